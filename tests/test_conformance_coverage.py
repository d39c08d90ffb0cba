"""The conformance suite covers what the foundation promises: every weight type, every cache
type (store and attention, every K/V pair), both attention masks, both RoPE modes."""
from __future__ import annotations

from itertools import product

from vkdflash.conformance import all_cases
from vkdflash.kernels.types import CACHE_TYPES, WEIGHT_TYPES

NAMES = [c.name for c in all_cases()]


def has(prefix: str) -> bool:
    return any(n.startswith(prefix) for n in NAMES)


def test_every_weight_type_in_matmul_and_get_rows():
    for t in WEIGHT_TYPES:
        assert has(f"matmul/{t}/") and has(f"get_rows/{t}/"), t


def test_matmul_covers_matvec_and_matrix_up_to_64_rows():
    assert any(",n=1" in n and n.startswith("matmul/") for n in NAMES)
    assert any(",n=64" in n and n.startswith("matmul/") for n in NAMES)


def test_every_cache_type_stored_and_every_pair_attended():
    for t in CACHE_TYPES:
        assert has(f"kv_store/{t}/"), t
    for k, v in product(CACHE_TYPES, CACHE_TYPES):
        assert has(f"attention/{k},{v}/"), (k, v)


def test_rotating_store_for_every_quantized_type_and_q_rotation_for_every_size():
    from vkdflash.kernels.kv_store import ROTATIONS
    from vkdflash.kernels.types import get_type
    for t in CACHE_TYPES:
        if get_type(t).quantized:
            for rot in ROTATIONS:
                assert has(f"kv_store/{t}/rot={rot}/"), (t, rot)
    for rot in ROTATIONS:
        assert any(n.startswith("attention/") and n.endswith(f",qrot={rot}") for n in NAMES), rot


def test_both_masks_both_rope_modes_and_head_dims():
    attention = [n for n in NAMES if n.startswith("attention/")]
    assert any(n.endswith(",causal") or ",causal," in n for n in attention)
    assert any(n.endswith(",block") or ",block," in n for n in attention)
    assert has("rope/normal/") and has("rope/neox/")
    for hd in (64, 128):
        assert any(n.startswith("attention/") and f"hd={hd}," in n for n in NAMES), hd


def test_other_families_present():
    for fam in ("rms_norm", "softmax", "argmax", "swiglu", "add", "fwht", "copy"):
        assert has(f"{fam}/"), fam
