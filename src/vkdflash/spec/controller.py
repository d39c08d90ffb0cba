"""Cost-aware draft length (docs/design.md section 11): before each step choose k, 0..k_max, to
maximise expected committed tokens per second

    E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j        T(k) = c_verify(k + 1) + c_draft(k)

a_j: the running probability that draft j is accepted given drafts 1..j-1 were (decayed counts
per position, so it follows the text; a position with little evidence leans on the one before
it, so after drafts 1..j keep being accepted the choice reaches for j + 1). a_1 starts from what
the draft measured on its own suite where it knows (`expect`), else 0.5: the shipped DFlash
draft (a_1 0.25) then starts plain on lavapipe instead of drafting 3 steps to learn it. Once the
run's first drafts say the record does not describe this run (fewer accepted than a draft of the
record's a_1 would get but DROP_CHANCE of the time), a_1 starts from the run's own rate instead.
c_draft(k): seconds of a proposal of up to k tokens (costs.DraftCosts: the median of the recent
ones per k, unseen k interpolated; before the first, what an earlier run timed, else 0).
c_verify(n): seconds of an n-row target pass, learned from the cached curve and live passes
(costs.VerifyCosts). The prior's shape can be wrong, so after a step whose drafts were all
accepted it tries a length of 2k + 1 it has not priced.

A length whose first pass must compile kernels first (setup: lavapipe takes ~1.6 s for a new
batch width, more than a 128-token run saves) counts its setup against the time to generate
what is left, so a short run stays plain where a long one drafts; probes take a ready length.

Keeping a strategy's state (its commit: MTP runs its head over each committed token) costs every
step whatever k, so T(k) includes that overhead (the median of recent commits: a first commit of
a shape compiles); once the evidence (STOP_STEPS timed steps; where its drafts' cost decides,
SHAPE_PASSES timed proposals) says the best k with the strategy is below STOP_RATIO of plain
decoding without it, or the best is k = 0 while its upkeep is more than UPKEEP_SHARE of a step,
or none of its drafts was accepted where a draft as good as its a_1 prior would have had one
accepted (STOP_CHANCE: the shipped MTP head, a_1 0.35, had none of its first 5 accepted on bench
spec's prompt and was switched off at 4), or the best is k = 0 and not even the a_1 it expects
would bring a length to STOP_RATIO of plain decoding, `stop_reason()` says why and the engine
switches the strategy off: k = 0 alone cannot stop a strategy's upkeep (the target's captures,
commits where a strategy writes each step), and its probes cost too (the shipped DFlash draft on
lavapipe, a_1 ~0.25, left on at k 0 with a probe now and then: 0.91x plain over 9 alternations,
0.94x once its commits waited for its proposals; switched off: 0.97-1.00x).

k = 0 is plain decoding; while the choice stays 0 it drafts a little anyway every `probe_every`
steps, so the estimates can recover when the text becomes predictable; a probe that gets
nothing accepted doubles the wait (up to MAX_PROBE_WAIT), so a draft that is never right costs
next to nothing."""
from __future__ import annotations

import functools
import math
from statistics import median

import numpy as np

from .costs import DECAY, SHAPE_PASSES, DraftCosts, VerifyCosts

PRIOR = 2.0        # pseudo-counts behind a_j's prior: a_{j-1} (for a_1: 0.5)
RECORD_PRIOR = 8.0  # ... behind a_1's where the draft's record gives it (measured over thousands of
                    # drafts: at 2, one rejected first draft took the shipped DFlash draft, a_1 0.43,
                    # below the 0.30 at which k 1 pays, and it idled where k 1 gives 1.15x plain)
MAX_PROBE_WAIT = 128
STOP_STEPS = 16    # timed steps before judging whether the strategy pays
STOP_RATIO = 0.97  # below this share of plain decoding's rate, it does not
STOP_DRAFTS = 4    # ... nor when none of this many drafts was accepted (at least; see stop_drafts)
STOP_CHANCE = 0.02  # ... where a draft with the a_1 prior gets none of them accepted this rarely
DROP_CHANCE = 0.002  # a draft's record no longer counts where a draft of its a_1 gets no more of the
                     # run's first drafts accepted this rarely; asked after every rejected one, so at
                     # the record's a_1 1.6% of 300-draft runs drop it (at 0.02: 12.6%), and at a_1
                     # 0.1 against 0.43 it goes after 16 first drafts (median; 90%: 27)
UPKEEP_SHARE = 0.01  # ... nor when no k pays and keeping its state costs more than this share of a step
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
        self.guess = functools.lru_cache(maxsize=None)(guess or (lambda rows: 1.0))  # asked every step while unmeasured
        self.unmeasured = None if verify_seconds is not None or fixed else UNTIMED  # why no curve
        self._judged = 0  # the most tokens measuring_pays found could not repay measuring
        self.costs = VerifyCosts(verify_seconds or {1: 1.0}, width or (lambda rows: rows))
        self.full = 0       # drafts of the last step when all were accepted, else 0
        self.drafts = DraftCosts()
        self.counts = np.zeros((self.k_max, 2))  # decayed (accepted, rejected) per draft position
        self.run_counts = np.zeros((self.k_max, 2))  # the same, undecayed: what the stop rule judges by
        self.first_prior, self.first_weight = 0.5, PRIOR
        self.expected = self.first_prior  # a_1 as the run started: the record, else the guess
        self.disowned = None  # why the record stopped pricing them (the run contradicted it)
        self.idle = 0      # steps since the last draft
        self.wait = probe_every  # idle steps before the next probe
        self.probing = False
        self.chosen: list[int] = []
        self.overhead, self.overheads = 0.0, []  # seconds a step spends keeping the strategy's state, whatever k
        self.total = np.zeros(2, int)  # drafted, accepted in this run
        self.held = 0  # steps that drafted less than the rate asked: the run would not repay a compile

    # -- the model -----------------------------------------------------------------
    def expect(self, first_acceptance: float) -> None:
        """The prior of a_1: what the draft measured on its suite (RECORD_PRIOR pseudo-counts:
        evidence outweighs it within some ten first drafts)."""
        self.first_prior = self.expected = min(max(float(first_acceptance), 0.0), 1.0)
        self.first_weight = RECORD_PRIOR

    @property
    def record(self) -> float | None:
        """a_1 on the draft's record while it prices the drafts (expect, until dropped)."""
        return self.expected if self.first_weight == RECORD_PRIOR else None

    def _check_record(self) -> None:
        """Drop the record where this run's first drafts contradict it (a quantized draft cache
        written without rotation, sampling, prompts unlike the suite's): held at RECORD_PRIOR it
        kept the negative control (unrotated injection, a_1 ~0.1 against the record's 0.43)
        drafting in bursts through 128-token runs, never switched off: 0.936x plain over 18 runs;
        dropped (after 20-24 first drafts there), no length pays at the run's rate and it stops:
        0.960x (design.md 11)."""
        accepted, rejected = (int(c) for c in self.run_counts[0])  # asked after a draft: n >= 1
        n = accepted + rejected
        if self.fixed or self.record is None or not _unlikely(accepted, n, self.record, DROP_CHANCE):
            return
        self.disowned = (f"{accepted} of its {n} first drafts accepted, which a draft of its record's a_1 "
                         f"{self.record:.2f} gets under {DROP_CHANCE:.1%} of the time: drafts are priced at "
                         f"this run's {accepted / n:.2f} from now on")
        self.first_prior, self.first_weight = accepted / n, PRIOR

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
        ones = self.costs.ones()
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
        self.unmeasured = None
        self.costs.measured(verify_seconds)

    def acceptance(self, counts=None) -> np.ndarray:
        """a_j for j = 1..k_max (from the decayed counts, or the given ones)."""
        out, prior, weight = [], self.first_prior, self.first_weight
        for acc, rej in (self.counts if counts is None else counts).tolist():
            prior = (acc + weight * prior) / (acc + rej + weight)
            out.append(prior)
            weight = PRIOR
        return np.array(out)

    def c_verify(self, n: int) -> float:
        return self.costs.c_verify(n)

    def c_draft(self, k: int) -> float:
        return self.drafts.cost(k)

    def expected_tokens(self, limit: int, counts=None) -> list[float]:
        """E(k), tokens a step commits with k = 0..limit drafts (plain Python: the controller runs
        every step, and numpy's per-call cost on these few values was 2% of a lavapipe decode step)."""
        tokens, reach, expected = [1.0], 1.0, 0.0
        for a in self.acceptance(counts)[:limit].tolist():
            reach *= a
            expected += reach
            tokens.append(1.0 + expected)
        return tokens

    def rates(self, limit: int, counts=None, verify=None) -> list[float]:
        """Committed tokens per second with k = 0..limit drafts (verify: the pass prices, c_verify
        unless given)."""
        verify = verify or self.c_verify
        return [t / (verify(k + 1) + self.c_draft(k) + self.overhead)
                for k, t in enumerate(self.expected_tokens(limit, counts))]

    def expected_rate(self, k: int) -> float:
        return self.rates(k)[k]

    def plain_rate(self) -> float:
        """Tokens per second without the strategy at all."""
        return 1.0 / self.c_verify(1)

    def stop_reason(self) -> str | None:
        """Why the strategy should be switched off (it costs more than it saves), or None while it
        pays or the evidence is thin (never when fixed)."""
        scaled = self.costs.scaled
        if self.fixed or self.unmeasured or scaled < STOP_STEPS:
            return None
        if self.total[0] >= self.stop_drafts() and not self.total[1]:
            # its upkeep (captures, commits) is then pure cost, and hidden in the live curve
            return (f"none of its {self.total[0]} drafts was accepted in {scaled} steps; --draft-fixed "
                    "keeps it on")
        if self.drafts.timings() < SHAPE_PASSES:
            # its rate rests on what a draft costs: one timing is noise (the shipped MTP head's
            # first timed draft, 8.3 ms where they take ~3, switched it off after a mid-run
            # measurement at a 1000-token request's 261st token, where k 1 pays 1.15x plain)
            return None
        # judged on the whole run's acceptance (the decayed one follows the text, and one unlucky
        # stretch would switch off a strategy that pays) and on steady pass prices (a slow spell's
        # would: choose() idles through it at the live ones)
        steady = self.costs.steady
        rates = self.rates(self.k_max, self.run_counts, steady)
        k = _argmax(rates)
        best, plain, a_1 = rates[k], self.plain_rate(), self.acceptance(self.run_counts)[0]
        if k == 0 and self.overhead > UPKEEP_SHARE * self.c_verify(1):
            return (f"it costs more than it saves here: no draft length pays (a_1 {a_1:.2f}) and it "
                    f"spends {1000 * self.overhead:.0f} ms keeping its state a step; --draft-fixed keeps it on")
        # idling still costs its captures and probes: off where not even the a_1 on the draft's
        # record would make a length pay by the margin below (the shipped DFlash draft on
        # lavapipe); inside it, a few noisy timings decide (the shipped MTP head, 1.16x plain at
        # k 1, was switched off in 1 of 5 runs when 4 drafts' timings put k 1 at 0.98x)
        if k == 0 and max(self.rates(self.k_max, np.zeros_like(self.run_counts), steady)[1:], default=0.0) \
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
        miss = 1.0 - self.expected
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
            if self.full and reach > k and self.costs.width(reach + 1) not in self.costs.live and affordable(reach) \
                    and self._may_pay(reach, rates[k]):
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

    def _may_pay(self, j: int, rate: float) -> bool:
        """Whether j drafts would beat `rate` were their pass to cost what the kernels guess (the
        cached shape may be wrong, the kernels' slot arithmetic not by much): trying 2k + 1 after
        each accepted single draft, the MTP head (its chained second draft rarely right) compiled
        and ran 4- and 8-row passes no rate would choose."""
        return self.expected_tokens(j)[j] / (self.guess(j + 1) * self.c_verify(1) + self.c_draft(j)
                                             + self.overhead) > rate

    def update(self, k: int, drafted: int, accepted: int, verify_seconds: float | None,
               draft_seconds: float | None) -> None:
        """After a step that asked for k drafts, got `drafted`, and the target accepted `accepted`;
        seconds of None are not typical (a first pass that recorded and compiled) and not learned."""
        if verify_seconds is not None:
            rows = self.costs.width(drafted + 1)
            self.costs.learn(rows, rows == drafted + 1, verify_seconds)
        if k and draft_seconds is not None:
            self.drafts.learn(k, draft_seconds)
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
            if not accepted:  # only a rejected first draft makes the record less likely
                self._check_record()

    def finish(self) -> None:
        """Hand what the run learned of the verify costs to `persist` (VerifyCosts.learned)."""
        curve = None if self.persist is None or self.unmeasured else self.costs.learned()
        if curve is not None:
            self.persist(curve)

    def summary(self) -> dict:
        """Mean chosen k and why: the expected rate of the mean choice next to plain decoding's
        (None when fixed: that controller prices nothing, its curve is a placeholder)."""
        mean_k = float(np.mean(self.chosen)) if self.chosen else 0.0
        k = int(round(mean_k))
        priced = not (self.fixed or self.unmeasured)
        return {"mode": "fixed" if self.fixed else "cost-aware", "mean_k": mean_k, "held_for_setup": self.held,
                "unmeasured": self.unmeasured, "record_dropped": self.disowned,
                "expected_tps": self.expected_rate(k) if priced else None,
                "plain_tps": self.plain_rate() if priced else None,
                "overhead_seconds": self.overhead,
                "acceptance": [round(float(a), 3) for a in self.acceptance()],
                "verify_seconds": {str(n): s for n, s in sorted(self.costs.verify.items())}}


def _unlikely(accepted: int, n: int, a: float, chance: float) -> bool:
    """Whether a draft of first-draft acceptance a gets no more than `accepted` of n first drafts
    accepted with probability under `chance` (the binomial tail, summed from its largest term down
    in logs, (1 - a)^n underflowing in long runs, and stopped once it is decided: every rejected
    first draft asks)."""
    if accepted >= a * n or a <= 0.0:
        return False  # at or above the mean
    if a >= 1.0:
        return True
    log_a, log_miss, top = math.log(a), math.log1p(-a), math.lgamma(n + 1)
    tail = 0.0
    for i in range(accepted, -1, -1):  # below the mean, each term is smaller than the one above
        term = math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_a + (n - i) * log_miss)
        tail += term
        if tail >= chance:
            return False
        if term < 1e-6 * chance:
            break  # the terms left shrink faster than geometrically
    return True


def _argmax(values: list) -> int:
    """The first index of the largest value, as np.argmax."""
    return max(range(len(values)), key=values.__getitem__)
