#!/usr/bin/env python3
"""Record the speed figures the speculation work is judged by, side by side, into
benchmarks/<device>.json (lavapipe: <device>-<cpu>.json), so a later change can be compared with
`git diff` and a rerun.

    python tools/bench_record.py            # the default model; run on an idle machine

Figures (each from one `vkdflash bench` run): decode/prefill tok/s, the kernel-family profile
and the verify cost curve; ngram on code that repeats itself and a random DFlash draft, each
cost-aware and --draft-fixed, and the shipped DFlash draft and MTP head cost-aware (the default
prompt), alone and led by ngram (cascades; ngram+mtp is the default on the default model), each
next to plain decoding (128 tokens, alternated 5 times, medians: on a shared VM
one pair of runs moves by +-5%)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from vkdflash.errors import VkdflashError

ROOT = Path(__file__).resolve().parent.parent
# ends at "Point4:", not at the newline after it: a prompt ending in a bare "\n" token makes
# SmolLM2's greedy continuation drop the body's indentation, so it stops repeating the earlier
# classes (tokenizer boundary: the text's own "\n   " merges into one token)
REPEATING_CODE = ("class Point2:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
                  "class Point3:\n    def __init__(self, x, y, z):\n        self.x = x\n        self.y = y\n"
                  "        self.z = z\n\nclass Point4:")


def vkdflash(*args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        done = subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", *args, "--json", f.name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            command = shlex.join(["vkdflash", *args]).replace("\n", "\\n")  # the prompt's newlines: one line
            said = done.stderr.strip().splitlines()
            raise SystemExit(f"bench_record: error: `{command}` failed (exit {done.returncode})"
                             + (f": {said[-1]}" if said else ""))
        return json.loads(Path(f.name).read_text())


def spec_figures(report: dict) -> dict:
    s = report["spec"]
    return {"plain_tps": report["none_tps"], "spec_tps": report["spec_tps"], "speedup": report["speedup"],
            "speedups": report["speedups"],
            "identical_output": report["identical_output"], "drafted": s["drafted"], "accepted": s["accepted"],
            "tau": s["tau"], "mean_k": (s["draft_length"] or {}).get("mean_k"), "by_source": s.get("by_source")}


def cpu_model() -> str:
    """The host CPU (lavapipe's speed depends on it more than on the driver string)."""
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        if line.startswith("model name"):
            return f"{line.partition(':')[2].strip()} ({os.cpu_count()} cores)"
    return f"unknown ({os.cpu_count()} cores)"


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from dflash_fixtures import write_dflash
    from vkdflash.model import default_model_path
    model = str(default_model_path())
    out: dict = {"date": date.today().isoformat(), "model": Path(model).name,
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True).stdout.strip()}
    m = vkdflash("bench", "model", "-p", "64", "-n", "32", "--profile", "--verify-curve")
    out["device"] = m["device"]
    out["cpu"] = cpu_model()
    out["model_bench"] = {"decode_tps": m["decode_tps"], "prefill_tps": m["prefill_tps"],
                          "verify_curve": m["verify_curve"]["relative"],
                          "profile_ms": {n: {f: round(v["ms"], 2) for f, v in p["families"].items()}
                                         for n, p in m["profile"]["passes"].items()}}
    with tempfile.TemporaryDirectory() as d:
        draft = str(write_dflash(Path(d) / "random_dflash.gguf", model, n_layer=1, target_layers=(2, 10, 18, 26),
                                 n_head=9, n_head_kv=3, head_dim=64, n_ff=1536))
        runs = {"ngram_repeating_code": (["--spec", "ngram", "--draft-max", "16", "-p", REPEATING_CODE], True),
                "random_dflash": (["-md", draft, "--draft-max", "15"], True),
                "shipped_dflash": (["--spec", "dflash"], False), "shipped_mtp": (["--spec", "mtp"], False),
                # the default on the default model: the copy first, then the head (a cascade)
                "ngram_then_mtp": (["--spec", "ngram+mtp"], False),
                "ngram_then_dflash": (["--spec", "ngram+dflash"], False)}
        for name, (args, with_fixed) in runs.items():
            for mode in ("cost-aware", "fixed") if with_fixed else ("cost-aware",):
                extra = ["--draft-fixed"] if mode == "fixed" else []
                out.setdefault(name, {})[mode] = spec_figures(vkdflash("bench", "spec", "-n", "128", "--reps", "5",
                                                                       *args, *extra))
    # lavapipe's figures are the host CPU's: one record per CPU model, not one the next host overwrites
    name = out["device"] + (" " + out["cpu"].rpartition(" (")[0] if "llvmpipe" in out["device"] else "")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    dest = ROOT / "benchmarks" / f"{slug}.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(dest)


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError) as exc:  # the default model's download, benchmarks/ not writable
        sys.exit(f"bench_record: error: {exc}")
