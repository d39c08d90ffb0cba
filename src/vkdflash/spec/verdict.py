"""When a strategy should be switched off (DraftController.stop_reason).

Keeping a strategy's state (its commit: MTP runs its head over each committed token) costs every
step whatever k, so T(k) includes that overhead (the median of recent commits: a first commit of
a shape compiles); once the evidence (STOP_STEPS timed steps; where its drafts' cost decides,
SHAPE_PASSES timed proposals) says the best k with the strategy is below STOP_RATIO of plain
decoding without it, or the best is k = 0 while its upkeep is more than UPKEEP_SHARE of a step,
or none of its drafts was accepted where a draft as good as its a_1 prior would have had one
accepted (acceptance.STOP_CHANCE: the shipped MTP head, a_1 0.35, had none of its first 5
accepted on bench spec's prompt and was switched off at 4), or the best is k = 0 and not even the a_1 it expects
would bring a length to STOP_RATIO of plain decoding, `stop_reason()` says why and the engine
switches the strategy off: k = 0 alone cannot stop a strategy's upkeep (the target's captures,
commits where a strategy writes each step), and its probes cost too (the shipped DFlash draft on
lavapipe, a_1 ~0.25, left on at k 0 with a probe now and then: 0.91x plain over 9 alternations,
0.94x once its commits waited for its proposals; switched off: 0.97-1.00x).

A stop is `lasting` (the engine drops the strategy for the speculator's life) only where no
length would pay even at the a_1 the draft expects (its record, else the guess): then it is this
device's verdict, which a server's next request would reach again. Otherwise it rests on this
request's text, and `new_request` gives the next request a fresh view of acceptance, probes and
the stop rules' evidence; what was learned of the device (pass and draft prices, upkeep) stays.
"""
from __future__ import annotations

import numpy as np

from .costs import SHAPE_PASSES, argmax

STOP_STEPS = 16    # timed steps before judging whether the strategy pays
STOP_RATIO = 0.97  # below this share of plain decoding's rate, it does not
UPKEEP_SHARE = 0.01  # ... nor when no k pays and keeping its state costs more than this share of a step


def at_record(control) -> list[float]:
    """Rates with k = 0..k_max at the acceptance the draft expects (no evidence: its record's
    a_1, else the guess) and steady pass prices."""
    return control.rates(control.k_max, np.zeros_like(control.acceptance.run_counts), control.costs.steady)


def verdict(control) -> str | None:
    """Why the strategy should be switched off, or None while it pays or the evidence is thin."""
    # timed steps of the speculator (pass prices) and of this request (its acceptance)
    scaled = min(control.costs.scaled, control.steps)
    if control.fixed or control.unmeasured or scaled < STOP_STEPS:
        return None
    if control.total[0] >= control.acceptance.stop_drafts() and not control.total[1]:
        # its upkeep (captures, commits) is then pure cost, and hidden in the live curve
        return (f"none of its {control.total[0]} drafts was accepted in {control.steps} steps; --draft-fixed "
                "keeps it on")
    if control.drafts.timings() < SHAPE_PASSES:
        # its rate rests on what a draft costs: one timing is noise (the shipped MTP head's
        # first timed draft, 8.3 ms where they take ~3, switched it off after a mid-run
        # measurement at a 1000-token request's 261st token, where k 1 pays 1.15x plain)
        return None
    # judged on the whole run's acceptance (the decayed one follows the text, and one unlucky
    # stretch would switch off a strategy that pays) and on steady pass prices (a slow spell's
    # would: choose() idles through it at the live ones)
    steady = control.costs.steady
    run_counts = control.acceptance.run_counts
    rates = control.rates(control.k_max, run_counts, steady)
    k = argmax(rates)
    best, plain, a_1 = rates[k], control.plain_rate(), control.acceptance.estimate(run_counts)[0]
    if k == 0 and control.overhead > UPKEEP_SHARE * control.c_verify(1):
        return (f"it costs more than it saves here: no draft length pays (a_1 {a_1:.2f}) and it "
                f"spends {1000 * control.overhead:.0f} ms keeping its state a step; --draft-fixed keeps it on")
    # idling still costs its captures and probes: off where not even the a_1 on the draft's
    # record would make a length pay by the margin below (the shipped DFlash draft on
    # lavapipe); inside it, a few noisy timings decide (the shipped MTP head, 1.16x plain at
    # k 1, was switched off in 1 of 5 runs when 4 drafts' timings put k 1 at 0.98x)
    if k == 0 and max(at_record(control)[1:], default=0.0) < STOP_RATIO * plain:
        return (f"it costs more than it saves here: no draft length pays at the a_1 it expects "
                f"({control.acceptance.first_prior:.2f}) nor at the {a_1:.2f} it had; --draft-fixed keeps it on")
    if best >= STOP_RATIO * plain:
        return None
    return (f"it costs more than it saves here: at best {best:.1f} tok/s with it (k {k}, a_1 "
            f"{a_1:.2f}, {1000 * control.c_draft(max(k, 1)):.0f} ms drafting and "
            f"{1000 * control.overhead:.0f} ms keeping its state a step) against {plain:.1f} tok/s without; "
            "--draft-fixed keeps it on")
