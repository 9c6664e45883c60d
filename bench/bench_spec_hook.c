/* bench_spec_hook.c — what a policy's speculate hook costs per engine step,
 * in-process in its sandbox, as the engine calls it (the C side's state and
 * request tables included), warm and cold.
 *
 *   ./build/bench_spec_hook [POLICY.lua...] [--batch B[,B...]] [--steps N] [--flush MIB] [--idle] [--json FILE]
 *
 * Each policy (default: policies/spec_adaptive.lua and a hook that returns
 * false, the marshalling alone) runs STEPS steps (default 1000) of B
 * requests (default 1,4) that could draft with n-gram lookup or an EAGLE
 * draft, on a fixed cost curve; drafts pass at a fixed rate from a fixed
 * seed, so two builds see the same steps and make the same choices (the
 * checksum of the choices is printed: it must agree between builds).
 * --idle: lookup never finds anything to copy and EAGLE's drafts pass 20%
 * (a story at batch 4: the policy drafts little or nothing). Cold:
 * before each step FLUSH MiB (default 64) are written, as a forward pass
 * streaming the weights evicts the policy's memory from the caches; the
 * hook then runs from DRAM, which is how it runs in the engine. */
#include "bench/bench_results.h"
#include "policy/policy.h"
#include "policy/policy_lua.h"
#include "util/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_B 16

typedef struct run_result {
    double us;            /* hook time per step */
    long rounds;          /* candidates that drafted */
    unsigned long long sum; /* checksum of the choices */
} run_result;

/* STEPS steps of b requests through policy p; flush bytes written before each step */
static int run(li_policy *p, int b, int steps, bool idle, volatile char *flush, size_t flush_bytes, run_result *out) {
    static const char *const names[5] = {"ngram", "draft", "layerskip", "medusa", "eagle"};
    const bool avail[5] = {true, false, false, false, true};
    const double draft_time[5] = {0, 0, 0, 0, 2e-4}, verify_time[2] = {5e-6, 0};
    double rows[LI_SPEC_COST_ROWS];
    for (int n = 0; n < LI_SPEC_COST_ROWS; n++) rows[n] = 1.7e-3 + n * 0.28e-3; /* Zen 5's curve, roughly */
    li_req_view v[MAX_B];
    li_spec_cand c[MAX_B];
    double acc[MAX_B][5];
    int64_t drafted[MAX_B][5] = {{0}}, accepted[MAX_B][5] = {{0}};
    unsigned rng = 1;
    run_result r = {0};
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < b; i++) {
            v[i] = (li_req_view){.id = i + 1, .state = LI_REQ_RUNNING, .tenant = "", .prompt_len = 100,
                                 .num_tokens = 100 + s, .num_computed = 100 + s, .num_generated = s,
                                 .max_tokens = 1 << 30, .spec_acceptance = -1, .first_scheduled = 0, .first_token = 0};
            for (int m = 0; m < 5; m++) acc[i][m] = drafted[i][m] ? (double)accepted[i][m] / (double)drafted[i][m] : -1;
            /* lookup finds something to copy two steps in three, matches of 0-6 tokens (--idle: never) */
            c[i] = (li_spec_cand){.id = i + 1, .want_method = 0, .want_k = 8, .max_k = 16, .temperature = 0,
                                  .acceptance = acc[i], .drafted = drafted[i], .ngram = !idle && s % 3 ? 4 : 0,
                                  .ngram_match = idle ? 0 : s % 7, .method = 0, .k = 8};
        }
        const li_step_state st = {.step = s, .now = s * 1e-3, .reqs = v, .n_reqs = b, .kv_free_blocks = 100,
                                  .kv_total_blocks = 200, .block_size = 16, .max_num_seqs = MAX_B,
                                  .max_batched_tokens = 512};
        const li_spec_state ss = {.methods = names, .available = avail, .n_methods = 5, .batch_size = b,
                                  .step_time = 2e-3, .token_time = 1e-3, .draft_time = draft_time, .row_time = rows,
                                  .verify_time = verify_time};
        for (size_t o = 0; o < flush_bytes; o += 64) flush[o]++;
        li_error err = {0};
        const double t0 = li_time_now();
        const int rc = p->ops->speculate(p, &st, &ss, c, b, &err);
        r.us += li_time_now() - t0;
        if (rc) {
            fprintf(stderr, "bench_spec_hook: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < b; i++) {
            if (c[i].method < 0 || c[i].k <= 0) continue;
            /* n-gram drafts pass 70% each, EAGLE's 40% (--idle: 20%) */
            const int m = c[i].method;
            const unsigned pass = m ? (idle ? 20u : 40u) : 70u;
            int a = 0;
            while (a < c[i].k && ((rng = rng * 1103515245u + 12345u) >> 16) % 100 < pass) a++;
            drafted[i][m] += c[i].k, accepted[i][m] += a, r.rounds++;
            r.sum = r.sum * 31 + (unsigned long long)(m * 64 + c[i].k + 7 * i);
        }
    }
    r.us = r.us / steps * 1e6;
    *out = r;
    return 0;
}

/* a fresh state of the same policy */
static int reload(li_policy *p, const char *path, const char *src) {
    li_error err = {0};
    if (!p->ops->reload(p, path, src, &err)) return 0;
    fprintf(stderr, "bench_spec_hook: %s: reload: %s\n", path, err.msg);
    return 1;
}

int main(int argc, char **argv) {
    li_bench_results res;
    if (li_bench_results_init(&res, "spec_hook", &argc, argv)) return 2;
    const char *files[16];
    int n_files = 0, steps = 1000, batches[8], n_b = 0;
    bool idle = false;
    size_t flush_mib = 64;
    for (int i = 1; i < argc; i++) {
        const bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--idle")) {
            idle = true;
        } else if (!strcmp(argv[i], "--steps") && has) {
            steps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--flush") && has) {
            flush_mib = (size_t)atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--batch") && has) {
            for (char *s = argv[++i]; *s && n_b < 8; s++) {
                batches[n_b++] = (int)strtol(s, &s, 10);
                if (*s != ',') break;
            }
        } else if (argv[i][0] == '-' || n_files == 16) {
            fprintf(stderr, "usage: bench_spec_hook [POLICY.lua...] [--batch B[,B...]] [--steps N] [--flush MIB] [--idle] "
                            "[--json FILE] [--plot FILE]\n");
            return 2;
        } else {
            files[n_files++] = argv[i];
        }
    }
    for (int i = 0; i < n_b; i++)
        if (batches[i] < 1 || batches[i] > MAX_B) {
            fprintf(stderr, "bench_spec_hook: --batch: 1..%d requests\n", MAX_B);
            return 2;
        }
    if (steps < 1 || flush_mib > 4096) {
        fprintf(stderr, "bench_spec_hook: --steps must be >= 1 and --flush at most 4096 MiB\n");
        return 2;
    }
    if (!n_b) batches[n_b++] = 1, batches[n_b++] = 4;
    static const char noop_src[] = "return { speculate = function() return false end }";
    if (!n_files) files[n_files++] = "policies/spec_adaptive.lua";
    const size_t flush_bytes = flush_mib << 20;
    volatile char *flush = flush_bytes ? calloc(flush_bytes, 1) : NULL;
    if (flush_bytes && !flush) return 1;
    printf("speculate hook, us per step (%d steps%s; cold: %zu MiB written before each step)\n", steps,
           idle ? ", idle: nothing to copy" : "", flush_mib);
    printf("%-32s %5s %10s %10s %8s %18s\n", "policy", "batch", "warm", "cold", "rounds", "choices");
    for (int f = -1; f < n_files; f++) {
        li_policy *p;
        li_error err = {0};
        const char *name = f < 0 ? "(returns false)" : files[f];
        if (li_policy_lua_open(&p, f < 0 ? "noop" : files[f], f < 0 ? noop_src : NULL, NULL, &err)) {
            fprintf(stderr, "bench_spec_hook: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < n_b; i++) {
            run_result warm, cold;
            /* a fresh policy state for each: the same steps, so the same choices */
            const char *path = f < 0 ? "noop" : files[f], *src = f < 0 ? noop_src : NULL;
            if (run(p, batches[i], steps, idle, flush, 0, &warm) || reload(p, path, src) ||
                run(p, batches[i], steps, idle, flush, flush_bytes, &cold) || reload(p, path, src))
                return 1;
            printf("%-32s %5d %10.1f %10.1f %8ld %018llx\n", name, batches[i], warm.us, cold.us, cold.rounds, cold.sum);
            char label[300];
            snprintf(label, sizeof label, "%s, batch %d", name, batches[i]);
            cJSON *row = li_bench_results_row(&res, "name", label);
            cJSON_AddNumberToObject(row, "batch", batches[i]);
            cJSON_AddNumberToObject(row, "us_warm", warm.us);
            cJSON_AddNumberToObject(row, "us_cold", cold.us);
            cJSON_AddNumberToObject(row, "rounds", (double)cold.rounds);
            if (warm.sum != cold.sum) {
                fprintf(stderr, "bench_spec_hook: %s: warm and cold runs chose differently\n", name);
                return 1;
            }
        }
        p->ops->free(p);
    }
    free((void *)flush);
    li_bench_results_chart(&res, "name", "us_cold", "us per step, cold", "speculate hook", false);
    return li_bench_results_finish(&res) ? 1 : 0;
}
