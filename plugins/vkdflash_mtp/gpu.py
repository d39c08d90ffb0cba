"""The next-n head on the GPU: the kernels of the target's forward pass, on buffers this plugin owns.

Two kinds of recorded graph, each replayed with per-step values written into small buffers:
  commit(n): K/V of n committed positions (fuse, attn_norm, k/v, rope) written through the core
             cache-write hook -- nothing else persists, so nothing else is computed;
  draft(m):  m chained depths in ONE submit: depth j reads its token id and state from slot j,
             runs the whole block, writes its argmax id and the state to feed back into slot j+1.
             When the request samples (T > 0), host-drawn Gumbel noise times T is added to the
             logits before the argmax: argmax(l + T g) is a draw from softmax(l / T) (Gumbel-max),
             so depth j+1 is conditioned on a sampled draft without leaving the GPU.
eh_proj . [e ; h] is computed as W_e . e + W_h . h with the two column halves of eh_proj (split
on block boundaries, or dequantized to f32 where the hidden size is not a whole number of blocks).
With a draft vocabulary (vkdflash.api.DraftVocab) the LM head holds only its tokens' rows, and a
depth's argmax is a row of it: depth j+1 looks its token up in the same rows of the embedding,
and only the host maps rows back to token ids."""
from __future__ import annotations

import numpy as np

from vkdflash.api import (BlockBuffers, BlockShape, BlockWeights, DeviceStore, Graph, VkdflashError, Weight,
                          add, argmax, copy, dequantize, draft_distribution, get_rows, get_type, matmul, record_block,
                          rms_norm, select_drafts, write_kv)

# committed positions per commit graph: the matmuls compile a kernel per batch-width family, and
# flushes of held positions come in every width (lavapipe: 5 head kernels, ~0.6 s each, in a cold
# 1000-token run), where 2-row pieces reuse one and cost ~0.5 ms each
COMMIT_ROWS = 2


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


class HeadRunner:
    def __init__(self, gpu, heads, target, kv, max_depth: int, vocab=None):
        self.gpu, self.kv, self.hp, self.hidden = gpu, kv, heads.hp, heads.hidden
        self.d, self.n_vocab, self.max_depth = heads.hp.n_embd, target.n_vocab, max(1, int(max_depth))
        self.vocab = vocab  # None: the whole vocabulary
        self.n_out = vocab.size if vocab else self.n_vocab  # LM head rows
        self.store = DeviceStore(gpu)
        try:
            self._load(heads, target)
        except BaseException:
            self.close()
            raise

    def _load(self, heads, target) -> None:
        hp, B = self.hp, COMMIT_ROWS
        vec, mat = (lambda s, rep=1: self._vec(heads, s, rep)), (lambda s: self._mat(heads, s))
        self.enorm, self.hnorm = vec("nextn.enorm.weight"), vec("nextn.hnorm.weight")
        self.sh_norm = vec("nextn.shared_head_norm.weight")
        self.w_e, self.w_h = self._split_eh(heads)
        self.block = BlockWeights.load(vec, mat, "", hp.has_qkv_bias, hp.has_qk_norm, bias_rows=B)
        self.embed = mat("nextn.embed_tokens.weight") if heads.has("nextn.embed_tokens.weight") else target.token_embd
        # embed_out embeds what a depth drafted: a row of the head
        if self.vocab:
            self.head, self.embed_out = self._narrow(heads, target)
        else:
            self.head = (mat("nextn.shared_head_head.weight") if heads.has("nextn.shared_head_head.weight")
                         else target.output)
            self.embed_out = self.embed
        d = self.d
        self.shape = BlockShape(d, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.rms_eps, hp.rope_base,
                                hp.rope_mode)
        self.b = BlockBuffers.alloc(self._buf, self.shape, B)
        self.e, self.hn, self.hin = (self._buf(4 * B * d) for _ in range(3))
        self.ids, self.pos = self._buf(4 * B), self._buf(4 * B)
        # draft slots, each on a bindable offset
        self.a = max(16, self.gpu.features.min_storage_buffer_offset_alignment)
        D, a = self.max_depth, self.a
        self.s_h, self.s_logits = _up(4 * d, a), _up(4 * self.n_out, a)
        self.d_ids, self.d_pos, self.d_par = self._buf(a * (D + 1)), self._buf(a * D), self._buf(a * D)
        self.d_h, self.d_logits = self._buf(self.s_h * (D + 1)), self._buf(self.s_logits * D)
        self.d_noise, self.d_noisy = self._buf(self.s_logits * D), self._buf(self.s_logits * D)

    # -- weights --------------------------------------------------------------------------
    def _buf(self, nbytes: int):
        return self.store.buffer(nbytes)

    def _vec(self, heads, suffix: str, repeat: int = 1):
        return self.store.vector(heads.tensor(suffix), repeat)

    def _mat(self, heads, suffix: str) -> Weight:
        return self.store.matrix(heads.tensor(suffix), heads.name(suffix))

    def _narrow(self, heads, target):
        """The LM head's and the embedding's rows for the vocabulary's tokens (one weight when both
        are the target's tied embedding)."""
        def narrowed(suffix, name):
            if heads.has(suffix):
                return self.vocab.head(self.store, heads.tensor(suffix), heads.name(suffix))
            return self.vocab.head(self.store, target.model_file.tensor(name), f"target {name}")
        head = narrowed("nextn.shared_head_head.weight", target.model_file.output_name)
        tied = not heads.has("nextn.shared_head_head.weight") and not heads.has("nextn.embed_tokens.weight") \
            and target.model_file.output_name == "token_embd.weight"
        return head, head if tied else narrowed("nextn.embed_tokens.weight", "token_embd.weight")

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
    def _fuse(self, g, n, ids, h, embed=None) -> None:
        """x = W_e enorm(embed(ids)) + W_h hnorm(h) for n rows."""
        d, eps, b = self.d, self.hp.rms_eps, self.b
        get_rows(g, embed or self.embed, ids, self.e, n)
        rms_norm(g, self.e, self.enorm, self.e, n, d, eps)
        rms_norm(g, h, self.hnorm, self.hn, n, d, eps)
        matmul(g, self.w_e, self.e, b.x, n)
        matmul(g, self.w_h, self.hn, b.x, n, accumulate=True)

    def _record_commit(self, n: int) -> Graph:
        """K/V of n committed positions only: nothing else of the block persists."""
        g, b = Graph(self.gpu), self.b
        self._fuse(g, n, self.ids, self.hin)
        rms_norm(g, b.x, self.block.attn_norm, b.xn, n, self.d, self.hp.rms_eps)
        write_kv(g, self.block, self.shape, b, self.kv, 0, b.xn, n, self.pos)
        return g

    def _record_draft(self, m: int, sampled: bool) -> Graph:
        d, a, eps, b = self.d, self.a, self.hp.rms_eps, self.b
        g = Graph(self.gpu)
        for j in range(m):
            ids, pos, par = self.d_ids.view(a * j, 4), self.d_pos.view(a * j, 4), self.d_par.view(a * j, 16)
            logits = self.d_logits.view(self.s_logits * j, 4 * self.n_out)
            # depth 0 reads the committed token, deeper ones a row of the (narrowed) head
            self._fuse(g, 1, ids, self.d_h.view(self.s_h * j, 4 * d), self.embed if j == 0 else self.embed_out)
            record_block(g, self.block, self.shape, b, self.kv, 0, 1, pos, par)
            rms_norm(g, b.x, self.sh_norm, b.xn, 1, d, eps)
            matmul(g, self.head, b.xn, logits, 1)
            if sampled:
                noisy = self.d_noisy.view(self.s_logits * j, 4 * self.n_out)
                add(g, logits, self.d_noise.view(self.s_logits * j, 4 * self.n_out), noisy, self.n_out)
                logits = noisy
            argmax(g, logits, self.d_ids.view(a * (j + 1), 4), 1, self.n_out)
            if j + 1 < m:
                feed = b.x if self.hidden == "prenorm" else b.xn
                copy(g, feed, self.d_h.view(self.s_h * (j + 1), 4 * d), 4 * d)
        return g

    def _graph(self, key):
        if key[0] == "commit":
            return self.store.graph(key, lambda: self._record_commit(key[1]))
        return self.store.graph(key, lambda: self._record_draft(key[1], key[2]))

    # -- running --------------------------------------------------------------------------
    def commit(self, h: np.ndarray, tokens, first_pos: int) -> None:
        """Write the head's K/V for positions first_pos.. from target states h [n, d] and tokens t_{i+1}."""
        tokens = np.asarray(tokens, np.uint32)
        for s in range(0, len(tokens), COMMIT_ROWS):
            n = min(COMMIT_ROWS, len(tokens) - s)
            self.ids.write(tokens[s:s + n])
            self.pos.write(np.arange(first_pos + s, first_pos + s + n, dtype=np.uint32))
            self.hin.write(np.ascontiguousarray(h[s:s + n], np.float32))
            self._graph(("commit", n)).run()

    def draft(self, h: np.ndarray, token: int, pos: int, m: int, p_min: float = 0.0, temperature: float = 0.0,
              rng=None):
        """m chained drafts from state h [d] at position pos and the token after it: (ids, None) greedy,
        (ids, their distributions softmax(logits / T) [n, vocab]) when sampling at temperature T."""
        if not 1 <= m <= self.max_depth:
            raise VkdflashError(f"mtp: {m} drafts asked, this head was set up for 1..{self.max_depth}")
        w = self.a // 4
        self.d_ids.write(np.array([token], np.uint32))
        self.d_h.write(np.ascontiguousarray(h, np.float32).reshape(-1))
        slots = np.zeros((m, w), np.uint32)
        slots[:, 0] = np.arange(pos, pos + m)
        self.d_pos.write(slots)
        self.d_par.write(slots)
        sampled = temperature > 0
        if sampled:
            noise = np.zeros((m, self.s_logits // 4), np.float32)
            noise[:, :self.n_out] = temperature * rng.gumbel(size=(m, self.n_out))
            self.d_noise.write(noise)
        self._graph(("draft", m, sampled)).run()
        drafts = self.d_ids.read(np.uint32, w * (m + 1))[w::w]
        drafts = self.vocab.tokens(drafts) if self.vocab else [int(t) for t in drafts]
        if p_min <= 0 and not sampled:
            return drafts, None
        rows = self.d_logits.read(np.float32, self.s_logits // 4 * m).reshape(m, -1)[:, :self.n_out]
        if p_min > 0:
            drafts = select_drafts(drafts, rows, p_min)
        if not sampled:
            return drafts, None
        q = draft_distribution(rows[:len(drafts)], temperature)
        return drafts, (self.vocab.widen(q) if self.vocab else q)

    def close(self) -> None:
        self.store.close()
