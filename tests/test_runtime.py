"""The runtime: device choice, buffers, pipeline cache, graph replay with one submit."""
from __future__ import annotations

import types

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.kernels.copy import copy
from vkdflash.runtime.device import choose_device, list_devices
from vkdflash.runtime.graph import Graph
from vkdflash.runtime.memory import TexelView, View, pieces, texel_view


def test_graph_of_many_dispatches_replays_with_one_submit(ctx0):
    n = 4096
    x = np.random.default_rng(1).uniform(-1, 1, n).astype(np.float32)
    bufs = [ctx0.upload(x)] + [ctx0.buffer(x.nbytes) for _ in range(2)]
    g = Graph(ctx0)
    for i in range(120):  # ping-pong: each copy depends on the previous one
        copy(g, bufs[0] if i == 0 else bufs[1 + (i + 1) % 2], bufs[1 + i % 2], x.nbytes)
    before = ctx0.submit_count
    g.run()
    assert ctx0.submit_count - before == 1
    assert np.array_equal(bufs[1 + 119 % 2].read(np.float32), x)
    # replay with new input data: no re-recording, one more submit, new result
    bufs[0].write(-x)
    g.run()
    assert ctx0.submit_count - before == 2
    assert np.array_equal(bufs[1 + 119 % 2].read(np.float32), -x)
    g.destroy()


def test_pipelines_are_cached(ctx0):
    a = ctx0.pipeline("copy", 2, 4, (8,))
    assert ctx0.pipeline("copy", 2, 4, (8,)) is a
    assert ctx0.pipeline("copy", 2, 4, (16,)) is not a


def test_timestamps_per_dispatch(ctx0):
    if not ctx0.features.timestamps:
        pytest.skip("device has no timestamps")  # reported as skipped, never as passed
    buf, out = ctx0.buffer(1 << 16), ctx0.buffer(1 << 16)
    g = Graph(ctx0, timestamps=True)
    for _ in range(3):
        copy(g, buf, out, 1 << 16)
    g.run()
    t = g.timings()
    assert [label for label, _ in t] == ["copy"] * 3 and all(ns > 0 for _, ns in t)
    g.destroy()


def test_buffer_write_read_roundtrip_and_overflow(ctx0):
    buf = ctx0.buffer(64)
    buf.write(np.arange(8, dtype=np.uint32), offset=16)
    assert np.array_equal(buf.read(np.uint32, 8, 16), np.arange(8))
    with pytest.raises(VkdflashError, match="overflows"):
        buf.write(np.zeros(17, np.float32))


def _fake(limit, align):
    return types.SimpleNamespace(features=types.SimpleNamespace(
        max_storage_buffer_range=limit, min_storage_buffer_offset_alignment=align))


def test_pieces_fit_range_and_alignment():
    for nrows, row_bytes, limit, align in [(1000, 18 * 128, 1 << 20, 16), (50000, 2304, 128 << 20, 64),
                                           (7, 100, 350, 4), (3, 10, 1000, 16)]:
        got = pieces(_fake(limit, align), nrows, row_bytes)
        assert sum(n for _, n in got) == nrows
        assert [r for r, _ in got] == list(np.cumsum([0] + [n for _, n in got[:-1]]))
        assert all(n * row_bytes <= limit for _, n in got)
        assert all(r * row_bytes % align == 0 for r, _ in got)
    with pytest.raises(VkdflashError, match="exceeds"):
        pieces(_fake(100, 4), 10, 101)


def test_texel_view_only_where_the_device_can_bind_it():
    ctx = types.SimpleNamespace(features=types.SimpleNamespace(
        min_texel_buffer_offset_alignment=64, max_texel_buffer_elements=100))
    buf = types.SimpleNamespace()
    assert texel_view(ctx, View(buf, 128, 1608), "u32x4") == TexelView(buf, 128, 1600, "u32x4")
    assert texel_view(ctx, View(buf, 48, 1600), "u32x4") is None      # offset not 64-aligned
    assert texel_view(ctx, View(buf, 0, 1616), "f32x4") is None       # 101 texels
    assert texel_view(ctx, View(buf, 0, 400), "u32") == TexelView(buf, 0, 400, "u32")


def test_tensor_larger_than_storage_range_copies_in_pieces(ctx0):
    """A buffer larger than maxStorageBufferRange is bound piece by piece."""
    row = 1 << 20
    nrows = ctx0.features.max_storage_buffer_range // row + 2
    src = ctx0.buffer(nrows * row)
    data = np.random.default_rng(2).integers(0, 255, nrows * row, dtype=np.uint8)
    src.write(data)
    dst = ctx0.buffer(nrows * row)
    g = Graph(ctx0)
    parts = pieces(ctx0, nrows, row)
    assert len(parts) > 1
    for first, n in parts:
        copy(g, src.view(first * row, n * row), dst.view(first * row, n * row), n * row, groups=4)
    g.run()
    assert np.array_equal(dst.read(np.uint8), data)
    g.destroy(), src.destroy(), dst.destroy()


def test_device_choice_by_index_name_and_env(monkeypatch):
    devs = list_devices()
    assert choose_device(0) == 0
    assert choose_device(devs[-1].name[:5].upper()) in range(len(devs))
    monkeypatch.setenv("VKDFLASH_DEVICE", str(len(devs) - 1))
    assert choose_device() == len(devs) - 1
    with pytest.raises(VkdflashError, match="out of range"):
        choose_device(len(devs))
    with pytest.raises(VkdflashError, match="no Vulkan device matches"):
        choose_device("no-such-gpu-anywhere")


def test_staging_path_for_device_memory_the_host_cannot_map(ctx0):
    """Discrete GPUs keep weights in memory the host cannot map: writes and reads then go
    through a staging buffer and a copy. lavapipe maps everything, so force that path."""
    buf = ctx0.buffer(4096)
    buf.mapped = None
    data = np.random.default_rng(3).integers(0, 255, 1000, dtype=np.uint8)
    buf.write(data, offset=96)
    assert np.array_equal(buf.read(np.uint8, 1000, 96), data)
    g = Graph(ctx0)
    out = ctx0.buffer(4096)
    copy(g, buf, out, 4096)
    g.run()
    assert np.array_equal(out.read(np.uint8, 1000, 96), data)
    g.destroy(), out.destroy()


def test_no_vulkan_device_is_a_one_line_error_with_install_hint(monkeypatch):
    from vkdflash.runtime import device
    monkeypatch.setattr(device, "list_devices", lambda: [])
    with pytest.raises(VkdflashError, match="apt-get install") as err:
        device.choose_device()
    assert "\n" not in str(err.value)


def test_a_failed_compile_raises_where_used_and_the_context_still_closes():
    """Kernels compile on the context's thread pool: a driver error comes back from `handle`
    (where a graph first waits for it), and closing the context afterwards releases the rest."""
    from concurrent.futures import Future

    from vkdflash.runtime.context import Context
    c = Context(list_devices()[0].index)

    def failing(call):
        f = Future()
        f.set_exception(RuntimeError("driver said no"))
        return f
    c.compiler.submit = failing
    pipe = c.pipeline("copy", 2, 4, (64,))
    with pytest.raises(RuntimeError, match="driver said no"):
        pipe.handle  # noqa: B018
    c.close()
    assert c.device is None


# -- read-only memory: which bindings a kernel stores to, from its SPIR-V ------------------

@pytest.mark.parametrize("shader, writes", [
    ("copy", {1}),                                   # src readonly, dst writeonly
    ("mul_mat_texel_glu_norm_q4_1", {2}),            # W, x, U, norm weight: texel views; Y
    ("flash_attn", {3}),                             # Q, K, V and the params read; O written
    ("rope", {3, 5}),                                # Q and K in place of their outputs
    ("hadamard", {0, 1}),                            # no readonly qualifier: both may be stored to
])
def test_a_kernels_writable_bindings_come_from_its_spirv(shader, writes):
    from vkdflash.runtime.pipelines import shader_writes
    assert shader_writes(shader) == writes


def test_a_damaged_spirv_module_is_one_error():
    from vkdflash.runtime.pipelines import spirv_bytes
    from vkdflash.runtime.reflect import writable_bindings
    code = spirv_bytes("copy")
    for bad, why in [(b"\0" * 20, "not a SPIR-V module"), (code[:-2], "not a SPIR-V module"),
                     (code[:20] + b"\0\0\0\0" + code[24:], "damaged SPIR-V module")]:
        with pytest.raises(VkdflashError, match=why):
            writable_bindings(bad)


def test_no_dispatch_stores_into_read_only_memory(ctx0):
    """Recorded through the API the dispatch is refused where it is recorded; put into the graph
    behind the API's back, the graph refuses to run. Reading a weight stays allowed."""
    from vkdflash.runtime.graph import Dispatch
    weight, scratch = ctx0.upload(np.arange(16, dtype=np.float32)), ctx0.buffer(64)
    weight.read_only = "a test weight"
    g = Graph(ctx0)
    copy(g, weight, scratch, 64)  # a read
    with pytest.raises(VkdflashError, match=r"^test_runtime \(test_runtime.py:\d+\): a copy dispatch would store "
                                            r"into a test weight \(binding 1\), which is read only$"):
        copy(g, scratch, weight, 64)
    assert len(g) == 1
    pipe = ctx0.pipeline("copy", 2, 4, (8,))
    g._dispatches.append(Dispatch(pipe, (View(scratch, 0, 64), View(weight, 0, 64)), (1, 1, 1),
                                  (4).to_bytes(4, "little"), True, "copy"))
    with pytest.raises(VkdflashError, match="behind its back would store into a test weight"):
        g.run()
    g.destroy()
    assert weight.read(np.float32).tolist() == list(range(16))


def test_a_seal_inside_a_seal_leaves_the_outer_one_sealed(ctx0):
    """A cache write inside a kv_cache_write wrapper seals and unseals the graph within the outer
    seal: the wrappers after it must still be unable to record."""
    a, b = ctx0.buffer(64), ctx0.buffer(64)
    g = Graph(ctx0)
    try:
        with g.sealed("wrappers run"):
            with g.sealed("a nested write's wrappers run"):
                pass
            with pytest.raises(VkdflashError, match="while wrappers run"):
                copy(g, a, b, 64)
        copy(g, a, b, 64)  # unsealed once the outermost ends
        assert len(g) == 1
    finally:
        g.destroy()
        a.destroy()
        b.destroy()
