"""Fused flash-style attention over a ggml-layout KV cache (shaders/flash_attn.comp).

Cache layout (one layer, K and V alike): n_ctx rows, row p holds position p as n_head_kv*head_dim
values in the cache type's block layout; head h occupies values [h*head_dim, (h+1)*head_dim).
The K and V types are specialization constants, so every K/V pair runs from one SPIR-V.
Cache buffers must be readable up to the next 16-byte boundary after the last row (see
cache_nbytes). Q is rotated like a rotated K cache inside the kernel; un-rotating the output
is the caller's (kv_cache.attend)."""
from __future__ import annotations

import math
import struct

from ..errors import VkdflashError
from ..runtime.memory import View, as_view, prefers_texel_loads, texel_view
from .hadamard import scale as rotation_scale
from .kv_store import ROTATIONS
from .types import CACHE_TYPES, get_type

LANES = 8        # invocations per workgroup; fixed, because each row's walk order depends on it
MAX_HEAD_DIM = 256
ROW_BUDGET = 384  # (query, head) rows x head_dim per workgroup: registers, shared memory (12 KB
# with 8 lanes), compile time. SmolLM2 (3 heads of 64 a kv head): 384 pairs the queries, and 16
# query rows at context 64 took 195 -> 171 us, 64 rows 701 -> 597 (iq4_nl cache: 755 -> 444)
MASKS = {"causal": 0, "block": 1}
MAX_GROUPS = 65535  # the smallest maxComputeWorkGroupCount Vulkan allows
# lavapipe stops a shader invocation after 65535 loop iterations in total (kernels/copy.py), and
# then silently: a lane walks every LANES-th visible position, one iteration each, and spends
# the rest on rotating Q (one 256-value FWHT: about 1600) and merging the lanes (a few hundred).
# Past the limit the walk stops early: at 600000 positions the output missed the last rows
# (NMSE 1.0); at 520000 with a rotated hd-256 K as well.
MAX_ITERATIONS = 65535
LOOP_RESERVE = 4096


def max_positions(features) -> int | None:
    """The most cache positions attention can read on this device, or None for no limit (CPU
    devices: lavapipe's loop limit; verified at this bound with a q4_0 hd-256 cache)."""
    return (MAX_ITERATIONS - LOOP_RESERVE) * LANES if features.device_type == "cpu" else None


def cache_nbytes(cache_type, n_ctx: int, n_head_kv: int, head_dim: int) -> int:
    """Bytes to allocate for one layer's K (or V) cache of n_ctx rows: the rows plus the tail
    up to a 16-byte boundary that attention() reads past the last row (never uses)."""
    rows = n_ctx * get_type(cache_type).row_bytes(n_head_kv * head_dim)
    return -(-rows // 16) * 16


def attention(graph, q_view, k_view, v_view, out_view, params_view, n_q: int, n_head: int,
              n_head_kv: int, head_dim: int, k_type, v_type, mask: str = "causal",
              scale: float | None = None, q_rotation: int = 0, texel: bool | None = None) -> None:
    """Record out = softmax(scale * (H Q) K^T + mask) V for n_q queries at cache positions
    first_pos .. first_pos+n_q-1, first_pos being uint32 word 0 of `params_view` (read at run time,
    so the host may rewrite it between replays). Q and out are f32 [n_q, n_head, head_dim]; H is
    the Hadamard rotation in `q_rotation`-value chunks (0: none), applied in registers, so Q is
    only read.

    mask "causal": query i sees positions 0..first_pos+i. mask "block": every query sees
    0..first_pos+n_q-1. The cache binding's row count bounds every visible length."""
    kt, vt = _cache_type(k_type), _cache_type(v_type)
    if mask not in MASKS:
        raise VkdflashError(f"attention mask must be one of {', '.join(MASKS)}, got {mask!r}")
    if head_dim <= 0 or head_dim % 32 or head_dim > MAX_HEAD_DIM:
        raise VkdflashError(f"attention head_dim must be a multiple of 32 up to {MAX_HEAD_DIM}, got {head_dim}")
    if n_q <= 0 or n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise VkdflashError(f"attention needs n_head ({n_head}) to be a positive multiple of "
                            f"n_head_kv ({n_head_kv}) and n_q ({n_q}) > 0")
    q_view, k_view, v_view = as_view(q_view), as_view(k_view), as_view(v_view)
    out_view, params_view = as_view(out_view), as_view(params_view)
    qo_bytes = n_q * n_head * head_dim * 4
    for name, view in (("Q", q_view), ("output", out_view)):
        if view.size < qo_bytes:
            raise VkdflashError(f"attention {name} holds {view.size} bytes, needs {qo_bytes} "
                                f"(f32 [{n_q}, {n_head}, {head_dim}])")
    k_row, v_row = kt.row_bytes(n_head_kv * head_dim), vt.row_bytes(n_head_kv * head_dim)
    n_ctx = min(k_view.size // k_row, v_view.size // v_row)
    if n_ctx == 0:
        raise VkdflashError(f"attention cache bindings hold no full row ({k_row} / {v_row} bytes)")
    most = max_positions(graph.ctx.features)
    if most is not None and n_ctx > most:
        raise VkdflashError(f"attention reads at most {most} cache positions on this device (its loop "
                            f"limit), and the bindings hold {n_ctx}")
    k_view, v_view = _padded(graph.ctx, k_view, "K"), _padded(graph.ctx, v_view, "V")
    if params_view.size < 4:
        raise VkdflashError("attention params buffer must hold a uint32 first_pos")
    if q_rotation and (q_rotation not in ROTATIONS or head_dim % q_rotation):
        raise VkdflashError(f"attention rotates Q in chunks of {', '.join(map(str, ROTATIONS))} values that "
                            f"divide head_dim, not {q_rotation} for head_dim {head_dim}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    gqa = n_head // n_head_kv
    g, qt = tile(n_q, gqa, head_dim)
    if -(-n_q // qt) > MAX_GROUPS:
        raise VkdflashError(f"attention takes at most {MAX_GROUPS * qt} queries per call, got {n_q}")
    rot = (q_rotation, float(rotation_scale(q_rotation)) if q_rotation else 1.0)
    merge = shuffle_merge(graph.ctx.features)
    pk = pack(graph.ctx.features) if merge else 1
    groups = [n_head // g, -(-n_q // qt)]
    # query tiles pair up where there are enough to fill a workgroup; else head groups do (a
    # decode step; and 2 rows on lavapipe, whose one tile of 2 left half of every workgroup
    # idle: at context 1000 the 2-row attention took 19 ms, the 4-row one 18, one row 7.4)
    pack_y = n_q > 1 and (pk == 1 or groups[1] >= pk)
    groups[pack_y] = -(-groups[pack_y] // pk)
    spec = (LANES * pk, head_dim, kt.id, vt.id, g, qt) + rot + (int(merge), pk, int(pack_y))
    views = [q_view, k_view, v_view, out_view, params_view]
    texels = [texel_view(graph.ctx, v, f) for v, f in zip(views[:3], ("f32x4", "u32x4", "u32x4"))]
    if (prefers_texel_loads(graph.ctx.features) if texel is None else texel) and all(texels):
        pipe = graph.ctx.pipeline("flash_attn_texel", 5, 32, spec, (0, 1, 2))
        views[:3] = texels
    else:
        pipe = graph.ctx.pipeline("flash_attn", 5, 32, spec)
    push = struct.pack("<7If", n_q, n_head, gqa, n_ctx, k_row // 2, v_row // 2, MASKS[mask], scale)
    graph.dispatch(pipe, views, tuple(groups), push,
                   label=f"flash_attn/{kt.name},{vt.name}" + (f",qrot{q_rotation}" if q_rotation else ""))


def shuffle_merge(features) -> bool:
    """The lanes' states merge by subgroup shuffles where a workgroup fits in one subgroup:
    on lavapipe, merging through shared memory cost more than the attention at 16 query rows."""
    return "shuffle" in features.subgroup_ops and features.subgroup_size >= LANES


def pack(features) -> int:
    """Groups of LANES lanes a workgroup holds (with the shuffle merge): CPU devices fill their
    SIMD width (lavapipe at 512 bits: 16 lanes, so 2; 16 query rows at context 64 went 331 -> 205
    us alone). GPUs keep 1 until measured there."""
    if features.device_type != "cpu":
        return 1
    return max(1, min(4, features.subgroup_size // LANES))


def tile(n_q: int, gqa: int, head_dim: int) -> tuple[int, int]:
    """(G heads, QT queries) per workgroup: each K/V row fetched serves G*QT rows. Any choice
    gives the same bits; it trades registers and compile time for fewer fetches. QT is 1 for
    decode and one fixed value otherwise, so a model compiles two variants."""
    g = max((d for d in range(1, gqa + 1) if gqa % d == 0 and d * head_dim <= ROW_BUDGET), default=1)
    qt = 1 if n_q == 1 else max(1, ROW_BUDGET // (g * head_dim))
    return g, qt


def _padded(ctx, view: View, what: str) -> View:
    """The shader reads caches in 16-byte vectors: bind up to the next 16-byte boundary (those
    bytes are read, never used), which the cache buffer must hold."""
    size = -(-view.size // 16) * 16
    if view.offset + size > view.buffer.nbytes:
        raise VkdflashError(f"attention {what} cache buffer must extend to a 16-byte boundary after the "
                            f"bound rows: allocate {size - view.size} more bytes (see cache_nbytes)")
    if size > ctx.features.max_storage_buffer_range:
        raise VkdflashError(f"attention {what} cache binding of {size} bytes exceeds the device's storage "
                            f"range {ctx.features.max_storage_buffer_range}")
    return View(view.buffer, view.offset, size)


def _cache_type(t):
    tt = get_type(t)
    if tt.name not in CACHE_TYPES:
        raise VkdflashError(f"{tt.name} is not a KV cache type; cache types: {', '.join(CACHE_TYPES)}")
    return tt
