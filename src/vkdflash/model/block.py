"""One transformer decoder block (llama / qwen2 / qwen3 style), recorded into a Graph: the one
recorder the target's forward pass, MTP heads, DFlash drafts and third-party drafters share.

    x += W_o attend(RoPE(q_norm(W_q xn)), write(RoPE(k_norm(W_k xn)), W_v xn))   xn = RMSNorm(x)
    x += W_down (silu(W_gate xn) * W_up xn)                                        xn = RMSNorm(x)

K/V go to the cache through `kv`, a KV cache or a strategy's KVHandle (both have record_write
and attend: the core's one write path and its matching read path). Every kernel is batch
invariant, so a row's result does not depend on how many rows are recorded together."""
from __future__ import annotations

from dataclasses import dataclass

from ..kernels.elementwise import add
from ..kernels.matmul import glu, matmul, matmul_split, norm_on_load
from ..kernels.norm import rms_norm
from ..kernels.rope import rope, store_rope


@dataclass(frozen=True)
class BlockShape:
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rms_eps: float
    rope_base: float
    rope_mode: str = "normal"       # "normal" (llama) or "neox" (qwen2/3, DFlash)
    rope_factors: object = None     # llama3-style per-pair frequency factors, or None


@dataclass
class BlockWeights:
    """One block's tensors (GGUF names blk.N.*): Weights for matrices, f32 buffers for vectors."""
    attn_norm: object
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: object
    gate: object
    up: object
    down: object
    bias: tuple | None = None       # (q, k, v) biases, repeated once per row (qwen2)
    qk_norm: tuple | None = None    # (q_norm, k_norm), per head (qwen3, DFlash)
    wqkv: object = None             # wq, wk, wv stacked in one Weight (they are its row slices)

    @classmethod
    def load(cls, vec, mat, prefix: str, bias: bool = False, qk_norm: bool = False,
             bias_rows: int = 1, stack=None) -> "BlockWeights":
        """vec(name[, repeat]) -> f32 buffer and mat(name) -> Weight read the tensors `prefix` + name;
        stack(names) -> (stacked Weight, its row slices) or None, where Q, K and V may share one."""
        p = prefix
        qkv_names = [p + f"attn_{x}.weight" for x in "qkv"]
        stacked = stack(qkv_names) if stack else None
        wqkv, (wq, wk, wv) = stacked if stacked else (None, [mat(name) for name in qkv_names])
        return cls(vec(p + "attn_norm.weight"), wq, wk, wv, mat(p + "attn_output.weight"), vec(p + "ffn_norm.weight"),
                   mat(p + "ffn_gate.weight"), mat(p + "ffn_up.weight"), mat(p + "ffn_down.weight"),
                   tuple(vec(p + f"attn_{x}.bias", bias_rows) for x in "qkv") if bias else None,
                   (vec(p + "attn_q_norm.weight"), vec(p + "attn_k_norm.weight")) if qk_norm else None, wqkv)


@dataclass
class BlockBuffers:
    """f32 scratch for up to `rows` rows: x is the residual stream the block updates in place."""
    x: object
    xn: object
    q: object
    k: object
    v: object
    att: object
    gate: object
    up: object

    @classmethod
    def alloc(cls, buffer, s: BlockShape, rows: int) -> "BlockBuffers":
        """buffer(nbytes) allocates (e.g. DeviceStore.buffer, freed with the store). q, k and v
        are views of one buffer, so a stacked QKV matmul fills them in one dispatch."""
        d, q, kv = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        f32 = lambda n: buffer(4 * rows * n)  # noqa: E731
        qkv = f32(q + 2 * kv)
        return cls(f32(d), f32(d), qkv.view(0, 4 * rows * q), qkv.view(4 * rows * q, 4 * rows * kv),
                   qkv.view(4 * rows * (q + kv), 4 * rows * kv), f32(q), f32(s.n_ff), f32(s.n_ff))


def project(g, w: BlockWeights, s: BlockShape, src, out, which: int, n: int, pos, rotate: bool = True,
            product: bool = True) -> None:
    """out = W src for n rows, W the q (which=0), k (1) or v (2) projection (unless `product` is
    False: out holds it already); then its bias, and for q and k the per-head norm and (with
    `rotate`) RoPE at the uint32 positions in `pos`."""
    weight, heads = ((w.wq, s.n_head), (w.wk, s.n_head_kv), (w.wv, s.n_head_kv))[which]
    if product:
        matmul(g, weight, src, out, n)
    if w.bias:
        add(g, out, w.bias[which], out, n * heads * s.head_dim)
    if which < 2:
        if w.qk_norm:
            rms_norm(g, out, w.qk_norm[which], out, n * heads, s.head_dim, s.rms_eps)
        if rotate:
            rope(g, out, pos, out, n, heads, s.head_dim, s.rope_base, s.rope_mode, freq_factors=s.rope_factors)


def write_kv(g, w: BlockWeights, s: BlockShape, b: BlockBuffers, kv, layer: int, src, n: int, pos) -> None:
    """K and V of n rows of `src` (already normed) into `kv` at `pos`, through the core write path."""
    project(g, w, s, src, b.k, 1, n, pos)
    project(g, w, s, src, b.v, 2, n, pos)
    kv.record_write(g, layer, b.k, b.v, pos, n)


def record_block(g, w: BlockWeights, s: BlockShape, b: BlockBuffers, kv, layer: int, n: int, pos, params,
                 mask: str = "causal") -> None:
    """The whole block on n rows of b.x, in place. pos: n uint32 positions; params: uint32 word 0
    is the first query's position (attention's mask), both rewritable between replays."""
    d, eps = s.n_embd, s.rms_eps
    # where the kernel shape allows, QKV and the GLU apply their RMSNorm as they load x
    fused = w.wqkv is not None and norm_on_load(g, n, b.x, w.attn_norm, w.wqkv)
    if not fused:
        rms_norm(g, b.x, w.attn_norm, b.xn, n, d, eps)
    roped = False
    if w.wqkv is not None:
        # Q and K turned as the matmul stores them where nothing comes between (bias, qk_norm)
        turn = None if w.bias or w.qk_norm else store_rope(g, pos, n, s.head_dim, s.rope_base, s.rope_mode,
                                                            freq_factors=s.rope_factors)
        roped = matmul_split(g, w.wqkv, b.x if fused else b.xn, [(w.wq.rows, b.q), (w.wk.rows, b.k), (w.wv.rows, b.v)],
                             n, rope=turn, norm=(w.attn_norm, eps) if fused else None)
    project(g, w, s, b.xn, b.q, 0, n, pos, rotate=False, product=w.wqkv is None)
    project(g, w, s, b.xn, b.k, 1, n, pos, rotate=False, product=w.wqkv is None)
    project(g, w, s, b.xn, b.v, 2, n, pos, product=w.wqkv is None)
    if not roped:  # Q and K in one dispatch; every path gives write_kv's bits
        rope(g, b.q, pos, b.q, n, s.n_head, s.head_dim, s.rope_base, s.rope_mode, freq_factors=s.rope_factors,
             second=(b.k, b.k, s.n_head_kv))
    kv.record_write(g, layer, b.k, b.v, pos, n)
    kv.attend(g, layer, b.q, b.att, params, n, s.n_head, mask=mask)
    matmul(g, w.wo, b.att, b.x, n, accumulate=True)
    fused = norm_on_load(g, n, b.x, w.ffn_norm, w.gate, w.up)
    if not fused:
        rms_norm(g, b.x, w.ffn_norm, b.xn, n, d, eps)
    glu(g, w.gate, w.up, b.x if fused else b.xn, b.gate, n, b.up, norm=(w.ffn_norm, eps) if fused else None)
    matmul(g, w.down, b.gate, b.x, n, accumulate=True)
