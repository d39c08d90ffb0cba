"""Edges where speculative generation could part from plain decoding: the verifier's randomness."""
from __future__ import annotations

import numpy as np

import test_spec
from test_spec import PROMPT
from vkdflash.generate import Stats, generate
from vkdflash.sampling import Sampler
from vkdflash.spec import Proposal, SpecStats, Strategy, StrategyOptions
from vkdflash.spec.engine import Speculator

target = test_spec.target  # the tiny target model


class SeededDrafter(Strategy):
    """Samples its drafts as the shipped DFlash strategy does: a generator seeded with ctx.seed."""

    def __init__(self):
        self.uniforms = []

    def begin(self, ctx):
        self.rng = np.random.default_rng(ctx.seed)

    def propose(self, ctx, last_token, max_n):
        n_vocab = ctx.target.n_vocab
        u = [self.rng.random() for _ in range(max_n)]
        self.uniforms += u
        return Proposal([int(x * n_vocab) for x in u], np.full((max_n, n_vocab), 1.0 / n_vocab))


class Recording(np.random.Generator):
    def __init__(self, seed):
        super().__init__(np.random.PCG64(seed))
        self.uniforms = []

    def random(self, *args, **kwargs):
        u = super().random(*args, **kwargs)
        self.uniforms.append(u)
        return u


def test_a_seeded_strategys_draws_are_not_the_verifiers_coins(target):
    """Seeded alike, the two generators were one stream: the coin that accepted draft i had drawn
    draft i + 1, which skewed sampled output away from plain sampling's distribution."""
    model, tok = target
    drafter = SeededDrafter()
    speculator = Speculator(model, "seeded", lambda ctx: drafter, StrategyOptions(draft_max=3), SpecStats())
    sampler = Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    sampler.rng = Recording(7)
    list(generate(model, tok, PROMPT, 12, sampler, (), Stats(), speculator))
    speculator.close()
    assert len(drafter.uniforms) > 3 and len(sampler.rng.uniforms) > 3
    assert not set(drafter.uniforms) & set(sampler.rng.uniforms)
