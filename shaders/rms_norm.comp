#version 450
// RMSNorm with weight, one workgroup per row (ggml_rms_norm followed by ggml_mul):
// y = x / sqrt(mean(x^2) + eps) * w. Also the per-head q_norm/k_norm: rows = tokens*heads.
// TEXEL variant (CPU devices, one subgroup a workgroup): x and w are read as uniform texel
// buffers of vec4, a straight-line gather on lavapipe where a storage load loops over the lanes.
//! variant rms_norm
//! variant rms_norm_sg_texel ONE_SUBGROUP=1 TEXEL=1
#include "common.glsl"
#include "rows.glsl"

layout(constant_id = 1) const bool VEC4 = false;  // dim % 4 == 0 and 16-byte aligned views

#ifdef TEXEL
layout(binding = 0) uniform samplerBuffer x_tex;
layout(binding = 1) uniform samplerBuffer w_tex;
vec4 x4(uint i) { return texelFetch(x_tex, int(i)); }
vec4 w4(uint i) { return texelFetch(w_tex, int(i)); }
float x(uint i) { return x4(i >> 2)[i & 3u]; }
float w(uint i) { return w4(i >> 2)[i & 3u]; }
#else
layout(binding = 0) readonly buffer X { float x_[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4_[]; };
layout(binding = 1) readonly buffer W { float w_[]; };
layout(binding = 1) readonly buffer W4 { vec4 w4_[]; };
vec4 x4(uint i) { return x4_[i]; }
vec4 w4(uint i) { return w4_[i]; }
float x(uint i) { return x_[i]; }
float w(uint i) { return w_[i]; }
#endif
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 2) writeonly buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push { uint n_rows; uint dim; float eps; } p;
#include "norm.glsl"

void main() {
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    for (uint row = gl_WorkGroupID.x; row < p.n_rows; row += gl_NumWorkGroups.x) {
        float scale;
        if (VEC4) {
            scale = rms_scale(row * (p.dim / 4u), p.dim / 4u, p.dim, p.eps);
        } else {
            const uint base = row * p.dim;
            float s = 0.0;
            for (uint i = tid; i < p.dim; i += WG) { float v = x(base + i); s += v * v; }
            scale = inversesqrt(row_sum(s) / float(p.dim) + p.eps);
        }
        if (VEC4) {
            const uint n4 = p.dim / 4u, base = row * n4;
            for (uint i = tid; i < n4; i += WG) y4[base + i] = rms_apply(x4(base + i), scale, w4(i));
        } else {
            const uint base = row * p.dim;
            for (uint i = tid; i < p.dim; i += WG) y[base + i] = (x(base + i) * scale) * w(i);
        }
    }
}
