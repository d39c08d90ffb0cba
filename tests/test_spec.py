"""The speculative engine: losslessness, oracle acceptance, statistics, fault isolation."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from gguf_fixtures import write_model
from vkdflash.errors import VkdflashError
from vkdflash.generate import Stats, generate
from vkdflash.model import load_model
from vkdflash.model.forward import Model
from vkdflash.sampling import Sampler
from vkdflash.spec import Proposal, SpecStats, Strategy, StrategyOptions
from vkdflash.spec.controller import DraftController
from vkdflash.spec.engine import Speculator
from vkdflash.spec.verify import verify, verify_greedy
from vkdflash.tokenizer import Tokenizer
from vkdflash_ngram import PromptLookup

PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30, 7, 19, 4, 5, 17, 3]


@pytest.fixture(scope="module")
def target(tmp_path_factory, request):
    from conftest import context_for, DEVICES
    path = write_model(tmp_path_factory.mktemp("spec") / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2,
                       n_head_kv=1, head_dim=64, seed=5)
    mf = load_model(path)
    model = Model(context_for(DEVICES[0].index), mf, n_ctx=128)
    yield model, Tokenizer(mf.metadata)
    model.close()


def run(model, tok, factory=None, n=24, draft_max=8, sampler=None, name="test"):
    stats, spec_stats = Stats(), SpecStats()
    speculator = None
    if factory is not None:
        speculator = Speculator(model, name, factory, StrategyOptions(draft_max=draft_max), spec_stats)
    sampler = sampler or Sampler(temp=0.0)
    list(generate(model, tok, PROMPT, n, sampler, (), stats, speculator))
    if speculator is not None:
        speculator.close()
    return stats.tokens, spec_stats


class Oracle(Strategy):
    """Drafts the target's own greedy continuation, optionally corrupting draft position k."""

    def __init__(self, reference: list, corrupt: int | None = None):
        self.reference, self.corrupt = reference, corrupt

    def propose(self, ctx, last_token, max_n):
        done = len(ctx.tokens) - len(PROMPT) + 1  # generated tokens including last_token
        drafts = list(self.reference[done:done + max_n])
        if self.corrupt is not None and self.corrupt < len(drafts):
            drafts[self.corrupt] = (drafts[self.corrupt] + 1) % 200
        return Proposal(drafts)


def test_oracle_is_accepted_completely(target):
    model, tok = target
    plain, _ = run(model, tok)
    got, stats = run(model, tok, lambda ctx: Oracle(plain))
    assert got == plain
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert stats.tau == pytest.approx(1 + stats.accepted / stats.steps)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_corrupted_position_gives_exactly_predicted_acceptance(target, k):
    model, tok = target
    plain, _ = run(model, tok)
    got, stats = run(model, tok, lambda ctx: Oracle(plain, corrupt=k), draft_max=6)
    assert got == plain
    # every step accepts exactly min(k, drafted) tokens and then takes the target's own token
    n, steps, accepted, per_pos = len(plain), 0, 0, [0] * 6
    emitted = 1
    while emitted < n:
        drafted = min(6, n - emitted - 1)
        if drafted > 0:
            a = min(k, drafted)
            steps, accepted = steps + 1, accepted + a
            for j in range(a):
                per_pos[j] += 1
        else:
            a = 0
        emitted += a + 1
    assert (stats.steps, stats.accepted) == (steps, accepted)
    assert stats.per_position[:k] == per_pos[:k] and not any(stats.per_position[k:])


@pytest.mark.parametrize("draft_max", [1, 2, 5, 15])
def test_ngram_greedy_is_identical_to_plain(target, draft_max):
    model, tok = target
    plain, _ = run(model, tok, n=32)
    got, stats = run(model, tok, PromptLookup, n=32, draft_max=draft_max)
    assert got == plain
    assert stats.steps > 0


class Raises(Strategy):
    def propose(self, ctx, last_token, max_n):
        if len(ctx.tokens) > len(PROMPT) + 3:
            raise RuntimeError("boom\nsecond line")
        return Proposal([1])


class Invalid(Strategy):
    def __init__(self, bad):
        self.bad = bad

    def propose(self, ctx, last_token, max_n):
        return Proposal(self.bad(max_n))


@pytest.mark.parametrize("factory", [
    lambda ctx: Raises(),
    lambda ctx: Invalid(lambda n: [10 ** 6]),
    lambda ctx: Invalid(lambda n: [1] * (n + 1)),
    lambda ctx: Invalid(lambda n: ["a"]),
], ids=["raises", "out-of-vocab", "too-many", "not-int"])
def test_faulty_strategy_is_switched_off_and_output_stays_correct(target, factory, caplog):
    model, tok = target
    plain, _ = run(model, tok)
    got, stats = run(model, tok, factory)
    assert got == plain
    assert stats.disabled and "\n" not in stats.disabled
    assert any("switched off" in r.getMessage() for r in caplog.records)


class BadProbs(Strategy):
    def __init__(self, bad):
        self.bad = bad

    def propose(self, ctx, last_token, max_n):
        n_vocab = ctx.target.hparams.n_vocab
        probs = np.full((1, n_vocab), 1.0 / n_vocab)
        return Proposal([1], self.bad(probs))


def _nan(p):
    p[0, 3] = np.nan
    return p


@pytest.mark.parametrize("bad, problem", [
    (lambda p: p - 2.0 / p.shape[1], "not all finite and non-negative"),  # negative: drew ids past the vocabulary
    (_nan, "not all finite and non-negative"),
    (lambda p: p * 0, "a row that sums to 0"),
    (lambda p: p[:, :-1], "have shape"),
    (lambda p: p.astype(str), "not all finite and non-negative"),
], ids=["negative", "nan", "zero", "shape", "strings"])
def test_draft_probabilities_that_are_no_distribution_switch_the_strategy_off_at_once(target, bad, problem):
    model, tok = target
    got, stats = run(model, tok, lambda ctx: BadProbs(bad), sampler=Sampler(temp=0.8, seed=3))
    assert len(got) == 24 and problem in stats.disabled and stats.drafted == 0


def test_a_strategy_that_cannot_start_is_one_error_line(target, caplog):
    model, _ = target
    with pytest.raises(VkdflashError) as err:
        Speculator(model, "broken", lambda ctx: 1 / 0, StrategyOptions(draft_max=4), SpecStats())
    assert str(err.value) == "strategy broken could not start: start raised ZeroDivisionError: division by zero"
    assert not [r for r in caplog.records if "division by zero" in r.getMessage()]  # said once, as the error


def test_the_stats_line_reports_acceptance_only_for_drafts_made():
    stats = SpecStats(strategy="dflash", draft_max=7)
    assert "drafted 0, so no acceptance to report" in stats.line() and "0.0%" not in stats.line()
    stats.draft_length = {"mode": "cost-aware", "mean_k": 0.0}
    assert stats.line().endswith("mean k 0.0 (--draft-fixed drafts whatever it costs)")
    stats.record(4, 2)
    stats.record(2, 0)
    assert "drafted 6, accepted 2 (33.3%), tau 2.00, per position [0.50 0.50 0.00 0.00]" in stats.line()
    assert "--draft-fixed" not in stats.line()


def test_verifier_greedy_prefix():
    logits = np.zeros((4, 10))
    for row, best in enumerate([3, 5, 7, 9]):
        logits[row, best] = 1.0
    ids = [3, 5, 7, 9]
    assert verify_greedy([3, 5, 7], ids) == (3, 9)
    assert verify_greedy([3, 6, 7], ids) == (1, 5)
    assert verify_greedy([], ids[:1]) == (0, 3)
    # the sampled verifier at T 0 (one-hot distributions) agrees
    assert verify([3, 5, 7], logits, Sampler(temp=0)) == (3, 9)
    assert verify([3, 6, 7], logits, Sampler(temp=0)) == (1, 5)
    assert verify([], logits[:1], Sampler(temp=0)) == (0, 3)


@pytest.mark.parametrize("draft_kind", ["one-hot", "distribution"])
def test_speculative_sampling_reproduces_target_distribution(draft_kind):
    """Chi-square: the first emitted token of a verify step is distributed as the target's p,
    whatever the draft proposed and with what q (small vocabulary, seeded)."""
    r = np.random.default_rng(0)
    vocab, trials = 6, 20000
    logits = r.normal(size=(2, vocab)) * 1.5
    sampler = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    p = sampler.probs(logits[0])
    q = r.dirichlet(np.ones(vocab))
    counts = np.zeros(vocab)
    for _ in range(trials):
        if draft_kind == "one-hot":
            d, probs = 2, None
        else:
            d = int(sampler.rng.choice(vocab, p=q))
            probs = q[None, :]
        n, nxt = verify([d], logits, sampler, probs)
        counts[d if n == 1 else nxt] += 1
    expected = p * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # chi-square, 5 degrees of freedom, p = 0.001
    # and it would fail for a verifier that always accepted the one-hot draft
    assert ((np.eye(vocab)[2] * trials - expected) ** 2 / expected).sum() > 20.5


@pytest.mark.slow
def test_end_to_end_sampling_matches_plain_distribution(target):
    """T > 0: the second generated token's distribution with an always-drafting strategy equals
    plain sampling's (chi-square over the most frequent tokens, seeded)."""
    model, tok = target

    class Fixed(Strategy):
        def propose(self, ctx, last_token, max_n):
            return Proposal([7][:max_n])

    def second_tokens(factory, seed):
        out = []
        for i in range(300):
            got, _ = run(model, tok, factory, n=2, sampler=Sampler(temp=1.5, top_k=0, top_p=1.0, min_p=0.0,
                                                                   seed=seed + i))
            out.append(got[1] if len(got) > 1 else 10 ** 4)  # stopped early (EOS): its own category
        return np.array(out)

    a, b = second_tokens(None, 0), second_tokens(lambda ctx: Fixed(), 10_000)
    top = np.argsort(-np.bincount(np.concatenate([a, b])))[:5]
    ca = np.array([np.sum(a == t) for t in top] + [np.sum(~np.isin(a, top))])
    cb = np.array([np.sum(b == t) for t in top] + [np.sum(~np.isin(b, top))])
    pooled = (ca + cb) / 2
    chi2 = float((((ca - pooled) ** 2 + (cb - pooled) ** 2) / np.maximum(pooled, 1)).sum())
    assert chi2 < 20.5


class AlwaysWrong(Strategy):
    def propose(self, ctx, last_token, max_n):
        return Proposal([(last_token + 1) % 200] * max_n)


def test_the_cost_aware_length_stops_drafting_what_is_never_accepted(target):
    class LinearCosts(DraftController):
        """Verify cost grows with every row (a CPU device), whatever this tiny model measures."""
        def update(self, k, drafted, accepted, verify_seconds, draft_seconds, *part):
            super().update(k, drafted, accepted, 0.01 * (drafted + 1), 0.0, *part)

    model, tok = target
    runs = {}
    for mode in ("fixed", "cost-aware"):
        stats = SpecStats()
        spec = Speculator(model, "wrong", lambda ctx: AlwaysWrong(), StrategyOptions(draft_max=8), stats,
                          LinearCosts(8, {n: 0.01 * n for n in (1, 2, 4, 8, 16)}, fixed=mode == "fixed"))
        got = list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
        assert "".join(got) == "".join(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
        runs[mode] = stats
    assert runs["fixed"].steps >= 20 and runs["fixed"].drafted >= 100 and runs["fixed"].accepted == 0
    assert runs["cost-aware"].drafted <= 2 * 3 and runs["cost-aware"].draft_length["mean_k"] < 0.5
    assert "draft length cost-aware: mean k" in runs["cost-aware"].line()


class Recorded(AlwaysWrong):
    """Never right, while claiming its suite measured a_1 = 0.9 (or nothing)."""

    def __init__(self, expected):
        self.expected_first_acceptance = expected


def test_watchdog_warns_once_when_acceptance_falls_far_below_the_record(target, caplog):
    model, tok = target
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        run(model, tok, lambda ctx: Recorded(0.9), n=60, draft_max=2)
    warned = [r.getMessage() for r in caplog.records if "far below" in r.getMessage()]
    assert len(warned) == 1
    assert "first-draft acceptance 0.00" in warned[0] and "0.90" in warned[0]
    assert "likely cause: prompts unlike its training data" in warned[0] and "K f16, V f16" in warned[0]
    caplog.clear()
    options = StrategyOptions(draft_max=2, cache_type_k="q4_0", rotate=False)
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        spec = Speculator(model, "test", lambda ctx: Recorded(0.9), options, SpecStats())
        list(generate(model, tok, PROMPT, 60, Sampler(temp=0.7, seed=1), (), Stats(), spec))
        spec.close()
    warned = [r.getMessage() for r in caplog.records if "far below" in r.getMessage()]
    assert len(warned) == 1 and "the quantized draft cache (K q4_0, V f16, KV rotation OFF)" in warned[0]
    assert "sampling at T 0.7 (the record is greedy)" in warned[0] and "or prompts unlike" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        run(model, tok, lambda ctx: Recorded(None), n=60, draft_max=2)  # no record: nothing to compare
        run(model, tok, lambda ctx: Recorded(0.9), n=20, draft_max=2)   # too few steps to judge
    assert not [r for r in caplog.records if "far below" in r.getMessage()]


def test_a_strategy_switched_off_against_its_record_says_what_may_be_wrong(target, caplog):
    """The controller drops a draft's record once the run's first drafts contradict it (design.md
    11), often before the watchdog has steps enough to warn: the switch-off line then names the
    causes the watchdog would have, and the log says when and why the record stopped counting."""
    class CheapVerify(DraftController):
        """A pass of 2 rows costs 1.1 of 1 (drafting at a_1 0.9 pays), whatever this model measures."""
        def update(self, k, drafted, accepted, verify_seconds, draft_seconds, *part):
            super().update(k, drafted, accepted, 0.01 + 0.001 * drafted, 0.0001 if k else None, *part)

    model, tok = target
    stats = SpecStats()
    options = StrategyOptions(draft_max=1, cache_type_k="q4_0")
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        spec = Speculator(model, "test", lambda ctx: Recorded(0.9), options, stats,
                          CheapVerify(1, {n: 0.01 + 0.001 * (n - 1) for n in (1, 2, 4)}))
        list(generate(model, tok, PROMPT, 40, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
    dropped = [r.getMessage() for r in caplog.records if "first drafts accepted" in r.getMessage()]
    assert dropped == ["test: 0 of its 3 first drafts accepted, which a draft of its record's a_1 0.90 gets "
                       "under 0.2% of the time: drafts are priced at this run's 0.00 from now on"]
    assert stats.steps < 24 and not [r for r in caplog.records if "far below" in r.getMessage()]
    assert stats.disabled.startswith("none of its 4 drafts") and stats.disabled.endswith(
        "its record's a_1 is 0.90: likely causes: the quantized draft cache (K q4_0, V f16, KV rotation on), "
        "or prompts unlike its training data")


def test_the_model_says_what_a_first_pass_of_a_size_costs_beyond_running_it(target):
    """0 once recorded; recording only where a pass of the same kernels (family: batch width and
    whether every row's logits are kept) exists; else compiling: as the cheapest family compile
    where one of its batch width exists (its matmuls are shared), else the dearest (the
    controller weighs it against what is left to run)."""
    shared, _ = target
    model = Model(shared.ctx, shared.mf, n_ctx=128)
    try:
        assert model.setup_seconds(2, True) == 0.0  # nothing known yet: no estimate
        model.forward([1, 2, 3])
        assert model.setup_seconds(2, True) == model.first_record[model._family(3, False)] > 0
        model.forward([1, 2], all_logits=True)
        assert model.setup_seconds(2, True) == 0.0
        assert model._family(3, True) != model._family(2, True) and model._family(3, True)[0] == model._family(3, False)[0]
        model.first_record[model._family(3, False)] = 5.0  # the costs, set apart
        model.first_record[model._family(2, True)] = 1.0
        assert model.setup_seconds(3, True) == 1.0  # the 3-row family's width was recorded: the cheapest
        assert model.setup_seconds(9, True) == 5.0  # a new width: the dearest
        model.reset()
        # three widths of one family (slot count), past the prompt's
        a = next(n for n in range(4, 64) if len({model._family(n + i, True) for i in range(3)}) == 1)
        model.forward(list(range(a)), all_logits=True)
        model.reset()
        model.forward(list(range(a + 1)), all_logits=True)  # same family: recording only
        assert len(model.graph_seconds) == 1
        # (no order between the two: this shares a context whose kernels other tests compiled)
        assert model.setup_seconds(a + 2, True) == model.graph_seconds[0]
    finally:
        model.close()


def test_a_pass_computes_whole_batch_slots(target):
    """What the controller prices a pass at: matmuls run nj_for(n) rows a slot."""
    from vkdflash.kernels.matmul import nj_for
    model, _ = target
    assert [model.pass_width(n) for n in (1, 2, 4)] == [1, 2, 4]
    for n in range(1, 65):
        nj = nj_for(n, model.matmul_config)
        assert model.pass_width(n) % nj == 0 and model.pass_width(n) - nj < n <= model.pass_width(n), n


class Laborious(Oracle):
    """Always right, but keeping its state costs far more than a verify pass of this tiny model."""

    def commit(self, ctx):
        import time
        time.sleep(0.02)


def test_a_strategy_that_costs_more_than_it_saves_is_switched_off_and_output_stays_the_same(target, caplog):
    from vkdflash.spec.controller import STOP_STEPS
    model, tok = target
    plain, _ = run(model, tok, n=40)
    stats = SpecStats()
    spec = Speculator(model, "laborious", lambda ctx: Laborious(plain), StrategyOptions(draft_max=1), stats,
                      DraftController(1, {n: 0.002 * n for n in (1, 2, 4, 8)}))
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        got = list(generate(model, tok, PROMPT, 40, Sampler(temp=0.0), (), Stats(), spec))
    spec.close()
    assert "".join(got) == "".join(generate(model, tok, PROMPT, 40, Sampler(temp=0.0)))
    # judged once STOP_STEPS passes were timed (a first, compiling pass is not), long before the end
    assert stats.disabled and "costs more than it saves" in stats.disabled and STOP_STEPS - 2 <= stats.steps <= STOP_STEPS + 2
    assert any("switched off" in r.getMessage() for r in caplog.records)


class Asked(Oracle):
    """The oracle, noting every draft length it is asked for."""

    def __init__(self, reference, asked):
        super().__init__(reference)
        self.asked = asked

    def propose(self, ctx, last_token, max_n):
        self.asked.append(max_n)
        return super().propose(ctx, last_token, max_n)


def test_bench_spec_warms_every_length_before_the_measured_run(target):
    """The warm-up asks for 1, 2, .., draft max in turn and records every verify length, so the
    measured run is the steady state: no kernel compiles for the controller to avoid there."""
    from vkdflash import bench
    model, tok = target
    plain, _ = run(model, tok, n=40)
    asked = []

    def make(stats):
        return Speculator(model, "asked", lambda ctx: Asked(plain, asked), StrategyOptions(draft_max=4), stats,
                          DraftController(4, {n: 0.002 * n for n in (1, 2, 4, 8)}))

    report = bench.spec(model, tok, tok.decode(PROMPT), 24, make)
    assert report["identical_output"]
    assert asked[:8] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert all(model.recorded(n, n > 1, greedy=True) for n in range(1, 6))  # as the greedy run passes them
    assert report["spec"]["draft_length"]["held_for_setup"] == 0


class Short(Asked):
    """Drafts at most 3 tokens, as a DFlash draft with blocks of 4 would."""
    longest_draft = 3


def test_draft_max_is_capped_at_what_the_strategy_can_draft(target, caplog):
    model, tok = target
    plain, _ = run(model, tok, n=40)
    asked, stats = [], SpecStats()
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        spec = Speculator(model, "short", lambda ctx: Short(plain, asked), StrategyOptions(draft_max=16), stats,
                          DraftController(16, {n: 0.002 * n for n in (1, 2, 4, 8, 16)}, fixed=True))
        got = list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
    spec.close()
    assert "".join(got) == "".join(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
    assert asked and max(asked) == 3 and stats.draft_max == 3 and len(stats.per_position) == 3
    assert any("draft max 3 (the strategy's longest draft, not --draft-max 16; fixed length" in r.getMessage() for r in caplog.records)


def test_bench_spec_warms_only_the_lengths_a_strategy_drafts(target):
    from vkdflash import bench
    model, tok = target
    plain, _ = run(model, tok, n=40)
    asked = []

    def make(stats):
        return Speculator(model, "short", lambda ctx: Short(plain, asked), StrategyOptions(draft_max=16), stats,
                          DraftController(16, {n: 0.002 * n for n in (1, 2, 4, 8, 16)}))

    report = bench.spec(model, tok, tok.decode(PROMPT), 24, make)
    assert report["identical_output"] and report["spec"]["draft_max"] == 3
    assert asked[:6] == [1, 2, 3, 1, 2, 3] and max(asked) == 3


class Compiling(Oracle):
    """The oracle, but every proposal creates a kernel pipeline (as a draft's first pass of a new
    width compiles one): its timings are not what drafting costs."""

    class Kernel:
        def destroy(self):
            pass

    def propose(self, ctx, last_token, max_n):
        ctx.gpu.pipelines[("test: compiled while proposing", len(ctx.tokens))] = self.Kernel()
        return super().propose(ctx, last_token, max_n)


@pytest.mark.parametrize("strategy, learned", [(Oracle, True), (Compiling, False)])
def test_a_proposal_that_compiled_is_not_learned_as_drafting_cost(target, strategy, learned):
    model, tok = target
    plain, _ = run(model, tok, n=40)
    control = DraftController(3, {n: 0.002 * n for n in (1, 2, 4, 8)}, fixed=True)
    spec = Speculator(model, "t", lambda ctx: strategy(plain), StrategyOptions(draft_max=3), SpecStats(), control)
    try:
        list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
    finally:
        spec.close()
        for key in [k for k in model.ctx.pipelines if k[0] == "test: compiled while proposing"]:
            del model.ctx.pipelines[key]
    assert bool(control.drafts.timed) == learned


def test_a_strategys_first_proposals_of_a_shape_are_not_learned(target):
    """They run cold (the shipped MTP head's: 9.1 and 6.6 ms, then 2.5-2.8): the first
    COLD_PROPOSALS of each (asked, drafted) shape reach the controller untimed, the rest timed."""
    from vkdflash.spec.engine import COLD_PROPOSALS

    class Logged(DraftController):
        def update(self, k, drafted, accepted, verify_seconds, draft_seconds, *part):
            self.log.append(((k, drafted), draft_seconds is not None))
            super().update(k, drafted, accepted, verify_seconds, draft_seconds, *part)

    model, tok = target
    plain, _ = run(model, tok, n=40)
    control = Logged(3, {n: 0.002 * n for n in (1, 2, 4, 8)}, fixed=True)
    control.log = []
    spec = Speculator(model, "t", lambda ctx: Oracle(plain), StrategyOptions(draft_max=3), SpecStats(), control)
    try:
        list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
    finally:
        spec.close()
    seen: dict = {}
    for shape, timed in control.log:
        seen[shape] = seen.get(shape, 0) + 1
        assert timed == (seen[shape] > COLD_PROPOSALS)
    assert max(seen.values()) > COLD_PROPOSALS and any(timed for _, timed in control.log)


@pytest.mark.parametrize("pays", [False, True])
def test_with_no_cached_curve_a_run_measures_it_mid_way_only_where_that_pays(target, pays):
    """A controller with no curve decodes plain until measuring pays; then the curve is timed
    after the request's context (which must survive it: the output stays plain decoding's) and
    the oracle drafts."""
    from vkdflash.spec import curve

    class Judged(DraftController):
        def measuring_pays(self, room, compile_seconds, passes):
            self.asked.append((room, compile_seconds, passes))
            verdict = super().measuring_pays(room, compile_seconds, passes)  # this tiny model's: never
            return bool(self.costs.timed) if pays else verdict

    model, tok = target
    reference, _ = run(model, tok, n=32)
    measured = []
    stats = SpecStats()
    control = Judged(8, None)
    control.asked = []
    spec = Speculator(model, "oracle", lambda ctx: Oracle(reference), StrategyOptions(draft_max=8), stats, control,
                      measure=lambda: measured.append(model.cache.n_past) or curve.measure_here(model))
    got = list(generate(model, tok, PROMPT, 32, Sampler(temp=0.0), (), Stats(), spec))
    spec.close()
    assert "".join(got) == "".join(generate(model, tok, PROMPT, 32, Sampler(temp=0.0)))
    # over as many tokens as the request has generated (the first 1-row pass compiles: no figure)
    assert control.asked[0] == (1, control.asked[0][1], curve.measuring_passes())
    if pays:  # after the prompt and the first generated token
        assert [a[0] for a in control.asked] == [1, 2] and measured == [len(PROMPT) + 1]
        assert control.unmeasured is None and stats.drafted > 0 and stats.accepted == stats.drafted
    else:  # asked again as the tokens generated grow
        horizons = [a[0] for a in control.asked]  # and the tokens left bound them
        assert horizons == [min(e, 31 - e) for e in range(1, 31)] and measured == [] and stats.drafted == 0
        assert "verify cost unmeasured: measuring it (once" in stats.line() and "than 15 tokens" in stats.line()


def test_the_engines_setup_prices_follow_what_the_model_records(target):
    """The engine keeps setup prices between steps (choose() asks for every length), and drops
    them when the model records a graph: what was a compile is then free, and a new width dear."""
    shared, _ = target
    model = Model(shared.ctx, shared.mf, n_ctx=128)
    spec = Speculator(model, "oracle", lambda ctx: Oracle([]), StrategyOptions(draft_max=4), SpecStats())
    try:
        model.forward([1, 2, 3])
        first = spec._setup_seconds(2, True, (), True)
        assert first == model.setup_seconds(2, True, (), True) > 0
        model.forward([1, 2], all_logits=True, greedy=True)
        assert spec._setup_seconds(2, True, (), True) == 0.0
        assert spec._setup_seconds(2, True) == model.setup_seconds(2, True)
    finally:
        spec.close()
        model.close()


@pytest.mark.parametrize("ctype", ["q8_0", "q4_0"])
def test_a_mid_run_measurement_leaves_a_rotated_quantized_cache_as_it_was(target, ctype):
    """The measuring passes write K/V past the request's context (through the one write path,
    rotated and quantized) and are rolled back: greedy output stays plain decoding's."""
    from vkdflash.spec import curve
    shared, tok = target
    model = Model(shared.ctx, shared.mf, n_ctx=128, ctk=ctype, ctv=ctype)
    try:
        assert model.cache.k_rot and model.cache.v_rot
        plain = "".join(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
        measured = []

        class Pays(DraftController):
            def measuring_pays(self, room, compile_seconds, passes):
                return bool(self.costs.timed)
        reference, _ = run(model, tok, n=24)
        spec = Speculator(model, "oracle", lambda ctx: Oracle(reference), StrategyOptions(draft_max=4), SpecStats(),
                          Pays(4, None), measure=lambda: measured.append(1) or curve.measure_here(model))
        got = "".join(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
        assert measured == [1] and got == plain
    finally:
        model.close()


class SlowStart(Oracle):
    """The oracle, whose first proposal compiles (sleeps) for a while."""

    def __init__(self, reference):
        super().__init__(reference)
        self.started = False

    def propose(self, ctx, last_token, max_n):
        if not self.started:
            import time
            time.sleep(0.3)
            self.started = True
        return super().propose(ctx, last_token, max_n)


def test_a_strategys_first_proposal_is_priced_as_the_last_process_measured_it(target, tmp_path, monkeypatch):
    """The shipped MTP head's first proposal compiles its kernels (~0.9 s on lavapipe), which a cold
    default run bought unpriced and lost. Measured once, the next process weighs it as a compile:
    a short run stays plain; where the strategy already proposed on this device context, nothing."""
    from vkdflash.spec import curve
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    monkeypatch.setattr(curve, "_proposed", type(curve._proposed)())
    model, tok = target
    plain, _ = run(model, tok, n=24)
    model.forward(PROMPT[:2], all_logits=True, greedy=True)  # the 2-row pass is recorded: no compile to price

    def drafted() -> int:
        stats = SpecStats()
        spec = Speculator(model, "slow-start", lambda ctx: SlowStart(plain), StrategyOptions(draft_max=1), stats,
                          DraftController(1, {1: 0.002, 2: 0.0021, 4: 0.0022}), costs=curve.StrategyCosts(model, "slow-start"))
        got = list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
        assert got == list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
        return stats.drafted

    assert drafted() > 0  # nothing known: drafts from the first step, and the costs are measured
    assert curve.StrategyCosts(model, "slow-start").first_seconds() == 0.0  # it ran here
    assert 0 < curve.StrategyCosts(model, "slow-start").drafts()[1] < 0.3  # a warm proposal's median
    curve._proposed.clear()  # a new process
    first = curve.StrategyCosts(model, "slow-start").first_seconds()
    assert first >= 0.3 and drafted() == 0  # 0.3 s is more than 23 tokens can save


def test_a_cascade_prices_each_parts_first_proposal_apart(target, tmp_path, monkeypatch):
    """ngram+mtp in a cold process: the head's first proposal compiles its kernels (~2 s on
    lavapipe). Priced as the cascade's, it held the free copy at 0 for a whole run; now the copy
    drafts, the slow part is never asked, and each part's first proposal is recorded under its own name."""
    from vkdflash.spec import curve
    from vkdflash.spec.cascade import Cascade
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    monkeypatch.setattr(curve, "_proposed", type(curve._proposed)())
    model, tok = target
    plain, _ = run(model, tok, n=24)
    model.forward(PROMPT[:2], all_logits=True, greedy=True)  # the 2-row pass is recorded: no compile to price
    slow = []

    def drafted(proposes_first: str) -> SpecStats:
        stats = SpecStats()
        parts = [("copy", lambda ctx: Oracle(plain), {}), ("slow", lambda ctx: slow.append(SlowStart(plain)) or slow[-1], {})]
        if proposes_first == "slow":
            parts.reverse()
        spec = Speculator(model, "cascade", lambda ctx: Cascade(ctx, parts), StrategyOptions(draft_max=1), stats,
                          DraftController(1, {1: 0.002, 2: 0.0021, 4: 0.0022}),
                          costs=curve.StrategyCosts(model, "cascade", parts=("copy", "slow")))
        got = list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
        assert got == list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
        return stats

    drafted("slow")  # the slow part leads: it proposes (0.3 s) and its first proposal is recorded
    assert slow[-1].started and curve.StrategyCosts(model, "slow").first_seconds() == 0.0
    curve._proposed.clear()  # a new process
    assert curve.StrategyCosts(model, "slow").first_seconds() >= 0.3
    assert curve.StrategyCosts(model, "cascade", parts=("copy", "slow")).first_seconds() >= 0.3
    stats = drafted("copy")
    assert stats.drafted > 0 and set(stats.by_source) == {"copy"} and not slow[-1].started


def test_a_cascade_part_switched_off_is_no_longer_priced_or_asked(target, caplog):
    """A part that raised is off for good: the controller prices only the parts still on (a dead
    part's length had kept the step asking the cascade, which asked nobody)."""
    from vkdflash.spec.cascade import Cascade
    model, tok = target
    plain, _ = run(model, tok, n=24)
    model.forward(PROMPT[:2], all_logits=True, greedy=True)

    class RaisesLater(Raises):
        def propose(self, ctx, last_token, max_n):
            if len(ctx.tokens) > len(PROMPT) + 3:
                raise RuntimeError("boom")
            return Proposal([])  # declines, so the oracle after it is asked too

    class Seen(DraftController):
        def choose(self, *args):
            k = super().choose(*args)
            priced.append(set(self.lengths))
            return k

    priced = []
    control = Seen(2, {1: 0.002, 2: 0.0021, 4: 0.0022})
    parts = [("raises", lambda ctx: RaisesLater(), {}), ("oracle", lambda ctx: Oracle(plain), {})]
    spec = Speculator(model, "raises+oracle", lambda ctx: Cascade(ctx, parts), StrategyOptions(draft_max=2),
                      SpecStats(), control)
    got = list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0), (), Stats(), spec))
    live = spec.parts
    spec.close()
    assert got == list(generate(model, tok, PROMPT, 24, Sampler(temp=0.0)))
    assert "its part raises switched off for good" in caplog.text
    steps = [p for p in priced if p]
    assert live == ["oracle"] and steps[0] == {"raises", "oracle"} and steps[-1] == {"oracle"}


@pytest.mark.parametrize("entry, first, drafts", [
    ({"first": "1.2", "draft": {"1": -3, "2": 1e9, "x": 0.01, "3": 0.004, "4": [1]}}, 0.0, {3: 0.004}),
    ({"first": True, "draft": "fast"}, 0.0, {}),
    ([1, 2], 0.0, {}),
    ({"first": 0.9, "draft": {"1": 0.0028}}, 0.9, {1: 0.0028}),
])
def test_a_strategys_cached_costs_are_read_only_where_they_are_seconds(target, tmp_path, monkeypatch, entry, first,
                                                                        drafts):
    """The curve file may have been edited or damaged: what is not a plausible figure is not priced."""
    from vkdflash.spec import curve
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    monkeypatch.setattr(curve, "_proposed", type(curve._proposed)())
    model, _ = target
    (tmp_path / "curves.json").write_text(json.dumps({curve.StrategyCosts(model, "x").key: entry}))
    costs = curve.StrategyCosts(model, "x")  # reads the file as a run begins
    assert costs.first_seconds() == first and costs.drafts() == drafts


@pytest.mark.parametrize("entry, cached", [
    ({"1": 0.02, "2": 0.025}, {1: 0.02, 2: 0.025}),
    ({"1": 0, "2": 0.025}, None),  # a 0 divided the controller's rates by zero
    ({"1": float("nan"), "2": 0.025}, None),
    ({"1": 0.02, "2": -0.5}, None),
    ({"1": 0.02, "x": 0.025}, None),
    ({"2": 0.025}, None),
    ({}, None),
    ([0.02], None),
])
def test_a_cached_verify_curve_is_read_only_where_it_is_seconds(target, tmp_path, monkeypatch, entry, cached):
    """An edited or damaged curve must not price a run (a 0 crashed it): such a curve is measured again."""
    from vkdflash.spec import curve
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    model, _ = target
    (tmp_path / "curves.json").write_text(json.dumps({curve._key(model): entry}))
    assert curve.cached_costs(model) == cached


def test_a_damaged_cost_file_is_kept_aside_not_overwritten(target, tmp_path, monkeypatch, caplog):
    """The file holds every model's and strategy's costs: one that does not parse is moved aside, with
    a warning, before a run stores what it measured."""
    from vkdflash.spec import curve
    file = tmp_path / "curves.json"
    monkeypatch.setenv("VKDFLASH_CURVES", str(file))
    model, _ = target
    file.write_text('{"another model": {"1": 0.02}, "truncated')
    with caplog.at_level("WARNING", logger="vkdflash"):
        curve.remember(model, {1: 0.02})
    assert (tmp_path / "curves.json.damaged").read_text().startswith('{"another model"')
    assert json.loads(file.read_text()) == {curve._key(model): {"1": 0.02}}
    assert "moved to" in caplog.text and not list(tmp_path.glob("*.partial"))


def test_processes_storing_together_keep_every_entry(tmp_path):
    """Each store reads, sets one entry and writes the file: unlocked, six processes of 30 stores
    each had kept 128 of 180 entries."""
    import os
    import subprocess
    import sys
    file = tmp_path / "curves.json"
    script = ("import sys; from vkdflash.measured import store\n"
              "for i in range(25): store(f'{sys.argv[1]} {i}', i, 'a test entry')")
    env = {**os.environ, "VKDFLASH_CURVES": str(file)}
    workers = [subprocess.Popen([sys.executable, "-c", script, str(w)], env=env) for w in range(4)]
    assert [w.wait(timeout=120) for w in workers] == [0] * 4
    assert len(json.loads(file.read_text())) == 100 and not list(tmp_path.glob("*.partial"))


def test_a_strategys_costs_are_kept_per_draft_file(target, tmp_path):
    """A -md draft of another size costs another amount: its file names the entry, as the model's does."""
    from vkdflash.spec import curve
    model, _ = target
    draft = tmp_path / "head.gguf"
    draft.write_bytes(b"x" * 10)
    own, first = curve.StrategyCosts(model, "mtp").key, curve.StrategyCosts(model, "mtp", str(draft)).key
    draft.write_bytes(b"x" * 20)
    assert len({own, first, curve.StrategyCosts(model, "mtp", str(draft)).key}) == 3


def test_a_fixed_length_run_prices_its_strategy_for_the_next_run(target, tmp_path, monkeypatch):
    """--draft-fixed times the same proposals as the controller: a user who measures acceptance that
    way first must not leave the next cost-aware run pricing a stale first proposal."""
    from vkdflash.cli_spec import SpecRequest, build_speculator
    from vkdflash.spec import curve
    from vkdflash.spec.engine import COLD_PROPOSALS
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    monkeypatch.setattr(curve, "_proposed", type(curve._proposed)())
    model, tok = target
    request = SpecRequest("ngram", None, 2, 0.0, "f16", "f16", (), draft_fixed=True)
    stats = SpecStats()
    spec = build_speculator(model, request, "ngram", True, stats)
    assert spec.control.fixed
    list(generate(model, tok, PROMPT * 3, 24, Sampler(temp=0.0), (), Stats(), spec))
    spec.close()
    assert stats.steps > COLD_PROPOSALS + 3 and stats.drafted > 0
    curve._proposed.clear()  # a new process
    priced = curve.StrategyCosts(model, "ngram")
    assert priced.first_seconds() > 0 and set(priced.drafts()) == {2}


class Sometimes(Oracle):
    """Drafts the target's continuation on every third step it is asked, nothing on the others (a
    lookup that finds a match now and then)."""

    def __init__(self, reference: list):
        super().__init__(reference)
        self.asked = 0

    def propose(self, ctx, last_token, max_n):
        self.asked += 1
        return super().propose(ctx, last_token, max_n) if self.asked % 3 == 0 else Proposal([])


class FreeSometimes(Sometimes):
    """Sometimes, declared free: the engine asks it before choosing k."""
    free_proposals = True

    def __init__(self, reference: list):
        super().__init__(reference)
        self.max_ns = []

    def propose(self, ctx, last_token, max_n):
        self.max_ns.append(max_n)
        return super().propose(ctx, last_token, max_n)


def test_a_free_strategy_is_asked_for_its_longest_draft_before_k_is_chosen(target):
    """Once a step, for as many drafts as the step may take; the controller chooses k with that
    draft in hand (none: a plain step) and the step verifies its first k. Output stays plain's."""
    model, tok = target
    reference, _ = run(model, tok, n=40)
    for rows in range(2, 6):  # the verify widths compiled: no compile holds the choice
        model.forward(PROMPT[:rows], all_logits=True, greedy=True)

    class Seen(DraftController):
        def choose(self, room, setup=None, done=None, firsts=None, in_hand=None):
            k = super().choose(room, setup, done, firsts, in_hand)
            choices.append((room, in_hand, k))
            return k

    choices, stats, strategy = [], SpecStats(), FreeSometimes(reference)
    control = Seen(4, {1: 0.002, 2: 0.0021, 4: 0.0022, 8: 0.0023})  # verify nearly free: drafts pay
    spec = Speculator(model, "free", lambda ctx: strategy, StrategyOptions(draft_max=4), stats, control)
    gen_stats = Stats()
    list(generate(model, tok, PROMPT, 40, Sampler(temp=0.0), (), gen_stats, spec))
    spec.close()
    assert gen_stats.tokens == reference
    asked = [(room, in_hand, k) for room, in_hand, k in choices if room > 0]
    assert strategy.max_ns == [min(4, room) for room, _, _ in asked]
    assert all(0 <= k <= in_hand for _, in_hand, k in asked)
    assert any(k for *_, k in asked) and any(in_hand == 0 for _, in_hand, _ in asked)
    assert stats.drafted == sum(k for *_, k in asked) and stats.accepted == stats.drafted


def test_the_engine_tells_the_controller_how_often_a_strategy_proposes_when_asked(target):
    """Its drafts are priced by that share (controller.rates); output stays plain decoding's."""
    model, tok = target
    reference, _ = run(model, tok, n=40)
    stats = SpecStats()
    spec = Speculator(model, "sometimes", lambda ctx: Sometimes(reference), StrategyOptions(draft_max=4), stats)
    spec.control.fixed = True  # asked every step, whatever this tiny model's passes cost
    gen_stats = Stats()
    list(generate(model, tok, PROMPT, 40, Sampler(temp=0.0), (), gen_stats, spec))
    offered = spec.control.acceptance.offered()
    spec.close()
    assert gen_stats.tokens == reference
    assert stats.steps > stats.drafted / 4 and 0.2 < offered < 0.5
