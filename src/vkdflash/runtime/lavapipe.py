"""lavapipe (Mesa's CPU Vulkan driver) settings, chosen before the driver loads: it reads them
from the environment once, when the Vulkan instance is created. GPU drivers ignore them."""
from __future__ import annotations

import os

VECTOR_WIDTH = "LP_NATIVE_VECTOR_WIDTH"


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux); empty where unknown."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def choose_vector_width(environ=os.environ, flags: set[str] | None = None) -> str:
    """Run lavapipe 512 bits (16 lanes) a SIMD vector on AVX-512 CPUs unless the user chose a
    width; return what was decided and why, for the log.

    Mesa 22.3 uses 256 bits even where the CPU has AVX-512. Measured side by side at 512 on an
    AMD EPYC (Zen 4, 2 cores): a 16-row pass 90 against 125 ms of GPU time, a 1-row pass the same,
    ngram on repeating code 3.58x plain decoding against 3.01x (docs/design.md section 13)."""
    if VECTOR_WIDTH in environ:
        return f"lavapipe SIMD width {environ[VECTOR_WIDTH]} bits ({VECTOR_WIDTH} is set)"
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw"} <= flags:
        environ[VECTOR_WIDTH] = "512"
        return f"lavapipe SIMD width 512 bits (AVX-512 CPU; {VECTOR_WIDTH}=256 restores Mesa's default)"
    return "lavapipe SIMD width: Mesa's default (no AVX-512)"
