"""Shipped SPIR-V must match its GLSL sources (no compiler needed to check)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_spirv_is_current():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "build_shaders.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"stale SPIR-V, run tools/build_shaders.py:\n{res.stdout}{res.stderr}"


def test_omit_drops_the_products_no_code_path_dispatches(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_shaders
    finally:
        sys.path.pop(0)
    comp = tmp_path / "k.comp"
    comp.write_text("//! variant k\n//! variant k_glu GLU=1\n//! each T a=A b=B\n//! omit k_glu*_b\n")
    assert build_shaders.variants(comp) == [("k_a", ["T=A"]), ("k_b", ["T=B"]), ("k_glu_a", ["GLU=1", "T=A"])]
