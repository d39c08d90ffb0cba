"""Which bindings a kernel may write, read from its SPIR-V: a dispatch that binds a read-only
buffer (a weight) where the shader can store is refused as it is recorded (runtime/graph.py).

Taken from the shader itself, not from a list beside each kernel, so a new kernel is covered
as it is written: a storage block is read only where GLSL declared it `readonly` (every member
NonWritable), a storage texel buffer where its variable is NonWritable; uniform blocks and
uniform texel buffers never store."""
from __future__ import annotations

import struct

from ..errors import VkdflashError

MAGIC = 0x07230203
# opcodes
OP_TYPE_IMAGE, OP_TYPE_STRUCT, OP_TYPE_POINTER, OP_FUNCTION, OP_VARIABLE, OP_DECORATE, OP_MEMBER_DECORATE = \
    25, 30, 32, 54, 59, 71, 72
# decorations
BLOCK, BUFFER_BLOCK, NON_WRITABLE, BINDING = 2, 3, 24, 33
# storage classes
UNIFORM_CONSTANT, UNIFORM, STORAGE_BUFFER = 0, 2, 12
STORAGE_IMAGE = 2  # OpTypeImage's Sampled operand: used without a sampler (imageStore can write)


def writable_bindings(code: bytes) -> frozenset:
    """Binding numbers of the module's descriptors that a shader store can write."""
    if len(code) < 20 or len(code) % 4 or struct.unpack_from("<I", code)[0] != MAGIC:
        raise VkdflashError("not a SPIR-V module (no magic number, or not whole 32-bit words)")
    words = memoryview(code).cast("I")  # SPIR-V is little endian, as every device vkdflash runs on
    binding, flagged, struct_flags, members, non_writable_members = {}, set(), {}, {}, {}
    pointers, variables, storage_images = {}, [], set()
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise VkdflashError(f"a damaged SPIR-V module: an instruction of {count} words at word {i}")
        if op == OP_FUNCTION:
            break  # decorations, types and global variables all come before the first function
        args = words[i + 1:i + count]
        if op == OP_DECORATE and len(args) >= 2:
            if args[1] == BINDING and len(args) >= 3:
                binding[args[0]] = args[2]
            elif args[1] == NON_WRITABLE:
                flagged.add(args[0])
            elif args[1] in (BLOCK, BUFFER_BLOCK):
                struct_flags[args[0]] = args[1]
        elif op == OP_MEMBER_DECORATE and len(args) >= 3 and args[2] == NON_WRITABLE:
            non_writable_members.setdefault(args[0], set()).add(args[1])
        elif op == OP_TYPE_STRUCT and args:
            members[args[0]] = len(args) - 1
        elif op == OP_TYPE_IMAGE and len(args) >= 7 and args[6] == STORAGE_IMAGE:
            storage_images.add(args[0])
        elif op == OP_TYPE_POINTER and len(args) >= 3:
            pointers[args[0]] = args[2]
        elif op == OP_VARIABLE and len(args) >= 3:
            variables.append((args[1], pointers.get(args[0]), args[2]))
        i += count

    def stores(var: int, pointee, storage_class: int) -> bool:
        if var in flagged:
            return False
        if storage_class == STORAGE_BUFFER or (storage_class == UNIFORM and struct_flags.get(pointee) == BUFFER_BLOCK):
            return len(non_writable_members.get(pointee, ())) < members.get(pointee, 0)
        return storage_class == UNIFORM_CONSTANT and pointee in storage_images

    return frozenset(binding[var] for var, pointee, sc in variables if var in binding and stores(var, pointee, sc))

