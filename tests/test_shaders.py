"""Shipped SPIR-V must match its GLSL sources (no compiler needed to check)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_spirv_is_current():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "build_shaders.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"stale SPIR-V, run tools/build_shaders.py:\n{res.stdout}{res.stderr}"
