// GGML type ids (ggml.h numbering) and block geometry. Plain types count as 32-element
// blocks so every kernel walks rows in 32-value chunks whatever the type.
#define T_F32 0u
#define T_F16 1u
#define T_Q4_0 2u
#define T_Q4_1 3u
#define T_Q5_0 6u
#define T_Q5_1 7u
#define T_Q8_0 8u
#define T_Q4_K 12u
#define T_Q6_K 14u
#define T_IQ4_NL 20u
#define T_BF16 30u

// elements per block
uint type_qk(uint t) { return (t == T_Q4_K || t == T_Q6_K) ? 256u : 32u; }

// 16-bit words per block
uint type_u16(uint t) {
    switch (t) {
    case T_F32: return 64u;
    case T_F16: case T_BF16: return 32u;
    case T_Q4_0: case T_IQ4_NL: return 9u;
    case T_Q4_1: return 10u;
    case T_Q5_0: return 11u;
    case T_Q5_1: return 12u;
    case T_Q8_0: return 17u;
    case T_Q4_K: return 72u;
    case T_Q6_K: return 105u;
    }
    return 0u;
}

const float IQ4NL_VALUES[16] = float[16](-127., -104., -83., -65., -49., -35., -22., -10.,
                                         1., 13., 25., 38., 53., 69., 89., 113.);
