"""The speculative decoding loop: draft with a strategy, verify in one target pass, roll back.

Per step, with `last` the newest token (sampled, not yet in the target cache, at position P):
  drafts d1..dk <- strategy.propose(last)               (k <= --draft-max, the context, the budget)
  logits        <- target.forward([last, d1..dk])        (one batched pass, every row's logits;
                                                          greedy: every row's argmax, on the GPU)
  n, next       <- verify(drafts, logits)                (greedy or speculative sampling)
  target cache truncated to P+1+n; the strategy is told which positions were committed.
Batch invariance makes the verify pass's logits bit-identical to one-token decoding, so greedy
output is identical to --spec none. A step the controller keeps plain may still ask for drafts
and leave them unverified, to learn their acceptance (shadow.py). A strategy that raises or
proposes invalid tokens is switched off for good with a one-line warning (_disable); generation
goes on.
A Speculator serves request after request (the suite, a server): each starts from nothing
committed, with the controller's view of the text reset (DraftController.new_request); what it
learned of this device, and SpecStats' counts, run on over the speculator's life."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import VkdflashError
from .cascade import Cascade
from .controller import DraftController
from .curve import FIRST_ROWS, measuring_passes
from .stats import SpecStats
from .strategy import InvalidProposal, Proposal, StrategyContext, checked_proposal, declared
from .verify import verify, verify_greedy
from .watchdog import Watchdog

log = logging.getLogger("vkdflash")
# a strategy's first proposals of a shape run cold: the shipped MTP head's k 1 proposals took (the
# first untimed) 9.1, 6.6, 3.9, 3.5 ms, then 2.5-2.8, and priced by the first three it was
# switched off where k 1 pays; the first two are not learned (the median of three absorbs one more)
COLD_PROPOSALS = 2


@dataclass
class TargetView:
    """The parts of the target a strategy may borrow (weights are read by kernels, never written)."""
    hparams: object
    token_embd: object   # Weight
    output: object       # Weight (the LM head)
    output_norm: object  # f32 buffer
    n_ctx: int
    model_file: object = None  # the target's ModelFile (next-n heads may live in it)

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab


def target_view(model) -> TargetView:
    # read only since their upload; a strategy that writes one is told whose it is
    for buffer, name in ((model.embd.buffer, model.embd.name), (model.output.buffer, model.output.name),
                         (model.output_norm, "output_norm.weight")):
        buffer.read_only = f"the target's weight {name}"
    return TargetView(model.hp, model.embd, model.output, model.output_norm, model.cache.n_ctx, model.mf)


def _why(what: str, exc: Exception) -> str:
    """One line for a strategy call that raised."""
    if isinstance(exc, VkdflashError):  # already the user's one line (e.g. a malformed draft file)
        return str(exc)
    return f"{what} raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _strategy_seed(seed: int | None) -> int | None:
    """The request's seed as a strategy gets it: derived, not equal. A strategy seeding numpy's
    generator with the sampler's own seed drew its drafts from the verifier's stream: the number
    that accepted draft i had drawn draft i + 1, and sampled text left plain sampling's distribution."""
    return None if seed is None else int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


class Speculator:
    def __init__(self, model, name: str, factory, options, stats: SpecStats, control: DraftController | None = None,
                 measure=None, costs=None):
        """control: chooses each step's draft length (None: always up to --draft-max); measure():
        the verify curve, timed after the request's context, for a control built without one
        (called when the rest of a run can repay it); costs: the strategy's curve.StrategyCosts (its
        first proposal, which the control weighs as a compile until the strategy has proposed, and
        what its proposals cost before this run times them)."""
        self.model, self.stats, self.measure, self.costs = model, stats, measure, costs
        self._first_seconds = costs.first_seconds() if costs else 0.0
        self._proposed = False
        self.control = control or DraftController(options.draft_max, {1: 1.0}, fixed=True)
        drafts = costs.drafts() if costs else {}
        self.control.drafts.prior(drafts)
        self._seen: dict = {}  # proposals per (asked, drafted) shape: a strategy's graphs exist, and warm
        self._setup_key, self._setup_at = None, {}  # setup seconds per pass shape (_setup_seconds)
        self.watchdog = Watchdog()
        self._off = ""  # why the strategy sits out the rest of this request (_disable)
        self.ctx = StrategyContext(gpu=model.ctx, target=target_view(model), options=options)
        stats.strategy, stats.draft_max = name, options.draft_max
        self.strategy, self.recorded_part = None, ""  # a cascade's part whose record prices it
        self._told: dict = {}  # a cascade part's dropped record, as last logged
        try:  # a start that fails is the user's error (a bad draft file or option): said once, as the error
            self.strategy = factory(self.ctx)
            if self.strategy is None:
                raise VkdflashError("its factory returned nothing")
            self.capture, self.expected, longest, self._free = declared(self.strategy, model.hp.n_layer)
            if isinstance(self.strategy, Cascade):
                self._cascade(self.strategy.parts)
        except Exception as exc:  # noqa: BLE001 -- one line, never a plugin's traceback
            self._drop_strategy()  # what it made so far is freed now, not when the process ends
            self.ctx.close()
            raise VkdflashError(f"strategy {name} could not start: {_why('start', exc)}") from None
        if self.expected:
            self.control.acceptance.expect(self.expected)  # the draft's own record: the controller's first guess
        capped = ""
        if longest and longest < options.draft_max:
            self.control.limit(longest)
            stats.draft_max, capped = longest, f"the strategy's longest draft, not --draft-max {options.draft_max}; "
        caches = (f"draft cache K {options.cache_type_k} V {options.cache_type_v}" if self.ctx.cache_names
                  else "no draft cache")
        log.info("speculation: strategy %s, draft max %d (%s%s length, a_1 prior %.2f from %s), draft p-min %g, "
                 "captures %s, %s", name, stats.draft_max, capped,
                 "fixed" if self.control.fixed else "cost-aware", self.control.acceptance.first_prior,
                 "the draft's record" if self.expected else "no record", options.p_min, list(self.capture) or "none",
                 caches)
        if (self._first_seconds or drafts) and not self.control.fixed:  # a fixed length prices nothing
            first = (", ".join(f"{part} {s:.2f} s" for part, s in self._firsts(self.parts).items()) if self.parts
                     else f"{self._first_seconds:.2f} s")
            log.info("%s as an earlier run here measured it (priced until this run times it): first proposal "
                     "%s, proposals of k drafts %s", name, first,
                     ", ".join(f"{k}: {1000 * s:.1f} ms" for k, s in sorted(drafts.items())) or "untimed")

    def _guard(self, what: str, call):
        """Run a strategy call; on any exception switch the strategy off (one line, no traceback)."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 -- a plugin must never take generation down
            self._disable(_why(what, exc))
        return None

    @property
    def _active(self) -> bool:
        return self.strategy is not None and not self._off

    def _disable(self, why: str, lasting: bool = True) -> None:
        """Switch the strategy off. Where it is at fault (it raised, proposed no proposal) or costs
        more than it saves here even at the acceptance it expects, for good: a server's later
        requests would pay the same. Where this request's text defeated its drafts, for the rest
        of this request only: the next request may suit it (ngram on a chat answer, then code)."""
        if not self._active:
            return
        self._off = self.stats.disabled = why
        log.warning("strategy %s switched off for %s: %s", self.stats.strategy,
                    "this and later requests" if lasting else "this request", why)
        if lasting:
            self._drop_strategy()

    def _cascade(self, parts) -> None:
        """A cascade's parts: each priced from its own record and its proposals' costs as an earlier
        run here timed them; the watchdog judges the part whose record prices the whole."""
        costs = self.costs.parts if self.costs else {}
        self.control.part_priors = {p.name: (p.expected, costs[p.name].drafts() if p.name in costs else {})
                                    for p in parts}
        records = {p.name: p.expected for p in parts if p.expected is not None}
        if records:
            self.recorded_part = max(records, key=records.get)

    @property
    def parts(self) -> list[str]:
        """A cascade's parts still on, in the order it asks them (one that raised is switched off:
        it is neither priced nor asked again)."""
        return [p.name for p in self.strategy.parts] if isinstance(self.strategy, Cascade) else []

    def _drop_strategy(self) -> None:
        strategy, self.strategy = self.strategy, None
        if strategy is not None:
            try:
                strategy.close()
            except Exception:  # noqa: BLE001 -- it is off either way
                pass

    def _committed(self, out, start: int, rows: int, tokens: list) -> None:
        """Hand the newly committed positions' hidden states to the strategy."""
        c = self.ctx
        c.tokens = c.tokens + list(tokens)
        c.new_start = start
        c.new_hidden = {k: v[:rows] for k, v in out.hidden.items() if isinstance(k, int)}
        c.new_final = out.hidden["final"][:rows] if "final" in out.hidden else None

    def _propose(self, last: int, max_n: int) -> Proposal:
        t0 = time.perf_counter()
        prop = self._guard("propose", lambda: self.strategy.propose(self.ctx, last, max_n))
        self.stats.draft_seconds += time.perf_counter() - t0
        if not self._active:
            return Proposal([])
        try:
            return checked_proposal(prop, max_n, self.model.hp.n_vocab)  # what is verified is what was checked
        except InvalidProposal as exc:
            self._disable(str(exc))
            return Proposal([])

    def tokens(self, prompt_ids: list, sampler, budget: int, gen_stats):
        """Yield generated token ids, committing speculatively; `budget` bounds drafting."""
        model, cache = self.model, self.model.cache
        model.reset()
        self.ctx.tokens = []  # a new request: nothing committed yet
        if self.strategy is not None:  # off for the last request's text, not this one's
            self._off = self.stats.disabled = ""
        self.control.new_request()
        self.ctx.temperature, self.ctx.seed = sampler.temp, _strategy_seed(sampler.seed)
        greedy = sampler.greedy
        t0 = time.perf_counter()
        out = model.forward(prompt_ids, capture=self.capture if self._active else (), greedy=greedy, prompt=True)
        gen_stats.prompt_tokens, gen_stats.prompt_seconds = len(prompt_ids), time.perf_counter() - t0
        if self._active:
            self._committed(out, 0, len(prompt_ids), prompt_ids)
            self._timed_inject(lambda: self.strategy.begin(self.ctx), "begin")
        last = int(out.ids[-1]) if greedy else sampler.sample(out.logits[-1])
        emitted = 0
        while True:
            yield last
            emitted += 1
            pos = cache.n_past  # where `last` goes
            room = min(budget - emitted - 1, cache.n_ctx - pos - 1)
            if pos >= cache.n_ctx:
                return
            if self._active and self.control.unmeasured and self.measure is not None and room > 0:
                self._measure_if_it_pays(self.control.horizon(room, emitted))
            passes = lambda rows: self._setup_seconds(rows, rows > 1, self.capture, greedy)  # noqa: E731
            # a cascade's parts still on, each at its own length, their first proposals priced apart
            parts = self.parts if self._active else []
            firsts = self._firsts(parts) if parts else None
            setup = passes if firsts is not None else lambda rows: passes(rows) + self._first_seconds  # noqa: E731
            held, held_seconds, in_hand = None, 0.0, None  # a free strategy's longest draft, in hand before k is chosen
            if self._active and self._free and room > 0:
                t0 = time.perf_counter()
                held = self._propose(last, min(self.control.k_max, room))
                held_seconds, in_hand = time.perf_counter() - t0, len(held.tokens)
            drafting = self.control.choose(room, setup, emitted, firsts, in_hand) if self._active else 0
            ask = drafting or (self.control.shadow if self._active else 0)  # a shadow: proposed, not verified
            lengths = self.control.lengths if self._active else {}
            asked = {name: lengths.get(name, ask) for name in parts} if ask else {}
            if parts:
                self.strategy.lengths = asked
            t0, kernels = time.perf_counter(), len(model.ctx.pipelines)
            if held is not None:
                prop = Proposal(held.tokens[:ask], None if held.probs is None else held.probs[:ask], held.source)
                t0 -= held_seconds  # what the proposal cost, as if asked now
            else:
                prop = self._propose(last, ask) if ask > 0 else Proposal([])
            t1, compiled = time.perf_counter(), len(model.ctx.pipelines) > kernels
            if ask > 0 and parts and self.costs and self._active:
                for name, seconds in self.strategy.timed.items():
                    if name in self.costs.parts:
                        self.costs.parts[name].proposed(seconds)
            elif (ask > 0 or held is not None) and not self._proposed:
                self._proposed, self._first_seconds = True, 0.0
                if self.costs:
                    self.costs.proposed(t1 - t0)
            # a first pass records a graph and compiles kernels (a 3-row verify once took 1.8 s,
            # 40 ms after): not a cost to learn; nor a strategy's first proposals of a shape
            # (COLD_PROPOSALS), or one that compiled (MTP writing held positions in a pass of a
            # new width: 0.66 s for k 1)
            shape = (ask, len(prop.tokens))
            seen = self._seen[shape] = self._seen.get(shape, 0) + 1
            typical = seen > COLD_PROPOSALS and not compiled
            declined = self.strategy.declined if parts and self._active else ()
            if ask > drafting:
                self.control.shadowed(prop.tokens, t1 - t0, typical, prop.source, declined)
                prop, declined = Proposal([]), ()
            capture = self.capture if self._active else ()  # a switched-off strategy reads none
            rows = 1 + len(prop.tokens)  # one row: plain decoding's own pass (measured 2-3% faster)
            warm = model.recorded(rows, rows > 1, capture, greedy)
            out = model.forward([last] + prop.tokens, all_logits=rows > 1, capture=capture, greedy=greedy)
            t2 = time.perf_counter()
            self.stats.verify_seconds += t2 - t1
            n, nxt = (verify_greedy(prop.tokens, out.ids) if greedy
                      else verify(prop.tokens, out.logits, sampler, prop.probs))
            cache.truncate(pos + 1 + n)
            self.stats.record(len(prop.tokens), n, prop.source)
            self.watchdog.watch(self.expected if self._active else None, self.stats, self.ctx, self.recorded_part)
            disowned = self.control.acceptance.disowned
            self.control.update(drafting, len(prop.tokens), n, t2 - t1 if warm else None, t1 - t0 if typical else None,
                                prop.source, asked.get(prop.source, ask), declined)
            self.control.committed(prop.tokens[:n] + [nxt])
            if self.control.acceptance.disowned != disowned:
                log.info("%s: %s", self.stats.strategy, self.control.acceptance.disowned)
            part = self.control.parts.get(prop.source)
            if part is not None and part.acceptance.disowned and part.acceptance.disowned != self._told.get(prop.source):
                self._told[prop.source] = part.acceptance.disowned
                log.info("%s: %s", prop.source, part.acceptance.disowned)
            log.debug("position %d: drafted %d (max %d), accepted %d", pos, len(prop.tokens), drafting, n)
            if self._active:
                self._committed(out, pos, 1 + n, [last] + prop.tokens[:n])
                self.control.note_overhead(self._timed_inject(lambda: self.strategy.commit(self.ctx), "commit"))
                reason = self.control.stop_reason()
                if reason:
                    self._disable(reason + self.watchdog.short_of_record(self.control.acceptance, self.ctx),
                                  self.control.lasting)
            for t in prop.tokens[:n]:
                yield t
                emitted += 1
            last = nxt

    def _firsts(self, names) -> dict[str, float]:
        """Seconds each of these cascade parts will take to propose the first time in this process
        (0 once it has, or where no earlier run timed it)."""
        costs = self.costs.parts if self.costs else {}
        return {name: costs[name].first_seconds() if name in costs else 0.0 for name in names}

    def _setup_seconds(self, *shape) -> float:
        """model.setup_seconds(*shape), kept until the model records a graph: choose() prices
        every length each step (27 calls a step, ~1% of a lavapipe decode step)."""
        model = self.model
        key = (len(model.store.graphs), len(model.graph_seconds))
        if key != self._setup_key:
            self._setup_key, self._setup_at = key, {}
        seconds = self._setup_at.get(shape)
        if seconds is None:
            seconds = self._setup_at[shape] = model.setup_seconds(*shape)
        return seconds

    def _measure_if_it_pays(self, horizon: int) -> None:
        """Measure the verify curve once `horizon` tokens (DraftController.horizon: as many as
        generated so far) could repay it, as choose() weighs compiles."""
        # a cascade can draft once its cheapest part has proposed
        first = min(self._firsts(self.parts).values()) if self.parts else self._first_seconds
        compile_seconds = sum(self._setup_seconds(n, True) for n in FIRST_ROWS) + first
        if self.control.measuring_pays(horizon, compile_seconds, measuring_passes()):
            t0 = time.perf_counter()
            self.control.measured(self.measure())
            log.info("measured the verify cost of %s-row passes in %.1f s after %d tokens: as many more would repay it",
                     "/".join(map(str, FIRST_ROWS)), time.perf_counter() - t0, horizon)

    def _timed_inject(self, call, what: str) -> float:
        t0 = time.perf_counter()
        self._guard(what, call)
        seconds = time.perf_counter() - t0
        self.stats.inject_seconds += seconds
        return seconds

    def close(self) -> None:
        self.stats.draft_length = self.control.summary()
        self.control.finish()
        if self.costs:
            self.costs.remember_drafts(self.control.drafts.learned())
            for name, part in self.control.parts.items():
                if name in self.costs.parts:
                    self.costs.parts[name].remember_drafts(part.drafts.learned())
        if self.strategy is not None:
            self._guard("close", self.strategy.close)
        self.ctx.close()
