#version 450
// Index of the largest value per row. Ties go to the lowest index, NaN beats everything (the
// first NaN wins, as numpy.argmax), -0.0 ties +0.0. Values are compared as order-preserving
// integer keys, so the result does not hang on how a device compares NaN. With FLAG, bit 31 of
// the index marks a row whose largest value is not finite (NaN, +inf, or every value -inf):
// greedy decoding reads back only the index and must still refuse such logits.
// TEXEL variant: as rms_norm.comp's.
//! variant argmax
//! variant argmax_sg_texel ONE_SUBGROUP=1 TEXEL=1
#include "common.glsl"
#include "rows.glsl"

layout(constant_id = 1) const bool VEC4 = false;  // n_cols % 4 == 0 and a 16-byte aligned view
layout(constant_id = 2) const bool FLAG = false;

#ifdef TEXEL
layout(binding = 0) uniform samplerBuffer x_tex;
vec4 x4(uint i) { return texelFetch(x_tex, int(i)); }
float x(uint i) { return x4(i >> 2)[i & 3u]; }
#else
layout(binding = 0) readonly buffer X { float x_[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4_[]; };
vec4 x4(uint i) { return x4_[i]; }
float x(uint i) { return x_[i]; }
#endif
layout(binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform Push { uint n_rows; uint n_cols; } p;

uvec4 order_key(vec4 v) {
    uvec4 u = floatBitsToUint(v);
    u = mix(u, uvec4(0u), equal(u, uvec4(0x80000000u)));                 // -0 -> +0
    const uvec4 k = mix(u | 0x80000000u, ~u, notEqual(u & 0x80000000u, uvec4(0u)));
    return mix(k, uvec4(0xFFFFFFFFu), greaterThan(u & 0x7FFFFFFFu, uvec4(0x7F800000u)));  // NaN
}

void main() {
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    for (uint row = gl_WorkGroupID.x; row < p.n_rows; row += gl_NumWorkGroups.x) {
        uint key = 0u, idx = 0xFFFFFFFFu;
        if (VEC4) {
            const uint n = p.n_cols / 4u, base = row * n;
            uvec4 bk = uvec4(0u), bi = uvec4(0xFFFFFFFFu);
            for (uint i = tid; i < n; i += WG) {
                const uvec4 k = order_key(x4(base + i));
                const bvec4 gt = greaterThan(k, bk);  // strict: the earliest index of a lane stays
                bk = mix(bk, k, gt);
                bi = mix(bi, uvec4(4u * i) + uvec4(0u, 1u, 2u, 3u), gt);
            }
            for (uint c = 0u; c < 4u; c++) better(key, idx, bk[c], bi[c]);
        } else {
            const uint base = row * p.n_cols;
            for (uint i = tid; i < p.n_cols; i += WG) {
                const uint k = order_key(vec4(x(base + i))).x;
                if (k > key) { key = k; idx = i; }  // every real key is > 0
            }
        }
        row_argmax(key, idx);
        const bool finite = key > 0x007FFFFFu && key < 0xFF800000u;  // keys of -inf and +inf
        if (tid == 0u) y[row] = FLAG && !finite ? idx | 0x80000000u : idx;
    }
}
