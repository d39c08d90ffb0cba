"""The KV cache: the only owner of K/V memory, with exactly one write path and one read path.

record_write() is the core cache-write hook: one kernel rotates whichever half is quantized (Hadamard,
docs/design.md section 2) and quantizes and stores, reading the caller's rows without changing
them. attend() is the matching read path: attention rotates Q like K in registers, runs in
rotated space, and the output is un-rotated. The cache's buffers are owned memory
(runtime/ownership.py): a dispatch that binds them from anywhere but these two paths is refused
where it is recorded, and checked again when the graph is built. That is what makes a side door
that skips the rotation (llama.cpp issue 25725, docs/design.md section 1) impossible here."""
from __future__ import annotations

import functools
import itertools
import logging
import os
import reprlib
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import plugins
from .errors import VkdflashError, quote
from .kernels.attention import MAX_HEAD_DIM, attention, cache_nbytes, max_positions
from .kernels.hadamard import fwht, rotation_block
from .kernels.kv_store import store_rows
from .kernels.types import CACHE_TYPES, get_type
from .model.hparams import MAX_CTX, MAX_HEADS, MAX_LAYERS
from .runtime.memory import as_view
from .runtime.ownership import Owner

log = logging.getLogger("vkdflash")


def rotation_disabled_by_env() -> bool:
    """VKDFLASH_ATTN_ROT_DISABLE=<non-zero integer> turns rotation off, like llama.cpp's switch."""
    value = os.environ.get("VKDFLASH_ATTN_ROT_DISABLE", "").strip()
    try:
        return int(value) != 0
    except ValueError:
        if value:
            _ignored_switch(value)
        return False


@functools.lru_cache(maxsize=None)
def _ignored_switch(value: str) -> None:
    """Say once that a value llama.cpp's rule ignores is ignored ("yes" looks like it disabled rotation)."""
    log.warning("VKDFLASH_ATTN_ROT_DISABLE=%s is not an integer, so KV rotation stays on (1 turns it off)", quote(value))


def _rotation_switched_off(rotate: bool) -> str | None:
    """What turned rotation off for every cache type, if anything."""
    if rotation_disabled_by_env():
        return f"VKDFLASH_ATTN_ROT_DISABLE={os.environ['VKDFLASH_ATTN_ROT_DISABLE'].strip()}"
    return None if rotate else "--no-kv-rotation"


def _rotation_note(cache_type: str, head_dim: int, block: int, switched_off: str | None) -> str:
    """A half's rotation for the log: on with its block size, or off and why."""
    if block:
        return f"on, n={block}"
    if not get_type(cache_type).quantized:
        return f"off: {cache_type} needs none"
    return f"off: {switched_off or f'head_dim {head_dim} is not a multiple of 64'}"


@dataclass(frozen=True)
class CacheInfo:
    """What hook implementations see of a cache: its description, never its buffers."""
    key: int
    name: str
    n_layer: int
    n_ctx: int
    n_head_kv: int
    head_dim: int
    k_type: str
    v_type: str
    k_rotation: int  # Hadamard block size applied to K (0: not rotated)
    v_rotation: int


_caches: "weakref.WeakValueDictionary[int, KVCache]" = weakref.WeakValueDictionary()
_keys = itertools.count(1)


def _written(info: CacheInfo, layer: int, positions, n_rows: int) -> None:
    """After a run: tell kv_cache_written observers (if any) which positions were written."""
    if plugins.observed("kv_cache_written"):
        view = as_view(positions)
        pos = view.buffer.read(np.uint32, n_rows, view.offset)
        plugins.notify("kv_cache_written", cache=info, layer=layer, positions=pos)


def _check_shape(ctx, name: str, n_layer, n_ctx, n_head_kv, head_dim, ctk: str, ctv: str) -> None:
    """Dimensions a cache can be made of (Vulkan's bind of a 0-byte buffer crashes the process),
    each layer's K and V within the device's storage range (attention binds them whole)."""
    for dim, value, most in (("n_layer", n_layer, MAX_LAYERS), ("n_ctx", n_ctx, MAX_CTX),
                             ("n_head_kv", n_head_kv, MAX_HEADS), ("head_dim", head_dim, MAX_HEAD_DIM)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= most:
            raise VkdflashError(f"the {name} KV cache's {dim} must be a whole number in 1..{most}, "
                                f"not {reprlib.repr(value)}")
    for half, t in (("K", ctk), ("V", ctv)):
        if get_type(t).name not in CACHE_TYPES:
            raise VkdflashError(f"{t} is not a KV cache type for {half}; choose one of {', '.join(CACHE_TYPES)}")
        if get_type(t).quantized and head_dim % 32:
            raise VkdflashError(f"a quantized {half} cache needs head_dim divisible by 32, got {head_dim}")
    if head_dim % 32:  # any type: attention and the store work in 32-value blocks (refused here, not at first use)
        raise VkdflashError(f"the {name} KV cache's head_dim must be a multiple of 32, not {head_dim}")
    too_big = past_storage_range(ctx, n_ctx, n_head_kv, head_dim, ctk, ctv)
    if too_big:
        half, need, limit = too_big
        raise VkdflashError(f"the {name} KV cache needs {need} bytes a layer for {half}, more than the "
                            f"device's storage range of {limit} bytes")
    most = max_positions(ctx.features)
    if most is not None and n_ctx > most:
        raise VkdflashError(f"the {name} KV cache's n_ctx {n_ctx} is more than attention can read on this "
                            f"device: at most {most} positions (lavapipe's shader loop limit)")


def past_storage_range(ctx, n_ctx: int, n_head_kv: int, head_dim: int, ctk: str, ctv: str) -> tuple | None:
    """(half, bytes a layer, the device's limit) for the first half of a cache too big to bind whole
    (attention binds each layer's K and V whole), or None."""
    limit = ctx.features.max_storage_buffer_range
    for half, t in (("K", ctk), ("V", ctv)):
        need = cache_nbytes(t, n_ctx, n_head_kv, head_dim)
        if need > limit:
            return half, need, limit
    return None


@contextmanager
def _observed_only(views: dict):
    """The buffers behind `views` read only while kv_cache_write wrappers run. The sealed graph
    keeps a wrapper from recording into the write's graph; this keeps it from changing the rows
    (or positions) it observes some other way, a graph of its own run at once or a host write,
    before they are stored: rows a wrapper had rotated were stored rotated twice, that is
    unrotated, and read with a rotated Q (llama.cpp issue 25725 through a hook)."""
    marked = []
    try:
        for name, view in views.items():
            buf = as_view(view).buffer
            if not buf.read_only:
                buf.read_only = f"the {name} a kv_cache_write wrapper observes"
                marked.append(buf)
        yield
    finally:
        for buf in marked:
            buf.read_only = None


class KVCache:
    def __init__(self, ctx, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 ctk: str = "f16", ctv: str = "f16", rotate: bool = True, name: str = "target"):
        _check_shape(ctx, name, n_layer, n_ctx, n_head_kv, head_dim, ctk, ctv)
        self.ctx, self.name = ctx, name
        n_layer, n_ctx, n_head_kv, head_dim = int(n_layer), int(n_ctx), int(n_head_kv), int(head_dim)
        self.n_layer, self.n_ctx, self.n_head_kv, self.head_dim = n_layer, n_ctx, n_head_kv, head_dim
        self.ctk, self.ctv = get_type(ctk).name, get_type(ctv).name
        switched_off = _rotation_switched_off(rotate)
        self.k_rot = 0 if switched_off else rotation_block(self.ctk, head_dim, "k")
        self.v_rot = 0 if switched_off else rotation_block(self.ctv, head_dim, "v")
        self.row_len = n_head_kv * head_dim
        self._owner = Owner(f"the {name} KV cache")
        self.k, self.v = [], []
        try:
            for _ in range(n_layer):
                self.k.append(ctx.buffer(cache_nbytes(self.ctk, n_ctx, n_head_kv, head_dim), owner=self._owner))
                self.v.append(ctx.buffer(cache_nbytes(self.ctv, n_ctx, n_head_kv, head_dim), owner=self._owner))
        except VkdflashError:  # out of memory part way: what was allocated is freed now, not at exit
            for buf in self.k + self.v:
                buf.destroy()
            raise
        self.n_past = 0  # committed positions; the rest of each buffer is stale and never read
        self.info = CacheInfo(next(_keys), name, n_layer, n_ctx, n_head_kv, head_dim, self.ctk, self.ctv,
                              self.k_rot, self.v_rot)
        _caches[self.info.key] = self
        log.info("%s KV cache: %d layers x %d positions, K %s (rotation %s), V %s (rotation %s)",
                 name, n_layer, n_ctx, self.ctk, _rotation_note(self.ctk, head_dim, self.k_rot, switched_off),
                 self.ctv, _rotation_note(self.ctv, head_dim, self.v_rot, switched_off))

    def describe(self) -> dict:
        return {"k_type": self.ctk, "v_type": self.ctv, "k_rotation": self.k_rot, "v_rotation": self.v_rot,
                "n_ctx": self.n_ctx}

    def _views(self, layer: int):
        rk, rv = get_type(self.ctk).row_bytes(self.row_len), get_type(self.ctv).row_bytes(self.row_len)
        return self.k[layer].view(0, self.n_ctx * rk), self.v[layer].view(0, self.n_ctx * rv)

    # -- the one write path: the core cache-write hook ------------------------------
    def record_write(self, graph, layer: int, k_rows, v_rows, positions, n_rows: int) -> None:
        """Record a write of n_rows K and V rows (f32 [n_rows, n_head_kv*head_dim], RoPE already
        applied to K) at the uint32 cache positions in `positions`. Plugin wrappers of the hook
        observe it (the rows and positions are read only while they run); the store is recorded
        whatever they do, and the rows are only read."""
        if not 0 <= layer < self.n_layer:
            raise VkdflashError(f"{self.name} cache has layers 0..{self.n_layer - 1}, not {layer}")
        hook_args = dict(cache=self.info, graph=graph, layer=layer, k_rows=k_rows, v_rows=v_rows,
                         positions=positions, n_rows=n_rows)
        with graph.sealed("kv_cache_write wrappers run (they observe a write, they cannot record one)"), \
                _observed_only({"K rows": k_rows, "V rows": v_rows, "positions": positions}):
            plugins.wrap("kv_cache_write", hook_args, lambda: self._store(graph, layer, k_rows, v_rows, positions, n_rows))
        info = self.info  # what the graph keeps for the observers: a description, no buffers
        graph.after_run(lambda: _written(info, layer, positions, n_rows))

    def _store(self, graph, layer: int, k_rows, v_rows, positions, n_rows: int) -> None:
        """Rotate (where that half is quantized), quantize and store: one kernel for both halves
        where they share type and rotation, else one per half."""
        k_view, v_view = self._views(layer)
        with graph.on_behalf_of(self._owner):
            if (self.ctk, self.k_rot) == (self.ctv, self.v_rot):
                store_rows(graph, k_rows, positions, k_view, n_rows, self.row_len, self.ctk, rotation=self.k_rot,
                           second=(v_rows, v_view))
            else:
                store_rows(graph, k_rows, positions, k_view, n_rows, self.row_len, self.ctk, rotation=self.k_rot)
                store_rows(graph, v_rows, positions, v_view, n_rows, self.row_len, self.ctv, rotation=self.v_rot)

    # -- the matching read path ---------------------------------------------------
    def attend(self, graph, layer: int, q, out, params, n_q: int, n_head: int, mask: str = "causal") -> None:
        """Record out = attention(q) over this layer's cache in rotated space: the kernel rotates
        q with H_k as it reads it (q is not changed), the output is un-rotated with H_v (H is its
        own inverse) in place in `out`."""
        k_view, v_view = self._views(layer)
        with graph.on_behalf_of(self._owner):
            attention(graph, q, k_view, v_view, out, params, n_q, n_head, self.n_head_kv, self.head_dim,
                      self.ctk, self.ctv, mask=mask, q_rotation=self.k_rot)
        if self.v_rot:
            fwht(graph, out, out, n_q * n_head, self.head_dim, self.v_rot)

    def truncate(self, n: int) -> None:
        """Forget positions >= n (speculation rolls back rejected drafts this way)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.n_ctx:
            raise VkdflashError(f"cannot truncate the {self.name} cache to {reprlib.repr(n)}: it has "
                                f"{self.n_ctx} positions")
        self.n_past = min(self.n_past, int(n))

    def destroy(self) -> None:
        _caches.pop(self.info.key, None)
        for buf in self.k + self.v:
            buf.destroy()
        self.k, self.v = [], []
