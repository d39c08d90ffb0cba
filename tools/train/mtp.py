"""MTP (next-n) head training (reference.md section 5), the graph of vkdflash.ref.mtp in torch.

Depth 1, teacher-forced over a whole sequence: x_i = eh_proj . [enorm(embed(t_{i+1})) ; hnorm(h_i)]
at position i (h_i: the target's residual leaving the trunk, "prenorm"), one causal decoder block,
shared_head_norm, the target's LM head -> t_{i+2}. Depth 2 as the engine drafts it: the row fed
back is (y_i, t_{i+2}) at position i+1, seeing the depth-1 K/V of positions 0..i and itself ->
t_{i+3}. Loss = CE(depth 1) + 0.5 CE(depth 2), on a random subset of rows per step (the frozen
49152-row LM head dominates the cost). The block starts as a copy of the target's last block.
With teacher=True the CE is against the target's own distribution for that token (its LM head
on its state one position on: h_{i+1} for t_{i+2}), not the data's token: 42% of the tokens
are prompt text and a quarter of the continuations were sampled at T 0.7, not necessarily what
the target would pick, and greedy verification accepts exactly what it would pick. Accuracy
is then against its argmax."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dflash import OUT_SCALE
from target import DraftVocab, attend, rms_norm, rope

DEPTH2_WEIGHT = 0.5


class Head(nn.Module):
    def __init__(self, target, vocab=None):
        super().__init__()
        hp, w, d = target.hp, target.w, target.hp.n_embd
        b = f"blk.{hp.n_layer - 1}."
        p = lambda t: nn.Parameter(t.clone().float())  # noqa: E731
        self.hp = hp
        self.t = nn.ParameterDict({k: p(w[b + k + ".weight"]) for k in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        for k in ("attn_output", "ffn_down"):
            self.t[k].data *= OUT_SCALE
        self.eh_proj = p(torch.cat([torch.eye(d), torch.eye(d)], 1))
        self.enorm, self.hnorm = p(torch.ones(d)), p(torch.ones(d))
        self.shared_head_norm = p(w["output_norm.weight"])
        self.embd = target.w["token_embd.weight"]
        self.vocab = DraftVocab(target, vocab)  # logits over these tokens (row i: vocab.tokens[i])

    def fuse(self, h, tokens):
        e = self.embd[tokens]
        cat = torch.cat([rms_norm(e, self.enorm, self.hp.rms_eps), rms_norm(h, self.hnorm, self.hp.rms_eps)], -1)
        return cat @ self.eh_proj.T

    def _qkv(self, x, pos):
        hp, t = self.hp, self.t
        S, T, _ = x.shape
        h = rms_norm(x, t["attn_norm"], hp.rms_eps)
        heads = lambda y, n: y.view(S, T, n, hp.head_dim).transpose(1, 2)  # noqa: E731
        q = rope(heads(h @ t["attn_q"].T, hp.n_head), pos, hp.rope_base, hp.rope_mode)
        k = rope(heads(h @ t["attn_k"].T, hp.n_head_kv), pos, hp.rope_base, hp.rope_mode)
        return q, k, heads(h @ t["attn_v"].T, hp.n_head_kv)

    def _rest(self, x, o):
        t, hp = self.t, self.hp
        x = x + o.transpose(1, 2).reshape(x.shape) @ t["attn_output"].T
        h = rms_norm(x, t["ffn_norm"], hp.rms_eps)
        return x + (F.silu(h @ t["ffn_gate"].T) * (h @ t["ffn_up"].T)) @ t["ffn_down"].T

    def forward(self, h, tokens):
        """h [S, T, d] target states of positions 0..T-1, tokens [S, T + 3] -> the block's outputs
        at depth 1 (row i: t_{i+2}) and depth 2 (row i: t_{i+3}), each [S, T, d]."""
        S, T, _ = h.shape
        pos = torch.arange(T)[None].expand(S, T)
        x1 = self.fuse(h, tokens[:, 1:T + 1])
        q1, k1, v1 = self._qkv(x1, pos)
        causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        y1 = self._rest(x1, attend(q1, k1, v1, causal))
        x2 = self.fuse(y1, tokens[:, 2:T + 2])
        q2, k2, v2 = self._qkv(x2, pos + 1)
        mask2 = torch.cat([causal.expand(1, 1, T, T), torch.eye(T, dtype=torch.bool)[None, None]], 3)
        y2 = self._rest(x2, attend(q2, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), mask2))
        return y1, y2

    def logits(self, y):
        """Logits over the head's vocabulary rows for block outputs y [..., d]."""
        return rms_norm(y, self.shared_head_norm, self.hp.rms_eps) @ self.vocab.head.T

    def loss(self, h, tokens, valid, rows: int, rng, teacher: bool = False):
        """h [S, T, d] target states of positions 0..T-1, tokens [S, T + 3] (t_{i+1}, t_{i+2} per i,
        plus t_{i+3}), valid [S, T + 3] bool. Returns loss and top-1 accuracy at depth 1 and 2."""
        S, T, _ = h.shape
        y1, y2 = self(h, tokens)
        losses, accs = [], []
        for depth, y in ((1, y1), (2, y2)):
            ok = valid[:, depth + 1:T + depth + 1].reshape(-1).nonzero()[:, 0]
            pick = ok[torch.from_numpy(rng.choice(len(ok), size=min(rows, len(ok)), replace=False))]
            logits = self.logits(y.reshape(S * T, -1)[pick])
            if teacher:  # state i + depth predicts the token at i + depth + 1, this row's label
                ahead = torch.cat([h[:, depth:], h[:, :depth]], 1).reshape(S * T, -1)[pick]
                with torch.no_grad():
                    p = self.vocab.teacher(ahead).float()
                losses.append(-(p * F.log_softmax(logits.float(), -1)).sum(-1).mean())
                labels = p.argmax(-1)
            else:
                labels = self.vocab.row[tokens[:, depth + 1:T + depth + 1].reshape(-1)[pick]]
                losses.append(F.cross_entropy(logits.float(), labels))
            accs.append((logits.argmax(-1) == labels).float().mean())
        return losses[0] + DEPTH2_WEIGHT * losses[1], torch.stack(accs)


def parameters(model: Head, first: int) -> dict:
    """GGUF name -> the module's parameter (the head's blocks are numbered from `first`)."""
    b = f"blk.{first}."
    out = {b + k + ".weight": v for k, v in model.t.items()}
    out.update({b + "nextn.eh_proj.weight": model.eh_proj, b + "nextn.enorm.weight": model.enorm,
                b + "nextn.hnorm.weight": model.hnorm, b + "nextn.shared_head_norm.weight": model.shared_head_norm})
    return out


def tensors(model: Head, first: int) -> dict:
    return {k: v.detach().float().numpy() for k, v in parameters(model, first).items()}


def sample_batch(ds, rng: np.random.Generator, n_seq: int):
    """n_seq sequences: states of positions 0..L-2 and tokens padded (valid marks real ones)."""
    idx = rng.choice(len(ds.lengths), size=n_seq, replace=False)
    T = int(max(ds.lengths[i] for i in idx)) - 1
    h = torch.zeros(n_seq, T, ds.n_feat)
    tokens = torch.zeros(n_seq, T + 3, dtype=torch.long)
    valid = torch.zeros(n_seq, T + 3, dtype=torch.bool)
    for r, i in enumerate(idx):
        f, t = ds.feats(i), ds.tokens(i)
        h[r, :len(f)] = torch.from_numpy(f.astype(np.float32))
        tokens[r, :len(t)] = torch.from_numpy(t.astype(np.int64))
        valid[r, :len(t)] = True
    return h, tokens, valid
