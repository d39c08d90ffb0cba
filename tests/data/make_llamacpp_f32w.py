"""Regenerates smollm2-f32w-llamacpp.json: llama.cpp's own numbers for SmolLM2-135M-Instruct with its
Q4_1/Q8_0 weights expanded to F32, so that llama.cpp's CPU backend multiplies in f32 instead of
rounding activations to 8 bits; what remains is the graph itself, which the numpy reference must
reproduce to rounding (tests/test_ref_model.py). Not run by the tests.

How it was made: llama.cpp 0c1e570 (the tree vendored in the llama-cpp-python 0.3.36 sdist) built
as shared libraries (cmake -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON, CPU only); the model requantized
with llama_model_quantize(ftype=LLAMA_FTYPE_ALL_F32, allow_requantize) to smol_f32.gguf; this script
run with that library through llama-cpp-python's ctypes layer:
  LLAMA_CPP_LIB_PATH=.../build/bin PYTHONPATH=<sdist dir> python make_llamacpp_f32w.py smol_f32.gguf
Inputs: the prompt ids + the first 31 greedy tokens of each case of
tests/data/reference/smollm2-llamacpp-top10.json, one batch per case, 2 threads.
Records, per config, the top-10 log-probabilities at the 32 positions that predict the tokens, and
for quantized caches the layer-0 K and V cache bytes of case 0 (llama_state_seq_get_data)."""
import base64
import ctypes
import json
import struct
import sys
from pathlib import Path

import llama_cpp.llama_cpp as L
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

REF = Path(__file__).resolve().parent / "reference" / "smollm2-llamacpp-top10.json"
TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20}
# name -> (cache type, flash attention); a quantized V cache needs flash attention
CONFIGS = {"f32": ("f32", 0), "f16": ("f16", 1)}
STATE_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]
N_LAYER, N_HEAD_KV, HEAD_DIM = 30, 3, 64


def context(model, ctype: str, fa: int):
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
    cp.n_threads = cp.n_threads_batch = 2
    cp.type_k = cp.type_v = TYPES[ctype]
    cp.flash_attn_type = fa
    return L.llama_init_from_model(model, cp)


def decode(ctx, seq):
    b = L.llama_batch_init(len(seq), 0, 1)
    b.n_tokens = len(seq)
    for i, t in enumerate(seq):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)


def layer0_kv(ctx, n_cells: int, row_bytes: int, type_id: int) -> tuple[bytes, bytes]:
    n = L.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * n)()
    L.llama_state_seq_get_data(ctx, buf, n, 0)
    st = bytes(buf)
    hdr = struct.pack("<iQ", type_id, row_bytes * N_HEAD_KV)
    k0 = st.find(hdr) + len(hdr)
    size = n_cells * row_bytes * N_HEAD_KV
    # K rows of every layer, then V rows (v_trans is 0 with flash attention)
    offs = [k0 + i * (size + len(hdr)) for i in range(2 * N_LAYER)]
    assert all(st[o - len(hdr):o] == hdr for o in offs), "unexpected state layout"
    return st[offs[0]:offs[0] + size], st[offs[N_LAYER]:offs[N_LAYER] + size]


def main(model_path: str) -> None:
    cases = json.loads(REF.read_text())["cases"]
    L.llama_backend_init()
    model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = {"source": __doc__.split("\n\n")[1].replace("\n", " "), "configs": {}, "kv_layer0": {}}
    for name, (ctype, fa) in CONFIGS.items():
        rows = []
        for c in cases:
            seq = c["prompt_ids"] + c["tokens"][:-1]
            ctx = context(model, ctype, fa)
            decode(ctx, seq)
            steps = []
            for i in range(len(c["prompt_ids"]) - 1, len(seq)):
                x = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).astype(np.float64)
                lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
                top = np.argsort(-lp, kind="stable")[:10]
                steps.append({"ids": top.tolist(), "logprobs": lp[top].tolist()})
            rows.append(steps)
            L.llama_free(ctx)
        out["configs"][name] = {"cache": ctype, "flash_attn": bool(fa), "cases": rows}
    seq = cases[0]["prompt_ids"] + cases[0]["tokens"][:-1]
    for ctype in STATE_TYPES:
        qk, bb = GGML_QUANT_SIZES[GGMLQuantizationType(TYPES[ctype])]
        ctx = context(model, ctype, 1)
        decode(ctx, seq)
        k, v = layer0_kv(ctx, len(seq), HEAD_DIM // qk * bb, TYPES[ctype])
        out["kv_layer0"][ctype] = {"k": base64.b64encode(k).decode(), "v": base64.b64encode(v).decode()}
        L.llama_free(ctx)
    Path(__file__).with_name("smollm2-f32w-llamacpp.json").write_text(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main(sys.argv[1])
