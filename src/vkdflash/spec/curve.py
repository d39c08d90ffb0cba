"""The target's verify cost curve: seconds of an n-row forward with every row's logits, measured
once per (model file, device, cache types) and kept with what else this machine measured
(measured.py); the draft-length controller refreshes it from live verify passes."""
from __future__ import annotations

import logging
import math
import time
import weakref

import numpy as np

from ..measured import file_id, load, measured_file, store
from ..runtime.pipelines import spirv_build_id

log = logging.getLogger("vkdflash")
ROWS = (1, 2, 4, 8, 16, 32)
# what a run measures when no curve is cached: each width is a kernel compile (~1 s on lavapipe),
# and all of ROWS at a 64-token context held the README's first command 8.8 s, 1-4 rows 3.9 s;
# wider passes are priced by extrapolation (dearer than they turn out) until a run's own passes
# price them, and the cache keeps what they cost
FIRST_ROWS = (1, 2, 4)
# a width whose best figure sits above the kernels' guess (model.pass_cost_guess) times the 1-row
# one by this much is timed in more rounds, up to as many again: a cold process once cached 2 rows
# at 1.44x one row and another 4 rows at 2.05x where warm rounds give 1.14-1.23x and 1.5-1.76x
SUSPECT = 1.1
# bumped when what is cached changes meaning: 2 keeps only widths timed often, 3 no longer scales
# them with the 1-row figure (costs.VerifyCosts.learned)
CURVE_FORMAT = "curves 3"


def measure(model, rows=ROWS, context: int = 64, reps: int = 3) -> dict[int, float]:
    """Best of `reps` wall-clock seconds of an n-row pass at a `context`-token position, after a
    warm-up round that records and compiles. Rounds visit every n in turn, so a slow spell of
    the machine touches every n alike, not the one measured then. The cache is left empty."""
    rows = [n for n in rows if n <= model.cache.n_ctx] or [1]  # a tiny -c: the passes that fit
    context = max(0, min(context, model.cache.n_ctx - max(rows)))
    tokens = np.random.default_rng(2).integers(0, model.hp.n_vocab, context + max(rows)).tolist()
    model.reset()
    if context:
        model.forward(tokens[:context])
    seconds = _rounds(model, context, tokens[context:], rows, reps)
    model.reset()
    return seconds


def measure_here(model, rows=FIRST_ROWS, reps: int = 3, cache: bool = False) -> dict[int, float]:
    """measure() after the request's own context, which stays in the cache: a run that finds it
    can repay measuring does so between two steps (`cache`: and keeps what it measured)."""
    start = model.cache.n_past
    rows = [n for n in rows if start + n <= model.cache.n_ctx] or [1]
    tokens = np.random.default_rng(2).integers(0, model.hp.n_vocab, max(rows)).tolist()
    seconds = _rounds(model, start, tokens, rows, reps)
    if cache:
        remember(model, seconds)
    return seconds


def measuring_passes(rows=FIRST_ROWS, reps: int = 3) -> int:
    """Rows the passes of measure_here() compute, warm-up round included (its cost in 1-row
    passes, at most, unless a figure looks suspect: then up to `reps` rounds more)."""
    return (reps + 1) * sum(rows)


def _rounds(model, start: int, tokens: list, rows, reps: int) -> dict[int, float]:
    """Best seconds per width of passes at position `start`, in reps + 1 rounds, and up to reps
    more while a width looks suspect; the cache ends there, whatever happens."""
    seconds = {n: float("inf") for n in rows}
    try:
        for done in range(2 * reps + 1):
            if done > reps and not _suspect(seconds, getattr(model, "pass_cost_guess", None)):
                break
            for n in rows:
                model.cache.truncate(start)
                t0 = time.perf_counter()
                model.forward(tokens[:n], all_logits=True)
                seconds[n] = min(seconds[n], time.perf_counter() - t0)
    finally:
        model.cache.truncate(start)
    return seconds


def _suspect(seconds: dict, guess) -> bool:
    """Whether a width costs more than SUSPECT x the kernels' guess of it from the 1-row figure."""
    one = seconds.get(1)
    return bool(guess and one) and any(s > SUSPECT * guess(n) * one for n, s in seconds.items() if n > 1)


def _key(model) -> str:
    f = model.ctx.features
    return (f"{file_id(model.mf.gguf.path)}|{f.name}|{f.driver}|{model.cache.ctk}/{model.cache.ctv}"
            f"|kernels {spirv_build_id()}|{CURVE_FORMAT}")


def cached_costs(model) -> dict[int, float] | None:
    """The cached curve for this model, device and cache types, or None: none yet, or one that
    must be measured again."""
    cached = load().get(_key(model))
    if not isinstance(cached, dict) or not cached:
        return None
    curve = {int(n): _seconds(s) for n, s in cached.items() if str(n).isdigit() and 0 < int(n) <= 1024}
    if len(curve) < len(cached) or None in curve.values() or 1 not in curve:
        # a 0 divided the controller's rates by zero, a NaN priced every length alike
        log.warning("the cached verify cost curve in %s holds entries that are not seconds of a pass "
                    "(edited or damaged?): measuring it again", measured_file())
        return None
    if plausible(curve) == curve:
        return curve
    # priced by it, a strategy would never draft and so never correct it
    log.warning("the cached verify cost curve has an n-row pass dearer than n 1-row passes "
                "(timed on a starved machine?): measuring it again")
    return None


def verify_costs(model) -> dict[int, float]:
    """The cached curve, measured now (FIRST_ROWS) if there is none."""
    curve = cached_costs(model)
    if curve is None:
        log.info("measuring the verify cost of %s-row passes of this model on this device (once; cached in %s)",
                 "/".join(map(str, FIRST_ROWS)), measured_file())
        # best of 4: one noisy pass once gave a 1-row figure 2.4x too high
        curve = measure(model, rows=FIRST_ROWS, context=4, reps=3)
        remember(model, curve)
    return curve


def plausible(curve: dict) -> dict:
    """No n-row pass dearer than n one-row passes (the same work, a dispatch each): bounds a curve
    cached from a starved spell (seen: 2 rows at 16x one row, timed while memory pressure evicted
    the mapped weights)."""
    one = curve.get(1)
    return curve if one is None else {n: min(s, n * one) for n, s in curve.items()}


def remember(model, seconds: dict) -> None:
    """Replace the cached curve with `seconds` (what a run learned from its live verify passes,
    so a curve measured while the machine was busy heals)."""
    store(_key(model), {str(n): float(s) for n, s in sorted(seconds.items())}, "the verify cost curve")


_proposed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device context -> StrategyCosts keys that proposed on it


class StrategyCosts:
    """What a strategy costs on this model and device, as the last process that ran it measured:
    its first proposal in a process (compiling its kernels: the shipped MTP head's ~1 s on lavapipe,
    Mesa 22.3 keeping no pipeline cache; nothing once it proposed on this device context) and a
    proposal of k drafts. Unpriced, a cold 1000-token default run bought the head's compiles, with
    drafts priced free until timed, at ~430 tokens, and ran 3-15% slower than plain decoding."""

    def __init__(self, model, name: str, draft: str | None = None, parts: tuple = ()):
        """draft: the -md file the strategy runs (its size and time name it too), None for its own;
        parts: a cascade's strategy names, whose first proposals price its own."""
        self.ctx, self.key = model.ctx, f"{_key(model)}|strategy {name}" + (f"|{file_id(draft)}" if draft else "")
        self.known = self._cached()  # as the file held it when the run began
        self.parts = {part: StrategyCosts(model, part, draft) for part in parts}

    def _cached(self) -> dict:
        cached = load().get(self.key)
        return cached if isinstance(cached, dict) else {}

    def first_seconds(self) -> float:
        """Seconds of the strategy's first proposal in this process (0 once it proposed here); a
        cascade's, its parts' still to come, each recorded alone (Cascade.timed)."""
        if self.parts:
            return sum(part.first_seconds() for part in self.parts.values())
        if self.key in _proposed.get(self.ctx, ()):
            return 0.0
        return _seconds(self.known.get("first")) or 0.0

    def drafts(self) -> dict[int, float]:
        """Seconds of a proposal of k drafts, per k."""
        table = self.known.get("draft")
        if not isinstance(table, dict):
            return {}
        out = {k: _seconds(v) for k, v in table.items() if k.isdigit() and 0 < int(k) <= 1024}
        return {int(k): v for k, v in out.items() if v}

    def proposed(self, seconds: float) -> None:
        """The strategy proposed on this context, the first time in `seconds`."""
        keys = _proposed.setdefault(self.ctx, set())
        if self.key not in keys:
            keys.add(self.key)
            store(self.key, self._cached() | {"first": float(seconds)}, "a strategy's costs")

    def remember_drafts(self, seconds: dict) -> None:
        if seconds:
            store(self.key, self._cached() | {"draft": {str(k): float(v) for k, v in sorted(seconds.items())}},
                   "a strategy's costs")


def _seconds(value) -> float | None:
    """A cached figure that can be seconds (the file may have been edited or damaged)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 3600 and math.isfinite(value)
    return float(value) if ok else None
