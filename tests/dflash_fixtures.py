"""Tiny random DFlash draft GGUFs for a given target, with llama.cpp's exact keys and tensor names.

write_dflash(path, target_path, ...) writes general.architecture "dflash", dflash.block_size,
dflash.target_layers, tokenizer.ggml.mask_token_id, the standard dflash.* hyperparameters and
the target's tokenizer arrays (docs/design.md section 4: this layout loads in llama.cpp). Keyword
arguments change or drop keys and tensors for the loader's rejection tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType as VT
from gguf import GGMLQuantizationType as GT
from gguf import GGUFWriter
from gguf.quants import quantize

from gguf_fixtures import DROP, _weights, finish
from vkdflash.model.gguf_file import GGUFFile

ARCH = "dflash"


def draft_tensors(n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, head_dim: int,
                  n_features: int, n_vocab: int, own_embd: bool, own_output: bool) -> dict:
    """name -> ggml shape (ne0 first), as llama.cpp's converter names them."""
    q, kv, d = n_head * head_dim, n_head_kv * head_dim, n_embd
    t = {"fc.weight": (n_features, d), "enc.output_norm.weight": (d,)}
    if own_embd:
        t["token_embd.weight"] = (d, n_vocab)
    for i in range(n_layer):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": (d,), b + "attn_q.weight": (d, q), b + "attn_k.weight": (d, kv),
                  b + "attn_v.weight": (d, kv), b + "attn_output.weight": (q, d),
                  b + "attn_q_norm.weight": (head_dim,), b + "attn_k_norm.weight": (head_dim,),
                  b + "ffn_norm.weight": (d,), b + "ffn_gate.weight": (d, n_ff), b + "ffn_up.weight": (d, n_ff),
                  b + "ffn_down.weight": (n_ff, d)})
    t["output_norm.weight"] = (d,)
    if own_output:
        t["output.weight"] = (d, n_vocab)
    return t


def write_dflash(path, target_path, *, n_layer: int = 2, target_layers=(1, 2), block_size: int = 16,
                 mask_token_id: int = 0, n_head: int = 2, n_head_kv: int = 1, head_dim: int = 64, n_ff: int = 256,
                 n_embd: int | None = None, weight_type: str = "q8_0", own_embd: bool = False,
                 own_output: bool = False, n_vocab: int | None = None, seed: int = 0, metadata: dict | None = None,
                 drop_tensors=(), shapes: dict | None = None, values: dict | None = None) -> Path:
    """Write a random draft for the target GGUF at `target_path`; returns its path. n_embd and
    n_vocab default to the target's; metadata: key -> (value, type[, item type]) or DROP;
    values: tensor name -> f32 array (numpy order) replacing the random weights."""
    with GGUFFile(target_path) as target:
        tmd, tvt = target.metadata, target.value_types
        tarch = tmd["general.architecture"]
        n_embd = int(tmd[f"{tarch}.embedding_length"]) if n_embd is None else n_embd
        tokenizer = {k: (tmd[k], tvt[k]) for k in tmd if k.startswith("tokenizer.")}
        n_vocab = len(tmd["tokenizer.ggml.tokens"]) if n_vocab is None else n_vocab
    md = {
        "general.architecture": (ARCH, VT.STRING),
        "general.name": ("tiny-dflash", VT.STRING),
        f"{ARCH}.block_count": (n_layer, VT.UINT32),
        f"{ARCH}.context_length": (256, VT.UINT32),
        f"{ARCH}.embedding_length": (n_embd, VT.UINT32),
        f"{ARCH}.feed_forward_length": (n_ff, VT.UINT32),
        f"{ARCH}.attention.head_count": (n_head, VT.UINT32),
        f"{ARCH}.attention.head_count_kv": (n_head_kv, VT.UINT32),
        f"{ARCH}.attention.key_length": (head_dim, VT.UINT32),
        f"{ARCH}.attention.value_length": (head_dim, VT.UINT32),
        f"{ARCH}.rope.freq_base": (1000000.0, VT.FLOAT32),
        f"{ARCH}.attention.layer_norm_rms_epsilon": (1e-6, VT.FLOAT32),
        f"{ARCH}.block_size": (block_size, VT.UINT32),
        f"{ARCH}.target_layers": (list(target_layers), VT.ARRAY, VT.INT32),
    }
    for key, (value, vtype) in tokenizer.items():
        if isinstance(vtype, tuple):
            items = list(value) if isinstance(value, list) else [v.item() for v in value]
            md[key] = (items, VT.ARRAY, vtype[1])
        else:
            md[key] = (value, vtype)
    md["tokenizer.ggml.mask_token_id"] = (mask_token_id, VT.UINT32)
    for key, value in (metadata or {}).items():
        if value is DROP:
            md.pop(key, None)
        else:
            md[key] = value
    spec = draft_tensors(n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, len(target_layers) * n_embd,
                         n_vocab, own_embd, own_output)
    r = np.random.default_rng(seed)
    w = GGUFWriter(str(path), ARCH)
    w.kv_data[0].clear()  # keep full control of the keys (the writer pre-adds the architecture)
    for key, (value, vtype, *item) in md.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for name, shape in spec.items():
        if name in drop_tensors:
            continue
        shape = (shapes or {}).get(name, shape)
        data, gt = _weights(r, shape, weight_type)
        if name in (values or {}):
            data = np.asarray(values[name], np.float32).reshape(tuple(reversed(shape)))
            if len(shape) > 1 and gt != GT.F32:
                data = quantize(data, gt)
        w.add_tensor(name, data, raw_dtype=gt)
    return finish(w, path)


def copy_last_values(n_vocab: int, n_embd: int = 128, head_dim: int = 64, n_head: int = 2, n_ff: int = 256,
                     mask_token_id: int = 0, seed: int = 0) -> dict:
    """Weights for a 1-layer draft (one KV head) that drafts the last token again and again.

    Its own embedding lives in the first head_dim dimensions with rows of equal norm (the mask
    row zero) and doubles as its LM head. W_q = 0 makes attention uniform; injected context has
    g = 0 (enc norm weight 0), so K = V = 0 there, and so are the mask rows' V: every block row
    reads V(row 0) / (rows seen), which W_v and W_o carry into its residual stream as the last
    token's embedding direction, and output_norm removes the 1 / (rows seen) scale. Against a
    target that mostly repeats its last token this accepts often but not always."""
    r = np.random.default_rng(seed)
    d, hd = n_embd, head_dim
    embd = np.zeros((n_vocab, d), np.float32)
    embd[:, :hd] = r.standard_normal((n_vocab, hd))
    embd *= 8.0 / np.maximum(np.linalg.norm(embd, axis=1, keepdims=True), 1e-9)
    embd[mask_token_id] = 0.0
    wv = np.zeros((hd, d), np.float32)
    wv[:, :hd] = np.eye(hd)
    wo = np.zeros((d, n_head * hd), np.float32)
    wo[:hd, :hd] = np.eye(hd)
    ones = np.ones(d, np.float32)
    return {"token_embd.weight": embd, "output.weight": embd, "enc.output_norm.weight": np.zeros(d, np.float32),
            "blk.0.attn_norm.weight": ones, "blk.0.ffn_norm.weight": ones, "output_norm.weight": ones,
            "blk.0.attn_q.weight": np.zeros((n_head * hd, d), np.float32), "blk.0.attn_v.weight": wv,
            "blk.0.attn_output.weight": wo, "blk.0.ffn_down.weight": np.zeros((d, n_ff), np.float32),
            "blk.0.attn_q_norm.weight": np.ones(hd, np.float32), "blk.0.attn_k_norm.weight": np.ones(hd, np.float32)}
