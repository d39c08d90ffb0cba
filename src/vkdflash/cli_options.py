"""Options shared by several commands: device choice, the model flags, and the checked value types."""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

import click

from .errors import VkdflashError, quote
from .kernels.types import CACHE_TYPES

DEVICE_OPTION = click.option("--device", "device", default=None, metavar="D",
                             help="Vulkan device index or name substring (env VKDFLASH_DEVICE).")


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and inf: float() reads both, and nan passes every bound."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class Utf8Text(click.ParamType):
    """Text that is valid UTF-8. Argument bytes that are not arrive as surrogate escapes: refused
    here, in the words of the flag, before the model loads (the tokenizer would refuse them too)."""
    name = "text"

    def __init__(self, empty: bool = True):
        self.empty = empty  # False: an empty value would do nothing (a stop string)

    def convert(self, value, param, ctx):
        if not value and not self.empty:
            self.fail("empty: it would match nothing", param, ctx)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ord(value[exc.start])
            what = f"byte 0x{bad - 0xdc00:02x}" if 0xdc80 <= bad <= 0xdcff else f"character U+{bad:04X}"
            offset = len(value[:exc.start].encode("utf-8"))
            self.fail(f"not valid UTF-8: {what} at byte offset {offset} (after {quote(value[:exc.start][-20:])})",
                      param, ctx)
        return value


class OutputFile(click.ParamType):
    """A file written when the run ends, checked before it starts: a path that cannot be written
    would lose the whole run's figures."""
    name = "file"

    def convert(self, value, param, ctx):
        if not value:
            self.fail("give a file name (an empty one names no file).", param, ctx)
        path = Path(value)
        if path.is_dir() or value.endswith(os.sep):
            self.fail(f"{quote(value)} is a folder, not a file.", param, ctx)
        folder = path.parent
        if not folder.is_dir():
            why = "is not a folder" if folder.exists() else "does not exist"
            self.fail(f"{quote(value)}: its folder {quote(str(folder))} {why}.", param, ctx)
        if not os.access(folder, os.W_OK) or path.exists() and not os.access(path, os.W_OK):
            self.fail(f"{quote(value)} cannot be written (permission denied).", param, ctx)
        return value


def model_options(f):
    """Flags shared by generate and bench model, spelled as llama.cpp spells them."""
    opts = [
        click.option("-m", "--model", "model_path", default=None, type=click.Path(dir_okay=False),
                     help="GGUF file (default: the embedded SmolLM2-135M-Instruct, fetched once)."),
        click.option("-c", "--ctx-size", "n_ctx", default=4096, show_default=True, type=click.IntRange(1, 1 << 20),
                     help="Context size in tokens (KV cache positions)."),
        click.option("-ctk", "--cache-type-k", "ctk", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="K cache type."),
        click.option("-ctv", "--cache-type-v", "ctv", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="V cache type."),
        click.option("--no-kv-rotation", is_flag=True,
                     help="Store quantized K/V unrotated (also VKDFLASH_ATTN_ROT_DISABLE=1)."),
        DEVICE_OPTION,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@contextmanager
def open_model(model_path, n_ctx, ctk, ctv, no_kv_rotation, device):
    """(model, tokenizer) on a device of their own, released on the way out."""
    from .model import default_model_path, load_model, prewarm
    from .model.forward import Model
    from .runtime.context import Context
    from .tokenizer import Tokenizer
    path = model_path or default_model_path()
    ctx = Context(device)
    try:
        # the first pass's kernels compile while the file is parsed and uploaded (model/prewarm.py)
        prewarm.start(ctx, prewarm.entry_key(ctx, path, ctk, ctv, not no_kv_rotation))
        with load_model(path) as mf:
            check_cache_fits(ctx, mf.hparams, n_ctx, ctk, ctv)
            model = Model(ctx, mf, n_ctx=n_ctx, ctk=ctk, ctv=ctv, rotate=not no_kv_rotation)
            try:
                # after the model: made first, the tokenizer's allocations left a 2-row verify pass 8%
                # slower (29.7-29.9 against 27.5-27.6 ms in generate's loop; 1-row passes the same;
                # cause not found, the device memory's placement in the heap is the likely one)
                tok = Tokenizer(mf.metadata)
                yield model, tok
            finally:
                model.close()
    finally:
        ctx.close()


def check_cache_fits(ctx, hp, n_ctx: int, ctk: str, ctv: str) -> None:
    """The cache's own check (kv_cache.past_storage_range) before the weights upload, in the words
    of the flag that sets it."""
    from .kernels.attention import max_positions
    from .kv_cache import past_storage_range
    too_big = past_storage_range(ctx, n_ctx, hp.n_head_kv, hp.head_dim, ctk, ctv)
    if too_big:
        half, need, limit = too_big
        raise VkdflashError(f"-c {n_ctx} needs a {half} cache of {need >> 20} MiB per layer, more than the "
                            f"device's storage range {limit >> 20} MiB allows: lower -c")
    most = max_positions(ctx.features)
    if most is not None and n_ctx > most:
        raise VkdflashError(f"-c {n_ctx}: attention reads at most {most} positions on this device (lavapipe's "
                            "shader loop limit): lower -c")
