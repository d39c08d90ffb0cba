"""The next-n head on the GPU: the kernels of the target's forward pass, on buffers this plugin owns.

Two kinds of recorded graph, each replayed with per-step values written into small buffers:
  commit(n): K/V of n committed positions (fuse, attn_norm, k/v, rope) written through the core
             cache-write hook -- nothing else persists, so nothing else is computed;
  draft(m):  m chained depths in ONE submit: depth j reads its token id and state from slot j,
             runs the whole block, writes its argmax id and the state to feed back into slot j+1.
eh_proj . [e ; h] is computed as W_e . e + W_h . h with the two column halves of eh_proj (split
on block boundaries, or dequantized to f32 where the hidden size is not a whole number of blocks)."""
from __future__ import annotations

import numpy as np

from vkdflash.errors import VkdflashError
from vkdflash.kernels import elementwise, matmul as mm, norm, rope as rope_k
from vkdflash.kernels.copy import copy
from vkdflash.kernels.embed import get_rows
from vkdflash.kernels.softmax import argmax
from vkdflash.kernels.types import get_type
from vkdflash.kernels.weights import Weight
from vkdflash.model.store import DeviceStore
from vkdflash.ref.quants import dequantize
from vkdflash.runtime.graph import Graph

MAX_ROWS = 64  # committed positions per commit graph (the kernels' batch-invariance range)


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


class HeadRunner:
    def __init__(self, gpu, heads, target, kv, max_depth: int):
        self.gpu, self.kv, self.hp, self.hidden = gpu, kv, heads.hp, heads.hidden
        self.d, self.n_vocab, self.max_depth = heads.hp.n_embd, target.n_vocab, max(1, int(max_depth))
        self.store = DeviceStore(gpu)
        try:
            self._load(heads, target)
        except BaseException:
            self.close()
            raise

    def _load(self, heads, target) -> None:
        hp, B = self.hp, MAX_ROWS
        vec, mat = (lambda s, rep=1: self._vec(heads, s, rep)), (lambda s: self._mat(heads, s))
        self.enorm, self.hnorm = vec("nextn.enorm.weight"), vec("nextn.hnorm.weight")
        self.sh_norm = vec("nextn.shared_head_norm.weight")
        self.w_e, self.w_h = self._split_eh(heads)
        self.attn_norm, self.ffn_norm = vec("attn_norm.weight"), vec("ffn_norm.weight")
        self.wq, self.wk, self.wv, self.wo = (mat(f"attn_{x}.weight") for x in ("q", "k", "v", "output"))
        self.gate, self.up, self.down = (mat(f"ffn_{x}.weight") for x in ("gate", "up", "down"))
        self.bias = [vec(f"attn_{x}.bias", B) for x in "qkv"] if hp.has_qkv_bias else None
        self.qk_norm = (vec("attn_q_norm.weight"), vec("attn_k_norm.weight")) if hp.has_qk_norm else None
        self.embed = mat("nextn.embed_tokens.weight") if heads.has("nextn.embed_tokens.weight") else target.token_embd
        self.head = (mat("nextn.shared_head_head.weight") if heads.has("nextn.shared_head_head.weight")
                     else target.output)
        d, q, kvw = self.d, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        f32 = lambda n: self._buf(4 * n)  # noqa: E731
        self.e, self.hn, self.x, self.o, self.xn = (f32(B * d) for _ in range(5))
        self.q, self.att, self.k, self.v = f32(B * q), f32(B * q), f32(B * kvw), f32(B * kvw)
        self.g, self.u = f32(B * hp.n_ff), f32(B * hp.n_ff)
        self.ids, self.pos, self.hin = self._buf(4 * B), self._buf(4 * B), f32(B * d)
        # draft slots, each on a bindable offset
        self.a = max(16, self.gpu.features.min_storage_buffer_offset_alignment)
        D, a = self.max_depth, self.a
        self.s_h, self.s_logits = _up(4 * d, a), _up(4 * self.n_vocab, a)
        self.d_ids, self.d_pos, self.d_par = self._buf(a * (D + 1)), self._buf(a * D), self._buf(a * D)
        self.d_h, self.d_logits = self._buf(self.s_h * (D + 1)), self._buf(self.s_logits * D)

    # -- weights --------------------------------------------------------------------------
    def _buf(self, nbytes: int):
        return self.store.buffer(nbytes)

    def _vec(self, heads, suffix: str, repeat: int = 1):
        return self.store.vector(heads.tensor(suffix), repeat)

    def _mat(self, heads, suffix: str) -> Weight:
        return self.store.matrix(heads.tensor(suffix), heads.name(suffix))

    def _split_eh(self, heads):
        t, d = heads.tensor("nextn.eh_proj.weight"), self.d
        tt, name = get_type(t.type_id), heads.name("nextn.eh_proj.weight")
        if d % tt.qk == 0:
            rb = tt.row_bytes(d)
            raw = np.asarray(t.data).reshape(d, 2 * rb)
            halves = [Weight(self.gpu, tt, d, d, np.ascontiguousarray(raw[:, s]), f"{name}[{i}]")
                      for i, s in enumerate((slice(0, rb), slice(rb, 2 * rb)))]
        else:
            full = dequantize(np.asarray(t.data), t.type_id, 2 * d).reshape(d, 2 * d)
            halves = [Weight.from_float(self.gpu, full[:, i * d:(i + 1) * d], "f32", f"{name}[{i}]") for i in range(2)]
        return [self.store.adopt(w) for w in halves]

    # -- recording ------------------------------------------------------------------------
    def _fuse(self, g, n, ids, h) -> None:
        """x = W_e enorm(embed(ids)) + W_h hnorm(h) for n rows."""
        d, eps = self.d, self.hp.rms_eps
        get_rows(g, self.embed, ids, self.e, n)
        norm.rms_norm(g, self.e, self.enorm, self.e, n, d, eps)
        norm.rms_norm(g, h, self.hnorm, self.hn, n, d, eps)
        mm.matmul(g, self.w_e, self.e, self.x, n)
        mm.matmul(g, self.w_h, self.hn, self.o, n)
        elementwise.add(g, self.x, self.o, self.x, n * d)

    def _qkv(self, g, n, pos, with_q: bool) -> None:
        hp, hd, eps = self.hp, self.hp.head_dim, self.hp.rms_eps
        norm.rms_norm(g, self.x, self.attn_norm, self.xn, n, self.d, eps)
        outs = ([(self.wq, self.q, 0, hp.n_head)] if with_q else []) + [(self.wk, self.k, 1, hp.n_head_kv),
                                                                       (self.wv, self.v, 2, hp.n_head_kv)]
        for w, out, which, heads in outs:
            mm.matmul(g, w, self.xn, out, n)
            if self.bias:
                elementwise.add(g, out, self.bias[which], out, n * heads * hd)
            if self.qk_norm and which < 2:
                norm.rms_norm(g, out, self.qk_norm[which], out, n * heads, hd, eps)
            if which < 2:
                rope_k.rope(g, out, pos, out, n, heads, hd, hp.rope_base, hp.rope_mode)

    def _record_commit(self, n: int) -> Graph:
        g = Graph(self.gpu)
        self._fuse(g, n, self.ids, self.hin)
        self._qkv(g, n, self.pos, with_q=False)
        self.kv.record_write(g, 0, self.k, self.v, self.pos, n)
        return g

    def _record_draft(self, m: int) -> Graph:
        hp, d, a, eps = self.hp, self.d, self.a, self.hp.rms_eps
        g = Graph(self.gpu)
        for j in range(m):
            ids, pos, par = self.d_ids.view(a * j, 4), self.d_pos.view(a * j, 4), self.d_par.view(a * j, 16)
            logits = self.d_logits.view(self.s_logits * j, 4 * self.n_vocab)
            self._fuse(g, 1, ids, self.d_h.view(self.s_h * j, 4 * d))
            self._qkv(g, 1, pos, with_q=True)
            self.kv.record_write(g, 0, self.k, self.v, pos, 1)
            self.kv.attend(g, 0, self.q, self.att, par, 1, hp.n_head)
            mm.matmul(g, self.wo, self.att, self.o, 1)
            elementwise.add(g, self.x, self.o, self.x, d)
            norm.rms_norm(g, self.x, self.ffn_norm, self.xn, 1, d, eps)
            mm.matmul(g, self.gate, self.xn, self.g, 1)
            mm.matmul(g, self.up, self.xn, self.u, 1)
            elementwise.swiglu(g, self.g, self.u, self.g, hp.n_ff)
            mm.matmul(g, self.down, self.g, self.o, 1)
            elementwise.add(g, self.x, self.o, self.x, d)
            norm.rms_norm(g, self.x, self.sh_norm, self.xn, 1, d, eps)
            mm.matmul(g, self.head, self.xn, logits, 1)
            argmax(g, logits, self.d_ids.view(a * (j + 1), 4), 1, self.n_vocab)
            if j + 1 < m:
                feed = self.x if self.hidden == "prenorm" else self.xn
                copy(g, feed, self.d_h.view(self.s_h * (j + 1), 4 * d), 4 * d)
        return g

    def _graph(self, key):
        record = self._record_commit if key[0] == "commit" else self._record_draft
        return self.store.graph(key, lambda: record(key[1]))

    # -- running --------------------------------------------------------------------------
    def commit(self, h: np.ndarray, tokens, first_pos: int) -> None:
        """Write the head's K/V for positions first_pos.. from target states h [n, d] and tokens t_{i+1}."""
        tokens = np.asarray(tokens, np.uint32)
        for s in range(0, len(tokens), MAX_ROWS):
            n = min(MAX_ROWS, len(tokens) - s)
            self.ids.write(tokens[s:s + n])
            self.pos.write(np.arange(first_pos + s, first_pos + s + n, dtype=np.uint32))
            self.hin.write(np.ascontiguousarray(h[s:s + n], np.float32))
            self._graph(("commit", n)).run()

    def draft(self, h: np.ndarray, token: int, pos: int, m: int, p_min: float = 0.0) -> list:
        """m chained drafts from state h [d] at position pos and the token after it."""
        if not 1 <= m <= self.max_depth:
            raise VkdflashError(f"mtp: {m} drafts asked, this head was set up for 1..{self.max_depth}")
        w = self.a // 4
        self.d_ids.write(np.array([token], np.uint32))
        self.d_h.write(np.ascontiguousarray(h, np.float32).reshape(-1))
        slots = np.zeros((m, w), np.uint32)
        slots[:, 0] = np.arange(pos, pos + m)
        self.d_pos.write(slots)
        self.d_par.write(slots)
        self._graph(("draft", m)).run()
        drafts = self.d_ids.read(np.uint32, w * (m + 1))[w::w].tolist()
        if p_min > 0:
            rows = self.d_logits.read(np.float32, self.s_logits // 4 * m).reshape(m, -1)[:, :self.n_vocab]
            rows = rows.astype(np.float64) - rows.max(axis=1, keepdims=True)
            top = 1.0 / np.exp(rows).sum(axis=1)  # softmax probability of the argmax
            low = np.flatnonzero(top < p_min)
            drafts = drafts[:low[0]] if low.size else drafts
        return [int(t) for t in drafts]

    def close(self) -> None:
        self.store.close()
