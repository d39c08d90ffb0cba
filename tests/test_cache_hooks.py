"""The cache-write hooks and cache memory under plugin mistakes and misuse: every side door the
issue-7 review found through the documented API is refused with a one-line message, or is
harmless, and a faulty plugin is unregistered with one warning while the run goes on."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gguf_fixtures import write_model
from kv_probe import Probe, queries, reachable_from, rows
from vkdflash import plugins
from vkdflash.errors import VkdflashError
from vkdflash.hookspecs import hookimpl
from vkdflash.kernels.hadamard import fwht
from vkdflash.kernels.kv_store import store_rows
from vkdflash.kv_cache import _caches
from vkdflash.runtime.context import Context
from vkdflash.runtime.graph import Graph
from vkdflash.runtime.memory import Buffer


pytestmark = pytest.mark.usefixtures("fresh_plugins")


def written_and_checked(ctx, probe, plugin=None, name="misbehaving", n=6, seed=0):
    """Register `plugin`, write rows through the handle (device rows), and check the cache holds
    exactly what it would without the plugin."""
    if plugin is not None:
        plugins.manager().register(plugin, name=name)
    r = np.random.default_rng(seed)
    k, v = rows(r, n), rows(r, n)
    kb, vb = ctx.upload(k), ctx.upload(v)
    try:
        probe.handle.write(ctx, 0, kb, vb, np.arange(n))
        assert np.array_equal(kb.read(np.float32).reshape(k.shape), k)
    finally:
        kb.destroy()
        vb.destroy()
    probe.expect(0, k, v)
    probe.check_bytes()
    probe.check_attention(queries(r, 2), n - 2)


def warnings_about(caplog, name):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and f"plugin {name}" in r.getMessage()]


@pytest.fixture
def probe(ctx0):
    p = Probe(ctx0, "q8_0", "q4_0")
    yield p
    p.close()


# -- wrappers that raise or break the protocol: unregistered, one warning, write unchanged ----

class RaisesBefore:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        raise RuntimeError("boom before")
        yield  # noqa: unreachable -- a generator all the same


class RaisesAfter:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        yield
        raise RuntimeError("boom after")


class NeverYields:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        if cache:
            return None
        yield


class YieldsTwice:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        yield
        yield


@pytest.mark.parametrize("plugin,why", [(RaisesBefore(), "raised RuntimeError: boom before"),
                                        (RaisesAfter(), "raised RuntimeError: boom after after the write"),
                                        (NeverYields(), "returned without yielding"),
                                        (YieldsTwice(), "yielded more than once")],
                         ids=["raises before yield", "raises after yield", "never yields", "yields twice"])
def test_a_faulty_wrapper_is_unregistered_with_one_warning_and_the_write_happens(ctx0, probe, caplog, plugin, why):
    written_and_checked(ctx0, probe, plugin)
    assert plugins.manager().get_plugin("misbehaving") is None
    written_and_checked(ctx0, probe, seed=1)  # later writes: no second warning
    msgs = warnings_about(caplog, "misbehaving")
    assert len(msgs) == 1 and why in msgs[0] and "\n" not in msgs[0], msgs


# -- wrappers that try to record into the graph they observe ----------------------------------

class RotatesRowsFirst:
    """Rotates the caller's rows before the core's store: the store would then hold H(Hx) = x."""

    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        fwht(graph, k_rows, k_rows, n_rows, cache.n_head_kv * cache.head_dim, cache.k_rotation)
        return (yield)


class StoresItself:
    """Finds the cache memory by internals and records its own unrotated store."""

    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        c = _caches[cache.key]
        store_rows(graph, k_rows, positions, c.k[layer], n_rows, c.row_len, c.ctk)
        return (yield)


@pytest.mark.parametrize("plugin", [RotatesRowsFirst(), StoresItself()], ids=["rotates rows", "stores itself"])
def test_a_wrapper_cannot_record_into_the_write(ctx0, probe, caplog, plugin):
    written_and_checked(ctx0, probe, plugin)
    msgs = warnings_about(caplog, "misbehaving")
    assert len(msgs) == 1 and "kv_cache_write wrappers run" in msgs[0], msgs
    assert "test_cache_hooks" in msgs[0]  # the call site is named


def test_the_graph_a_wrapper_gets_leads_to_no_cache_memory(ctx0, probe):
    seen = []

    class Looks:
        @hookimpl(wrapper=True)
        def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
            seen.append(graph)
            return (yield)

    written_and_checked(ctx0, probe, Looks())
    graph = seen[0]
    assert not hasattr(graph, "dispatches")
    public = {n: getattr(graph, n) for n in dir(graph) if not n.startswith("_")}
    # the runtime context is the device (no cache memory in it), as in test_plugins
    found = [o for o in reachable_from(list(public.values()), depth=8, skip=lambda o: isinstance(o, Context))
             if isinstance(o, Buffer) and o.owner]
    assert not found


# -- cache memory is owned: refused where recorded, checked where the graph is built ----------

def test_binding_cache_memory_outside_the_cache_is_refused_with_the_call_site(ctx0, probe):
    c = _caches[probe.handle.info.key]
    src, pos = ctx0.upload(np.zeros((1, c.row_len), np.float32)), ctx0.upload(np.zeros(1, np.uint32))
    g = Graph(ctx0)
    with pytest.raises(VkdflashError) as err:
        store_rows(g, src, pos, c.k[0], 1, c.row_len, c.ctk)
    msg = str(err.value)
    assert "q8_0/q4_0 KV cache memory" in msg and "test_cache_hooks" in msg and "\n" not in msg
    with pytest.raises(VkdflashError, match="written only by its own store kernel"):
        c.k[0].write(np.zeros(16, np.uint8))
    g.destroy()
    src.destroy()
    pos.destroy()


def _recorded_write(ctx, probe):
    r = np.random.default_rng(4)
    kb, vb, pb = ctx.upload(rows(r, 2)), ctx.upload(rows(r, 2)), ctx.upload(np.arange(2, dtype=np.uint32))
    g = Graph(ctx)
    probe.handle.record_write(g, 0, kb, vb, pb, 2)
    return g, [kb, vb, pb]


@pytest.mark.parametrize("tamper", ["remove", "replace", "append"])
def test_a_graph_whose_cache_dispatches_were_tampered_with_does_not_run(ctx0, probe, tamper):
    g, bufs = _recorded_write(ctx0, probe)
    store = next(d for d in g._dispatches if d.label.startswith("set_rows"))
    if tamper == "remove":
        g._dispatches.remove(store)
    elif tamper == "replace":  # the same store without the rotation
        unrotated = ctx0.pipeline("set_rows", 3, 20, (32, 8, 0, 1.0))
        g._dispatches[g._dispatches.index(store)] = type(store)(unrotated, *(store.views, store.groups, store.push,
                                                                            store.barrier, store.label))
    else:
        g._dispatches.append(type(store)(store.pipeline, store.views, store.groups, store.push,
                                         store.barrier, "copied"))
    with pytest.raises(VkdflashError, match="q8_0/q4_0 KV cache") as err:
        g.run()
    assert "\n" not in str(err.value)
    g.destroy()
    for b in bufs:
        b.destroy()


# -- registration: only observing wrappers may implement the cache hooks ----------------------

class PlainWrite:
    @hookimpl
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        pass


class FirstWrite:
    @hookimpl(tryfirst=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        pass


class OldStyleWrapper:
    @hookimpl(hookwrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        yield


def _entry_point(name, plugin):
    class EntryPoint:
        dist = None

        def load(self):
            return plugin
    ep = EntryPoint()
    ep.name = name
    return ep


@pytest.mark.parametrize("plugin", [PlainWrite(), FirstWrite(), OldStyleWrapper()],
                         ids=["plain", "tryfirst", "old-style hookwrapper"])
def test_a_non_wrapper_implementation_is_refused_at_registration(ctx0, probe, monkeypatch, caplog, plugin):
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda group: list(real(group=group)) + [_entry_point("odd", plugin)])
    names = [p["name"] for p in plugins.plugin_list()]
    assert "odd" not in names and "ngram" in names
    msgs = warnings_about(caplog, "odd")
    assert len(msgs) == 1 and "is skipped" in msgs[0] and "not a wrapper" in msgs[0], msgs
    # one registered behind the manager's back is unregistered at the first write, which goes on
    written_and_checked(ctx0, probe, plugin, name="odd-direct")
    assert plugins.manager().get_plugin("odd-direct") is None
    assert len(warnings_about(caplog, "odd-direct")) == 1


# -- hook semantics: recorded writes vs per-run writes ----------------------------------------

def test_kv_cache_write_counts_recordings_and_kv_cache_written_counts_runs(ctx0, tmp_path):
    from vkdflash.model import load_model
    from vkdflash.model.forward import Model
    recorded, ran = [], []

    class Counter:
        @hookimpl(wrapper=True)
        def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
            recorded.append((layer, n_rows))
            return (yield)

        @hookimpl
        def kv_cache_written(self, cache, layer, positions):
            ran.append((cache.name, layer, positions.tolist()))

    plugins.manager().register(Counter(), name="counter")
    model = Model(ctx0, load_model(write_model(tmp_path / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2,
                                               n_head_kv=1, head_dim=64)), n_ctx=16, ctk="q4_0")
    try:
        model.forward([1, 2, 3, 4, 5])
        for t in (6, 7, 8):
            model.forward([t])
    finally:
        model.close()
    # two graphs recorded (5 rows, 1 row), two layers each; four runs, two layers each
    assert recorded == [(0, 5), (1, 5), (0, 1), (1, 1)]
    assert ran == [("target", layer, pos) for pos in ([0, 1, 2, 3, 4], [5], [6], [7]) for layer in (0, 1)]


def test_a_raising_observer_is_unregistered_with_one_warning(ctx0, probe, caplog):
    class Raises:
        @hookimpl
        def kv_cache_written(self, cache, layer, positions):
            raise ValueError("observer boom")

    written_and_checked(ctx0, probe, Raises(), name="bad-observer")
    written_and_checked(ctx0, probe, seed=2)
    msgs = warnings_about(caplog, "bad-observer")
    assert len(msgs) == 1 and "observer raised ValueError: observer boom" in msgs[0]


def test_a_wrapper_observer_of_kv_cache_written_is_refused(ctx0, probe, caplog):
    class Wraps:
        @hookimpl(wrapper=True)
        def kv_cache_written(self, cache, layer, positions):
            return (yield)

    written_and_checked(ctx0, probe, Wraps(), name="wrapping-observer")
    assert plugins.manager().get_plugin("wrapping-observer") is None
    assert len(warnings_about(caplog, "wrapping-observer")) == 1


# -- end to end: `vkdflash generate` with a third-party plugin that raises --------------------

RAISER = textwrap.dedent('''
    import pluggy
    hookimpl = pluggy.HookimplMarker("vkdflash")

    @hookimpl(wrapper=True)
    def kv_cache_write(cache, graph, layer, k_rows, v_rows, positions, n_rows):
        raise RuntimeError("raiser is broken")
        yield
''')


def _cli(args, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_generate_output_is_unchanged_by_a_raising_wrapper_plugin(tmp_path):
    """A real third-party plugin (an installed distribution with a `vkdflash` entry point) whose
    kv_cache_write wrapper raises: same text as without it, exactly one warning line."""
    site = tmp_path / "site"
    (site / "raiser-0.1.dist-info").mkdir(parents=True)
    (site / "raiser.py").write_text(RAISER)
    (site / "raiser-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: raiser\nVersion: 0.1\n")
    (site / "raiser-0.1.dist-info" / "entry_points.txt").write_text("[vkdflash]\nraiser = raiser\n")
    model = write_model(tmp_path / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    args = ["generate", "-m", str(model), "hello world", "-n", "12", "--temp", "0", "-ctk", "q8_0", "-ctv", "q4_0"]
    plain, faulty = _cli(args), _cli(args, extra_path=site)
    assert plain.returncode == 0 and faulty.returncode == 0, faulty.stderr
    assert faulty.stdout == plain.stdout
    warned = [line for line in faulty.stderr.splitlines() if "plugin raiser" in line]
    assert len(warned) == 1 and "raiser is broken" in warned[0], faulty.stderr
    assert "Traceback" not in faulty.stderr
