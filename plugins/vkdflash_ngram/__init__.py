"""Prompt-lookup n-gram drafting: the smallest complete strategy, no model at all.

A plugin is a module (or object) with `@hookimpl` functions, registered through the
`vkdflash` entry-point group in its package metadata:

    [project.entry-points.vkdflash]
    ngram = "vkdflash_ngram"

This one looks for the most recent earlier occurrence of the last few committed tokens and
proposes what followed it -- effective on code, quotes and summaries that repeat the prompt."""
from __future__ import annotations

from vkdflash.api import Option, Proposal, Strategy, hookimpl

__version__ = "0.1.0"


N = Option("n", int, 3, "longest n-gram looked up (the last n committed tokens, then n-1, ...)")


class PromptLookup(Strategy):
    name = "ngram"

    def __init__(self, ctx):
        self.max_ngram = ctx.options.settings.get(N.key, N.default)
        if self.max_ngram < 1:
            raise ValueError(f"ngram.n must be at least 1, got {self.max_ngram}")

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        history = ctx.tokens + [last_token]
        for n in range(min(self.max_ngram, len(history) - 1), 0, -1):
            tail = history[-n:]
            # newest earlier match first: recent context predicts best
            for start in range(len(history) - n - 1, -1, -1):
                if history[start:start + n] == tail:
                    return Proposal(history[start + n:start + n + max_n])
        return Proposal([])


@hookimpl
def register_strategies(register):
    register("ngram", PromptLookup, "prompt lookup: copy what followed the last n-gram earlier in the text",
             options=(N,))
