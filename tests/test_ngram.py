"""The ngram strategy's proposals: pure token bookkeeping, no device."""
import random
from types import SimpleNamespace

from vkdflash_ngram import PromptLookup


def propose(tokens: list, max_n: int = 8, n: int = 3) -> list:
    lookup = PromptLookup(SimpleNamespace(options=SimpleNamespace(settings={"n": n})))
    return lookup.propose(SimpleNamespace(tokens=tokens[:-1]), tokens[-1], max_n).tokens


def test_it_copies_what_followed_the_newest_earlier_occurrence_of_the_last_tokens():
    assert propose([1, 2, 3, 4, 5, 9, 9, 1, 2, 3]) == [4, 5, 9, 9, 1, 2, 3]
    assert propose([1, 2, 3, 4, 5, 9, 9, 1, 2, 3], max_n=2) == [4, 5]
    assert propose([1, 2, 3, 4, 5]) == []  # nothing recurs


SEP, CLS, POINT, COLON, BODY = 9, 10, 11, 12, [20, 21, 22]


def classes(*numbers) -> list:
    """"\n\nclass Point<N>:" and the same body, as tokens"""
    return [t for n in numbers for t in (SEP, CLS, POINT, n, COLON, *BODY)]


def test_it_stops_where_the_occurrence_before_went_on_differently():
    # after a third "class Point" the two newest repeats disagree on N: no guess
    assert propose(classes(2, 3) + [SEP, CLS, POINT]) == []
    # ... and agree up to where they part
    assert propose([7, 1, 2, 3, 8, 7, 1, 2, 4, 7]) == [1, 2]


def test_past_a_varying_slot_it_goes_on_from_the_tokens_before_it_where_two_repeats_agree():
    assert propose(classes(2, 3) + [SEP, CLS, POINT, 4]) == [COLON, *BODY, SEP, CLS, POINT]
    # one earlier repeat is too little evidence for a guess past the slot
    assert propose(classes(2) + [SEP, CLS, POINT, 4]) == []


class Scanning(PromptLookup):
    """The lookup as a scan of the whole text (what the index must give)."""

    def _newest(self, history, end, n):
        tail = history[end - n:end]
        return [s for s in range(end - n - 1, -1, -1) if history[s:s + n] == tail][:2]


def test_the_index_proposes_what_a_scan_of_the_text_would():
    rng = random.Random(7)
    for n in (1, 2, 3, 4):
        settings = SimpleNamespace(options=SimpleNamespace(settings={"n": n}))
        lookup, scan = PromptLookup(settings), Scanning(settings)
        for text in range(6):
            tokens = [rng.randrange(4 + 3 * text) for _ in range(300)]
            if text % 3:
                lookup.begin(None)
            # committed a few tokens at a time, as steps commit them; every third text follows another
            # without begin() and starts shorter (indexed again), as a replay of positions does
            cuts = sorted(rng.sample(range(1, len(tokens)), 60)) if text % 3 else range(1, len(tokens))
            for cut in cuts:
                ctx = SimpleNamespace(tokens=tokens[:cut])
                assert lookup.propose(ctx, tokens[cut], 8).tokens == scan.propose(ctx, tokens[cut], 8).tokens
