"""Byte-level BPE tokenizer (GGUF tokenizer.ggml.model "gpt2") that reproduces llama.cpp's ids.

The BPE itself runs in the `tokenizers` library; what makes the ids llama.cpp's is around it:
llama.cpp's pre-tokenizer regexes per tokenizer.ggml.pre (applied in sequence, unmatched text kept
as its own piece), its special-token partition (longest token first, whole-text passes), its
ignore_merges and add_bos defaults, and its token_to_piece rules for decoding.
"""
from __future__ import annotations

import codecs
import logging
from functools import lru_cache

import numpy as np

from .errors import VkdflashError, quote
from .model.hparams import MAX_VOCAB

log = logging.getLogger("vkdflash")

# llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe: regexes per pre-tokenizer type
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                           r"|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                          r"|\s+(?!\S)|\s+")
PRE_REGEXES = {
    "gpt2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "qwen2": [_QWEN2],
    "llama-bpe": [_LLAMA3],
}
# other tokenizer.ggml.pre names llama.cpp maps to the same pre-tokenizer
PRE_ALIASES = {"gpt-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2", "starcoder": "smollm", "refact": "smollm",
               "command-r": "smollm", "codeshell": "smollm", "qwen2": "qwen2", "stablelm2": "qwen2",
               "deepseek-r1-qwen": "qwen2", "llama3": "llama-bpe", "llama-v3": "llama-bpe"}
IGNORE_MERGES = {"llama-bpe"}       # whole-word vocabulary hits skip the merges
DEFAULT_ADD_BOS = {"llama-bpe"}     # add_bos when tokenizer.ggml.add_bos_token is absent
# token types (llama.cpp llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# texts llama.cpp treats as end-of-generation wherever they are in the vocabulary
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
             "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}


@lru_cache(maxsize=1)
def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode(): the printable character that stands for each byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@lru_cache(maxsize=1)
def _char_bytes() -> dict[str, int]:
    return {c: b for b, c in enumerate(byte_chars())}


def _pre_name(pre: str) -> str:
    name = PRE_ALIASES.get(pre, pre)
    if name not in PRE_REGEXES:
        raise VkdflashError(f"tokenizer pre-tokenizer {quote(pre)} is not supported "
                            f"(supported: {', '.join(sorted(set(PRE_ALIASES) | set(PRE_REGEXES)))})")
    return name


class Tokenizer:
    """encode(text) -> ids and decode(ids) -> text as llama.cpp does for a GGUF's vocabulary."""

    def __init__(self, metadata):
        """metadata: a GGUFFile's Metadata (typed reads: a key of the wrong type is a one-line error)."""
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        m = metadata
        model = m.str("tokenizer.ggml.model", default=None)
        if model != "gpt2":
            shown = "missing" if model is None else quote(model)
            raise VkdflashError(f"tokenizer model {shown} is not supported (only byte-level BPE, 'gpt2')")
        self.tokens: list[str] = list(m.strings("tokenizer.ggml.tokens", MAX_VOCAB, default=[]))
        if not self.tokens:
            raise VkdflashError("the GGUF has no tokenizer.ggml.tokens")
        n = len(self.tokens)
        types = m.ints("tokenizer.ggml.token_type", 0, BYTE, max_count=n, default=None)
        self.types = np.full(n, NORMAL, np.int32) if types is None else types.astype(np.int32)
        if len(self.types) != n:
            raise VkdflashError(f"tokenizer.ggml.token_type has {len(self.types)} entries for {n} tokens")
        self.pre = _pre_name(m.str("tokenizer.ggml.pre", default="") or "default")
        token_id = (lambda key: m.int(f"tokenizer.ggml.{key}_token_id", 0, n - 1, default=None))
        self.bos_id, self.eos_id = token_id("bos"), token_id("eos")
        self.eot_id, self.eom_id = token_id("eot"), token_id("eom")
        self.add_bos = m.bool("tokenizer.ggml.add_bos_token", default=self.pre in DEFAULT_ADD_BOS)
        self.add_eos = m.bool("tokenizer.ggml.add_eos_token", default=False)
        for flag, tid, what in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos")):
            if flag and tid is None:
                raise VkdflashError(f"tokenizer.ggml.add_{what}_token is true but {what}_token_id is not set")

        vocab = {t: i for i, t in enumerate(self.tokens)}  # a duplicate text maps to its last id, as in llama.cpp
        merges = []
        for merge in m.strings("tokenizer.ggml.merges", 4 * MAX_VOCAB, default=[]):
            cut = merge.find(" ", 1)
            if cut < 0:
                raise VkdflashError(f"tokenizer merge {quote(merge)} has no space separator")
            merges.append((merge[:cut], merge[cut + 1:]))
        try:
            bpe = HFTokenizer(models.BPE(vocab, merges, ignore_merges=self.pre in IGNORE_MERGES))
        except Exception as exc:  # the library's message (e.g. a merge of unknown tokens) in one line
            raise VkdflashError(f"invalid tokenizer vocabulary: {quote(' '.join(str(exc).split()), 200)}") from None
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_REGEXES[self.pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._bpe = bpe
        # the BPE silently drops a byte whose character is no token (llama.cpp does too), so encode
        # checks its output when some are missing (SmolLM2 lacks a few control and unused bytes)
        self._missing_bytes = frozenset(c for c in byte_chars() if c not in vocab)
        # llama.cpp types an end-of-turn text control whatever the file says ("this is probably a bug in
        # the model"), so a template's <|eot_id|> is that token, not the pieces of its text
        for text in sorted(EOG_TEXTS):
            i = vocab.get(text)
            if i is not None and self.types[i] not in (CONTROL, USER_DEFINED, UNKNOWN):
                log.info("token %d %s is an end-of-turn text typed %d: taken as a control token, as llama.cpp does",
                         i, text, int(self.types[i]))
                self.types[i] = CONTROL
        special = [i for i in range(n) if self.types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and self.tokens[i]]
        self._special = sorted(special, key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self.eog_ids = frozenset({i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
                                 | {i for i in special if self.tokens[i] in EOG_TEXTS})

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        from .model.gguf_file import GGUFFile
        with GGUFFile(path) as gf:
            return cls(gf.metadata)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def _partition(self, text: str, parse_special: bool) -> list:
        """llama.cpp's tokenizer_st_partition: split out special tokens, longest first; control and
        unknown tokens only when parse_special. Returns str fragments and int token ids."""
        frags: list = [text]
        for tid in self._special:
            if not parse_special and self.types[tid] != USER_DEFINED:
                continue
            tok = self.tokens[tid]
            out = []
            for f in frags:
                if not isinstance(f, str) or tok not in f:
                    out.append(f)
                    continue
                parts = f.split(tok)
                for k, p in enumerate(parts):
                    if k:
                        out.append(tid)
                    if p:
                        out.append(p)
            frags = out
        return frags

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. add_special: BOS/EOS as the model's add_bos/add_eos say.
        parse_special: control tokens written in the text (e.g. "<|im_start|>") become those tokens."""
        try:  # a lone surrogate (an undecodable byte's escape) would fail deep in the BPE library
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ord(text[exc.start])
            what = f"byte 0x{bad - 0xdc00:02x}" if 0xdc80 <= bad <= 0xdcff else f"lone surrogate U+{bad:04X}"
            raise VkdflashError(f"the text is not valid Unicode: {what} at character {exc.start} "
                                f"(after {quote(text[:exc.start][-20:])})") from None
        ids = [self.bos_id] if add_special and self.add_bos else []
        for f in self._partition(text, parse_special):
            if isinstance(f, int):
                ids.append(f)
            else:
                ids.extend(self._encode_text(f))
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _encode_text(self, text: str) -> list[int]:
        """BPE ids of plain text; an error naming the characters the vocabulary lacks bytes for."""
        ids = self._bpe.encode(text, add_special_tokens=False).ids
        if not self._missing_bytes:
            return ids
        chars = byte_chars()
        if "".join(self.tokens[i] for i in ids) != "".join(chars[b] for b in text.encode("utf-8")):
            lost = dict.fromkeys(c for c in text if any(chars[b] in self._missing_bytes for b in c.encode("utf-8")))
            raise VkdflashError(f"the prompt has characters this model's vocabulary cannot encode: "
                                f"{quote(''.join(lost))}")
        return ids

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        """llama.cpp's token_to_piece: normal tokens byte-decoded, user-defined ones as written,
        control/unknown ones as written only when `special`, anything else empty."""
        if not 0 <= tid < len(self.tokens):
            raise VkdflashError(f"token id {tid} is outside the vocabulary ({len(self.tokens)})")
        ttype, text = self.types[tid], self.tokens[tid]
        if ttype == USER_DEFINED or (special and ttype in (CONTROL, UNKNOWN)):
            return text.encode("utf-8")
        if ttype != NORMAL:
            return b""
        table = _char_bytes()
        return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in text)

    def decode(self, ids, special: bool = False) -> str:
        """Text of `ids` (invalid UTF-8 becomes U+FFFD); `special` renders control tokens."""
        return b"".join(self.token_bytes(int(i), special) for i in ids).decode("utf-8", errors="replace")

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids


class StreamDecoder:
    """Text of a token stream, piece by piece, never splitting a UTF-8 sequence: bytes of an
    incomplete character wait for the next token; invalid bytes become U+FFFD."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer, self.special = tokenizer, special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tid: int) -> str:
        return self._utf8.decode(self.tokenizer.token_bytes(int(tid), self.special))

    def flush(self) -> str:
        """What is still buffered (an incomplete character becomes U+FFFD); the decoder is then reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
