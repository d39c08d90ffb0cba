"""Text generation: prompt -> prefill -> sample / decode loop, streamed, with timing stats."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from .sampling import Sampler, StopMatcher
from .tokenizer import StreamDecoder

log = logging.getLogger("vkdflash")


@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    stop_reason: str = ""
    tokens: list = field(default_factory=list)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first generated token comes from the prompt's logits; decode steps are the rest
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0

    def line(self) -> str:
        return (f"prompt {self.prompt_tokens} tok at {self.prompt_tps:.1f} tok/s, generated "
                f"{self.generated_tokens} tok at {self.decode_tps:.2f} tok/s ({self.stop_reason})")

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "prompt_tps": self.prompt_tps,
                "generated_tokens": self.generated_tokens, "decode_tps": self.decode_tps,
                "stop_reason": self.stop_reason}


def plain_tokens(model, prompt_ids: list[int], sampler, stats: Stats):
    """Yield sampled token ids one decode step at a time (no speculation)."""
    model.reset()
    t0 = time.perf_counter()
    out = model.forward(prompt_ids, greedy=sampler.greedy, prompt=True)
    stats.prompt_tokens, stats.prompt_seconds = len(prompt_ids), time.perf_counter() - t0
    while True:
        token = int(out.ids[-1]) if sampler.greedy else sampler.sample(out.logits[-1])
        yield token
        if model.cache.n_past >= model.cache.n_ctx:
            return
        out = model.forward([token], greedy=sampler.greedy)


def generate(model, tokenizer, prompt_ids: list[int], n_predict: int, sampler: Sampler,
             stops=(), stats: Stats | None = None, speculator=None):
    """Yield text pieces (never broken UTF-8) until EOS/EOG, a stop string, n_predict tokens or a
    full context. The model's cache is reset first; `stats` is filled in as the run goes.
    With a speculator (spec.engine.Speculator) tokens come from draft-and-verify steps."""
    stats = stats if stats is not None else Stats()
    decoder, matcher = StreamDecoder(tokenizer), StopMatcher(stops)
    source = (speculator.tokens(prompt_ids, sampler, n_predict, stats) if speculator is not None
              else plain_tokens(model, prompt_ids, sampler, stats))
    stats.stop_reason = "context full" if n_predict > 0 else "length"
    t0 = None
    for token in source if n_predict > 0 else ():
        if t0 is None:
            t0 = time.perf_counter()  # decode time starts once the prompt is done
        if tokenizer.is_eog(token):
            stats.stop_reason = "eos"
            break
        stats.generated_tokens += 1
        stats.tokens.append(token)
        text = matcher.feed(decoder.push(token))
        if text:
            yield text
        if matcher.stopped:
            stats.stop_reason = f"stop string {matcher.matched!r}"
            break
        if stats.generated_tokens >= n_predict:
            stats.stop_reason = "length"
            break
    source.close()
    stats.decode_seconds = time.perf_counter() - t0 if t0 is not None else 0.0
    tail = matcher.feed(decoder.flush()) + matcher.flush()
    if tail:
        yield tail
