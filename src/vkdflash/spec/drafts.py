"""Draft lists from a drafter's logits, by llama.cpp's rule: greedy ids, cut before the first
position whose top-1 probability (after top-k 10) falls below --draft-p-min. At T > 0 a drafter
samples instead and hands the verifier its distributions, so speculative sampling accepts as
much as the draft and target distributions overlap (a one-hot draft accepts only p(d))."""
from __future__ import annotations

import numpy as np

TOP_K = 10  # llama.cpp's draft sampler: top-k 10, then its probabilities are renormalised


def top1_probability(logits: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Per row, the top token's probability after top-k: what llama.cpp compares with --draft-p-min."""
    x = np.asarray(logits, np.float64)
    k = min(k, x.shape[-1])
    top = -np.sort(-x, axis=-1)[..., :k]
    e = np.exp(top - top[..., :1])
    return e[..., 0] / e.sum(axis=-1)


def select_drafts(ids, logits, p_min: float) -> list:
    """Greedy drafts, stopping before the first one whose top-k probability is below p_min."""
    ids = [int(t) for t in ids]
    if p_min <= 0 or not ids:
        return ids
    p = top1_probability(logits)
    for i, prob in enumerate(p):
        if prob < p_min:
            return ids[:i]
    return ids


def draft_distribution(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) per row, f64: the q a sampling drafter draws from and reports."""
    x = np.asarray(logits, np.float64) / temperature
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample_drafts(logits: np.ndarray, temperature: float, rng: np.random.Generator, p_min: float = 0.0):
    """(ids, probs [n, vocab]) drawn row by row from softmax(logits / T), cut by the p_min rule."""
    q = draft_distribution(logits, temperature)
    ids = [int(rng.choice(q.shape[1], p=row)) for row in q]
    if p_min > 0:
        ids = select_drafts(ids, logits, p_min)
    return ids, q[:len(ids)]
