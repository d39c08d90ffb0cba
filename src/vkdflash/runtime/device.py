"""Vulkan instance, device enumeration and choice, feature probe."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, asdict

from ..errors import VkdflashError
from .lavapipe import choose_vector_width

INSTALL_HINT = ("install a Vulkan driver: on Debian/Ubuntu `apt-get install libvulkan1 "
                "mesa-vulkan-drivers` (lavapipe runs on any CPU)")


def vk_error_name(exc) -> str:
    """VkErrorOutOfDeviceMemory -> VK_ERROR_OUT_OF_DEVICE_MEMORY (the name the Vulkan spec uses)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).upper()


def device_error(exc, doing: str, hint: str = "") -> VkdflashError:
    """A failed Vulkan call as one line: what ran out or broke, while `doing` what, what to do."""
    name = vk_error_name(exc)
    if name == "VK_ERROR_OUT_OF_DEVICE_MEMORY":
        text = f"out of device memory: {doing}"
    elif name == "VK_ERROR_OUT_OF_HOST_MEMORY":
        text = f"out of host memory: {doing}"
    elif name == "VK_ERROR_DEVICE_LOST":
        text, hint = (f"the Vulkan device was lost: {doing} (VK_ERROR_DEVICE_LOST: a driver crash or GPU reset)",
                      "restart vkdflash")
    else:
        text = f"Vulkan call failed ({name}): {doing}"
    return VkdflashError(f"{text}: {hint}" if hint else text)


def _vk():
    try:
        import vulkan
    except OSError as exc:  # the loader itself is missing
        raise VkdflashError(f"no Vulkan loader (libvulkan.so.1): {INSTALL_HINT}") from exc
    return vulkan


@dataclass
class Features:
    """What a device can do, probed once; `vkdflash devices` prints this."""
    index: int
    name: str
    vendor: str
    driver: str
    device_type: str
    api_version: str
    subgroup_size: int
    subgroup_ops: list
    max_storage_buffer_range: int
    min_storage_buffer_offset_alignment: int
    max_texel_buffer_elements: int
    min_texel_buffer_offset_alignment: int
    max_shared_memory: int
    max_workgroup_invocations: int
    timestamp_period_ns: float
    timestamps: bool
    storage_16bit: bool
    storage_8bit: bool
    float16: bool
    int8: bool
    integer_dot_product: bool

    def as_dict(self) -> dict:
        return asdict(self)


VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x106B: "Apple",
           0x10005: "Mesa", 0x13B5: "ARM", 0x5143: "Qualcomm"}
SUBGROUP_OPS = {1: "basic", 2: "vote", 4: "arithmetic", 8: "ballot", 16: "shuffle",
                32: "shuffle_relative", 64: "clustered", 128: "quad"}
TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}


class Instance:
    """The process-wide Vulkan instance (created lazily, once)."""
    _shared: "Instance | None" = None

    def __init__(self):
        self.cpu_driver = choose_vector_width()  # before the driver loads
        vk = _vk()
        self.vk = vk
        app = vk.VkApplicationInfo(pApplicationName="vkdflash", applicationVersion=1,
                                   pEngineName="vkdflash", engineVersion=1,
                                   apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
        try:
            self.handle = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        except vk.VkError as exc:
            raise VkdflashError(f"cannot create a Vulkan instance ({type(exc).__name__}): "
                                f"{INSTALL_HINT}") from exc
        self.physical = list(vk.vkEnumeratePhysicalDevices(self.handle))

    @classmethod
    def get(cls) -> "Instance":
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def probe(self, index: int) -> Features:
        vk, ffi = self.vk, self.vk.ffi
        pd = self.physical[index]
        subgroup = ffi.new("VkPhysicalDeviceSubgroupProperties*",
                           {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES})
        driver = ffi.new("VkPhysicalDeviceDriverProperties*",
                         {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                          "pNext": subgroup})
        props2 = ffi.new("VkPhysicalDeviceProperties2*",
                         {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": driver})
        vk.vkGetPhysicalDeviceProperties2(pd, props2)
        p = props2.properties
        f16 = ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*",
                      {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES})
        s8 = ffi.new("VkPhysicalDevice8BitStorageFeatures*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES, "pNext": f16})
        s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*",
                      {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, "pNext": s8})
        feats2 = ffi.new("VkPhysicalDeviceFeatures2*",
                         {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": s16})
        vk.vkGetPhysicalDeviceFeatures2(pd, feats2)
        exts = {e.extensionName
                for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
        queue = self.compute_queue_family(index)
        ts_bits = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)[queue].timestampValidBits
        api = p.apiVersion
        return Features(
            index=index,
            name=ffi.string(p.deviceName).decode(),
            vendor=VENDORS.get(p.vendorID, hex(p.vendorID)),
            driver=f"{ffi.string(driver.driverName).decode()} {ffi.string(driver.driverInfo).decode()}".strip(),
            device_type=TYPES.get(p.deviceType, str(p.deviceType)),
            api_version=f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}",
            subgroup_size=subgroup.subgroupSize,
            subgroup_ops=[name for bit, name in SUBGROUP_OPS.items()
                          if subgroup.supportedOperations & bit
                          and subgroup.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT],
            max_storage_buffer_range=p.limits.maxStorageBufferRange,
            min_storage_buffer_offset_alignment=p.limits.minStorageBufferOffsetAlignment,
            max_texel_buffer_elements=p.limits.maxTexelBufferElements,
            min_texel_buffer_offset_alignment=p.limits.minTexelBufferOffsetAlignment,
            max_shared_memory=p.limits.maxComputeSharedMemorySize,
            max_workgroup_invocations=p.limits.maxComputeWorkGroupInvocations,
            timestamp_period_ns=float(p.limits.timestampPeriod),
            timestamps=bool(ts_bits) and p.limits.timestampPeriod > 0,
            storage_16bit=bool(s16.storageBuffer16BitAccess),
            storage_8bit=bool(s8.storageBuffer8BitAccess),
            float16=bool(f16.shaderFloat16),
            int8=bool(f16.shaderInt8),
            integer_dot_product="VK_KHR_shader_integer_dot_product" in exts,
        )

    def compute_queue_family(self, index: int) -> int:
        vk = self.vk
        fams = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical[index])
        for i, fam in enumerate(fams):
            if fam.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                return i
        raise VkdflashError(f"device {index} has no compute queue")


def list_devices() -> list[Features]:
    inst = Instance.get()
    return [inst.probe(i) for i in range(len(inst.physical))]


def choose_device(selector: str | int | None = None) -> int:
    """Pick a device by index or name substring (`--device`, else VKDFLASH_DEVICE).

    Without a selector, prefer a discrete GPU, then integrated, then anything (lavapipe)."""
    devices = list_devices()
    if not devices:
        raise VkdflashError(f"no Vulkan device found: {INSTALL_HINT}")
    if selector is None:
        selector = os.environ.get("VKDFLASH_DEVICE") or None
    if selector is None:
        rank = {"discrete-gpu": 0, "integrated-gpu": 1, "virtual-gpu": 2}
        return min(devices, key=lambda d: (rank.get(d.device_type, 3), d.index)).index
    text = str(selector).strip()
    if text.isdigit():
        idx = int(text)
        if idx >= len(devices):
            raise VkdflashError(f"device index {idx} out of range: {len(devices)} device(s) present "
                                f"(see `vkdflash devices`)")
        return idx
    matches = [d for d in devices if text.lower() in d.name.lower()]
    if not matches:
        names = ", ".join(f"{d.index}: {d.name}" for d in devices)
        raise VkdflashError(f"no Vulkan device matches {text!r}; present: {names}")
    return matches[0].index
