/* test_fcfs.c — the C fallback FCFS (li_policy_fcfs_plan) and Lua's
 * policy.fcfs (lua/luainfer/policy.lua, run in-process like any policy)
 * make the same plans:
 *  - a few fixed states with the plan written out (decode + chunked prefill,
 *    preempting the latest-arrived, self-preemption, a blocked queue head,
 *    a cached prefix counted as computed);
 *  - 5000 random step states (mixes of waiting, running, preempted and
 *    forked requests, drafts, cached prefixes, tight and loose budgets and
 *    free blocks): the two plans are equal, and every branch of the
 *    algorithm is taken many times (so the comparison is not vacuous);
 *  - admission against projected blocks under KV pressure (fixed states, and
 *    in the random ones: projections, earlier preemptions and the running
 *    set's need vary, and the projection changes the plan often): the
 *    projected peak lets in a request that ends before the running one does
 *    (where the sum of projections would hold it: counted in the random
 *    states), and past 256 members the sum decides. */
#include "policy/policy_lua.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQS 40

typedef struct fx {
    li_req_view r[MAX_REQS];
    li_step_state st;
} fx;

static const char *plan_str(const li_plan *p, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < p->n_run && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld:%d", i ? " " : "", (long long)p->run[i].id, p->run[i].n_tokens);
    if (p->n_preempt && n < cap) n += (size_t)snprintf(buf + n, cap - n, " | preempt");
    for (int32_t i = 0; i < p->n_preempt && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, " %lld", (long long)p->preempt[i]);
    return buf;
}

static li_policy *open_fcfs(void) {
    static const char src[] = "local policy = require('luainfer.policy')\n"
                              "return { schedule = function(state) return policy.fcfs(state) end }\n";
    li_policy *p = NULL;
    li_error err = {0};
    int rc = li_policy_lua_open(&p, NULL, src, NULL, &err);
    CHECK(rc == 0, "open policy.fcfs: %s", err.msg);
    return rc ? NULL : p;
}

/* Both plans for st; returns whether they are equal (c_out gets C's). */
static bool both(li_policy *p, const li_step_state *st, char *c_out, char *lua_out, size_t cap) {
    li_plan pc, pl;
    li_plan_init(&pc);
    li_plan_init(&pl);
    li_policy_fcfs_plan(st, &pc);
    li_error err = {0};
    int rc = p->ops->schedule(p, st, &pl, &err);
    plan_str(&pc, c_out, cap);
    if (rc) snprintf(lua_out, cap, "error: %s", err.msg);
    else plan_str(&pl, lua_out, cap);
    li_plan_free(&pc);
    li_plan_free(&pl);
    return rc == 0 && !strcmp(c_out, lua_out);
}

/* ---- fixed states ------------------------------------------------------------ */

static void fx_init(fx *f, int32_t free_blocks, int32_t seqs, int32_t tokens) {
    memset(f, 0, sizeof *f);
    f->st = (li_step_state){.now = 100, .reqs = f->r, .kv_free_blocks = free_blocks, .kv_total_blocks = 1000,
                            .block_size = 16, .max_num_seqs = seqs, .max_batched_tokens = tokens};
}

static void fx_add(fx *f, int64_t id, li_req_state s, int64_t prompt, int64_t gen, int64_t computed) {
    f->r[f->st.n_reqs++] = (li_req_view){.id = id, .state = s, .arrival = (double)id, .tenant = "",
                                         .prompt_len = prompt, .num_tokens = prompt + gen,
                                         .num_computed = computed, .num_generated = gen, .max_tokens = 100,
                                         .n_blocks = (int32_t)((computed + 15) / 16), .spec_acceptance = -1};
}

/* What the engine projects (engine.c: the KV of prompt + max_tokens - 1
 * tokens) and the running set's sum of it. */
static void fx_project(fx *f) {
    f->st.kv_running_need = 0;
    for (int32_t i = 0; i < f->st.n_reqs; i++) {
        li_req_view *v = &f->r[i];
        const int64_t bs = f->st.block_size, end = LI_MAX(v->prompt_len + v->max_tokens - 1, v->num_tokens);
        v->projected_blocks = (int32_t)LI_MAX(0, (end + bs - 1) / bs - v->n_blocks);
        if (v->state == LI_REQ_RUNNING) f->st.kv_running_need += v->projected_blocks;
    }
}

static void expect(li_policy *p, const fx *f, const char *want, const char *what) {
    char c[4096], l[4096];
    both(p, &f->st, c, l, sizeof c);
    CHECK(!strcmp(c, want), "%s: C plan \"%s\", want \"%s\"", what, c, want);
    CHECK(!strcmp(l, want), "%s: Lua plan \"%s\", want \"%s\"", what, l, want);
}

static void test_fixed(li_policy *p) {
    fx f;
    fx_init(&f, 100, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 5, 14);
    fx_add(&f, 2, LI_REQ_RUNNING, 100, 0, 32);
    fx_add(&f, 3, LI_REQ_WAITING, 50, 0, 0);
    fx_add(&f, 4, LI_REQ_PREEMPTED, 30, 2, 0);
    expect(p, &f, "1:1 2:68 4:32 3:27", "decode, prefill rest, preempted before waiting, chunked");

    /* 1 decodes at a block boundary with no free block: 3 (latest running) goes */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 16, 0, 15);
    fx_add(&f, 2, LI_REQ_RUNNING, 32, 1, 32);
    fx_add(&f, 3, LI_REQ_RUNNING, 20, 1, 20);
    expect(p, &f, "1:1 2:1 | preempt 3", "latest-arrived running request is preempted");

    /* the only running request cannot get one token: it preempts itself */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 32, 1, 32);
    expect(p, &f, " | preempt 1", "self-preemption");

    /* a waiting head that does not fit stops the queue */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_WAITING, 40, 0, 0);
    fx_add(&f, 2, LI_REQ_WAITING, 5, 0, 0);
    expect(p, &f, "", "no overtaking the queue head");

    /* a cached prefix: 2 blocks already held count as computed */
    fx_init(&f, 1, 8, 128);
    fx_add(&f, 1, LI_REQ_WAITING, 40, 0, 32);
    expect(p, &f, "1:8", "cached prefix");
}

static bool in_run(const li_plan *pc, int64_t id, int32_t *tok);

/* ---- projected admission ------------------------------------------------------- */

static void test_projected(li_policy *p) {
    fx f;
    /* under pressure (2 is preempted), 10 blocks free. 1 holds 1 block and
     * needs 6 more by its end (109 tokens of KV, 95 steps on); 2 (22 tokens
     * of KV to recompute, max_tokens 100) would need 8 and outlive 1, so
     * both at 1's last step need 14: 2 waits, and 3 behind it */
    fx_init(&f, 10, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 5, 14);
    fx_add(&f, 2, LI_REQ_PREEMPTED, 20, 3, 0);
    fx_add(&f, 3, LI_REQ_WAITING, 5, 0, 0);
    f.r[1].n_preemptions = 1;
    fx_project(&f);
    expect(p, &f, "1:1", "a preempted request resumes only when it can finish");
    /* 1 goes on to 159 tokens (9 more blocks), 2 stops at 59 (4 blocks, 37
     * steps): the sum of the projections (13) exceeds the 10 free, but the
     * peak is 9 (1 alone at its end; 7 at 2's last step): 2 resumes */
    f.r[0].max_tokens = 150;
    f.r[1].max_tokens = 40;
    f.r[2].max_tokens = 160;
    fx_project(&f);
    expect(p, &f, "1:1 2:23", "a request that finishes before the running one ends resumes beside it");
    f.r[2].max_tokens = 20; /* 3 ends after 20 steps: 7 at its last step */
    fx_project(&f);
    expect(p, &f, "1:1 2:23 3:5", "the peak is shared in queue order");

    /* no pressure: admission is optimistic (3 needs more than the headroom) */
    fx_init(&f, 10, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 5, 14);
    fx_add(&f, 3, LI_REQ_WAITING, 5, 0, 0);
    f.r[0].projected_blocks = 8;
    f.r[1].projected_blocks = 9;
    f.st.kv_running_need = 8;
    expect(p, &f, "1:1 3:5", "optimistic admission without pressure");
    f.r[0].n_preemptions = 1; /* a live request was preempted before: pressure */
    expect(p, &f, "1:1", "a request preempted before keeps admission conservative");

    /* progress: nothing runs, so the head runs even though it cannot finish */
    fx_init(&f, 2, 8, 128);
    fx_add(&f, 2, LI_REQ_PREEMPTED, 40, 10, 0);
    f.r[0].projected_blocks = 9;
    expect(p, &f, "2:32", "the queue head runs when nothing else does");

    /* a victim gives back its blocks and its projection */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 32, 1, 32);
    fx_add(&f, 2, LI_REQ_RUNNING, 20, 1, 20);
    fx_add(&f, 3, LI_REQ_WAITING, 4, 0, 0);
    f.r[0].projected_blocks = 1;
    f.r[1].projected_blocks = 3;
    f.r[2].projected_blocks = 1;
    f.st.kv_running_need = 4;
    /* 1 takes 1 of 2's 2 blocks; headroom -4 + 2 + 3 = 1 holds 3 */
    expect(p, &f, "1:1 3:4 | preempt 2", "a victim's projection returns to the headroom");
    f.r[2].projected_blocks = 2;
    expect(p, &f, "1:1 | preempt 2", "and no more than that");
}

/* Past FCFS_PEAK_MAX (256) members the sum of projections decides: n running
 * decodes that need no more blocks and end within 5 steps, and a preempted
 * request that needs 8 blocks with 5 free. The peak lets it in (they are all
 * gone long before it needs the eighth block), the sum does not. */
static void test_peak_cap(li_policy *p) {
    for (int32_t n = 200; n <= 300; n += 100) {
        li_req_view *r = calloc((size_t)n + 1, sizeof *r);
        CHECK(r != NULL, "calloc");
        if (!r) return;
        for (int32_t i = 0; i < n; i++)
            r[i] = (li_req_view){.id = i + 1, .state = LI_REQ_RUNNING, .arrival = i, .tenant = "", .prompt_len = 10,
                                 .num_tokens = 11, .num_computed = 10, .num_generated = 1, .max_tokens = 6,
                                 .n_blocks = 1, .spec_acceptance = -1};
        r[n] = (li_req_view){.id = n + 1, .state = LI_REQ_PREEMPTED, .arrival = n, .tenant = "", .prompt_len = 20,
                             .num_tokens = 20, .max_tokens = 100, .n_preemptions = 1, .projected_blocks = 8,
                             .spec_acceptance = -1};
        const li_step_state st = {.now = 100, .reqs = r, .n_reqs = n + 1, .kv_free_blocks = 5,
                                  .kv_total_blocks = 1000, .block_size = 16, .max_num_seqs = 400,
                                  .max_batched_tokens = 1000};
        char c[8192], l[8192];
        CHECK(both(p, &st, c, l, sizeof c), "%d running: C and Lua differ:\n  C:   %.200s\n  Lua: %.200s", n, c, l);
        li_plan pc;
        li_plan_init(&pc);
        li_policy_fcfs_plan(&st, &pc);
        const bool admitted = in_run(&pc, n + 1, NULL);
        CHECK(admitted == (n < 256), "%d running: the preempted request is %s", n, admitted ? "admitted" : "held");
        li_plan_free(&pc);
        free(r);
    }
}

/* ---- random states ------------------------------------------------------------- */

static int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_u32() % (uint32_t)(hi - lo + 1)); }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int n_forked; /* fork children random_state made */

/* A random but engine-like state: requests in arrival order (ties: samples
 * of one prompt), running ones holding the blocks their computed tokens
 * need (sometimes one more: a block reserved ahead), queued ones whose
 * cached prefix counts as computed blocks, as the engine's views say. */
static void random_state(fx *f) {
    static const int32_t sizes[] = {1, 2, 4, 16, 32};
    const int32_t bs = sizes[rnd(0, 4)];
    const bool tight = rnd(0, 1);
    memset(f, 0, sizeof *f);
    f->st = (li_step_state){.step = rnd(1, 1000), .now = 50, .reqs = f->r, .block_size = bs,
                            .kv_free_blocks = (int32_t)(tight ? rnd(0, 3) : rnd(0, 200)),
                            .max_num_seqs = (int32_t)(tight ? rnd(1, 4) : rnd(1, 32)),
                            .max_batched_tokens = (int32_t)(tight ? rnd(1, 24) : rnd(1, 600))};
    f->st.kv_total_blocks = f->st.kv_free_blocks + 500;
    const int32_t n = (int32_t)(tight ? rnd(0, 6) : rnd(0, MAX_REQS));
    double t = 0;
    for (int32_t i = 0; i < n; i++) {
        li_req_view *v = &f->r[i];
        const int64_t prompt = rnd(1, rnd(0, 3) ? 40 : 300);
        /* a fork child: the previous request's sample, same prompt and arrival,
         * sharing (and counting) the same blocks */
        if (i > 0 && f->r[i - 1].state == LI_REQ_RUNNING && rnd(0, 4) == 0) {
            *v = f->r[i - 1];
            v->id++;
            v->num_tokens = v->num_computed + 1;
            v->num_generated = v->num_tokens - v->prompt_len;
            f->st.n_reqs++;
            n_forked++;
            continue;
        }
        t += rnd(0, 3) ? 1.0 : 0.0;
        *v = (li_req_view){.id = i ? f->r[i - 1].id + 1 : 1, .arrival = t, .tenant = "", .prompt_len = prompt,
                           .max_tokens = 64, .spec_acceptance = -1};
        const int64_t r = rnd(0, 9);
        if (r < 5) {
            v->state = LI_REQ_RUNNING;
            if (rnd(0, 2)) { /* decoding, maybe with drafts at the end */
                const int64_t gen = rnd(1, 30);
                v->num_computed = prompt + gen - 1;
                v->num_tokens = prompt + gen + (rnd(0, 3) ? 0 : rnd(1, 4));
                v->num_generated = gen;
            } else { /* mid-prefill */
                v->num_computed = rnd(1, prompt);
                v->num_tokens = prompt;
            }
            v->n_blocks = (int32_t)(ceil_div(v->num_computed, bs) + (rnd(0, 5) == 0));
            if (rnd(0, 5) == 0) v->n_preemptions = (int32_t)rnd(1, 3);
        } else {
            v->state = r < 7 ? LI_REQ_WAITING : LI_REQ_PREEMPTED;
            const int64_t gen = v->state == LI_REQ_PREEMPTED ? rnd(0, 30) : 0;
            v->num_tokens = prompt + gen;
            v->num_generated = gen;
            /* a cache hit leaves at least one token to compute */
            const int64_t hits = rnd(0, 2) ? 0 : rnd(0, (v->num_tokens - 1) / bs);
            v->num_computed = hits * bs;
            v->cached_len = v->num_computed;
            v->n_blocks = (int32_t)hits;
            /* beyond what the engine hands over today (its queued requests
             * hold whole cached blocks only), so that a blocked queue head
             * can differ from a later request that still fits: the two
             * must agree on any state a policy may be given */
            if (rnd(0, 4) == 0) {
                v->num_computed = rnd(0, v->num_tokens - 1);
                v->n_blocks = (int32_t)ceil_div(v->num_computed, bs);
            }
            if (v->state == LI_REQ_PREEMPTED) v->n_preemptions = (int32_t)rnd(1, 3);
        }
        /* what the engine projects: the KV of prompt + max_tokens - 1 tokens */
        const int64_t end = LI_MAX(v->prompt_len + v->max_tokens - 1, v->num_tokens);
        v->projected_blocks = (int32_t)LI_MAX(0, ceil_div(end, bs) - v->n_blocks);
        if (rnd(0, 5) == 0) v->projected_blocks = (int32_t)rnd(0, 8);
        f->st.n_reqs++;
    }
    for (int32_t i = 0; i < f->st.n_reqs; i++)
        if (f->r[i].state == LI_REQ_RUNNING) f->st.kv_running_need += f->r[i].projected_blocks;
    if (rnd(0, 5) == 0) f->st.kv_running_need = (int32_t)rnd(0, 50);
}

/* Whether the projection changed C's plan for this state (coverage: the
 * plan without it, every projection 0, differs). */
static bool projection_mattered(const fx *f) {
    fx g = *f;
    g.st.reqs = g.r;
    g.st.kv_running_need = 0;
    for (int32_t i = 0; i < g.st.n_reqs; i++) g.r[i].projected_blocks = 0;
    li_plan a, b;
    li_plan_init(&a);
    li_plan_init(&b);
    li_policy_fcfs_plan(&f->st, &a);
    li_policy_fcfs_plan(&g.st, &b);
    char sa[8192], sb[8192];
    const bool diff = strcmp(plan_str(&a, sa, sizeof sa), plan_str(&b, sb, sizeof sb)) != 0;
    li_plan_free(&a);
    li_plan_free(&b);
    return diff;
}

/* Which branches a plan took, read from the state and the plan. */
typedef struct coverage {
    int victim, self, queue_shrunk, running_shrunk, blocked, budget_out, seqs_out, equal_plans, projected;
    int peak_let_in; /* under pressure, a queued request admitted beside running ones although the sum
                      * of projections (its own over the headroom) would have held it */
} coverage;

static bool in_run(const li_plan *pc, int64_t id, int32_t *tok) {
    for (int32_t k = 0; k < pc->n_run; k++)
        if (pc->run[k].id == id) {
            if (tok) *tok = pc->run[k].n_tokens;
            return true;
        }
    return false;
}

static void cover(const fx *f, const li_plan *pc, coverage *c) {
    const li_step_state *st = &f->st;
    int64_t used = 0;
    for (int32_t k = 0; k < pc->n_run; k++) used += pc->run[k].n_tokens;
    int32_t first_running = -1;
    for (int32_t i = 0; i < st->n_reqs && first_running < 0; i++)
        if (st->reqs[i].state == LI_REQ_RUNNING) first_running = i;
    for (int32_t k = 0; k < pc->n_preempt; k++) {
        /* the earliest running request has nobody before it to be a victim of */
        if (first_running >= 0 && pc->preempt[k] == st->reqs[first_running].id) c->self++;
        else c->victim++;
    }
    bool blocked = false;
    for (int32_t i = 0; i < st->n_reqs; i++) {
        const li_req_view *v = &st->reqs[i];
        int32_t tok = 0;
        const bool run = in_run(pc, v->id, &tok);
        const int64_t rest = v->num_tokens - v->num_computed;
        /* fewer tokens than it has left although the token budget had more: blocks ran short */
        if (run && tok < rest && used < st->max_batched_tokens) {
            if (v->state == LI_REQ_RUNNING) c->running_shrunk++;
            else c->queue_shrunk++;
        }
        if (v->state != LI_REQ_RUNNING && !run && rest > 0 && used < st->max_batched_tokens &&
            pc->n_run < st->max_num_seqs)
            blocked = true;
    }
    c->blocked += blocked;
    bool pressure = false, any_running = false;
    for (int32_t i = 0; i < st->n_reqs; i++) {
        pressure |= st->reqs[i].state == LI_REQ_PREEMPTED || st->reqs[i].n_preemptions > 0;
        any_running |= st->reqs[i].state == LI_REQ_RUNNING && in_run(pc, st->reqs[i].id, NULL);
    }
    if (pressure && any_running && pc->n_preempt == 0) {
        const int64_t headroom = (int64_t)st->kv_free_blocks - st->kv_running_need;
        bool let_in = false;
        for (int32_t i = 0; i < st->n_reqs; i++)
            let_in |= st->reqs[i].state != LI_REQ_RUNNING && in_run(pc, st->reqs[i].id, NULL) &&
                      st->reqs[i].projected_blocks > headroom;
        c->peak_let_in += let_in;
    }
    c->budget_out += used == st->max_batched_tokens;
    c->seqs_out += pc->n_run == st->max_num_seqs;
}

static void test_random(li_policy *p) {
    rng_seed(0x5eedfcf5);
    coverage cov = {0};
    int bad = 0;
    const int N = 5000;
    for (int it = 0; it < N; it++) {
        fx f;
        random_state(&f);
        char c[8192], l[8192];
        if (both(p, &f.st, c, l, sizeof c)) {
            cov.equal_plans++;
            li_plan pc;
            li_plan_init(&pc);
            li_policy_fcfs_plan(&f.st, &pc);
            cover(&f, &pc, &cov);
            cov.projected += projection_mattered(&f);
            li_plan_free(&pc);
        } else if (bad++ < 5) {
            fprintf(stderr, "state %d (block_size %d, free %d, seqs %d, tokens %d):\n", it, f.st.block_size,
                    f.st.kv_free_blocks, f.st.max_num_seqs, f.st.max_batched_tokens);
            for (int32_t i = 0; i < f.st.n_reqs; i++) {
                const li_req_view *v = &f.r[i];
                fprintf(stderr, "  id %lld state %d arrival %g tokens %lld computed %lld blocks %d\n",
                        (long long)v->id, v->state, v->arrival, (long long)v->num_tokens,
                        (long long)v->num_computed, v->n_blocks);
            fprintf(stderr, "    projected %d preemptions %d (running need %d)\n", v->projected_blocks,
                    v->n_preemptions, f.st.kv_running_need);
            }
            fprintf(stderr, "  C:   %s\n  Lua: %s\n", c, l);
        }
    }
    CHECK(bad == 0, "%d of %d random states give different plans", bad, N);
    printf("random states: %d equal; victims %d, self-preemptions %d, shrunk prefill %d (running) %d (queued), "
           "queue blocked %d, token budget spent %d, seqs spent %d, fork children %d, projection mattered %d, "
           "peak let in %d\n",
           cov.equal_plans, cov.victim, cov.self, cov.running_shrunk, cov.queue_shrunk, cov.blocked,
           cov.budget_out, cov.seqs_out, n_forked, cov.projected, cov.peak_let_in);
    /* every branch is exercised often enough that a change to it shows */
    CHECK(cov.victim > 20 && cov.self > 20 && cov.running_shrunk > 20 && cov.queue_shrunk > 20 &&
              cov.blocked > 20 && cov.budget_out > 20 && cov.seqs_out > 20 && n_forked > 20 && cov.projected > 20 &&
              cov.peak_let_in > 20,
          "random states miss a branch (see the counts above)");
}

int main(void) {
    li_policy *p = open_fcfs();
    if (!p) return t_summary("test_fcfs");
    test_fixed(p);
    test_projected(p);
    test_random(p);
    test_peak_cap(p);
    p->ops->free(p);
    return t_summary("test_fcfs");
}
