// Quantize 32 f32 values into one block of a KV-cache type, bit-exact with gguf-py and
// ggml's reference quantizers (quantize_row_*_ref; iq4_nl: quantize_row_iq4_nl_ref).
// Include once per destination buffer after defining
//   QZ_BUF  the uint16_t[] array receiving the blocks
//   QZ_FN   the name to give the function
//   QZ_BUF4 the same memory as uvec4[], and QZ_WIDE a bool: when true, plain types (whole
//           16-byte words: blocks of 64 or 128 bytes from a 16-byte aligned binding) are
//           written 16 bytes a store, a quarter to an eighth of lavapipe's per-lane store loops
// It defines: void QZ_FN(uint type, uint base, float x[32])
//   base: index in QZ_BUF of the block's first 16-bit word (type_u16(type) words are written).
// Plain types (f32/f16/bf16) count as 32-value blocks, as in dequant.glsl.
//
// Exactness: Vulkan lets '/' be 2.5 ulp off and f16 packing round as it likes, while d and
// 1/d decide every quant; so divisions go through div_rn and f16 through f32_to_f16_rn
// (integer arithmetic, IEEE round-to-nearest-even), and `precise` keeps the compiler
// from fusing multiply-adds that the references round separately.

#ifndef QUANTIZE_HELPERS
#define QUANTIZE_HELPERS

// a / b correctly rounded, for finite a and finite nonzero b (others fall back to '/').
float div_rn(float a, float b) {
    uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
    uint sign = (ua ^ ub) & 0x80000000u;
    uint ea = (ua >> 23) & 0xFFu, eb = (ub >> 23) & 0xFFu;
    uint ma = ua & 0x7FFFFFu, mb = ub & 0x7FFFFFu;
    if (ea == 255u || eb == 255u || (eb == 0u && mb == 0u)) return a / b;
    if (ea == 0u && ma == 0u) return uintBitsToFloat(sign);
    int xa = int(ea), xb = int(eb);
    if (ea == 0u) { int s = 23 - findMSB(ma); ma <<= uint(s); xa = 1 - s; } else { ma |= 0x800000u; }
    if (eb == 0u) { int s = 23 - findMSB(mb); mb <<= uint(s); xb = 1 - s; } else { mb |= 0x800000u; }
    int e = xa - xb + 127;  // biased exponent of the quotient
    if (ma < mb) { ma <<= 1; e -= 1; }
    if (e >= 255) return uintBitsToFloat(sign | 0x7F800000u);
    // restoring division: 24 quotient bits, r = twice the remainder
    uint q = 0u, r = ma;
    for (int i = 0; i < 24; i++) {
        q <<= 1;
        if (r >= mb) { r -= mb; q |= 1u; }
        r <<= 1;
    }
    if (e >= 1) {
        q += (r > mb || (r == mb && (q & 1u) != 0u)) ? 1u : 0u;
        uint bits = (uint(e - 1) << 23) + q;  // the hidden bit carries into the exponent
        return uintBitsToFloat(sign | min(bits, 0x7F800000u));
    }
    uint s = uint(1 - e);  // subnormal result: shift the 24-bit quotient right by s
    if (s > 24u) return uintBitsToFloat(sign);
    uint kept = q >> s, rem = q & ((1u << s) - 1u), half_ = 1u << (s - 1u);
    kept += (rem > half_ || (rem == half_ && (r != 0u || (kept & 1u) != 0u))) ? 1u : 0u;
    return uintBitsToFloat(sign | kept);
}

// f32 -> f16 bits, round to nearest even with subnormals and overflow to inf (as numpy).
uint f32_to_f16_rn(float x) {
    uint u = floatBitsToUint(x);
    uint sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);
    if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
    if (a >= 0x38800000u) {                       // normal f16
        uint r = a - 0x38000000u;
        return sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
    }
    if (a <= 0x33000000u) return sign;            // <= 2^-25 rounds to zero
    uint m = (a & 0x7FFFFFu) | 0x800000u, s = 126u - (a >> 23);
    uint kept = m >> s, rem = m & ((1u << s) - 1u), half_ = 1u << (s - 1u);
    return sign | (kept + ((rem > half_ || (rem == half_ && (kept & 1u) != 0u)) ? 1u : 0u));
}

// Nearest IQ4_NL codebook index, as ggml's best_index_int8: count the midpoints 2x reaches.
uint iq4nl_index(float x) {
    const float MID2[15] = float[15](-231., -187., -148., -114., -84., -57., -32., -9.,
                                     14., 38., 63., 91., 122., 158., 202.);
    float x2 = x + x;
    uint l = 0u;
    [[unroll]] for (uint i = 0; i < 15; i++) l += x2 >= MID2[i] ? 1u : 0u;
    return l;
}

// round half away from zero, as C roundf and gguf-py np_roundf
int round_away(float v) {
    precise float a = abs(v);
    precise float f = floor(a);
    int q = int(f) + ((a - f) >= 0.5 ? 1 : 0);
    return v < 0.0 ? -q : q;
}

#endif

#define QZ_W(i, val) QZ_BUF[base + (i)] = uint16_t(val)
#define QZ_W4(k, val) QZ_BUF4[base / 8u + (k)] = (val)
// q[32] as ggml nibbles from word w0 on, preceded by the 32 fifth bits when q5 (q5_0, q5_1)
#define QZ_PACK(q, q5, w0) { \
    uint qs_ = (w0); \
    if (q5) { \
        uint qh_ = 0u; \
        [[unroll]] for (uint i_ = 0; i_ < 32; i_++) qh_ |= (q[i_] >> 4) << i_; \
        QZ_W(qs_, qh_ & 0xFFFFu); QZ_W(qs_ + 1u, qh_ >> 16); \
        qs_ += 2u; \
    } \
    [[unroll]] for (uint k_ = 0; k_ < 8; k_++) { \
        uint j_ = 2 * k_; \
        QZ_W(qs_ + k_, (q[j_] & 15u) | ((q[j_ + 16] & 15u) << 4) | ((q[j_ + 1] & 15u) << 8) \
                        | ((q[j_ + 17] & 15u) << 12)); \
    } \
}

void QZ_FN(uint type, uint base, float x[32]) {
    switch (type) {
    case T_F32:
        if (QZ_WIDE) {
            [[unroll]] for (uint k = 0; k < 8; k++)
                QZ_W4(k, floatBitsToUint(vec4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3])));
            break;
        }
        [[unroll]] for (uint i = 0; i < 32; i++) {
            uint u = floatBitsToUint(x[i]);
            QZ_W(2 * i, u & 0xFFFFu); QZ_W(2 * i + 1, u >> 16);
        }
        break;
    case T_F16: case T_BF16: {
        uint h[32];
        [[unroll]] for (uint i = 0; i < 32; i++) h[i] = type == T_F16 ? f32_to_f16_rn(x[i]) : f32_to_bf16(x[i]);
        if (QZ_WIDE) {
            [[unroll]] for (uint k = 0; k < 4; k++) {
                const uint i = 8 * k;
                QZ_W4(k, uvec4(h[i] | (h[i + 1] << 16), h[i + 2] | (h[i + 3] << 16),
                               h[i + 4] | (h[i + 5] << 16), h[i + 6] | (h[i + 7] << 16)));
            }
            break;
        }
        [[unroll]] for (uint i = 0; i < 32; i++) QZ_W(i, h[i]);
        break;
    }
    case T_Q8_0: {
        float amax = 0.0;
        [[unroll]] for (uint i = 0; i < 32; i++) amax = max(amax, abs(x[i]));
        float d = div_rn(amax, 127.0);
        float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        QZ_W(0, f32_to_f16_rn(d));
        [[unroll]] for (uint k = 0; k < 16; k++) {
            precise float v0 = x[2 * k] * id, v1 = x[2 * k + 1] * id;
            uint q0 = uint(round_away(v0)) & 0xFFu, q1 = uint(round_away(v1)) & 0xFFu;
            QZ_W(1 + k, q0 | (q1 << 8));
        }
        break;
    }
    case T_Q4_0: case T_Q5_0: {
        // d = (signed value of largest magnitude) / -8 (-16); q = trunc(x/d + 8.5 (16.5))
        bool q5 = type == T_Q5_0;
        // first value of largest magnitude; x[0] when all are zero (gguf-py's argmax)
        float amax = abs(x[0]), vmax = x[0];
        [[unroll]] for (uint i = 1; i < 32; i++) if (amax < abs(x[i])) { amax = abs(x[i]); vmax = x[i]; }
        float d = div_rn(vmax, q5 ? -16.0 : -8.0);
        float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        float off = q5 ? 16.5 : 8.5;
        uint qmax = q5 ? 31u : 15u;
        uint q[32];
        [[unroll]] for (uint i = 0; i < 32; i++) {
            precise float v = x[i] * id + off;
            q[i] = min(qmax, uint(max(v, 0.0)));
        }
        QZ_W(0, f32_to_f16_rn(d));
        QZ_PACK(q, q5, 1u);
        break;
    }
    case T_Q4_1: case T_Q5_1: {
        // d = (max - min) / 15 (31), m = min; q = trunc((x - min)/d + 0.5)
        bool q5 = type == T_Q5_1;
        float vmin = x[0], vmax = x[0];
        [[unroll]] for (uint i = 1; i < 32; i++) { vmin = min(vmin, x[i]); vmax = max(vmax, x[i]); }
        precise float range = vmax - vmin;
        float d = div_rn(range, q5 ? 31.0 : 15.0);
        float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        uint qmax = q5 ? 31u : 15u;
        uint q[32];
        [[unroll]] for (uint i = 0; i < 32; i++) {
            precise float v = (x[i] - vmin) * id + 0.5;
            q[i] = min(qmax, uint(max(v, 0.0)));
        }
        QZ_W(0, f32_to_f16_rn(d));
        QZ_W(1, f32_to_f16_rn(vmin));
        QZ_PACK(q, q5, 2u);
        break;
    }
    case T_IQ4_NL: {
        // quantize_row_iq4_nl_ref: d = max/-127, nearest codebook entries, then the
        // least-squares scale sum(w q x)/sum(w q^2) with weights w = x^2
        float amax = 0.0, vmax = 0.0;
        [[unroll]] for (uint i = 0; i < 32; i++) if (amax < abs(x[i])) { amax = abs(x[i]); vmax = x[i]; }
        uint l[32];
        float d = 0.0;
        if (amax < 1e-15) {  // GROUP_MAX_EPS: an all-zero block
            [[unroll]] for (uint i = 0; i < 32; i++) l[i] = 0u;
        } else {
            float id = div_rn(1.0, div_rn(vmax, -127.0));
            precise float sumqx = 0.0, sumq2 = 0.0;
            [[unroll]] for (uint i = 0; i < 32; i++) {
                precise float al = id * x[i];
                l[i] = iq4nl_index(al);
                float q = IQ4NL_VALUES[l[i]];
                precise float wq = (x[i] * x[i]) * q;
                sumqx = sumqx + wq * x[i];
                sumq2 = sumq2 + wq * q;
            }
            d = sumq2 > 0.0 ? div_rn(sumqx, sumq2) : 0.0;
        }
        QZ_W(0, f32_to_f16_rn(d));
        [[unroll]] for (uint k = 0; k < 8; k++) {
            uint j = 2 * k;
            QZ_W(1 + k, l[j] | (l[j + 16] << 4) | (l[j + 1] << 8) | (l[j + 17] << 12));
        }
        break;
    }
    }
}

#undef QZ_W
#undef QZ_PACK
