"""No dead imports or unused names anywhere in the project (pyflakes)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pyflakes_is_clean():
    res = subprocess.run([sys.executable, "-m", "pyflakes", "src", "plugins", "tests", "tools"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
