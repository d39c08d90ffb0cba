"""The transformer forward pass on the GPU (llama / qwen2 / qwen3, dense).

One graph is recorded per (tokens per call, logits rows, captured layers, greedy) and replayed
with new token ids and positions written into small buffers, so decode costs one submit a token.
A greedy pass keeps the logits on the device and reads back each row's argmax (4 bytes a row,
not n_vocab floats: what a discrete GPU would send over its bus every token).
Every kernel is batch invariant, so a token's logits are bit-identical whether it is run
alone, inside a prefill chunk, or inside a speculative verify batch."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import VkdflashError
from ..kernels.attention import MAX_HEAD_DIM
from ..kernels.blocks import dequantize
from ..kernels.copy import copy
from ..kernels.embed import get_rows
from ..kernels.matmul import config_for, matmul, nj_for, slot_cost
from ..kernels.norm import rms_norm
from ..kernels.softmax import FLAG_NONFINITE, argmax
from ..kernels.weights import Weight
from ..kv_cache import KVCache
from ..runtime.graph import Graph
from . import prewarm
from .block import BlockBuffers, BlockShape, BlockWeights, record_block
from .store import DeviceStore

log = logging.getLogger("vkdflash")

MAX_BATCH = 64  # tokens per call: the batch-invariance range every kernel is tested over


@dataclass
class Output:
    logits: np.ndarray | None        # [rows, n_vocab]: the last row, or every row (None: greedy)
    hidden: dict  # layer-input id i -> residual stream entering block i [n, d] (n_layer: leaving
                  # the last block); "final" -> after output_norm
    ids: np.ndarray | None = None    # greedy: each of those rows' argmax


class Model:
    def __init__(self, ctx, model_file, n_ctx: int = 4096, ctk: str = "f16", ctv: str = "f16",
                 rotate: bool = True):
        self.ctx, self.mf, hp = ctx, model_file, model_file.hparams
        self.hp = hp
        if hp.head_dim % 32 or hp.head_dim > MAX_HEAD_DIM:
            raise VkdflashError(f"head_dim {hp.head_dim} is not supported: attention needs a multiple of 32 "
                                f"up to {MAX_HEAD_DIM}")
        if n_ctx <= 0:
            raise VkdflashError(f"context size must be positive, got {n_ctx}")
        if hp.n_ctx_train and n_ctx > hp.n_ctx_train:
            log.warning("context %d exceeds the model's training context %d", n_ctx, hp.n_ctx_train)
        # before the weights upload, so the 1-row pass's kernels compile beside it
        self.prewarm_key = prewarm.entry_key(ctx, model_file.gguf.path, ctk, ctv, rotate)
        self.prewarmed = prewarm.start(ctx, self.prewarm_key)
        self.store = DeviceStore(ctx)
        self.matmul_config = config_for(ctx.features)
        self.first_record: dict[tuple, float] = {}  # seconds to record a family's first pass (compiles)
        self.graph_seconds: list[float] = []        # seconds to record the later ones
        self.row_seconds: float | None = None       # the last recorded 1-row pass's wall time
        self.prompt_rent = 0.0  # seconds prompts paid in narrower passes than their own width's
        self.embd = self._mat("token_embd.weight")
        self.output = self.embd if hp.tied_output else self._mat("output.weight")
        self.output_norm = self._vec("output_norm.weight")
        self.layers = [BlockWeights.load(self._vec, self._mat, f"blk.{i}.", hp.has_qkv_bias, hp.has_qk_norm,
                                         bias_rows=MAX_BATCH, stack=self._stack) for i in range(hp.n_layer)]
        self.cache = KVCache(ctx, hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim, ctk, ctv, rotate)
        # what the host writes or reads every step lives in mapped memory: no staging copies
        host = lambda n: self.store.buffer(n, host=True)  # noqa: E731
        self.logits = host(4 * MAX_BATCH * hp.n_vocab)
        self.device_logits, self.best = self._buf(4 * MAX_BATCH * hp.n_vocab), host(4 * MAX_BATCH)
        self.ids, self.pos, self.params = host(4 * MAX_BATCH), host(4 * MAX_BATCH), host(16)
        self.captures: dict = {}
        rope_factors = None  # llama3-style per-pair frequency factors
        if hp.has_rope_freqs:
            t = model_file.tensor("rope_freqs.weight")
            rope_factors = dequantize(np.asarray(t.data), t.type_id, t.shape[0]).reshape(-1)
        self.shape = BlockShape(hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.rms_eps,
                                hp.rope_base, hp.rope_mode, rope_factors)
        self.b = BlockBuffers.alloc(self._buf, self.shape, MAX_BATCH)
        log.info("model %s: %d layers, d %d, heads %d/%d x %d, vocab %d, rope %s base %g, weights %s",
                 hp.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab, hp.rope_mode,
                 hp.rope_base, self.weight_types())

    # -- loading --------------------------------------------------------------------
    def _buf(self, nbytes: int):
        return self.store.buffer(nbytes)

    def _mat(self, name: str) -> Weight:
        return self.store.matrix(self.mf.tensor(name), name)

    def _stack(self, names):
        return self.store.stacked([self.mf.tensor(name) for name in names], names)

    def _vec(self, name: str, repeat: int = 1):
        """A 1-D tensor as f32 (biases repeated per batch row so a plain add applies them)."""
        return self.store.vector(self.mf.tensor(name), repeat)

    def weight_types(self) -> str:
        names = sorted({w.ttype.name for layer in self.layers for w in (layer.wq, layer.gate, layer.down)}
                       | {self.embd.ttype.name, self.output.ttype.name})
        return "/".join(names)

    # -- recording ------------------------------------------------------------------
    def _record(self, n: int, all_logits: bool, capture: tuple, greedy: bool, timestamps: bool = False) -> Graph:
        hp, b, d = self.hp, self.b, self.hp.n_embd
        g = Graph(self.ctx, timestamps=timestamps)
        get_rows(g, self.embd, self.ids, b.x, n)
        for i, w in enumerate(self.layers):
            if i in capture:
                copy(g, b.x, self._capture(i).view(0, n * d * 4), n * d * 4, groups=4)
            record_block(g, w, self.shape, b, self.cache, i, n, self.pos, self.params)
        if hp.n_layer in capture:
            copy(g, b.x, self._capture(hp.n_layer).view(0, n * d * 4), n * d * 4, groups=4)
        rms_norm(g, b.x, self.output_norm, b.xn, n, d, hp.rms_eps)
        logits, rows = self.device_logits if greedy else self.logits, n if all_logits else 1
        matmul(g, self.output, b.xn if all_logits else b.xn.view((n - 1) * d * 4, d * 4), logits, rows)
        if greedy:
            argmax(g, logits, self.best, rows, hp.n_vocab, flag_nonfinite=True)
        return g

    def _capture(self, layer: int):
        if layer not in self.captures:
            self.captures[layer] = self.store.buffer(4 * MAX_BATCH * self.hp.n_embd, host=True)
        return self.captures[layer]

    # -- running --------------------------------------------------------------------
    def forward(self, tokens, all_logits: bool = False, capture=(), greedy: bool = False,
                prompt: bool = False) -> Output:
        """Append `tokens` to the cache and return logits (last row, or every row), or with
        `greedy` their argmax ids only, and, for the layers in `capture`, the residual stream
        entering them plus the final hidden state. A `prompt` (decoding follows) may run in
        passes of widths whose kernels are compiled (`_prompt_width`): the same bits."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        capture = tuple(sorted(set(int(c) for c in capture)))
        bad = [c for c in capture if not 0 <= c <= self.hp.n_layer]
        if bad:
            raise VkdflashError(f"cannot capture layer input {bad[0]}: ids run 0..{self.hp.n_layer}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.hp.n_vocab):
            raise VkdflashError(f"token id {int(tokens.max())} is outside the vocabulary ({self.hp.n_vocab})")
        logits, ids, hidden = [], [], {c: [] for c in capture}
        if capture:
            hidden["final"] = []
        start, widths = 0, []
        while start < tokens.size:
            left = tokens.size - start
            chunk = tokens[start:start + (self._prompt_width(left) if prompt and not all_logits else MAX_BATCH)]
            start += chunk.size
            widths.append(chunk.size)
            last = start >= tokens.size
            rows, captured = self._run(chunk, all_logits, capture, greedy, need_logits=all_logits or last)
            (ids if greedy else logits).append(rows)
            for key, value in captured.items():
                hidden[key].append(value)
        if prompt and widths and max(widths) < min(tokens.size, MAX_BATCH):
            log.info("prompt of %d tokens in %s-row passes: compiling kernels for wider ones would cost "
                     "more than they save (priced as the 1-row kernels took, %.2f s)", tokens.size,
                     "/".join(str(w) for w in sorted(set(widths), reverse=True)),
                     self.first_record[self._family(1, False)])
        hidden = {k: np.concatenate(v) for k, v in hidden.items()}
        if greedy:
            return Output(None, hidden, np.concatenate(ids) if ids else np.zeros(0, np.uint32))
        return Output(np.concatenate(logits) if logits else np.zeros((0, self.hp.n_vocab), np.float32), hidden)

    def recorded(self, n: int, all_logits: bool = False, capture=(), greedy: bool = False) -> bool:
        """Whether an n-row pass has its graph (the first one records it and compiles kernels)."""
        return (int(n), all_logits, tuple(sorted(set(int(c) for c in capture))), greedy) in self.store.graphs

    def setup_seconds(self, n: int, all_logits: bool = False, capture=(), greedy: bool = False) -> float:
        """What a first n-row pass costs beyond running it: 0 once recorded; recording alone where a
        pass of its family (the same kernels) was recorded; else compiling too (lavapipe: 0.2-0.4 s
        a kernel): as the cheapest family compile where a family of its batch width was recorded
        (the matmuls are shared), else as the dearest. Cold lavapipe, one process: a 7-token
        prompt 2.1 s, then 1 row 0.9 s, 2 rows 2.4 s, 4 rows 2.5 s, 16 rows (the prompt's width)
        0.95 s; priced as the last family's, 2 rows looked like 0.9 s and a cold 128-token
        `generate --spec mtp` drafted into that compile."""
        if self.recorded(n, all_logits, capture, greedy):
            return 0.0
        family = self._family(n, all_logits)
        if family in self.first_record:
            return float(np.median(self.graph_seconds)) if self.graph_seconds else 0.0
        if not self.first_record:
            return 0.0
        same_width = any(f[0] == family[0] for f in self.first_record)
        return (min if same_width else max)(self.first_record.values())

    def pass_width(self, n: int) -> int:
        """Rows an n-row pass computes: matmuls run whole slots of nj_for(n) rows, so its cost is
        that of the next multiple (lavapipe: 7..8 rows cost like 8, 9..12 like 12)."""
        nj = nj_for(n, self.matmul_config)
        return -(-n // nj) * nj

    def pass_cost_guess(self, n: int) -> float:
        """An n-row pass in 1-row passes as the kernels' model guesses it (kernels.matmul.slot_cost)."""
        return slot_cost(n, self.matmul_config)

    def _prompt_width(self, left: int) -> int:
        """Rows of a prompt's next pass, `left` rows to go. A first pass of a new batch width
        compiles its kernels (lavapipe: 0.5-1 s, 25-50 one-row passes of SmolLM2), and decoding
        compiles the 1-row ones anyway: so a prompt runs in the widest compiled width while that
        costs less than compiling its own would (priced as the 1-row family's compile, passes at
        the kernels' guess times a timed 1-row pass), or until what the narrower passes cost
        beyond it (over every prompt so far: a process serving many) has paid for a compile.
        A cold `generate` of a 6-token prompt spent 1.3 s compiling its 6-row family to save ~0.1 s."""
        n = min(left, MAX_BATCH)
        if n == 1 or self._family(n, False) in self.first_record:
            return n
        if self.row_seconds is None:
            return 1  # the 1-row kernels compile (and then a pass is timed) first
        compiled = max(w for w in range(1, n) if self._family(w, False) in self.first_record)
        guess = lambda w: slot_cost(w, self.matmul_config)  # noqa: E731
        as_compiled = (left // compiled) * guess(compiled) + left % compiled
        to_compile = max(self.first_record[self._family(1, False)] - self.prompt_rent, 0.0) / self.row_seconds
        if -(-left // n) * guess(n) + to_compile < as_compiled:
            return n
        self.prompt_rent += (guess(compiled) - compiled * guess(n) / n) * self.row_seconds
        return compiled

    def _family(self, n: int, all_logits: bool):
        """Passes of one family share every kernel (matmuls specialize on the batch width)."""
        return nj_for(n, self.matmul_config), all_logits and n > 1

    def _recorded(self, n: int, all_logits: bool, capture: tuple, greedy: bool) -> Graph:
        t0 = time.perf_counter()
        graph = self._record(n, all_logits, capture, greedy)
        graph.ready()
        seconds, family = time.perf_counter() - t0, self._family(n, all_logits)
        if family in self.first_record:
            self.graph_seconds.append(seconds)
        else:
            if not self.first_record and family == self._family(1, False):
                seconds = prewarm.first_pass(self.prewarm_key, self.prewarmed, graph.kernels(), seconds)
            self.first_record[family] = seconds
        return graph

    def _run(self, chunk, all_logits: bool, capture: tuple, greedy: bool, need_logits: bool):
        n, hp, cache = chunk.size, self.hp, self.cache
        start = cache.n_past
        if start + n > cache.n_ctx:
            raise VkdflashError(f"context full: {start} + {n} tokens exceed -c {cache.n_ctx}")
        key = (n, all_logits, capture, greedy)
        recorded = key in self.store.graphs
        graph = self.store.graph(key, lambda: self._recorded(n, all_logits, capture, greedy))
        t0 = time.perf_counter()
        self._stage(chunk, start)
        graph.run()
        if n == 1 and recorded:
            self.row_seconds = time.perf_counter() - t0
        cache.n_past = start + n
        rows = (n if all_logits else 1) if need_logits else 0
        if greedy:
            out = self.best.read(np.uint32, rows)
            bad = np.flatnonzero(out & FLAG_NONFINITE)
            if bad.size:  # what the sampler refuses when it sees the logits
                at = start + (int(bad[0]) if all_logits else n - 1)
                raise VkdflashError(f"the logits at position {at} hold NaN or +inf, or are all -inf: nothing to "
                                    "decode (a damaged model file?)")
        else:
            out = self.logits.read(np.float32, rows * hp.n_vocab).reshape(rows, hp.n_vocab)
        hidden = {c: self.captures[c].read(np.float32, n * hp.n_embd).reshape(n, hp.n_embd) for c in capture}
        if capture:
            hidden["final"] = self.b.xn.read(np.float32, n * hp.n_embd).reshape(n, hp.n_embd)
        return out, hidden

    def _stage(self, chunk, start: int) -> None:
        """The per-step values of a pass over `chunk` at positions start..: ids, positions, first position."""
        self.ids.write(chunk.astype(np.uint32))
        self.pos.write(np.arange(start, start + chunk.size, dtype=np.uint32))
        self.params.write(np.array([start, 0, 0, 0], np.uint32))

    def profile(self, tokens, all_logits: bool, greedy: bool = False, reps: int = 3) -> list[tuple[str, float]]:
        """(label, GPU ns) per dispatch of one pass over `tokens` (1..MAX_BATCH) at the current
        position: the fastest of `reps` replays of a graph recorded with timestamps (plus one to
        compile). The cache position does not advance."""
        chunk = np.asarray(tokens, np.int64).reshape(-1)
        if not 1 <= chunk.size <= MAX_BATCH or self.cache.n_past + chunk.size > self.cache.n_ctx:
            raise VkdflashError(f"cannot profile {chunk.size} rows at position {self.cache.n_past}")
        graph = self._record(chunk.size, all_logits, (), greedy, timestamps=True)
        try:
            self._stage(chunk, self.cache.n_past)
            runs = []
            for _ in range(reps + 1):
                graph.run()
                runs.append(graph.timings())
            return min(runs[1:], key=lambda t: sum(ns for _, ns in t))
        finally:
            graph.destroy()

    def reset(self) -> None:
        self.cache.truncate(0)

    def close(self) -> None:
        self.store.close()
        self.cache.destroy()
