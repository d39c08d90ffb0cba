"""Launch shape and argument checks shared by the row kernels (norm, rope, elementwise, softmax).

Row kernels reduce with subgroup XOR butterflies, so the workgroup is a whole number of
subgroups: exactly one subgroup on CPU devices (lavapipe: 8 lanes, where barriers and extra
workgroups are expensive), 64 lanes elsewhere. Workgroups loop over rows, so the number of
workgroups can be capped without changing any row's arithmetic."""
from __future__ import annotations

from ..errors import VkdflashError
from ..runtime.memory import View, as_view, texel_views

F32 = 4


def workgroup(ctx) -> int:
    sub = max(1, ctx.features.subgroup_size)
    return sub if ctx.features.device_type == "cpu" else max(64, sub)


# lavapipe stops an invocation after 65535 loop iterations in total (see kernels/copy.py)
MAX_ITERATIONS = 65535
MAX_GROUPS = 65535


def groups(ctx, n_items: int, iterations_per_item: int = 1, what: str = "kernel") -> int:
    """Workgroups for `n_items` independent rows (or chunks) that each cost one lane
    `iterations_per_item` loop iterations: few on CPUs, plenty on GPUs, and enough that no lane
    runs into lavapipe's loop limit."""
    per_item = iterations_per_item + 8  # the loop over rows and the reductions count too
    if per_item > MAX_ITERATIONS:
        raise VkdflashError(f"{what}: one row needs {iterations_per_item} loop iterations per lane, "
                            f"more than the {MAX_ITERATIONS} lavapipe allows; use shorter rows")
    cap = 8 if ctx.features.device_type == "cpu" else 4096
    need = -(-n_items // (MAX_ITERATIONS // per_item))
    if need > MAX_GROUPS:
        raise VkdflashError(f"{what}: {n_items} rows need {need} workgroups, more than {MAX_GROUPS}")
    return max(1, min(n_items, max(cap, need)))


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


def texel_inputs(ctx, *views: View) -> list | None:
    """The `_sg_texel` variant's inputs (vec4 texel views) where it applies: a one-subgroup
    workgroup (no barrier code at all), a device that prefers texel loads, and views it can bind
    as texels (whole vec4 rows checked by the caller). None: take the storage-buffer variant."""
    if workgroup(ctx) != max(1, ctx.features.subgroup_size):
        return None
    return texel_views(ctx, views)
