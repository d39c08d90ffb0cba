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
    """(path, metadata) of the GGUF in `directory` made for this target (a ModelFile), or None."""
    if target_file is None:
        return None
    name = target_file.metadata.get("general.name")
    size = target_file.gguf.file_size
    for path in sorted(Path(directory).glob("*.gguf")):
        with GGUFFile(path) as f:
            md = f.metadata
            if md.get(TARGET_NAME) == name and md.get(TARGET_SIZE) == size:
                return os.fspath(path), dict(md)
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
    tau, cpu = md.get("vkdflash.suite.tau"), md.get(CPU_SPEEDUP)
    number = lambda x: float(x) if isinstance(x, (int, float)) else None  # noqa: E731
    return [{"strategy": strategy, "path": path, "tau": number(tau), "cpu_speedup": number(cpu)}]


def suite_record(metadata: dict) -> Record:
    """What a draft recorded about itself (nothing for a draft made elsewhere)."""
    a1 = metadata.get(FIRST_ACCEPTANCE)
    a1 = float(a1) if isinstance(a1, (int, float)) and 0 < a1 <= 1 else None
    note = metadata.get("vkdflash.suite.note")
    return Record(a1, note if isinstance(note, str) else "")
