/* bench_spec_verify.c — what verification (core/spec/verify.c) costs per
 * engine step at a real vocabulary size, beside the ~3.7 ms a batch-1 step
 * of the 135M model takes here (docs/benchmarks.md, "n-gram speculation").
 *
 *   bench_spec_verify [n_vocab] [rounds] [--json FILE] [--plot FILE]
 *                                             default 49152, 5
 *
 * Random peaked target and draft rows (every id possible) and uniformly
 * random draft ids, so most calls stop early: a rejection costs a pass or two
 * over the vocabulary (residual, draw), which is what is measured. Prints
 * microseconds per call, best of the rounds, for each rule; the cases run
 * interleaved round by round so machine load hits all of them alike. */
#include "spec/verify.h"
#include "util/common.h"
#include "bench/bench_results.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double uni(void *ctx) {
    (void)ctx;
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static double now_us(void) { return li_time_now() * 1e6; }

#define K 4
#define TN 9
static const int32_t TREE_PAR[TN] = {-1, -1, -1, 0, 0, 1, 3, 3, 6};

int main(int argc, char **argv) {
    li_bench_results res;
    if (li_bench_results_init(&res, "spec_verify", &argc, argv)) return 2;
    const int32_t nv = argc > 1 ? atoi(argv[1]) : 49152;
    const int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (nv < 2 || nv > (1 << 22) || rounds < 1) {
        fprintf(stderr, "usage: bench_spec_verify [n_vocab in 2..4194304] [rounds >= 1]\n");
        return 2;
    }
    float *p = malloc(sizeof *p * (size_t)(TN + 1) * nv), *q = malloc(sizeof *q * (size_t)(TN + 1) * nv);
    float *scratch = malloc(sizeof *scratch * 2 * (size_t)nv);
    if (!p || !q || !scratch) return 1;
    /* peaked rows, as a model's are at temperature ~0.7: exp(8 u) */
    for (int r = 0; r <= TN; r++) {
        double sp = 0, sq = 0;
        for (int32_t i = 0; i < nv; i++) {
            p[(size_t)r * nv + i] = (float)exp(8 * uni(NULL));
            q[(size_t)r * nv + i] = (float)exp(8 * uni(NULL));
            sp += p[(size_t)r * nv + i], sq += q[(size_t)r * nv + i];
        }
        for (int32_t i = 0; i < nv; i++) p[(size_t)r * nv + i] /= (float)sp, q[(size_t)r * nv + i] /= (float)sq;
    }
    const char *names[6] = {"chain k4 sampled", "chain k4 deterministic", "chain k0 (bonus only)",
                            "tree 9 sampled", "tree 9 deterministic", "typical tree 9"};
    double best[6];
    for (int c = 0; c < 6; c++) best[c] = INFINITY;
    int32_t tok[TN], path[TN], next;
    int64_t sink = 0, acc[6] = {0};
    const int calls = 200;
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < 6; c++) {
            const double t0 = now_us();
            for (int it = 0; it < calls; it++) {
                for (int i = 0; i < TN; i++) tok[i] = (int32_t)(uni(NULL) * nv);
                int32_t a = 0;
                switch (c) {
                case 0: a = li_spec_verify_chain(p, q, nv, tok, K, uni, NULL, scratch, &next); break;
                case 1: a = li_spec_verify_chain(p, NULL, nv, tok, K, uni, NULL, scratch, &next); break;
                case 2: a = li_spec_verify_chain(p, q, nv, tok, 0, uni, NULL, scratch, &next); break;
                case 3: a = li_spec_verify_tree(p, q, nv, tok, TREE_PAR, TN, uni, NULL, scratch, path, &next); break;
                case 4: a = li_spec_verify_tree(p, NULL, nv, tok, TREE_PAR, TN, uni, NULL, scratch, path, &next); break;
                default: a = li_spec_verify_typical(p, nv, tok, TREE_PAR, TN, 0.09f, 0.3f, uni, NULL, path, &next);
                }
                acc[c] += a, sink += next;
            }
            const double us = (now_us() - t0) / calls;
            if (us < best[c]) best[c] = us;
        }
    }
    printf("n_vocab %d, best of %d rounds of %d calls (uniformly random draft ids)\n", nv, rounds,
           calls);
    for (int c = 0; c < 6; c++) {
        const double accepted = (double)acc[c] / ((double)calls * rounds);
        printf("  %-24s %8.1f us/call  (accepted %.2f/call)\n", names[c], best[c], accepted);
        cJSON *row = li_bench_results_row(&res, "name", names[c]);
        cJSON_AddNumberToObject(row, "us_per_call", best[c]);
        cJSON_AddNumberToObject(row, "accepted_per_call", accepted);
    }
    cJSON_AddNumberToObject(res.root, "n_vocab", nv);
    cJSON_AddNumberToObject(res.root, "rounds", rounds);
    char title[96];
    snprintf(title, sizeof title, "speculative verification, n_vocab %d, best of %d rounds", nv, rounds);
    li_bench_results_chart(&res, "name", "us_per_call", "us per call", title, false);
    free(p), free(q), free(scratch);
    if (li_bench_results_finish(&res)) return 1;
    return sink == 42 ? 1 : 0;
}
