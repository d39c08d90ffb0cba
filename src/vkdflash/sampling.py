"""Token sampling like llama.cpp's default chain, and stop-string detection on streamed text.

Chain (llama.cpp common_sampler defaults, without penalties / DRY / typical / XTC, which default off):
  top-k -> top-p -> min-p -> temperature -> seeded draw.
top-k, top-p and min-p look at the temperature-1 distribution of the tokens still in the running;
the temperature then scales the survivors' logits and the draw uses their softmax. temp <= 0 is
greedy: argmax, ties to the lowest index (llama.cpp's greedy sampler). Ties at the top-k / top-p
cut go to the lower token id (llama.cpp's partial sort leaves them unspecified). The draw is not
llama.cpp's mt19937 stream: numpy's PCG64 seeded with `seed`, one uniform per draw.

`probs()` is the final distribution the draw uses, over the whole vocabulary (zeros for tokens
cut away), which is what speculative sampling compares draft and target with."""
from __future__ import annotations

import numpy as np

from .errors import VkdflashError


def _logits(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64).reshape(-1)
    if x.size == 0 or np.isnan(x).any() or np.isposinf(x).any():
        raise VkdflashError("logits must be a non-empty vector without NaN or +inf")
    if np.isneginf(x).all():
        raise VkdflashError("every logit is -inf: nothing to sample")
    return x


def _order(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Ids of the kept tokens, highest logit first, ties by lower id."""
    ids = np.flatnonzero(keep)
    return ids[np.argsort(-x[ids], kind="stable")]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def top_k_mask(logits, k: int, keep=None) -> np.ndarray:
    """Keep the k highest logits among `keep` (all when k <= 0 or k >= the count)."""
    x = _logits(logits)
    keep = np.isfinite(x) if keep is None else np.asarray(keep, bool) & np.isfinite(x)
    return _top_k(x, k, keep)


def _top_k(x: np.ndarray, k: int, keep: np.ndarray) -> np.ndarray:
    """top_k_mask on validated logits. The k-th highest value by partition, not a sort of the
    vocabulary (SmolLM2's 49152 logits: 5 ms of a 21 ms decode step): every id above it, then
    ties at it by lower id, as _order ranks them."""
    ids = None if keep.all() else np.flatnonzero(keep)
    values = x if ids is None else x[ids]
    if not 0 < k < values.size:
        return keep
    kth = np.partition(values, values.size - k)[values.size - k]
    above, at = np.flatnonzero(values > kth), np.flatnonzero(values == kth)
    chosen = np.concatenate([above, at[:k - above.size]])
    out = np.zeros_like(keep)
    out[chosen if ids is None else ids[chosen]] = True
    return out


def top_p_mask(logits, p: float, keep=None) -> np.ndarray:
    """Keep the smallest highest-first prefix of `keep` whose probability (softmax over `keep`)
    sums to at least p (unchanged when p >= 1)."""
    x = _logits(logits)
    keep = np.isfinite(x) if keep is None else np.asarray(keep, bool) & np.isfinite(x)
    if p >= 1.0:
        return keep
    order = _order(x, keep)
    cum = np.cumsum(_softmax(x[order]))
    n = min(int(np.searchsorted(cum, p, side="left")) + 1, len(order))  # first index with cum >= p
    out = np.zeros_like(keep)
    out[order[:n]] = True
    return out


def min_p_mask(logits, p: float, keep=None) -> np.ndarray:
    """Keep tokens of `keep` whose probability is at least p times the largest one's
    (llama.cpp's test: logit >= max_logit + log(p)); unchanged when p <= 0."""
    x = _logits(logits)
    keep = np.isfinite(x) if keep is None else np.asarray(keep, bool) & np.isfinite(x)
    if p <= 0.0:
        return keep
    # p > 1 would keep nothing: the top token stays (llama.cpp's sorted path keeps the first)
    return keep & (x >= x[keep].max() + min(np.log(p), 0.0))


class Sampler:
    def __init__(self, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 seed: int | None = None):
        self.temp, self.top_k, self.top_p, self.min_p = float(temp), int(top_k), float(top_p), float(min_p)
        if np.isnan([self.temp, self.top_p, self.min_p]).any():  # NaN compares false: silently "off"
            raise VkdflashError(f"sampler settings must be numbers: temp {temp}, top-p {top_p}, min-p {min_p}")
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def probs(self, logits) -> np.ndarray:
        """The distribution sample() draws from, f64 over the whole vocabulary (one-hot when greedy)."""
        x = _logits(logits)
        out = np.zeros_like(x)
        if self.greedy:
            out[int(np.argmax(x))] = 1.0
            return out
        # top-p and min-p over the top-k survivors alone (ids ascending: ties rank as in x)
        ids = np.flatnonzero(_top_k(x, self.top_k, np.isfinite(x)))
        kept = x[ids]
        keep = min_p_mask(kept, self.min_p, top_p_mask(kept, self.top_p))
        # shift before scaling: logits / 1e-308 overflowed to inf, and inf - inf drew NaN
        kept = kept[keep]
        with np.errstate(over="ignore"):  # a logit far below the top at T ~ 1e-308: -inf, weight 0
            out[ids[keep]] = _softmax((kept - kept.max()) / self.temp)
        return out

    def draw(self, probs) -> int:
        """One seeded draw from a (not necessarily normalised) non-negative distribution: over its
        nonzero entries, whose running sums are those of the whole vector (adding 0 is exact)."""
        probs = np.asarray(probs, np.float64).reshape(-1)
        ids = np.flatnonzero(probs)
        cum = np.cumsum(probs[ids])
        if not ids.size or not cum[-1] > 0:
            raise VkdflashError("cannot draw from an all-zero distribution")
        return int(ids[min(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"), ids.size - 1)])

    def sample(self, logits) -> int:
        if self.greedy:
            return int(np.argmax(_logits(logits)))
        return self.draw(self.probs(logits))


class StopMatcher:
    """Feed streamed text; get back what is safe to show. A tail that could still become a stop
    string is held back; when a stop string completes, the text before it is released and
    `stopped` becomes true (the stop string itself is never released)."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False
        self.matched: str | None = None

    def _partial(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self.held + text
        # the first stop string to complete in reading order (the longest of those ending there),
        # so the result never depends on how the text was split into chunks
        hits = [(buf.find(s) + len(s), -len(s), s) for s in self.stops if s in buf]
        if hits:
            end, _, s = min(hits)
            self.stopped, self.matched, self.held = True, s, ""
            return buf[:end - len(s)]
        keep = self._partial(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """End of stream: release what was held back (nothing once stopped)."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out
