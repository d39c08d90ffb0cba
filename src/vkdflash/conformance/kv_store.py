"""KV-cache store: the whole cache after a store must equal the numpy quantizer's bytes in the
named rows and stay untouched elsewhere (docs/design.md section 7: bit-exact with gguf-py;
iq4_nl within one quant step of ggml's reference algorithm). Rotating stores must equal the
quantizer's bytes of the rotated rows (ref.hadamard.fwht_f32, bit-identical to the kernel's
transform); `launch` checks that the source rows are unchanged. "pair" cases store K and V rows
in one dispatch (set_rows_kv) into two caches of one buffer, a guard region after each."""
from __future__ import annotations

import numpy as np

from . import GUARD_BYTE, Case, launch, rng, uniform
from ..errors import VkdflashError
from ..kernels.kv_store import cache_row_bytes, store_rows, write_positions
from ..kernels.types import CACHE_TYPES, get_type
from ..ref.hadamard import fwht_f32
from ..ref.quantize import dequantize, quant_step, quantize

# (row_len, n_rows, n_ctx): decode, a prompt batch, a 64-row batch, a ragged row length
SHAPES = [(64, 1, 8), (256, 5, 40), (1024, 64, 100), (96, 7, 9)]


# (rotation, row_len, n_rows, n_ctx): head_dim 64, 128 (two heads) and 256
ROTATED_SHAPES = [(64, 128, 3, 8), (128, 256, 5, 12), (256, 256, 2, 4)]

STRIDE = 67  # source floats a row (of 64 stored)


def _compare_rows(got, want, stored, cache_type: str):
    """(got, want) for an exact type; iq4_nl: the rows not stored byte for byte (a stray write is no
    float rounding), the stored ones as (values, reference values, quant steps)."""
    if cache_type != "iq4_nl":
        return got, want
    rest = np.ones(len(got), bool)
    rest[stored] = False
    if not np.array_equal(got[rest], want[rest]):
        raise VkdflashError("the store changed cache rows it was not given")
    return (dequantize(got[stored], cache_type), dequantize(want[stored], cache_type),
            quant_step(want[stored], cache_type))


def _case(cache_type: str, row_len: int, n_rows: int, n_ctx: int, rotation: int = 0, stride: int | None = None):
    def run(ctx):
        r = rng("kv_store", cache_type, row_len, n_rows, n_ctx, rotation, *([stride] if stride else []))
        x = uniform(r, n_rows, stride or row_len)  # rows `stride` floats apart: the floats between are not stored
        pos = r.permutation(n_ctx)[:n_rows]  # distinct, unordered, non-contiguous
        rb = cache_row_bytes(row_len, cache_type)
        posb = ctx.buffer(4 * n_rows)
        write_positions(posb, pos, n_ctx)
        got = launch(ctx, n_ctx * rb, lambda g, src, p, out: store_rows(g, src, p, out, n_rows, row_len, cache_type,
                                                                        src_stride=stride, rotation=rotation),
                     x, posb, dtype=np.uint8).reshape(n_ctx, rb)
        want = np.full_like(got, GUARD_BYTE)  # Output's fill: rows not stored keep it
        rows = x[:, :row_len]
        want[pos] = quantize(fwht_f32(rows, rotation) if rotation else rows, cache_type)
        return _compare_rows(got, want, pos, cache_type)

    name = f"rot={rotation}/" if rotation else ""
    name += f"row_len={row_len},rows={n_rows},n_ctx={n_ctx}" + (f",stride={stride}" if stride else "")
    return Case(f"kv_store/{cache_type}/{name}", run, metric="exact" if cache_type != "iq4_nl" else "quant")


def _pair_case(cache_type: str, row_len: int, n_rows: int, n_ctx: int, rotation: int = 0, stride: int | None = None):
    def run(ctx):
        r = rng("kv_store", "pair", cache_type, row_len, n_rows, n_ctx, rotation, *([stride] if stride else []))
        xk, xv = (uniform(r, n_rows, stride or row_len) for _ in "kv")
        pos = r.permutation(n_ctx)[:n_rows]
        rb = cache_row_bytes(row_len, cache_type)
        posb = ctx.buffer(4 * n_rows)
        write_positions(posb, pos, n_ctx)

        def record(g, k, v, p, k_cache, v_cache):  # two caches of one buffer, each with its guard
            store_rows(g, k, p, k_cache, n_rows, row_len, cache_type, src_stride=stride, rotation=rotation,
                       second=(v, v_cache))

        got = launch(ctx, (n_ctx * rb,) * 2, record, xk, xv, posb, dtype=np.uint8).reshape(2 * n_ctx, rb)
        want = np.full_like(got, GUARD_BYTE)
        for at, x in ((0, xk), (n_ctx, xv)):
            rows = x[:, :row_len]
            want[at + pos] = quantize(fwht_f32(rows, rotation) if rotation else rows, cache_type)
        return _compare_rows(got, want, np.concatenate([pos, n_ctx + pos]), cache_type)

    name = f"rot={rotation}/" if rotation else ""
    name += f"row_len={row_len},rows={n_rows},n_ctx={n_ctx}" + (f",stride={stride}" if stride else "")
    return Case(f"kv_store/pair/{cache_type}/{name}", run, metric="exact" if cache_type != "iq4_nl" else "quant")


def cases():
    return ([_case(t, *s) for t in CACHE_TYPES for s in SHAPES]
            + [_case(t, row_len, n_rows, n_ctx, rot) for t in CACHE_TYPES if get_type(t).quantized
               for rot, row_len, n_rows, n_ctx in ROTATED_SHAPES]
            + [_pair_case(t, *s) for t in CACHE_TYPES for s in SHAPES[:2]]
            + [_pair_case(t, *ROTATED_SHAPES[0][1:], ROTATED_SHAPES[0][0]) for t in CACHE_TYPES if get_type(t).quantized]
            # a source stride that is no whole vec4: the storage-buffer kernels on any device
            + [f(t, 64, 3, 8, stride=STRIDE) for t in CACHE_TYPES for f in (_case, _pair_case)])
