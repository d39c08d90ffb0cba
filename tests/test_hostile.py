"""Hostile model files: each example of issue 11 (found by fuzzing as an attacker would) gets one
short line through the CLI, never a traceback, a hang or a silent misread."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

import gguf_fixtures as F
from dflash_fixtures import write_dflash
from mtp_fixtures import write_sidecar, write_target
from vkdflash.cli import main
from vkdflash.model.gguf_file import GGUFFile

pytestmark = pytest.mark.usefixtures("fresh_plugins")
MODEL = dict(n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
LONG = 100_000


def one_line_error(path, *args) -> str:
    """The CLI's error line for `args`: exit 1, no traceback, short whatever the file holds."""
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and lines and lines[-1].startswith("vkdflash: error:"), res.output[-2000:]
    assert len(lines[-1]) < len(str(path)) + 300, lines[-1][:500]
    return lines[-1]


def generate(path, *extra) -> str:
    return one_line_error(path, "generate", "-m", path, "hi", "-n", "2", "--temp", "0", "-c", "64", *extra)


def inspect(path) -> str:
    return one_line_error(path, "inspect", path)


def model(tmp_path, name="m.gguf", **metadata) -> Path:
    return F.write_model(tmp_path / name, "llama", metadata=metadata, **MODEL)


WRONG_TYPES = {  # key -> (value as written, words of the error)
    "general.architecture": ((["llama"], VT.ARRAY, VT.STRING),
                             "general.architecture should be a string, found an array of STRING"),
    "tokenizer.ggml.tokens": (("abc", VT.STRING), "tokenizer.ggml.tokens should be an array of strings, found STRING"),
    "llama.expert_count": (([8], VT.ARRAY, VT.UINT32), "llama.expert_count should be an integer, found an array"),
    "llama.rope.scaling.type": ((["yarn"], VT.ARRAY, VT.STRING), "rope.scaling.type should be a string, found an array"),
}
TOKENIZER_TYPES = {
    "tokenizer.ggml.model": ((["gpt2"], VT.ARRAY, VT.STRING), "should be a string, found an array of STRING"),
    "tokenizer.ggml.pre": ((7, VT.UINT32), "tokenizer.ggml.pre should be a string, found UINT32"),
    "tokenizer.ggml.token_type": ((["1"], VT.ARRAY, VT.STRING), "token_type should be an array of integers"),
    "tokenizer.ggml.merges": (("a b", VT.STRING), "tokenizer.ggml.merges should be an array of strings, found STRING"),
    "tokenizer.ggml.bos_token_id": (("12", VT.STRING), "bos_token_id should be an integer, found STRING"),
    "tokenizer.ggml.eos_token_id": ((12.0, VT.FLOAT32), "eos_token_id should be an integer, found FLOAT32"),
    "tokenizer.ggml.eot_token_id": ((10**12, VT.UINT64), "eot_token_id = 1000000000000 is out of range"),
    "tokenizer.ggml.add_bos_token": (("false", VT.STRING), "add_bos_token should be a bool, found STRING"),
}


@pytest.mark.parametrize("key", list(WRONG_TYPES))
def test_wrong_value_type_in_model_keys(tmp_path, key):
    value, words = WRONG_TYPES[key]
    path = model(tmp_path, **{key: value})
    assert words in inspect(path) and words in generate(path)


@pytest.mark.parametrize("key", list(TOKENIZER_TYPES))
def test_wrong_value_type_in_tokenizer_keys(tmp_path, key):
    value, words = TOKENIZER_TYPES[key]
    assert words in generate(model(tmp_path, **{key: value}))


def test_draft_architecture_as_array(tmp_path):
    target = model(tmp_path)
    draft = model(tmp_path, "d.gguf", **{"general.architecture": WRONG_TYPES["general.architecture"][0]})
    assert "general.architecture should be a string" in generate(draft, "-m", target, "-md", draft)


def test_wrong_value_type_in_dflash_and_mtp_files(tmp_path):
    target = model(tmp_path)
    draft = write_dflash(tmp_path / "d.gguf", target, metadata={"dflash.block_size": ("16", VT.STRING)})
    assert "dflash.block_size should be an integer, found STRING" in generate(target, "-md", draft)
    mtp_target = write_target(tmp_path / "t.gguf", n_nextn=0)
    sidecar = write_sidecar(tmp_path / "s.gguf", metadata={"mtp.embedding_length": ("128", VT.STRING)})
    line = generate(mtp_target, "--spec", "mtp", "-md", sidecar)
    assert "mtp.embedding_length should be an integer, found STRING" in line and "raised" not in line


@pytest.mark.parametrize("key,value,words", [
    ("llama.attention.layer_norm_rms_epsilon", 1e-45, "out of range (1e-12..0.1)"),
    ("llama.rope.freq_base", 1e-30, "out of range (2..1e+12)"),
    ("llama.rope.freq_base", float("nan"), "rope.freq_base = nan is out of range"),
])
def test_absurd_hyperparameters(tmp_path, key, value, words):
    assert words in inspect(model(tmp_path, **{key: (value, VT.FLOAT32)}))


def _patched(path: Path, edit) -> Path:
    data = bytearray(path.read_bytes())
    edit(data)
    out = path.with_name("patched-" + path.name)
    out.write_bytes(bytes(data))
    return out


def _info_pos(data, name: str) -> int:
    """Byte offset of a tensor's type id in the directory (after its name and dims)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.find(key) + len(key)
    return pos + 4 + 8 * struct.unpack_from("<I", data, pos)[0]


def test_overlapping_tensors_are_refused(tmp_path):
    path = model(tmp_path)
    with GGUFFile(path) as gf:
        first = min(gf.tensors.values(), key=lambda t: t.offset)
        rel = first.offset - gf.data_offset

    def overlap(data):  # output_norm.weight's data is the first tensor's
        struct.pack_into("<Q", data, _info_pos(data, "output_norm.weight") + 4, rel)
    assert "overlaps the previous tensor's" in inspect(_patched(path, overlap))


def test_tensor_count_lowered_by_one_is_refused(tmp_path):
    path = model(tmp_path)
    line = inspect(_patched(path, lambda d: struct.pack_into("<Q", d, 8, struct.unpack_from("<Q", d, 8)[0] - 1)))
    assert "the tensor table does not describe this file's data" in line


def test_type_patched_to_a_smaller_one_is_refused(tmp_path):
    path = model(tmp_path)  # q8_0 weights: 34 bytes a block; q4_0 has 18
    line = inspect(_patched(path, lambda d: struct.pack_into("<I", d, _info_pos(d, "blk.0.attn_q.weight"), 2)))
    assert "unused bytes before tensor" in line


@pytest.mark.parametrize("key,value", [
    ("general.architecture", ("x" * LONG, VT.STRING)),
    ("tokenizer.ggml.pre", ("p" * LONG, VT.STRING)),
    ("tokenizer.ggml.merges", (["m" * LONG], VT.ARRAY, VT.STRING)),
    ("llama.rope.scaling.type", ("s" * LONG, VT.STRING)),
])
def test_errors_quote_at_most_80_characters_of_the_file(tmp_path, key, value):
    line = generate(model(tmp_path, **{key: value}))
    text = value[0] if isinstance(value[0], str) else value[0][0]
    assert f"({LONG} chars)" in line and text[:81] not in line


def test_long_tensor_name_is_cut(tmp_path):
    path = write_target(tmp_path / "t.gguf", n_nextn=0, extra={"z" * 60_000: (128,)})
    line = inspect(path)
    assert f"unexpected tensor {'z' * 80!r}... (60000 chars)" in line


@pytest.mark.parametrize("template,words", [
    (("{{ 1/0 }}", VT.STRING), "failed: ZeroDivisionError"),
    (("{{ 'x' * 4000000000 }}", VT.STRING), "builds a value of more than"),
    (("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", VT.STRING),
     "takes more than 1,000,000 steps"),
    ((7, VT.UINT32), "tokenizer.chat_template should be a string, found UINT32"),
])
def test_chat_template_failures_name_the_template(tmp_path, template, words):
    path = model(tmp_path, **{"tokenizer.chat_template": template})
    line = generate(path, "--chat")
    assert words in line and "tokenizer.chat_template" in line and str(path) in line
