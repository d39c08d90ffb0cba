"""The ngram strategy's proposals: pure token bookkeeping, no device."""
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
