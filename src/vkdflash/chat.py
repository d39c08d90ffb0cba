"""Chat prompts from the GGUF's tokenizer.chat_template, rendered like Hugging Face / llama.cpp do:
jinja2 in an immutable sandbox (bounded in time, size and work: sandbox.py), trim_blocks +
lstrip_blocks, loop controls, raise_exception(), strftime_now(), a tojson filter that keeps
non-ASCII, the special-token texts as variables, `{% generation %}` blocks."""
from __future__ import annotations

import json
import logging
from datetime import datetime

from jinja2.ext import Extension

from . import sandbox
from .errors import VkdflashError

log = logging.getLogger("vkdflash")
# llama.cpp's fallback when a model has no template
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")


class _Generation(Extension):
    """Hugging Face's `{% generation %}...{% endgeneration %}` (it marks the assistant's text for
    training masks): rendered as its body, as transformers renders it."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    sandbox.fits(32 * len(fmt), "strftime_now()")   # a directive of 2 characters may print 20 or more
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; `render(messages)` gives the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "chat template"):
        self.source, self.bos_token, self.eos_token, self.name = source, bos_token, eos_token, name
        if not isinstance(source, str):
            raise VkdflashError(f"{name} is not text but {type(source).__name__}")
        self._env = sandbox.BoundedEnvironment({"tojson": _tojson}, {"strftime_now": _strftime_now}, trim_blocks=True,
                                               lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation])
        self._template = sandbox.run(self._env, lambda: self._env.from_string(source), name)

    @classmethod
    def from_metadata(cls, metadata, tokenizer=None, path=None) -> "ChatTemplate":
        """The model's template (a GGUF's Metadata; ChatML when it has none or an empty one, as llama.cpp),
        with its BOS/EOS texts; errors name the template and the file at `path`."""
        name = "tokenizer.chat_template" + (f" of {path}" if path else "")
        try:
            source = metadata.str("tokenizer.chat_template", default="")
        except VkdflashError as exc:
            raise VkdflashError(f"{path}: {exc}" if path else str(exc)) from None
        log.info("chat template: %s", f"the model's ({len(source)} characters)" if source else
                 "ChatML (the model has none)")
        text = (lambda i: "" if tokenizer is None or i is None else tokenizer.tokens[i])
        return cls(source or CHATML, text(getattr(tokenizer, "bos_id", None)), text(getattr(tokenizer, "eos_id", None)),
                   name if source else "ChatML")

    def render(self, messages, add_generation_prompt: bool = True, **extra) -> str:
        """messages: [{"role": ..., "content": ...}, ...]; extra variables (tools=..., etc.) pass through.
        tools and documents are None unless given, as Hugging Face passes them (and llama.cpp's
        template engine reads an unset variable): `{% if tools is not none %}` must be false."""
        extra = {"tools": None, "documents": None, **extra}
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise VkdflashError("chat messages must be a list of {'role': str, 'content': ...} dicts")

        def render():
            pieces, size = [], 0
            for piece in self._template.generate(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                                 bos_token=self.bos_token, eos_token=self.eos_token, **extra):
                size += len(piece)
                if size > sandbox.MAX_SIZE:
                    raise sandbox.Refused(f"writes a prompt of more than {sandbox.MAX_SIZE:,} characters")
                pieces.append(piece)
            return "".join(pieces)
        return sandbox.run(self._env, render, self.name)


def chat_prompt_ids(tokenizer, template: ChatTemplate, messages, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a rendered chat: special tokens in the text parsed, BOS added as the model says
    unless the template already wrote it."""
    return rendered_ids(tokenizer, template.render(messages, add_generation_prompt))


def rendered_ids(tokenizer, text: str) -> list[int]:
    """Token ids of text a chat template wrote (all or part of a chat), as chat_prompt_ids takes them."""
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    if tokenizer.add_bos and len(ids) > 1 and ids[0] == ids[1] == tokenizer.bos_id:
        ids = ids[1:]
    return ids
