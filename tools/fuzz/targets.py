"""What gets mutated and how each case runs: the clean files (the test fixtures and the real default
model's header), the plan of case i drawn from random.Random(f"{seed}:{i}"), and the command lines
that put a mutated file through `inspect` and `generate` as a user would."""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["hello world", "h\u00e9llo <|im_start|> \U0001F600", "the", "x " * 100]


@dataclass(frozen=True)
class Target:
    name: str
    mutated: str               # the clean file (in the fixture folder) each case mutates
    model: str | None = None   # the clean -m file when the mutated one is a draft or sidecar
    spec: str | None = None    # the strategy the case runs


REAL = "real"
TARGETS = {t.name: t for t in [
    Target("llama", "llama.gguf"), Target("qwen2", "qwen2.gguf"), Target("qwen3", "qwen3.gguf"),
    Target("dflash", "dflash.gguf", model="llama.gguf", spec="dflash"),
    Target("mtp_sidecar", "mtp-sidecar.gguf", model="mtp-plain.gguf", spec="mtp"),
    Target("mtp_heads", "mtp-heads.gguf", spec="mtp"),
    Target(REAL, REAL),        # the default model's header over a sparse data section
]}


def real_model_path() -> Path:
    """Where `vkdflash` caches the default model (it is not fetched here)."""
    from vkdflash.model.fetch import MEMBER, cache_dir
    return cache_dir() / Path(MEMBER).name


def write_fixtures(folder: Path) -> None:
    """The clean files, written with the test suite's own fixture writers."""
    sys.path.insert(0, str(REPO / "tests"))
    import mtp_fixtures
    from dflash_fixtures import write_dflash
    from gguf_fixtures import write_model
    small = dict(n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)  # head_dim 64: the rotation applies
    llama = write_model(folder / "llama.gguf", "llama", seed=3, **small)
    write_model(folder / "qwen2.gguf", "qwen2", weight_type="q4_0", **small)
    write_model(folder / "qwen3.gguf", "qwen3", weight_type="f16", n_embd=64, n_ff=128, n_head=4, n_head_kv=2)
    write_dflash(folder / "dflash.gguf", llama)
    mtp_fixtures.write_target(folder / "mtp-plain.gguf", n_nextn=0)
    mtp_fixtures.write_sidecar(folder / "mtp-sidecar.gguf")
    mtp_fixtures.write_target(folder / "mtp-heads.gguf", "qwen3")


@dataclass(frozen=True)
class Plan:
    index: int
    kind: str
    target: str
    chat: bool
    name_spec: bool   # pass --spec (else the -md file's plugin claims it)
    prompt: str
    n_ctx: int


def plan_case(seed: int, index: int, kinds: list[str], targets: list[str]) -> tuple[Plan, random.Random]:
    """Case `index`: kinds take turns, and within a kind the targets (each pair once in every
    len(kinds) * len(targets) cases); the rest is drawn, and the generator is returned so that the
    mutation continues the same stream."""
    rng = random.Random(f"{seed}:{index}")
    kind, target = kinds[index % len(kinds)], targets[index // len(kinds) % len(targets)]
    chat, name_spec, prompt = rng.random() < 0.3, rng.random() < 0.5, rng.choice(PROMPTS)
    chat = chat or kind == "chat_template"
    # a context too small for the prompt is refused before drafts load: only sometimes, never for the control
    n_ctx = 32 if kind != "clean" and not chat and rng.random() < 0.2 else 512
    return Plan(index, kind, target, chat, name_spec, prompt, n_ctx), rng


def commands(plan: Plan, mutated: Path, fixtures: Path) -> list[list[str]]:
    """inspect, then a two-token greedy generation (run even when inspect refused: generate loads
    files along other paths, drafts and sidecars among them)."""
    t = TARGETS[plan.target]
    gen = ["generate", "-n", "2", "--temp", "0", "-c", str(plan.n_ctx)] + (["--chat"] if plan.chat else [])
    if t.model is None:
        gen += ["-m", str(mutated)]
    else:
        gen += ["-m", str(fixtures / t.model), "-md", str(mutated)]
    if t.spec is not None:
        # a fixed draft length skips measuring the verify cost curve, seconds per new file
        gen += (["--spec", t.spec] if plan.name_spec or t.model is None else []) + ["--draft-fixed"]
    return [["inspect", str(mutated)], gen + ["--", plan.prompt]]
