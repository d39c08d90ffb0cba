"""The Weight class: raw GGUF bytes on the device, quantizing helper, validation, pieces."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.kernels.types import WEIGHT_TYPES, get_type
from vkdflash.kernels.weights import Weight
from vkdflash.ref import quants as ref


@pytest.mark.parametrize("tname", WEIGHT_TYPES)
def test_raw_bytes_round_trip(ctx, tname):
    rows, cols = 5, 512
    raw = ref.random_blocks(np.random.default_rng(1), tname, rows, cols)
    for tile in (1, 4, None):
        w = Weight(ctx, tname, rows, cols, raw, tile=tile)
        assert (w.rows, w.cols, w.ttype.name) == (rows, cols, tname)
        assert tile is None or w.tile == tile
        padded = -(-rows // w.tile) * w.tile
        assert w.row_bytes == get_type(tname).row_bytes(cols) and w.nbytes == padded * w.stride
        assert w.stride % 16 == 0 and w.stride - w.row_bytes < 16
        stored = w.buffer.read(np.uint8, w.nbytes).reshape(-1, 16)
        # the documented layout: 16-byte word k of row r is slot k * tile + r % tile of tile r // tile
        words = w.stride // 16
        for r in range(padded):
            row = np.concatenate([stored[(r // w.tile) * w.tile * words + k * w.tile + r % w.tile]
                                  for k in range(words)])
            if r < rows:
                assert np.array_equal(row[:w.row_bytes], raw.reshape(rows, -1)[r])
                assert not row[w.row_bytes:].any()
            else:
                assert not row.any()
        assert np.array_equal(w.dequantize(), ref.dequantize(raw, tname, cols))
        assert len(w.pieces) == 1 and w.pieces[0].rows == rows
        w.destroy()


@pytest.mark.parametrize("tname", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_from_float(ctx, tname):
    a = np.random.default_rng(2).uniform(-1, 1, (3, 64)).astype(np.float32)
    w = Weight.from_float(ctx, a, tname)
    want = ref.dequantize(ref.quantize(a, tname), tname, 64)
    assert np.array_equal(w.dequantize(), want)
    if tname == "f32":
        assert np.array_equal(want, a)
    assert np.abs(want - a).max() < 0.2  # at most about one q4 step (max/8)
    w.destroy()


def test_gguf_shaped_arrays(ctx):
    """GGUFReader hands out f32 tensors as float arrays and quantized ones as (rows, bytes)."""
    a = np.random.default_rng(3).uniform(-1, 1, (4, 32)).astype(np.float32)
    w = Weight(ctx, "f32", 4, 32, a)
    assert np.array_equal(w.dequantize(), a)
    w.destroy()


def test_pieces_cover_rows(ctx, monkeypatch):
    monkeypatch.setattr(ctx.features, "max_storage_buffer_range", 1000)
    raw = ref.random_blocks(np.random.default_rng(4), "q4_0", 30, 96)  # 54-byte rows
    w = Weight(ctx, "q4_0", 30, 96, raw)
    assert [p.first_row for p in w.pieces] == sorted(p.first_row for p in w.pieces)
    assert sum(p.rows for p in w.pieces) == 30 and w.pieces[0].first_row == 0
    align = ctx.features.min_storage_buffer_offset_alignment
    for p in w.pieces:
        assert p.view.offset == p.first_row * w.stride and p.view.offset % align == 0
        assert p.view.size == -(-p.rows // w.tile) * w.tile * w.stride <= 1000  # whole tiles
    w.destroy()


@pytest.mark.parametrize("args, match", [
    (("q4_0", 4, 48), "multiple of 32"),
    (("q4_k", 4, 128), "multiple of 256"),
    (("q4_0", 0, 64), "positive"),
    (("iq4_nl", 4, 64), "not a weight type"),
    (("q9_9", 4, 64), "unknown tensor type"),
])
def test_bad_shapes(ctx, args, match):
    with pytest.raises(VkdflashError, match=match):
        Weight(ctx, *args, np.zeros(4096, np.uint8))


def test_wrong_byte_count(ctx):
    with pytest.raises(VkdflashError, match="bytes given"):
        Weight(ctx, "q8_0", 4, 64, np.zeros(4 * 68 - 2, np.uint8))


def test_from_float_errors(ctx):
    with pytest.raises(VkdflashError, match="2-D"):
        Weight.from_float(ctx, np.zeros(64, np.float32), "f16")
    with pytest.raises(VkdflashError, match="cannot quantize"):
        Weight.from_float(ctx, np.zeros((2, 256), np.float32), "q4_k")
    with pytest.raises(VkdflashError, match="multiple of 32"):
        Weight.from_float(ctx, np.zeros((2, 40), np.float32), "f16")


def test_error_messages_are_one_line(ctx):
    with pytest.raises(VkdflashError) as info:
        Weight(ctx, "q6_k", 3, 255, np.zeros(10, np.uint8))
    assert "\n" not in str(info.value)
