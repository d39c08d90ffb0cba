#!/usr/bin/env python3
"""Compile shaders/*.comp to SPIR-V shipped in src/vkdflash/spirv/, validating each with spirv-val.

A .comp declares its variants in lines of the form
    //! variant NAME DEFINE=VALUE ...
(none: one variant named after the file), and may multiply them along one axis:
    //! each DEFINE KEY=VALUE ...
makes NAME_KEY of every variant with DEFINE=VALUE added (a constant the compiler folds, so each
module holds only its own code: lavapipe spends most of a pipeline's creation on the module's
size), and may drop the products no code path can dispatch:
    //! omit GLOB ...
The manifest records a hash of each variant's
inputs (source, includes, defines, flags) so a test can tell when shipped SPIR-V is stale
without needing a compiler.

    python tools/build_shaders.py          # rebuild what changed
    python tools/build_shaders.py --check  # exit 1 if anything is stale
"""
from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHADERS = ROOT / "shaders"
OUT = ROOT / "src" / "vkdflash" / "spirv"
MANIFEST = OUT / "manifest.json"
FLAGS = ["--target-env=vulkan1.2", "-O", "-fshader-stage=compute"]
INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.M)
VARIANT = re.compile(r"^//!\s*variant\s+(\S+)(.*)$", re.M)
EACH = re.compile(r"^//!\s*each\s+(\S+)(.*)$", re.M)
OMIT = re.compile(r"^//!\s*omit\s+(.*)$", re.M)


def includes(path: Path, seen: set | None = None) -> list[Path]:
    seen = set() if seen is None else seen
    for name in INCLUDE.findall(path.read_text()):
        inc = SHADERS / name
        if inc not in seen:
            seen.add(inc)
            includes(inc, seen)
    return sorted(seen)


def variants(comp: Path) -> list[tuple[str, list[str]]]:
    text = comp.read_text()
    found = [(name, args.split()) for name, args in VARIANT.findall(text)] or [(comp.stem, [])]
    for define, values in EACH.findall(text):
        found = [(f"{name}_{key}", defines + [f"{define}={value}"])
                 for name, defines in found for key, value in (kv.split("=", 1) for kv in values.split())]
    omitted = [glob for line in OMIT.findall(text) for glob in line.split()]
    return [(name, defines) for name, defines in found if not any(fnmatch.fnmatchcase(name, g) for g in omitted)]


def input_hash(comp: Path, defines: list[str]) -> str:
    h = hashlib.sha256()
    for p in [comp, *includes(comp)]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(FLAGS + defines).encode())
    return h.hexdigest()


def plan() -> dict[str, dict]:
    out = {}
    for comp in sorted(SHADERS.glob("*.comp")):
        for name, defines in variants(comp):
            if name in out:
                sys.exit(f"duplicate shader variant {name} in {comp.name} and {out[name]['source']}")
            out[name] = {"source": comp.name, "defines": defines, "inputs": input_hash(comp, defines)}
    return out


def stale(wanted: dict, manifest: dict) -> list[str]:
    bad = [n for n, v in wanted.items()
           if manifest.get(n, {}).get("inputs") != v["inputs"] or not (OUT / f"{n}.spv").exists()
           or hashlib.sha256((OUT / f"{n}.spv").read_bytes()).hexdigest() != manifest[n].get("spirv")]
    bad += [n for n in manifest if n not in wanted]
    return bad


def compile_one(name: str, entry: dict) -> str | None:
    spv = OUT / f"{name}.spv"
    cmd = ["glslc", *FLAGS, f"-I{SHADERS}", *[f"-D{d}" for d in entry["defines"]],
           str(SHADERS / entry["source"]), "-o", str(spv)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return f"{name}: {res.stderr.strip()}"
    res = subprocess.run(["spirv-val", "--target-env", "vulkan1.2", str(spv)], capture_output=True, text=True)
    if res.returncode:
        return f"{name}: spirv-val: {res.stderr.strip()}{res.stdout.strip()}"
    entry["spirv"] = hashlib.sha256(spv.read_bytes()).hexdigest()
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale SPIR-V, build nothing")
    ap.add_argument("--force", action="store_true", help="rebuild every variant")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT.parent / ".spirv.lock", "w") as lock:  # concurrent builds take turns
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build(args)


def build(args) -> int:
    wanted = plan()
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    todo = list(wanted) if args.force else stale(wanted, manifest)
    if args.check:
        for n in todo:
            print(f"stale: {n}")
        return 1 if todo else 0
    for tool in ("glslc", "spirv-val"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install glslc spirv-tools")
    build = [n for n in todo if n in wanted]
    with ThreadPoolExecutor() as pool:
        errors = [e for e in pool.map(lambda n: compile_one(n, wanted[n]), build) if e]
    for n, entry in wanted.items():
        if n not in build:
            entry["spirv"] = manifest[n]["spirv"]
    for n in manifest:
        if n not in wanted:
            (OUT / f"{n}.spv").unlink(missing_ok=True)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    MANIFEST.write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    print(f"built {len(build)} of {len(wanted)} shader variants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
