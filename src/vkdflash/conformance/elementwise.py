"""Elementwise add, mul, swiglu, scale against the float64 reference."""
from __future__ import annotations

import numpy as np

from . import Case, launch, rng, uniform
from ..kernels import elementwise
from ..ref import ops


def _case(op: str, n: int, span: float = 1.0):
    def run(ctx):
        r = rng("elementwise", op, n, span)
        a, b = uniform(r, n) * np.float32(span), uniform(r, n)
        if op == "scale":
            got = launch(ctx, a.nbytes, lambda g, ab, out: elementwise.scale(g, ab, out, n, 0.125), a)
            return got, ops.scale(a, 0.125)
        got = launch(ctx, a.nbytes, lambda g, ab, bb, out: getattr(elementwise, op)(g, ab, bb, out, n), a, b)
        return got, {"add": ops.add, "mul": ops.mul, "swiglu": ops.swiglu}[op](a, b)
    return Case(f"{op}/f32/n={n}" + (f",span={span:g}" if span != 1.0 else ""), run)


def cases():
    out = [_case(op, n) for op in ("add", "mul", "swiglu", "scale") for n in (1, 1001, 576 * 64, 1 << 20)]
    out.append(_case("swiglu", 4096 * 8, span=30.0))  # saturated silu: exp overflow must give -0, not NaN
    return out
