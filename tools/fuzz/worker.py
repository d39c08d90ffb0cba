"""A fuzz worker: builds case i's mutated file, runs the vkdflash CLI on it in-process and answers
one JSON line per case. Started by campaign.py as `python -m tools.fuzz.worker CONFIG_JSON`; reads
case indices on stdin. It exits after a case that may have left it damaged (crash, hang, memory)
or once its address space has grown past half the cap; the campaign then starts a fresh one."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import resource
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from .gguf_image import read
from .mutations_raw import mutate
from .targets import REAL, REPO, TARGETS, commands, plan_case

LONG_MESSAGE = 400          # characters: error messages should quote at most ~80 of the file's
FATAL = {"crash", "hang", "memory", "harness_error"}


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so that `except Exception` in the code under test lets it through."""


def _alarm(signum, frame):
    raise CaseTimeout()


def frame_text(frame) -> str:
    path = Path(frame.filename)
    try:
        shown = path.relative_to(REPO)
    except ValueError:
        shown = Path(*path.parts[-2:])
    return f"{shown}:{frame.lineno} {frame.name}"


def where(exc: BaseException) -> tuple[str, str]:
    """(innermost frame in vkdflash or its plugins, innermost frame of all), as text."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?", "?"
    own = [f for f in frames if f.filename.startswith((str(REPO / "src"), str(REPO / "plugins")))]
    return frame_text((own or frames)[-1]), frame_text(frames[-1])


def classify_exit(code, stderr: str) -> dict:
    if code in (0, None):
        return {"outcome": "accepted"}
    if code == 2:
        return {"outcome": "usage", "detail": stderr.strip()[-300:]}
    at = stderr.find("vkdflash: error: ")
    if code != 1 or at < 0:
        return {"outcome": "crash", "detail": f"exit {code} without a one-line error: {stderr.strip()[-200:]!r}",
                "signature": f"exit {code}"}
    message = stderr[at + len("vkdflash: error: "):].rstrip("\n")
    # code that catches broadly can turn the cap's MemoryError or the alarm into a refusal: still a failure
    for caught, outcome in (("MemoryError", "memory"), ("CaseTimeout", "hang")):
        if caught in message:
            return {"outcome": outcome, "detail": f"{caught} caught and refused: {message[:200]!r}",
                    "signature": f"{caught} caught: {message[:60]}"}
    if "\n" in message:
        return {"outcome": "multi_line", "detail": repr(message[:300]), "signature": message.split("\n")[0][:60]}
    if len(message) > LONG_MESSAGE:
        return {"outcome": "long_message", "detail": f"{len(message)} chars: {message[:200]!r}...",
                "signature": message[:60]}
    return {"outcome": "refused", "detail": message[:300]}


def run_cli(argv: list[str], time_cap: float) -> dict:
    """One CLI command in this process, classified."""
    from vkdflash.cli import main
    err = io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, time_cap)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main.main(args=argv, prog_name="vkdflash")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) or exc.code is None else 1
    except CaseTimeout as exc:
        own, last = where(exc)
        return {"outcome": "hang", "detail": f"still running after {time_cap:g} s at {own} (in {last})",
                "signature": f"at {own}"}
    except MemoryError as exc:
        own, last = where(exc)
        return {"outcome": "memory", "detail": f"MemoryError at {own} (in {last})", "signature": f"at {own}"}
    except BaseException as exc:  # anything else is a traceback the user would see
        own, last = where(exc)
        text = " ".join(str(exc).split())[:200]
        return {"outcome": "crash", "detail": f"{type(exc).__name__}: {text} at {own} (in {last})",
                "signature": f"{type(exc).__name__} at {own}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return classify_exit(code, err.getvalue())


class OneDevice:
    """The CLI opens a Vulkan device per command and closes it after: right for a user, but a
    worker would recompile every pipeline (1.3 s on lavapipe) per case. Here one device serves
    every case (its close is put off) and what a command left on it (a model whose construction
    failed half-way) is released after it; the files under test never reach device creation."""

    def __init__(self):
        import vkdflash.runtime.context as rc
        self.devices = {}
        new_device = rc.Context

        def device(selector=None):
            if selector not in self.devices:
                ctx = self.devices[selector] = new_device(selector)
                ctx.close = ctx.release  # the device stays for the next case
            return self.devices[selector]
        rc.Context = device


class Worker:
    def __init__(self, config: dict):
        self.config = config
        self.fixtures = Path(config["fixtures"])
        self.scratch = Path(config["keep"] or config["scratch"])
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.images = {}
        self.device = OneDevice()

    def image(self, target: str):
        if target not in self.images:
            path = self.config["real_model"] if target == REAL else self.fixtures / TARGETS[target].mutated
            self.images[target] = read(path, keep_data=target != REAL)
        return self.images[target]

    def run(self, index: int) -> dict:
        c = self.config
        plan, rng = plan_case(c["seed"], index, c["kinds"], c["targets"])
        result = {"index": index, "kind": plan.kind, "target": plan.target, "chat": plan.chat}
        t0 = time.perf_counter()
        try:
            img = self.image(plan.target).copy()
            result["mutation"] = mutate(img, plan.kind, rng)
            path = self.scratch / f"case-{index}.gguf"
            img.write(path)
        except Exception as exc:  # a bug of the fuzzer itself: counted, never hidden
            last = where(exc)[1]
            return dict(result, outcome="harness_error", detail=f"{type(exc).__name__}: {exc} at {last}",
                        signature=f"{type(exc).__name__} at {last}")
        steps = []
        try:
            for argv in commands(plan, path, self.fixtures):
                step = run_cli(argv, c["time_cap"])
                steps.append(step)
                if step["outcome"] in FATAL:
                    break
        finally:
            if not c["keep"]:
                path.unlink(missing_ok=True)
        worst = next((s for s in steps if s["outcome"] not in ("accepted", "refused", "usage")), steps[-1])
        if plan.kind == "clean" and worst["outcome"] in ("refused", "usage"):
            worst = {"outcome": "harness_error", "detail": f"the clean file was not accepted: {worst.get('detail')}",
                     "signature": "clean file not accepted"}
        result.update(worst, steps=[s["outcome"] for s in steps], seconds=round(time.perf_counter() - t0, 3))
        if c["keep"]:
            result["replay"] = [shlex.join(["vkdflash"] + argv) for argv in commands(plan, path, self.fixtures)]
        return result


class CurrentStderr:
    """The CLI's log handler writes here, so each command's warnings land in that command's capture."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def address_space_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") >> 20


def main() -> None:
    config = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # native code that prints to stdout must not corrupt the protocol
    cap = config["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _alarm)
    logging.basicConfig(stream=CurrentStderr(), format="vkdflash: %(message)s")  # the CLI's own setup then keeps it
    if config["preload"]:
        import runpy
        runpy.run_path(config["preload"])
    worker = Worker(config)
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        result = worker.run(int(line))
        result["exit"] = result["outcome"] in FATAL or address_space_mb() > config["memory_mb"] // 2
        proto.write(json.dumps(result) + "\n")
        if result["exit"]:
            break


if __name__ == "__main__":
    main()
