"""Bad input from plugins and flags: a one-line error or one warning naming the problem, never a
traceback, and the engine goes on without what was wrong."""
from __future__ import annotations

import logging

import pytest

import test_spec_options
from vkdflash import plugins
from vkdflash.hookspecs import hookimpl

pytestmark = pytest.mark.usefixtures("fresh_plugins")
model, run = test_spec_options.model, test_spec_options.run  # the same tiny model and CLI runner


def generate(model, *extra):
    return run("generate", "-m", model, "ab ab ab ab ab", "-n", "6", "--temp", "0", "-c", "64", *extra)


def last_line(res, exit_code: int, *words) -> str:
    lines = res.output.strip().splitlines()
    assert res.exit_code == exit_code and lines[-1].startswith("vkdflash: error:"), res.output
    assert all(w in lines[-1] for w in words), lines[-1]
    return lines[-1]


def warnings(caplog, *words) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and all(w in r.getMessage() for w in words)]


class FakeEntryPoint:
    """A third-party entry point (no distribution) that loads `plugin`."""

    def __init__(self, name, plugin):
        self.name, self.dist, self.plugin = name, None, plugin

    def load(self):
        return self.plugin


def install_first(monkeypatch, name, plugin):
    """Install `plugin` as a third-party entry point found before the built-in ones."""
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda group: [FakeEntryPoint(name, plugin)] + list(real(group=group)))


def offering(*entries):
    """A plugin shipping `entries` for its own strategy "offered" (alias "offered-alias")."""
    class Offers:
        @staticmethod
        @hookimpl
        def register_strategies(register):
            register("offered", lambda ctx: None, aliases=("offered-alias",))

        @staticmethod
        @hookimpl
        def shipped_drafts(model_file):
            return list(entries)
    return Offers


FILE = __file__  # an existing file for a draft's path
GOOD = {"strategy": "offered", "path": FILE, "tau": 0.5, "cpu_speedup": 2.0}


@pytest.mark.parametrize("bad,words", [
    ("junk", ["a str, not a dict"]), ({}, ["strategy None is not one the plugin registers"]),
    ({"strategy": "offered", "path": FILE, "tau": "high"}, ["tau 'high'"]),
    ({"strategy": "offered", "path": FILE, "cpu_speedup": "fast"}, ["cpu_speedup 'fast'"]),
    ({"strategy": "offered", "path": FILE, "tau": float("nan")}, ["tau nan"]),
    ({"strategy": "offered", "path": None}, ["path None"]),
    ({"strategy": "offered", "path": "x.gguf"}, ["path 'x.gguf' is not an existing file"]),
    ({"strategy": "ngram", "path": FILE}, ["strategy 'ngram' is not one the plugin registers", "offered"]),
    ({"strategy": "nosuch", "path": FILE}, ["strategy 'nosuch' is not one the plugin registers", "offered"])])
def test_a_bad_shipped_draft_is_dropped_with_one_warning_naming_the_plugin(bad, words, caplog):
    plugins.manager().register(offering(bad, GOOD), name="offers")
    assert plugins.shipped(None) == [GOOD]
    assert len(warnings(caplog, "plugin offers", *words)) == 1, caplog.text


def test_shipped_drafts_that_is_not_a_list_is_ignored_and_aliases_are_spelled_by_name(caplog):
    class NotAList:
        @staticmethod
        @hookimpl
        def shipped_drafts(model_file):
            return {"tau": "high"}
    plugins.manager().register(NotAList, name="notalist")
    plugins.manager().register(offering(dict(GOOD, strategy="offered-alias")), name="offers")
    assert plugins.shipped(None) == [GOOD]
    assert len(warnings(caplog, "plugin notalist", "returned a dict, not a list")) == 1


def test_generate_goes_on_past_a_plugin_offering_bad_drafts(model, caplog):
    plain = generate(model)
    plugins.manager().register(offering("junk", {"strategy": "ngram", "path": "x.gguf", "tau": "high"}, [{}]),
                               name="offers")
    res = generate(model)
    assert res.exit_code == 0, res.output
    assert res.stdout == plain.stdout
    assert len(warnings(caplog, "plugin offers")) == 3


class Dup:
    @staticmethod
    @hookimpl(trylast=True)
    def register_strategies(register):
        register("ngram", lambda ctx: None, "a third-party ngram")
        register("mine", lambda ctx: None, "a strategy of its own")


def test_a_third_party_strategy_cannot_take_a_built_in_name(model, monkeypatch, caplog):
    install_first(monkeypatch, "dup", Dup)
    found = plugins.strategies()
    assert found["ngram"].plugin == "ngram" and found["mine"].plugin == "dup"
    plugins.strategies()
    said = warnings(caplog, "'ngram'")
    assert len(said) == 1 and "plugin dup" in said[0] and "plugin ngram" in said[0], said
    listing = run("plugins")
    assert listing.exit_code == 0 and "a third-party ngram" not in listing.output, listing.output
    assert generate(model, "--spec", "ngram").exit_code == 0
    assert generate(model).exit_code == 0


def test_a_spec_option_without_a_value_says_so(model):
    line = last_line(generate(model, "--spec", "ngram", "--spec-opt", "ngram.n"), 1,
                     "--spec-opt ngram.n needs a value: NAME.OPTION=VALUE")
    assert "no option" not in line


def test_a_spec_option_for_no_strategy_at_all_lists_the_known_ones(model):
    line = last_line(generate(model, "--spec", "ngram", "--spec-opt", "bogus.n=3"), 1, "'bogus'", "dflash", "ngram")
    assert "but the strategy is" not in line


@pytest.mark.parametrize("flags,words", [
    (["--spec", "none", "--spec-opt", "ngram.n=3"], ["--spec-opt ngram.n=3", "--spec none"]),
    (["--spec", "none", "-md", "x.gguf"], ["-md 'x.gguf'", "--spec none"]),
    (["--spec", "ngram", "-md", "x.gguf"], ["-md 'x.gguf'", "--spec ngram", "dflash, draft, mtp"])])
def test_flags_the_strategy_would_never_read_are_usage_errors(model, flags, words):
    last_line(generate(model, *flags), 2, *words)


def test_strategies_with_draft_files_take_md(model):
    assert plugins.draft_takers() == ["dflash", "draft", "mtp"]
    res = generate(model, "--spec", "draft", "-md", "missing.gguf")
    assert res.exit_code == 1 and "missing.gguf" in res.output, res.output


def test_a_typo_in_vkdflash_plugins_is_named(model, monkeypatch, caplog):
    monkeypatch.setenv("VKDFLASH_PLUGINS", "ngarm")
    assert run("plugins").exit_code == 0
    said = warnings(caplog, "VKDFLASH_PLUGINS", "'ngarm'")
    assert len(said) == 1 and "dflash, draft, mtp, ngram" in said[0], said
    line = last_line(generate(model, "--spec", "ngram"), 1, "unknown speculative strategy 'ngram'")
    assert line.endswith("available: none"), line

