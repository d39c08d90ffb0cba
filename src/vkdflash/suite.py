"""The acceptance suite: fixed prompts (code, chat, story), 128 new tokens each, for every strategy
and draft cache type, greedy at a fixed draft length (so the figures describe the draft, not the
draft-length controller) and at T 0.7; plain decoding alongside for tok/s.

None of these prompts is in the training mix of tools/train (its code comes from the standard
library, its chat and story requests from other subjects)."""
from __future__ import annotations

import time
from dataclasses import dataclass

SUITE_CACHE_TYPES = ("f16", "bf16", "q8_0", "q5_1", "q4_0", "iq4_nl")

CODE = (
    "def is_prime(n):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import json\n\n\ndef load_config(path):\n",
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n",
    "# Count how often each word occurs in a text file\nfrom collections import Counter\n\n\n",
    "def merge_sort(xs):\n",
    "class Point2:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n\nclass Point3:\n"
    "    def __init__(self, x, y, z):\n        self.x = x\n        self.y = y\n        self.z = z\n\n\nclass Point4:\n",
    "def read_csv(path):\n    \"\"\"Return the rows of a CSV file as dictionaries.\"\"\"\n",
    "for i in range(1, 101):\n    if i % 15 == 0:\n",
    "import unittest\n\n\nclass TestMath(unittest.TestCase):\n    def test_add(self):\n",
)
CHAT = (
    "What is the capital of France, and what is it famous for?",
    "How do I reverse a list in Python?",
    "Give me a simple recipe for pancakes.",
    "What are the benefits of regular exercise?",
    "Explain what a neural network is.",
    "What is the difference between a list and a tuple in Python?",
    "How does a bicycle stay upright?",
    "Write a haiku about autumn.",
)
STORY_CHAT = ("Write a short story about a brave mouse.", "Tell me a story about a pirate who finds a map.",
              "Write a bedtime story about the moon.")
STORY_TEXT = ("Once upon a time, in a small village by the sea, ", "The old wizard opened the door and ",
              "It was a cold winter morning when Anna ")


@dataclass(frozen=True)
class Prompt:
    kind: str    # code | chat | story
    text: str
    chat: bool   # wrapped in the model's chat template as a user message


def _round_robin(*groups):
    """Interleaved, so the first N prompts (--suite-prompts N) cover every kind."""
    out, groups = [], [list(g) for g in groups]
    while any(groups):
        out += [g.pop(0) for g in groups if g]
    return tuple(out)


PROMPTS = _round_robin([Prompt("code", t, False) for t in CODE], [Prompt("chat", t, True) for t in CHAT],
                       [Prompt("story", t, True) for t in STORY_CHAT] + [Prompt("story", t, False) for t in STORY_TEXT])


def prompt_ids(prompt: Prompt, tokenizer, template) -> list:
    from .chat import chat_prompt_ids
    if prompt.chat:
        return chat_prompt_ids(tokenizer, template, [{"role": "user", "content": prompt.text}])
    return tokenizer.encode(prompt.text, add_special=True, parse_special=True)


def run(model, tokenizer, prompts, n_gen: int, sampler_for, speculator) -> dict:
    """Generate for every prompt with one speculator (None: plain). sampler_for(i) -> Sampler.
    Returns totals and a per-kind breakdown of acceptance, tau and tok/s."""
    from .generate import Stats, generate
    from .spec import SpecStats
    total = Stats()
    kinds: dict = {}
    st = speculator.stats if speculator is not None else SpecStats()
    t0 = time.perf_counter()
    for i, (prompt, ids) in enumerate(prompts):
        before = (st.steps, st.drafted, st.accepted, list(st.per_position))
        stats = Stats()
        for _ in generate(model, tokenizer, ids, n_gen, sampler_for(i), (), stats, speculator):
            pass
        k = kinds.setdefault(prompt.kind, {"steps": 0, "drafted": 0, "accepted": 0, "tokens": 0, "seconds": 0.0})
        k["steps"] += st.steps - before[0]
        k["drafted"] += st.drafted - before[1]
        k["accepted"] += st.accepted - before[2]
        k["tokens"] += max(stats.generated_tokens - 1, 0)
        k["seconds"] += stats.decode_seconds
        total.generated_tokens += max(stats.generated_tokens - 1, 0)
        total.decode_seconds += stats.decode_seconds
    out = {"tokens": total.generated_tokens, "decode_tps": _rate(total.generated_tokens, total.decode_seconds),
           "wall_seconds": time.perf_counter() - t0}
    if speculator is not None:
        out.update(acceptance=st.acceptance_rate, tau=st.tau,
                   per_position=[round(a / st.steps, 3) if st.steps else 0.0 for a in st.per_position],
                   disabled=st.disabled or None, by_source=st.as_dict()["by_source"])
        out["per_kind"] = {name: {"acceptance": _rate(k["accepted"], k["drafted"]),
                                  "tau": 1.0 + _rate(k["accepted"], k["steps"]) if k["steps"] else 0.0,
                                  "decode_tps": _rate(k["tokens"], k["seconds"])} for name, k in kinds.items()}
    else:
        out["per_kind"] = {name: {"decode_tps": _rate(k["tokens"], k["seconds"])} for name, k in kinds.items()}
    return out


def _rate(a: float, b: float) -> float:
    return a / b if b else 0.0


def table(report: dict) -> str:
    """The suite's figures as a text table (one row per strategy x cache type x temperature)."""
    w = max([8] + [len(r["strategy"]) for r in report["runs"]])  # a cascade's name: ngram+dflash
    head = (f"{'strategy':<{w}} {'cache':<7} {'T':>4} {'k':>3} {'accept':>7} {'tau':>5} {'code tau':>8} "
            f"{'chat tau':>8} {'story tau':>9} {'tok/s':>6} {'vs none':>7}")
    lines = [head, "-" * len(head)]
    for r in report["runs"]:
        pk = r.get("per_kind", {})
        taus = [f"{pk.get(kind, {}).get('tau', 0.0):>{w}.2f}" for kind, w in (("code", 8), ("chat", 8), ("story", 9))]
        k = len(r.get("per_position") or []) or r["draft_max"]  # what it drafted at most: a strategy may clamp
        lines.append(f"{r['strategy']:<{w}} {r['cache']:<7} {r['temp']:>4.1f} {k:>3} "
                     f"{r.get('acceptance', 0.0):>7.3f} {r.get('tau', 0.0):>5.2f} {' '.join(taus)} "
                     f"{r['decode_tps']:>6.1f} {r['speedup']:>6.2f}x"
                     + (f"  SWITCHED OFF: {r['disabled'][:60]}" if r.get("disabled") else ""))
    return "\n".join(lines)
