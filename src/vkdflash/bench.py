"""`vkdflash bench`: figures measured side by side in one run, reported as JSON."""
from __future__ import annotations

import time

import numpy as np

from .errors import VkdflashError
from .kernels.copy import copy
from .kernels.matmul import MatmulConfig, matmul
from .kernels.weights import Weight
from .ref.quants import random_blocks
from .runtime.graph import Graph
from .spec.controller import DraftController
from .spec.curve import ROWS, measure

COPY_SHAPES = [(8, 1), (8, 2), (8, 4), (64, 2), (64, 16), (256, 64)]  # (workgroup, groups)


def gpu_seconds(graph: Graph, reps: int) -> float:
    """Best GPU time of one replay over `reps` replays (timestamps when present, else wall)."""
    best = float("inf")
    graph.run()  # warm-up: first replay pays for pipeline compilation and page faults
    for _ in range(reps):
        t0 = time.perf_counter()
        graph.run()
        wall = time.perf_counter() - t0
        stamps = graph.timings()
        best = min(best, sum(ns for _, ns in stamps) * 1e-9 if stamps else wall)
    return best


def copy_gbps(ctx, nbytes: int, reps: int) -> dict:
    """Plain-copy bandwidth, bytes read + bytes written per second, best over workgroup shapes."""
    src, dst = ctx.buffer(nbytes), ctx.buffer(nbytes)
    src.write(np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8))
    shapes = {}
    for wg, groups in COPY_SHAPES:
        g = Graph(ctx, timestamps=True)
        copy(g, src, dst, nbytes, groups, wg)
        shapes[f"wg{wg}x{groups}"] = 2 * nbytes / gpu_seconds(g, reps) / 1e9
        g.destroy()
    src.destroy(), dst.destroy()
    best = max(shapes, key=shapes.get)
    return {"gbps": shapes[best], "best_shape": best, "bytes": nbytes, "shapes": shapes}


def overheads(ctx, reps: int) -> dict:
    """Wall time of one submit (1 tiny dispatch) and of each extra dispatch in a replayed graph."""
    a, b = ctx.buffer(16), ctx.buffer(16)

    def wall(n: int) -> float:
        g = Graph(ctx)
        for _ in range(n):
            copy(g, a, b, 16)
        g.run()
        best = float("inf")
        for _ in range(max(reps, 10)):
            t0 = time.perf_counter()
            g.run()
            best = min(best, time.perf_counter() - t0)
        g.destroy()
        return best

    one, many = wall(1), wall(201)
    a.destroy(), b.destroy()
    return {"submit_us": one * 1e6, "dispatch_us": (many - one) / 200 * 1e6}


def kernels(ctx, reps: int = 5) -> dict:
    copy_fig = copy_gbps(ctx, 32 << 20, reps)
    matvec = {}
    for t in ("f16", "q8_0", "q4_0"):
        fig = matvec_gbps(ctx, t, 4096, 4096, reps)
        fig["ratio_to_copy"] = fig["gbps"] / copy_fig["gbps"]
        matvec[t] = fig
    return {"device": ctx.features.name, "driver": ctx.features.driver, "copy": copy_fig,
            "matvec_4096x4096": matvec, "overhead": overheads(ctx, reps)}


def model(m, n_prompt: int, n_gen: int) -> dict:
    """Prefill n_prompt tokens, then decode n_gen tokens greedily; wall-clock tok/s of each."""
    vocab = m.hp.n_vocab
    prompt = np.random.default_rng(0).integers(0, vocab, n_prompt).tolist()
    m.reset()
    m.forward(prompt, greedy=True)  # warm-up: records and compiles the graphs both phases use
    m.forward(prompt[:1], greedy=True)
    m.reset()
    t0 = time.perf_counter()
    token = int(m.forward(prompt, greedy=True).ids[-1])
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_gen):
        token = int(m.forward([token], greedy=True).ids[-1])
    decode = time.perf_counter() - t0
    return {"device": m.ctx.features.name, "model": m.hp.arch, "weights": m.weight_types(),
            "cache": m.cache.describe(), "n_prompt": n_prompt, "n_gen": n_gen,
            "prefill_tps": n_prompt / prefill, "decode_tps": n_gen / decode}


def family(label: str) -> str:
    """A dispatch label's kernel family: 'mul_mat/q4_1' -> 'mul_mat', 'set_rows.q8_0.rot64' -> 'set_rows'."""
    return label.replace(".", "/").split("/")[0]


def profile(m, rows=(1, 16), context: int = 64, reps: int = 3) -> dict:
    """GPU time per kernel family (and per label) of one greedy decode step and of an n-row pass
    (every row's logits and argmax, as a greedy verify), at a context of `context` tokens
    (timestamps; empty where the device has none)."""
    vocab = m.hp.n_vocab
    tokens = np.random.default_rng(1).integers(0, vocab, context + max(rows)).tolist()
    out = {"context": context, "reps": reps, "passes": {}}
    for n in rows:
        m.reset()
        m.forward(tokens[:context])
        timings = m.profile(tokens[context:context + n], all_logits=n > 1, greedy=True, reps=reps)
        total = sum(ns for _, ns in timings) or 1.0
        by_family, by_label = {}, {}
        for label, ns in timings:
            for table, key in ((by_family, family(label)), (by_label, label)):
                entry = table.setdefault(key, {"ms": 0.0, "dispatches": 0})
                entry["ms"] += ns * 1e-6
                entry["dispatches"] += 1
        for table in (by_family, by_label):
            for entry in table.values():
                entry["share"] = entry["ms"] * 1e6 / total
        out["passes"][str(n)] = {"rows": n, "gpu_ms": total * 1e-6, "dispatches": len(timings),
                                 "families": dict(sorted(by_family.items(), key=lambda kv: -kv[1]["ms"])),
                                 "labels": dict(sorted(by_label.items(), key=lambda kv: -kv[1]["ms"]))}
    m.reset()
    return out


def verify_curve(m, rows=ROWS, context: int = 64, reps: int = 5) -> dict:
    """Wall time of an n-row forward with every row's logits (what a verify pass costs) relative
    to n = 1, best of `reps` after a warm-up, each at the same context position."""
    seconds = measure(m, rows, context, reps)
    return {"context": context, "reps": reps, "seconds": {str(n): s for n, s in seconds.items()},
            "relative": {str(n): s / seconds[rows[0]] for n, s in seconds.items()}}


class Sweep(DraftController):
    """Asks for 1, 2, .., k_max drafts in turn: a warm-up that compiles every length's kernels."""

    def choose(self, room: int, setup=None, done=None, firsts=None, in_hand=None) -> int:
        k = min(len(self.chosen) % self.k_max + 1, room, self.k_max if in_hand is None else in_hand)
        self.chosen.append(k)
        return k  # a cascade's parts sweep too (no `lengths`)


SPEC_PROMPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
               "def factorial(n):\n")


def spec(m, tokenizer, prompt: str | None, n_gen: int, make_speculator, reps: int = 1, temp: float = 0.0,
         seed: int = 0) -> dict:
    """Generation without and with speculation, side by side; greedy outputs must be identical
    (at temp > 0 each pair samples with seed + its index, and speculative sampling keeps only
    the distribution, so the texts are not compared). With reps > 1 the two alternate `reps`
    times and the figures are medians: a shared VM's speed drifts by 10% between runs seconds
    apart, which one pair of runs reports as a speedup."""
    from .generate import Stats, generate
    from .sampling import Sampler
    from .spec import SpecStats
    ids = tokenizer.encode(prompt or SPEC_PROMPT, add_special=True, parse_special=True)
    if len(ids) >= m.cache.n_ctx:  # generate's words: the warm-up's passes would say "context full"
        raise VkdflashError(f"the prompt is {len(ids)} tokens, the context only {m.cache.n_ctx}: raise -c")
    greedy = temp <= 0

    def run(label: str, pair: int = 0) -> dict:
        stats, spec_stats = Stats(), SpecStats()
        speculator = make_speculator(spec_stats) if label != "none" else None
        if label == "warmup":
            # every length's kernels compiled, the target's and the strategy's, as in a server that
            # has run a while: the measured runs are the steady state (a short cold run's compiles
            # are the controller's to weigh); the curve it learns is cached for the measured runs
            k_max = speculator.control.k_max  # --draft-max, or the strategy's longest draft below it
            for n in range(1, min(k_max, m.cache.n_ctx - len(ids)) + 2):
                m.reset()
                m.forward([ids[0]] * n, all_logits=n > 1, capture=speculator.capture, greedy=greedy)
            m.reset()
            persist = getattr(speculator.control, "persist", None)
            costs = speculator.control.costs
            speculator.control = Sweep(k_max, costs.prior, persist=persist, width=costs.width)
        for _ in generate(m, tokenizer, ids, n_gen, Sampler(temp=temp, seed=seed + pair), (), stats, speculator):
            pass
        if speculator is not None:
            speculator.close()
        # decode speed after the prompt (both runs prefill the same prompt the same way)
        return {"tokens": stats.tokens, "decode_tps": stats.decode_tps,
                "stats": spec_stats.as_dict() if speculator is not None else None}

    run("warmup")
    # then once as measured, not counted: kernels only the controller's own choices reach (the
    # shipped DFlash draft writes held positions in passes of whatever width has piled up) compile
    # here, not in the first measured pair (it ran at 0.56-0.82x where the others ran at ~0.95x)
    run("spec")
    pairs = [(run("none", i), run("spec", i)) for i in range(reps)]
    if not pairs[0][0]["decode_tps"]:
        raise VkdflashError(f"the prompt's continuation stops after {len(pairs[0][0]['tokens'])} token(s), "
                            "so there is no decoding to compare: give a prompt that runs on")
    speedups = [sp["decode_tps"] / none["decode_tps"] for none, sp in pairs]
    middle = pairs[int(np.argsort(speedups)[len(speedups) // 2])]  # the median pair's own figures
    return {"device": m.ctx.features.name, "model": m.hp.arch, "n_gen": n_gen, "prompt_tokens": len(ids),
            "reps": reps, "temp": temp, "none_tps": float(np.median([none["decode_tps"] for none, _ in pairs])),
            "spec_tps": float(np.median([sp["decode_tps"] for _, sp in pairs])),
            "speedup": float(np.median(speedups)), "speedups": speedups,
            "identical_output": all(none["tokens"] == sp["tokens"] for none, sp in pairs) if greedy else None,
            "spec": middle[1]["stats"]}


def matvec_gbps(ctx, type_name: str, rows: int = 4096, cols: int = 4096, reps: int = 5,
                config: MatmulConfig | None = None) -> dict:
    """Weight bytes read per second by an n=1 matmul (best GPU time over `reps` replays)."""
    r = np.random.default_rng(0)
    w = Weight(ctx, type_name, rows, cols, random_blocks(r, type_name, rows, cols))
    x = ctx.upload(r.uniform(-1, 1, cols).astype(np.float32))
    y = ctx.buffer(rows * 4)
    g = Graph(ctx, timestamps=True)
    matmul(g, w, x, y, 1, config)
    # best of 3 x reps replays: as many tries as the copy figure gets over its shapes, so a
    # busy host skews both alike
    seconds = min(gpu_seconds(g, reps) for _ in range(3))
    g.destroy(), w.destroy(), x.destroy(), y.destroy()
    return {"gbps": w.nbytes / seconds / 1e9, "seconds": seconds, "bytes": w.nbytes,
            "rows": rows, "cols": cols, "type": type_name}
