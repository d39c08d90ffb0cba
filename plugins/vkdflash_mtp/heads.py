"""Finding and checking next-n (MTP) heads: inside the target GGUF, or in a -md sidecar.

In the target (llama.cpp's layout for GLM4-MoE / DeepSeek / Qwen3.5 next-n heads):
  {arch}.nextn_predict_layers = N heads; {arch}.block_count counts them, so the trunk is
  block_count - N blocks and head j is block blk.{trunk + j}: a standard block (same shapes as the
  trunk's) plus blk.{trunk + j}.nextn.{eh_proj {2d, d}, enorm, hnorm, shared_head_norm} and
  optionally .nextn.{embed_tokens, shared_head_head} (else the target's token_embd / output).
  {arch}.nextn.hidden = "prenorm" (default) | "postnorm": the target state the heads read.

Sidecar (-md FILE), general.architecture = "mtp", holding only the heads under the same names:
  mtp.target_architecture   string, the target's architecture (llama | qwen2 | qwen3): rope
                            pairing, q/k norm and qkv bias follow it
  mtp.block_count           u32, trunk + heads, as in the target: heads at blk.{block_count - N + j}
  mtp.nextn_predict_layers  u32 N >= 1
  mtp.embedding_length      u32, must equal the target's
  mtp.feed_forward_length, mtp.attention.head_count, mtp.attention.layer_norm_rms_epsilon,
  optional mtp.attention.head_count_kv / .key_length / .rope.freq_base: the head block's own
  optional mtp.nextn.hidden "prenorm" | "postnorm" (default "prenorm")
A -md file that is itself a full llama / qwen2 / qwen3 model carrying heads is accepted too.
Drafting uses the first head (as llama.cpp does), chained on its own output; every head is
checked when loaded."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from vkdflash.api import MAX_HEAD_DIM as ATTN_MAX_HEAD_DIM
from vkdflash.api import (ARCHITECTURES, MAX_EMBD, MAX_LAYERS, MAX_VOCAB, RMS_EPS, ROPE_BASE, GGUFFile, ModelFile,
                          TensorData, VkdflashError, check_rope_scaling, check_tensors, nextn_hidden, nextn_tensors,
                          quote, read_heads, shipped_draft)

log = logging.getLogger("vkdflash")
SIDECAR_ARCH = "mtp"
NO_HEADS = "mtp needs next-n heads: the target has none and no -md sidecar was given"
SHIPPED = Path(__file__).parent / "heads"  # sidecars trained for particular targets (tools/train)


@dataclasses.dataclass
class Heads:
    hp: object       # HParams of the head block: dims, eps, rope; n_layer = first head's block index
    count: int
    hidden: str      # "prenorm" | "postnorm"
    path: str
    source: object   # ModelFile or GGUFFile the tensors are read from
    own: bool        # the source was opened here and closes with the heads

    @property
    def first(self) -> int:
        return self.hp.n_layer

    def name(self, suffix: str, j: int = 0) -> str:
        """Tensor name of head j: name("attn_q.weight") or name("nextn.eh_proj.weight")."""
        return f"blk.{self.first + j}.{suffix}"

    def has(self, suffix: str, j: int = 0) -> bool:
        tensors = self.source.gguf.tensors if isinstance(self.source, ModelFile) else self.source.tensors
        return self.name(suffix, j) in tensors

    def tensor(self, suffix: str, j: int = 0) -> TensorData:
        return self.source.tensor(self.name(suffix, j))  # a ModelFile's or a sidecar GGUFFile's

    def close(self) -> None:
        if self.own:
            self.source.close()


def find_heads(target_hp, target_file=None, draft_model: str | None = None) -> Heads:
    """The heads to draft with: the -md sidecar when given, else the target's own."""
    if draft_model:
        heads = load_sidecar(draft_model, target_hp)
        if target_hp.n_nextn:
            log.info("mtp: using the heads of %s rather than the target's own", draft_model)
    elif target_hp.n_nextn:
        if target_file is None:
            raise VkdflashError("mtp: the target carries next-n heads but the strategy context has no "
                                "target model file to read them from (TargetView.model_file)")
        heads = Heads(target_file.hparams, target_hp.n_nextn, target_hp.nextn_hidden, target_file.gguf.path,
                      target_file, False)
    elif (path := shipped_draft(SHIPPED, target_file)) is not None:
        heads = load_sidecar(path, target_hp)
        log.info("mtp: the target has no next-n heads; using the sidecar shipped for it: %s", path)
    else:
        raise VkdflashError(NO_HEADS)
    check_runnable(heads.hp)
    log.info("mtp: %d next-n head(s) at block %d of %s, reading the %s target state, d %d, heads %d/%d x %d",
             heads.count, heads.first, heads.path, heads.hidden, heads.hp.n_embd, heads.hp.n_head,
             heads.hp.n_head_kv, heads.hp.head_dim)
    return heads


def check_runnable(hp) -> None:
    if hp.head_dim % 32 or hp.head_dim > ATTN_MAX_HEAD_DIM:
        raise VkdflashError(f"mtp: head block head_dim {hp.head_dim} is not supported (a multiple of 32 up to "
                            f"{ATTN_MAX_HEAD_DIM})")


def load_sidecar(path, target_hp) -> Heads:
    gf = GGUFFile(path)
    try:
        arch = gf.metadata.str("general.architecture")
        if arch in ARCHITECTURES:
            gf.close()
            return _from_model_file(ModelFile(path), target_hp)
        if arch != SIDECAR_ARCH:
            raise VkdflashError(f"general.architecture is {quote(arch)}: an MTP sidecar has {SIDECAR_ARCH!r} "
                                f"(or is a {'/'.join(ARCHITECTURES)} model carrying next-n heads)")
        hp, count, hidden = _sidecar_hparams(gf, target_hp)
        required, optional = nextn_tensors(hp, hp.n_layer, count)
        check_tensors(gf.tensors, required, optional, f"{count} next-n head(s) at block {hp.n_layer}")
        return Heads(hp, count, hidden, gf.path, gf, True)
    except VkdflashError as exc:
        gf.close()
        msg = str(exc)
        raise VkdflashError(msg if msg.startswith(gf.path) else f"{gf.path}: {msg}") from None


def _from_model_file(mf: ModelFile, target_hp) -> Heads:
    hp = mf.hparams
    try:
        if not hp.n_nextn:
            raise VkdflashError(f"{mf.gguf.path}: a {hp.arch} model without next-n heads cannot serve as the "
                                "MTP sidecar")
        _check_fits(hp.arch, hp.n_embd, hp.n_vocab, target_hp, mf.gguf.path)
    except VkdflashError:
        mf.close()
        raise
    return Heads(hp, hp.n_nextn, hp.nextn_hidden, mf.gguf.path, mf, True)


def _check_fits(arch: str, n_embd: int, n_vocab: int, target_hp, path) -> None:
    if arch != target_hp.arch:
        raise VkdflashError(f"{path}: heads for a {arch} target, the target is {target_hp.arch}")
    if n_embd != target_hp.n_embd:
        raise VkdflashError(f"{path}: heads of width {n_embd}, the target's hidden size is {target_hp.n_embd}")
    if n_vocab != target_hp.n_vocab:
        raise VkdflashError(f"{path}: heads for a vocabulary of {n_vocab}, the target's has {target_hp.n_vocab}")


def _sidecar_hparams(gf: GGUFFile, target_hp):
    m, a = gf.metadata, SIDECAR_ARCH
    arch = m.str(f"{a}.target_architecture")
    n_embd = m.int(f"{a}.embedding_length", 1, MAX_EMBD)
    n_vocab = m.int(f"{a}.vocab_size", 1, MAX_VOCAB, default=target_hp.n_vocab)
    _check_fits(arch, n_embd, n_vocab, target_hp, gf.path)
    n_block = m.int(f"{a}.block_count", 2, MAX_LAYERS)
    count = m.int(f"{a}.nextn_predict_layers", 1, n_block - 1)
    if n_block - count != target_hp.n_layer:
        raise VkdflashError(f"{a}.block_count {n_block} - {count} heads = {n_block - count} trunk blocks, "
                            f"the target has {target_hp.n_layer}")
    n_head, n_head_kv, head_dim = read_heads(m, a, n_embd, min_head_dim=2)
    check_rope_scaling(m, a)  # the head turns by base^(-2i/d) alone
    hp = dataclasses.replace(
        target_hp, n_layer=target_hp.n_layer, n_ff=m.int(f"{a}.feed_forward_length", 1, 16 * MAX_EMBD),
        n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        rms_eps=m.float(f"{a}.attention.layer_norm_rms_epsilon", *RMS_EPS),
        rope_base=m.float(f"{a}.rope.freq_base", *ROPE_BASE, default=10000.0), n_nextn=count,
        nextn_hidden=nextn_hidden(m, a))
    return hp, count, hp.nextn_hidden
