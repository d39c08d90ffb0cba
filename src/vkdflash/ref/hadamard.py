"""numpy Walsh-Hadamard rotation of quantized KV caches (llama.cpp PR 21038; docs/design.md section 2).

H_n is the Sylvester matrix scaled by 1/sqrt(n): orthonormal, symmetric, H_n @ H_n = I. It is
applied block-diagonally over consecutive n-value chunks of each head vector: K (and Q) with
n_k = the largest power of two >= 64 dividing head_dim, V (and the attention output) with 64,
only for quantized cache types and head_dim % 64 == 0."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..kernels.hadamard import scale
from ..kernels.types import get_type

V_BLOCK = 64


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


def k_block(head_dim: int) -> int:
    """n_k: the largest power of two >= 64 dividing head_dim (128 for 128, 64 for 64 or 192)."""
    if head_dim % 64:
        raise VkdflashError(f"head_dim {head_dim} is not a multiple of 64: no K rotation")
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def v_block(head_dim: int) -> int:
    """n_v: always 64."""
    if head_dim % V_BLOCK:
        raise VkdflashError(f"head_dim {head_dim} is not a multiple of 64: no V rotation")
    return V_BLOCK


def rotation_enabled(cache_type: str, head_dim: int) -> bool:
    """Rotate a cache (K and V decided separately) iff its type is quantized and head_dim % 64 == 0."""
    return get_type(cache_type).quantized and head_dim % 64 == 0


def rotation_block(cache_type: str, head_dim: int, kind: str) -> int:
    """Chunk size of the rotation for a K or V cache of this type, 0 when it is not rotated."""
    if kind not in ("k", "v"):
        raise VkdflashError(f"rotation kind must be 'k' or 'v', got {kind!r}")
    if not rotation_enabled(cache_type, head_dim):
        return 0
    return k_block(head_dim) if kind == "k" else v_block(head_dim)
