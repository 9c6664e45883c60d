"""llama.cpp and luainfer against the float64 NumPy forward of one GGUF.

    .venv/bin/python bench/llama_cpp_logits.py MODEL.gguf [MODEL2.gguf ...]

For 17 prefixes of one prompt (cut at words), the top-40 logits (by the
float64 forward of tests/integration/test_prune.py on the gguf package's
dequantized weights) from llama.cpp (llama-cpp-python, needed in .venv),
`luainfer generate --isa auto` and `--isa ggml`: the largest and mean
absolute difference per engine and top-1 agreement. Used to check that
llama.cpp runs a per-block-width file (architecture "deci") as it runs the
shipped model: both engines' error being their 8-bit activation rounding.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tp", ROOT / "tests/integration/test_prune.py")
tp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp)
WORDS = ("The old lighthouse keeper climbed the spiral stairs every evening, and on the night of the great storm "
         "he saw").split()

for path in sys.argv[1:]:
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, verbose=False, n_threads=2, logits_all=True)
    m = tp.GGUFModel(path)
    res = {"llama.cpp": [], "luainfer auto": [], "luainfer ggml": []}
    agree = dict.fromkeys(res, 0)
    for k in range(4, len(WORDS) + 1):
        prompt = " ".join(WORDS[:k])
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        ll = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        ref = tp.forward(m, ids, 1)[0][0]
        top = np.argsort(-ref)[:40]
        res["llama.cpp"].append(np.abs(ll[top] - ref[top]).max())
        agree["llama.cpp"] += ll.argmax() == ref.argmax()
        for isa in ("auto", "ggml"):
            out = subprocess.run([str(ROOT / "build/luainfer"), "generate", "--model", path, "--prompt", prompt,
                                  "--max-tokens", "1", "--temperature", "0", "--json", "--top-logits", "40", "--isa",
                                  isa, "--threads", "2"], capture_output=True, text=True, check=True)
            d = json.loads(out.stdout)
            assert d["prompt_tokens"] == ids, "the two tokenizers differ"
            tl = dict(d["top_logits"][0])
            res["luainfer " + isa].append(max(abs(tl[t] - ref[t]) for t in top if t in tl))
            agree["luainfer " + isa] += d["tokens"][0] == ref.argmax()
    n = len(res["llama.cpp"])
    print(f"{path} ({m.arch}), {n} prompts: " + "; ".join(
        f"{k}: max {max(v):.3f} mean {np.mean(v):.3f} top-1 {agree[k]}/{n}" for k, v in res.items()))
