"""The watchdog: one warning when live first-draft acceptance falls far below what the draft
recorded on its suite, naming the likely causes: the symptom of llama.cpp issue 25725 (a quantized
draft cache written without rotation), whose reporter had to find the cause by bisecting."""
from __future__ import annotations

import logging

from ..kernels.types import get_type
from ..kv_cache import rotation_disabled_by_env

log = logging.getLogger("vkdflash")
WATCH_STEPS = 24    # verify steps with drafts before the watchdog judges acceptance
# live a_1 below this share of the draft's recorded a_1 is "far below": the bug it exists for
# (unrotated injection) falls below 0.2x, while single suite prompts, walked in torch with the
# shipped files, fall below 0.5x of their suite's mean on 4 of 24 (both drafts) and 0.25x on none
WATCH_RATIO = 0.25


class Watchdog:
    def __init__(self):
        self.warned = False  # once a speculator's life, judged over its stats'

    def watch(self, expected: float | None, stats, ctx, part: str = "") -> None:
        """After a step: warn once where the live a_1 is far below `expected` (the record's a_1);
        in a cascade, the a_1 of the `part` whose record it is (a copy's misses are not the draft's)."""
        steps, first = (stats.steps, stats.per_position[0] if stats.per_position else 0) if not part \
            else (lambda c: (c[0], c[3]))(stats.by_source.get(part, [0, 0, 0, 0]))
        if self.warned or not expected or steps < WATCH_STEPS:
            return
        live = first / steps
        if live < WATCH_RATIO * expected:
            self.warned = True
            log.warning("%s: first-draft acceptance %.2f after %d steps is far below the %.2f this draft measured "
                        "on its suite; %s", part or stats.strategy, live, steps, expected, suspects(ctx))

    def short_of_record(self, acceptance, ctx) -> str:
        """For a strategy switched off after its first drafts contradicted the draft's record (the
        controller dropped it, often before the watchdog has steps enough to judge): the causes."""
        if self.warned or not acceptance.disowned:
            return ""
        return f"; its record's a_1 is {acceptance.expected:.2f}: {suspects(ctx)}"


def suspects(ctx) -> str:
    """The causes that apply: what differs from how a draft's record is measured (f16 draft
    caches, greedy); the prompts can always be unlike the training data."""
    o, temp = ctx.options, ctx.temperature
    rotated = o.rotate and not rotation_disabled_by_env()
    caches = f"K {o.cache_type_k}, V {o.cache_type_v}, KV rotation {'on' if rotated else 'OFF'}"
    causes = []
    if any(get_type(t).quantized for t in (o.cache_type_k, o.cache_type_v)):
        causes.append(f"the quantized draft cache ({caches})")
    if temp > 0:
        causes.append(f"sampling at T {temp:.2g} (the record is greedy)")
    if not causes:
        return (f"likely cause: prompts unlike its training data (draft cache {caches}, greedy: as the "
                "record was measured)")
    return f"likely causes: {', '.join(causes)}, or prompts unlike its training data"
