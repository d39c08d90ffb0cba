"""Sampler edges (NaN settings, min-p above 1, vanishing temperatures) and Monte-Carlo checks that
speculative sampling emits exactly plain sampling's distribution: the joint of two tokens under
llama.cpp's default truncation, for one-hot, sampled, narrowed-vocabulary and inconsistent drafts."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.sampling import Sampler
from vkdflash.spec.verify import verify

V = 5  # a small vocabulary: every joint cell of two tokens is counted


def _chi2(counts, probs) -> tuple[float, int]:
    """Pearson's statistic over the cells expected >= 5 times (the rest pooled), and its dof."""
    counts, expected = np.asarray(counts, float).ravel(), np.asarray(probs, float).ravel() * np.sum(counts)
    big = expected >= 5
    c = np.append(counts[big], counts[~big].sum())
    e = np.append(expected[big], expected[~big].sum())
    if e[-1] == 0:
        assert c[-1] == 0, "a draw landed where the distribution has no mass"
        c, e = c[:-1], e[:-1]
    return float(((c - e) ** 2 / e).sum()), len(e) - 1


CHI2_999 = {3: 16.27, 8: 26.12, 10: 29.59, 12: 32.91, 15: 37.70, 20: 45.31, 24: 51.18}  # p = 0.001


def _assert_fits(counts, probs):
    stat, dof = _chi2(counts, probs)
    limit = CHI2_999.get(dof) or dof + 4.5 * np.sqrt(2 * dof)  # ~p 0.001 for larger dof
    assert stat < limit, (stat, dof, counts)


def _target(prefix: tuple) -> np.ndarray:
    """The toy target's logits after `prefix` (a different, fixed vector per prefix)."""
    return np.random.default_rng([7, len(prefix), *prefix]).normal(size=V) * 1.5


def _draft_logits(prefix: tuple) -> np.ndarray:
    return np.random.default_rng([9, len(prefix), *prefix]).normal(size=V)


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _propose(kind: str, prefix: tuple, k: int, rng):
    """k drafts after `prefix` and the q rows the verifier gets (None: one-hot drafts)."""
    toks, rows = [], []
    for _ in range(k):
        ctx = prefix + tuple(toks)
        if kind == "one-hot":  # deterministic: the draft's argmax
            toks.append(int(np.argmax(_draft_logits(ctx))))
            continue
        if kind == "narrow":  # a draft over the first V - 2 tokens only (its rows are shorter)
            q = _softmax(_draft_logits(ctx)[:V - 2])
        else:
            q = _softmax(_draft_logits(ctx))
        d = int(rng.choice(q.size, p=q))
        if kind == "stray" and rng.random() < 0.3:  # now and then a token outside the reported q
            q = q.copy()
            d = V - 1
            q[d] = 0.0
            q /= q.sum()
        toks.append(d)
        rows.append(q)
    return toks, (None if kind == "one-hot" else rows)


def _two_tokens(kind: str, sampler: Sampler, rng, k: int = 2, verifier=verify) -> tuple[int, int]:
    """The first two tokens speculative decoding emits from the empty prefix (as many verify steps
    as it takes), drafting k at a time."""
    out: list[int] = []
    while len(out) < 2:
        prefix = tuple(out)
        drafts, q = _propose(kind, prefix, k, rng)
        logits = np.stack([_target(prefix + tuple(drafts[:i])) for i in range(len(drafts) + 1)])
        n, nxt = verifier(drafts, logits, sampler, q)
        out += drafts[:n] + [nxt]
    return out[0], out[1]


def _plain_joint(sampler: Sampler) -> np.ndarray:
    p1 = sampler.probs(_target(()))
    return np.array([p1[a] * sampler.probs(_target((a,))) for a in range(V)])


LLAMA = dict(temp=0.8, top_k=4, top_p=0.95, min_p=0.05)  # llama.cpp's defaults, top-k cut to bite at V 5


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("kind", ["one-hot", "sampled", "narrow", "stray"])
def test_speculative_joint_of_two_tokens_is_plain_sampling(kind, k):
    """Chi-square over the 25 cells of (token 1, token 2): drafts accepted, rejected and the bonus
    token (token 2 when k is 1) all emit the truncated, tempered distribution plain sampling draws from."""
    sampler = Sampler(seed=5, **LLAMA)
    rng = np.random.default_rng(6)
    trials = 6000
    counts = np.zeros((V, V))
    for _ in range(trials):
        a, b = _two_tokens(kind, sampler, rng, k)
        counts[a, b] += 1
    _assert_fits(counts, _plain_joint(sampler))


def test_joint_check_can_fail():
    """The check above rejects a verifier that skips the residual (redraws from p on rejection)."""
    def biased(drafts, logits, sampler, draft_probs=None):
        for i, d in enumerate(drafts):
            p = sampler.probs(logits[i])
            q = np.zeros_like(p)
            q[:len(draft_probs[i])] = draft_probs[i]
            if sampler.rng.random() < min(1.0, p[d] / q[d]):
                continue
            return i, sampler.draw(p)  # wrong: should be norm(max(p - q, 0))
        return len(drafts), sampler.draw(sampler.probs(logits[len(drafts)]))

    sampler, rng = Sampler(seed=5, **LLAMA), np.random.default_rng(6)
    counts = np.zeros((V, V))
    for _ in range(6000):
        a, b = _two_tokens("sampled", sampler, rng, verifier=biased)
        counts[a, b] += 1
    stat, dof = _chi2(counts, _plain_joint(sampler))
    assert stat > 2 * (CHI2_999.get(dof) or dof + 4.5 * np.sqrt(2 * dof))


def test_proposed_token_outside_its_q_is_verified_as_one_hot():
    """A draft token its own q gives no mass (a plugin's q out of step with its draws, or f32
    underflow): the only distribution-preserving reading is a point mass on it. Was: always
    rejected, then drawn from norm(max(p - q, 0)), far from p."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    sampler = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    q = np.array([[0.5, 0.5, 0.0, 0.0]])
    counts = np.zeros(4)
    accepted = 0
    for _ in range(4000):
        n, nxt = verify([3], logits, sampler, q)
        counts[3 if n else nxt] += 1
        accepted += n
    _assert_fits(counts, [0.5, 0.3, 0.15, 0.05])
    assert 120 < accepted < 280  # accepted with p(3) = 0.05, as a one-hot draft


def test_draft_rows_over_a_smaller_vocabulary():
    """q over the first 3 of 4 tokens (the rest zero): verified, not a broadcasting error."""
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1], [0.25] * 4]))
    sampler = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=4)
    q = np.array([0.2, 0.2, 0.6])
    rng = np.random.default_rng(1)
    counts = np.zeros(4)
    for _ in range(4000):
        d = int(rng.choice(3, p=q))
        n, nxt = verify([d], logits, sampler, q[None, :])
        counts[d if n else nxt] += 1
    _assert_fits(counts, [0.4, 0.3, 0.2, 0.1])
    with pytest.raises(VkdflashError):  # a row longer than the target's vocabulary
        verify([0], logits, sampler, np.ones((1, 5)) / 5)


def test_verify_is_seed_reproducible():
    logits = np.random.default_rng(2).normal(size=(4, 30)) * 2
    q = np.random.default_rng(3).dirichlet(np.ones(30), size=3)

    def run(seed):
        s = Sampler(seed=seed)
        return [verify([1, 2, 3], logits, s, q) for _ in range(40)]
    assert run(11) == run(11) and run(11) != run(12)


def test_plain_draws_follow_probs_under_the_default_chain():
    """sample() with llama.cpp's defaults draws probs() (chi-square, 200-token vocabulary)."""
    x = np.random.default_rng(4).normal(size=200) * 3
    s = Sampler(seed=9)
    p = s.probs(x)
    assert 1 < (p > 0).sum() <= 40
    counts = np.bincount([s.sample(x) for _ in range(6000)], minlength=200)
    _assert_fits(counts, p)


def test_nan_settings_are_refused():
    for bad in (dict(temp=np.nan), dict(top_p=np.nan), dict(min_p=np.nan)):
        with pytest.raises(VkdflashError):
            Sampler(**bad)


def test_min_p_above_one_keeps_the_top_token():
    """llama.cpp always keeps the first (top) token; was: a numpy error on an empty max."""
    x = np.array([1.0, 3.0, 2.0, 3.0, -np.inf])
    p = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=1.5, seed=0).probs(x)
    assert np.array_equal(p, [0, 0.5, 0, 0.5, 0])


def test_vanishing_temperature_is_greedy_not_an_error():
    """temp 1e-308 (the CLI takes any finite value >= 0): logits / T overflowed to inf and the
    draw saw NaN ("cannot draw from an all-zero distribution"). Now the argmax, ties shared."""
    x = np.array([30.0, 29.0, -5.0, 30.0])
    s = Sampler(temp=1e-308, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    assert np.array_equal(s.probs(x), [0.5, 0, 0, 0.5])
    assert {s.sample(x) for _ in range(50)} == {0, 3}
    assert Sampler(temp=1e-308, seed=0).sample(-x) == 2
    # and tiny but ordinary: logits 1e-7 apart at T 1e-6 are still a real draw between them
    p = Sampler(temp=1e-6, seed=0).probs(np.array([1.0, 1.0 - 1e-7, 0.5]))
    assert np.allclose(p, [1 / (1 + np.exp(-0.1)), 1 - 1 / (1 + np.exp(-0.1)), 0], rtol=1e-6)
