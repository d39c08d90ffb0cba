"""Model hyperparameters read from GGUF metadata, with llama.cpp's key names and defaults."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import VkdflashError, quote
from .metadata import REQUIRED, Metadata

# rope pairing per architecture, as llama.cpp's llama_model_rope_type(): names as in kernels/rope.py
ROPE_MODES = {"llama": "normal", "qwen2": "neox", "qwen3": "neox"}
ARCHITECTURES = tuple(ROPE_MODES)
# the target state a next-n (MTP) head reads: the residual leaving the last trunk block, or that
# after output_norm; architectures differ, so files say it in {arch}.nextn.hidden
NEXTN_HIDDEN = ("prenorm", "postnorm")

# sanity bounds: far above any real model, low enough that no size computed from them is absurd
MAX_LAYERS = 1024
MAX_EMBD = 1 << 17
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_VOCAB = 1 << 22
MAX_CTX = 1 << 26
# the rms-norm epsilon is added to a row's mean square: below 1e-12 it is no guard in f32 (1e-45 is a
# denormal a GPU flushes to zero, so an all-zero row divides by zero); above 0.1 it swamps the
# mean square of unit-scale activations. Real models use 1e-6 .. 1e-5.
RMS_EPS = (1e-12, 0.1)
# rope pair i turns at base^(-2i/d) per position: a base at or below 1 turns the slow pairs fastest
# (1e-30 overflows to inf, then NaN); published bases run 1e4 .. 1e8.
ROPE_BASE = (2.0, 1e12)


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    rope_mode: str          # "normal" (llama) or "neox" (qwen2, qwen3)
    n_ctx_train: int
    n_vocab: int
    tied_output: bool       # no output.weight: the output projection is token_embd
    has_qkv_bias: bool      # blk.N.attn_{q,k,v}.bias present (qwen2)
    has_qk_norm: bool       # qwen3
    has_rope_freqs: bool = False  # rope_freqs.weight present (per-pair frequency factors)
    n_nextn: int = 0        # next-n (MTP) heads: blocks n_layer.. after the trunk, not run by the forward pass
    nextn_hidden: str = "prenorm"  # what the heads read (NEXTN_HIDDEN)

    def as_dict(self) -> dict:
        return asdict(self)


def read_heads(m: "Metadata", arch: str, n_embd: int, min_head_dim: int) -> tuple[int, int, int]:
    """(n_head, n_head_kv, head_dim) with llama.cpp's defaults and consistency checks."""
    n_head = m.int(f"{arch}.attention.head_count", 1, MAX_HEADS)
    n_head_kv = m.int(f"{arch}.attention.head_count_kv", 1, n_head, default=n_head)
    if n_head % n_head_kv:
        raise VkdflashError(f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    if f"{arch}.attention.key_length" not in m and n_embd % n_head:
        raise VkdflashError(f"embedding_length {n_embd} is not a multiple of head_count {n_head} "
                            f"and {arch}.attention.key_length is missing")
    head_dim = m.int(f"{arch}.attention.key_length", min_head_dim, MAX_HEAD_DIM, default=n_embd // n_head)
    return n_head, n_head_kv, head_dim


def read_hparams(m: Metadata, tensor_names) -> HParams:
    """HParams of a llama / qwen2 / qwen3 file; the tensor names decide tied output and options."""
    arch = m.str("general.architecture")
    if arch not in ROPE_MODES:
        raise VkdflashError(f"architecture {quote(arch)} is not supported (supported: {', '.join(ARCHITECTURES)})")
    n_tensors = len(tensor_names)
    # as in llama.cpp, block_count includes the trailing next-n heads; n_layer is the trunk
    n_block = m.int(f"{arch}.block_count", 1, MAX_LAYERS)
    n_nextn = m.int(f"{arch}.nextn_predict_layers", 0, n_block - 1, default=0)
    n_layer = n_block - n_nextn
    if n_layer * 9 + 2 > n_tensors:
        raise VkdflashError(f"{arch}.block_count = {n_layer} needs at least {n_layer * 9 + 2} tensors, "
                            f"the file holds {n_tensors}")
    n_embd = m.int(f"{arch}.embedding_length", 1, MAX_EMBD)
    n_ff = m.int(f"{arch}.feed_forward_length", 1, 16 * MAX_EMBD)
    n_head, n_head_kv, head_dim = read_heads(m, arch, n_embd, min_head_dim=2)
    if head_dim % 2:
        raise VkdflashError(f"head dimension {head_dim} must be even for rope")
    v_dim = m.int(f"{arch}.attention.value_length", 1, MAX_HEAD_DIM, default=head_dim)
    if v_dim != head_dim:
        raise VkdflashError(f"value_length {v_dim} differs from key_length {head_dim}: not supported")
    n_rot = m.int(f"{arch}.rope.dimension_count", 1, MAX_HEAD_DIM, default=head_dim)
    if n_rot != head_dim:
        raise VkdflashError(f"{arch}.rope.dimension_count {n_rot} differs from the head dimension {head_dim}: "
                            "partial rotary embedding is not supported")
    if m.int(f"{arch}.expert_count", 0, 1 << 20, default=0):
        raise VkdflashError(f"mixture-of-experts models ({arch}.expert_count) are not supported")
    check_rope_scaling(m, arch)
    tokens = m.strings("tokenizer.ggml.tokens", MAX_VOCAB, default=None)
    n_vocab = m.int(f"{arch}.vocab_size", 1, MAX_VOCAB, default=REQUIRED if tokens is None else len(tokens))
    names = set(tensor_names)
    return HParams(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, rms_eps=m.float(f"{arch}.attention.layer_norm_rms_epsilon", *RMS_EPS),
        rope_base=m.float(f"{arch}.rope.freq_base", *ROPE_BASE, default=10000.0), rope_mode=ROPE_MODES[arch],
        n_ctx_train=m.int(f"{arch}.context_length", 1, MAX_CTX), n_vocab=n_vocab,
        tied_output="output.weight" not in names, has_qkv_bias="blk.0.attn_q.bias" in names,
        has_qk_norm=arch == "qwen3", has_rope_freqs="rope_freqs.weight" in names,
        n_nextn=n_nextn, nextn_hidden=nextn_hidden(m, arch))


def check_rope_scaling(m: Metadata, arch: str) -> None:
    """Refuse the rope scaling keys that would change the angles, read as llama.cpp's load_hparams and
    llama_context read them: the type defaults to "linear" (absent is not "none"); under "linear" the
    angles are multiplied by 1 / rope.scaling.factor (else the old key rope.scale_linear; 0 means 1);
    "none" ignores the factor; and every type multiplies cos and sin by rope.scaling.attn_factor.
    The kernels turn by base^(-2i/d) / rope_freqs only, so each of those must be a no-op here."""
    scaling = m.str(f"{arch}.rope.scaling.type", default="linear")
    if scaling not in ("none", "linear"):
        raise VkdflashError(f"rope scaling {quote(scaling)} ({arch}.rope.scaling.type) is not supported")
    if scaling == "linear":
        key = next((k for k in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear") if k in m), None)
        factor = 0.0 if key is None else m.float(key, 0.0, 1e6)
        if factor not in (0.0, 1.0):
            raise VkdflashError(f"{key} = {factor:g}: linear rope scaling (positions divided by the factor) "
                                "is not supported")
    attn_factor = m.float(f"{arch}.rope.scaling.attn_factor", 0.0, 1e6, default=1.0)
    if attn_factor != 1.0:
        raise VkdflashError(f"{arch}.rope.scaling.attn_factor = {attn_factor:g}: scaled rope (cos and sin times "
                            "the factor) is not supported")


def check_output_rows(hp: HParams, m: Metadata) -> None:
    """Sampling may pick any row of the output layer (hp.n_vocab rows, as the tensors were checked to
    have), so each row needs a token to print. Fewer rows than tokens is harmless: the model never emits
    the rest, and the forward pass refuses a prompt holding one. (llama.cpp's converter pads the token
    list to the rows with [PAD] tokens, so real files have as many of each.)"""
    tokens = m.strings("tokenizer.ggml.tokens", MAX_VOCAB, default=None)
    if tokens is not None and hp.n_vocab > len(tokens):
        raise VkdflashError(f"the output layer has {hp.n_vocab} rows but the tokenizer only {len(tokens)} tokens: "
                            f"the model could emit ids {len(tokens)}..{hp.n_vocab - 1}, which have no text")


def nextn_hidden(m: Metadata, arch: str) -> str:
    """{arch}.nextn.hidden: "prenorm" (default, llama.cpp's GLM4-MoE / Qwen3.5 heads) or "postnorm"."""
    return m.str(f"{arch}.nextn.hidden", default="prenorm", choices=NEXTN_HIDDEN)
