"""The DFlash proposer on the GPU: inject committed target features, draft a block in one pass.

inject (begin / commit), per committed position p, features = [h_L1 | ... | h_LK]:
  g = RMSNorm_enc(fc . features); per draft layer: K = RoPE_p(k_norm(W_k g)), V = W_v g -> the
  draft cache at p through the KV handle (the core write hook: rotation, then quantization).
propose: tokens [last, MASK x n] at P..P+n (P = committed positions = injected positions), the
  layer stack with the "block" mask, LM head on rows 1..n, greedy argmax on the GPU. Attention
  sees 0..P+n: 0..P-1 were injected, P..P+n written by this very pass, so no stale row is ever
  read; the block's rows are dropped afterwards and overwritten by the next injection.
One graph is recorded per shape and replayed; ids, positions and first position live in small
buffers rewritten per step."""
from __future__ import annotations

import logging

import numpy as np

from vkdflash.errors import VkdflashError
from vkdflash.kernels import elementwise, matmul as mm, norm, rope as rope_k
from vkdflash.kernels.embed import get_rows
from vkdflash.kernels.softmax import argmax
from vkdflash.kernels.weights import Weight
from vkdflash.model.store import DeviceStore
from vkdflash.ref.dflash import select_drafts
from vkdflash.runtime.graph import Graph
from vkdflash.spec import Proposal, Strategy

from .draft_file import load_draft

log = logging.getLogger("vkdflash")
INJECT_ROWS = 64  # positions fused per injection pass (longer prompts go in chunks)


class Layer:
    def __init__(self, i: int, vec, mat):
        b = f"blk.{i}."
        self.attn_norm, self.ffn_norm = vec(b + "attn_norm.weight"), vec(b + "ffn_norm.weight")
        self.q_norm, self.k_norm = vec(b + "attn_q_norm.weight"), vec(b + "attn_k_norm.weight")
        self.wq, self.wk, self.wv = mat(b + "attn_q.weight"), mat(b + "attn_k.weight"), mat(b + "attn_v.weight")
        self.wo = mat(b + "attn_output.weight")
        self.gate, self.up, self.down = mat(b + "ffn_gate.weight"), mat(b + "ffn_up.weight"), mat(b + "ffn_down.weight")


class DFlash(Strategy):
    name = "dflash"

    def __init__(self, ctx):
        if not ctx.options.draft_model:
            raise VkdflashError("dflash needs a draft model: -md FILE")
        self.gpu, self.options = ctx.gpu, ctx.options
        self.draft = load_draft(ctx.options.draft_model, ctx.target.hparams)
        self.hp = hp = self.draft.hp
        self.capture_layers = hp.target_layers
        self.n_vocab = ctx.target.n_vocab
        self.store = DeviceStore(ctx.gpu)
        try:
            self._load(ctx)
        except Exception:
            self.close()
            raise
        self.draft.close()  # every tensor now lives in device buffers
        self.n_injected = 0
        log.info("dflash draft %s: %d layers, block size %d, target layers %s, mask token %d, %s embedding, "
                 "%s LM head", ctx.options.draft_model, hp.n_layer, hp.block_size, list(hp.target_layers),
                 hp.mask_token_id, "own" if hp.own_embd else "target's", "own" if hp.own_output else "target's")

    def _load(self, ctx) -> None:
        hp, d, B = self.hp, self.hp.n_embd, INJECT_ROWS
        self.fc = self._mat("fc.weight")
        self.enc_norm, self.output_norm = self._vec("enc.output_norm.weight"), self._vec("output_norm.weight")
        self.embd = self._mat("token_embd.weight") if hp.own_embd else ctx.target.token_embd
        self.output = self._mat("output.weight") if hp.own_output else ctx.target.output
        self.layers = [Layer(i, self._vec, self._mat) for i in range(hp.n_layer)]
        self.kv = ctx.create_kv_cache(hp.n_layer, hp.n_head_kv, hp.head_dim, name="dflash draft")
        q, kv, nb = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.block_size
        f32 = lambda n: self._buf(4 * n)  # noqa: E731
        self.feat, self.g = f32(B * hp.n_features), f32(B * d)
        self.k, self.v, self.pos = f32(B * kv), f32(B * kv), self._buf(4 * B)
        self.x, self.xn, self.o = f32(nb * d), f32(nb * d), f32(nb * d)
        self.q, self.att = f32(nb * q), f32(nb * q)
        self.gate, self.up = f32(nb * hp.n_ff), f32(nb * hp.n_ff)
        self.logits, self.ids, self.best = f32(nb * self.n_vocab), self._buf(4 * nb), self._buf(4 * nb)
        self.params = self._buf(16)

    def _buf(self, nbytes: int):
        return self.store.buffer(nbytes)

    def _mat(self, name: str) -> Weight:
        return self.store.matrix(self.draft.tensor(name), f"dflash {name}")

    def _vec(self, name: str):
        return self.store.vector(self.draft.tensor(name))

    # -- recording ------------------------------------------------------------------
    def _kv_rows(self, g, L: Layer, src, n: int) -> None:
        """K = RoPE(k_norm(W_k src)), V = W_v src for n rows at the positions in self.pos."""
        hp = self.hp
        mm.matmul(g, L.wk, src, self.k, n)
        mm.matmul(g, L.wv, src, self.v, n)
        norm.rms_norm(g, self.k, L.k_norm, self.k, n * hp.n_head_kv, hp.head_dim, hp.rms_eps)
        rope_k.rope(g, self.k, self.pos, self.k, n, hp.n_head_kv, hp.head_dim, hp.rope_base, "neox")

    def _record_inject(self, n: int) -> Graph:
        hp, g = self.hp, Graph(self.gpu)
        mm.matmul(g, self.fc, self.feat, self.g, n)
        norm.rms_norm(g, self.g, self.enc_norm, self.g, n, hp.n_embd, hp.rms_eps)
        for i, L in enumerate(self.layers):  # no attn_norm on g and no attention: K/V only
            self._kv_rows(g, L, self.g, n)
            self.kv.record_write(g, i, self.k, self.v, self.pos, n)
        return g

    def _record_block(self, n: int) -> Graph:
        """n + 1 rows: [last, MASK x n] -> argmax ids of rows 1..n (and their logits)."""
        hp, g, m, d = self.hp, Graph(self.gpu), n + 1, self.hp.n_embd
        get_rows(g, self.embd, self.ids, self.x, m)
        for i, L in enumerate(self.layers):
            norm.rms_norm(g, self.x, L.attn_norm, self.xn, m, d, hp.rms_eps)
            mm.matmul(g, L.wq, self.xn, self.q, m)
            norm.rms_norm(g, self.q, L.q_norm, self.q, m * hp.n_head, hp.head_dim, hp.rms_eps)
            rope_k.rope(g, self.q, self.pos, self.q, m, hp.n_head, hp.head_dim, hp.rope_base, "neox")
            self._kv_rows(g, L, self.xn, m)
            self.kv.record_write(g, i, self.k, self.v, self.pos, m)
            self.kv.attend(g, i, self.q, self.att, self.params, m, hp.n_head, mask="block")
            mm.matmul(g, L.wo, self.att, self.o, m)
            elementwise.add(g, self.x, self.o, self.x, m * d)
            norm.rms_norm(g, self.x, L.ffn_norm, self.xn, m, d, hp.rms_eps)
            mm.matmul(g, L.gate, self.xn, self.gate, m)
            mm.matmul(g, L.up, self.xn, self.up, m)
            elementwise.swiglu(g, self.gate, self.up, self.gate, m * hp.n_ff)
            mm.matmul(g, L.down, self.gate, self.o, m)
            elementwise.add(g, self.x, self.o, self.x, m * d)
        rows = self.xn.view(d * 4, n * d * 4)  # row 0 (the last token) predicts nothing new
        norm.rms_norm(g, self.x.view(d * 4, n * d * 4), self.output_norm, rows, n, d, hp.rms_eps)
        mm.matmul(g, self.output, rows, self.logits, n)
        argmax(g, self.logits, self.best, n, self.n_vocab)
        return g

    def _graph(self, key):
        record = self._record_inject if key[0] == "inject" else self._record_block
        return self.store.graph(key, lambda: record(key[1]))

    # -- the strategy API -----------------------------------------------------------
    def begin(self, ctx) -> None:
        self.n_injected = 0
        self._inject(ctx)

    def commit(self, ctx) -> None:
        self._inject(ctx)

    def _inject(self, ctx) -> None:
        start = ctx.new_start
        missing = [i for i in self.hp.target_layers if i not in ctx.new_hidden]
        if missing:
            raise VkdflashError(f"dflash needs the target's layer input {missing[0]}, which was not captured")
        feats = np.concatenate([np.asarray(ctx.new_hidden[i], np.float32) for i in self.hp.target_layers], axis=1)
        if start > self.n_injected:
            raise VkdflashError(f"dflash injection at position {start} leaves a gap "
                                f"(the draft context holds {self.n_injected})")
        for first in range(0, len(feats), INJECT_ROWS):
            chunk = np.ascontiguousarray(feats[first:first + INJECT_ROWS])
            self.feat.write(chunk)
            self.pos.write(np.arange(start + first, start + first + len(chunk), dtype=np.uint32))
            self._graph(("inject", len(chunk))).run()
        self.n_injected = start + len(feats)

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        P = len(ctx.tokens)
        n = min(max_n, self.hp.block_size - 1, self.kv.info.n_ctx - 1 - P)
        if n <= 0:
            return Proposal([])
        if P != self.n_injected:
            raise VkdflashError(f"dflash drafts at position {P} but holds context for {self.n_injected}")
        self.ids.write(np.array([last_token] + [self.hp.mask_token_id] * n, np.uint32))
        self.pos.write(np.arange(P, P + n + 1, dtype=np.uint32))
        self.params.write(np.array([P, 0, 0, 0], np.uint32))
        self._graph(("block", n)).run()
        self.kv.truncate(P)  # only injected context persists; P.. are rewritten on commit
        ids = self.best.read(np.uint32, n)
        logits = (self.logits.read(np.float32, n * self.n_vocab).reshape(n, self.n_vocab)
                  if self.options.p_min > 0 else None)
        return Proposal(select_drafts(ids, logits, self.options.p_min))

    def close(self) -> None:
        self.store.close()
        self.draft.close()
