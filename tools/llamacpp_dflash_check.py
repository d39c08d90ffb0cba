"""Does a DFlash draft accept as often in llama.cpp as in vkdflash? Same prompts, same target file.

    python tools/llamacpp_dflash_check.py --server PATH/llama-server [--draft FILE] [--prompts 6] [-n 128]
Starts llama-server with `-md DRAFT --spec-type draft-dflash --spec-draft-n-max K` on the CPU,
sends the first suite prompts (chat ones rendered with the model's template, as vkdflash does)
greedily, and reads draft_n / draft_n_accepted from its timings; then runs vkdflash on the same
prompts at the same fixed draft length. Prints both acceptances per prompt and in total (JSON)."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import click


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
@click.option("--draft", default=None, help="DFlash GGUF (default: the one shipped for the default model)")
@click.option("--prompts", "n_prompts", default=6, show_default=True)
@click.option("-n", "n_gen", default=128, show_default=True)
@click.option("--port", default=8097, show_default=True)
@click.option("--threads", default=2, show_default=True)
def main(server, draft, n_prompts, n_gen, port, threads):
    from vkdflash.chat import ChatTemplate
    from vkdflash.model import GGUFFile, default_model_path, load_model
    from vkdflash.spec.shipped import shipped_draft
    from vkdflash.suite import PROMPTS
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
    texts = [template.render([{"role": "user", "content": p.text}]) if p.chat else p.text for p in prompts]
    proc = subprocess.Popen([server, "-m", target, "-md", draft, "--spec-type", "draft-dflash",
                             "--spec-draft-n-max", str(k), "-c", "2048", "-t", str(threads), "--port", str(port),
                             "-ngl", "0", "--temp", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        theirs = []
        for text in texts:
            t = post(port, {"prompt": text, "n_predict": n_gen, "temperature": 0.0, "cache_prompt": False})["timings"]
            theirs.append((t.get("draft_n", 0), t.get("draft_n_accepted", 0)))
    finally:
        proc.terminate()
        proc.wait()
    ours = vkdflash_acceptance(mf, tok, template, prompts, draft, k, n_gen)
    rate = lambda pairs: sum(a for _, a in pairs) / max(1, sum(d for d, _ in pairs))  # noqa: E731
    report = {"draft": draft, "draft_length": k, "n_gen": n_gen,
              "per_prompt": [{"prompt": p.text[:40], "llama_cpp": {"drafted": a[0], "accepted": a[1]},
                              "vkdflash": {"drafted": b[0], "accepted": b[1]}}
                             for p, a, b in zip(prompts, theirs, ours)],
              "llama_cpp_acceptance": rate(theirs), "vkdflash_acceptance": rate(ours)}
    report["ratio"] = report["llama_cpp_acceptance"] / report["vkdflash_acceptance"] if rate(ours) else None
    click.echo(json.dumps(report, indent=1))


def vkdflash_acceptance(mf, tok, template, prompts, draft, k, n_gen) -> list:
    from vkdflash.generate import Stats, generate
    from vkdflash.model.forward import Model
    from vkdflash.runtime.context import Context
    from vkdflash.sampling import Sampler
    from vkdflash.spec import SpecStats, StrategyOptions
    from vkdflash.spec.engine import Speculator
    from vkdflash.suite import prompt_ids
    from vkdflash_dflash import factory
    model = Model(Context(None), mf, n_ctx=2048)
    out = []
    for p in prompts:
        stats = SpecStats()
        spec = Speculator(model, "dflash", factory, StrategyOptions(draft_model=draft, draft_max=k), stats)
        list(generate(model, tok, prompt_ids(p, tok, template), n_gen, Sampler(temp=0.0), (), Stats(), spec))
        spec.close()
        out.append((stats.drafted, stats.accepted))
    model.close()
    return out


if __name__ == "__main__":
    main()
