"""Copy must move bytes exactly and stop at the end of its output."""
from __future__ import annotations

import numpy as np

from . import Case, Output, rng, uniform
from ..kernels.copy import copy
from ..runtime.graph import Graph


def _case(n: int, groups: int):
    def run(ctx):
        x = uniform(rng("copy", n), n)
        src, out = ctx.upload(x), Output(ctx, x.nbytes)
        g = Graph(ctx)
        copy(g, src, out.view, x.nbytes, groups)
        g.run()
        got = out.read(np.float32)
        g.destroy(), src.destroy(), out.destroy()
        return got, x
    return Case(f"copy/f32/n={n},groups={groups}", run, metric="exact")


def cases():
    # 4M values: more than 65535 loop iterations per lane unless the dispatch is sized for it
    return [_case(n, g) for n in (4, 4096, 1 << 20, 1 << 22) for g in (1, 3)]
