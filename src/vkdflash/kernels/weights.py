"""Weight tensors on the device, in ggml's raw block layout (exactly the bytes of the GGUF file),
each row padded to a multiple of 16 bytes: matmul then reads every row with the same 16-byte
loads, one dispatch a matrix (unpadded q4_1 rows of 576 values start at two offsets mod 16).

On CPU devices rows are also interleaved in tiles of `tile` rows, 16 bytes at a time (word k of
row r at tile r // tile, slot k * tile + r % tile), as llama.cpp's CPU backend repacks Q4_0:
the SIMD lanes of a matmul, one row each, then read 16 * tile contiguous bytes per load instead
of `tile` scattered cache lines (perf on lavapipe: ~70% of decode time stalled in those loads).

A tensor larger than the device's storage-buffer range (128 MiB on lavapipe) is bound in row
pieces; kernels dispatch once per piece with the piece's view and its first row."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import VkdflashError
from .blocks import dequantize, quantize
from ..runtime.memory import View, pieces, prefers_texel_loads
from .types import WEIGHT_TYPES, TensorType, get_type


@dataclass(frozen=True)
class Piece:
    first_row: int
    rows: int
    view: View


def row_tile(features) -> int:
    """Rows a tile interleaves on this device: one SIMD vector of lanes where lanes walk rows
    alone (CPU devices, see kernels/matmul.config_for), else 1 (plain row-major)."""
    return max(1, int(features.subgroup_size)) if prefers_texel_loads(features) else 1


class Weight:
    """ttype: TensorType; rows: output features (ggml ne[1]); cols: input features (ggml ne[0]);
    tile: rows interleaved per tile (default: row_tile of the device)."""

    def __init__(self, ctx, ttype, rows: int, cols: int, data: np.ndarray, name: str = "weight",
                 tile: int | None = None):
        t = ttype if isinstance(ttype, TensorType) else get_type(ttype)
        if t.name not in WEIGHT_TYPES:
            raise VkdflashError(f"{name}: {t.name} is not a weight type; supported: {', '.join(WEIGHT_TYPES)}")
        rows, cols = int(rows), int(cols)
        if rows <= 0 or cols <= 0:
            raise VkdflashError(f"{name}: shape ({rows}, {cols}) must be positive")
        if cols % 32 or cols % t.qk:
            raise VkdflashError(f"{name}: {t.name} needs cols to be a multiple of {max(32, t.qk)}, got {cols}")
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.ctx, self.ttype, self.rows, self.cols, self.name = ctx, t, rows, cols, name
        self.offset, self.shared = 0, False  # a slice (rows_slice) views its parent's buffer
        self.row_bytes = t.row_bytes(cols)  # in the GGUF file
        if raw.nbytes != rows * self.row_bytes:
            raise VkdflashError(f"{name}: {raw.nbytes} bytes given, a {t.name} tensor of "
                                f"{rows}x{cols} needs {rows * self.row_bytes}")
        self.stride = -(-self.row_bytes // 16) * 16  # on the device
        self.tile = int(tile or row_tile(ctx.features))
        while self.tile > 1 and self.tile * self.stride > ctx.features.max_storage_buffer_range:
            self.tile //= 2  # a tile must fit one binding
        padded_rows = -(-rows // self.tile) * self.tile
        self.nbytes = padded_rows * self.stride
        padded = np.zeros((padded_rows, self.stride), np.uint8)
        padded[:rows, :self.row_bytes] = raw.reshape(rows, self.row_bytes)
        self.buffer = ctx.buffer(self.nbytes)
        self.buffer.write(self._interleave(padded, self.tile))
        self.buffer.read_only = f"the weight {name}"  # borrowed by strategies: uploaded once, never changed
        # pieces hold whole tiles
        span = self.tile * self.stride
        self.pieces = [Piece(t * self.tile, min(n * self.tile, rows - t * self.tile), self.buffer.view(t * span, n * span))
                       for t, n in pieces(ctx, padded_rows // self.tile, span)]

    def rows_slice(self, first: int, rows: int, name: str) -> "Weight | None":
        """Rows first..first+rows as a Weight on this one's memory (stacked QKV: one matmul fills
        all three, and each part still works alone), or None where the layout cannot give one
        (a slice must start on a tile, in the first piece, at an offset the device can bind)."""
        span = -(-rows // self.tile) * self.tile * self.stride
        offset = first * self.stride
        if (first % self.tile or len(self.pieces) != 1 or first + rows > self.rows
                or offset % self.ctx.features.min_storage_buffer_offset_alignment):
            return None
        part = object.__new__(Weight)
        part.__dict__.update(self.__dict__)
        part.rows, part.name, part.offset, part.shared, part.nbytes = rows, name, offset, True, span
        part.pieces = [Piece(0, rows, self.buffer.view(offset, span))]
        return part

    @classmethod
    def from_float(cls, ctx, array: np.ndarray, ttype, name: str = "weight") -> "Weight":
        """Quantize a float (rows, cols) array with gguf-py (f32/f16/bf16 stored directly)."""
        array = np.asarray(array, np.float32)
        if array.ndim != 2:
            raise VkdflashError(f"{name}: expected a 2-D array, got shape {array.shape}")
        t = ttype if isinstance(ttype, TensorType) else get_type(ttype)
        if t.name in WEIGHT_TYPES and array.shape[1] % max(32, t.qk):
            raise VkdflashError(f"{name}: {t.name} needs cols to be a multiple of {max(32, t.qk)}, "
                                f"got {array.shape[1]}")
        return cls(ctx, t, array.shape[0], array.shape[1], quantize(array, t), name)

    def dequantize(self) -> np.ndarray:
        """The values the kernels compute with, as float32 (rows, cols) (reads the device copy)."""
        rows = self._interleave(self.buffer.read(np.uint8, self.nbytes, self.offset), self.tile, inverse=True)
        return dequantize(rows[:self.rows, :self.row_bytes], self.ttype, self.cols)

    def _interleave(self, data: np.ndarray, tile: int, inverse: bool = False) -> np.ndarray:
        """(padded rows, stride) bytes <-> the device layout (tiles of `tile` rows, 16 bytes a slot)."""
        words = self.stride // 16
        if inverse:
            return data.reshape(-1, words, tile, 16).transpose(0, 2, 1, 3).reshape(-1, self.stride)
        return data.reshape(-1, tile, words, 16).transpose(0, 2, 1, 3).reshape(-1)

    def __repr__(self) -> str:
        return f"Weight({self.name}, {self.ttype.name}, {self.rows}x{self.cols}, {len(self.pieces)} piece(s))"

    def destroy(self) -> None:
        if not self.shared:
            self.buffer.destroy()
        self.pieces = []
