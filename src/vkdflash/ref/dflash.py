"""numpy reference of DFlash block-diffusion drafting (docs/design.md section 4), the GPU plugin's oracle.

Inject, for each committed position p, with features = [h_L1 | h_L2 | ...] (the residual stream
entering target layers L_1..L_K, llama.cpp layer-input ids):
  g = RMSNorm_enc(fc . features); per draft layer l: K = RoPE_p(k_norm(W_k g)), V = W_v g,
  written at position p through the draft cache's one write path (rotate, then quantize).
Draft a block at P (the position of the last token): tokens [last, MASK x n] at P..P+n, the
Qwen3-style layer stack with the "block" mask (every row sees all context and the whole block),
output_norm, LM head; row i (1..n) predicts the token at P+i. The block's K/V are dropped after.

Precision as ref.model: f64 products and norms rounded to f32 after each operation.
`inject_rotated=False` stores the injected K/V unrotated while the read path still rotates Q --
llama.cpp issue 25725 -- and exists only so tests can show that bug is detectable."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..spec.drafts import select_drafts
from . import ops
from .kv import KVCache
from .model import dequantize_tensor

class RefDFlash:
    """RefDFlash(draft, target_weights, ctk, ctv, rotate): `draft` is a vkdflash_dflash DraftFile
    (`.hp`, `.gguf.tensors`, `.tensor(name)`); `target_weights` a ref.model.RefWeights whose
    token_embd / output the draft borrows when it has none. The draft cache is a ref.kv.KVCache."""

    def __init__(self, draft, target_weights, ctk: str = "f16", ctv: str = "f16", rotate: bool = True,
                 inject_rotated: bool = True):
        self.hp = hp = draft.hp
        self.w = {}
        for name in draft.gguf.tensors:
            x = dequantize_tensor(draft.tensor(name))
            self.w[name] = x.astype(np.float64) if x.ndim > 1 else x
        self.embd = self.w.get("token_embd.weight", target_weights["token_embd.weight"])
        self.output = self.w.get("output.weight", target_weights["output.weight"])
        self.cache = KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, ctk, ctv, rotate)
        self.inject_rotated = inject_rotated
        self.n_injected = 0

    def _mm(self, x, w) -> np.ndarray:
        return (np.asarray(x, np.float64) @ w.T).astype(np.float32)

    def _rope(self, x, positions) -> np.ndarray:
        return ops.rope(x, positions, self.hp.rope_base, "neox")

    def _kv(self, layer: int, h: np.ndarray, positions: np.ndarray):
        hp, b = self.hp, f"blk.{layer}."
        k = self._mm(h, self.w[b + "attn_k.weight"]).reshape(len(h), hp.n_head_kv, hp.head_dim)
        k = self._rope(ops.rms_norm(k, self.w[b + "attn_k_norm.weight"], hp.rms_eps), positions)
        v = self._mm(h, self.w[b + "attn_v.weight"]).reshape(len(h), hp.n_head_kv, hp.head_dim)
        return k, v

    def features(self, hidden: dict) -> np.ndarray:
        """[n, K*d]: the captured layer inputs concatenated in target_layers order."""
        return np.concatenate([np.asarray(hidden[i], np.float32) for i in self.hp.target_layers], axis=1)

    def inject(self, start: int, features: np.ndarray) -> None:
        """Fuse committed positions start.. and write their K/V into every draft layer."""
        hp = self.hp
        features = np.asarray(features, np.float32)
        if features.ndim != 2 or features.shape[1] != hp.n_features:
            raise VkdflashError(f"DFlash features must be [n, {hp.n_features}], got {list(features.shape)}")
        if start > self.n_injected:
            raise VkdflashError(f"DFlash injection at {start} leaves a gap (context holds {self.n_injected})")
        g = ops.rms_norm(self._mm(features, self.w["fc.weight"]), self.w["enc.output_norm.weight"], hp.rms_eps)
        positions = start + np.arange(len(g))
        saved = self.cache.k_block, self.cache.v_block
        if not self.inject_rotated:
            self.cache.k_block = self.cache.v_block = 0
        try:
            for layer in range(hp.n_layer):
                self.cache.write(layer, start, *self._kv(layer, g, positions))
        finally:
            self.cache.k_block, self.cache.v_block = saved
        self.n_injected = start + len(g)

    def draft(self, last_token: int, n: int, p_min: float = 0.0):
        """Draft n tokens after `last_token` (at position n_injected). Returns (tokens, logits [n, vocab])."""
        hp, P = self.hp, self.n_injected
        n = min(n, hp.block_size - 1)
        if n <= 0:
            return [], np.zeros((0, self.output.shape[0]), np.float32)
        tokens = np.array([last_token] + [hp.mask_token_id] * n)
        positions = P + np.arange(n + 1)
        x = self.embd[tokens].astype(np.float32)
        for layer in range(hp.n_layer):
            b = f"blk.{layer}."
            h = ops.rms_norm(x, self.w[b + "attn_norm.weight"], hp.rms_eps)
            q = self._mm(h, self.w[b + "attn_q.weight"]).reshape(n + 1, hp.n_head, hp.head_dim)
            q = self._rope(ops.rms_norm(q, self.w[b + "attn_q_norm.weight"], hp.rms_eps), positions)
            self.cache.write(layer, P, *self._kv(layer, h, positions))
            o = self.cache.attend(layer, q, P, mask="block")
            x = ops.add(x, self._mm(o.reshape(n + 1, -1), self.w[b + "attn_output.weight"]))
            h = ops.rms_norm(x, self.w[b + "ffn_norm.weight"], hp.rms_eps)
            f = ops.swiglu(self._mm(h, self.w[b + "ffn_gate.weight"]), self._mm(h, self.w[b + "ffn_up.weight"]))
            x = ops.add(x, self._mm(f, self.w[b + "ffn_down.weight"]))
        self.cache.truncate(P)  # only injected context persists
        logits = self._mm(ops.rms_norm(x[1:], self.w["output_norm.weight"], hp.rms_eps), self.output)
        return select_drafts(np.argmax(logits, axis=1), logits, p_min), logits
