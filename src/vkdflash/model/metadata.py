"""Typed reads of GGUF metadata. Every key the engine reads states its GGUF value type (and for
arrays the item type and a length bound) and its allowed range; a file that disagrees gets one line
naming the key, what was expected and what was found. Nothing is coerced: a token id "12" or 12.0,
or add_bos_token "false", is refused, not guessed at.

Metadata is also a read-only mapping of the raw values, which is what plugin hooks receive."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from gguf.constants import GGUFValueType as VT

from ..errors import VkdflashError, quote

INTS = frozenset({VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64})
FLOATS = frozenset({VT.FLOAT32, VT.FLOAT64})
REQUIRED = object()   # default= sentinel: the key must be present


def type_name(vtype) -> str:
    """'UINT32', 'an array of STRING'."""
    return f"an array of {vtype[1].name}" if isinstance(vtype, tuple) else vtype.name


class Metadata(Mapping):
    """key -> raw value (numbers, str, numpy arrays, lists of str) plus typed, range-checked reads."""

    def __init__(self, values: dict, types: dict):
        self._values, self.types = values, types

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def _absent(self, key, default) -> bool:
        if key in self._values:
            return False
        if default is REQUIRED:
            raise VkdflashError(f"missing metadata key {key}")
        return True

    def _typed(self, key, kinds, expected: str, array: bool = False):
        vtype = self.types[key]
        item = vtype[1] if isinstance(vtype, tuple) else vtype
        if item not in kinds or isinstance(vtype, tuple) != array:
            raise VkdflashError(f"metadata {key} should be {expected}, found {type_name(vtype)}")
        return self._values[key]

    def int(self, key, lo: int, hi: int, default=REQUIRED):
        if self._absent(key, default):
            return default
        v = int(self._typed(key, INTS, "an integer"))
        if not lo <= v <= hi:
            raise VkdflashError(f"metadata {key} = {v} is out of range ({lo}..{hi})")
        return v

    def float(self, key, lo: float, hi: float, default=REQUIRED):
        if self._absent(key, default):
            return default
        v = float(self._typed(key, FLOATS, "a float"))
        if not lo <= v <= hi:  # NaN fails too
            raise VkdflashError(f"metadata {key} = {v:g} is out of range ({lo:g}..{hi:g})")
        return v

    def bool(self, key, default=REQUIRED):
        return default if self._absent(key, default) else bool(self._typed(key, {VT.BOOL}, "a bool"))

    def str(self, key, default=REQUIRED, choices=None):
        if self._absent(key, default):
            return default
        v = self._typed(key, {VT.STRING}, "a string")
        if choices is not None and v not in choices:
            raise VkdflashError(f"metadata {key} = {quote(v)} must be one of {', '.join(choices)}")
        return v

    def strings(self, key, max_count: int, default=REQUIRED) -> list:
        if self._absent(key, default):
            return default
        v = self._typed(key, {VT.STRING}, "an array of strings", array=True)
        if len(v) > max_count:
            raise VkdflashError(f"metadata {key} has {len(v)} strings (at most {max_count})")
        return v

    def ints(self, key, lo: int, hi: int, max_count: int, default=REQUIRED) -> np.ndarray:
        if self._absent(key, default):
            return default
        v = np.asarray(self._typed(key, INTS, "an array of integers", array=True))
        if len(v) > max_count:
            raise VkdflashError(f"metadata {key} has {len(v)} integers (at most {max_count})")
        wide = v.astype(np.float64)  # compares uint64 items with negative bounds too
        bad = v[(wide < lo) | (wide > hi)]
        if bad.size:
            raise VkdflashError(f"metadata {key} holds {int(bad[0])}, out of range ({lo}..{hi})")
        return v.astype(np.int64)
