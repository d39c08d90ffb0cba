"""GGUF parsing and validation: the tiny fixture models load (checked against gguf-py's own reader),
and every malformation is a one-line VkdflashError that names the problem, never a hang or traceback."""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import GGUFValueType as VT

import gguf_fixtures as F
from vkdflash.errors import VkdflashError
from vkdflash.model import GGUFFile, expected_tensors, inspect_file, load_model
from vkdflash.model.describe import describe

ARCHS = ["llama", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {a: F.write_model(d / f"{a}.gguf", a, seed=i) for i, a in enumerate(ARCHS)}


def failure(path) -> str:
    """The message of the VkdflashError that loading `path` must raise."""
    with pytest.raises(VkdflashError) as info:
        load_model(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_and_matches_gguf_py(models, arch):
    path = models[arch]
    ref = GGUFReader(path)
    with load_model(path) as m:
        hp = m.hparams
        assert (hp.arch, hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv) == (arch, 2, 64, 128, 4, 2)
        assert hp.head_dim == (32 if arch == "qwen3" else 16)
        assert hp.rope_mode == ("normal" if arch == "llama" else "neox")
        assert hp.n_vocab == len(F.vocab()[0]) and hp.n_ctx_train == 256
        assert hp.tied_output == (arch == "qwen2") and hp.has_qkv_bias == (arch == "qwen2")
        assert hp.has_qk_norm == (arch == "qwen3")
        assert hp.rms_eps == pytest.approx(1e-5 if arch == "llama" else 1e-6)
        assert m.output_name == ("token_embd.weight" if hp.tied_output else "output.weight")
        assert set(m.gguf.tensors) == set(expected_tensors(hp)) == {t.name for t in ref.tensors}
        for t in ref.tensors:
            type_id, shape, data = m.tensor(t.name)
            assert type_id == int(t.tensor_type) and shape == tuple(int(x) for x in t.shape)
            assert data.dtype == np.uint8 and not data.flags.writeable
            assert np.array_equal(data, np.asarray(t.data).reshape(-1).view(np.uint8)), t.name
        for key, field in ref.fields.items():
            if key.startswith("GGUF."):
                continue
            got = m.metadata[key]
            want = field.contents()
            if isinstance(got, np.ndarray):
                got = got.tolist()
            assert got == want, key


@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"])
def test_every_supported_weight_type(tmp_path, wtype):
    p = F.write_model(tmp_path / "m.gguf", "llama", n_embd=256, n_ff=256, weight_type=wtype, embd_type=wtype)
    with load_model(p) as m:
        assert m.tensor("blk.1.ffn_down.weight").type_id == m.gguf.tensors["token_embd.weight"].type_id


def test_tied_llama_and_optional_keys_default(tmp_path):
    p = F.write_model(tmp_path / "m.gguf", "llama", tied=True, metadata={
        "llama.rope.freq_base": F.DROP, "llama.attention.head_count_kv": F.DROP,
        "llama.attention.key_length": F.DROP}, n_head_kv=4)
    with load_model(p) as m:
        hp = m.hparams
        assert hp.tied_output and m.output_name == "token_embd.weight"
        assert (hp.rope_base, hp.n_head_kv, hp.head_dim) == (10000.0, 4, 16)


def test_vocab_size_from_metadata_must_match_embedding(tmp_path):
    p = F.write_model(tmp_path / "m.gguf", metadata={"llama.vocab_size": (300, VT.UINT32)})
    n = len(F.vocab()[0])
    assert f"token_embd.weight has shape [64, {n}], expected [64, 300]" in failure(p)


def test_describe_and_inspect(models):
    with load_model(models["qwen2"]) as m:
        text = describe(m.gguf, m.hparams)
    assert "qwen2: 2 layers, d 64, ff 128, heads 4/2 x 16" in text and "tied output" in text
    assert "blk.1.attn_v.bias" in text and "tokenizer.ggml.merges" in text
    assert all(len(line) < 200 for line in text.splitlines())
    text2, problem = inspect_file(models["qwen2"])
    assert problem is None and text2 == text


def test_inspect_names_why_a_wellformed_file_cannot_run():
    text, problem = inspect_file(F.TOKENIZER_DATA / "ggml-vocab-gpt-2.gguf")
    assert problem == "architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3)"
    assert "tokenizer.ggml.tokens" in text and f"not runnable: {problem}" in text


# ---- malformed files -------------------------------------------------------------------------

def _bytes(path) -> bytearray:
    return bytearray(path.read_bytes())


def _write(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def test_bad_magic_and_version(models, tmp_path):
    data = _bytes(models["llama"])
    data[:4] = b"GGML"
    assert "not a GGUF file" in failure(_write(tmp_path, data))
    data[:4] = b"GGUF"
    struct.pack_into("<I", data, 4, 7)
    assert "unsupported GGUF version 7" in failure(_write(tmp_path, data))
    struct.pack_into("<I", data, 4, 3 << 24)
    assert "big-endian" in failure(_write(tmp_path, data))


def test_missing_and_unreadable_file(tmp_path):
    assert "cannot read" in failure(tmp_path / "nope.gguf")
    assert "too short" in failure(_write(tmp_path, b""))
    assert "too short" in failure(_write(tmp_path, b"GGUF\3\0\0\0"))


def test_truncated_anywhere(models, tmp_path):
    data = bytes(_bytes(models["qwen3"]))
    gf = GGUFFile(models["qwen3"])
    header_end = gf.data_offset
    size = max(t.offset + t.nbytes for t in gf.tensors.values())  # the file may end in padding
    gf.close()
    cuts = sorted({30, 100, 500, 1000, 2000, header_end // 2, header_end - 40, header_end - 1, header_end,
                   header_end + 10, (header_end + size) // 2, size - 1})
    for cut in cuts:
        msg = failure(_write(tmp_path, data[:cut]))
        assert "truncated" in msg or "past the end" in msg or "too short" in msg, (cut, msg)


@pytest.mark.parametrize("key", ["general.architecture", "llama.block_count", "llama.embedding_length",
                                 "llama.feed_forward_length", "llama.attention.head_count",
                                 "llama.attention.layer_norm_rms_epsilon", "llama.context_length"])
def test_missing_key(tmp_path, key):
    p = F.write_model(tmp_path / "m.gguf", metadata={key: F.DROP})
    assert failure(p).endswith(f"missing metadata key {key}")


def test_missing_vocab_size_without_tokenizer(tmp_path):
    p = F.write_model(tmp_path / "m.gguf", metadata={"tokenizer.ggml.tokens": F.DROP})
    assert failure(p).endswith("missing metadata key llama.vocab_size")


@pytest.mark.parametrize("arch,name", [("llama", "blk.1.ffn_up.weight"), ("llama", "token_embd.weight"),
                                       ("llama", "output_norm.weight"), ("qwen2", "blk.1.attn_v.bias"),
                                       ("qwen3", "blk.0.attn_k_norm.weight")])
def test_missing_tensor(tmp_path, arch, name):
    p = F.write_model(tmp_path / "m.gguf", arch, drop_tensors={name})
    assert failure(p).endswith(f"missing tensor {name}")


def test_unexpected_tensor(tmp_path):
    p = F.write_model(tmp_path / "m.gguf", "qwen2", drop_tensors={"blk.0.attn_q.bias"})
    assert "unexpected tensor 'blk.0.attn_k.bias'" in failure(p)


@pytest.mark.parametrize("arch,name,shape,want", [
    ("llama", "blk.0.attn_k.weight", (64, 48), (64, 32)),
    ("llama", "blk.1.ffn_down.weight", (64, 128), (128, 64)),
    ("qwen3", "blk.0.attn_q_norm.weight", (16,), (32,)),
    ("qwen2", "blk.1.attn_q.bias", (32,), (64,))])
def test_wrong_shape(tmp_path, arch, name, shape, want):
    p = F.write_model(tmp_path / "m.gguf", arch, shapes={name: shape})
    assert failure(p).endswith(f"tensor {name} has shape {list(shape)}, expected {list(want)}")


def test_unknown_and_unsupported_types(models, tmp_path):
    p = _write(tmp_path, _bytes(models["llama"]))
    F.patch_tensor_info(p, "blk.0.attn_q.weight", type_id=99)
    assert failure(p).endswith("tensor 'blk.0.attn_q.weight' has unknown ggml type id 99")
    p = F.write_model(tmp_path / "f64.gguf", types={"blk.1.ffn_up.weight": "f64"})
    assert "tensor blk.1.ffn_up.weight has type F64, not supported" in failure(p)
    p = F.write_model(tmp_path / "q1d.gguf", types={"blk.0.attn_norm.weight": "q8_0"},
                      shapes={"blk.0.attn_norm.weight": (64, 1)})
    assert "has shape [64, 1], expected [64]" in failure(p)


@pytest.mark.parametrize("key,value,words", [
    ("llama.block_count", 10**9, "out of range"),
    ("llama.block_count", 100, "needs at least 902 tensors, the file holds 21"),
    ("llama.embedding_length", 10**9, "out of range"),
    ("llama.attention.head_count", 0, "out of range"),
    ("llama.attention.head_count_kv", 3, "not a multiple of head_count_kv 3"),
    ("llama.context_length", 2**40, "out of range"),
])
def test_absurd_hparams(tmp_path, key, value, words):
    vtype = VT.UINT64 if value >= 2**32 else VT.UINT32
    p = F.write_model(tmp_path / "m.gguf", metadata={key: (value, vtype)})
    assert words in failure(p)


def test_wrong_value_types_and_arch(tmp_path):
    p = F.write_model(tmp_path / "a.gguf", metadata={"llama.block_count": ("2", VT.STRING)})
    assert "llama.block_count should be an integer, found STRING" in failure(p)
    p = F.write_model(tmp_path / "b.gguf", metadata={"llama.rope.freq_base": (-1.0, VT.FLOAT32)})
    assert "llama.rope.freq_base = -1 is out of range (2..1e+12)" in failure(p)
    p = F.write_model(tmp_path / "c.gguf", metadata={"general.architecture": ("gpt2", VT.STRING)})
    assert "architecture 'gpt2' is not supported" in failure(p)


def test_tensor_offsets_and_dims(models, tmp_path):
    base = _bytes(models["llama"])
    p = _write(tmp_path, base)
    F.patch_tensor_info(p, "output_norm.weight", offset=10**12)
    assert "tensor 'output_norm.weight' data (bytes" in failure(p) and "past the end of the file" in failure(p)
    p = _write(tmp_path, base)
    F.patch_tensor_info(p, "output_norm.weight", offset=33)
    assert "offset 33 is not a multiple of the alignment 32" in failure(p)
    p = _write(tmp_path, base)
    F.patch_tensor_info(p, "token_embd.weight", dims=(2**40, 2**40))
    assert "tensor 'token_embd.weight' has an absurd shape" in failure(p)
    p = _write(tmp_path, base)
    F.patch_tensor_info(p, "token_embd.weight", dims=(1 << 20, 1 << 20))
    assert "lies past the end of the file" in failure(p)


def _field_offset(data: bytes, key: str) -> int:
    """Byte offset just after a metadata key's name."""
    k = struct.pack("<Q", len(key)) + key.encode()
    return data.find(k) + len(k)


def test_absurd_counts_and_lengths_fail_fast(models, tmp_path):
    base = _bytes(models["llama"])
    t0 = time.perf_counter()
    for off, value, words in [(16, 2**60, "impossible"), (8, 2**62, "impossible")]:
        data = bytearray(base)
        struct.pack_into("<Q", data, off, value)
        assert words in failure(_write(tmp_path, data))
    pos = _field_offset(base, "tokenizer.ggml.tokens") + 8   # after value type and item type
    for length in (2**60, 10**6):
        data = bytearray(base)
        struct.pack_into("<Q", data, pos, length)
        assert "array 'tokenizer.ggml.tokens'" in failure(_write(tmp_path, data))
    pos = _field_offset(base, "tokenizer.ggml.token_type") + 8
    data = bytearray(base)
    struct.pack_into("<Q", data, pos, 2**61)
    assert "array 'tokenizer.ggml.token_type' (2305843009213693952 x INT32)" in failure(_write(tmp_path, data))
    p = F.write_model(tmp_path / "u8.gguf", metadata={"x.bytes": ([1, 2, 3], VT.ARRAY, VT.UINT8)})
    data = bytearray(p.read_bytes())  # gguf-py's GGUFReader loops forever on this one
    struct.pack_into("<Q", data, _field_offset(data, "x.bytes") + 8, 2**40)
    assert "array 'x.bytes' (1099511627776 x UINT8)" in failure(_write(tmp_path, data))
    pos = _field_offset(base, "general.name") + 4
    data = bytearray(base)
    struct.pack_into("<Q", data, pos, 2**50)
    assert "value of 'general.name'" in failure(_write(tmp_path, data))
    data = bytearray(base)
    struct.pack_into("<I", data, _field_offset(base, "general.name"), 77)
    assert "unknown value type 77" in failure(_write(tmp_path, data))
    assert time.perf_counter() - t0 < 5


def test_random_corruption_never_escapes(models, tmp_path):
    """Flipped header bytes either still load or give a one-line VkdflashError, quickly."""
    base = bytes(_bytes(models["qwen2"]))
    gf = GGUFFile(models["qwen2"])
    header_end = gf.data_offset
    gf.close()
    r = np.random.default_rng(1234)
    for trial in range(60):
        data = bytearray(base)
        for pos in r.integers(4, header_end, size=int(r.integers(1, 4))):
            data[pos] = int(r.integers(0, 256))
        p = _write(tmp_path, data, f"c{trial}.gguf")
        t0 = time.perf_counter()
        try:
            load_model(p).close()
        except VkdflashError as exc:
            assert "\n" not in str(exc)
        assert time.perf_counter() - t0 < 2, trial


@pytest.mark.slow
def test_smollm2_loads():
    """The real model (docs/design.md section 8): llama, 30 layers, d 576, 9/3 heads of 64, tied output."""
    from vkdflash.model import default_model_path
    with load_model(default_model_path(progress=False)) as m:
        hp = m.hparams
        assert (hp.arch, hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab) == \
            ("llama", 30, 576, 1536, 9, 3, 64, 49152)
        assert hp.tied_output and hp.rope_mode == "normal" and hp.rope_base == 100000.0
        assert hp.n_ctx_train == 8192 and hp.rms_eps == pytest.approx(1e-5)
        types = {t.type_name for t in m.gguf.tensors.values()}
        assert types == {"Q4_1", "Q8_0", "F32"} and m.tensor("token_embd.weight").type_id == 8
        assert m.output_name == "token_embd.weight"
        assert "total 92.10 MiB" in describe(m.gguf, m.hparams)
