"""Compute pipelines: one per (shader, binding count, push size, specialization constants).

Every kernel uses the same shape of interface: N buffers in set 0 (bindings 0..N-1), storage
buffers except those named as uniform texel buffers, an optional push-constant block for static shapes, and 32-bit specialization constants
numbered from 0 (constant 0 is the workgroup size by convention)."""
from __future__ import annotations

import functools
import hashlib
import struct
from concurrent.futures import Future
from importlib import resources

from ..errors import VkdflashError
from .reflect import writable_bindings


def spirv_bytes(shader: str) -> bytes:
    path = resources.files("vkdflash") / "spirv" / f"{shader}.spv"
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise VkdflashError(f"no compiled shader {shader!r}: run `python tools/build_shaders.py`") from exc


@functools.lru_cache(maxsize=None)
def shader_writes(shader: str) -> frozenset:
    """The bindings a shipped kernel can store to (runtime/reflect.py), read once per process."""
    return writable_bindings(spirv_bytes(shader))


def spirv_build_id() -> str:
    """A short hash of the shipped kernels (their manifest): timings cached on disk are only
    valid for the kernels that were measured."""
    manifest = resources.files("vkdflash") / "spirv" / "manifest.json"
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:12]


def _spec_word(value) -> bytes:
    if isinstance(value, float):
        return struct.pack("<f", value)
    return struct.pack("<I", int(value) & 0xFFFFFFFF)


class Pipeline:
    def __init__(self, ctx, shader: str, n_bindings: int, push_size: int, spec: tuple, texels: tuple, compiler):
        """Compiles on `compiler` (an Executor) and returns at once; `handle` waits for it. A compile
        is one driver call, most of a first pass's cost (lavapipe: 0.3 s a matmul kernel with
        Mesa's disk cache warm), and drivers compile several pipelines at once on their threads."""
        vk, ffi = ctx.vk, ctx.ffi
        self.ctx, self.shader, self.n_bindings, self.push_size = ctx, shader, n_bindings, push_size
        self.texels = frozenset(texels)  # bindings that are uniform texel buffers
        self.writes = shader_writes(shader)  # bindings the kernel can store to (its SPIR-V says)
        self.key = (shader, n_bindings, push_size, tuple(spec), tuple(texels))  # as Context.pipeline names it
        code = spirv_bytes(shader)
        self.module = vk.vkCreateShaderModule(ctx.device, vk.VkShaderModuleCreateInfo(
            codeSize=len(code), pCode=code), None)
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=self.descriptor_type(i), descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(n_bindings)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(ctx.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=n_bindings, pBindings=bindings), None)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                         size=push_size)] if push_size else []
        self.layout = vk.vkCreatePipelineLayout(ctx.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout],
            pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None), None)
        data = b"".join(_spec_word(v) for v in spec)
        entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(len(spec))]
        spec_info = None
        if spec:
            self._spec_data = ffi.new("char[]", data)
            spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                                dataSize=len(data), pData=self._spec_data)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module,
                                                   pName="main", pSpecializationInfo=spec_info)
        info = [vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)]
        # the cffi memory `info` points into (entry name, specialization map) lives as long as
        # the Python objects that made it: kept until the compile has run
        self._infos = (stage, spec_info, entries, info)
        create = lambda: vk.vkCreateComputePipelines(ctx.device, None, 1, info, None)[0]  # noqa: E731
        self._handle = compiler.submit(create)

    @property
    def handle(self):
        if isinstance(self._handle, Future):
            self._handle, self._infos = self._handle.result(), None
        return self._handle

    def descriptor_type(self, binding: int) -> int:
        vk = self.ctx.vk
        return vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER if binding in self.texels else vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        try:
            vk.vkDestroyPipeline(dev, self.handle, None)
        except Exception:  # noqa: BLE001 -- a compile that failed made no pipeline (its error was raised where used)
            pass
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        vk.vkDestroyShaderModule(dev, self.module, None)
