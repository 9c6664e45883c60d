"""luainfer must reproduce llama.cpp: same tokens, same logits, same perplexity.

The reference outputs come from llama-cpp-python (tests/golden/*.json, made by
tools/gen_llama_golden.py). The greedy golden also carries, for each top-40
row, the *exact* logits of the same ids: a float64 forward pass over the same
dequantized weights ("ref"). For every golden prompt we run

    luainfer generate --temperature 0 --max-tokens 64 --json --top-logits 40

and check, in order:
  1. prompt_tokens are exactly llama.cpp's (tokenizer + chat template);
  2. the generated tokens are exactly llama.cpp's, except at a genuine tie.
     At the first differing position d the divergence is accepted (and
     printed; only the prefix before d is compared further) when either
       - llama.cpp's own logit for luainfer's token is within NEAR_TIE_GAP of
         its top-1 (a near-tie in llama.cpp's logits), or
       - the exact logits rank luainfer's token within REF_TIE_GAP of
         llama.cpp's token (luainfer picked what exact math calls a tie, or
         exact math's actual winner);
  3. on the positions whose context is identical (the prefix and d itself):
       - |luainfer - llama.cpp| < MAX_ABS_LOGIT_DIFF on ids in both top-40s,
       - luainfer is about as close to the exact logits as llama.cpp is:
         mean |luainfer - ref| <= REF_MEAN_RATIO * mean |llama.cpp - ref| + REF_MEAN_SLACK,
       - the top-1 id agrees on >= MIN_TOP1_AGREEMENT of the identical prefix.

Perplexity on tests/data/alice_ch1.txt must be within PPL_REL_TOL of
llama.cpp's for the same ctx and chunk scheme.

With `--isa ggml` luainfer computes what llama.cpp's x86 build computes
(kernels/cpu/ggml_kernels.h), so there the checks are exact: the same tokens
on every prompt, the same float32 logits (the goldens store llama.cpp's
exactly), and the same perplexity to the golden's 6 decimals.

The measured numbers are printed as a table at the end of the run and written
to build/parity_report.json (see conftest.py).
"""

import json
import math
import re
import struct
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

GOLDEN_GREEDY = REPO_ROOT / "tests" / "golden" / "llama_cpp_greedy.json"
GOLDEN_PPL = REPO_ROOT / "tests" / "golden" / "llama_cpp_perplexity.json"

# Why these bounds (measured 2025-11 on SmolLM2-135M Q4_1, 12 prompts, 322
# positions of identical context; llama-cpp-python 0.3.36, AVX-512 build):
# llama.cpp rounds activations to 8 bits (Q8_1/Q8_0) inside every matmul and
# keeps K/V in F16, so its logits are not the exact ones either:
#   |llama.cpp - ref|  per-position max: mean 0.39, p99 0.78, max 1.18
#   |luainfer  - ref|  per-position max: mean 0.41, p99 0.80, max 0.90
#   |luainfer - llama.cpp|              : mean 0.42, p99 0.83, max 0.97
#   error of llama.cpp's top-2 gap vs ref: mean 0.12, p90 0.27, p99 0.42
# So no engine that computes differently from llama.cpp can match its argmax
# where the top-2 gap is below ~0.3, and a 0.05 gap is 1/6 of the noise.
# - NEAR_TIE_GAP 0.05: the near-tie rule on llama.cpp's logits alone.
# - REF_TIE_GAP 0.3: ~p95 of llama.cpp's own top-2 gap error against exact
#   math. (At 5 of the 6 larger divergences seen, exact math agreed with
#   luainfer, not with llama.cpp.)
# - MAX_ABS_LOGIT_DIFF 1.25: measured max 0.97, with margin; the brief's
#   starting 0.5 is below llama.cpp's own distance from exact logits.
# - REF_MEAN_RATIO/SLACK: luainfer may be at most 25% (+0.02) further from
#   the exact logits than llama.cpp is (measured: 0.99x-1.07x).
NEAR_TIE_GAP = 0.05
REF_TIE_GAP = 0.3
MAX_ABS_LOGIT_DIFF = 1.25
REF_MEAN_RATIO = 1.25
REF_MEAN_SLACK = 0.02
MIN_POSITIONS_PER_PROMPT = 8   # per-prompt closeness check needs this many
POOLED_REF_MEAN_RATIO = 1.15   # pooled over all prompts (measured 1.06x)
MIN_TOP1_AGREEMENT = 0.99
PPL_REL_TOL = 0.01
TOP_K = 40


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


GREEDY = _load(GOLDEN_GREEDY)
PPL = _load(GOLDEN_PPL)
EOG_IDS = set(GREEDY["eog_token_ids"])


def _top5(pairs):
    return [(i, round(v, 4)) for i, v in (pairs or [])[:5]]


def _strip_partial_utf8(s):
    # A 64-token cut can end inside a multi-byte character; decoders differ on
    # whether that tail becomes U+FFFD or is held back.
    return s.rstrip("\ufffd")


def _generate_args(model_path, thread_args, case):
    args = ["generate", "--model", model_path, "--temperature", "0",
            "--max-tokens", str(GREEDY["max_tokens"]), "--json",
            "--top-logits", str(TOP_K)] + thread_args
    if case["chat"]:
        args += ["--chat", "--prompt", case["user"]]
    else:
        args += ["--prompt", case["prompt"]]
    return args


# ---------------------------------------------------------------------------
# Divergence analysis
# ---------------------------------------------------------------------------
def _first_divergence(gold, ours):
    """Index of the first differing position, or None if identical
    (a shorter sequence that is a prefix of the other differs at its end)."""
    gt, ot = gold["tokens"], ours["tokens"]
    for i in range(min(len(gt), len(ot))):
        if gt[i] != ot[i]:
            return i
    if len(gt) == len(ot):
        return None
    return min(len(gt), len(ot))


def _gap(pairs, values, first_id, wanted):
    """values[first_id] - max(values[w] for w in wanted), over the ids of
    pairs (values aligned with pairs); None if no wanted id is there."""
    if not pairs or values is None:
        return None
    v = {i: x for (i, _), x in zip(pairs, values)}
    cands = [v[i] for i in wanted if i in v]
    if first_id not in v or not cands:
        return None
    return v[first_id] - max(cands)


def _judge_divergence(gold, ours, d):
    """At position d llama.cpp and luainfer chose differently.

    Returns (accepted, llama_gap, ref_gap, detail). llama_gap: llama.cpp's
    logit of its choice minus its logit of luainfer's choice (an EOG token
    when luainfer stopped there); ref_gap: the same in exact logits (negative
    when exact math prefers luainfer's choice). None when luainfer's choice
    is not in llama.cpp's top-40.
    """
    gt, ot = gold["tokens"], ours["tokens"]
    # llama.cpp's logits at d: a generated position, or the one that chose EOG
    if d < len(gt):
        g_pairs, g_ref = gold["top_logits"][d], gold["ref_logits"][d]
        g_choice = gt[d]
    else:
        g_pairs, g_ref = gold.get("stop_top_logits"), gold.get("stop_ref_logits")
        g_choice = "EOG"
    o_pairs = ours["top_logits"][d] if d < len(ours.get("top_logits") or []) else None
    if d < len(ot):
        o_choice = ot[d]
        wanted = {o_choice}
    else:
        o_choice = "EOG" if ours["finish_reason"] == "stop" else "END"
        wanted = EOG_IDS if o_choice == "EOG" else set()

    first = g_pairs[0][0] if g_pairs else None
    llama_gap = _gap(g_pairs, [x for _, x in g_pairs or []], first, wanted)
    ref_gap = _gap(g_pairs, g_ref, first, wanted)
    ref_top5 = None
    if g_pairs and g_ref:
        ref_top5 = sorted(((i, x) for (i, _), x in zip(g_pairs, g_ref)),
                          key=lambda t: -t[1])[:5]
    accepted = ((llama_gap is not None and llama_gap < NEAR_TIE_GAP)
                or (ref_gap is not None and ref_gap < REF_TIE_GAP))
    r4 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    detail = (f"first differing position {d}: llama.cpp chose {g_choice}, "
              f"luainfer chose {o_choice}; llama.cpp top-5 {_top5(g_pairs)}; "
              f"luainfer top-5 {_top5(o_pairs)}; exact top-5 {_top5(ref_top5)}; "
              f"gap to luainfer's choice: llama.cpp {r4(llama_gap)}, exact {r4(ref_gap)}")
    return accepted, llama_gap, ref_gap, detail


def _logit_agreement(gold, ours, n_positions):
    """Compare top-40 logits on positions [0, n_positions).

    Returns (|ours-llama| diffs, worst (diff, pos, id), |ours-ref| diffs,
    |llama-ref| diffs), all over ids present in both top-40 lists."""
    diffs, worst, ours_ref, llama_ref = [], (0.0, None, None), [], []
    for i in range(n_positions):
        g = {t: v for t, v in gold["top_logits"][i]}
        ref = {t: x for (t, _), x in zip(gold["top_logits"][i], gold["ref_logits"][i])}
        for t, v in ours["top_logits"][i]:
            if t in g:
                dv = abs(v - g[t])
                diffs.append(dv)
                ours_ref.append(abs(v - ref[t]))
                llama_ref.append(abs(g[t] - ref[t]))
                if dv > worst[0]:
                    worst = (dv, i, t)
    return diffs, worst, ours_ref, llama_ref


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


# ---------------------------------------------------------------------------
# Greedy generation parity
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", GREEDY["prompts"], ids=[p["name"] for p in GREEDY["prompts"]])
def test_greedy_matches_llama_cpp(case, run_ok, model_path, thread_args, parity_report):
    r = run_ok(_generate_args(model_path, thread_args, case))
    ours = r.json()
    for key in ("text", "tokens", "prompt_tokens", "finish_reason", "timings", "top_logits"):
        assert key in ours, f"JSON output lacks {key!r}: keys {sorted(ours)}"

    # 1. prompt tokens
    assert ours["prompt_tokens"] == case["prompt_tokens"], (
        f"[{case['name']}] prompt tokens differ from llama.cpp's\n"
        f" prompt  : {case['prompt']!r}\n llama.cpp: {case['prompt_tokens']}\n"
        f" luainfer : {ours['prompt_tokens']}")

    # shape of top_logits: one list of K (id, logit) pairs per generated token,
    # sorted by logit, best first
    assert len(ours["top_logits"]) == len(ours["tokens"]), "one top_logits row per token"
    for i, row in enumerate(ours["top_logits"]):
        assert len(row) == TOP_K, f"position {i}: {len(row)} pairs, wanted {TOP_K}"
        vals = [v for _, v in row]
        assert vals == sorted(vals, reverse=True), f"position {i}: top_logits not sorted"
        assert row[0][0] == ours["tokens"][i], (
            f"position {i}: greedy token {ours['tokens'][i]} is not the top logit {row[0]}")

    # 2. generated tokens: measure first, record, then judge
    d = _first_divergence(case, ours)
    accepted, llama_gap, ref_gap, note = True, None, None, None
    if d is None:
        n_same = len(case["tokens"])
    else:
        n_same = d
        accepted, llama_gap, ref_gap, detail = _judge_divergence(case, ours, d)
        note = f"[{case['name']}] {detail}"
        print("\n" + note + (" -> accepted as a tie" if accepted else " -> NOT a tie"))

    # 3. logits on positions with identical context: the prefix, plus the
    #    diverging position itself (its context is still identical)
    n_cmp = min(n_same + (1 if d is not None else 0),
                len(case["top_logits"]), len(ours["top_logits"]))
    diffs, worst, ours_ref, llama_ref = _logit_agreement(case, ours, n_cmp)
    top1 = [ours["top_logits"][i][0][0] == case["top_logits"][i][0][0] for i in range(n_same)]
    top1_rate = _mean(top1)
    max_diff = max(diffs) if diffs else None
    parity_report["generate"][case["name"]] = {
        "chat": case["chat"],
        "n_golden": len(case["tokens"]),
        "n_ours": len(ours["tokens"]),
        "n_identical": n_same,
        "diverged_at": d,
        "tie_gap": llama_gap,
        "ref_gap": ref_gap,
        "divergence_accepted": accepted if d is not None else None,
        "divergence": note,
        "n_logit_pairs": len(diffs),
        "max_abs_logit_diff": max_diff,
        "mean_abs_logit_diff": _mean(diffs),
        "worst_position_token": [worst[1], worst[2]],
        "mean_abs_diff_ours_vs_exact": _mean(ours_ref),
        "mean_abs_diff_llama_vs_exact": _mean(llama_ref),
        "sums_vs_exact": [sum(ours_ref), sum(llama_ref), len(ours_ref)],
        "top1_agreement": top1_rate,
        "timings": ours.get("timings"),
    }

    assert accepted, (
        f"generated tokens diverge from llama.cpp and it is not a tie "
        f"(llama.cpp gap >= {NEAR_TIE_GAP} and exact gap >= {REF_TIE_GAP})\n"
        f" prompt: {case['prompt']!r}\n {note}\n"
        f" llama.cpp tokens: {case['tokens']}\n luainfer tokens : {ours['tokens']}")
    if d is None:
        assert ours["finish_reason"] == case["finish_reason"], (
            f"same tokens but finish_reason {ours['finish_reason']!r} != "
            f"{case['finish_reason']!r}")
        txt_ok = _strip_partial_utf8(ours["text"]) in (
            _strip_partial_utf8(case["text"]), _strip_partial_utf8(case["text_special"]))
        assert txt_ok, (f"same tokens but text differs:\n llama.cpp: {case['text']!r}\n"
                        f" luainfer : {ours['text']!r}")
    if max_diff is not None:
        i, t = worst[1], worst[2]
        assert max_diff < MAX_ABS_LOGIT_DIFF, (
            f"[{case['name']}] max |logit diff| {max_diff:.4f} >= {MAX_ABS_LOGIT_DIFF} "
            f"at position {i}, token {t}\n llama.cpp top-5 {_top5(case['top_logits'][i])}\n"
            f" luainfer top-5 {_top5(ours['top_logits'][i])}")
        mo, ml = _mean(ours_ref), _mean(llama_ref)
        # one or two positions make a noisy mean: those prompts count only in
        # test_logits_as_close_to_exact_as_llama_cpp (pooled over all prompts)
        assert n_cmp < MIN_POSITIONS_PER_PROMPT or mo <= REF_MEAN_RATIO * ml + REF_MEAN_SLACK, (
            f"[{case['name']}] luainfer is further from the exact logits than llama.cpp: "
            f"mean |luainfer-exact| {mo:.4f} vs mean |llama.cpp-exact| {ml:.4f}")
    if top1_rate is not None:
        assert top1_rate >= MIN_TOP1_AGREEMENT, f"top-1 agreement {top1_rate:.3f}"


# ---------------------------------------------------------------------------
# --isa ggml: llama.cpp's own arithmetic, checked bit for bit
# ---------------------------------------------------------------------------
def _f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


@pytest.mark.parametrize("case", GREEDY["prompts"], ids=[p["name"] for p in GREEDY["prompts"]])
def test_isa_ggml_reproduces_llama_cpp_bit_for_bit(case, run_ok, model_path, thread_args):
    """The same greedy tokens to the end, and at every position the same
    float32 logit for each of llama.cpp's top-40 ids."""
    ours = run_ok(_generate_args(model_path, thread_args, case) + ["--isa", "ggml"]).json()
    assert ours["prompt_tokens"] == case["prompt_tokens"]
    assert ours["tokens"] == case["tokens"], (
        f"[{case['name']}] --isa ggml tokens differ from llama.cpp's\n"
        f" llama.cpp: {case['tokens']}\n luainfer : {ours['tokens']}")
    assert ours["finish_reason"] == case["finish_reason"]
    assert len(ours["top_logits"]) == len(case["top_logits"])
    for i, (g_row, o_row) in enumerate(zip(case["top_logits"], ours["top_logits"])):
        g = {t: _f32(v) for t, v in g_row}
        o = {t: _f32(v) for t, v in o_row}
        assert set(o) == set(g), f"[{case['name']}] position {i}: top-40 ids differ"
        bad = [(t, g[t], o[t]) for t in g if o[t] != g[t]]
        assert not bad, (f"[{case['name']}] position {i}: {len(bad)} logits differ from llama.cpp's, "
                         f"e.g. id {bad[0][0]}: llama.cpp {bad[0][1]!r}, luainfer {bad[0][2]!r}")


@pytest.mark.parametrize("ctx,chunks", [(128, 4), (512, 1)])
def test_isa_ggml_perplexity_is_llama_cpps(ctx, chunks, run_ok, model_path, thread_args):
    """The running perplexity after the first chunks, to the golden's 6
    decimals (ctx 512 is one 512-token forward pass: the batched order of
    attention over long rows)."""
    gold = next(r for r in PPL["results"] if r["ctx"] == ctx)
    ours = run_ok(["perplexity", "--model", model_path, "--file", REPO_ROOT / PPL["text_file"],
                   "--ctx", str(ctx), "--chunks", str(chunks), "--json", "--isa", "ggml"] + thread_args,
                  timeout=900).json()
    want = gold["running_ppl_per_chunk"][chunks - 1]
    assert abs(ours["perplexity"] - want) <= 1e-6, (
        f"ctx {ctx}, {chunks} chunks: --isa ggml perplexity {ours['perplexity']!r} vs llama.cpp {want}")


def test_isa_amx_is_avx512_bit_for_bit(run_cli, run_ok, model_path, thread_args):
    """AMX tiles take the integer block dots of the quantized matmuls of 11+
    rows (prefill here: a 512-token chunk, and each prompt); the float
    arithmetic is AVX-512's, so logits and perplexity are the same bits."""
    probe = run_cli(["generate", "--model", model_path, "--isa", "amx", "--prompt", "a", "--max-tokens", "1"])
    if probe.returncode != 0:
        pytest.skip(f"--isa amx not on this machine: {probe.stderr.strip()[-200:]}")
    ppl = [run_ok(["perplexity", "--model", model_path, "--file", REPO_ROOT / PPL["text_file"], "--ctx", "512",
                   "--chunks", "1", "--json", "--isa", isa] + thread_args).json() for isa in ("avx512", "amx")]
    assert ppl[0]["perplexity"] == ppl[1]["perplexity"], ppl
    for case in GREEDY["prompts"][:3]:
        out = [run_ok(_generate_args(model_path, thread_args, case) + ["--isa", isa]).json()
               for isa in ("avx512", "amx")]
        assert out[0]["tokens"] == out[1]["tokens"], case["name"]
        assert out[0]["top_logits"] == out[1]["top_logits"], case["name"]


def test_logits_as_close_to_exact_as_llama_cpp(parity_report):
    """Pooled over every prompt checked above: luainfer's distance from the
    exact logits is about llama.cpp's (see POOLED_REF_MEAN_RATIO)."""
    rows = [r for r in parity_report["generate"].values() if r.get("sums_vs_exact")]
    if not rows:
        pytest.skip("no greedy parity rows were recorded in this session")
    ours = sum(r["sums_vs_exact"][0] for r in rows)
    llama = sum(r["sums_vs_exact"][1] for r in rows)
    n = sum(r["sums_vs_exact"][2] for r in rows)
    parity_report["pooled_vs_exact"] = {"n_pairs": n, "ours_mean": ours / n,
                                        "llama_cpp_mean": llama / n}
    assert ours <= POOLED_REF_MEAN_RATIO * llama, (
        f"mean |luainfer-exact| {ours / n:.4f} vs mean |llama.cpp-exact| {llama / n:.4f} "
        f"over {n} logits")


def test_streamed_text_matches_json(run_ok, model_path, thread_args):
    """Without --json, generate streams to stdout the text that --json reports."""
    case = next(p for p in GREEDY["prompts"] if p["name"] == "prose")
    args = _generate_args(model_path, thread_args, case)
    k = args.index("--top-logits")
    del args[k:k + 2]
    want = run_ok(args).json()["text"]
    got = run_ok([a for a in args if a != "--json"]).stdout
    assert got in (want, want + "\n"), (
        f"streamed stdout differs from the --json text\n json  : {want!r}\n"
        f" stdout: {got!r}")


def test_chat_flag_renders_the_template(run_ok, model_path, thread_args):
    """--chat wraps the prompt exactly as the GGUF chat template does."""
    case = next(p for p in GREEDY["prompts"] if p["chat"])
    r = run_ok(["generate", "--model", model_path, "--temperature", "0",
                "--max-tokens", "1", "--json", "--chat", "--prompt", case["user"]]
               + thread_args)
    assert r.json()["prompt_tokens"] == case["prompt_tokens"]
    # and the same text given raw (special tokens parsed) tokenizes the same
    r = run_ok(["generate", "--model", model_path, "--temperature", "0",
                "--max-tokens", "1", "--json", "--prompt", case["prompt"]] + thread_args)
    assert r.json()["prompt_tokens"] == case["prompt_tokens"]


# ---------------------------------------------------------------------------
# Perplexity parity
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("gold", PPL["results"], ids=[f"ctx{r['ctx']}" for r in PPL["results"]])
def test_perplexity_matches_llama_cpp(gold, run_ok, model_path, thread_args, parity_report):
    text = REPO_ROOT / PPL["text_file"]
    r = run_ok(["perplexity", "--model", model_path, "--file", text,
                "--ctx", str(gold["ctx"]), "--json"] + thread_args, timeout=900)
    ours = r.json()
    ppl = ours.get("perplexity")
    row = {"ctx": gold["ctx"], "ours": ppl, "llama_cpp": gold["perplexity"],
           "rel_diff": None, "n_chunks": ours.get("n_chunks"),
           "n_scored": ours.get("n_scored")}
    parity_report["perplexity"][gold["ctx"]] = row
    assert isinstance(ppl, (int, float)) and math.isfinite(ppl), f"perplexity = {ppl!r}"
    row["rel_diff"] = ppl / gold["perplexity"] - 1.0
    assert ours.get("ctx") == gold["ctx"]
    assert ours.get("n_chunks") == gold["n_chunks"], "chunking differs from llama.cpp's"
    assert ours.get("n_scored") == gold["n_scored"], "scored positions differ from llama.cpp's"
    assert abs(row["rel_diff"]) < PPL_REL_TOL, (
        f"ctx={gold['ctx']}: perplexity {ppl:.4f} vs llama.cpp {gold['perplexity']:.4f} "
        f"({row['rel_diff']:+.3%})")


def test_perplexity_plain_output(run_ok, model_path, thread_args):
    """Without --json the result is printed as `perplexity: X` (over the
    first 4 chunks: the format is what is checked, the full text is above)."""
    gold = PPL["results"][0]
    r = run_ok(["perplexity", "--model", model_path, "--file", REPO_ROOT / PPL["text_file"],
                "--ctx", str(gold["ctx"]), "--chunks", "4"] + thread_args, timeout=900)
    m = re.search(r"perplexity:\s*([0-9.eE+-]+)", r.stdout)
    assert m, f"no 'perplexity: X' line in stdout: {r.stdout[-500:]!r}"
    assert abs(float(m.group(1)) / gold["running_ppl_per_chunk"][3] - 1.0) < PPL_REL_TOL
