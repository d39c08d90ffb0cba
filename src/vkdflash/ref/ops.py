"""numpy references for the row kernels: RMSNorm, RoPE, elementwise ops, softmax, argmax.

Computed in float64 (exact enough to be the ground truth for f32 kernels), returned as f32
except argmax (uint32 indices)."""
from __future__ import annotations

import numpy as np

from ..kernels.rope import rope_freqs
from ..kernels.softmax import FLAG_NONFINITE


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def rms_norm(x, w, eps: float) -> np.ndarray:
    """Rows along the last axis; `w` has the row length (per-head norm: reshape to heads first)."""
    x = _f64(x)
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * scale * _f64(w)).astype(np.float32)


def rope(x, positions, freq_base: float, mode: str = "normal", n_rot: int | None = None,
         freq_scale: float = 1.0, freq_factors=None) -> np.ndarray:
    """x: [n_tokens, n_heads, head_dim]; positions: [n_tokens] integers.

    normal (ggml mode 0): pair i rotates elements (2i, 2i+1); neox (mode 2): (i, i + n_rot/2).
    Elements at n_rot and beyond pass through unchanged."""
    x = _f64(x)
    n_rot = x.shape[-1] if n_rot is None else n_rot
    theta = np.asarray(positions, np.int64).astype(np.float64)[:, None] * rope_freqs(
        n_rot, freq_base, freq_scale, freq_factors)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if mode == "normal":
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    elif mode == "neox":
        h = n_rot // 2
        x0, x1 = x[..., :h], x[..., h:n_rot]
        out[..., :h] = x0 * cos - x1 * sin
        out[..., h:n_rot] = x0 * sin + x1 * cos
    else:
        raise ValueError(f"unknown rope mode {mode!r}")
    return out.astype(np.float32)


def add(a, b) -> np.ndarray:
    return (_f64(a) + _f64(b)).astype(np.float32)


def mul(a, b) -> np.ndarray:
    return (_f64(a) * _f64(b)).astype(np.float32)


def scale(x, s: float) -> np.ndarray:
    return (_f64(x) * np.float64(np.float32(s))).astype(np.float32)


def silu(x) -> np.ndarray:
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def swiglu(gate, up) -> np.ndarray:
    """silu(gate) * up (ggml_swiglu_split)."""
    return (silu(gate) * _f64(up)).astype(np.float32)


def softmax(x, scale: float = 1.0) -> np.ndarray:
    """Softmax of x*scale along the last axis, max-subtracted; a row that is all -inf gives zeros."""
    v = _f64(x) * np.float64(np.float32(scale))
    m = np.max(v, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(v - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0).astype(np.float32)


def argmax(x, flag_nonfinite: bool = False) -> np.ndarray:
    """Index of the largest value per row; ties go to the lowest index (llama.cpp's greedy
    sampler), NaN counts as larger than everything (the first NaN wins), -0.0 equals +0.0.
    flag_nonfinite: FLAG_NONFINITE set where that largest value is NaN or +-inf."""
    x = np.asarray(x, np.float32)
    idx = np.argmax(x, axis=-1).astype(np.uint32)
    if flag_nonfinite:
        top = np.take_along_axis(x, idx[..., None].astype(np.int64), -1)[..., 0]
        idx[~np.isfinite(top)] |= np.uint32(FLAG_NONFINITE)
    return idx
