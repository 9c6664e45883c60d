/* fuzz_policy_src.c — arbitrary policy source text, loaded and run in-process
 * (policy_lua.c, the sandbox the isolated host runs too) under a small
 * instruction budget and memory limit: the load, three schedule steps over a
 * fixed state of 4 requests, an admit, an evict over 6 candidates, an
 * on_finish, and a reload of the same text.
 *
 * The seeds (tools/gen_fuzz_corpus.py) are the shipped policies and the
 * hostile ones of issue 18: C-stack recursion through gsub/tostring, memory
 * bombs in compiled loops, endless loops, catastrophic patterns, plans of
 * 10^6 entries. Each must end as an error, never a crash or a hang.
 *
 * Invariants (abort() = a crash the fuzzer records):
 *  - a failure has a code and a message;
 *  - a plan has only ids in [0, 2^53], tokens in [1, 2^31), at most
 *    LI_PLAN_MAX_ENTRIES entries of each kind;
 *  - an eviction order has at most one entry per candidate;
 *  - an admit reason fits its buffer;
 *  - the Lua state never holds more than its hard cap (limit + 1/4). */
#define _GNU_SOURCE
#include "policy/policy_lua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEM_LIMIT ((size_t)8 << 20)
#define BUDGET 200000 /* VM instructions per call: a busy loop costs ~1 ms */
#define N_REQS 4
#define N_CANDS 6

static void fail(const char *what) {
    fprintf(stderr, "fuzz_policy_src: invariant broken: %s\n", what);
    abort();
}

static void check_err(int rc, const li_error *err) {
    if (rc && (!err->code || !err->msg[0])) fail("an error without a code or message");
}

static void check_mem(const li_policy *p) {
    /* + 1 MiB: what the C side pushes outside calls is never refused */
    if (li_policy_lua_mem_used(p) > MEM_LIMIT + MEM_LIMIT / 4 + (1 << 20)) fail("the Lua state grew past its hard cap");
}

static void check_plan(const li_plan *plan) {
    if (plan->n_run < 0 || plan->n_run > LI_PLAN_MAX_ENTRIES || plan->n_preempt < 0 ||
        plan->n_preempt > LI_PLAN_MAX_ENTRIES)
        fail("plan size");
    for (int32_t i = 0; i < plan->n_run; i++)
        if (plan->run[i].id < 0 || plan->run[i].id > ((int64_t)1 << 53) || plan->run[i].n_tokens < 1)
            fail("plan run entry");
    for (int32_t i = 0; i < plan->n_preempt; i++)
        if (plan->preempt[i] < 0 || plan->preempt[i] > ((int64_t)1 << 53)) fail("plan preempt id");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("LUAINFER_LOG", "error", 0); /* every seed fails on purpose: no warning per input */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (64 << 10)) return 0; /* policy files are small; keep each run fast */
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0; /* the text ends at its first NUL, as a C string source does */

    li_policy_lua_opts o = {.mem_limit = MEM_LIMIT, .instr_budget = BUDGET};
    li_policy *p = NULL;
    li_error err = {0};
    int rc = li_policy_lua_open(&p, "fuzz.lua", src, &o, &err);
    check_err(rc, &err);
    if (rc) {
        free(src);
        return 0;
    }
    check_mem(p);

    static const char *const tenants[N_REQS] = {"", "a", "b", "a"};
    li_req_view reqs[N_REQS];
    for (int i = 0; i < N_REQS; i++)
        reqs[i] = (li_req_view){.id = 10 + i, .state = (li_req_state)(i % 3), .arrival = 0.5 * i, .priority = i - 1,
                                .tenant = tenants[i], .prompt_len = 20 + i, .num_tokens = 24 + i,
                                .num_computed = i == 0 ? 0 : 23 + i, .num_generated = 4, .max_tokens = 32,
                                .n_blocks = i == 0 ? 0 : 2, .spec_acceptance = i == 2 ? 0.5 : -1};
    li_step_state st = {.step = 1, .now = 2.0, .reqs = reqs, .n_reqs = N_REQS, .kv_free_blocks = 10,
                        .kv_total_blocks = 20, .kv_cached_blocks = 3, .block_size = 16, .max_num_seqs = 8,
                        .max_batched_tokens = 64};
    li_plan plan = {0};
    for (int step = 1; step <= 3; step++) {
        st.step = step;
        li_plan_clear(&plan);
        li_error e = {0};
        if (p->has_schedule) {
            int r = p->ops->schedule(p, &st, &plan, &e);
            check_err(r, &e);
            if (r == 0) check_plan(&plan);
        }
        check_mem(p);
    }
    li_plan_free(&plan);

    bool accept;
    char reason[64];
    li_error e = {0};
    int r = p->ops->admit(p, &reqs[0], &st, &accept, reason, sizeof reason, &e);
    check_err(r, &e);
    if (!memchr(reason, 0, sizeof reason)) fail("admit reason not terminated");

    li_evict_candidate cands[N_CANDS];
    for (int i = 0; i < N_CANDS; i++) cands[i] = (li_evict_candidate){.block = 100 + i, .last_access = i, .hits = i, .depth = i};
    int32_t order[N_CANDS], n_order = 0;
    e = (li_error){0};
    r = p->ops->evict(p, cands, N_CANDS, 2, order, &n_order, &e);
    check_err(r, &e);
    if (n_order < 0 || n_order > N_CANDS) fail("evict order length");

    p->ops->on_finish(p, &reqs[1], "stop");
    check_mem(p);

    e = (li_error){0};
    r = p->ops->reload(p, "fuzz.lua", src, &e);
    check_err(r, &e);
    check_mem(p);
    p->ops->free(p);
    free(src);
    return 0;
}
