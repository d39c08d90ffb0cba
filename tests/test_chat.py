"""Chat templates: rendered with jinja2 as Hugging Face / llama.cpp do, checked against the ChatML
format written out by hand, and the prompt tokenized with its special tokens."""
from __future__ import annotations

import re
import threading
import time

import pytest

import gguf_fixtures as F
from vkdflash import sandbox
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


def test_generation_blocks_render_their_body():
    """Templates written for training (SmolLM3, some Qwen ones) mark the assistant's text with
    Hugging Face's {% generation %} tag; it was a syntax error here."""
    source = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A:{{ m.content }}"
              "{% endgeneration %}{% else %}U:{{ m.content }}{% endif %}\n{% endfor %}")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert ChatTemplate(source).render(msgs) == "U:hiA:yo"  # trim_blocks drops the newline after a tag
    with pytest.raises(VkdflashError, match="syntax error at line 1: .*looking for .*endgenera"):
        ChatTemplate("{% generation %}x")


def test_tools_and_documents_are_none_unless_given():
    """Hugging Face renders with tools=None, documents=None (llama.cpp's engine reads unset variables as
    none): `tools is not none` was true for an undefined variable and wrote a tools section."""
    source = "{% if tools is not none %}T{{ tools|length }}{% endif %}{% if documents is none %}D{% endif %}"
    msgs = CONVERSATIONS[0]
    assert ChatTemplate(source).render(msgs) == "D"
    assert ChatTemplate(source).render(msgs, tools=[{"name": "f"}]) == "T1D"


def test_template_errors_are_one_line():
    msgs = CONVERSATIONS[0]
    with pytest.raises(VkdflashError, match=r"^chat template refused the messages: 'no tools\\nhere'$"):
        ChatTemplate("{{ raise_exception('no tools\nhere') }}").render(msgs)
    with pytest.raises(VkdflashError, match="^chat template syntax error at line 2"):
        ChatTemplate("ok\n{% for %}")
    with pytest.raises(VkdflashError, match="^chat template failed"):  # the sandbox forbids mutation
        ChatTemplate("{{ messages.append(1) }}").render(msgs)
    with pytest.raises(VkdflashError, match="list of"):
        ChatTemplate("x").render("not a list")


# Hostile templates: the template comes from whoever made the model file and is a program.

NAME = "tokenizer.chat_template of model.gguf"
TOO_BIG = "builds a value of more than 4,194,304 characters"
NESTED_LOOPS = "{% set s = 'x' * 20000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"


def refused(source, match: str, name: str = NAME) -> str:
    """The template fails compiling or rendering with one short, one-line VkdflashError naming it."""
    with pytest.raises(VkdflashError) as info:
        ChatTemplate(source, name=name).render(CONVERSATIONS[0])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(name + " ") and len(msg) < 200, msg
    assert re.search(match, msg), msg
    return msg


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setattr(sandbox, "MAX_SECONDS", 0.2)


@pytest.mark.parametrize("source, match", [
    ("{{ 1/0 }}", "failed: ZeroDivisionError: 'division by zero'$"),
    ("{{ 'x' * 4000000000 }}", TOO_BIG + r" \(in \*\)"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "1,000,000 steps"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed: RecursionError"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", TOO_BIG),
    ("{{ 'x'|center(4000000000) }}", TOO_BIG + r" \(in \|center\)"),
    ("{{ 'x'.center(1000000000) }}", TOO_BIG + r" \(in center\(\)\)"),
    ("{{ [1] * 10**9 }}", TOO_BIG),
    ("{{ 2 ** (10 ** 10) }}", "a number of more than 4096 bits"),  # jinja reads 2**10**10 as (2**10)**10
    ("{% set ns = namespace(n=3) %}{% for i in range(99) %}{% set ns.n = ns.n * ns.n %}{% endfor %}", "4096 bits"),
    ("{{ '%0999999999d' % 1 }}", TOO_BIG),
    ("{{ '%*d' % (999999999, 1) }}", TOO_BIG),
    ("{{ '%0999999999d'|format(1) }}", TOO_BIG),
    ("{{ '{:>999999999}'.format(1) }}", TOO_BIG),
    ("{{ ('x' * 1000000).replace('', 'y' * 1000) }}", TOO_BIG),
    ("{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}", TOO_BIG),
    ("{{ ('y' * 1000000).join('x' * 1000) }}", TOO_BIG),
    ("{{ ('x' * 1000)|join('y' * 1000000) }}", TOO_BIG),
    ("{{ ('\\n' * 100000)|indent(1000) }}", TOO_BIG),
    ("{{ [1]|batch(1000000, 'x' * 1000)|list }}", TOO_BIG),
    ("{{ ([[[[1] * 1000]]] * 100)|tojson(indent=100000) }}", TOO_BIG),
    ("{{ ([[1]] * 100000)|sum(start=[]) }}", TOO_BIG),   # quadratic copying, all of it in C
    # one string shared by reference many times: str(), ==, hash() would walk every occurrence, in C
    ("{% set a = ['x' * 1000000] * 1000 %}{{ a }}", TOO_BIG),
    ("{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a] %}{{ [b, b, b, b, b] }}", TOO_BIG + " .in a literal"),
    ("{% set a = 'x' * 1000000 %}{{ a ~ a ~ a ~ a ~ a }}", TOO_BIG),
    ("{% set a = 'x' * 1000000 %}{% set ns = namespace() %}{% set ns.a = a %}{% set ns.b = a %}{% set ns.c = a %}"
     "{% set ns.d = a %}{% set ns.e = a %}", TOO_BIG + " .in namespace attribute 'e'"),
    ("{% set a = 'x' * 1000000 %}{% macro f() %}{{ varargs }}{% endmacro %}{{ f(a, a, a, a, a) }}",
     TOO_BIG + r" \(in f\(\)\)"),
    ("{% set a = 'x' * 1000000 %}{% set b = [a] + [a] %}{% set c = [b] + [b] %}{% set d = [c] + [c] %}{{ d|length }}",
     TOO_BIG + r" \(in \+\)"),
    ("{% set a = 'x' * 4000000 %}{% set s %}{{ a }}{{ a }}{% endset %}", TOO_BIG),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "writes a prompt of more than 4,194,304 characters"),
    ("{% macro f(s) %}{{ f(s ~ '!') }}{% endmacro %}{{ f('x' * 4000000) }}", "67,108,864 characters in all"),
    ("{{ ''.__class__.__mro__ }}", "failed: SecurityError"),
    ("{{ [1].index('y' * 100000) }}", r"failed: ValueError: .*yyyy.*\.\.\. \(100017 chars\)$"),   # the echoed value is cut short
    ("ok\n{% for %}", "syntax error at line 2"),
    (None, "is not text but NoneType"),
    (b"{{ 1 }}", "is not text but bytes"),
])
def test_hostile_template_is_one_short_error(source, match):
    refused(source, match)


def test_raise_exception_message_is_cut_short():
    msg = refused("{{ raise_exception('why ' * 25000) }}", r"refused the messages: 'why why .*'\.\.\. \(100000 chars\)$")
    assert len(msg) < len(NAME) + 140


def test_name_defaults_to_chat_template():
    refused("{{ 1/0 }}", "^chat template failed", name="chat template")
    with pytest.raises(VkdflashError, match="^chat template failed"):
        ChatTemplate("{{ 1/0 }}").render(CONVERSATIONS[0])


def test_loops_without_calls_hit_the_deadline(short_deadline):
    refused(NESTED_LOOPS, r"runs for more than 0.2 s$")


def test_nothing_strays_after_a_deadline(short_deadline):
    refused(NESTED_LOOPS, "runs for more than")
    time.sleep(0.1)   # past sandbox.RETRY: a watcher still running would inject again, into this sleep
    assert sum(range(300000)) == 44999850000   # plain Python, where a late injected exception would land
    assert not [t for t in threading.enumerate() if t.name == "chat template deadline"]
    check_smollm_template(ChatTemplate(F.SMOLLM_TEMPLATE))


def test_the_deadline_fires_again_when_swallowed():
    """A timeout that lands in a __del__ or weakref callback is only reported as ignored: it must come again."""
    deadline, hits, give_up = sandbox.Deadline(0.01), 0, time.monotonic() + 2
    try:
        deadline.start()
        while hits < 2 and time.monotonic() < give_up:
            try:
                while time.monotonic() < give_up:
                    pass
            except sandbox.Timeout:
                hits += 1   # swallowed
    finally:
        try:
            deadline.stop()
        except sandbox.Timeout:
            pass
    assert hits == 2


def test_a_deadline_hits_only_its_own_thread(short_deadline):
    failures = []

    def hostile():
        try:
            ChatTemplate(NESTED_LOOPS).render(CONVERSATIONS[0])
        except VkdflashError as exc:
            failures.append(str(exc))
    thread = threading.Thread(target=hostile)
    thread.start()
    template, renders = ChatTemplate(F.SMOLLM_TEMPLATE), 0
    while thread.is_alive() or renders == 0:
        assert template.render(CONVERSATIONS[2]) == chatml(CONVERSATIONS[2], True, SMOL_SYSTEM)
        renders += 1
    thread.join()
    assert len(failures) == 1 and "runs for more than" in failures[0]


def test_long_conversation_stays_within_the_bounds():
    msgs = [{"role": ("user", "assistant")[i % 2], "content": f"{i}: " + "word " * 200} for i in range(2000)]
    assert ChatTemplate(F.SMOLLM_TEMPLATE).render(msgs) == chatml(msgs, True, SMOL_SYSTEM)   # 2 MB, well in time


def test_bounds_leave_ordinary_template_code_alone():
    source = ("{% set ns = namespace(last=-1, parts=[]) %}"
              "{% for m in messages[::-1] %}{% if ns.last < 0 and m.role == 'user' %}"
              "{% set ns.last = messages|length - 1 - loop.index0 %}{% endif %}{% endfor %}"
              "{% for m in messages %}{% set ns.parts = ns.parts + [m.content.split('</think>')[-1]] %}{% endfor %}"
              "{{ ns.last }}|{{ ns.parts|join(',') }}|{{ {'a': [1, (2, 3)]}|tojson(indent=1) }}|"
              "{{ '%s-%03d' % ('n', 7) }}|{{ '{}:{}'.format('k', 'v') ~ '!' }}|{{ range(3)|list }}|"
              "{{ 'ab' * 2 }}|{{ 2 ** 10 }}|{{ 'x'|center(5) }}|{{ 'a\nb'|indent(2) }}|{{ strftime_now('%Y')|length }}")
    msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>t</think>a1"},
            {"role": "user", "content": "q2"}]
    assert ChatTemplate(source).render(msgs) == (
        '2|q1,a1,q2|{\n "a": [\n  1,\n  [\n   2,\n   3\n  ]\n ]\n}|n-007|k:v!|[0, 1, 2]|abab|1024|  x  |a\n  b|4')
