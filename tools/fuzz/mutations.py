"""Metadata mutations: each kind edits a parsed GGUF (an Image) in one family of ways and returns a
short description of what it did. Counted per kind, so each family's outcomes show separately.
The tensor-directory and raw-byte kinds are in mutations_raw.py; KINDS gathers both."""
from __future__ import annotations

import random

from . import hostile
from .gguf_image import ARRAY, BOOL, INT_TYPES, KV, STRING, Image

SUPPORTED_ARCHS = [b"llama", b"qwen2", b"qwen3", b"dflash", b"mtp"]
# optional keys the loaders read when present (suffixes after "<arch>.")
OPTIONAL_HPARAMS = ["rope.dimension_count", "rope.scaling.type", "rope.scaling.factor", "vocab_size", "expert_count",
                    "nextn_predict_layers", "nextn.hidden", "attention.key_length", "attention.value_length",
                    "block_size", "target_layers", "target_architecture"]
TOKEN_ID_KEYS = ["bos", "eos", "eot", "eom", "pad", "unknown", "mask", "sep"]


def show(b: bytes, limit: int = 40) -> str:
    text = b.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def arch_of(img: Image) -> bytes:
    kv = img.get("general.architecture")
    return kv.value if kv is not None and kv.vtype == STRING else b"llama"


def pick_kv(img: Image, rng: random.Random, prefixes=()) -> int | None:
    """Index of a random key/value, preferring keys that start with one of `prefixes`."""
    if not img.kvs:
        return None
    preferred = [i for i, kv in enumerate(img.kvs) if prefixes and kv.key.startswith(tuple(prefixes))]
    return rng.choice(preferred if preferred and rng.random() < 0.8 else range(len(img.kvs)))


def hparam_prefixes(img: Image) -> tuple[bytes, ...]:
    return arch_of(img) + b".", b"tokenizer.ggml.", b"general."


class Mutation:
    name = ""

    def apply(self, img: Image, rng: random.Random) -> str:
        raise NotImplementedError


class TypeSwap(Mutation):
    """Same key, same meaning, another declared type: scalar <-> array, int <-> string <-> float <-> bool."""
    name = "type_swap"

    def apply(self, img, rng):
        i = pick_kv(img, rng, hparam_prefixes(img))
        if i is None:
            return "no metadata"
        kv = img.kvs[i]
        new_type = rng.choice([t for t in hostile.ALL_TYPES if t != kv.vtype])
        value, item = hostile.convert(kv.vtype, kv.value, kv.item_type, new_type, rng)
        img.kvs[i] = KV(kv.key, new_type, value, item)
        return f"{show(kv.key)} type {kv.vtype} -> {new_type}"


class ArrayEdit(Mutation):
    """Arrays too short, too long, empty, or of another element type (nested arrays included)."""
    name = "array_edit"

    def apply(self, img, rng):
        arrays = [i for i, kv in enumerate(img.kvs) if kv.vtype == ARRAY]
        if not arrays:
            return TypeSwap().apply(img, rng)
        i = rng.choice(arrays)
        kv = img.kvs[i]
        items, op = list(kv.value), rng.choice(["empty", "shorter", "longer", "item_type", "duplicate"])
        item_type = kv.item_type
        if op == "empty":
            items = []
        elif op == "shorter":
            items = items[:rng.randrange(len(items))] if items else items
        elif op == "longer":
            items += (items[-1:] or [hostile.filler(item_type)]) * rng.choice([1, 2, 1000])
        elif op == "duplicate":
            items = items * 2
        else:
            item_type = rng.choice([t for t in hostile.ALL_TYPES if t != kv.item_type])
            items = [hostile.convert(kv.item_type, v, None, item_type, rng)[0] for v in items[:300]]
            if item_type == ARRAY:
                items = [(STRING, [b"x"])] * len(items)
        img.kvs[i] = KV(kv.key, ARRAY, items, item_type)
        return f"{show(kv.key)} {op}: {len(kv.value)} -> {len(items)} items of type {item_type}"


class HparamValue(Mutation):
    """Numbers at the edges (0, -1, 2**63, NaN, inf, 1e-45, 1e30) for the architecture's keys and token ids."""
    name = "hparam_value"

    def apply(self, img, rng):
        arch = arch_of(img)
        if rng.random() < 0.25:
            key = arch + b"." + rng.choice(OPTIONAL_HPARAMS).encode()
        else:
            numeric = [kv.key for kv in img.kvs if kv.key.startswith((arch + b".", b"tokenizer.ggml."))
                       and (kv.vtype in INT_TYPES or kv.vtype in (6, 12) or kv.item_type in INT_TYPES)]
            key = rng.choice(numeric) if numeric else arch + b".block_count"
        old = img.get(key)
        if old is not None and old.vtype == ARRAY and old.item_type in INT_TYPES:
            items = [hostile.any_int(rng) if rng.random() < 0.5 else v for v in old.value]
            img.put(KV(key, ARRAY, items, old.item_type))
            return f"{show(key)} array items -> edge values"
        numeric = [4, 5, 10, 11, 6, 12, 0, 1]
        vtype = old.vtype if old is not None and old.vtype in numeric and rng.random() < 0.7 else rng.choice(numeric)
        value = hostile.any_scalar(rng, vtype)
        img.put(KV(key, vtype, value))
        return f"{show(key)} = {value!r} (type {vtype})"


class KeyEdit(Mutation):
    """Keys deleted, duplicated, renamed (case, another architecture's prefix, invalid UTF-8, empty, 70 kB)."""
    name = "key_edit"

    def apply(self, img, rng):
        op = rng.choice(["delete", "delete", "duplicate", "rename", "insert"])
        i = pick_kv(img, rng, hparam_prefixes(img))
        if op == "insert" or i is None:
            key = arch_of(img) + b"." + rng.choice(OPTIONAL_HPARAMS).encode()
            vtype, value, item = hostile.random_value(rng)
            img.put(KV(key, vtype, value, item))
            return f"insert {show(key)} type {vtype}"
        kv = img.kvs[i]
        if op == "delete":
            del img.kvs[i]
            return f"delete {show(kv.key)}"
        if op == "duplicate":
            vtype, value, item = (kv.vtype, kv.value, kv.item_type) if rng.random() < 0.5 else hostile.random_value(rng)
            img.kvs.insert(rng.randrange(len(img.kvs) + 1), KV(kv.key, vtype, value, item))
            return f"duplicate {show(kv.key)}"
        arch = arch_of(img)
        other = rng.choice([a for a in SUPPORTED_ARCHS if a != arch]) + b"."
        new = rng.choice([kv.key.upper(), kv.key + b"x", kv.key.replace(arch + b".", other), b"", kv.key + b"\xff",
                          b"k" * 70_000, kv.key[:-1], b"general.architecture"])
        img.kvs[i] = KV(new, kv.vtype, kv.value, kv.item_type)
        return f"rename {show(kv.key)} -> {show(new)}"


class TokenizerEdit(Mutation):
    """The vocabulary, token types, merges, pre-tokenizer, model name, special ids and add_bos flags."""
    name = "tokenizer"

    def apply(self, img, rng):
        op = rng.choice(["tokens", "token_type", "merges", "pre", "model", "token_id", "add_flag"])
        return getattr(self, op)(img, rng)

    def tokens(self, img, rng):
        kv = img.get("tokenizer.ggml.tokens")
        tokens = list(kv.value) if kv is not None and kv.vtype == ARRAY and kv.item_type == STRING else []
        how = rng.choice(["drop_specials", "duplicate", "invalid_utf8", "empty_text", "giant", "few", "none", "many"])
        if how == "drop_specials":
            tokens = tokens[3:]
        elif how == "duplicate" and tokens:
            tokens[rng.randrange(len(tokens))] = tokens[rng.randrange(len(tokens))]
        elif how in ("invalid_utf8", "empty_text", "giant") and tokens:
            tokens[rng.randrange(len(tokens))] = {"invalid_utf8": b"\xff\xc0", "empty_text": b"",
                                                 "giant": b"t" * 100_000}[how]
        elif how == "few":
            tokens = tokens[:rng.choice([0, 1, 2, 10])]
        elif how == "many":
            tokens = tokens + [b"<x%d>" % i for i in range(rng.choice([1000, 1 << 18]))]
        else:
            tokens = []
        img.put(KV(b"tokenizer.ggml.tokens", ARRAY, tokens, STRING))
        return f"tokens {how}: {len(tokens)}"

    def token_type(self, img, rng):
        kv = img.get("tokenizer.ggml.token_type")
        types = list(kv.value) if kv is not None and kv.vtype == ARRAY and kv.item_type in INT_TYPES else [1] * 10
        how = rng.choice(["values", "shorter", "longer", "all_control", "all_byte"])
        if how == "values":
            for _ in range(rng.randint(1, 5)):
                types[rng.randrange(len(types))] = rng.choice([0, -1, 5, 6, 7, 255, 2**31 - 1, -2**31])
        elif how == "shorter":
            types = types[:-rng.randint(1, len(types))]
        elif how == "longer":
            types += [1] * rng.randint(1, 100)
        else:
            types = [3 if how == "all_control" else 6] * len(types)
        img.put(KV(b"tokenizer.ggml.token_type", ARRAY, types, 5))
        return f"token_type {how}"

    def merges(self, img, rng):
        kv = img.get("tokenizer.ggml.merges")
        merges = list(kv.value) if kv is not None and kv.vtype == ARRAY and kv.item_type == STRING else []
        bad = rng.choice([b"ab", b"a b c", b" a", b"a ", b"", b"zz qq", b"\xff \xfe", b"  ", b"<|im_start|> a"])
        how = rng.choice(["insert", "replace_all", "empty", "duplicate"])
        if how == "insert":
            merges.insert(rng.randrange(len(merges) + 1), bad)
        elif how == "replace_all":
            merges = [bad] * len(merges)
        elif how == "duplicate":
            merges = merges + merges
        else:
            merges = []
        img.put(KV(b"tokenizer.ggml.merges", ARRAY, merges, STRING))
        return f"merges {how} {show(bad)}"

    def pre(self, img, rng):
        value = rng.choice([b"", b"llama3", b"llama-bpe", b"qwen2", b"smollm", b"gpt-4o", b"deepseek-llm", b"default",
                            b"unknown-pre", b"x" * 5000, b"\xff", b"smollm\n"])
        img.put(KV(b"tokenizer.ggml.pre", STRING, value))
        return f"pre = {show(value)}"

    def model(self, img, rng):
        value = rng.choice([b"llama", b"bert", b"", b"gpt2 ", b"GPT2", b"t5", b"none", b"rwkv", b"gpt2\x00"])
        img.put(KV(b"tokenizer.ggml.model", STRING, value))
        return f"model = {show(value)}"

    def token_id(self, img, rng):
        key = b"tokenizer.ggml.%s_token_id" % rng.choice(TOKEN_ID_KEYS).encode()
        vtype = rng.choice([4, 4, 5, 10, 11, 6])
        value = hostile.any_scalar(rng, vtype) if rng.random() < 0.7 else rng.choice([276, 277, 278, 49151, 49152])
        img.put(KV(key, vtype, value))
        return f"{show(key)} = {value!r} (type {vtype})"

    def add_flag(self, img, rng):
        what = rng.choice([b"bos", b"eos"])
        img.put(KV(b"tokenizer.ggml.add_%s_token" % what, BOOL, rng.choice([0, 1, 1, 2])))
        if rng.random() < 0.5:
            img.kvs = [kv for kv in img.kvs if kv.key != b"tokenizer.ggml.%s_token_id" % what]
            return f"add_{what.decode()}_token set, its id deleted"
        return f"add_{what.decode()}_token set"


class ChatTemplateEdit(Mutation):
    """Hostile template programs, non-string templates, named templates, no template (ChatML fallback)."""
    name = "chat_template"

    def apply(self, img, rng):
        key = b"tokenizer.chat_template"
        how = rng.choice(["program"] * 6 + ["typed", "named", "delete"])
        if how == "program":
            source = rng.choice(hostile.TEMPLATES)
            img.put(KV(key, STRING, source.encode("utf-8", "surrogatepass")))
            return f"template {source[:60]!r}"
        if how == "typed":
            vtype, value, item = hostile.random_value(rng)
            img.put(KV(key, vtype, value, item))
            return f"template of type {vtype}"
        if how == "named":
            name = key + b"." + rng.choice([b"tool_use", b"rag", b"", b"\xff"])
            img.put(KV(name, STRING, rng.choice(hostile.TEMPLATES).encode("utf-8", "surrogatepass")))
            return f"named template {show(name)}"
        img.kvs = [kv for kv in img.kvs if kv.key != key]
        return "template deleted"


class Architecture(Mutation):
    """general.architecture missing, an array, a number, unknown, or another supported one (keys renamed or not)."""
    name = "architecture"

    def apply(self, img, rng):
        arch = arch_of(img)
        key = b"general.architecture"
        how = rng.choice(["array", "number", "unknown", "other", "other_with_keys", "delete"])
        if how == "array":
            img.put(KV(key, ARRAY, [arch], STRING))
        elif how == "number":
            img.put(KV(key, 4, 1))
        elif how == "unknown":
            img.put(KV(key, STRING, rng.choice([b"gpt-neox", b"LLAMA", b"", b"llama\x00", b"a" * 3000, b"\xff"])))
        elif how == "delete":
            img.kvs = [kv for kv in img.kvs if kv.key != key]
        else:
            other = rng.choice([a for a in SUPPORTED_ARCHS if a != arch])
            img.put(KV(key, STRING, other))
            if how == "other_with_keys":
                img.kvs = [KV(kv.key.replace(arch + b".", other + b".", 1), kv.vtype, kv.value, kv.item_type)
                           if kv.key.startswith(arch + b".") else kv for kv in img.kvs]
            return f"architecture {show(arch)} -> {show(other)} ({how})"
        return f"architecture {how}"


class Alignment(Mutation):
    """general.alignment odd, zero, huge, of the wrong type; half the time the padding follows it."""
    name = "alignment"

    def apply(self, img, rng):
        key = b"general.alignment"
        vtype = rng.choice([4, 4, 4, 10, 5, STRING, ARRAY])
        value = rng.choice([0, 1, 3, 8, 16, 33, 64, 4096, 2**31, 2**32 - 1, -32])
        if vtype == STRING:
            img.put(KV(key, STRING, str(value).encode()))
        elif vtype == ARRAY:
            img.put(KV(key, ARRAY, [value], 4))
        else:
            img.put(KV(key, vtype, value))
            if vtype == 4 and 0 < value <= 4096 and value & (value - 1) == 0 and rng.random() < 0.5:
                img.alignment = value
        return f"alignment {value} (type {vtype}, padding {img.alignment})"
