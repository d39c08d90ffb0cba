#!/usr/bin/env python3
"""Many short requests through one Speculator, as a server would send them: the acceptance
suite's prompts in turn, greedy, the cost-aware draft length, the cached verify curve. Prints one
JSON line: wall seconds, tokens drafted and accepted, and per request its seconds and drafts.
Run it once per strategy (and `none`) in separate processes, alternated, on an idle machine.

    python tools/bench_serve.py mtp 24 64      # STRATEGY REQUESTS TOKENS_EACH
"""
from __future__ import annotations

import json
import sys
import time

from vkdflash.chat import ChatTemplate
from vkdflash.cli_options import open_model
from vkdflash.cli_spec import SpecRequest, build_speculator
from vkdflash.generate import Stats, generate
from vkdflash.sampling import Sampler
from vkdflash.spec import SpecStats
from vkdflash.suite import PROMPTS, prompt_ids


def main(name: str, requests: int, n_gen: int) -> dict:
    with open_model(None, 4096, "f16", "f16", False, None) as (model, tok):
        template = ChatTemplate.from_metadata(model.mf.metadata, tok)
        req = SpecRequest(spec=name, draft_model=None, draft_max=16, draft_p_min=0.0, ctkd="f16", ctvd="f16",
                          spec_opts=())
        stats = SpecStats()
        spec = build_speculator(model, req, req.resolve(), True, stats, lazy_curve=True)
        per, t0 = [], time.perf_counter()
        for i in range(requests):
            ids = prompt_ids(PROMPTS[i % len(PROMPTS)], tok, template)
            drafted, t = stats.drafted, time.perf_counter()
            for _ in generate(model, tok, ids, n_gen, Sampler(temp=0.0), (), Stats(), spec):
                pass
            per.append([round(time.perf_counter() - t, 2), stats.drafted - drafted])
        wall = time.perf_counter() - t0
        if spec is not None:
            spec.close()
    return {"strategy": name, "requests": requests, "tokens_each": n_gen, "wall_seconds": round(wall, 2),
            "drafted": stats.drafted, "accepted": stats.accepted, "per_request": per}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
