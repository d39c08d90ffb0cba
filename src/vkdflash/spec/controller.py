"""Cost-aware draft length (docs/design.md section 11): before each step choose k, 0..k_max, to
maximise expected committed tokens per second

    E(k) = 1 + o sum_{i<=k} prod_{j<=i} a_j     T(k) = o c_verify(k + 1) + (1 - o) c_verify(1) + c_draft(k)

a_j: the running probability that draft j is accepted given drafts 1..j-1 were (acceptance.py:
decayed counts per position over a prior, the draft's record for a_1 where it has one); o: the
chance that a step asking for drafts gets any (a lookup finds no match: a plain step).
c_draft(k): seconds of a proposal of up to k tokens (costs.DraftCosts: the median of the recent
ones per k, unseen k interpolated; before the first, what an earlier run timed, else 0).
c_verify(n): seconds of an n-row target pass, learned from the cached curve and live passes
(costs.VerifyCosts). The prior's shape can be wrong, so after a step whose drafts were all
accepted it tries a length of 2k + 1 it has not priced.

A length whose first pass must compile kernels first (setup: lavapipe takes ~1.6 s for a new
batch width, more than a 128-token run saves) counts its setup against the time to generate
what is left, so a short run stays plain where a long one drafts; probes take a ready length.
Compiled kernels outlive the request: once a speculator has served one, the tokens of every
request so far count (`horizon`), so a process serving many short requests drafts in the end.

Keeping a strategy's state costs every step whatever k, so T(k) includes that overhead, and
when the evidence says the strategy does not pay here, `stop_reason()` says why (verdict.py).
A shadow step (shadow.py) proposes drafts it does not verify, to learn acceptance where compiles
hold the choice at k = 0.

k = 0 is plain decoding; while the choice stays 0 it drafts a little anyway every `probe_every`
steps, so the estimates can recover when the text becomes predictable; a probe that gets
nothing accepted doubles the wait (up to parts.MAX_PROBE_WAIT), so a draft that is never right costs
next to nothing."""
from __future__ import annotations

import functools
from statistics import median

import numpy as np

from . import parts
from .acceptance import Acceptance
from .costs import DraftCosts, VerifyCosts, argmax, bought, whole_draft
from .shadow import Shadow
from .verdict import STOP_RATIO, STOP_STEPS, at_record, verdict

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
        self.acceptance = Acceptance(self.k_max)
        self.idle = 0      # steps since the last draft
        self.wait = probe_every  # idle steps before the next probe
        self.probing = False
        self.chosen: list[int] = []  # this request's k per step
        self.earlier = (0, 0)  # sum of k and steps of the requests before it (summary)
        self.served = 0  # tokens the steps of the requests before it committed
        self.steps = 0  # this request's steps
        self.lasting = False  # whether the last stop_reason() is this device's verdict, not the request's
        self.overhead, self.overheads = 0.0, []  # seconds a step spends keeping the strategy's state, whatever k
        self.total = np.zeros(2, int)  # drafted, accepted in this request
        self.held = 0  # steps that drafted less than the rate asked: the run would not repay a compile
        self.shadows, self.shadow = Shadow(), 0  # drafts proposed and not verified (shadow.py); this step's
        self.parts: dict[str, parts.Part] = {}  # a cascade's parts (Proposal.source), as seen
        self.part_priors: dict[str, tuple] = {}  # part -> (a_1 on its draft's record or None, {k: proposal seconds})
        self.lengths: dict[str, int] = {}  # a cascade's length per part this step (choose)
        self._shadow_source = ""  # the cascade's part whose shadow drafts are pending
        self.offer_known = False  # this step's draft was in hand, counted as an offer when proposed (choose)

    # -- the model -----------------------------------------------------------------
    def new_request(self) -> None:
        """Forget what the last request's text taught; keep what the device's costs did."""
        self.acceptance.reset()
        for part in self.parts.values():
            part.new_request()
        self.served += self.steps + int(self.total[1])
        self.shadows.new_request()
        self.full, self.idle, self.wait, self.probing, self.steps = 0, 0, self.probe_every, False, 0
        self.total[:] = 0
        self.earlier = (self.earlier[0] + sum(self.chosen), self.earlier[1] + len(self.chosen))
        self.chosen = []

    def limit(self, k_max: int) -> None:
        """Lower k_max to what the strategy can draft (before the first step)."""
        self.k_max = min(self.k_max, int(k_max))
        self.acceptance.limit(self.k_max)

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

    def c_verify(self, n: int) -> float:
        return self.costs.c_verify(n)

    def c_draft(self, k: int) -> float:
        return self.drafts.cost(k)

    def expected_tokens(self, limit: int, counts=None, acceptance=None, cautious: bool = False,
                        offered: float | None = None) -> list[float]:
        """E(k), tokens a step commits with k = 0..limit drafts (plain Python: the controller runs
        every step, and numpy's per-call cost on these few values was 2% of a lavapipe decode step)."""
        acceptance = acceptance or self.acceptance
        offered = _offered(acceptance, counts) if offered is None else offered
        tokens, reach, expected = [1.0], 1.0, 0.0
        for a in acceptance.estimate(counts, cautious)[:limit].tolist():
            reach *= a
            expected += reach
            tokens.append(1.0 + offered * expected)
        return tokens

    def rates(self, limit: int, counts=None, verify=None, part=None, cautious: bool = False,
              in_hand: bool = False) -> list[float]:
        """Committed tokens per second with k = 0..limit drafts (verify: the pass prices, c_verify
        unless given; part: a cascade part's (Acceptance, DraftCosts) instead of the strategy's;
        cautious: Acceptance.estimate's; in_hand: a step whose drafts are proposed already); a step
        that asks and gets no drafts runs plain decoding's 1-row pass."""
        verify = verify or self.c_verify
        acceptance, drafts = part or (self.acceptance, self.drafts)
        offered, plain = 1.0 if in_hand else _offered(acceptance, counts), verify(1)
        return [t / (offered * verify(k + 1) + (1.0 - offered) * plain + drafts.cost(k) + self.overhead)
                for k, t in enumerate(self.expected_tokens(limit, counts, acceptance, cautious, offered))]

    def expected_rate(self, k: int) -> float:
        return self.rates(k)[k]

    def plain_rate(self) -> float:
        """Tokens per second without the strategy at all."""
        return 1.0 / self.c_verify(1)

    def stop_reason(self) -> str | None:
        """Why the strategy should be switched off (it costs more than it saves), or None while it
        pays or the evidence is thin (never when fixed); sets `lasting`."""
        reason = verdict(self)
        if reason:  # the device's verdict where drafts as good as it expects would not pay either
            self.lasting = max(at_record(self)[1:], default=0.0) < STOP_RATIO * self.plain_rate()
        return reason

    def note_overhead(self, seconds: float) -> None:
        """Seconds the last step spent keeping the strategy's state (its commit); the median of
        the recent ones, as a first commit of a shape may compile kernels."""
        self.overheads = (self.overheads + [seconds])[-STOP_STEPS:]
        self.overhead = float(median(self.overheads))

    # -- deciding and learning -------------------------------------------------------
    def choose(self, room: int, setup=None, done: int | None = None, firsts: dict | None = None,
               in_hand: int | None = None) -> int:
        """k for the next step, at most `room` (the tokens left to generate). setup(rows): seconds
        a first pass of that many rows costs before it runs (kernel compiles: ~1.6 s for a new
        batch width on lavapipe, more than a short run can earn back), paid only where the
        `horizon` repays it: the tokens left, or where the request has generated `done` tokens,
        no more than that (a run may end at any token: chat answers to -n 512 ended after 7, 38
        and 138 tokens, and compiles bought at their start had made them 1.6-1.8x slower than
        plain decoding; weighed over the tokens so far, a compile is bought once the rent paid
        without it would have bought it, so a run that ends then pays at most twice the best).
        firsts: a cascade's {part: seconds its first proposal will take} (setup then prices the
        passes alone): each part gets its own length (part_lengths, kept in `lengths`) and the
        step asks for the longest. in_hand: the length of a free strategy's draft, proposed before
        the choice (Strategy.free_proposals): k is at most that (0: a plain step, neither idle nor
        a choice), and the step prices the draft as proposed, not by the chance that a step gets
        one, so a lookup silent on most of a text drafts where it has a draft."""
        if self.fixed:
            in_hand = None  # always k_max, as without a draft in hand (what --draft-fixed measures)
        self.offer_known = in_hand is not None
        if self.offer_known:  # how often it offers a draft: the share a compile is weighed at
            self.acceptance.asked(in_hand > 0)
        horizon, setup = self.horizon(room, done), setup or (lambda rows: 0.0)
        limit = min(self.k_max, room, self.k_max if in_hand is None else in_hand)
        self.shadow, self.lengths = 0, {}
        if limit <= 0:
            return 0
        if self.fixed:
            k = limit
        elif self.unmeasured:
            k = 0  # plain until a curve is measured
        elif firsts is not None:
            self.lengths = self.part_lengths(room, setup, done, firsts)
            k = max(self.lengths.values(), default=0)
        else:
            # plain decoding's own pass is compiled sooner or later whatever this step drafts: in a
            # cold process pricing it here made the first step draft (a 2-row compile, ~1.6 s)
            # a draft in hand is priced as proposed; a compile (bought's cautious rates) at the offer share
            rates = self.rates(limit, in_hand=self.offer_known)
            k = bought(limit, horizon, setup, rates, lambda: self.rates(limit, cautious=True))
            if self.offer_known:
                k = whole_draft(k, limit, rates, setup)
            self.held += k < argmax(rates)
            reach = min(limit, 2 * self.full + 1)
            if self.full and reach > k and self.costs.width(reach + 1) not in self.costs.live \
                    and self._affordable(reach, horizon, setup) and self._may_pay(reach, rates[k], self.offer_known):
                k = reach  # the last drafts all held: learn what a longer verify costs here
            self.probing = k == 0 and self.idle >= self.wait
            if self.probing:
                k = self.probe(limit, horizon, setup)
                self.probing = k > 0
        if not (k or self.fixed):  # what plain decoding commits next says how its drafts would have done
            if firsts is None:
                self.shadow = self.shadows.length(self, limit, horizon, setup)
            else:
                self.shadow, asked = parts.shadow_lengths(self, limit, horizon, setup, firsts)
                if self.shadow:  # else every part keeps its length (0)
                    self.lengths = asked
        self.idle = 0 if k else self.idle + 1
        self.chosen.append(k)
        return k

    def part_lengths(self, room: int, setup=None, done: int | None = None, firsts: dict | None = None) -> dict[str, int]:
        """A cascade's draft length per part (parts.lengths)."""
        return parts.lengths(self, room, setup, done, firsts)

    def _affordable(self, j: int, horizon: int, setup) -> bool:
        """Whether j drafts' first pass costs no more than the pass itself, or little next to the
        horizon (a probe, or a longer draft tried to learn its cost, buys no compile)."""
        first = setup(j + 1)
        return first <= self.c_verify(j + 1) or Shadow.affordable(first, horizon, self.c_verify(1))

    def probe(self, limit: int, horizon: int, setup, part=None) -> int:
        """A probe's length (0: none affordable): the one that would pay best at the draft's record
        (part: a cascade part's, as rates takes it). MTP's head (a_1 0.35) probes 1 draft, a 2-row
        pass, not 2 (3 rows, priced as 4 on lavapipe: a dear probe)."""
        cheap = [j for j in range(1, limit + 1) if self._affordable(j, horizon, setup)]
        if not cheap:
            return 0
        at_record = self.rates(limit, np.zeros_like((part[0] if part else self.acceptance).counts), part=part)
        return max(cheap, key=lambda j: (at_record[j], -j))

    def horizon(self, room: int, done: int | None) -> int:
        """Tokens a compile bought now is weighed over: the tokens left (`room`), or where the
        request has generated `done`, no more than that (see choose). Kernels outlive the request,
        so once the speculator has served one, the tokens of all requests so far, uncapped by this
        one's room: a server's 64-token answers never drafted, each too short to repay a compile
        alone (the same rent-or-buy rule over the process, as the prompt's width is chosen)."""
        if done is None:
            return room
        if self.served:
            return self.served + done
        return max(1, min(room, done))

    def shadowed(self, drafts, seconds: float, typical: bool, source: str = "", declined=()) -> None:
        """This step's shadow drafts (proposed in `seconds`; typical: not a first proposal of its
        shape; source, declined: the cascade's part that proposed them, those before it that had none)."""
        self._asked(bool(drafts), source, declined)
        self.shadows.proposed(drafts, seconds)
        self._shadow_source = source if drafts else ""
        if typical:
            self.drafts.learn(self.shadow, seconds)
            if source and drafts:
                self.part(source).drafts.learn(self.shadow, seconds)

    def committed(self, tokens) -> None:
        """Tokens a step committed, in order: a pending shadow's drafts are judged against them (and
        teach the cascade's part that proposed them: unverified, a copy's drafts priced it at a_1's
        prior of 0.5 where they matched 97% of the time, and no compile was ever bought for it)."""
        decided = self.shadows.see(tokens)
        if decided:  # a cascade's record is its recorded part's, judged there (update)
            self.acceptance.learn(*decided, keep_record=self.fixed or bool(self.part_priors))
            if self._shadow_source:
                self.part(self._shadow_source).acceptance.learn(*decided)

    def _may_pay(self, j: int, rate: float, in_hand: bool) -> bool:
        """Whether j drafts would beat `rate` were their pass to cost what the kernels guess (the
        cached shape may be wrong, the kernels' slot arithmetic not by much): trying 2k + 1 after
        each accepted single draft, the MTP head (its chained second draft rarely right) compiled
        and ran 4- and 8-row passes no rate would choose."""
        c_1 = self.c_verify(1)
        return self.rates(j, verify=lambda rows: self.guess(rows) * c_1, in_hand=in_hand)[j] > rate

    def _asked(self, proposed: bool, source: str, declined) -> None:
        """Whether the strategy, and each cascade part asked, proposed anything (a draft in hand was
        counted when it was proposed: offer_known)."""
        if not self.offer_known:
            self.acceptance.asked(proposed)
        for name in declined:
            self.part(name).acceptance.asked(False)
        if source and proposed:
            self.part(source).acceptance.asked(True)

    def update(self, k: int, drafted: int, accepted: int, verify_seconds: float | None,
               draft_seconds: float | None, source: str = "", source_k: int = 0, declined=()) -> None:
        """After a step that asked for k drafts, got `drafted` (from a cascade's part `source`, asked
        for source_k, after the parts `declined` had none), and the target accepted `accepted`;
        seconds of None are not typical (a first pass that recorded and compiled) and not learned."""
        if k:
            self._asked(drafted > 0, source, declined)
        if verify_seconds is not None:
            rows = self.costs.width(drafted + 1)
            self.costs.learn(rows, rows == drafted + 1, verify_seconds)
        if k and draft_seconds is not None:
            self.drafts.learn(k, draft_seconds)
        if source and drafted:
            self.part(source).learn(drafted, accepted, self.fixed, source_k or k, draft_seconds)
        self.full = drafted if drafted and accepted == drafted else 0
        self.total += (drafted, accepted)
        self.steps += 1
        if self.probing:
            self.wait = parts.next_wait(self.wait, accepted, self.probe_every)
            self.probing = False
        # a cascade's record is its drafting part's, judged there: the copy's misses must not drop it
        self.acceptance.learn(drafted, accepted, keep_record=self.fixed or bool(self.part_priors))

    def part(self, name: str) -> parts.Part:
        """What the controller knows of the cascade's part `name` (made from its prior when first seen)."""
        part = self.parts.get(name)
        if part is None:
            part = self.parts[name] = parts.Part(self.k_max, self.probe_every, *self.part_priors.get(name, (None, {})))
        return part

    def finish(self) -> None:
        """Hand what the run learned of the verify costs to `persist` (VerifyCosts.learned)."""
        curve = None if self.persist is None or self.unmeasured else self.costs.learned()
        if curve is not None:
            self.persist(curve)

    def summary(self) -> dict:
        """Mean chosen k and why: the expected rate of the mean choice next to plain decoding's
        (None when fixed: that controller prices nothing, its curve is a placeholder)."""
        steps = self.earlier[1] + len(self.chosen)
        mean_k = (self.earlier[0] + sum(self.chosen)) / steps if steps else 0.0
        k = int(round(mean_k))
        priced = not (self.fixed or self.unmeasured)
        return {"mode": "fixed" if self.fixed else "cost-aware", "mean_k": mean_k, "steps": steps,
                "held_for_setup": self.held, "shadow": list(self.shadows.counts),
                "unmeasured": self.unmeasured, "record_dropped": self.acceptance.disowned,
                "expected_tps": self.expected_rate(k) if priced else None,
                "plain_tps": self.plain_rate() if priced else None,
                "overhead_seconds": self.overhead,
                "acceptance": [round(float(a), 3) for a in self.acceptance.estimate()],
                "verify_seconds": {str(n): s for n, s in sorted(self.costs.verify.items())}}


def _offered(acceptance: Acceptance, counts) -> float:
    """The chance a step asking for drafts gets some: the live estimate, or 1 for given counts
    (a draft as good as its record, or the stop rules' whole-run view: a text without repeats
    is this request's, not a reason to drop a lookup for the speculator's life)."""
    return acceptance.offered() if counts is None else 1.0
