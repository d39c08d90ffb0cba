"""One Model and one Speculator serving request after request (the suite; a server): a strategy
switched off for a request's text drafts again on the next, each request is judged on its own
drafts, sampled output does not depend on the requests before, a strategy at fault or too dear
for the device stays off (and the log says so), and no per-step list outlives its request."""
from __future__ import annotations

import logging

import pytest

import test_spec
from test_spec import PROMPT, Laborious
from vkdflash.generate import Stats, generate
from vkdflash.sampling import Sampler
from vkdflash.spec import Proposal, SpecStats, Strategy, StrategyOptions
from vkdflash.spec.controller import DraftController
from vkdflash.spec.engine import Speculator

target = test_spec.target  # the tiny target model
OTHER = [9, 14, 27, 3, 61, 8, 40, 2, 33, 5, 12]


class Priced(DraftController):
    """Passes priced as on a GPU (2 rows cost 1.1 of 1), drafts and upkeep free, whatever this tiny
    model measures: its choices follow the acceptance alone."""

    def update(self, k, drafted, accepted, verify_seconds, draft_seconds, *part):
        super().update(k, drafted, accepted, 0.01 + 0.001 * drafted, 0.0 if k else None, *part)

    def note_overhead(self, seconds):
        super().note_overhead(0.0)


def priced(k_max: int) -> Priced:
    return Priced(k_max, {n: 0.01 + 0.001 * (n - 1) for n in (1, 2, 4, 8)})


class RightOn(Strategy):
    """Drafts the target's greedy continuation of the prompts it knows, a wrong token otherwise."""

    def __init__(self, known: dict):
        self.known = known  # tuple(prompt) -> continuation

    def begin(self, ctx):
        self.reference, self.start = self.known.get(tuple(ctx.tokens)), len(ctx.tokens)

    def propose(self, ctx, last_token, max_n):
        if self.reference is None:
            return Proposal([(last_token + 1) % 200] * max_n)
        done = len(ctx.tokens) - self.start + 1
        return Proposal(list(self.reference[done:done + max_n]))


def tokens(model, tok, prompt, n, spec=None, sampler=None):
    stats = Stats()
    list(generate(model, tok, prompt, n, sampler or Sampler(temp=0.0), (), stats, spec))
    return stats.tokens


@pytest.fixture
def warm(target):
    """Every verify width recorded: no compile for the controller to price (choices as a warm server's)."""
    model, tok = target
    for n in range(1, 6):
        model.reset()
        model.forward(PROMPT[:n], all_logits=n > 1, greedy=True)
    return model, tok


def right_on_other(model, tok, control):
    known = {tuple(OTHER): tokens(model, tok, OTHER, 40)}
    stats = SpecStats()
    return Speculator(model, "right-on", lambda ctx: RightOn(known), StrategyOptions(draft_max=4), stats,
                      control), stats


def test_a_strategy_switched_off_for_a_requests_text_drafts_again_on_the_next(warm, caplog):
    model, tok = warm
    spec, stats = right_on_other(model, tok, priced(4))
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        assert tokens(model, tok, PROMPT, 40, spec) == tokens(model, tok, PROMPT, 40)
    assert stats.disabled.startswith("none of its") and "switched off for this request" in caplog.text
    drafted, accepted = stats.drafted, stats.accepted
    assert tokens(model, tok, OTHER, 40, spec) == tokens(model, tok, OTHER, 40)
    spec.close()
    assert stats.drafted > drafted and stats.accepted - accepted == stats.drafted - drafted and not stats.disabled


def test_each_request_is_judged_on_its_own_drafts(warm):
    """After a request whose drafts were all accepted, one whose drafts never are is switched off
    as in a fresh speculator (the totals once ran on: none accepted was never true again)."""
    model, tok = warm

    def wrong_request(spec, stats):
        drafted = stats.drafted
        tokens(model, tok, PROMPT, 40, spec)
        spec.close()
        return stats.drafted - drafted, stats.disabled

    fresh = wrong_request(*right_on_other(model, tok, priced(4)))
    spec, stats = right_on_other(model, tok, priced(4))
    tokens(model, tok, OTHER, 40, spec)
    assert stats.accepted == stats.drafted > 0 and not stats.disabled
    assert wrong_request(spec, stats) == fresh and fresh[1].startswith("none of its")


def test_a_seeded_request_samples_the_same_text_through_a_speculator_that_served_others(warm):
    model, tok = warm
    sampler = lambda: Sampler(temp=0.8, seed=4)  # noqa: E731
    spec, stats = right_on_other(model, tok, priced(1))
    tokens(model, tok, PROMPT, 40, spec)  # its text switches the strategy off for that request
    assert stats.disabled
    drafted = stats.drafted
    reused = tokens(model, tok, OTHER, 40, spec, sampler())
    spec.close()
    assert stats.drafted > drafted
    spec, _ = right_on_other(model, tok, priced(1))
    assert tokens(model, tok, OTHER, 40, spec, sampler()) == reused
    spec.close()


class CapturingRaises(Strategy):
    capture_layers = (1,)

    def propose(self, ctx, last_token, max_n):
        raise RuntimeError("boom")


@pytest.mark.parametrize("case", ["raised", "costs more than it saves"])
def test_a_strategy_at_fault_or_too_dear_here_stays_off_and_the_log_says_so(target, caplog, monkeypatch, case):
    model, tok = target
    if case == "raised":
        factory, control = (lambda ctx: CapturingRaises()), None
    else:
        plain = tokens(model, tok, PROMPT, 40)
        factory, control = (lambda ctx: Laborious(plain)), DraftController(1, {n: 0.002 * n for n in (1, 2, 4, 8)})
    stats = SpecStats()
    spec = Speculator(model, case, factory, StrategyOptions(draft_max=1), stats, control)
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        tokens(model, tok, PROMPT, 40, spec)
    assert case in stats.disabled and "switched off for this and later requests" in caplog.text and spec.strategy is None
    drafted, captures, forward = stats.drafted, [], model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: captures.append(kw.get("capture")) or forward(*a, **kw))
    assert tokens(model, tok, OTHER, 24, spec) == tokens(model, tok, OTHER, 24)
    spec.close()
    assert stats.drafted == drafted and captures and not any(captures)  # nor a capture for it


def test_no_per_step_list_outlives_its_request(warm):
    model, tok = warm
    spec, stats = right_on_other(model, tok, priced(4))
    tokens(model, tok, OTHER, 24, spec)
    steps = len(spec.control.chosen)
    for _ in range(5):
        tokens(model, tok, OTHER, 24, spec)
    assert len(spec.control.chosen) == steps
    spec.close()
    assert stats.draft_length["steps"] == 6 * steps and stats.draft_length["mean_k"] > 1  # the summary: all six


def test_a_record_one_request_disowned_prices_the_next_again():
    c = DraftController(2, {1: 0.01, 2: 0.011})
    c.acceptance.expect(0.9)
    for _ in range(4):
        c.choose(10)
        c.update(1, 1, 0, 0.01, 0.0)
    c.note_overhead(0.001)
    c.wait = 64  # probes that got nothing accepted
    assert c.acceptance.disowned and c.total[0] == 4
    c.new_request()
    assert c.acceptance.record == 0.9 and c.acceptance.disowned is None and not c.total.any()
    assert not c.acceptance.counts.any() and (c.idle, c.wait, c.steps, c.chosen) == (0, c.probe_every, 0, [])
    assert c.drafts.timings() == 4 and c.costs.scaled == 4 and c.overhead == 0.001  # the device's, kept
