"""Prompt-lookup n-gram drafting: the smallest complete strategy, no model at all.

A plugin is a module (or object) with `@hookimpl` functions, registered through the
`vkdflash` entry-point group in its package metadata:

    [project.entry-points.vkdflash]
    ngram = "vkdflash_ngram"

This one looks for the most recent earlier occurrence of the last few committed tokens and
proposes what followed it -- effective on code, quotes and summaries that repeat the prompt. It
stops where the occurrence before that one went on differently: such a slot varies between
repeats (the N of a third `class PointN`), so a guess there is usually wrong, and a shorter
draft is a cheaper verify (the target's own token fills the slot for free). Past the slot it
goes on from the tokens before it, where two repeats agree on what followed.

Where each n-gram started is indexed as tokens are committed, so a lookup costs the same at any
context length (a scan of the text had cost 4-6 ms a proposal at 4096 tokens, a fifth of a
lavapipe decode step)."""
from __future__ import annotations

from bisect import bisect_right

from vkdflash.api import Option, Proposal, Strategy, hookimpl

__version__ = "0.1.0"


N = Option("n", int, 3, "longest n-gram looked up (the last n committed tokens, then n-1, ...)")


class PromptLookup(Strategy):
    name = "ngram"
    free_proposals = True  # a lookup in the committed text: the engine asks before choosing k

    def __init__(self, ctx):
        self.max_ngram = ctx.options.settings.get(N.key, N.default)
        if self.max_ngram < 1:
            raise ValueError(f"ngram.n must be at least 1, got {self.max_ngram}")
        self.begin(ctx)

    def begin(self, ctx) -> None:
        """A new request: nothing indexed yet."""
        self.indexed = 0  # committed tokens indexed so far
        self.starts: list[dict] = [{} for _ in range(self.max_ngram)]  # [n - 1]: n-gram -> where it started, ascending

    def _index(self, tokens: list) -> None:
        """Index the n-grams ending at tokens committed since the last call (committed tokens never
        change within a request; fewer than indexed means another text: start again)."""
        if len(tokens) < self.indexed:
            self.begin(None)
        for end in range(self.indexed + 1, len(tokens) + 1):
            for n in range(1, min(self.max_ngram, end) + 1):
                self.starts[n - 1].setdefault(tuple(tokens[end - n:end]), []).append(end - n)
        self.indexed = len(tokens)

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        self._index(ctx.tokens)
        history = ctx.tokens + [last_token]
        draft = self._lookup(history, len(history), max_n, need=1)
        if not draft:
            # the last token may fill a slot that varies between repeats (the N of class PointN):
            # where what came before it recurs, and two repeats agree on what followed the slot
            draft = self._lookup(history, len(history) - 1, max_n, need=2, skip=1)
        return Proposal(draft)

    def _lookup(self, history: list, end: int, max_n: int, need: int, skip: int = 0) -> list:
        """What followed the newest earlier occurrence of the longest n-gram ending history[:end]
        (`skip` tokens after it), cut where the occurrence before it went on differently; nothing
        when that n-gram occurred fewer than `need` times."""
        for n in range(min(self.max_ngram, end - 1), 0, -1):
            ends = [start + n + skip for start in self._newest(history, end, n)]  # recent context predicts best
            if ends:
                if len(ends) < need:
                    return []
                draft = history[ends[0]:ends[0] + max_n]
                if len(ends) > 1:
                    other = history[ends[1]:ends[1] + len(draft)]
                    draft = draft[:next((i for i, (a, b) in enumerate(zip(draft, other)) if a != b), len(draft))]
                return draft
        return []

    def _newest(self, history: list, end: int, n: int) -> list:
        """Where the two newest earlier occurrences of history[end - n:end] start, newest first
        (each ends before that tail does)."""
        starts = self.starts[n - 1].get(tuple(history[end - n:end]), ())
        newest = bisect_right(starts, end - n - 1)
        return starts[max(0, newest - 2):newest][::-1]


@hookimpl
def register_strategies(register):
    register("ngram", PromptLookup, "prompt lookup: copy what followed the last n-gram earlier in the text",
             options=(N,))
