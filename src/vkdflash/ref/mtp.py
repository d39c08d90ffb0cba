"""numpy reference of next-n (MTP) head drafting: the pipeline of the `mtp` strategy plugin.

Positions. The target has committed t_0..t_{C-1} with states h_0..h_{C-1} (h_i has seen t_0..t_i).
The head at position i consumes (h_i, t_{i+1}) and predicts t_{i+2}:
  x_i = eh_proj . [enorm(embed(t_{i+1})) ; hnorm(h_i)]      (embedding first)
  y_i = block(x_i) at rope position i, with the head's own KV cache; logits_i = head(shared_head_norm(y_i))
so the cache holds an entry for every position i whose t_{i+1} is committed: 0..C-2 (written by
update() from the committed tokens and the target's states; only K/V are needed there).
Drafting from the newest token t_P (P = C, not committed, h known up to P-1):
  depth 1: (h_{P-1}, t_P) at position P-1 -> d_1;  depth k: (f(y_{k-1}), d_{k-1}) at P+k-2 -> d_k,
f being the identity for "prenorm" heads and shared_head_norm for "postnorm" ones (the state fed
back is of the kind the head was trained on); the drafted positions are dropped afterwards.

`heads` is any object with .hp (HParams of the head block), .first (its block index), .hidden,
.has(suffix) and .tensor(suffix) -> TensorData (vkdflash_mtp.heads.Heads). Arithmetic as
ref.model: f64 products rounded to f32, K/V through ref.kv.KVCache (rotation, quantization)."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from . import ops
from .kv import KVCache
from .model import dequantize_tensor


class RefMTP:
    def __init__(self, heads, target_weights, ctk: str = "f16", ctv: str = "f16", rotate: bool = True):
        self.hp, self.hidden = heads.hp, heads.hidden
        self.w = {}
        for suffix in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                       "ffn_down", "attn_q_norm", "attn_k_norm", "nextn.eh_proj", "nextn.enorm", "nextn.hnorm",
                       "nextn.shared_head_norm", "nextn.embed_tokens", "nextn.shared_head_head"):
            for kind in ("weight", "bias"):
                if heads.has(f"{suffix}.{kind}"):
                    x = dequantize_tensor(heads.tensor(f"{suffix}.{kind}"))
                    self.w[f"{suffix}.{kind}"] = x.astype(np.float64) if x.ndim > 1 else x
        self.embed = self.w.get("nextn.embed_tokens.weight", target_weights["token_embd.weight"])
        self.head = self.w.get("nextn.shared_head_head.weight", target_weights["output.weight"])
        self.cache = KVCache(1, self.hp.n_head_kv, self.hp.head_dim, ctk, ctv, rotate)
        self.n_written, self.h_prev = 0, None

    # -- the head, row-wise --------------------------------------------------------------
    def _mm(self, x, name: str) -> np.ndarray:
        y = (np.asarray(x, np.float64) @ self.w[name + ".weight"].T).astype(np.float32)
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def _norm(self, x, name: str) -> np.ndarray:
        return ops.rms_norm(x, self.w[name + ".weight"], self.hp.rms_eps)

    def fuse(self, h: np.ndarray, tokens) -> np.ndarray:
        e = self.embed[np.asarray(tokens, np.int64)].astype(np.float32)
        cat = np.concatenate([self._norm(e, "nextn.enorm"), self._norm(h, "nextn.hnorm")], axis=1)
        return self._mm(cat, "nextn.eh_proj")

    def _qkv(self, x: np.ndarray, pos0: int):
        hp, n = self.hp, len(x)
        h = self._norm(x, "attn_norm")
        q = self._mm(h, "attn_q").reshape(n, hp.n_head, hp.head_dim)
        k = self._mm(h, "attn_k").reshape(n, hp.n_head_kv, hp.head_dim)
        v = self._mm(h, "attn_v").reshape(n, hp.n_head_kv, hp.head_dim)
        if hp.has_qk_norm:
            q, k = self._norm(q, "attn_q_norm"), self._norm(k, "attn_k_norm")
        positions = pos0 + np.arange(n)
        q = ops.rope(q, positions, hp.rope_base, hp.rope_mode)
        k = ops.rope(k, positions, hp.rope_base, hp.rope_mode)
        return q, k, v

    def block(self, x: np.ndarray, pos0: int) -> np.ndarray:
        """The head's decoder block on rows at positions pos0.. (writes their K/V, attends causally)."""
        hp, n = self.hp, len(x)
        q, k, v = self._qkv(x, pos0)
        self.cache.write(0, pos0, k, v)
        o = self.cache.attend(0, q, pos0)
        x = x + self._mm(o.reshape(n, hp.n_head * hp.head_dim), "attn_output")
        h = self._norm(x, "ffn_norm")
        return x + self._mm(ops.swiglu(self._mm(h, "ffn_gate"), self._mm(h, "ffn_up")), "ffn_down")

    def output(self, y: np.ndarray):
        """(state fed to the next depth, logits) of block outputs y."""
        yn = self._norm(y, "nextn.shared_head_norm")
        logits = (np.asarray(yn, np.float64) @ self.head.T).astype(np.float32)
        return (y if self.hidden == "prenorm" else yn), logits

    # -- the strategy's state machine ----------------------------------------------------
    def update(self, tokens, new_start: int, new_h: np.ndarray) -> None:
        """Committed tokens (all of them) and the target states of positions new_start..C-1: write
        the head's K/V for every position up to C-2 not yet written."""
        tokens, new_h = list(tokens), np.asarray(new_h, np.float32)
        c = len(tokens)
        if new_start + len(new_h) != c or new_start != (0 if self.h_prev is None else self.n_written + 1):
            raise VkdflashError(f"mtp: states for positions {new_start}..{new_start + len(new_h) - 1} do not "
                                f"follow the {self.n_written + 1 if self.h_prev is not None else 0} committed")
        hs = new_h if self.h_prev is None else np.concatenate([self.h_prev[None], new_h])
        first = self.n_written
        positions = np.arange(first, c - 1)
        self.cache.truncate(first)
        if len(positions):
            x = self.fuse(hs[:len(positions)], [tokens[i + 1] for i in positions])
            _, k, v = self._qkv(x, first)
            self.cache.write(0, first, k, v)
        self.h_prev, self.n_written = new_h[-1].copy(), c - 1

    def propose(self, last_token: int, max_n: int):
        """Drafts d_1..d_max_n after last_token and their logits [max_n, n_vocab]."""
        if self.h_prev is None:
            raise VkdflashError("mtp: propose before any committed target state")
        h, tok, drafts, logits = self.h_prev[None], int(last_token), [], []
        for depth in range(max_n):
            y = self.block(self.fuse(h, [tok]), self.n_written + depth)
            h, lg = self.output(y)
            tok = int(np.argmax(lg[0]))
            drafts.append(tok)
            logits.append(lg[0])
        self.cache.truncate(self.n_written)
        return drafts, np.array(logits, np.float32).reshape(len(drafts), -1)
