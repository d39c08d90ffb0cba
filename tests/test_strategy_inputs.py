"""What a strategy hands the core is checked where it enters: cache shapes and buffer sizes,
proposals, declared attributes, writes into the target's weights and KV positions. A bad one is
one line (the strategy cannot start, or is switched off), never a traceback or a crash, and
greedy output stays --spec none's."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import test_spec
from kv_probe import HD, N_CTX, N_HEAD_KV, Probe, rows
from vkdflash.errors import VkdflashError
from vkdflash.kernels.copy import copy
from vkdflash.kv_cache import KVCache
from vkdflash.model.forward import Model
from vkdflash.model.store import DeviceStore
from vkdflash.runtime.graph import Graph
from vkdflash.sampling import Sampler
from vkdflash.spec import Proposal, SpecStats, Strategy, StrategyOptions
from vkdflash.spec.engine import Speculator

PROMPT, target = test_spec.PROMPT, test_spec.target  # the same tiny target (its own instance here)


def run(model, tok, factory=None, n=24, sampler=None):
    """Generated ids and the strategy's stats (plain decoding without a factory)."""
    return test_spec.run(model, tok, factory, n=n, draft_max=4, sampler=sampler)


def cannot_start(model, factory) -> str:
    with pytest.raises(VkdflashError) as err:
        Speculator(model, "odd", factory, StrategyOptions(draft_max=4), SpecStats())
    assert "\n" not in str(err.value)
    return str(err.value)


class Makes(Strategy):
    """Runs `make(ctx)` as it starts (a factory's work), drafting nothing."""

    def __init__(self, ctx, make):
        make(ctx)

    def propose(self, ctx, last_token, max_n):
        return Proposal([])


# -- 1. cache shapes and buffer sizes ----------------------------------------------

def test_a_zero_sized_cache_or_buffer_is_one_error_not_a_crash():
    """Vulkan's bind of a 0-byte buffer crashed the process (exit 139): run in a child process,
    so the crash fails this test instead of ending the run."""
    child = textwrap.dedent("""
        from types import SimpleNamespace
        from conftest import DEVICES, context_for
        from vkdflash.errors import VkdflashError
        from vkdflash.spec import StrategyContext, StrategyOptions
        ctx = context_for(DEVICES[0].index)
        sctx = StrategyContext(gpu=ctx, target=SimpleNamespace(n_ctx=64), options=StrategyOptions())
        for make in (lambda: sctx.create_kv_cache(1, 0, 64), lambda: sctx.create_kv_cache(1, 3, 0),
                     lambda: ctx.buffer(0)):
            try:
                make()
                print("made")
            except VkdflashError as exc:
                print(exc)
        """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [
        "the draft KV cache's n_head_kv must be a whole number in 1..1024, not 0",
        "the draft KV cache's head_dim must be a whole number in 1..256, not 0",
        "a buffer needs a positive whole number of bytes, not 0"]


@pytest.mark.parametrize("n_ctx, why", [
    (-5, "n_ctx must be a whole number in 1..67108864, not -5"),
    (0, "n_ctx must be a whole number in 1..67108864, not 0"),
    (10 ** 8, "n_ctx must be a whole number in 1..67108864, not 100000000"),
    (2 * 10 ** 6, "needs 256000000 bytes a layer for K, more than the device's storage range"),
])
def test_a_strategy_cache_of_an_impossible_context_cannot_start(target, n_ctx, why):
    model, _ = target
    line = cannot_start(model, lambda ctx: Makes(ctx, lambda c: c.create_kv_cache(1, 1, 64, n_ctx=n_ctx)))
    assert line.startswith("strategy odd could not start: the draft KV cache") and why in line


def test_a_cache_shape_that_is_no_whole_number_is_refused(ctx0):
    for shape in [(1.5, 8, 1, 64), (True, 8, 1, 64), (1, 8, 2000, 64), (1, 8, 1, 512)]:
        with pytest.raises(VkdflashError, match="must be a whole number"):
            KVCache(ctx0, *shape)


def test_a_buffer_size_must_be_a_positive_whole_number(ctx0):
    for nbytes in (-16, 2.5, "64"):
        with pytest.raises(VkdflashError, match="a buffer needs a positive whole number of bytes"):
            ctx0.buffer(nbytes)
    with pytest.raises(VkdflashError, match="a buffer needs a positive whole number of bytes"):
        DeviceStore(ctx0).buffer(-1)


def test_out_of_device_memory_says_how_many_bytes_were_asked_for(ctx0):
    with pytest.raises(VkdflashError, match=r"^out of device memory: a buffer of 17592186044416 bytes "
                                            r"\(16777216\.0 MiB\) was asked for \(VkError"):
        ctx0.buffer(1 << 44)


# -- 2. proposals -------------------------------------------------------------------

class Returns(Strategy):
    """Proposes whatever `make(last_token, max_n, n_vocab)` returns."""

    def __init__(self, make):
        self.make = make

    def propose(self, ctx, last_token, max_n):
        return self.make(last_token, max_n, ctx.target.n_vocab)


@pytest.mark.parametrize("make, why", [
    (lambda t, n, v: [t], "propose returned list, not a Proposal"),
    (lambda t, n, v: None, "propose returned NoneType, not a Proposal"),
    (lambda t, n, v: Proposal(x for x in [1]), "proposed tokens as generator, not a list of token ids"),
    (lambda t, n, v: Proposal(np.array([[1]])), "not a 1-D integer array"),
    (lambda t, n, v: Proposal(np.array([1.0])), "not a 1-D integer array"),
    (lambda t, n, v: Proposal([True]), "not all integers"),
    (lambda t, n, v: Proposal(b"\x01"), "proposed tokens as bytes"),
], ids=["list", "none", "generator", "2-d", "float-array", "bool", "bytes"])
def test_a_proposal_that_is_no_proposal_switches_the_strategy_off(target, make, why):
    model, tok = target
    plain, _ = run(model, tok)
    got, stats = run(model, tok, lambda ctx: Returns(make))
    assert got == plain and stats.drafted == 0 and why in stats.disabled and "\n" not in stats.disabled


class ArrayOracle(Strategy):
    """Drafts the target's own greedy continuation as an int64 array."""

    def __init__(self, reference: list):
        self.reference = np.array(reference)

    def propose(self, ctx, last_token, max_n):
        done = len(ctx.tokens) - len(PROMPT) + 1  # generated tokens including last_token
        return Proposal(self.reference[done:done + max_n])


def test_drafts_in_an_integer_array_are_verified_as_drafts(target):
    """An array of several drafts once raised in the check (`tokens or []`)."""
    model, tok = target
    plain, _ = run(model, tok)
    got, stats = run(model, tok, lambda ctx: ArrayOracle(plain))
    assert got == plain and not stats.disabled and stats.drafted > 0 and stats.accepted == stats.drafted


def test_probabilities_are_checked_against_the_tokens_the_engine_verifies(target):
    """A one-token array with no rows of probabilities once passed as [] drafts and was verified
    as one draft (IndexError in the verifier)."""
    model, tok = target
    got, stats = run(model, tok, lambda ctx: Returns(lambda t, n, v: Proposal(np.array([0]), np.zeros((0, v)))),
                     sampler=Sampler(temp=0.7, seed=3))
    assert len(got) == 24 and stats.drafted == 0
    assert stats.disabled.startswith("draft probabilities have shape (0, ")


def test_a_checked_proposal_is_what_the_engine_uses():
    from vkdflash.spec.strategy import InvalidProposal, checked_proposal
    prop = checked_proposal(Proposal(np.array([3, 1, 2], np.uint16)), 4, 10)
    assert prop.tokens == [3, 1, 2] and all(type(t) is int for t in prop.tokens) and prop.probs is None
    probs = np.full((2, 10), 0.1, np.float32)
    assert checked_proposal(Proposal((4, 5), probs), 2, 10).probs is probs
    assert checked_proposal(Proposal(range(2)), 2, 10).tokens == [0, 1]
    with pytest.raises(InvalidProposal, match=r"^draft probabilities are not all finite and non-negative: "
                                              r"not a numeric array \(dtype bool\)$"):
        checked_proposal(Proposal([1], np.ones((1, 10), bool)), 2, 10)


# -- 3. declared attributes --------------------------------------------------------

class Declares(Strategy):
    def __init__(self, **attributes):
        for key, value in attributes.items():
            setattr(self, key, value)

    def propose(self, ctx, last_token, max_n):
        return Proposal([])


A1 = "expected_first_acceptance must be None or a number in 0..1,"


@pytest.mark.parametrize("attributes, why", [
    (dict(capture_layers=5), "capture_layers must be target layer-input ids in 0..2, not 5"),
    (dict(capture_layers=("x",)), "capture_layers must be target layer-input ids in 0..2, not ('x',)"),
    (dict(capture_layers=(99,)), "capture_layers must be target layer-input ids in 0..2, not (99,)"),
    (dict(capture_layers=(True,)), "capture_layers must be target layer-input ids in 0..2, not (True,)"),
    (dict(expected_first_acceptance="high"), f"{A1} not 'high'"),
    (dict(expected_first_acceptance=float("nan")), f"{A1} not nan"),
    (dict(expected_first_acceptance=1.5), f"{A1} not 1.5"),
    (dict(longest_draft=True), "longest_draft must be None or a positive whole number, not True"),
    (dict(longest_draft=0), "longest_draft must be None or a positive whole number, not 0"),
    (dict(longest_draft=2.0), "longest_draft must be None or a positive whole number, not 2.0"),
    (dict(free_proposals="yes"), "free_proposals must be True or False, not 'yes'"),
    (dict(free_proposals=1), "free_proposals must be True or False, not 1"),
])
def test_a_bad_declared_attribute_is_one_line_as_the_strategy_starts(target, attributes, why):
    model, _ = target
    assert cannot_start(model, lambda ctx: Declares(**attributes)) == f"strategy odd could not start: {why}"


def test_declared_attributes_of_numpy_types_are_taken(target, caplog):
    model, _ = target
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        spec = Speculator(model, "np", lambda ctx: Declares(capture_layers=np.array([0, 2]), longest_draft=np.int64(2),
                                                            expected_first_acceptance=np.float32(0.5)),
                          StrategyOptions(draft_max=4), SpecStats())
    spec.close()
    assert spec.capture == (0, 2) and spec.stats.draft_max == 2 and spec.expected == 0.5


# -- 4. the target's weights -------------------------------------------------------

class Writes(Strategy):
    """Overwrites one of the target's borrowed weights as it begins."""

    def __init__(self, pick):
        self.pick = pick

    def begin(self, ctx):
        buffer = self.pick(ctx.target)
        buffer.write(np.zeros(buffer.nbytes // 4, np.float32))

    def propose(self, ctx, last_token, max_n):
        return Proposal([])


@pytest.mark.parametrize("pick, name", [
    (lambda t: t.output_norm, "output_norm.weight"),
    (lambda t: t.token_embd.buffer, "token_embd.weight"),
    (lambda t: t.output.buffer, "output.weight"),
], ids=["output_norm", "token_embd", "output"])
def test_a_strategy_cannot_write_the_targets_weights(target, pick, name):
    assert why_switched_off(target, lambda ctx: Writes(pick)) == f"this buffer is the target's weight {name}: read only"


def why_switched_off(target, factory) -> str:
    """Greedy output before, with and after a strategy that writes a weight is the same; why the
    strategy was switched off."""
    shared, tok = target
    model = Model(shared.ctx, shared.mf, n_ctx=128)  # its own copy: the old code changed it for good
    try:
        plain, _ = run(model, tok)
        got, stats = run(model, tok, factory)
        again, _ = run(model, tok)
    finally:
        model.close()
    assert got == plain == again
    return stats.disabled


class GpuWrites(Strategy):
    """Overwrites one of the target's borrowed weights with a kernel of its own as it begins: the
    dispatch binds the weight where the copy kernel stores."""

    def __init__(self, pick):
        self.pick = pick

    def begin(self, ctx):
        dst = self.pick(ctx.target)
        src, g = ctx.gpu.buffer(16), Graph(ctx.gpu)
        try:
            copy(g, src, dst, 16)
            g.run()
        finally:
            g.destroy()

    def propose(self, ctx, last_token, max_n):
        return Proposal([])


@pytest.mark.parametrize("pick, name", [
    (lambda t: t.output_norm, "output_norm.weight"),
    (lambda t: t.output.buffer, "output.weight"),
], ids=["output_norm", "output"])
def test_a_strategys_kernel_cannot_write_the_targets_weights(target, pick, name):
    """Host writes and device copies were refused, a kernel's stores were not: the strategy's
    copy zeroed the norm's weights and greedy output changed for good."""
    why = why_switched_off(target, lambda ctx: GpuWrites(pick))
    assert why.endswith(f"a copy dispatch would store into the target's weight {name} (binding 1), which is read only")
    assert why.startswith("test_strategy_inputs (test_strategy_inputs.py:")  # the call site


def test_uploaded_weights_are_read_only(ctx0, target):
    model, _ = target
    store = DeviceStore(ctx0)
    try:
        vector = store.vector(model.mf.tensor("output_norm.weight"))
        with pytest.raises(VkdflashError, match="^this buffer is a model's weight vector: read only$"):
            vector.write(np.zeros(4, np.float32))
        weight = store.matrix(model.mf.tensor("blk.0.ffn_up.weight"), "up")
        with pytest.raises(VkdflashError, match="^this buffer is the weight up: read only$"):
            weight.buffer.write(np.zeros(4, np.uint8))
        with pytest.raises(VkdflashError, match="^this buffer is the weight up: read only$"):
            ctx0.copy(store.buffer(64, host=True), weight.buffer, 16)  # nor through a device copy
        store.buffer(64).write(np.zeros(16, np.float32))  # scratch memory stays writable
    finally:
        store.close()


# -- 5. KV positions ---------------------------------------------------------------

@pytest.mark.parametrize("positions, why", [
    ([3, 3], "a store names the same cache position twice"),
    ([1.7], "positions must be a 1-D sequence of integers"),
    ([True], "positions must be a 1-D sequence of integers"),
    ([N_CTX], f"cache position {N_CTX} is outside the cache"),
])
def test_a_handle_write_refuses_positions_the_store_cannot_take(ctx0, positions, why):
    probe = Probe(ctx0, "q8_0", "f16")
    try:
        r = np.random.default_rng(0)
        k, v = rows(r, len(positions)), rows(r, len(positions))
        with pytest.raises(VkdflashError, match=why):
            probe.handle.write(ctx0, 0, k, v, positions)
        probe.handle.write(ctx0, 0, k[:1], v[:1], [0])  # and the cache still takes a good write
        probe.expect(0, k[:1], v[:1])
        probe.check_bytes()
    finally:
        probe.close()


# -- 6. what the logs say ----------------------------------------------------------

def test_the_speculation_line_says_when_a_strategy_made_no_draft_cache(target, caplog):
    model, _ = target
    made = []
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        for make in (lambda c: None, lambda c: made.append(c.create_kv_cache(1, N_HEAD_KV, HD, n_ctx=16))):
            Speculator(model, "s", lambda ctx: Makes(ctx, make), StrategyOptions(draft_max=2), SpecStats()).close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speculation:")]
    assert len(made) == 1 and len(lines) == 2
    assert lines[0].endswith("captures none, no draft cache") and "draft cache K" not in lines[0]
    assert lines[1].endswith("captures none, draft cache K f16 V f16")


@pytest.mark.parametrize("ctk, head_dim, rotate, env, note", [
    ("f16", 64, True, None, "K f16 (rotation off: f16 needs none)"),
    ("q8_0", 64, True, None, "K q8_0 (rotation on, n="),
    ("q8_0", 64, False, None, "K q8_0 (rotation off: --no-kv-rotation)"),
    ("q8_0", 64, True, "1", "K q8_0 (rotation off: VKDFLASH_ATTN_ROT_DISABLE=1)"),
    ("q4_0", 32, True, None, "K q4_0 (rotation off: head_dim 32 is not a multiple of 64)"),
])
def test_a_cache_says_why_its_rotation_is_off(ctx0, caplog, monkeypatch, ctk, head_dim, rotate, env, note):
    if env:
        monkeypatch.setenv("VKDFLASH_ATTN_ROT_DISABLE", env)
    else:
        monkeypatch.delenv("VKDFLASH_ATTN_ROT_DISABLE", raising=False)
    with caplog.at_level(logging.INFO, logger="vkdflash"):
        KVCache(ctx0, 1, 8, 1, head_dim, ctk, "f32", rotate, name="probe").destroy()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("probe KV cache:"))
    assert note in line and line.endswith("V f32 (rotation off: f32 needs none)")
