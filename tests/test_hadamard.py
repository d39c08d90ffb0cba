"""Walsh-Hadamard rotation: the matrix, the GPU transform (exact f32 reference, H H = I,
in place, batch invariance) and the rotation sizes llama.cpp uses."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.kernels.hadamard import SIZES, fwht
from vkdflash.ref.hadamard import (fwht_f32, hadamard_matrix, k_block, rotate, rotation_block,
                                   rotation_enabled, v_block)
from vkdflash.runtime.graph import Graph


@pytest.mark.parametrize("n", [1, 2, 4, 64, 128, 256, 512])
def test_matrix_orthonormal_symmetric(n):
    h = hadamard_matrix(n)
    assert np.allclose(h @ h.T, np.eye(n), atol=1e-12)
    assert np.array_equal(h, h.T)
    assert np.allclose(np.abs(h), 1 / np.sqrt(n))
    if n > 1:  # Sylvester: H_2m = [[H, H], [H, -H]], first row all positive
        m = hadamard_matrix(n // 2) / np.sqrt(2)
        assert np.allclose(h, np.block([[m, m], [m, -m]]))
        assert np.all(h[0] > 0)


def test_fast_reference_matches_matrix():
    x = np.random.default_rng(0).uniform(-1, 1, (3, 1024)).astype(np.float32)
    for n in SIZES:
        assert np.allclose(fwht_f32(x, n), rotate(x, n), atol=1e-6)


def gpu_fwht(ctx, x: np.ndarray, n: int, twice: bool = False) -> np.ndarray:
    buf = ctx.upload(np.ascontiguousarray(x, np.float32))
    g = Graph(ctx)
    for _ in range(2 if twice else 1):
        fwht(g, buf, buf, x.shape[0], x.shape[1], n)  # in place
    g.run()
    out = buf.read(np.float32).reshape(x.shape)
    g.destroy(), buf.destroy()
    return out


@pytest.mark.parametrize("n", SIZES)
def test_gpu_exact_and_involution(ctx, n):
    x = np.random.default_rng(n).uniform(-1, 1, (4, 2 * n)).astype(np.float32)
    once = gpu_fwht(ctx, x, n)
    assert np.array_equal(once.view(np.uint32), fwht_f32(x, n).view(np.uint32))
    twice = gpu_fwht(ctx, x, n, twice=True)
    assert np.max(np.abs(twice - x)) < 1e-5  # H H = I
    assert np.sum((once - rotate(x, n)) ** 2) / np.sum(rotate(x, n) ** 2) < 1e-12


@pytest.mark.parametrize("n", SIZES)
def test_batch_invariance(ctx, n):
    x = np.random.default_rng(7).uniform(-1, 1, (64, max(n, 256))).astype(np.float32)
    src, dst = ctx.upload(x), ctx.buffer(x.nbytes)
    full = None
    for rows in range(64, 0, -1):
        g = Graph(ctx)
        fwht(g, src, dst, rows, x.shape[1], n)
        g.run()
        g.destroy()
        got = dst.read(np.float32).reshape(x.shape)[:rows]
        full = got if full is None else full
        assert np.array_equal(got.view(np.uint32), full[:rows].view(np.uint32)), f"n={n} rows={rows}"
    src.destroy(), dst.destroy()


def test_bad_shapes_raise(ctx0):
    buf = ctx0.buffer(4 * 1024)
    g = Graph(ctx0)
    for n, rows, row_len in ((32, 1, 64), (100, 1, 200), (64, 1, 96), (64, 0, 64), (64, 17, 64)):
        with pytest.raises(VkdflashError):
            fwht(g, buf, buf, rows, row_len, n)
    assert len(g) == 0
    g.destroy(), buf.destroy()


def test_rotation_sizes():
    assert [k_block(hd) for hd in (64, 128, 192, 256, 512, 576)] == [64, 128, 64, 256, 512, 64]
    assert v_block(128) == 64 and v_block(192) == 64
    assert rotation_enabled("q8_0", 128) and rotation_enabled("iq4_nl", 64)
    assert not rotation_enabled("f16", 128) and not rotation_enabled("bf16", 128)
    assert not rotation_enabled("q4_0", 96)
    assert rotation_block("q4_0", 128, "k") == 128 and rotation_block("q4_0", 128, "v") == 64
    assert rotation_block("f32", 128, "k") == 0 and rotation_block("q5_1", 80, "v") == 0
    with pytest.raises(VkdflashError):
        rotation_block("q8_0", 128, "q")
    with pytest.raises(VkdflashError):
        k_block(96)
