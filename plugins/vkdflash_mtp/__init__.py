"""MTP drafting with next-n prediction heads (DeepSeek-V3 / GLM / Qwen3.5 style, docs/design.md 5).

The head reads the target's state h_i and the embedding of the next token t_{i+1}, runs one
decoder block with its own KV cache and predicts t_{i+2}; drafting chains it on its own output
up to --draft-max deep (positions: vkdflash.ref.mtp, the numpy reference of this plugin).
Heads come from the target GGUF or from a -md sidecar (formats: vkdflash_mtp.heads). The head's
cache is made with ctx.create_kv_cache, so it has the draft cache types (-ctkd / -ctvd) and every
write goes through the core cache-write hook, rotated like any other. Committed positions are
written when a proposal needs them (at most MAX_PENDING held back): while the draft-length
controller idles at k 0, a step pays nothing for the head (its K/V work was ~1 ms of a 25 ms
step on lavapipe, the cost that switched the head off where no draft length paid). Until a
request's first proposal up to IDLE_HOLD wait, so a run that never drafts (a short cold one on
lavapipe, where a longer verify would not repay its compile) never compiles the commit graph
either: 0.9 s of a 128-token `generate`."""
from __future__ import annotations

import logging

import numpy as np

from vkdflash.api import VOCAB, Proposal, Strategy, VkdflashError, draft_vocab, hookimpl, offer, suite_record

from .gpu import HeadRunner
from .heads import NO_HEADS, SHIPPED, SIDECAR_ARCH, Heads, find_heads, load_sidecar

__version__ = "0.1.0"
log = logging.getLogger("vkdflash")
MAX_PENDING = 64  # committed positions whose K/V may wait for a proposal (one commit graph)
IDLE_HOLD = 1024  # the same before a request's first proposal (~2 KB a position held)
__all__ = ["MTP", "NO_HEADS", "Heads", "HeadRunner", "find_heads", "load_sidecar"]


class MTP(Strategy):
    name = "mtp"

    def __init__(self, ctx):
        target = ctx.target
        self.heads = find_heads(target.hparams, getattr(target, "model_file", None), ctx.options.draft_model)
        try:
            self.expected_first_acceptance = suite_record(self.heads.source.metadata).first_acceptance
            hp = self.heads.hp
            # the residual leaving the trunk (prenorm heads); postnorm heads read ctx.new_final,
            # which the engine hands over whenever anything is captured
            self.capture_layers = (target.hparams.n_layer,)
            self.kv = ctx.create_kv_cache(1, hp.n_head_kv, hp.head_dim, name="mtp")
            vocab = self._vocab(ctx)
            self.runner = HeadRunner(ctx.gpu, self.heads, target, self.kv, ctx.options.draft_max, vocab)
        except BaseException:
            self.heads.close()
            raise
        self.p_min = ctx.options.p_min
        self.n_written, self.h_prev = 0, None  # head K/V due for positions 0..n_written-1
        self.pending = []  # (states, tokens, first position) not yet written
        self.drafting = False  # proposed this request: positions wait MAX_PENDING, not IDLE_HOLD

    def _vocab(self, ctx):
        vocab = draft_vocab(self.heads.source.metadata, ctx.target.n_vocab, ctx.options.settings)
        if vocab and ctx.target.model_file is None:
            log.info("mtp: LM head over every token (the target's file is not at hand to narrow it)")
            return None
        log.info("mtp: LM head over %s", f"the head file's {vocab.size} most frequent tokens of {vocab.n_vocab} "
                 "(--spec-opt mtp.vocab=0: every token)" if vocab else "every token")
        return vocab

    def _states(self, ctx) -> np.ndarray:
        if self.heads.hidden == "prenorm":
            h = ctx.new_hidden.get(ctx.target.hparams.n_layer)
        else:
            h = ctx.new_final
        if h is None:
            raise VkdflashError("mtp: the engine handed over no target states")
        return np.asarray(h, np.float32)

    def begin(self, ctx) -> None:
        self.n_written, self.h_prev, self.pending, self.drafting = 0, None, [], False
        self.rng = np.random.default_rng(ctx.seed)  # Gumbel noise when the request samples
        self._update(ctx)

    def commit(self, ctx) -> None:
        self._update(ctx)

    def _update(self, ctx) -> None:
        """K/V for every position i whose next token t_{i+1} is now committed (see ref.mtp)."""
        new, c = self._states(ctx), len(ctx.tokens)
        expect = 0 if self.h_prev is None else self.n_written + 1
        if ctx.new_start != expect or ctx.new_start + len(new) != c:
            raise VkdflashError(f"mtp: states for positions {ctx.new_start}..{ctx.new_start + len(new) - 1} do "
                                f"not follow the {expect} committed before")
        hs = new if self.h_prev is None else np.concatenate([self.h_prev[None], new])
        first = self.n_written
        if c - 1 > first:
            self.pending.append((hs[:c - 1 - first], ctx.tokens[first + 1:c], first))
        self.h_prev, self.n_written = new[-1].copy(), c - 1
        if self.pending and self.n_written - self.pending[0][2] >= (MAX_PENDING if self.drafting else IDLE_HOLD):
            self._flush()

    def _flush(self) -> None:
        """Write the K/V of every committed position still pending, in one go."""
        if not self.pending:
            return
        first = self.pending[0][2]
        hs = np.concatenate([h for h, _, _ in self.pending])
        tokens = [t for _, ts, _ in self.pending for t in ts]
        self.pending = []
        self.kv.truncate(first)
        self.runner.commit(hs, tokens, first)

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        if self.h_prev is None or max_n <= 0:
            return Proposal([])
        m = min(max_n, self.runner.max_depth)
        self.drafting = True
        self._flush()
        try:
            drafts, probs = self.runner.draft(self.h_prev, last_token, self.n_written, m, self.p_min,
                                              ctx.temperature, self.rng)
        finally:
            self.kv.truncate(self.n_written)  # drafted positions are never kept
        return Proposal(drafts, probs)

    def close(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()
        self.heads.close()


@hookimpl
def register_strategies(register):
    register("mtp", MTP, "next-n (MTP) heads of the target, or of a -md sidecar, drafting autoregressively",
             options=(VOCAB,), aliases=("draft-mtp",))


@hookimpl
def shipped_drafts(model_file):
    if model_file is not None and model_file.hparams.n_nextn:
        return None  # the target's own heads come first
    return offer("mtp", SHIPPED, model_file)


@hookimpl
def claim_draft_file(path, metadata):
    return "mtp" if metadata.get("general.architecture") == SIDECAR_ARCH else None
