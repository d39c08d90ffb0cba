#version 450
// Embedding gather: out[i, :] = dequant(W[ids[i], :]) for any weight type, f32 output.
// One lane dequantizes one 32-value chunk. A weight bound in row pieces is gathered with one
// dispatch per piece, each writing the rows whose id falls in it; the first piece also
// fills rows whose id is out of range with NaN, so a bad id is loud, never stale memory.
#include "common.glsl"
#include "types.glsl"

layout(constant_id = 1) const uint TYPE = 0u;  // ggml type id of W
layout(constant_id = 2) const uint TILE = 1u;  // rows per interleaved tile (kernels/weights.py)

layout(binding = 0) readonly buffer W { uint16_t w16[]; };
layout(binding = 1) readonly buffer Ids { uint ids[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint first_row;   // first weight row in this piece
    uint rows;        // weight rows in this piece
    uint total_rows;  // weight rows in all pieces
    uint cols;
    uint stride;      // bytes per weight row (kernels/weights.py pads rows to 16 bytes)
} p;

// `base`: the block's 16-bit word in its row; a row's 16-byte words are TILE words apart
uint row16;
#define DQ_BUF w16
#define DQ_FN dequant_w
#define DQ_INDEX(i) ((row16 + ((base + (i)) >> 3) * TILE) * 8u + ((base + (i)) & 7u))
#include "dequant.glsl"

void main() {
    uint chunk = gl_GlobalInvocationID.x, i = gl_WorkGroupID.y;
    uint nchunk = p.cols / 32u;
    if (chunk >= nchunk) return;
    uint id = ids[i], out0 = i * p.cols + chunk * 32u;
    if (id - p.first_row < p.rows) {  // unsigned: also false for id < first_row
        uint per = type_qk(TYPE) / 32u;  // chunks per block
        float v[32];
        uint r = id - p.first_row;
        row16 = r / TILE * TILE * (p.stride / 16u) + r % TILE;
        dequant_w(TYPE, chunk / per * type_u16(TYPE), chunk % per, v);
        [[unroll]] for (uint k = 0u; k < 32u; k++) o[out0 + k] = v[k];
    } else if (p.first_row == 0u && id >= p.total_rows) {
        [[unroll]] for (uint k = 0u; k < 32u; k++) o[out0 + k] = uintBitsToFloat(0x7FC00000u);
    }
}
