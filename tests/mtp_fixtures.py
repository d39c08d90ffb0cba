"""Tiny random-weight targets carrying next-n (MTP) heads, and MTP sidecars, written with gguf-py.

write_target(path, ...) writes a dense model (gguf_fixtures' vocabulary and keys) whose trunk
depends only on `seed`, plus `n_nextn` heads drawn from `head_seed`: with n_nextn=0 it is the same
trunk without heads. write_sidecar(path, ...) writes the same heads into an "mtp" sidecar.
head_arrays: tensor suffix (e.g. "nextn.eh_proj.weight") -> float array replacing head 0's random
data; trained_head() computes such arrays for a head that has learned the target's own greedy
continuation (so drafts get accepted). metadata / drop / shapes / extra: malformation knobs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

from gguf_fixtures import DROP, _weights, finish, model_metadata, model_tensors, vocab

DIMS = dict(n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)  # head_dim 64: rotation applies


def head_tensors(arch: str, first: int, count: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                 head_dim: int, n_vocab: int, own_embed: bool = False, own_head: bool = False) -> dict:
    """name -> ggml shape of `count` heads at blocks first.. (llama.cpp's names)."""
    spec = {}
    for i in range(first, first + count):
        block = model_tensors(arch, 1, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, True)
        spec.update({k.replace("blk.0.", f"blk.{i}."): v for k, v in block.items() if k.startswith("blk.0.")})
        b = f"blk.{i}.nextn."
        spec.update({b + "eh_proj.weight": (2 * n_embd, n_embd), b + "enorm.weight": (n_embd,),
                     b + "hnorm.weight": (n_embd,), b + "shared_head_norm.weight": (n_embd,)})
        if own_embed:
            spec[b + "embed_tokens.weight"] = (n_embd, n_vocab)
        if own_head:
            spec[b + "shared_head_head.weight"] = (n_embd, n_vocab)
    return spec


def _write(path, arch: str, md: dict, parts, weight_type: str, drop=(), shapes=None, extra=None) -> Path:
    """parts: [(spec, rng, arrays)] written in order; arrays: name -> float array overriding the rng."""
    w = GGUFWriter(str(path), arch)
    w.kv_data[0].clear()
    for key, (value, vtype, *item) in md.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for spec, r, arrays in parts:
        for name, shape in spec.items():
            data, gt = _weights(r, shape, weight_type)  # drawn even when replaced: the stream stays put
            if name in arrays:
                data, gt = _weights_from(arrays[name], weight_type)
            if name in drop:
                continue
            if shapes and name in shapes:
                data, gt = _weights(np.random.default_rng(0), shapes[name], weight_type)
            w.add_tensor(name, data, raw_dtype=gt)
    for name, shape in (extra or {}).items():
        data, gt = _weights(np.random.default_rng(1), shape, "f32")
        w.add_tensor(name, data, raw_dtype=gt)
    return finish(w, path)


def _weights_from(x: np.ndarray, type_name: str):
    from gguf.quants import quantize
    x = np.ascontiguousarray(x, np.float32)
    gt = GT[type_name.upper()]
    if x.ndim == 1 or gt == GT.F32:
        return x, GT.F32
    if gt == GT.F16:
        return x.astype(np.float16), gt
    return quantize(x, gt), gt


def _head_parts(arch, first, n_nextn, head_seed, head_arrays, own_embed, own_head):
    spec = head_tensors(arch, first, n_nextn, DIMS["n_embd"], DIMS["n_ff"], DIMS["n_head"], DIMS["n_head_kv"],
                        DIMS["head_dim"], len(vocab()[0]), own_embed, own_head)
    arrays = {f"blk.{first}.{k}": v for k, v in (head_arrays or {}).items()}
    return spec, np.random.default_rng(head_seed), arrays


def write_target(path, arch: str = "llama", *, n_layer: int = 2, n_nextn: int = 1, hidden: str | None = None,
                 seed: int = 3, head_seed: int = 11, weight_type: str = "q8_0", head_arrays: dict | None = None,
                 own_embed: bool = False, own_head: bool = False, metadata: dict | None = None, drop=(),
                 shapes: dict | None = None, extra: dict | None = None) -> Path:
    n_block = n_layer + n_nextn
    md = model_metadata(arch, n_block, DIMS["n_embd"], DIMS["n_ff"], DIMS["n_head"], DIMS["n_head_kv"],
                        DIMS["head_dim"], 256)
    if n_nextn:
        md[f"{arch}.nextn_predict_layers"] = (n_nextn, VT.UINT32)
    if hidden is not None:
        md[f"{arch}.nextn.hidden"] = (hidden, VT.STRING)
    _override(md, metadata)
    trunk = model_tensors(arch, n_layer, DIMS["n_embd"], DIMS["n_ff"], DIMS["n_head"], DIMS["n_head_kv"],
                          DIMS["head_dim"], len(vocab()[0]), arch == "qwen2")
    parts = [(trunk, np.random.default_rng(seed), {})]
    if n_nextn:
        parts.append(_head_parts(arch, n_layer, n_nextn, head_seed, head_arrays, own_embed, own_head))
    return _write(path, arch, md, parts, weight_type, drop, shapes, extra)


def sidecar_metadata(arch: str, n_trunk: int, n_nextn: int, hidden: str | None) -> dict:
    a = "mtp"
    md = {"general.architecture": (a, VT.STRING), "general.name": ("tiny-mtp-heads", VT.STRING),
          f"{a}.target_architecture": (arch, VT.STRING), f"{a}.block_count": (n_trunk + n_nextn, VT.UINT32),
          f"{a}.nextn_predict_layers": (n_nextn, VT.UINT32), f"{a}.embedding_length": (DIMS["n_embd"], VT.UINT32),
          f"{a}.feed_forward_length": (DIMS["n_ff"], VT.UINT32),
          f"{a}.attention.head_count": (DIMS["n_head"], VT.UINT32),
          f"{a}.attention.head_count_kv": (DIMS["n_head_kv"], VT.UINT32),
          f"{a}.attention.key_length": (DIMS["head_dim"], VT.UINT32),
          f"{a}.rope.freq_base": (1000000.0 if arch != "llama" else 10000.0, VT.FLOAT32),
          f"{a}.attention.layer_norm_rms_epsilon": (1e-6 if arch != "llama" else 1e-5, VT.FLOAT32)}
    if hidden is not None:
        md[f"{a}.nextn.hidden"] = (hidden, VT.STRING)
    return md


def write_sidecar(path, arch: str = "llama", *, n_trunk: int = 2, n_nextn: int = 1, hidden: str | None = None,
                  head_seed: int = 11, weight_type: str = "q8_0", head_arrays: dict | None = None,
                  own_embed: bool = False, own_head: bool = False, metadata: dict | None = None, drop=(),
                  shapes: dict | None = None, extra: dict | None = None) -> Path:
    md = sidecar_metadata(arch, n_trunk, n_nextn, hidden)
    _override(md, metadata)
    parts = [_head_parts(arch, n_trunk, n_nextn, head_seed, head_arrays, own_embed, own_head)]
    return _write(path, "mtp", md, parts, weight_type, drop, shapes, extra)


def _override(md: dict, metadata: dict | None) -> None:
    for key, value in (metadata or {}).items():
        if value is DROP:
            md.pop(key, None)
        else:
            md[key] = value


def greedy_ids(ref_model, prompt, n: int) -> list:
    """The numpy reference's greedy continuation of `prompt` (n tokens)."""
    ref_model.reset()
    logits, out = ref_model.forward(prompt).logits[-1], []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = ref_model.forward([out[-1]]).logits[-1]
    return out


def trained_head(ref_weights, sequence, states, rms_eps: float, scale: float = 10.0, seed: int = 7) -> dict:
    """Head-0 arrays fitted (least squares, exact for fewer samples than 2 n_embd) so that at every
    position i of `sequence` the fused state x_i = eh_proj [enorm(embed(t_{i+1})) ; hnorm(h_i)]
    (states: the target's prenorm states h_i) points where the target's LM head, through
    shared_head_norm, ranks t_{i+2} first. The block keeps its random weights (its cache still
    matters); drafts from the target's own greedy continuation are then mostly accepted at depth 1
    and less deeper, where the head reads its own output, as with real heads."""
    from vkdflash.ref import ops
    emb, out = ref_weights["token_embd.weight"], ref_weights["output.weight"]
    d = emb.shape[1]
    r = np.random.default_rng(seed)
    enorm, hnorm, sh_norm = (1.0 + 0.1 * r.standard_normal((3, d))).astype(np.float32)
    seq = np.asarray(sequence)
    z = np.concatenate([ops.rms_norm(emb[seq[1:-1]].astype(np.float32), enorm, rms_eps),
                        ops.rms_norm(states[:len(seq) - 2], hnorm, rms_eps)], axis=1).astype(np.float64)
    y = (sh_norm * out[seq[2:]]).astype(np.float64)
    y *= scale * np.sqrt(d) / np.linalg.norm(y, axis=1, keepdims=True)
    eh_proj = np.linalg.lstsq(z, y, rcond=None)[0].T                                      # [d, 2d]
    return {"nextn.eh_proj.weight": eh_proj.astype(np.float32), "nextn.enorm.weight": enorm,
            "nextn.hnorm.weight": hnorm, "nextn.shared_head_norm.weight": sh_norm}
