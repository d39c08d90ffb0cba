"""Drafts proposed and not verified ("shadow" drafts). While the cost-aware controller keeps plain
decoding because a verify pass of a new width would compile for longer than the run has earned,
a strategy that never drafts never learns what it would have had accepted: its record's a_1
prices it for the whole run. A shadow step asks the strategy for drafts, runs plain decoding's
own 1-row pass (the step commits one token, as when every draft is rejected), and counts how
many of the drafts the tokens plain decoding then commits match. Greedy, that is what verifying
them would have accepted; sampled, for one-hot drafts it is as likely as acceptance, and for a
draft with its own distribution q (accepted with chance sum min(p, q) >= sum p q) a lower bound.

A shadow costs the proposal alone, so it is taken where it can change a choice a compile holds:
the strategy's first proposal compiles for no longer than a probe may, drafts that always held
would repay a length's compile over the horizon, and this request's shadows have cost under
SHADOW_SHARE of its plain decoding. Where every length is compiled, probes learn instead."""
from __future__ import annotations

from statistics import median

import numpy as np

from .costs import argmax

SHADOW_SHARE = 0.05  # most of a request's decoding time its shadow proposals may take
SHADOW_MAX = 4       # most drafts a shadow proposes (a_1 and a_2 decide most choices)


class Shadow:
    def __init__(self):
        self.drafts: list[int] = []  # the pending shadow's drafts, checked against later tokens
        self.matched = 0
        self.seconds = 0.0  # this request's shadow proposals
        self.counts = [0, 0]  # drafted, would have been accepted: over the speculator's life

    @property
    def pending(self) -> bool:
        return bool(self.drafts)

    def length(self, control, limit: int, horizon: int, setup) -> int:
        """Drafts for this step to propose and not verify (0: none), for a controller that chose
        k = 0 with `setup(rows)` the seconds a first pass of that many rows (and the strategy's
        first proposal) would cost."""
        ones = control.costs.ones()
        if self.pending or limit <= 0 or not ones:
            return 0
        c_1 = median(ones)
        if not self.affordable(setup(1), horizon, c_1) or self.seconds > SHADOW_SHARE * control.steps * c_1:
            return 0  # its first proposal would compile for longer than a probe may, or over budget
        # no curve measured yet: passes priced as the kernels guess, as measuring_pays prices them
        verify = (lambda rows: control.guess(rows) * c_1) if control.unmeasured else None
        sure = control.rates(limit, np.tile([1e9, 0.0], (control.k_max, 1)), verify)
        if not any(setup(j + 1) > 0 and horizon / sure[j] + setup(j + 1) < horizon / sure[0]
                   for j in range(1, limit + 1)):
            # no compile holds the choice (probes, whose drafts are verified, learn there: shadows
            # of a random DFlash draft on warm kernels cost it 5%), or not even drafts that always
            # held would repay one: no acceptance would change k
            return 0
        rates = control.rates(limit, verify=verify)
        return min(limit, SHADOW_MAX, max(1, argmax(rates)))

    @staticmethod
    def affordable(first: float, horizon: int, c_1: float) -> bool:
        """Whether a first proposal (or pass) of `first` seconds costs no more than a probe may: a
        twentieth of what the horizon's tokens take plain (the controller's probes use it too)."""
        return first <= 0.05 * horizon * c_1

    def proposed(self, drafts, seconds: float) -> None:
        """Drafts proposed after the newest token, to be matched against the tokens after it."""
        self.drafts, self.matched = [int(t) for t in drafts], 0
        self.seconds += seconds

    def see(self, tokens) -> tuple[int, int] | None:
        """The next committed tokens, in order; (drafted, matched) once the shadow is decided."""
        for t in tokens:
            if not self.drafts:
                return None
            if int(t) == self.drafts[self.matched]:
                self.matched += 1
                if self.matched < len(self.drafts):
                    continue
            decided, self.drafts = (len(self.drafts), self.matched), []
            self.counts = [self.counts[0] + decided[0], self.counts[1] + decided[1]]
            return decided
        return None

    def new_request(self) -> None:
        """The pending shadow's tokens will never come; the budget starts again."""
        self.drafts, self.seconds = [], 0.0
