"""Draft lists from a drafter's logits, by llama.cpp's rule: greedy ids, cut before the first
position whose top-1 probability (after top-k 10) falls below --draft-p-min."""
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
