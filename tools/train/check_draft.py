"""Do the trainers' torch graphs compute what the engine's numpy references do?

    python tools/train/check_draft.py --dflash FILE | --mtp FILE [--model TARGET]
Loads the exported draft back into the torch module (its q8_0 weights dequantized), runs both on
the same target features and prints the logits NMSE (whole-model threshold 2e-3) and argmax
agreement; exits non-zero above the threshold."""
from __future__ import annotations

import sys

import click
import numpy as np
import torch

from export import restore
from target import Target, attend, rms_norm
from vkdflash.errors import VkdflashError

TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"


def nmse(a, b):
    return float(((a - b) ** 2).sum() / (b ** 2).sum())


@click.command()
@click.option("--model", "model_path", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--dflash", "dflash_path", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--mtp", "mtp_path", default=None, type=click.Path(exists=True, dir_okay=False))
def main(model_path, dflash_path, mtp_path):
    if not (dflash_path or mtp_path):  # else the target runs for nothing
        raise click.UsageError("give --dflash FILE, --mtp FILE or both")
    from vkdflash.model.fetch import default_model_path
    from vkdflash.model.model_file import ModelFile
    from vkdflash.ref.model import RefWeights
    from vkdflash.tokenizer import Tokenizer
    path = str(model_path or default_model_path())
    mf = ModelFile(path)
    ids = Tokenizer(mf.metadata).encode(TEXT)
    refw = RefWeights(mf)
    target = Target(path)
    T = len(ids)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    caps = (2, 10, 18, 26, target.hp.n_layer)
    _, seen = target.forward(torch.tensor([ids]), torch.arange(T)[None], mask, target.new_cache(1, T), 0, caps)
    if dflash_path:
        from dflash import Draft, parameters
        from vkdflash.ref.dflash import RefDFlash
        from vkdflash_dflash.draft_file import load_draft
        draft = load_draft(dflash_path, mf.hparams)
        hp = draft.hp
        model = Draft(target, hp.target_layers, hp.n_layer, hp.block_size, hp.mask_token_id)
        restore(parameters(model), dflash_path)
        a = T - hp.block_size  # the anchor: context 0..a-1
        feats = torch.cat([seen[i] for i in hp.target_layers], -1)
        ours = model(feats[:, :a], torch.tensor([ids]), torch.tensor([[a]]))[0, 0].detach().numpy()
        ref = RefDFlash(draft, refw)
        ref.inject(0, np.concatenate([seen[i][0, :a].numpy() for i in hp.target_layers], 1))
        _, want = ref.draft(ids[a], hp.block_size - 1)
        report("dflash", ours, want)
    if mtp_path:
        from mtp import Head, parameters
        from vkdflash.ref.mtp import RefMTP
        from vkdflash_mtp.heads import load_sidecar
        heads = load_sidecar(mtp_path, mf.hparams)
        head = Head(target)
        restore(parameters(head, mf.hparams.n_layer), mtp_path)
        h = seen[mf.hparams.n_layer][0]
        x1 = head.fuse(h[None, :T - 1], torch.tensor([ids[1:]]))
        q, k, v = head._qkv(x1, torch.arange(T - 1)[None])
        y = head._rest(x1, attend(q, k, v, torch.ones(T - 1, T - 1, dtype=torch.bool).tril()[None, None]))
        ours = (rms_norm(y[0], head.shared_head_norm, head.hp.rms_eps) @ head.vocab.head.T).detach().numpy()
        ref = RefMTP(heads, refw)
        x = ref.fuse(h.numpy()[:T - 1], ids[1:])  # depth 1 at every position, teacher-forced
        _, want = ref.output(ref.block(x, 0))
        report("mtp", ours, want)


def report(what, ours, want):
    e = nmse(ours, want)
    agree = (ours.argmax(-1) == want.argmax(-1)).mean()
    print(f"{what}: torch vs numpy reference logits NMSE {e:.2e}, argmax agreement {agree:.2f}")
    if e > 2e-3:
        raise SystemExit(f"{what}: the training graph disagrees with the engine's reference")


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError) as exc:  # a file that is no GGUF
        sys.exit(f"check_draft.py: error: {exc}")
