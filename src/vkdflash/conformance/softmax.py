"""Softmax (NMSE_SOFTMAX) and argmax (exact) against the references, up to vocabulary widths."""
from __future__ import annotations

import numpy as np

from . import NMSE_SOFTMAX, Case, launch, rng, uniform
from ..kernels.softmax import argmax, softmax
from ..ref import ops


def _softmax_case(n_rows, n_cols, scale=1.0, masked=False):
    def run(ctx):
        r = rng("softmax", n_rows, n_cols, scale, masked)
        x = uniform(r, n_rows, n_cols) * np.float32(8.0)  # logits' spread: [-1, 1] gives a near-flat softmax
        if masked:  # causal-style -inf tails, and one fully masked row
            for i in range(n_rows):
                x[i, r.integers(1, n_cols + 1):] = -np.inf
            x[0, :] = -np.inf
        got = launch(ctx, x.nbytes, lambda g, xb, out: softmax(g, xb, out, n_rows, n_cols, scale), x)
        return got.reshape(x.shape), ops.softmax(x, scale)
    name = f"softmax/f32/rows={n_rows},cols={n_cols},scale={scale:g}" + (",masked" if masked else "")
    return Case(name, run, threshold=NMSE_SOFTMAX)


def _argmax_case(n_rows, n_cols, special=False, flag=False):
    def run(ctx):
        r = rng("argmax", n_rows, n_cols, special)
        x = uniform(r, n_rows, n_cols)
        if special:  # exact ties (lowest index wins), NaN, +-inf, signed zeros
            x = np.round(x * 4) / 4
            x[0, :] = 0.0
            x[0, r.integers(0, n_cols, 7)] = -0.0
            x[1, r.integers(0, n_cols, 3)] = np.nan
            x[2, r.integers(0, n_cols, 3)] = np.inf
            x[3, :] = -np.inf
            x[4, :] = -0.0
            x[4, n_cols - 1] = 0.0
        got = launch(ctx, n_rows * 4, lambda g, xb, out: argmax(g, xb, out, n_rows, n_cols, flag), x,
                     dtype=np.uint32)
        return got, ops.argmax(x, flag)
    name = (f"argmax/f32/rows={n_rows},cols={n_cols}" + (",ties-nan-inf" if special else "")
            + (",flag-nonfinite" if flag else ""))
    return Case(name, run, metric="exact")


def cases():
    return [
        _softmax_case(1, 64),
        _softmax_case(64, 1001, scale=0.125),
        _softmax_case(16, 4096, scale=0.088),
        _softmax_case(23, 333, masked=True),
        _softmax_case(2, 49152),
        _softmax_case(4, 151936),
        _argmax_case(1, 49152),
        _argmax_case(64, 576),
        _argmax_case(5, 50257),
        _argmax_case(8, 1000, special=True),
        _argmax_case(8, 999, special=True),
        _argmax_case(8, 49152, special=True, flag=True),
        _argmax_case(8, 999, special=True, flag=True),
        _argmax_case(3, 151936),
    ]
