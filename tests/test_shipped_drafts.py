"""The drafts shipped for the default model (SmolLM2-135M-Instruct Q4_1): found without -md, and
acceptance that holds on quantized draft caches, with a negative control that reproduces
llama.cpp issue 25725 (injected K/V stored without the rotation the read path applies) and must
collapse DFlash acceptance -- proof these tests would catch the bug they exist for."""
from __future__ import annotations

import json
import logging
import re

import pytest

import vkdflash.kv_cache as kv_cache
from conftest import DEVICES, context_for
from vkdflash.chat import ChatTemplate
from vkdflash.generate import Stats, generate
from vkdflash.model import default_model_path, load_model
from vkdflash.model.forward import Model
from vkdflash.model.metadata import Metadata
from vkdflash.sampling import Sampler
from vkdflash.spec import SpecStats, StrategyOptions
from vkdflash.spec.engine import Speculator
from vkdflash.spec.shipped import suite_record
from vkdflash.suite import PROMPTS, prompt_ids
from vkdflash.tokenizer import Tokenizer
from vkdflash_dflash import factory as dflash_factory
from vkdflash_dflash.strategy import DFlash
from vkdflash_mtp import MTP

pytestmark = pytest.mark.slow
# code, chat, story, code: the first of the suite's prompts, at its fixed draft lengths
CASES = list(PROMPTS[:4])
N_GEN = 48
STRATEGIES = {"dflash": (dflash_factory, 15), "mtp": (MTP, 2)}


@pytest.fixture(scope="module")
def smollm2():
    mf = load_model(default_model_path(progress=False))
    tok = Tokenizer(mf.metadata)
    template = ChatTemplate.from_metadata(mf.metadata, tok)
    model = Model(context_for(DEVICES[0].index), mf, n_ctx=512)
    yield model, tok, [prompt_ids(p, tok, template) for p in CASES]
    model.close()


def acceptance(smollm2, name: str, ctype: str) -> tuple:
    """(acceptance rate, greedy output) over CASES at the strategy's fixed draft length."""
    model, tok, prompts = smollm2
    make, k = STRATEGIES[name]
    stats, outputs = SpecStats(), []
    spec = Speculator(model, name, make, StrategyOptions(draft_max=k, cache_type_k=ctype, cache_type_v=ctype), stats)
    assert spec.strategy is not None, stats.disabled
    for ids in prompts:
        gen = Stats()
        list(generate(model, tok, ids, N_GEN, Sampler(temp=0.0), (), gen, spec))
        outputs.append(gen.tokens)
    spec.close()
    assert not stats.disabled and stats.drafted > 0
    return stats.acceptance_rate, outputs


@pytest.fixture(scope="module")
def f16(smollm2):
    return {name: acceptance(smollm2, name, "f16") for name in STRATEGIES}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_shipped_draft_is_found_and_accepted(smollm2, f16, name):
    rate, _ = f16[name]
    print(f"\n{name}: f16 draft cache acceptance {rate:.3f}")
    assert rate >= 0.02  # a trained draft, not noise: a random one accepts ~1/49152 (measured: dflash 0.034
    # at length 7, mtp 0.19 at length 2 -- weak drafts, see issue 10's note)


@pytest.mark.parametrize("name", list(STRATEGIES))
# 4 prompts x 48 tokens move acceptance by +-7% (round-5 files: q8_0 0.95x / 1.02x, q4_0 1.00x /
# 1.07x for dflash / mtp, q4_0 above q8_0); the bug these guard against falls below 0.1x
@pytest.mark.parametrize("ctype,ratio", [("q8_0", 0.9), ("q4_0", 0.85)])
def test_quantized_draft_cache_keeps_acceptance(smollm2, f16, name, ctype, ratio):
    base, plain_outputs = f16[name]
    rate, outputs = acceptance(smollm2, name, ctype)
    print(f"\n{name}: {ctype} acceptance {rate:.3f} vs f16 {base:.3f} ({rate / base:.2f}x)")
    assert outputs == plain_outputs  # greedy output never depends on the draft
    assert rate >= ratio * base


def test_negative_control_unrotated_injection_collapses_dflash(smollm2, f16, monkeypatch, caplog):
    """Test-only monkeypatch: DFlash's injection graphs store K/V without rotation (the read path
    still rotates Q and un-rotates the output), as llama.cpp's side door did. Acceptance must fall
    below 0.2x the f16 figure on a quantized cache; if it did not, the parity tests above could
    not tell a broken write path from a working one."""
    store, record = kv_cache.store_rows, DFlash._record_inject

    def unrotated(*args, rotation=0, **kwargs):
        return store(*args, rotation=0, **kwargs)

    def record_unrotated(self, n):
        with monkeypatch.context() as m:
            m.setattr(kv_cache, "store_rows", unrotated)
            return record(self, n)

    monkeypatch.setattr(DFlash, "_record_inject", record_unrotated)
    with caplog.at_level(logging.WARNING, logger="vkdflash"):
        rate, _ = acceptance(smollm2, "dflash", "q4_0")
    base = f16["dflash"][0]
    print(f"\ndflash q4_0 with unrotated injection: acceptance {rate:.3f} vs f16 {base:.3f}")
    assert rate < 0.2 * base
    # and the watchdog names the draft cache to a user who meets it
    warned = [r.getMessage() for r in caplog.records if "far below" in r.getMessage()]
    assert len(warned) == 1 and "the quantized draft cache (K q4_0, V q4_0" in warned[0], warned


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_shipped_drafts_record_their_suite_acceptance(smollm2, name):
    """The watchdog's reference: each shipped file says what a_1 its suite measured."""
    model, _, _ = smollm2
    stats = SpecStats()
    make, k = STRATEGIES[name]
    spec = Speculator(model, name, make, StrategyOptions(draft_max=k), stats)
    try:
        expected = spec.strategy.expected_first_acceptance
    finally:
        spec.close()
    assert expected is not None and 0.1 <= expected <= 1.0
    assert suite_record(Metadata({}, {})).first_acceptance is None  # a draft made elsewhere records nothing


def test_default_speculation_follows_the_measured_speedup_and_dflash_needs_no_md(caplog, tmp_path, monkeypatch):
    """Neither --spec nor -md on the default model: on a GPU a shipped draft runs (cost-aware); on
    a CPU device only one whose recorded bench speedup there beat plain decoding by more than its
    noise (MIN_CPU_SPEEDUP; when none did, off, and the run says why). Greedy output is that of
    --spec none either way, and --spec dflash finds the shipped draft without -md. With no verify
    curve cached, a default run too short to repay measuring one does not (on lavapipe it had made
    the README's first command 3.5x slower than --spec none)."""
    from click.testing import CliRunner

    from vkdflash.cli import main
    from vkdflash.cli_spec import MIN_CPU_SPEEDUP
    from vkdflash.plugins import shipped
    mf = load_model(default_model_path(progress=False))
    try:
        paying = [d["strategy"] for d in shipped(mf) if (d.get("cpu_speedup") or 0) >= MIN_CPU_SPEEDUP]
    finally:
        mf.close()
    args = ["generate", "-n", "16", "--temp", "0", "def is_prime(n):"]
    curves = tmp_path / "verify-curves.json"
    monkeypatch.setenv("VKDFLASH_CURVES", str(curves))
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        auto = CliRunner().invoke(main, ["-v"] + args)
    if "speculation on by default" in caplog.text:
        from vkdflash.spec.curve import CURVE_FORMAT  # the file may hold other measurements, no curve
        assert not [k for k in (json.loads(curves.read_text()) if curves.exists() else {}) if k.endswith(CURVE_FORMAT)]
        assert "verify cost unmeasured: measuring it" in auto.output, auto.output
    plain = CliRunner().invoke(main, args + ["--spec", "none"])
    dflash = CliRunner().invoke(main, args + ["--spec", "dflash", "--draft-fixed"])
    assert auto.exit_code == plain.exit_code == dflash.exit_code == 0, (auto.output, dflash.output)
    if DEVICES[0].device_type == "cpu" and not paying:
        assert "speculation off by default" in caplog.text and re.search(r"dflash \d\.\d\dx", caplog.text)
    elif DEVICES[0].device_type == "cpu":
        assert f"speculation on by default: {paying[0]}" in caplog.text
        assert "led by ngram" in caplog.text and f"spec ngram+{paying[0]} " in auto.output  # the copy goes first
        assert re.search(r"\d\.\d\dx plain decoding in bench spec on a CPU", caplog.text)  # what qualified it
    else:
        assert "speculation on by default" in caplog.text and "cost-aware length" in caplog.text
    text = lambda res: res.stdout.split("prompt ")[0]  # noqa: E731 -- the generated text, before the stats
    assert text(auto) == text(plain) == text(dflash)
    assert "spec " not in plain.output
    assert "spec dflash" in dflash.output and "accepted" in dflash.output
