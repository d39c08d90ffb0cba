#!/usr/bin/env python3
"""vkdflash's first run on a real GPU, prepared here and made in three calls of the workplace's
`device` tool (a lent NVIDIA machine: no package index, and a call carries at most 64 MiB with
the ~30 MiB working tree, while the default model is 94 MiB).

    python tools/device_check.py prepare      # here: .device/ (git-excluded) with the Vulkan
                                              # loader, the wheels the device image lacks and the
                                              # model in three parts; prints the three calls
    python3 tools/device_check.py stage N     # there (N = 1, 2, 3), results into $OUT

Stage 1 unpacks the loader, installs the wheels and the package's entry points (no build: the
sources run from src/ and plugins/), then runs `devices` and `conformance`; stage 2 the kernel
benchmark and the device-generic tests; stage 3 joins the model (sha256 checked) and runs
`bench model --profile --verify-curve`, `bench spec` for ngram, mtp and dflash, a cold
`generate --spec dflash` (the issue-10 check, where verify is nearly free), the model tests and
six suite prompts at three draft cache types. Every step has a time
limit; one that fails or hangs is logged and the next runs. Each stage ends with a summary on
stdout (what the tool shows) and leaves log.txt and JSON in $OUT."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

from bench_record import REPEATING_CODE, spec_figures  # this folder: the record's prompt and figures
from vkdflash.errors import VkdflashError

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / ".device"
CALL_LIMIT = 64 << 20  # bytes one call carries, working tree included
WHEELS = ("vulkan", "cffi", "pycparser", "gguf")  # what vkdflash needs beyond the device image
LOADER_DEBS = ("libvulkan1",)
NVIDIA_ICD = Path("/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json")
PARTS = 3
MODEL = DEV / "model.gguf"
# kernel and runtime tests that need no model (stage 2) and those that do (stage 3)
KERNEL_TESTS = ("test_conformance.py", "test_matmul.py", "test_attention.py", "test_kv_store.py",
                "test_hadamard.py", "test_runtime.py", "test_ops.py")
MODEL_TESTS = ("test_model.py", "test_spec.py")


# -- here -------------------------------------------------------------------------------------
def prepare(python: str) -> None:
    from vkdflash.model import default_model_path
    exclude = ROOT / subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout.strip()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.device/" not in (exclude.read_text().split() if exclude.exists() else []):
        with exclude.open("a") as f:
            f.write("/.device/\n")
    for sub in ("whl", "gl"):
        (DEV / sub).mkdir(parents=True, exist_ok=True)
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
         python, "--implementation", "cp", *platforms, "-d", DEV / "whl", *(f"{w}=={version(w)}" for w in WHEELS)])
    if subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip() != "amd64":
        sys.exit("prepare: the loader .deb is fetched for this machine's architecture, and the device is amd64")
    run(["apt-get", "download", *LOADER_DEBS], cwd=DEV / "gl")
    model = default_model_path()
    data = model.read_bytes()
    cut = -(-len(data) // PARTS)
    for i in range(PARTS):
        (DEV / f"model.{i}").write_bytes(data[i * cut:(i + 1) * cut])
    calls = [[".device/whl", ".device/gl", ".device/model.0"]] + [[f".device/model.{i}"] for i in range(1, PARTS)]
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    tree = sum((ROOT / p).stat().st_size for p in listed.split("\0") if p)
    print(f"prepared {DEV}: working tree {tree / 2**20:.1f} MiB; then, back to back (a machine idles out in 30 s):")
    for n, carry in enumerate(calls, 1):
        size = tree + sum(f.stat().st_size for c in carry for f in _files(ROOT / c))
        if size > CALL_LIMIT:
            sys.exit(f"prepare: call {n} would carry {size / 2**20:.1f} MiB, over the 64 MiB a call takes")
        print(f"  run(command='python3 tools/device_check.py stage {n}', carry={json.dumps(carry)}, "
              f"timeout_s=600)   # {size / 2**20:.1f} MiB")
    print("then give_back.")


def _files(path: Path):
    return [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]


def run(cmd, **kw) -> None:
    subprocess.run([str(c) for c in cmd], check=True, **kw)


# -- there ------------------------------------------------------------------------------------
class Stage:
    def __init__(self, out: Path):
        self.out, self.summary = out, []
        self.log = open(out / "log.txt", "a")
        site = DEV / "site"
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, (ROOT / "src", ROOT / "plugins", site))),
                        PYTHONUNBUFFERED="1", VKDFLASH_CURVES=str(DEV / "verify-curves.json"),
                        VKDFLASH_CACHE=str(DEV / "cache"))
        if NVIDIA_ICD.exists():
            self.env.setdefault("VK_DRIVER_FILES", str(NVIDIA_ICD))

    def step(self, name: str, cmd, timeout: int, stdout_to: str | None = None) -> bool:
        """Run one step; its output goes to log.txt (stdout to a file of $OUT where named)."""
        t0 = time.time()
        try:
            done = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=self.env, capture_output=True, timeout=timeout)
            rc, so, se = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            rc, so, se = f"timed out after {timeout} s", exc.stdout or b"", exc.stderr or b""
        so, se = (b.decode(errors="replace") if isinstance(b, bytes) else b for b in (so, se))
        took = time.time() - t0
        if stdout_to:
            (self.out / stdout_to).write_text(so)
        self.log.write(f"==== {name} ({took:.1f} s, exit {rc})\n$ {' '.join(map(str, cmd))}\n"
                       f"{'' if stdout_to else so}{se}\n")
        self.log.flush()
        tails = [t.strip().splitlines()[-1][:240] for t in ("" if stdout_to else so, se) if t.strip()]
        self.summary.append(f"{name}: exit {rc} in {took:.0f} s" + "".join(f" | {t}" for t in tails))
        return rc == 0

    def cli(self, name: str, *args, timeout: int, stdout_to: str | None = None) -> bool:
        return self.step(name, [sys.executable, "-c", "from vkdflash.cli import main; main()", *args], timeout,
                         stdout_to)

    def finish(self) -> None:
        self.log.close()
        print("\n".join(self.summary))


def setup(st: Stage) -> None:
    """The loader (every stage, as the device notes ask), then, once, the wheels and the
    package's entry points: all that installing it would add to running from the sources."""
    for deb in sorted((DEV / "gl").glob("*.deb")):
        st.step(f"unpack {deb.name}", ["dpkg", "-x", deb, "/"], 60)
    st.step("ldconfig", ["ldconfig"], 60)
    site = DEV / "site"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name']}-{project['version']}.dist-info"
    if info.exists() or not st.step("install wheels", [
            sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", site,
            *sorted((DEV / "whl").glob("*.whl"))], 120):
        return
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("[vkdflash]\n" + "".join(
        f"{k} = {v}\n" for k, v in project["entry-points"]["vkdflash"].items()))


def join_model(st: Stage) -> bool:
    """The parts joined into the model cache (sha256 checked), so commands find the default model."""
    with open(MODEL, "wb") as f:
        for i in range(PARTS):
            f.write((DEV / f"model.{i}").read_bytes())
    return st.step("join the model", [sys.executable, "-c", "import sys; from vkdflash.model.fetch import adopt; "
                                      "print(adopt(sys.argv[1]))", MODEL], 60)


def stage(n: int, out: Path) -> None:
    st = Stage(out)
    setup(st)
    tests = ROOT / "tests"
    if n == 1:
        st.cli("devices", "devices", "--json", timeout=60, stdout_to="devices.json")
        st.cli("conformance", "conformance", "--json", out / "conformance.json", timeout=300)
    elif n == 2:
        st.cli("bench kernels", "bench", "kernels", "--json", out / "bench-kernels.json", timeout=120)
        st.step("kernel tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 *(tests / t for t in KERNEL_TESTS), "--junitxml", out / "kernel-tests.xml"], 300)
    elif join_model(st):
        st.cli("bench model", "bench", "model", "--profile", "--verify-curve", "--json", out / "bench-model.json",
               timeout=90)
        for name, extra in (("ngram", ("-p", REPEATING_CODE, "--draft-max", "16")), ("mtp", ()), ("dflash", ())):
            st.cli(f"bench spec {name}", "bench", "spec", "--spec", name, *extra, "-n", "128", "--reps", "3",
                   "--json", out / f"spec-{name}.json", timeout=90)
        st.cli("generate --spec dflash (cold, no curve)", "generate", "--spec", "dflash", "def is_prime(n):",
               timeout=60, stdout_to="generate-dflash.txt")
        st.step("model tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                *(tests / t for t in MODEL_TESTS), "--junitxml", out / "model-tests.xml"], 120)
        st.cli("suite (6 prompts, greedy)", "bench", "spec", "--suite", "default", "--suite-prompts", "6",
               "--suite-temps", "0", "--suite-cache-types", "f16,q8_0,q4_0", "--suite-runs", "dflash:7,mtp:2",
               "--json", out / "suite.json", timeout=150)
        st.summary += figures(out)
    st.finish()


def figures(out: Path) -> list[str]:
    """The figures the issues ask about, from stage 3's JSON (whatever was written)."""
    lines = []
    try:
        m = json.loads((out / "bench-model.json").read_text())
        lines.append(f"decode {m['decode_tps']:.1f} tok/s, prefill {m['prefill_tps']:.1f} tok/s; n-row pass / 1-row: "
                     + ", ".join(f"{n}: {r:.2f}x" for n, r in m["verify_curve"]["relative"].items()))
    except (OSError, ValueError, KeyError) as exc:
        lines.append(f"bench model: no figures ({exc!r})")
    for name in ("ngram", "mtp", "dflash"):
        try:
            f = spec_figures(json.loads((out / f"spec-{name}.json").read_text()))
            lines.append(f"{name}: {f['speedup']:.2f}x plain ({f['plain_tps']:.1f} -> {f['spec_tps']:.1f} tok/s), "
                         f"tau {f['tau']:.2f}" + ("" if f["mean_k"] is None else f", mean k {f['mean_k']:.2f}"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            lines.append(f"bench spec {name}: no figures ({exc!r})")
    try:
        for r in json.loads((out / "suite.json").read_text())["runs"]:
            lines.append(f"suite {r['strategy']} {r['cache']}: acceptance {r['acceptance']:.3f}, tau {r['tau']:.2f}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        lines.append(f"suite: no figures ({exc!r})")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--python", default="3.12", help="the device image's Python, which the wheels are for")
    s = sub.add_parser("stage")
    s.add_argument("n", type=int, choices=range(1, PARTS + 1))
    s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "device-out")))
    a = ap.parse_args(argv)
    if a.what == "prepare":
        prepare(a.python)
        return
    # a stage unpacks .debs into / and runs ldconfig: only on the lent machine, which has the NVIDIA
    # driver (its ICD, its device node); a developer's machine has its own loader and must keep it
    if not (NVIDIA_ICD.exists() or Path("/dev/nvidiactl").exists()):
        sys.exit(f"device_check: error: stage {a.n} runs on the lent device machine only (no {NVIDIA_ICD} here): "
                 "run `prepare` here and make the calls it prints")
    needs = [DEV / f"model.{i}" for i in range(PARTS)] if a.n == 3 else [DEV / "gl", DEV / "whl"]
    missing = [part.name for part in needs if not part.exists()]
    if missing:
        sys.exit(f"device_check: error: .device/ lacks {', '.join(missing)}: run `tools/device_check.py prepare` "
                 "first, then the calls it prints, back to back")
    a.out.mkdir(parents=True, exist_ok=True)
    stage(a.n, a.out)


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError, subprocess.CalledProcessError) as exc:  # the model's download, a failed pip
        sys.exit(f"device_check: error: {exc}")
