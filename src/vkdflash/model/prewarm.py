"""A model's first kernels, compiled while it loads. Mesa 22.3's lavapipe keeps no pipeline
cache, so a cold process parsed the GGUF, uploaded the weights, and then waited ~0.7 s on the
1-row pass's kernels (9 for SmolLM2); submitted as the model starts loading, from the keys the
last process here recorded, they compile on Context.compiler's threads beside the parse and
upload: a cold `vkdflash generate -n 32` took 2.05-2.14 s without, 1.91-2.01 s with (alternated,
2-core Xeon; docs/design.md 13).

That process's record time is what the kernels cost when a pass waits for them; a prewarmed one
waits less, so the figure cached with the keys stays the price of compiling a family
(Model.setup_seconds, the prompt's width), as cold processes measure it."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import weakref
from importlib import resources

from ..kv_cache import rotation_disabled_by_env
from ..measured import file_id, load, store
from ..runtime.pipelines import spirv_build_id

log = logging.getLogger("vkdflash")
FORMAT = "first-pass kernels 1"
_started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device context -> {key: start()}


def entry_key(ctx, path, ctk: str, ctv: str, rotate: bool) -> str:
    """What decides a 1-row pass's kernels: the model file, the device, the cache types and rotation,
    the kernels shipped."""
    f = ctx.features
    rotation = "on" if rotate and not rotation_disabled_by_env() else "off"
    return f"{file_id(path)}|{f.name}|{f.driver}|{ctk}/{ctv} rotation {rotation}|kernels {spirv_build_id()}|{FORMAT}"


def start(ctx, key: str) -> tuple[float, list] | None:
    """Submit the compiles the last process here recorded under `key`, once per device context
    (the CLI starts them before it parses the model file, the Model asks again); the seconds a
    cold first 1-row pass took to record and the kernels (None: nothing cached, nothing submitted)."""
    started = _started.setdefault(ctx, {})
    if key not in started:
        started[key] = _submit(ctx, key)
    return started[key]


def _submit(ctx, key: str) -> tuple[float, list] | None:
    entry = load().get(key)
    kernels = _checked(entry)
    if kernels is None:
        if entry is not None:
            log.warning("the cached kernel list of this model's first pass is damaged: not used")
        return None
    for kernel in kernels:
        ctx.pipeline(*kernel)
    log.info("compiling the %d kernels of a 1-row pass while the model loads (the last run here used them)",
             len(kernels))
    return float(entry["seconds"]), kernels


def remember(key: str, kernels: list, seconds: float) -> None:
    """The kernels of a first 1-row pass, and the seconds a cold process took to record it."""
    listed = [list(k[:3]) + [list(k[3]), list(k[4])] for k in kernels]
    store(key, {"kernels": listed, "seconds": float(seconds), "check": _check(listed)},
          "the kernels of a first pass")


def first_pass(key: str, prewarmed: tuple | None, kernels: list, seconds: float) -> float:
    """After a model's first 1-row pass (`seconds` to record it, compiling `kernels`): keep them
    for the next process; the seconds its kernels cost a pass that waits for them all, as a cold
    process measured it."""
    if prewarmed is None:
        remember(key, kernels, seconds)
        return seconds
    cold, submitted = prewarmed
    if set(kernels) != set(submitted):  # another mode (greedy, captures) or changed kernels
        remember(key, kernels, cold)
    return max(seconds, cold)


def _check(kernels: list) -> str:
    """Binds the list to the shipped kernels: a damaged key (a wrong binding count) is undefined
    behaviour in the driver, so any entry that does not hash right is not compiled."""
    text = json.dumps(kernels, separators=(",", ":")) + spirv_build_id()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _checked(entry) -> list | None:
    """The entry's kernels as Context.pipeline arguments, or None where it is not one this module wrote."""
    if not isinstance(entry, dict) or not isinstance(entry.get("kernels"), list):
        return None
    seconds, kernels = entry.get("seconds"), entry["kernels"]
    if not (isinstance(seconds, float) and math.isfinite(seconds) and 0 < seconds < 3600):
        return None
    if entry.get("check") != _check(kernels) or not all(_shipped(k) for k in kernels):
        return None
    return [(k[0], k[1], k[2], tuple(k[3]), tuple(k[4])) for k in kernels]


def _shipped(kernel) -> bool:
    return (isinstance(kernel, list) and len(kernel) == 5 and isinstance(kernel[0], str)
            and kernel[0].isidentifier() and (resources.files("vkdflash") / "spirv" / f"{kernel[0]}.spv").is_file())
