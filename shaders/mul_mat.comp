#version 450
// y[j, r] = sum_c W[r, c] * x[j, c]: ggml weight blocks (any weight type) times f32 activations.
//
// Batch invariance: each y[j, r] is summed in one fixed order that depends only on the row
// (32-value chunks in column order, each chunk as fixed fma/add chains), whatever n is, in
// whichever activation slot and with whichever NJ or load path it is computed; `precise`
// keeps the compiler from contracting some copies into fma and not others.
// Shape: SPLIT lanes share a weight row (1: each lane walks its row alone, best on lavapipe),
// each lane keeps NJ activation rows, so weights are read once per NJ activations, and R
// consecutive weight rows, so each x chunk loaded serves R rows.
// lavapipe facts behind the load paths: a storage-buffer load costs a per-lane loop, so
// 16-byte loads (WIDE) read ~2.5x faster than 4-byte ones, and loading an x chunk once per
// subgroup and shuffling it (XBCAST) beats every lane loading the same x; with 16 lanes, one
// load holds two slots' chunks (XBCAST 2): perf put lavapipe's x gathers first in a 16-row pass.
// WIDE path: rows are stored 16-byte aligned (kernels/weights.py pads each row of the GGUF
// layout to `stride` bytes), so every block of a group of G blocks sits at a compile-time
// offset in a window of 16-byte loads; TAIL blocks (cols/QK mod G) end the row. Rows may be
// interleaved in tiles of TILE rows (kernels/weights.py): 16-byte word k of row r is word
// k * TILE + r % TILE of its tile, so the lanes of a SIMD vector, on consecutive rows, load
// contiguous memory.
// TEXEL variant: W and X are uniform texel buffers; lavapipe turns a texel fetch into a
// straight-line gather, where a storage-buffer load is a loop over the lanes (2-4x faster).
// GLU variants: y = silu(W x) * (U x), U (binding 3) the up projection of the same type and
// shape as W (gate); R rows a lane are R/2 gate rows and the same R/2 rows of U, so the FFN's
// gate, up and swiglu are one dispatch.
// ROPE variants: output segments 0 and 1 (Q and K of a QKV matmul) leave RoPE'd (normal mode,
// rope.comp's arithmetic, the same bits): a lane's vector of consecutive outputs holds whole
// pairs. NJ <= subgroup size. Without its 30 rope dispatches a decode step takes ~2 ms less wall
// time on lavapipe, four times their GPU time: each dispatch costs lavapipe's thread pool too.
// NORM variants (TEXEL, XBCAST, one subgroup a workgroup): x is the residual stream and the
// matmul applies RMSNorm as it loads it (norm.glsl, rms_norm.comp's bits): no rms_norm dispatch.
//! variant mul_mat
//! variant mul_mat_texel TEXEL=1
//! variant mul_mat_glu GLU=1
//! variant mul_mat_texel_glu TEXEL=1 GLU=1
//! variant mul_mat_rope ROPE=1
//! variant mul_mat_texel_rope TEXEL=1 ROPE=1
//! variant mul_mat_texel_norm TEXEL=1 NORM=1
//! variant mul_mat_texel_rope_norm TEXEL=1 ROPE=1 NORM=1
//! variant mul_mat_texel_glu_norm TEXEL=1 GLU=1 NORM=1
//! each WTYPE f32=T_F32 f16=T_F16 q4_0=T_Q4_0 q4_1=T_Q4_1 q5_0=T_Q5_0 q5_1=T_Q5_1 q8_0=T_Q8_0 q4_k=T_Q4_K q6_k=T_Q6_K bf16=T_BF16
// the GLU and store-time RoPE need an even number of weight rows a lane, which only 32-value
// blocks get (kernels/matmul.py rows_per_lane): no code path dispatches them for the k-quants
//! omit mul_mat*_glu*_q4_k mul_mat*_glu*_q6_k mul_mat*_rope*_q4_k mul_mat*_rope*_q6_k
#extension GL_KHR_shader_subgroup_shuffle : enable
#include "common.glsl"
#include "types.glsl"

// ggml type id of W: one module per type (`each` above), not a specialization constant; a module
// holding every type's code took lavapipe 0.22-0.47 s to create a pipeline from, its own 0.15
const uint TYPE = WTYPE;
layout(constant_id = 1) const uint SPLIT = 1u;   // lanes per row: power of two <= subgroup size
layout(constant_id = 2) const uint NJ = 1u;      // activation rows per invocation
layout(constant_id = 3) const uint WIDE = 0u;    // 1: 16-byte loads (not q6_k)
layout(constant_id = 4) const uint XBCAST = 0u;  // x chunks shuffled, of XBCAST slots a load (SPLIT 1,
                                                 // subgroup >= 8 XBCAST lanes)
const uint XB = XBCAST > 1u ? XBCAST : 1u;
layout(constant_id = 5) const uint TAIL = 0u;    // WIDE: blocks per row mod G
layout(constant_id = 6) const uint JROLL = 0u;   // 1: a rolled loop over the NJ slots (compiles
                                                 // ~60x faster on LLVM without XBCAST, runs slower)
layout(constant_id = 7) const uint R = 1u;       // weight rows per lane (WIDE, 32-value blocks)
layout(constant_id = 8) const uint TILE = 1u;    // rows per interleaved tile of W (and U)
layout(constant_id = 9) const uint ISLOTS = 1u;  // most slots (NJ) decoding and summing interleaved
layout(constant_id = 10) const uint VEC = 0u;    // 1: a lane's output rows are stored as one vector
                                                 // (host: RO 2 or 4 dividing rows, row0, segments)

#ifdef TEXEL
layout(binding = 0) uniform usamplerBuffer w_tex;  // u32x4 texels (wide path), else u32
layout(binding = 1) uniform samplerBuffer x_tex;
uint w32(uint i) { return texelFetch(w_tex, int(i)).x; }
uvec4 w128(uint i) { return texelFetch(w_tex, int(i)); }
vec4 x4(uint i) { return texelFetch(x_tex, int(i)); }
#ifdef GLU
layout(binding = 3) uniform usamplerBuffer u_tex;
uvec4 u128(uint i) { return texelFetch(u_tex, int(i)); }
#endif
#else
layout(binding = 0) readonly buffer W { uint w32_[]; };
layout(binding = 0) readonly buffer W4 { uvec4 w128_[]; };
layout(binding = 1) readonly buffer X { vec4 x4_[]; };
uint w32(uint i) { return w32_[i]; }
uvec4 w128(uint i) { return w128_[i]; }
vec4 x4(uint i) { return x4_[i]; }
#ifdef GLU
layout(binding = 3) readonly buffer U4 { uvec4 u128_[]; };
uvec4 u128(uint i) { return u128_[i]; }
#endif
#endif
#ifdef ROPE
#include "rope.glsl"
layout(binding = 3) readonly buffer Pos { int pos[]; };     // per activation row
layout(binding = 4) readonly buffer Freq { uvec2 freq[]; }; // per pair (kernels/rope.py's table)
#endif
#ifdef NORM
#if defined(GLU)
layout(binding = 4) uniform samplerBuffer nw_tex;  // the norm's weight
#elif defined(ROPE)
layout(binding = 5) uniform samplerBuffer nw_tex;
#else
layout(binding = 3) uniform samplerBuffer nw_tex;
#endif
vec4 nw4(uint i) { return texelFetch(nw_tex, int(i)); }
#endif
#ifdef GLU
const bool GLU_ON = true;
#else
const bool GLU_ON = false;
uvec4 u128(uint i) { return uvec4(0u); }
#endif
layout(binding = 2) buffer Y { float y[]; };
layout(binding = 2) buffer Y2 { vec2 y2[]; };
layout(binding = 2) buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push {
    uint rows;      // weight rows in this piece
    uint cols;
    uint n;         // activation rows
    uint row0;      // output feature of this piece's first row
    uint stride;    // bytes per weight row (a multiple of 16)
    // Output segments: features [0, end0) form matrix 0 of Y, [end0, end1) matrix 1, [end1,
    // end2) matrix 2, each row-major from float `base` of Y (one matmul fills Q, K and V).
    uint end0, end1, end2, base0, base1, base2;
    // 1: y += W x (a residual add without a dispatch). A push constant, not a specialization:
    // each specialization is one more kernel to compile (lavapipe: 0.2-0.4 s), and the branch
    // is taken once per output
    uint acc;
#ifdef ROPE
    uint head_dim, half_rot;  // of the heads in segments 0 and 1
#endif
#ifdef NORM
    float eps;
#endif
} p;
#ifdef NORM
#define ONE_SUBGROUP 1
#include "rows.glsl"
#include "norm.glsl"
#endif

// y index of output feature f of activation row j
uint y_index(uint j, uint f) {
    uint start = f < p.end0 ? 0u : f < p.end1 ? p.end0 : p.end1;
    uint end = f < p.end0 ? p.end0 : f < p.end1 ? p.end1 : p.end2;
    uint base = f < p.end0 ? p.base0 : f < p.end1 ? p.base1 : p.base2;
    return base + j * (end - start) + (f - start);
}

const bool PLAIN = TYPE == T_F32 || TYPE == T_F16 || TYPE == T_BF16;
const uint QK = (TYPE == T_Q4_K || TYPE == T_Q6_K) ? 256u : 32u;
// bytes per block (plain types: per 32-value chunk), as type_u16 in types.glsl
const uint BB = TYPE == T_F32 ? 128u : (TYPE == T_F16 || TYPE == T_BF16) ? 64u : TYPE == T_Q8_0 ? 34u
    : TYPE == T_Q4_0 ? 18u : TYPE == T_Q4_1 ? 20u : TYPE == T_Q5_0 ? 22u : TYPE == T_Q5_1 ? 24u
    : TYPE == T_Q4_K ? 144u : 210u;
// blocks per group (WIDE): 16 / gcd(BB, 16), so every group starts 16-byte aligned; q6_k would
// need 8 x 210 bytes, too big a window: it always takes the narrow path
const bool WIDE_ON = WIDE != 0u && TYPE != T_Q6_K;
const uint G = !WIDE_ON ? 1u : (TYPE == T_Q8_0 || TYPE == T_Q4_0 || TYPE == T_Q5_0) ? 8u
    : TYPE == T_Q4_1 ? 4u : TYPE == T_Q5_1 ? 2u : 1u;
const uint NW = 68u;  // most 32-bit words held at once: 8 q8_0 blocks (272 bytes)

// The loaded bytes as 32-bit words a[]; at32/at16/at8(b) read byte b on. Wide path: b counts
// from the group's start. Narrow path: blocks are only 2-byte aligned, so when `odd` the window
// starts 2 bytes before the block and b counts from the block. Offsets are compile-time
// constants after unrolling, so only the odd/even choice is made at run time (a select).
uint a[NW];
bool odd;
uint fsh(uint lo, uint hi) { return (lo >> 16) | (hi << 16); }
uint at32(uint b) {
    uint k = b >> 2;
    if ((b & 2u) == 0u) return odd ? fsh(a[k], a[k + 1u]) : a[k];
    return odd ? a[k + 1u] : fsh(a[k], a[k + 1u]);
}
uint at16(uint b) {
    uint k = b >> 2;
    if ((b & 2u) == 0u) return odd ? a[k] >> 16 : a[k] & 0xFFFFu;
    return odd ? a[k + 1u] & 0xFFFFu : a[k] >> 16;
}
uint at8(uint b) { return (at16(b & ~1u) >> ((b & 1u) * 8u)) & 0xFFu; }

// 32-bit word k of the row whose first 16-byte word is `row16`
uint word32(uint row16, uint k) { return (row16 + (k >> 2) * TILE) * 4u + (k & 3u); }

// narrow path: one block at any 2-byte-aligned byte offset `off` of the row, 4 bytes a load
void load_block(uint row16, uint off) {
    uint base = off >> 2, last = (off + BB - 1u) >> 2;
    odd = (off & 2u) != 0u;
    [[unroll]] for (uint k = 0u; k < (BB + 5u) / 4u; k++) a[k] = w32(word32(row16, min(base + k, last)));
}

// wide path: `nb` blocks starting at 16-byte word `base` of W (of U when `up`), TILE words apart
void load_group(uint base, uint nb, bool up) {
    odd = false;
    [[unroll]] for (uint k = 0u; k < (nb * BB + 15u) / 16u; k++) {
        uvec4 v = up ? u128(base + k * TILE) : w128(base + k * TILE);
        a[4u * k] = v.x; a[4u * k + 1u] = v.y; a[4u * k + 2u] = v.z; a[4u * k + 3u] = v.w;
    }
}

vec4 nib4(uint w, uint shift) {
    return vec4(uvec4(w >> shift, w >> (shift + 8u), w >> (shift + 16u), w >> (shift + 24u)) & 15u);
}
vec4 i8x4(uint w) {
    return vec4(ivec4(int(w << 24), int(w << 16), int(w << 8), int(w)) >> 24);
}
vec4 bit4(uint h, uint e) {  // bit e..e+3 of h, each as 16.0 or 0.0
    return vec4(uvec4(h >> e, h >> (e + 1u), h >> (e + 2u), h >> (e + 3u)) & 1u) * 16.0;
}

// Chunk `sub` of the block at window byte `o` as w = A * q + B: q the block's raw integers
// (plain types and q6_k: the values themselves, A = 1, B = 0), so a chunk's dot product is
// A * sum(q x) + B * sum(x): two operations a weight fewer than dequantizing each value, and
// sum(x) is shared by every row of the lane (llama.cpp's q4_1 x q8_1 trick, in f32).
const bool SCALED = !(TYPE == T_F32 || TYPE == T_F16 || TYPE == T_BF16 || TYPE == T_Q6_K);
const bool OFFSET = TYPE == T_Q4_0 || TYPE == T_Q4_1 || TYPE == T_Q5_0 || TYPE == T_Q5_1 || TYPE == T_Q4_K;
void chunk_scale(uint o, uint sub, out float A, out float B) {
    A = 1.0; B = 0.0;
    switch (TYPE) {
    case T_Q8_0:
        A = f16_to_f32(at16(o)); break;
    case T_Q4_0: case T_Q5_0:
        A = f16_to_f32(at16(o)); B = (TYPE == T_Q4_0 ? -8.0 : -16.0) * A; break;
    case T_Q4_1: case T_Q5_1:
        A = f16_to_f32(at16(o)); B = f16_to_f32(at16(o + 2u)); break;
    case T_Q4_K: {
        uint sc, mn;
        if (sub < 4u) {
            sc = at8(o + 4u + sub) & 63u; mn = at8(o + 8u + sub) & 63u;
        } else {
            sc = (at8(o + 8u + sub) & 15u) | ((at8(o + sub) >> 6) << 4);
            mn = (at8(o + 8u + sub) >> 4) | ((at8(o + 4u + sub) >> 6) << 4);
        }
        A = f16_to_f32(at16(o)) * float(sc); B = -(f16_to_f32(at16(o + 2u)) * float(mn));
        break;
    }
    }
}

// q of values 4k..4k+3 of the chunk (ggml's value order), k = 0..7
vec4 chunk_q(uint o, uint sub, uint k) {
    uint h = k >> 2, kk = k & 3u;  // q4/q5: low nibbles of the 16 bytes, then the high ones
    switch (TYPE) {
    case T_F32:
        return uintBitsToFloat(uvec4(a[o / 4u + 4u * k], a[o / 4u + 4u * k + 1u], a[o / 4u + 4u * k + 2u], a[o / 4u + 4u * k + 3u]));
    case T_F16:
        return vec4(unpackHalf2x16(a[o / 4u + 2u * k]), unpackHalf2x16(a[o / 4u + 2u * k + 1u]));
    case T_BF16:
        return uintBitsToFloat(uvec4(a[o / 4u + 2u * k] << 16, a[o / 4u + 2u * k] & 0xFFFF0000u,
                                     a[o / 4u + 2u * k + 1u] << 16, a[o / 4u + 2u * k + 1u] & 0xFFFF0000u));
    case T_Q8_0:
        return i8x4(at32(o + 2u + 4u * k));
    case T_Q4_0: case T_Q4_1:
        return nib4(at32(o + (TYPE == T_Q4_1 ? 4u : 2u) + 4u * kk), 4u * h);
    case T_Q5_0: case T_Q5_1: {
        uint qh0 = TYPE == T_Q5_1 ? 4u : 2u;
        return nib4(at32(o + qh0 + 4u + 4u * kk), 4u * h) + bit4(at32(o + qh0), 16u * h + 4u * kk);
    }
    case T_Q4_K:
        return nib4(at32(o + 16u + 32u * (sub >> 1) + 4u * k), (sub & 1u) * 4u);
    case T_Q6_K: {
        uint half_ = sub >> 2, r = sub & 3u;
        uint l = at32(o + 64u * half_ + (r & 1u) * 32u + 4u * k), hb = at32(o + 128u + 32u * half_ + 4u * k);
        uint qls = (r >> 1) * 4u, qhs = 2u * r;
        vec4 q = nib4(l, qls) + 16.0 * vec4(uvec4(hb >> qhs, hb >> (qhs + 8u), hb >> (qhs + 16u), hb >> (qhs + 24u)) & 3u);
        float sc = float(int(at8(o + 192u + 2u * sub + h) << 24) >> 24);
        return f16_to_f32(at16(o + 208u)) * sc * (q - 32.0);
    }
    }
    return vec4(0.0);
}

// One step of a chunk's dot product: s += q . x over 4 values, as fma in column order. Every
// path runs the same chains of 32 steps per chunk and combines them the same way, so a result
// never depends on n, the slot, NJ, R or the load path.
void dot4(inout precise float s, vec4 q, vec4 x) {
    s = fma(q.x, x.x, s); s = fma(q.y, x.y, s); s = fma(q.z, x.z, s); s = fma(q.w, x.w, s);
}
// t, the sum of a chunk's 32 x values, in the one order every path uses: each vec4 as
// (x + y) + (z + w), then the 8 vec4 sums as a tree. It serves all rows, so XBCAST lanes, which
// hold one vec4 of the chunk each, reduce it by 3 XOR shuffles: 32 adds a slot were ~4% of a
// 16-row pass.
float sum4(vec4 x) {
    precise float a = x.x + x.y, b = x.z + x.w, r = a + b;
    return r;
}
float tree8(float p[8]) {
    precise float r = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    return r;
}
// lane l holds vec4 l % 8 of a chunk: each of the 8 lanes ends with tree8 of the chunk
// (a + b == b + a bitwise, so both lanes of a pair hold the same bits)
float lanes_sum(vec4 mine) {
    precise float t = sum4(mine);
    t = t + subgroupShuffleXor(t, 1u);
    t = t + subgroupShuffleXor(t, 2u);
    t = t + subgroupShuffleXor(t, 4u);
    return t;
}
// slot jj's t from lanes_sum of its XBCAST load (lanes 8 (jj % XB) .. hold it)
float slot_sum(float tl, uint jj) {
    return XB == 1u ? tl : subgroupShuffle(tl, 8u * (jj % XB));
}
// acc + the chunk's dot product A * s + B * t
float combine(float acc, float A, float B, float s, float t) {
    precise float c = OFFSET ? fma(A, s, B * t) : A * s;
    precise float r = !SCALED ? acc + s : OFFSET ? acc + c : fma(A, s, acc);
    return r;
}

#ifdef NORM
float nscale[NJ];  // each slot's RMSNorm scale
#endif
// XBCAST: lane l loads vec4 l % 8 of slot jj + l / 8's chunk (XBCAST slots a load; a slot past
// NJ reloads the last), so vec4 k of slot jj + i is at lane 8 i + k
vec4 x_slots(uint xj[NJ], uint jj, uint xb) {
    uint l = gl_SubgroupInvocationID, row = xj[jj];
#ifdef NORM
    float sc = nscale[jj];
    [[unroll]] for (uint i = 1u; i < XBCAST; i++) if (l >= 8u * i) {
        row = xj[min(jj + i, NJ - 1u)];
        sc = nscale[min(jj + i, NJ - 1u)];
    }
    return rms_apply(x4(row + xb + (l & 7u)), sc, nw4(xb + (l & 7u)));
#else
    [[unroll]] for (uint i = 1u; i < XBCAST; i++) if (l >= 8u * i) row = xj[min(jj + i, NJ - 1u)];
    return x4(row + xb + (l & 7u));
#endif
}

// 32 activations starting at vec4 index `base`
void load_x(uint base, out vec4 xs[8]) {
    if (XBCAST != 0u) {
        vec4 mine = x4(base + (gl_SubgroupInvocationID & 7u));
        [[unroll]] for (uint k = 0u; k < 8u; k++) xs[k] = subgroupShuffle(mine, k);
    } else {
        [[unroll]] for (uint k = 0u; k < 8u; k++) xs[k] = x4(base + k);
    }
}

const bool WIDE_R = WIDE_ON && QK == 32u && JROLL == 0u;
const uint RL = WIDE_R ? R : 1u;       // rows per lane actually used (GLU: needs WIDE_R, R even)
const uint RO = GLU_ON ? RL / 2u : RL;  // output rows per lane; row i >= RO reads U's row i - RO
const uint CPG = G * QK / 32u;         // 32-value chunks per group of blocks
uint win[RL][NW];                      // each row's loaded group (a[] holds the one in use)

// acc[i][jj] += chunk c of the loaded groups . activation rows xj[jj], chunk at x vec4 xb
void chunks(uint c0, uint count, uint xb0, uint xj[NJ], inout precise float acc[RL][NJ]) {
    [[unroll]] for (uint c = c0; c < c0 + count; c++) {
        uint o = c / (QK / 32u) * BB, sub = c % (QK / 32u), xb = xb0 + c * 8u;
        float A[RL], B[RL];
        [[unroll]] for (uint i = 0u; i < RL; i++) {
            a = win[i];
            chunk_scale(o, sub, A[i], B[i]);
        }
        if (JROLL != 0u) {
            vec4 q[8];
            [[unroll]] for (uint k = 0u; k < 8u; k++) q[k] = chunk_q(o, sub, k);
            [[dont_unroll]] for (uint jj = 0u; jj < NJ; jj++) {
                vec4 xs[8];
                load_x(xj[jj] + xb, xs);
                precise float s = 0.0;
                float p[8];
                [[unroll]] for (uint k = 0u; k < 8u; k++) {
                    dot4(s, q[k], xs[k]);
                    p[k] = sum4(xs[k]);
                }
                acc[0][jj] = combine(acc[0][jj], A[0], B[0], s, OFFSET ? tree8(p) : 0.0);
            }
        } else if (NJ > ISLOTS) {
            // every row's chunk decoded once (spilled: it serves NJ slots), then slot by slot
            // the chains of all rows: RL sums and one x value live at a time, not RL x NJ
            // (lavapipe keeps each live value in a SIMD register; 16 on AVX2)
            vec4 q[RL][8];
            [[unroll]] for (uint i = 0u; i < RL; i++) {
                a = win[i];
                [[unroll]] for (uint k = 0u; k < 8u; k++) q[i][k] = chunk_q(o, sub, k);
            }
            vec4 mine = vec4(0.0);
            float tl = 0.0;
            [[unroll]] for (uint jj = 0u; jj < NJ; jj++) {
                if (XBCAST != 0u && jj % XB == 0u) {
                    mine = x_slots(xj, jj, xb);
                    if (OFFSET) tl = lanes_sum(mine);
                }
                precise float s[RL];
                float p[8];
                [[unroll]] for (uint k = 0u; k < 8u; k++) {
                    vec4 xk = XBCAST != 0u ? subgroupShuffle(mine, 8u * (jj % XB) + k) : x4(xj[jj] + xb + k);
                    p[k] = sum4(xk);
                    [[unroll]] for (uint i = 0u; i < RL; i++) {
                        if (k == 0u) s[i] = 0.0;
                        dot4(s[i], q[i][k], xk);
                    }
                }
                float t = !OFFSET ? 0.0 : XBCAST != 0u ? slot_sum(tl, jj) : tree8(p);
                [[unroll]] for (uint i = 0u; i < RL; i++) acc[i][jj] = combine(acc[i][jj], A[i], B[i], s[i], t);
            }
        } else {
            // one slot (or up to ISLOTS): 4 values of every row's chunk decoded at a time, then
            // that step of every row's chain, so nothing spills
            vec4 mine[NJ];
            float tl[NJ], p[NJ][8];
            if (XBCAST != 0u)
                [[unroll]] for (uint jj = 0u; jj < NJ; jj += XB) {
                    mine[jj] = x_slots(xj, jj, xb);
                    if (OFFSET) tl[jj] = lanes_sum(mine[jj]);
                }
            precise float s[RL][NJ];
            [[unroll]] for (uint k = 0u; k < 8u; k++) {
                vec4 q[RL];
                [[unroll]] for (uint i = 0u; i < RL; i++) {
                    a = win[i];
                    q[i] = chunk_q(o, sub, k);
                }
                [[unroll]] for (uint jj = 0u; jj < NJ; jj++) {
                    vec4 xk = XBCAST != 0u ? subgroupShuffle(mine[jj - jj % XB], 8u * (jj % XB) + k) : x4(xj[jj] + xb + k);
                    p[jj][k] = sum4(xk);
                    [[unroll]] for (uint i = 0u; i < RL; i++) {
                        if (k == 0u) s[i][jj] = 0.0;
                        dot4(s[i][jj], q[i], xk);
                    }
                }
            }
            [[unroll]] for (uint i = 0u; i < RL; i++)
                [[unroll]] for (uint jj = 0u; jj < NJ; jj++) {
                    float t = !OFFSET ? 0.0 : XBCAST != 0u ? slot_sum(tl[jj - jj % XB], jj) : tree8(p[jj]);
                    acc[i][jj] = combine(acc[i][jj], A[i], B[i], s[i][jj], t);
                }
        }
    }
}

void main() {
    const uint RPG = gl_WorkGroupSize.x / SPLIT;  // row slots per workgroup
    uint lane = gl_LocalInvocationID.x, part = lane % SPLIT;
    uint nblk = p.cols / QK, xrow = p.cols / 4u;
    uint r[RL], row16[RL];  // row16: the row's first 16-byte word
    [[unroll]] for (uint i = 0u; i < RL; i++) {
        r[i] = (gl_WorkGroupID.x * RPG + lane / SPLIT) * RO + i % RO;
        // dead lanes read a real row and store nothing
        uint rr = min(r[i], p.rows - 1u);
        row16[i] = rr / TILE * TILE * (p.stride / 16u) + rr % TILE;
    }
    // activation rows past n repeat row n-1: computed, never stored (no branches: every lane
    // must reach the shuffles, and SIMD CPUs would run a skipped branch anyway)
    uint xj[NJ];
    [[unroll]] for (uint jj = 0u; jj < NJ; jj++) xj[jj] = min(gl_WorkGroupID.y * NJ + jj, p.n - 1u) * xrow;
#ifdef NORM
    [[unroll]] for (uint jj = 0u; jj < NJ; jj++) nscale[jj] = rms_scale(xj[jj], xrow, p.cols, p.eps);
#endif

    precise float acc[RL][NJ];
    [[unroll]] for (uint i = 0u; i < RL; i++)
        [[unroll]] for (uint jj = 0u; jj < NJ; jj++) acc[i][jj] = 0.0;

    uint ng = WIDE_ON ? nblk / G : nblk;
    for (uint g = part; g < ng; g += SPLIT) {
        [[unroll]] for (uint i = 0u; i < RL; i++) {
            if (WIDE_ON) {
                load_group(row16[i] + g * (G * BB / 16u) * TILE, G, i >= RO);
            } else if (PLAIN) {
                uint base = g * BB / 4u;  // plain rows are 4-byte aligned
                [[unroll]] for (uint k = 0u; k < BB / 4u; k++) a[k] = w32(word32(row16[i], base + k));
            } else {
                load_block(row16[i], g * BB);
            }
            win[i] = a;
        }
        chunks(0u, CPG, g * G * QK / 4u, xj, acc);
    }
    if (WIDE_ON && TAIL > 0u && part == ng % SPLIT) {
        [[unroll]] for (uint i = 0u; i < RL; i++) {
            load_group(row16[i] + ng * (G * BB / 16u) * TILE, TAIL, i >= RO);
            win[i] = a;
        }
        chunks(0u, TAIL * QK / 32u, ng * G * QK / 4u, xj, acc);
    }
    if (SPLIT > 1u) {
        // butterfly: a + b == b + a bitwise, so every lane of the group ends with the same sum
        [[unroll]] for (uint i = 0u; i < RL; i++)
            [[unroll]] for (uint jj = 0u; jj < NJ; jj++)
                for (uint m = 1u; m < SPLIT; m <<= 1) acc[i][jj] = acc[i][jj] + subgroupShuffleXor(acc[i][jj], m);
    }
    // A lane's RO rows are consecutive, so with VEC one store writes them all: lavapipe runs
    // each store as a loop over the lanes with stack round trips per value, and at 16 rows the
    // per-float stores held ~9% of the pass (16-row SmolLM2 pass 87 -> 80 ms).
#ifdef ROPE
    // pairs (2i, 2i + 1) of a head turn by pos * freq_i (i < half_rot), in Q and K only. Loads
    // are per-lane loops on lavapipe: each lane loads its pairs' angles and one slot's position
    // once, and the slots take theirs by shuffle
    const uint f0 = p.row0 + r[0], fs = f0 - (f0 < p.end0 ? 0u : p.end0);
    const uint pair0 = fs % p.head_dim / 2u;
    uvec2 fq[RO / 2u];
    [[unroll]] for (uint k = 0u; k < RO / 2u; k++) fq[k] = freq[min(pair0 + k, p.half_rot - 1u)];
    const int lane_pos = pos[min(gl_WorkGroupID.y * NJ + gl_SubgroupInvocationID % NJ, p.n - 1u)];
#endif
    bool add = p.acc != 0u;
    [[unroll]] for (uint jj = 0u; jj < NJ; jj++) {
        uint j = gl_WorkGroupID.y * NJ + jj;
        float v[RO];
        [[unroll]] for (uint i = 0u; i < RO; i++) {
            // silu(g) * u spelled as elementwise.comp's swiglu, so the bits match it
            float g = acc[i][jj];
            v[i] = GLU_ON ? g / (1.0 + exp(-g)) * acc[GLU_ON ? i + RO : i][jj] : g;
        }
#ifdef ROPE
        const int pj = subgroupShuffle(lane_pos, jj);
        [[unroll]] for (uint i = 0u; i + 1u < RO; i += 2u) {
            if (f0 < p.end1 && pair0 + i / 2u < p.half_rot) {
                vec2 sc = sincos_turns(pj, fq[i / 2u]);
                precise float r0 = v[i] * sc.y - v[i + 1u] * sc.x, r1 = v[i] * sc.x + v[i + 1u] * sc.y;
                v[i] = r0;
                v[i + 1u] = r1;
            }
        }
#endif
        if (part != 0u || j >= p.n) continue;
        if (VEC != 0u && RO == 4u) {
            uint at = y_index(j, p.row0 + r[0]) / 4u;
            vec4 o = vec4(v[0], v[1 % RO], v[2 % RO], v[3 % RO]);
            if (r[0] < p.rows) y4[at] = add ? y4[at] + o : o;
        } else if (VEC != 0u && RO == 2u) {
            uint at = y_index(j, p.row0 + r[0]) / 2u;
            vec2 o = vec2(v[0], v[1 % RO]);
            if (r[0] < p.rows) y2[at] = add ? y2[at] + o : o;
        } else {
            [[unroll]] for (uint i = 0u; i < RO; i++) {
                uint at = y_index(j, p.row0 + r[i]);
                if (r[i] < p.rows) y[at] = add ? y[at] + v[i] : v[i];
            }
        }
    }
}
