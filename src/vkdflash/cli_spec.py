"""Speculation flags for `generate` and `bench`, spelled as llama.cpp spells them (plus aliases).

The core names no strategy: `--spec` takes any registered name or alias, a `-md` file goes to
the strategy whose plugin claims it (claim_draft_file), and `--spec-opt NAME.KEY=VALUE` sets the
options a strategy declared."""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import click

from .cli_options import FiniteFloatRange
from .errors import VkdflashError, quote
from .kernels.types import CACHE_TYPES

log = logging.getLogger("vkdflash")
# a shipped draft's recorded CPU speedup must beat plain decoding by more than bench spec's noise
# (medians of 5 alternations move by a few percent on a shared VM; a draft the controller switches
# off after 16 steps measured 0.93-1.03x) before it runs by default on a CPU device
MIN_CPU_SPEEDUP = 1.05


@dataclass(frozen=True)
class SpecRequest:
    spec: str | None            # --spec (or llama.cpp's --spec-type)
    draft_model: str | None     # -md
    draft_max: int
    draft_p_min: float
    ctkd: str
    ctvd: str
    spec_opts: tuple            # --spec-opt NAME.KEY=VALUE, as given
    draft_fixed: bool = False   # --draft-fixed: always draft up to --draft-max

    def resolve(self) -> str:
        """The strategy to run: --spec, else the one whose plugin claims the -md file, else none."""
        from .plugins import claim
        from .spec import cascade
        if self.spec:
            return "none" if self.spec == "none" else cascade.lookup(self.spec).name
        if not self.draft_model:
            return "none"
        from .model import GGUFFile
        with GGUFFile(self.draft_model) as f:
            metadata = f.metadata
        try:
            arch = metadata.str("general.architecture", default="?")
        except VkdflashError as exc:
            raise VkdflashError(f"{self.draft_model}: {exc}") from None
        name = claim(self.draft_model, metadata)
        if name is None:
            raise VkdflashError(f"no strategy plugin recognizes {self.draft_model} (architecture {quote(arch)}); "
                                "choose one with --spec")
        return name

    def resolve_for(self, model_file, device_type: str) -> str:
        """resolve(), except that with neither --spec nor -md a draft shipped for this target may
        run (the best recorded tau) under the cost-aware draft length. On a GPU verifying a block
        costs about one decode step, so that is on; on a CPU device only a draft whose recorded
        bench figure there beat plain decoding by more than that figure's noise is (a strategy's
        per-step bookkeeping costs even when the length controller drafts nothing)."""
        if self.spec or self.draft_model:
            return self.resolve()
        from .plugins import shipped
        found = shipped(model_file)
        if device_type == "cpu":
            slow = [f"{d['strategy']} {d['cpu_speedup']:.2f}x" if d.get("cpu_speedup")
                    else f"{d['strategy']} unmeasured"
                    for d in found if not (d.get("cpu_speedup") or 0) >= MIN_CPU_SPEEDUP]
            found = [d for d in found if (d.get("cpu_speedup") or 0) >= MIN_CPU_SPEEDUP]
            if not found and slow:
                log.info("speculation off by default: on a CPU device the drafts shipped for this model measured %s "
                         "of plain decoding (vkdflash bench spec); --spec NAME runs one anyway", ", ".join(slow))
        if not found:
            return "none"
        best = found[0]
        why = [f"suite tau {d['tau']:.2f}" if d.get("tau") else "" for d in found]
        if device_type == "cpu":  # what qualified it here
            why[0] += f"{', ' if why[0] else ''}{best['cpu_speedup']:.2f}x plain decoding in bench spec on a CPU"
        passed = "".join(f"; over {d['strategy']} ({w or 'no record'})" for d, w in zip(found[1:], why[1:]))
        # strategies that run no model go first: where the text repeats they copy it, drafting further
        # than the draft would, elsewhere they propose nothing (bench spec on lavapipe, ngram+mtp
        # against mtp: code 1.77x against 1.38x plain, chat 1.00x against 0.98x, a story 1.06x against 1.04x)
        from .plugins import model_free
        from .spec.cascade import SEP
        lead = [n for n in model_free() if n != best["strategy"]]
        name = SEP.join([*lead, best["strategy"]])
        log.info("speculation on by default: %s with the draft shipped for this model (%s, %s%s)%s; %s",
                 best["strategy"], best["path"], why[0] or "no record", passed,
                 f", led by {', '.join(lead)} (no model: each step asked first, it drafts where it finds the "
                 f"text repeating; --spec {best['strategy']}: the draft alone)" if lead else "",
                 "the draft length follows the measured cost on this device (--draft-fixed: always draft; "
                 "--spec none: off)" if not self.draft_fixed else "--draft-fixed: always drafting")
        return name

    def settings(self, name: str) -> dict:
        """The chosen strategy's option values; an option for another strategy is an error.
        A cascade's are {part name: that part's values}, each option going to the part it names."""
        from .plugins import strategies
        from .spec.cascade import lookup
        reg, known = lookup(name), strategies()
        parts = reg.parts or (reg,)
        pairs: dict = {p.name: [] for p in parts}
        for text in self.spec_opts:
            owner, dot, pair = text.partition(".")
            if not dot:
                raise VkdflashError(f"--spec-opt {text[:40]}: write it as NAME.KEY=VALUE")
            if not any(owner == r.name or owner in r.aliases for r in known.values()):
                raise VkdflashError(f"--spec-opt {text[:40]}: no strategy is called {owner[:40]!r} "
                                    f"(known: {', '.join(sorted(known))})")
            part = next((p for p in parts if owner == p.name or owner in p.aliases), None)
            if part is None:
                raise VkdflashError(f"--spec-opt {text[:40]} is for {owner[:40]}, but the strategy is {reg.name}")
            pairs[part.name].append(pair)
        values = {p.name: p.settings(pairs[p.name]) for p in parts}
        return values if reg.parts else values[reg.name]


def spec_options(f):
    """Add the speculation flags to a command; it receives them as one `spec_request`."""
    @functools.wraps(f)
    def wrapper(*args, spec, spec_type, draft_model, draft_max, draft_p_min, ctkd, ctvd, spec_opts, draft_fixed,
                **kwargs):
        if spec and spec_type and spec != spec_type:
            raise VkdflashError(f"--spec {spec} and --spec-type {spec_type} disagree")
        request = SpecRequest(spec or spec_type, draft_model, draft_max, draft_p_min, ctkd, ctvd, tuple(spec_opts),
                              draft_fixed)
        _refuse_unread(request)
        return f(*args, spec_request=request, **kwargs)

    opts = [
        click.option("--spec", "spec", default=None, metavar="NAME",
                     help="Speculative strategy: none or any plugin's (see `vkdflash plugins`), or a cascade A+B "
                          "(each step the first that proposes: ngram+mtp copies where the text repeats). "
                          "Default: the strategy that claims the -md file, else one with a draft shipped for "
                          "the model (drafting only where it measures faster), else none."),
        click.option("--spec-type", "spec_type", default=None, metavar="TYPE",
                     help="llama.cpp spelling (draft-dflash, draft-mtp, none): any strategy alias."),
        click.option("-md", "--model-draft", "--spec-draft-model", "draft_model", default=None,
                     type=click.Path(dir_okay=False), help="Draft GGUF (a DFlash draft, an MTP sidecar, ...)."),
        click.option("--draft-max", "--spec-draft-n-max", "draft_max", default=16, show_default=True,
                     type=click.IntRange(1, 64), help="Most tokens drafted per step."),
        click.option("--draft-p-min", "--spec-draft-p-min", "draft_p_min", default=0.0, show_default=True,
                     type=FiniteFloatRange(0.0, 1.0), help="Stop drafting below this draft probability."),
        click.option("-ctkd", "--cache-type-k-draft", "ctkd", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="Draft K cache type."),
        click.option("-ctvd", "--cache-type-v-draft", "ctvd", default="f16", show_default=True,
                     type=click.Choice(CACHE_TYPES, case_sensitive=False), help="Draft V cache type."),
        click.option("--spec-opt", "spec_opts", multiple=True, metavar="NAME.KEY=VALUE",
                     help="A strategy's own option (repeatable; `vkdflash plugins` lists them)."),
        click.option("--draft-fixed", "draft_fixed", is_flag=True,
                     help="Always draft up to --draft-max (default: each step's length is chosen for the "
                          "most tokens per second from the measured verify cost and the running acceptance)."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def _refuse_unread(request: SpecRequest) -> None:
    """A -md file or --spec-opt the named strategy would never read is a usage error, not dropped silently."""
    if request.spec == "none" and request.spec_opts:
        raise click.UsageError(f"--spec-opt {request.spec_opts[0][:40]}: --spec none runs no strategy to take it")
    if request.spec == "none" and request.draft_model:
        raise click.UsageError(f"-md {quote(request.draft_model)}: --spec none runs no draft model")
    if request.spec and request.draft_model:
        from .plugins import draft_takers
        from .spec.cascade import lookup
        takers, reg = draft_takers(), lookup(request.spec)
        taking = [p.name for p in reg.parts or (reg,) if p.name in takers]
        if len(taking) > 1:
            raise click.UsageError(f"-md {quote(request.draft_model)}: the cascade {reg.name} holds {len(taking)} "
                                   f"strategies that take a draft model ({', '.join(taking)}); one -md goes to one")
        if not taking:
            raise click.UsageError(f"-md {quote(request.draft_model)}: --spec {request.spec} takes no draft model "
                                   f"(strategies that do: {', '.join(takers) or 'none'})")


def build_speculator(model, request: SpecRequest, name: str, rotate: bool, stats, lazy_curve: bool = False):
    """A Speculator for strategy `name` (from request.resolve()), or None for plain decoding.
    lazy_curve: with no verify curve cached, measure it only once as many tokens as the request
    has generated could repay that (speculation, on by default or asked for, must not make a
    short run much slower than plain decoding); else before the first token (benchmarks)."""
    if name == "none":
        return None
    from .spec.cascade import lookup
    from .spec.controller import DraftController
    from .measured import measured_file
    from .spec.curve import StrategyCosts, cached_costs, measure_here, remember, verify_costs
    from .spec.engine import Speculator
    from .spec.strategy import StrategyOptions
    options = StrategyOptions(draft_model=request.draft_model, draft_max=request.draft_max, p_min=request.draft_p_min,
                              cache_type_k=request.ctkd, cache_type_v=request.ctvd, rotate=rotate,
                              settings=request.settings(name))
    measure = None
    # a fixed length's proposals cost what they cost under the controller: timed, they price its next run
    registered = lookup(name)
    costs = StrategyCosts(model, name, request.draft_model, tuple(p.name for p in registered.parts))
    if request.draft_fixed:
        control = DraftController(request.draft_max, {1: 1.0}, fixed=True)
    else:
        curve = cached_costs(model) if lazy_curve else verify_costs(model)
        if curve is None:
            log.info("no verify cost curve cached for this model on this device (%s): measured once as many "
                     "tokens as a request has generated could repay it; until then plain decoding", measured_file())
            measure = functools.partial(measure_here, model, cache=True)
        control = DraftController(request.draft_max, curve, persist=lambda curve: remember(model, curve),
                                  width=model.pass_width, guess=model.pass_cost_guess)
    return Speculator(model, name, registered.factory, options, stats, control, measure, costs)
