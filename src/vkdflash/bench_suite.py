"""`vkdflash bench spec --suite`: the acceptance suite's runs, side by side in one process."""
from __future__ import annotations

import dataclasses
import logging

import click

from .errors import VkdflashError, quote
from .kernels.types import CACHE_TYPES
from .suite import PROMPTS, prompt_ids, run, table

log = logging.getLogger("vkdflash")


@dataclasses.dataclass(frozen=True)
class Runs:
    strategies: tuple   # (name, fixed draft length)
    cache_types: tuple
    temps: tuple


def parse_runs(runs: str, cache_types: str, temps: str) -> Runs:
    """The suite flags' values; a bad one is a usage error naming its flag."""
    from .spec.cascade import lookup
    chosen = []
    for item in filter(None, runs.split(",")):
        name, _, k = item.partition(":")
        if not (k.isascii() and k.isdigit() and 1 <= int(k) <= 64):
            raise click.BadParameter(f"{quote(item, 40)}: write NAME:K with K in 1..64", param_hint="'--suite-runs'")
        try:
            lookup(name)
        except VkdflashError as exc:
            raise click.BadParameter(str(exc), param_hint="'--suite-runs'") from None
        chosen.append((name, int(k)))
    if not chosen:
        raise click.BadParameter("give at least one NAME:K", param_hint="'--suite-runs'")
    types = tuple(filter(None, cache_types.split(",")))
    bad = [t for t in types if t not in CACHE_TYPES]
    if bad or not types:
        raise click.BadParameter(f"{quote(bad[0], 20) if bad else 'none given'} is not a cache type "
                                 f"({', '.join(CACHE_TYPES)})", param_hint="'--suite-cache-types'")
    try:
        ts = tuple(float(t) for t in filter(None, temps.split(",")))
    except ValueError:
        raise click.BadParameter(f"{quote(temps, 40)}: write temperatures like 0,0.7",
                                 param_hint="'--suite-temps'") from None
    if not ts or any(not 0 <= t <= 2 for t in ts):
        raise click.BadParameter("give temperatures in 0..2", param_hint="'--suite-temps'")
    return Runs(tuple(chosen), types, ts)


def run_suite(model, tok, request, runs: Runs, n_prompts: int, n_gen: int, rotate: bool) -> dict:
    from .chat import ChatTemplate
    from .cli_spec import build_speculator
    from .sampling import Sampler
    from .spec import SpecStats
    template = ChatTemplate.from_metadata(model.mf.metadata, tok, model.mf.gguf.path)
    prompts = [(p, prompt_ids(p, tok, template)) for p in PROMPTS[:n_prompts]]
    sampler_for = (lambda temp: (lambda i: Sampler(temp=0.0) if temp == 0 else Sampler(temp=temp, seed=i)))
    log.info("suite: %d prompts, %d new tokens each, strategies %s, draft caches %s, temperatures %s",
             len(prompts), n_gen, runs.strategies, runs.cache_types, runs.temps)
    plain = run(model, tok, prompts, n_gen, sampler_for(0.0), None)
    report = {"device": model.ctx.features.name, "model": model.mf.metadata.str("general.name", default=None),
              "prompts": len(prompts), "n_gen": n_gen, "none": plain, "runs": [], "skipped": []}
    for name, k in runs.strategies:
        for temp in runs.temps:
            for ct in runs.cache_types if temp == 0 else runs.cache_types[:1]:
                req = dataclasses.replace(request, spec=name, draft_max=k, ctkd=ct, ctvd=ct, draft_fixed=True)
                try:
                    spelled = req.resolve()  # as registered: ngram+draft-mtp is ngram+mtp
                    spec = build_speculator(model, req, spelled, rotate, SpecStats())
                except VkdflashError as exc:
                    skip = {"strategy": name, "why": str(exc)}
                    if skip not in report["skipped"]:  # each temperature meets the same failure
                        report["skipped"].append(skip)
                        log.warning("suite: %s skipped: %s", name, exc)
                    break
                try:
                    r = run(model, tok, prompts, n_gen, sampler_for(temp), spec)
                    has_cache = bool(spec.ctx.cache_names)
                finally:
                    spec.close()
                r.update(strategy=spelled, cache=ct if has_cache else "-", temp=temp, draft_max=k,
                         speedup=r["decode_tps"] / plain["decode_tps"] if plain["decode_tps"] else 0.0)
                report["runs"].append(r)
                log.info("suite: %s cache %s T %.1f: acceptance %.3f, tau %.2f, %.1f tok/s", spelled, r["cache"], temp,
                         r["acceptance"], r["tau"], r["decode_tps"])
                if not has_cache:
                    break  # no draft cache: the cache type changes nothing
    report["table"] = table(report)
    return report
