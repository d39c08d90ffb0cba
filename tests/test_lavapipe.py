"""lavapipe's SIMD width: chosen from the CPU before the driver loads, a user's choice kept, and
every kernel still conformant at the width this process does not run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vkdflash.runtime.device import list_devices
from vkdflash.runtime.lavapipe import VECTOR_WIDTH, choose_vector_width, cpu_flags

AVX512 = {"avx512f", "avx512bw"}
LAVAPIPE = [d for d in list_devices() if "llvmpipe" in d.driver]
needs_lavapipe = pytest.mark.skipif(not LAVAPIPE, reason="no lavapipe device present")


def test_avx512_cpus_get_512_bit_vectors():
    env: dict = {}
    said = choose_vector_width(env, {"fpu", "avx2", *AVX512})
    assert env == {VECTOR_WIDTH: "512"} and "512 bits" in said and "AVX-512" in said


def test_other_cpus_and_a_users_choice_are_left_alone():
    env: dict = {}
    assert "Mesa's default" in choose_vector_width(env, {"avx2", "fma", "avx512f"}) and env == {}
    env = {VECTOR_WIDTH: "256"}
    assert "256 bits" in choose_vector_width(env, {"avx2", *AVX512}) and env == {VECTOR_WIDTH: "256"}


def test_cpu_flags_come_from_proc_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512bw\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(f)) == {"fpu", "sse2", "avx512f", "avx512bw"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


def _vkdflash(width: str | None, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a new process (lavapipe reads its width once a process), at `width` or unset."""
    env = {k: v for k, v in os.environ.items() if k != VECTOR_WIDTH}
    if width:
        env[VECTOR_WIDTH] = width
    return subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", *args],
                          env=env, capture_output=True, text=True, timeout=1200)


def _lavapipe_line(out: str) -> str:
    return next(line for line in out.splitlines() if "llvmpipe" in line and "bits" in line)


@needs_lavapipe
def test_the_chosen_width_reaches_the_driver():
    res = _vkdflash(None, "devices")
    assert res.returncode == 0, res.stderr
    if AVX512 <= cpu_flags():
        assert "512 bits" in _lavapipe_line(res.stdout) and "SIMD width 512 bits (AVX-512 CPU" in res.stdout
    else:
        assert "SIMD width: Mesa's default" in res.stdout
    res = _vkdflash("256", "devices")
    assert "256 bits" in _lavapipe_line(res.stdout) and f"({VECTOR_WIDTH} is set)" in res.stdout


@pytest.mark.slow
@needs_lavapipe
def test_kernels_conform_at_the_other_width():
    """This process runs one width; the other (subgroup 8 or 16, other kernel shapes and row
    tiles) must pass conformance too."""
    other = "256" if "512 bits" in LAVAPIPE[0].name else "512"
    res = _vkdflash(other, "conformance", "--quick", "--device", "llvmpipe")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"{other} bits" in res.stdout and ", 0 failed" in res.stdout
