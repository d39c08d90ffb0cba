"""Shadow drafts (spec/shadow.py): while compiles hold the controller at k = 0, a strategy's drafts
are proposed, not verified, and judged against the tokens plain decoding commits next; what they
would have had accepted prices the drafts, and the output stays plain decoding's."""
from __future__ import annotations

import test_reuse
import test_spec
from test_reuse import OTHER, RightOn, tokens
from vkdflash.sampling import Sampler
from vkdflash.spec import SpecStats, StrategyOptions
from vkdflash.spec.controller import DraftController
from vkdflash.spec.engine import Speculator
from vkdflash.spec.shadow import SHADOW_SHARE, Shadow

target = test_spec.target
warm = test_reuse.warm
CPU = {1: 0.025, 2: 0.028, 4: 0.035, 8: 0.050, 16: 0.085}


def test_a_shadow_is_decided_at_its_first_miss_or_when_every_draft_matched():
    s = Shadow()
    s.proposed([5, 6, 7], 0.001)
    assert s.see([5]) is None and s.see([6, 9, 7]) == (3, 2) and not s.pending
    s.proposed([5, 6], 0.001)
    assert s.see([4]) == (2, 0)
    s.proposed([5, 6], 0.001)
    assert s.see([5, 6]) == (2, 2) and s.counts == [7, 4]
    s.proposed([1], 0.001)
    s.new_request()
    assert not s.pending and s.see([1]) is None and s.seconds == 0.0


def timed(control, steps: int = 40) -> DraftController:
    """A controller that has timed `steps` plain 1-row passes (c_1 25 ms)."""
    for _ in range(steps):
        control.update(0, 0, 0, CPU[1], None)
    return control


def compile_at(seconds: float):
    return lambda rows: 0.0 if rows == 1 else seconds


def test_shadows_are_taken_where_acceptance_could_change_the_choice_and_within_budget():
    c = timed(DraftController(4, CPU))
    assert c.choose(1000, compile_at(1.6), done=100) == 0 and c.shadow >= 1  # held for the compile
    c = timed(DraftController(4, CPU))
    assert c.choose(1000, compile_at(1.6), done=2) == 0 and c.shadow == 0  # drafts that always hold would not repay it yet
    c = timed(DraftController(4, CPU))
    first_proposal = lambda rows: 0.5 + (0.0 if rows == 1 else 1.6)  # noqa: E731  the strategy's own compile
    assert c.choose(1000, first_proposal, done=100) == 0 and c.shadow == 0
    c = timed(DraftController(4, CPU))
    c.shadows.seconds = SHADOW_SHARE * c.steps * CPU[1] + 1e-6  # this request's budget is spent
    assert c.choose(1000, compile_at(1.6), done=100) == 0 and c.shadow == 0


def test_what_shadows_would_have_had_accepted_buys_the_compile_sooner():
    """A draft whose record says a_1 0.3 (not worth a compile) shadows; its drafts all match, so the
    controller buys the compile at a shorter horizon than the record alone would have."""
    def buys_at(shadow_hits: bool) -> int:
        c = timed(DraftController(4, CPU))
        c.acceptance.expect(0.3)
        for done in range(1, 2000):
            k = c.choose(4000, compile_at(1.6), done=done)
            if k:
                return done
            if c.shadow and shadow_hits:
                c.shadowed([1] * c.shadow, 0.0, False)
                c.committed([1] * c.shadow)
            c.update(0, 0, 0, CPU[1], None)
        return 2000

    assert buys_at(True) < buys_at(False) / 2


def test_shadow_steps_keep_plain_output_and_count_what_would_have_held(warm):
    """Forced to shadow every step, a strategy that drafts the target's own continuation has all
    its shadow drafts matched; the text is plain decoding's, greedy and seeded alike."""
    class ShadowOnly(DraftController):
        def choose(self, room, setup=None, done=None, firsts=None, in_hand=None):
            super().choose(room, setup, done, firsts, in_hand)
            self.shadow = 0 if self.shadows.pending else min(2, room)
            return 0

    model, tok = warm
    known = {tuple(OTHER): tokens(model, tok, OTHER, 40)}
    for sampler in (lambda: Sampler(temp=0.0), lambda: Sampler(temp=0.8, seed=3)):
        stats = SpecStats()
        control = ShadowOnly(4, {1: 0.01, 2: 0.011, 4: 0.013})
        spec = Speculator(model, "right-on", lambda ctx: RightOn(known), StrategyOptions(draft_max=4), stats, control)
        assert tokens(model, tok, OTHER, 40, spec, sampler()) == tokens(model, tok, OTHER, 40, None, sampler())
        spec.close()
        drafted, matched = control.shadows.counts
        assert stats.drafted == 0 and drafted >= 20
        if sampler().greedy:
            assert matched == drafted and "drafts proposed unverified" in stats.line()


def test_no_shadow_where_every_length_is_compiled():
    """Warm kernels leave the learning to probes, whose drafts are verified: shadows of a random
    DFlash draft cost it 5% of bench spec's decoding."""
    c = timed(DraftController(4, CPU))
    c.acceptance.expect(0.02)
    assert c.choose(1000, compile_at(0.0), done=500) == 0 and c.shadow == 0


def test_with_no_curve_yet_shadows_say_whether_measuring_one_would_pay():
    """Before a curve is measured every step is plain; shadows price the drafts meanwhile, with
    passes at the kernels' guess (a cold `generate --spec ngram` on code that repeats itself:
    75 of 75 matched, then it measured and drafted 135)."""
    c = timed(DraftController(4, None, guess=lambda rows: 1 + 0.1 * (rows - 1)))
    assert c.unmeasured and c.choose(1000, compile_at(1.6), done=100) == 0 and c.shadow >= 1
    before = c.expected_tokens(4)[4]
    c.shadowed([1] * c.shadow, 0.0, False)
    c.committed([1] * c.shadow)
    assert c.expected_tokens(4)[4] > before
