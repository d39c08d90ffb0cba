"""Tensor-directory and raw-byte mutations, the stacked kind, and KINDS: every mutation kind by name."""
from __future__ import annotations

import random
import struct
from dataclasses import replace

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from . import mutations as M
from .mutations import Mutation
from .gguf_image import ARRAY, STRING, Image, Tensor, encode_string, encode_tensor, encode_value

VALID_TYPE_IDS = [int(t) for t in GGMLQuantizationType]
INVALID_TYPE_IDS = [4, 5, 31, 42, 255, 2**31, 2**32 - 1]
EDGE_DIMS = [0, 1, 2, 33, 255, 2**31, 2**40, 2**63, 2**64 - 1]
EDGE_LENGTHS = [2**31, 2**32, 2**62, 2**63, 2**64 - 1]


def _nbytes(t: Tensor) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
    n = 1
    for d in t.dims:
        n *= d
    return n // block * size


class TensorInfoEdit(Mutation):
    """A directory entry's type (valid, smaller, unknown), dims, offset (shifted, misaligned,
    overlapping, past the end) or name; entries removed, added or swapped."""
    name = "tensor_info"

    def apply(self, img, rng):
        if not img.tensors:
            return "no tensors"
        i = rng.randrange(len(img.tensors))
        t = img.tensors[i]
        op = rng.choice(["type", "type", "dims", "dims", "offset", "offset", "name", "remove", "add", "swap"])
        if op == "type":
            new = rng.choice(VALID_TYPE_IDS if rng.random() < 0.8 else INVALID_TYPE_IDS)
            img.tensors[i] = replace(t, type_id=new)
            return f"{M.show(t.name)} type {t.type_id} -> {new}"
        if op == "dims":
            dims = list(t.dims)
            how = rng.choice(["edge", "swap", "append", "drop", "five"])
            if how == "edge":
                dims[rng.randrange(len(dims))] = rng.choice(EDGE_DIMS)
            elif how == "swap":
                dims.reverse()
            elif how == "append":
                dims.append(rng.choice([1, 2]))
            elif how == "drop" and len(dims) > 1:
                dims.pop()
            else:
                dims = (dims + [1] * 5)[:5]
            img.tensors[i] = replace(t, dims=tuple(dims))
            return f"{M.show(t.name)} dims {list(t.dims)} -> {dims}"
        if op == "offset":
            other = rng.choice(img.tensors).offset
            new = rng.choice([t.offset + img.alignment, t.offset - img.alignment, t.offset + 1, other, img.data_size,
                              img.data_size - img.alignment, 2**63, 2**64 - 1, 0])
            img.tensors[i] = replace(t, offset=new)
            return f"{M.show(t.name)} offset {t.offset} -> {new}"
        if op == "name":
            new = rng.choice([rng.choice(img.tensors).name, b"blk.99.attn_q.weight", b"", b"\xff\xfe", b"output.weight",
                              b"token_embd.weight", b"n" * 70_000, t.name + b".extra"])
            img.tensors[i] = replace(t, name=new)
            return f"{M.show(t.name)} renamed {M.show(new)}"
        if op == "remove":
            del img.tensors[i]
            return f"{M.show(t.name)} removed"
        if op == "add":
            img.tensors.append(replace(t, name=rng.choice([b"extra.weight", t.name + b"_copy", b"blk.0.attn_q.bias"])))
            return f"{M.show(t.name)} added again"
        j = rng.randrange(len(img.tensors))
        img.tensors[i], img.tensors[j] = replace(t, name=img.tensors[j].name), replace(img.tensors[j], name=t.name)
        return f"names of {M.show(t.name)} and {M.show(img.tensors[i].name)} swapped"


class CountsVersion(Mutation):
    """The fixed header: magic, version (old, future, big-endian), key and tensor counts that lie."""
    name = "counts_version"

    def apply(self, img, rng):
        op = rng.choice(["n_kv", "n_kv", "n_tensors", "n_tensors", "version", "magic"])
        if op == "version":
            img.version = rng.choice([0, 1, 2, 4, 3 << 24, 2**32 - 1])
            return f"version {img.version}"
        if op == "magic":
            img.magic = rng.choice([b"GGML", b"FUGG", b"gguf", b"\0\0\0\0", b"GGUG"])
            return f"magic {img.magic!r}"
        real = len(img.kvs) if op == "n_kv" else len(img.tensors)
        new = rng.choice([real - 1, real + 1, real - 1, real + 1, 0, real + 1000] + EDGE_LENGTHS) % 2**64
        setattr(img, op, new)
        return f"{op} {real} -> {new}"


class Truncate(Mutation):
    """The file cut short: inside the fixed header, the metadata, the tensor directory or the data."""
    name = "truncate"

    def apply(self, img, rng):
        head = len(img.header())
        total = head + img.data_size
        img.length = rng.choice([rng.randrange(0, 24), rng.randrange(0, head), rng.randrange(0, head), head,
                                 rng.randrange(head, total), total - 1])
        return f"truncated to {img.length} of {total} bytes (header {head})"


class HeaderBytes(Mutation):
    """Random bytes or flipped bits in the header; regions weighted so a 2 MB vocabulary does not
    take every hit."""
    name = "header_bytes"

    def apply(self, img, rng):
        head = img.header()
        tensors_at = len(head.rstrip(b"\0")) - sum(len(t.raw or encode_tensor(t)) for t in img.tensors)
        regions = [(0, 24), (24, max(25, tensors_at)), (max(24, tensors_at), len(head))]
        hits = []
        for _ in range(rng.randint(1, 8)):
            lo, hi = rng.choice(regions)
            pos = rng.randrange(lo, max(lo + 1, hi))
            new = rng.randrange(256) if rng.random() < 0.5 else head[min(pos, len(head) - 1)] ^ (1 << rng.randrange(8))
            img.edits.append((pos, bytes([new])))
            hits.append(pos)
        return f"bytes at {sorted(hits)}"


class DataBytes(Mutation):
    """Tensor data with random bytes, NaN / inf floats, or inf / NaN block scales."""
    name = "data_bytes"

    def apply(self, img, rng):
        start = len(img.header())
        small = [t for t in img.tensors if _nbytes(t) <= 4 << 20 and t.offset + _nbytes(t) <= img.data_size]
        if not small or rng.random() < 0.3:
            for _ in range(rng.randint(1, 32)):
                noise = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
                img.edits.append((start + rng.randrange(max(1, img.data_size)), noise))
            return "random bytes in the data"
        t = rng.choice(small)
        blob = bytearray(img.data[t.offset:t.offset + _nbytes(t)].ljust(_nbytes(t), b"\0"))
        which = rng.randrange(3)  # NaN, inf, -inf
        f16 = [b"\x00\x7e", b"\x00\x7c", b"\x00\xfc"][which]
        if t.type_id == 0:
            blob[:] = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff"][which] * (len(blob) // 4)
        elif t.type_id == 1:
            blob[:] = f16 * (len(blob) // 2)
        else:  # most block formats start with an f16 scale
            block = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)][1]
            for b in range(0, len(blob), block):
                blob[b:b + 2] = f16
        img.edits.append((start + t.offset, bytes(blob)))
        return f"{M.show(t.name)} data -> non-finite"


class StringLength(Mutation):
    """Length and count fields that lie: a key, a string value, an array count, a tensor name, a dimension count."""
    name = "string_length"

    def apply(self, img, rng):
        types = {kv.vtype for kv in img.kvs}
        present = {"key": img.kvs, "string": STRING in types, "array": ARRAY in types, "tensor_name": img.tensors,
                   "n_dims": img.tensors}
        op = rng.choice([op for op, there in present.items() if there] or ["none"])
        if op == "none":
            return "nothing to lie about"
        if op in ("tensor_name", "n_dims"):
            i = rng.randrange(len(img.tensors))
            t = img.tensors[i]
            if op == "n_dims":
                claim = rng.choice([0, 5, 2**31, 2**32 - 1, len(t.dims) + 1])
                img.tensors[i] = replace(t, raw=encode_tensor(t, claim))
                return f"{M.show(t.name)} claims {claim} dims"
            lie = self._lie(rng, len(t.name))
            img.tensors[i] = replace(t, raw=struct.pack("<Q", lie) + encode_tensor(t)[8:])
            return f"tensor name {M.show(t.name)} length {lie}"
        want = {"string": STRING, "array": ARRAY}.get(op)
        i = rng.choice([i for i, kv in enumerate(img.kvs) if want is None or kv.vtype == want])
        kv = img.kvs[i]
        key, body = encode_string(kv.key), encode_value(kv.vtype, kv.value, kv.item_type)
        real = len(kv.key) if op == "key" else len(kv.value)
        lie = struct.pack("<Q", self._lie(rng, real))
        if op == "key":
            raw = lie + key[8:] + body
        elif op == "string":  # body: type u32, length u64, bytes
            raw = key + body[:4] + lie + body[12:]
        else:                 # body: type u32, item type u32, count u64, items
            raw = key + body[:8] + lie + body[16:]
        img.kvs[i] = replace(kv, raw=raw)
        return f"{op} of {M.show(kv.key)}: length {struct.unpack('<Q', lie)[0]} (really {real})"

    @staticmethod
    def _lie(rng: random.Random, real: int) -> int:
        return rng.choice([real + 1, real + 1000, max(0, real - 1), 0] + EDGE_LENGTHS)


class Clean(Mutation):
    """No mutation: the control. Every clean case must be accepted, or the campaign tests only refusals."""
    name = "clean"

    def apply(self, img, rng):
        return "none"


class Stacked(Mutation):
    """Two to four mutations of the other structural kinds, one after another."""
    name = "stacked"

    def apply(self, img, rng):
        parts = [rng.choice(STACKABLE) for _ in range(rng.randint(2, 4))]
        return "; ".join(f"{k.name}: {k.apply(img, rng)}" for k in parts)


STACKABLE = [M.TypeSwap(), M.ArrayEdit(), M.HparamValue(), M.KeyEdit(), M.TokenizerEdit(), M.ChatTemplateEdit(),
             M.Architecture(), M.Alignment(), TensorInfoEdit(), StringLength()]
KINDS: dict[str, M.Mutation] = {k.name: k for k in [Clean()] + STACKABLE + [CountsVersion(), Truncate(), HeaderBytes(),
                                                                           DataBytes(), Stacked()]}


def mutate(img: Image, kind: str, rng: random.Random) -> str:
    """Apply one kind to img (in place); returns the description."""
    return KINDS[kind].apply(img, rng)
