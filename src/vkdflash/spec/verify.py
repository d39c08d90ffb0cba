"""The verifier: decides which drafted tokens the target accepts (separate from every proposer).

Greedy (verify_greedy): accept the longest prefix where each draft equals the target's argmax
(its ids come from the GPU, not the logits), then append the target's own next token.
Sampling (T > 0): standard speculative sampling -- accept d with probability min(1, p(d)/q(d)),
else draw from the normalised residual max(p - q, 0) -- so the output is distributed exactly as
the target's own sampling (docs/design.md section 6)."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError


def verify_greedy(drafts: list[int], target_ids) -> tuple[int, int]:
    """target_ids: the target's argmax for [last, d1..dk] (k+1 rows). Returns (n_accepted, next_token)."""
    n = 0
    while n < len(drafts) and drafts[n] == int(target_ids[n]):
        n += 1
    return n, int(target_ids[n])


def verify(drafts: list[int], logits: np.ndarray, sampler, draft_probs: np.ndarray | None = None):
    """logits: target logits for [last, d1..dk] (k+1 rows). Returns (n_accepted, next_token).
    (At T 0 the sampler's distributions are one-hot, so this agrees with verify_greedy.)"""
    k = len(drafts)
    for i, d in enumerate(drafts):
        p = sampler.probs(logits[i])
        q = _draft_q(draft_probs, i, d, p.size)
        if sampler.rng.random() < min(1.0, p[d] / q[d]):
            continue
        residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0:  # p == q exactly: any draw from p is right
            residual = p
        return i, sampler.draw(residual)
    return k, sampler.draw(sampler.probs(logits[k]))


def _draft_q(draft_probs, i: int, d: int, n_vocab: int) -> np.ndarray:
    """The draft's q for position i over the target's vocabulary: its row normalised, zero past a
    shorter row's end; one-hot on d for a deterministic draft, and for a token its own row gives
    no mass (d cannot have been drawn from that row: a point mass on d is the reading that keeps
    the output distributed as p whatever chose d; max(p - q, 0) there was not)."""
    q = np.zeros(n_vocab)
    if draft_probs is not None:
        row = np.asarray(draft_probs[i], np.float64).reshape(-1)
        if row.size > n_vocab:
            raise VkdflashError(f"draft probabilities over {row.size} tokens, the target has {n_vocab}")
        total = row.sum()
        if d < row.size and row[d] > 0 and np.isfinite(total):
            q[:row.size] = row / total
            return q
    q[d] = 1.0
    return q
