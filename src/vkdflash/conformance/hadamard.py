"""Fast Walsh-Hadamard transform: H_n x per chunk against a float64 matrix product, and H(H x) = x."""
from __future__ import annotations

from . import NMSE_DEFAULT, Case, launch, rng, uniform
from ..kernels.hadamard import SIZES, fwht
from ..ref.hadamard import rotate


def _case(n: int, n_rows: int, row_len: int, twice: bool):
    def run(ctx):
        x = uniform(rng("fwht", n, n_rows, row_len), n_rows, row_len)
        def record(g, src, out):
            fwht(g, src, out, n_rows, row_len, n)
            if twice:  # second pass in place
                fwht(g, out, out, n_rows, row_len, n)
        got = launch(ctx, x.nbytes, record, x).reshape(n_rows, row_len)
        return got, x if twice else rotate(x, n)

    kind = "twice" if twice else "once"
    return Case(f"fwht/{kind}/n={n},rows={n_rows},row_len={row_len}", run, threshold=NMSE_DEFAULT)


def cases():
    out = []
    for n in SIZES:
        out += [_case(n, 3, max(n, 1024), False), _case(n, 1, n, False), _case(n, 5, 2 * n, True)]
    return out
