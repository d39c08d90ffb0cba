"""Cascades (`--spec ngram+mtp`): the first part that proposes is verified, every part sees every
commit under its own options, and the names, options and stats say which part did what. No
device: parts are stand-ins (tests/test_mtp.py runs ngram+mtp through the engine)."""
from __future__ import annotations

from types import SimpleNamespace

import click
import pytest

from vkdflash.cli_spec import SpecRequest, _refuse_unread
from vkdflash.errors import VkdflashError
from vkdflash.spec.cascade import lookup
from vkdflash.spec.cascade import Cascade
from vkdflash.spec.stats import SpecStats
from vkdflash.spec.strategy import Proposal, Strategy, StrategyOptions


class Part(Strategy):
    def __init__(self, ctx, drafts, log, name, capture=(), expected=None, longest=None):
        self.drafts, self.log, self.part = list(drafts), log, name
        self.capture_layers, self.expected_first_acceptance, self.longest_draft = capture, expected, longest
        log.append((name, "init", dict(ctx.options.settings)))

    def begin(self, ctx):
        self.log.append((self.part, "begin", dict(ctx.options.settings)))

    def propose(self, ctx, last_token, max_n):
        self.log.append((self.part, "propose", max_n))
        return Proposal(self.drafts[:max_n])

    def commit(self, ctx):
        self.log.append((self.part, "commit", dict(ctx.options.settings)))

    def close(self):
        self.log.append((self.part, "close"))


def ctx_for():
    return SimpleNamespace(options=StrategyOptions(settings={"whole": 1}),
                           target=SimpleNamespace(n_vocab=100, hparams=SimpleNamespace(n_layer=4)))


def cascade(ctx, log, copy=(), model=(4, 5, 6), **model_kw):
    return Cascade(ctx, [("copy", lambda c: Part(c, copy, log, "copy"), {"n": 3}),
                         ("model", lambda c: Part(c, model, log, "model", **model_kw), {"vocab": 0})])


def test_the_first_part_with_drafts_is_verified_and_named_and_the_parts_after_it_are_not_asked():
    """Not even on the first proposal: a part's first use (the MTP head's kernels compiling) is
    priced against its own drafts, so it is asked only where they pay (`timed` times each part)."""
    log, ctx = [], ctx_for()
    c = cascade(ctx, log, copy=[7, 8])
    for _ in range(2):
        first = c.propose(ctx, 1, 4)
        assert (first.tokens, first.source) == ([7, 8], "copy")
        assert [e for e in log if e[1] == "propose"] == [("copy", "propose", 4)] and set(c.timed) == {"copy"}
        log.clear()
    c.parts[0].strategy.drafts = []
    got = c.propose(ctx, 1, 2)
    assert (got.tokens, got.source) == ([4, 5], "model") and set(c.timed) == {"copy", "model"}
    assert all(s >= 0 for s in c.timed.values())
    c.parts[1].strategy.drafts = []
    assert c.propose(ctx, 1, 2) == Proposal([])
    c.lengths = {"copy": 0, "model": 0}
    assert c.propose(ctx, 1, 2) == Proposal([]) and c.timed == {}


def test_the_parts_asked_that_proposed_nothing_are_named_in_order():
    """The controller learns from them how often each part proposes when asked (a copy is silent
    where the text does not repeat)."""
    log, ctx = [], ctx_for()
    c = cascade(ctx, log, copy=[])
    assert c.propose(ctx, 1, 4).source == "model" and c.declined == ["copy"]
    c.parts[0].strategy.drafts = [7]
    assert c.propose(ctx, 1, 4).source == "copy" and c.declined == []
    c.parts[0].strategy.drafts = c.parts[1].strategy.drafts = []
    assert c.propose(ctx, 1, 4) == Proposal([]) and c.declined == ["copy", "model"]
    c.lengths = {"copy": 0}  # a part held at length 0 is not asked, so it declined nothing
    assert c.propose(ctx, 1, 4) == Proposal([]) and c.declined == ["model"]


def test_every_part_sees_begin_and_commit_under_its_own_options_and_closes():
    log, ctx = [], ctx_for()
    c = cascade(ctx, log)
    c.begin(ctx)
    c.commit(ctx)
    c.close()
    assert log == [("copy", "init", {"n": 3}), ("model", "init", {"vocab": 0}),
                   ("copy", "begin", {"n": 3}), ("model", "begin", {"vocab": 0}),
                   ("copy", "commit", {"n": 3}), ("model", "commit", {"vocab": 0}), ("copy", "close"), ("model", "close")]
    assert ctx.options.settings == {"whole": 1}  # the engine's options are put back


def test_declarations_combine_and_each_part_drafts_within_its_own_longest():
    log, ctx = [], ctx_for()
    c = cascade(ctx, log, capture=(3, 1), expected=0.4, longest=2)
    assert (c.capture_layers, c.expected_first_acceptance, c.longest_draft) == ((1, 3), 0.4, None)
    c.propose(ctx, 1, 6)
    assert ("model", "propose", 2) in log
    bounded = Cascade(ctx, [("a", lambda x: Part(x, [], log, "a", longest=3), {}),
                            ("b", lambda x: Part(x, [], log, "b", longest=7), {})])
    assert bounded.longest_draft == 7


def test_a_failing_part_is_switched_off_alone_and_the_last_one_raises_naming_it(caplog):
    log, ctx = [], ctx_for()
    c = cascade(ctx, log, copy=[])
    c.parts[1].strategy.propose = lambda *a: 1 / 0
    assert c.propose(ctx, 1, 3) == Proposal([])  # the copy has nothing, the model fails: the copy goes on
    c.parts[0].strategy.drafts = [7]
    assert c.propose(ctx, 1, 3).tokens == [7]
    assert [p.name for p in c.parts] == ["copy"] and ("model", "close") in log
    assert "its part model switched off for good: model propose raised ZeroDivisionError" in caplog.text
    c.commit(ctx)
    c.parts[0].strategy.propose = lambda *a: Proposal([500])
    with pytest.raises(VkdflashError, match="^copy proposed invalid tokens"):
        c.propose(ctx, 1, 3)


def test_a_failed_start_names_the_part_and_leaves_nothing_open():
    log, ctx = [], ctx_for()

    def refuse(_):
        raise ValueError("no draft")
    with pytest.raises(VkdflashError, match="^model: start raised ValueError: no draft"):
        Cascade(ctx, [("copy", lambda x: Part(x, [], log, "copy"), {}), ("model", refuse, {})])
    assert ("copy", "close") in log and ctx.options.settings == {"whole": 1}
    log.clear()
    with pytest.raises(VkdflashError, match=r"^model: capture_layers must be .* not \(99,\)"):
        cascade(ctx, log, capture=(99,))
    assert ("model", "close") in log and ("copy", "close") in log  # the part made, then refused, is closed

    def busy_copy(x):
        part = Part(x, [], log, "copy")
        part.close = lambda: 1 / 0
        return part
    with pytest.raises(VkdflashError, match="no draft"):  # a part failing to close hides nothing
        Cascade(ctx, [("copy", busy_copy, {}), ("model", refuse, {})])


def test_names_resolve_to_registered_parts_or_one_line_errors():
    reg = lookup("ngram+draft-mtp")
    assert reg.name == "ngram+mtp" and [p.name for p in reg.parts] == ["ngram", "mtp"]
    for bad, words in [("ngram+ngram", "names ngram twice"), ("ngram+none", "none cannot be part"),
                       ("ngram+nope", "unknown speculative strategy 'nope'"), ("ngram+", "unknown")]:
        with pytest.raises(VkdflashError, match=words):
            lookup(bad)


def request(spec, *opts, md=None):
    return SpecRequest(spec, md, 8, 0.0, "f16", "f16", opts)


def test_spec_opts_go_to_the_part_they_name():
    got = request("ngram+mtp", "ngram.n=5").settings("ngram+mtp")
    assert got["ngram"] == {"n": 5} and set(got) == {"ngram", "mtp"}
    with pytest.raises(VkdflashError, match="is for dflash, but the strategy is ngram\\+mtp"):
        request("ngram+mtp", "dflash.vocab=0").settings("ngram+mtp")


def test_a_draft_file_goes_to_the_one_part_that_takes_drafts(tmp_path):
    md = str(tmp_path / "d.gguf")
    _refuse_unread(request("ngram+dflash", md=md))  # dflash takes it
    with pytest.raises(click.UsageError, match="takes no draft model"):
        _refuse_unread(request("ngram", md=md))
    with pytest.raises(click.UsageError, match="holds 2 strategies that take a draft model"):
        _refuse_unread(request("dflash+mtp", md=md))


def test_stats_count_acceptance_per_part():
    s = SpecStats(strategy="ngram+mtp")
    s.record(4, 4, "ngram")
    s.record(2, 0, "mtp")
    s.record(2, 1, "mtp")
    assert (s.steps, s.drafted, s.accepted) == (3, 8, 5)
    assert s.as_dict()["by_source"] == {"ngram": {"verify_steps": 1, "drafted": 4, "accepted": 4, "tau": 5.0},
                                        "mtp": {"verify_steps": 2, "drafted": 4, "accepted": 1, "tau": 1.5}}
    assert "by part ngram 1 steps tau 5.00, mtp 2 steps tau 1.50" in s.line()
    assert SpecStats().as_dict()["by_source"] is None


def test_the_built_in_strategies_that_run_no_model_lead_the_default(fresh_plugins, monkeypatch):
    from vkdflash import plugins
    assert plugins.model_free() == ["ngram"]  # the one built-in that declares free proposals
    monkeypatch.setenv("VKDFLASH_PLUGINS", "mtp,dflash")
    plugins.reset()
    assert plugins.model_free() == []


def test_the_watchdog_judges_the_part_whose_record_it_is(caplog):
    import logging

    from vkdflash.spec.watchdog import WATCH_STEPS, Watchdog
    ctx = SimpleNamespace(options=StrategyOptions(), temperature=0.0)
    s = SpecStats(strategy="ngram+mtp")
    for _ in range(WATCH_STEPS):
        s.record(4, 0, "ngram")  # the copy misses: not the head's fault
        s.record(2, 1, "mtp")
    dog = Watchdog()
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        dog.watch(0.5, s, ctx, "mtp")
        assert not caplog.text
        Watchdog().watch(0.5, s, ctx)  # the whole cascade's a_1 (0.5 of the steps): also fine
        for _ in range(8 * WATCH_STEPS):
            s.record(2, 0, "mtp")
        dog.watch(0.5, s, ctx, "mtp")
    assert "mtp: first-draft acceptance 0.11 after 216 steps is far below the 0.50" in caplog.text


def test_the_suite_table_fits_a_cascades_name():
    from vkdflash.suite import table
    row = lambda name: {"strategy": name, "cache": "f16", "temp": 0.0, "draft_max": 2, "acceptance": 0.4,  # noqa: E731
                        "tau": 1.8, "per_kind": {}, "decode_tps": 40.0, "speedup": 1.1, "per_position": [0.5, 0.2]}
    lines = table({"runs": [row("mtp"), row("ngram+dflash")]}).splitlines()
    assert len({len(line) for line in lines}) == 1 and lines[3].startswith("ngram+dflash f16")
