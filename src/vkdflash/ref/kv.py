"""numpy KV cache with the GPU cache's semantics: one write path, one read path (docs/design.md 2, 3).

Write (`write`): K and V arrive after RoPE (and k_norm); a quantized half whose head_dim % 64 == 0
is rotated block-diagonally with the Hadamard matrix (K in n_k chunks, V in 64-value chunks) unless
rotation is disabled (llama.cpp's LLAMA_ATTN_ROT_DISABLE), then quantized with `ref.quantize`: the
cache keeps exactly the bytes the GPU store kernel writes, and reads their dequantized values.
Read (`attend`): Q is rotated with H_k, attention runs in rotated space over the dequantized cache,
and the output is rotated back with H_v (H is symmetric and H H = I).

Rotations use `hadamard.fwht_f32`, bit-identical with hadamard.comp, so the stored bytes can be
compared with the GPU's."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..kernels.types import CACHE_TYPES, get_type
from .attention import attention
from .hadamard import fwht_f32, rotation_block
from .quantize import dequantize, quantize


def _check_cache_type(name: str, head_dim: int) -> str:
    if name not in CACHE_TYPES:
        raise VkdflashError(f"unknown KV cache type {name!r} (supported: {', '.join(CACHE_TYPES)})")
    if get_type(name).quantized and head_dim % 32:
        raise VkdflashError(f"a {name} KV cache needs head_dim divisible by 32, got {head_dim}")
    return name


class KVCache:
    """Per layer K and V of shape [positions, n_head_kv, head_dim], stored in types ctk / ctv."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, ctk: str = "f16", ctv: str = "f16",
                 rotate: bool = True):
        self.n_layer, self.n_head_kv, self.head_dim = n_layer, n_head_kv, head_dim
        self.ctk, self.ctv = _check_cache_type(ctk, head_dim), _check_cache_type(ctv, head_dim)
        # rotation chunk sizes, 0 = that half is stored unrotated
        self.k_block = rotation_block(ctk, head_dim, "k") if rotate else 0
        self.v_block = rotation_block(ctv, head_dim, "v") if rotate else 0
        self._rb = {"k": get_type(ctk).row_bytes(head_dim), "v": get_type(ctv).row_bytes(head_dim)}
        self.reset()

    def reset(self) -> None:
        self._len = [0] * self.n_layer
        self._raw = {h: [np.zeros((0, self.n_head_kv, self._rb[h]), np.uint8) for _ in range(self.n_layer)]
                     for h in "kv"}
        self._val = {h: [np.zeros((0, self.n_head_kv, self.head_dim), np.float32) for _ in range(self.n_layer)]
                     for h in "kv"}

    @property
    def n(self) -> int:
        """Positions held by every layer (the next write position of a full forward pass)."""
        return min(self._len)

    def layer_len(self, layer: int) -> int:
        return self._len[layer]

    def truncate(self, n: int) -> None:
        """Drop positions >= n in every layer."""
        if n < 0:
            raise VkdflashError(f"cannot truncate the KV cache to {n} positions")
        self._len = [min(length, n) for length in self._len]

    def _store(self, half: str, layer: int, pos: int, x: np.ndarray) -> None:
        ctype = self.ctk if half == "k" else self.ctv
        block = self.k_block if half == "k" else self.v_block
        x = np.asarray(x, np.float32)
        if block:
            x = fwht_f32(x, block)
        raw = quantize(x, ctype)
        end = pos + len(x)
        raw_l, val_l = self._raw[half][layer], self._val[half][layer]
        if end > len(raw_l):  # grow by doubling so appends stay linear
            cap = max(end, 2 * len(raw_l), 16)
            raw_l = np.concatenate([raw_l, np.zeros((cap - len(raw_l),) + raw_l.shape[1:], np.uint8)])
            val_l = np.concatenate([val_l, np.zeros((cap - len(val_l),) + val_l.shape[1:], np.float32)])
            self._raw[half][layer], self._val[half][layer] = raw_l, val_l
        raw_l[pos:end] = raw
        val_l[pos:end] = dequantize(raw, ctype)

    def write(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store K, V [n, n_head_kv, head_dim] (after RoPE) at positions pos..pos+n-1 of a layer.
        Positions must follow on from what the layer holds (pos <= its length); the layer's length
        becomes pos + n, so rewriting earlier positions drops the ones after them."""
        shape = (self.n_head_kv, self.head_dim)
        if np.shape(k)[1:] != shape or np.shape(v) != np.shape(k):
            raise VkdflashError(f"KV write expects k and v of shape [n, {shape[0]}, {shape[1]}], "
                                f"got {list(np.shape(k))} and {list(np.shape(v))}")
        if not 0 <= pos <= self._len[layer]:
            raise VkdflashError(f"KV write at position {pos} leaves a gap (layer {layer} holds {self._len[layer]})")
        self._store("k", layer, pos, k)
        self._store("v", layer, pos, v)
        self._len[layer] = pos + len(k)

    def raw(self, layer: int, half: str) -> np.ndarray:
        """The stored bytes of one half ('k' or 'v'): [positions, n_head_kv, row_bytes] uint8."""
        return self._raw[half][layer][:self._len[layer]]

    def values(self, layer: int, half: str) -> np.ndarray:
        """What attention reads: the dequantized (still rotated) values, [positions, n_head_kv, head_dim]."""
        return self._val[half][layer][:self._len[layer]]

    def rotate_q(self, q: np.ndarray) -> np.ndarray:
        return fwht_f32(q, self.k_block) if self.k_block else np.asarray(q, np.float32)

    def unrotate_out(self, o: np.ndarray) -> np.ndarray:
        return fwht_f32(o, self.v_block) if self.v_block else np.asarray(o, np.float32)

    def attend(self, layer: int, q: np.ndarray, first_pos: int, mask: str = "causal") -> np.ndarray:
        """Attention of q [n_q, n_head, head_dim] (after RoPE), sitting at positions first_pos.., over
        the layer's cache; scale 1/sqrt(head_dim), softmax in f64. Returns f32 [n_q, n_head, head_dim]."""
        n_q = len(q)
        need = first_pos + n_q
        if need > self._len[layer]:
            raise VkdflashError(f"attention over {need} positions but layer {layer} holds {self._len[layer]}")
        o = attention(self.rotate_q(q), self.values(layer, "k"), self.values(layer, "v"), first_pos, mask)
        return self.unrotate_out(o)
