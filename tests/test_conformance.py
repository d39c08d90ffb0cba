"""Every conformance case on every Vulkan device present (the same cases `vkdflash conformance` runs)."""
from __future__ import annotations

import pytest

from vkdflash.conformance import all_cases, run_case

CASES = all_cases()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_case(ctx, case):
    before = set(ctx.pipelines)
    res = run_case(ctx, case)
    assert res.ok, f"{case.name}: {case.metric} error {res.error:.3g} > {case.threshold:g} {res.detail}"
    assert set(ctx.pipelines) <= before  # a case's kernels go with it (lavapipe: ~12 MB each)
