"""DFlash draft training (reference.md section 4; DFlash paper / SpecForge), the engine's graph in torch.

For an anchor a of a sequence t_0..t_{L-1}: the context is g_p = RMSNorm_enc(fc . [h_L1 | ... | h_LK]_p)
for p < a, entering every draft layer only as K = RoPE_p(k_norm(W_k g)), V = W_v g; the block is
[t_a, MASK x (B-1)] at positions a..a+B-1, run through the layer stack with every block row seeing
the context and the whole block; row k predicts t_{a+k}. Loss: cross-entropy of rows 1..B-1
weighted by exp(-(k-1)/gamma), against the data's tokens or (teacher) the target's own
distribution for each (its LM head on its last state at a+k-1: what greedy verification
accepts). Target embedding and LM head are frozen and shared; the draft layer starts from the
target's last block (Q/K rows un-permuted for NEOX RoPE)."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from target import DraftVocab, attend, rms_norm, rope

GAMMA = {16: 7.0, 8: 4.0}
OUT_SCALE = 0.1  # the copied block's output projections, scaled: at 1 the untrained block swamps the
                 # residual (first loss ~75), at 0.1 it starts at ~10 and falls faster (measured, 15 steps)


def unpermute(w, n_head):
    """llama.cpp's converter interleaves Q/K rows for its normal RoPE; NEOX wants HF's order."""
    out, n_in = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, n_in).transpose(1, 2).reshape(out, n_in)


class Layer(nn.Module):
    def __init__(self, target, src: int):
        super().__init__()
        hp, w, b = target.hp, target.w, f"blk.{src}."
        p = lambda t: nn.Parameter(t.clone().float())  # noqa: E731
        self.attn_norm, self.ffn_norm = p(w[b + "attn_norm.weight"]), p(w[b + "ffn_norm.weight"])
        self.wq = p(unpermute(w[b + "attn_q.weight"], hp.n_head))
        self.wk = p(unpermute(w[b + "attn_k.weight"], hp.n_head_kv))
        self.wv, self.wo = p(w[b + "attn_v.weight"]), p(w[b + "attn_output.weight"] * OUT_SCALE)
        self.q_norm, self.k_norm = p(torch.ones(hp.head_dim)), p(torch.ones(hp.head_dim))
        self.gate, self.up = p(w[b + "ffn_gate.weight"]), p(w[b + "ffn_up.weight"])
        self.down = p(w[b + "ffn_down.weight"] * OUT_SCALE)


class Draft(nn.Module):
    def __init__(self, target, layers, n_layer: int = 1, block: int = 8, mask_token: int = 0, vocab=None):
        super().__init__()
        hp, d = target.hp, target.hp.n_embd
        self.hp, self.target_layers, self.block, self.mask_token = hp, tuple(layers), block, mask_token
        fc = torch.zeros(d, len(layers) * d)
        fc[:, -d:] = torch.eye(d)  # start from the deepest captured state
        self.fc = nn.Parameter(fc)
        self.enc_norm = nn.Parameter(target.w[f"blk.{hp.n_layer - 1}.attn_norm.weight"].clone())
        self.layers = nn.ModuleList(Layer(target, hp.n_layer - n_layer + i) for i in range(n_layer))
        self.out_norm = nn.Parameter(target.w["output_norm.weight"].clone())
        self.embd = target.w["token_embd.weight"]
        self.vocab = DraftVocab(target, vocab)  # logits over these tokens (row i: vocab.tokens[i])

    def _heads(self, x, n):
        return x.view(x.shape[0], x.shape[1], n, self.hp.head_dim).transpose(1, 2)

    def forward(self, feats, tokens, anchors):
        """feats [S, Lf, K*d] (f32), tokens [S, L], anchors [S, A] -> logits [S, A, B-1, len(vocab.tokens)]."""
        hp, B = self.hp, self.block
        S, Lf, _ = feats.shape
        A = anchors.shape[1]
        g = rms_norm(feats @ self.fc.T, self.enc_norm, hp.rms_eps)
        ctx_pos = torch.arange(Lf)[None].expand(S, Lf)
        pos = (anchors[:, :, None] + torch.arange(B)).reshape(S, A * B)
        ids = torch.full((S, A, B), self.mask_token, dtype=torch.long)
        ids[:, :, 0] = torch.gather(tokens, 1, anchors)
        x = self.embd[ids.reshape(S, A * B)]
        blk = torch.arange(A * B) // B
        seen_ctx = ctx_pos[:, None, :] < anchors.repeat_interleave(B, 1)[:, :, None]  # context before the anchor
        mask = torch.cat([seen_ctx, (blk[:, None] == blk[None, :]).expand(S, -1, -1)], 2)[:, None]
        for L in self.layers:
            kc = rope(rms_norm(self._heads(g @ L.wk.T, hp.n_head_kv), L.k_norm, hp.rms_eps), ctx_pos, hp.rope_base, "neox")
            vc = self._heads(g @ L.wv.T, hp.n_head_kv)
            h = rms_norm(x, L.attn_norm, hp.rms_eps)
            q = rope(rms_norm(self._heads(h @ L.wq.T, hp.n_head), L.q_norm, hp.rms_eps), pos, hp.rope_base, "neox")
            kb = rope(rms_norm(self._heads(h @ L.wk.T, hp.n_head_kv), L.k_norm, hp.rms_eps), pos, hp.rope_base, "neox")
            vb = self._heads(h @ L.wv.T, hp.n_head_kv)
            o = attend(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2), mask)
            x = x + o.transpose(1, 2).reshape(S, A * B, -1) @ L.wo.T
            h = rms_norm(x, L.ffn_norm, hp.rms_eps)
            x = x + (F.silu(h @ L.gate.T) * (h @ L.up.T)) @ L.down.T
        rows = x.view(S, A, B, -1)[:, :, 1:]
        return rms_norm(rows, self.out_norm, hp.rms_eps) @ self.vocab.head.T

    def loss(self, feats, tokens, anchors, last=None):
        """Position-weighted cross-entropy and per-position top-1 accuracy [B-1]. last [S, Lf, d]:
        the target's final states (teacher: its distribution for each label, not the token)."""
        B = self.block
        logits = self.forward(feats, tokens, anchors)
        at = (anchors[:, :, None] + torch.arange(1, B)).flatten(1)  # label positions
        if last is None:
            labels = self.vocab.row[torch.gather(tokens, 1, at)].view(anchors.shape + (B - 1,))
            ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten(), reduction="none").view(labels.shape)
        else:
            state = torch.gather(last, 1, (at - 1)[:, :, None].expand(-1, -1, last.shape[2]))
            with torch.no_grad():
                p = self.vocab.teacher(state).float()
            p = p.view(logits.shape)
            ce = -(p * F.log_softmax(logits.float(), -1)).sum(-1)
            labels = p.argmax(-1)
        wts = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / GAMMA.get(B, B / 2))
        acc = (logits.argmax(-1) == labels).float().mean((0, 1))
        return (ce * wts).sum(-1).mean() / wts.sum(), acc


def parameters(model: Draft) -> dict:
    """GGUF name -> the module's parameter ([out, in] for matrices)."""
    out = {"fc.weight": model.fc, "enc.output_norm.weight": model.enc_norm, "output_norm.weight": model.out_norm}
    for i, L in enumerate(model.layers):
        b = f"blk.{i}."
        out.update({b + "attn_norm.weight": L.attn_norm, b + "attn_q.weight": L.wq, b + "attn_k.weight": L.wk,
                    b + "attn_v.weight": L.wv, b + "attn_output.weight": L.wo, b + "attn_q_norm.weight": L.q_norm,
                    b + "attn_k_norm.weight": L.k_norm, b + "ffn_norm.weight": L.ffn_norm,
                    b + "ffn_gate.weight": L.gate, b + "ffn_up.weight": L.up, b + "ffn_down.weight": L.down})
    return out


def zero_outputs(model: Draft, new: set) -> None:
    """Layers added to a trained draft (`new`: their GGUF names) start with zero output
    projections, so the deeper draft begins as exactly the one it grows from."""
    for name, p in parameters(model).items():
        if name in new and name.endswith(("attn_output.weight", "ffn_down.weight")):
            p.data.zero_()


def tensors(model: Draft) -> dict:
    """GGUF name -> f32 numpy array."""
    return {k: v.detach().float().numpy() for k, v in parameters(model).items()}


def lr_at(step: int, steps: int, peak: float, warmup: int = 10) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def sample_batch(ds, rng: np.random.Generator, n_seq: int, n_anchor: int, block: int):
    """Pick n_seq sequences and n_anchor anchors each (mostly in the target-generated part)."""
    picks, rows = [], 0
    while len(picks) < n_seq:
        i = int(rng.integers(len(ds.lengths)))
        L, Lp = ds.lengths[i], ds.prompt_lengths[i]
        lo, hi = max(1, Lp - 8), L - block
        if hi - lo + 1 < 2:
            continue
        a = rng.choice(np.arange(lo, hi + 1), size=min(n_anchor, hi - lo + 1), replace=False)
        picks.append((i, np.sort(np.resize(a, n_anchor))))
        rows = max(rows, L)
    feats = torch.zeros(n_seq, rows - 1, ds.n_feat)
    tokens = torch.zeros(n_seq, rows, dtype=torch.long)
    for r, (i, _) in enumerate(picks):
        f = ds.feats(i)
        feats[r, :len(f)] = torch.from_numpy(f.astype(np.float32))
        tokens[r, :ds.lengths[i]] = torch.from_numpy(ds.tokens(i).astype(np.int64))
    return feats, tokens, torch.from_numpy(np.stack([a for _, a in picks])).long()
