#version 450
// RMSNorm with weight, one workgroup per row (ggml_rms_norm followed by ggml_mul):
// y = x / sqrt(mean(x^2) + eps) * w. Also the per-head q_norm/k_norm: rows = tokens*heads.
#include "common.glsl"
#include "rows.glsl"

layout(constant_id = 1) const bool VEC4 = false;  // dim % 4 == 0 and 16-byte aligned views

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 1) readonly buffer W4 { vec4 w4[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 2) writeonly buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push { uint n_rows; uint dim; float eps; } p;

void main() {
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    for (uint row = gl_WorkGroupID.x; row < p.n_rows; row += gl_NumWorkGroups.x) {
        float s = 0.0;
        if (VEC4) {
            const uint n4 = p.dim / 4u, base = row * n4;
            vec4 a = vec4(0.0);
            for (uint i = tid; i < n4; i += WG) { vec4 v = x4[base + i]; a += v * v; }
            s = (a.x + a.y) + (a.z + a.w);
        } else {
            const uint base = row * p.dim;
            for (uint i = tid; i < p.dim; i += WG) { float v = x[base + i]; s += v * v; }
        }
        const float scale = inversesqrt(row_sum(s) / float(p.dim) + p.eps);
        if (VEC4) {
            const uint n4 = p.dim / 4u, base = row * n4;
            for (uint i = tid; i < n4; i += WG) y4[base + i] = (x4[base + i] * scale) * w4[i];
        } else {
            const uint base = row * p.dim;
            for (uint i = tid; i < p.dim; i += WG) y[base + i] = (x[base + i] * scale) * w[i];
        }
    }
}
