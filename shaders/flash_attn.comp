#version 450
// Fused attention (flash-style online softmax) reading a ggml-layout KV cache of any cache type.
//
// One workgroup of LANES invocations per (query, head). Lane j walks the cache positions
// j, j+LANES, j+2*LANES, ... below the query's visible length, one position at a time, keeping
// its own running max, running sum and weighted sum of V rows (f32). At the end the lanes merge
// their states in fixed lane order (one barrier, no tree). The walk and the merge depend only
// on the visible length, never on n_q, so a query's output has the same bits however the
// queries are batched or chunked (batch invariance).
#include "common.glsl"
#include "types.glsl"

layout(constant_id = 1) const uint HD = 128;     // head_dim, a multiple of 32
layout(constant_id = 2) const uint K_TYPE = 1u;  // ggml type id of the K cache
layout(constant_id = 3) const uint V_TYPE = 1u;  // ggml type id of the V cache

layout(binding = 0) readonly buffer Q { vec4 q_in[]; };        // [n_q, n_head, HD]
// Cache rows are only 2-byte aligned, but lavapipe gathers every load lane by lane, so whole
// 16-byte vectors are read and the 16-bit words picked out with selects (fetch_k / fetch_v).
// The host binds the cache padded to a 16-byte boundary.
layout(binding = 1) readonly buffer K { uvec4 k_cache[]; };  // [n_ctx] rows of n_head_kv*HD values
layout(binding = 2) readonly buffer V { uvec4 v_cache[]; };
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
        [[unroll]] for (uint k = 0; k < (n / 2u + 7u) / 4u; k++) {              \
            uvec4 x = BUF[min(a0 + k, a_last)];                                        \
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

shared float sh_m[gl_WorkGroupSize.x];
shared float sh_l[gl_WorkGroupSize.x];
shared vec4 sh_acc[HD / 4u * gl_WorkGroupSize.x];

void main() {
    const uint LANES = gl_WorkGroupSize.x;
    const uint lane = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, qi = gl_WorkGroupID.y;
    const uint vis = min(p.block_mask != 0u ? first_pos + p.n_q : first_pos + qi + 1u, p.n_ctx);
    const uint kv_head = h / p.gqa;
    const uint k_blk = type_u16(K_TYPE), v_blk = type_u16(V_TYPE);
    const uint k_off = kv_head * NB * k_blk, v_off = kv_head * NB * v_blk;
    const uint q_off = (qi * p.n_head + h) * (HD / 4u);  // in vec4s

    // scores in log2 units, so the softmax uses exp2
    const float qscale = p.scale * 1.4426950408889634;
    float q[HD];
    [[unroll]] for (uint d = 0; d < HD; d += 4) {
        vec4 x = q_in[q_off + d / 4u] * qscale;
        q[d] = x.x; q[d + 1] = x.y; q[d + 2] = x.z; q[d + 3] = x.w;
    }

    float acc[HD];
    [[unroll]] for (uint d = 0; d < HD; d++) acc[d] = 0.0;
    float m = NO_SCORE, l = 0.0;
    float blk[32];

    for (uint pos = lane; pos < vis; pos += LANES) {
        fetch_k(pos * p.k_row + k_off, NB * k_blk);
        vec4 s4 = vec4(0.0);  // four partial sums: shorter dependency chains
        [[unroll]] for (uint b = 0; b < NB; b++) {
            dequant_k(K_TYPE, b * k_blk, 0u, blk);
            [[unroll]] for (uint i = 0; i < 32; i += 4)
                s4 = fma(vec4(q[32 * b + i], q[32 * b + i + 1], q[32 * b + i + 2], q[32 * b + i + 3]),
                         vec4(blk[i], blk[i + 1], blk[i + 2], blk[i + 3]), s4);
        }
        const float s = (s4.x + s4.y) + (s4.z + s4.w);
        if (s > m) {  // new running max: rescale what was accumulated so far
            float r = exp2(m - s);
            l *= r;
            [[unroll]] for (uint d = 0; d < HD; d++) acc[d] *= r;
            m = s;
        }
        float w = exp2(s - m);
        l += w;
        fetch_v(pos * p.v_row + v_off, NB * v_blk);
        [[unroll]] for (uint b = 0; b < NB; b++) {
            dequant_v(V_TYPE, b * v_blk, 0u, blk);
            [[unroll]] for (uint i = 0; i < 32; i++) acc[32 * b + i] = fma(w, blk[i], acc[32 * b + i]);
        }
    }

    sh_m[lane] = m;
    sh_l[lane] = l;
    [[unroll]] for (uint d = 0; d < HD; d += 4)
        sh_acc[d / 4u * LANES + lane] = vec4(acc[d], acc[d + 1], acc[d + 2], acc[d + 3]);
    barrier();

    float mx = NO_SCORE;
    for (uint j = 0; j < LANES; j++) mx = max(mx, sh_m[j]);
    float sum = 0.0;
    for (uint j = 0; j < LANES; j++) sum = fma(sh_l[j], exp2(sh_m[j] - mx), sum);
    const float inv = sum > 0.0 ? 1.0 / sum : 0.0;
    for (uint d4 = lane; d4 < HD / 4u; d4 += LANES) {
        vec4 o = vec4(0.0);
        for (uint j = 0; j < LANES; j++) o = fma(sh_acc[d4 * LANES + j], vec4(exp2(sh_m[j] - mx)), o);
        o_out[q_off + d4] = o * inv;
    }
}
