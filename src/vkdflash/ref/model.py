"""numpy reference forward pass of dense llama / qwen2 / qwen3 GGUF models, computed as llama.cpp does.

Graph per token (llama.cpp's llm_build_llama / qwen2 / qwen3):
  x = token_embd[t]
  per block: h = attn_norm(x); q, k, v = W h (+ bias, qwen2); qwen3: per-head q_norm / k_norm;
    RoPE (normal for llama, NEOX for qwen2/qwen3) at the cache positions; K, V written to the cache
    (rotated / quantized by ref.kv); causal GQA attention, scale 1/sqrt(head_dim);
    x += attn_output(o); x += ffn_down(silu(ffn_gate(h')) * ffn_up(h')) with h' = ffn_norm(x)
  logits = output(output_norm(x)), output = token_embd when the file has no output.weight.

Precision: weights are dequantized once (gguf-py, bit-exact with ggml's dequantizers) and matrices
kept as f64 (exact copies of the f32 values; twice the memory, ~1.1 GB for SmolLM2-135M);
activations are f32 between operations. Matrix products, RMSNorm, RoPE, SwiGLU and the attention
(scores, softmax, weighted sum) are computed in f64 and rounded to f32 (ref.ops, ref.attention): each
operation is the correctly rounded result of its f32 inputs, the sharper side of any comparison with
a GPU kernel, and a row's result does not depend on how many rows share the call (an f32 BLAS
product does, in the last bits), so incremental and batched decoding agree to rounding."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from ..errors import VkdflashError
from . import ops
from .kv import KVCache


def dequantize_tensor(t) -> np.ndarray:
    """A TensorData -> f32 array in numpy order (ggml shape reversed: [n_out, n_in] for a matrix)."""
    x = gq.dequantize(t.data, GGMLQuantizationType(t.type_id))
    return np.ascontiguousarray(x, np.float32).reshape(tuple(reversed(t.shape)))


class RefWeights:
    """Every tensor of a ModelFile dequantized once (matrices f64, vectors f32); share one between
    several RefModels."""

    def __init__(self, model_file):
        self.hparams = hp = model_file.hparams
        self.t = {}
        for name in model_file.gguf.tensors:
            x = dequantize_tensor(model_file.tensor(name))
            self.t[name] = x.astype(np.float64) if x.ndim > 1 else x
        if hp.tied_output:
            self.t["output.weight"] = self.t["token_embd.weight"]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.t[name]

    def get(self, name: str):
        return self.t.get(name)


@dataclass
class RefOutput:
    logits: np.ndarray                       # [n, n_vocab] f32
    hidden: dict = field(default_factory=dict)  # layer-input id -> [n, n_embd] f32 residual stream
    final: np.ndarray | None = None          # [n, n_embd] f32, after output_norm


class RefModel:
    """RefModel(model_file_or_weights, ctk, ctv, rotate): a model with its own KV cache.

    forward() appends tokens at the cache's current position. Captured hidden states use
    llama.cpp's layer-input numbering: id i is the residual stream entering block i (0 = the
    embeddings), id n_layer the stream leaving the last block (before output_norm)."""

    def __init__(self, model, ctk: str = "f16", ctv: str = "f16", rotate: bool = True, n_ctx: int | None = None):
        self.w = model if isinstance(model, RefWeights) else RefWeights(model)
        self.hp = hp = self.w.hparams
        self.n_ctx = hp.n_ctx_train if n_ctx is None else n_ctx
        self.cache = KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, ctk, ctv, rotate)

    @property
    def n_past(self) -> int:
        return self.cache.n

    def reset(self) -> None:
        self.cache.reset()

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return ops.rope(x, positions, self.hp.rope_base, self.hp.rope_mode,
                        freq_factors=self.w.get("rope_freqs.weight"))

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x [n, n_in] f32 times the weight's transpose, in f64, rounded to f32."""
        return (np.asarray(x, np.float64) @ self.w[name].T).astype(np.float32)

    def _proj(self, h: np.ndarray, name: str) -> np.ndarray:
        y = self._mm(h, name + ".weight")
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def _block(self, i: int, x: np.ndarray, pos0: int) -> np.ndarray:
        hp, w, b = self.hp, self.w, f"blk.{i}."
        n, hd = len(x), hp.head_dim
        h = ops.rms_norm(x, w[b + "attn_norm.weight"], hp.rms_eps)
        q = self._proj(h, b + "attn_q").reshape(n, hp.n_head, hd)
        k = self._proj(h, b + "attn_k").reshape(n, hp.n_head_kv, hd)
        v = self._proj(h, b + "attn_v").reshape(n, hp.n_head_kv, hd)
        if hp.has_qk_norm:
            q = ops.rms_norm(q, w[b + "attn_q_norm.weight"], hp.rms_eps)
            k = ops.rms_norm(k, w[b + "attn_k_norm.weight"], hp.rms_eps)
        positions = pos0 + np.arange(n)
        q, k = self._rope(q, positions), self._rope(k, positions)
        self.cache.write(i, pos0, k, v)
        o = self.cache.attend(i, q, pos0)
        x = x + self._mm(o.reshape(n, hp.n_head * hd), b + "attn_output.weight")
        h = ops.rms_norm(x, w[b + "ffn_norm.weight"], hp.rms_eps)
        f = ops.swiglu(self._mm(h, b + "ffn_gate.weight"), self._mm(h, b + "ffn_up.weight"))
        return x + self._mm(f, b + "ffn_down.weight")

    def forward(self, tokens, capture_layers=()) -> RefOutput:
        """Run tokens (list of ids) at positions n_past.. and return the logits of every one."""
        hp = self.hp
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if len(tokens) == 0:
            raise VkdflashError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise VkdflashError(f"token id out of range 0..{hp.n_vocab - 1}")
        capture = sorted(set(int(c) for c in capture_layers))
        if capture and not (0 <= capture[0] and capture[-1] <= hp.n_layer):
            raise VkdflashError(f"capture layer ids must be in 0..{hp.n_layer}, got {capture}")
        pos0 = self.n_past
        if pos0 + len(tokens) > self.n_ctx:
            raise VkdflashError(f"context full: {pos0} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        out = RefOutput(logits=None)
        x = self.w["token_embd.weight"][tokens].astype(np.float32)
        for i in range(hp.n_layer):
            if i in capture:
                out.hidden[i] = x.copy()
            x = self._block(i, x, pos0)
        if hp.n_layer in capture:
            out.hidden[hp.n_layer] = x.copy()
        out.final = ops.rms_norm(x, self.w["output_norm.weight"], hp.rms_eps)
        out.logits = self._mm(out.final, "output.weight")
        return out

    def logits(self, tokens) -> np.ndarray:
        """forward(tokens).logits."""
        return self.forward(tokens).logits
