"""numpy Walsh-Hadamard rotation of quantized KV caches (llama.cpp PR 21038; docs/design.md section 2).

H_n is the Sylvester matrix scaled by 1/sqrt(n): orthonormal, symmetric, H_n @ H_n = I. It is
applied block-diagonally over consecutive n-value chunks of each head vector: K (and Q) with
n_k = the largest power of two >= 64 dividing head_dim, V (and the attention output) with 64,
only for quantized cache types and head_dim % 64 == 0."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..kernels.hadamard import V_BLOCK, k_block, rotation_block, rotation_enabled, scale, v_block

__all__ = ["V_BLOCK", "fwht_f32", "hadamard_matrix", "k_block", "rotate", "rotation_block",
           "rotation_enabled", "scale", "v_block"]


def _check_n(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise VkdflashError(f"Hadamard size must be a power of two, got {n}")


def hadamard_matrix(n: int, dtype=np.float64) -> np.ndarray:
    """Sylvester H_n / sqrt(n): H_1 = [1], H_2m = [[H, H], [H, -H]]."""
    _check_n(n)
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(dtype)


def rotate(x: np.ndarray, n: int) -> np.ndarray:
    """Block-diagonal rotation of the last axis in n-value chunks (float64 matrix product)."""
    x = np.asarray(x)
    if x.shape[-1] % n:
        raise VkdflashError(f"rows of {x.shape[-1]} values do not split into {n}-value chunks")
    chunks = x.reshape(*x.shape[:-1], -1, n).astype(np.float64)
    return (chunks @ hadamard_matrix(n)).reshape(x.shape)


def fwht_f32(x: np.ndarray, n: int) -> np.ndarray:
    """The fast transform in f32 with the GPU kernel's butterfly order (h = 1, 2, 4, ...), then
    one multiply by f32(1/sqrt(n)): bit-identical to hadamard.comp."""
    _check_n(n)
    x = np.asarray(x, np.float32)
    if x.shape[-1] % n:
        raise VkdflashError(f"rows of {x.shape[-1]} values do not split into {n}-value chunks")
    v = x.reshape(-1, n).copy()
    h = 1
    while h < n:
        v = v.reshape(-1, n // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        v = np.stack([a + b, a - b], axis=2).reshape(-1, n)
        h *= 2
    return (v * scale(n)).reshape(x.shape)
