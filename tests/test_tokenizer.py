"""Tokenizer: llama.cpp's own tokenizations (its test-suite vocabularies, SmolLM2-135M), decoding,
special tokens, BOS/EOS rules and the streaming detokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFValueType as VT

import gguf_fixtures as F
from vkdflash.errors import VkdflashError
from vkdflash.model import GGUFFile, default_model_path
from vkdflash.tokenizer import StreamDecoder, Tokenizer

SEP = "\n__ggml_vocab_test__\n"


def llamacpp_pairs(name: str) -> list[tuple[str, list[int]]]:
    """The .inp/.out pairs, split exactly as llama.cpp's test-tokenizer-0 does."""
    raw = (F.TOKENIZER_DATA / f"{name}.inp").read_bytes().decode("utf-8")
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    outs = (F.TOKENIZER_DATA / f"{name}.out").read_text(encoding="utf-8").split("\n")
    assert len(outs) >= len(texts) and len(texts) > 40
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def check_all(tok: Tokenizer, cases) -> None:
    bad = [(text, tok.encode(text, add_special=False), ids) for text, ids in cases
           if tok.encode(text, add_special=False) != ids]
    assert not bad, f"{len(bad)} of {len(cases)} differ from llama.cpp, first: {bad[0]!r}"[:2000]
    for text, ids in cases:  # byte-level BPE is lossless: llama.cpp's ids decode to the text
        assert tok.decode(ids) == text


@pytest.fixture(scope="module", params=["ggml-vocab-gpt-2.gguf", "ggml-vocab-qwen2.gguf"])
def vocab_file(request):
    return request.param, Tokenizer.from_gguf(F.TOKENIZER_DATA / request.param)


def test_llamacpp_vocab_fixtures(vocab_file):
    name, tok = vocab_file
    check_all(tok, llamacpp_pairs(name))


def test_stream_decoder_matches_decode(vocab_file):
    name, tok = vocab_file
    for _, ids in llamacpp_pairs(name):
        s = StreamDecoder(tok)
        pieces = [s.push(i) for i in ids]
        assert "".join(pieces) + s.flush() == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces)  # the fixtures are valid UTF-8: nothing broken mid-way


@pytest.fixture(scope="module")
def smollm2():
    with GGUFFile(default_model_path(progress=False)) as gf:
        return Tokenizer(gf.metadata), dict(gf.metadata)


@pytest.mark.slow
def test_smollm2_matches_llamacpp(smollm2):
    tok, _ = smollm2
    cases = json.loads((F.TOKENIZER_DATA / "smollm2-135m.llamacpp.json").read_text(encoding="utf-8"))
    check_all(tok, [(c["text"], c["ids"]) for c in cases])
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos, tok.pre) == (1, 2, False, False, "smollm")
    assert tok.eog_ids == {0, 2}  # <|endoftext|> and <|im_end|>, as llama.cpp
    ref = json.loads(F.LLAMACPP_TOP10.read_text(encoding="utf-8"))
    for case in ref["cases"]:  # llama.cpp's own run: prompt ids (add_special, no BOS) and generated text
        assert tok.encode(case["prompt"]) == case["prompt_ids"]
        assert tok.decode(case["tokens"]) == case["content"]
        s = StreamDecoder(tok)
        assert "".join(s.push(i) for i in case["tokens"]) + s.flush() == case["content"]


# ---- the fixture vocabulary -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = F.write_model(tmp_path_factory.mktemp("tok") / "m.gguf", "llama")
    with GGUFFile(p) as gf:
        return Tokenizer(gf.metadata)


def tid(text: str) -> int:
    return F.vocab()[0].index(text)


def test_merges_and_byte_fallback(tiny):
    assert tiny.encode("hello world") == [tid("hello"), tid("Ġworld")]
    assert tiny.encode(" the then") == [tid("Ġthe"), tid("Ġthe"), tid("n")]
    assert tiny.encode("é") == [tid(c) for c in "Ã©"]      # two byte tokens
    assert tiny.encode("  x") == [tid("Ġ"), tid("Ġ"), tid("x")]  # gpt2 regex: "\s+(?!\S)" keeps one space apart
    assert tiny.encode("12") == [tid("1"), tid("2")]       # smollm splits digits


def test_roundtrip_random_text(tiny):
    r = np.random.default_rng(7)
    alphabet = list("abcdefghello wrld THE\n\t.,!?'0123456789") + ["é", "ß", "🦙", "中", "\u200d", "<", "|"]
    for _ in range(200):
        text = "".join(r.choice(alphabet, size=int(r.integers(0, 40))))
        assert tiny.decode(tiny.encode(text)) == text


def test_special_tokens(tiny):
    text = "<|im_start|>user\nhi<|im_end|>"
    plain = tiny.encode(text)
    assert 1 not in plain and 2 not in plain and tiny.decode(plain) == text
    parsed = tiny.encode(text, parse_special=True)
    assert parsed[0] == 1 and parsed[-1] == 2 and parsed[1:-1] == tiny.encode("user\nhi")
    assert tiny.decode(parsed) == "user\nhi" and tiny.decode(parsed, special=True) == text
    user = tid(F.USER_TOKEN)  # user-defined tokens match even without parse_special, and always print
    assert tiny.encode("a<tool>b") == [tid("a"), user, tid("b")]
    assert tiny.decode([user]) == "<tool>"
    assert tiny.eog_ids == {0, 2}
    with pytest.raises(VkdflashError, match="outside the vocabulary"):
        tiny.decode([10**6])


def test_an_end_of_turn_text_typed_normal_is_a_control_token_as_in_llama_cpp(tmp_path):
    """Some conversions type <|im_end|> / <|eot_id|> normal; llama.cpp overrides that to control, so a
    chat template's end-of-turn text is that one token (here it was split into pieces and the
    model never saw the turn end)."""
    tokens, types, merges = F.vocab()
    types = [1 if t == "<|im_end|>" else ty for t, ty in zip(tokens, types)]
    p = F.write_model(tmp_path / "m.gguf", metadata={"tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32)})
    with GGUFFile(p) as gf:
        t = Tokenizer(gf.metadata)
    assert t.encode("hi<|im_end|>", add_special=False, parse_special=True) == t.encode("hi", add_special=False) + [2]
    assert 2 in t.eog_ids and t.decode([2]) == ""  # and it prints as a control token does


def test_bos_eos_rules(tmp_path):
    def tok(**md):
        p = F.write_model(tmp_path / "m.gguf", metadata=md)
        with GGUFFile(p) as gf:
            return Tokenizer(gf.metadata)

    t = tok(**{"tokenizer.ggml.add_bos_token": (True, VT.BOOL), "tokenizer.ggml.add_eos_token": (True, VT.BOOL)})
    assert t.encode("hello") == [1, tid("hello"), 2] and t.encode("hello", add_special=False) == [tid("hello")]
    t = tok(**{"tokenizer.ggml.add_bos_token": F.DROP, "tokenizer.ggml.pre": ("llama-bpe", VT.STRING)})
    assert t.add_bos and t.encode("")[0] == 1     # llama-bpe adds BOS unless the file says otherwise
    with pytest.raises(VkdflashError, match="add_bos_token is true but bos_token_id is not set"):
        tok(**{"tokenizer.ggml.add_bos_token": (True, VT.BOOL), "tokenizer.ggml.bos_token_id": F.DROP})
    with pytest.raises(VkdflashError, match="pre-tokenizer 'tekken' is not supported"):
        tok(**{"tokenizer.ggml.pre": ("tekken", VT.STRING)})
    with pytest.raises(VkdflashError, match="tokenizer model 'llama' is not supported"):
        tok(**{"tokenizer.ggml.model": ("llama", VT.STRING)})
    with pytest.raises(VkdflashError, match=r"bos_token_id = 999 is out of range \(0\.\.[0-9]+\)"):
        tok(**{"tokenizer.ggml.bos_token_id": (999, VT.UINT32)})


def test_stream_decoder_buffers_partial_utf8(tiny):
    llama = tiny.encode("🦙!")
    assert len(llama) == 5  # four byte tokens, then "!"
    s = StreamDecoder(tiny)
    assert [s.push(i) for i in llama] == ["", "", "", "🦙", "!"]
    assert s.flush() == ""
    s.push(llama[0])
    assert s.flush() == "\ufffd" and s.push(tid("a")) == "a"  # a dangling lead byte, then a fresh start
    r = np.random.default_rng(3)
    for _ in range(200):  # any token sequence, valid UTF-8 or not: stream == one-shot decode
        ids = r.integers(0, tiny.n_vocab, size=int(r.integers(0, 12))).tolist()
        s = StreamDecoder(tiny, special=True)
        assert "".join(s.push(i) for i in ids) + s.flush() == tiny.decode(ids, special=True)


def test_invalid_unicode_text_is_one_line_error(tiny):
    """A lone surrogate (what an undecodable byte becomes under surrogateescape) used to reach the
    BPE library and fail there with a TypeError traceback ("TextInputSequence must be str")."""
    for text, what in (("ab\udcff", r"byte 0xff at character 2 \(after 'ab'\)"),
                       ("\ud800x", r"lone surrogate U\+D800 at character 0")):
        for parse_special in (False, True):
            with pytest.raises(VkdflashError, match="^the text is not valid Unicode: " + what) as info:
                tiny.encode(text, parse_special=parse_special)
            assert "\n" not in str(info.value)
