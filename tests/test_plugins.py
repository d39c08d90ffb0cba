"""Plugin system: entry points, VKDFLASH_PLUGINS, the documented hooks, the core cache-write hook."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kv_probe import reachable_from
from vkdflash import hookspecs, plugins
from vkdflash.cli import main
from vkdflash.hookspecs import hookimpl
from vkdflash.kv_cache import KVCache, _caches
from vkdflash.spec.strategy import KVHandle, StrategyContext, StrategyOptions

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
         if hasattr(fn, "vkdflash_spec")]


pytestmark = pytest.mark.usefixtures("fresh_plugins")


def test_every_hook_is_documented_with_its_exact_signature():
    docs = DOCS.read_text()
    assert HOOKS == ["claim_draft_file", "kv_cache_write", "kv_cache_written", "register_strategies",
                     "shipped_drafts"]
    for name in HOOKS:
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"### {name}({params})" in docs, name
        assert getattr(hookspecs, name).__doc__


def test_builtin_strategies_load_through_entry_points():
    found = plugins.strategies()
    assert {"ngram", "dflash", "mtp"} <= set(found)
    assert found["ngram"].plugin == "ngram"


def test_vkdflash_plugins_restricts_what_loads(monkeypatch):
    monkeypatch.setenv("VKDFLASH_PLUGINS", "ngram")
    assert [p["name"] for p in plugins.plugin_list()] == ["ngram"]
    plugins.reset()
    monkeypatch.setenv("VKDFLASH_PLUGINS", "")
    assert plugins.plugin_list() == [] and plugins.strategies() == {}


def test_plugins_cli_lists_name_version_hooks():
    res = CliRunner().invoke(main, ["plugins", "--json"])
    assert res.exit_code == 0, res.output
    listing = {p["name"]: p for p in json.loads(res.output)}
    assert listing["ngram"]["hooks"] == ["register_strategies"] and listing["ngram"]["version"]
    assert "ngram" in listing["ngram"]["strategies"]


def test_registered_plugin_adds_a_strategy_then_unregisters():
    class Extra:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            register("extra", lambda ctx: None, "test")
    pm = plugins.manager()
    pm.register(Extra, name="extra")
    assert "extra" in plugins.strategies()
    pm.unregister(name="extra")
    assert "extra" not in plugins.strategies()


def test_a_duplicate_strategy_name_keeps_the_built_in_and_says_so(caplog):
    """A third party's plugin must not take the engine down, nor a built-in's name."""
    class Dup:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            register("ngram", lambda ctx: None)
    plugins.manager().register(Dup, name="dup")
    with caplog.at_level("WARNING", logger="vkdflash"):
        assert plugins.strategies()["ngram"].plugin == "ngram"
    assert [r.getMessage() for r in caplog.records if "'ngram'" in r.getMessage() and "dup" in r.getMessage()]


def test_wrappers_observe_every_write(ctx0):
    seen = []

    class Observer:
        @staticmethod
        @hookimpl(wrapper=True)
        def kv_cache_write(cache, graph, layer, k_rows, v_rows, positions, n_rows):
            seen.append((cache.name, layer, n_rows, cache.k_rotation))
            return (yield)

    pm = plugins.manager()
    pm.register(Observer, name="observer")
    cache = KVCache(ctx0, 2, 16, 1, 64, "q8_0", "q4_0", name="probe")
    handle = KVHandle(cache)
    r = np.random.default_rng(1)
    handle.write(ctx0, 1, r.uniform(-1, 1, (3, 64)).astype(np.float32),
                 r.uniform(-1, 1, (3, 64)).astype(np.float32), [4, 5, 6])
    assert seen == [("probe", 1, 3, 64)]
    pm.unregister(name="observer")
    cache.destroy()


def test_a_strategy_cannot_reach_cache_buffers(ctx0, tmp_path):
    """From everything a strategy is handed (its context with the real target view, and its KV
    handles) no KV cache and no cache buffer -- the target's or its own -- is reachable; the
    handle's public surface is write, record_write, attend, truncate and info."""
    from gguf_fixtures import write_model
    from vkdflash.model import load_model
    from vkdflash.model.forward import Model
    from vkdflash.runtime.context import Context
    from vkdflash.spec.engine import target_view
    model = Model(ctx0, load_model(write_model(tmp_path / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2,
                                               n_head_kv=1, head_dim=64)), n_ctx=16, ctk="q8_0")
    sctx = StrategyContext(gpu=ctx0, target=target_view(model), options=StrategyOptions(cache_type_k="q4_0"))
    handle = sctx.create_kv_cache(1, 1, 64)
    public = sorted(n for n in dir(handle) if not n.startswith("_"))
    assert public == ["attend", "info", "record_write", "truncate", "write"]
    caches = [model.cache, _caches[handle.info.key]]
    forbidden = {id(c) for c in caches} | {id(b) for c in caches for b in c.k + c.v}
    # the runtime context (sctx.gpu) is the plugin's way to run kernels; it holds no cache
    reachable = reachable_from([handle, {k: v for k, v in vars(sctx).items() if k != "gpu"}], depth=8,
                           skip=lambda o: isinstance(o, Context))
    assert not any(id(o) in forbidden for o in reachable)
    assert not any(isinstance(o, KVCache) for o in reachable)
    sctx.close()
    model.close()


def test_a_plugin_that_fails_to_load_is_skipped_with_one_line_warning(monkeypatch, caplog):
    class BrokenEntryPoint:
        name, dist = "broken", None

        def load(self):
            raise ImportError("no module named 'nowhere'")

    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda group: list(real(group=group)) + [BrokenEntryPoint()])
    names = [p["name"] for p in plugins.plugin_list()]
    assert "broken" not in names and "ngram" in names
    assert any("plugin broken failed to load" in r.getMessage() for r in caplog.records)


def test_a_plugin_whose_registration_raises_is_skipped(caplog):
    class Bad:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            raise RuntimeError("boom")
    plugins.manager().register(Bad, name="bad")
    assert "ngram" in plugins.strategies()
    assert any("plugin bad failed to register" in r.getMessage() for r in caplog.records)
