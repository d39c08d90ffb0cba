"""tools/replay_ngram.py: the noise-free replay of ngram's draft lengths (no model needed here:
a made-up text and pass prices)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools")]

from replay_ngram import Replay  # noqa: E402

from vkdflash.spec.controller import DraftController  # noqa: E402

CURVE = {1: 0.030, 2: 0.036, 3: 0.045, 4: 0.050, 5: 0.060, 6: 0.066, 7: 0.075, 8: 0.080, 9: 0.090}
# a block of 8 tokens that repeats with one slot (the 4th) differing each time, like class PointN
TEXT = [t for n in range(12) for t in (1, 2, 3, 100 + n, 5, 6, 7, 8)]


def replay() -> Replay:
    return Replay(TEXT[:16], TEXT[16:], lambda rows: CURVE[rows])


def test_a_step_drafts_what_ngram_proposes_and_counts_the_accepted_prefix():
    r = replay()
    # after "... 5 6 7" the lookup proposes 8, then 1 2 3, then the slot the earlier repeats disagree on
    i = next(i for i in range(1, len(r.gen)) if r.gen[i - 1] == 7)
    drafted, accepted = r.step(i, 8)
    assert drafted == 4 and accepted == 4  # 8 1 2 3, cut before the varying slot
    assert r.step(i, 2) == (2, 2) and r.step(i, 0) == (0, 0)


def test_no_choice_of_lengths_beats_the_clairvoyant_bound():
    r = replay()
    best = r.clairvoyant(8)
    for fixed in (False, True):
        seconds, steps = r.controlled(DraftController(8, {1: CURVE[1], 2: CURVE[2], 4: CURVE[4]}, fixed=fixed))
        assert seconds >= best - 1e-12 and len(steps) > 0
    plain = (len(r.gen) - 1) * CURVE[1]
    assert best < plain / 2  # the repeats are worth drafting: the bound knows it


def test_bad_arguments_are_refused_before_anything_runs():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "replay_ngram.py"), "--draft-max", "0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--draft-max" in res.stderr.splitlines()[-1]
