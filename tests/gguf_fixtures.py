"""Tiny random-weight GGUF models written with gguf-py's GGUFWriter, named as llama.cpp names them.

write_model(path, "llama" | "qwen2" | "qwen3", ...) writes a complete dense model with a small
byte-level BPE vocabulary (256 byte tokens, a few merges, control and user-defined tokens) and a
chat template; keyword arguments drop or change keys and tensors for malformation tests.
patch_tensor_info() edits a written file's tensor directory in place.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter
from gguf.quants import quantize

from vkdflash.tokenizer import byte_chars

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # control tokens 0, 1, 2
USER_TOKEN = "<tool>"                                         # user-defined token, last id
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
          ("Ġ", "w"), ("o", "r"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "hello"),
          ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d"), ("Ġ", "Ġ")]
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
DROP = object()  # metadata override value that removes the key
# vendored fixtures (tests/data/PROVENANCE.md says where each comes from)
DATA = Path(__file__).resolve().parent / "data"
TOKENIZER_DATA = DATA / "tokenizer"
LLAMACPP_TOP10 = DATA / "reference" / "smollm2-llamacpp-top10.json"


def vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the fixture vocabulary."""
    tokens = SPECIALS + byte_chars() + [a + b for a, b in MERGES] + [USER_TOKEN]
    types = [3] * len(SPECIALS) + [1] * (256 + len(MERGES)) + [4]
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


def _weights(r, shape_ggml, type_name: str) -> tuple[np.ndarray, GT]:
    """Random data for a tensor of ggml shape (ne0, ne1, ...) stored as `type_name`."""
    gt = GT[type_name.upper()]
    np_shape = tuple(reversed(shape_ggml))
    if len(np_shape) == 1:
        return (1.0 + 0.1 * r.standard_normal(np_shape)).astype(np.float32), GT.F32
    x = (0.05 * r.standard_normal(np_shape)).astype(np.float32)
    if gt == GT.F32:
        return x, gt
    if gt in (GT.F16, GT.F64):
        return x.astype(np.float16 if gt == GT.F16 else np.float64), gt
    if gt in (GT.Q4_K, GT.Q6_K):  # gguf-py cannot quantize these: random valid blocks
        from vkdflash.ref.quants import random_blocks
        return random_blocks(r, type_name.lower(), int(np.prod(np_shape[:-1])), np_shape[-1]), gt
    return quantize(x, gt), gt


def model_metadata(arch: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                   head_dim: int | None, n_ctx: int) -> dict:
    """key -> (value, GGUFValueType[, item type]) as convert_hf_to_gguf.py writes them."""
    tokens, types, merges = vocab()
    qwen = arch != "llama"
    md = {
        "general.architecture": (arch, VT.STRING),
        "general.name": (f"tiny-{arch}", VT.STRING),
        f"{arch}.block_count": (n_layer, VT.UINT32),
        f"{arch}.context_length": (n_ctx, VT.UINT32),
        f"{arch}.embedding_length": (n_embd, VT.UINT32),
        f"{arch}.feed_forward_length": (n_ff, VT.UINT32),
        f"{arch}.attention.head_count": (n_head, VT.UINT32),
        f"{arch}.attention.head_count_kv": (n_head_kv, VT.UINT32),
        f"{arch}.rope.freq_base": (1000000.0 if qwen else 10000.0, VT.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-6 if qwen else 1e-5, VT.FLOAT32),
        "tokenizer.ggml.model": ("gpt2", VT.STRING),
        "tokenizer.ggml.pre": ("qwen2" if qwen else "smollm", VT.STRING),
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
        "tokenizer.ggml.merges": (merges, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.bos_token_id": (0 if qwen else 1, VT.UINT32),
        "tokenizer.ggml.eos_token_id": (0 if qwen else 2, VT.UINT32),
        "tokenizer.ggml.add_bos_token": (False, VT.BOOL),
        "tokenizer.chat_template": (SMOLLM_TEMPLATE, VT.STRING),
    }
    if head_dim is not None:
        md[f"{arch}.attention.key_length"] = (head_dim, VT.UINT32)
        md[f"{arch}.attention.value_length"] = (head_dim, VT.UINT32)
    return md


def model_tensors(arch: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                  head_dim: int, n_vocab: int, tied: bool) -> dict:
    """name -> ggml shape, in the order llama.cpp's converter writes them."""
    q, kv = n_head * head_dim, n_head_kv * head_dim
    t = {"token_embd.weight": (n_embd, n_vocab)}
    for i in range(n_layer):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": (n_embd,), b + "attn_q.weight": (n_embd, q),
                  b + "attn_k.weight": (n_embd, kv), b + "attn_v.weight": (n_embd, kv)})
        if arch == "qwen2":
            t.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if arch == "qwen3":
            t.update({b + "attn_q_norm.weight": (head_dim,), b + "attn_k_norm.weight": (head_dim,)})
        t.update({b + "attn_output.weight": (q, n_embd), b + "ffn_norm.weight": (n_embd,),
                  b + "ffn_gate.weight": (n_embd, n_ff), b + "ffn_up.weight": (n_embd, n_ff),
                  b + "ffn_down.weight": (n_ff, n_embd)})
    t["output_norm.weight"] = (n_embd,)
    if not tied:
        t["output.weight"] = (n_embd, n_vocab)
    return t


def finish(w: GGUFWriter, path) -> Path:
    """Write a filled GGUFWriter out and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_model(path, arch: str = "llama", *, n_layer: int = 2, n_embd: int = 64, n_ff: int = 128,
                n_head: int = 4, n_head_kv: int = 2, head_dim: int | None = None, n_ctx: int = 256,
                weight_type: str = "q8_0", embd_type: str | None = None, tied: bool | None = None,
                seed: int = 0, metadata: dict | None = None, drop_tensors=(), shapes: dict | None = None,
                types: dict | None = None, rope_freqs: bool = False) -> Path:
    """Write a tiny model; returns its path. Defaults: qwen3 gets head_dim 32 (q width != n_embd),
    qwen2 a tied output. metadata: key -> (value, type[, item type]) or DROP; shapes / types:
    tensor name -> replacement ggml shape / type name."""
    if arch == "qwen3" and head_dim is None:
        head_dim = 32
    tied = (arch == "qwen2") if tied is None else tied
    md = model_metadata(arch, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_ctx)
    for key, value in (metadata or {}).items():
        if value is DROP:
            md.pop(key, None)
        else:
            md[key] = value
    hd = head_dim or n_embd // n_head
    spec = model_tensors(arch, n_layer, n_embd, n_ff, n_head, n_head_kv, hd, len(vocab()[0]), tied)
    if rope_freqs:  # llama3-style per-pair frequency factors (positive, near 1)
        spec["rope_freqs.weight"] = (hd // 2,)
    r = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.kv_data[0].clear()  # the writer pre-adds general.architecture: keep full control of the keys
    for key, (value, vtype, *item) in md.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for name, shape in spec.items():
        if name in drop_tensors:
            continue
        shape = (shapes or {}).get(name, shape)
        tname = (types or {}).get(name) or (embd_type if name == "token_embd.weight" and embd_type else weight_type)
        data, gt = _weights(r, shape, tname)
        w.add_tensor(name, data, raw_dtype=gt)
    return finish(w, path)


def patch_tensor_info(path, name: str, *, type_id: int | None = None, offset: int | None = None,
                      dims: tuple[int, ...] | None = None) -> None:
    """Overwrite fields of one tensor's directory entry in a written file (same number of dims)."""
    data = bytearray(Path(path).read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.find(key)
    assert pos > 0, name
    pos += len(key)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    pos += 4
    if dims is not None:
        assert len(dims) == n_dims
        struct.pack_into(f"<{n_dims}Q", data, pos, *dims)
    pos += 8 * n_dims
    if type_id is not None:
        struct.pack_into("<I", data, pos, type_id)
    if offset is not None:
        struct.pack_into("<Q", data, pos + 4, offset)
    Path(path).write_bytes(bytes(data))
