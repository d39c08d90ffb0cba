"""How drafts do on prompts they were not trained on, in torch, as the engine would run them.

    python tools/train/heldout.py DRAFT.gguf [MTP.gguf ...] [--suite | --prompts 24 --seed 7 --mix varied] [--copies]
The target continues each prompt greedily; per prompt kind it prints, for a DFlash draft, the
acceptance per position of a greedy speculative walk at draft length block size - 1 (the next
anchor after n accepted is a + n + 1: the anchors the engine's steps land on) and its tau; for an
MTP head, the same at draft length 2. `--suite` uses the acceptance suite's prompts and 128
new tokens: the figures `vkdflash bench spec --suite default` measures live (a gap between them is an engine bug). A
mix's prompts share templates with the training data (one greedy answer per prompt), so a
mix's figures overstate what a draft does on text it never saw."""
from __future__ import annotations

import sys
from collections import defaultdict

import click
import numpy as np
import torch

from data import generate, load_text_tools, prompt_mix
from export import restore
from target import Target
from vkdflash.errors import VkdflashError


def greedy_walk(drafts_at, t, first: int, k: int):
    """Accepted drafts per position, and steps, of a greedy walk: at anchor a (t_a committed, not
    yet verified) drafts_at(a) proposes t_{a+1..a+k}; after n accepted the next anchor is a + n + 1."""
    walk, steps, a = np.zeros(k), 0, first
    while a + k < len(t):
        ok = drafts_at(a) == t[a + 1:a + 1 + k]
        n = k if ok.all() else int(np.argmin(ok))
        walk[:n] += 1
        steps += 1
        a += n + 1
    return walk, steps


def dflash_drafts(model, ids, t, f):
    """The draft's proposals at every anchor past the prompt: [anchor - len(ids), block - 1]."""
    every = list(range(len(ids), len(t) - model.block + 1))
    if not every:
        return np.zeros((0, model.block - 1), np.int64)
    ff = torch.from_numpy(f.reshape(len(f), -1))[None]
    return model.vocab.tokens[model(ff, torch.from_numpy(t.astype(np.int64))[None], torch.tensor([every]))[0]
                              .argmax(-1)].numpy()


def copied(t, a: int, k: int, longest: int = 8):
    """What followed the latest earlier match of the longest suffix (2..longest tokens) of t[:a+1]:
    the k tokens an n-gram lookup would draft at anchor a, or None."""
    for n in range(min(longest, a), 1, -1):
        suffix = t[a + 1 - n:a + 1]
        for s in range(a - n, -1, -1):
            if np.array_equal(t[s:s + n], suffix):
                return t[s + n:s + n + k]
    return None


def copy_split(pred, ids, t, k: int, sums: dict) -> None:
    """Per anchor, cumulative hits of the draft and of the n-gram lookup, apart for the anchors
    whose next token the lookup gets (copies) and the rest: what a draft leaves on copied text."""
    for j, a in enumerate(range(len(ids), len(ids) + len(pred))):
        label, lookup = t[a + 1:a + 1 + k], copied(t, a, k)
        key = "copies" if lookup is not None and len(lookup) and lookup[0] == label[0] else "rest"
        ngram = np.cumprod(lookup == label) if lookup is not None and len(lookup) == k else np.zeros(k)
        s = sums.setdefault(key, np.zeros((3, k)))
        s += [np.ones(k), np.cumprod(pred[j] == label), ngram]


def mtp_drafts(head, ids, t, h):
    """Depth 1 at state i (t_{i+1} its anchor) drafts t_{i+2}, depth 2 t_{i+3}: the proposals at
    every anchor past the prompt, [anchor - len(ids), 2]."""
    pad = torch.cat([torch.from_numpy(t.astype(np.int64)), torch.zeros(3, dtype=torch.long)])[None]
    pred = np.stack([head.vocab.tokens[head.logits(y[0]).argmax(-1)].numpy()
                     for y in head(torch.from_numpy(h)[None], pad)], 1)  # [state, depth]
    return pred[len(ids) - 1:len(t) - 3]


@click.command()
@click.argument("drafts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="target GGUF (default: embedded SmolLM2)")
@click.option("--suite", is_flag=True, help="the acceptance suite's prompts, 128 new tokens (vkdflash.suite)")
@click.option("--prompts", default=24, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=7, show_default=True, help="prompt mix seed (training data used 0-6)")
@click.option("--mix", "mix_name", type=click.Choice(["stdlib", "varied", "words"]), default="stdlib", show_default=True)
@click.option("--new", "n_new", default=96, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--copies", is_flag=True, help="every anchor's cumulative hits, apart for the anchors an n-gram "
              "lookup of the last 2..8 tokens gets right (copied text) and the rest, next to the lookup's")
def main(drafts, model_path, suite, prompts, seed, mix_name, n_new, threads, copies):
    from dflash import Draft
    from dflash import parameters as draft_parameters
    from mtp import Head
    from mtp import parameters as head_parameters
    from vkdflash.model.fetch import default_model_path
    from vkdflash.model.gguf_file import GGUFFile
    from vkdflash.model.model_file import ModelFile
    from vkdflash.spec.vocab import draft_vocab
    from vkdflash.suite import PROMPTS, prompt_ids
    from vkdflash_dflash.draft_file import load_draft
    torch.set_num_threads(threads)
    path = str(model_path or default_model_path())
    target = Target(path)
    tok, template = load_text_tools(path)
    if suite:
        mix, n_new = [(p.kind, prompt_ids(p, tok, template)) for p in PROMPTS], 128
    else:
        mix = prompt_mix(prompts, tok, template, seed, varied=mix_name == "varied", words=mix_name == "words")
    models, layers = [], {target.hp.n_layer}
    for d in drafts:
        with GGUFFile(d) as f:
            arch = f.metadata.str("general.architecture")
            vocab = draft_vocab(f.metadata, target.hp.n_vocab, {})
        ids = None if vocab is None else vocab.ids
        if arch == "dflash":
            hp = load_draft(d, ModelFile(path).hparams).hp
            m = Draft(target, hp.target_layers, hp.n_layer, hp.block_size, hp.mask_token_id, vocab=ids)
            restore(draft_parameters(m), d)
            layers |= set(hp.target_layers)
        else:
            m = Head(target, ids)
            restore(head_parameters(m, target.hp.n_layer), d)
        models.append((d, arch, m))
    capture = tuple(sorted(layers))
    tokens, feats = generate(target, [ids for _, ids in mix], n_new, capture, 16, seed, tok.eog_ids, sampled=0.0)
    for d, arch, m in models:
        sums, split = defaultdict(dict), defaultdict(dict)
        with torch.no_grad():
            for (kind, ids), t, f in zip(mix, tokens, feats):
                f = f.astype(np.float32)
                if arch == "dflash":
                    pred = dflash_drafts(m, ids, t, f[:, [capture.index(x) for x in m.target_layers]])
                else:
                    pred = mtp_drafts(m, ids, t, f[:, capture.index(target.hp.n_layer)])
                k = pred.shape[1]
                walk, steps = greedy_walk(lambda a: pred[a - len(ids)], t, len(ids), k) if len(pred) \
                    else (np.zeros(k), 0)
                if copies:
                    copy_split(pred, ids, t, k, split[kind])
                for s in (sums[kind], sums["all"]):
                    s["steps"], s["walk"] = s.get("steps", 0) + steps, s.get("walk", 0) + walk
        click.echo(f"{d} ({len(mix)} prompts, {'suite' if suite else f'mix seed {seed}'}):")
        for kind in sorted(sums.keys() - {"all"}) + ["all"]:
            pos = sums[kind]["walk"] / max(sums[kind]["steps"], 1)
            click.echo(f"  {kind:6s} walk tau {1 + sum(pos):.2f}, acceptance {sum(pos) / len(pos):.3f}, "
                       f"per position {' '.join(f'{x:.2f}' for x in pos)}")
        for kind in sorted(split):
            for key, (n, draft, lookup) in sorted(split[kind].items()):
                click.echo(f"  {kind:6s} {key:6s} {int(n[0]):5d} anchors: draft {' '.join(f'{x:.2f}' for x in draft / n)}"
                           f"  n-gram {' '.join(f'{x:.2f}' for x in lookup / n)}")


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError) as exc:  # a draft that is no GGUF
        sys.exit(f"heldout.py: error: {exc}")
