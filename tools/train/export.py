"""Write trained drafts as llama.cpp-format GGUFs (matrices q8_0, vectors f32).

DFlash: general.architecture "dflash" with llama.cpp's keys and the target's tokenizer arrays
(reference.md section 4). MTP: an "mtp" sidecar for the target's architecture (the engine's
vkdflash_mtp.heads format: head blocks numbered after the trunk). Both record how they were
trained and, once measured, the acceptance the engine's watchdog compares live acceptance with."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter
from gguf.quants import quantize

from vkdflash.model.gguf_file import GGUFFile


def restore(params: dict, path, grow: bool = False) -> set:
    """Load an exported draft's weights (dequantized) into `params` (GGUF name -> parameter): the
    start of a longer run, or of a check. Every tensor must match a parameter's name and shape;
    with `grow`, layers the file lacks (a deeper draft's new ones) are left as they are.
    Returns their names."""
    import torch
    from vkdflash.errors import VkdflashError
    from vkdflash.model.gguf_file import TensorData
    from vkdflash.ref.model import dequantize_tensor
    with GGUFFile(path) as gf:
        missing = {n for n in set(params) - set(gf.tensors) if n.startswith("blk.")} if grow else set()
        if set(gf.tensors) != set(params) - missing:
            raise VkdflashError(f"{path}: its tensors {sorted(set(gf.tensors) ^ set(params))[:4]} do not match the module's")
        for name, t in gf.tensors.items():
            x = torch.from_numpy(np.array(dequantize_tensor(TensorData(t.type_id, t.shape, gf.data(name)))))
            if tuple(x.shape) != tuple(params[name].shape):
                raise VkdflashError(f"{path}: {name} is {tuple(x.shape)}, the module's {tuple(params[name].shape)}")
            params[name].data = x.to(params[name].dtype)
    return missing


def tokenizer_keys(target_path) -> dict:
    with GGUFFile(target_path) as gf:
        return {k: v for k, v in all_keys(gf).items() if k.startswith("tokenizer.")}


def target_identity(target_path) -> dict:
    """The keys by which the engine finds a shipped draft for its target (vkdflash.spec.shipped)."""
    import os
    from vkdflash.spec.shipped import TARGET_NAME, TARGET_SIZE
    with GGUFFile(target_path) as gf:
        name = gf.metadata.get("general.name", "")
    return {TARGET_NAME: (name, VT.STRING), TARGET_SIZE: (os.path.getsize(target_path), VT.UINT64)}


def write(path, arch: str, metadata: dict, arrays: dict) -> None:
    """metadata: key -> (value, type[, item type]); arrays: name -> f32 numpy array ([out, in])."""
    w = GGUFWriter(str(path), arch)
    w.kv_data[0].clear()  # the keys below are the whole header, in this order
    for key, (value, vtype, *item) in metadata.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for name, x in arrays.items():
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim == 2 and x.shape[1] % 32 == 0:
            w.add_tensor(name, quantize(x, GT.Q8_0), raw_dtype=GT.Q8_0)
        else:
            w.add_tensor(name, x, raw_dtype=GT.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dflash_metadata(hp, n_layer: int, block: int, layers, mask_token: int, target_path, notes: str) -> dict:
    a = "dflash"
    md = {"general.architecture": (a, VT.STRING), "general.name": ("vkdflash SmolLM2-135M DFlash draft", VT.STRING),
          "general.description": (notes, VT.STRING),
          f"{a}.block_count": (n_layer, VT.UINT32), f"{a}.context_length": (hp.n_ctx_train, VT.UINT32),
          f"{a}.embedding_length": (hp.n_embd, VT.UINT32), f"{a}.feed_forward_length": (hp.n_ff, VT.UINT32),
          f"{a}.attention.head_count": (hp.n_head, VT.UINT32),
          f"{a}.attention.head_count_kv": (hp.n_head_kv, VT.UINT32),
          f"{a}.attention.key_length": (hp.head_dim, VT.UINT32),
          f"{a}.attention.value_length": (hp.head_dim, VT.UINT32),
          f"{a}.rope.freq_base": (float(hp.rope_base), VT.FLOAT32),
          f"{a}.attention.layer_norm_rms_epsilon": (float(hp.rms_eps), VT.FLOAT32),
          f"{a}.block_size": (block, VT.UINT32), f"{a}.target_layers": (list(layers), VT.ARRAY, VT.INT32)}
    md.update(tokenizer_keys(target_path))
    md["tokenizer.ggml.mask_token_id"] = (mask_token, VT.UINT32)
    return md


def mtp_metadata(hp, notes: str) -> dict:
    a = "mtp"
    return {"general.architecture": (a, VT.STRING), "general.name": ("vkdflash SmolLM2-135M MTP head", VT.STRING),
            "general.description": (notes, VT.STRING),
            f"{a}.target_architecture": (hp.arch, VT.STRING), f"{a}.block_count": (hp.n_layer + 1, VT.UINT32),
            f"{a}.nextn_predict_layers": (1, VT.UINT32), f"{a}.embedding_length": (hp.n_embd, VT.UINT32),
            f"{a}.vocab_size": (hp.n_vocab, VT.UINT32), f"{a}.feed_forward_length": (hp.n_ff, VT.UINT32),
            f"{a}.attention.head_count": (hp.n_head, VT.UINT32),
            f"{a}.attention.head_count_kv": (hp.n_head_kv, VT.UINT32),
            f"{a}.attention.key_length": (hp.head_dim, VT.UINT32),
            f"{a}.rope.freq_base": (float(hp.rope_base), VT.FLOAT32),
            f"{a}.attention.layer_norm_rms_epsilon": (float(hp.rms_eps), VT.FLOAT32),
            f"{a}.nextn.hidden": ("prenorm", VT.STRING)}


def all_keys(gf) -> dict:
    out = {}
    for key, value in gf.metadata.items():
        vtype = gf.value_types[key]
        if isinstance(vtype, tuple):
            items = list(value) if isinstance(value, list) else [v.item() for v in value]
            out[key] = (items, VT.ARRAY, vtype[1])
        else:
            out[key] = (value, vtype)
    return out


def restamp(path, extra: dict) -> None:
    """Rewrite `path` with metadata keys added or replaced (tensors copied as they are)."""
    import os
    import tempfile
    with GGUFFile(path) as gf:
        md = all_keys(gf)
        md.update(extra)
        tensors = [(name, t.type_id, np.array(gf.data(name))) for name, t in gf.tensors.items()]
        shapes = {name: t.shape for name, t in gf.tensors.items()}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".gguf")
    os.close(fd)
    w = GGUFWriter(tmp, md["general.architecture"][0])
    w.kv_data[0].clear()
    for key, (value, vtype, *item) in md.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for name, type_id, data in tensors:
        gt = GT(type_id)
        if gt == GT.F32:
            w.add_tensor(name, data.view(np.float32).reshape(tuple(reversed(shapes[name]))), raw_dtype=gt)
        else:
            rows = tuple(reversed(shapes[name]))[:-1]
            w.add_tensor(name, data.view(np.uint8).reshape(rows + (-1,)), raw_dtype=gt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a shipped file is read by every user
    os.replace(tmp, path)
