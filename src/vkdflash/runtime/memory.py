"""Buffers: device-local memory, mapped directly where the device allows it, staged where not.

Binding ranges are limited by maxStorageBufferRange (128 MiB on lavapipe); `pieces` splits a
row-major tensor into bindable row ranges so kernels can be dispatched once per piece."""
from __future__ import annotations

import reprlib
from dataclasses import dataclass

import numpy as np

from ..errors import VkdflashError
from .device import device_error


def _find_memory(ctx, type_bits: int, want: int, avoid: int = 0) -> int | None:
    props = ctx.memory_props
    for i in range(props.memoryTypeCount):
        flags = props.memoryTypes[i].propertyFlags
        if type_bits & (1 << i) and flags & want == want and not flags & avoid:
            return i
    return None


STAGING_BYTES = 64 << 20  # transfers through unmappable memory go in pieces of this size


def buffer_size(nbytes) -> int:
    """A buffer's size as an int: Vulkan's bind of a 0-byte buffer crashes the process."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
        raise VkdflashError(f"a buffer needs a positive whole number of bytes, not {reprlib.repr(nbytes)}")
    return int(nbytes)


class Buffer:
    def __init__(self, ctx, nbytes: int, host: bool = False, owner=None):
        vk = ctx.vk
        self.ctx, self.nbytes = ctx, buffer_size(nbytes)
        self.owner = owner  # an ownership.Owner: only its code may bind or write this memory
        self.read_only = None  # what the buffer holds when it must not change (a weight): write() says it
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        try:
            self.handle = vk.vkCreateBuffer(ctx.device, vk.VkBufferCreateInfo(
                size=self.nbytes, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        except vk.VkError as exc:  # lavapipe refuses a size past its heap here, before any allocation
            raise self._out_of_memory(exc) from None
        req = vk.vkGetBufferMemoryRequirements(ctx.device, self.handle)
        local, visible = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, (
            vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        if host:  # per-step inputs and read-backs: the host maps them, no staging copy
            order = [(visible | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0), (visible, 0)]
        else:
            # VRAM the host cannot map first (discrete GPUs: the small mappable BAR heap stays
            # free), then device-local mappable memory (UMA, lavapipe), then anything mappable
            order = [(local, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT), (local, 0), (visible, 0)]
        mtype = next((t for t in (_find_memory(ctx, req.memoryTypeBits, w, a) for w, a in order)
                      if t is not None), None)
        if mtype is None:
            raise VkdflashError(f"no memory type for a {self.nbytes}-byte buffer")
        self.memory = self.mapped = None
        try:
            self.memory = vk.vkAllocateMemory(ctx.device, vk.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=mtype), None)
            vk.vkBindBufferMemory(ctx.device, self.handle, self.memory, 0)
            flags = ctx.memory_props.memoryTypes[mtype].propertyFlags
            if flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT:
                raw = vk.vkMapMemory(ctx.device, self.memory, 0, self.nbytes, 0)
                self.mapped = np.frombuffer(raw, dtype=np.uint8)
        except vk.VkError as exc:  # nothing of this buffer outlives the error
            vk.vkDestroyBuffer(ctx.device, self.handle, None)
            if self.memory is not None:
                vk.vkFreeMemory(ctx.device, self.memory, None)
                self.memory = None
            raise self._out_of_memory(exc) from None
        ctx.track(self)

    def _out_of_memory(self, exc) -> VkdflashError:
        what = f", for {self.owner.name}" if self.owner is not None else ""
        hint = ("lower -c or use a quantized cache (-ctk/-ctv q8_0)" if self.owner is not None else
                "use a smaller model, a lower -c or a quantized cache (-ctk/-ctv q8_0)")
        return device_error(exc, f"a buffer of {self.nbytes} bytes ({self.nbytes / 2**20:.1f} MiB) "
                                 f"was asked for ({type(exc).__name__}){what}", hint)

    def check_host_write(self) -> None:
        """A host write or a device copy into this buffer: refused for owned memory (a KV cache)
        and read-only memory (a weight)."""
        if self.owner is not None:
            raise VkdflashError(f"{self.owner.name} memory is written only by its own store kernel")
        if self.read_only:
            raise VkdflashError(f"this buffer is {self.read_only}: read only")

    def write(self, data, offset: int = 0) -> None:
        self.check_host_write()
        src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if offset + src.nbytes > self.nbytes:
            raise VkdflashError(f"write of {src.nbytes} bytes at {offset} overflows a {self.nbytes}-byte buffer")
        if self.mapped is not None:
            self.mapped[offset:offset + src.nbytes] = src
            return
        for start in range(0, src.nbytes, STAGING_BYTES):
            chunk = src[start:start + STAGING_BYTES]
            staging = self.ctx.staging(chunk.nbytes)
            staging.mapped[:chunk.nbytes] = chunk
            self.ctx.copy(staging, self, chunk.nbytes, 0, offset + start)

    def read(self, dtype=np.uint8, count: int | None = None, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = (self.nbytes - offset) // dtype.itemsize if count is None else count
        nbytes = count * dtype.itemsize
        if self.mapped is not None:
            return self.mapped[offset:offset + nbytes].copy().view(dtype)
        out = np.empty(nbytes, np.uint8)
        for start in range(0, nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, nbytes - start)
            staging = self.ctx.staging(n)
            self.ctx.copy(self, staging, n, offset + start, 0)
            out[start:start + n] = staging.mapped[:n]
        return out.view(dtype)

    def view(self, offset: int = 0, size: int | None = None) -> "View":
        return View(self, offset, self.nbytes - offset if size is None else size)

    def destroy(self) -> None:
        vk = self.ctx.vk
        if self.memory is None:
            return
        self.ctx.untrack(self)
        if self.mapped is not None:
            self.mapped = None
            vk.vkUnmapMemory(self.ctx.device, self.memory)
        vk.vkDestroyBuffer(self.ctx.device, self.handle, None)
        vk.vkFreeMemory(self.ctx.device, self.memory, None)
        self.memory = None


@dataclass(frozen=True)
class View:
    """A bindable byte range of a buffer."""
    buffer: Buffer
    offset: int
    size: int


# texel formats a kernel may read a buffer as: name -> (VkFormat suffix, bytes per texel)
TEXEL_FORMATS = {"u32": ("R32_UINT", 4), "u32x4": ("R32G32B32A32_UINT", 16),
                 "f32x4": ("R32G32B32A32_SFLOAT", 16)}


@dataclass(frozen=True)
class TexelView(View):
    """A view bound as a uniform texel buffer (read with texelFetch): on lavapipe a texel fetch
    is a straight-line gather, where a storage-buffer load is a branchy loop over the lanes."""
    format: str = "u32x4"


def prefers_texel_loads(features) -> bool:
    """Whether kernels should read through texel views where they can: measured on lavapipe
    (2-4x faster matmul reads); GPUs keep storage loads until measured there."""
    return features.device_type == "cpu"


def texel_view(ctx, x, fmt: str) -> TexelView | None:
    """`x` as texels of `fmt`, or None where the device cannot bind it so (offset alignment,
    texel count): the caller then takes its storage-buffer path."""
    v = as_view(x)
    size = TEXEL_FORMATS[fmt][1]
    f = ctx.features
    if v.offset % max(f.min_texel_buffer_offset_alignment, size) or v.size // size > f.max_texel_buffer_elements:
        return None
    return TexelView(v.buffer, v.offset, v.size // size * size, fmt)


def texel_views(ctx, views, fmt: str = "f32x4") -> list | None:
    """Every view as texels of `fmt` where the device prefers texel loads and can bind them all;
    else None (the caller takes its storage-buffer variant)."""
    if not prefers_texel_loads(ctx.features):
        return None
    texels = [texel_view(ctx, v, fmt) for v in views]
    return texels if all(texels) else None


def as_view(x) -> View:
    return x if isinstance(x, View) else x.view()


def pieces(ctx, nrows: int, row_bytes: int) -> list[tuple[int, int]]:
    """Split `nrows` rows of `row_bytes` into (first_row, nrows) ranges that each fit one binding
    and start at an offset the device can bind."""
    limit = ctx.features.max_storage_buffer_range
    align = ctx.features.min_storage_buffer_offset_alignment
    if row_bytes > limit:
        raise VkdflashError(f"one row of {row_bytes} bytes exceeds the device's storage range {limit}")
    step = max(1, limit // row_bytes)
    # a piece boundary must land on an aligned byte offset
    while step > 1 and (step * row_bytes) % align:
        step -= 1
    if (step * row_bytes) % align and nrows > step:
        raise VkdflashError(f"cannot split rows of {row_bytes} bytes at {align}-byte alignment")
    return [(r, min(step, nrows - r)) for r in range(0, nrows, step)]
