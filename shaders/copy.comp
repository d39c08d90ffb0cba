#version 450
// Plain copy: the bandwidth yardstick that bench compares every kernel with.
#include "common.glsl"

layout(binding = 0) readonly buffer Src { vec4 src[]; };
layout(binding = 1) writeonly buffer Dst { vec4 dst[]; };
layout(push_constant) uniform Push { uint n; } p;  // vec4 count

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) dst[i] = src[i];
}
