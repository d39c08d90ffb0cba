"""The `draft` strategy (a separate small model drafts token by token), built only on the public
API: greedy output identical to --spec none for every draft cache type and draft length, the
target drafting for itself accepted in full, and a draft with another vocabulary refused."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from gguf_fixtures import vocab, write_model
from vkdflash.cli import main

PROMPT = "hello world, hello world"


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    common = dict(n_embd=128, n_ff=256, n_head=2, n_head_kv=1, head_dim=64)
    tokens = vocab()[0]
    return {"target": str(write_model(d / "t.gguf", "llama", seed=21, **common)),
            "small": str(write_model(d / "s.gguf", "qwen2", n_layer=1, seed=4, **common)),
            "other_vocab": str(write_model(d / "o.gguf", "llama", seed=4, **common, metadata={
                "tokenizer.ggml.tokens": ([t + "x" if i == 100 else t for i, t in enumerate(tokens)],
                                          VT.ARRAY, VT.STRING)}))}


def generate(files, *extra):
    res = CliRunner().invoke(main, ["generate", "-m", files["target"], PROMPT, "-n", "20", "--temp", "0",
                                    "-c", "96", *extra])
    assert res.exit_code == 0, res.output
    return res


def acceptance(res) -> tuple[int, int]:
    m = re.search(r"drafted (\d+), accepted (\d+)", res.output)
    assert m and "switched off" not in res.output, res.output
    return int(m.group(1)), int(m.group(2))


def test_the_target_drafting_for_itself_is_accepted_in_full(files):
    plain = generate(files)
    # --draft-fixed: a prompt runs in compiled widths, so the verify's kernels are a compile this
    # short run would not repay
    res = generate(files, "--spec", "draft", "-md", files["target"], "--draft-max", "4", "--draft-fixed")
    assert res.stdout == plain.stdout
    drafted, accepted = acceptance(res)
    assert drafted > 0 and accepted == drafted


@pytest.mark.parametrize("ctkd", ["f16", "q8_0", "q4_0", "iq4_nl"])
@pytest.mark.parametrize("draft_max", [1, 3, 8])
def test_a_small_draft_gives_the_same_greedy_output(files, ctkd, draft_max):
    plain = generate(files)
    # --draft-fixed: this 20-token run would not repay compiling the longer verify's kernels
    res = generate(files, "-md", files["small"], "--draft-max", str(draft_max), "-ctkd", ctkd, "-ctvd", ctkd,
                   "--draft-fixed")
    assert res.stdout == plain.stdout
    assert "spec draft" in res.output  # a plain dense -md model is claimed by the draft plugin
    assert acceptance(res)[0] > 0


def test_a_draft_with_another_vocabulary_is_a_one_line_error(files):
    res = CliRunner().invoke(main, ["generate", "-m", files["target"], PROMPT, "-n", "4", "--spec", "draft",
                                    "-md", files["other_vocab"]])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and "another vocabulary" in lines[-1] and lines[-1].startswith("vkdflash: error:")


def test_draft_needs_a_file():
    res = CliRunner().invoke(main, ["generate", "-m", "nosuch.gguf", "x", "--spec", "draft"])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_tokens_committed_while_idle_are_fed_before_the_next_proposal(ctx0, files, monkeypatch):
    """Until its first proposal the draft feeds nothing (a run left plain pays no draft pass a
    step); then it catches up in one pass and proposes what it would have, fed token by token
    (batch invariance: the same rows)."""
    import vkdflash_draft
    from vkdflash.model import load_model
    from vkdflash.model.forward import Model
    from vkdflash.spec import StrategyContext, StrategyOptions
    from vkdflash.spec.engine import target_view
    model = Model(ctx0, load_model(files["target"]), n_ctx=96)
    proposals = []
    for hold in (0, vkdflash_draft.IDLE_HOLD):
        monkeypatch.setattr(vkdflash_draft, "IDLE_HOLD", hold)
        sctx = StrategyContext(gpu=ctx0, target=target_view(model),
                               options=StrategyOptions(draft_model=files["small"], draft_max=3))
        s = vkdflash_draft.DraftModel(sctx)
        sctx.tokens = [5, 17, 3, 42, 8]
        s.begin(sctx)
        for t in (23, 11, 2, 30):
            sctx.tokens = sctx.tokens + [t]
            s.commit(sctx)
        assert s.n_done == (len(sctx.tokens) if hold == 0 else 0)
        proposals.append(s.propose(sctx, 7, 3).tokens)
        s.close()
        sctx.close()
    model.close()
    assert len(proposals[0]) == 3 and proposals[0] == proposals[1]
