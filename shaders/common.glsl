// Shared by every kernel: extensions, workgroup size as specialization constant 0, scalar unpacking.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;

float f16_to_f32(uint h) { return unpackHalf2x16(h).x; }
float bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }
uint f32_to_f16(float x) { return packHalf2x16(vec2(x, 0.0)) & 0xFFFFu; }
// Round to nearest even, as gguf-py and ggml do; NaN stays a (quiet) NaN.
uint f32_to_bf16(float x) {
    uint u = floatBitsToUint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 64u;
    return (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
}
