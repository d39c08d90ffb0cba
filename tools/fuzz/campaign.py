"""The campaign: a pool of long-lived worker processes (Python, Vulkan and pipeline start-up cost
seconds, a case milliseconds), each case under a wall-time cap enforced from here, a stuck or dead
worker killed or buried and replaced, and the results gathered by case index."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .mutations_raw import KINDS
from .report import FAILURES
from .targets import REAL, REPO, TARGETS, plan_case, real_model_path, write_fixtures

STARTUP_S = 180      # a worker imports vkdflash and opens the device before its first case
KILL_GRACE_S = 10    # the worker's own alarm reports a hang with its stack; past this we kill it


@dataclass
class Config:
    seed: int = 0
    cases: int = 300
    start: int = 0                  # first case index (a campaign can be split or resumed)
    workers: int = 2
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    time_cap: float = 30.0          # seconds per command; a tiny-model generation takes ~0.1 s warm, 2 s cold
    memory_mb: int = 4096           # address-space cap per worker (the Vulkan device maps ~1 GB)
    preload: str | None = None      # a Python file each worker runs first (instrumentation)
    keep: str | None = None         # keep the case files in this folder
    indices: list[int] | None = None


class WorkerProcess:
    def __init__(self, config: dict, log_path: Path, cache: Path):
        # VKDFLASH_CACHE: verify curves and the like stay out of the user's cache
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                   VKDFLASH_CACHE=str(cache))
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tools.fuzz.worker", json.dumps(config)], cwd=REPO,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)
        self.buffer = b""
        self.ready = False
        self.index: int | None = None
        self.deadline = time.monotonic() + STARTUP_S
        self.killed = False

    def send(self, index: int, seconds: float) -> None:
        self.index, self.deadline = index, time.monotonic() + seconds
        try:
            self.proc.stdin.write(b"%d\n" % index)
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died meanwhile: its end of stream reports the case
            pass

    def read_lines(self) -> list[dict] | None:
        """Complete messages now readable; None at end of stream (the worker is gone)."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def kill(self) -> None:
        self.killed = True
        self.proc.kill()

    def close(self) -> int:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # stdin of a dead worker: the pipe is broken
                pass
        return self.proc.wait()


def death(rc: int, log_tail: str) -> dict:
    """The outcome of a case whose worker died without answering (not killed by the campaign)."""
    if rc < 0:
        sig = signal.Signals(-rc).name
        if sig == "SIGKILL":
            return {"outcome": "memory", "detail": f"worker killed (SIGKILL: out of memory?) {log_tail}",
                    "signature": "worker killed"}
        return {"outcome": "crash", "detail": f"worker died of {sig} {log_tail}", "signature": f"worker {sig}"}
    return {"outcome": "crash", "detail": f"worker exited {rc} without answering {log_tail}",
            "signature": f"worker exit {rc}"}


def _log(w: WorkerProcess) -> str:
    return w.log_path.read_text(errors="replace")[-3000:]


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f"| {lines[-1][:200]}" if lines else ""


def run(config: Config, progress=None) -> tuple[list[dict], float]:
    """All cases' results in index order, and the wall time. progress(done, total, failures) is
    called every few seconds."""
    targets = list(config.targets)
    if REAL in targets and not real_model_path().exists():
        print(f"fuzz: skipping target {REAL}: {real_model_path()} is absent (any `vkdflash generate` without -m "
              "fetches it)", file=sys.stderr)
        targets.remove(REAL)
    indices = config.indices if config.indices is not None else list(range(config.start, config.start + config.cases))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vkdflash-fuzz-") as tmp:
        run_dir = Path(tmp)
        fixtures = Path(config.keep or run_dir) / "fixtures"  # kept too: drafts replay with their -m target
        fixtures.mkdir(parents=True, exist_ok=True)
        write_fixtures(fixtures)
        base = dict(asdict(config), targets=targets, fixtures=str(fixtures), real_model=str(real_model_path()))
        hard_cap = 2 * config.time_cap + KILL_GRACE_S  # two commands per case, each under the worker's alarm
        results = Pool(base, run_dir, hard_cap).run(indices, config.workers, progress)
    return [results[i] for i in indices], time.monotonic() - t0


class Pool:
    """Worker processes fed case indices; one that ends is replaced while cases remain."""

    def __init__(self, base: dict, run_dir: Path, hard_cap: float):
        self.base, self.run_dir, self.hard_cap = base, run_dir, hard_cap
        self.sel = selectors.DefaultSelector()
        self.spawned, self.results, self.pending, self.workers = 0, {}, deque(), []

    def spawn(self) -> WorkerProcess:
        self.spawned += 1
        n = self.spawned
        w = WorkerProcess(dict(self.base, scratch=str(self.run_dir / f"scratch-{n}")),
                          self.run_dir / f"worker-{n}.log", self.run_dir / "cache")
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def bury(self, w: WorkerProcess) -> None:
        """Replace a worker that ended; the case it was running, if any, is reported from here."""
        self.sel.unregister(w.proc.stdout)
        rc = w.close()
        if not w.ready:
            raise RuntimeError(f"a fuzz worker failed to start (exit {rc}); its log:\n" + _log(w))
        if w.index is not None:
            plan = plan_case(self.base["seed"], w.index, self.base["kinds"], self.base["targets"])[0]
            outcome = death(rc, _tail(w.log_path)) if not w.killed else {
                "outcome": "hang", "detail": f"killed after {self.hard_cap:g} s", "signature": "killed by the campaign"}
            self.results[w.index] = dict(index=w.index, kind=plan.kind, target=plan.target, chat=plan.chat, **outcome)
        self.workers[self.workers.index(w)] = self.spawn() if self.pending else None

    def run(self, indices: list[int], n_workers: int, progress) -> dict[int, dict]:
        self.pending.extend(indices)
        self.workers = [self.spawn() for _ in range(min(n_workers, len(indices)))]
        try:
            self._loop(len(indices), progress)
        finally:  # an interrupted campaign leaves no worker behind
            for w in self.workers:
                if w is not None:
                    w.kill()
                    w.close()
        return self.results

    def _loop(self, total: int, progress) -> None:
        last_report = time.monotonic()
        while len(self.results) < total:
            for w in self.workers:
                if w is not None and w.ready and w.index is None and self.pending:
                    w.send(self.pending.popleft(), self.hard_cap)
            timed = [w for w in self.workers if w is not None and (w.index is not None or not w.ready)]
            timeout = min((w.deadline for w in timed), default=time.monotonic() + 1) - time.monotonic()
            for key, _ in self.sel.select(timeout=min(max(timeout, 0), 5.0)):
                self._receive(key.data)
            now = time.monotonic()
            for w in [w for w in timed if now > w.deadline and not w.killed and w in self.workers]:
                if not w.ready:
                    raise RuntimeError(f"a fuzz worker did not start within {STARTUP_S} s; its log:\n" + _log(w))
                w.kill()  # its end of stream comes next and reports the case as a hang
            if progress and now - last_report > 10:
                last_report = now
                progress(len(self.results), total, sum(r["outcome"] in FAILURES for r in self.results.values()))

    def _receive(self, w: WorkerProcess) -> None:
        messages = w.read_lines()
        if messages is None:
            self.bury(w)
            return
        for m in messages:
            if m.get("ready"):
                w.ready = True
                continue
            self.results[m["index"]] = m
            w.index = None
            if m.pop("exit"):  # it stops after a case that may have damaged it
                self.bury(w)
                return
