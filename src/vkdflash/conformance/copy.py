"""Copy must move bytes exactly and stop at the end of its output."""
from __future__ import annotations

from . import Case, launch, rng, uniform
from ..kernels.copy import copy


def _case(n: int, groups: int):
    def run(ctx):
        x = uniform(rng("copy", n), n)
        return launch(ctx, x.nbytes, lambda g, src, out: copy(g, src, out, x.nbytes, groups), x), x
    return Case(f"copy/f32/n={n},groups={groups}", run, metric="exact")


def cases():
    # 4M values: more than 65535 loop iterations per lane unless the dispatch is sized for it
    return [_case(n, g) for n in (4, 4096, 1 << 20, 1 << 22) for g in (1, 3)]
