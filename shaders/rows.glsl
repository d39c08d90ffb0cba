// Row reductions for the one-workgroup-per-row kernels (rms_norm, softmax, argmax).
// The workgroup size must be a multiple of the subgroup size (kernels/rows.py picks it).
// ONE_SUBGROUP variants (workgroup == subgroup) carry no shared memory and no barrier: lavapipe
// runs any shader with a barrier as coroutines, which cost it 2-3x on a short row even when
// the barrier is never reached.
// XOR butterflies leave the same value on every lane and combine lanes in an order fixed by
// the lane numbers alone, so a row's result never depends on how many rows share the dispatch.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

#ifndef ONE_SUBGROUP
shared float row_red[gl_WorkGroupSize.x];
shared uint row_red_key[gl_WorkGroupSize.x];
shared uint row_red_idx[gl_WorkGroupSize.x];
#endif

// Across subgroups (only when the workgroup has several): the leading barrier keeps a previous
// call's readers from seeing this call's writes.
float row_sum(float s) {
    for (uint m = 1u; m < gl_SubgroupSize; m <<= 1) s += subgroupShuffleXor(s, m);
#ifndef ONE_SUBGROUP
    if (gl_NumSubgroups == 1u) return s;
    barrier();
    if (gl_SubgroupInvocationID == 0u) row_red[gl_SubgroupID] = s;
    barrier();
    s = row_red[0];
    for (uint k = 1u; k < gl_NumSubgroups; k++) s += row_red[k];
#endif
    return s;
}

float row_max(float s) {
    for (uint m = 1u; m < gl_SubgroupSize; m <<= 1) s = max(s, subgroupShuffleXor(s, m));
#ifndef ONE_SUBGROUP
    if (gl_NumSubgroups == 1u) return s;
    barrier();
    if (gl_SubgroupInvocationID == 0u) row_red[gl_SubgroupID] = s;
    barrier();
    s = row_red[0];
    for (uint k = 1u; k < gl_NumSubgroups; k++) s = max(s, row_red[k]);
#endif
    return s;
}

// (key, index) pairs: the larger key wins, the lower index breaks ties.
void better(inout uint key, inout uint idx, uint k, uint i) {
    if (k > key || (k == key && i < idx)) { key = k; idx = i; }
}

void row_argmax(inout uint key, inout uint idx) {
    for (uint m = 1u; m < gl_SubgroupSize; m <<= 1)
        better(key, idx, subgroupShuffleXor(key, m), subgroupShuffleXor(idx, m));
#ifndef ONE_SUBGROUP
    if (gl_NumSubgroups == 1u) return;
    barrier();
    if (gl_SubgroupInvocationID == 0u) { row_red_key[gl_SubgroupID] = key; row_red_idx[gl_SubgroupID] = idx; }
    barrier();
    for (uint k = 0u; k < gl_NumSubgroups; k++) better(key, idx, row_red_key[k], row_red_idx[k]);
#endif
}
