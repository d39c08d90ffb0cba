#!/usr/bin/env python3
"""The draft-length controller's choices for ngram, priced without the machine's noise.

`bench spec` times real passes, and on a shared 2-core VM a pass of 8 rows takes 70 ms for a
while and 100-125 ms the next (docs/design.md section 13), so pairs of runs of one commit range
2.0-4.1x on the record's repeating code. ngram needs no model to propose, and greedy decoding
commits the target's own text whatever is drafted, so a run can be replayed exactly: the target's
greedy continuation is generated once, every pass costs its width's best measured time (the
verify curve, best of several rounds), and the real DraftController chooses each step's k from
those costs and what ngram's drafts get accepted. Beside it: --draft-fixed (always k_max) and a
clairvoyant bound (the best k for each step, knowing the text ahead), each as a speedup over
plain decoding priced the same way. A step's cost outside the pass is left out of all of them
(the controller and bookkeeping take ~0.3 ms; under cProfile plain `generate` spent 98% of its time in
the passes).

    python tools/replay_ngram.py [--draft-max 16] [-n 128] [--prior cold|cached] [--json FILE]

--prior: the curve the controller starts from. cold (the default): what a first run measures (1, 2
and 4 rows, here at their best); cached: the curve this machine's runs cached for the model, as
`bench spec` and `generate` start from it (widths a run added in a slow spell included).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import REPEATING_CODE  # noqa: E402
from vkdflash_ngram import PromptLookup  # noqa: E402

from vkdflash.cli_options import open_model  # noqa: E402
from vkdflash.errors import VkdflashError  # noqa: E402
from vkdflash.spec.controller import DraftController  # noqa: E402
from vkdflash.measured import measured_file  # noqa: E402
from vkdflash.spec.curve import cached_costs, measure  # noqa: E402

PROMPTS = {"repeating code": REPEATING_CODE, "is_prime": "def is_prime(n):",
           "json loader": "import json\n\ndef load_config(path):",
           "story": "Once upon a time, a little fox lived in the forest. One day the fox"}
COLD_ROWS = (1, 2, 4)  # what a first run measures (curve.FIRST_ROWS): the controller learns the rest live


def greedy_text(model, tok, prompt: str, n_gen: int) -> tuple[list, list]:
    """The prompt's ids and the target's greedy continuation (n_gen tokens)."""
    ids = tok.encode(prompt)
    model.reset()
    gen = [int(model.forward(ids, greedy=True, prompt=True).ids[-1])]
    while len(gen) < n_gen:
        gen.append(int(model.forward([gen[-1]], greedy=True).ids[-1]))
    model.reset()
    return ids, gen


def best_curve(model, widths, rounds: int = 4) -> dict[int, float]:
    """Best seconds of a pass per width over `rounds` measurements (each itself a best of 2)."""
    measure(model, rows=widths, reps=1)  # compiles
    best = {n: float("inf") for n in widths}
    for _ in range(rounds):
        best = {n: min(best[n], s) for n, s in measure(model, rows=widths, reps=2, context=128).items()}
    return best


class Replay:
    """One text's steps: what ngram proposes asked for k at a position, and what is accepted."""

    def __init__(self, prompt: list, gen: list, cost):
        self.prompt, self.gen, self.cost = prompt, gen, cost
        self.lookup = PromptLookup(SimpleNamespace(options=SimpleNamespace(settings={})))

    def draft(self, i: int, k: int) -> list:
        """What ngram proposes asked for k drafts with gen[:i] committed (gen[i - 1] the last)."""
        if not k:
            return []
        return self.lookup.propose(SimpleNamespace(tokens=self.prompt + self.gen[:i - 1]), self.gen[i - 1], k).tokens

    def accepted(self, i: int, draft: list) -> int:
        accepted = next((j for j, (a, b) in enumerate(zip(draft, self.gen[i:])) if a != b), len(draft))
        return min(accepted, len(self.gen) - i - 1)

    def step(self, i: int, k: int) -> tuple[int, int]:
        """(drafted, accepted) asking for k drafts at i."""
        draft = self.draft(i, k)
        return len(draft), self.accepted(i, draft)

    def controlled(self, control: DraftController) -> tuple[float, list]:
        """Seconds and steps (k asked / drafted / accepted) with the controller choosing k, the
        longest draft in hand as the engine asks a free strategy (Strategy.free_proposals)."""
        i, seconds, steps = 1, 0.0, []
        while i < len(self.gen):
            room = len(self.gen) - i
            held = self.draft(i, min(control.k_max, room))
            k = control.choose(room, None, i, None, len(held))
            drafted, accepted = len(held[:k]), self.accepted(i, held[:k])
            cost = self.cost(drafted + 1)
            control.update(k, drafted, accepted, cost, 0.0 if k else None)
            control.committed(self.gen[i:i + accepted + 1])
            seconds, i = seconds + cost, i + accepted + 1
            steps.append(f"{k}/{drafted}/{accepted}")
        return seconds, steps

    def clairvoyant(self, k_max: int) -> float:
        """The least seconds any choice of k per step could take (knowing the text ahead)."""
        n = len(self.gen)
        best = {n: 0.0}
        for i in range(n - 1, 0, -1):
            best[i] = min(self.cost(d + 1) + best[min(i + a + 1, n)]
                          for d, a in (self.step(i, k) for k in range(min(k_max, n - i - 1) + 1)))
        return best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--prior", choices=("cold", "cached"), default="cold")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not 1 <= args.draft_max <= 32 or args.n_gen < 2:
        ap.error("--draft-max must be 1..32 and -n at least 2")
    with open_model(None, 4096, "f16", "f16", False, None) as (model, tok):
        cached = cached_costs(model) if args.prior == "cached" else None
        if args.prior == "cached" and cached is None:
            raise VkdflashError(f"--prior cached: {measured_file()} holds no verify curve for this model and "
                                "device (a `vkdflash bench spec` run caches one)")
        widths = sorted({model.pass_width(n) for n in range(1, args.draft_max + 2)})
        curve = best_curve(model, widths)
        texts = {name: greedy_text(model, tok, p, args.n_gen) for name, p in PROMPTS.items()}
        width, device = model.pass_width, model.ctx.features.name
        guesses = {n: model.pass_cost_guess(n) for n in range(1, args.draft_max + 2)}
    cost = lambda rows: curve[width(rows)]  # noqa: E731
    prior = cached or {n: curve[n] for n in COLD_ROWS}
    out = {"device": device, "draft_max": args.draft_max, "n_gen": args.n_gen,
           "curve": {str(n): s for n, s in curve.items()}, "prior": {str(n): s for n, s in prior.items()},
           "prompts": {}}
    for name, (prompt, gen) in texts.items():
        replay, plain = Replay(prompt, gen, cost), (len(gen) - 1) * curve[1]
        figures = {}
        for mode in ("cost-aware", "fixed"):
            # the rest of the widths the controller times itself
            control = DraftController(args.draft_max, prior, fixed=mode == "fixed", width=width, guess=guesses.get)
            seconds, steps = replay.controlled(control)
            figures[mode] = {"speedup": plain / seconds, "steps": len(steps), "trace": " ".join(steps)}
        figures["clairvoyant"] = {"speedup": plain / replay.clairvoyant(args.draft_max)}
        out["prompts"][name] = figures
        print(f"{name:15s} " + "  ".join(f"{m} {f['speedup']:.2f}x" for m, f in figures.items()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError) as exc:
        sys.exit(f"replay_ngram: error: {exc}")
