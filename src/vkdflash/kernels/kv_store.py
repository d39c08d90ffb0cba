"""KV-cache store: quantize f32 rows into cache rows named by a positions buffer (set_rows.comp).

Cache layout (one layer, K or V): n_ctx rows; row p holds position p as
n_kv_heads*head_dim values in the cache type's ggml block layout, head h at values
[h*head_dim, (h+1)*head_dim); a rotated cache holds H x, not x. The positions buffer holds one uint32 per stored row and is
rewritten between replays (`write_positions` checks and writes it), so one recorded graph
serves every decoding step. Quantization is bit-exact with gguf-py (ggml's iq4_nl reference
for iq4_nl): see shaders/quantize.glsl."""
from __future__ import annotations

import struct

import numpy as np

from ..errors import VkdflashError
from ..runtime.memory import as_view, pieces, texel_views
from .hadamard import scale
from .types import CACHE_TYPES, get_type

WORKGROUP = 32  # lavapipe: 8..64 measure within noise of each other; each invocation quantizes a block
ROTATIONS = (64, 128, 256)  # Hadamard chunks a cache uses (ref.hadamard.rotation_block, head_dim <= 256)


def cache_row_bytes(row_len: int, cache_type: str) -> int:
    t = get_type(cache_type)
    if t.name not in CACHE_TYPES:
        raise VkdflashError(f"{t.name} is not a KV-cache type; use one of {', '.join(CACHE_TYPES)}")
    if row_len <= 0 or row_len % 32:
        raise VkdflashError(f"cache rows need a positive multiple of 32 values, got {row_len}")
    return t.row_bytes(row_len)


def cache_rows(cache, row_len: int, cache_type: str) -> int:
    """Number of positions (n_ctx) a cache buffer or view holds."""
    size, rb = as_view(cache).size, cache_row_bytes(row_len, cache_type)
    if size % rb:
        raise VkdflashError(f"cache of {size} bytes is not a whole number of {rb}-byte {cache_type} rows")
    return size // rb


def write_positions(positions_buffer, positions, n_ctx: int, offset: int = 0) -> None:
    """Check and write the uint32 cache positions of the next store (host side, between replays)."""
    pos = np.asarray(positions)
    if pos.ndim != 1 or (pos.size and not np.issubdtype(pos.dtype, np.integer)):
        raise VkdflashError("positions must be a 1-D sequence of integers")
    if pos.size and (pos.min() < 0 or pos.max() >= n_ctx):
        raise VkdflashError(f"cache position {int(pos.min() if pos.min() < 0 else pos.max())} "
                            f"is outside the cache (n_ctx {n_ctx})")
    if np.unique(pos).size != pos.size:
        raise VkdflashError("a store names the same cache position twice")
    view = as_view(positions_buffer)
    if offset + 4 * pos.size > view.size:
        raise VkdflashError(f"{pos.size} positions do not fit a {view.size}-byte positions buffer")
    view.buffer.write(pos.astype(np.uint32), view.offset + offset)


def store_rows(graph, src_view, positions_view, cache_view, n_rows: int, row_len: int, cache_type: str,
               src_stride: int | None = None, rotation: int = 0, workgroup: int = WORKGROUP,
               second=None) -> None:
    """Record: cache[positions[r]] = quantize(H src[r]) for r < n_rows, H the Hadamard rotation
    in `rotation`-value chunks (0: none), applied in registers: src is only read.

    src_view: n_rows f32 rows, `src_stride` floats apart (default row_len); positions_view:
    n_rows uint32 (see write_positions); cache_view: the whole cache (n_ctx rows). Caches
    larger than one binding are stored piece by piece, each dispatch skipping rows of others.
    second: (src_view, cache_view) stored alike at the same positions, in the same dispatch
    where both caches fit one binding (a layer's K and V: one dispatch fewer)."""
    t = get_type(cache_type)
    rb = cache_row_bytes(row_len, cache_type)
    stride = row_len if src_stride is None else int(src_stride)
    if n_rows <= 0:
        raise VkdflashError(f"store_rows needs at least one row, got {n_rows}")
    if rotation and (rotation not in ROTATIONS or row_len % rotation):
        raise VkdflashError(f"a store rotates in chunks of {', '.join(map(str, ROTATIONS))} values that "
                            f"divide the row, not {rotation} for rows of {row_len}")
    if stride < row_len:
        raise VkdflashError(f"source stride {stride} is shorter than a row of {row_len} values")
    pairs = [(as_view(src_view), as_view(cache_view))] + ([tuple(as_view(v) for v in second)] if second else [])
    for src, _ in pairs:
        if src.size < 4 * ((n_rows - 1) * stride + row_len):
            raise VkdflashError(f"source of {src.size} bytes holds fewer than {n_rows} rows of {row_len} floats")
    pos = as_view(positions_view)
    if pos.size < 4 * n_rows:
        raise VkdflashError(f"positions buffer of {pos.size} bytes holds fewer than {n_rows} uint32")
    n_ctx = [cache_rows(cache, row_len, cache_type) for _, cache in pairs]
    if len(set(n_ctx)) > 1:
        raise VkdflashError(f"the two caches of one store hold {n_ctx[0]} and {n_ctx[1]} rows")
    ctx = graph.ctx
    offsets = [cache.offset + row0 * rb for _, cache in pairs for row0, _ in _pieces(ctx, n_ctx[0], rb, cache.offset)]
    spec = (workgroup, t.id, rotation, float(scale(rotation)) if rotation else 1.0, int(wide_stores(t, offsets)))
    units = n_rows * row_len // max(rotation, 32)
    label = f"set_rows.{t.name}" + (f".rot{rotation}" if rotation else "")
    push = struct.pack("<5I", n_rows, row_len, stride, 0, n_ctx[0])
    # texel variants: sources as vec4 texels (whole vec4s: row_len is a multiple of 32)
    texels = texel_views(ctx, [src for src, _ in pairs]) if stride % 4 == 0 else None
    if texels:
        pairs = [(tv, cache) for tv, (_, cache) in zip(texels, pairs)]
    variant = "_texel" if texels else ""
    if second and all(len(_pieces(ctx, n_ctx[0], rb, cache.offset)) == 1 for _, cache in pairs):
        (src, cache), (src_v, cache_v) = pairs
        graph.dispatch(ctx.pipeline("set_rows_kv" + variant, 5, 20, spec, (0, 3) if variant else ()),
                       [src, pos, cache, src_v, cache_v], (-(-2 * units // workgroup),), push, label=label + ".kv")
        return
    pipe = ctx.pipeline("set_rows" + variant, 3, 20, spec, (0,) if variant else ())
    for src, cache in pairs:
        for row0, count in _pieces(ctx, n_ctx[0], rb, cache.offset):
            piece = cache.buffer.view(cache.offset + row0 * rb, count * rb)
            graph.dispatch(pipe, [src, pos, piece], (-(-units // workgroup),),
                           struct.pack("<5I", n_rows, row_len, stride, row0, count), label=label)


def wide_stores(t, binding_offsets) -> bool:
    """16-byte stores (set_rows.comp's WIDE): plain types, whose 64- or 128-byte blocks then sit
    on 16-byte boundaries of 16-byte aligned bindings."""
    return t.name in ("f32", "f16", "bf16") and all(off % 16 == 0 for off in binding_offsets)


def _pieces(ctx, n_ctx: int, row_bytes: int, offset: int) -> list[tuple[int, int]]:
    limit = ctx.features.max_storage_buffer_range
    if n_ctx * row_bytes <= limit:
        return [(0, n_ctx)]
    align = ctx.features.min_storage_buffer_offset_alignment
    if offset % align:
        raise VkdflashError(f"a cache larger than one binding must start at a {align}-byte aligned offset")
    return pieces(ctx, n_ctx, row_bytes)
