"""The cost-aware draft length: it picks argmax_k E(k) / T(k) from its estimates, learns
acceptance and costs from the steps it sees, probes when it has stopped drafting, and keeps the
old behaviour with fixed=True."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.spec.controller import DraftController
from vkdflash.spec.costs import PERSIST_PASSES, WHOLE_DRAFT, _interp

GPU = {n: 0.010 + 0.0002 * n for n in (1, 2, 4, 8, 16, 32)}          # verify nearly free
CPU = {1: 0.066, 2: 0.080, 4: 0.101, 8: 0.150, 16: 0.250, 32: 0.460}   # lavapipe-like, n=16 ~3.8x


def trained(curve, accept_p: float, k_max: int = 8, steps: int = 200, draft_cost: float = 0.0, seed: int = 0):
    """A controller fed `steps` fixed-length steps whose drafts are accepted i.i.d. with accept_p."""
    c = DraftController(k_max, curve)
    r = np.random.default_rng(seed)
    for _ in range(steps):
        accepted = 0
        while accepted < k_max and r.random() < accept_p:
            accepted += 1
        c.update(k_max, k_max, accepted, curve[min(curve, key=lambda n: abs(n - k_max - 1))], draft_cost)
    return c


def test_fixed_mode_always_drafts_the_most_it_may():
    c = DraftController(6, CPU, fixed=True)
    assert [c.choose(room) for room in (10, 6, 3, 0)] == [6, 6, 3, 0]


def test_it_chooses_the_k_with_the_best_expected_rate():
    c = trained(CPU, 0.8)
    k = c.choose(64)
    rates = [c.expected_rate(j) for j in range(9)]
    assert k == int(np.argmax(rates)) and rates[k] > rates[0]
    assert c.acceptance.estimate()[0] == pytest.approx(0.8, abs=0.1)


def test_the_first_choice_starts_from_the_drafts_own_record():
    """A draft whose suite measured a_1 0.25 is not worth a dear verify before any evidence;
    with no record (prior 0.5) the first step drafts; where verify is nearly free both draft.
    (The curve recorded at 978550f on lavapipe: 1 / 1.28 / 1.58 / 2.46 / 4.25.)"""
    lavapipe = {1: 0.0233, 2: 0.0298, 4: 0.0368, 8: 0.0573, 16: 0.099}
    unknown, known = DraftController(7, lavapipe), DraftController(7, lavapipe)
    known.acceptance.expect(0.25)
    assert unknown.choose(100) > 0 and known.choose(100) == 0
    assert known.acceptance.estimate()[0] == pytest.approx(0.25)
    cheap = DraftController(7, GPU)
    cheap.acceptance.expect(0.25)
    assert cheap.choose(100) > 0


def test_cheap_verify_and_good_drafts_draft_the_most():
    assert trained(GPU, 0.9).choose(64) == 8


def test_drafts_that_are_never_accepted_stop_being_drafted_except_for_rarer_and_rarer_probes():
    c = trained(CPU, 0.0)
    chosen = []
    for _ in range(300):
        k = c.choose(64)
        chosen.append(k)
        c.update(k, k, 0, CPU[min(CPU, key=lambda n: abs(n - k - 1))], 0.0)
    probes = [i for i, k in enumerate(chosen) if k]
    assert set(chosen) <= {0, 2} and probes[0] == 8
    waits = np.diff(probes)
    assert list(waits[:4]) == [17, 33, 65, 129] and len(probes) <= 6  # the wait doubles after each miss


def test_fewer_rows_never_cost_more():
    """A stale, noisy 1-row figure above a live 2-row one would make drafting look free (seen
    on lavapipe: k=1 on every step, 0.55-0.63x plain)."""
    c = DraftController(15, {**CPU, 1: 0.097})
    c.update(1, 1, 0, 0.072, 0.006)
    assert c.c_verify(1) <= c.c_verify(2) == pytest.approx(0.072)
    for _ in range(30):  # 4-row passes turn out fast: the 1- and 2-row costs follow them down
        c.update(3, 3, 0, 0.030, 0.006)
    assert c.c_verify(1) <= c.c_verify(2) <= c.c_verify(4) == pytest.approx(0.030)
    before, a1 = (dict(c.costs.verify), dict(c.drafts.timed)), c.acceptance.estimate()[0]
    c.update(15, 15, 3, None, None)  # an untypical (first, compiling) pass: learn acceptance only
    assert (c.costs.verify, c.drafts.timed) == before and c.acceptance.estimate()[0] > a1


def test_a_width_is_priced_by_its_own_passes_only_once_it_has_a_few():
    """This VM's identical passes range 28-52 ms within a second: the MTP head's first two
    2-row passes (48 and 53 ms, 1.4x the 1-row ones; 1.1x in rounds) priced k 1 out and switched
    it off. Until a width has SHAPE_PASSES passes it keeps the prior's shape at the live scale;
    then the median of its passes, so one more spike does not move it."""
    c = DraftController(4, CPU)
    for _ in range(20):
        c.update(0, 0, 0, CPU[1], None)
    for seconds in (1.4 * CPU[2], 1.5 * CPU[2]):
        c.update(1, 1, 0, seconds, 0.003)
        assert c.c_verify(2) < 1.1 * CPU[2]
    for seconds in (CPU[2], CPU[2], 1.02 * CPU[2], 1.02 * CPU[2], 2.0 * CPU[2]):
        c.update(1, 1, 0, seconds, 0.003)
    assert c.c_verify(2) == pytest.approx(1.02 * CPU[2])


def test_widths_timed_in_different_spells_are_not_compared():
    """1-row passes in a fast spell, then only 2-row passes in a spell 1.3x slower: the 1-row
    price follows the 2-row one at the prior's ratio once its own timings are old, where
    comparing the two spells would price a 2-row pass at 1.3x the prior's ratio."""
    c = DraftController(4, CPU)
    for _ in range(20):
        c.update(0, 0, 0, CPU[1], None)
    for _ in range(40):
        c.update(1, 1, 1, 1.3 * CPU[2], 0.003)
    assert c.c_verify(2) / c.c_verify(1) == pytest.approx(CPU[2] / CPU[1])
    assert c.c_verify(2) == pytest.approx(1.3 * CPU[2])


def test_a_stale_curve_keeps_its_shape_at_the_live_scale():
    """A curve cached while the machine was busy: row counts not seen live follow the ratio of
    live to cached passes; one slow pass (a compile, a burst of load) does not move them, and
    before any width is priced it moves the scale a bounded step."""
    busy = {n: 3 * s for n, s in CPU.items()}
    c = DraftController(15, busy)
    for _ in range(20):
        c.update(1, 1, 1, CPU[2], 0.001)
    assert c.c_verify(2) == pytest.approx(CPU[2])
    assert c.c_verify(16) == pytest.approx(CPU[16], rel=0.01) and c.c_verify(32) == pytest.approx(CPU[32], rel=0.01)
    c.update(1, 1, 1, 5.0, 0.001)
    assert c.c_verify(16) == pytest.approx(CPU[16], rel=0.01)
    fresh = DraftController(15, busy)
    fresh.update(1, 1, 1, CPU[2], 0.001)
    fresh.update(1, 1, 1, 5.0, 0.001)
    assert CPU[16] < fresh.c_verify(16) <= CPU[16] * 4 ** 0.5 * 1.001


def test_after_drafts_that_all_held_it_tries_longer_ones_to_learn_their_cost():
    """A cached curve whose shape is wrong (n-row passes dearer than they are) would keep the
    choice short forever; trying 2k + 1 after a step whose k drafts all held finds the cheap
    lengths. Without the reach (full forced to 0) the same controller stays near k = 3."""
    true = {1: 0.033, 2: 0.040, 4: 0.048, 8: 0.070, 16: 0.120}
    stale = {1: 0.035, 2: 0.056, 4: 0.108, 8: 0.201, 16: 0.330}

    def mean_k(reach: bool) -> float:
        c, r, ks = DraftController(15, stale), np.random.default_rng(0), []
        for _ in range(150):
            if not reach:
                c.full = 0
            k = c.choose(64)
            accepted = 0
            while accepted < k and r.random() < 0.9:
                accepted += 1
            c.update(k, k, accepted, float(np.interp(k + 1, list(true), list(true.values()))), 0.0)
            ks.append(k)
        return float(np.mean(ks[-50:]))

    best = max(range(16), key=lambda j: sum(0.9 ** i for i in range(j + 1)) / np.interp(j + 1, list(true), list(true.values())))
    assert best == 7 and abs(mean_k(True) - best) <= 2 and mean_k(False) < best - 3


def test_a_pass_is_priced_at_the_batch_width_it_computes():
    """lavapipe's matmuls run 8-row slots: 9..16 rows cost what 16 do. Priced linearly between
    8 and 16, 10 rows looked cheap, and the controller drafted 9 (10 rows at 16 rows' cost);
    priced by width it drafts to a slot's end: 7 or 15."""
    def width(rows):
        slot = 1 if rows == 1 else min(8, 1 << (rows - 1).bit_length())
        return -(-rows // slot) * slot

    def chosen(c, accept) -> list:
        ks = []
        for _ in range(60):
            k = c.choose(64)
            c.update(k, k, min(k, accept), CPU[min(CPU, key=lambda n: abs(n - width(k + 1)))], 0.0)
            ks.append(k)
        return ks

    priced = DraftController(15, CPU, width=width)
    assert priced.c_verify(10) == priced.c_verify(16) == CPU[16] and priced.c_verify(5) == CPU[8]
    assert set(chosen(priced, 9)) <= {0, 1, 3, 7, 15}
    assert set(chosen(DraftController(15, CPU), 9)) - {0, 1, 3, 7, 15}  # priced linearly: mid-slot lengths


def test_the_learned_curve_is_handed_back_at_the_end():
    """Only widths timed often: one pass is noise (a cached 2-row figure from bench spec's warm-up
    sweep once made the next runs switch the MTP head off). The others stay as cached."""
    got = []
    c = DraftController(8, CPU, persist=got.append)
    c.finish()
    assert got == []  # nothing learned: nothing to write
    c.update(3, 3, 3, CPU[4] / 2, 0.0)
    c.update(1, 1, 1, CPU[2] * 3, 0.0)
    c.finish()
    assert got == []  # each width timed once
    for _ in range(7):
        c.update(3, 3, 3, CPU[4] / 2, 0.0)
    c.finish()
    assert len(got) == 1 and got[0][4] == pytest.approx(CPU[4] / 2)
    assert got[0][16] == CPU[16]  # untimed: as cached
    assert got[0][2] == pytest.approx(CPU[4] / 2)  # not the one 3x pass; fewer rows never cost more
    # plain decoding's cost never rises from a run's 1-row passes (test_spec_options: it heals down)
    slow = DraftController(8, CPU, persist=got.append)
    for _ in range(PERSIST_PASSES):
        slow.update(0, 0, 0, CPU[1] * 1.5, None)
    slow.finish()
    assert len(got) == 2 and got[1][1] == CPU[1]


def test_a_slow_run_teaches_the_cache_nothing():
    """Every pass of a run 15x dear (memory pressure evicting the weights), or 1.5x (a busy
    machine): cached, 2 rows at 16x one row switched the MTP head off in the next runs. The cache
    keeps the best a width has done, as measuring it does; a faster run lowers it."""
    got = []
    for slow in (15, 1.5, 0.8):
        c = DraftController(8, CPU, persist=got.append)
        for _ in range(PERSIST_PASSES):
            c.update(1, 1, 1, slow * CPU[2], 0.0)
        c.finish()
    assert got[0] == pytest.approx(CPU) and got[1] == pytest.approx(CPU)
    assert got[2][2] == pytest.approx(0.8 * CPU[2]) and got[2][16] == CPU[16]


def test_a_dear_one_row_pass_does_not_cheapen_the_verify_passes():
    """In a speculative run the 1-row passes come between the strategy's and cost more than plain
    decoding's (28.7 against 21.5 ms): they shape no other width (scaled down with their excess, a
    16-row pass was cached at 48 ms where it takes 75), and plain decoding's figure never rises."""
    got = []
    c = DraftController(8, CPU, persist=got.append)
    for _ in range(PERSIST_PASSES):
        c.update(0, 0, 0, 1.4 * CPU[1], None)
        c.update(1, 1, 1, 1.1 * CPU[2], 0.0)
    c.finish()
    assert got[0] == pytest.approx(CPU)  # not 2 rows at 1.1 / 1.4 of the cached figure
    c = DraftController(8, CPU, persist=got.append)  # a run that hardly drafts
    for _ in range(PERSIST_PASSES):
        c.update(0, 0, 0, 1.4 * CPU[1], None)
    c.finish()
    assert got[1] == pytest.approx(CPU)


def test_passes_short_of_their_width_are_not_cached_as_its_price():
    """9 rows run the 16-row matmuls but attention, norms and RoPE of 9: cached as the 16-row
    price, they had put it at 62 ms where 16 rows take 75."""
    got = []
    slots = lambda rows: 1 << (rows - 1).bit_length()  # noqa: E731
    c = DraftController(16, CPU, persist=got.append, width=slots)
    for _ in range(PERSIST_PASSES):
        c.update(8, 8, 0, 0.8 * CPU[16], 0.0)  # 9 rows, width 16
    c.finish()
    assert got == []
    for _ in range(PERSIST_PASSES):
        c.update(15, 15, 0, 0.9 * CPU[16], 0.0)  # 16 rows
    c.finish()
    assert got[0][16] == pytest.approx(0.9 * CPU[16])


def test_no_cached_width_costs_more_than_its_rows_one_by_one():
    from vkdflash.spec.curve import plausible
    assert plausible({1: 0.02, 2: 0.317, 4: 0.05, 16: 0.756}) == {1: 0.02, 2: 0.04, 4: 0.05, 16: 0.32}
    assert plausible({2: 0.3}) == {2: 0.3}  # no 1-row figure: nothing to bound by


def test_it_recovers_when_the_text_becomes_predictable():
    c = trained(CPU, 0.0)
    for _ in range(100):
        k = c.choose(64)
        c.update(k, k, k, CPU[min(CPU, key=lambda n: abs(n - k - 1))], 0.0)  # everything accepted now
    assert c.choose(64) >= 4


def test_an_expensive_draft_lowers_the_choice():
    cheap, dear = trained(GPU, 0.7, draft_cost=0.0), trained(GPU, 0.7, draft_cost=0.2)
    assert dear.choose(64) < cheap.choose(64)


def test_costs_interpolate_and_extend_linearly():
    c = DraftController(4, {1: 1.0, 4: 4.0})
    assert c.c_verify(2) == pytest.approx(2.0) and c.c_verify(6) == pytest.approx(6.0)
    assert c.c_draft(3) == 0.0
    c.update(2, 2, 1, 2.5, 0.3)
    assert c.c_verify(3) == pytest.approx(2.5) and c.c_draft(2) == pytest.approx(0.3) and c.c_draft(4) > 0.3


def test_summary_says_what_it_chose_and_why():
    c = trained(CPU, 0.8)
    for _ in range(5):
        c.choose(64)
    s = c.summary()
    assert s["mode"] == "cost-aware" and s["mean_k"] > 0 and s["expected_tps"] > s["plain_tps"]


def test_a_fixed_run_claims_no_rates():
    """--draft-fixed prices nothing (its curve is a placeholder, {1: 1.0}): its summary and stats
    line give no expected or plain rate (they read 35 against 150 tok/s plain, made up)."""
    from vkdflash.spec import SpecStats
    c = DraftController(4, {1: 1.0}, fixed=True)
    c.choose(64)
    c.update(4, 4, 2, 0.047, 0.004)
    s = c.summary()
    assert s["mode"] == "fixed" and s["expected_tps"] is None and s["plain_tps"] is None
    stats = SpecStats()
    stats.strategy, stats.draft_length = "ngram", s
    assert "mean k 4.0" in stats.line() and "plain" not in stats.line()
    stats.record(2, 1)  # asked for 4, the strategy found 2 to propose: the line tells them apart
    assert "mean k 4.0 asked, 2.0 drafted a step" in stats.line()


def test_a_length_whose_kernels_must_compile_is_drafted_only_where_the_run_repays_it():
    """setup(rows): one-time seconds before a first pass of that many rows (lavapipe compiles a
    new batch width in ~1.6 s): a short run stays plain and does not even probe, a long one drafts."""
    def setup(rows):
        return 0.0 if rows == 1 else 1.6

    short, long_ = trained(CPU, 0.8), trained(CPU, 0.8)
    assert [short.choose(20, setup) for _ in range(40)] == [0] * 40 and short.summary()["held_for_setup"] == 40
    assert long_.choose(2000, setup) > 0
    # a request that may end at any token: bought once as many tokens as were generated would repay it
    early = trained(CPU, 0.8)
    assert early.choose(2000, setup, done=1) == 0 and early.choose(2000, setup, done=1500) > 0
    assert early.choose(20, setup, done=1500) == 0  # and no more than are left
    cheap = trained(CPU, 0.8)
    assert cheap.choose(20, lambda rows: 0.0) > 0  # nothing to compile: the choice is the rate's


def test_kernels_outlive_the_request_so_a_compile_is_weighed_over_every_request_served():
    """A server's short answers: each alone too short to repay a compile, together they do."""
    def setup(rows):
        return 0.0 if rows == 1 else 1.6

    def answer(c, tokens: int = 64) -> list[int]:  # one request, its drafts accepted at 0.8
        c.new_request()
        r, room, chosen = np.random.default_rng(len(c.chosen)), tokens, []
        while room > 0:
            k = c.choose(room, setup, done=tokens - room)
            accepted = 0
            while accepted < k and r.random() < 0.8:
                accepted += 1
            c.update(k, k, accepted, CPU[min(CPU, key=lambda n: abs(n - k - 1))], 0.0)
            chosen.append(k)
            room -= 1 + accepted
        return chosen

    c = trained(CPU, 0.8)
    c.new_request()
    assert c.served > 200 and c.horizon(20, 10) == c.served + 10
    fresh = DraftController(8, CPU)
    assert fresh.horizon(20, 10) == 10 and fresh.horizon(20, 1500) == 20  # one request: no more than it has left
    firsts = [answer(fresh) for _ in range(12)]
    assert not any(firsts[0]), "one 64-token answer cannot repay a 1.6 s compile"
    assert any(firsts[-1]), "twelve of them can, once their tokens count together"


def test_plain_decodings_own_first_pass_is_no_reason_to_draft():
    """In a cold process nothing is compiled, the 1-row pass included; it is compiled whatever a
    step drafts, so a short run stays plain (a cold `generate --spec mtp -n 128` on lavapipe
    drafted from its first step: 21 tok/s against 25-32 plain)."""
    cold = trained(CPU, 0.8)
    assert [cold.choose(20, lambda rows: 1.6) for _ in range(10)] == [0] * 10
    assert trained(CPU, 0.8).choose(2000, lambda rows: 1.6) > 0


def test_probes_take_a_length_that_is_ready():
    c = trained(CPU, 0.0)
    ready = {1, 4}
    chosen = [c.choose(30, lambda rows: 0.0 if rows in ready else 1.6) for _ in range(9)]
    assert chosen[:8] == [0] * 8 and chosen[8] == 3  # the probe (due after 8 idle steps) drafts 3, not 2


def test_a_probe_drafts_the_length_that_pays_best_at_the_drafts_record():
    """A weak draft (MTP's head: a_1 0.35) probes 1 token, a 2-row pass; one with no record
    (0.5) probes 2 on the same curve, where a third row costs little."""
    def probe(first_acceptance):
        c = DraftController(8, CPU)
        if first_acceptance is not None:
            c.acceptance.expect(first_acceptance)
        for _ in range(40):  # nothing is accepted: it stops drafting, then probes
            k = c.choose(100)
            if c.probing:
                return k
            c.update(k, k, 0, CPU[1] if not k else _interp(CPU, k + 1), None)
        return None

    assert probe(0.35) == 1 and probe(None) == 2


def test_a_strategy_whose_upkeep_outweighs_what_it_saves_is_judged_not_to_pay():
    """MTP on lavapipe: ~17 ms a step keeping its state (commit) whatever k, at a_1 ~0.6 a
    verify of ~40 ms: slower than plain decoding at every k, so it should be switched off."""
    def fed(overhead: float, fixed: bool = False, steps: int = 40):
        c = DraftController(2, CPU, fixed=fixed)
        r = np.random.default_rng(0)
        for i in range(steps):
            k = c.choose(1000)
            accepted = int(k > 0 and r.random() < 0.6)
            c.update(k, k, accepted, CPU[1] if not k else float(np.interp(k + 1, list(CPU), list(CPU.values()))), 0.015)
            c.note_overhead(overhead)
            if i + 1 < 16:
                assert c.stop_reason() is None  # too little evidence yet
        return c.stop_reason()

    reason = fed(0.030)
    assert reason and "costs more than it saves" in reason and "30 ms keeping its state" in reason
    # under 1% of a step (UPKEEP_SHARE), an unlucky stretch of its drafts does not switch it off
    assert fed(0.0005) is None and fed(0.030, fixed=True) is None


def test_a_strategy_that_would_cost_a_few_percent_is_judged_not_to_pay():
    """The shipped MTP head on lavapipe: a_1 ~0.3, ~5 ms a draft, ~1 ms upkeep a step; no k
    repays it, so with it the best is k 0 at ~0.96 of plain. Left on it measured 0.89x (its
    probes and upkeep); a 10% margin kept it on, 3% (the estimates' noise) does not. With
    almost no upkeep (DFlash and MTP write committed positions only when they draft) it stays
    on through an unlucky stretch where its expected a_1 makes a length pay, and is switched off
    where not even that would come within the rate rule's margin: idling still costs its
    captures and probes (the shipped DFlash draft left idling on lavapipe: 0.94x plain over 9
    alternations)."""
    def fed(overhead: float, draft_seconds: float = 0.02) -> str | None:
        c = DraftController(2, CPU)
        for _ in range(40):
            k = c.choose(1000)
            accepted = int(k > 0 and c.total[0] % 3 == 0)  # a_1 ~1/3
            c.update(k, k, accepted, float(np.interp(k + 1, list(CPU), list(CPU.values()))), draft_seconds * k or None)
            c.note_overhead(overhead)
            if c.stop_reason():
                break
        return c.stop_reason()

    assert "costs more than it saves" in (fed(0.003) or "")  # 4.5% of a step
    # 30 ms a draft: 0.90x plain at a_1 0.5 (20 ms: 0.985x, inside the margin: left idling)
    assert "no draft length pays at the a_1 it expects (0.50)" in (fed(0.0005, 0.03) or "")
    assert fed(0.0005, 0.012) is None  # at 0.5 one 12 ms draft pays; at the 1/3 it gets, none does


def test_a_draft_near_break_even_at_its_record_is_not_switched_off_on_a_few_timings():
    """The shipped MTP head on 512-bit lavapipe: 1.16x plain at k 1 (a_1 ~0.45 live, 0.35 on
    its record, a 2-row pass ~1.04x a 1-row one, ~3.7 ms a draft). In one run of five its first
    4 drafts timed a 2-row pass at 1.15x and a draft at 7 ms, k 1 at the record's a_1 came to
    0.98x plain, and it was switched off for the run. Inside the rate rule's margin it stays on;
    well below it (12 ms drafts: 0.89x), off."""
    def judged(draft_seconds: float) -> str | None:
        curve = {1: 0.0325, 2: 0.0375, 4: 0.0445}
        c = DraftController(2, curve)
        c.acceptance.expect(0.35)
        for step in range(16):
            k = int(step % 4 == 0)  # 4 drafts, the first accepted
            c.update(k, k, int(step == 0), curve[k + 1], draft_seconds if k else None)
            c.note_overhead(0.00002)
        return c.stop_reason()

    assert judged(0.007) is None
    assert "no draft length pays at the a_1 it expects (0.35)" in (judged(0.012) or "")


def test_a_strategy_that_only_idles_and_probes_is_switched_off():
    """The shipped DFlash draft on lavapipe (a_1 ~0.25 on its record and live): no k pays, so it
    idles at k 0, probing now and then, and one probe is accepted, so the none-accepted rule
    never fires; its ~0.6 ms of upkeep a step (2.6%) was within the rate rule's margin, and left
    on it ran at 0.91x plain (its probes cost too). No k paying plus upkeep switches it off, once
    its probes have timed a few proposals (the record's a_1 weighs 8 pseudo-counts, so the
    accepted probe lifts it to 0.33, not 0.5, and no k is tried between probes)."""
    lavapipe = {1: 0.0233, 2: 0.0298, 4: 0.0368, 8: 0.0573, 16: 0.099}
    c = DraftController(7, lavapipe, width=lambda n: n if n <= 4 else -(-n // 8) * 8)
    c.acceptance.expect(0.25)
    for step in range(40):
        k = c.choose(1000)
        c.update(k, k, int(k > 0 and c.total[0] == 0), _interp(lavapipe, k + 1), 0.004 if k else None)
        c.note_overhead(0.0006)
        if c.stop_reason():
            break
    assert c.total[1] == 1 and step + 1 <= 36 and "no draft length pays" in c.stop_reason()


def test_a_strategy_none_of_whose_drafts_is_accepted_is_judged_not_to_pay():
    """Its upkeep (captures, commits) hides in the live verify costs, so the rate test alone
    would keep a never-right draft on at ~0.9x plain: no acceptance in 4+ drafts is enough."""
    c = DraftController(4, CPU)
    for i in range(20):
        k = c.choose(1000)
        c.update(k, k, 0, CPU[1] if not k else CPU[min(CPU, key=lambda n: abs(n - k - 1))], 0.001)
        if c.stop_reason():
            break
    assert i + 1 == 16 and "none of its" in c.stop_reason() and c.total[0] >= 4 and c.total[1] == 0
    lucky = DraftController(4, CPU)
    for _ in range(20):
        k = lucky.choose(1000)
        lucky.update(k, k, int(k > 0 and lucky.total[1] == 0), CPU[1] if not k else CPU[2], 0.001)
    assert lucky.total[1] == 1 and lucky.stop_reason() is None  # one accepted draft: judged by its rate


LAVAPIPE = {1: 0.0251, 2: 0.0297, 4: 0.0368, 8: 0.0573, 16: 0.099}  # bench spec, MTP at k 1


def test_a_drafts_record_outweighs_its_first_misses():
    """The shipped DFlash draft (a_1 0.43 on its record, ~0.5 on bench spec's prompt, where k 1
    pays from 0.30) had its first draft, a function body's first token, rejected: with the record
    worth 2 pseudo-counts that put a_1 at 0.29, it idled and probed and ran at 0.94-1.02x plain
    where k 1 gives 1.14-1.15x. The record, measured over thousands of drafts, now weighs 8; a
    guess (no record: 0.5) still 2, so a draft nobody measured yields to evidence as fast."""
    def k_after(misses, record):
        c = DraftController(1, LAVAPIPE)
        if record is not None:
            c.acceptance.expect(record)
        for _ in range(misses):
            c.update(1, 1, 0, LAVAPIPE[2], 0.003)
        return c.choose(1000)
    assert [k_after(m, 0.43) for m in range(6)] == [1, 1, 1, 1, 0, 0]
    assert [k_after(m, None) for m in range(4)] == [1, 1, 0, 0]


def test_how_many_misses_switch_a_draft_off_follows_what_it_expects():
    """The shipped MTP head (a_1 0.35 on its record) had none of its first 5 drafts accepted on
    bench spec's prompt (a 12% chance at that a_1), was switched off by a 4-draft rule, and paid
    1.07x there at k 1. None accepted of n drafts must be unlikely (2%) for the a_1 it expects."""
    def misses(prior, n):
        c = DraftController(1, LAVAPIPE)
        if prior is not None:
            c.acceptance.expect(prior)
        for step in range(16):  # n rejected single drafts, then plain steps
            c.update(int(step < n), int(step < n), 0, LAVAPIPE[2 if step < n else 1], 0.001 if step < n else None)
            c.note_overhead(0.0001)
        reason = c.stop_reason() or ""
        return c.acceptance.stop_drafts(), reason.startswith("none of its")
    assert misses(0.35, 5) == (10, False) and misses(0.35, 10) == (10, True)
    assert misses(None, 5) == (6, False) and misses(None, 6) == (6, True)
    assert misses(0.9, 4) == (4, True) and misses(0.0, 15)[0] == 16


def test_the_controllers_arithmetic_is_numpys():
    """_lerp and argmax replace np.interp and np.argmax per step (their call cost was 2% of a
    lavapipe decode step): the same bits and the same index, so no choice moves."""
    from vkdflash.spec.costs import _lerp, argmax
    rng = np.random.default_rng(3)
    for _ in range(200):
        xs = np.sort(rng.choice(np.arange(1, 80), size=int(rng.integers(2, 8)), replace=False)).astype(float)
        ys = rng.random(len(xs)) * 0.1
        for x in np.concatenate([xs, rng.uniform(0, 90, 20)]):
            assert _lerp(float(x), xs.tolist(), ys.tolist()) == float(np.interp(x, xs, ys))
        values = rng.integers(0, 4, 9).astype(float).tolist()
        assert argmax(values) == int(np.argmax(values))


def test_a_longer_draft_is_never_priced_below_a_shorter_one():
    """Draft timings that fall with k (the first k 1 proposal paid a compile: 656 ms, then k 3
    422 ms) once extrapolated to a negative cost at k 14, and the controller drafted 14 at a_1 0.5."""
    c = DraftController(16, CPU)
    c.update(1, 1, 1, CPU[2], 0.656)
    c.update(3, 3, 0, CPU[4], 0.422)
    costs = [c.c_draft(k) for k in range(1, 17)]
    assert all(0.0 <= a <= b for a, b in zip(costs, costs[1:]))
    assert c.choose(14) == 0


def test_without_a_curve_it_decodes_plain_until_one_is_measured():
    c = DraftController(8, None)
    c.acceptance.expect(0.5)
    assert c.choose(1000) == 0 and not c.measuring_pays(1000, 3.0, 28)  # no 1-row pass timed yet
    c.update(0, 0, 0, 0.02, None)
    # E(8) at a_j 0.5 is ~2: 100 tokens at 20 ms save at most ~1 s, measuring costs 3.56 s
    assert not c.measuring_pays(100, 3.0, 28)
    assert "(once, ~3.6 s) would cost more than 100 tokens could save (at most 1.0 s)" in c.unmeasured
    assert c.measuring_pays(1000, 3.0, 28)  # ~10 s
    assert c.choose(1000) == 0 and c.stop_reason() is None and c.summary()["expected_tps"] is None
    c.finish()  # nothing to persist: no persist callback is even needed
    c.measured({1: 0.02, 2: 0.021, 4: 0.023})
    assert c.unmeasured is None and c.choose(1000) > 0 and c.summary()["expected_tps"] > c.summary()["plain_tps"]


def test_measuring_an_unknown_curve_is_bounded_by_the_kernels_guess():
    """Priced as free passes, 500 tokens at a_1 0.52 could save ~45% and a 1000-token default run
    measured at its 236th token and lost 20%; at lavapipe's slot model (2 rows 1.2x, 3 rows 1.4x)
    the best length saves ~22%, so a measurement of ~2.7 s waits for ~500 tokens."""
    def pays(room: int, guess=None) -> bool:
        c = DraftController(16, None, guess=guess)
        c.acceptance.expect(0.52)
        c.update(0, 0, 0, 0.025, None)
        return c.measuring_pays(room, 2.2, 21)

    slots = {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6}
    lavapipe = lambda rows: slots.get(rows, 0.8 + 0.2 * rows)  # noqa: E731
    assert pays(300) and not pays(300, lavapipe) and not pays(450, lavapipe) and pays(600, lavapipe)


def test_cost_rules_wait_for_a_few_timed_drafts():
    """A 1000-token default MTP run measured its curve at the 261st token (2 rows at 1.42x, a noisy
    spell), drafted 4 times and was switched off on its one timed draft, 8.3 ms where drafts take
    ~3: k 1 paid 1.15x plain there. One timing prices nothing; three of them at that cost do."""
    c = DraftController(16, None)
    c.acceptance.expect(0.52)
    for _ in range(257):
        c.update(0, 0, 0, 0.0216, None)
    c.measured({1: 0.0216, 2: 0.0306, 4: 0.0484})
    for i, (accepted, draft) in enumerate([(1, None), (1, None), (0, 0.0083), (0, None)]):
        c.update(1, 1, accepted, 0.0298 if i % 2 else None, draft)
    assert c.stop_reason() is None
    for _ in range(2):
        c.update(1, 1, 1, 0.0298, 0.0083)
        c.update(1, 1, 0, 0.0298, 0.0083)
    assert "costs more than it saves" in (c.stop_reason() or "")


def test_a_slow_spell_in_one_width_does_not_switch_a_paying_draft_off():
    """A 1000-token default MTP run (cached curve: 2 rows 1.21x one row) drafted k 1 at a_1 ~0.5
    with 2-row passes ~29 ms and 1-row ones ~25; a slow spell put its recent 2-row passes at ~40 ms
    while the few 1-row ones between them stayed at ~25, and it was switched off for the run
    (k 1 priced at 0.86x plain) though over the run 2 rows cost 1.15x one row and k 1 paid ~1.1x.
    The verdict takes the curve's shape where the live one is dearer; choose() still idles
    through the spell at live prices. A draft that costs too much is still switched off."""
    def judged(spell_seconds: float, draft_seconds: float) -> tuple:
        c = DraftController(16, {1: 0.0197, 2: 0.0238, 4: 0.0338})
        c.acceptance.expect(0.52)
        for step in range(60):
            one_row = step % 4 == 3
            slow = step >= 40
            c.update(0 if one_row else 1, 0 if one_row else 1, int(step % 2 == 0 and not one_row),
                     0.0245 if one_row else (spell_seconds if slow else 0.029), None if one_row else draft_seconds)
            c.note_overhead(0.00002)
        return c.stop_reason(), c.choose(500, done=500)

    assert judged(0.040, 0.003) == (None, 0)  # idles through the spell, stays on
    assert judged(0.029, 0.003)[1] == 1  # outside it, k 1 pays
    assert "costs more than it saves" in (judged(0.040, 0.012)[0] or "")


def test_drafts_are_priced_as_an_earlier_run_timed_them_until_this_one_does():
    """Priced free until timed, the default MTP head's k 1 looked to save 5 ms a token on lavapipe
    where it saves ~2.4 (drafts ~3 ms), and a cold run bought compiles it could not repay."""
    c = DraftController(4, CPU)
    assert c.c_draft(1) == 0.0 and c.drafts.learned() == {}
    c.drafts.prior({1: 0.003, 2: 0.0025})
    assert c.c_draft(1) == 0.003 and c.c_draft(2) == 0.003  # never cheaper for more drafts
    for seconds in (0.005, 0.006, 0.007):
        c.update(1, 1, 1, CPU[2], seconds)
    assert c.c_draft(1) == 0.006 and c.drafts.learned() == {1: 0.006}  # its own timings win


def test_a_longer_draft_is_tried_only_where_the_kernels_guess_says_it_could_pay():
    """After a step whose drafts all held the controller tries 2k + 1 to learn its cost. The MTP
    head on lavapipe (a_1 ~0.5, its chained second draft rarely right) tried 3 after each accepted
    single draft, compiling 4- and 8-row passes no rate chose. At the kernels' guess of those
    passes 3 drafts at its acceptance cannot pay, so it no longer tries them; drafts that are
    mostly right (ngram on repeating code) still do where the cached shape is too dear."""
    slots = {1: 1.0, 2: 1.2, 3: 1.6, 4: 1.6}
    lavapipe = lambda rows: slots.get(rows, 0.8 + 0.2 * rows)  # noqa: E731
    priced = {n: 0.025 * lavapipe(n) for n in (1, 2, 4, 8, 16)}

    def tried(curve: dict, right: float) -> set:
        width = lambda n: 1 << (n - 1).bit_length()  # noqa: E731 -- 3 rows cost what 4 do
        c, r, seen = DraftController(16, curve, guess=lavapipe, width=width), np.random.default_rng(1), set()
        c.acceptance.expect(right)
        for _ in range(60):
            k = c.choose(1000)
            seen.add(k)
            accepted = 0
            while accepted < k and r.random() < (right if accepted == 0 else right / 10 if right < 0.8 else right):
                accepted += 1
            c.update(k, k, accepted, priced[width(k + 1)], 0.003 * k or None)
        return seen

    assert not tried(priced, 0.5) & {3, 7}
    stale = {n: s * (1 if n == 1 else 2) for n, s in priced.items()}  # n-row passes cached 2x dearer
    assert max(tried(stale, 0.9)) >= 3


def test_a_run_that_contradicts_the_drafts_record_is_priced_by_its_own_rate():
    """The negative control (unrotated injection into a q4_0 draft cache): the shipped DFlash
    draft's record says a_1 0.43 and the run got ~0.1; the record's 8 pseudo-counts outweighed
    the decayed evidence, so it kept drafting through a 128-token run at 0.93x plain and was never
    switched off. Fewer first drafts accepted than a draft of the record's a_1 gets 0.2% of the
    time now drop the record: a_1 starts from the run's rate, and where no length pays there, it
    stops. A run like its record keeps it; a fixed length prices nothing, so drops nothing."""
    def run(accepted_at, drafts: int, fixed: bool = False):
        c = DraftController(1, LAVAPIPE, fixed=fixed)
        c.acceptance.expect(0.43)
        for i in range(drafts):
            c.update(1, 1, int(accepted_at(i)), LAVAPIPE[2], 0.003)
            c.note_overhead(0.00002)
        return c, c.acceptance

    c, a = run(lambda i: i % 8 == 0, 23)  # every eighth first draft right: 3 of 23
    assert a.disowned is None and a.record == 0.43 and c.stop_reason() is None
    c, a = run(lambda i: i % 8 == 0, 24)
    assert a.disowned.startswith("3 of its 24 first drafts accepted") and a.record is None
    assert a.first_prior == 0.125 and a.expected == 0.43 and c.summary()["record_dropped"] == a.disowned
    assert "no draft length pays at the a_1 it expects (0.12)" in c.stop_reason()
    c, a = run(lambda i: i * 43 % 100 < 43, 400)  # 0.43, evenly spread
    assert a.disowned is None and a.record == 0.43 and c.stop_reason() is None
    c, a = run(lambda i: False, 40, fixed=True)
    assert a.disowned is None and a.record == 0.43


def test_the_record_check_is_the_binomial_tail():
    """_unlikely(x, n, a, chance): P(X <= x) < chance for X ~ Binomial(n, a), summed exactly here,
    including long runs where (1 - a)^n underflows a float."""
    from math import comb

    from vkdflash.spec.acceptance import _unlikely
    for n in (1, 5, 24, 97):
        for x in range(n + 1):
            for a in (0.1, 0.43, 0.9):
                tail = sum(comb(n, i) * a ** i * (1 - a) ** (n - i) for i in range(x + 1))
                for chance in (0.002, 0.02, 0.5):
                    assert _unlikely(x, n, a, chance) == (tail < chance), (x, n, a, chance)
    assert _unlikely(300, 2000, 0.43, 0.002) and not _unlikely(850, 2000, 0.43, 0.002)


def test_a_cascades_parts_each_get_the_length_their_own_acceptance_pays():
    """ngram+mtp on the bench prompt: the copy right on ~90% of its drafts, the head on ~40%; one
    length for both held the copy at the head's k ~1."""
    c, r = DraftController(8, CPU), np.random.default_rng(0)
    assert c.part_lengths(64) == {}  # no part seen yet: each drafts choose()'s k
    for step in range(120):
        source, p = ("copy", 0.9) if step % 2 else ("head", 0.4)
        accepted = 0
        while accepted < 8 and r.random() < p:
            accepted += 1
        c.update(8, 8, accepted, CPU[8], 0.0, source, 8)
    lengths = c.part_lengths(64)
    assert lengths["copy"] >= 4 and lengths["head"] <= 2 and lengths["copy"] > c.choose(64)
    for part in c.parts:
        rates = c.rates(8, part=(c.parts[part].acceptance, c.parts[part].drafts))
        assert lengths[part] == int(np.argmax(rates)), part
    assert DraftController(8, CPU, fixed=True).part_lengths(64) == {}  # a fixed length is every part's


def test_a_cascade_part_held_at_length_0_is_probed_and_waits_longer_after_a_miss():
    c = DraftController(8, CPU)
    for _ in range(40):
        c.update(4, 4, 0, CPU[4], 0.0, "copy", 4)  # never right
    waits = []
    for _ in range(3):
        steps = 1
        while c.part_lengths(64)["copy"] == 0:
            steps += 1
        waits.append(steps)
        c.update(1, 1, 0, CPU[2], 0.0, "copy", 1)
    assert waits == [8, 16, 32]


def test_a_cascade_part_is_priced_from_its_own_record_and_costs_and_loses_a_record_the_run_contradicts():
    """The head's record and proposal costs price its part (a bare part priced its drafts free); a
    run that contradicts its record drops it there, as for a lone strategy; the copy's misses never
    drop the cascade's own record (the head's)."""
    c = DraftController(8, CPU)
    c.acceptance.expect(0.43)
    c.part_priors = {"dflash": (0.43, {1: 0.004, 4: 0.006}), "copy": (None, {})}
    c.update(1, 1, 0, CPU[2], None, "dflash", 1)
    head = c.parts["dflash"]
    assert head.acceptance.record == 0.43 and head.drafts.cost(4) == pytest.approx(0.006)
    r = np.random.default_rng(1)
    for _ in range(60):
        c.update(1, 1, int(r.random() < 0.1), CPU[2], 0.004, "dflash", 1)
        c.update(4, 4, 0, CPU[4], 0.0, "copy", 4)
    assert head.acceptance.record is None and "first drafts accepted" in head.acceptance.disowned
    assert c.acceptance.record == 0.43  # the whole's is judged through its part, not by the copy's misses


def test_a_cascade_part_probes_a_compiled_length():
    """A part held at 0 probes as choose() does: not a length whose pass would compile (a 2-row
    pass, ~1.6 s on lavapipe, in a 40-token run)."""
    c = DraftController(8, CPU)
    for _ in range(40):
        c.update(4, 4, 0, CPU[4], 0.0, "copy", 4)
    setup = lambda rows: 1.6 if rows == 2 else 0.0  # noqa: E731
    probes = [k for k in (c.part_lengths(40, setup)["copy"] for _ in range(30)) if k]
    assert probes and 1 not in probes


def test_a_strategy_that_proposes_on_a_third_of_the_steps_is_priced_by_the_steps_it_proposes_on():
    """A lookup (ngram) silent where the text does not repeat: priced as if it drafted every step it
    was asked, it bought a 4-row and a 2-row verify's compiles (1.7 s) in a 256-token chat story
    where it proposed on a third of the steps (11.7 s against 9.2 s plain). A step it is silent on
    runs plain decoding's pass, so when it does propose its drafts still pay."""
    def run(silent_every: int) -> DraftController:
        c, r = DraftController(4, CPU), np.random.default_rng(3)
        for step in range(120):
            if step % 3 and silent_every:
                c.update(1, 0, 0, CPU[1], 0.0)  # asked, proposed nothing: a 1-row pass
                continue
            c.update(1, 1, int(r.random() < 0.6), CPU[2], 0.0)
        return c

    always, sparse = run(0), run(3)
    assert always.acceptance.offered() == pytest.approx(1.0)
    assert sparse.acceptance.offered() == pytest.approx(1 / 3, abs=0.1)
    assert min(always.acceptance.estimate()[0], sparse.acceptance.estimate()[0]) > 0.4  # drafts of a_1 0.6
    gain = [c.expected_rate(1) / c.plain_rate() - 1 for c in (always, sparse)]
    assert 0 < gain[1] < 0.5 * gain[0]
    setup = lambda rows: 0.0 if rows == 1 else 1.0  # noqa: E731 -- compiling a verify width
    assert always.choose(200, setup, done=100) > 0 and sparse.choose(200, setup, done=100) == 0
    assert sparse.choose(200) > 0  # compiled: whenever it proposes, its drafts pay
    # the stop rules judge the drafts it made, not the text's repeats: a draft as good as its
    # record is one that proposes when asked
    assert sparse.rates(4, np.zeros((4, 2)))[1] == pytest.approx(always.rates(4, np.zeros((4, 2)))[1])


def test_a_draft_in_hand_caps_k_and_is_priced_as_proposed():
    """A free strategy's draft, proposed before the choice: k is at most its length, and a step
    with none is plain without counting as a choice; a compile is still weighed at the share of
    steps that have a draft, so a lookup silent on most of a text buys none."""
    c = trained(GPU, 0.9)
    chosen = len(c.chosen)
    assert c.choose(64, in_hand=3) == 3 and c.choose(64, in_hand=0) == 0 and len(c.chosen) == chosen + 1
    assert DraftController(6, CPU, fixed=True).choose(10, in_hand=2) == 6  # --draft-fixed asks for k_max
    sparse = DraftController(4, CPU)
    for step in range(120):  # a draft in hand on every third step, counted once whatever k is
        k = sparse.choose(200, in_hand=0 if step % 3 else 1)
        sparse.update(k, k, int(k and step % 5 < 3), CPU[k + 1], 0.0 if k else None)
    assert sparse.acceptance.offered() == pytest.approx(1 / 3, abs=0.1)
    assert sparse.rates(1, in_hand=True)[1] > sparse.rates(1)[1]
    setup = lambda rows: 0.0 if rows == 1 else 1.0  # noqa: E731 -- compiling a verify width
    assert sparse.choose(200, setup, done=100, in_hand=4) == 0
    assert sparse.choose(200, in_hand=4) > 0


def test_a_draft_in_hand_is_taken_whole_where_that_prices_near_the_best():
    """A shorter k than the rate's best would leave the draft's rest to a short step of its own."""
    c = trained(CPU, 0.7)
    rates = c.rates(8, in_hand=True)
    best = int(np.argmax(rates))
    assert 0 < best < 8 and rates[best + 1] >= WHOLE_DRAFT * rates[best] > rates[best + 2]
    assert c.choose(64, in_hand=8) == best + 1


def test_a_shadow_or_a_cascade_part_that_proposes_nothing_counts_as_asked():
    c = DraftController(4, CPU)
    for _ in range(6):
        c.shadowed([], 0.0, True)
    assert c.acceptance.offered() < 0.5
    c.new_request()
    assert c.acceptance.offered() == 1.0  # the next request's text may repeat
    for _ in range(10):
        c.update(2, 2, 1, CPU[4], 0.0, "model", 2, declined=("copy",))
    assert c.parts["copy"].acceptance.offered() < 0.3 and c.parts["model"].acceptance.offered() == pytest.approx(1.0)
    assert c.acceptance.offered() == pytest.approx(1.0)  # the cascade as a whole proposed each time


def test_a_compile_is_bought_on_what_the_evidence_supports_not_on_one_lucky_draft():
    """A position with no evidence leans on the one before it: one shadow whose three drafts all
    matched put ngram's a_2 and a_3 at 0.73 and 0.82 in a chat story (the run's drafts then got 0.07
    and 0) and bought a 4-row verify's compile. A compile is sunk, so a length that needs one is
    priced with a_j (j >= 2) a standard deviation below its mean, as this run's drafts there weigh it."""
    def trained(long_drafts: int) -> DraftController:
        c = DraftController(4, CPU)
        for i in range(10):
            c.update(1, 1, int(i % 5 < 3), CPU[2], 0.0)  # a_1 ~0.6 over ten first drafts
        for i in range(long_drafts):
            c.update(3, 3, 1 if i % 4 == 3 else 3, CPU[4], 0.0)  # the first one all held
        return c

    setup = lambda rows: 0.0 if rows == 1 else 2.0  # noqa: E731
    lucky, steady = trained(1), trained(30)
    rates = lucky.rates(4)
    assert min(100 / rates[j] + 2.0 for j in range(1, 5)) < 100 / rates[0], "priced at the means, it would buy"
    assert lucky.choose(200, setup, done=100) == 0
    assert lucky.choose(200) > 0  # compiled already: the means choose, as before
    mean, cautious = steady.acceptance.estimate(), steady.acceptance.estimate(cautious=True)
    assert cautious[0] == mean[0] and np.all(mean[1:3] - cautious[1:3] < 0.1)
    assert steady.choose(200, setup, done=100) > 0


def test_a_cascade_parts_first_proposal_is_priced_against_that_parts_drafts_alone():
    """ngram+mtp in a cold process: the head's first proposal compiles its kernels (~2 s on
    lavapipe). Priced as the cascade's, it held the free copy at 0 through a 300-token run the copy
    alone made 1.3x faster; each part now pays only its own."""
    c = DraftController(8, CPU)
    c.part_priors = {"copy": (None, {}), "head": (0.45, {1: 0.004, 2: 0.006})}
    cold = {"copy": 0.0, "head": 2.0}
    k = c.choose(200, None, 100, cold)
    assert c.lengths["copy"] > 0 and c.lengths["head"] == 0 and k == c.lengths["copy"]
    assert c.choose(200, None, 100, {"copy": 2.0, "head": 2.0}) == 0 and c.lengths == {"copy": 0, "head": 0}
    c.choose(200, None, 100, {"copy": 0.0, "head": 0.0})
    assert c.lengths["head"] > 0  # once it has proposed (or where a long run repays it)
    c.served = 20000
    c.choose(200, None, 100, cold)
    assert c.lengths["head"] > 0
    assert c.choose(200, None, 100) == c.chosen[-1] and c.lengths == {}  # not a cascade's call: one length


def test_a_cascades_shadows_teach_the_part_that_proposed_them_and_leave_the_wholes_record():
    """Unverified, a copy's drafts left it priced at a_1's prior of 0.5 where they matched 97% of
    the time; and the copy's unmatched shadows in a chat answer dropped the cascade's record (the
    head's 0.52) and switched the cascade off."""
    c = DraftController(4, CPU)
    c.acceptance.expect(0.52)
    c.part_priors = {"copy": (None, {}), "head": (0.52, {})}
    for _ in range(30):
        c.shadow = 2
        c.shadowed([7, 8], 0.0001, True, "copy", ())
        c.committed([7, 8, 9])
    copy = c.parts["copy"].acceptance
    assert copy.estimate()[0] > 0.9 and copy.offered() > 0.9
    for _ in range(60):
        c.shadowed([7, 8], 0.0001, True, "copy", ())
        c.committed([1])
    assert c.acceptance.record == 0.52 and c.parts["copy"].acceptance.estimate()[0] < 0.2
    offered = copy.offered()
    c.shadowed([], 0.0001, True, "", ("copy",))
    assert copy.offered() < offered  # asked and silent counts too
    assert "head" not in c.parts or c.parts["head"].acceptance.run_counts.sum() == 0
