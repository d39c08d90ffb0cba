"""Fused attention against the numpy reference, over every K/V cache type pair and a shape sweep.

The reference reads the dequantized cache (gguf-py's dequantizer), so the comparison isolates
the kernel from quantization error."""
from __future__ import annotations

import numpy as np
from gguf import quants as gq

from . import NMSE_ATTENTION, Case, launch, rng, uniform
from ..kernels.attention import attention
from ..kernels.types import CACHE_TYPES, get_type
from ..runtime.memory import prefers_texel_loads
from ..ref.attention import attention as ref_attention
from ..ref.hadamard import fwht_f32


def make_cache(r: np.random.Generator, type_name: str, n_ctx: int, n_head_kv: int, head_dim: int):
    """Random cache rows in `type_name`'s layout: (raw bytes [n_ctx, row_bytes], dequantized
    values [n_ctx, n_head_kv, head_dim] f32)."""
    t = get_type(type_name)
    n = n_head_kv * head_dim
    if type_name == "iq4_nl":  # gguf-py cannot quantize iq4_nl: random valid blocks instead
        blocks = r.integers(0, 256, size=(n_ctx, n // 32, t.block_bytes), dtype=np.uint8)
        d = r.uniform(0.002, 0.009, size=(n_ctx, n // 32)).astype(np.float16)
        blocks[:, :, :2] = d.view(np.uint8).reshape(n_ctx, n // 32, 2)
        raw = blocks.reshape(n_ctx, -1)
    else:
        raw = np.ascontiguousarray(gq.quantize(uniform(r, n_ctx, n), t.gguf)).view(np.uint8)
    assert raw.shape == (n_ctx, t.row_bytes(n))
    deq = gq.dequantize(raw, t.gguf).astype(np.float32)
    return raw, deq.reshape(n_ctx, n_head_kv, head_dim)


def upload_cache(ctx, raw: np.ndarray):
    """Upload cache rows followed by the 16-byte tail attention() needs, filled with 0xFF
    (NaN in every float type) so a kernel that used those bytes would show it."""
    pad = -raw.nbytes % 16
    buf = ctx.upload(np.concatenate([raw.reshape(-1), np.full(pad + 16, 0xFF, np.uint8)]))
    return buf, buf.view(0, raw.nbytes)


def run_attention(ctx, q, k_raw, v_raw, first_pos, n_head_kv, k_type, v_type, mask="causal",
                  scale=None, q_rotation=0, texel=None):
    """Upload, record, run once; returns f32 [n_q, n_head, hd] (`launch` checks Q is unchanged)."""
    n_q, n_head, hd = q.shape
    (kb, kv), (vb, vv) = upload_cache(ctx, k_raw), upload_cache(ctx, v_raw)

    def record(g, qb, _kb, _vb, pb, out):
        attention(g, qb, kv, vv, out, pb, n_q, n_head, n_head_kv, hd, k_type, v_type, mask, scale, q_rotation,
                  texel)
    return launch(ctx, q.nbytes, record, q, kb, vb, np.array([first_pos], np.uint32)).reshape(q.shape)


def _case(k_type, v_type, hd, n_head, n_head_kv, n_q, first_pos, mask, scale=None, slow=False, q_rotation=0,
          other_path=False):
    def run(ctx):
        r = rng("attention", k_type, v_type, hd, n_head, n_head_kv, n_q, first_pos, mask, scale, q_rotation)
        n_ctx = first_pos + n_q + 3  # rows past the visible range must be ignored
        k_raw, k = make_cache(r, k_type, n_ctx, n_head_kv, hd)
        v_raw, v = make_cache(r, v_type, n_ctx, n_head_kv, hd)
        q = uniform(r, n_q, n_head, hd)
        texel = not prefers_texel_loads(ctx.features) if other_path else None
        got = run_attention(ctx, q, k_raw, v_raw, first_pos, n_head_kv, k_type, v_type, mask, scale, q_rotation,
                            texel)
        q_ref = fwht_f32(q, q_rotation) if q_rotation else q
        return got, ref_attention(q_ref, k, v, first_pos, mask, scale)
    name = (f"attention/{'other-path/' if other_path else ''}{k_type},{v_type}/hd={hd},heads={n_head}/{n_head_kv},n_q={n_q},"
            f"pos={first_pos},{mask}" + ("" if scale is None else f",scale={scale}")
            + (f",qrot={q_rotation}" if q_rotation else ""))
    return Case(name, run, threshold=NMSE_ATTENTION, slow=slow)


# sweep: one K/V pair per (head_dim, GQA ratio), which fixes the pipelines compiled; together
# they put every cache type at head_dim 64 or 128
_SWEEP_TYPES = {(64, 1): ("f16", "f16"), (64, 3): ("q8_0", "q8_0"), (64, 4): ("q4_0", "iq4_nl"),
                (128, 1): ("f32", "q5_1"), (128, 3): ("bf16", "q4_1"), (128, 4): ("q5_0", "f16")}
_KV_LENGTHS = (37, 100, 150, 300, 490)


def cases():
    # every K/V pair, tiny (one pipeline each): one block per head, two kv heads (odd 16-bit
    # offsets for 9-word blocks)
    out = [_case(kt, vt, 32, 2, 2, 1, 9, "causal", scale=1.0) for kt in CACHE_TYPES for vt in CACHE_TYPES]
    i = 0
    for (hd, gqa), (kt, vt) in _SWEEP_TYPES.items():
        for mask in ("causal", "block"):
            for n_q in (1, 5, 16):
                n_kv = _KV_LENGTHS[i % len(_KV_LENGTHS)]
                out.append(_case(kt, vt, hd, 2 * gqa, 2, n_q, n_kv - n_q, mask, scale=(None, 0.5, 1.5)[i % 3],
                                 slow=n_kv * n_q * gqa * hd > 1_000_000))
                i += 1
    out.append(_case("q8_0", "q4_1", 256, 4, 2, 4, 200, "causal"))
    # Q rotated in the kernel, as a rotated K cache reads it: every rotation size, decode and batch
    for kt, vt, hd, rot, n_q in (("q8_0", "q8_0", 64, 64, 1), ("q4_0", "f16", 64, 64, 7),
                                 ("q5_1", "q4_1", 128, 128, 1), ("iq4_nl", "q5_0", 128, 128, 5),
                                 ("q4_1", "q8_0", 192, 64, 3), ("q5_0", "iq4_nl", 256, 256, 2)):
        out.append(_case(kt, vt, hd, 4, 2, n_q, 40, "causal", q_rotation=rot))
    out.append(_case("f16", "q8_0", 128, 32, 8, 64, 2000, "causal", slow=True))
    # the load path the device does not prefer (texel or storage buffers), so both are checked
    out += [_case("f16", "f16", 64, 6, 2, 5, 30, "causal", other_path=True),
            _case("q4_0", "iq4_nl", 64, 8, 2, 1, 40, "causal", other_path=True),
            _case("q8_0", "q4_1", 128, 4, 2, 3, 40, "block", q_rotation=128, other_path=True)]
    return out
