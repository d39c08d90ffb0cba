#version 450
// Fast Walsh-Hadamard transform over consecutive N-value chunks, scaled by 1/sqrt(N)
// (Sylvester order, no signs: reference.md section 2). One invocation per chunk, so a
// chunk's result never depends on the batch; src and dst may be the same buffer.
#include "common.glsl"

layout(constant_id = 1) const uint N = 128;        // chunk size, a power of two
layout(constant_id = 2) const float SCALE = 1.0;   // f32(1/sqrt(N))

layout(binding = 0) buffer Src { float src[]; };
layout(binding = 1) buffer Dst { float dst[]; };

layout(push_constant) uniform Push {
    uint n_chunks;
} p;

void main() {
    float v[N];
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint c = gl_GlobalInvocationID.x; c < p.n_chunks; c += stride) {
        uint base = c * N;
        for (uint i = 0; i < N; i++) v[i] = src[base + i];
        // butterflies at distance h = 1, 2, 4, ...: (a, b) -> (a + b, a - b)
        for (uint h = 1; h < N; h <<= 1) {
            for (uint k = 0; k < N / 2; k++) {
                uint j = ((k & ~(h - 1u)) << 1) | (k & (h - 1u));
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        for (uint i = 0; i < N; i++) dst[base + i] = v[i] * SCALE;
    }
}
