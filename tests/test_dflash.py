"""DFlash: the llama.cpp-format draft loader, the GPU proposer against the numpy pipeline (quantized
draft caches included, with a control that reproduces llama.cpp issue 25725), and greedy
generation with --spec dflash identical to --spec none."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dflash_fixtures import copy_last_values, write_dflash
from gguf_fixtures import DROP, write_model
from gguf import GGUFValueType as VT
from vkdflash.conformance import nmse
from vkdflash.errors import VkdflashError
from vkdflash.generate import Stats, generate, plain_tokens
from vkdflash.hookspecs import hookimpl
from vkdflash.model import load_model
from vkdflash.model.forward import Model
from vkdflash.plugins import manager, strategies
from vkdflash.ref.dflash import RefDFlash
from vkdflash.spec.drafts import top1_probability
from vkdflash.ref.model import RefModel, RefWeights
from vkdflash.sampling import Sampler
from vkdflash.spec import SpecStats, StrategyContext, StrategyOptions
from vkdflash.spec.engine import Speculator, target_view
from vkdflash.spec.vocab import DRAFT_VOCAB, VOCAB
from vkdflash.tokenizer import Tokenizer
from vkdflash_dflash import factory
from vkdflash_dflash.draft_file import load_draft

PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30, 7]
# a fixed committed continuation, and how many drafts each step "accepts" (0..3)
SEQUENCE = [19, 4, 100, 200, 33, 12, 9, 50, 60, 70, 80, 90, 91, 92, 93, 94, 95]
ACCEPTS = [0, 2, 1, 3, 0, 1]
NMSE_DRAFT = 1e-6  # GPU drafter vs numpy drafter logits (measured ~1e-13, 2e-9 with a quant-step flip)
CACHE_TYPES = ["f16", "q8_0", "q4_0", "iq4_nl"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash")
    # head_dim 64: the smallest the rotation applies to
    target = write_model(d / "target.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64,
                         seed=3)
    return {"dir": d, "target": target, "draft": write_dflash(d / "draft.gguf", target)}


@pytest.fixture(scope="module")
def target(files):
    return load_model(files["target"])


@pytest.fixture(scope="module")
def ref_weights(target):
    return RefWeights(target)


def strategy_ctx(ctx, model, draft, **options):
    return StrategyContext(gpu=ctx, target=target_view(model),
                           options=StrategyOptions(draft_model=str(draft), **options))


# -- plugin and loader -----------------------------------------------------------------------------

def test_registered_through_the_entry_point():
    found = strategies()
    assert "dflash" in found
    assert found["dflash"].factory is factory and found["dflash"].plugin == "dflash"


def test_loader_reads_llama_cpp_keys(files, target):
    d = load_draft(files["draft"], target.hparams)
    hp = d.hp
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (2, 128, 2, 1, 64, 256)
    assert hp.block_size == 16 and hp.target_layers == (1, 2) and hp.mask_token_id == 0
    assert hp.n_features == 256 and not hp.own_embd and not hp.own_output
    assert hp.rms_eps == pytest.approx(1e-6) and hp.rope_base == 1e6
    d.close()


def test_block_size_defaults_to_16(files, target):
    path = write_dflash(files["dir"] / "nobs.gguf", files["target"], metadata={"dflash.block_size": DROP})
    assert load_draft(path, target.hparams).hp.block_size == 16


REJECT = {
    "hidden size": (dict(n_embd=64), "draft hidden size 64 does not match the target's 128"),
    "mask id": (dict(mask_token_id=5000), "mask token id 5000 is outside the target vocabulary"),
    "own embedding rows": (dict(own_embd=True, n_vocab=200), "draft token_embd.weight has 200 rows"),
    "own output rows": (dict(own_output=True, n_vocab=300), "draft output.weight has 300 rows"),
    "target layer": (dict(target_layers=(1, 3)), "target layer 3 does not exist"),
    "negative target layer": (dict(target_layers=(-1, 2)), "dflash.target_layers holds -1, out of range (0..1024)"),
    "no target_layers": (dict(metadata={"dflash.target_layers": DROP}), "missing metadata key dflash.target_layers"),
    "float target_layers": (dict(metadata={"dflash.target_layers": ([1.0, 2.0], VT.ARRAY, VT.FLOAT32)}),
                            "dflash.target_layers should be an array of integers, found an array of FLOAT32"),
    "no mask id": (dict(metadata={"tokenizer.ggml.mask_token_id": DROP}),
                   "missing metadata key tokenizer.ggml.mask_token_id"),
    "no block_count": (dict(metadata={"dflash.block_count": DROP}), "missing metadata key dflash.block_count"),
    "rope scaling": (dict(metadata={"dflash.rope.scaling.factor": (4.0, VT.FLOAT32)}),
                     "dflash.rope.scaling.factor = 4: linear rope scaling"),
    "no eps": (dict(metadata={"dflash.attention.layer_norm_rms_epsilon": DROP}),
               "missing metadata key dflash.attention.layer_norm_rms_epsilon"),
    "architecture": (dict(metadata={"general.architecture": ("llama", VT.STRING)}), "a DFlash draft has 'dflash'"),
    "missing tensor": (dict(drop_tensors=("blk.1.attn_k_norm.weight",)), "missing tensor blk.1.attn_k_norm.weight"),
    "missing fc": (dict(drop_tensors=("fc.weight",)), "missing tensor fc.weight"),
    "wrong shape": (dict(shapes={"blk.0.attn_q.weight": (128, 64)}), "tensor blk.0.attn_q.weight has shape [128, 64]"),
    "wrong fc shape": (dict(shapes={"fc.weight": (384, 128)}), "tensor fc.weight has shape [384, 128]"),
}


@pytest.mark.parametrize("case", list(REJECT))
def test_loader_rejects_with_one_line(files, target, case):
    kwargs, message = REJECT[case]
    path = write_dflash(files["dir"] / f"bad-{case.replace(' ', '_')}.gguf", files["target"], **kwargs)
    with pytest.raises(VkdflashError) as exc:
        load_draft(path, target.hparams)
    text = str(exc.value)
    assert message in text and str(path) in text and "\n" not in text


def test_factory_needs_a_draft_model(ctx0, target):
    m = Model(ctx0, target, n_ctx=32)
    ctx = StrategyContext(gpu=ctx0, target=target_view(m), options=StrategyOptions())
    with pytest.raises(VkdflashError, match=r"^dflash needs a draft model: -md FILE$"):
        factory(ctx)
    m.close()


# -- the GPU proposer against the numpy pipeline ---------------------------------------------------

def drive(ctx0, target, ref_weights, draft_path, ctype, max_n=8, p_min=0.0, steps=ACCEPTS):
    """Run the GPU strategy and numpy pipelines (correct and, for quantized caches, the llama.cpp
    bug) over propose/commit cycles on the same target features. Yields per step
    (gpu tokens, gpu logits, ref tokens, ref logits, bug tokens, bug logits)."""
    model = Model(ctx0, target, n_ctx=64)
    sctx = strategy_ctx(ctx0, model, draft_path, draft_max=max_n, p_min=p_min, cache_type_k=ctype,
                        cache_type_v=ctype)
    s = factory(sctx)
    draft = load_draft(draft_path, target.hparams)
    ref = RefDFlash(draft, ref_weights, ctype, ctype)
    bug = RefDFlash(draft, ref_weights, ctype, ctype, inject_rotated=False)
    tgt = RefModel(ref_weights, n_ctx=64)
    layers = draft.hp.target_layers
    out = tgt.forward(PROMPT, capture_layers=layers)
    sctx.tokens, sctx.new_start, sctx.new_hidden = list(PROMPT), 0, out.hidden
    s.begin(sctx)
    for r in (ref, bug):
        r.inject(0, r.features(out.hidden))
    seq = iter(SEQUENCE)
    last = next(seq)
    try:
        for accept in steps:
            prop = s.propose(sctx, last, max_n)
            n = min(max_n, draft.hp.block_size - 1)
            got = s.logits.read(np.float32, n * s.n_out).reshape(n, -1)
            want, bad = ref.draft(last, max_n, p_min), bug.draft(last, max_n, p_min)
            yield prop.tokens, got, want[0], want[1], bad[0], bad[1]
            commit = [last] + list(itertools.islice(seq, accept))
            out = tgt.forward(commit, capture_layers=layers)
            sctx.new_start, sctx.tokens, sctx.new_hidden = len(sctx.tokens), sctx.tokens + commit, out.hidden
            s.commit(sctx)
            for r in (ref, bug):
                r.inject(sctx.new_start, r.features(out.hidden))
            last = next(seq)
    finally:
        s.close()
        sctx.close()
        model.close()
        draft.close()


@pytest.mark.parametrize("ctype", CACHE_TYPES)
def test_drafts_match_numpy_pipeline_that_rotates_at_injection(ctx0, target, ref_weights, files, ctype):
    """THE DFlash test: with a quantized draft cache the GPU drafter's tokens equal the numpy
    pipeline's, which rotates injected K/V like every other write. A numpy pipeline that stores
    the injected K/V unrotated (llama.cpp issue 25725) drafts something else: the test can fail."""
    quantized = ctype != "f16"
    errs, bug_errs, bug_differs = [], [], False
    for tokens, got, want_tokens, want, bug_tokens, bug in drive(ctx0, target, ref_weights, files["draft"], ctype,
                                                                 max_n=15):  # a full block of 16 rows
        assert tokens == want_tokens
        errs.append(nmse(got, want))
        bug_errs.append(nmse(got, bug))
        bug_differs |= bug_tokens != tokens
    print(f"\n{ctype} draft cache: logits NMSE vs numpy max {max(errs):.1e}, vs unrotated injection "
          f"min {min(bug_errs):.1e}")
    assert max(errs) <= NMSE_DRAFT
    if quantized:
        assert min(bug_errs) > 1e4 * max(errs) and min(bug_errs) > 0.1
        assert bug_differs
    else:  # nothing is rotated in an f16 cache: the bug has nothing to break
        assert bug_errs == errs


def test_draft_cache_uses_draft_types_and_rotation(ctx0, target, files):
    m = Model(ctx0, target, n_ctx=32)
    sctx = strategy_ctx(ctx0, m, files["draft"], cache_type_k="q8_0", cache_type_v="q4_0")
    s = factory(sctx)
    info = s.kv.info
    assert (info.k_type, info.v_type, info.k_rotation, info.v_rotation) == ("q8_0", "q4_0", 64, 64)
    assert (info.n_layer, info.n_head_kv, info.head_dim, info.n_ctx) == (2, 1, 64, 32)
    s.close()
    sctx.close()
    m.close()


class WriteObserver:
    """A plugin wrapping the core cache-write hook: it sees every write, and cannot skip it."""

    def __init__(self):
        self.writes = []

    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        self.writes.append((cache.name, layer, n_rows, cache.k_rotation, cache.v_rotation))
        return (yield)


def test_every_draft_cache_write_goes_through_the_core_hook(ctx0, target, files):
    observer = WriteObserver()
    manager().register(observer, name="dflash-test-observer")
    try:
        m = Model(ctx0, target, n_ctx=32)
        sctx = strategy_ctx(ctx0, m, files["draft"], cache_type_k="q4_0", cache_type_v="iq4_nl")
        s = factory(sctx)
        out = m.forward(PROMPT, capture=s.capture_layers)
        sctx.tokens, sctx.new_hidden = list(PROMPT), out.hidden
        s.begin(sctx)                       # 10 positions, injected when a proposal needs them
        s.propose(sctx, 1, 4)               # inject them 5 rows a pass (the block's width), then the block
        out = m.forward([1, 2], capture=s.capture_layers)
        sctx.new_start, sctx.tokens, sctx.new_hidden = 10, sctx.tokens + [1, 2], out.hidden
        s.commit(sctx)                      # 2 positions
        s.propose(sctx, 3, 4)               # inject 7..11 (5 rows again), then the block
        s.close()
        sctx.close()
        m.close()
    finally:
        manager().unregister(name="dflash-test-observer")
    draft = [w for w in observer.writes if w[0] == "dflash draft"]
    # each graph's writes, as it is recorded (replays of the 5-row graphs record nothing)
    assert [(layer, n) for _, layer, n, _, _ in draft] == [(0, 5), (1, 5), (0, 5), (1, 5)]
    assert all(w[3:] == (64, 64) for w in draft)


def test_p_min_stops_drafting_early(ctx0, target, ref_weights, files):
    """llama.cpp's rule: top-1 of a top-k 10 distribution; stop before the first draft below p-min."""
    draft = load_draft(files["draft"], target.hparams)
    probe = RefDFlash(draft, ref_weights)
    tgt = RefModel(ref_weights, n_ctx=64)
    probe.inject(0, probe.features(tgt.forward(PROMPT, capture_layers=draft.hp.target_layers).hidden))
    p = top1_probability(probe.draft(SEQUENCE[0], 8)[1])
    p_min = float(np.sort(p)[len(p) // 2])  # some drafts fall below it
    draft.close()
    cut = False
    for tokens, _, want_tokens, want, _, _ in drive(ctx0, target, ref_weights, files["draft"], "q8_0",
                                                    p_min=p_min, steps=ACCEPTS[:3]):
        assert tokens == want_tokens
        keep = int(np.argmax(np.append(top1_probability(want) < p_min, True)))
        assert len(tokens) == keep
        cut |= keep < 8
    assert cut


def test_own_embedding_and_lm_head(ctx0, target, ref_weights, files):
    path = write_dflash(files["dir"] / "own.gguf", files["target"], n_layer=1, own_embd=True, own_output=True,
                        target_layers=(0, 1, 2), seed=7)
    d = load_draft(path, target.hparams)
    assert d.hp.own_embd and d.hp.own_output and d.hp.n_features == 384
    d.close()
    for tokens, got, want_tokens, want, _, _ in drive(ctx0, target, ref_weights, path, "q4_0", steps=ACCEPTS[:3]):
        assert tokens == want_tokens and nmse(got, want) <= NMSE_DRAFT


def test_draft_length_clamped_to_block_size(ctx0, target, ref_weights, files):
    path = write_dflash(files["dir"] / "bs4.gguf", files["target"], block_size=4)
    steps = list(drive(ctx0, target, ref_weights, path, "q8_0", max_n=15, steps=ACCEPTS[:2]))
    for tokens, got, want_tokens, *_ in steps:
        assert len(tokens) == 3 and tokens == want_tokens and got.shape[0] == 3


def begun_beside_numpy(ctx0, target, ref_weights, path, draft_max: int):
    """The GPU strategy and the numpy pipeline, both begun on PROMPT: (model, sctx, s, draft, ref, tgt)."""
    model = Model(ctx0, target, n_ctx=64)
    sctx = strategy_ctx(ctx0, model, path, draft_max=draft_max)
    s = factory(sctx)
    draft = load_draft(path, target.hparams)
    ref, tgt = RefDFlash(draft, ref_weights), RefModel(ref_weights, n_ctx=64)
    out = tgt.forward(PROMPT, capture_layers=draft.hp.target_layers)
    sctx.tokens, sctx.new_start, sctx.new_hidden = list(PROMPT), 0, out.hidden
    s.begin(sctx)
    ref.inject(0, ref.features(out.hidden))
    return model, sctx, s, draft, ref, tgt


def committed_beside_numpy(sctx, s, draft, ref, tgt, last: int) -> None:
    """`last` committed: the target's features for it handed to both."""
    out = tgt.forward([last], capture_layers=draft.hp.target_layers)
    sctx.new_start, sctx.tokens, sctx.new_hidden = len(sctx.tokens), sctx.tokens + [last], out.hidden
    s.commit(sctx)
    ref.inject(sctx.new_start, ref.features(out.hidden))


def test_held_positions_are_injected_no_wider_than_a_block(ctx0, target, ref_weights, files, monkeypatch):
    """Positions held while idle pile up in any number; an injection pass of that many rows
    compiled the draft's matmul kernels for its batch-width family (lavapipe: ~0.6 s each). They
    go a block's rows at a time, the widths a drafting step's commits use, and the proposal stays
    the numpy pipeline's."""
    import vkdflash_dflash.strategy as strategy
    widths, real = [], strategy.matmul
    monkeypatch.setattr(strategy, "matmul", lambda g, w, x, y, n, **kw: widths.append(n) or real(g, w, x, y, n, **kw))
    path = write_dflash(files["dir"] / "bs4-held.gguf", files["target"], block_size=4)
    model, sctx, s, draft, ref, tgt = begun_beside_numpy(ctx0, target, ref_weights, path, 3)
    for last in SEQUENCE[:4]:  # idle steps: 14 positions held
        committed_beside_numpy(sctx, s, draft, ref, tgt, last)
    assert sum(len(f) for _, f in s.pending) == 14
    assert s.propose(sctx, 50, 3).tokens == ref.draft(50, 3, 0.0)[0]
    assert widths and max(widths) <= 4, sorted(set(widths))
    s.close()
    sctx.close()
    model.close()
    draft.close()


def test_commits_go_in_widths_the_draft_runs_with_the_same_bits(ctx0, target, ref_weights, files):
    """A drafting step commits 1..k+1 positions, and an injection pass of a new width compiled the
    draft's matmul kernels for its family (lavapipe: ~0.3 s each, two or three a family; 1.1 s of a
    48-token run at k 1). Commits go in the widths the draft's blocks run, a remainder widened
    backwards over positions injected before; a draft that also runs 1-row passes injects each
    1-row commit as it is. Every proposal's logits are the same bits, with a quantized draft cache."""
    path = write_dflash(files["dir"] / "bs4-widths.gguf", files["target"], block_size=4)
    model = Model(ctx0, target, n_ctx=64)
    drafts = []
    for narrow in (False, True):
        sctx = strategy_ctx(ctx0, model, path, draft_max=3, cache_type_k="q4_0", cache_type_v="q4_0")
        s = factory(sctx)
        if narrow:
            s.widths.add(1)
        drafts.append((sctx, s))
    tgt, layers = RefModel(ref_weights, n_ctx=64), drafts[0][1].capture_layers
    hidden = tgt.forward(PROMPT + SEQUENCE[:9], capture_layers=layers).hidden
    for sctx, s in drafts:
        sctx.tokens, sctx.new_start, sctx.new_hidden = list(PROMPT), 0, {i: h[:10] for i, h in hidden.items()}
        s.begin(sctx)
    logits = [[], []]
    at = len(PROMPT)
    for step, n in enumerate([1, 2, 1, 1, 3, 1]):  # positions committed after each proposal of 1 draft
        for (sctx, s), out in zip(drafts, logits):
            s.propose(sctx, SEQUENCE[step], 1)
            out.append(s.logits.read(np.float32, s.n_out).copy())
            sctx.new_start, sctx.tokens = at, sctx.tokens + SEQUENCE[at - 10:at - 10 + n]
            sctx.new_hidden = {i: h[at:at + n] for i, h in hidden.items()}
            s.commit(sctx)
        at += n
    for (sctx, s), out in zip(drafts, logits):
        s.propose(sctx, 7, 1)
        out.append(s.logits.read(np.float32, s.n_out).copy())
    widened, narrow = (sorted(n for kind, n in s.store.graphs if kind == "inject") for _, s in drafts)
    assert widened == [2] and narrow == [1, 2]
    assert all(np.array_equal(a, b) for a, b in zip(*logits)) and len(logits[0]) == 7
    for sctx, s in drafts:
        s.close()
        sctx.close()
    model.close()


def test_propose_refuses_a_context_it_has_not_seen(ctx0, target, files):
    m = Model(ctx0, target, n_ctx=32)
    sctx = strategy_ctx(ctx0, m, files["draft"])
    s = factory(sctx)
    out = m.forward(PROMPT, capture=s.capture_layers)
    sctx.tokens, sctx.new_hidden = list(PROMPT), out.hidden
    s.begin(sctx)
    sctx.tokens = sctx.tokens + [1]  # committed without telling the strategy
    with pytest.raises(VkdflashError, match="drafts at position 11 but holds context for 10"):
        s.propose(sctx, 1, 4)
    assert s.propose(sctx, 1, 0).tokens == []
    s.close()
    sctx.close()
    m.close()


# -- through the engine ---------------------------------------------------------------------------

def generate_ids(model, prompt, n, speculator=None):
    sampler = Sampler(temp=0.0)
    source = (speculator.tokens(prompt, sampler, n, Stats()) if speculator is not None
              else plain_tokens(model, prompt, sampler, Stats()))
    ids = list(itertools.islice(source, n))
    source.close()
    return ids


@pytest.mark.parametrize("ctype", CACHE_TYPES)
def test_greedy_generation_identical_to_no_speculation(ctx0, target, files, ctype):
    n = 24
    model = Model(ctx0, target, n_ctx=128)
    plain = generate_ids(model, PROMPT, n)
    for draft_max in range(1, 16):
        stats = SpecStats()
        options = StrategyOptions(draft_model=str(files["draft"]), draft_max=draft_max, cache_type_k=ctype,
                                  cache_type_v=ctype)
        spec = Speculator(model, "dflash", factory, options, stats)
        assert spec.strategy is not None, stats.disabled
        got = generate_ids(model, PROMPT, n, spec)
        spec.close()
        assert got == plain, f"draft max {draft_max}"
        assert stats.disabled == "" and stats.drafted > 0
        assert len(stats.per_position) <= draft_max
    model.close()


def test_accepted_drafts_commit_several_positions(ctx0, files):
    """A tied random target mostly repeats its last token; a draft built to repeat it too gets
    most drafts accepted and some rejected, so the engine commits several positions per step and
    rolls back: greedy output must still be that of plain decoding."""
    d = files["dir"]
    tied = load_model(write_model(d / "tied.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1,
                                  head_dim=64, seed=3, tied=True))
    n_vocab = tied.hparams.n_vocab
    draft = write_dflash(d / "copy.gguf", d / "tied.gguf", n_layer=1, own_embd=True, own_output=True,
                         values=copy_last_values(n_vocab))
    model = Model(ctx0, tied, n_ctx=160)
    n = 96
    plain = generate_ids(model, PROMPT, n)
    for ctype, draft_max in (("q8_0", 15), ("iq4_nl", 6)):
        stats = SpecStats()
        options = StrategyOptions(draft_model=str(draft), draft_max=draft_max, cache_type_k=ctype,
                                  cache_type_v=ctype)
        spec = Speculator(model, "dflash", factory, options, stats)
        got = generate_ids(model, PROMPT, n, spec)
        spec.close()
        print(f"\ncopy draft vs tied target, {ctype}, draft max {draft_max}: {stats.line()}")
        assert got == plain and stats.disabled == ""
        assert 0.5 < stats.acceptance_rate < 1.0 and stats.tau > 3
    model.close()


def test_sampling_dflash_draws_from_its_distributions_and_hands_them_over(ctx0, target, files, monkeypatch):
    """At T > 0 every block row is drawn from softmax(logits / T) with the request's seed, and
    that q goes to the verifier (speculative sampling then accepts min(1, p/q), not just p(d))."""
    from vkdflash.spec.drafts import draft_distribution
    from vkdflash_dflash.strategy import DFlash
    seen, orig = [], DFlash.propose

    def spy(self, ctx, last, max_n):
        prop = orig(self, ctx, last, max_n)
        n = min(max_n, self.hp.block_size - 1)
        seen.append((prop, self.logits.read(np.float32, n * self.n_vocab).reshape(n, -1), ctx.temperature))
        return prop

    monkeypatch.setattr(DFlash, "propose", spy)
    model = Model(ctx0, target, n_ctx=128)
    stats = SpecStats()
    spec = Speculator(model, "dflash", factory, StrategyOptions(draft_model=str(files["draft"]), draft_max=4), stats)
    tok = Tokenizer(target.metadata)
    list(generate(model, tok, PROMPT, 24, Sampler(temp=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=5), (), Stats(),
                  spec))
    spec.close()
    model.close()
    assert seen and not stats.disabled
    off_argmax = 0
    for prop, logits, temp in seen:
        assert temp == 2.0 and prop.probs is not None and prop.probs.shape == (len(prop.tokens), logits.shape[1])
        np.testing.assert_allclose(prop.probs, draft_distribution(logits[:len(prop.tokens)], 2.0), rtol=1e-12)
        off_argmax += sum(t != int(np.argmax(row)) for t, row in zip(prop.tokens, logits))
    assert off_argmax > 0  # sampled, not greedy: a random draft at T 2 is rarely sure of anything


def test_one_speculator_serves_request_after_request(ctx0, target, files):
    """The suite and a server reuse a speculator: each request starts from nothing committed
    (a second request once found the first one's tokens and switched the strategy off)."""
    model = Model(ctx0, target, n_ctx=128)
    stats = SpecStats()
    spec = Speculator(model, "dflash", factory, StrategyOptions(draft_model=str(files["draft"]), draft_max=4), stats)
    for prompt in (PROMPT, PROMPT[:5], PROMPT[3:]):
        assert generate_ids(model, prompt, 12, spec) == generate_ids(model, prompt, 12)
        assert stats.disabled == ""
    spec.close()
    model.close()


def test_a_draft_vocabulary_narrows_the_lm_head_to_the_same_drafts(ctx0, target, ref_weights, files):
    """A draft listing all tokens but one the drafts never pick (in another order): its LM head
    holds those rows only, each listed token's logit has the bits of the whole head's, and the
    drafts are the whole head's; the vocab setting 0 keeps the whole head."""
    full = list(drive(ctx0, target, ref_weights, files["draft"], "f16", steps=ACCEPTS[:3]))
    n_vocab = target.hparams.n_vocab
    unused = min(set(range(n_vocab)) - {t for step in full for t in step[0]})
    listed = np.random.default_rng(0).permutation([t for t in range(n_vocab) if t != unused]).tolist()
    path = write_dflash(files["dir"] / "vocab.gguf", files["target"],
                        metadata={DRAFT_VOCAB: (listed, VT.ARRAY, VT.UINT32)})
    narrow = list(drive(ctx0, target, ref_weights, path, "f16", steps=ACCEPTS[:3]))
    for (tokens, logits, want, *_), (n_tokens, n_logits, *_) in zip(full, narrow):
        assert n_tokens == tokens == want
        assert n_logits.shape[1] == n_vocab - 1
        assert np.array_equal(n_logits, logits[:, listed])
    model = Model(ctx0, target, n_ctx=64)
    sctx = strategy_ctx(ctx0, model, path)
    sctx.options.settings = {VOCAB.key: 0}
    s = factory(sctx)
    assert s.vocab is None and s.n_out == n_vocab
    s.close()
    sctx.close()
    model.close()


@pytest.mark.parametrize("inject_rows,idle_hold", [(64, 1024), (3, 12)])
def test_positions_committed_while_idle_are_injected_before_the_next_proposal(ctx0, target, ref_weights, files,
                                                                              monkeypatch, inject_rows, idle_hold):
    """While the controller idles at k 0 the draft injects nothing; what was committed meanwhile
    (at most INJECT_ROWS held back, or IDLE_HOLD before the request's first proposal) is injected
    before the next proposal, which then equals the numpy pipeline's, injected step by step."""
    import vkdflash_dflash.strategy as strategy
    monkeypatch.setattr(strategy, "INJECT_ROWS", inject_rows)
    monkeypatch.setattr(strategy, "IDLE_HOLD", idle_hold)
    model, sctx, s, draft, ref, tgt = begun_beside_numpy(ctx0, target, ref_weights, files["draft"], 4)
    proposals = 0
    for step, last in enumerate(SEQUENCE[:12]):
        if step % 5 == 4:  # a proposal after 4 idle steps
            assert s.propose(sctx, last, 4).tokens == ref.draft(last, 4, 0.0)[0]
            proposals += 1
        held = sum(len(f) for _, f in s.pending)
        assert held < (inject_rows if proposals else idle_hold)
        if not proposals and len(sctx.tokens) < idle_hold:
            assert held == len(sctx.tokens)  # nothing injected before the first proposal
        committed_beside_numpy(sctx, s, draft, ref, tgt, last)
    assert proposals == 2 and s.propose(sctx, 50, 4).tokens == ref.draft(50, 4, 0.0)[0]
    s.close()
    sctx.close()
    model.close()
    draft.close()
