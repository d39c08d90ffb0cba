"""How drafts do on prompts they were not trained on, in torch, as the engine would run them.

    python tools/train/heldout.py DRAFT.gguf [MTP.gguf ...] [--suite | --prompts 24 --seed 7 --mix varied]
The target continues each prompt greedily; per prompt kind it prints, for a DFlash draft, the
acceptance per position of a greedy speculative walk at draft length block size - 1 (the next
anchor after n accepted is a + n + 1: the anchors the engine's steps land on) and its tau; for an
MTP head, the same at draft length 2. `--suite` uses the acceptance suite's prompts and 128 new tokens: the figures
`vkdflash bench spec --suite default` measures live (a gap between them is an engine bug). A
mix's prompts share templates with the training data (one greedy answer per prompt), so a
mix's figures overstate what a draft does on text it never saw."""
from __future__ import annotations

from collections import defaultdict

import click
import numpy as np
import torch

from data import generate, load_text_tools, prompt_mix
from export import restore
from target import Target


def dflash_walk(model, ids, t, f, B):
    """Accepted drafts per position over a greedy walk, and its steps."""
    walk, steps = np.zeros(B - 1), 0
    every = list(range(len(ids), len(t) - B + 1))
    if not every:
        return walk, steps
    ff = torch.from_numpy(f.reshape(len(f), -1))[None]
    pred = model.vocab.tokens[model(ff, torch.from_numpy(t.astype(np.int64))[None], torch.tensor([every]))[0]
                              .argmax(-1)].numpy()
    a = len(ids)
    while a + B <= len(t):
        ok = pred[a - len(ids)] == t[a + 1:a + B]
        n = int(np.argmin(ok)) if not ok.all() else B - 1
        walk[:n] += 1
        steps += 1
        a += n + 1
    return walk, steps


def mtp_walk(head, ids, t, h):
    """Accepted drafts per position over a greedy walk at draft length 2, and its steps."""
    pad = torch.cat([torch.from_numpy(t.astype(np.int64)), torch.zeros(3, dtype=torch.long)])[None]
    hh = torch.from_numpy(h)[None]
    y = head(hh, pad)
    preds = [head.vocab.tokens[head.logits(d[0]).argmax(-1)].numpy() for d in y]
    walk, steps, i = np.zeros(2), 0, len(ids) - 1
    while i + 3 < len(t):  # state i and t_{i+1} committed: drafts t_{i+2}, t_{i+3}
        n = int(preds[0][i] == t[i + 2]) * (1 + int(preds[1][i] == t[i + 3]))
        walk[:n] += 1
        i += n + 1
        steps += 1
    return walk, steps


@click.command()
@click.argument("drafts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", default=None, help="target GGUF (default: embedded SmolLM2)")
@click.option("--suite", is_flag=True, help="the acceptance suite's prompts, 128 new tokens (vkdflash.suite)")
@click.option("--prompts", default=24, show_default=True)
@click.option("--seed", default=7, show_default=True, help="prompt mix seed (training data used 0-6)")
@click.option("--mix", type=click.Choice(["stdlib", "varied", "words"]), default="stdlib", show_default=True)
@click.option("--new", "n_new", default=96, show_default=True)
@click.option("--threads", default=2, show_default=True)
def main(drafts, model_path, suite, prompts, seed, mix, n_new, threads):
    from dflash import Draft
    from dflash import parameters as draft_parameters
    from mtp import Head
    from mtp import parameters as head_parameters
    from vkdflash.model.fetch import default_model_path
    from vkdflash.model.gguf_file import GGUFFile, ModelFile
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
        mix = prompt_mix(prompts, tok, template, seed, varied=mix == "varied", words=mix == "words")
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
        sums = defaultdict(lambda: defaultdict(float))
        with torch.no_grad():
            for (kind, ids), t, f in zip(mix, tokens, feats):
                f = f.astype(np.float32)
                s = sums[kind]
                if arch == "dflash":
                    cols = [capture.index(x) for x in m.target_layers]
                    walk, steps = dflash_walk(m, ids, t, f[:, cols], m.block)
                else:
                    walk, steps = mtp_walk(m, ids, t, f[:, capture.index(target.hp.n_layer)])
                s["steps"] += steps
                for i, w in enumerate(walk):
                    s[i] += w
        click.echo(f"{d} ({len(mix)} prompts, {'suite' if suite else f'mix seed {seed}'}):")
        for kind, s in sorted(sums.items()) + [("all", {k: sum(x[k] for x in sums.values())
                                                        for k in set().union(*sums.values())})]:
            st = max(s["steps"], 1)
            pos = [s.get(i, 0) / st for i in range(m.block - 1 if arch == "dflash" else 2)]
            click.echo(f"  {kind:6s} walk tau {1 + sum(pos):.2f}, acceptance {sum(pos) / len(pos):.3f}, "
                       f"per position {' '.join(f'{x:.2f}' for x in pos)}")


if __name__ == "__main__":
    main()
