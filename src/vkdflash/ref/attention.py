"""Attention over a (dequantized) KV cache: the numpy ground truth for flash_attn.comp."""
from __future__ import annotations

import numpy as np


def visible_lengths(n_q: int, first_pos: int, mask: str) -> np.ndarray:
    """How many cache positions (from 0) each query sees.

    causal: query i sits at first_pos+i and sees 0..first_pos+i.
    block (DFlash drafting): every query sees everything before the block and the whole block."""
    if mask == "causal":
        return first_pos + np.arange(n_q) + 1
    if mask == "block":
        return np.full(n_q, first_pos + n_q)
    raise ValueError(f"unknown mask {mask!r}")


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, first_pos: int, mask: str = "causal",
              scale: float | None = None) -> np.ndarray:
    """q: [n_q, n_head, hd]; k, v: [n_ctx, n_head_kv, hd] (dequantized cache values).
    Returns f32 [n_q, n_head, hd]. Head h reads kv head h // (n_head // n_head_kv); softmax in f64."""
    n_q, n_head, hd = q.shape
    n_head_kv = k.shape[1]
    group = n_head // n_head_kv
    scale = 1.0 / np.sqrt(hd) if scale is None else scale
    k = np.repeat(np.asarray(k, np.float64), group, axis=1)  # [n_ctx, n_head, hd]
    v = np.repeat(np.asarray(v, np.float64), group, axis=1)
    out = np.zeros((n_q, n_head, hd))
    for i, n in enumerate(visible_lengths(n_q, first_pos, mask)):
        s = np.einsum("hd,phd->hp", np.asarray(q[i], np.float64), k[:n]) * scale
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        out[i] = np.einsum("hp,phd->hd", w, v[:n])
    return out.astype(np.float32)
