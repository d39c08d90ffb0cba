"""The hostile-file fuzz campaign (tools/fuzz): a CI-sized run must find nothing, its GGUF
serializer must round-trip exactly, cases must replay by index, and planted failures of every
class must be caught (a campaign that cannot fail proves nothing)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.fuzz import gguf_image  # noqa: E402
from tools.fuzz.campaign import Config, run  # noqa: E402
from tools.fuzz.mutations_raw import KINDS, mutate  # noqa: E402
from tools.fuzz.report import FAILURES, summary, text  # noqa: E402
from tools.fuzz.targets import TARGETS, real_model_path, write_fixtures  # noqa: E402

CI_CASES = len(KINDS) * 15   # every kind 15 times


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-fixtures")
    write_fixtures(folder)
    return folder


def test_serializer_round_trips_exactly(fixtures, tmp_path):
    for t in TARGETS.values():
        if t.name == "real":
            continue
        src = fixtures / t.mutated
        gguf_image.read(src).write(tmp_path / "copy.gguf")
        assert (tmp_path / "copy.gguf").read_bytes() == src.read_bytes(), t.name


def test_real_header_round_trips_over_a_sparse_data_section(tmp_path):
    real = real_model_path()
    if not real.exists():
        pytest.skip(f"{real} is absent (any `vkdflash generate` without -m fetches it)")
    img = gguf_image.read(real, keep_data=False)
    size = img.write(tmp_path / "header.gguf")
    head = img.header()
    with open(real, "rb") as f:
        assert f.read(len(head)) == head
    assert size == real.stat().st_size == (tmp_path / "header.gguf").stat().st_size


def test_every_kind_mutates_every_target_reproducibly(fixtures, tmp_path):
    """Case i of a seed is the same file whenever it is built (replaying by index works), and no
    mutation breaks the fuzzer itself."""
    for t in TARGETS.values():
        if t.name == "real":
            continue
        clean = gguf_image.read(fixtures / t.mutated)
        for kind in KINDS:
            for seed in range(3):
                files = []
                for n in range(2):
                    img = clean.copy()
                    description = mutate(img, kind, random.Random(f"{seed}:{kind}"))
                    img.write(tmp_path / f"{n}.gguf")
                    files.append((description, (tmp_path / f"{n}.gguf").read_bytes()))
                assert files[0] == files[1], (t.name, kind, seed)


def test_ci_campaign_finds_nothing():
    results, seconds = run(Config(seed=0, cases=CI_CASES, time_cap=30.0))
    s = summary(results, seconds, "python -m tools.fuzz --seed 0")
    assert s["failures"] == 0, "\n" + text(s)
    accepted = {r["target"] for r in results if r["kind"] == "clean" and r["outcome"] == "accepted"}
    assert accepted >= set(TARGETS) - ({"real"} if not real_model_path().exists() else set()), accepted


PLANTED = '''
import os, signal, time
import vkdflash.model as model
from vkdflash.errors import VkdflashError

def planted(path):
    index = int(os.path.basename(str(path)).split("-")[1].split(".")[0])
    if index == 0:
        raise RuntimeError("planted crash")
    if index == 1:
        time.sleep(3600)                      # the worker's alarm reports it
    if index == 2:
        return bytearray(64 << 30)            # past the address-space cap: MemoryError
    if index == 3:
        os.kill(os.getpid(), signal.SIGSEGV)  # the worker dies
    if index == 4:
        raise VkdflashError("first line\\nsecond line")
    if index == 5:
        raise VkdflashError("x" * 1000)
    if index == 6:
        try:
            bytearray(64 << 30)
        except Exception as exc:              # a broad handler hides the cap's MemoryError in a refusal
            raise VkdflashError(f"failed: {type(exc).__name__}")
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(3600)                          # deaf to the alarm: the campaign kills it

model.inspect_file = planted
'''


def test_planted_failures_are_caught(tmp_path):
    preload = tmp_path / "plant.py"
    preload.write_text(PLANTED)
    # a short cap keeps the hangs quick; every case here fails before generation, which a cold worker
    # could not finish in 2 s (it compiles its pipelines)
    results, seconds = run(Config(seed=0, indices=list(range(8)), kinds=["clean"], targets=["llama"], workers=2,
                                  time_cap=2.0, preload=str(preload)))
    got = {r["index"]: r["outcome"] for r in results}
    assert got == {0: "crash", 1: "hang", 2: "memory", 3: "crash", 4: "multi_line", 5: "long_message", 6: "memory",
                   7: "hang"}, text(summary(results, seconds, ""))
    assert "RuntimeError at " in results[0]["signature"] and "SIGSEGV" in results[3]["detail"]
    assert results[7]["signature"] == "killed by the campaign"
    assert all(r["outcome"] in FAILURES for r in results)
