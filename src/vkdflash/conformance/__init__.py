"""Cross-device conformance: every kernel x type x shape against a numpy reference.

Each module in this package defines `cases()` yielding Case objects; the runner finds the
modules itself, so adding a kernel family means adding one module here. Method and
thresholds: docs/design.md section 7 (seeded inputs in [-1, 1], NMSE, NaN fails, infinities
must match in sign, a guard region after every output stays untouched)."""
from __future__ import annotations

import fnmatch
import importlib
import pkgutil
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import VkdflashError
from ..runtime.graph import Graph

# docs/design.md section 7
NMSE_DEFAULT = 1e-7
NMSE_SOFTMAX = 1e-6
NMSE_MATMUL = 5e-4
NMSE_ATTENTION = 5e-4

GUARD_BYTES = 256
GUARD_BYTE = 0xA5


@dataclass
class Case:
    """One conformance check. `run(ctx)` returns (got, want) arrays.

    metric: "nmse" (threshold is the NMSE bound), "exact" (bitwise equal), or "quant"
    (bytes of quantized blocks: equal, or dequantized values at most one quant step apart,
    `run` then returns (got_dequant, want_dequant, step) via `extra`)."""
    name: str
    run: Callable
    metric: str = "nmse"
    threshold: float = NMSE_DEFAULT
    slow: bool = False
    tags: tuple = field(default_factory=tuple)


@dataclass
class Result:
    case: Case
    ok: bool
    error: float
    detail: str = ""


def rng(*key) -> np.random.Generator:
    """A seeded generator per case, so every device sees the same inputs."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def uniform(r: np.random.Generator, *shape) -> np.ndarray:
    return r.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    denom = float(np.sum(want * want))
    err = float(np.sum((got - want) ** 2))
    return err / denom if denom else err


def compare(case: Case, got, want, step=None) -> Result:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Result(case, False, float("inf"), f"shape {got.shape} != {want.shape}")
    # NaN anywhere fails, whatever the metric: an "exact" NaN in both would pass bit for bit
    for what, a in (("output", got), ("reference", want)):
        if a.dtype.kind == "f" and np.isnan(a).any():
            return Result(case, False, float("inf"), f"NaN in the {what}")
    if case.metric == "exact":
        same = np.array_equal(got.view(np.uint8) if got.dtype.kind == "f" else got,
                              want.astype(got.dtype).view(np.uint8) if got.dtype.kind == "f" else want)
        diff = int(np.count_nonzero(got != want))
        return Result(case, same, float(diff), "" if same else f"{diff} values differ")
    if case.metric == "quant":
        # step: per-value quantization step; allowed one step where float rounding differs
        off = np.abs(got.astype(np.float64) - want) / np.maximum(step, 1e-30)
        worst = float(off.max()) if off.size else 0.0
        return Result(case, worst <= 1.0 + 1e-6, worst, f"{int(np.count_nonzero(off > 1e-6))} values off")
    if got.dtype.kind == "f":
        inf_g, inf_w = np.isinf(got), np.isinf(want)
        if not np.array_equal(inf_g, inf_w) or not np.array_equal(np.sign(got[inf_g]), np.sign(want[inf_w])):
            return Result(case, False, float("inf"), "infinities differ")
        got, want = np.where(inf_g, 0, got), np.where(inf_w, 0, want)
    err = nmse(got, want)
    return Result(case, err <= case.threshold, err)


class Output:
    """Output buffers, each followed by a guard region the kernel must not touch. The parts share
    one device buffer (multi-output kernels need that) at 256-byte offsets, which every device can
    bind, with at least GUARD_BYTES between them; every byte outside the parts is checked."""

    def __init__(self, ctx, *sizes: int):
        self.parts, end = [], 0
        for size in sizes:
            start = -(-end // 256) * 256
            self.parts.append((start, int(size)))
            end = start + int(size) + GUARD_BYTES
        self.buffer = ctx.buffer(end)
        self.buffer.write(np.full(end, GUARD_BYTE, np.uint8))
        self.views = [self.buffer.view(start, size) for start, size in self.parts]

    def read(self, dtype=np.float32) -> np.ndarray:
        """The parts, one after another, as a flat `dtype` array."""
        raw = self.buffer.read(np.uint8)
        outside = np.ones(len(raw), bool)
        for start, size in self.parts:
            outside[start:start + size] = False
        if (raw[outside] != GUARD_BYTE).any():
            raise VkdflashError("kernel wrote past the end of its output (guard region changed)")
        return np.concatenate([raw[start:start + size] for start, size in self.parts]).view(dtype)

    def destroy(self) -> None:
        self.buffer.destroy()


def launch(ctx, out_nbytes, record, *inputs, dtype=np.float32, scratch=()) -> np.ndarray:
    """Run one kernel once: numpy inputs are uploaded (device objects pass through), then
    record(graph, *buffers, *out_views) is recorded and run, one guarded output view per size in
    `out_nbytes` (an int or a tuple); everything is freed afterwards and the outputs come back one
    after another as a flat `dtype` array. `scratch`: Outputs the kernels write on the way (their
    guards are checked too). A kernel must only read its numpy inputs: one that changed is an error."""
    sizes = out_nbytes if isinstance(out_nbytes, tuple) else (out_nbytes,)
    bufs = [ctx.upload(a) if isinstance(a, np.ndarray) else a for a in inputs]
    out, graph = Output(ctx, *sizes), Graph(ctx)
    try:
        record(graph, *bufs, *out.views)
        graph.run()
        for i, (a, b) in enumerate(zip(inputs, bufs)):
            if isinstance(a, np.ndarray) and not np.array_equal(b.read(np.uint8, a.nbytes), a.reshape(-1).view(np.uint8)):
                raise VkdflashError(f"the kernel changed its input {i}")
        for s in scratch:
            s.read(np.uint8)
        return out.read(dtype)
    finally:
        graph.destroy()
        out.destroy()
        for b in bufs:
            b.destroy()


def family_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def all_cases(pattern: str | None = None, include_slow: bool = True) -> list[Case]:
    out = []
    for name in family_modules():
        mod = importlib.import_module(f"{__name__}.{name}")
        out.extend(mod.cases())
    if pattern:
        pat = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        out = [c for c in out if fnmatch.fnmatch(c.name, pat)]
    return [c for c in out if include_slow or not c.slow]


def run_case(ctx, case: Case) -> Result:
    """One case; the pipelines it compiled are destroyed after it (cases rarely share one, and
    lavapipe keeps ~12 MB of machine code a matmul pipeline: 1.4 GB over the matmul cases)."""
    before = set(ctx.pipelines)
    try:
        res = case.run(ctx)
    except VkdflashError as exc:
        return Result(case, False, float("inf"), str(exc))
    except Exception as exc:  # noqa: BLE001 -- a driver error fails this case, not the whole run
        return Result(case, False, float("inf"), f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        ctx.drop_pipelines(set(ctx.pipelines) - before)
    return compare(case, *res)
