"""Does the torch target compute what the engine computes? Logits NMSE and argmax agreement.

    python tools/train/check.py [--model FILE]
Runs a code prompt through both (engine: f16 KV cache on the first Vulkan device) and prints
the NMSE of the logits of every position and how many argmaxes agree."""
from __future__ import annotations

import sys

import click
import torch

from target import Target
from vkdflash.errors import VkdflashError

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"


@click.command()
@click.option("--model", "model_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="target GGUF (default: the embedded SmolLM2)")
def main(model_path):
    from vkdflash.cli_options import open_model
    with open_model(model_path, 512, "f16", "f16", False, None) as (model, tok):  # closed before torch loads
        ids = tok.encode(PROMPT)
        engine = model.forward(ids, all_logits=True).logits
        path = model.mf.gguf.path  # the default model's when --model is not given
    target = Target(path)
    T = len(ids)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    x, _ = target.forward(torch.tensor([ids]), torch.arange(T)[None], mask, target.new_cache(1, T), 0)
    ours = target.lm_head(x[0]).numpy()
    nmse = float(((ours - engine) ** 2).sum() / (engine ** 2).sum())
    agree = int((ours.argmax(1) == engine.argmax(1)).sum())
    print(f"{T} positions: logits NMSE {nmse:.2e} (whole-model threshold 2e-3), argmax agrees at {agree}/{T}")
    if nmse > 2e-3:
        raise SystemExit("torch target disagrees with the engine")


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError) as exc:  # a file that is no GGUF, no Vulkan device
        sys.exit(f"check.py: error: {exc}")
