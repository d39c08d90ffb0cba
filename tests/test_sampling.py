"""Sampler: greedy, seeded reproducibility, the top-k / top-p / min-p cuts from their definitions,
the draw's frequencies, and stop strings on streamed text."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.sampling import Sampler, StopMatcher, min_p_mask, top_k_mask, top_p_mask


def _logits(probs) -> np.ndarray:
    return np.log(np.asarray(probs, np.float64))


def test_greedy_argmax_lowest_index_on_ties():
    x = np.array([0.5, 2.0, -1.0, 2.0, 1.9], np.float32)
    s = Sampler(temp=0.0, seed=1)
    assert s.greedy and s.sample(x) == 1
    assert np.array_equal(s.probs(x), np.eye(5)[1])
    assert Sampler(temp=-1.0).sample(np.array([-np.inf, 3.0, 3.0])) == 1


def test_seeded_draws_reproduce():
    x = np.random.default_rng(0).standard_normal(1000)
    a = [Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7).sample(x) for _ in range(3)]
    assert len(set(a)) == 1
    s1, s2 = Sampler(seed=123), Sampler(seed=123)
    seq1 = [s1.sample(x) for _ in range(50)]
    seq2 = [s2.sample(x) for _ in range(50)]
    assert seq1 == seq2 and len(set(seq1)) > 1
    assert seq1 != [Sampler(seed=124).sample(x) for _ in range(50)]


def test_top_k_keeps_k_largest_ties_to_lower_id():
    x = np.array([1.0, 5.0, 3.0, 5.0, 3.0, -2.0])
    assert np.flatnonzero(top_k_mask(x, 1)).tolist() == [1]
    assert np.flatnonzero(top_k_mask(x, 3)).tolist() == [1, 2, 3]
    assert top_k_mask(x, 0).all() and top_k_mask(x, 6).all() and top_k_mask(x, 99).all()


def test_top_k_matches_a_full_ranking_with_ties_and_masks():
    """top_k_mask finds the cut by partition, not by sorting the vocabulary: the same ids as
    ranking every kept finite logit (highest first, ties by lower id), over many tied cuts."""
    r = np.random.default_rng(8)
    for _ in range(300):
        n = int(r.integers(1, 120))
        x = r.integers(-4, 4, n).astype(np.float64)  # few values: ties at most cuts
        x[r.random(n) < 0.15] = -np.inf
        keep = r.random(n) < 0.8
        if not np.isfinite(x).any():
            continue
        ranked = [i for i in sorted(range(n), key=lambda i: (-x[i], i)) if keep[i] and np.isfinite(x[i])]
        for k in (1, 2, 3, 7, 40):
            want = sorted(ranked[:k]) if k < len(ranked) else sorted(ranked)
            assert np.flatnonzero(top_k_mask(x, k, keep)).tolist() == want


def test_a_draw_lands_on_a_token_the_distribution_allows():
    s = Sampler(seed=2)
    probs = np.zeros(50000)
    probs[[3, 17, 49999]] = [0.2, 0.5, 0.3]
    assert set(s.draw(probs) for _ in range(300)) == {3, 17, 49999}
    with pytest.raises(VkdflashError, match="all-zero"):
        s.draw(np.zeros(8))


def test_top_p_smallest_prefix_reaching_p():
    p = np.array([0.1, 0.4, 0.2, 0.3])                  # sorted: 0.4 (1), 0.3 (3), 0.2 (2), 0.1 (0)
    x = _logits(p)
    for top_p, want in [(0.3, [1]), (0.39, [1]), (0.5, [1, 3]), (0.69, [1, 3]), (0.71, [1, 2, 3]),
                        (0.95, [0, 1, 2, 3])]:
        got = np.flatnonzero(top_p_mask(x, top_p)).tolist()
        # the definition: highest first, cumulative sum, first index where it reaches p
        order = np.argsort(-p, kind="stable")
        n = int(np.argmax(np.cumsum(p[order]) >= top_p - 1e-12)) + 1
        assert got == sorted(order[:n].tolist()) == want, top_p
    assert top_p_mask(x, 1.0).all()


def test_top_p_renormalises_over_the_kept_tokens():
    p = np.array([0.5, 0.25, 0.15, 0.1])
    keep = top_k_mask(_logits(p), 2)                   # {0, 1}: renormalised 2/3, 1/3
    assert np.flatnonzero(top_p_mask(_logits(p), 0.6, keep)).tolist() == [0]
    assert np.flatnonzero(top_p_mask(_logits(p), 0.7, keep)).tolist() == [0, 1]


def test_min_p_relative_to_max():
    p = np.array([0.5, 0.2, 0.051, 0.26, 0.01, 0.0249, 0.0251])
    x = _logits(p)
    for min_p in (0.05, 0.1, 0.5, 0.6):
        assert np.array_equal(min_p_mask(x, min_p), p >= min_p * p.max() - 1e-15), min_p
    assert min_p_mask(x, 0.0).all()
    keep = np.array([False, True, True, True, True, True, True])  # max among kept is 0.26
    assert np.array_equal(min_p_mask(x, 0.5, keep), keep & (p >= 0.13))


def test_probs_chain_order_and_temperature():
    r = np.random.default_rng(3)
    x = r.standard_normal(200) * 2
    s = Sampler(temp=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=0)
    got = s.probs(x)
    # chain from the definitions: top-k, then top-p and min-p on the temperature-1 softmax, then temp
    order = np.argsort(-x, kind="stable")[:20]
    pk = np.exp(x[order] - x[order].max())
    pk /= pk.sum()
    order = order[:int(np.argmax(np.cumsum(pk) >= 0.9)) + 1]
    order = order[x[order] >= x[order].max() + np.log(0.05)]
    want = np.zeros(200)
    e = np.exp((x[order] - x[order].max()) / 0.7)
    want[order] = e / e.sum()
    assert np.allclose(got, want, rtol=1e-12, atol=1e-15)
    assert abs(got.sum() - 1) < 1e-12 and (got > 0).sum() == len(order)
    assert s.sample(x) in set(order.tolist())


def test_draw_frequencies_follow_probs():
    x = _logits([0.5, 0.3, 0.15, 0.05])
    s = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    counts = np.bincount([s.sample(x) for _ in range(4000)], minlength=4) / 4000
    assert np.abs(counts - [0.5, 0.3, 0.15, 0.05]).max() < 0.03   # ~4 sigma at n=4000
    assert all(s.draw([0.0, 0.0, 2.0, 0.0]) == 2 for _ in range(20))


def test_bad_logits():
    with pytest.raises(VkdflashError):
        Sampler().sample(np.array([1.0, np.nan]))
    with pytest.raises(VkdflashError):
        Sampler().sample(np.array([-np.inf, -np.inf]))
    with pytest.raises(VkdflashError):
        Sampler().draw([0.0, 0.0])


def _stream(stops, chunks):
    m = StopMatcher(stops)
    out = [m.feed(c) for c in chunks]
    return out, m.flush(), m


def test_stop_matcher_holds_back_partial_match():
    out, tail, m = _stream(["</s>"], ["Hello <", "/", "s> more"])
    assert out == ["Hello ", "", ""] and tail == "" and m.stopped and m.matched == "</s>"


def test_stop_matcher_releases_false_alarm():
    out, tail, m = _stream(["</s>"], ["a <", "/x", " b <"])
    assert out == ["a ", "</x", " b "] and tail == "<" and not m.stopped
    assert "".join(out) + tail == "a </x b <"


def test_stop_matcher_earliest_of_several_and_after_stop():
    out, tail, m = _stream(["END", "ND!", "\n\n"], ["x EN", "D! \n\n y"])
    assert out == ["x ", ""] and m.matched == "END"
    assert m.feed("more") == "" and tail == ""
    out, _, m = _stream(["ab", "b"], ["xab"])
    assert out == ["x"] and m.matched == "ab"      # both end at the same place: the longer one
    out, _, m = _stream(["abcd", "bc"], ["abcd"])
    assert out == ["a"] and m.matched == "bc"      # "bc" completes first, as it would when streamed


def test_stop_matcher_streamed_equals_whole():
    r = np.random.default_rng(5)
    text = "".join(r.choice(list("ab<>/ \n"), 400))
    stops = ["</a>", "b\n\nb", "<<"]
    whole = StopMatcher(stops)
    want = whole.feed(text) + whole.flush()
    for _ in range(20):
        cuts = sorted(r.choice(len(text), 30, replace=False))
        chunks = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        m = StopMatcher(stops)
        assert "".join(m.feed(c) for c in chunks) + m.flush() == want
        assert m.stopped == whole.stopped


def test_stop_matcher_no_stops():
    out, tail, m = _stream([""], ["abc", "def"])
    assert out == ["abc", "def"] and tail == "" and not m.stopped
