// Dequantize 32 consecutive values of one block, for any type in types.glsl.
// Include once per source buffer after defining
//   DQ_BUF  the uint16_t[] array holding the blocks
//   DQ_FN   the name to give the function
// and optionally DQ_INDEX(i), the DQ_BUF index of the block's 16-bit word i (default base + i).
// It defines: void DQ_FN(uint type, uint base, uint sub, out float v[32])
//   base: index in DQ_BUF of the block's first 16-bit word; sub: which 32-value chunk
//   of a 256-value K-quant block (0 for 32-value blocks).
// Layouts follow ggml exactly (docs/design.md section 3; k-quants as in ggml-quants.c).

#ifndef DQ_INDEX
#define DQ_INDEX(i) (base + (i))
#endif
#define DQ_W(i) uint(DQ_BUF[DQ_INDEX(i)])
#define DQ_B(off) ((DQ_W((off) >> 1) >> (((off) & 1u) << 3)) & 0xFFu)

// `precise`: no fma contraction, so values match gguf-py bit for bit on every device
void DQ_FN(uint type, uint base, uint sub, out precise float v[32]) {
    switch (type) {
    case T_F32:
        [[unroll]] for (uint i = 0; i < 32; i++) v[i] = uintBitsToFloat(DQ_W(2 * i) | (DQ_W(2 * i + 1) << 16));
        break;
    case T_F16:
        [[unroll]] for (uint i = 0; i < 32; i++) v[i] = f16_to_f32(DQ_W(i));
        break;
    case T_BF16:
        [[unroll]] for (uint i = 0; i < 32; i++) v[i] = bf16_to_f32(DQ_W(i));
        break;
    case T_Q8_0: {
        float d = f16_to_f32(DQ_W(0));
        [[unroll]] for (uint k = 0; k < 16; k++) {
            uint w = DQ_W(1 + k);
            v[2 * k] = d * float(int(w << 24) >> 24);
            v[2 * k + 1] = d * float(int(w << 16) >> 24);
        }
        break;
    }
    case T_Q4_0: case T_IQ4_NL: case T_Q4_1: {
        float d = f16_to_f32(DQ_W(0));
        float m = type == T_Q4_1 ? f16_to_f32(DQ_W(1)) : 0.0;
        uint qs = type == T_Q4_1 ? 2u : 1u;
        [[unroll]] for (uint k = 0; k < 8; k++) {
            uint w = DQ_W(qs + k);
            uint n0 = w & 15u, n1 = (w >> 8) & 15u, n2 = (w >> 4) & 15u, n3 = (w >> 12) & 15u;
            if (type == T_IQ4_NL) {
                v[2 * k] = d * IQ4NL_VALUES[n0]; v[2 * k + 1] = d * IQ4NL_VALUES[n1];
                v[2 * k + 16] = d * IQ4NL_VALUES[n2]; v[2 * k + 17] = d * IQ4NL_VALUES[n3];
            } else if (type == T_Q4_1) {
                v[2 * k] = float(n0) * d + m; v[2 * k + 1] = float(n1) * d + m;
                v[2 * k + 16] = float(n2) * d + m; v[2 * k + 17] = float(n3) * d + m;
            } else {
                v[2 * k] = (float(n0) - 8.0) * d; v[2 * k + 1] = (float(n1) - 8.0) * d;
                v[2 * k + 16] = (float(n2) - 8.0) * d; v[2 * k + 17] = (float(n3) - 8.0) * d;
            }
        }
        break;
    }
    case T_Q5_0: case T_Q5_1: {
        bool q51 = type == T_Q5_1;
        float d = f16_to_f32(DQ_W(0));
        float m = q51 ? f16_to_f32(DQ_W(1)) : 0.0;
        uint h = q51 ? 2u : 1u;
        uint qh = DQ_W(h) | (DQ_W(h + 1) << 16);
        [[unroll]] for (uint k = 0; k < 8; k++) {
            uint w = DQ_W(h + 2 + k);
            uint j = 2 * k;
            uint n0 = (w & 15u) | (((qh >> j) & 1u) << 4);
            uint n1 = ((w >> 8) & 15u) | (((qh >> (j + 1)) & 1u) << 4);
            uint n2 = ((w >> 4) & 15u) | (((qh >> (j + 16)) & 1u) << 4);
            uint n3 = ((w >> 12) & 15u) | (((qh >> (j + 17)) & 1u) << 4);
            if (q51) {
                v[j] = float(n0) * d + m; v[j + 1] = float(n1) * d + m;
                v[j + 16] = float(n2) * d + m; v[j + 17] = float(n3) * d + m;
            } else {
                v[j] = (float(n0) - 16.0) * d; v[j + 1] = (float(n1) - 16.0) * d;
                v[j + 16] = (float(n2) - 16.0) * d; v[j + 17] = (float(n3) - 16.0) * d;
            }
        }
        break;
    }
    case T_Q4_K: {
        // d, dmin, scales[12], qs[128]; chunk `sub` uses 6-bit scale/min pair `sub`
        float d = f16_to_f32(DQ_W(0)), dmin = f16_to_f32(DQ_W(1));
        uint sc, mn;
        if (sub < 4u) {
            sc = DQ_B(4u + sub) & 63u; mn = DQ_B(8u + sub) & 63u;
        } else {
            sc = (DQ_B(8u + sub) & 15u) | ((DQ_B(sub) >> 6) << 4);
            mn = (DQ_B(8u + sub) >> 4) | ((DQ_B(4u + sub) >> 6) << 4);
        }
        float dl = d * float(sc), ml = dmin * float(mn);
        uint q0 = 16u + 32u * (sub >> 1), shift = (sub & 1u) * 4u;
        [[unroll]] for (uint i = 0; i < 32; i++) v[i] = dl * float((DQ_B(q0 + i) >> shift) & 15u) - ml;
        break;
    }
    case T_Q6_K: {
        // ql[128], qh[64], scales[16] (int8), d; halves of 128 values, four 32-value rows each
        float d = f16_to_f32(DQ_W(104));
        uint half_ = sub >> 2, r = sub & 3u;
        uint ql0 = 64u * half_ + (r & 1u) * 32u, qls = (r >> 1) * 4u;
        uint qh0 = 128u + 32u * half_, qhs = 2u * r;
        [[unroll]] for (uint i = 0; i < 32; i++) {
            uint q = ((DQ_B(ql0 + i) >> qls) & 15u) | (((DQ_B(qh0 + i) >> qhs) & 3u) << 4);
            float s = float(int(DQ_B(192u + 8u * half_ + i / 16u + 2u * r) << 24) >> 24);
            v[i] = d * s * (float(q) - 32.0);
        }
        break;
    }
    }
}

#undef DQ_W
#undef DQ_INDEX
#undef DQ_B
