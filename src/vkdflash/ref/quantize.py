"""numpy KV-cache quantizers: gguf-py for every type it quantizes, a port of ggml's reference
IQ4_NL quantizer for iq4_nl (gguf-py only dequantizes that one).

`quantize(x, t)` maps f32 rows (..., n) to raw blocks (..., row_bytes) as uint8, exactly the
bytes a cache row holds; `dequantize` inverts it; `quant_step` gives the per-value step the
"quant" conformance metric allows (docs/design.md sections 3 and 7)."""
from __future__ import annotations

import numpy as np
from gguf import quants as gq

from ..kernels.types import get_type

IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
# 2x the midpoints between neighbouring codebook values: best_index_int8 compares 2x with them
_IQ4NL_MID2 = IQ4NL_VALUES[:-1] + IQ4NL_VALUES[1:]
_GROUP_MAX_EPS = np.float32(1e-15)


def _iq4nl_index(al: np.ndarray) -> np.ndarray:
    return np.count_nonzero((al + al)[..., None] >= _IQ4NL_MID2, axis=-1)


def _iq4nl_sums(x: np.ndarray, w: np.ndarray, id_: np.ndarray):
    """Indices for scale 1/id_ and the f32 sums sum(w q x), sum(w q^2), accumulated in ggml's order."""
    f32 = np.float32
    l = _iq4nl_index(id_[:, None] * x)
    q = IQ4NL_VALUES[l]
    sumqx, sumq2 = np.zeros(len(x), f32), np.zeros(len(x), f32)
    for j in range(x.shape[1]):
        wq = w[:, j] * q[:, j]
        sumqx = (sumqx + wq * x[:, j]).astype(f32)
        sumq2 = (sumq2 + wq * q[:, j]).astype(f32)
    return l, sumqx, sumq2


def quantize_iq4_nl(x: np.ndarray, ntry: int = -1) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_impl for 32-value blocks without an importance matrix.

    ntry=-1 is quantize_row_iq4_nl_ref, what llama.cpp's CPU and Vulkan backends use to
    write an iq4_nl KV cache (and what set_rows.comp does); ntry=7 is the slower search over
    15 extra scales that quantize_iq4_nl uses for model files. Arithmetic is f32 without
    fused multiply-adds; a C build with -ffp-contract=fast may differ in the last bit."""
    f32 = np.float32
    x = np.ascontiguousarray(x, f32)
    shape = x.shape
    blocks = x.reshape(-1, 32)
    nb = len(blocks)
    w = blocks * blocks
    ax = np.abs(blocks)
    imax = ax.argmax(axis=1)
    vmax = blocks[np.arange(nb), imax]
    live = ax[np.arange(nb), imax] >= _GROUP_MAX_EPS
    safe_max = np.where(live, vmax, f32(1))  # dead blocks are zeroed below
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d0 = (-safe_max if ntry > 0 else safe_max) / IQ4NL_VALUES[0]
        l, sumqx, sumq2 = _iq4nl_sums(blocks, w, f32(1) / d0)
        d = np.where(sumq2 > 0, sumqx / np.where(sumq2 > 0, sumq2, f32(1)), f32(0)).astype(f32)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            id_ = f32(itry + IQ4NL_VALUES[0]) / safe_max
            _, sx, s2 = _iq4nl_sums(blocks, w, id_)
            better = (s2 > 0) & (sx * sx > best * s2)
            d = np.where(better, sx / np.where(better, s2, f32(1)), d).astype(f32)
            best = np.where(better, d * sx, best).astype(f32)
        if ntry > 0:
            l = _iq4nl_index(np.where(d != 0, f32(1) / np.where(d != 0, d, f32(1)), f32(0))[:, None] * blocks)
    d = np.where(live, d, f32(0)).astype(np.float16)
    l = np.where(live[:, None], l, 0).astype(np.uint8)
    qs = l[:, :16] | (l[:, 16:] << 4)
    out = np.concatenate([d.view(np.uint8).reshape(nb, 2), qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 18)


def quantize(x: np.ndarray, cache_type: str) -> np.ndarray:
    """f32 rows (..., n) -> the bytes of those rows in `cache_type` (..., row_bytes)."""
    t = get_type(cache_type)
    x = np.ascontiguousarray(x, np.float32)
    if t.name == "iq4_nl":
        return quantize_iq4_nl(x)
    raw = gq.quantize(x, t.gguf)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(*x.shape[:-1], t.row_bytes(x.shape[-1]))


def dequantize(raw: np.ndarray, cache_type: str) -> np.ndarray:
    """Bytes of rows (..., row_bytes) -> f32 values (..., n)."""
    t = get_type(cache_type)
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.shape[-1] // t.block_bytes * t.qk
    if t.name in ("f32", "f16"):
        out = raw.view(np.float32 if t.name == "f32" else np.float16)
    else:
        out = gq.dequantize(raw, t.gguf)
    return np.asarray(out, np.float32).reshape(*raw.shape[:-1], n)


def quant_step(raw: np.ndarray, cache_type: str) -> np.ndarray:
    """Per-value quantization step of the rows in `raw`: the largest distance between the
    dequantized value and a neighbouring quant level (0 for plain types)."""
    t = get_type(cache_type)
    if not t.quantized:
        return np.zeros(dequantize(raw, cache_type).shape, np.float32)
    raw = np.ascontiguousarray(raw, np.uint8)
    blocks = raw.reshape(-1, t.block_bytes)
    d = np.abs(blocks[:, :2].copy().view(np.float16).astype(np.float32))  # (nb, 1)
    if t.name == "iq4_nl":
        gaps = np.diff(IQ4NL_VALUES)
        idx = np.concatenate([blocks[:, 2:] & 15, blocks[:, 2:] >> 4], axis=1).astype(int)
        below = np.where(idx > 0, gaps[np.maximum(idx - 1, 0)], 0)
        above = np.where(idx < 15, gaps[np.minimum(idx, 14)], 0)
        step = d * np.maximum(below, above)
    else:
        step = np.broadcast_to(d, (len(blocks), 32))
    n = raw.shape[-1] // t.block_bytes * 32
    return np.ascontiguousarray(step, np.float32).reshape(*raw.shape[:-1], n)
