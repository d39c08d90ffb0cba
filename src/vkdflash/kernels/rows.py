"""Launch shape and argument checks shared by the row kernels (norm, rope, elementwise, softmax).

Row kernels reduce with subgroup XOR butterflies, so the workgroup is a whole number of
subgroups: exactly one subgroup on CPU devices (lavapipe: 8 lanes, where barriers and extra
workgroups are expensive), 64 lanes elsewhere. Workgroups loop over rows, so the number of
workgroups can be capped without changing any row's arithmetic."""
from __future__ import annotations

from ..errors import VkdflashError
from ..runtime.memory import View, as_view

F32 = 4


def workgroup(ctx) -> int:
    sub = max(1, ctx.features.subgroup_size)
    return sub if ctx.features.device_type == "cpu" else max(64, sub)


def groups(ctx, n_items: int) -> int:
    """Workgroups for `n_items` independent rows (or chunks): few on CPUs, plenty on GPUs."""
    cap = 8 if ctx.features.device_type == "cpu" else 4096
    return max(1, min(n_items, cap))


def check_view(ctx, what: str, view, nbytes: int) -> View:
    view = as_view(view)
    if view.size < nbytes:
        raise VkdflashError(f"{what}: view of {view.size} bytes is smaller than the {nbytes} bytes needed")
    if nbytes > ctx.features.max_storage_buffer_range:
        raise VkdflashError(f"{what}: {nbytes} bytes exceed the device's storage range "
                            f"{ctx.features.max_storage_buffer_range}; split the rows (memory.pieces)")
    return View(view.buffer, view.offset, nbytes)


def check_dims(**dims) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or value < 1 or value >= 1 << 31:
            raise VkdflashError(f"{name} must be a positive integer, got {value!r}")


def vec4_ok(n: int, *views: View) -> bool:
    """Whole rows of vec4s: `n` floats per row and every view on a 16-byte boundary."""
    return n % 4 == 0 and all(v.offset % 16 == 0 for v in views)
