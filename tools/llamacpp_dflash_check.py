"""Does a DFlash draft accept as often in llama.cpp as in vkdflash? Same prompts, same target file.

    python tools/llamacpp_dflash_check.py --server PATH/llama-server [--draft FILE] [--prompts 6] [-n 128]
Starts llama-server with `-md DRAFT --spec-type draft-dflash --spec-draft-n-max K` on the CPU,
sends the first suite prompts as vkdflash's token ids (chat ones through the model's template)
greedily, and reads draft_n / draft_n_accepted from its timings; then runs vkdflash on the same
ids at the same fixed draft length. Prints both acceptances per prompt and in total, and over
the prompts whose greedy texts agree (JSON). Build llama-server for the CPU with GGML_NATIVE=OFF
on a VM: -march=native code can use instructions the hypervisor refuses (SIGILL)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import click

from vkdflash.errors import VkdflashError
from vkdflash.suite import PROMPTS


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait_ready(port: int, proc, seconds: float = 300) -> None:
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit("llama-server did not become ready")


@click.command()
@click.option("--server", required=True, type=click.Path(exists=True, dir_okay=False), help="llama-server binary")
@click.option("--draft", default=None, type=click.Path(exists=True, dir_okay=False),
              help="DFlash GGUF (default: the one shipped for the default model)")
@click.option("--prompts", "n_prompts", default=6, show_default=True, type=click.IntRange(1, len(PROMPTS)))
@click.option("-n", "n_gen", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--port", default=8097, show_default=True, type=click.IntRange(1, 65535))
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
def main(server, draft, n_prompts, n_gen, port, threads):
    from vkdflash.chat import ChatTemplate
    from vkdflash.model import GGUFFile, default_model_path, load_model
    from vkdflash.spec.shipped import shipped_draft
    from vkdflash.suite import prompt_ids
    from vkdflash.tokenizer import Tokenizer
    from vkdflash_dflash.draft_file import read_hparams
    from vkdflash_dflash.strategy import SHIPPED
    target = str(default_model_path())
    mf = load_model(target)
    draft = draft or shipped_draft(SHIPPED, mf)
    with GGUFFile(draft) as f:
        k = read_hparams(f).block_size - 1  # a whole block, as the suite's fixed length
    tok = Tokenizer(mf.metadata)
    template = ChatTemplate.from_metadata(mf.metadata, tok)
    prompts = PROMPTS[:n_prompts]
    # token ids, not text: both engines see the same input whatever their tokenizers do
    ids = [prompt_ids(p, tok, template) for p in prompts]
    proc = subprocess.Popen([server, "-m", target, "-md", draft, "--spec-type", "draft-dflash",
                             "--spec-draft-n-max", str(k), "-c", "2048", "-t", str(threads), "--port", str(port),
                             "-ngl", "0", "--temp", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        theirs = []
        for prompt in ids:
            r = post(port, {"prompt": prompt, "n_predict": n_gen, "temperature": 0.0, "cache_prompt": False,
                            "return_tokens": True})
            t = r["timings"]
            theirs.append((t.get("draft_n", 0), t.get("draft_n_accepted", 0), r.get("tokens", [])))
    finally:
        proc.terminate()
        proc.wait()
    ours = vkdflash_acceptance(mf, tok, ids, draft, k, n_gen)
    # the targets' greedy texts part where their numerics do (llama.cpp's CPU matmuls quantize
    # activations to 8 bits), and from there the drafts are judged on different text: also
    # compare the prompts whose texts agree on their first quarter
    same = [common_prefix(a[2], b[2]) for a, b in zip(theirs, ours)]
    agree = [i for i, n in enumerate(same) if n >= n_gen // 4]
    report = {"draft": draft, "draft_length": k, "n_gen": n_gen,
              "per_prompt": [{"prompt": p.text[:40], "llama_cpp": {"drafted": a[0], "accepted": a[1]},
                              "vkdflash": {"drafted": b[0], "accepted": b[1]}, "same_tokens": n}
                             for p, a, b, n in zip(prompts, theirs, ours, same)],
              **compare(theirs, ours),
              "agreeing_prompts": {"count": len(agree), **compare([theirs[i] for i in agree], [ours[i] for i in agree])}}
    click.echo(json.dumps(report, indent=1))


def compare(theirs: list, ours: list) -> dict:
    rate = lambda runs: sum(r[1] for r in runs) / max(1, sum(r[0] for r in runs))  # noqa: E731
    a, b = rate(theirs), rate(ours)
    return {"llama_cpp_acceptance": a, "vkdflash_acceptance": b, "ratio": a / b if b else None}


def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def vkdflash_acceptance(mf, tok, ids, draft, k, n_gen) -> list:
    """(drafted, accepted, generated ids) per prompt, greedy at draft length k."""
    from vkdflash.generate import Stats, generate
    from vkdflash.model.forward import Model
    from vkdflash.runtime.context import Context
    from vkdflash.sampling import Sampler
    from vkdflash.spec import SpecStats, StrategyOptions
    from vkdflash.spec.engine import Speculator
    from vkdflash_dflash import factory
    model = Model(Context(None), mf, n_ctx=2048)
    out = []
    for prompt in ids:
        stats = SpecStats()
        spec = Speculator(model, "dflash", factory, StrategyOptions(draft_model=draft, draft_max=k), stats)
        run = Stats()
        list(generate(model, tok, prompt, n_gen, Sampler(temp=0.0), (), run, spec))
        spec.close()
        out.append((stats.drafted, stats.accepted, run.tokens))
    model.close()
    return out


if __name__ == "__main__":
    try:
        main()
    except (VkdflashError, OSError, json.JSONDecodeError) as exc:  # a file that is no GGUF, a server that answers badly
        sys.exit(f"llamacpp_dflash_check: error: {exc}")
