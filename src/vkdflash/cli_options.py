"""Options shared by several commands: device choice and the model flags."""
from __future__ import annotations

from contextlib import contextmanager

import click

from .kernels.types import CACHE_TYPES

DEVICE_OPTION = click.option("--device", "device", default=None, metavar="D",
                             help="Vulkan device index or name substring (env VKDFLASH_DEVICE).")


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
    from .model import default_model_path, load_model
    from .model.forward import Model
    from .runtime.context import Context
    from .tokenizer import Tokenizer
    with load_model(model_path or default_model_path()) as mf:
        tok = Tokenizer(mf.metadata)
        ctx = Context(device)
        try:
            model = Model(ctx, mf, n_ctx=n_ctx, ctk=ctk, ctv=ctv, rotate=not no_kv_rotation)
            try:
                yield model, tok
            finally:
                model.close()
        finally:
            ctx.close()
