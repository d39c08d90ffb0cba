#version 450
// Softmax over rows of x*scale, max-subtracted (ggml_soft_max_ext without mask or ALiBi).
// Three passes per row: max, exp and sum (exponentials parked in y), rescale by 1/sum.
// A row whose max is -inf (fully masked) comes out as zeros.
#include "common.glsl"
#include "rows.glsl"

layout(constant_id = 1) const bool VEC4 = false;  // n_cols % 4 == 0 and 16-byte aligned views

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) buffer Y { float y[]; };
layout(binding = 1) buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push { uint n_rows; uint n_cols; float scale; } p;

void main() {
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    for (uint row = gl_WorkGroupID.x; row < p.n_rows; row += gl_NumWorkGroups.x) {
        const uint n = VEC4 ? p.n_cols / 4u : p.n_cols, base = row * n;
        float m = NEG_INF;
        if (VEC4) {
            vec4 m4 = vec4(NEG_INF);
            for (uint i = tid; i < n; i += WG) m4 = max(m4, x4[base + i] * p.scale);
            m = max(max(m4.x, m4.y), max(m4.z, m4.w));
        } else {
            for (uint i = tid; i < n; i += WG) m = max(m, x[base + i] * p.scale);
        }
        m = row_max(m);
        if (m == NEG_INF) m = 0.0;
        float s = 0.0;
        if (VEC4) {
            vec4 s4 = vec4(0.0);
            for (uint i = tid; i < n; i += WG) {
                const vec4 e = exp(x4[base + i] * p.scale - m);
                y4[base + i] = e;
                s4 += e;
            }
            s = (s4.x + s4.y) + (s4.z + s4.w);
        } else {
            for (uint i = tid; i < n; i += WG) {
                const float e = exp(x[base + i] * p.scale - m);
                y[base + i] = e;
                s += e;
            }
        }
        s = row_sum(s);
        const float inv = s > 0.0 ? 1.0 / s : 0.0;
        // each lane rescales exactly the values it wrote, so no barrier is needed
        if (VEC4) for (uint i = tid; i < n; i += WG) y4[base + i] *= inv;
        else for (uint i = tid; i < n; i += WG) y[base + i] *= inv;
    }
}
