"""The command line: exit codes, one-line errors, JSON output."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vkdflash.cli import main
from vkdflash.model import load_model
from vkdflash.tokenizer import Tokenizer


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_devices_lists_and_marks_default():
    res = run("devices")
    assert res.exit_code == 0, res.output
    assert "*0:" in res.output or "* " in res.output or "*" in res.output.splitlines()[0]
    data = json.loads(run("devices", "--json").output)
    assert sum(d["default"] for d in data) == 1 and all("subgroup_size" in d for d in data)


def test_bad_device_is_one_line_error():
    res = run("conformance", "--device", "99", "--filter", "copy")
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vkdflash: error:") and "99" in lines[0]


def test_conformance_filter_and_json(tmp_path):
    out = tmp_path / "c.json"
    res = run("conformance", "--filter", "copy/*", "--json", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["results"] and all(r["pass"] and r["case"].startswith("copy/") for r in data["results"])
    assert "passed, 0 failed" in res.output


def test_conformance_unknown_filter_fails():
    res = run("conformance", "--filter", "no-such-kernel")
    assert res.exit_code == 1 and "no conformance case matches" in res.output


def test_generate_on_malformed_files_is_one_line_error(tmp_path):
    from gguf_fixtures import write_model
    good = write_model(tmp_path / "good.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    data = good.read_bytes()
    cases = {"magic.gguf": b"XXXX" + data[4:], "truncated.gguf": data[: len(data) // 2],
             "empty.gguf": b""}
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        for args in (["generate", "-m", str(path), "hi", "-n", "1"], ["inspect", str(path)]):
            res = run(*args)
            lines = res.output.strip().splitlines()
            assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("vkdflash: error:"), (name, res.output)
    res = run("generate", "-m", str(tmp_path / "missing.gguf"), "hi")
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_generate_streams_text_and_stats(tmp_path):
    from gguf_fixtures import write_model
    path = write_model(tmp_path / "m.gguf", "qwen3", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    res = CliRunner().invoke(main, ["generate", "-m", str(path), "-p", "hello", "-n", "5", "--temp", "0",
                                    "-c", "64", "-ctk", "q8_0", "-ctv", "q4_0"])
    assert res.exit_code == 0, res.output
    assert "generated" in res.output and "tok/s" in res.output
    bad = run("generate", "-m", str(path), "hi", "-ctk", "q3_k")
    assert bad.exit_code == 2 and "q3_k" in bad.output


def test_control_tokens_written_in_a_raw_prompt_are_those_tokens(tmp_path):
    """As llama-cli -p and llama-server's /completion tokenize a prompt: a hand-written chat turn
    is the chat template's tokens, not the characters of its markers."""
    from gguf_fixtures import SPECIALS, write_model
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=64, n_ff=128, n_head=2, n_head_kv=1, head_dim=32)
    text = SPECIALS[1] + "user\nhi" + SPECIALS[2]
    res = run("generate", "-m", str(path), text, "-n", "1", "--temp", "0", "-c", "64")
    assert res.exit_code == 0, res.output
    with load_model(str(path)) as mf:
        tok = Tokenizer(mf.metadata)
        parsed, plain = tok.encode(text, parse_special=True), tok.encode(text)
    assert len(parsed) < len(plain) and f"prompt {len(parsed)} tok" in res.output


def test_every_command_releases_the_device_it_opened(tmp_path, monkeypatch):
    """In one process (a test run, a server) each run's device, kernels and buffers are freed:
    lavapipe kept ~180 MB of a never-destroyed device per tiny-model run."""
    from gguf_fixtures import write_model
    from vkdflash.runtime.context import Context
    opened, real_init = [], Context.__init__
    monkeypatch.setattr(Context, "__init__", lambda self, *a, **k: opened.append(self) or real_init(self, *a, **k))
    path = str(write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64))
    for args in (["generate", "-m", path, "hi", "-n", "3", "-c", "64", "--spec", "ngram"],
                 ["bench", "model", "-m", path, "-p", "4", "-n", "2"],
                 ["bench", "spec", "-m", path, "-n", "4", "-c", "64", "--spec", "ngram", "--reps", "1"],
                 ["bench", "kernels", "--reps", "1"], ["conformance", "--filter", "softmax"],
                 ["generate", "-m", path, "x" * 300, "-c", "16"]):  # a one-line error on the way out
        before = len(opened)
        res = run(*args)
        assert res.exit_code in (0, 1) and "Traceback" not in res.output, (args, res.output)
        made = opened[before:]
        assert made and all(c.device is None and not c._live and not c.pipelines for c in made), args


def test_bench_spec_without_spec_measures_what_generate_would_run(tmp_path):
    """No --spec: the default strategy (on the default model the shipped draft led by ngram); a model
    with none is a one-line usage error, as --spec none is."""
    from gguf_fixtures import write_model
    path = str(write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64))
    for args, words in ((["-m", path], "no strategy runs by default here"), (["--spec", "none"], "name another")):
        res = run("bench", "spec", "-n", "4", "-c", "64", "--reps", "1", *args)
        assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output


def test_inspect_recognises_a_dflash_draft(tmp_path):
    from dflash_fixtures import write_dflash
    from gguf_fixtures import write_model
    target = write_model(tmp_path / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    res = run("inspect", str(write_dflash(tmp_path / "d.gguf", target)))
    assert res.exit_code == 0 and "a draft for --spec dflash" in res.output and "fc.weight" in res.output


def test_bad_flags_are_one_line_errors():
    for args in (["generate", "hi", "-ctk", "q3_k"], ["nosuch"], ["generate", "--temp", "abc", "x"],
                 ["bench", "kernels", "--reps", "0"]):
        res = CliRunner().invoke(main, args)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("vkdflash: error:"), (args, res.output)


def test_conformance_reports_a_crashing_case_and_fails(monkeypatch):
    import vkdflash.conformance as conf

    def boom(ctx):
        raise RuntimeError("driver lost\nmore")
    monkeypatch.setattr(conf, "all_cases", lambda pattern=None, include_slow=True: [conf.Case("fake/crash", boom)])
    res = run("conformance")
    assert res.exit_code == 1 and "FAIL RuntimeError: driver lost" in res.output and "0 passed, 1 failed" in res.output


def test_bench_model_profile_and_verify_curve(tmp_path):
    from gguf_fixtures import write_model
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    out = tmp_path / "b.json"
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "-p", "8", "-n", "2", "-ctk", "q8_0",
                                    "--profile", "--verify-curve", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    passes = report["profile"]["passes"]
    assert set(passes) == {"1", "16"}
    for p in passes.values():
        assert p["gpu_ms"] > 0 and {"mul_mat", "flash_attn", "set_rows", "rms_norm"} <= set(p["families"])
        assert abs(sum(f["share"] for f in p["families"].values()) - 1) < 1e-6
        assert sum(f["dispatches"] for f in p["families"].values()) == p["dispatches"]
    curve = report["verify_curve"]["relative"]
    assert list(curve) == ["1", "2", "4", "8", "16", "32"] and curve["1"] == 1.0 and curve["32"] > 1.0


@pytest.mark.parametrize("hold", [True, False])
def test_a_log_line_waits_for_the_streamed_texts_line_break(hold):
    """On a terminal that shows both, a warning no longer lands in the middle of generated code."""
    import io
    import logging
    import logging.handlers
    from vkdflash.cli_stream import TextStream
    out = io.StringIO()
    shown = logging.StreamHandler(out)
    shown.setFormatter(logging.Formatter("vkdflash: %(message)s"))
    root = logging.getLogger()
    root.addHandler(shown)
    try:
        stream = TextStream(hold=hold, handler=shown, out=out)
        stream.write("def f():\n    ret")
        logging.getLogger("vkdflash").warning("switched off")
        stream.write("urn 1\nf(")
        logging.getLogger("vkdflash").warning("twice")
        stream.write(")")
        stream.close()
    finally:
        root.removeHandler(shown)
    assert shown not in root.handlers and not any(isinstance(h, logging.handlers.MemoryHandler) for h in root.handlers)
    if hold:
        assert out.getvalue() == "def f():\n    return 1\nvkdflash: switched off\nf()\nvkdflash: twice\n"
    else:
        assert "    retvkdflash: switched off\n" in out.getvalue()
