#version 450
// RoPE (ggml_rope, no YaRN): pair i < n_rot/2 of every head turns by pos * freq_i.
// normal (ggml mode 0) pairs elements (2i, 2i+1); NEOX (mode 2) pairs (i, i + n_rot/2);
// elements from n_rot on pass through. One lane per (token, pair), looping over heads so
// each angle is computed once: the heads of x, then those of x2 (a second tensor at the same
// positions, e.g. K with Q: one dispatch instead of two).
// TEXEL variant (CPU devices): one lane per (token, 4 pairs), reading x as vec4 texels and
// writing vec4s: lavapipe loops over the lanes for every storage access, so a quarter as many
// accesses. Needs head_dim and n_rot multiples of 8 and 16-byte aligned views.
//! variant rope
//! variant rope_texel TEXEL=1
#include "common.glsl"
#include "rope.glsl"

layout(constant_id = 1) const bool NEOX = false;

layout(binding = 1) readonly buffer Pos { int pos[]; };     // per token, rewritten between replays
layout(binding = 2) readonly buffer Freq { uvec2 freq[]; }; // per pair: freq_i / 2pi, 0.64 fixed point (lo, hi)
#ifdef TEXEL
layout(binding = 0) uniform samplerBuffer x_tex;
layout(binding = 3) writeonly buffer Y { vec4 y[]; };
layout(binding = 4) uniform samplerBuffer x2_tex;
layout(binding = 5) writeonly buffer Y2 { vec4 y2[]; };
#else
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 3) writeonly buffer Y { float y[]; };
layout(binding = 4) readonly buffer X2 { float x2[]; };
layout(binding = 5) writeonly buffer Y2 { float y2[]; };
#endif
layout(push_constant) uniform Push { uint n_tokens; uint n_heads; uint half_dim; uint half_rot; uint n_heads2; } p;

#ifdef TEXEL
// Pairs 4q..4q+3 turned by sc[0..3]: normal mode holds them in vec4s a, b (elements 8q..8q+7),
// NEOX holds their first elements in a and their partners in b.
void turn(inout vec4 a, inout vec4 b, const vec2 sc[4], const bool rotated) {
    if (!rotated) return;
    if (NEOX) {
        const vec4 s = vec4(sc[0].x, sc[1].x, sc[2].x, sc[3].x), c = vec4(sc[0].y, sc[1].y, sc[2].y, sc[3].y);
        const vec4 x0 = a, x1 = b;
        precise vec4 r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        a = r0;
        b = r1;
    } else {
        const vec4 x0 = vec4(a.xz, b.xz), x1 = vec4(a.yw, b.yw);
        const vec4 s = vec4(sc[0].x, sc[1].x, sc[2].x, sc[3].x), c = vec4(sc[0].y, sc[1].y, sc[2].y, sc[3].y);
        precise vec4 r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        a = vec4(r0.x, r1.x, r0.y, r1.y);
        b = vec4(r0.z, r1.z, r0.w, r1.w);
    }
}

void main() {
    const uint quads = p.half_dim / 4u, n_items = p.n_tokens * quads, head4 = p.half_dim / 2u;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint item = gl_GlobalInvocationID.x; item < n_items; item += stride) {
        const uint token = item / quads, q = item % quads;
        const bool rotated = 4u * q < p.half_rot;
        vec2 sc[4];
        for (uint k = 0u; k < 4u; k++) sc[k] = rotated ? sincos_turns(pos[token], freq[4u * q + k]) : vec2(0.0, 1.0);
        // texels of a and b within a head (elements past n_rot pass through, paired as normal)
        const uint ia = rotated && NEOX ? q : 2u * q, ib = rotated && NEOX ? q + p.half_rot / 4u : 2u * q + 1u;
        uint base = token * p.n_heads * head4;
        for (uint h = 0u; h < p.n_heads; h++, base += head4) {
            vec4 a = texelFetch(x_tex, int(base + ia)), b = texelFetch(x_tex, int(base + ib));
            turn(a, b, sc, rotated);
            y[base + ia] = a; y[base + ib] = b;
        }
        base = token * p.n_heads2 * head4;
        for (uint h = 0u; h < p.n_heads2; h++, base += head4) {
            vec4 a = texelFetch(x2_tex, int(base + ia)), b = texelFetch(x2_tex, int(base + ib));
            turn(a, b, sc, rotated);
            y2[base + ia] = a; y2[base + ib] = b;
        }
    }
}
#else
void main() {
    const uint n_items = p.n_tokens * p.half_dim, head_dim = 2u * p.half_dim;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint item = gl_GlobalInvocationID.x; item < n_items; item += stride) {
        const uint token = item / p.half_dim, j = item % p.half_dim;
        const bool rotated = j < p.half_rot;
        const uint i0 = rotated && NEOX ? j : 2u * j, i1 = rotated && NEOX ? j + p.half_rot : 2u * j + 1u;
        const vec2 sc = rotated ? sincos_turns(pos[token], freq[j]) : vec2(0.0, 1.0);
        uint base = token * p.n_heads * head_dim;
        for (uint h = 0u; h < p.n_heads; h++, base += head_dim) {
            const float x0 = x[base + i0], x1 = x[base + i1];
            precise float r0 = x0 * sc.y - x1 * sc.x, r1 = x0 * sc.x + x1 * sc.y;
            y[base + i0] = rotated ? r0 : x0;
            y[base + i1] = rotated ? r1 : x1;
        }
        base = token * p.n_heads2 * head_dim;
        for (uint h = 0u; h < p.n_heads2; h++, base += head_dim) {
            const float x0 = x2[base + i0], x1 = x2[base + i1];
            precise float r0 = x0 * sc.y - x1 * sc.x, r1 = x0 * sc.x + x1 * sc.y;
            y2[base + i0] = rotated ? r0 : x0;
            y2[base + i1] = rotated ? r1 : x1;
        }
    }
}
#endif
