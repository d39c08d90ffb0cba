"""A logical device: queue, command pool, the one submit path, and a cached pipeline per kernel."""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

from ..errors import VkdflashError
from .device import Instance, choose_device, device_error
from .memory import Buffer
from .pipelines import Pipeline

log = logging.getLogger("vkdflash")

# row reductions use subgroup butterflies (shuffle) and subgroup adds
REQUIRED_SUBGROUP_OPS = ("basic", "arithmetic", "shuffle")


class Context:
    """Everything that runs GPU work on one device goes through one Context."""

    def __init__(self, selector: str | int | None = None):
        self.instance = Instance.get()
        vk, ffi = self.instance.vk, self.instance.vk.ffi
        self.vk, self.ffi = vk, ffi
        self.index = choose_device(selector)
        self.features = self.instance.probe(self.index)
        if not self.features.storage_16bit:
            raise VkdflashError(f"device {self.features.name!r} lacks 16-bit storage buffers, "
                                "which every vkdflash kernel reads quantized blocks with")
        missing = [op for op in REQUIRED_SUBGROUP_OPS if op not in self.features.subgroup_ops]
        if missing:
            raise VkdflashError(f"device {self.features.name!r} lacks subgroup operations in compute "
                                f"shaders: {', '.join(missing)}")
        self.physical = self.instance.physical[self.index]
        self.queue_family = self.instance.compute_queue_family(self.index)
        s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
            "storageBuffer16BitAccess": 1})
        core = vk.VkPhysicalDeviceFeatures(shaderInt16=vk.vkGetPhysicalDeviceFeatures(self.physical).shaderInt16)
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1,
                                                pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=s16, queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
                                     pEnabledFeatures=core)
        self.device = self.pool = None
        try:
            self.device = vk.vkCreateDevice(self.physical, info, None)
            self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
            self.pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                queueFamilyIndex=self.queue_family), None)
            self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        except vk.VkError as exc:  # what was made is unmade: a failed open leaves nothing behind
            if self.pool is not None:
                vk.vkDestroyCommandPool(self.device, self.pool, None)
            if self.device is not None:
                vk.vkDestroyDevice(self.device, None)
            self.device = None
            raise device_error(exc, f"opening device {self.index} ({self.features.name})") from None
        self.memory_props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.pipelines: dict[tuple, Pipeline] = {}
        # a graph's kernels compile side by side (2 cores: a 2-row pass's five 1.55 -> 0.9 s)
        self.compiler = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="vkdflash-compile")
        self._live: dict[int, object] = {}  # buffers and graphs not yet destroyed, in creation order
        self._kept: dict[tuple, Buffer] = {}  # constant tables shared by every model on the device
        self.submit_count = 0
        self._upload_cmd = None
        self._staging = None
        log.info("device %d: %s (%s, %s), subgroup %d, max storage range %d MiB",
                 self.index, self.features.name, self.features.vendor, self.features.driver,
                 self.features.subgroup_size, self.features.max_storage_buffer_range >> 20)
        if "llvmpipe" in self.features.driver:
            log.info("%s", self.instance.cpu_driver)

    # -- memory -------------------------------------------------------------
    def buffer(self, nbytes: int, host: bool = False, owner=None) -> Buffer:
        """A storage buffer; `host=True` forces host-visible memory (staging, parameters);
        `owner` (an ownership.Owner) keeps it to its owner's dispatches."""
        return Buffer(self, nbytes, host, owner)

    def staging(self, nbytes: int) -> Buffer:
        """A reused host-visible buffer of at least nbytes for copies to and from unmappable memory."""
        if self._staging is None or self._staging.nbytes < nbytes:
            if self._staging is not None:
                self._staging.destroy()
            self._staging = Buffer(self, max(nbytes, 1 << 20), host=True)
        return self._staging

    def upload(self, array, host: bool = False) -> Buffer:
        data = memoryview(array).cast("B") if not hasattr(array, "tobytes") else array
        buf = self.buffer(max(int(data.nbytes), 4), host)
        buf.write(data)
        return buf

    # -- pipelines ----------------------------------------------------------
    def pipeline(self, shader: str, n_bindings: int, push_size: int = 0, spec: tuple = (),
                 texels: tuple = ()) -> Pipeline:
        key = (shader, n_bindings, push_size, tuple(spec), tuple(texels))
        pipe = self.pipelines.get(key)
        if pipe is None:
            pipe = self.pipelines[key] = Pipeline(self, shader, n_bindings, push_size, tuple(spec), tuple(texels),
                                                  self.compiler)
        return pipe

    def drop_pipelines(self, keys) -> None:
        """Destroy these cached pipelines (the device must be idle)."""
        for key in keys:
            self.pipelines.pop(key).destroy()

    # -- submission ---------------------------------------------------------
    def command_buffer(self):
        vk = self.vk
        try:
            return vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
                commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        except vk.VkError as exc:
            raise device_error(exc, "allocating a command buffer") from None

    def submit(self, cmd) -> None:
        """The only queue submit in vkdflash: one call, counted, waited on."""
        vk = self.vk
        try:
            vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])],
                             self.fence)
        except vk.VkError as exc:
            raise device_error(exc, "submitting work to the device") from None
        self.submit_count += 1
        try:
            vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, 0xFFFFFFFFFFFFFFFF)
            vk.vkResetFences(self.device, 1, [self.fence])
        except vk.VkError as exc:
            self._settle()  # the submitted work must not still run while its buffers are freed
            raise device_error(exc, "waiting for the device's work") from None

    def _settle(self) -> None:
        """After a failed wait: nothing left in flight, the fence unsignaled, as far as the device lets."""
        vk = self.vk
        for call in (lambda: vk.vkQueueWaitIdle(self.queue), lambda: vk.vkResetFences(self.device, 1, [self.fence])):
            try:
                call()
            except vk.VkError:  # a lost device refuses these too: it runs nothing either
                pass

    def copy(self, src: Buffer, dst: Buffer, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        """One-shot buffer copy (staging transfers)."""
        dst.check_host_write()
        vk = self.vk
        if self._upload_cmd is None:
            self._upload_cmd = self.command_buffer()
        cmd = self._upload_cmd
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1,
                           [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)])
        vk.vkEndCommandBuffer(cmd)
        self.submit(cmd)

    def kept(self, key: tuple, make) -> Buffer:
        """A constant buffer made once for this device (until release) by make()."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def track(self, obj) -> None:
        """Note a buffer or graph, so that close() releases it if its owner did not."""
        self._live[id(obj)] = obj

    def untrack(self, obj) -> None:
        self._live.pop(id(obj), None)

    def release(self) -> None:
        """Destroy every buffer and graph still alive (their owners did not, e.g. a model whose
        loading failed half-way)."""
        try:
            self.vk.vkDeviceWaitIdle(self.device)
        except self.vk.VkError:  # a lost device: it runs nothing, and its objects are still freed
            pass
        for obj in reversed(list(self._live.values())):  # graphs before the buffers they bind
            obj.destroy()
        self._staging = None
        self._kept.clear()

    def close(self) -> None:
        """Release the device and everything made on it (a server or a test process opens many)."""
        if self.device is None:
            return
        vk = self.vk
        self.release()
        for pipe in self.pipelines.values():
            pipe.destroy()
        self.pipelines.clear()
        self.compiler.shutdown()
        self._upload_cmd = None
        vk.vkDestroyFence(self.device, self.fence, None)
        vk.vkDestroyCommandPool(self.device, self.pool, None)  # frees its command buffers
        vk.vkDestroyDevice(self.device, None)
        self.device = None
