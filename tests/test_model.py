"""The GPU forward pass against the numpy reference (tiny random models) and llama.cpp (SmolLM2)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from gguf_fixtures import LLAMACPP_TOP10, write_model
from vkdflash.conformance import nmse
from vkdflash.errors import VkdflashError
from vkdflash.model import load_model
from vkdflash.model.forward import Model
from vkdflash.ref.model import RefModel

NMSE_LOGITS = 2e-3  # docs/design.md section 7: whole-model logits
PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30, 7, 19, 4]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    # head_dim 64: the smallest the rotation applies to
    return {arch: load_model(write_model(d / f"{arch}.gguf", arch, n_embd=128, n_ff=256, n_head=2, n_head_kv=1,
                                         head_dim=64, seed=3)) for arch in ("llama", "qwen2", "qwen3")}


def greedy(model, prompt, n):
    model.reset()
    logits = model.forward(prompt).logits[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.forward([out[-1]]).logits[-1]
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_match_numpy_reference(ctx0, tiny, arch):
    gpu = Model(ctx0, tiny[arch], n_ctx=64)
    ref = RefModel(tiny[arch], n_ctx=64)
    got = gpu.forward(PROMPT, all_logits=True).logits
    want = ref.forward(PROMPT).logits
    assert nmse(got, want) <= NMSE_LOGITS
    ref.reset()
    ref_ids, logits = [], ref.forward(PROMPT).logits[-1]
    for _ in range(12):
        ref_ids.append(int(np.argmax(logits)))
        logits = ref.forward([ref_ids[-1]]).logits[-1]
    assert greedy(gpu, PROMPT, 12) == ref_ids
    gpu.close()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batched_equals_token_by_token_bitwise(ctx0, tiny, arch):
    """Batch invariance end to end: prefill logits equal one-token decode logits, bit for bit."""
    m = Model(ctx0, tiny[arch], n_ctx=64)
    batched = m.forward(PROMPT, all_logits=True).logits
    m.reset()
    single = np.concatenate([m.forward([t]).logits for t in PROMPT])
    assert np.array_equal(batched.view(np.uint32), single.view(np.uint32))
    m.close()


def test_a_prompt_runs_in_compiled_widths_while_compiling_its_own_would_cost_more(ctx0, tiny, caplog):
    """A prompt (decoding follows) may run in passes of widths whose kernels are compiled: its
    own width only where that compile (priced as the 1-row family's) costs less than the passes
    it saves, at the kernels' guess times a timed 1-row pass. Same bits either way."""
    mf, cap = tiny["qwen3"], [1, tiny["qwen3"].hparams.n_layer]
    whole = Model(ctx0, mf, n_ctx=64)
    want = whole.forward(PROMPT, capture=cap)
    m = Model(ctx0, mf, n_ctx=64)
    m.first_record[m._family(1, False)] = 1e3  # as if a width's kernels took 1000 s to compile
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        got = m.forward(PROMPT, capture=cap, prompt=True)
    assert {key[0] for key in m.store.graphs} == {1}  # 12 one-row passes: no new width compiled
    assert "prompt of 12 tokens in 1-row passes" in caplog.text  # -v says why
    assert np.array_equal(got.logits.view(np.uint32), want.logits.view(np.uint32))
    for key in want.hidden:
        assert np.array_equal(got.hidden[key].view(np.uint32), want.hidden[key].view(np.uint32))
    m.row_seconds = 0.01
    m.first_record = {m._family(1, False): 0.001}  # a compile cheaper than a 1-row pass: own width
    assert m._prompt_width(12) == 12 and m._prompt_width(100) == 64
    m.first_record[m._family(1, False)] = 1.0  # 100 one-row passes
    assert m._prompt_width(64) == 1 and m._prompt_width(200) == 64  # 200 rows pay for it
    m.first_record[m._family(8, False)] = 1.0  # a compiled 8-row family takes what it can
    assert m._prompt_width(12) == m._prompt_width(9) == 8 and m._prompt_width(3) == 1
    del m.first_record[m._family(8, False)]
    paid = [m._prompt_width(40) for _ in range(200)]  # many prompts: what 1-row passes cost adds up
    assert paid[0] == 1 and paid[-1] == 40 and 0.7 <= m.prompt_rent <= 0.75  # less the passes it saves
    m.reset()
    assert m.forward(PROMPT, prompt=False).logits is not None and (12, False, (), False) in m.store.graphs
    whole.close()
    m.close()


def test_a_greedy_pass_reads_back_the_argmax_of_its_logits(ctx0, tiny):
    """greedy=True keeps the logits on the device and returns each row's argmax: the same ids
    numpy finds in the logits a plain pass returns, for a prefill's last row, every row of a
    batch and a decode step; logits that hold NaN are refused in one line, as the sampler does."""
    m = Model(ctx0, tiny["qwen3"], n_ctx=64)
    logits = m.forward(PROMPT, all_logits=True).logits
    decoded = m.forward([9]).logits
    m.reset()
    assert m.forward(PROMPT, greedy=True).logits is None
    m.reset()
    assert m.forward(PROMPT, greedy=True).ids.tolist() == [int(np.argmax(logits[-1]))]
    m.reset()
    assert m.forward(PROMPT, all_logits=True, greedy=True).ids.tolist() == np.argmax(logits, axis=1).tolist()
    assert m.forward([9], greedy=True).ids.tolist() == [int(np.argmax(decoded[0]))]
    m.output_norm.read_only = None  # weights are read only once uploaded: this stands in for a damaged file
    m.output_norm.write(np.full(m.hp.n_embd, np.nan, np.float32))  # whose NaN reaches the logits
    m.reset()
    with pytest.raises(VkdflashError, match=f"logits at position {len(PROMPT) - 1} hold NaN"):
        m.forward(PROMPT, greedy=True)
    m.close()


def test_captured_hidden_states_match_reference(ctx0, tiny):
    mf = tiny["qwen3"]
    n_layer = mf.hparams.n_layer
    m = Model(ctx0, mf, n_ctx=64)
    got = m.forward(PROMPT, capture=[0, 1, n_layer]).hidden
    want = RefModel(mf, n_ctx=64).forward(PROMPT, capture_layers=[0, 1, n_layer])
    for layer in (0, 1, n_layer):
        assert nmse(got[layer], want.hidden[layer]) <= NMSE_LOGITS
    assert nmse(got["final"], want.final) <= NMSE_LOGITS
    with pytest.raises(VkdflashError, match="capture"):
        m.forward([1], capture=[n_layer + 1])
    m.close()


@pytest.mark.parametrize("ctype", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("rotate", [True, False])
def test_quantized_cache_matches_reference_cache(ctx0, tiny, ctype, rotate):
    """Same cache type and rotation in both: the GPU cache stores what the numpy cache stores.
    The match is far tighter than the quantization's own effect, so a cache that skipped the
    rotation or the quantization would fail."""
    mf = tiny["llama"]
    gpu = Model(ctx0, mf, n_ctx=64, ctk=ctype, ctv=ctype, rotate=rotate)
    assert bool(gpu.cache.k_rot) == (rotate and ctype != "f16")
    got = gpu.forward(PROMPT, all_logits=True).logits
    same = RefModel(mf, ctk=ctype, ctv=ctype, rotate=rotate, n_ctx=64).forward(PROMPT).logits
    assert nmse(got, same) <= 1e-7
    if ctype != "f16":
        other = RefModel(mf, ctk=ctype, ctv=ctype, rotate=not rotate, n_ctx=64).forward(PROMPT).logits
        assert nmse(got, other) > 100 * nmse(got, same)
    gpu.close()


def test_rope_frequency_factors_are_applied(ctx0, tmp_path):
    mf = load_model(write_model(tmp_path / "f.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1,
                                head_dim=64, rope_freqs=True))
    assert mf.hparams.has_rope_freqs
    m = Model(ctx0, mf, n_ctx=64)
    assert nmse(m.forward(PROMPT, all_logits=True).logits, RefModel(mf, n_ctx=64).forward(PROMPT).logits) <= 1e-7
    m.close()


def test_context_overflow_and_bad_tokens_are_clear_errors(ctx0, tiny):
    m = Model(ctx0, tiny["llama"], n_ctx=8)
    with pytest.raises(VkdflashError, match="context full"):
        m.forward(PROMPT)
    with pytest.raises(VkdflashError, match="vocabulary"):
        m.forward([10 ** 6])
    m.close()


def test_rotation_env_switch(ctx0, tiny, monkeypatch):
    monkeypatch.setenv("VKDFLASH_ATTN_ROT_DISABLE", "1")
    m = Model(ctx0, tiny["llama"], n_ctx=16, ctk="q8_0", ctv="q4_0")
    assert m.cache.k_rot == 0 and m.cache.v_rot == 0
    m.close()


def test_a_rotation_switch_that_is_no_integer_says_rotation_stays_on(monkeypatch, caplog):
    """llama.cpp's rule ignores such a value: "yes" must not look like it turned rotation off."""
    from vkdflash.kv_cache import rotation_disabled_by_env
    monkeypatch.setenv("VKDFLASH_ATTN_ROT_DISABLE", "yes-please")
    with caplog.at_level("WARNING", logger="vkdflash"):
        assert not rotation_disabled_by_env() and not rotation_disabled_by_env()
    assert [r.getMessage() for r in caplog.records] == [
        "VKDFLASH_ATTN_ROT_DISABLE='yes-please' is not an integer, so KV rotation stays on (1 turns it off)"]


def test_a_first_pass_compiles_while_the_next_process_loads_the_model(tmp_path, monkeypatch, caplog):
    """The kernels a cold process's first 1-row pass compiled are submitted as the next process's
    model starts loading (lavapipe keeps no pipeline cache); the next pass gives the same bits, and
    a family's compile is still priced as the cold process paid it."""
    from conftest import DEVICES
    from vkdflash.measured import load
    from vkdflash.model import prewarm
    from vkdflash.runtime.context import Context
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "measured.json"))
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64, seed=4)

    def process(greedy: bool = False):
        ctx = Context(DEVICES[0].index)
        model = Model(ctx, load_model(path), n_ctx=16)
        submitted = set(ctx.pipelines)  # before any pass
        assert prewarm.start(ctx, model.prewarm_key) is model.prewarmed  # once a context: the CLI asks first
        out = model.forward([7], greedy=greedy)
        first = model.first_record[model._family(1, False)]
        model.close()
        ctx.close()
        return submitted, out.ids if greedy else out.logits, first

    none, cold_logits, cold = process()
    (entry,) = load().values()
    assert not none and entry["seconds"] == cold and len(entry["kernels"]) >= 5
    with caplog.at_level("INFO", logger="vkdflash"):
        submitted, logits, first = process()
    assert submitted == {tuple(k[:3]) + (tuple(k[3]), tuple(k[4])) for k in entry["kernels"]}
    assert np.array_equal(logits, cold_logits) and first >= cold and "while the model loads" in caplog.text
    _, ids, _ = process(greedy=True)  # another mode's kernels replace the list; the cold price stays
    assert ids[0] == int(np.argmax(cold_logits[-1]))
    (greedy_entry,) = load().values()
    assert greedy_entry["seconds"] == cold and greedy_entry["kernels"] != entry["kernels"]
    (key,) = load()
    for damage in ({**entry, "kernels": entry["kernels"][:-1]}, {**entry, "seconds": -1.0}, [1]):
        monkeypatch.setattr(prewarm, "load", lambda: {key: damage})
        caplog.clear()
        with caplog.at_level("WARNING", logger="vkdflash"):
            assert process()[0] == set() and "damaged: not used" in caplog.text


# -- SmolLM2-135M against llama.cpp's own numbers ------------------------------------------------



@pytest.fixture(scope="module")
def smollm2():
    from vkdflash.model import default_model_path
    return load_model(default_model_path(progress=False))


@pytest.fixture(scope="module")
def llamacpp():
    return json.loads(LLAMACPP_TOP10.read_text())["cases"]


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.slow
def test_smollm2_matches_llamacpp(ctx0, smollm2, llamacpp):
    """Same prompt ids; same first 8 greedy ids, except where llama.cpp itself sees a near-tie;
    top-1 log-probabilities close while the ids agree.

    Our top-1 log-probabilities differ from llama.cpp's by 0.044 on average and ~0.2 at worst;
    the float64 numpy reference shows the same figures, so the gap is in llama.cpp's arithmetic
    (emulating its 8-bit activation quantization or f16 attention did not close it). A greedy
    step may therefore flip where llama.cpp's own top-2 gap is below 0.1 nats: allowed, and
    only to llama.cpp's second choice."""
    from vkdflash.tokenizer import Tokenizer
    tok = Tokenizer(smollm2.metadata)
    m = Model(ctx0, smollm2, n_ctx=256)
    diffs, agree = [], []
    for case in llamacpp:
        assert tok.encode(case["prompt"], add_special=True) == case["prompt_ids"]
        ours = greedy(m, case["prompt_ids"], 8)
        for step, (got, ref) in enumerate(zip(ours, case["steps"][:8])):
            if got != ref["id"]:
                top = ref["top"]
                assert got == top[1]["id"] and top[0]["logprob"] - top[1]["logprob"] < 0.1, \
                    f"{case['prompt']!r} step {step}: {got} vs llama.cpp {ref['id']} (not a near-tie)"
                break
        m.reset()  # teacher-forced over llama.cpp's 32 tokens: every step's distribution at once
        lp = log_softmax(m.forward(case["prompt_ids"] + case["tokens"][:-1], all_logits=True).logits)
        lp = lp[len(case["prompt_ids"]) - 1:]
        n = 0
        for row, step in zip(lp, case["steps"]):
            if int(np.argmax(row)) != step["id"]:
                break
            n += 1
            diffs.append(abs(row[step["id"]] - step["logprob"]))
        agree.append(n)
    print(f"\nSmolLM2 vs llama.cpp: teacher-forced greedy agreement per case {agree}/32, top-1 log-prob "
          f"|diff| max {max(diffs):.3f} mean {np.mean(diffs):.3f}")
    assert np.mean(diffs) < 0.06 and max(diffs) < 0.3
    m.close()


def top1_agreement(ctx, mf, cases, ctk, ctv, rotate, reference=None):
    m = Model(ctx, mf, n_ctx=256, ctk=ctk, ctv=ctv, rotate=rotate)
    ids = []
    for case in cases:
        m.reset()
        ids.append(np.argmax(m.forward(case["prompt_ids"] + case["tokens"], all_logits=True).logits, axis=1))
    m.close()
    ids = np.concatenate(ids)
    return ids if reference is None else float(np.mean(ids == reference))


@pytest.mark.slow
def test_smollm2_quantized_cache_agreement(ctx0, smollm2, llamacpp):
    """Teacher-forced top-1 agreement with the f16-cache run over every position of the 8 cases."""
    f16 = top1_agreement(ctx0, smollm2, llamacpp, "f16", "f16", True)
    assert f16.size >= 256
    q8 = top1_agreement(ctx0, smollm2, llamacpp, "q8_0", "q8_0", True, f16)
    q4_rot = top1_agreement(ctx0, smollm2, llamacpp, "q4_0", "q4_0", True, f16)
    q4_raw = top1_agreement(ctx0, smollm2, llamacpp, "q4_0", "q4_0", False, f16)
    print(f"\nSmolLM2 top-1 agreement with f16 cache over {f16.size} positions: q8_0 {q8:.4f}, "
          f"q4_0 rotated {q4_rot:.4f}, q4_0 unrotated {q4_raw:.4f}")
    assert q8 >= 0.98
    assert q4_rot > q4_raw


@pytest.mark.slow
def test_smollm2_gpu_matches_numpy_reference(ctx0, smollm2, llamacpp):
    """The chain to llama.cpp without its rounding noise: GPU engine == float64 numpy reference
    here, and the reference == llama.cpp (same commit, F32 weights) in test_ref_model.py."""
    case = llamacpp[0]
    ids = case["prompt_ids"] + case["tokens"][:16]
    m = Model(ctx0, smollm2, n_ctx=64)
    got = m.forward(ids, all_logits=True).logits
    want = RefModel(smollm2, n_ctx=64).forward(ids).logits
    err = nmse(got, want)
    print(f"\nSmolLM2 GPU vs numpy reference logits NMSE {err:.2e}")
    assert err <= 1e-6 and np.array_equal(got.argmax(1), want.argmax(1))
    m.close()
