"""The command line: exit codes, one-line errors, JSON output."""
from __future__ import annotations

import json

from click.testing import CliRunner

from vkdflash.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_devices_lists_and_marks_default():
    res = run("devices")
    assert res.exit_code == 0, res.output
    assert "*0:" in res.output or "* " in res.output or "*" in res.output.splitlines()[0]
    data = json.loads(run("devices", "--json").output)
    assert sum(d["default"] for d in data) == 1 and all("subgroup_size" in d for d in data)


def test_bad_device_is_one_line_error():
    res = run("conformance", "--device", "99", "--filter", "copy")
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vkdflash: error:") and "99" in lines[0]


def test_conformance_filter_and_json(tmp_path):
    out = tmp_path / "c.json"
    res = run("conformance", "--filter", "copy/*", "--json", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["results"] and all(r["pass"] and r["case"].startswith("copy/") for r in data["results"])
    assert "passed, 0 failed" in res.output


def test_conformance_unknown_filter_fails():
    res = run("conformance", "--filter", "no-such-kernel")
    assert res.exit_code == 1 and "no conformance case matches" in res.output
