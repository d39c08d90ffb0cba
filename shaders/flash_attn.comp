#version 450
// Fused attention (flash-style online softmax) reading a ggml-layout KV cache of any cache type.
//
// A workgroup of LANES invocations handles R = QT x G (query, head) rows: QT consecutive
// queries times G heads that share one kv head, so each K/V row fetched and dequantized serves
// all R rows. Lane j walks the cache positions j, j+LANES, j+2*LANES, ... one at a time, keeping
// per row a running max, running sum and weighted sum of V rows (f32); a row skips positions it
// may not see. At the end the lanes merge their states, lane l summing the others in the fixed
// order l^0, l^1, ..., l^(LANES-1) (by subgroup shuffles, or through shared memory after one
// barrier; no tree), and lane l writes the outputs d4 with d4 % LANES == l. A row's operations depend
// only on its own visible length, never on n_q, QT or G, so its output has the same bits
// however the queries are batched or chunked (batch invariance).
// TEXEL variant: Q, K and V are read as uniform texel buffers (see mul_mat.comp: cheaper loads
// on lavapipe).
//! variant flash_attn
//! variant flash_attn_texel TEXEL=1
#extension GL_KHR_shader_subgroup_shuffle : enable
#include "common.glsl"
#include "types.glsl"
#include "hadamard.glsl"

layout(constant_id = 1) const uint HD = 128;     // head_dim, a multiple of 32
layout(constant_id = 2) const uint K_TYPE = 1u;  // ggml type id of the K cache
layout(constant_id = 3) const uint V_TYPE = 1u;  // ggml type id of the V cache
layout(constant_id = 4) const uint G = 1u;       // heads per workgroup, all on one kv head
layout(constant_id = 5) const uint QT = 1u;      // queries per workgroup
layout(constant_id = 6) const uint K_ROT = 0u;   // Hadamard chunk of a rotated K cache (0: none)
layout(constant_id = 7) const float K_ROT_SCALE = 1.0;  // f32(1/sqrt(K_ROT))
// 1: the workgroup lies in one subgroup, whose shuffles merge the lanes' states; shared memory
// and a barrier cost lavapipe 2x the attention itself at 16 query rows
layout(constant_id = 8) const bool SHUFFLE_MERGE = false;
// PACK groups of LANES lanes share a workgroup (SHUFFLE_MERGE only: a 16-lane SIMD vector would
// otherwise run 8 lanes), each group a workgroup of its own as above: part p of workgroup w is
// group w * PACK + p along y (queries) when PACK_Y, else along x (heads)
layout(constant_id = 9) const uint PACK = 1u;
layout(constant_id = 10) const bool PACK_Y = false;
const uint LANES = gl_WorkGroupSize.x / PACK;
const uint MERGE_LANES = SHUFFLE_MERGE ? LANES : 1u;
const uint R = QT * G;                           // rows per workgroup: row r = (query r / G, head r % G)

// Cache rows are only 2-byte aligned, but lavapipe gathers every load lane by lane, so whole
// 16-byte vectors are read and the 16-bit words picked out with selects (fetch_k / fetch_v).
// The host binds the cache padded to a 16-byte boundary.
#ifdef TEXEL
layout(binding = 0) uniform samplerBuffer q_tex;   // [n_q, n_head, HD]
layout(binding = 1) uniform usamplerBuffer k_tex;  // [n_ctx] rows of n_head_kv*HD values
layout(binding = 2) uniform usamplerBuffer v_tex;
vec4 q_in(uint i) { return texelFetch(q_tex, int(i)); }
uvec4 k_cache(uint i) { return texelFetch(k_tex, int(i)); }
uvec4 v_cache(uint i) { return texelFetch(v_tex, int(i)); }
#else
layout(binding = 0) readonly buffer Q { vec4 q_in_[]; };
layout(binding = 1) readonly buffer K { uvec4 k_cache_[]; };
layout(binding = 2) readonly buffer V { uvec4 v_cache_[]; };
vec4 q_in(uint i) { return q_in_[i]; }
uvec4 k_cache(uint i) { return k_cache_[i]; }
uvec4 v_cache(uint i) { return v_cache_[i]; }
#endif
layout(binding = 3) writeonly buffer O { vec4 o_out[]; };      // [n_q, n_head, HD]
layout(binding = 4) readonly buffer Params { uint first_pos; };  // rewritten between replays

layout(push_constant) uniform Push {
    uint n_q, n_head, gqa;    // gqa = n_head / n_head_kv
    uint n_ctx;               // rows in the cache binding: visible lengths are clamped to it
    uint k_row, v_row;        // 16-bit words per cache row
    uint block_mask;          // 0: causal, 1: every query sees the whole block
    float scale;
} p;

const uint NB = HD / 32;

// One head's row of K / V as 16-bit words (f32, the widest type, needs 2 words per value).
// Private arrays indexed by constants only, so they live in registers.
uint k_row[2 * HD];
uint v_row[2 * HD];

// Copy the n 16-bit words starting at 16-bit index `base` of BUF into W: read the 16-byte
// vectors covering them (never past the one holding the last word), then shift by the start's
// 32-bit slot r and its 16-bit half.
#define DEFINE_FETCH(NAME, BUF, W)                                                      \
    void NAME(uint base, uint n) {                                                     \
        const uint w0 = base >> 1, r = w0 & 3u, a0 = w0 >> 2, a_last = (base + n - 1u) >> 3; \
        const bool odd = (base & 1u) != 0u;                                            \
        uint u[HD + 8];                                                                \
        [[unroll]] for (uint k = 0; k < (n / 2u + 7u) / 4u; k++) {                     \
            uvec4 x = BUF(min(a0 + k, a_last));                                        \
            u[4u * k] = x.x; u[4u * k + 1u] = x.y; u[4u * k + 2u] = x.z; u[4u * k + 3u] = x.w; \
        }                                                                              \
        uint cur = r == 0u ? u[0] : r == 1u ? u[1] : r == 2u ? u[2] : u[3];            \
        [[unroll]] for (uint j = 0; j < n / 2u; j++) {                                 \
            uint nxt = r == 0u ? u[j + 1u] : r == 1u ? u[j + 2u] : r == 2u ? u[j + 3u] : u[j + 4u]; \
            W[2u * j] = odd ? cur >> 16 : cur & 0xFFFFu;                               \
            W[2u * j + 1u] = odd ? nxt & 0xFFFFu : cur >> 16;                          \
            cur = nxt;                                                                 \
        }                                                                              \
        if ((n & 1u) != 0u) W[n - 1u] = odd ? cur >> 16 : cur & 0xFFFFu;              \
    }
DEFINE_FETCH(fetch_k, k_cache, k_row)
DEFINE_FETCH(fetch_v, v_cache, v_row)

#define DQ_BUF k_row
#define DQ_FN dequant_k
#include "dequant.glsl"
#undef DQ_BUF
#undef DQ_FN
#define DQ_BUF v_row
#define DQ_FN dequant_v
#include "dequant.glsl"

const float NO_SCORE = -3.0e38;  // finite "minus infinity": exp2(NO_SCORE - s) is exactly 0

shared float sh_m[R * gl_WorkGroupSize.x];
shared float sh_l[R * gl_WorkGroupSize.x];
shared vec4 sh_acc[R * HD / 4u * gl_WorkGroupSize.x];
shared float sh_q[K_ROT > 0u ? PACK * R * HD : 1u];  // the rotated queries

void main() {
    const uint lane = gl_LocalInvocationID.x % LANES, part = gl_LocalInvocationID.x / LANES;
    const uint gx = PACK_Y ? gl_WorkGroupID.x : gl_WorkGroupID.x * PACK + part;
    const uint gy = PACK_Y ? gl_WorkGroupID.y * PACK + part : gl_WorkGroupID.y;
    const bool dead = gx * G >= p.n_head;  // a part past the last head group: sees nothing
    const uint h0 = dead ? 0u : gx * G, q0 = dead ? p.n_q : gy * QT;
    const uint kv_head = h0 / p.gqa;
    const uint k_blk = type_u16(K_TYPE), v_blk = type_u16(V_TYPE);
    const uint k_off = kv_head * NB * k_blk, v_off = kv_head * NB * v_blk;

    uint vis[QT];  // visible cache length per query (0: past n_q)
    uint vis_max = 0u;
    [[unroll]] for (uint t = 0; t < QT; t++) {
        const uint qi = q0 + t;
        vis[t] = qi < p.n_q ? min(p.block_mask != 0u ? first_pos + p.n_q : first_pos + qi + 1u, p.n_ctx) : 0u;
        vis_max = max(vis_max, vis[t]);
    }

    // Q is rotated like the K cache (the caller's Q is only read), then scaled into log2
    // units, so the softmax uses exp2
    const float qscale = p.scale * 1.4426950408889634;
    float q[R * HD];
    if (K_ROT > 0u) {
        // The lanes rotate the R rows' chunks into shared memory, one chunk each in turn: one
        // rolled FWHT (unrolled per row, it would cost seconds of compile on lavapipe).
        for (uint c = lane; c < R * HD / K_ROT; c += LANES) {
            const uint r = c * K_ROT / HD, qi = min(q0 + r / G, p.n_q - 1u);
            const uint src = (qi * p.n_head + h0 + r % G) * HD + c * K_ROT - r * HD;
            float v[K_ROT > 0u ? K_ROT : 1u];
            for (uint i = 0; i < K_ROT; i += 4) {
                vec4 x = q_in((src + i) / 4u);
                v[i] = x.x; v[i + 1] = x.y; v[i + 2] = x.z; v[i + 3] = x.w;
            }
            FWHT(v, 0u, K_ROT, K_ROT_SCALE)
            for (uint i = 0; i < K_ROT; i++) sh_q[part * R * HD + c * K_ROT + i] = v[i];
        }
        barrier();
        [[unroll]] for (uint d = 0; d < R * HD; d++) q[d] = sh_q[part * R * HD + d] * qscale;
    } else {
        [[unroll]] for (uint r = 0; r < R; r++) {
            const uint qi = min(q0 + r / G, p.n_q - 1u);  // rows past n_q load a real query, never used
            const uint q_off = (qi * p.n_head + h0 + r % G) * (HD / 4u);
            [[unroll]] for (uint d = 0; d < HD; d += 4) {
                vec4 x = q_in(q_off + d / 4u) * qscale;
                q[r * HD + d] = x.x; q[r * HD + d + 1] = x.y; q[r * HD + d + 2] = x.z; q[r * HD + d + 3] = x.w;
            }
        }
    }

    float acc[R * HD];
    [[unroll]] for (uint d = 0; d < R * HD; d++) acc[d] = 0.0;
    float m[R], l[R], w[R];
    [[unroll]] for (uint r = 0; r < R; r++) { m[r] = NO_SCORE; l[r] = 0.0; }
    float blk[32];

    for (uint pos = lane; pos < vis_max; pos += LANES) {
        fetch_k(pos * p.k_row + k_off, NB * k_blk);
        vec4 s4[R];  // four partial sums per row: shorter dependency chains
        [[unroll]] for (uint r = 0; r < R; r++) s4[r] = vec4(0.0);
        [[unroll]] for (uint b = 0; b < NB; b++) {
            dequant_k(K_TYPE, b * k_blk, 0u, blk);
            [[unroll]] for (uint r = 0; r < R; r++) {
                const uint o = r * HD + 32 * b;
                [[unroll]] for (uint i = 0; i < 32; i += 4)
                    s4[r] = fma(vec4(q[o + i], q[o + i + 1], q[o + i + 2], q[o + i + 3]),
                                vec4(blk[i], blk[i + 1], blk[i + 2], blk[i + 3]), s4[r]);
            }
        }
        [[unroll]] for (uint r = 0; r < R; r++) {
            if (QT == 1u || pos < vis[r / G]) {
                const float s = (s4[r].x + s4[r].y) + (s4[r].z + s4[r].w);
                if (s > m[r]) {  // new running max: rescale what was accumulated so far
                    const float c = exp2(m[r] - s);
                    l[r] *= c;
                    [[unroll]] for (uint d = 0; d < HD; d++) acc[r * HD + d] *= c;
                    m[r] = s;
                }
                w[r] = exp2(s - m[r]);
                l[r] += w[r];
            }
        }
        fetch_v(pos * p.v_row + v_off, NB * v_blk);
        [[unroll]] for (uint b = 0; b < NB; b++) {
            dequant_v(V_TYPE, b * v_blk, 0u, blk);
            [[unroll]] for (uint r = 0; r < R; r++) {
                if (QT == 1u || pos < vis[r / G]) {
                    const uint o = r * HD + 32 * b;
                    [[unroll]] for (uint i = 0; i < 32; i++) acc[o + i] = fma(w[r], blk[i], acc[o + i]);
                }
            }
        }
    }

    if (SHUFFLE_MERGE) {
        // lane l reads lane l^j's state by shuffle (j < LANES: within l's part)
        [[unroll]] for (uint r = 0; r < R; r++) {
            const uint qi = q0 + r / G;
            float mx = NO_SCORE, sum = 0.0, f[MERGE_LANES];
            [[unroll]] for (uint j = 0; j < LANES; j++) mx = max(mx, subgroupShuffleXor(m[r], j));
            [[unroll]] for (uint j = 0; j < LANES; j++) {
                f[j] = exp2(subgroupShuffleXor(m[r], j) - mx);
                sum = fma(subgroupShuffleXor(l[r], j), f[j], sum);
            }
            const float inv = sum > 0.0 ? 1.0 / sum : 0.0;
            const uint o_off = (qi * p.n_head + h0 + r % G) * (HD / 4u);
            [[unroll]] for (uint d4 = 0; d4 < HD / 4u; d4++) {
                const uint d = r * HD + 4u * d4;
                const vec4 mine = vec4(acc[d], acc[d + 1u], acc[d + 2u], acc[d + 3u]);
                vec4 o = vec4(0.0);
                [[unroll]] for (uint j = 0; j < LANES; j++) o = fma(subgroupShuffleXor(mine, j), vec4(f[j]), o);
                if (qi < p.n_q && d4 % LANES == lane) o_out[o_off + d4] = o * inv;
            }
        }
        return;
    }
    [[unroll]] for (uint r = 0; r < R; r++) {
        sh_m[r * LANES + lane] = m[r];
        sh_l[r * LANES + lane] = l[r];
        [[unroll]] for (uint d = 0; d < HD; d += 4)
            sh_acc[(r * HD + d) / 4u * LANES + lane] =
                vec4(acc[r * HD + d], acc[r * HD + d + 1], acc[r * HD + d + 2], acc[r * HD + d + 3]);
    }
    barrier();

    for (uint r = 0; r < R; r++) {
        const uint qi = q0 + r / G;
        if (qi >= p.n_q) break;
        float mx = NO_SCORE;
        for (uint j = 0; j < LANES; j++) mx = max(mx, sh_m[r * LANES + j]);
        float sum = 0.0;
        for (uint j = 0; j < LANES; j++) sum = fma(sh_l[r * LANES + (lane ^ j)], exp2(sh_m[r * LANES + (lane ^ j)] - mx), sum);
        const float inv = sum > 0.0 ? 1.0 / sum : 0.0;
        const uint o_off = (qi * p.n_head + h0 + r % G) * (HD / 4u);
        for (uint d4 = lane; d4 < HD / 4u; d4 += LANES) {
            vec4 o = vec4(0.0);
            for (uint j = 0; j < LANES; j++)
                o = fma(sh_acc[(r * HD / 4u + d4) * LANES + (lane ^ j)], vec4(exp2(sh_m[r * LANES + (lane ^ j)] - mx)), o);
            o_out[o_off + d4] = o * inv;
        }
    }
}
