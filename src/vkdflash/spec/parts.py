"""A cascade's parts as the draft-length controller sees them (docs/design.md section 11). Each part
(a copy, a draft model, a head) is priced at its own acceptance and proposal cost, as the
controller prices a lone strategy, with compiles weighed over the same horizon: priced as one
whole, a copy right on 88% of its drafts was held at the head's k ~1 (the default bench prompt,
ngram+mtp). The step asks the cascade for the longest of the parts' lengths."""
from __future__ import annotations

from statistics import median

from .acceptance import Acceptance
from .costs import DraftCosts, argmax, bought
from .shadow import Shadow

MAX_PROBE_WAIT = 128  # most idle steps between probes (the wait doubles after each that fails)


def next_wait(wait: int, accepted: int, probe_every: int) -> int:
    """Idle steps before the next probe: back to probe_every after one that had a draft accepted,
    doubled (up to MAX_PROBE_WAIT) after one that had none, so a draft that is never right costs
    next to nothing."""
    return probe_every if accepted else min(2 * wait, MAX_PROBE_WAIT)


class Part:
    """What the controller knows of one part: its acceptance (from its draft's record, dropped
    where the run contradicts it, as a strategy's), its proposals' costs, its probes."""

    def __init__(self, k_max: int, probe_every: int, record: float | None, drafts: dict):
        self.acceptance, self.drafts = Acceptance(k_max), DraftCosts()
        if record is not None:
            self.acceptance.expect(record)
        self.drafts.prior(drafts)
        self.probe_every = probe_every
        self.idle, self.wait, self.probing = 0, probe_every, False

    def new_request(self) -> None:
        self.acceptance.reset()
        self.idle, self.wait, self.probing = 0, self.probe_every, False

    def learn(self, drafted: int, accepted: int, fixed: bool, asked: int, seconds: float | None) -> None:
        """After a step whose drafts this part proposed (asked for `asked`, in `seconds`; None: not
        a typical proposal, not learned)."""
        self.acceptance.learn(drafted, accepted, keep_record=fixed)
        if self.probing:
            self.wait, self.probing = next_wait(self.wait, accepted, self.probe_every), False
        if seconds is not None:
            self.drafts.learn(asked, seconds)


def lengths(control, room: int, setup=None, done: int | None = None, firsts: dict | None = None) -> dict[str, int]:
    """The draft length per part (those the cascade started with, `part_priors`, and any seen
    propose). firsts: the parts still on, each with its first proposal still to pay, a compile of
    that part's alone (priced as the cascade's, the MTP head's 2 s held the free copy at 0
    through a cold 300-token run it made 1.3x faster alone). A part held at 0 probes as choose()
    does: a length whose pass is compiled, the best at its record."""
    names = list(firsts) if firsts is not None else \
        [*control.part_priors, *(name for name in control.parts if name not in control.part_priors)]
    if control.fixed or control.unmeasured or not names:
        return {}
    horizon, setup = control.horizon(room, done), setup or (lambda rows: 0.0)
    limit, out, held = min(control.k_max, room), {}, False
    for name in names:
        part, first = control.part(name), (firsts or {}).get(name, 0.0)
        costs = (lambda rows: setup(rows) + first) if first else setup
        priced = (part.acceptance, part.drafts)
        rates = control.rates(limit, part=priced)
        k = bought(limit, horizon, costs, rates, lambda: control.rates(limit, part=priced, cautious=True))
        held |= k < argmax(rates)
        part.idle, part.probing = (part.idle + 1 if k == 0 else 0), False
        if part.idle >= part.wait:  # the text may have turned (a copy in a chat answer)
            k = control.probe(limit, horizon, costs, priced)
            if k:
                part.idle, part.probing = 0, True
        out[name] = k
    control.held += held
    return out


def shadow_lengths(control, limit: int, horizon: int, setup, firsts: dict) -> tuple[int, dict[str, int]]:
    """A shadow step's length (0: none) and the parts it asks: those whose first proposal a probe
    may pay."""
    cheapest = min(firsts.values(), default=0.0)
    shadow = control.shadows.length(control, limit, horizon, lambda rows: setup(rows) + cheapest)
    if not shadow:  # Shadow.length proposes one only where 1-row passes were timed
        return 0, {}
    c_1 = median(control.costs.ones())
    return shadow, {name: shadow if Shadow.affordable(first, horizon, c_1) else 0 for name, first in firsts.items()}
