"""Llama-architecture files other than SmolLM2: tiny models that vary one thing at a time (head
counts, head width, rope keys and tensors, biases, norms, weight types), each either computed right
or refused in one line naming what is unsupported. "Right" is judged against an independent float64
transcription of llama.cpp's graph that reads the file with gguf-py itself (not through
vkdflash's hparams), so a key the loader drops shows up as a wrong logit, not as agreement between
two readers that share the mistake."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType as VT, GGUFWriter
from gguf.quants import dequantize

import gguf_fixtures as F
from vkdflash.conformance import nmse
from vkdflash.errors import VkdflashError
from vkdflash.model import GGUFFile, load_model
from vkdflash.model.forward import Model
from vkdflash.ref.model import RefModel

PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30, 7, 19, 4]
BASE = dict(n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=32, weight_type="f32")
K_QUANTS = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64)  # rows of 256 for q4_K / q6_K
NMSE_REF = 1e-10   # the numpy reference: f64 products rounded to f32
NMSE_GPU = 1e-6    # the GPU with an f32 cache (lavapipe gives ~1e-13)
BIAS_SHAPES = {"attn_q.bias": "q", "attn_k.bias": "kv", "attn_v.bias": "kv", "attn_output.bias": "d",
               "ffn_gate.bias": "ff", "ffn_up.bias": "ff", "ffn_down.bias": "d"}


def _md(key, value):
    return {f"llama.{key}": value}


# name -> write_model keywords (merged over BASE); extra: bias tensors added to every block
VARIANTS = {
    "mha": dict(n_head_kv=4),
    "gqa2": {},
    "gqa4": dict(n_embd=256, n_head=8, n_head_kv=2),
    "gqa8": dict(n_embd=256, n_head=8, n_head_kv=1),
    "mqa": dict(n_head_kv=1),
    "q_wider_than_embd": dict(head_dim=64),                       # q rows 256, n_embd 128
    "q_narrower_than_embd": dict(n_head=2, n_head_kv=1),          # q rows 64
    "embd_not_heads_times_dim": dict(n_embd=96, n_head=2, n_head_kv=1),
    "no_key_length": dict(head_dim=None),                         # n_embd / n_head
    "rope_base_500k": dict(metadata=_md("rope.freq_base", (500000.0, VT.FLOAT32))),
    "no_rope_base": dict(metadata=_md("rope.freq_base", F.DROP)),  # llama.cpp's 10000
    "no_head_count_kv": dict(n_head_kv=4, metadata=_md("attention.head_count_kv", F.DROP)),
    "rms_eps_1e-6": dict(metadata=_md("attention.layer_norm_rms_epsilon", (1e-6, VT.FLOAT32))),
    "rms_eps_1e-2": dict(metadata=_md("attention.layer_norm_rms_epsilon", (1e-2, VT.FLOAT32))),
    "tied_output": dict(tied=True),
    "rope_freqs": dict(rope_freqs=True),                          # Llama-3.x per-pair factors
    "qkv_bias": dict(extra=("attn_q.bias", "attn_k.bias", "attn_v.bias")),
    "scaling_none_with_factor": dict(metadata={**_md("rope.scaling.type", ("none", VT.STRING)),
                                               **_md("rope.scaling.factor", (4.0, VT.FLOAT32))}),
    "scaling_linear_factor_1": dict(metadata={**_md("rope.scaling.type", ("linear", VT.STRING)),
                                              **_md("rope.scaling.factor", (1.0, VT.FLOAT32))}),
    "attn_factor_1": dict(metadata=_md("rope.scaling.attn_factor", (1.0, VT.FLOAT32))),
    "f16": dict(weight_type="f16"),
    "q8_0": dict(weight_type="q8_0"),
    "q4_0": dict(weight_type="q4_0"),
    "q4_k": dict(weight_type="q4_k", **K_QUANTS),
    "q6_k": dict(weight_type="q6_k", **K_QUANTS),
    "mix": dict(weight_type="q4_k", embd_type="q6_k", types={
        "output.weight": "q8_0", "blk.0.attn_v.weight": "f16", "blk.0.ffn_down.weight": "q6_k",
        "blk.1.ffn_down.weight": "q4_0", "blk.1.attn_q.weight": "q8_0"}, **K_QUANTS),
    "mix_tied": dict(weight_type="q8_0", embd_type="q6_k", tied=True, **K_QUANTS),
}


def write(path, extra=(), **kw):
    """F.write_model over BASE; `extra` adds the named bias tensors to every block (llama.cpp loads
    each of them for a llama file when present)."""
    kw = {**BASE, **kw}
    if not extra:
        return F.write_model(path, "llama", **kw)
    md = F.model_metadata("llama", 2, kw["n_embd"], kw["n_ff"], kw["n_head"], kw["n_head_kv"], kw["head_dim"], 256)
    spec = F.model_tensors("llama", 2, kw["n_embd"], kw["n_ff"], kw["n_head"], kw["n_head_kv"], kw["head_dim"],
                           len(F.vocab()[0]), False)
    size = dict(q=kw["n_head"] * kw["head_dim"], kv=kw["n_head_kv"] * kw["head_dim"], d=kw["n_embd"], ff=kw["n_ff"])
    for i in range(2):
        spec.update({f"blk.{i}.{name}": (size[BIAS_SHAPES[name]],) for name in extra})
    r = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.kv_data[0].clear()
    for key, (value, vtype, *item) in md.items():
        w.add_key_value(key, value, vtype, item[0] if item else None)
    for name, shape in spec.items():
        data, gt = F._weights(r, shape, kw["weight_type"])
        w.add_tensor(name, data, raw_dtype=gt)
    return F.finish(w, path)


def independent_logits(path, tokens) -> np.ndarray:
    """llama.cpp's llama graph in float64, one token and one head at a time, from the file as gguf-py
    reads it: defaults, rope scaling (linear factor, attn_factor), rope_freqs and every optional bias
    as llama-model.cpp / llama-context.cpp / ggml_rope_ext apply them."""
    reader = GGUFReader(str(path))
    md = {}
    for field in reader.fields.values():
        if field.types and field.types[0] != VT.ARRAY:
            part = field.parts[field.data[0]]
            md[field.name] = bytes(part).decode() if field.types[0] == VT.STRING else part[0].item()
    W = {t.name: np.asarray(dequantize(t.data, GGMLQuantizationType(t.tensor_type)), np.float64)
         .reshape(tuple(reversed([int(s) for s in t.shape]))) for t in reader.tensors}
    n_layer, n_embd = md["llama.block_count"], md["llama.embedding_length"]
    n_head = md["llama.attention.head_count"]
    n_kv = md.get("llama.attention.head_count_kv", n_head)
    hd = md.get("llama.attention.key_length", n_embd // n_head)
    n_rot = md.get("llama.rope.dimension_count", hd)
    eps, base = md["llama.attention.layer_norm_rms_epsilon"], md.get("llama.rope.freq_base", 10000.0)
    scaling = md.get("llama.rope.scaling.type", "linear")
    assert scaling in ("none", "linear"), scaling
    factor = md.get("llama.rope.scaling.factor", md.get("llama.rope.scale_linear", 0.0))
    freq_scale = 1.0 if scaling == "none" or factor == 0 else 1.0 / factor
    mscale = md.get("llama.rope.scaling.attn_factor", 1.0)
    ff = W.get("rope_freqs.weight", np.ones(n_rot // 2))
    out_w = W.get("output.weight", W["token_embd.weight"])

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x) + eps) * g

    def rope(v, p):
        theta = p * freq_scale * base ** (-2.0 * np.arange(n_rot // 2) / n_rot) / ff
        c = (v[0:n_rot:2] + 1j * v[1:n_rot:2]) * np.exp(1j * theta) * mscale
        v = v.copy()
        v[0:n_rot:2], v[1:n_rot:2] = c.real, c.imag
        return v

    def lin(name, x):
        return W[name + ".weight"] @ x + W.get(name + ".bias", 0.0)

    keys, vals, logits = [[] for _ in range(n_layer)], [[] for _ in range(n_layer)], []
    for p, t in enumerate(tokens):
        x = W["token_embd.weight"][t].copy()
        for i in range(n_layer):
            b = f"blk.{i}."
            h = norm(x, W[b + "attn_norm.weight"])
            q, k, v = (lin(b + f"attn_{n}", h) for n in "qkv")
            keys[i].append([rope(k[j * hd:(j + 1) * hd], p) for j in range(n_kv)])
            vals[i].append([v[j * hd:(j + 1) * hd] for j in range(n_kv)])
            heads = []
            for j in range(n_head):
                qh, kv_head = rope(q[j * hd:(j + 1) * hd], p), j // (n_head // n_kv)
                s = np.array([qh @ keys[i][u][kv_head] for u in range(p + 1)]) / np.sqrt(hd)
                a = np.exp(s - s.max())
                heads.append(sum(a[u] / a.sum() * vals[i][u][kv_head] for u in range(p + 1)))
            x = x + lin(b + "attn_output", np.concatenate(heads))
            h = norm(x, W[b + "ffn_norm.weight"])
            g = lin(b + "ffn_gate", h)
            x = x + lin(b + "ffn_down", g / (1 + np.exp(-g)) * lin(b + "ffn_up", h))
        logits.append(out_w @ norm(x, W["output_norm.weight"]))
    return np.array(logits)


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    """name -> (path, independent logits of PROMPT), written once per module."""
    d, cache = tmp_path_factory.mktemp("variants"), {}

    def get(name):
        if name not in cache:
            path = write(d / f"{name}.gguf", **VARIANTS[name])
            cache[name] = path, independent_logits(path, PROMPT)
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reference_matches_independent(variant, name):
    path, want = variant(name)
    with load_model(path) as mf:
        got = RefModel(mf, "f32", "f32", n_ctx=64).forward(PROMPT).logits
    assert nmse(got, want) < NMSE_REF


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gpu_matches_independent(ctx0, variant, name):
    path, want = variant(name)
    with load_model(path) as mf:
        m = Model(ctx0, mf, n_ctx=64, ctk="f32", ctv="f32")
        try:
            got = m.forward(PROMPT, all_logits=True).logits
        finally:
            m.close()
    assert nmse(got, want) < NMSE_GPU


def one_line_refusal(path) -> str:
    with pytest.raises(VkdflashError) as info:
        load_model(path).close()
    line = str(info.value)
    assert "\n" not in line and len(line) < len(str(path)) + 200, line
    return line


# keys llama.cpp applies to a llama file that the kernels cannot: each must be refused, naming the key
CHANGES_THE_ANGLES = {
    # no type: llama.cpp's default is "linear", and the factor divides every angle
    "factor_without_type": ({"rope.scaling.factor": (4.0, VT.FLOAT32)}, "llama.rope.scaling.factor = 4"),
    "old_scale_linear_key": ({"rope.scale_linear": (2.0, VT.FLOAT32)}, "llama.rope.scale_linear = 2"),
    "linear_with_factor": ({"rope.scaling.type": ("linear", VT.STRING), "rope.scaling.factor": (8.0, VT.FLOAT32)},
                           "llama.rope.scaling.factor = 8"),
    # llama_context multiplies cos and sin by it whatever the scaling type
    "attn_factor": ({"rope.scaling.attn_factor": (1.5, VT.FLOAT32)}, "llama.rope.scaling.attn_factor = 1.5"),
    "yarn": ({"rope.scaling.type": ("yarn", VT.STRING), "rope.scaling.factor": (4.0, VT.FLOAT32)},
             "rope scaling 'yarn' (llama.rope.scaling.type)"),
    "longrope": ({"rope.scaling.type": ("longrope", VT.STRING)}, "rope scaling 'longrope' (llama.rope.scaling.type)"),
    "partial_rotary": ({"rope.dimension_count": (16, VT.UINT32)}, "llama.rope.dimension_count 16 differs"),
    "nan_factor": ({"rope.scaling.factor": (float("nan"), VT.FLOAT32)},
                   "llama.rope.scaling.factor = nan is out of range"),
}


@pytest.mark.parametrize("name", list(CHANGES_THE_ANGLES))
def test_rope_keys_that_change_the_math_are_refused(tmp_path, name):
    keys, words = CHANGES_THE_ANGLES[name]
    path = write(tmp_path / "m.gguf", metadata={f"llama.{k}": v for k, v in keys.items()})
    assert words in one_line_refusal(path)


@pytest.mark.parametrize("extra", [("attn_output.bias",), ("ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"),
                                   ("attn_q.bias",)])
def test_biases_the_forward_pass_lacks_are_refused(tmp_path, extra):
    """llama.cpp adds each of these when a llama file has it; vkdflash adds Q, K and V biases as a set."""
    line = one_line_refusal(write(tmp_path / "m.gguf", extra=extra))
    assert ("unexpected tensor 'blk.0." in line or "missing tensor blk.0.attn_k.bias" in line), line


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_rope_freqs_that_are_not_positive_are_refused_at_load(tmp_path, value):
    path = write(tmp_path / "m.gguf", rope_freqs=True)
    with GGUFFile(path) as g:
        offset = g.tensors["rope_freqs.weight"].offset
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = np.float32(value).tobytes()
    path.write_bytes(bytes(data))
    line = one_line_refusal(path)
    assert f"tensor rope_freqs.weight holds {value:g}: rope frequency factors must be positive" in line


def test_rows_the_kernels_cannot_read_are_refused_at_load(tmp_path):
    """An f16 model with n_ff 100 loaded (and `inspect` called it fine) until the GPU model was
    built and its first weight refused; now the file is refused where it is read."""
    from gguf_fixtures import write_model
    path = write_model(tmp_path / "m.gguf", "llama", n_embd=64, n_ff=100, n_head=2, n_head_kv=1, head_dim=32,
                       weight_type="f16")
    with pytest.raises(VkdflashError, match=r"ffn_down.weight has rows of 100 values: .* multiple of 32"):
        load_model(str(path))
