"""Elementwise f32 ops over n values: add, mul, swiglu (silu(gate) * up), scale.

Outputs may alias an input (in place). One shader, the op chosen by specialization constant."""
from __future__ import annotations

import struct

from . import rows

OPS = {"add": 0, "mul": 1, "swiglu": 2, "scale": 3}


def _dispatch(graph, op: str, a, b, out, n: int, s: float = 1.0) -> None:
    ctx = graph.ctx
    rows.check_dims(n=n)
    nbytes = n * rows.F32
    a = rows.check_view(ctx, f"{op} input", a, nbytes)
    b = a if b is None else rows.check_view(ctx, f"{op} input", b, nbytes)
    out = rows.check_view(ctx, f"{op} out", out, nbytes)
    vec4 = rows.vec4_ok(n, a, b, out)
    wg = rows.workgroup(ctx)
    count = n // 4 if vec4 else n
    pipe = ctx.pipeline("elementwise", 3, 8, (wg, OPS[op], int(vec4)))
    graph.dispatch(pipe, [a, b, out], (rows.groups(ctx, -(-count // wg), 1, op),),
                   struct.pack("<If", count, s), label=op)


def add(graph, a, b, out, n: int) -> None:
    """out = a + b."""
    _dispatch(graph, "add", a, b, out, n)


def mul(graph, a, b, out, n: int) -> None:
    """out = a * b."""
    _dispatch(graph, "mul", a, b, out, n)


def swiglu(graph, gate, up, out, n: int) -> None:
    """out = silu(gate) * up, silu(x) = x / (1 + exp(-x))."""
    _dispatch(graph, "swiglu", gate, up, out, n)


def scale(graph, x, out, n: int, s: float) -> None:
    """out = x * s."""
    _dispatch(graph, "scale", x, None, out, n, s)
