// RoPE angles, shared by rope.comp and mul_mat.comp's ROPE variants (rope on the QKV store).
// The angles' polynomials and every turn (x0 * c - x1 * s, x0 * s + x1 * c) are `precise`, so both
// kernels give the same bits wherever a compiler would contract some of them into fma.

// (sin, cos) of 2pi * pos * f, with f a fraction of a turn in 0.64 fixed point. The product is
// exact modulo one turn, so large positions lose nothing to range reduction; the remainder
// around the nearest quarter turn (|a| <= pi/4) goes through Cephes' sinf/cosf polynomials,
// which unlike the built-in sin/cos have a precision the Vulkan spec does not leave open.
vec2 sincos_turns(int position, uvec2 f) {
    const uint a = uint(abs(position));
    uint hi, lo;
    umulExtended(a, f.x, hi, lo);
    hi += a * f.y;                              // modulo 2^32: whole turns drop out
    const uint q = (hi + 0x20000000u) >> 30;    // nearest quarter turn
    const int r = int(hi - (q << 30));          // remainder, units of 2^-32 turn
    precise float t = (float(r) + float(lo) * 2.3283064365386963e-10) * 1.4629180792671596e-9;
    precise float z = t * t;
    precise float s = t + t * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    precise float c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3
                                                                           + z * 2.443315711809948e-5));
    vec2 sc = (q & 1u) != 0u ? vec2(c, -s) : vec2(s, c);
    if ((q & 2u) != 0u) sc = -sc;
    if (position < 0) sc.x = -sc.x;
    return sc;
}
