"""How a DFlash draft does on prompts it was not trained on, in torch, as the engine would run it.

    python tools/train/heldout.py DRAFT.gguf [--prompts 24] [--seed 7] [--new 96]
A fresh prompt mix (another seed than the training data's) is continued greedily by the target;
prints the draft's top-1 accuracy per block position over every anchor of the continuations, and
the acceptance per position of a greedy speculative walk (the next anchor after n accepted is
a + n + 1: the anchors the engine's steps land on). The walk's figures are what `vkdflash bench
spec --suite` should measure live with --draft-fixed at block size - 1: a gap between them is an
engine bug; a gap between training and held-out accuracy is overfitting."""
from __future__ import annotations

import click
import numpy as np
import torch

from data import generate, load_text_tools, prompt_mix
from dflash import Draft, parameters
from export import restore
from target import Target


@click.command()
@click.argument("draft_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", default=None, help="target GGUF (default: embedded SmolLM2)")
@click.option("--prompts", default=24, show_default=True)
@click.option("--seed", default=7, show_default=True, help="prompt mix seed (training data used 0, 1)")
@click.option("--new", "n_new", default=96, show_default=True)
@click.option("--threads", default=2, show_default=True)
def main(draft_path, model_path, prompts, seed, n_new, threads):
    from vkdflash.model.fetch import default_model_path
    from vkdflash.model.gguf_file import ModelFile
    from vkdflash_dflash.draft_file import load_draft
    torch.set_num_threads(threads)
    path = str(model_path or default_model_path())
    hp = load_draft(draft_path, ModelFile(path).hparams).hp
    target = Target(path)
    tok, template = load_text_tools(path)
    mix = prompt_mix(prompts, tok, template, seed)
    tokens, feats = generate(target, [ids for _, ids in mix], n_new, tuple(hp.target_layers), 16, seed,
                             tok.eog_ids, sampled=0.0)
    model = Draft(target, hp.target_layers, hp.n_layer, hp.block_size, hp.mask_token_id)
    restore(parameters(model), draft_path)
    B = hp.block_size
    top1, anchors, walk, steps = np.zeros(B - 1), 0, np.zeros(B - 1), 0
    with torch.no_grad():
        for (_, ids), t, f in zip(mix, tokens, feats):
            ff = torch.from_numpy(f.astype(np.float32).reshape(len(f), -1))[None]
            tt = torch.from_numpy(t.astype(np.int64))[None]
            every = list(range(len(ids), len(t) - B + 1))
            if not every:
                continue
            pred = model(ff, tt, torch.tensor([every]))[0].argmax(-1).numpy()  # [A, B-1]
            labels = np.stack([t[a + 1:a + B] for a in every])
            top1 += (pred == labels).sum(0)
            anchors += len(every)
            a = len(ids)
            while a + B <= len(t):
                ok = pred[a - len(ids)] == t[a + 1:a + B]
                n = int(np.argmin(ok)) if not ok.all() else B - 1
                walk[:n] += 1
                steps += 1
                a += n + 1
    click.echo(f"{draft_path}: {len(mix)} prompts (seed {seed}), {anchors} anchors, {steps} walk steps")
    click.echo("top-1 per position:       " + " ".join(f"{x:.3f}" for x in top1 / max(anchors, 1)))
    click.echo("walk acceptance/position: " + " ".join(f"{x:.3f}" for x in walk / max(steps, 1)))
    click.echo(f"walk tau {1 + walk.sum() / max(steps, 1):.2f}")


if __name__ == "__main__":
    main()
