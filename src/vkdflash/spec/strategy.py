"""What a speculative strategy sees and implements (one proposer per method, vLLM-style).

A strategy gets a StrategyContext: the committed tokens, the target hidden states it asked
for, the target's borrowed embedding / LM head weights, the GPU to run its own kernels on its
own buffers, and KV handles for its own caches. A KVHandle's only write is the core
cache-write hook (which rotates and quantizes by the cache's types) and its only other
operations are the matching read path and truncate: no buffers, ever."""
from __future__ import annotations

import logging
import reprlib
from collections.abc import Sequence
from numbers import Real
from dataclasses import dataclass, field

import numpy as np

from ..errors import VkdflashError
from ..kernels.kv_store import write_positions
from ..kv_cache import KVCache, _caches

log = logging.getLogger("vkdflash")
_owned: dict[int, list] = {}  # id(StrategyContext) -> its caches: kept off the context itself


@dataclass
class Proposal:
    """Draft tokens for positions P+1..P+k, P being the position of `last_token`.
    probs: the draft's distribution for each drafted position [k, n_vocab] when it sampled
    them; None means the drafts were chosen deterministically (q is one-hot).
    source: which proposer drafted them, when a strategy combines several (a cascade's part):
    the stats count acceptance per source."""
    tokens: list
    probs: np.ndarray | None = None
    source: str = ""


class InvalidProposal(VkdflashError):
    """Why a strategy's proposal is unusable (the engine then switches the strategy off)."""


def checked_proposal(prop, max_n: int, n_vocab: int) -> Proposal:
    """A strategy's proposal as the engine uses it: tokens a list of ints, probs None or an array
    of their [len(tokens), n_vocab] distributions. Raises InvalidProposal saying what is wrong."""
    if not hasattr(prop, "tokens"):
        raise InvalidProposal(f"propose returned {type(prop).__name__}, not a Proposal")
    tokens = _token_list(prop.tokens)
    if len(tokens) > max_n or not all(0 <= t < n_vocab for t in tokens):
        raise InvalidProposal(f"proposed invalid tokens {tokens[:8]!r} (max {max_n}, vocabulary {n_vocab})")
    source = getattr(prop, "source", "")
    if not isinstance(source, str):
        raise InvalidProposal(f"proposal source must be a string, not {type(source).__name__}")
    probs = getattr(prop, "probs", None)
    if probs is None:
        return Proposal(tokens, None, source)
    probs = np.asarray(probs)
    if probs.shape != (len(tokens), n_vocab):
        raise InvalidProposal(f"draft probabilities have shape {probs.shape}, expected ({len(tokens)}, {n_vocab})")
    if probs.dtype.kind not in "iuf":  # bool, complex, strings, objects: no probabilities
        raise InvalidProposal(f"draft probabilities are not all finite and non-negative: not a numeric array "
                              f"(dtype {probs.dtype})")
    # the verifier divides by them; negative ones had drawn tokens outside the vocabulary steps later
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise InvalidProposal("draft probabilities are not all finite and non-negative")
    if probs.size and not (probs.sum(axis=1) > 0).all():
        raise InvalidProposal("draft probabilities have a row that sums to 0")
    return Proposal(tokens, probs, source)


def _token_list(tokens) -> list:
    """Drafted ids as ints, from a sequence or a 1-D integer array (an iterator is refused: reading
    it to check it would leave nothing to verify)."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise InvalidProposal(f"proposed tokens as an array of shape {tokens.shape} and dtype {tokens.dtype}, "
                                  "not a 1-D integer array")
        return tokens.tolist()
    if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
        raise InvalidProposal(f"proposed tokens as {type(tokens).__name__}, not a list of token ids")
    tokens = list(tokens)
    if not all(_whole(t) for t in tokens):
        raise InvalidProposal(f"proposed invalid tokens {tokens[:8]!r}: not all integers")
    return [int(t) for t in tokens]


class KVHandle:
    """A strategy's view of one of its KV caches: write (through the core hook), attend, truncate."""
    __slots__ = ("_info",)

    def __init__(self, cache: KVCache):
        # only the cache's description: the cache itself is looked up by key inside the core
        self._info = cache.info

    def _cache(self) -> KVCache:
        cache = _caches.get(self._info.key)
        if cache is None:
            raise VkdflashError(f"the {self._info.name} cache was closed")
        return cache

    @property
    def info(self):
        """CacheInfo: types, rotation block sizes, shape. No buffers."""
        return self._info

    def record_write(self, graph, layer: int, k_rows, v_rows, positions, n_rows: int) -> None:
        """Record a write of f32 rows (device views, only read: the core rotates and quantizes as
        it stores) at the uint32 positions in a device view, into `graph`."""
        self._cache().record_write(graph, layer, k_rows, v_rows, positions, n_rows)

    def write(self, gpu, layer: int, k_rows, v_rows, positions) -> None:
        """Write now: host or device f32 rows [n, n_head_kv*head_dim] at host positions (integers,
        each once: rows stored at one position race). Device rows are only read, so the same rows
        can go to any number of caches."""
        from ..runtime.graph import Graph
        pos = np.asarray(positions).reshape(-1)
        n, width = pos.size, self._info.n_head_kv * self._info.head_dim
        if n == 0:
            return
        pbuf, g = gpu.buffer(4 * n), Graph(gpu)
        owned, views = [pbuf], []
        try:
            write_positions(pbuf, pos, self._info.n_ctx)  # every store's check: integers, in the cache, each once
            for rows in (k_rows, v_rows):
                if isinstance(rows, np.ndarray):
                    rows = np.ascontiguousarray(rows, np.float32)
                    if rows.shape != (n, width):
                        raise VkdflashError(f"cache rows must be [{n}, {width}] f32, got {rows.shape}")
                    rows = gpu.upload(rows)
                    owned.append(rows)
                views.append(rows)
            self._cache().record_write(g, layer, views[0], views[1], pbuf, n)
            g.run()
        finally:
            g.destroy()
            for b in owned:
                b.destroy()

    def attend(self, graph, layer: int, q, out, params, n_q: int, n_head: int, mask: str = "causal") -> None:
        """Record attention over this cache (the read path: Q rotated as the kernel reads it,
        never changed; the output un-rotated in `out`)."""
        self._cache().attend(graph, layer, q, out, params, n_q, n_head, mask)

    def truncate(self, n: int) -> None:
        self._cache().truncate(n)


@dataclass(frozen=True)
class Option:
    """A setting a strategy declares when it registers: `--spec-opt NAME.KEY=VALUE` sets it, the
    strategy reads ctx.options.settings[KEY] (the default when not given)."""
    key: str
    type: type           # int, float, str or bool
    default: object
    help: str = ""

    def parse(self, text: str, strategy: str):
        try:
            if self.type is bool:
                if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(text)
                return text.lower() in ("1", "true", "yes", "on")
            return self.type(text)
        except ValueError:
            raise VkdflashError(f"--spec-opt {strategy}.{self.key}={text[:40]}: not a valid "
                                f"{self.type.__name__}") from None


@dataclass
class StrategyOptions:
    draft_model: str | None = None      # -md FILE
    draft_max: int = 16                 # --draft-max
    p_min: float = 0.0                  # --draft-p-min
    cache_type_k: str = "f16"           # -ctkd
    cache_type_v: str = "f16"           # -ctvd
    rotate: bool = True                 # --no-kv-rotation turns it off for draft caches too
    settings: dict = field(default_factory=dict)  # the strategy's declared Options, by key


@dataclass
class StrategyContext:
    gpu: object                         # runtime Context: run kernels on your own buffers
    target: object                      # TargetView (hparams, token_embd, output, output_norm, n_ctx)
    options: StrategyOptions
    tokens: list = field(default_factory=list)   # committed token ids (a copy; do not rely on mutating it)
    new_start: int = 0                  # position of the first row in new_hidden / new_final
    new_hidden: dict = field(default_factory=dict)  # layer-input id -> [n_new, d] for newly committed positions
    new_final: np.ndarray | None = None  # [n_new, d]: target hidden state after output_norm
    temperature: float = 0.0            # the request's sampling temperature (0: greedy), set before begin()
    seed: int | None = None             # derived from the request's seed, never the sampler's own (None: unseeded)

    def create_kv_cache(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int | None = None,
                        name: str = "draft") -> KVHandle:
        """A KV cache in the draft cache types (-ctkd/-ctvd), rotated like every other cache."""
        cache = KVCache(self.gpu, n_layer, self.target.n_ctx if n_ctx is None else n_ctx, n_head_kv, head_dim,
                        self.options.cache_type_k, self.options.cache_type_v, self.options.rotate, name)
        _owned.setdefault(id(self), []).append(cache)
        return KVHandle(cache)

    @property
    def cache_names(self) -> list:
        """Names of the KV caches this context created (a strategy without any has no draft cache)."""
        return [c.info.name for c in _owned.get(id(self), [])]

    def close(self) -> None:
        for cache in _owned.pop(id(self), []):
            cache.destroy()


class Strategy:
    """Base of every proposer. Override what you need; the engine calls, in order:
    begin(ctx) once after the prompt is committed (ctx.new_* cover positions 0..P-1), then
    per step propose(ctx, last_token, max_n) and, after verification, commit(ctx) with ctx.new_*
    covering the positions just committed. close() at the end."""

    name = "base"
    capture_layers: tuple = ()   # target layer-input ids whose residual stream this strategy reads
    # a_1 (share of steps whose first draft is accepted) this draft measured on its own suite,
    # when it knows one (api.suite_record): the draft-length controller starts from it, and the
    # engine warns when live a_1 falls far below it
    expected_first_acceptance: float | None = None
    # the most tokens propose() ever drafts (a DFlash block's size - 1), None: no bound of its own;
    # the engine caps --draft-max there, so the draft-length controller never prices longer drafts
    longest_draft: int | None = None
    # True where propose() does no device work and costs next to nothing (a lookup in the committed
    # text): the engine asks for the longest draft before choosing k, so the draft-length controller
    # prices the draft in hand, not the chance that there is one
    free_proposals: bool = False

    def begin(self, ctx: StrategyContext) -> None:
        pass

    def propose(self, ctx: StrategyContext, last_token: int, max_n: int) -> Proposal:
        raise NotImplementedError

    def commit(self, ctx: StrategyContext) -> None:
        pass

    def close(self) -> None:
        pass


def declared(strategy, n_layer: int) -> tuple:
    """A strategy's capture_layers, expected_first_acceptance, longest_draft and free_proposals, checked (a bad
    one is the plugin's bug, said as it starts, not a traceback or a silent misprice later)."""
    capture = getattr(strategy, "capture_layers", ())
    try:
        layers = tuple(capture)
    except TypeError:
        layers = None
    if layers is None or not all(_whole(c) and 0 <= c <= n_layer for c in layers):
        raise VkdflashError(f"capture_layers must be target layer-input ids in 0..{n_layer}, not "
                            f"{reprlib.repr(capture)}")
    expected = getattr(strategy, "expected_first_acceptance", None)
    if expected is not None and not (isinstance(expected, Real) and not isinstance(expected, bool)
                                     and 0 <= expected <= 1):  # NaN fails the range too
        raise VkdflashError(f"expected_first_acceptance must be None or a number in 0..1, not {reprlib.repr(expected)}")
    longest = getattr(strategy, "longest_draft", None)
    if longest is not None and not (_whole(longest) and longest > 0):
        raise VkdflashError(f"longest_draft must be None or a positive whole number, not {reprlib.repr(longest)}")
    free = getattr(strategy, "free_proposals", False)
    if not isinstance(free, bool):
        raise VkdflashError(f"free_proposals must be True or False, not {reprlib.repr(free)}")
    return (tuple(int(c) for c in layers), None if expected is None else float(expected),
            None if longest is None else int(longest), free)


def _whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
