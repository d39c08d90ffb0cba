"""DFlash block-diffusion drafting (arXiv 2602.06036) with llama.cpp-format draft GGUFs.

`--spec dflash -md DRAFT.gguf`: the draft reads the target's residual stream at the layers its
GGUF names (dflash.target_layers), keeps its own KV cache of fused target features (in the draft
cache types -ctkd/-ctvd, written through the core write hook, so rotated like every cache), and
drafts up to block_size - 1 tokens in one non-causal pass. Without -md it uses the draft shipped
in drafts/ for the target, when there is one (trained by tools/train)."""
from __future__ import annotations

from pathlib import Path

from vkdflash.api import VOCAB, hookimpl, offer

__version__ = "0.1.0"


def factory(ctx):
    from .strategy import DFlash
    return DFlash(ctx)


@hookimpl
def register_strategies(register):
    register("dflash", factory, "DFlash block diffusion: a small draft fed with target hidden states "
                                "proposes a whole block per pass (-md DRAFT.gguf, or the draft shipped for the "
                                "default model)", options=(VOCAB,), aliases=("draft-dflash",))


@hookimpl
def shipped_drafts(model_file):
    return offer("dflash", Path(__file__).parent / "drafts", model_file)


@hookimpl
def claim_draft_file(path, metadata):
    return "dflash" if metadata.get("general.architecture") == "dflash" else None
