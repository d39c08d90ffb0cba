"""GGUF container parsing: metadata and tensor directory, memory-mapped, every read bounds-checked.

gguf-py's GGUFReader builds a numpy view per array element (about 12 s of CPU for a 150k-token
vocabulary here) and loops on array lengths it never checks against the file size, so a corrupt
length can hang it. This parser walks the same format (GGUF v2/v3, little endian) with struct,
checks every count against the bytes left, and reports problems as one-line VkdflashErrors.
gguf-py still supplies the type tables and writes the test files.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import VkdflashError, quote
from .metadata import Metadata

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_NAME = 1 << 16           # bytes in a key or tensor name
MAX_ALIGNMENT = 1 << 20      # llama.cpp writes 32; larger only pads the file
# what a path that is not a regular file is: mapping one would block (a FIFO) or misread it
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_SCALARS = {  # value type -> struct format
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class TensorData(NamedTuple):
    type_id: int             # ggml type id
    shape: tuple[int, ...]   # ggml order: shape[0] = elements per row
    data: np.ndarray         # raw bytes, np.uint8, a read-only view of the mapped file


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]   # ggml order: shape[0] = elements per row (ne0)
    offset: int              # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.type_id).name


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise VkdflashError(f"truncated: {what} at byte {self.pos} runs past the end of the file "
                                f"({self.size} bytes)")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.unpack("<Q", what)
        if limit is not None and n > limit:
            raise VkdflashError(f"{what} is {n} bytes long (limit {limit})")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise VkdflashError(f"{what} at byte {self.pos - n} is not valid UTF-8") from None


def _check_regular(path: str) -> None:
    """Refuse a path (symlinks followed) that is not a regular file, before opening it: opening a FIFO
    waits for a writer forever, and a pipe or device has no size to map."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
        raise VkdflashError(f"{path} is {kind}, not a GGUF file")


class GGUFFile:
    """A parsed GGUF: `metadata` (a Metadata: key -> value with typed reads), `value_types` (key ->
    GGUFValueType, arrays as (ARRAY, item type)), `tensors` (name -> TensorInfo, file order). Arrays
    of numbers are numpy arrays, arrays of strings are lists of str. The tensor data must tile the
    data section (check_layout)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            _check_regular(self.path)
            # non-blocking: a file swapped for a FIFO after the check fails to map instead of hanging
            with open(self.path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    raise VkdflashError(f"{self.path}: {self.file_size} bytes is too short for a GGUF file")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise VkdflashError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        try:
            self._parse()
        except VkdflashError as exc:
            self.close()
            raise VkdflashError(f"{self.path}: {exc}") from None

    def _parse(self) -> None:
        c = _Cursor(self._mm, self.file_size)
        if self._mm[:4] != GGUF_MAGIC:
            raise VkdflashError(f"not a GGUF file (magic {bytes(self._mm[:4])!r}, expected b'GGUF')")
        c.pos = 4
        self.version = c.unpack("<I", "version")
        if self.version not in (2, 3):
            hint = " (big-endian files are not supported)" if self.version & 0xFFFF == 0 else ""
            raise VkdflashError(f"unsupported GGUF version {self.version}{hint}")
        n_tensors = c.unpack("<Q", "tensor count")
        n_kv = c.unpack("<Q", "metadata count")
        # smallest possible entries: a key/value is 8+1+4+1 bytes, a tensor 8+1+4+8+4+8
        if n_kv * 14 > self.file_size or n_tensors * 33 > self.file_size:
            raise VkdflashError(f"header claims {n_kv} metadata entries and {n_tensors} tensors, "
                                f"impossible in {self.file_size} bytes")
        values: dict[str, Any] = {}
        self.value_types: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string("metadata key", MAX_NAME)
            if key in values:
                raise VkdflashError(f"duplicate metadata key {quote(key)}")
            values[key], self.value_types[key] = self._value(c, key)
        self.metadata = Metadata(values, self.value_types)
        align = self.metadata.int("general.alignment", 1, MAX_ALIGNMENT, default=32)
        if align & (align - 1):
            raise VkdflashError(f"general.alignment {align} is not a power of two")
        self.alignment = align
        infos = [self._tensor_info(c) for _ in range(n_tensors)]
        self.header_size = c.pos
        self.data_offset = -(-c.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, type_id, rel in infos:
            if name in self.tensors:
                raise VkdflashError(f"duplicate tensor {quote(name)}")
            qt = GGMLQuantizationType(type_id)
            block, block_bytes = GGML_QUANT_SIZES[qt]
            if shape[0] % block:
                raise VkdflashError(f"tensor {quote(name)}: row length {shape[0]} is not a multiple of the "
                                    f"{qt.name} block size {block}")
            nbytes = int(np.prod(shape, dtype=object)) // block * block_bytes
            start = self.data_offset + rel
            if start + nbytes > self.file_size:
                raise VkdflashError(f"tensor {quote(name)} data (bytes {start}..{start + nbytes}) lies past the end "
                                    f"of the file ({self.file_size} bytes): truncated or corrupt")
            self.tensors[name] = TensorInfo(name, type_id, shape, start, nbytes)
        self.check_layout()

    def check_layout(self) -> None:
        """The data section starts at the aligned end of the header and the tensors tile it: in
        offset order each starts where the previous ended, rounded up to the alignment, and the
        last ends the file (plus at most its padding). A tensor count cut short, a type patched to
        one of another size, or overlapping or stray offsets all break the tiling, and the
        weights would be read from the wrong bytes."""
        align, pos = self.alignment, self.data_offset
        for t in sorted(self.tensors.values(), key=lambda t: t.offset):
            if t.offset % align:
                raise VkdflashError(f"tensor {quote(t.name)} offset {t.offset - self.data_offset} is not a multiple "
                                    f"of the alignment {align}")
            if t.offset < pos:
                raise VkdflashError(f"tensor {quote(t.name)} data (bytes {t.offset}..{t.offset + t.nbytes}) overlaps "
                                    f"the previous tensor's, which ends at byte {pos}")
            if t.offset > pos:
                raise VkdflashError(f"{t.offset - pos} unused bytes before tensor {quote(t.name)} (at byte {pos}): "
                                    "the tensor table does not describe this file's data")
            pos = -(-(t.offset + t.nbytes) // align) * align
        end = pos if self.tensors else self.header_size
        if self.file_size > max(end, self.data_offset):
            raise VkdflashError(f"the tensors' data ends at byte {end}, the file at {self.file_size}: "
                                "the tensor table does not describe this file's data")

    def _value(self, c: _Cursor, key: str):
        key = quote(key)  # every message below echoes it
        raw = c.unpack("<I", f"type of {key}")
        try:
            vtype = GGUFValueType(raw)
        except ValueError:
            raise VkdflashError(f"metadata {key} has unknown value type {raw}") from None
        if vtype == GGUFValueType.STRING:
            return c.string(f"value of {key}"), vtype
        if vtype in _SCALARS:
            return c.unpack(_SCALARS[vtype], f"value of {key}"), vtype
        raw = c.unpack("<I", f"item type of {key}")
        try:
            itype = GGUFValueType(raw)
        except ValueError:
            raise VkdflashError(f"metadata {key} has unknown array item type {raw}") from None
        count = c.unpack("<Q", f"length of {key}")
        if itype == GGUFValueType.STRING:
            c.need(count * 8, f"array {key} ({count} strings)")
            return [c.string(f"item of {key}") for _ in range(count)], (vtype, itype)
        if itype not in _SCALARS:
            raise VkdflashError(f"metadata {key}: arrays of {itype.name} are not supported")
        dtype = np.dtype(_SCALARS[itype])
        c.need(count * dtype.itemsize, f"array {key} ({count} x {itype.name})")
        arr = np.frombuffer(self._mm, dtype, count, c.pos).copy()  # metadata must outlive the mapping
        c.pos += count * dtype.itemsize
        return arr, (vtype, itype)

    def _tensor_info(self, c: _Cursor):
        full = c.string("tensor name", MAX_NAME)
        name = quote(full)  # what messages echo
        n_dims = c.unpack("<I", f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise VkdflashError(f"tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        shape = tuple(c.unpack("<Q", f"shape of {name}") for _ in range(n_dims))
        if min(shape) < 1 or int(np.prod(shape, dtype=object)) >= 1 << 50:
            raise VkdflashError(f"tensor {name} has an absurd shape {list(shape)}")
        type_id = c.unpack("<I", f"type of {name}")
        if type_id not in GGMLQuantizationType._value2member_map_:
            raise VkdflashError(f"tensor {name} has unknown ggml type id {type_id}")
        return full, shape, type_id, c.unpack("<Q", f"offset of {name}")

    def tensor(self, name: str) -> TensorData:
        """A tensor's type, shape and raw bytes (data); a one-line error where the file has none of
        that name."""
        t = self.tensors.get(name)
        if t is None:
            raise VkdflashError(f"{self.path}: no tensor {name}")
        return TensorData(t.type_id, t.shape, self.data(name))

    def data(self, name: str) -> np.ndarray:
        """The raw bytes of a tensor: a read-only np.uint8 view of the mapping (no copy)."""
        t = self.tensors[name]
        if self._mm is None:
            raise VkdflashError(f"{self.path}: file already closed")
        return np.frombuffer(self._mm, np.uint8, t.nbytes, t.offset)

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views still alive: the mapping goes when they do
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
