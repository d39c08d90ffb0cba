"""The mtp strategy: next-n heads load (in the target or a sidecar) or fail in one line, GPU drafts
equal the numpy reference's for every draft cache type, and greedy generation with --spec mtp is
identical to plain greedy generation."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT

import mtp_fixtures as M
from gguf_fixtures import DROP
from vkdflash.conformance import nmse
from vkdflash.errors import VkdflashError
from vkdflash.generate import Stats, generate
from vkdflash.model import expected_tensors, load_model
from vkdflash.model.forward import Model
from vkdflash.plugins import strategies
from vkdflash.spec.cascade import lookup
from vkdflash.ref.model import RefModel, RefWeights
from vkdflash.ref.mtp import RefMTP
from vkdflash.sampling import Sampler
from vkdflash.spec import SpecStats, StrategyContext, StrategyOptions
from vkdflash.spec import engine
from vkdflash.spec.engine import Speculator
from vkdflash.spec.vocab import DRAFT_VOCAB, VOCAB
from vkdflash.tokenizer import Tokenizer
from vkdflash_mtp import MTP, NO_HEADS

PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30, 7, 19, 4]
CACHE_TYPES = ["f16", "q8_0", "q4_0", "iq4_nl"]


def view_with_file(model):
    """The engine's TargetView plus the target's ModelFile, where in-target heads are read from."""
    view = ORIGINAL_TARGET_VIEW(model)
    view.model_file = model.mf
    return view


ORIGINAL_TARGET_VIEW = engine.target_view


@pytest.fixture
def with_file(monkeypatch):
    monkeypatch.setattr(engine, "target_view", view_with_file)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {"plain": M.write_target(d / "plain.gguf", n_nextn=0), "heads": M.write_target(d / "heads.gguf"),
            "dir": d}


def context(ctx, model, **options) -> StrategyContext:
    return StrategyContext(gpu=ctx, target=view_with_file(model), options=StrategyOptions(**options))


def hand_over(sctx, model_out, start: int, tokens: list) -> None:
    """What the engine does after committing `tokens` at positions start..: tokens and states."""
    sctx.tokens = sctx.tokens + list(tokens)
    sctx.new_start = start
    sctx.new_hidden = {k: v for k, v in model_out.hidden.items() if isinstance(k, int)}
    sctx.new_final = model_out.hidden["final"]


# -- registration and loading ----------------------------------------------------------------------

def test_mtp_is_registered():
    reg = strategies()["mtp"]
    assert reg.factory is MTP and reg.plugin == "mtp" and reg.description and "draft-mtp" in reg.aliases


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_target_with_heads_loads_and_runs_only_the_trunk(ctx0, tmp_path, arch):
    with_heads = load_model(M.write_target(tmp_path / "h.gguf", arch, hidden="postnorm", own_embed=True,
                                           own_head=True))
    plain = load_model(M.write_target(tmp_path / "p.gguf", arch, n_nextn=0))
    hp = with_heads.hparams
    assert (hp.n_layer, hp.n_nextn, hp.nextn_hidden) == (2, 1, "postnorm")
    assert plain.hparams.n_nextn == 0 and plain.hparams.nextn_hidden == "prenorm"
    assert "blk.2.nextn.eh_proj.weight" in expected_tensors(hp) and "blk.2.attn_q.weight" in expected_tensors(hp)
    got = [Model(ctx0, mf, n_ctx=32) for mf in (with_heads, plain)]
    logits = [m.forward(PROMPT, all_logits=True).logits for m in got]
    assert np.array_equal(logits[0], logits[1])  # the same trunk, and nothing else runs
    for m in got:
        m.close()


def failure(path, sidecar: bool = False, target=None) -> str:
    with pytest.raises(VkdflashError) as info:
        if sidecar:
            from vkdflash_mtp import load_sidecar
            load_sidecar(path, target)
        else:
            load_model(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg


@pytest.mark.parametrize("knobs, words", [
    (dict(metadata={"llama.nextn_predict_layers": (3, VT.UINT32)}), "nextn_predict_layers = 3 is out of range"),
    (dict(metadata={"llama.nextn_predict_layers": DROP}), "unexpected tensor 'blk.2."),
    (dict(metadata={"llama.nextn.hidden": ("middle", VT.STRING)}), "must be one of prenorm, postnorm"),
    (dict(metadata={"llama.nextn.hidden": (1, VT.UINT32)}), "nextn.hidden should be a string"),
    (dict(drop=["blk.2.nextn.eh_proj.weight"]), "missing tensor blk.2.nextn.eh_proj.weight"),
    (dict(drop=["blk.2.attn_k.weight"]), "missing tensor blk.2.attn_k.weight"),
    (dict(shapes={"blk.2.nextn.eh_proj.weight": (128, 128)}), "blk.2.nextn.eh_proj.weight has shape [128, 128]"),
    (dict(own_embed=True, shapes={"blk.2.nextn.embed_tokens.weight": (128, 100)}), "embed_tokens.weight has shape"),
    (dict(extra={"blk.2.nextn.bogus.weight": (128,)}), "unexpected tensor 'blk.2.nextn.bogus.weight'"),
    (dict(extra={"blk.3.nextn.eh_proj.weight": (256, 128)}), "unexpected tensor 'blk.3.nextn.eh_proj.weight'"),
], ids=["count-too-big", "count-missing", "hidden-value", "hidden-type", "no-eh_proj", "no-attn_k",
        "eh_proj-shape", "embed-shape", "bogus-tensor", "second-head-undeclared"])
def test_malformed_target_heads_are_one_line_errors(tmp_path, knobs, words):
    assert words in failure(M.write_target(tmp_path / "bad.gguf", **knobs))


@pytest.mark.parametrize("knobs, words", [
    (dict(metadata={"general.architecture": ("dflash", VT.STRING)}), "an MTP sidecar has 'mtp'"),
    (dict(metadata={"mtp.target_architecture": ("qwen3", VT.STRING)}), "heads for a qwen3 target"),
    (dict(metadata={"mtp.embedding_length": (256, VT.UINT32)}), "heads of width 256"),
    (dict(metadata={"mtp.block_count": (4, VT.UINT32)}), "the target has 2"),
    (dict(metadata={"mtp.nextn_predict_layers": DROP}), "missing metadata key mtp.nextn_predict_layers"),
    (dict(metadata={"mtp.nextn.hidden": ("late", VT.STRING)}), "must be one of prenorm, postnorm"),
    (dict(drop=["blk.2.nextn.hnorm.weight"]), "missing tensor blk.2.nextn.hnorm.weight"),
    (dict(shapes={"blk.2.ffn_up.weight": (128, 64)}), "ffn_up.weight has shape"),
    (dict(extra={"token_embd.weight": (128, 277)}), "unexpected tensor 'token_embd.weight'"),
    (dict(metadata={"mtp.rope.scaling.attn_factor": (0.5, VT.FLOAT32)}), "mtp.rope.scaling.attn_factor = 0.5"),
], ids=["arch", "target-arch", "width", "block-count", "no-count", "hidden", "no-hnorm", "shape", "extra", "rope"])
def test_malformed_sidecars_are_one_line_errors(files, tmp_path, knobs, words):
    target = load_model(files["plain"]).hparams
    assert words in failure(M.write_sidecar(tmp_path / "bad.gguf", **knobs), True, target)


def test_model_without_heads_is_no_sidecar(files):
    target = load_model(files["plain"]).hparams
    assert "without next-n heads" in failure(files["plain"], True, target)


def test_no_heads_anywhere(ctx0, files, caplog):
    model = Model(ctx0, load_model(files["plain"]), n_ctx=64)
    with pytest.raises(VkdflashError) as info:
        MTP(context(ctx0, model))
    assert str(info.value) == NO_HEADS == ("mtp needs next-n heads: the target has none and no -md sidecar "
                                           "was given")
    with pytest.raises(VkdflashError) as info:  # through the engine: the one error line, naming why
        Speculator(model, "mtp", MTP, StrategyOptions(), SpecStats())
    assert str(info.value) == f"strategy mtp could not start: {NO_HEADS}"
    model.close()


# -- GPU against numpy -----------------------------------------------------------------------------

ACCEPTS = [0, 3, 5, 1, 0, 2]  # drafts "accepted" per simulated step (varies the commit sizes)


def drive(ctx, mf, heads_file: str | None, ctype: str, max_n: int = 5, ref_rotate: bool = True):
    """Run the GPU strategy and the numpy reference side by side through begin / propose / commit
    with the GPU target's states; return per step (GPU drafts, reference drafts, logits NMSE).
    At the end the GPU head's drafts must equal those of a reference given everything committed
    in one update: its cache holds exactly one entry per committed position."""
    model = Model(ctx, mf, n_ctx=96)
    sctx = context(ctx, model, draft_model=heads_file, draft_max=max_n, cache_type_k=ctype, cache_type_v=ctype)
    gpu = MTP(sctx)
    ref = RefMTP(gpu.heads, RefWeights(mf), ctype, ctype, ref_rotate)
    key = mf.hparams.n_layer if gpu.heads.hidden == "prenorm" else "final"
    out = model.forward(PROMPT, capture=gpu.capture_layers)
    hand_over(sctx, out, 0, PROMPT)
    gpu.begin(sctx)
    ref.update(sctx.tokens, 0, out.hidden[key])
    last, steps = 9, []
    for accept in ACCEPTS:
        got = gpu.propose(sctx, last, max_n).tokens
        want, want_logits = ref.propose(last, max_n)
        runner = gpu.runner
        rows = runner.d_logits.read(np.float32, runner.s_logits // 4 * max_n).reshape(max_n, -1)
        steps.append((got, want, nmse(rows[:, :runner.n_vocab], want_logits)))
        committed = [last] + got[:accept]
        start = len(sctx.tokens)
        out = model.forward(committed, all_logits=True, capture=gpu.capture_layers)
        hand_over(sctx, out, start, committed)
        gpu.commit(sctx)
        ref.update(sctx.tokens, start, out.hidden[key])
        last = int(np.argmax(out.logits[-1]))
    final = gpu.propose(sctx, last, max_n).tokens
    # incremental bookkeeping == one update over everything committed (same states)
    fresh = RefMTP(gpu.heads, ref_weights_of(ref), ctype, ctype, ref_rotate)
    model.reset()
    everything = model.forward(sctx.tokens, capture=gpu.capture_layers).hidden[key]
    fresh.update(sctx.tokens, 0, everything)
    again = RefMTP(gpu.heads, ref_weights_of(ref), ctype, ctype, ref_rotate)
    n0 = len(PROMPT)
    again.update(sctx.tokens[:n0], 0, everything[:n0])
    for s, e in zip(np.cumsum([n0] + [a + 1 for a in ACCEPTS])[:-1], np.cumsum([n0] + [a + 1 for a in ACCEPTS])[1:]):
        again.update(sctx.tokens[:e], s, everything[s:e])
    steps.append((final, fresh.propose(last, max_n)[0], 0.0))
    assert again.propose(last, max_n)[0] == steps[-1][1]
    gpu.close()
    sctx.close()
    model.close()
    return steps


def ref_weights_of(ref: RefMTP):
    return {"token_embd.weight": ref.embed, "output.weight": ref.head}


@pytest.mark.parametrize("ctype", CACHE_TYPES)
def test_gpu_drafts_equal_numpy_drafts(ctx0, files, ctype):
    mf = load_model(files["heads"])
    steps = drive(ctx0, mf, None, ctype)
    for got, want, err in steps:
        assert got == want
        assert err <= 1e-6, err
    if ctype != "f16":  # the head's cache is rotated: a reference without rotation is far off
        same = max(err for _, _, err in steps[:-1])
        other = min(err for _, _, err in drive(ctx0, mf, None, ctype, ref_rotate=False)[:-1])
        assert other > 100 * same, (other, same)


@pytest.mark.parametrize("arch, where, hidden", [("qwen3", "sidecar", "postnorm"), ("qwen2", "target", "postnorm"),
                                                 ("llama", "sidecar", "prenorm")])
def test_gpu_drafts_equal_numpy_drafts_other_heads(ctx0, tmp_path, arch, where, hidden):
    """q/k norm + NEOX (qwen3), qkv bias + tied output (qwen2), the head's own embedding and LM
    head, both kinds of fed state, and the sidecar path."""
    d = tmp_path
    if where == "sidecar":
        mf = load_model(M.write_target(d / "t.gguf", arch, n_nextn=0))
        side = str(M.write_sidecar(d / "s.gguf", arch, hidden=hidden, own_embed=True, own_head=True))
    else:
        mf, side = load_model(M.write_target(d / "t.gguf", arch, hidden=hidden, own_head=True)), None
    for got, want, err in drive(ctx0, mf, side, "q8_0"):
        assert got == want
        assert err <= 1e-6, err


# -- losslessness ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(files):
    """A target whose head has learned the target's own greedy continuation (in the GGUF and as a
    sidecar), so drafts are accepted and commits of every size happen."""
    d, mf = files["dir"], load_model(files["plain"])
    w = RefWeights(mf)
    ref = RefModel(w, n_ctx=128)
    seq = PROMPT + M.greedy_ids(ref, PROMPT, 60)
    ref.reset()
    states = ref.forward(seq, capture_layers=[mf.hparams.n_layer]).hidden[mf.hparams.n_layer]
    arrays = M.trained_head(w, seq, states, mf.hparams.rms_eps)
    return {"target": load_model(M.write_target(d / "trained.gguf", head_arrays=arrays)),
            "sidecar": str(M.write_sidecar(d / "trained-side.gguf", head_arrays=arrays))}


def generate_ids(model, tok, n, factory=None, **options):
    stats, spec_stats = Stats(), SpecStats()
    spec = Speculator(model, "mtp", factory, StrategyOptions(**options), spec_stats) if factory else None
    list(generate(model, tok, PROMPT, n, Sampler(temp=0.0), (), stats, spec))
    if spec is not None:
        spec.close()
    return stats.tokens, spec_stats


@pytest.mark.parametrize("ctype", CACHE_TYPES)
def test_greedy_mtp_is_identical_to_plain(ctx0, trained, with_file, ctype):
    mf = trained["target"]
    model, tok = Model(ctx0, mf, n_ctx=128), Tokenizer(mf.metadata)
    plain, _ = generate_ids(model, tok, 40)
    first = []
    for draft_max in range(1, 16):
        got, stats = generate_ids(model, tok, 40, MTP, draft_max=draft_max, cache_type_k=ctype, cache_type_v=ctype)
        assert got == plain, draft_max
        assert not stats.disabled and stats.steps > 0
        first.append(stats.per_position[0] / stats.steps)
    print(f"\nmtp {ctype}: first-draft acceptance per draft length 1..15: {np.round(first, 2).tolist()}")
    assert min(first) >= 0.8  # the head works: its cache, positions and fed state are right
    model.close()


def test_greedy_mtp_from_sidecar_and_p_min(ctx0, trained, files):
    model = Model(ctx0, load_model(files["plain"]), n_ctx=128)
    tok = Tokenizer(model.mf.metadata)
    plain, _ = generate_ids(model, tok, 40)
    got, stats = generate_ids(model, tok, 40, MTP, draft_model=trained["sidecar"], draft_max=6)
    assert got == plain and not stats.disabled and stats.per_position[0] >= 0.8 * stats.steps
    cut, cut_stats = generate_ids(model, tok, 40, MTP, draft_model=trained["sidecar"], draft_max=6, p_min=1.01)
    assert cut == plain and cut_stats.drafted == 0  # no draft is ever above probability 1.01
    model.close()


@pytest.mark.parametrize("p_min", [0.6, 0.9])
def test_mtp_cuts_its_drafts_by_llama_cpps_p_min_rule(ctx0, trained, monkeypatch, p_min):
    """--draft-p-min compares the top token's probability after top-k 10 (llama.cpp's draft
    sampler, spec/drafts.py), as DFlash and the draft model do; the head used the full softmax."""
    from vkdflash.spec.drafts import select_drafts
    from vkdflash_mtp.gpu import HeadRunner
    seen, orig = [], HeadRunner.draft

    def spy(self, h, token, pos, m, p_min=0.0, temperature=0.0, rng=None):
        drafts, probs = orig(self, h, token, pos, m, p_min, temperature, rng)
        logits = self.d_logits.read(np.float32, self.s_logits // 4 * m).reshape(m, -1)[:, :self.n_vocab]
        seen.append((list(drafts), select_drafts(np.argmax(logits, axis=1), logits, p_min)))
        return drafts, probs

    monkeypatch.setattr(HeadRunner, "draft", spy)
    mf = trained["target"]
    model, tok = Model(ctx0, mf, n_ctx=128), Tokenizer(mf.metadata)
    spec = Speculator(model, "mtp", MTP, StrategyOptions(draft_max=3, p_min=p_min), SpecStats())
    list(generate(model, tok, PROMPT, 30, Sampler(temp=0.0), (), Stats(), spec))
    spec.close()
    model.close()
    assert seen and all(got == want for got, want in seen)


def test_sampled_mtp_drafts_are_gumbel_max_draws(ctx0, trained, monkeypatch):
    """At T > 0 the head's chained drafts are argmax(logits + T * Gumbel noise) of each depth's
    own logits -- a draw from softmax(logits / T) -- and that q is handed to the verifier."""
    import copy

    from vkdflash.spec.drafts import draft_distribution
    from vkdflash_mtp.gpu import HeadRunner
    seen, orig = [], HeadRunner.draft

    def spy(self, h, token, pos, m, p_min=0.0, temperature=0.0, rng=None):
        state = copy.deepcopy(rng.bit_generator.state)
        drafts, probs = orig(self, h, token, pos, m, p_min, temperature, rng)
        logits = self.d_logits.read(np.float32, self.s_logits // 4 * m).reshape(m, -1)[:, :self.n_vocab]
        replay = np.random.default_rng()
        replay.bit_generator.state = state
        noise = (temperature * replay.gumbel(size=(m, self.n_vocab))).astype(np.float32)
        seen.append((drafts, probs, logits, noise, temperature))
        return drafts, probs

    monkeypatch.setattr(HeadRunner, "draft", spy)
    mf = trained["target"]
    model, tok = Model(ctx0, mf, n_ctx=128), Tokenizer(mf.metadata)
    stats = SpecStats()
    spec = Speculator(model, "mtp", MTP, StrategyOptions(draft_max=3), stats)
    list(generate(model, tok, PROMPT, 30, Sampler(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=2), (), Stats(),
                  spec))
    spec.close()
    model.close()
    assert seen and not stats.disabled
    for drafts, probs, logits, noise, temp in seen:
        assert temp == 1.5
        assert drafts == [int(i) for i in np.argmax(logits + noise, axis=1)]
        np.testing.assert_allclose(probs, draft_distribution(logits, 1.5), rtol=1e-12)


# -- draft vocabulary ------------------------------------------------------------------------------

def vocab_drafts(ctx, model, path, vocab=None, temperature=0.0):
    """Drafts of 3 from a few last tokens after PROMPT: [(tokens, logits, probs)], and the head's rows."""
    sctx = context(ctx, model, draft_model=path, draft_max=3)
    if vocab is not None:
        sctx.options.settings = {VOCAB.key: vocab}
    sctx.temperature, sctx.seed = temperature, 5
    gpu = MTP(sctx)
    model.reset()
    hand_over(sctx, model.forward(PROMPT, capture=gpu.capture_layers), 0, PROMPT)
    gpu.begin(sctx)
    out, r = [], gpu.runner
    for last in (9, 4, 30, 77):
        prop = gpu.propose(sctx, last, 3)
        out.append((prop.tokens, r.d_logits.read(np.float32, r.s_logits // 4 * 3).reshape(3, -1)[:, :r.n_out],
                    prop.probs))
    n_out = r.n_out
    gpu.close()
    sctx.close()
    return out, n_out


def test_a_draft_vocabulary_narrows_the_head_to_the_same_chained_drafts(ctx0, files, tmp_path):
    """A sidecar listing all tokens but one the drafts never pick (in another order): the head holds
    those rows, depth j+1 embeds the row depth j picked, and the drafts and each listed token's
    logit are the whole head's; sampled drafts hand over distributions that are zero off the list."""
    mf = load_model(files["plain"])
    model = Model(ctx0, mf, n_ctx=96)
    full, n_vocab = vocab_drafts(ctx0, model, str(M.write_sidecar(tmp_path / "full.gguf")))
    unused = min(set(range(n_vocab)) - {t for tokens, _, _ in full for t in tokens})
    listed = np.random.default_rng(0).permutation([t for t in range(n_vocab) if t != unused]).tolist()
    path = str(M.write_sidecar(tmp_path / "vocab.gguf", metadata={DRAFT_VOCAB: (listed, VT.ARRAY, VT.UINT32)}))
    narrow, n_out = vocab_drafts(ctx0, model, path)
    assert n_out == n_vocab - 1
    for (tokens, logits, _), (n_tokens, n_logits, _) in zip(full, narrow):
        assert n_tokens == tokens and len(tokens) == 3
        assert np.array_equal(n_logits, logits[:, listed])
    sampled, _ = vocab_drafts(ctx0, model, path, temperature=1.0)
    for tokens, _, probs in sampled:
        assert probs.shape == (3, n_vocab) and np.all(probs[:, unused] == 0)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0)
        assert all(probs[i, t] > 0 for i, t in enumerate(tokens))
    assert vocab_drafts(ctx0, model, path, vocab=0)[1] == n_vocab
    model.close()


@pytest.mark.parametrize("listed, vocab, words", [
    ([3, 5, 3], None, "vkdflash.draft.vocab lists a token twice"),
    ([3, 1 << 20], None, "vkdflash.draft.vocab holds 1048576, out of range"),
    ([3, 5], -1, "vocab=-1: must be >= 0"),
])
def test_a_bad_draft_vocabulary_is_a_one_line_error(ctx0, files, tmp_path, listed, vocab, words):
    model = Model(ctx0, load_model(files["plain"]), n_ctx=96)
    path = str(M.write_sidecar(tmp_path / "bad.gguf", metadata={DRAFT_VOCAB: (listed, VT.ARRAY, VT.UINT32)}))
    sctx = context(ctx0, model, draft_model=path)
    if vocab is not None:
        sctx.options.settings = {VOCAB.key: vocab}
    with pytest.raises(VkdflashError) as info:
        MTP(sctx)
    assert words in str(info.value) and "\n" not in str(info.value)
    sctx.close()
    model.close()


@pytest.mark.parametrize("max_pending,idle_hold", [(64, 1024), (3, 14)])
def test_positions_committed_while_idle_are_written_before_the_next_proposal(ctx0, files, monkeypatch, max_pending,
                                                                             idle_hold):
    """While the controller idles at k 0 the head writes nothing; the positions committed meanwhile
    (held back, at most MAX_PENDING, or IDLE_HOLD before the request's first proposal) are written
    before the next proposal, which then equals the numpy reference's, kept up to date step by step."""
    import vkdflash_mtp
    monkeypatch.setattr(vkdflash_mtp, "MAX_PENDING", max_pending)
    monkeypatch.setattr(vkdflash_mtp, "IDLE_HOLD", idle_hold)
    mf = load_model(files["heads"])
    model = Model(ctx0, mf, n_ctx=96)
    sctx = context(ctx0, model, draft_max=3)
    gpu = MTP(sctx)
    ref = RefMTP(gpu.heads, RefWeights(mf), "f16", "f16", True)
    key = mf.hparams.n_layer
    out = model.forward(PROMPT, capture=gpu.capture_layers)
    hand_over(sctx, out, 0, PROMPT)
    gpu.begin(sctx)
    ref.update(sctx.tokens, 0, out.hidden[key])
    last, proposals = 9, 0
    for step in range(12):
        if step % 5 == 4:  # a proposal after 4 idle steps
            assert gpu.propose(sctx, last, 3).tokens == ref.propose(last, 3)[0]
            proposals += 1
        held = sum(len(t) for _, t, _ in gpu.pending)
        assert held < (max_pending if proposals else idle_hold)
        if not proposals and len(sctx.tokens) - 1 < idle_hold:
            assert held == len(sctx.tokens) - 1  # nothing written before the first proposal
        start = len(sctx.tokens)
        out = model.forward([last], capture=gpu.capture_layers)
        hand_over(sctx, out, start, [last])
        gpu.commit(sctx)
        ref.update(sctx.tokens, start, out.hidden[key])
        last = int(np.argmax(out.logits[-1]))
    assert proposals == 2 and gpu.propose(sctx, last, 3).tokens == ref.propose(last, 3)[0]
    gpu.close()
    sctx.close()
    model.close()


def test_held_positions_are_written_in_the_batch_widths_of_every_step(ctx0, files, monkeypatch):
    """A flush after idle steps holds any number of positions; a commit graph of that many rows
    compiled the head's matmul kernels for its batch-width family (lavapipe: 5 families, ~0.6 s
    each, in a cold 1000-token run). Its rows go in pieces of 1-2, whose kernels every step uses,
    and the head's drafts stay the reference's."""
    import vkdflash_mtp.gpu as head_gpu
    widths, real = [], head_gpu.matmul
    monkeypatch.setattr(head_gpu, "matmul", lambda g, w, x, y, n, **kw: widths.append(n) or real(g, w, x, y, n, **kw))
    mf = load_model(files["heads"])
    model = Model(ctx0, mf, n_ctx=96)
    sctx = context(ctx0, model, draft_max=3)
    gpu = MTP(sctx)
    ref = RefMTP(gpu.heads, RefWeights(mf), "f16", "f16", True)
    out = model.forward(PROMPT, capture=gpu.capture_layers)
    hand_over(sctx, out, 0, PROMPT)
    gpu.begin(sctx)
    ref.update(sctx.tokens, 0, out.hidden[mf.hparams.n_layer])
    last = 9
    for _ in range(20):  # idle steps: nothing written yet
        start = len(sctx.tokens)
        out = model.forward([last], capture=gpu.capture_layers)
        hand_over(sctx, out, start, [last])
        gpu.commit(sctx)
        ref.update(sctx.tokens, start, out.hidden[mf.hparams.n_layer])
        last = int(np.argmax(out.logits[-1]))
    held = sum(len(t) for _, t, _ in gpu.pending)
    assert held > 16 and gpu.propose(sctx, last, 3).tokens == ref.propose(last, 3)[0]
    assert widths and max(widths) <= 2, sorted(set(widths))
    gpu.close()
    sctx.close()
    model.close()


def test_greedy_cascade_with_ngram_is_identical_to_plain_and_the_head_sees_every_commit(ctx0, trained, files):
    """ngram+mtp: where the copy proposes, the head does not, yet it must write every committed
    position (else its later drafts read a cache with holes and its acceptance falls)."""
    model = Model(ctx0, load_model(files["plain"]), n_ctx=128)
    tok = Tokenizer(model.mf.metadata)
    plain, _ = generate_ids(model, tok, 60)
    reg = lookup("ngram+mtp")
    opts = dict(draft_model=trained["sidecar"], draft_max=4, settings={"ngram": {"n": 3}, "mtp": reg.parts[1].settings(())})
    got, stats = generate_ids(model, tok, 60, reg.factory, **opts)
    assert got == plain and not stats.disabled
    ngram, mtp = stats.by_source["ngram"], stats.by_source["mtp"]
    assert ngram[0] > 0 and mtp[0] > 0 and ngram[0] + mtp[0] == stats.steps
    alone, alone_stats = generate_ids(model, tok, 60, MTP, draft_model=trained["sidecar"], draft_max=4)
    assert alone == plain
    assert mtp[2] / mtp[1] >= 0.8 * alone_stats.acceptance_rate, (mtp, alone_stats.acceptance_rate)
    model.close()
