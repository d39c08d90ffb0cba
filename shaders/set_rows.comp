#version 450
// KV-cache store: quantize f32 rows into the cache rows named by a positions buffer, rotating
// them on the way when ROT > 0 (the Hadamard rotation of a quantized cache, hadamard.glsl).
// The rotation happens in registers: the source rows are only read, never changed, so the
// same rows can be stored into any number of caches of any types.
// One invocation per unit of U values (a 32-value block, or one ROT-value rotation chunk),
// so no two invocations touch the same bytes.
#include "common.glsl"
#include "types.glsl"
#include "hadamard.glsl"

layout(constant_id = 1) const uint CACHE_TYPE = 0;
layout(constant_id = 2) const uint ROT = 0;              // rotation chunk (64..256), 0: none
layout(constant_id = 3) const float ROT_SCALE = 1.0;     // f32(1/sqrt(ROT))
const uint U = ROT > 32u ? ROT : 32u;                    // values per invocation

layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) readonly buffer Pos { uint pos[]; };   // rewritten between replays
layout(binding = 2) buffer Cache { uint16_t cache[]; };

layout(push_constant) uniform Push {
    uint n_rows;      // rows to store
    uint row_len;     // values per row (a multiple of U)
    uint src_stride;  // floats between source rows
    uint row0;        // first cache row of the bound piece
    uint n_ctx;       // cache rows in the bound piece
} p;

#define QZ_BUF cache
#define QZ_FN quantize_block
#include "quantize.glsl"

void main() {
    uint upr = p.row_len / U, bpr = p.row_len / 32u, words = type_u16(CACHE_TYPE);
    uint total = p.n_rows * upr, stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint u = gl_GlobalInvocationID.x; u < total; u += stride) {
        uint r = u / upr, k = u - r * upr;
        uint row = pos[r] - p.row0;  // wraps past n_ctx when below row0
        if (row >= p.n_ctx) continue;  // another piece's row (the host rejects out-of-range positions)
        float v[U];
        uint s = r * p.src_stride + k * U;
        [[unroll]] for (uint i = 0; i < U; i++) v[i] = src[s + i];
        if (ROT > 0u) { FWHT(v, 0u, ROT, ROT_SCALE) }
        for (uint b = 0; b < U / 32u; b++) {
            float x[32];
            [[unroll]] for (uint i = 0; i < 32; i++) x[i] = v[32u * b + i];
            quantize_block(CACHE_TYPE, (row * bpr + k * (U / 32u) + b) * words, x);
        }
    }
}
