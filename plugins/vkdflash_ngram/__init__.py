"""Prompt-lookup n-gram drafting: the smallest complete strategy, no model at all.

A plugin is a module (or object) with `@hookimpl` functions, registered through the
`vkdflash` entry-point group in its package metadata:

    [project.entry-points.vkdflash]
    ngram = "vkdflash_ngram"

This one looks for the most recent earlier occurrence of the last few committed tokens and
proposes what followed it -- effective on code, quotes and summaries that repeat the prompt."""
from __future__ import annotations

from vkdflash.hookspecs import hookimpl
from vkdflash.spec import Proposal, Strategy

__version__ = "0.1.0"


class PromptLookup(Strategy):
    name = "ngram"

    def __init__(self, ctx, max_ngram: int = 3):
        self.max_ngram = max_ngram

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
    register("ngram", PromptLookup, "prompt lookup: copy what followed the last n-gram earlier in the text")
