"""setup.sh, run with stand-ins for dpkg-query and python (no apt, no network, no real venv)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_setup_remakes_a_venv_without_pip(tmp_path):
    """`python3 -m venv .venv` before python3-venv is installed leaves .venv/bin/python and no pip:
    setup.sh skipped making the venv because bin/python existed, then failed at `pip install` on every run."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    repo.mkdir(), bin_.mkdir()
    shutil.copy(ROOT / "setup.sh", repo / "setup.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    log = tmp_path / "log"
    _exe(bin_ / "dpkg-query", "printf 'install ok installed'\n")          # every apt package present
    good_python = f'echo "$@" >> {log}\nexit 0\n'
    _exe(bin_ / "python3", (f'echo "venv $@" >> {log}\n'                  # `python3 -m venv [--clear] .venv`
                            'mkdir -p .venv/bin\n'
                            f"printf '%s' '#!/bin/sh\n{good_python}' > .venv/bin/python\n"
                            'chmod +x .venv/bin/python\n'))
    (repo / ".venv" / "bin").mkdir(parents=True)
    _exe(repo / ".venv" / "bin" / "python", 'echo "No module named pip" >&2\nexit 1\n')
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(repo / "setup.sh"), "--no-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)   # from another folder
    assert done.returncode == 0, done.stderr
    calls = log.read_text()
    assert "venv -m venv" in calls and "-m pip install -q -e .[test]" in calls
    done = subprocess.run(["bash", str(repo / "setup.sh"), "--no-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)   # a second run: the venv is kept
    assert done.returncode == 0, done.stderr
    assert log.read_text().count("venv -m venv") == 1
    assert log.read_text().count("pip install -q -e") == 1  # installed for this pyproject.toml: offline works
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = ['y']\n")
    done = subprocess.run(["bash", str(repo / "setup.sh"), "--no-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)   # a changed project installs again
    assert done.returncode == 0, done.stderr
    assert log.read_text().count("pip install -q -e") == 2
