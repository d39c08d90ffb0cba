"""llama.cpp-format DFlash draft GGUFs: keys, tensors, and whether a draft fits a target.

Format (docs/design.md section 4): general.architecture "dflash"; dflash.block_size (u32,
default 16), dflash.target_layers (int array of llama.cpp layer-input ids, mandatory),
tokenizer.ggml.mask_token_id and the standard dflash.* hyperparameters; tensors fc,
enc.output_norm, output_norm, optional token_embd / output (else the target's) and per layer
the Qwen3 set (attn_q_norm / attn_k_norm included). Every problem is a one-line VkdflashError."""
from __future__ import annotations

import os
from dataclasses import dataclass

from vkdflash.api import (MAX_EMBD, MAX_LAYERS, MAX_VOCAB, RMS_EPS, ROPE_BASE, GGUFFile, TensorData, VkdflashError,
                          check_rope_scaling, check_tensors, quote, read_heads)

ARCH = "dflash"
DEFAULT_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 64  # one propose pass must fit the engine's batch
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class DFlashHParams:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    block_size: int
    target_layers: tuple   # llama.cpp layer-input ids, in feature-concatenation order
    mask_token_id: int
    own_embd: bool         # token_embd.weight present (else the target's)
    own_output: bool       # output.weight present (else the target's LM head)

    @property
    def n_features(self) -> int:
        return len(self.target_layers) * self.n_embd


def read_hparams(gguf: GGUFFile) -> DFlashHParams:
    m = gguf.metadata
    arch = m.str("general.architecture")
    if arch != ARCH:
        raise VkdflashError(f"general.architecture is {quote(arch)}, a DFlash draft has {ARCH!r}")
    n_embd = m.int(f"{ARCH}.embedding_length", 32, MAX_EMBD)
    n_head, n_head_kv, head_dim = read_heads(m, ARCH, n_embd, min_head_dim=32)
    if head_dim % 32:
        raise VkdflashError(f"head dimension {head_dim} must be a multiple of 32 (attention kernel)")
    target_layers = m.ints(f"{ARCH}.target_layers", 0, MAX_LAYERS, max_count=MAX_LAYERS)
    if not len(target_layers):
        raise VkdflashError(f"metadata {ARCH}.target_layers is empty")
    check_rope_scaling(m, ARCH)  # the kernels turn by base^(-2i/d) alone
    block_size = m.int(f"{ARCH}.block_size", 2, MAX_BLOCK_SIZE, default=DEFAULT_BLOCK_SIZE)
    names = gguf.tensors
    return DFlashHParams(
        n_layer=m.int(f"{ARCH}.block_count", 1, MAX_LAYERS), n_embd=n_embd,
        n_ff=m.int(f"{ARCH}.feed_forward_length", 32, 16 * MAX_EMBD), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, rms_eps=m.float(f"{ARCH}.attention.layer_norm_rms_epsilon", *RMS_EPS),
        rope_base=m.float(f"{ARCH}.rope.freq_base", *ROPE_BASE, default=10000.0), block_size=block_size,
        target_layers=tuple(int(x) for x in target_layers),
        mask_token_id=m.int("tokenizer.ggml.mask_token_id", 0, MAX_VOCAB),
        own_embd="token_embd.weight" in names, own_output="output.weight" in names)


def expected_tensors(hp: DFlashHParams, n_vocab: int) -> dict:
    """name -> ggml shape (ne0 first) of every tensor the draft must hold."""
    d, hd, ff = hp.n_embd, hp.head_dim, hp.n_ff
    q, kv = hp.n_head * hd, hp.n_head_kv * hd
    spec = {"fc.weight": (hp.n_features, d), "enc.output_norm.weight": (d,), "output_norm.weight": (d,)}
    if hp.own_embd:
        spec["token_embd.weight"] = (d, n_vocab)
    if hp.own_output:
        spec["output.weight"] = (d, n_vocab)
    shapes = {"attn_norm": (d,), "attn_q": (d, q), "attn_k": (d, kv), "attn_v": (d, kv), "attn_output": (q, d),
              "attn_q_norm": (hd,), "attn_k_norm": (hd,), "ffn_norm": (d,), "ffn_gate": (d, ff),
              "ffn_up": (d, ff), "ffn_down": (ff, d)}
    for i in range(hp.n_layer):
        spec.update({f"blk.{i}.{name}.weight": shapes[name] for name in LAYER_TENSORS})
    return spec


def check_fits(hp: DFlashHParams, gguf: GGUFFile, target_hp) -> None:
    """The draft reads the target's residual stream and borrows its embedding / LM head: sizes must agree."""
    if hp.n_embd != target_hp.n_embd:
        raise VkdflashError(f"draft hidden size {hp.n_embd} does not match the target's {target_hp.n_embd}")
    if hp.mask_token_id >= target_hp.n_vocab:
        raise VkdflashError(f"mask token id {hp.mask_token_id} is outside the target vocabulary "
                            f"({target_hp.n_vocab} tokens)")
    bad = [x for x in hp.target_layers if not 0 <= x <= target_hp.n_layer]
    if bad:
        raise VkdflashError(f"target layer {bad[0]} does not exist: the target has layer inputs "
                            f"0..{target_hp.n_layer}")
    for name in ("token_embd.weight", "output.weight"):
        t = gguf.tensors.get(name)
        if t is not None and len(t.shape) == 2 and t.shape[1] != target_hp.n_vocab:
            raise VkdflashError(f"draft {name} has {t.shape[1]} rows, the target vocabulary {target_hp.n_vocab}")
    check_tensors(gguf.tensors, expected_tensors(hp, target_hp.n_vocab), {}, "a DFlash draft")


class DraftFile:
    """A DFlash draft GGUF checked against its target: `hp`, `tensor(name)`, `has(name)`."""

    def __init__(self, path, target_hp):
        self.path = os.fspath(path)
        self.gguf = GGUFFile(path)
        try:
            self.hp = read_hparams(self.gguf)
            check_fits(self.hp, self.gguf, target_hp)
        except VkdflashError as exc:
            self.gguf.close()
            raise VkdflashError(f"{self.path}: {exc}") from None

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def tensor(self, name: str) -> TensorData:
        return self.gguf.tensor(name)

    def close(self) -> None:
        self.gguf.close()


def load_draft(path, target_hp) -> DraftFile:
    return DraftFile(path, target_hp)
