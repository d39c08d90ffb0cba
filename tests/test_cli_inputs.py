"""Bad command-line input is one line naming the problem, found before anything runs: a missing
model file (MISSING) stands in for the run, so a check that came too late fails fast instead."""
from __future__ import annotations

import logging
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from vkdflash.cli import main

MISSING = "/nonexistent/model.gguf"


def usage_error(*args) -> str:
    """The one line a usage error (exit 2) prints."""
    res = CliRunner().invoke(main, list(args))
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("vkdflash: error:"), (args, res.output)
    return lines[0]


@pytest.mark.parametrize("args, flag", [
    (["generate", "hi", "--min-p", "nan"], "--min-p"),
    (["generate", "hi", "--temp", "nan"], "--temp"),
    (["generate", "hi", "--temp", "inf"], "--temp"),
    (["generate", "hi", "--top-p", "nan"], "--top-p"),
    (["generate", "hi", "--draft-p-min", "nan"], "--draft-p-min"),
    (["bench", "spec", "--spec", "ngram", "--temp", "nan"], "--temp"),
    (["bench", "spec", "--spec", "ngram", "--draft-p-min", "nan"], "--draft-p-min"),
])
def test_float_flags_refuse_nan_and_inf(args, flag):
    assert flag in usage_error(*args, "-m", MISSING)


def test_every_float_flag_of_every_command_is_finite():
    """A float flag added later must not let nan through (nan passes every bound of FloatRange)."""
    def params(cmd):
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                yield from params(sub)
        else:
            yield from ((cmd.name, p) for p in cmd.params)
    floats = [(name, p.opts[-1], type(p.type).__name__) for name, p in params(main)
              if isinstance(p.type, click.types.FloatParamType)]
    assert len(floats) >= 5 and all(kind == "FiniteFloatRange" for *_, kind in floats), floats


@pytest.mark.parametrize("args", [["generate", "a\udcffb"], ["generate", "-p", "a\udcffb"],
                                  ["generate", "hi", "--chat", "--system", "a\udcffb"],
                                  ["generate", "hi", "--stop", "a\udcffb"],
                                  ["bench", "spec", "--spec", "ngram", "-p", "a\udcffb"]])
def test_text_that_is_not_utf8_is_refused(args):
    line = usage_error(*args, "-m", MISSING)
    assert "not valid UTF-8: byte 0xff at byte offset 1 (after 'a')" in line


def test_a_non_utf8_argument_from_a_real_command_line():
    res = subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", "generate", b"a\xffb",
                          "-m", MISSING], capture_output=True, text=True)
    assert res.returncode == 2 and "not valid UTF-8" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("command", [["bench", "model", "-m", MISSING], ["bench", "kernels", "--device", "99"],
                                     ["bench", "spec", "--spec", "ngram", "-m", MISSING],
                                     ["conformance", "--filter", "copy*", "--device", "99"]])
def test_json_files_are_checked_before_the_run(command, tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    for path, why in ((tmp_path / "no" / "x.json", "does not exist"), (a_file / "x.json", "is not a folder"),
                      (tmp_path, "is a folder"), ("", "empty")):
        line = usage_error(*command, "--json", str(path))
        assert "--json" in line and why in line, line
    assert a_file.read_text() == ""


def test_bench_model_says_when_it_raises_the_context(monkeypatch, caplog):
    import vkdflash.cli_bench as cli_bench
    from vkdflash.errors import VkdflashError
    seen = []

    def stop(model_path, n_ctx, *rest):
        seen.append(n_ctx)
        raise VkdflashError("stopped before the model")
    monkeypatch.setattr(cli_bench, "open_model", stop)
    caplog.set_level(logging.INFO, logger="vkdflash")
    res = CliRunner().invoke(main, ["bench", "model", "-p", "100", "-n", "2", "-c", "32"])
    assert res.exit_code == 1 and seen == [103]
    assert "-c raised from 32 to 103" in caplog.text


def test_bench_spec_names_a_prompt_longer_than_the_context():
    """It had said "context full: 40 + 4 tokens exceed -c 40", from its warm-up's passes."""
    res = CliRunner().invoke(main, ["bench", "spec", "--spec", "ngram", "-n", "4", "--reps", "1", "-c", "40"])
    assert res.exit_code == 1
    assert res.output.strip().splitlines()[-1] == "vkdflash: error: the prompt is 44 tokens, the context only 40: raise -c"


def test_suite_runs_are_checked():
    suite = ["bench", "spec", "-m", MISSING, "--suite", "default"]
    line = usage_error(*suite, "--suite-runs", "bogus:3")
    assert "--suite-runs" in line and "'bogus'" in line and "ngram" in line
    assert "at least one" in usage_error(*suite, "--suite-runs", "")
    assert "K in 1..64" in usage_error(*suite, "--suite-runs", "ngram:\u00b2")
    assert "--suite-runs" in usage_error("bench", "spec", "-m", MISSING, "--spec", "ngram", "--suite-runs", "ngram:2")
    assert "--reps" in usage_error(*suite, "--reps", "2")


def test_a_strategy_the_suite_cannot_build_is_skipped_once(monkeypatch):
    from types import SimpleNamespace

    import vkdflash.bench_suite as bench_suite
    import vkdflash.chat
    import vkdflash.cli_spec
    from vkdflash.cli_spec import SpecRequest
    from vkdflash.errors import VkdflashError

    def cannot_build(*args):
        raise VkdflashError("no draft")
    monkeypatch.setattr(vkdflash.cli_spec, "build_speculator", cannot_build)
    monkeypatch.setattr(vkdflash.chat.ChatTemplate, "from_metadata", lambda *args: None)
    monkeypatch.setattr(bench_suite, "prompt_ids", lambda *args: [1])
    monkeypatch.setattr(bench_suite, "run", lambda *args: {"decode_tps": 1.0, "per_kind": {}})
    model = SimpleNamespace(ctx=SimpleNamespace(features=SimpleNamespace(name="dev")),
                            mf=SimpleNamespace(metadata=SimpleNamespace(str=lambda *a, **k: "m"),
                                               gguf=SimpleNamespace(path="m.gguf")))
    runs = bench_suite.Runs((("ngram", 8),), ("f16",), (0.0, 0.7))
    report = bench_suite.run_suite(model, None, SpecRequest(None, None, 16, 0.0, "f16", "f16", ()), runs, 1, 4, True)
    assert report["skipped"] == [{"strategy": "ngram", "why": "no draft"}] and report["runs"] == []


def test_system_needs_chat_and_seeds_are_checked():
    assert "--system needs --chat" in usage_error("generate", "hi", "--system", "be brief", "-m", MISSING)
    assert "x>=-1" in usage_error("generate", "hi", "-s", "-2", "-m", MISSING)
    assert "x>=0" in usage_error("bench", "spec", "--spec", "ngram", "-s", "-1", "-m", MISSING)
    res = CliRunner().invoke(main, ["generate", "hi", "-s", "-1", "-m", MISSING])  # -1: a random seed
    assert res.exit_code == 1 and "model.gguf" in res.output


def test_a_context_past_the_storage_range_names_c(tmp_path):
    from gguf_fixtures import write_model
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=2, head_dim=64)
    res = CliRunner().invoke(main, ["generate", "-m", str(path), "hi", "-n", "1", "-c", str(1 << 20)])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert "-c 1048576 needs a K cache of 256 MiB per layer" in lines[0] and "lower -c" in lines[0]


def test_a_context_past_what_attention_can_read_names_c(tmp_path, ctx0):
    """A q4_0 cache fits the storage range at 600000 positions, but a lavapipe lane stops after
    65535 loop iterations: refused before the weights upload, in the words of -c."""
    from gguf_fixtures import write_model
    from vkdflash.kernels.attention import max_positions
    most = max_positions(ctx0.features)
    if most is None:
        pytest.skip("this device's attention has no position limit")
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=2, head_dim=64)
    res = CliRunner().invoke(main, ["generate", "-m", str(path), "hi", "-n", "1", "-c", str(most + 1),
                                    "-ctk", "q4_0", "-ctv", "q4_0"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert f"-c {most + 1}: attention reads at most {most} positions" in lines[0] and "lower -c" in lines[0]


def test_a_full_output_is_one_line_not_a_traceback(tmp_path):
    """`generate > /dev/full`: the disk's words, once, and no second complaint as stdout closes."""
    from gguf_fixtures import write_model
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=2, head_dim=64)
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", "generate", "-m",
                              str(path), "hi", "-n", "4", "--temp", "0", "-c", "64"], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=300)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        "vkdflash: error: No space left on device (writing the output?)"], res.stderr


def test_devices_lists_what_is_there_whatever_vkdflash_device_says(monkeypatch):
    monkeypatch.setenv("VKDFLASH_DEVICE", "99")
    res = CliRunner().invoke(main, ["devices"])
    assert res.exit_code == 0 and "0: " in res.stdout and "VKDFLASH_DEVICE=99: device index 99" in res.stderr


def test_a_conformance_filter_that_matches_nothing_names_the_families():
    res = CliRunner().invoke(main, ["conformance", "--filter", "mul_mat/q4_0*"])
    assert res.exit_code == 1 and "start with a kernel family: add," in res.output and "matmul" in res.output
    assert "matmul/q4_0*" in next(p.help for p in main.commands["conformance"].params if p.name == "pattern")


def test_an_empty_stop_string_is_refused():
    assert "--stop" in usage_error("generate", "hi", "--stop", "", "-m", MISSING)
