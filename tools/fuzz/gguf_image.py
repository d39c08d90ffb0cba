"""A GGUF file as an editable structure that writes back byte for byte.

The engine's parser checks and rejects; this one only splits a well-formed file into its parts
(ordered key/values with their declared types, tensor directory, data) so that mutations can edit
the parts and then the raw bytes. Strings stay bytes, so invalid UTF-8 can be planted. The data
section may be held sparse: `data` is a prefix, the rest up to `data_size` is written as a hole
(zeros, no disk cost), which is enough for a header mutation of a 100 MB model.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field, replace
from typing import Any

STRING, ARRAY = 8, 9
BOOL = 7
FLOAT_TYPES = {6: "<f", 12: "<d"}
INT_TYPES = {0: (1, False), 1: (1, True), 2: (2, False), 3: (2, True), 4: (4, False), 5: (4, True),
             10: (8, False), 11: (8, True)}   # type -> (bytes, signed)
SCALAR_SIZE = {t: n for t, (n, _) in INT_TYPES.items()} | {6: 4, 12: 8, BOOL: 1}


@dataclass(frozen=True)
class KV:
    key: bytes
    vtype: int
    value: Any                   # int / float for scalars (bool as its byte), bytes for a string, list for an array
    item_type: int | None = None
    raw: bytes | None = None     # when set, written instead of the whole encoded entry (key included)


@dataclass(frozen=True)
class Tensor:
    name: bytes
    dims: tuple[int, ...]
    type_id: int
    offset: int                  # relative to the data section, as stored
    raw: bytes | None = None     # when set, written instead of the whole encoded entry


@dataclass
class Image:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes                  # the stored prefix of the data section
    data_size: int               # the data section's full size (beyond `data`: zeros)
    alignment: int = 32          # padding after the header
    magic: bytes = b"GGUF"
    n_kv: int | None = None      # header counts, when they should lie
    n_tensors: int | None = None
    edits: list[tuple[int, bytes]] = field(default_factory=list)   # overwrites at file offsets, last
    length: int | None = None    # truncate the written file to this many bytes

    def copy(self) -> "Image":
        return replace(self, kvs=list(self.kvs), tensors=list(self.tensors), edits=list(self.edits))

    def index(self, key: str | bytes) -> int | None:
        k = key.encode() if isinstance(key, str) else key
        return next((i for i, kv in enumerate(self.kvs) if kv.key == k), None)

    def get(self, key: str) -> KV | None:
        i = self.index(key)
        return None if i is None else self.kvs[i]

    def put(self, kv: KV) -> None:
        """Replace the entry with kv's key, or append it."""
        i = self.index(kv.key)
        if i is None:
            self.kvs.append(kv)
        else:
            self.kvs[i] = kv

    def header(self) -> bytes:
        out = [self.magic, struct.pack("<IQQ", self.version,
                                       len(self.tensors) if self.n_tensors is None else self.n_tensors,
                                       len(self.kvs) if self.n_kv is None else self.n_kv)]
        for kv in self.kvs:
            out.append(kv.raw if kv.raw is not None else
                       encode_string(kv.key) + encode_value(kv.vtype, kv.value, kv.item_type))
        for t in self.tensors:
            out.append(t.raw if t.raw is not None else encode_tensor(t))
        head = b"".join(out)
        return head + bytes(-len(head) % self.alignment)

    def write(self, path) -> int:
        """Write the file; returns its size."""
        head = self.header()
        with open(path, "wb") as f:
            f.write(head)
            f.write(self.data[:self.data_size])
            f.truncate(len(head) + self.data_size)
            size = len(head) + self.data_size
            for pos, blob in self.edits:
                if pos < size:
                    f.seek(pos)
                    f.write(blob[:size - pos])
            if self.length is not None and self.length < size:
                f.truncate(self.length)
                size = self.length
        return size


def encode_string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def encode_tensor(t: Tensor, n_dims: int | None = None) -> bytes:
    """A directory entry; n_dims, when given, is the dimension count it claims."""
    u64 = (1 << 64) - 1  # any number fits: -1 is all ones
    dims = struct.pack(f"<{len(t.dims)}Q", *(d & u64 for d in t.dims))
    return encode_string(t.name) + struct.pack("<I", len(t.dims) if n_dims is None else n_dims) + dims + \
        struct.pack("<IQ", t.type_id & 0xFFFFFFFF, t.offset & u64)


def encode_scalar(vtype: int, value) -> bytes:
    """Any number fits: ints wrap to the width (-1 -> all ones), floats round to f32 (1e300 -> inf)."""
    if vtype in INT_TYPES or vtype == BOOL:
        n = SCALAR_SIZE[vtype]
        return (int(value) % (1 << 8 * n)).to_bytes(n, "little")
    if vtype == 6:
        import numpy as np
        with np.errstate(over="ignore"):
            return np.float32(value).tobytes()
    return struct.pack("<d", float(value))


def encode_value(vtype: int, value, item_type: int | None = None) -> bytes:
    head = struct.pack("<I", vtype)
    if vtype == STRING:
        return head + encode_string(value)
    if vtype != ARRAY:
        return head + encode_scalar(vtype, value)
    head += struct.pack("<IQ", item_type, len(value))
    if item_type == STRING:
        return head + b"".join(encode_string(v) for v in value)
    if item_type == ARRAY:  # nested arrays: each item is (item type, items)
        return head + b"".join(encode_value(ARRAY, v[1], v[0])[4:] for v in value)
    return head + b"".join(encode_scalar(item_type, v) for v in value)


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value if len(value) > 1 else value[0]

    def string(self) -> bytes:
        n = self.take("<Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos])

    def scalar(self, vtype: int):
        if vtype in FLOAT_TYPES:
            return self.take(FLOAT_TYPES[vtype])
        n, signed = INT_TYPES.get(vtype, (1, False))  # BOOL keeps its byte
        self.pos += n
        return int.from_bytes(self.buf[self.pos - n:self.pos], "little", signed=signed)

    def value(self, vtype: int):
        if vtype == STRING:
            return self.string(), None
        if vtype != ARRAY:
            return self.scalar(vtype), None
        item_type, count = self.take("<IQ")
        if item_type == STRING:
            return [self.string() for _ in range(count)], item_type
        if item_type == ARRAY:
            return [tuple(reversed(self.value(ARRAY))) for _ in range(count)], item_type
        return [self.scalar(item_type) for _ in range(count)], item_type


def read(path, keep_data: bool = True) -> Image:
    """Parse a well-formed GGUF; keep_data=False holds the data section sparse (size only)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        r = _Reader(mm)
        magic = bytes(mm[:4])
        r.pos = 4
        version, n_tensors, n_kv = r.take("<IQQ")
        kvs = []
        for _ in range(n_kv):
            key, vtype = r.string(), r.take("<I")
            value, item_type = r.value(vtype)
            kvs.append(KV(key, vtype, value, item_type))
        tensors = []
        for _ in range(n_tensors):
            name, n_dims = r.string(), r.take("<I")
            dims = tuple(r.take("<Q") for _ in range(n_dims))
            type_id, offset = r.take("<IQ")
            tensors.append(Tensor(name, dims, type_id, offset))
        align = next((kv.value for kv in kvs if kv.key == b"general.alignment" and kv.vtype == 4), 32)
        start = r.pos + (-r.pos % align)
        data = bytes(mm[start:]) if keep_data else b""
        return Image(version, kvs, tensors, data, len(mm) - start, align, magic)
