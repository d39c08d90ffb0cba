"""The kernel choices a GPU gets, run on the CPU devices here with their features saying
"discrete-gpu": row kernels of 64 lanes reducing across subgroups, attention without packed
query tiles, lanes splitting a weight row, no CPU-only fused variants. CI has no GPU, so
without this these paths would first run on one. (Matmul shapes: test_matmul's OTHER_SHAPES;
a GPU's unrolled slot loops take lavapipe's LLVM ~40 s a kernel, so the model here rolls them.)"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import DEVICES
from gguf_fixtures import write_model
from vkdflash import conformance as cf
from vkdflash.kernels import attention, matmul, rows
from vkdflash.model import forward, load_model
from vkdflash.model.forward import Model
from vkdflash.runtime.context import Context

CPU_DEVICES = [d.index for d in DEVICES if d.device_type == "cpu"]
CASES = [c for c in cf.all_cases() if not c.name.startswith("matmul/")]


@pytest.fixture(scope="module", params=CPU_DEVICES, ids=[f"dev{i}" for i in CPU_DEVICES])
def gpu_like(request):
    ctx = Context(request.param)
    ctx.features.device_type = "discrete-gpu"
    # the seam works: these are the choices a GPU gets
    assert rows.workgroup(ctx) >= 64 and attention.pack(ctx.features) == 1
    assert matmul.config_for(ctx.features).split > 1
    yield ctx
    ctx.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kernels_conform_with_gpu_choices(gpu_like, case):
    res = cf.run_case(gpu_like, case)
    assert res.ok, f"{case.name}: error {res.error:.3g} > {case.threshold:g} {res.detail}"


def test_the_model_with_gpu_choices_is_batch_invariant(gpu_like, ctx0, tmp_path, monkeypatch):
    """A 12-row pass gives every row the bits of 1-row passes, and the logits of the CPU choices."""
    if ctx0.features.device_type != "cpu":
        pytest.skip("the default device is a GPU: its own tests run these paths")
    config_for = matmul.config_for

    def rolled(features):
        return dataclasses.replace(config_for(features), rolled_slots=features.device_type != "cpu")
    monkeypatch.setattr(matmul, "config_for", rolled)
    monkeypatch.setattr(forward, "config_for", rolled)
    path = write_model(tmp_path / "m.gguf", "llama", n_layer=2, n_embd=128, n_ff=256, n_head=2, n_head_kv=1,
                       head_dim=64, weight_type="q4_1")
    tokens = np.random.default_rng(5).integers(0, 270, 20).tolist()

    def logits(ctx, cache: str):
        with load_model(path) as mf:
            m = Model(ctx, mf, n_ctx=64, ctk=cache, ctv=cache)
            try:
                m.forward(tokens[:8])
                batch = m.forward(tokens[8:], all_logits=True).logits
                m.reset()
                m.forward(tokens[:8])
                single = np.concatenate([m.forward([t], all_logits=True).logits for t in tokens[8:]])
            finally:
                m.close()
        assert np.array_equal(batch.view(np.uint32), single.view(np.uint32)), f"{cache}: rows depend on the batch"
        return batch

    for cache in ("f16", "q4_0"):
        gpu, cpu = logits(gpu_like, cache), logits(ctx0, cache)
        assert cf.nmse(gpu, cpu) < 1e-4, cache
