"""Classic speculative decoding: a separate small model with the target's vocabulary drafts
autoregressively (`-md small.gguf`, llama.cpp's and vLLM's most common method).

Written only against vkdflash.api, as the proof that it suffices: the draft's layers are the
shared decoder block, its KV cache comes from ctx.create_kv_cache (the draft cache types, the
core write path). Per step the draft chains k one-token passes in ONE submit (token j's argmax
feeds step j + 1); committed tokens it has not seen yet are fed in before the next draft.
Its cache holds rows for every committed position: after a step the rows of the accepted
drafts are already right (same tokens), the rest are fed again. Until a request's first
proposal up to IDLE_HOLD committed tokens wait (then go in ROWS a pass): a run the draft-length
controller leaves plain pays no draft pass a step."""
from __future__ import annotations

import logging

import numpy as np

from vkdflash.api import (ARCHITECTURES, BlockBuffers, BlockShape, BlockWeights, DeviceStore, Graph, Proposal,
                          Strategy, VkdflashError, argmax, dequantize, get_rows, hookimpl, load_model, matmul,
                          record_block, rms_norm, select_drafts)

__version__ = "0.1.0"
log = logging.getLogger("vkdflash")
ROWS = 64  # tokens per feed pass (the kernels' batch-invariance range)
IDLE_HOLD = 1024  # committed tokens that may wait for a request's first proposal


class DraftModel(Strategy):
    name = "draft"

    def __init__(self, ctx):
        if not ctx.options.draft_model:
            raise VkdflashError("draft needs a draft model: -md SMALL.gguf (same vocabulary as the target)")
        self.options, self.n_ctx = ctx.options, ctx.target.n_ctx
        mf = load_model(ctx.options.draft_model)
        try:
            _check_vocab(mf, ctx.target)
            self.store = DeviceStore(ctx.gpu)
            self._load(ctx, mf)
        finally:
            mf.close()
        self.n_done, self.pending, self.drafting = 0, None, False
        hp = self.hp
        log.info("draft model %s: %s, %d layers, d %d, %d/%d heads of %d", ctx.options.draft_model, hp.arch,
                 hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim)

    def _load(self, ctx, mf) -> None:
        self.hp = hp = mf.hparams
        mat = lambda name: self.store.matrix(mf.tensor(name), f"draft {name}")  # noqa: E731
        vec = lambda name, rep=1: self.store.vector(mf.tensor(name), rep)  # noqa: E731
        self.embd = mat("token_embd.weight")
        self.output = self.embd if hp.tied_output else mat("output.weight")
        self.output_norm = vec("output_norm.weight")
        self.layers = [BlockWeights.load(vec, mat, f"blk.{i}.", hp.has_qkv_bias, hp.has_qk_norm, bias_rows=ROWS)
                       for i in range(hp.n_layer)]
        factors = None
        if hp.has_rope_freqs:
            t = mf.tensor("rope_freqs.weight")
            factors = dequantize(np.asarray(t.data), t.type_id, t.shape[0]).reshape(-1)
        self.shape = BlockShape(hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.rms_eps,
                                hp.rope_base, hp.rope_mode, factors)
        self.b = BlockBuffers.alloc(self.store.buffer, self.shape, ROWS)
        self.kv = ctx.create_kv_cache(hp.n_layer, hp.n_head_kv, hp.head_dim, name="draft model")
        # per-step values in slots the device can bind: ids (k + 1), positions and first positions (k)
        self.slot = max(16, ctx.gpu.features.min_storage_buffer_offset_alignment)
        k = ctx.options.draft_max
        self.ids, self.pos = self.store.buffer(self.slot * (k + 1), host=True), self.store.buffer(self.slot * k, host=True)
        self.feed_ids, self.feed_pos = self.store.buffer(4 * ROWS, host=True), self.store.buffer(4 * ROWS, host=True)
        self.params = self.store.buffer(16, host=True)
        self.logits = self.store.buffer(4 * k * hp.n_vocab, host=True)

    # -- recording ------------------------------------------------------------------
    def _record_feed(self, n: int) -> Graph:
        """n committed tokens through every layer: their K/V go to the cache, nothing else is kept."""
        g = Graph(self.store.ctx)
        get_rows(g, self.embd, self.feed_ids, self.b.x, n)
        for i, w in enumerate(self.layers):
            record_block(g, w, self.shape, self.b, self.kv, i, n, self.feed_pos, self.params)
        return g

    def _record_chain(self, k: int) -> Graph:
        """k one-token passes: step j reads id slot j at position slot j, writes its argmax to slot j + 1."""
        g, s, d, n_vocab = Graph(self.store.ctx), self.slot, self.hp.n_embd, self.hp.n_vocab
        for j in range(k):
            pos = self.pos.view(s * j, 4)
            get_rows(g, self.embd, self.ids.view(s * j, 4), self.b.x, 1)
            for i, w in enumerate(self.layers):
                record_block(g, w, self.shape, self.b, self.kv, i, 1, pos, self.pos.view(s * j, 16))
            rms_norm(g, self.b.x, self.output_norm, self.b.xn, 1, d, self.hp.rms_eps)
            logits = self.logits.view(4 * n_vocab * j, 4 * n_vocab)
            matmul(g, self.output, self.b.xn, logits, 1)
            argmax(g, logits, self.ids.view(s * (j + 1), 4), 1, n_vocab)
        return g

    # -- the strategy API -----------------------------------------------------------
    def begin(self, ctx) -> None:
        self.n_done, self.pending, self.drafting = 0, None, False
        self._catch_up(ctx.tokens)

    def commit(self, ctx) -> None:
        first, k = self.pending or (self.n_done, 0)
        # the rows written while drafting hold last, d1.. d_{k-1} at first..first+k-1: right where committed
        self.n_done, self.pending = min(len(ctx.tokens), first + k), None
        self._catch_up(ctx.tokens)

    def _catch_up(self, tokens) -> None:
        if self.drafting or len(tokens) - self.n_done >= IDLE_HOLD:
            self._feed(tokens)

    def _feed(self, tokens) -> None:
        """Write the K/V of committed tokens the cache does not hold yet."""
        self.kv.truncate(self.n_done)
        while self.n_done < len(tokens):
            chunk = np.asarray(tokens[self.n_done:self.n_done + ROWS], np.uint32)
            self.feed_ids.write(chunk)
            self.feed_pos.write(np.arange(self.n_done, self.n_done + len(chunk), dtype=np.uint32))
            self.params.write(np.array([self.n_done, 0, 0, 0], np.uint32))
            self.store.graph(("feed", len(chunk)), lambda n=len(chunk): self._record_feed(n)).run()
            self.n_done += len(chunk)

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        P = len(ctx.tokens)
        k = min(max_n, self.options.draft_max, self.n_ctx - 1 - P)
        if k <= 0:
            return Proposal([])
        self.drafting = True
        self._feed(ctx.tokens)
        if self.n_done != P:
            raise VkdflashError(f"draft: the draft cache holds {self.n_done} positions, drafting at {P}")
        w = self.slot // 4
        self.ids.write(np.array([last_token], np.uint32))
        slots = np.zeros((k, w), np.uint32)
        slots[:, 0] = np.arange(P, P + k)
        self.pos.write(slots)
        self.store.graph(("chain", k), lambda: self._record_chain(k)).run()
        self.pending = (P, k)
        ids = self.ids.read(np.uint32, w * (k + 1)).reshape(k + 1, w)[1:, 0]
        logits = (self.logits.read(np.float32, k * self.hp.n_vocab).reshape(k, -1)
                  if self.options.p_min > 0 else None)
        return Proposal(select_drafts(ids, logits, self.options.p_min))

    def close(self) -> None:
        self.store.close()


def _check_vocab(mf, target) -> None:
    """Drafts are token ids: the draft must number tokens exactly as the target does."""
    mine, theirs = mf.metadata.get("tokenizer.ggml.tokens"), None
    if target.model_file is not None:
        theirs = target.model_file.metadata.get("tokenizer.ggml.tokens")
    if mf.hparams.n_vocab > target.n_vocab or (mine is not None and theirs is not None and list(mine) != list(theirs)):
        raise VkdflashError(f"draft model {mf.gguf.path} has another vocabulary than the target "
                            f"({mf.hparams.n_vocab} vs {target.n_vocab} tokens, or different token strings)")


@hookimpl
def register_strategies(register):
    register("draft", DraftModel, "a separate small model with the target's vocabulary drafts token by token "
                                  "(-md SMALL.gguf)")


@hookimpl(trylast=True)
def claim_draft_file(path, metadata):
    """A plain dense model is a classic draft (other plugins' draft formats are claimed first)."""
    return "draft" if metadata.get("general.architecture") in ARCHITECTURES else None
