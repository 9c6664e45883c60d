/* bench_device_sampling.c — how often a model's own draws are decided by
 * the largest logits alone (sampler.h li_sampler_sample_cand), the way a
 * device backend samples: only those candidates and the row's lse copied
 * back, the full row only when they cannot decide.
 *
 *   bench_device_sampling MODEL TEXT [windows] [new_tokens] [--json FILE]
 *                                       default 4, 128
 *
 * For each sampling setting, each of `windows` prompts (64 tokens from
 * evenly spaced places in TEXT) is continued by `new_tokens` tokens drawn by
 * the full chain (li_sampler_sample_u asking the distribution). Beside it a second sampler of the
 * same seed draws from the 64 largest logits (a reference top-k) and the
 * row's lse (and the raw logits of the ids penalties edit), falling back
 * to the logits when it says it cannot decide.
 * Prints the share of draws decided from the candidates, beside the share
 * whose token is among them at all (what no use of them can exceed), and
 * checks that
 * every draw is the full sampler's (a mismatch is a bug: exit status 1).
 * Runs on the CPU: the candidates are what a device's topk would return. */
#include "bench/bench_results.h"
#include "engine/session.h"
#include "runtime/runtime.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K = LI_SAMPLER_CAND_WIDE, PROMPT = 64 };

int main(int argc, char **argv) {
    li_bench_results res;
    if (li_bench_results_init(&res, "device_sampling", &argc, argv)) return 2;
    if (argc < 3) {
        fprintf(stderr, "usage: bench_device_sampling MODEL TEXT [windows 1..64] [new_tokens 1..1024] [--json FILE]\n");
        return 2;
    }
    const int windows = argc > 3 ? atoi(argv[3]) : 4, n_new = argc > 4 ? atoi(argv[4]) : 128;
    if (windows < 1 || windows > 64 || n_new < 1 || n_new > 1024) {
        fprintf(stderr, "bench_device_sampling: windows must be in 1..64 and new_tokens in 1..1024\n");
        return 2;
    }
    li_error err = {0};
    li_runtime rt;
    if (li_runtime_open_device(&rt, argv[1], 0, "auto", NULL, "--device", &err)) return li_runtime_fail(&err);
    li_model *m = rt.model;
    char *text = NULL;
    size_t len = 0;
    int32_t *toks = NULL;
    size_t n_tok = 0;
    if (li_read_file(argv[2], (size_t)1 << 30, "text file", &text, &len, &err) ||
        li_tokenizer_encode(m->tok, text, len, false, false, &toks, &n_tok, &err)) {
        li_runtime_close(&rt);
        return li_runtime_fail(&err);
    }
    if (n_tok < (size_t)PROMPT * (size_t)windows) {
        fprintf(stderr, "bench_device_sampling: %s has %zu tokens, fewer than %d windows of %d\n", argv[2], n_tok,
                windows, PROMPT);
        return 2;
    }
    const int32_t nv = m->hp.n_vocab;
    li_session sess;
    if (li_session_init(&sess, m, &rt.be, PROMPT + n_new, LI_TYPE_F16, PROMPT, &err)) {
        li_runtime_close(&rt);
        return li_runtime_fail(&err);
    }
    float *logits = li_xmalloc((size_t)PROMPT * nv * sizeof(float)), *probs = li_xmalloc((size_t)nv * sizeof(float));
    struct { const char *name; float t, top_p, min_p; int32_t top_k; float rp, pres, freq; } sets[] = {
        {"T 1.0 (OpenAI's default)", 1.0f, 1.0f, 0.0f, 0, 1, 0, 0},
        {"T 0.7", 0.7f, 1.0f, 0.0f, 0, 1, 0, 0},
        {"T 0.7, top_p 0.9", 0.7f, 0.9f, 0.0f, 0, 1, 0, 0},
        {"T 1.0, top_p 0.95", 1.0f, 0.95f, 0.0f, 0, 1, 0, 0},
        {"T 0.8, min_p 0.05", 0.8f, 1.0f, 0.05f, 0, 1, 0, 0},
        {"T 1.2, top_p 0.9", 1.2f, 0.9f, 0.0f, 0, 1, 0, 0},
        {"T 0.8, top_k 100", 0.8f, 1.0f, 0.0f, 100, 1, 0, 0},
        {"llama.cpp's defaults", 0.8f, 0.95f, 0.05f, 40, 1, 0, 0},
        {"  + repeat_penalty 1.1", 0.8f, 0.95f, 0.05f, 40, 1.1f, 0, 0},
        {"greedy, repeat_penalty 1.2", 0.0f, 1.0f, 0.0f, 0, 1.2f, 0, 0},
        {"T 0.7, presence/freq 0.5", 0.7f, 1.0f, 0.0f, 0, 1, 0.5f, 0.5f},
    };
    const int n_sets = (int)(sizeof sets / sizeof sets[0]);
    printf("%s: %d prompts of %d tokens, %d new tokens each, the %d largest logits and the lse a row\n", argv[1],
           windows, PROMPT, n_new, K);
    printf("%-26s %9s %9s %10s %10s\n", "setting", "draws", "decided", "in the 64", "mismatches");
    int bad = 0;
    li_token_logprob cand[K];
    float vals[K], ev[LI_SAMPLER_EDIT_MAX];
    int32_t ids[K], eids[LI_SAMPLER_EDIT_MAX];
    for (int si = 0; si < n_sets; si++) {
        li_sampling_params p;
        li_sampling_params_default(&p);
        p.temperature = sets[si].t, p.top_p = sets[si].top_p, p.min_p = sets[si].min_p, p.top_k = sets[si].top_k;
        p.repeat_penalty = sets[si].rp, p.presence_penalty = sets[si].pres, p.frequency_penalty = sets[si].freq;
        long draws = 0, decided = 0, mismatches = 0, within = 0;
        for (int w = 0; w < windows && !bad; w++) {
            p.seed = 1000u * (uint64_t)si + (uint64_t)w;
            li_sampler a, b;
            if (li_sampler_init(&a, &p, nv, &err) || li_sampler_init(&b, &p, nv, &err)) return li_runtime_fail(&err);
            li_session_reset(&sess);
            const int32_t *prompt = toks + (n_tok / (size_t)windows) * (size_t)w;
            const float *row = logits + (size_t)(PROMPT - 1) * nv;
            if (li_session_eval(&sess, prompt, PROMPT, true, logits, &err)) return li_runtime_fail(&err);
            for (int i = 0; i < PROMPT; i++) li_sampler_accept(&a, prompt[i]), li_sampler_accept(&b, prompt[i]);
            for (int t = 0; t < n_new; t++) {
                /* the full chain (sample_u asking the distribution sorts every kept logit), not
                 * the candidates li_sampler_sample draws from: the reference stays independent */
                const int32_t want = li_sampler_sample_u(&a, row, li_sampler_uniform(&a), probs, NULL, NULL);
                li_logits_top(row, nv, K, cand, false);
                for (int i = 0; i < K; i++) vals[i] = cand[i].logprob, ids[i] = cand[i].id;
                const int32_t ne = li_sampler_edit_ids(&b, eids, LI_SAMPLER_EDIT_MAX);
                for (int j = 0; j < ne; j++) ev[j] = row[eids[j]];
                const float sc = li_sampler_cand_scale(&b);
                const float lse_t = sc > 0 ? li_sampler_lse_scaled(row, nv, sc) : NAN;
                const li_sampler_cands cd = {vals, ids, K, li_sampler_lse(row, nv), lse_t, eids, ev, LI_MAX(ne, 0)};
                int32_t got = ne < 0 ? -1 : li_sampler_sample_cand(&b, &cd, NULL, NULL);
                decided += got >= 0;
                for (int i = 0; i < K; i++) within += ids[i] == want; /* what any use of the 64 could decide */
                if (got < 0) got = li_sampler_sample(&b, row, NULL, NULL);
                mismatches += got != want;
                li_sampler_accept(&a, want), li_sampler_accept(&b, want);
                draws++;
                if (li_session_eval(&sess, &want, 1, false, logits, &err)) return li_runtime_fail(&err);
                row = logits;
            }
            li_sampler_free(&a);
            li_sampler_free(&b);
        }
        printf("%-26s %9ld %8.1f%% %9.1f%% %10ld\n", sets[si].name, draws, 100.0 * (double)decided / (double)draws,
               100.0 * (double)within / (double)draws, mismatches);
        cJSON *jr = li_bench_results_row(&res, "setting", sets[si].name);
        cJSON_AddNumberToObject(jr, "draws", (double)draws);
        cJSON_AddNumberToObject(jr, "decided_pct", 100.0 * (double)decided / (double)draws);
        cJSON_AddNumberToObject(jr, "in_candidates_pct", 100.0 * (double)within / (double)draws);
        cJSON_AddNumberToObject(jr, "mismatches", (double)mismatches);
        bad |= mismatches != 0;
    }
    printf("bytes copied back a row: %d for the candidates and lse, %d for the logits\n", K * 8 + 4, nv * 4);
    free(logits);
    free(probs);
    free(toks);
    free(text);
    li_session_free(&sess);
    li_runtime_close(&rt);
    li_bench_results_chart(&res, "setting", "decided_pct", "% of draws decided by the candidates",
                           "Draws decided by the 64 largest logits and the lse", false);
    return li_bench_results_finish(&res) | bad;
}
