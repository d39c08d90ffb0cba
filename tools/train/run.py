"""Train the shipped drafts for a target: data, then a DFlash draft and an MTP head.

    python tools/train/run.py data   --out DIR [--prompts 1024] [--new 96] [--mix varied]
    python tools/train/run.py recapture --data DIR --out DIR2 --capture 2,10,18,29,30
    python tools/train/run.py text   --out DIR [--prompts 1000] [--length 256]
    python tools/train/run.py --threads 1 dflash --data DIR --out FILE.gguf [--steps 1100 --lr 4e-4]
    python tools/train/run.py --threads 1 mtp    --data DIR --out FILE.gguf [--steps 950 --lr 4e-4]
    python tools/train/run.py stamp FILE.gguf --suite-json S --strategy NAME [--cpu-speedup X]
    python tools/train/run.py vocab FILE.gguf --data DIR [--data DIR]
    python tools/train/run.py score-mtp FILE.gguf --data HELD_OUT_DIR
--data repeats (data runs with different seeds train as one set); --init FILE.gguf starts from an
exported draft instead of the target's last block (a longer run in pieces, or more data).
Needs the [train] extra (torch on the CPU, tqdm). Every step is seeded. On the 2-core reference
machine: data 10 min, both trainers side by side (1 thread each) 42 min; then data with --seed 1
and both again with --seed 2 --data D0 --data D1 --init F --lr 2e-4 (1400 / 1200 steps, 46 min);
then --teacher rounds (the target's own distributions as labels: 42% of the data's tokens are
prompt text and a quarter of the continuations T 0.7 samples, not necessarily what greedy
verification accepts): DFlash --seed 3, 600 steps;
MTP --seed 3, 400 steps, then --seed 4, 600 steps at 1.5e-4 (those rounds: --vocab 0). Round 4,
on new prompts: data --seed 2 and --bf16 --seed 3 --prompts 2048, then both trainers --bf16
--seed 11 --teacher from the round-3 files on both sets, DFlash 2300 steps (--anchors 32, 2e-4),
MTP 1800 (--seqs 8 --rows 1024, 1.5e-4). Round 5: data --bf16 --seed 4 --prompts 2048, then
both --seed 12 from the round-4 files on the three sets, DFlash 2000 steps (1.5e-4), MTP 1300
(1.2e-4). Rounds 6 to 8 (round 8 made the shipped files): README, "Training the shipped drafts"."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np
import torch

from data import generate, load_text_tools, prompt_mix, recapture, self_prompts
from dflash import lr_at
from target import Target
from vkdflash.cli_options import FiniteFloatRange
from vkdflash.cli_spec import MIN_CPU_SPEEDUP
from vkdflash.errors import VkdflashError

DFLASH_LAYERS = (2, 10, 18, 26)  # llama.cpp layer-input ids: 4 evenly spaced layers of 30


def model_option(f):
    return click.option("--model", "model_path", default=None, type=click.Path(exists=True, dir_okay=False),
                        help="target GGUF (default: embedded SmolLM2)")(f)


def resolve(model_path):
    from vkdflash.model.fetch import default_model_path
    return str(model_path or default_model_path())


@click.group()
@click.option("--threads", default=2, show_default=True, help="torch CPU threads")
@click.option("--seed", default=0, show_default=True)
@click.option("--bf16/--f32", default=False, show_default=True,
              help="bf16 matmuls (AMX / AVX512-BF16 CPUs run them ~10x faster): the trainers autocast (weights, "
                   "optimizer and loss stay f32); data runs the target's matrices in bf16")
@click.pass_context
def cli(ctx, threads, seed, bf16):
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    ctx.obj = {"seed": seed, "bf16": bf16}


@cli.command()
@model_option
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--prompts", default=1024, show_default=True)
@click.option("--new", "n_new", default=96, show_default=True, help="tokens generated per prompt")
@click.option("--batch", default=64, show_default=True)
@click.option("--mix", type=click.Choice(["stdlib", "varied", "words", "self"]), default="stdlib", show_default=True,
              help="varied: half the prompts short code starts, wider questions and story openers (round 6); "
                   "words: requests naming words drawn from the tokenizer's vocabulary (round 7); self: requests "
                   "the target writes itself at T 1 (round 10)")
@click.pass_context
def data(ctx, model_path, out, prompts, n_new, batch, mix):
    """The target's continuations of a prompt mix, with its layer inputs at every position."""
    path = resolve(model_path)
    target = Target(path, torch.bfloat16 if ctx.obj["bf16"] else torch.float32)
    tok, template = load_text_tools(path)
    if mix == "self":
        mix = self_prompts(target, tok, template, prompts, ctx.obj["seed"], batch)
    else:
        mix = prompt_mix(prompts, tok, template, ctx.obj["seed"], varied=mix == "varied", words=mix == "words")
    capture = DFLASH_LAYERS + (target.hp.n_layer,)
    tokens, feats = generate(target, [ids for _, ids in mix], n_new, capture, batch, ctx.obj["seed"], tok.eog_ids)
    n = save_data(out, path, capture, tokens, feats, [len(ids) for _, ids in mix], [k for k, _ in mix])
    click.echo(f"{len(tokens)} sequences, {n} tokens -> {out}")


def save_data(out, model_path, capture, tokens, feats, prompt_lengths, kinds) -> int:
    """Write sequences and their captured layer inputs as `data.Dataset` reads them; returns the tokens."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(t) for t in tokens])
    np.save(out / "tokens.npy", np.concatenate(tokens))
    np.save(out / "features.npy", np.concatenate(feats))
    (out / "index.json").write_text(json.dumps({
        "model": model_path, "capture": list(capture), "lengths": lengths.tolist(),
        "prompt_lengths": list(prompt_lengths), "kinds": list(kinds)}))
    return int(lengths.sum())


@cli.command("text")
@model_option
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--prompts", default=1000, show_default=True, help="windows of text")
@click.option("--length", default=256, show_default=True, help="tokens per window")
@click.option("--batch", default=16, show_default=True)
@click.pass_context
def text_cmd(ctx, model_path, out, prompts, length, batch):
    """Windows of real text on this machine, teacher-forced, with the target's layer inputs at every
    position (text.py; train on them with --teacher). Written as `data` writes, prompt length 0."""
    from text import text_mix
    path = resolve(model_path)
    target = Target(path, torch.bfloat16 if ctx.obj["bf16"] else torch.float32)
    tok, template = load_text_tools(path)
    mix = text_mix(prompts, tok, template, ctx.obj["seed"], length)
    capture = DFLASH_LAYERS + (target.hp.n_layer,)
    tokens = [np.array(ids, np.int32) for _, ids in mix]
    feats = recapture(target, tokens, capture, batch)
    n = save_data(out, path, capture, tokens, feats, [0] * len(mix), [k for k, _ in mix])
    click.echo(f"{len(tokens)} windows, {n} tokens -> {out}")


def made_by_data(ctx, param, value):
    """Checked before the target loads: each folder holds what `run.py data` writes."""
    for folder in value if param.multiple else (value,):
        if not (Path(folder) / "index.json").is_file():
            raise click.BadParameter(f"{folder} holds no data made by `run.py data` (no index.json)")
    return value


@cli.command("recapture")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), required=True,
              callback=made_by_data)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--capture", required=True, help="layer inputs to keep (llama.cpp ids, comma-separated)")
@click.option("--batch", default=32, show_default=True)
@click.pass_context
def recapture_cmd(ctx, data_dir, out, capture, batch):
    """The same sequences as `data` output, with other layer inputs captured (teacher-forced)."""
    index = json.loads((Path(data_dir) / "index.json").read_text())
    target = Target(index["model"], torch.bfloat16 if ctx.obj["bf16"] else torch.float32)
    flat, ends = np.load(Path(data_dir) / "tokens.npy"), np.cumsum(index["lengths"])
    tokens = np.split(flat, ends[:-1])
    layers = tuple(int(x) for x in capture.split(","))
    feats = recapture(target, tokens, layers, batch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", flat)
    np.save(out / "features.npy", np.concatenate(feats))
    (out / "index.json").write_text(json.dumps(index | {"capture": list(layers)}))
    click.echo(f"{len(tokens)} sequences, layers {list(layers)} -> {out}")


def train_loop(model, batches, steps: int, lr: float, desc: str, bf16: bool = False):
    """AdamW with warmup + cosine; batches(step) -> loss, per-position accuracy. Progress via tqdm."""
    from contextlib import nullcontext

    from tqdm import tqdm
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    bar = tqdm(range(steps), desc=desc, unit="step")
    acc_avg = None
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            loss, acc = batches(step)
        loss = loss.float()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        acc_avg = acc if acc_avg is None else 0.95 * acc_avg + 0.05 * acc
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=" ".join(f"{a:.2f}" for a in acc_avg[:4].tolist()))
    return acc_avg


def data_option(f):
    return click.option("--data", "data_dirs", type=click.Path(exists=True, file_okay=False), required=True,
                        multiple=True, callback=made_by_data,
                        help="`data` output (repeatable: runs with different seeds)")(f)


def vocab_option(f):
    return click.option("--vocab", "n_vocab", default=8192, show_default=True,
                        help="logits over the data's N most frequent tokens, the rows the engine computes for a "
                             "draft (--spec-opt NAME.vocab, run.py vocab); 0: every token")(f)


def draft_tokens(ds, n_vocab: int, init=None):
    """The token rows the loss covers: the data's N most frequent, or --init's own list where it has
    one (a round on other text keeps the rows the engine computes for the file; keep_vocab)."""
    if not n_vocab:
        return None
    listed = init_vocab(init)
    return listed[:n_vocab] if listed is not None else ds.ranked_tokens()[:n_vocab]


def init_vocab(init):
    from vkdflash.model.gguf_file import GGUFFile
    from vkdflash.spec.vocab import DRAFT_VOCAB
    if not init:
        return None
    with GGUFFile(init) as f:
        return f.metadata.ints(DRAFT_VOCAB, 0, 1 << 31, 1 << 31, default=None)


def keep_vocab(out, init) -> None:
    """Write --init's vocabulary list into the trained file (`run.py vocab` would rank the data's)."""
    from gguf import GGUFValueType as VT

    from export import restamp
    from vkdflash.spec.vocab import DRAFT_VOCAB
    listed = init_vocab(init)
    if listed is not None:
        restamp(out, {DRAFT_VOCAB: ([int(t) for t in listed], VT.ARRAY, VT.UINT32)})


def init_option(f):
    return click.option("--init", type=click.Path(exists=True, dir_okay=False), default=None,
                        help="start from this exported draft (a longer run, or more data) instead of the target")(f)


def index_model(data_dirs) -> str:
    return json.loads((Path(data_dirs[0]) / "index.json").read_text())["model"]


@cli.command()
@data_option
@init_option
@click.option("--out", type=click.Path(dir_okay=False), required=True)
@click.option("--steps", default=1200, show_default=True)
@click.option("--block", default=8, show_default=True, type=click.Choice(["8", "16"]))
@click.option("--layers", "n_layer", default=1, show_default=True,
              help="draft decoder layers (more than --init's: the new ones start as identity)")
@click.option("--target-layers", default=",".join(map(str, DFLASH_LAYERS)), show_default=True,
              help="the target's layer inputs the draft reads (llama.cpp ids; the target's layer count: its final "
                   "state); each must be in the data's capture")
@click.option("--seqs", default=8, show_default=True, help="sequences per step")
@click.option("--anchors", default=16, show_default=True, help="anchors (blocks) per sequence")
@click.option("--lr", default=3e-4, show_default=True)
@click.option("--teacher/--tokens", default=False, show_default=True,
              help="learn the target's own distribution for each token (its LM head on its state), or the data's tokens")
@vocab_option
@click.pass_context
def dflash(ctx, data_dirs, init, out, steps, block, n_layer, target_layers, seqs, anchors, lr, teacher, n_vocab):
    """Train a DFlash draft on `data` output and write it as a llama.cpp-format GGUF."""
    from data import Dataset
    from dflash import Draft, parameters, sample_batch, tensors, zero_outputs
    from export import dflash_metadata, restore, target_identity, write
    block = int(block)
    path = index_model(data_dirs)
    target = Target(path)
    layers = tuple(int(x) for x in target_layers.split(","))
    ds = Dataset(data_dirs, layers + ((target.hp.n_layer,) if teacher else ()))
    model = Draft(target, layers, n_layer, block, vocab=draft_tokens(ds, n_vocab, init))
    if init:
        grown = restore(parameters(model), init, grow=True)
        zero_outputs(model, grown)
    rng = np.random.default_rng(ctx.obj["seed"])
    d_in = len(layers) * target.hp.n_embd

    def batch(step):
        feats, tokens, anchors_ = sample_batch(ds, rng, seqs, anchors, block)
        return model.loss(feats[..., :d_in], tokens, anchors_, feats[..., d_in:] if teacher else None)

    acc = train_loop(model, batch, steps, lr, "dflash", ctx.obj["bf16"])
    notes = (f"trained by tools/train/run.py dflash{' --teacher' if teacher else ''}: {steps} steps x {seqs} seqs x "
             f"{anchors} blocks of {block}, "
             f"seed {ctx.obj['seed']}, {len(ds.lengths)} sequences"
             + (f", from {Path(init).name}" if init else "") + "; train top-1 per position "
             + " ".join(f"{a:.2f}" for a in acc.tolist()))
    md = dflash_metadata(target.hp, n_layer, block, layers, model.mask_token, path, notes)
    write(out, "dflash", md | target_identity(path), tensors(model))
    keep_vocab(out, init)
    click.echo(f"wrote {out}: {notes}")


@cli.command()
@data_option
@init_option
@click.option("--out", type=click.Path(dir_okay=False), required=True)
@click.option("--steps", default=1200, show_default=True)
@click.option("--seqs", default=6, show_default=True, help="sequences per step")
@click.option("--rows", default=384, show_default=True, help="LM-head rows per depth per step")
@click.option("--lr", default=3e-4, show_default=True)
@click.option("--teacher/--tokens", default=False, show_default=True,
              help="learn the target's own distribution for each token (its LM head on its next state), "
                   "or the data's tokens")
@vocab_option
@click.pass_context
def mtp(ctx, data_dirs, init, out, steps, seqs, rows, lr, teacher, n_vocab):
    """Train one next-n head on `data` output and write it as an MTP sidecar GGUF."""
    from data import Dataset
    from export import mtp_metadata, restore, target_identity, write
    from mtp import Head, parameters, sample_batch, tensors
    path = index_model(data_dirs)
    target = Target(path)
    ds = Dataset(data_dirs, (target.hp.n_layer,))
    model = Head(target, draft_tokens(ds, n_vocab, init))
    if init:
        restore(parameters(model, target.hp.n_layer), init)
    rng = np.random.default_rng(ctx.obj["seed"])
    acc = train_loop(model, lambda step: model.loss(*sample_batch(ds, rng, seqs), rows, rng, teacher), steps, lr,
                     "mtp", ctx.obj["bf16"])
    notes = (f"trained by tools/train/run.py mtp{' --teacher' if teacher else ''}: {steps} steps x {seqs} seqs "
             f"({rows} rows per depth), seed "
             f"{ctx.obj['seed']}, {len(ds.lengths)} sequences"
             + (f", from {Path(init).name}" if init else "") + f"; train top-1 depth 1 {acc[0]:.2f}, "
             f"depth 2 {acc[1]:.2f}")
    write(out, "mtp", mtp_metadata(target.hp, notes) | target_identity(path),
          tensors(model, target.hp.n_layer))
    keep_vocab(out, init)
    click.echo(f"wrote {out}: {notes}")


@cli.command("score-mtp")
@click.argument("head_path", type=click.Path(exists=True, dir_okay=False))
@data_option
@click.option("--seqs", default=8, show_default=True, help="sequences per batch")
@click.option("--batches", default=32, show_default=True)
@click.pass_context
def score_mtp(ctx, head_path, data_dirs, seqs, batches):
    """Top-1 of an MTP head at depth 1 and 2 on `data` output, against the target's argmax over the
    head's vocabulary (as training reports it). On prompts it never saw (`run.py --seed 7 data
    --prompts 256`), a gap to the training figure is overfitting."""
    from data import Dataset
    from export import restore
    from mtp import Head, parameters, sample_batch
    from vkdflash.model import GGUFFile
    from vkdflash.spec.vocab import draft_vocab
    target = Target(index_model(data_dirs))
    ds = Dataset(data_dirs, (target.hp.n_layer,))
    with GGUFFile(head_path) as f:  # the rows the engine computes for this head
        vocab = draft_vocab(f.metadata, target.hp.n_vocab, {})
    model = Head(target, None if vocab is None else vocab.ids)
    restore(parameters(model, target.hp.n_layer), head_path)
    rng = np.random.default_rng(ctx.obj["seed"])
    with torch.no_grad():
        accs = np.mean([model.loss(*sample_batch(ds, rng, min(seqs, len(ds.lengths))), 1 << 30, rng, True)[1].numpy()
                        for _ in range(batches)], 0)
    click.echo(f"{head_path}: top-1 depth 1 {accs[0]:.3f}, depth 2 {accs[1]:.3f} "
               f"({batches} x {seqs} of {len(ds.lengths)} sequences)")


@cli.command()
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@data_option
def vocab(draft, data_dirs):
    """List the data's tokens in the draft, most frequent first: the engine's draft vocabulary."""
    from gguf import GGUFValueType as VT

    from data import Dataset
    from export import restamp
    from vkdflash.spec.vocab import DRAFT_VOCAB
    ranked = Dataset(data_dirs, []).ranked_tokens()
    restamp(draft, {DRAFT_VOCAB: ([int(t) for t in ranked], VT.ARRAY, VT.UINT32)})
    click.echo(f"{draft}: {len(ranked)} tokens listed, most frequent first")


@cli.command()
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@click.option("--suite-json", type=click.Path(exists=True, dir_okay=False), required=True,
              help="`vkdflash bench spec --suite default --json FILE` output")
@click.option("--strategy", required=True, help="which run of the suite describes this draft (dflash, mtp)")
@click.option("--cpu-speedup", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="`vkdflash bench spec --spec NAME` speedup (cost-aware) on a CPU device: at "
                   f"{MIN_CPU_SPEEDUP} or more, generate uses the draft by default there")
def stamp(draft, suite_json, strategy, cpu_speedup):
    """Record the suite's greedy f16-cache figures in the draft (the engine's watchdog reads them)."""
    from gguf import GGUFValueType as VT

    from export import restamp
    from vkdflash.spec.shipped import CPU_SPEEDUP, FIRST_ACCEPTANCE
    report = suite_report(suite_json)
    run = next((r for r in report["runs"] if r["strategy"] == strategy and r["temp"] == 0
                and r["cache"] in ("f16", "-")), None)
    if run is None:
        raise SystemExit(f"{suite_json} has no greedy f16 run of {strategy}")
    a1 = run["per_position"][0]
    note = (f"a_1 {a1:.2f}, acceptance {run['acceptance']:.2f}, tau {run['tau']:.2f} at draft length "
            f"{len(run['per_position'])} (suite default: {report['prompts']} prompts x {report['n_gen']} tokens, greedy, "
            f"f16 draft cache, on {report['device']})")
    restamp(draft, {FIRST_ACCEPTANCE: (float(a1), VT.FLOAT32),
                    "vkdflash.suite.acceptance": (float(run["acceptance"]), VT.FLOAT32),
                    "vkdflash.suite.tau": (float(run["tau"]), VT.FLOAT32),
                    "vkdflash.suite.note": (note, VT.STRING)}
             | ({CPU_SPEEDUP: (cpu_speedup, VT.FLOAT32)} if cpu_speedup is not None else {}))
    click.echo(f"stamped {draft}: {note}")


def suite_report(path: str) -> dict:
    """The suite's report in `path`; a usage error saying what the file should be if it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        report = None
    if not (isinstance(report, dict) and isinstance(report.get("runs"), list)):
        raise click.BadParameter(f"{path} is not the JSON of `vkdflash bench spec --suite default --json FILE`",
                                 param_hint="'--suite-json'")
    return report


if __name__ == "__main__":
    try:
        cli()
    except (VkdflashError, OSError, json.JSONDecodeError) as exc:  # a file that is no GGUF, a broken index.json
        sys.exit(f"run.py: error: {exc}")
