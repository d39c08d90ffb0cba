"""The frozen target in torch: a dense llama / qwen2 / qwen3 GGUF, dequantized with gguf-py.

Same graph as vkdflash.ref.model (llama.cpp's), batched with left padding so many prompts
generate at once; layer inputs are captured with llama.cpp's ids (i = the residual entering
block i, n_layer = the one leaving the trunk). Used to make training data and features fast;
tools/train/check.py compares its logits with the engine's."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from vkdflash.model.model_file import ModelFile
from vkdflash.ref.model import dequantize_tensor


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, base, mode):
    """x [B, H, T, hd], pos [B, T] -> rotated; normal pairs (2i, 2i+1), neox (i, i + hd/2)."""
    hd = x.shape[-1]
    freqs = base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    theta = pos[:, None, :, None].float() * freqs  # [B, 1, T, hd/2]
    cos, sin = torch.cos(theta), torch.sin(theta)
    if mode == "normal":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)
    x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1)


def attend(q, k, v, mask):
    """q [B, H, T, hd], k/v [B, Hkv, S, hd], mask [B, 1, T, S] bool (True = seen): GQA attention."""
    B, H, T, hd = q.shape
    rep = H // k.shape[1]
    if rep > 1:  # the rep query heads of a kv head as rep * T rows: K and V are never copied
        q = q.reshape(B, k.shape[1], rep * T, hd)
        mask = mask.unsqueeze(2).expand(-1, -1, rep, -1, -1).reshape(mask.shape[0], 1, rep * T, mask.shape[-1])
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(hd))
    return o.reshape(B, H, T, hd)


class Target:
    """Frozen weights (f32 tensors by GGUF name) and a batched forward with a KV cache."""

    def __init__(self, path, matmul_dtype=torch.float32):
        mf = ModelFile(path)
        try:
            self.hp = hp = mf.hparams
            self.w = {name: torch.from_numpy(np.array(dequantize_tensor(mf.tensor(name)))) for name in mf.gguf.tensors}
        finally:
            mf.close()
        if hp.tied_output:
            self.w["output.weight"] = self.w["token_embd.weight"]
        if hp.has_rope_freqs or hp.n_nextn:
            raise SystemExit("training supports plain dense targets (no rope_freqs, no next-n heads)")
        # the forward's matrices in matmul_dtype (bf16: AMX / AVX512-BF16 CPUs run them ~10x faster
        # than f32); the residual stream, norms, attention and self.w stay f32
        self.dtype = matmul_dtype
        self.mm = {k: v.to(matmul_dtype) for k, v in self.w.items() if v.ndim == 2 and k != "token_embd.weight"}

    def lm_head(self, x, rows=None):
        """Logits from final states x: every token, or the given rows of the output matrix."""
        x = rms_norm(x, self.w["output_norm.weight"], self.hp.rms_eps)
        return self._mm(x, "output.weight") if rows is None else x @ rows.T

    def _mm(self, x, name):
        return (x.to(self.dtype) @ self.mm[name].T).float()

    @torch.no_grad()
    def forward(self, tokens, pos, mask, cache, start, capture=()):
        """tokens/pos [B, T] at cache slots start..start+T; mask [B, 1, T, start+T]; cache: list of
        per-layer [K, V] buffers [B, Hkv, S, hd] (written here). Returns (x leaving the trunk,
        {layer id: residual entering it})."""
        hp, w = self.hp, self.w
        B, T = tokens.shape
        x = w["token_embd.weight"][tokens]
        seen = {}
        for i in range(hp.n_layer):
            if i in capture:
                seen[i] = x
            b = f"blk.{i}."
            h = rms_norm(x, w[b + "attn_norm.weight"], hp.rms_eps)
            q, k, v = (self._proj(h, b + name) for name in ("attn_q", "attn_k", "attn_v"))
            q = q.view(B, T, hp.n_head, hp.head_dim).transpose(1, 2)
            k = k.view(B, T, hp.n_head_kv, hp.head_dim).transpose(1, 2)
            v = v.view(B, T, hp.n_head_kv, hp.head_dim).transpose(1, 2)
            if hp.has_qk_norm:
                q = rms_norm(q, w[b + "attn_q_norm.weight"], hp.rms_eps)
                k = rms_norm(k, w[b + "attn_k_norm.weight"], hp.rms_eps)
            q, k = rope(q, pos, hp.rope_base, hp.rope_mode), rope(k, pos, hp.rope_base, hp.rope_mode)
            K, V = cache[i]
            K[:, :, start:start + T], V[:, :, start:start + T] = k, v
            o = attend(q, K[:, :, :start + T], V[:, :, :start + T], mask)
            x = x + self._mm(o.transpose(1, 2).reshape(B, T, -1), b + "attn_output.weight")
            h = rms_norm(x, w[b + "ffn_norm.weight"], hp.rms_eps)
            f = F.silu(self._mm(h, b + "ffn_gate.weight")) * self._mm(h, b + "ffn_up.weight")
            x = x + self._mm(f, b + "ffn_down.weight")
        if hp.n_layer in capture:
            seen[hp.n_layer] = x
        return x, seen

    def _proj(self, h, name):
        y = self._mm(h, name + ".weight")
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def new_cache(self, B, S):
        hp = self.hp
        return [[torch.zeros(B, hp.n_head_kv, S, hp.head_dim) for _ in range(2)] for _ in range(hp.n_layer)]


class DraftVocab:
    """The tokens a draft's logits cover: the engine computes a draft's logits for the first
    tokens of its vocabulary list only (vkdflash.draft.vocab, default 8192), so training
    normalizes over the same rows, at a fraction of the full head's cost. Labels off the list map
    to -100 (ignored by the loss, and never a hit: the engine cannot propose them)."""

    def __init__(self, target, tokens=None):
        n = target.w["output.weight"].shape[0]
        self.tokens = torch.arange(n) if tokens is None else torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        self.head = target.w["output.weight"] if tokens is None else target.w["output.weight"][self.tokens]
        self.row = torch.full((n,), -100, dtype=torch.long)
        self.row[self.tokens] = torch.arange(len(self.tokens))
        self.target = target

    def teacher(self, x):
        """The target's distribution over these tokens from its final state x."""
        return F.softmax(self.target.lm_head(x, self.head), -1)

