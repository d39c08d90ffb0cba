#version 450
// KV-cache store: quantize f32 rows into the cache rows named by a positions buffer, rotating
// them on the way when ROT > 0 (the Hadamard rotation of a quantized cache, hadamard.glsl).
// The rotation happens in registers: the source rows are only read, never changed, so the
// same rows can be stored into any number of caches of any types.
// One invocation per unit of U values (a 32-value block, or one ROT-value rotation chunk),
// so no two invocations touch the same bytes.
// KV variant: K and V rows of one type and rotation in one dispatch (the second half of the
// units stores src_v into cache_v at the same positions): one dispatch a layer fewer.
// TEXEL variants (CPU devices): the sources are read as vec4 texels, a straight-line gather on
// lavapipe where each storage load loops over the lanes; rows and strides are multiples of 4.
//! variant set_rows
//! variant set_rows_kv KV=1
//! variant set_rows_texel TEXEL=1
//! variant set_rows_kv_texel KV=1 TEXEL=1
#include "common.glsl"
#include "types.glsl"
#include "hadamard.glsl"

layout(constant_id = 1) const uint CACHE_TYPE = 0;
layout(constant_id = 2) const uint ROT = 0;              // rotation chunk (64..256), 0: none
layout(constant_id = 3) const float ROT_SCALE = 1.0;     // f32(1/sqrt(ROT))
const uint U = ROT > 32u ? ROT : 32u;                    // values per invocation
layout(constant_id = 4) const bool WIDE = false;         // plain types: 16-byte stores (quantize.glsl)

layout(binding = 1) readonly buffer Pos { uint pos[]; };   // rewritten between replays
layout(binding = 2) buffer Cache { uint16_t cache[]; };
layout(binding = 2) buffer Cache4 { uvec4 cache4[]; };
#ifdef TEXEL
layout(binding = 0) uniform samplerBuffer src_tex;
vec4 src4(uint i) { return texelFetch(src_tex, int(i / 4u)); }
#else
layout(binding = 0) readonly buffer Src { float src[]; };
vec4 src4(uint i) { return vec4(src[i], src[i + 1u], src[i + 2u], src[i + 3u]); }
#endif
#ifdef KV
layout(binding = 4) buffer CacheV { uint16_t cache_v[]; };
layout(binding = 4) buffer CacheV4 { uvec4 cache_v4[]; };
#ifdef TEXEL
layout(binding = 3) uniform samplerBuffer src_v_tex;
vec4 src_v4(uint i) { return texelFetch(src_v_tex, int(i / 4u)); }
#else
layout(binding = 3) readonly buffer SrcV { float src_v[]; };
vec4 src_v4(uint i) { return vec4(src_v[i], src_v[i + 1u], src_v[i + 2u], src_v[i + 3u]); }
#endif
#endif

layout(push_constant) uniform Push {
    uint n_rows;      // rows to store
    uint row_len;     // values per row (a multiple of U)
    uint src_stride;  // floats between source rows
    uint row0;        // first cache row of the bound piece
    uint n_ctx;       // cache rows in the bound piece
} p;

#define QZ_WIDE WIDE
#define QZ_BUF cache
#define QZ_BUF4 cache4
#define QZ_FN quantize_block
#include "quantize.glsl"
#undef QZ_BUF
#undef QZ_BUF4
#undef QZ_FN

#ifdef KV
#define QZ_BUF cache_v
#define QZ_BUF4 cache_v4
#define QZ_FN quantize_block_v
#include "quantize.glsl"
const uint HALVES = 2u;
vec4 load4(bool second, uint i) { return second ? src_v4(i) : src4(i); }
void store(bool second, uint base, float x[32]) {
    if (second) quantize_block_v(CACHE_TYPE, base, x); else quantize_block(CACHE_TYPE, base, x);
}
#else
const uint HALVES = 1u;
vec4 load4(bool second, uint i) { return src4(i); }
void store(bool second, uint base, float x[32]) { quantize_block(CACHE_TYPE, base, x); }
#endif

void main() {
    uint upr = p.row_len / U, bpr = p.row_len / 32u, words = type_u16(CACHE_TYPE);
    uint half_ = p.n_rows * upr, stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint u = gl_GlobalInvocationID.x; u < HALVES * half_; u += stride) {
        bool second = u >= half_;  // KV: a V unit
        uint uu = second ? u - half_ : u, r = uu / upr, k = uu - r * upr;
        uint row = pos[r] - p.row0;  // wraps past n_ctx when below row0
        if (row >= p.n_ctx) continue;  // another piece's row (the host rejects out-of-range positions)
        float v[U];
        uint s = r * p.src_stride + k * U;
        [[unroll]] for (uint i = 0; i < U; i += 4) {
            vec4 x = load4(second, s + i);
            v[i] = x.x; v[i + 1] = x.y; v[i + 2] = x.z; v[i + 3] = x.w;
        }
        if (ROT > 0u) { FWHT(v, 0u, ROT, ROT_SCALE) }
        for (uint b = 0; b < U / 32u; b++) {
            float x[32];
            [[unroll]] for (uint i = 0; i < 32; i++) x[i] = v[32u * b + i];
            store(second, (row * bpr + k * (U / 32u) + b) * words, x);
        }
    }
}
