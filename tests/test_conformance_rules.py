"""The conformance harness enforces docs/design.md section 7 itself: NaN anywhere fails,
infinities match in sign, each family at its class's threshold, quantized stores within one
quant step per value and untouched elsewhere, a guard region after every output (side-by-side
outputs and the buffers kernels write on the way included), and every shipped kernel run."""
from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace

import numpy as np
from vkdflash import conformance as cf
from vkdflash.conformance import kv_store as kv_cases, matmul as mm_cases
from vkdflash.kernels.copy import copy
from vkdflash.kernels.types import get_type
from vkdflash.runtime.graph import Graph
from vkdflash.runtime.memory import View, prefers_texel_loads
from vkdflash.runtime.pipelines import shader_writes

CASES = {c.name: c for c in cf.all_cases()}


def _check(metric="nmse", threshold=cf.NMSE_DEFAULT, *arrays):
    return cf.compare(cf.Case("rule", None, metric, threshold), *arrays).ok


def test_nan_anywhere_fails_even_where_the_reference_has_it():
    x = np.array([1.0, np.nan, -2.0], np.float32)
    assert not _check("exact", 0, x, x.copy())  # bit for bit the same NaN: still a failure
    assert not _check("nmse", cf.NMSE_DEFAULT, x, x.copy())
    assert not _check("nmse", cf.NMSE_DEFAULT, np.zeros(3, np.float32), x)  # a reference NaN too


def test_infinities_must_match_in_sign_and_place():
    want = np.array([1.0, np.inf, -np.inf], np.float32)
    assert _check("nmse", cf.NMSE_DEFAULT, want.copy(), want)
    assert not _check("nmse", cf.NMSE_DEFAULT, np.array([1.0, -np.inf, -np.inf], np.float32), want)
    assert not _check("nmse", cf.NMSE_DEFAULT, np.array([1.0, np.inf, 0.0], np.float32), want)


def test_one_quant_step_is_a_bound_per_value_not_an_average():
    want, step = np.zeros(1000), np.full(1000, 0.1)
    one_off = want.copy()
    one_off[7] = 0.1
    assert _check("quant", 0, one_off, want, step)
    one_off[7] = 0.15  # 1.5 steps in one value of a thousand
    assert not _check("quant", 0, one_off, want, step)


def _rule(name: str) -> tuple:
    """What section 7 asks of a case: (metric, NMSE bound or None)."""
    family = name.split("/")[0]
    if family in ("copy", "argmax", "get_rows"):  # get_rows dequantizes bit for bit: stricter than 1e-7
        return "exact", None
    if family == "kv_store":
        return ("quant" if "/iq4_nl/" in name else "exact"), None
    bound = {"softmax": cf.NMSE_SOFTMAX, "matmul": cf.NMSE_MATMUL, "attention": cf.NMSE_ATTENTION}
    return "nmse", bound.get(family, cf.NMSE_DEFAULT)


def test_every_case_is_compared_at_its_class_threshold():
    for name, case in CASES.items():
        metric, bound = _rule(name)
        assert case.metric == metric and (bound is None or case.threshold <= bound), (name, case.metric,
                                                                                        case.threshold)


def _run(ctx, name: str) -> cf.Result:
    return cf.run_case(ctx, CASES[name])


def _overrun(g, view):
    """A deliberately wrong kernel: 16 bytes of 1.0 stored just past the end of `view`."""
    src = g.ctx.upload(np.ones(4, np.float32))
    g.after_run(src.destroy)
    copy(g, src, View(view.buffer, view.offset + view.size, 16), 16)


def test_a_write_past_q_in_a_qkv_matmul_is_caught(ctx, monkeypatch):
    """Q, K and V side by side: before, a write past Q landed in K, which the matmul then
    overwrote, and the case passed."""
    name = "matmul/rope/q4_1/n=1,hd=64"
    assert _run(ctx, name).ok
    split = mm_cases.matmul_split

    def overrunning(g, w, x, outs, *args, **kw):
        _overrun(g, outs[0][1])
        return split(g, w, x, outs, *args, **kw)
    monkeypatch.setattr(mm_cases, "matmul_split", overrunning)
    res = _run(ctx, name)
    assert not res.ok and "guard" in res.detail


def test_a_write_past_the_k_cache_in_a_pair_store_is_caught(ctx, monkeypatch):
    """K and V caches of one store: before, V's cache began right after K's where K's size was a
    multiple of 256 bytes, and V's store overwrote a write past K (this case stores row 0)."""
    name = "kv_store/pair/f32/row_len=64,rows=1,n_ctx=8"
    assert _run(ctx, name).ok
    store = kv_cases.store_rows

    def overrunning(g, src, pos, cache, *args, **kw):
        _overrun(g, cache)
        return store(g, src, pos, cache, *args, **kw)
    monkeypatch.setattr(kv_cases, "store_rows", overrunning)
    res = _run(ctx, name)
    assert not res.ok and "guard" in res.detail


def test_a_guard_after_the_buffers_kernels_write_on_the_way(ctx, monkeypatch):
    """The GLU's up-projection scratch (three-kernel path) is an output too."""
    name = "matmul/glu/q4_1/rows=36,cols=512,n=1"
    glu = mm_cases.glu

    def overrunning(g, gate, up, x, y, n, scratch, *args, **kw):
        _overrun(g, scratch)
        return glu(g, gate, up, x, y, n, scratch, *args, **kw)
    monkeypatch.setattr(mm_cases, "glu", overrunning)
    res = _run(ctx, name)
    assert not res.ok and "guard" in res.detail


def test_an_iq4_nl_store_into_a_row_it_was_not_given_fails(ctx, monkeypatch):
    """Rows a store must leave alone are compared byte for byte: before, they went through the
    one-quant-step allowance, and a stray write one level off passed."""
    name = "kv_store/iq4_nl/row_len=64,rows=1,n_ctx=8"
    assert _run(ctx, name).ok
    launch = kv_cases.launch

    def stray(*args, **kw):
        got = launch(*args, **kw)
        rb = get_type("iq4_nl").row_bytes(64)
        untouched = next(i for i in range(0, got.size, rb) if (got[i:i + rb] == cf.GUARD_BYTE).all())
        got[untouched + 2] += 1  # the first value's index 5 -> 6: one codebook level
        return got
    monkeypatch.setattr(kv_cases, "launch", stray)
    res = _run(ctx, name)
    assert not res.ok and "not given" in res.detail


# the row kernels take their texel variants only where the device prefers texel loads
_PREFERRED_TEXEL = {"argmax_sg_texel", "rms_norm_sg_texel", "rope_texel", "set_rows_texel", "set_rows_kv_texel"}


def test_every_shipped_kernel_is_run_by_a_case(ctx, monkeypatch):
    """Every kernel in the SPIR-V manifest is dispatched by some case on this device, but the texel
    row kernels a device that prefers storage loads never takes (variants no code path can dispatch
    anywhere are not built: mul_mat.comp's `omit`). Recorded without compiling or running anything."""
    shipped = set(json.loads((resources.files("vkdflash") / "spirv" / "manifest.json").read_text()))
    ran = set()

    def pipeline(shader, n_bindings, push_size=0, spec=(), texels=()):
        return SimpleNamespace(shader=shader, n_bindings=n_bindings, push_size=push_size, texels=frozenset(texels),
                               writes=shader_writes(shader), key=(shader, n_bindings, push_size, spec, texels))

    def run(graph):
        ran.update(key[0] for key in graph.kernels())
        for fn in graph._after_run:
            fn()
    monkeypatch.setattr(ctx, "pipeline", pipeline)
    monkeypatch.setattr(Graph, "run", run)
    for case in CASES.values():
        cf.run_case(ctx, case)
    unreachable = set() if prefers_texel_loads(ctx.features) else _PREFERRED_TEXEL
    assert unreachable <= shipped
    assert sorted(shipped - unreachable - ran) == []


def test_inputs_are_seeded_and_uniform_in_minus_one_to_one():
    a, b = cf.rng("rule", 1, 2.0), cf.rng("rule", 1, 2.0)
    assert np.array_equal(cf.uniform(a, 64), cf.uniform(b, 64))
    x = cf.uniform(cf.rng("rule"), 10000)
    assert x.dtype == np.float32 and -1 <= x.min() < -0.99 and 0.99 < x.max() <= 1
