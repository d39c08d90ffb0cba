"""`vkdflash bench`: kernels, model and speculation figures as JSON."""
from __future__ import annotations

import json
import logging

import click
from click.core import ParameterSource

from .cli_options import DEVICE_OPTION, FiniteFloatRange, OutputFile, Utf8Text, model_options, open_model
from .cli_spec import build_speculator, spec_options
from .suite import PROMPTS, SUITE_CACHE_TYPES

log = logging.getLogger("vkdflash")


def emit_json(report: dict, json_path: str | None) -> None:
    text = json.dumps(report, indent=1)
    click.echo(text)
    if json_path:
        with open(json_path, "w") as f:
            f.write(text + "\n")


def given_flags(*names: str) -> list[str]:
    """The flags among the parameters `names` that the command line set (not left at their defaults)."""
    ctx = click.get_current_context()
    return [p.opts[-1] for p in ctx.command.params
            if p.name in names and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT]


@click.group()
def bench() -> None:
    """Measure speed (JSON output for comparisons)."""


@bench.command("kernels")
@DEVICE_OPTION
@click.option("--json", "json_path", default=None, type=OutputFile(),
              help="Write the figures to this JSON file (also printed).")
@click.option("--reps", default=5, show_default=True, type=click.IntRange(1, 1000))
def bench_kernels(device, json_path, reps) -> None:
    """Matvec GB/s (4096x4096, F16/Q8_0/Q4_0) next to plain-copy GB/s, plus dispatch/submit overhead."""
    from .bench import kernels
    from .runtime.context import Context
    ctx = Context(device)
    try:
        report = kernels(ctx, reps)
    finally:
        ctx.close()
    emit_json(report, json_path)


@bench.command("model")
@click.option("-p", "--n-prompt", default=128, show_default=True, type=click.IntRange(1, 1 << 16),
              help="Prompt tokens to prefill.")
@click.option("-n", "--n-gen", default=64, show_default=True, type=click.IntRange(2, 1 << 16),
              help="Tokens to decode.")
@click.option("--json", "json_path", default=None, type=OutputFile(),
              help="Write the figures to this JSON file (also printed).")
@click.option("--profile", "with_profile", is_flag=True,
              help="Also GPU time per kernel family of a decode step and a 16-row pass (table on stderr).")
@click.option("--verify-curve", "with_curve", is_flag=True,
              help="Also the cost of an n-row forward relative to n = 1, n = 1..32.")
@model_options
def bench_model(n_prompt, n_gen, json_path, with_profile, with_curve, model_path, n_ctx, ctk, ctv, no_kv_rotation,
                device) -> None:
    """Prefill and greedy decode tok/s on a fixed synthetic prompt."""
    from .bench import model as bench_run, profile, verify_curve
    # the run's tokens, and the 64 + 33 positions the --profile and --verify-curve passes fill
    needed = max(n_prompt + n_gen + 1, 64 + 33)
    if n_ctx < needed:
        log.info("-c raised from %d to %d: the run needs -p + -n + 1 = %d positions, the profiling passes 97",
                 n_ctx, needed, n_prompt + n_gen + 1)
        n_ctx = needed
    with open_model(model_path, n_ctx, ctk, ctv, no_kv_rotation, device) as (model, _):
        report = bench_run(model, n_prompt, n_gen)
        if with_profile:
            report["profile"] = profile(model)
            for p in report["profile"]["passes"].values():
                click.echo(f"{p['rows']}-row pass: {p['gpu_ms']:.2f} ms GPU, {p['dispatches']} dispatches", err=True)
                for name, f in p["families"].items():
                    click.echo(f"  {name:<12} {f['ms']:8.2f} ms {100 * f['share']:5.1f}%  "
                               f"{f['dispatches']:4d} dispatches", err=True)
        if with_curve:
            report["verify_curve"] = verify_curve(model)
            click.echo("n-row forward / 1-row: " + ", ".join(
                f"{n}: {r:.2f}x" for n, r in report["verify_curve"]["relative"].items()), err=True)
        emit_json(report, json_path)


@bench.command("spec")
@click.option("-p", "--prompt", default=None, type=Utf8Text(), help="Prompt (default: a code snippet with repetition).")
@click.option("-n", "--n-gen", default=None, type=click.IntRange(1, 1 << 16),
              help="Tokens to generate in each run (default 64; 128 per prompt with --suite).")
@click.option("--json", "json_path", default=None, type=OutputFile(),
              help="Write the figures to this JSON file (also printed).")
@click.option("--suite", default=None, type=click.Choice(["default"]),
              help="Run the acceptance suite (24 prompts: code, chat, story) for every strategy x draft cache "
                   "type at a fixed draft length, greedy and at T 0.7, with plain decoding alongside.")
@click.option("--suite-runs", default="dflash:15,mtp:2,ngram:8", show_default=True, metavar="NAME:K,...",
              help="Strategies the suite runs and the fixed draft length of each.")
@click.option("--suite-cache-types", default=",".join(SUITE_CACHE_TYPES), show_default=True, metavar="TYPE,...",
              help="Draft cache types the suite runs (K and V alike).")
@click.option("--suite-temps", default="0,0.7", show_default=True, metavar="T,...",
              help="Temperatures (T > 0 runs with the f16 draft cache, seeded per prompt).")
@click.option("--suite-prompts", default=len(PROMPTS), show_default=True, type=click.IntRange(1, len(PROMPTS)),
              help="Use the first N prompts (code, chat and story in turn).")
@click.option("--reps", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Alternate plain and speculative runs this many times and report the medians.")
@click.option("--temp", default=0.0, show_default=True, type=FiniteFloatRange(0.0, 100.0),
              help="Sample at this temperature (0: greedy, the outputs compared); not with --suite.")
@click.option("-s", "--seed", default=0, show_default=True, type=click.IntRange(0),
              help="RNG seed of the sampled runs (each pair: seed + its index).")
@model_options
@spec_options
def bench_spec(prompt, n_gen, json_path, reps, temp, seed, suite, suite_runs, suite_cache_types, suite_temps,
               suite_prompts, model_path, n_ctx, ctk, ctv, no_kv_rotation, device, spec_request) -> None:
    """Tok/s with a strategy next to --spec none in the same run, and the speedup (greedy unless --temp)."""
    from .bench import spec as bench_run
    if suite:
        if temp:
            raise click.UsageError("--temp is for one strategy's run; the suite's temperatures are --suite-temps")
        single = given_flags("prompt", "reps", "seed")
        if single:
            raise click.UsageError(f"{', '.join(single)}: for one strategy's run, not with --suite")
        from .bench_suite import parse_runs, run_suite
        runs = parse_runs(suite_runs, suite_cache_types, suite_temps)
        with open_model(model_path, n_ctx, ctk, ctv, no_kv_rotation, device) as (model, tok):
            report = run_suite(model, tok, spec_request, runs, suite_prompts, n_gen or 128, not no_kv_rotation)
            click.echo(report.pop("table"), err=True)
            emit_json(report, json_path)
            return
    suite_flags = given_flags("suite_runs", "suite_cache_types", "suite_temps", "suite_prompts")
    if suite_flags:
        raise click.UsageError(f"{', '.join(suite_flags)}: only with --suite default")
    n_gen = n_gen or 64
    if spec_request.spec == "none":
        raise click.UsageError("bench spec compares a strategy with --spec none: name another with --spec NAME")
    with open_model(model_path, n_ctx, ctk, ctv, no_kv_rotation, device) as (model, tok):
        name = spec_request.resolve_for(model.mf, model.ctx.features.device_type)  # what generate would run
        if name == "none":
            raise click.UsageError("no strategy runs by default here (`-v` says why): name one with --spec NAME "
                                   "(e.g. --spec ngram) or give -md DRAFT.gguf")
        make = lambda stats: build_speculator(model, spec_request, name, not no_kv_rotation, stats)  # noqa: E731
        report = bench_run(model, tok, prompt, n_gen, make, reps, temp, seed)
        emit_json(report, json_path)
