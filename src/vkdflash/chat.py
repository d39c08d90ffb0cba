"""Chat prompts from the GGUF's tokenizer.chat_template, rendered like Hugging Face / llama.cpp do:
jinja2 in an immutable sandbox, trim_blocks + lstrip_blocks, loop controls, raise_exception(),
strftime_now(), a tojson filter that keeps non-ASCII, the special-token texts as variables."""
from __future__ import annotations

import json
from datetime import datetime

from .errors import VkdflashError

# llama.cpp's fallback when a model has no template
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")


class _TemplateRaised(Exception):
    pass


def _raise_exception(message):
    raise _TemplateRaised(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class ChatTemplate:
    """A compiled chat template; `render(messages)` gives the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise VkdflashError(f"chat template syntax error at line {exc.lineno}: {_one_line(exc.message)}") from None

    @classmethod
    def from_metadata(cls, metadata: dict, tokenizer=None) -> "ChatTemplate":
        """The model's template (ChatML when it has none, as llama.cpp), with its BOS/EOS texts."""
        source = metadata.get("tokenizer.chat_template") or CHATML
        text = (lambda i: "" if tokenizer is None or i is None else tokenizer.tokens[i])
        return cls(source, text(getattr(tokenizer, "bos_id", None)), text(getattr(tokenizer, "eos_id", None)))

    def render(self, messages, add_generation_prompt: bool = True, **extra) -> str:
        """messages: [{"role": ..., "content": ...}, ...]; extra variables (tools=..., etc.) pass through."""
        import jinja2
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise VkdflashError("chat messages must be a list of {'role': str, 'content': ...} dicts")
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except _TemplateRaised as exc:
            raise VkdflashError(f"chat template refused the messages: {_one_line(exc)}") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise VkdflashError(f"chat template failed: {_one_line(exc)}") from None


def chat_prompt_ids(tokenizer, template: ChatTemplate, messages, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a rendered chat: special tokens in the text parsed, BOS added as the model says
    unless the template already wrote it."""
    text = template.render(messages, add_generation_prompt)
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    if tokenizer.add_bos and len(ids) > 1 and ids[0] == ids[1] == tokenizer.bos_id:
        ids = ids[1:]
    return ids
