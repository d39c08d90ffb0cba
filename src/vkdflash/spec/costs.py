"""What a target pass of n rows and a draft's proposal cost (docs/design.md section 11), for the
draft-length controller.

c_verify(n): seconds of an n-row target pass, priced at the batch width it computes (lavapipe's
matmuls run whole slot groups: 9 rows cost what 12 do). It starts from the cached curve (the prior)
and learns from every timed verify pass: a width timed a few times lately costs the median of
those passes; the others keep the prior's shape, scaled as the priced widths nearest them (a
curve cached while the machine was busy once made 16 rows look 2.6x dearer than they were, so
ngram drafted ~1 token a step at 1.6x instead of ~9 at 2.6x). What it learned of the widths it
timed often goes back to the cache when the run ends (`learned`)."""
from __future__ import annotations

import math
from bisect import bisect_right
from statistics import median

from .curve import plausible

DECAY = 0.9        # weight of the past in the scale (and the controller's acceptance counts), per update
MAX_SCALE_STEP = math.log(4.0)  # most one pass can pull the prior's scale (times its weight)
SHAPE_PASSES = 3    # recent passes of a width before their median prices it (before: the scaled prior)
KEEP_PASSES = 15    # timings kept per width (and per draft length)
WINDOW = 32         # passes a timing counts as recent: widths are priced from one spell of the machine
PERSIST_PASSES = 8  # passes of a width before the cache learns its cost (one is noise)
WHOLE_DRAFT = 0.97  # whole_draft: over 11 replayed texts and 3 curves, +3.5% where the best k alone gave +2.8%


class VerifyCosts:
    def __init__(self, prior: dict, width):
        """prior: {rows: seconds}; width(rows): the rows a pass of that many computes."""
        self.width = width
        self.timed: dict[int, list[tuple[int, float, bool]]] = {}  # (pass number, seconds, all rows used) per width
        self.scaled = 0  # passes behind the scale
        self.measured(prior)

    def measured(self, prior: dict) -> None:
        """A new prior (a curve measured mid-run): the scale starts again from it."""
        self.prior = {int(n): float(s) for n, s in prior.items()}
        self.log_scale = 0.0  # live / prior, in logs
        self._reprice()

    def learn(self, rows: int, whole: bool, seconds: float) -> None:
        """A timed pass of a width (`whole`: all its rows used); a pass that paid for compiling
        or ran on a busy machine moves the scale a bounded step."""
        ratio = math.log(max(seconds, 1e-9) / _interp(self.prior, rows))
        self.scaled += 1
        step = min(max(ratio - self.log_scale, -MAX_SCALE_STEP), MAX_SCALE_STEP)
        self.log_scale += step * max(1 - DECAY, 1 / self.scaled)
        self.timed[rows] = (self.timed.get(rows, []) + [(self.scaled, float(seconds), whole)])[-KEEP_PASSES:]
        self._reprice()

    def _reprice(self) -> None:
        """The curve, and empty tables of the prices c_verify and steady give from it (the
        controller asks for every length each step)."""
        self.verify, self._verify_at, self._steady_at = self._curve(), {}, {}

    def ones(self) -> list[float]:
        """Seconds of the 1-row passes timed (kept ones)."""
        return [s for _, s, _ in self.timed.get(self.width(1), [])]

    def _curve(self, min_passes: int = SHAPE_PASSES) -> dict[int, float]:
        """Verify seconds per row count: a width timed `min_passes` times or more costs the median
        of its recent passes, the others the prior scaled as the priced widths near it; fewer
        rows never cost more (a stale, noisy 1-row figure above a 2-row one would make drafting
        look free; seen on lavapipe: k = 1 on every step, 0.55-0.63x plain). A pass or two do not
        price a width: this VM's identical 1-row passes range 28-52 ms within a second, and the
        MTP head's first two 2-row passes, at 48 and 53 ms (1.4x the 1-row passes then, 1.02-1.04x
        in rounds), switched it off."""
        priced = self._priced(min_passes)
        xs = sorted(priced)
        log_x, logs = [math.log2(x) for x in xs], [math.log(priced[x] / _interp(self.prior, x)) for x in xs]

        def log_scale(n: int) -> float:
            """log(live / prior) at n: between the priced widths (in log rows), so an unpriced 2-row
            pass keeps the prior's ratio to the 1-row one the run timed; before any is priced, the
            running scale of all passes."""
            return _lerp(math.log2(n), log_x, logs) if xs else self.log_scale

        table = {n: s * math.exp(log_scale(n)) for n, s in self.prior.items()}
        table.update(priced)
        return _monotone(table)

    def _priced(self, min_passes: int, full: bool = False) -> dict[int, float]:
        """The widths timed `min_passes` times or more recently (`full`: by passes of that many
        rows, not fewer in its slots), at their median."""
        return {n: median(t) for n, t in self._recent(full).items() if len(t) >= min_passes}

    def _recent(self, full: bool = False) -> dict[int, list[float]]:
        """Seconds of each width's passes among the last WINDOW: from one spell of the machine,
        so the priced widths compare as if timed side by side (`full`: only passes of all its rows)."""
        return {n: [s for i, s, whole in t if i > self.scaled - WINDOW and (whole or not full)]
                for n, t in self.timed.items()}

    @property
    def live(self) -> dict[int, float]:
        """The widths priced by their own passes, at that price."""
        return {n: self.verify[n] for n, t in self._recent().items() if len(t) >= SHAPE_PASSES}

    def c_verify(self, n: int) -> float:
        cost = self._verify_at.get(n)
        if cost is None:
            cost = self._verify_at[n] = _interp(self.verify, self.width(n))
        return cost

    def steady(self, n: int) -> float:
        """c_verify(n) with its ratio to one row no dearer than the prior's: what the width costs
        when the machine is steady, for verdicts that last the run (the stop rules). A slow spell
        inflates the widths timed in it, and a width then no longer chosen keeps that price until
        its passes leave the window: a 1000-token MTP run priced 2 rows at 1.49x one row for a
        stretch (1.15x over the run) and was switched off at a_1 0.48, where k 1 pays ~1.1x."""
        cost = self._steady_at.get(n)
        if cost is None:
            shape = _interp(self.prior, self.width(n)) / _interp(self.prior, self.width(1))
            cost = self._steady_at[n] = min(self.c_verify(n), self.c_verify(1) * shape)
        return cost

    def learned(self) -> dict | None:
        """The curve for the cache (None: nothing learned): the prior, lowered where a width timed
        PERSIST_PASSES times or more in the last WINDOW passes did better (fewer rows never
        costing more). A width timed once or twice is noise (bench spec's warm-up sweep times each
        once; a cached 2-row figure 1.27x one row where rounds measure 1.02-1.04x switched the MTP
        head off). Like `curve.measure`, the cache keeps the best a width has done: a run in a
        slow spell teaches it nothing (plain decoding at 35 instead of 47 tok/s had raised every
        width 1.5x and switched the head off; starved of memory, every pass ~15x, 2 rows were
        cached at 16x one row), a fast one heals a curve measured on a busy machine. Only
        passes of all a width's rows count (9 rows ran 16-row matmuls, but attention, norms and
        RoPE of 9: a width's pass cached from them was 62 ms where 16 rows take 75). A width
        shapes no other: a speculative run's 1-row passes come between the strategy's and cost
        more than plain decoding's (28.7 against 21.5 ms), and scaled down with their excess a
        16-row pass was cached at 48 ms where it takes 75."""
        timed = self._priced(PERSIST_PASSES, full=True)
        if not timed:
            return None
        curve = dict(self.prior)
        for n, s in timed.items():
            curve[n] = min(s, curve.get(n, s))
        return plausible(_monotone(curve))


class DraftCosts:
    """c_draft(k): seconds of a proposal of up to k drafts, the median of its recent timings per k
    (before any, what an earlier run timed: `prior`); other k interpolated from a table that never
    falls with k (learned 1: 656 ms, 3: 422 ms, extrapolated, had priced 14 drafts at -864 ms, and
    chosen them); 0 before anything is known."""

    def __init__(self):
        self.timed: dict[int, list[float]] = {}  # recent proposal seconds per k
        self.median: dict[int, float] = {}  # their medians, or the prior's figure (priced every k each step)
        self._rising: dict[int, float] = {}
        self._at: dict[int, float] = {}

    def prior(self, seconds: dict) -> None:
        """What proposals of k drafts cost in an earlier run, until this one times them (priced
        free instead, the default MTP head's k 1 looked to save 5 ms a token where it saves ~2.4)."""
        self.median = {int(k): float(s) for k, s in seconds.items() if s > 0} | self.median
        self._reprice()

    def learn(self, k: int, seconds: float) -> None:
        self.timed[k] = (self.timed.get(k, []) + [float(seconds)])[-KEEP_PASSES:]
        self.median[k] = median(self.timed[k])
        self._reprice()

    def _reprice(self) -> None:
        self._rising, top, self._at = {}, 0.0, {}
        for j in sorted(self.median):
            top = self._rising[j] = max(top, self.median[j])

    def cost(self, k: int) -> float:
        if not (k and self.median):
            return 0.0
        cost = self._at.get(k)
        if cost is None:
            cost = self._at[k] = _interp(self._rising, k)
        return cost

    def timings(self) -> int:
        return sum(map(len, self.timed.values()))

    def learned(self) -> dict[int, float]:
        """Median seconds of the lengths timed SHAPE_PASSES times or more (for the cache)."""
        return {k: median(t) for k, t in self.timed.items() if len(t) >= SHAPE_PASSES}


def _monotone(table: dict) -> dict:
    """The table with fewer rows never costing more than more rows."""
    out, low = {}, float("inf")
    for n in sorted(table, reverse=True):
        low = out[n] = min(table[n], low)
    return dict(sorted(out.items()))


def _interp(table: dict, x: int) -> float:
    """Piecewise linear over the known points, extended linearly past the last one."""
    if x in table:
        return table[x]
    xs = sorted(table)
    if len(xs) == 1:
        return table[xs[0]] * x / xs[0]
    if x > xs[-1]:
        a, b = xs[-2], xs[-1]
        return table[b] + (table[b] - table[a]) / (b - a) * (x - b)
    return _lerp(x, xs, [table[v] for v in xs])


def _lerp(x: float, xs: list, ys: list) -> float:
    """np.interp for one point, arithmetic and all (held at the end values outside xs)."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    j = bisect_right(xs, x) - 1
    if x == xs[j]:
        return float(ys[j])
    return float((ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]) * (x - xs[j]) + ys[j])


def argmax(values: list) -> int:
    """The first index of the largest value, as np.argmax (plain Python: a few values, every step)."""
    return max(range(len(values)), key=values.__getitem__)


def whole_draft(k: int, limit: int, rates: list, setup) -> int:
    """With a draft of `limit` tokens in hand and k chosen: the longest length priced within
    WHOLE_DRAFT of k's rate whose pass is compiled (a shorter one leaves the draft's rest to a
    short step of its own: 9 tokens in hand, k 7 priced best at 8 rows against 12, and the last 2
    cost a step where asking 15 had verified all 9 in one; design.md 11)."""
    if not k:
        return 0
    return max(j for j in range(k, limit + 1) if j == k or (rates[j] >= WHOLE_DRAFT * rates[k] and not setup(j + 1)))


def bought(limit: int, horizon: int, setup, rates: list, cautious) -> int:
    """The length with the least time for `horizon` tokens, a length whose first pass must compile
    (setup) priced at the cautious rates: its compile is sunk whatever the drafts then do."""
    compile_s = [setup(j + 1) if j else 0.0 for j in range(limit + 1)]
    sure = cautious() if any(compile_s) else rates
    return min(range(limit + 1), key=lambda j: horizon / (sure[j] if compile_s[j] else rates[j]) + compile_s[j])
