"""The DFlash proposer on the GPU: inject committed target features, draft a block in one pass.

inject (begin / commit), per committed position p, features = [h_L1 | ... | h_LK]:
  g = RMSNorm_enc(fc . features); per draft layer: K = RoPE_p(k_norm(W_k g)), V = W_v g -> the
  draft cache at p through the KV handle (the core write hook: rotation, then quantization).
propose: tokens [last, MASK x n] at P..P+n (P = committed positions = injected positions), the
  layer stack with the "block" mask, LM head on rows 1..n (over the draft vocabulary's tokens
  where the file lists them: vkdflash.api.DraftVocab), greedy argmax on the GPU. Attention
  sees 0..P+n: 0..P-1 were injected, P..P+n written by this very pass, so no stale row is ever
  read; the block's rows are dropped afterwards and overwritten by the next injection.
One graph is recorded per shape and replayed; ids, positions and first position live in small
buffers rewritten per step. Committed features wait for the next proposal (at most INJECT_ROWS
of them, then one injection pass): a step the draft-length controller leaves plain pays nothing.
Until a request's first proposal up to IDLE_HOLD wait, so a run that never drafts never compiles
the injection graph either (1.3 s of a 128-token `generate` on lavapipe)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from vkdflash.api import (BlockBuffers, BlockShape, BlockWeights, DeviceStore, Graph, Proposal, Strategy, VkdflashError,
                          Weight, argmax, draft_vocab, get_rows, matmul, record_block, rms_norm, sample_drafts,
                          select_drafts, shipped_draft, suite_record, write_kv)

from .draft_file import load_draft

log = logging.getLogger("vkdflash")
INJECT_ROWS = 64  # committed positions that may wait for a proposal (injected a block's rows a pass)
IDLE_HOLD = 1024  # positions that may wait before a request's first proposal (~9 KB each)
SHIPPED = Path(__file__).parent / "drafts"  # drafts trained for particular targets (tools/train)


class DFlash(Strategy):
    name = "dflash"

    def __init__(self, ctx):
        path = ctx.options.draft_model or shipped_draft(SHIPPED, getattr(ctx.target, "model_file", None))
        if not path:
            raise VkdflashError("dflash needs a draft model: -md FILE")
        if not ctx.options.draft_model:
            log.info("dflash: no -md given; using the draft shipped for this target: %s", path)
        self.gpu, self.options = ctx.gpu, ctx.options
        self.draft = load_draft(path, ctx.target.hparams)
        self.record = suite_record(self.draft.gguf.metadata)
        self.expected_first_acceptance = self.record.first_acceptance
        self.hp = hp = self.draft.hp
        self.capture_layers = hp.target_layers
        self.longest_draft = hp.block_size - 1  # row 0 of a block is the last committed token
        self.n_vocab = ctx.target.n_vocab
        self.vocab = draft_vocab(self.draft.gguf.metadata, self.n_vocab, ctx.options.settings)
        if self.vocab and not hp.own_output and ctx.target.model_file is None:
            self.vocab = None  # the target's file is not at hand to narrow its head
        self.n_out = self.vocab.size if self.vocab else self.n_vocab  # LM head rows
        self.store = DeviceStore(ctx.gpu)
        try:
            self._load(ctx)
        except Exception:
            self.close()
            raise
        self.draft.close()  # every tensor now lives in device buffers
        self.n_injected, self.pending, self.drafting, self.tail = 0, [], False, None
        self.widths: set = set()  # rows of the passes this draft has run: their kernels are compiled
        log.info("dflash draft %s: %d layers, block size %d, target layers %s, mask token %d, %s embedding, "
                 "%s LM head over %s%s", path, hp.n_layer, hp.block_size, list(hp.target_layers),
                 hp.mask_token_id, "own" if hp.own_embd else "target's", "own" if hp.own_output else "target's",
                 f"the file's {self.n_out} most frequent tokens of {self.n_vocab} (--spec-opt dflash.vocab=0: "
                 "every token)" if self.vocab else "every token",
                 f"; its suite measured {self.record.note}" if self.record.note else "")

    def _load(self, ctx) -> None:
        hp, d, B = self.hp, self.hp.n_embd, INJECT_ROWS
        self.fc = self._mat("fc.weight")
        self.enc_norm, self.output_norm = self._vec("enc.output_norm.weight"), self._vec("output_norm.weight")
        self.embd = self._mat("token_embd.weight") if hp.own_embd else ctx.target.token_embd
        self.output = self._head(ctx)
        self.layers = [BlockWeights.load(self._vec, self._mat, f"blk.{i}.", qk_norm=True) for i in range(hp.n_layer)]
        self.kv = ctx.create_kv_cache(hp.n_layer, hp.n_head_kv, hp.head_dim, name="dflash draft")
        self.shape = BlockShape(d, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.rms_eps, hp.rope_base, "neox")
        nb = hp.block_size
        self.b = BlockBuffers.alloc(self._buf, self.shape, max(B, nb))  # K/V of B injected rows, or a block
        self.feat, self.g = self._buf(4 * B * hp.n_features), self._buf(4 * B * d)
        self.pos = self._buf(4 * max(B, nb))  # an injection's positions, or a block's
        self.logits, self.ids, self.best = self._buf(4 * nb * self.n_out), self._buf(4 * nb), self._buf(4 * nb)
        self.params = self._buf(16)

    def _head(self, ctx) -> Weight:
        if not self.vocab:
            return self._mat("output.weight") if self.hp.own_output else ctx.target.output
        if self.hp.own_output:
            tensor, name = self.draft.tensor("output.weight"), "dflash output.weight"
        else:
            mf = ctx.target.model_file
            tensor, name = mf.tensor(mf.output_name), f"target {mf.output_name}"
        return self.vocab.head(self.store, tensor, name)

    def _buf(self, nbytes: int):
        return self.store.buffer(nbytes)

    def _mat(self, name: str) -> Weight:
        return self.store.matrix(self.draft.tensor(name), f"dflash {name}")

    def _vec(self, name: str):
        return self.store.vector(self.draft.tensor(name))

    # -- recording ------------------------------------------------------------------
    def _record_inject(self, n: int) -> Graph:
        hp, g = self.hp, Graph(self.gpu)
        matmul(g, self.fc, self.feat, self.g, n)
        rms_norm(g, self.g, self.enc_norm, self.g, n, hp.n_embd, hp.rms_eps)
        for i, w in enumerate(self.layers):  # no attn_norm on g and no attention: K/V only
            write_kv(g, w, self.shape, self.b, self.kv, i, self.g, n, self.pos)
        return g

    def _record_block(self, n: int) -> Graph:
        """n + 1 rows: [last, MASK x n] -> argmax ids of rows 1..n (and their logits)."""
        hp, g, m, d, b = self.hp, Graph(self.gpu), n + 1, self.hp.n_embd, self.b
        get_rows(g, self.embd, self.ids, b.x, m)
        for i, w in enumerate(self.layers):
            record_block(g, w, self.shape, b, self.kv, i, m, self.pos, self.params, mask="block")
        rows = b.xn.view(d * 4, n * d * 4)  # row 0 (the last token) predicts nothing new
        rms_norm(g, b.x.view(d * 4, n * d * 4), self.output_norm, rows, n, d, hp.rms_eps)
        matmul(g, self.output, rows, self.logits, n)
        argmax(g, self.logits, self.best, n, self.n_out)
        return g

    def _graph(self, key):
        record = self._record_inject if key[0] == "inject" else self._record_block
        return self.store.graph(key, lambda: record(key[1]))

    # -- the strategy API -----------------------------------------------------------
    def begin(self, ctx) -> None:
        self.n_injected, self.pending, self.drafting, self.tail = 0, [], False, None
        self.rng = np.random.default_rng(ctx.seed)  # draws the drafts when the request samples
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
        if start != self.n_injected:
            self._flush()  # rewrites positions it had: what is pending must go first
        self.pending.append((start, feats))
        self.n_injected = start + len(feats)
        if self.n_injected - self.pending[0][0] >= (INJECT_ROWS if self.drafting else IDLE_HOLD):
            self._flush()

    def _flush(self) -> None:
        """Inject every committed position still pending, in passes of widths this draft already
        runs: every width family compiles its own matmul kernels (lavapipe: ~0.3 s each, two or
        three a family), a drafting step commits 1..k+1 positions, and a k-draft block compiles
        the (k+1)-row family anyway. A remainder no such width covers exactly goes in the
        narrowest one that does, widened backwards over positions injected before: their
        features give the same bits again (a row's result does not depend on the pass's width).
        Before any block has run, a block's rows a pass (held positions pile up in any number)."""
        if not self.pending:
            return
        start, feats = self.pending[0][0], np.concatenate([f for _, f in self.pending])
        self.pending = []
        first, known = start, feats
        if self.tail is not None and self.tail[0] + len(self.tail[1]) == start:
            first, known = self.tail[0], np.concatenate([self.tail[1], feats])
        end, block = start + len(feats), self.hp.block_size
        widths = self.widths or {min(INJECT_ROWS, block)}  # every width run is a block's at most
        at = start
        while at < end:
            fits = [w for w in widths if w >= end - at and end - w >= first]
            w = min(fits) if fits else max([w for w in widths if w <= end - at] or [end - at])
            at = end - w if fits else at
            self._inject_rows(at, known[at - first:at - first + w])
            at += w
        keep = min(len(known), block)
        self.tail = (end - keep, known[len(known) - keep:])

    def _inject_rows(self, at: int, feats: np.ndarray) -> None:
        self.widths.add(len(feats))
        self.feat.write(np.ascontiguousarray(feats))
        self.pos.write(np.arange(at, at + len(feats), dtype=np.uint32))
        self._graph(("inject", len(feats))).run()

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        P = len(ctx.tokens)
        n = min(max_n, self.hp.block_size - 1, self.kv.info.n_ctx - 1 - P)
        if n <= 0:
            return Proposal([])
        if P != self.n_injected:
            raise VkdflashError(f"dflash drafts at position {P} but holds context for {self.n_injected}")
        self.drafting = True
        self.widths.add(n + 1)  # this block's family: compiled now if it is not yet
        self._flush()
        self.ids.write(np.array([last_token] + [self.hp.mask_token_id] * n, np.uint32))
        self.pos.write(np.arange(P, P + n + 1, dtype=np.uint32))
        self.params.write(np.array([P, 0, 0, 0], np.uint32))
        self._graph(("block", n)).run()
        self.kv.truncate(P)  # only injected context persists; P.. are rewritten on commit
        sampled = ctx.temperature > 0
        logits = (self.logits.read(np.float32, n * self.n_out).reshape(n, self.n_out)
                  if self.options.p_min > 0 or sampled else None)
        if sampled:  # each block row's own distribution: rows are predicted in parallel
            rows, probs = sample_drafts(logits, ctx.temperature, self.rng, self.options.p_min)
            return Proposal(self.vocab.tokens(rows), self.vocab.widen(probs)) if self.vocab else Proposal(rows, probs)
        rows = select_drafts(self.best.read(np.uint32, n), logits, self.options.p_min)
        return Proposal(self.vocab.tokens(rows) if self.vocab else rows)

    def close(self) -> None:
        self.store.close()
        self.draft.close()
