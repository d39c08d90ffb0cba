"""A GGUF that holds a model vkdflash can run: the tensors a dense llama / qwen2 / qwen3 file (and
its next-n heads) must hold, as llama.cpp names them, checked by name, shape and type before any
weight is read; plugins check their own files with the same rules (api.check_tensors)."""
from __future__ import annotations

import os

from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from ..errors import VkdflashError, quote
from .gguf_file import GGUFFile, TensorData
from .metadata import Metadata

# 2-D weights may use any of these; 1-D tensors (norms, biases, rope factors) only the float ones
WEIGHT_TYPE_IDS = frozenset(int(GGMLQuantizationType[n.upper()]) for n in
                            ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"))
VECTOR_TYPE_IDS = frozenset(int(t) for t in (GGMLQuantizationType.F32, GGMLQuantizationType.F16,
                                             GGMLQuantizationType.BF16))


def block_tensors(hp, i: int) -> dict[str, tuple[int, ...]]:
    """The tensors of one standard block blk.{i} (also the body of a next-n head)."""
    d, hd, ff = hp.n_embd, hp.head_dim, hp.n_ff
    q, kv = hp.n_head * hd, hp.n_head_kv * hd
    b = f"blk.{i}."
    spec = {b + "attn_norm.weight": (d,), b + "attn_q.weight": (d, q), b + "attn_k.weight": (d, kv),
            b + "attn_v.weight": (d, kv), b + "attn_output.weight": (q, d), b + "ffn_norm.weight": (d,),
            b + "ffn_gate.weight": (d, ff), b + "ffn_up.weight": (d, ff), b + "ffn_down.weight": (ff, d)}
    if hp.has_qkv_bias:
        spec.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
    if hp.has_qk_norm:
        spec.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
    return spec


def nextn_tensors(hp, first: int, count: int) -> tuple[dict, dict]:
    """(required, optional) tensors of `count` next-n heads at blocks first..: a standard block
    plus blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm} and, optionally, the head's own
    embed_tokens / shared_head_head (else the target's token_embd / output are used)."""
    d, required, optional = hp.n_embd, {}, {}
    for i in range(first, first + count):
        b = f"blk.{i}.nextn."
        required.update(block_tensors(hp, i))
        required.update({b + "eh_proj.weight": (2 * d, d), b + "enorm.weight": (d,), b + "hnorm.weight": (d,),
                         b + "shared_head_norm.weight": (d,)})
        optional.update({b + "embed_tokens.weight": (d, hp.n_vocab), b + "shared_head_head.weight": (d, hp.n_vocab)})
    return required, optional


def expected_tensors(hp) -> dict[str, tuple[int, ...]]:
    """Every tensor a dense llama/qwen2/qwen3 file must hold, name -> ggml shape, as llama.cpp names them."""
    d = hp.n_embd
    spec = {"token_embd.weight": (d, hp.n_vocab), "output_norm.weight": (d,)}
    if not hp.tied_output:
        spec["output.weight"] = (d, hp.n_vocab)
    if hp.has_rope_freqs:
        spec["rope_freqs.weight"] = (hp.head_dim // 2,)
    for i in range(hp.n_layer):
        spec.update(block_tensors(hp, i))
    spec.update(nextn_tensors(hp, hp.n_layer, hp.n_nextn)[0])
    return spec


def check_tensors(tensors: dict, required: dict, optional: dict, what: str) -> None:
    """Every required tensor present with its shape and a supported type; optional ones checked
    when present; anything else is unexpected."""
    for name, shape in list(required.items()) + [(n, s) for n, s in optional.items() if n in tensors]:
        t = tensors.get(name)
        if t is None:
            raise VkdflashError(f"missing tensor {name}")
        if t.shape != shape:
            raise VkdflashError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        allowed = VECTOR_TYPE_IDS if len(shape) == 1 else WEIGHT_TYPE_IDS
        if t.type_id not in allowed:
            names = ", ".join(GGMLQuantizationType(i).name for i in sorted(allowed))
            raise VkdflashError(f"tensor {name} has type {t.type_name}, not supported here ({names})")
        if len(shape) == 2 and shape[0] % 32:  # f16/f32 rows may be any length; the kernels read 32-value blocks
            raise VkdflashError(f"tensor {name} has rows of {shape[0]} values: vkdflash's matrix kernels need a "
                                "multiple of 32")
    for name in tensors:
        if name not in required and name not in optional:
            raise VkdflashError(f"unexpected tensor {quote(name)} (not part of {what})")


class ModelFile:
    """A GGUF checked to hold a dense llama / qwen2 / qwen3 model that vkdflash can run."""

    def __init__(self, path: str | os.PathLike):
        from .hparams import check_output_rows, read_hparams
        self.gguf = GGUFFile(path)
        try:
            self.hparams = read_hparams(self.gguf.metadata, list(self.gguf.tensors))
            self._check_tensors()
            check_output_rows(self.hparams, self.gguf.metadata)
        except VkdflashError as exc:
            self.gguf.close()
            raise VkdflashError(f"{self.gguf.path}: {exc}") from None

    def _check_tensors(self) -> None:
        hp = self.hparams
        check_tensors(self.gguf.tensors, expected_tensors(hp), nextn_tensors(hp, hp.n_layer, hp.n_nextn)[1],
                      f"a dense {hp.arch} model")
        if hp.has_rope_freqs:
            # each rotated pair turns at base^(-2i/d) / factor_i (llama.cpp, ggml_rope_ext): a factor that is
            # not positive gives infinite or backwards angles (the ref's NaN, the kernel's refusal mid-run)
            t = self.gguf.tensors["rope_freqs.weight"]
            factors = dequantize(self.gguf.data(t.name), GGMLQuantizationType(t.type_id))
            bad = factors[~(factors > 0)]
            if bad.size:
                raise VkdflashError(f"tensor rope_freqs.weight holds {float(bad[0]):g}: rope frequency factors "
                                    "must be positive")

    @property
    def metadata(self) -> Metadata:
        return self.gguf.metadata

    @property
    def output_name(self) -> str:
        """The output projection's tensor: token_embd.weight when the embedding is tied."""
        return "token_embd.weight" if self.hparams.tied_output else "output.weight"

    def tensor(self, name: str) -> TensorData:
        return self.gguf.tensor(name)

    def close(self) -> None:
        self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_model(path: str | os.PathLike) -> ModelFile:
    return ModelFile(path)
