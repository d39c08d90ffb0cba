#version 450
// Fast Walsh-Hadamard transform over consecutive N-value chunks, scaled by 1/sqrt(N)
// (hadamard.glsl). One invocation per chunk, so a chunk's result never depends on the batch;
// src and dst may be the same buffer.
#include "common.glsl"
#include "hadamard.glsl"

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
        FWHT(v, 0u, N, SCALE)
        for (uint i = 0; i < N; i++) dst[base + i] = v[i];
    }
}
