"""Counts per mutation kind and outcome, failures grouped by signature with one reproducing case each."""
from __future__ import annotations

from collections import Counter, defaultdict

OUTCOMES = ["accepted", "refused", "usage", "crash", "hang", "memory", "long_message", "multi_line", "harness_error"]
FAILURES = frozenset(OUTCOMES[3:])


def counts(results: list[dict], by: str = "kind") -> dict[str, dict[str, int]]:
    table = defaultdict(Counter)
    for r in results:
        table[r[by]][r["outcome"]] += 1
    return {name: dict(c) for name, c in sorted(table.items())}


def failure_groups(results: list[dict]) -> list[dict]:
    """One entry per (outcome, signature): how many, under which kinds, and the first case."""
    groups: dict[tuple, dict] = {}
    for r in results:
        if r["outcome"] not in FAILURES:
            continue
        g = groups.setdefault((r["outcome"], r.get("signature", "")), {
            "outcome": r["outcome"], "signature": r.get("signature", ""), "count": 0, "kinds": Counter(),
            "example": {k: r.get(k) for k in ("index", "kind", "target", "chat", "mutation", "detail")}})
        g["count"] += 1
        g["kinds"][r["kind"]] += 1
    return sorted(({**g, "kinds": dict(g["kinds"])} for g in groups.values()), key=lambda g: -g["count"])


def summary(results: list[dict], seconds: float, replay: str) -> dict:
    """replay: the options that select the same cases (seed, kinds, targets)."""
    return {"replay": replay, "cases": len(results), "seconds": round(seconds, 1),
            "cases_per_second": round(len(results) / max(seconds, 1e-9), 2),
            "failures": sum(r["outcome"] in FAILURES for r in results), "counts": counts(results),
            "counts_by_target": counts(results, "target"),
            "failure_groups": failure_groups(results),
            "failed_cases": [r for r in results if r["outcome"] in FAILURES]}


def text(s: dict) -> str:
    table = s["counts"]
    shown = [o for o in OUTCOMES if any(o in row for row in table.values())]
    width = max([len(k) for k in table] + [5])
    lines = [f"{'kind':<{width}} " + " ".join(f"{o:>{max(len(o), 6)}}" for o in shown) + f" {'total':>6}"]
    total = Counter()
    for kind, row in table.items():
        total.update(row)
        lines.append(f"{kind:<{width}} " + " ".join(f"{row.get(o, 0):>{max(len(o), 6)}}" for o in shown)
                     + f" {sum(row.values()):>6}")
    lines.append(f"{'total':<{width}} " + " ".join(f"{total.get(o, 0):>{max(len(o), 6)}}" for o in shown)
                 + f" {sum(total.values()):>6}")
    lines.append(f"{s['cases']} cases in {s['seconds']} s ({s['cases_per_second']} cases/s): {s['failures']} failures")
    for g in s["failure_groups"]:
        ex = g["example"]
        lines.append(f"  {g['outcome']} x{g['count']} {g['signature']}  [{', '.join(sorted(g['kinds']))}]")
        lines.append(f"    e.g. {s['replay']} --only-index {ex['index']} ({ex['kind']} on {ex['target']}"
                     f"{', --chat' if ex['chat'] else ''}): {ex.get('mutation') or '-'}")
        lines.append(f"    {ex['detail']}")
    return "\n".join(lines)
