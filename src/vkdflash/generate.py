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


def generate(model, tokenizer, prompt_ids: list[int], n_predict: int, sampler: Sampler,
             stops=(), stats: Stats | None = None):
    """Yield text pieces (never broken UTF-8) until EOS/EOG, a stop string or n_predict tokens.

    The model's cache is reset first; `stats` (if given) is filled in as the run goes."""
    stats = stats if stats is not None else Stats()
    model.reset()
    decoder, matcher = StreamDecoder(tokenizer), StopMatcher(stops)
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids).logits[-1]
    stats.prompt_tokens, stats.prompt_seconds = len(prompt_ids), time.perf_counter() - t0
    t0 = time.perf_counter()
    stats.stop_reason = "length"
    while stats.generated_tokens < n_predict:
        token = sampler.sample(logits)
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
            break
        if model.cache.n_past >= model.cache.n_ctx:
            stats.stop_reason = "context full"
            break
        logits = model.forward([token]).logits[-1]
    stats.decode_seconds = time.perf_counter() - t0
    tail = matcher.feed(decoder.flush()) + matcher.flush()
    if tail:
        yield tail
