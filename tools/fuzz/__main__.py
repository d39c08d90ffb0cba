"""python -m tools.fuzz: run a seeded campaign of hostile GGUF files through `vkdflash inspect` and
`vkdflash generate` (from the repository root). Exits 1 when any case crashed, hung, ran out of
memory or printed an error longer than one short line."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from .campaign import Config, run
from .mutations_raw import KINDS
from .report import summary, text
from .targets import REAL, TARGETS, real_model_path

# a worker's address space reaches ~1.1-1.4 GB once it has opened the Vulkan device (lavapipe) and run
# a case; under ~1.5 GB cases fail from the cap itself, not from the file under test
MIN_MEMORY_MB = 2048


def _names(value: str, known) -> list[str]:
    names = [n for n in value.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (known: {', '.join(known)})")
    if not names:
        raise argparse.ArgumentTypeError(f"names none (known: {', '.join(known)})")
    return names


def _at_least(low: int):
    def check(value: str) -> int:
        n = int(value)
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {n}")
        return n
    check.__name__ = "integer"  # argparse names the type in "invalid integer value"
    return check


def _existing_file(value: str) -> str:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value} is not a file")
    return value


def _writable_file(value: str) -> str:
    """Checked now: the summary is written only after the whole campaign."""
    folder = Path(value).parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value} cannot be written")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=_at_least(1), default=300, help="number of cases (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=_at_least(0), default=0, help="first case index")
    p.add_argument("--workers", type=_at_least(1), default=2, help="worker processes (default 2)")
    p.add_argument("--kinds", type=lambda v: _names(v, KINDS), default=list(KINDS),
                   help="mutation kinds, comma-separated: " + ",".join(KINDS))
    p.add_argument("--targets", type=lambda v: _names(v, TARGETS), default=list(TARGETS),
                   help="files to mutate, comma-separated: " + ",".join(TARGETS))
    p.add_argument("--only-index", type=_at_least(0), metavar="I",
                   help="run case I alone and print everything about it")
    p.add_argument("--keep", metavar="DIR", help="keep the mutated files in DIR (to reproduce by hand)")
    p.add_argument("--time-cap", type=float, default=30.0, help="seconds per command before a case is a hang")
    p.add_argument("--memory-mb", type=_at_least(MIN_MEMORY_MB), default=4096,
                   help=f"address-space cap per worker (default 4096, at least {MIN_MEMORY_MB})")
    p.add_argument("--preload", type=_existing_file, metavar="FILE",
                   help="a Python file each worker runs before its cases")
    p.add_argument("--json", type=_writable_file, metavar="FILE",
                   help="also write the summary and every failed case as JSON")
    a = p.parse_args(argv)
    if not (math.isfinite(a.time_cap) and a.time_cap > 0):
        p.error(f"argument --time-cap: {a.time_cap:g} is not a positive number of seconds")
    if a.targets == [REAL] and not real_model_path().exists():
        p.error(f"--targets {REAL}: {real_model_path()} is absent (any `vkdflash generate` without -m fetches it)")
    config = Config(seed=a.seed, cases=a.cases, start=a.start, workers=a.workers, kinds=a.kinds, targets=a.targets,
                    time_cap=a.time_cap, memory_mb=a.memory_mb, preload=a.preload, keep=a.keep,
                    indices=None if a.only_index is None else [a.only_index])
    if a.only_index is not None:
        config.workers = 1
    results, seconds = run(config, lambda done, total, bad: print(
        f"fuzz: {done}/{total} cases, {bad} failures", file=sys.stderr, flush=True))
    replay = " ".join(["python -m tools.fuzz --seed", str(a.seed)]
                      + (["--kinds", ",".join(a.kinds)] if a.kinds != list(KINDS) else [])
                      + (["--targets", ",".join(a.targets)] if a.targets != list(TARGETS) else []))
    s = summary(results, seconds, replay)
    if a.only_index is not None:
        print(json.dumps(results[0], indent=1))
    print(text(s))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as exc:  # --keep a file, a full disk: one line, not a traceback
        sys.exit(f"python -m tools.fuzz: error: {exc}")
