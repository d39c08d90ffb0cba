"""docs/plugins.md's tutorial, executed: its files are written out as an installed distribution
(the entry point from its pyproject block), and the real `vkdflash` command lists the plugin and
generates with both of its strategies, greedy output identical to --spec none. The public API is
all the tutorial imports."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_fixtures import write_model

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
BLOCK = re.compile(r"```(\w+) file=(\S+)( append)?\n(.*?)```", re.S)


def tutorial_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for _, name, append, body in BLOCK.findall(DOCS.read_text(encoding="utf-8")):
        files[name] = files[name] + "\n\n" + body if append else body
    return files


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The tutorial package 'installed': its modules plus a dist-info carrying its entry points."""
    files = tutorial_files()
    root = tmp_path_factory.mktemp("tutorial")
    for name, body in files.items():
        if name != "pyproject.toml":
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(body)
    toml = files["pyproject.toml"]
    dist = re.search(r'name = "([^"]+)"', toml).group(1).replace("-", "_")
    points = toml.split("[project.entry-points.vkdflash]")[1].strip()
    info = root / f"{dist}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[vkdflash]\n" + points.replace('"', "") + "\n")
    return root


def vkdflash(site, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, "-c", "from vkdflash.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_the_tutorial_imports_only_the_public_api():
    for name, body in tutorial_files().items():
        for module in re.findall(r"^\s*from (vkdflash[\w.]*) import", body, re.M):
            assert module == "vkdflash.api", (name, module)


def test_the_tutorial_plugin_is_listed_and_its_strategies_run(site, tmp_path):
    listed = vkdflash(site, "plugins")
    assert listed.returncode == 0, listed.stderr
    assert "bigram" in listed.stdout and "--spec-opt bigram.depth=<int>" in listed.stdout and "--spec embed" in listed.stdout
    model = str(write_model(tmp_path / "t.gguf", "llama", n_embd=128, n_ff=256, n_head=2, n_head_kv=1,
                            head_dim=64, seed=9))
    # --draft-fixed: a 16-token run repays no kernel compiles, so cost-aware would not draft
    base = ["generate", "-m", model, "ab ab ab ab ab ab", "-n", "16", "--temp", "0", "-c", "64"]
    plain = vkdflash(site, *base)
    assert plain.returncode == 0, plain.stderr
    for extra in (["--spec", "bigram", "--spec-opt", "bigram.depth=8"], ["--spec", "embed"]):
        res = vkdflash(site, *base, *extra, "--draft-fixed")
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert res.stdout == plain.stdout
        drafted = re.search(r"drafted (\d+)", res.stderr)
        assert drafted and int(drafted.group(1)) > 0 and "switched off" not in res.stderr, res.stderr
