"""A cascade of strategies, `--spec ngram+mtp`: each step asks them in turn and verifies the
first proposal that is not empty.

A lookup that copies earlier text (ngram) is free to ask, silent where the text does not
repeat, and right on most steps where it finds a match; a draft model proposes every step, at
a lower acceptance. On the suite's code prompts half the steps continue earlier text (docs/
design.md 11): there the copy drafts further than the model would, elsewhere the model drafts.
Every part sees every begin and commit (a draft model's cache needs every position), as its
own options (`--spec-opt ngram.n=4` goes to ngram); the parts after the proposing one are not
asked, as when the draft-length controller asks a lone strategy for nothing. Each part's first
proposal is timed alone (`timed`): the controller prices a part's first use (the MTP head's
kernels compiling, ~1-2 s on lavapipe) against that part's drafts, not the copy's. A part that
fails is switched off alone."""
from __future__ import annotations

import dataclasses
import functools
import logging
import time

from ..errors import VkdflashError
from .strategy import Proposal, Strategy, checked_proposal, declared

log = logging.getLogger("vkdflash")
SEP = "+"


def lookup(name: str):
    """plugins.lookup, and a cascade of registered strategies for names joined by SEP: its
    Registered has `parts` and a factory that starts a Cascade of them."""
    from .. import plugins
    if SEP not in name:
        return plugins.lookup(name)
    parts = []
    for part in name.split(SEP):
        if part == "none":
            raise VkdflashError("none cannot be part of a cascade: give only strategies (ngram+mtp)")
        try:
            parts.append(plugins.lookup(part))
        except VkdflashError as exc:
            raise VkdflashError(f"{exc} (in the cascade {name[:60]!r})") from None
    names = [p.name for p in parts]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise VkdflashError(f"the cascade {name[:60]!r} names {twice} twice")
    return plugins.Registered(SEP.join(names), functools.partial(_start, tuple(parts)),
                              "cascade: each step the first of " + ", ".join(names) + " that proposes", "core",
                              parts=tuple(parts))


def _start(parts: tuple, ctx):
    return Cascade(ctx, [(p.name, p.factory, ctx.options.settings.get(p.name, p.settings(()))) for p in parts])


class Cascade(Strategy):
    name = "cascade"

    def __init__(self, ctx, parts):
        """parts: [(name, factory, settings)] in the order they are asked."""
        self.parts: list[_Part] = []
        self.lengths: dict[str, int] = {}  # the engine's draft length per part this step (none given: max_n)
        self.declined: list[str] = []  # the parts asked this step that proposed nothing, in order
        self.timed: dict[str, float] = {}  # seconds of each part asked this step
        self.title = SEP.join(name for name, _, _ in parts)
        try:
            for name, factory, settings in parts:
                self.parts.append(_Part.start(ctx, name, factory, settings))
        except BaseException:
            self._close_quietly()
            raise
        self.capture_layers = tuple(sorted({c for p in self.parts for c in p.capture}))
        expected = [p.expected for p in self.parts if p.expected is not None]
        # the controller's first guess: the best part's record (a copy it then finds only adds to it)
        self.expected_first_acceptance = max(expected) if expected else None
        longest = [p.longest for p in self.parts]
        self.longest_draft = None if None in longest else max(longest)

    def begin(self, ctx) -> None:
        for part in list(self.parts):
            self._each(ctx, part, "begin", lambda p=part: p.strategy.begin(ctx))

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        """The first part's drafts that are not empty; the parts before it were asked and had none,
        the parts after it are not asked."""
        self.declined, self.timed = [], {}
        for part in list(self.parts):
            n = min(self.lengths.get(part.name, max_n), max_n, part.longest or max_n)
            if n <= 0:
                continue
            t0 = time.perf_counter()
            prop = self._each(ctx, part, "propose",
                              lambda p=part: checked_proposal(p.strategy.propose(ctx, last_token, n), n,
                                                              ctx.target.n_vocab))
            self.timed[part.name] = time.perf_counter() - t0
            if prop is not None and prop.tokens:
                return Proposal(prop.tokens, prop.probs, part.name)
            if prop is not None:
                self.declined.append(part.name)
        return Proposal([])

    def commit(self, ctx) -> None:
        for part in list(self.parts):
            self._each(ctx, part, "commit", lambda p=part: p.strategy.commit(ctx))

    def _each(self, ctx, part, what: str, fn):
        """fn() for one part; a part that fails is switched off for good (one line) and the others go
        on: an MTP head that raises should not take the free copy with it. With none left it raises."""
        try:
            return part.call(ctx, what, fn)
        except VkdflashError as exc:
            self.parts.remove(part)
            if not self.parts:
                raise
            log.warning("strategy %s: its part %s switched off for good: %s", self.title, part.name, exc)
            try:
                part.strategy.close()
            except Exception:  # noqa: BLE001 -- it is off either way
                pass
        return None

    def close(self) -> None:
        errors = self._close_quietly()
        if errors:
            raise RuntimeError("; ".join(errors))

    def _close_quietly(self) -> list[str]:
        errors = []
        for part in self.parts:
            try:
                part.strategy.close()
            except Exception as exc:  # noqa: BLE001 -- the others still close
                errors.append(f"{part.name}: {exc}")
        self.parts = []
        return errors


@dataclasses.dataclass
class _Part:
    name: str
    strategy: Strategy
    options: object
    capture: tuple
    expected: float | None
    longest: int | None

    @classmethod
    def start(cls, ctx, name: str, factory, settings) -> "_Part":
        """The part's strategy, made with its own options and its declarations checked; a failure
        names the part and leaves nothing open."""
        base = ctx.options
        ctx.options = options = dataclasses.replace(base, settings=settings)
        strategy = None
        try:
            strategy = factory(ctx)
            if strategy is None:
                raise VkdflashError("its factory returned nothing")
            # free_proposals is a lone strategy's: the engine asks a cascade's parts after choosing
            capture, expected, longest, _free = declared(strategy, ctx.target.hparams.n_layer)
            return cls(name, strategy, options, capture, expected, longest)
        except Exception as exc:  # noqa: BLE001 -- one line naming the part
            if strategy is not None:
                try:
                    strategy.close()
                except Exception:  # noqa: BLE001 -- the start's own error is the one to say
                    pass
            raise VkdflashError(f"{name}: {_words('start', exc)}") from None
        finally:
            ctx.options = base

    def call(self, ctx, what: str, fn):
        """fn() with this part's options in ctx; what it raises, in one line naming the part."""
        base, ctx.options = ctx.options, self.options
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 -- one line naming the part, as the engine words a strategy's
            raise VkdflashError(f"{self.name} {_words(what, exc)}") from None
        finally:
            ctx.options = base


def _words(what: str, exc: Exception) -> str:
    if isinstance(exc, VkdflashError):
        return str(exc)
    return f"{what} raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
