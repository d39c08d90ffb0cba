"""Speculation statistics with llama.cpp / vLLM definitions (docs/design.md section 6)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    strategy: str = "none"
    draft_max: int = 0
    steps: int = 0              # verify passes that checked at least one draft
    drafted: int = 0
    accepted: int = 0
    per_position: list = field(default_factory=list)  # steps where draft position j was accepted
    verify_seconds: float = 0.0
    draft_seconds: float = 0.0
    inject_seconds: float = 0.0
    disabled: str = ""          # why the strategy is off: for good, or in the latest request (engine._disable)
    draft_length: dict = field(default_factory=dict)  # DraftController.summary(): mean k chosen, and why
    by_source: dict = field(default_factory=dict)  # a cascade's part -> [steps, drafted, accepted, first accepted]

    def record(self, n_drafted: int, n_accepted: int, source: str = "") -> None:
        if n_drafted == 0:
            return
        if source:
            counts = self.by_source.setdefault(source, [0, 0, 0, 0])
            for i, add in enumerate((1, n_drafted, n_accepted, n_accepted > 0)):
                counts[i] += add
        self.steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        while len(self.per_position) < n_drafted:
            self.per_position.append(0)
        for j in range(n_accepted):
            self.per_position[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean accepted length: 1 + accepted / verify steps."""
        return 1.0 + self.accepted / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "draft_max": self.draft_max, "verify_steps": self.steps,
                "drafted": self.drafted, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
                "tau": self.tau,
                "per_position_acceptance": [a / self.steps if self.steps else 0.0 for a in self.per_position],
                "seconds": {"verify": self.verify_seconds, "draft": self.draft_seconds, "inject": self.inject_seconds},
                "disabled": self.disabled or None, "draft_length": self.draft_length or None,
                "by_source": {name: {"verify_steps": st, "drafted": d, "accepted": a, "tau": 1.0 + a / st}
                              for name, (st, d, a, _) in self.by_source.items()} or None}

    def line(self) -> str:
        text = f"spec {self.strategy} (draft max {self.draft_max}): drafted {self.drafted}, "
        if self.steps:  # with nothing drafted, "accepted 0 (0.0%)" would read as a draft that is always wrong
            per_pos = " ".join(f"{a / self.steps:.2f}" for a in self.per_position[:8])
            text += (f"accepted {self.accepted} ({100 * self.acceptance_rate:.1f}%), tau {self.tau:.2f}, per position "
                     f"[{per_pos}{' ...' if len(self.per_position) > 8 else ''}], ")
        else:
            text += "so no acceptance to report, "
        if self.by_source:
            text += "by part " + ", ".join(f"{name} {st} steps tau {1 + a / st:.2f}"
                                           for name, (st, _, a, _) in self.by_source.items()) + ", "
        text += (f"time verify {self.verify_seconds:.2f}s draft {self.draft_seconds:.2f}s "
                 f"inject {self.inject_seconds:.2f}s")
        d = self.draft_length
        if d:
            text += f"; draft length {d['mode']}: mean k {d['mean_k']:.1f}"
            if self.drafted and d.get("steps"):  # a strategy may propose fewer than k (ngram finding no match)
                text += f" asked, {self.drafted / d['steps']:.1f} drafted a step"
            if d.get("unmeasured"):
                text += f", verify cost unmeasured: {d['unmeasured']}"
            if d.get("expected_tps") is not None:
                text += f", expected {d['expected_tps']:.1f} tok/s vs {d['plain_tps']:.1f} plain"
            if d.get("held_for_setup"):
                text += (f", {d['held_for_setup']} steps drafted less than the rate asked: the kernels of a "
                         "longer verify (or of the strategy's first proposal) would take longer to compile than "
                         "as many tokens as were generated would save")
            shadow = d.get("shadow") or (0, 0)
            if shadow[0]:
                text += f"; {shadow[0]} drafts proposed unverified, {shadow[1]} matched what decoding then chose"
            if not self.drafted and d["mode"] == "cost-aware":
                text += " (--draft-fixed drafts whatever it costs)"
        return text + (f"; switched off: {self.disabled}" if self.disabled else "")
