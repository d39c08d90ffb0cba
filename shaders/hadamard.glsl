// The fast Walsh-Hadamard transform of N consecutive values of a private array, in place,
// scaled by 1/sqrt(N) (Sylvester order, no signs: docs/design.md section 2). Butterflies at
// distance h = 1, 2, 4, ... and then one multiply, the order ref/hadamard.fwht_f32 follows,
// so every kernel that rotates (hadamard.comp, the rotating KV store, attention's Q) gives
// the same bits. `precise` keeps compilers from reassociating what the reference rounds.
//   FWHT(ARR, BASE, N, SCALE): ARR[BASE .. BASE+N) = H_N ARR[BASE .. BASE+N); SCALE = f32(1/sqrt(N))
// The loops stay loops: unrolled, N = 64 alone costs seconds of shader compile on lavapipe.
// ARR is indexed dynamically, so give it a scratch array, not one that must stay in registers.
#ifndef HADAMARD_GLSL
#define HADAMARD_GLSL
#define FWHT(ARR, BASE, N, SCALE)                                                           \
    [[dont_unroll]] for (uint h_ = 1u; h_ < (N); h_ <<= 1) {                                       \
        [[dont_unroll]] for (uint k_ = 0u; k_ < (N) / 2u; k_++) {                                  \
            uint j_ = (BASE) + (((k_ & ~(h_ - 1u)) << 1) | (k_ & (h_ - 1u)));           \
            precise float sum_ = ARR[j_] + ARR[j_ + h_];                                      \
            precise float diff_ = ARR[j_] - ARR[j_ + h_];                                     \
            ARR[j_] = sum_;                                                                   \
            ARR[j_ + h_] = diff_;                                                             \
        }                                                                                     \
    }                                                                                         \
    [[dont_unroll]] for (uint i_ = 0u; i_ < (N); i_++) { precise float y_ = ARR[(BASE) + i_] * (SCALE); ARR[(BASE) + i_] = y_; }
#endif
