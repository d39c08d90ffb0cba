"""What a plugin hands the core, checked before the core uses it: a strategy's declaration (its
name and aliases what `--spec NAME` can say, its options what `--spec-opt` can set and `vkdflash
plugins --json` list) and the drafts it ships. Each check says why, or None."""
from __future__ import annotations

import math
import numbers
import os
import re

SPELLING = re.compile(r"[a-z][a-z0-9_-]*")
OPTION_TYPES = (int, float, str, bool)


def declaration_problem(name, description, options, aliases) -> str | None:
    """Why register() refuses a strategy as declared, or None: its name and aliases must be what
    `--spec NAME` can say, its options what `--spec-opt` can set and `vkdflash plugins --json` list."""
    for what, given in (("options", options), ("aliases", aliases)):
        if not isinstance(given, (list, tuple)):
            return f"its {what} are a {type(given).__name__}, not a list or tuple"
    for what, spelled in (("name", name), *(("alias", alias) for alias in aliases)):
        if not (isinstance(spelled, str) and SPELLING.fullmatch(spelled)):
            return f"its {what} {spelled!r:.40} is not lowercase letters, digits, '-' and '_' after a letter"
    if not isinstance(description, str):
        return f"its description is a {type(description).__name__}, not a str"
    for option in options:
        problem = _option_problem(option)
        if problem:
            return problem
    keys = [option.key for option in options]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    return f"its option {twice!r} is declared twice" if twice else None


def _option_problem(option) -> str | None:
    if not all(hasattr(option, a) for a in ("key", "type", "default", "help", "parse")) \
            or option.type not in OPTION_TYPES:
        return f"its option {getattr(option, 'key', option)!r:.40} is not a vkdflash.api.Option of int, float, " \
            "str or bool"
    if not (isinstance(option.key, str) and SPELLING.fullmatch(option.key)):
        return f"its option key {option.key!r:.40} is not lowercase letters, digits, '-' and '_' after a letter"
    if not _default_fits(option.default, option.type):
        wanted = "a finite float" if option.type is float else f"of type {option.type.__name__}"
        return f"its option {option.key}'s default {option.default!r:.40} is not {wanted}"
    if not isinstance(option.help, str):
        return f"its option {option.key}'s help is a {type(option.help).__name__}, not a str"
    return None


def _default_fits(value, kind) -> bool:
    """Whether `value` is what --spec-opt would give for `kind` (JSON-listable: no numpy scalars)."""
    if isinstance(value, bool) or kind is bool:  # True is an int to Python, not to --spec-opt
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


def draft_problem(entry, own: dict) -> str | None:
    """Why a shipped_drafts entry cannot be used (see hookspecs.shipped_drafts), or None. Its
    strategy must be the plugin's own: a draft may not take another plugin's strategy over."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not a dict"
    strategy = entry.get("strategy")
    if not isinstance(strategy, str) or strategy not in own:
        return f"its strategy {strategy!r:.40} is not one the plugin registers (its own: {listed(own)})"
    path = entry.get("path")
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return f"its path {path!r:.80} is not an existing file"
    for key in ("tau", "cpu_speedup"):
        value = entry.get(key)
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if value is not None and not (number and math.isfinite(value) and value >= 0):
            return f"its {key} {value!r:.40} is not a number >= 0 (or None)"
    return None


def listed(names: dict) -> str:
    """The registered names among `names`' values, for a message."""
    return ", ".join(sorted(set(names.values()))) or "none"
