#version 450
// KV-cache store: quantize f32 rows into the cache rows named by a positions buffer.
// One invocation per 32-value block, so no two invocations touch the same bytes.
#include "common.glsl"
#include "types.glsl"

layout(constant_id = 1) const uint CACHE_TYPE = 0;

layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) readonly buffer Pos { uint pos[]; };   // rewritten between replays
layout(binding = 2) buffer Cache { uint16_t cache[]; };

layout(push_constant) uniform Push {
    uint n_rows;      // rows to store
    uint row_len;     // values per row (multiple of 32)
    uint src_stride;  // floats between source rows
    uint row0;        // first cache row of the bound piece
    uint n_ctx;       // cache rows in the bound piece
} p;

#define QZ_BUF cache
#define QZ_FN quantize_block
#include "quantize.glsl"

void main() {
    uint bpr = p.row_len / 32u, words = type_u16(CACHE_TYPE);
    uint total = p.n_rows * bpr, stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint b = gl_GlobalInvocationID.x; b < total; b += stride) {
        uint r = b / bpr, k = b - r * bpr;
        uint row = pos[r] - p.row0;  // wraps past n_ctx when below row0
        if (row >= p.n_ctx) continue;  // another piece's row (the host rejects out-of-range positions)
        float x[32];
        uint s = r * p.src_stride + k * 32u;
        [[unroll]] for (uint i = 0; i < 32; i++) x[i] = src[s + i];
        quantize_block(CACHE_TYPE, (row * bpr + k) * words, x);
    }
}
