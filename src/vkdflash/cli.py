"""The `vkdflash` command line."""
from __future__ import annotations

import json
import logging
import os
import sys

import click

from .errors import VkdflashError, quote
from .cli_options import DEVICE_OPTION, FiniteFloatRange, OutputFile, Utf8Text, model_options, open_model
from .cli_spec import build_speculator, spec_options
from .cli_stream import TextStream

log = logging.getLogger("vkdflash")


class Cli(click.Group):
    """Every error is one line on stderr: VkdflashError exits 1, a bad flag or value exits 2."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("vkdflash: interrupted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if getattr(exc, "ctx", None) else ""
            click.echo(f"vkdflash: error: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VkdflashError as exc:
            click.echo(f"vkdflash: error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("vkdflash: interrupted", err=True)
            sys.exit(130)
        except OSError as exc:  # the output's disk full, a file gone mid-run: the system's words, one line
            click.echo(f"vkdflash: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else
                                                                 " (writing the output?)"), err=True)
            if exc.filename is None:  # stdout itself may be what failed: its last flush must not print more
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as exc:  # a Vulkan call no path words (a pipeline, a descriptor pool): one line too
            vulkan = sys.modules.get("vulkan")  # a VkError means the bindings were imported
            if vulkan is None or not isinstance(exc, vulkan.VkError):
                raise
            from .runtime.device import device_error
            click.echo(f"vkdflash: error: {device_error(exc, 'a Vulkan call failed')}", err=True)
            sys.exit(1)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="Log decisions (-v) and details (-vv).")
@click.version_option(package_name="vkdflash")
def main(verbose: int) -> None:
    """Speculative decoding for GGUF models on any Vulkan GPU."""
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="vkdflash: %(message)s", stream=sys.stderr)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def devices(as_json: bool) -> None:
    """List Vulkan devices and the features vkdflash uses."""
    from .runtime.device import Instance, choose_device, list_devices
    devs = list_devices()
    if not devs:
        raise VkdflashError("no Vulkan device found: install a Vulkan driver, e.g. `apt-get install "
                            "libvulkan1 mesa-vulkan-drivers`")
    try:
        chosen = choose_device()
    except VkdflashError as exc:  # a bad VKDFLASH_DEVICE: this is the command that shows what is there
        chosen, unchosen = None, str(exc)
    else:
        unchosen = None
    if as_json:
        click.echo(json.dumps([dict(d.as_dict(), default=d.index == chosen) for d in devs], indent=1))
        return
    for d in devs:
        mark = "*" if d.index == chosen else " "
        click.echo(f"{mark}{d.index}: {d.name} [{d.vendor}, {d.device_type}] driver {d.driver}, Vulkan {d.api_version}")
        click.echo(f"    subgroup {d.subgroup_size}, storage range {d.max_storage_buffer_range >> 20} MiB "
                   f"(align {d.min_storage_buffer_offset_alignment}), shared {d.max_shared_memory >> 10} KiB, "
                   f"workgroup <= {d.max_workgroup_invocations}")
        flags = {"fp16": d.float16, "int8": d.int8, "16-bit storage": d.storage_16bit,
                 "8-bit storage": d.storage_8bit, "int dot": d.integer_dot_product, "timestamps": d.timestamps}
        click.echo("    " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items())
                   + f" (timestamp period {d.timestamp_period_ns:g} ns)")
        click.echo(f"    subgroup ops: {' '.join(d.subgroup_ops)}")
        if "llvmpipe" in d.driver:
            click.echo(f"    {Instance.get().cpu_driver}")
    click.echo("(* = default device; choose with --device or VKDFLASH_DEVICE)")
    if unchosen:
        click.echo(f"VKDFLASH_DEVICE={os.environ.get('VKDFLASH_DEVICE')}: {unchosen}", err=True)


@main.command()
@click.argument("path", type=click.Path(dir_okay=False))
def inspect(path) -> None:
    """Show a GGUF file's metadata and tensors, and whether vkdflash can run it."""
    from gguf import GGUFValueType

    from .model import ARCHITECTURES, GGUFFile, inspect_file
    text, problem = inspect_file(path)
    click.echo(text)
    if problem:
        from .plugins import claim, lookup
        with GGUFFile(path) as f:  # a model architecture or a wrongly typed one: `problem` says what is wrong
            arch = f.metadata.get("general.architecture")
            draft = f.metadata.types.get("general.architecture") == GGUFValueType.STRING and arch not in ARCHITECTURES
            name = claim(path, f.metadata) if draft else None
        if name is not None:  # not a model to run on its own, but a draft for one
            click.echo(f"a draft for --spec {name} ({lookup(name).description}): "
                       f"use it with -md {path} next to its target model")
            return
        raise VkdflashError(f"{path}: cannot run this model: {problem}")


@main.command()
@DEVICE_OPTION
@click.option("--filter", "pattern", default=None, metavar="PATTERN",
              help="Run only cases whose name matches (substring or glob, e.g. 'matmul/q4_0*').")
@click.option("--json", "json_path", default=None, type=OutputFile(), help="Also write every result to this JSON file.")
@click.option("--quick", is_flag=True, help="Skip the cases marked slow.")
def conformance(device, pattern, json_path, quick) -> None:
    """Check every kernel against its numpy reference on one device."""
    from .conformance import all_cases, run_case
    from .runtime.context import Context
    cases = all_cases(pattern, include_slow=not quick)
    if not cases:
        families = sorted({c.name.split("/")[0] for c in all_cases(None, include_slow=True)})
        raise VkdflashError(f"no conformance case matches {quote(pattern)}; case names start with a kernel "
                            f"family: {', '.join(families)} (e.g. 'matmul/q4_0*')")
    ctx = Context(device)
    results = []
    try:
        with click.progressbar(cases, label=f"conformance on {ctx.features.name}", file=sys.stderr,
                               item_show_func=lambda c: c.name if c else "") as bar:
            for case in bar:
                results.append(run_case(ctx, case))
    finally:
        ctx.close()
    width = max(len(r.case.name) for r in results)
    click.echo(f"{'case':<{width}}  {'error':>10}  {'threshold':>9}  pass")
    for r in results:
        thr = ("exact" if r.case.metric == "exact" else "1 step" if r.case.metric == "quant"
               else f"{r.case.threshold:.0e}")
        click.echo(f"{r.case.name:<{width}}  {r.error:>10.3g}  {thr:>9}  {'ok' if r.ok else 'FAIL ' + r.detail}")
    failed = [r for r in results if not r.ok]
    click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed on {ctx.features.name}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": ctx.features.as_dict(), "results": [
                {"case": r.case.name, "metric": r.case.metric, "error": r.error, "threshold": r.case.threshold,
                 "pass": r.ok, "detail": r.detail} for r in results]}, f, indent=1)
    if failed:
        sys.exit(1)


@main.command()
@click.argument("prompt_arg", required=False, metavar="[PROMPT]", type=Utf8Text())
@click.option("-p", "--prompt", default=None, type=Utf8Text(), help="Prompt text (or give it as the argument); control tokens written in it "
              "(<|im_start|>, ...) are those tokens, as in llama.cpp.")
@click.option("-n", "--n-predict", default=128, show_default=True, type=click.IntRange(0, 1 << 20),
              help="Most tokens to generate.")
@click.option("--temp", default=0.8, show_default=True, type=FiniteFloatRange(0.0), help="Temperature; 0 = greedy.")
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(0), help="0 = off.")
@click.option("--top-p", default=0.95, show_default=True, type=FiniteFloatRange(0.0, 1.0), help="1.0 = off.")
@click.option("--min-p", default=0.05, show_default=True, type=FiniteFloatRange(0.0, 1.0), help="0.0 = off.")
@click.option("-s", "--seed", default=-1, show_default=True, type=click.IntRange(-1), help="RNG seed; -1 = random.")
@click.option("--stop", "stops", multiple=True, type=Utf8Text(empty=False),
              help="Stop when this text is generated (repeatable).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template as a user message.")
@click.option("--system", default=None, type=Utf8Text(), help="System message for --chat.")
@model_options
@spec_options
def generate(prompt_arg, prompt, n_predict, temp, top_k, top_p, min_p, seed, stops, chat, system,
             model_path, n_ctx, ctk, ctv, no_kv_rotation, device, spec_request) -> None:
    """Generate text from a prompt, streamed, ending with a stats line."""
    from .chat import ChatTemplate, chat_prompt_ids
    from .generate import Stats, generate as run
    from .sampling import Sampler
    if prompt is not None and prompt_arg is not None:
        raise click.UsageError("give the prompt either as an argument or with -p, not both")
    text = prompt if prompt is not None else prompt_arg
    if text is None:
        raise click.UsageError("no prompt: give it as an argument or with -p/--prompt")
    if system is not None and not chat:
        raise click.UsageError("--system needs --chat (the system message goes into the chat template)")
    with open_model(model_path, n_ctx, ctk, ctv, no_kv_rotation, device) as (model, tok):
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            ids = chat_prompt_ids(tok, ChatTemplate.from_metadata(model.mf.metadata, tok, model.mf.gguf.path), messages)
        else:
            ids = tok.encode(text, add_special=True, parse_special=True)  # as llama-cli -p
        if not ids:
            raise VkdflashError("the prompt encodes to no tokens")
        if len(ids) >= model.cache.n_ctx:
            raise VkdflashError(f"the prompt is {len(ids)} tokens, the context only {model.cache.n_ctx}: raise -c")
        sampler = Sampler(temp, top_k, top_p, min_p, None if seed < 0 else seed)
        log.info("sampling: %s", "greedy" if sampler.greedy else
                 f"temp {temp}, top-k {top_k}, top-p {top_p}, min-p {min_p}, seed {seed}")
        from .spec import SpecStats
        stats, spec_stats = Stats(), SpecStats()
        name = spec_request.resolve_for(model.mf, model.ctx.features.device_type)
        speculator = build_speculator(model, spec_request, name, not no_kv_rotation, spec_stats, lazy_curve=True)
        stream = TextStream()
        try:
            if not chat:
                stream.write(text)
            for piece in run(model, tok, ids, n_predict, sampler, stops, stats, speculator):
                stream.write(piece)
        finally:
            stream.close()
            if speculator is not None:
                speculator.close()
        click.echo(stats.line(), err=True)
        if speculator is not None:
            click.echo(spec_stats.line(), err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins(as_json: bool) -> None:
    """List loaded plugins (name, version, hooks) and the strategies they register."""
    from .plugins import model_free, plugin_list, strategies
    found = strategies()
    listing = [dict(p, strategies=sorted(n for n, r in found.items() if r.plugin == p["name"]))
               for p in plugin_list()]
    if as_json:
        for p in listing:
            p["options"] = {n: [{"key": o.key, "type": o.type.__name__, "default": o.default, "help": o.help}
                                for o in found[n].options] for n in p["strategies"]}
            p["aliases"] = {n: list(found[n].aliases) for n in p["strategies"]}
        click.echo(json.dumps(listing, indent=1))
        return
    for p in listing:
        click.echo(f"{p['name']} {p['version'] or ''}: hooks {', '.join(p['hooks']) or '-'}; "
                   f"strategies {', '.join(p['strategies']) or '-'}")
    for name, r in sorted(found.items()):
        also = f" (also {', '.join(r.aliases)})" if r.aliases else ""
        click.echo(f"  --spec {name}{also}: {r.description}")
        for o in r.options:
            click.echo(f"      --spec-opt {name}.{o.key}=<{o.type.__name__}>  {o.help} (default {o.default})")
    if len(found) > 1:  # the example leads with a strategy that runs no model, as the default does
        free = model_free()
        a, b = sorted(found, key=lambda n: n not in free)[:2]
        click.echo(f"  --spec A+B (e.g. {a}+{b}): a cascade: each step the drafts of the first that proposes; "
                   "each part takes its own --spec-opt")


from .cli_bench import bench  # noqa: E402 -- the bench group lives in its own module

main.add_command(bench)
