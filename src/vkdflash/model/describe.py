"""Printable summary of a GGUF file for `vkdflash inspect`: header, hyperparameters, metadata, tensors."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import VkdflashError
from .gguf_file import GGUFFile
from .model_file import ModelFile

VALUE_WIDTH = 100


def _short(text: str, suffix: str = "") -> str:
    """One line about VALUE_WIDTH wide (repr() has escaped any newline)."""
    return text if len(text) <= VALUE_WIDTH else f"{text[:VALUE_WIDTH - 3]}...{suffix}"


def _name(text: str) -> str:
    """A key or tensor name from the file, on one line and cut to VALUE_WIDTH."""
    return _short(text if text.isprintable() else repr(text))


def _value(v, vtype) -> str:
    if isinstance(vtype, tuple):  # array
        items = v[:8] if isinstance(v, list) else np.asarray(v[:8]).tolist()
        shown = ", ".join(repr(x) for x in items) + (", ..." if len(v) > 8 else "")
        return _short(f"[{len(v)} x {vtype[1].name.lower()}] {shown}")
    return _short(repr(v), f" ({len(v)} chars)" if isinstance(v, str) else "")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f}"


def hparams_line(hp) -> str:
    return (f"{hp.arch}: {hp.n_layer} layers, d {hp.n_embd}, ff {hp.n_ff}, heads {hp.n_head}/{hp.n_head_kv} "
            f"x {hp.head_dim}, vocab {hp.n_vocab}, ctx {hp.n_ctx_train}, rope {hp.rope_mode} base {hp.rope_base:g}, "
            f"rms eps {hp.rms_eps:g}" + (", tied output" if hp.tied_output else "")
            + (", qkv bias" if hp.has_qkv_bias else "") + (", q/k norm" if hp.has_qk_norm else "")
            + (", rope freq factors" if hp.has_rope_freqs else ""))


def describe(gf: GGUFFile, hparams=None, problem: str | None = None) -> str:
    lines = [f"file: {gf.path} ({_mib(gf.file_size)} MiB, GGUF v{gf.version}, {len(gf.metadata)} metadata keys, "
             f"{len(gf.tensors)} tensors, data at byte {gf.data_offset})"]
    if hparams is not None:
        lines.append("model: " + hparams_line(hparams))
    if problem is not None:
        lines.append(f"not runnable: {problem}")
    lines.append("metadata:")
    keys = {k: _name(k) for k in gf.metadata}  # names come from the file: long ones are cut too
    width = max((len(k) for k in keys.values()), default=0)
    lines += [f"  {keys[k]:<{width}} = {_value(v, gf.value_types[k])}" for k, v in gf.metadata.items()]
    lines.append("tensors:")
    name_w = max((len(_name(n)) for n in gf.tensors), default=4)
    lines.append(f"  {'name':<{name_w}}  {'type':<5} {'shape':<16} {'MiB':>9} {'offset':>12}")
    per_type = defaultdict(lambda: [0, 0])
    for t in gf.tensors.values():
        lines.append(f"  {_name(t.name):<{name_w}}  {t.type_name:<5} {str(list(t.shape)):<16} {_mib(t.nbytes):>9} "
                     f"{t.offset:>12}")
        per_type[t.type_name][0] += 1
        per_type[t.type_name][1] += t.nbytes
    total = sum(n for _, n in per_type.values())
    lines.append("  total " + _mib(total) + " MiB: " + ", ".join(
        f"{name} {c} ({_mib(n)} MiB)" for name, (c, n) in sorted(per_type.items(), key=lambda kv: -kv[1][1])))
    return "\n".join(lines)


def inspect_file(path) -> tuple[str, str | None]:
    """(summary text, None) for a runnable model, (summary, reason) for a well-formed GGUF that vkdflash
    cannot run (the reason is one line). A corrupt file raises VkdflashError."""
    try:
        with ModelFile(path) as mf:
            return describe(mf.gguf, mf.hparams), None
    except VkdflashError as exc:
        problem = str(exc)
    with GGUFFile(path) as gf:  # raises again if the container itself is broken
        prefix = f"{gf.path}: "
        reason = problem[len(prefix):] if problem.startswith(prefix) else problem
        return describe(gf, None, reason), reason
