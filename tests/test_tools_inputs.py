"""Bad input to the developer tools (tools/) is an argument error or one line naming the problem,
found before anything long runs: never a traceback, a hang, or a benchmark started by mistake."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
sys.path[:0] = [str(ROOT), str(TOOLS)]

import bench_record  # noqa: E402
import device_check  # noqa: E402
from tools.fuzz.targets import real_model_path  # noqa: E402

# a check that came too late lets the tool start its work: this bounds the wait for that failure
LIMIT_S = 60
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the [train] extra (torch)")


def tool(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=LIMIT_S)


def refused(res: subprocess.CompletedProcess, code: int) -> str:
    """The error line of a refusal: exit 2 is a usage error (argparse and click print usage above
    it), exit 1 is one line and nothing else."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code and lines, (res.returncode, res.stderr)
    assert code == 2 or len(lines) == 1, res.stderr
    return lines[-1]


@pytest.fixture
def not_gguf(tmp_path) -> Path:
    path = tmp_path / "notgguf.gguf"
    path.write_text("not a GGUF file\n")
    return path


# -- bench_record ---------------------------------------------------------------------------------
def test_bench_record_help_prints_help_and_runs_nothing():
    res = tool(TOOLS / "bench_record.py", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage:") and "benchmarks/" in res.stdout, res.stderr


def test_bench_record_refuses_unknown_arguments():
    assert "unrecognized arguments: --bogus" in refused(tool(TOOLS / "bench_record.py", "--bogus"), 2)


def test_bench_record_names_the_vkdflash_command_that_failed():
    with pytest.raises(SystemExit) as exc:
        bench_record.vkdflash("bench", "spec", "-p", "two\nlines", "--reps", "0")
    message = str(exc.value)
    assert "\n" not in message and message.startswith("bench_record: error: `vkdflash bench spec"), message
    assert "--reps" in message.rpartition("failed")[2], message  # vkdflash's own last line says why


# -- llamacpp_dflash_check ------------------------------------------------------------------------
@pytest.mark.parametrize("args, flag", [
    (["--draft", "/nonexistent.gguf"], "--draft"),
    (["--prompts", "0"], "--prompts"),
    (["-n", "-5"], "-n"),
    (["--port", "0"], "--port"),
    (["--threads", "0"], "--threads"),
])
def test_llamacpp_check_refuses_bad_flags(args, flag):
    line = refused(tool(TOOLS / "llamacpp_dflash_check.py", "--server", "/bin/true", *args), 2)
    assert f"'{flag}'" in line, line


def test_llamacpp_check_names_a_draft_that_is_no_gguf(not_gguf):
    if not real_model_path().exists():
        pytest.skip("the default model is not cached (the check loads it before the draft)")
    line = refused(tool(TOOLS / "llamacpp_dflash_check.py", "--server", "/bin/true", "--draft", not_gguf), 1)
    assert line.startswith("llamacpp_dflash_check: error:") and str(not_gguf) in line, line


# -- fuzz -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, flag", [
    (["--workers", "0"], "--workers"),                      # hung: no worker ever took a case
    (["--preload", "/nonexistent.py"], "--preload"),
    (["--json", "/nonexistent/dir/f.json"], "--json"),      # failed only after the whole campaign
    (["--time-cap", "-1"], "--time-cap"),
    (["--time-cap", "nan"], "--time-cap"),
    (["--memory-mb", "1"], "--memory-mb"),
    (["--cases", "-3"], "--cases"),
    (["--only-index", "-1"], "--only-index"),
    (["--start", "-1"], "--start"),
    (["--kinds", ","], "--kinds"),
])
def test_fuzz_refuses_bad_arguments_before_the_campaign(args, flag):
    # --cases 1 first (the last of a repeated flag counts): a check that is missing fails fast
    line = refused(tool("-m", "tools.fuzz", "--cases", "1", *args), 2)
    assert line.startswith(f"python -m tools.fuzz: error: argument {flag}:"), line


def test_fuzz_refuses_a_json_path_that_is_a_folder(tmp_path):
    line = refused(tool("-m", "tools.fuzz", "--cases", "1", "--json", tmp_path), 2)
    assert "--json" in line and "cannot be written" in line, line


def test_fuzz_names_a_keep_folder_that_is_a_file(not_gguf):
    line = refused(tool("-m", "tools.fuzz", "--cases", "1", "--keep", not_gguf), 1)
    assert line.startswith("python -m tools.fuzz: error:") and str(not_gguf) in line, line


# -- device_check ---------------------------------------------------------------------------------
@pytest.fixture
def no_stage(monkeypatch):
    """A check that failed must not run a stage here: it unpacks .debs into / and runs ldconfig."""
    monkeypatch.setattr(device_check, "stage", lambda n, out: pytest.fail("the stage ran"))


def refusal(argv) -> str:
    with pytest.raises(SystemExit) as exc:
        device_check.main(argv)
    message = str(exc.value)
    assert message.startswith("device_check: error:") and "\n" not in message, message
    return message


@pytest.mark.parametrize("n", ["1", "3"])
def test_device_check_stages_refuse_to_run_off_the_device(tmp_path, monkeypatch, no_stage, n):
    monkeypatch.setattr(device_check, "NVIDIA_ICD", tmp_path / "absent.json")
    out = tmp_path / "made" / "out"
    message = refusal(["stage", n, "--out", str(out)])
    assert "device machine" in message and "prepare" in message, message
    assert not out.parent.exists()


def test_device_check_stage_3_without_prepare_says_to_prepare(tmp_path, monkeypatch, no_stage):
    icd = tmp_path / "nvidia_icd.json"
    icd.write_text("{}")
    monkeypatch.setattr(device_check, "NVIDIA_ICD", icd)
    monkeypatch.setattr(device_check, "DEV", tmp_path / ".device")
    message = refusal(["stage", "3", "--out", str(tmp_path / "out")])
    assert "model.0, model.1, model.2" in message and "prepare" in message, message


# -- replay_ngram ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args, flag", [(["--prior", "warm"], "--prior"), (["--draft-max", "0"], "--draft-max")])
def test_replay_ngram_refuses_bad_flags(args, flag):
    assert flag in refused(tool(TOOLS / "replay_ngram.py", *args), 2)


def test_replay_ngram_says_when_no_curve_is_cached(tmp_path, monkeypatch):
    """--prior cached prices from this machine's cached curve: with none, one line says so."""
    monkeypatch.setenv("VKDFLASH_CURVES", str(tmp_path / "curves.json"))
    line = refused(tool(TOOLS / "replay_ngram.py", "--prior", "cached"), 1)
    assert line.startswith("replay_ngram: error: --prior cached:") and "holds no verify curve" in line, line


# -- train (needs torch: every tool imports it first) ---------------------------------------------
@pytest.fixture
def suite_json(tmp_path) -> Path:
    """A suite report with a greedy f16 run of dflash, as `vkdflash bench spec --suite default` writes."""
    path = tmp_path / "suite.json"
    path.write_text('{"prompts": 1, "n_gen": 8, "device": "x", "runs": [{"strategy": "dflash", "temp": 0, '
                    '"cache": "f16", "per_position": [0.5], "acceptance": 0.5, "tau": 1.5}]}')
    return path


@needs_torch
@pytest.mark.parametrize("text", ["{not json", '{"spec": {}, "none_tps": 1.0}'])  # the second: a `bench spec` report
def test_train_stamp_names_a_suite_json_that_is_no_suite_report(tmp_path, not_gguf, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    line = refused(tool("run.py", "stamp", not_gguf, "--suite-json", bad, "--strategy", "dflash",
                        cwd=TOOLS / "train"), 2)
    assert "'--suite-json'" in line and "vkdflash bench spec --suite default --json" in line, line


@needs_torch
def test_train_stamp_names_a_draft_that_is_no_gguf(not_gguf, suite_json):
    line = refused(tool("run.py", "stamp", not_gguf, "--suite-json", suite_json, "--strategy", "dflash",
                        cwd=TOOLS / "train"), 1)
    assert line.startswith("run.py: error:") and str(not_gguf) in line, line


@needs_torch
@pytest.mark.parametrize("command", [["vocab", "DRAFT"], ["dflash", "--out", "x.gguf"], ["mtp", "--out", "x.gguf"],
                                     ["recapture", "--out", "x", "--capture", "2"]])
def test_train_names_a_data_folder_without_data(tmp_path, not_gguf, command):
    line = refused(tool("run.py", *[str(not_gguf) if a == "DRAFT" else a for a in command], "--data", tmp_path,
                        cwd=TOOLS / "train"), 2)
    assert "'--data'" in line and "run.py data" in line, line


@needs_torch
@pytest.mark.parametrize("script, args, flag", [
    ("run.py", ["data", "--out", "D", "--model", "/nonexistent.gguf"], "--model"),
    ("run.py", ["text", "--out", "D", "--model", "/nonexistent.gguf"], "--model"),
    ("check_draft.py", ["--dflash", "/nonexistent.gguf"], "--dflash"),
    ("check_draft.py", ["--mtp", "/nonexistent.gguf"], "--mtp"),
    ("check.py", ["--model", "/nonexistent.gguf"], "--model"),
])
def test_train_tools_refuse_missing_files_before_loading_the_target(script, args, flag):
    assert flag in refused(tool(script, *args, cwd=TOOLS / "train"), 2)


@needs_torch
def test_train_check_draft_needs_a_draft():
    assert "--dflash" in refused(tool("check_draft.py", cwd=TOOLS / "train"), 2)


@needs_torch
@pytest.mark.slow
def test_train_text_windows_are_seeded_bounded_and_hold_no_suite_prompt(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS / "train"))
    from data import load_text_tools
    from text import text_mix

    from vkdflash.suite import PROMPTS
    tok, template = load_text_tools(real_model_path())
    mix = text_mix(60, tok, template, seed=3, length=96)
    assert mix == text_mix(60, tok, template, seed=3, length=96)
    assert mix != text_mix(60, tok, template, seed=4, length=96)
    assert {k for k, _ in mix} == {"code", "prose", "chat"}
    assert all(64 <= len(ids) <= 96 for _, ids in mix)
    firsts = [p.text.strip().splitlines()[0].lower() for p in PROMPTS]
    assert not any(line in tok.decode(ids).lower() for _, ids in mix for line in firsts)
    turn = tok.encode("<|im_start|>", add_special=False, parse_special=True)  # SmolLM2's chat turns
    assert len(turn) == 1
    assert all((turn[0] in ids) == (k == "chat") for k, ids in mix)


@needs_torch
@pytest.mark.slow
def test_a_trainer_started_from_a_draft_keeps_its_vocabulary(tmp_path):
    """A round from --init trains on the rows the engine computes for that file and writes its list
    into the new file (ranked from other data, the engine's rows for the file would change)."""
    from vkdflash.model.gguf_file import GGUFFile
    from vkdflash.spec.vocab import DRAFT_VOCAB
    head = ROOT / "plugins" / "vkdflash_mtp" / "heads" / "smollm2-135m-instruct-q4_1.mtp.gguf"
    train = TOOLS / "train"
    made = subprocess.run([sys.executable, "run.py", "data", "--out", tmp_path / "d", "--prompts", "2", "--new", "4"],
                          cwd=train, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-500:]
    trained = subprocess.run([sys.executable, "run.py", "mtp", "--data", tmp_path / "d", "--init", head, "--out",
                              tmp_path / "h.gguf", "--steps", "1", "--seqs", "2", "--rows", "4", "--teacher"],
                             cwd=train, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-500:]
    lists = []
    for path in (head, tmp_path / "h.gguf"):
        with GGUFFile(path) as f:
            lists.append(f.metadata.ints(DRAFT_VOCAB, 0, 1 << 31, 1 << 31, default=None))
    assert lists[0] is not None and len(lists[0]) > 8192
    assert lists[1] is not None and list(lists[1]) == list(lists[0])
