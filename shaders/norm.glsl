// RMSNorm of vec4 rows, shared by rms_norm.comp and mul_mat.comp's NORM variants (the norm
// applied as the matmul loads x): one spelling, `precise`, so both give the same bits.
// The caller declares x4() and includes rows.glsl (row_sum) first.
float rms_scale(uint base, uint n4, uint dim, float eps) {
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    precise vec4 a = vec4(0.0);
    for (uint i = tid; i < n4; i += WG) { vec4 v = x4(base + i); a += v * v; }
    precise float s = (a.x + a.y) + (a.z + a.w);
    return inversesqrt(row_sum(s) / float(dim) + eps);
}

vec4 rms_apply(vec4 x, float scale, vec4 w) {
    precise vec4 y = (x * scale) * w;
    return y;
}
