#version 450
// Elementwise f32 ops, chosen by specialization constant so one SPIR-V serves all:
// add a+b, mul a*b, swiglu silu(a)*b (ggml_swiglu_split), scale a*s (b unbound: pass a).
#include "common.glsl"

layout(constant_id = 1) const uint OP = 0;  // kernels/elementwise.py OPS
layout(constant_id = 2) const bool VEC4 = false;
const uint OP_ADD = 0u, OP_MUL = 1u, OP_SWIGLU = 2u, OP_SCALE = 3u;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 1) readonly buffer B4 { vec4 b4[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 2) writeonly buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push { uint n; float s; } p;  // n counts vec4s when VEC4

vec4 apply(vec4 u, vec4 v) {
    if (OP == OP_ADD) return u + v;
    if (OP == OP_MUL) return u * v;
    if (OP == OP_SWIGLU) return u / (1.0 + exp(-u)) * v;
    return u * p.s;
}

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        if (VEC4) y4[i] = apply(a4[i], OP == OP_SCALE ? vec4(0.0) : b4[i]);
        else y[i] = apply(vec4(a[i]), vec4(OP == OP_SCALE ? 0.0 : b[i])).x;
    }
}
