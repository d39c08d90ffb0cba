"""Drafts that ship with a plugin for a particular target, and what they measured when they shipped.

A shipped draft names its target in metadata (vkdflash.target.name = the target's general.name,
vkdflash.target.size = its file size in bytes: cheap to check, and a different quantization or
build of the same model has another size) and records its acceptance on the training tool's
suite (vkdflash.suite.*), which the engine's watchdog compares live acceptance with."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..model.gguf_file import GGUFFile

TARGET_NAME, TARGET_SIZE = "vkdflash.target.name", "vkdflash.target.size"
FIRST_ACCEPTANCE = "vkdflash.suite.first_acceptance"  # a_1: verify steps whose first draft was accepted
CPU_SPEEDUP = "vkdflash.bench.cpu_speedup"  # bench spec (cost-aware) against --spec none on a CPU device


@dataclass(frozen=True)
class Record:
    first_acceptance: float | None   # a_1 measured on the suite (greedy, f16 draft cache)
    note: str                        # how it was measured, for the log


def _find(directory, target_file):
    """(path, Metadata) of the GGUF in `directory` made for this target (a ModelFile), or None."""
    if target_file is None:
        return None
    name = target_file.metadata.str("general.name", default=None)
    size = target_file.gguf.file_size
    for path in sorted(Path(directory).glob("*.gguf")):
        with GGUFFile(path) as f:
            md = f.metadata
            if (md.str(TARGET_NAME, default=None) == name
                    and md.int(TARGET_SIZE, 0, 1 << 62, default=None) == size):
                return os.fspath(path), md
    return None


def shipped_draft(directory, target_file) -> str | None:
    """Path of a GGUF in `directory` made for this target (a ModelFile), or None."""
    found = _find(directory, target_file)
    return found[0] if found else None


def offer(strategy: str, directory, model_file) -> list:
    """A plugin's shipped_drafts answer: [{"strategy", "path", "tau", "cpu_speedup"}] or []."""
    found = _find(directory, model_file)
    if found is None:
        return []
    path, md = found
    return [{"strategy": strategy, "path": path, "tau": md.float("vkdflash.suite.tau", 0.0, 1e6, default=None),
             "cpu_speedup": md.float(CPU_SPEEDUP, 0.0, 1e6, default=None)}]


def suite_record(metadata) -> Record:
    """What a draft recorded about itself (a GGUF's Metadata; nothing for a draft made elsewhere)."""
    return Record(metadata.float(FIRST_ACCEPTANCE, 0.0, 1.0, default=None),
                  metadata.str("vkdflash.suite.note", default=""))
