"""What the cost-aware controller believes of a draft's acceptance (docs/design.md section 11):
a_j, the chance that draft j is accepted given drafts 1..j-1 were, as decayed counts per draft
position over a prior. A position with little evidence leans on the one before it, so after
drafts 1..j keep being accepted the choice reaches for j + 1. a_1 leans on what the draft
measured on its own suite where it knows (`expect`), else on 0.5: the shipped DFlash draft (a_1
0.25) then starts plain on lavapipe instead of drafting 3 steps to learn it. Once the run's
first drafts say the record does not describe this run (fewer accepted than a draft of the
record's a_1 would get but DROP_CHANCE of the time), a_1 leans on the run's own rate instead.
`offered` is the chance the strategy proposes anything when asked: a lookup that copies earlier
text (ngram) is silent where the text does not repeat, and priced as if it drafted every step it
bought a 4-row and a 2-row verify's compiles (1.7 s) in a 256-token chat story where it proposed
on a third of the steps: 11.7 s against 9.2 s plain."""
from __future__ import annotations

import math

import numpy as np

from .costs import DECAY

PRIOR = 2.0        # pseudo-counts behind a_j's prior: a_{j-1} (for a_1: 0.5)
RECORD_PRIOR = 8.0  # ... behind a_1's where the draft's record gives it (measured over thousands of
                    # drafts: at 2, one rejected first draft took the shipped DFlash draft, a_1 0.43,
                    # below the 0.30 at which k 1 pays, and it idled where k 1 gives 1.15x plain)
DROP_CHANCE = 0.002  # a draft's record no longer counts where a draft of its a_1 gets no more of the
                     # run's first drafts accepted this rarely; asked after every rejected one, so at
                     # the record's a_1 1.6% of 300-draft runs drop it (at 0.02: 12.6%), and at a_1
                     # 0.1 against 0.43 it goes after 16 first drafts (median; 90%: 27)
STOP_DRAFTS = 4    # none of this many drafts accepted says a draft is not its prior (at least; stop_drafts)
STOP_CHANCE = 0.02  # ... where a draft with the a_1 prior gets none of them accepted this rarely
OFFER_PRIOR = 2.0   # pseudo-counts behind the prior that a strategy asked for drafts proposes some


class Acceptance:
    def __init__(self, k_max: int):
        self.counts = np.zeros((k_max, 2))  # decayed (accepted, rejected) per draft position
        self.run_counts = np.zeros((k_max, 2))  # the same, undecayed: what the stop rules judge by
        self.first_prior, self.first_weight = 0.5, PRIOR
        self.expected = self.first_prior  # a_1 as the run started: the record, else the guess
        self.disowned = None  # why the record stopped pricing drafts (the run contradicted it)
        self.start_weight = PRIOR  # first_weight as a run starts
        self.offers = (0.0, 0.0)  # decayed (proposed some, proposed none) over the steps that asked

    def expect(self, first_acceptance: float) -> None:
        """The prior of a_1: what the draft measured on its suite (RECORD_PRIOR pseudo-counts:
        evidence outweighs it within some ten first drafts)."""
        self.first_prior = self.expected = min(max(float(first_acceptance), 0.0), 1.0)
        self.first_weight = self.start_weight = RECORD_PRIOR

    def reset(self) -> None:
        """A new run (a server's next request): no evidence yet, and the record, even one the last
        run disowned, prices a_1 again (that run's text contradicted it, not necessarily this one's)."""
        self.counts, self.run_counts = np.zeros_like(self.counts), np.zeros_like(self.run_counts)
        self.offers = (0.0, 0.0)
        self.first_prior, self.first_weight, self.disowned = self.expected, self.start_weight, None

    @property
    def record(self) -> float | None:
        """a_1 on the draft's record while it prices the drafts (expect, until dropped)."""
        return self.expected if self.first_weight == RECORD_PRIOR else None

    def limit(self, k_max: int) -> None:
        """Keep the positions of the first k_max drafts only."""
        self.counts, self.run_counts = self.counts[:k_max], self.run_counts[:k_max]

    def estimate(self, counts=None, cautious: bool = False) -> np.ndarray:
        """a_j for j = 1..k_max (from the decayed counts, or the given ones); cautious: a_j for j >= 2
        one standard deviation below its mean, as the run's drafts at j (undecayed) and the prior
        weigh it (a compile is sunk: one shadow whose three drafts matched put a_2 and a_3 at 0.73
        and 0.82 where the run's drafts then got 0.07 and 0, and bought a 4-row verify on them)."""
        seen = (self.run_counts if counts is None else counts).sum(axis=1).tolist() if cautious else None
        counts = self.counts if counts is None else counts
        out, prior, weight = [], self.first_prior, self.first_weight
        for j, (acc, rej) in enumerate(counts.tolist()):
            prior = (acc + weight * prior) / (acc + rej + weight)
            spread = math.sqrt(prior * (1.0 - prior) / (seen[j] + weight + 1.0)) if cautious and j else 0.0
            out.append(max(0.0, prior - spread))
            weight = PRIOR
        return np.array(out)

    def offered(self) -> float:
        """The chance that a step asking for drafts gets some (1 until steps say otherwise)."""
        some, none = self.offers
        return (some + OFFER_PRIOR) / (some + none + OFFER_PRIOR)

    def asked(self, proposed: bool) -> None:
        """After a step that asked the strategy for drafts: whether it proposed any."""
        some, none = self.offers
        self.offers = (DECAY * some + proposed, DECAY * none + (not proposed))

    def learn(self, drafted: int, accepted: int, keep_record: bool = False) -> None:
        """After a step whose `drafted` drafts had their first `accepted` accepted (keep_record:
        a fixed draft length, which prices nothing, never drops it)."""
        if not drafted:
            return
        self.counts[:drafted] *= DECAY
        for counts in (self.counts, self.run_counts):
            counts[:accepted, 0] += 1
            if accepted < drafted:
                counts[accepted, 1] += 1
        if not accepted and not keep_record:  # only a rejected first draft makes the record less likely
            self._check_record()

    def _check_record(self) -> None:
        """Drop the record where this run's first drafts contradict it (a quantized draft cache
        written without rotation, sampling, prompts unlike the suite's): held at RECORD_PRIOR it
        kept the negative control (unrotated injection, a_1 ~0.1 against the record's 0.43)
        drafting in bursts through 128-token runs, never switched off: 0.936x plain over 18 runs;
        dropped (after 20-24 first drafts there), no length pays at the run's rate and it stops:
        0.960x (design.md 11)."""
        accepted, rejected = (int(c) for c in self.run_counts[0])  # asked after a draft: n >= 1
        n = accepted + rejected
        if self.record is None or not _unlikely(accepted, n, self.record, DROP_CHANCE):
            return
        self.disowned = (f"{accepted} of its {n} first drafts accepted, which a draft of its record's a_1 "
                         f"{self.record:.2f} gets under {DROP_CHANCE:.1%} of the time: drafts are priced at "
                         f"this run's {accepted / n:.2f} from now on")
        self.first_prior, self.first_weight = accepted / n, PRIOR

    def stop_drafts(self) -> int:
        """Drafts, none accepted, that say a draft is not the one its a_1 prior describes: a draft
        of that a_1 gets none of n accepted with chance (1 - a_1)^n, kept under STOP_CHANCE (6 at
        the default 0.5, 10 at 0.35), at least STOP_DRAFTS and at most 4x that."""
        miss = 1.0 - self.expected
        if miss <= 0.0:
            return STOP_DRAFTS
        n = np.ceil(np.log(STOP_CHANCE) / np.log(miss)) if miss < 1.0 else 4 * STOP_DRAFTS
        return int(min(max(n, STOP_DRAFTS), 4 * STOP_DRAFTS))


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
