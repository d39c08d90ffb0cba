"""Strategies own their options, aliases and draft files: `--spec-opt NAME.KEY=VALUE`, llama.cpp's
`--spec-type` spellings as aliases, and `-md FILE` going to whichever plugin claims the file."""
from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from gguf_fixtures import write_model
from vkdflash import plugins
from vkdflash.cli import main
from vkdflash.hookspecs import hookimpl


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_model(tmp_path_factory.mktemp("opts") / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2,
                           n_head_kv=1, head_dim=64, seed=3))


def run(*args):
    return CliRunner().invoke(main, list(args))


def generate(model, *extra):
    return run("generate", "-m", model, "ab ab ab ab ab", "-n", "10", "--temp", "0", "-c", "64", *extra)


def one_line_error(res, *words):
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and lines[-1].startswith("vkdflash: error:"), res.output
    assert all(w in lines[-1] for w in words), lines[-1]


def test_plugins_lists_each_strategys_options_and_aliases():
    res = run("plugins")
    assert res.exit_code == 0 and "--spec-opt ngram.n=<int>" in res.output and "(also draft-dflash)" in res.output
    assert "--spec A+B (e.g. ngram+dflash): a cascade" in res.output
    listing = {p["name"]: p for p in json.loads(run("plugins", "--json").output)}
    assert listing["ngram"]["options"]["ngram"] == [
        {"key": "n", "type": "int", "default": 3, "help": listing["ngram"]["options"]["ngram"][0]["help"]}]
    assert listing["mtp"]["aliases"]["mtp"] == ["draft-mtp"]


def test_a_spec_option_reaches_the_strategy_and_output_stays_identical(model):
    plain = generate(model)
    for n in ("1", "4"):
        res = generate(model, "--spec", "ngram", "--spec-opt", f"ngram.n={n}")
        assert res.exit_code == 0, res.output
        assert res.stdout == plain.stdout
    res = generate(model, "--spec", "ngram+ngram")
    assert res.exit_code == 1 and "names ngram twice" in res.output


@pytest.mark.parametrize("opt,words", [("ngram.x=1", ["no option 'x'", "n"]), ("ngram.n=abc", ["not a valid int"]),
                                       ("dflash.n=1", ["is for dflash", "ngram"]), ("n=1", ["NAME.KEY=VALUE"]),
                                       ("ngram.n=0", ["could not start", "at least 1"])])
def test_bad_spec_options_are_one_line_errors(model, opt, words, caplog):
    one_line_error(generate(model, "--spec", "ngram", "--spec-opt", opt), *words)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and words[-1] in r.getMessage()]
    assert not said, said  # a strategy that cannot start is the error line alone, not a warning before it


def test_spec_type_takes_any_alias_and_unknown_names_are_refused(model):
    one_line_error(generate(model, "--spec-type", "draft-dflash"), "dflash needs a draft model")
    one_line_error(generate(model, "--spec", "nosuch"), "unknown speculative strategy", "ngram")
    one_line_error(generate(model, "--spec", "ngram", "--spec-type", "draft-mtp"), "disagree")


def test_a_draft_file_no_plugin_claims_is_a_one_line_error(model):
    from gguf_fixtures import TOKENIZER_DATA
    vocab_only = str(TOKENIZER_DATA / "ggml-vocab-gpt-2.gguf")
    one_line_error(generate(model, "-md", vocab_only), "no strategy plugin recognizes", "architecture 'gpt2'", "--spec")


def test_a_third_party_plugin_claims_a_draft_file(model, caplog):
    from vkdflash_ngram import PromptLookup

    class Claims:  # claims files for a strategy of its own (a claim for another plugin's is ignored)
        @hookimpl
        def register_strategies(self, register):
            register("lookup", PromptLookup, "prompt lookup, for whatever -md names")

        @hookimpl
        def claim_draft_file(self, path, metadata):
            return "lookup" if metadata.get("general.architecture") == "llama" else None

    class Raises:
        @hookimpl
        def claim_draft_file(self, path, metadata):
            raise KeyError("boom")

    plain = generate(model)
    pm = plugins.manager()
    pm.register(Claims(), name="claims")
    pm.register(Raises(), name="raises")
    res = generate(model, "-md", model)
    assert res.exit_code == 0, res.output
    assert res.stdout == plain.stdout and "spec lookup" in res.stderr
    warned = [r.getMessage() for r in caplog.records if "plugin raises" in r.getMessage()]
    assert len(warned) == 1 and "claim_draft_file raised KeyError" in warned[0]


def test_bench_spec_needs_a_strategy_and_runs_one(model):
    res = run("bench", "spec", "-m", model, "-n", "6", "-c", "64")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "--spec NAME" in lines[0]
    res = run("bench", "spec", "-m", model, "-n", "6", "-c", "128", "--spec", "ngram", "--spec-opt", "ngram.n=2")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["none_tps"] > 0 and report["spec_tps"] > 0 and report["identical_output"]
    # alternating runs: the speedup is the median pair's
    assert report["reps"] == 3 and sorted(report["speedups"])[1] == report["speedup"]
    res = run("bench", "spec", "-m", model, "-n", "6", "-c", "128", "--spec", "ngram", "--temp", "0.7", "-s", "3",
              "--reps", "2")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)  # sampled: speeds and the speculative run's figures, texts not compared
    assert report["temp"] == 0.7 and report["identical_output"] is None and report["spec_tps"] > 0
    assert report["spec"]["strategy"] == "ngram"
    res = run("bench", "spec", "-m", model, "--suite", "default", "--temp", "0.7")
    assert res.exit_code == 2 and "--suite-temps" in res.output
    res = run("bench", "spec", "-m", model, "-n", "1", "-c", "128", "--spec", "ngram")  # no decode step to time
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and "no decoding to compare" in lines[0], res.output


def measuring_pays(monkeypatch):
    """Runs measure the verify curve after a few tokens: this tiny model's cheap passes never
    repay the compiles of measuring."""
    from vkdflash.spec.controller import DraftController
    monkeypatch.setattr(DraftController, "measuring_pays", lambda self, room, seconds, passes: room >= 4)


def _curves(file) -> dict:
    """The verify curves among what the measured file holds (not strategies' costs, kernel lists, headers)."""
    from vkdflash.spec.curve import CURVE_FORMAT
    known = json.loads(file.read_text()) if file.exists() else {}
    return {k: v for k, v in known.items() if k.endswith(CURVE_FORMAT)}


def test_the_verify_curve_is_measured_once_and_cached(model, tmp_path, monkeypatch):
    from vkdflash.spec import curve
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "verify-curves.json"))
    calls = []
    real = curve._rounds  # the timed rounds of a measurement, before the first token or mid-run
    monkeypatch.setattr(curve, "_rounds", lambda *a, **k: calls.append(1) or real(*a, **k))
    # a strategy asked for by name measures no sooner than one on by default: a short run would
    # pay the compiles of wider passes (a cold `--spec dflash` run on lavapipe: 9.0 s against 4.8)
    res = generate(model, "--spec", "ngram")
    assert res.exit_code == 0 and "verify cost unmeasured: measuring it" in res.output, res.output
    assert calls == [] and not _curves(tmp_path / "verify-curves.json")
    # a run whose tokens repay measuring measures; it compiles the widths it times, and, long
    # enough to repay recording a verify graph there, proposes
    measuring_pays(monkeypatch)
    res = generate(model, "--spec", "ngram", "-n", "50")
    assert res.exit_code == 0 and "drafted 0," not in res.output, res.output
    for _ in range(2):
        res = generate(model, "--spec", "ngram", "-c", "24")
        assert res.exit_code == 0 and "draft length cost-aware" in res.output, res.output
    assert len(calls) == 1
    cached = json.loads((tmp_path / "verify-curves.json").read_text())
    assert [k for k in cached if k.endswith("|strategy ngram")]  # and what ngram's proposals cost beside it
    curves = _curves(tmp_path / "verify-curves.json")
    (curve_seconds,) = curves.values()
    assert {"1", "2", "4"} <= set(curve_seconds)  # measured (+ widths the runs priced by their passes)
    # one cached from a starved spell (seen: 2 rows at 16x one row) is measured again, not trusted
    (key,) = curves
    cached[key]["2"] = 16 * cached[key]["1"]
    (tmp_path / "verify-curves.json").write_text(json.dumps(cached))
    res = generate(model, "--spec", "ngram", "-c", "24")
    assert res.exit_code == 0 and len(calls) == 2, res.output
    healed = json.loads((tmp_path / "verify-curves.json").read_text())[key]
    assert healed["2"] < 2 * healed["1"]


def test_the_curve_is_measured_in_rounds_over_every_width(monkeypatch):
    """Each round times every width once, so a slow spell of the machine shorter than the rounds
    leaves no width's best figure slow (one width timed all in a slow spell skews every ratio).
    Here passes 4..9 cost 10x: the first round and a half after the warm-up round."""
    import types
    from vkdflash.spec import curve
    clock = {"t": 0.0, "passes": 0}

    def forward(tokens, all_logits=False):
        clock["passes"] += 1
        slow = 3 < clock["passes"] <= 9  # passes 4..9: the first measured round and a half
        clock["t"] += len(tokens) * (10.0 if slow else 1.0)
    cache = types.SimpleNamespace(n_ctx=64, truncate=lambda n: None)
    model = types.SimpleNamespace(cache=cache, hp=types.SimpleNamespace(n_vocab=100), reset=lambda: None,
                                  forward=forward)
    monkeypatch.setattr(curve.time, "perf_counter", lambda: clock["t"])
    seconds = curve.measure(model, rows=(1, 2, 4), context=0, reps=3)
    assert seconds == {1: 1.0, 2: 2.0, 4: 4.0}


def test_a_width_far_above_the_kernels_guess_is_timed_again(monkeypatch):
    """A cold process cached 2 rows at 1.44x one row where warm rounds give 1.14-1.23x: a width
    above SUSPECT x the kernels' guess gets up to reps more rounds (here the 2-row passes of the
    warm-up and the 3 timed rounds cost 3x; the 5th round times them right), and none where the
    figures agree with the guess."""
    import types
    from vkdflash.spec import curve
    clock = {"t": 0.0, "passes": 0}

    def forward(tokens, all_logits=False):
        clock["passes"] += 1
        slow = len(tokens) == 2 and clock["passes"] <= 12
        clock["t"] += (0.8 + 0.2 * len(tokens)) * (3.0 if slow else 1.0)
    cache = types.SimpleNamespace(n_ctx=64, truncate=lambda n: None)

    def measured(guess):
        clock.update(t=0.0, passes=0)
        model = types.SimpleNamespace(cache=cache, hp=types.SimpleNamespace(n_vocab=100), reset=lambda: None,
                                      forward=forward, pass_cost_guess=guess)
        return curve.measure(model, rows=(1, 2, 4), context=0, reps=3), clock["passes"]

    monkeypatch.setattr(curve.time, "perf_counter", lambda: clock["t"])
    seconds, passes = measured(lambda n: 0.8 + 0.2 * n)
    assert seconds == pytest.approx({1: 1.0, 2: 1.2, 4: 1.6}) and passes == 15
    seconds, passes = measured(None)  # no guess: the rounds as before
    assert seconds == pytest.approx({1: 1.0, 2: 3.6, 4: 1.6}) and passes == 12


def test_a_run_heals_a_stale_cached_curve(model, tmp_path, monkeypatch):
    """Live verify passes go back to the cache: a curve 100x too dear (measured on a busy
    machine) comes back near what the passes cost now (from widths timed 8 times or more)."""
    file = tmp_path / "verify-curves.json"
    monkeypatch.setenv("VKDFLASH_CURVES", str(file))
    with monkeypatch.context() as patch:
        measuring_pays(patch)
        assert generate(model, "--spec", "ngram", "-c", "24").exit_code == 0
    ((key, measured),) = _curves(file).items()
    file.write_text(json.dumps({key: {n: 100 * s for n, s in measured.items()}}))
    res = generate(model, "--spec", "ngram", "-n", "40")
    assert res.exit_code == 0, res.output
    healed = json.loads(file.read_text())[key]
    assert all(healed[n] < 100 * s / 8 for n, s in measured.items())
