"""Bad model inputs found by audit: paths that are not files, a vocabulary missing byte tokens, an
output layer wider than the token list. Each is a one-line VkdflashError, never a hang or a silent loss."""
from __future__ import annotations

import os
import threading

import pytest
from gguf import GGUFValueType as VT

import gguf_fixtures as F
from vkdflash.errors import VkdflashError
from vkdflash.model import GGUFFile, inspect_file, load_model
from vkdflash.tokenizer import Tokenizer

LOADERS = [GGUFFile, load_model, inspect_file, Tokenizer.from_gguf]


def load_error(load, path) -> str:
    """The one-line error of load(path), run in a thread so that blocking on a FIFO fails the test."""
    outcome = {}

    def run():
        try:
            load(path)
        except VkdflashError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # a writer that leaves at once ends the blocked open, and the thread with it
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail(f"{load.__name__}({path}) blocked")
    assert "error" in outcome and "\n" not in outcome["error"], outcome
    return outcome["error"]


@pytest.mark.parametrize("load", LOADERS, ids=lambda f: f.__name__)
def test_fifo_is_refused_not_waited_on(tmp_path, load):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert load_error(load, fifo).endswith(f"{fifo} is a FIFO (pipe), not a GGUF file")


def test_pipe_is_named_not_measured():
    read_end, write_end = os.pipe()  # what `... | vkdflash inspect /dev/stdin` opens
    try:
        path = f"/dev/fd/{read_end}"
        assert load_error(GGUFFile, path) == f"{path} is a FIFO (pipe), not a GGUF file"
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("path,kind", [(None, "a directory"), ("/dev/null", "a character device")])
def test_other_non_files_are_named(tmp_path, path, kind):
    path = path or str(tmp_path)
    assert load_error(load_model, path) == f"{path} is {kind}, not a GGUF file"


def test_symlink_to_a_model_still_loads(tmp_path):
    link = tmp_path / "link.gguf"
    link.symlink_to(F.write_model(tmp_path / "m.gguf"))
    with load_model(link) as m:
        assert m.hparams.arch == "llama"


@pytest.fixture(scope="module")
def no_e_acute(tmp_path_factory) -> Tokenizer:
    """The fixture vocabulary with the byte tokens of "é" (UTF-8 C3 A9, shown as "Ã©") renamed away."""
    tokens = F.vocab()[0]
    for i, byte_char in enumerate(("Ã", "©")):
        tokens[tokens.index(byte_char)] = f"[PAD{i}]"
    p = F.write_model(tmp_path_factory.mktemp("vocab") / "m.gguf",
                      metadata={"tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING)})
    return Tokenizer.from_gguf(p)


@pytest.mark.parametrize("text", ["hello é world", "é", "<tool>é"])
def test_characters_the_vocabulary_lacks_are_named(no_e_acute, text):
    with pytest.raises(VkdflashError) as info:
        no_e_acute.encode(text)
    assert str(info.value) == "the prompt has characters this model's vocabulary cannot encode: 'é'"


def test_every_lost_character_is_named_and_the_rest_encode(no_e_acute):
    # "ö" (C3 B6) and "ß" (C3 9F) need the missing C3 too; the llama (F0 9F A6 99) does not
    with pytest.raises(VkdflashError, match="cannot encode: 'öß'$"):
        no_e_acute.encode("hello wörld ß 🦙")
    assert no_e_acute.decode(no_e_acute.encode("hello world 🦙 <tool>")) == "hello world 🦙 <tool>"


def rows_model(tmp_path, rows: int, arch: str = "llama"):
    shapes = {"token_embd.weight": (64, rows), "output.weight": (64, rows)}
    return F.write_model(tmp_path / "m.gguf", arch, metadata={f"{arch}.vocab_size": (rows, VT.UINT32)}, shapes=shapes)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: tied, token_embd is the output layer
def test_output_rows_beyond_the_tokens_are_refused(tmp_path, arch):
    n = len(F.vocab()[0])
    path = rows_model(tmp_path, n + 50, arch)
    assert load_error(load_model, path) == (f"{path}: the output layer has {n + 50} rows but the tokenizer only "
                                            f"{n} tokens: the model could emit ids {n}..{n + 49}, which have no text")
    assert inspect_file(path)[1].startswith("the output layer has")


def test_fewer_output_rows_than_tokens_load(tmp_path):
    with load_model(rows_model(tmp_path, len(F.vocab()[0]) - 1)) as m:  # the last token is never emitted
        assert m.hparams.n_vocab == len(F.vocab()[0]) - 1
