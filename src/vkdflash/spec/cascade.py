"""A cascade of strategies, `--spec ngram+mtp`: each step asks them in turn and verifies the
first proposal that is not empty.

A lookup that copies earlier text (ngram) is free to ask, silent where the text does not
repeat, and right on most steps where it finds a match; a draft model proposes every step, at
a lower acceptance. On the suite's code prompts half the steps continue earlier text (docs/
design.md 11): there the copy drafts further than the model would, elsewhere the model drafts.
Every part sees every begin and commit (a draft model's cache needs every position), as its
own options (`--spec-opt ngram.n=4` goes to ngram); only the proposing part's propose() runs,
as when the draft-length controller asks a lone strategy for nothing."""
from __future__ import annotations

import dataclasses
import functools

from ..errors import VkdflashError
from .strategy import InvalidProposal, Proposal, Strategy, checked_proposal, declared

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
        self.warm = False  # every part has proposed once
        self.lengths: dict[str, int] = {}  # the engine's draft length per part this step (none given: max_n)
        n_layer, base = ctx.target.hparams.n_layer, ctx.options
        try:
            for name, factory, settings in parts:
                options = dataclasses.replace(base, settings=settings)
                ctx.options = options
                strategy = factory(ctx)
                if strategy is None:
                    raise VkdflashError(f"{name}: its factory returned nothing")
                self.parts.append(_Part(name, strategy, options, *declared(strategy, n_layer)))
        except BaseException:
            self.close()
            raise
        finally:
            ctx.options = base
        self.capture_layers = tuple(sorted({c for p in self.parts for c in p.capture}))
        expected = [p.expected for p in self.parts if p.expected is not None]
        # the controller's first guess: the best part's record (a copy it then finds only adds to it)
        self.expected_first_acceptance = max(expected) if expected else None
        longest = [p.longest for p in self.parts]
        self.longest_draft = None if None in longest else max(longest)

    def begin(self, ctx) -> None:
        for part in self.parts:
            part.call(ctx, "begin", lambda p=part: p.strategy.begin(ctx))

    def propose(self, ctx, last_token: int, max_n: int) -> Proposal:
        chosen = Proposal([])
        for part in self.parts:
            n = min(self.lengths.get(part.name, max_n), max_n, part.longest or max_n)
            if n <= 0:
                continue
            prop = part.call(ctx, "propose", lambda p=part: p.strategy.propose(ctx, last_token, n))
            try:
                prop = checked_proposal(prop, n, ctx.target.n_vocab)
            except InvalidProposal as exc:
                raise InvalidProposal(f"{part.name} {exc}") from None
            if prop.tokens and not chosen.tokens:
                chosen = Proposal(prop.tokens, prop.probs, part.name)
            # the first proposal asks every part: its time is what the cascade's first use costs
            # (a draft model's kernels compile then), which the controller prices as a compile
            if chosen.tokens and self.warm:
                break
        self.warm = True
        return chosen

    def commit(self, ctx) -> None:
        for part in self.parts:
            part.call(ctx, "commit", lambda p=part: p.strategy.commit(ctx))

    def close(self) -> None:
        errors = []
        for part in self.parts:
            try:
                part.strategy.close()
            except Exception as exc:  # noqa: BLE001 -- the others still close
                errors.append(f"{part.name}: {exc}")
        self.parts = []
        if errors:
            raise RuntimeError("; ".join(errors))


@dataclasses.dataclass
class _Part:
    name: str
    strategy: Strategy
    options: object
    capture: tuple
    expected: float | None
    longest: int | None

    def call(self, ctx, what: str, fn):
        """fn() with this part's options in ctx; what it raises names the part."""
        base, ctx.options = ctx.options, self.options
        try:
            return fn()
        except VkdflashError as exc:
            raise VkdflashError(f"{self.name}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 -- one line naming the part, as the engine words a strategy's
            raise VkdflashError(f"{self.name} {what} raised {type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]}") from None
        finally:
            ctx.options = base
