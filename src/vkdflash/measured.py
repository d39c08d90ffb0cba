"""What earlier processes on this machine measured (verify cost curves, strategies' costs, the
kernels a model's first pass compiled): one JSON object of entries by key, in
$VKDFLASH_CACHE/verify-curves.json or the file $VKDFLASH_CURVES names (the tests keep theirs
apart). Every process reads it as it starts and stores what it learned as it ends."""
from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

from .model.fetch import cache_dir

log = logging.getLogger("vkdflash")


def measured_file() -> Path:
    return Path(os.environ.get("VKDFLASH_CURVES") or cache_dir() / "verify-curves.json")


def file_id(path) -> str:
    """A file named by its path, size and time (a changed file is another)."""
    try:
        st = os.stat(path)
    except OSError:
        return str(path)
    return f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"


def load() -> dict:
    """Every entry; {} where there is no file (or it is unreadable: then storing says so)."""
    path = measured_file()
    try:
        known = json.loads(path.read_text())
    except OSError:
        return {}
    except ValueError:
        known = None
    if isinstance(known, dict):
        return known
    # the next store would overwrite it: kept beside, for whoever damaged or edited it
    kept = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, kept)
        log.warning("%s is not a JSON object of cached costs (damaged or edited?): moved to %s; "
                    "costs are measured again", path, kept)
    except OSError as exc:
        log.warning("%s is not a JSON object of cached costs, and could not be moved aside: %s", path, exc)
    return {}


def store(key: str, value, what: str) -> None:
    """Set one entry, keeping the others: under a lock (processes ending together had dropped
    each other's entries) and whole or not at all (a run killed mid-write damages nothing)."""
    path = measured_file()
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = load()
            known[key] = value
            partial.write_text(json.dumps(known, indent=1))
            os.replace(partial, path)
    except OSError as exc:  # a read-only cache only costs a measurement next time
        partial.unlink(missing_ok=True)
        log.warning("could not cache %s in %s: %s", what, path, exc)
