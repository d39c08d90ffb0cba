"""Hostile values: numbers at the edges, strings that are not what a key expects, chat templates
that divide by zero, allocate gigabytes, recurse or loop for ever, and type conversions that keep
a value's meaning while changing its declared GGUF type ("12" for 12, 12.0 for 12, "false" for False)."""
from __future__ import annotations

import math
import random

from .gguf_image import ARRAY, BOOL, FLOAT_TYPES, INT_TYPES, STRING

INTS = [0, 1, -1, 2, 3, 5, 7, 8, 16, 31, 64, 255, 256, 4096, 65535, 65536, 1 << 20, 2**31 - 1, 2**31, 2**32 - 1,
        2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -2**31, -2**63]
FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, 1e-38, 1e30, 3.4e38, 1e300, -1.0, 0.5, 1e-12, 12.0]
STRINGS = [b"", b"12", b"12.0", b"-1", b"false", b"true", b"none", b"\xff\xfe\xfd", b"\x00", b"a\nb\nc", b"%s%n{0}{}",
           "\u00e9\u4e2d".encode() * 40, b"x" * 5000, b"y" * 200_000, b"llama", b"qwen3", b"gpt2", b"dflash", b"mtp",
           b"\x1b[2J", b"\r\n" * 50]
ALL_TYPES = list(INT_TYPES) + list(FLOAT_TYPES) + [BOOL, STRING, ARRAY]

_HUGE_MESSAGE = "'" + "m" * 100_000 + "'"
TEMPLATES = [
    "{{ 1/0 }}",
    "{{ 'x' * 4000000000 }}",
    "{{ 'x' * 2**62 }}",
    "{{ 10**10**10 }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s=[]) %}{% for i in range(100000) %}{% set ns.s = ns.s + [i] %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ raise_exception(" + _HUGE_MESSAGE + ") }}",
    "{{ raise_exception('line one\nline two\n\tline three') }}",
    "{{ raise_exception(messages) }}",
    "{{ raise_exception() }}",
    "{{ messages[7]['content'] }}",
    "{{ x.y.z }}",
    "{% if %}",
    "{% for %}" * 1000,
    "{{ '%s %s' % (1,) }}",
    "{{ '{0.__class__}'.format(1) }}",
    "{{ messages.__class__.__mro__ }}",
    "{% extends 'base.html' %}",
    "{% include messages %}",
    "{{ messages|tojson(indent=-5) }}{{ messages|tojson(separators=5) }}",
    "{{ strftime_now(5) }}{{ strftime_now('%Q' * 50) }}",
    "{{ lipsum(100000000) }}",
    "{{ 'a'|center(2**40) }}",
    "{{ bos_token * 1000000000 }}",
    "{{ messages|map('int')|list }}",
    "{% for i in range(100000) %}<|im_start|>{% endfor %}",
    "{{ messages[0].content|int(base=99) }}",
    "{% set x = messages.append(1) %}",
    "{{ range(2**62)|list }}",
    "{{ (messages * 1000000000)|length }}",
    "{% filter upper %}{{ '\u00e9' * 100 }}{% endfilter %}",
    "{{ '\x00\xff\U0001F600' }}" * 10,
    "{" * 5000,
    "{% raw %}" * 200,
    "plain text, no messages at all",
    "",
]


def any_int(rng: random.Random) -> int:
    return rng.choice(INTS) if rng.random() < 0.8 else rng.randint(-2**64, 2**64)


def any_float(rng: random.Random) -> float:
    return rng.choice(FLOATS) if rng.random() < 0.8 else rng.uniform(-1e6, 1e6)


def any_string(rng: random.Random) -> bytes:
    return rng.choice(STRINGS) if rng.random() < 0.9 else bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))


def any_scalar(rng: random.Random, vtype: int):
    if vtype in FLOAT_TYPES:
        return any_float(rng)
    if vtype == BOOL:
        return rng.choice([0, 1, 2, 255])
    return any_int(rng)


def random_value(rng: random.Random) -> tuple[int, object, int | None]:
    """(type, value, item type) of any kind, arrays included."""
    vtype = rng.choice(ALL_TYPES)
    if vtype == STRING:
        return vtype, any_string(rng), None
    if vtype != ARRAY:
        return vtype, any_scalar(rng, vtype), None
    item = rng.choice([t for t in ALL_TYPES if t != ARRAY] + [ARRAY])
    n = rng.choice([0, 1, 2, 5, 300])
    if item == STRING:
        return vtype, [any_string(rng) for _ in range(n)], item
    if item == ARRAY:
        return vtype, [(STRING, [b"a"])] * n, item
    return vtype, [any_scalar(rng, item) for _ in range(n)], item


def _number(value) -> float:
    """The numeric reading of a value of any type (what the file "means")."""
    if isinstance(value, bytes):
        try:
            return float(value.decode())
        except (UnicodeDecodeError, ValueError):
            return len(value)
    if isinstance(value, tuple):  # an item of a nested array: (item type, items)
        return len(value[1])
    if isinstance(value, list):
        return _number(value[0]) if value else 0
    return value


def filler(item_type: int):
    """A neutral item of an array of this type."""
    return b"" if item_type == STRING else (STRING, []) if item_type == ARRAY else 0


def convert(vtype: int, value, item_type, new_type: int, rng: random.Random) -> tuple[object, int | None]:
    """value re-typed as new_type, keeping its meaning where one exists: (new value, item type)."""
    x = _number(value)
    if new_type == STRING:
        if vtype == BOOL:
            return (b"true" if value else b"false"), None
        if vtype == ARRAY and item_type == STRING:
            return b" ".join(value[:50]), None
        text = repr(x) if isinstance(x, float) and not x.is_integer() else str(int(x)) if math.isfinite(x) else str(x)
        return text.encode(), None
    if new_type == ARRAY:
        if rng.random() < 0.3:
            return [], rng.choice(ALL_TYPES)
        if vtype == ARRAY:  # an array of arrays
            return [(item_type, value)], ARRAY
        return [value] * rng.choice([1, 2]), vtype
    if new_type in FLOAT_TYPES:
        return float(x), None
    if new_type == BOOL:
        return (1 if x else 0) if rng.random() < 0.7 else 2, None
    return (int(x) if math.isfinite(x) else any_int(rng)), None
