"""Self-distillation data: the target's own continuations of a varied prompt mix, with its features.

Prompts come from text already on the machine (no hub download): slices of the Python standard
library's source (code), its docstrings (facts), and chat / story requests built from them and
from a small list of subjects, wrapped in the model's chat template. The target continues each
prompt (greedy for most, T = 0.7 for a quarter, so drafts also learn the sampled distribution's
mode); every position's captured layer inputs are kept (f16) for the trainers."""
from __future__ import annotations

import ast
import random
import re
import sysconfig
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vkdflash.chat import ChatTemplate, chat_prompt_ids, rendered_ids
from vkdflash.model.gguf_file import GGUFFile
from vkdflash.suite import PROMPTS
from vkdflash.tokenizer import Tokenizer

SUBJECTS = ("a lighthouse keeper", "a robot who learns to paint", "two rival bakers", "a lost kitten",
            "a city under the sea", "an old map", "a dragon afraid of fire", "a time traveller's mistake",
            "a school science fair", "a talking tree", "the last train home", "a chess tournament",
            "a detective in the rain", "a garden on Mars", "a broken clock", "a friendly ghost")
TOPICS = ("recursion", "hash tables", "photosynthesis", "the water cycle", "binary search", "gravity",
          "unit testing", "the French Revolution", "compound interest", "HTTP requests", "sorting algorithms",
          "volcanoes", "regular expressions", "the immune system", "version control", "prime numbers")
CHAT_FORMS = ("Explain {} in simple terms.", "Give me three facts about {}.", "Why is {} important?",
              "How would you teach {} to a child?", "Write a short paragraph about {}.")
# The "varied" mix (round 6 on): short code starts of small everyday tasks, as people type them,
# wider questions and story openers. None is one of the suite's prompts (src/vkdflash/suite.py).
TASKS = (("reverse_words", "sentence", "Reverse the order of the words in a sentence"),
         ("count_vowels", "text", "Count the vowels in a string"),
         ("factorial", "n", "Compute n factorial"), ("fibonacci", "n", "Return the first n Fibonacci numbers"),
         ("is_palindrome", "s", "Check whether a string reads the same backwards"),
         ("flatten", "nested", "Flatten a nested list"), ("gcd", "a, b", "Greatest common divisor of two numbers"),
         ("celsius_to_fahrenheit", "c", "Convert a temperature from Celsius to Fahrenheit"),
         ("find_max", "numbers", "Find the largest number in a list"),
         ("remove_duplicates", "items", "Remove duplicates from a list, keeping the order"),
         ("write_lines", "path, lines", "Write a list of lines to a text file"),
         ("average", "values", "Return the mean of a list of numbers"),
         ("chunks", "items, size", "Split a list into chunks of a given size"),
         ("capitalize_words", "text", "Capitalize the first letter of every word"),
         ("count_lines", "path", "Count the lines in a file"), ("transpose", "matrix", "Transpose a matrix"),
         ("quick_sort", "arr", "Sort a list with quicksort"), ("bubble_sort", "arr", "Sort a list with bubble sort"),
         ("sum_digits", "n", "Sum the digits of a number"), ("to_binary", "n", "Convert an integer to binary"),
         ("download", "url", "Download a web page"), ("parse_args", "", "Parse the command line arguments"),
         ("matrix_multiply", "a, b", "Multiply two matrices"), ("word_lengths", "words", "Map each word to its length"))
CLASSES = (("Queue", ""), ("BankAccount", ", owner, balance=0"), ("Rectangle", ", width, height"),
           ("Node", ", value"), ("LinkedList", ""), ("Counter", ", start=0"), ("Student", ", name, grade"),
           ("Timer", ""), ("Vector", ", x, y"), ("Inventory", ""), ("Circle", ", radius"), ("Library", ""))
QUESTIONS = ("How do I {} in Python?", "What is the best way to {}?", "Can you show me how to {}?",
             "Write a Python program to {}.")
THINGS = ("What is {}?", "Tell me about {}.", "What are the main causes of {}?", "Summarize the history of {}.",
          "What should I know about {}?")
PLACES = ("Japan", "the Amazon rainforest", "the Roman Empire", "the Moon", "coffee", "the Olympic Games",
          "electric cars", "the Internet", "honey bees", "the Great Wall of China", "jazz", "earthquakes")
OPENERS = ("The door creaked open and", "Long ago, in a kingdom far away,", "On the first day of summer,",
           "Nobody in the town believed", "The spaceship landed in the middle of", "When the storm finally passed,",
           "Every night at midnight, the old clock", "Sam had never seen a", "Deep in the forest there lived")


def stdlib_sources(rng: random.Random, limit: int = 400) -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))
    rng.shuffle(files)
    out = []
    for p in files[:limit]:
        try:
            out.append((p.stem, p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def docstrings(module: str, source: str) -> list[tuple[str, str]]:
    """(qualified name, docstring) of the module's functions and classes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                out.append((f"{module}.{node.name}", doc))
    return out


def varied_prompt(rng: random.Random, tok: Tokenizer, template: ChatTemplate) -> tuple[str, list[int]]:
    """One prompt of the "varied" mix's own kinds: short code starts (a function or class header,
    maybe a docstring or a comment), how-to and general questions, story openers."""
    r = rng.random()
    name, args, what = rng.choice(TASKS)
    if r < 0.45:
        form = rng.randrange(4)
        if form == 0:
            text = f"def {name}({args}):\n"
        elif form == 1:
            text = f'def {name}({args}):\n    """{what}."""\n'
        elif form == 2:
            text = f"# {what}\n"
        else:
            cls, init_args = rng.choice(CLASSES)
            text = f"class {cls}:\n    def __init__(self{init_args}):\n"
        return "code", tok.encode(text)
    if r < 0.85:
        ask = (rng.choice(QUESTIONS).format(what[0].lower() + what[1:]) if rng.random() < 0.5
               else rng.choice(THINGS).format(rng.choice(PLACES + TOPICS)))
        return "chat", chat_prompt_ids(tok, template, [{"role": "user", "content": ask}])
    return "story", tok.encode(rng.choice(OPENERS) + " ")


# The "words" mix (round 7 on): the varied mix repeats a few dozen subjects, and greedy answers to
# one prompt are one sequence (its 1089 story sequences held 367 distinct ones), so the drafts
# learned those answers rather than the target's prose. Here every prompt names words drawn from
# the tokenizer's own vocabulary (~11k whole words), in many request forms.
WORD_CHAT = ("What is {a}?", "Tell me about {a}.", "Explain {a} to a beginner.", "Write a short poem about {a}.",
             "Write a haiku about {a}.", "Give me three tips about {a}.", "Why do people care about {a}?",
             "What is the difference between {a} and {b}?", "Write a short story about {a} and {b}.",
             "Describe {a} in a few sentences.", "What are the benefits of {a}?", "How does {a} work?",
             "Give me a simple recipe with {a}.", "Write a Python function that handles {a}.",
             "How do I {a} a {b} in Python?", "Summarize the history of {a}.", "List five facts about {a}.",
             "Write a letter to a friend about {a}.", "What should a child know about {a}?",
             "Is {a} a good idea? Answer briefly.", "Compare {a} with {b}.", "Write a story about a {a}.")
WORD_TEXT = ("Once upon a time, there was a {a} who ", "The {a} was ", "Every morning, the {a} ",
             "In the {a}, {b} ", "She opened the {a} and ", "The story of the {a} begins ")
WORD_CODE = ("def {a}_{b}({c}):\n", 'def {a}({c}):\n    """Return the {b} of the {c}."""\n', "# {A} the {b}\n",
             "class {A}{B}:\n    def __init__(self, {c}):\n", "import {c}\n\n\ndef {a}_{b}():\n",
             "def test_{a}_{b}():\n", "for {a} in {b}s:\n", "{a}s = []\nfor {b} in {c}:\n")


def tokenizer_words(tok: Tokenizer) -> list[str]:
    """Whole lowercase words of the vocabulary, past its ~300 most frequent merges (function words)
    and before its rarest (fragments)."""
    words = [s[1:] for s in tok.tokens if s.startswith("\u0120") and re.fullmatch("[a-z]{4,12}", s[1:])]
    return words[300:12000]


def words_prompt(rng: random.Random, words: list[str], tok: Tokenizer,
                 template: ChatTemplate) -> tuple[str, list[int]]:
    """One prompt of the "words" mix: ~40% code, ~40% chat, ~20% story text."""
    a, b, c = (rng.choice(words) for _ in range(3))
    fill = dict(a=a, b=b, c=c, A=a.capitalize(), B=b.capitalize())
    r = rng.random()
    if r < 0.4:
        return "code", tok.encode(rng.choice(WORD_CODE).format(**fill))
    if r < 0.8:
        ask = rng.choice(WORD_CHAT).format(**fill)
        return "chat", chat_prompt_ids(tok, template, [{"role": "user", "content": ask}])
    return "story", tok.encode(rng.choice(WORD_TEXT).format(**fill))


def prompt_mix(n: int, tok: Tokenizer, template: ChatTemplate, seed: int,
               varied: bool = False, words: bool = False) -> list[tuple[str, list[int]]]:
    """n (kind, token ids) prompts: ~35% code, ~20% facts, ~30% chat, ~15% stories; `varied`: half
    of them from varied_prompt instead (the draws of the others stay as without it); `words`: all
    from words_prompt."""
    if words:
        rng, vocab = random.Random(seed), tokenizer_words(tok)
        return [words_prompt(rng, vocab, tok, template) for _ in range(n)]
    rng = random.Random(seed)
    sources = stdlib_sources(rng)
    docs = [d for m, s in sources for d in docstrings(m, s)]
    other = random.Random(seed + 1_000_003)
    out = []
    while len(out) < n:
        if varied and other.random() < 0.5:
            kind, ids = varied_prompt(other, tok, template)
            if 4 <= len(ids):
                out.append((kind, ids[:192]))
            continue
        r = rng.random()
        if r < 0.35:
            _, src = rng.choice(sources)
            lines = src.splitlines()
            starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))] or [0]
            first = rng.choice(starts)
            text = "\n".join(lines[first:first + rng.randint(3, 30)]) + "\n"
            kind, ids = "code", tok.encode(text)
        elif r < 0.55:
            name, doc = rng.choice(docs)
            kind, ids = "facts", tok.encode(doc.split("\n\n")[0])
        elif r < 0.85:
            if rng.random() < 0.5:
                name, doc = rng.choice(docs)
                ask = rng.choice((f"What does the Python function `{name}` do?",
                                  f"Write a Python function that does this: {doc.splitlines()[0]}",
                                  f"Explain this documentation:\n{doc.split(chr(10) * 2)[0]}"))
            else:
                ask = rng.choice(CHAT_FORMS).format(rng.choice(TOPICS))
            kind, ids = "chat", chat_prompt_ids(tok, template, [{"role": "user", "content": ask}])
        else:
            subject = rng.choice(SUBJECTS)
            if rng.random() < 0.5:
                kind, ids = "story", chat_prompt_ids(
                    tok, template, [{"role": "user", "content": f"Write a short story about {subject}."}])
            else:
                kind, ids = "story", tok.encode(f"Once upon a time, there was {subject}.")
        if 4 <= len(ids):
            out.append((kind, ids[:192]))
    return out


# The "self" mix (round 10): requests the target writes itself. However many words fill them, our
# templates are guesses at what users ask; sampled from its chat template's user turn (or from a
# short code or story opener), the target's requests follow what it was tuned on, which is what
# its users' prompts resemble. Only its answers (greedy for most) become training data.
FENCE = "```python\n"  # written before a code opener so the target knows it writes Python; cut after
SELF_CODE = ("def", "class", "import", "from", "#", "for", "@", "with", "while", "if __name__")
SELF_TEXT = ("Once upon a time", "Long ago,", "One day,", "There once was", "In a small town", "It was a",
             "The old", "Every morning", "Deep in the", "When the")


SUITE_FIRST_LINES = tuple(p.text.strip().splitlines()[0].lower() for p in PROMPTS)


def holds_suite_prompt(text: str) -> bool:
    """Whether `text` holds the first line of an acceptance-suite prompt (training data must not)."""
    text = text.lower()
    return any(line in text for line in SUITE_FIRST_LINES)


def self_prompts(target, tok: Tokenizer, template: ChatTemplate, n: int, seed: int,
                 batch: int) -> list[tuple[str, list[int]]]:
    """Up to n (kind, token ids) prompts written by the target at T 1 (top-k 50): ~45% chat requests
    (its own user turns, the finished ones), ~35% code and ~20% story text (an opener continued, cut
    at a random line end or word end). A prompt holding the first line of an acceptance-suite prompt
    (the target writes `def is_prime(n):` and `import json` too) is dropped: the suite stays unseen."""
    rng = random.Random(seed)
    user_turn = template.render([{"role": "user", "content": "\0"}], add_generation_prompt=False).split("\0")[0]
    head = rendered_ids(tok, user_turn)
    kinds = ["chat" if r < 0.45 else "code" if r < 0.8 else "story" for r in (rng.random() for _ in range(n))]
    seeds = [head if k == "chat" else tok.encode(FENCE + rng.choice(SELF_CODE)) if k == "code"
             else tok.encode(rng.choice(SELF_TEXT)) for k in kinds]
    written, _ = generate(target, seeds, 48, (), batch, seed, tok.eog_ids, sampled=1.0, temp=1.0, top_k=50)
    out = []

    def keep(kind, ids):
        if not holds_suite_prompt(tok.decode(ids)):
            out.append((kind, ids))
    for kind, start, seq in zip(kinds, seeds, written):
        new = [int(t) for t in seq[len(start):]]
        if kind == "chat":
            ask = tok.decode(new[:-1]).strip() if new and new[-1] in tok.eog_ids else ""
            if len(ask.split()) >= 3:
                keep(kind, chat_prompt_ids(tok, template, [{"role": "user", "content": ask}])[:192])
            continue
        text = tok.decode(seq).removeprefix(FENCE).split("```")[0]
        first = len(tok.decode(start).removeprefix(FENCE))
        ends = [i + 1 for i, c in enumerate(text) if c == "\n" and i >= first] if kind == "code" else \
            [i for i, c in enumerate(text) if c == " " and i > first + 8]
        if ends:
            keep(kind, tok.encode(text[:rng.choice(ends)]))
    return out


@torch.no_grad()
def left_padded(seqs):
    """Sequences right-aligned for one causal pass: ids [B, T], pad [B], pos [B, T] (0 at each
    sequence's first token), mask [B, 1, T, T] (padded rows see themselves: no NaN)."""
    T = max(len(q) for q in seqs)
    pad = torch.tensor([T - len(q) for q in seqs])
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    for r, q in enumerate(seqs):
        ids[r, pad[r]:] = torch.as_tensor(np.asarray(q, np.int64))
    pos = (torch.arange(T)[None, :] - pad[:, None]).clamp(min=0)
    mask = (torch.arange(T)[None, :] >= pad[:, None])[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
    return ids, pad, pos, mask | torch.eye(T, dtype=torch.bool)


def generate(target, prompts, n_new: int, capture, batch: int, seed: int, eog=frozenset(), sampled=0.25,
             temp=0.7, top_k=0):
    """Continue every prompt by up to n_new tokens: a `sampled` share of them at `temp` (top_k: only the
    k likeliest tokens), the rest greedy. Returns (token arrays, feature arrays [L - 1, len(capture), d]
    f16: the captured layer inputs of every position fed; None without capture)."""
    g = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    tokens, feats = [None] * len(prompts), [None] * len(prompts)
    capture = list(capture)
    for first in tqdm(range(0, len(order), batch), desc="generate", unit="batch"):
        idx = order[first:first + batch]
        ids, pad, pos, mask = left_padded([prompts[i] for i in idx])
        (B, Lp), S = ids.shape, ids.shape[1] + n_new
        cache = target.new_cache(B, S)
        key_ok = (torch.arange(S)[None, :] >= pad[:, None])  # [B, S]
        row_temp = (torch.rand(B, generator=g) < sampled).float() * temp
        x, seen = target.forward(ids, pos, mask, cache, 0, capture)
        row_feats = [torch.stack([seen[c] for c in capture], 2).half()] if capture else []  # [B, T, C, d]
        out, done = [], torch.zeros(B, dtype=torch.bool)
        last = x[:, -1:]
        for t in range(n_new):
            nxt = _pick(target.lm_head(last[:, 0]), row_temp, g, top_k)
            out.append(nxt)
            done |= torch.tensor([int(v) in eog for v in nxt])
            if done.all() or t == n_new - 1:
                break
            p = Lp + t
            mask = key_ok[:, None, None, :p + 1]
            last, seen = target.forward(nxt[:, None], (p - pad)[:, None], mask, cache, p, capture)
            if capture:
                row_feats.append(torch.stack([seen[c] for c in capture], 2).half())
        gen = torch.stack(out, 1)
        allf = torch.cat(row_feats, 1) if capture else None
        for r, i in enumerate(idx):
            g_ids = gen[r].tolist()
            stop = next((j + 1 for j, v in enumerate(g_ids) if v in eog), len(g_ids))
            seq = prompts[i] + g_ids[:stop]
            tokens[i] = np.array(seq, np.int32)
            feats[i] = allf[r, pad[r]:pad[r] + len(seq) - 1].numpy() if capture else None
    return tokens, feats


def recapture(target, tokens, capture, batch: int):
    """The layer inputs `capture` at positions 0..L-2 of finished sequences, teacher-forced in one
    pass each: what generate() captured as it wrote them (the same forward), for layers it did not
    keep. Returns feature arrays [L - 1, len(capture), d] f16."""
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    feats = [None] * len(tokens)
    for first in tqdm(range(0, len(order), batch), desc="recapture", unit="batch"):
        idx = order[first:first + batch]
        ids, pad, pos, mask = left_padded([tokens[i][:-1] for i in idx])
        _, seen = target.forward(ids, pos, mask, target.new_cache(*ids.shape), 0, capture)
        allf = torch.stack([seen[c] for c in capture], 2).half()
        for r, i in enumerate(idx):
            feats[i] = allf[r, pad[r]:].numpy()
    return feats


def _pick(logits, temp, g, top_k=0):
    out = logits.argmax(-1)
    hot = (temp > 0).nonzero()[:, 0]
    if len(hot):
        logits = logits[hot]
        if top_k:
            logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
        probs = torch.softmax(logits / temp[hot, None], -1)
        out[hot] = torch.multinomial(probs, 1, generator=g)[:, 0]
    return out


def load_text_tools(model_path):
    with GGUFFile(model_path) as gf:
        tok = Tokenizer(gf.metadata)
        template = ChatTemplate.from_metadata(gf.metadata, tok)
    return tok, template


class Dataset:
    """What `run.py data` wrote, in one or more directories (runs with different seeds): tokens of
    sequence i, and the captured layer inputs `layers` of its positions 0..L-2 as
    [L - 1, len(layers) * d] f16 (memory-mapped)."""

    def __init__(self, roots, layers):
        import json
        roots = [Path(roots)] if isinstance(roots, (str, Path)) else [Path(r) for r in roots]
        indexes = [json.loads((root / "index.json").read_text()) for root in roots]
        if len({(ix["model"], tuple(ix["capture"])) for ix in indexes}) > 1:
            raise ValueError(f"{', '.join(map(str, roots))} were made for different targets or layers")
        self.capture = indexes[0]["capture"]
        self.slots = [self.capture.index(x) for x in layers]
        self.lengths = np.concatenate([ix["lengths"] for ix in indexes])
        self.prompt_lengths = np.concatenate([ix["prompt_lengths"] for ix in indexes])
        self.kinds = [k for ix in indexes for k in ix["kinds"]]
        self._tokens = np.concatenate([np.load(root / "tokens.npy") for root in roots])
        self._feats = [np.load(root / "features.npy", mmap_mode="r") for root in roots]
        self.part = np.concatenate([[p] * len(ix["lengths"]) for p, ix in enumerate(indexes)])
        self.tok_off = np.concatenate([[0], np.cumsum(self.lengths)])
        # feature rows: offsets within each directory's file
        self.feat_off = np.concatenate([np.concatenate([[0], np.cumsum(np.array(ix["lengths"]) - 1)[:-1]])
                                        for ix in indexes])
        self.n_feat = len(layers) * self._feats[0].shape[2]

    def tokens(self, i):
        return self._tokens[self.tok_off[i]:self.tok_off[i + 1]]

    def feats(self, i):
        start = self.feat_off[i]
        f = self._feats[self.part[i]][start:start + self.lengths[i] - 1][:, self.slots]
        return f.reshape(len(f), -1)

    def ranked_tokens(self) -> np.ndarray:
        """Token ids the data holds, by how often the target wrote them (its continuations), ties
        by how often the prompts hold them: a draft's vocabulary (vkdflash.api.DRAFT_VOCAB)."""
        n = int(self._tokens.max()) + 1
        wrote, read = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(len(self.lengths)):
            t = self.tokens(i)
            np.add.at(wrote, t[self.prompt_lengths[i]:], 1)
            np.add.at(read, t[:self.prompt_lengths[i]], 1)
        seen = np.flatnonzero(wrote + read)
        return seen[np.lexsort((seen, -read[seen], -wrote[seen]))]
