"""The "text" mix: windows of real text already on this machine, read by the target teacher-forced.

The other mixes make the target write every training token, at ~230 tokens a second on 2 cores;
teacher-forced passes over text that exists read ~400 a second (f32, AMD EPYC), so an hour gives
a draft more tokens, and far more subjects, than a generated round. The data's tokens are then
not what the target would write: train on this with --teacher (the target's own distribution at
each position is the label), so a draft learns what greedy verification accepts.

Sources: Python source files (the standard library and the installed packages: code), the
standard library's docstrings and pydoc topics, and the text files of /usr/share/doc (prose),
a quarter of the prose wrapped in the chat template as an assistant's answer to a request naming
its subject. A window holding the first line of an acceptance-suite prompt is dropped, as the
"self" mix drops such prompts: the suite stays unseen."""
from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from data import docstrings, holds_suite_prompt
from vkdflash.chat import ChatTemplate, rendered_ids
from vkdflash.tokenizer import Tokenizer

ASKS = ("Tell me about {}.", "Explain {}.", "What should I know about {}?", "Can you describe {}?")


def _read(paths, limit: int) -> list[tuple[Path, str]]:
    """(path, text) of up to `limit` of these files, skipping tiny, huge and unreadable ones."""
    out = []
    for p in paths:
        if len(out) >= limit:
            break
        try:
            if 400 < p.stat().st_size < 2_000_000:
                out.append((p, p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def sources(rng: random.Random) -> tuple[list[str], list[tuple[str, str]]]:
    """(code texts, (subject, prose) pairs) found on this machine, in a seeded order."""
    roots = [Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib")]
    code_files = sorted({p for r in roots for p in r.rglob("*.py")})
    rng.shuffle(code_files)
    code = [text for _, text in _read(code_files, 3000)]
    prose = [(name.rpartition(".")[2].replace("_", " "), doc) for text in code[:1500]
             for name, doc in docstrings("python", text)]
    try:
        from pydoc_data.topics import topics
        prose += [(k.replace("-", " "), v) for k, v in sorted(topics.items())]
    except ImportError:
        pass
    docs = sorted(p for p in Path("/usr/share/doc").rglob("*")
                  if p.is_file() and p.suffix in ("", ".md", ".txt", ".rst") and "copyright" not in p.name)
    prose += [(p.parent.name, text) for p, text in _read(docs, 2000)]
    return code, prose


def text_mix(n: int, tok: Tokenizer, template: ChatTemplate, seed: int, length: int = 256):
    """n (kind, token ids) windows of 64 to `length` tokens: about half code, the rest prose (a
    quarter of it as a chat answer)."""
    rng = random.Random(seed)
    code, prose = sources(rng)
    out = []
    while len(out) < n:
        if rng.random() < 0.45:
            kind, subject, text = "code", "", rng.choice(code)
        else:
            subject, text = rng.choice(prose)
            kind = "chat" if rng.random() < 0.25 else "prose"
        lines = text.splitlines(keepends=True)
        first = rng.randrange(len(lines)) if kind == "code" or len(text) > 6 * length else 0
        window = "".join(lines[first:first + 200])[:6 * length]
        if len(window) < (200 if kind == "code" else 120) or holds_suite_prompt(window):
            continue
        if kind == "chat":
            ids = rendered_ids(tok, template.render([{"role": "user", "content": rng.choice(ASKS).format(subject)},
                                                     {"role": "assistant", "content": window}], False))
        else:
            ids = tok.encode(window)
        if len(ids) >= 64:
            out.append((kind, ids[:length]))
    return out
