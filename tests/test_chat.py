"""Chat templates: rendered with jinja2 as Hugging Face / llama.cpp do, checked against the ChatML
format written out by hand, and the prompt tokenized with its special tokens."""
from __future__ import annotations

import pytest

import gguf_fixtures as F
from vkdflash.chat import CHATML, ChatTemplate, chat_prompt_ids
from vkdflash.errors import VkdflashError
from vkdflash.model import GGUFFile, default_model_path
from vkdflash.tokenizer import Tokenizer

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(messages, add_generation_prompt=True, default_system=None) -> str:
    """The ChatML text, written out independently of any template."""
    out = ""
    if default_system is not None and messages[0]["role"] != "system":
        out += f"<|im_start|>system\n{default_system}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke about 🦙 and ünïcode.\nTwo lines."}],
]


def check_smollm_template(template: ChatTemplate):
    for msgs in CONVERSATIONS:
        for agp in (True, False):
            assert template.render(msgs, add_generation_prompt=agp) == chatml(msgs, agp, SMOL_SYSTEM)


def test_fixture_template_is_smollm2s():
    check_smollm_template(ChatTemplate(F.SMOLLM_TEMPLATE))


@pytest.mark.slow
def test_smollm2_template_from_the_model():
    with GGUFFile(default_model_path(progress=False)) as gf:
        tok = Tokenizer(gf.metadata)
        template = ChatTemplate.from_metadata(gf.metadata, tok)
    check_smollm_template(template)
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    msgs = CONVERSATIONS[1]
    ids = chat_prompt_ids(tok, template, msgs)
    assert ids == tok.encode(chatml(msgs, True, SMOL_SYSTEM), parse_special=True)
    assert ids.count(1) == 3 and ids.count(2) == 2 and ids[0] == 1   # <|im_start|>, <|im_end|> as single tokens
    assert tok.decode(ids, special=True) == chatml(msgs, True, SMOL_SYSTEM)


def test_chatml_fallback_and_prompt_ids(tmp_path):
    p = F.write_model(tmp_path / "m.gguf", metadata={"tokenizer.chat_template": F.DROP})
    with GGUFFile(p) as gf:
        tok = Tokenizer(gf.metadata)
        template = ChatTemplate.from_metadata(gf.metadata, tok)
    assert template.source == CHATML
    msgs = CONVERSATIONS[0]
    assert template.render(msgs) == chatml(msgs)
    ids = chat_prompt_ids(tok, template, msgs)
    assert ids[0] == 1 and ids[-1] == tok.encode("\n")[-1] and ids.count(2) == 1


def test_hf_environment_features():
    msgs = [{"role": "user", "content": "é \"q\""}, {"role": "assistant", "content": "x"}]
    assert ChatTemplate("{{ messages[0]['content'] | tojson }}").render(msgs) == '"é \\"q\\""'
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    assert ChatTemplate(loop).render(msgs) == "user"
    trimmed = "  {% if add_generation_prompt %}\nGO\n  {% endif %}\nend"
    assert ChatTemplate(trimmed).render(msgs) == "GO\nend"   # trim_blocks + lstrip_blocks
    t = ChatTemplate("{{ bos_token }}{{ messages | length }}{{ eos_token }}{{ extra }}", "<s>", "</s>")
    assert t.render(msgs, extra="!") == "<s>2</s>!"


def test_template_errors_are_one_line():
    msgs = CONVERSATIONS[0]
    with pytest.raises(VkdflashError, match="^chat template refused the messages: no tools here$"):
        ChatTemplate("{{ raise_exception('no tools\nhere') }}").render(msgs)
    with pytest.raises(VkdflashError, match="^chat template syntax error at line 2"):
        ChatTemplate("ok\n{% for %}")
    with pytest.raises(VkdflashError, match="^chat template failed"):  # the sandbox forbids mutation
        ChatTemplate("{{ messages.append(1) }}").render(msgs)
    with pytest.raises(VkdflashError, match="list of"):
        ChatTemplate("x").render("not a list")
