"""Bad input through the plugin API itself: names, options, shipped drafts and claims a plugin
gets wrong, plugins that call sys.exit(), and hooks spelled wrong. Each is one warning naming the
plugin, never a traceback, and the plugin's other strategies (and every other plugin) go on."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from click.testing import CliRunner

from gguf_fixtures import write_model
from vkdflash import plugins
from vkdflash.api import GGUFFile, Option, VkdflashError
from vkdflash.cli import main
from vkdflash.hookspecs import hookimpl

pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_model(tmp_path_factory.mktemp("api-inputs") / "t.gguf", "llama"))


def warnings(caplog, *words) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and all(w in r.getMessage() for w in words)]


def one_warning(caplog, *words) -> str:
    said = warnings(caplog, *words)
    assert len(said) == 1 and "\n" not in said[0], caplog.text
    return said[0]


class EntryPoint:
    """A third-party entry point (no distribution) whose load() is `load`."""
    dist = None

    def __init__(self, name, load):
        self.name, self.load = name, load


def install(monkeypatch, name, load):
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda group: list(real(group=group)) + [EntryPoint(name, load)])


def registering(*strategies):
    """A plugin that registers each (args, kwargs) in turn, then a strategy called "good"."""
    class Registers:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            for args, kwargs in strategies:
                register(*args, **kwargs)
            register("good", lambda ctx: None, "registered after the bad one")
    return Registers


def listing_json() -> list:
    res = CliRunner().invoke(main, ["plugins", "--json"])
    assert res.exit_code == 0, res.output

    def refuse(constant):
        raise AssertionError(f"invalid JSON: {constant}")
    return json.loads(res.output, parse_constant=refuse)


@pytest.mark.parametrize("name,aliases,words", [
    (5, (), ["name 5"]), ("", (), ["name ''"]), ("has space", (), ["name 'has space'"]),
    ("Upper", (), ["'Upper'"]), ("a.b", (), ["'a.b'"]), ("ok", ("bad alias",), ["alias 'bad alias'"]),
    ("ok", (7,), ["alias 7"]), ("ok", "draft-ok", ["aliases are a str"])])
def test_a_name_or_alias_no_flag_can_spell_is_refused_and_the_plugin_goes_on(name, aliases, words, caplog):
    plugins.manager().register(registering(((name, lambda ctx: None), {"aliases": aliases})), name="odd")
    found = plugins.strategies()
    assert "good" in found and not {name, "ok"} & set(found)
    one_warning(caplog, "plugin odd", "refused", *words)
    res = CliRunner().invoke(main, ["plugins"])
    assert res.exit_code == 0 and "--spec good" in res.output, res.output


@pytest.mark.parametrize("options,words", [
    ((Option("d", int, b"x"),), ["default b'x' is not of type int"]),
    ((Option("d", int, "notanint"),), ["default 'notanint' is not of type int"]),
    ((Option("d", int, True),), ["default True"]),
    ((Option("d", float, float("nan")),), ["default nan is not a finite float"]),
    ((Option("d", float, float("inf")),), ["default inf"]),
    ((Option("d", float, np.float32(1)),), ["not a finite float"]),
    ((Option("d", bytes, b"x"),), ["not a vkdflash.api.Option"]),
    ((Option("d", int, 1), Option("d", int, 2)), ["option 'd' is declared twice"]),
    ((Option("a=b", int, 1),), ["key 'a=b'"]), ((Option("a.b", int, 1),), ["key 'a.b'"]),
    ((Option("", int, 1),), ["key ''"]), ((Option("d", str, "x", b"help"),), ["help is a bytes"]),
    (Option("d", int, 1), ["options are a Option"])])
def test_a_bad_option_refuses_its_strategy_alone_and_the_listing_stays_json(options, words, caplog):
    plugins.manager().register(registering((("bad", lambda ctx: None), {"options": options})), name="opts")
    found = plugins.strategies()
    assert "good" in found and "bad" not in found
    one_warning(caplog, "plugin opts", "'bad' is refused", *words)
    (listed,) = [p for p in listing_json() if p["name"] == "opts"]
    assert listed["strategies"] == ["good"]


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999"])
def test_a_float_option_refuses_what_is_not_a_finite_number(text):
    plugins.manager().register(registering((("floaty", lambda ctx: None), {"options": (Option("p", float, 0.5),)})),
                               name="floaty")
    reg = plugins.lookup("floaty")
    assert reg.settings(["p=2.5"]) == {"p": 2.5}
    with pytest.raises(VkdflashError, match=f"floaty.p={text}: not a finite float"):
        reg.settings([f"p={text}"])


def mine(claims=None, ships=()):
    """A plugin registering strategy "mine" (alias "my-alias") that claims every file for `claims`
    and ships the entries `ships`."""
    class Mine:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            register("mine", lambda ctx: None, aliases=("my-alias",))

        @staticmethod
        @hookimpl
        def claim_draft_file(path, metadata):
            return claims

        @staticmethod
        @hookimpl
        def shipped_drafts(model_file):
            return list(ships)
    return Mine


def test_a_shipped_draft_must_be_the_plugins_own_strategy_and_an_existing_file(tmp_path, caplog):
    draft = tmp_path / "mine.gguf"
    draft.write_bytes(b"GGUF")
    good = {"strategy": "my-alias", "path": str(draft), "tau": 0.5, "cpu_speedup": None}
    offers = [dict(good, strategy="mtp", tau=0.99), dict(good, path=str(tmp_path / "missing.gguf")),
              dict(good, path=str(tmp_path)), good]
    plugins.manager().register(mine(ships=offers), name="offers")
    assert plugins.shipped(None) == [dict(good, strategy="mine")]
    one_warning(caplog, "plugin offers", "'mtp' is not one the plugin registers (its own: mine)")
    one_warning(caplog, "plugin offers", "missing.gguf", "is not an existing file")
    assert len(warnings(caplog, "plugin offers", "is not an existing file")) == 2


@pytest.mark.parametrize("claimed", [5, "nosuch", "ngram"])
def test_a_claim_for_a_strategy_the_plugin_does_not_register_is_ignored(claimed, model, caplog):
    plugins.manager().register(mine(claims=claimed), name="claims")
    with GGUFFile(model) as f:
        metadata = f.metadata
    assert plugins.claim(model, metadata) == "draft"  # the built-in claim, as without the plugin
    plugins.claim(model, metadata)
    one_warning(caplog, "plugin claims", f"returned {claimed!r}", "its own: mine", "ignored")


def test_a_claim_by_alias_names_the_strategy(model):
    plugins.manager().register(mine(claims="my-alias"), name="claims")
    with GGUFFile(model) as f:
        assert plugins.claim(model, f.metadata) == "mine"


class Exit(BaseException):
    """What a plugin might raise that is not an Exception (as sys.exit() raises SystemExit)."""


def exits(hook, exc):
    """A plugin whose `hook` raises `exc` (a kv_cache_write wrapper raises before its yield)."""
    def raising(*args, **kwargs):
        raise exc

    def wrapper(cache, graph, layer, k_rows, v_rows, positions, n_rows):
        raise exc
        yield
    kinds = {"register_strategies": hookimpl(raising), "kv_cache_written": hookimpl(raising),
             "shipped_drafts": hookimpl(raising), "claim_draft_file": hookimpl(raising),
             "kv_cache_write": hookimpl(wrapper=True)(wrapper)}
    return type("Exits", (), {hook: staticmethod(kinds[hook])})


WRITE = dict(cache=None, graph=None, layer=0, k_rows=None, v_rows=None, positions=None, n_rows=1)
CALLS = {"kv_cache_written": lambda md: plugins.notify("kv_cache_written", cache=None, layer=0, positions=[0]),
         "kv_cache_write": lambda md: plugins.wrap("kv_cache_write", WRITE, lambda: None),
         "shipped_drafts": lambda md: plugins.shipped(None), "claim_draft_file": lambda md: plugins.claim("x", md)}


@pytest.mark.parametrize("exc", [SystemExit("boom"), SystemExit(3), Exit("boom")], ids=["exit-boom", "exit-3", "base"])
@pytest.mark.parametrize("hook", sorted(CALLS))
def test_a_hook_that_exits_is_unregistered_with_one_warning(hook, exc, model, caplog):
    plugins.manager().register(exits(hook, exc), name="exits")
    with GGUFFile(model) as f:
        CALLS[hook](f.metadata)
    assert plugins.manager().get_plugin("exits") is None
    one_warning(caplog, "plugin exits", hook, type(exc).__name__)


@pytest.mark.parametrize("exc", [SystemExit("boom"), Exit("boom")], ids=["exit", "base"])
def test_a_plugin_that_exits_while_loading_or_registering_is_skipped(exc, monkeypatch, caplog):
    def load():
        raise exc
    install(monkeypatch, "exits-loading", load)
    plugins.manager().register(exits("register_strategies", exc), name="exits")
    assert "ngram" in plugins.strategies()
    assert "exits-loading" not in [p["name"] for p in plugins.plugin_list()]
    one_warning(caplog, "plugin exits-loading failed to load", type(exc).__name__)
    one_warning(caplog, "plugin exits failed to register strategies", type(exc).__name__)


def test_ctrl_c_in_a_plugin_still_stops_the_run():
    plugins.manager().register(exits("kv_cache_written", KeyboardInterrupt()), name="interrupts")
    with pytest.raises(KeyboardInterrupt):
        CALLS["kv_cache_written"](None)


def test_a_misspelled_hook_is_named_with_the_nearest_real_one(monkeypatch, caplog):
    class Misspelled:
        @staticmethod
        @hookimpl
        def register_strategy(register):
            register("never", lambda ctx: None)

        @staticmethod
        @hookimpl(optionalhook=True)
        def some_future_hook():
            """declared optional: its author knows it may not exist"""
    install(monkeypatch, "typo", lambda: Misspelled)
    assert "typo" in [p["name"] for p in plugins.plugin_list()]
    said = one_warning(caplog, "plugin typo", "'register_strategy'")
    assert "did you mean register_strategies?" in said
    assert not warnings(caplog, "some_future_hook")


def test_a_hook_pluggy_refuses_is_one_warning_line(monkeypatch, caplog):
    class ExtraArgument:
        @staticmethod
        @hookimpl
        def kv_cache_written(cache, layer, positions, extra):
            pass
    install(monkeypatch, "extra", lambda: ExtraArgument)
    assert "extra" not in [p["name"] for p in plugins.plugin_list()]
    said = one_warning(caplog, "plugin extra failed to load", "PluginValidationError", "kv_cache_written")
    assert "{'extra'} are declared in the hookimpl" in said
