"""Speculation flags for `generate` and `bench`, spelled as llama.cpp spells them (plus aliases)."""
from __future__ import annotations

import click

from .errors import VkdflashError
from .kernels.types import CACHE_TYPES

# llama.cpp's --spec-type values
SPEC_TYPE_ALIASES = {"draft-dflash": "dflash", "draft-mtp": "mtp", "none": "none"}


def _spec_type(ctx, param, value):
    if value is None:
        return None
    if value not in SPEC_TYPE_ALIASES:
        raise click.BadParameter(f"{value!r} is not one of {', '.join(SPEC_TYPE_ALIASES)}")
    return SPEC_TYPE_ALIASES[value]


def spec_options(f):
    opts = [
        click.option("--spec", "spec", default=None, metavar="NAME",
                     help="Speculative strategy: none, dflash, mtp, or any plugin's (see `vkdflash plugins`). "
                          "Default: dflash when -md is a DFlash draft, else none."),
        click.option("--spec-type", "spec_type", default=None, callback=_spec_type, metavar="TYPE",
                     help="llama.cpp spelling: draft-dflash, draft-mtp or none."),
        click.option("-md", "--model-draft", "--spec-draft-model", "draft_model", default=None,
                     type=click.Path(dir_okay=False), help="Draft GGUF (DFlash draft or MTP sidecar)."),
        click.option("--draft-max", "--spec-draft-n-max", "draft_max", default=16, show_default=True,
                     type=click.IntRange(1, 64), help="Most tokens drafted per step."),
        click.option("--draft-p-min", "--spec-draft-p-min", "draft_p_min", default=0.0, show_default=True,
                     type=click.FloatRange(0.0, 1.0), help="Stop drafting below this draft probability."),
        click.option("-ctkd", "--cache-type-k-draft", "ctkd", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="Draft K cache type."),
        click.option("-ctvd", "--cache-type-v-draft", "ctvd", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="Draft V cache type."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def resolve_spec(spec, spec_type, draft_model) -> str:
    """--spec wins over --spec-type; without either, a DFlash -md file selects dflash (as llama.cpp
    detects it from the file), an MTP sidecar selects mtp, and no -md means no speculation."""
    if spec and spec_type and spec != spec_type:
        raise VkdflashError(f"--spec {spec} and --spec-type {spec_type} disagree")
    name = spec or spec_type
    if name:
        return name
    if draft_model:
        from .model import GGUFFile
        with GGUFFile(draft_model) as f:
            arch = f.metadata.get("general.architecture")
        return "dflash" if arch == "dflash" else "mtp"
    return "none"


def build_speculator(model, name: str, draft_model, draft_max, draft_p_min, ctkd, ctvd, rotate, stats):
    """A Speculator for strategy `name`, or None for plain decoding."""
    if name == "none":
        return None
    from .plugins import strategies
    from .spec.engine import Speculator
    from .spec.strategy import StrategyOptions
    found = strategies()
    if name not in found:
        raise VkdflashError(f"unknown speculative strategy {name!r}; available: none, {', '.join(sorted(found))}")
    options = StrategyOptions(draft_model=draft_model, draft_max=draft_max, p_min=draft_p_min,
                              cache_type_k=ctkd, cache_type_v=ctvd, rotate=rotate)
    spec = Speculator(model, name, found[name][0], options, stats)
    if spec.strategy is None:  # the factory itself failed: that is the user's error, say it once
        raise VkdflashError(f"strategy {name} could not start: {stats.disabled}")
    return spec
