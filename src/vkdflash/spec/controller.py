"""Cost-aware draft length (docs/design.md section 11): before each step choose k, 0..k_max, to
maximise expected committed tokens per second

    E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j        T(k) = c_verify(k + 1) + c_draft(k)

a_j: the running probability that draft j is accepted given drafts 1..j-1 were (decayed counts
per position, so it follows the text; a position with little evidence leans on the one before
it, so after drafts 1..j keep being accepted the choice reaches for j + 1). a_1 starts from what
the draft measured on its own suite where it knows (`expect`), else 0.5: the shipped DFlash
draft (a_1 0.25) then starts plain on lavapipe instead of drafting 3 steps to learn it.
c_draft(k): seconds of a proposal of up to k tokens (the median of the recent ones per k;
unseen k interpolated, 0 before the first).
c_verify(n): seconds of an n-row target pass, priced at the batch width it computes (lavapipe's
matmuls run whole slot groups: 9 rows cost what 12 do). It starts from the cached curve (the prior)
and learns from every timed verify pass: a width timed a few times lately costs the median of
those passes; the others keep the prior's shape, scaled as the priced widths nearest them (a
curve cached while the machine was busy once made 16 rows look 2.6x dearer than they were, so
ngram drafted ~1 token a step at 1.6x instead of ~9 at 2.6x). The prior's shape can be wrong
too, so after a step whose drafts were all accepted it tries a length of 2k + 1 it has not
priced. What it learned of the widths it timed often goes back to the cache when the run ends
(`persist`).

A length whose first pass must compile kernels first (setup: lavapipe takes ~1.6 s for a new
batch width, more than a 128-token run saves) counts its setup against the time to generate
what is left, so a short run stays plain where a long one drafts; probes take a ready length.

Keeping a strategy's state (its commit: MTP runs its head over each committed token) costs
every step whatever k, so T(k) includes that overhead (the median of recent commits: a first
commit of a shape compiles); once the evidence (STOP_STEPS timed steps; where its drafts' cost
decides, SHAPE_PASSES timed proposals) says the best k with the strategy is below STOP_RATIO of
plain decoding without it, or the best is k = 0 while its
upkeep is more than UPKEEP_SHARE of a step, or none of its drafts was accepted where a draft as
good as its a_1 prior would have had one accepted (STOP_CHANCE: the shipped MTP head, a_1 0.35,
had none of its first 5 accepted on bench spec's prompt and was switched off at 4), or the
best is k = 0 and not even the a_1 it expects would bring a length to STOP_RATIO of plain
decoding, `stop_reason()` says why and the engine switches the strategy off: k = 0 alone
cannot stop a strategy's upkeep (the target's captures, commits where a strategy writes each
step), and its probes cost too (the shipped DFlash draft on lavapipe, a_1 ~0.25, left on at k 0
with a probe now and then: 0.91x plain over 9 alternations, 0.94x once its commits waited for
its proposals; switched off: 0.97-1.00x).

k = 0 is plain decoding; while the choice stays 0 it drafts a little anyway every `probe_every`
steps, so the estimates can recover when the text becomes predictable; a probe that gets
nothing accepted doubles the wait (up to MAX_PROBE_WAIT), so a draft that is never right costs
next to nothing."""
from __future__ import annotations

import math
from bisect import bisect_right
from statistics import median

import numpy as np

from .curve import plausible

DECAY = 0.9        # weight of the past in the acceptance counts and the scale, per update
PRIOR = 2.0        # pseudo-counts behind a_j's prior: a_{j-1} (for a_1: the draft's record, or 0.5)
MAX_PROBE_WAIT = 128
STOP_STEPS = 16    # timed steps before judging whether the strategy pays
STOP_RATIO = 0.97  # below this share of plain decoding's rate, it does not
STOP_DRAFTS = 4    # ... nor when none of this many drafts was accepted (at least; see stop_drafts)
STOP_CHANCE = 0.02  # ... where a draft with the a_1 prior gets none of them accepted this rarely
UPKEEP_SHARE = 0.01  # ... nor when no k pays and keeping its state costs more than this share of a step
MAX_SCALE_STEP = float(np.log(4.0))  # most one pass can pull the prior's scale (times its weight)
SHAPE_PASSES = 3    # recent passes of a width before their median prices it (before: the scaled prior)
KEEP_PASSES = 15    # timings kept per width (and per draft length)
WINDOW = 32         # passes a timing counts as recent: widths are priced from one spell of the machine
PERSIST_PASSES = 8  # passes of a width before the cache learns its cost (one is noise)
UNTIMED = "no 1-row pass was timed before the run ended"  # why a run with no cached curve measured none


class DraftController:
    def __init__(self, k_max: int, verify_seconds: dict, fixed: bool = False, probe_every: int = 8,
                 persist=None, width=None, guess=None):
        """verify_seconds: the prior curve {rows: seconds}, or None where none is cached yet (every
        step is then plain until `measured` gives one); persist: called with the learned curve
        when the run ends (finish); width(rows): the rows a pass of that many computes (the target's
        matmuls run whole batch slots: on lavapipe 7..8 rows cost like 8, 9..12 like 12);
        guess(rows): what the kernels' model says such a pass costs in 1-row passes (bounds what
        measuring an unknown curve could save; else every pass is priced as one row)."""
        self.k_max, self.fixed, self.probe_every, self.persist = int(k_max), fixed, probe_every, persist
        self.width, self.guess = width or (lambda rows: rows), guess or (lambda rows: 1.0)
        self.unmeasured = None if verify_seconds is not None or fixed else UNTIMED  # why no curve
        self._judged = 0  # the most tokens measuring_pays found could not repay measuring
        self.prior = {int(n): float(s) for n, s in (verify_seconds or {1: 1.0}).items()}
        self.timed: dict[int, list[tuple[int, float, bool]]] = {}  # (pass number, seconds, all rows used) per width
        self.log_scale, self.scaled = 0.0, 0  # live / prior, in logs; passes behind it
        self.verify, self._verify_at = self._curve(), {}  # the curve, and c_verify's prices from it
        self.full = 0       # drafts of the last step when all were accepted, else 0
        self.draft: dict[int, list[float]] = {}  # recent proposal seconds per k
        self.draft_cost: dict[int, float] = {}  # their medians (rates() prices every k each step)
        self._rising: dict[int, float] = {}  # the medians, raised so a longer draft never costs less
        self._draft_at: dict[int, float] = {}  # c_draft's prices from them
        self.counts = np.zeros((self.k_max, 2))  # decayed (accepted, rejected) per draft position
        self.run_counts = np.zeros((self.k_max, 2))  # the same, undecayed: what the stop rule judges by
        self.first_prior = 0.5
        self.idle = 0      # steps since the last draft
        self.wait = probe_every  # idle steps before the next probe
        self.probing = False
        self.chosen: list[int] = []
        self.overhead, self.overheads = 0.0, []  # seconds a step spends keeping the strategy's state, whatever k
        self.total = np.zeros(2, int)  # drafted, accepted in this run
        self.held = 0  # steps that drafted less than the rate asked: the run would not repay a compile

    # -- the model -----------------------------------------------------------------
    def expect(self, first_acceptance: float) -> None:
        """The prior of a_1: what the draft measured on its suite (evidence outweighs it in a few steps)."""
        self.first_prior = min(max(float(first_acceptance), 0.0), 1.0)

    def limit(self, k_max: int) -> None:
        """Lower k_max to what the strategy can draft (before the first step)."""
        self.k_max = min(self.k_max, int(k_max))
        self.counts, self.run_counts = self.counts[:self.k_max], self.run_counts[:self.k_max]

    def measuring_pays(self, room: int, compile_seconds: float, passes: int) -> bool:
        """Whether measuring the verify curve now (compiles, then `passes` rows of passes) can be
        repaid by `room` tokens (the horizon choose() weighs compiles over): with passes at the
        kernels' guess, free drafts at the acceptance the draft expects, they would save
        room * c_1 * (1 - min_k guess(k + 1) / E(k)) at most. A default run of 128 tokens on
        lavapipe measured ~4 s to save 1-2 s, and took twice plain's time; priced as free passes,
        a 1000-token one measured at its 261st token and bought compiles it could not repay."""
        ones = [s for _, s, _ in self.timed.get(self.width(1), [])]
        if not ones:
            return False  # the first pass compiled: no 1-row cost yet
        c_1, tokens = median(ones), self.expected_tokens(min(self.k_max, room))
        share = min(self.guess(k + 1) / e for k, e in enumerate(tokens))
        most, cost = room * c_1 * max(0.0, 1.0 - share), compile_seconds + passes * c_1
        if most <= cost and room >= self._judged:  # the judgement over the most tokens says why
            self._judged = room
            self.unmeasured = (f"measuring it (once, ~{cost:.1f} s) would cost more than {room} tokens "
                               f"could save (at most {most:.1f} s)")
        return most > cost

    def measured(self, verify_seconds: dict) -> None:
        """The curve measured mid-run: the prior from now on."""
        self.unmeasured, self.log_scale = None, 0.0
        self.prior = {int(n): float(s) for n, s in verify_seconds.items()}
        self.verify, self._verify_at = self._curve(), {}

    def acceptance(self, counts=None) -> np.ndarray:
        """a_j for j = 1..k_max (from the decayed counts, or the given ones)."""
        out, prior = [], self.first_prior
        for acc, rej in (self.counts if counts is None else counts).tolist():
            prior = (acc + PRIOR * prior) / (acc + rej + PRIOR)
            out.append(prior)
        return np.array(out)

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

    def c_draft(self, k: int) -> float:
        if not (k and self.draft_cost):
            return 0.0
        cost = self._draft_at.get(k)
        if cost is None:
            cost = self._draft_at[k] = _interp(self._rising, k)
        return cost

    def expected_tokens(self, limit: int, counts=None) -> list[float]:
        """E(k), tokens a step commits with k = 0..limit drafts (plain Python: the controller runs
        every step, and numpy's per-call cost on these few values was 2% of a lavapipe decode step)."""
        tokens, reach, expected = [1.0], 1.0, 0.0
        for a in self.acceptance(counts)[:limit].tolist():
            reach *= a
            expected += reach
            tokens.append(1.0 + expected)
        return tokens

    def rates(self, limit: int, counts=None) -> list[float]:
        """Committed tokens per second with k = 0..limit drafts."""
        return [t / (self.c_verify(k + 1) + self.c_draft(k) + self.overhead)
                for k, t in enumerate(self.expected_tokens(limit, counts))]

    def expected_rate(self, k: int) -> float:
        return self.rates(k)[k]

    def plain_rate(self) -> float:
        """Tokens per second without the strategy at all."""
        return 1.0 / self.c_verify(1)

    def stop_reason(self) -> str | None:
        """Why the strategy should be switched off (it costs more than it saves), or None while it
        pays or the evidence is thin (never when fixed)."""
        if self.fixed or self.unmeasured or self.scaled < STOP_STEPS:
            return None
        if self.total[0] >= self.stop_drafts() and not self.total[1]:
            # its upkeep (captures, commits) is then pure cost, and hidden in the live curve
            return (f"none of its {self.total[0]} drafts was accepted in {self.scaled} steps; --draft-fixed "
                    "keeps it on")
        if sum(map(len, self.draft.values())) < SHAPE_PASSES:
            # its rate rests on what a draft costs: one timing is noise (the shipped MTP head's
            # first timed draft, 8.3 ms where they take ~3, switched it off after a mid-run
            # measurement at a 1000-token request's 261st token, where k 1 pays 1.15x plain)
            return None
        # judged on the whole run's acceptance: the decayed one follows the text, and one unlucky
        # stretch would switch off a strategy that pays
        rates = self.rates(self.k_max, self.run_counts)
        k = _argmax(rates)
        best, plain, a_1 = rates[k], self.plain_rate(), self.acceptance(self.run_counts)[0]
        if k == 0 and self.overhead > UPKEEP_SHARE * self.c_verify(1):
            return (f"it costs more than it saves here: no draft length pays (a_1 {a_1:.2f}) and it "
                    f"spends {1000 * self.overhead:.0f} ms keeping its state a step; --draft-fixed keeps it on")
        # idling still costs its captures and probes: off where not even the a_1 on the draft's
        # record would make a length pay by the margin below (the shipped DFlash draft on
        # lavapipe); inside it, a few noisy timings decide (the shipped MTP head, 1.16x plain at
        # k 1, was switched off in 1 of 5 runs when 4 drafts' timings put k 1 at 0.98x)
        if k == 0 and max(self.rates(self.k_max, np.zeros_like(self.run_counts))[1:], default=0.0) \
                < STOP_RATIO * plain:
            return (f"it costs more than it saves here: no draft length pays at the a_1 it expects "
                    f"({self.first_prior:.2f}) nor at the {a_1:.2f} it had; --draft-fixed keeps it on")
        if best >= STOP_RATIO * plain:
            return None
        return (f"it costs more than it saves here: at best {best:.1f} tok/s with it (k {k}, a_1 "
                f"{a_1:.2f}, {1000 * self.c_draft(max(k, 1)):.0f} ms drafting and "
                f"{1000 * self.overhead:.0f} ms keeping its state a step) against {plain:.1f} tok/s without; "
                "--draft-fixed keeps it on")

    def stop_drafts(self) -> int:
        """Drafts, none accepted, that say a draft is not the one its a_1 prior describes: a draft
        of that a_1 gets none of n accepted with chance (1 - a_1)^n, kept under STOP_CHANCE (6 at
        the default 0.5, 10 at 0.35), at least STOP_DRAFTS and at most 4x that."""
        miss = 1.0 - self.first_prior
        if miss <= 0.0:
            return STOP_DRAFTS
        n = np.ceil(np.log(STOP_CHANCE) / np.log(miss)) if miss < 1.0 else 4 * STOP_DRAFTS
        return int(min(max(n, STOP_DRAFTS), 4 * STOP_DRAFTS))

    def note_overhead(self, seconds: float) -> None:
        """Seconds the last step spent keeping the strategy's state (its commit); the median of
        the recent ones, as a first commit of a shape may compile kernels."""
        self.overheads = (self.overheads + [seconds])[-STOP_STEPS:]
        self.overhead = float(median(self.overheads))

    # -- deciding and learning -------------------------------------------------------
    def choose(self, room: int, setup=None, done: int | None = None) -> int:
        """k for the next step, at most `room` (the tokens left to generate). setup(rows): seconds
        a first pass of that many rows costs before it runs (kernel compiles: ~1.6 s for a new
        batch width on lavapipe, more than a short run can earn back), paid only where the
        `horizon` repays it: the tokens left, or where the request has generated `done` tokens,
        no more than that (a run may end at any token: chat answers to -n 512 ended after 7, 38
        and 138 tokens, and compiles bought at their start had made them 1.6-1.8x slower than
        plain decoding; weighed over the tokens so far, a compile is bought once the rent paid
        without it would have bought it, so a run that ends then pays at most twice the best)."""
        horizon = room if done is None else max(1, min(room, done))
        limit = min(self.k_max, room)
        if limit <= 0:
            return 0
        if self.fixed:
            k = limit
        elif self.unmeasured:
            k = 0  # plain until a curve is measured
        else:
            setup = setup or (lambda rows: 0.0)

            def affordable(j: int) -> bool:  # no dearer than its pass, or small next to what is left
                return setup(j + 1) <= max(self.c_verify(j + 1), 0.05 * horizon * self.c_verify(1))

            # plain decoding's own pass is compiled sooner or later whatever this step drafts: in a
            # cold process pricing it here made the first step draft (a 2-row compile, ~1.6 s)
            rates = self.rates(limit)
            k = min(range(limit + 1), key=lambda j: horizon / rates[j] + (setup(j + 1) if j else 0.0))
            self.held += k < _argmax(rates)
            reach = min(limit, 2 * self.full + 1)
            if self.full and reach > k and self.width(reach + 1) not in self.live and affordable(reach):
                k = reach  # the last drafts all held: learn what a longer verify costs here
            self.probing = k == 0 and self.idle >= self.wait
            if self.probing:
                # the length that would pay best at the draft's record: MTP's head (a_1 0.35) probes
                # 1 draft, a 2-row pass, not 2 (3 rows, priced as 4 on lavapipe: a dear probe)
                cheap = [j for j in range(1, limit + 1) if affordable(j)]
                at_record = self.rates(limit, np.zeros_like(self.counts))
                k = max(cheap, key=lambda j: (at_record[j], -j)) if cheap else 0
                self.probing = k > 0
        self.idle = 0 if k else self.idle + 1
        self.chosen.append(k)
        return k

    def update(self, k: int, drafted: int, accepted: int, verify_seconds: float | None,
               draft_seconds: float | None) -> None:
        """After a step that asked for k drafts, got `drafted`, and the target accepted `accepted`;
        seconds of None are not typical (a first pass that recorded and compiled) and not learned."""
        rows = self.width(drafted + 1)
        if verify_seconds is not None:
            # a pass that paid for compiling or ran on a busy machine moves the scale a bounded step
            ratio = math.log(max(verify_seconds, 1e-9) / _interp(self.prior, rows))
            self.scaled += 1
            step = min(max(ratio - self.log_scale, -MAX_SCALE_STEP), MAX_SCALE_STEP)
            self.log_scale += step * max(1 - DECAY, 1 / self.scaled)
            pass_ = (self.scaled, float(verify_seconds), rows == drafted + 1)
            self.timed[rows] = (self.timed.get(rows, []) + [pass_])[-KEEP_PASSES:]
            self.verify, self._verify_at = self._curve(), {}
        if k and draft_seconds is not None:
            self.draft[k] = (self.draft.get(k, []) + [float(draft_seconds)])[-KEEP_PASSES:]
            self.draft_cost[k] = median(self.draft[k])
            # priced from a table that never falls with k (learned 1: 656 ms, 3: 422 ms,
            # extrapolated, had priced 14 drafts at -864 ms, and chosen them)
            self._rising, top = {}, 0.0
            for j in sorted(self.draft_cost):
                top = self._rising[j] = max(top, self.draft_cost[j])
            self._draft_at = {}
        self.full = drafted if drafted and accepted == drafted else 0
        self.total += (drafted, accepted)
        if self.probing:
            self.wait = self.probe_every if accepted else min(2 * self.wait, MAX_PROBE_WAIT)
            self.probing = False
        if drafted:
            self.counts[:drafted] *= DECAY
            for counts in (self.counts, self.run_counts):
                counts[:accepted, 0] += 1
                if accepted < drafted:
                    counts[accepted, 1] += 1

    def finish(self) -> None:
        """Hand the learned curve to `persist`: the prior, lowered where a width timed
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
        if self.persist is None or not timed or self.unmeasured:
            return
        curve = dict(self.prior)
        for n, s in timed.items():
            curve[n] = min(s, curve.get(n, s))
        self.persist(plausible(_monotone(curve)))

    def summary(self) -> dict:
        """Mean chosen k and why: the expected rate of the mean choice next to plain decoding's
        (None when fixed: that controller prices nothing, its curve is a placeholder)."""
        mean_k = float(np.mean(self.chosen)) if self.chosen else 0.0
        k = int(round(mean_k))
        priced = not (self.fixed or self.unmeasured)
        return {"mode": "fixed" if self.fixed else "cost-aware", "mean_k": mean_k, "held_for_setup": self.held,
                "unmeasured": self.unmeasured,
                "expected_tps": self.expected_rate(k) if priced else None,
                "plain_tps": self.plain_rate() if priced else None,
                "overhead_seconds": self.overhead,
                "acceptance": [round(float(a), 3) for a in self.acceptance()],
                "verify_seconds": {str(n): s for n, s in sorted(self.verify.items())}}


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


def _argmax(values: list) -> int:
    """The first index of the largest value, as np.argmax."""
    return max(range(len(values)), key=values.__getitem__)


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
