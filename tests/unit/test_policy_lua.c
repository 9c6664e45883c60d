/* test_policy_lua.c — in-process Lua policies:
 *  - every shipped policy turns a synthetic step state into the exact plan
 *    its comments promise (default = the engine's FCFS, static, priority,
 *    sjf, fair);
 *  - the sandbox hides io/os.execute/require/debug/load/ffi/jit, keeps
 *    math.random deterministic, and a memory bomb is a clear error;
 *  - garbage plans and erroring policies are errors, never crashes;
 *  - hot reload swaps on success and keeps the old policy on failure;
 *  - request tables are the same objects from step to step;
 *  - the speculate hook sees every field of req.speculation and state.spec,
 *    kept in place from call to call, absent ones removed;
 *  - a runaway loop is stopped by the instruction budget (interpreter);
 *  - the hostile policies of issue 18 (C-stack recursion, backtracking,
 *    compiled loops, memory in hot loops, oversized plans) are errors;
 *    policy files must be regular files;
 *  - timing of one schedule() with 64 running requests (printed). */
#define _POSIX_C_SOURCE 200809L
#include "policy/policy_lua.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- fixtures ------------------------------------------------------------- */

typedef struct fx {
    li_req_view r[256];
    char tenants[256][16];
    li_step_state st;
} fx;

static void fx_init(fx *f, int32_t free_blocks, int32_t max_seqs, int32_t max_tokens) {
    memset(f, 0, sizeof *f);
    f->st = (li_step_state){.step = 0, .now = 100, .reqs = f->r, .kv_free_blocks = free_blocks,
                            .kv_total_blocks = 1000, .kv_cached_blocks = 0, .block_size = 16,
                            .max_num_seqs = max_seqs, .max_batched_tokens = max_tokens};
}

/* A request with `prompt` prompt tokens, `gen` generated, `computed` of them
 * in the KV cache; blocks = ceil(computed / 16). */
static li_req_view *fx_add(fx *f, int64_t id, li_req_state s, int64_t prompt, int64_t gen, int64_t computed) {
    li_req_view *v = &f->r[f->st.n_reqs++];
    *v = (li_req_view){.id = id, .state = s, .arrival = (double)id, .priority = 0, .tenant = "",
                       .prompt_len = prompt, .num_tokens = prompt + gen, .num_computed = computed,
                       .num_generated = gen, .max_tokens = 100, .cached_len = 0,
                       .n_blocks = (int32_t)((computed + 15) / 16), .n_preemptions = 0, .spec_acceptance = -1};
    return v;
}
static li_req_view *fx_decode(fx *f, int64_t id, int64_t prompt, int64_t gen) {
    return fx_add(f, id, LI_REQ_RUNNING, prompt, gen, prompt + gen - 1);
}
static li_req_view *fx_wait(fx *f, int64_t id, int64_t prompt) { return fx_add(f, id, LI_REQ_WAITING, prompt, 0, 0); }

static const char *plan_str(const li_plan *p) {
    static char buf[2048];
    size_t n = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < p->n_run; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%lld:%d", i ? " " : "", (long long)p->run[i].id,
                              p->run[i].n_tokens);
    if (p->n_preempt) {
        n += (size_t)snprintf(buf + n, sizeof buf - n, " | preempt");
        for (int32_t i = 0; i < p->n_preempt; i++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, " %lld", (long long)p->preempt[i]);
    }
    return buf;
}

static const char *src_dir(void) {
    const char *d = getenv("LUAINFER_SOURCE_DIR");
    return d && *d ? d : ".";
}

static li_policy *open_file(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", src_dir(), rel);
    li_policy *p = NULL;
    li_error err = {0};
    int rc = li_policy_lua_open(&p, path, NULL, NULL, &err);
    CHECK(rc == 0, "open %s: %s", rel, err.msg);
    return p;
}

static li_policy *open_src(const char *src, const li_policy_lua_opts *o) {
    li_policy *p = NULL;
    li_error err = {0};
    int rc = li_policy_lua_open(&p, NULL, src, o, &err);
    CHECK(rc == 0, "open source: %s\n%s", err.msg, src);
    return p;
}

/* Runs schedule and compares the plan; returns the rc. */
static int expect_plan(li_policy *p, const li_step_state *st, const char *want, const char *what) {
    li_plan plan;
    li_plan_init(&plan);
    li_error err = {0};
    int rc = p ? p->ops->schedule(p, st, &plan, &err) : -1;
    CHECK(rc == 0, "%s: schedule failed: %s", what, err.msg);
    if (rc == 0) CHECK(strcmp(plan_str(&plan), want) == 0, "%s: plan \"%s\", want \"%s\"", what, plan_str(&plan), want);
    li_plan_free(&plan);
    return rc;
}

/* Runs schedule expecting an error whose message contains `needle`. */
static void expect_error(li_policy *p, const li_step_state *st, const char *needle, const char *what) {
    li_plan plan;
    li_plan_init(&plan);
    li_error err = {0};
    int rc = p ? p->ops->schedule(p, st, &plan, &err) : 0;
    CHECK(rc != 0, "%s: expected an error, got plan \"%s\"", what, plan_str(&plan));
    CHECK(rc == 0 || strstr(err.msg, needle), "%s: error \"%s\" lacks \"%s\"", what, err.msg, needle);
    CHECK(plan.n_run == 0 && plan.n_preempt == 0, "%s: failed schedule left a plan", what);
    li_plan_free(&plan);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- shipped policies ------------------------------------------------------ */

static void test_default(void) {
    li_policy *p = open_file("policies/default.lua");
    if (!p) return;
    CHECK(p->has_schedule, "default has schedule");
    fx f;
    /* decodes first, the running prefill's rest, then waiting with chunked
     * prefill until the token budget (128) is spent */
    fx_init(&f, 100, 8, 128);
    fx_decode(&f, 1, 10, 5);
    fx_decode(&f, 2, 20, 3);
    fx_add(&f, 3, LI_REQ_RUNNING, 100, 0, 32); /* mid-prefill: 68 left */
    fx_wait(&f, 4, 50);
    fx_wait(&f, 5, 30);
    expect_plan(p, &f.st, "1:1 2:1 3:68 4:50 5:8", "default: chunked prefill");
    /* max_num_seqs */
    f.st.max_num_seqs = 3;
    expect_plan(p, &f.st, "1:1 2:1 3:68", "default: max_num_seqs");
    /* preempted requests are admitted before waiting ones */
    fx_init(&f, 100, 8, 128);
    fx_wait(&f, 1, 40);
    fx_add(&f, 2, LI_REQ_PREEMPTED, 20, 2, 0);
    expect_plan(p, &f.st, "2:22 1:40", "default: preempted first");
    /* no free blocks: running 1 needs a block -> latest-arrived running (3)
     * is preempted; waiting 4 gets what the freed blocks hold */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 7, 16); /* token 17 needs block 2 */
    fx_add(&f, 2, LI_REQ_RUNNING, 20, 12, 31);
    fx_add(&f, 3, LI_REQ_RUNNING, 40, 1, 40); /* 3 blocks */
    fx_wait(&f, 4, 50);
    expect_plan(p, &f.st, "1:1 2:1 4:32 | preempt 3", "default: preemption");
    /* the head of the queue does not fit at all: nobody overtakes it */
    fx_init(&f, 0, 8, 128);
    fx_wait(&f, 1, 50);
    fx_wait(&f, 2, 5);
    expect_plan(p, &f.st, "", "default: head-of-line");
    /* a lone running request with no block to grow into preempts itself */
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 7, 16);
    expect_plan(p, &f.st, " | preempt 1", "default: self-preemption");
    p->ops->free(p);
}

static void test_static(void) {
    li_policy *p = open_file("policies/static.lua");
    if (!p) return;
    fx f;
    fx_init(&f, 100, 2, 512);
    fx_wait(&f, 1, 10);
    fx_wait(&f, 2, 20);
    fx_wait(&f, 3, 30);
    expect_plan(p, &f.st, "1:10 2:20", "static: batch of max_num_seqs");
    /* the batch runs: 3 and the newcomer 4 wait although there is room */
    f.st.max_num_seqs = 8;
    fx_init(&f, 100, 8, 512);
    fx_decode(&f, 1, 10, 1);
    fx_decode(&f, 2, 20, 1);
    fx_wait(&f, 3, 30);
    fx_wait(&f, 4, 5);
    expect_plan(p, &f.st, "1:1 2:1", "static: nothing joins a running batch");
    fx_init(&f, 100, 8, 512);
    fx_decode(&f, 2, 20, 2); /* 1 finished */
    fx_wait(&f, 3, 30);
    fx_wait(&f, 4, 5);
    expect_plan(p, &f.st, "2:1", "static: batch runs to completion");
    fx_init(&f, 100, 8, 512);
    fx_wait(&f, 3, 30);
    fx_wait(&f, 4, 5);
    expect_plan(p, &f.st, "3:30 4:5", "static: next batch");
    p->ops->free(p);
}

static void test_priority(void) {
    li_policy *p = open_file("policies/priority.lua");
    if (!p) return;
    fx f;
    fx_init(&f, 100, 8, 512);
    fx_decode(&f, 1, 10, 1);
    fx_wait(&f, 2, 10);
    fx_wait(&f, 3, 20)->priority = 1;
    fx_wait(&f, 4, 30)->priority = 9;
    expect_plan(p, &f.st, "4:30 3:20 1:1 2:10", "priority: ordering");
    /* no free blocks: the important newcomer preempts the running one */
    fx_init(&f, 0, 8, 512);
    fx_add(&f, 1, LI_REQ_RUNNING, 20, 12, 31)->priority = 0; /* 2 blocks */
    fx_wait(&f, 2, 32)->priority = 5;
    expect_plan(p, &f.st, "2:32 | preempt 1", "priority: preempts lower");
    /* ... but never one of its own priority */
    f.r[0].priority = 5;
    expect_plan(p, &f.st, "1:1", "priority: equal priority not preempted");
    p->ops->free(p);
}

static void test_sjf(void) {
    li_policy *p = open_file("policies/sjf.lua");
    if (!p) return;
    fx f;
    fx_init(&f, 100, 8, 512);
    fx_wait(&f, 1, 100)->max_tokens = 100; /* 200 */
    fx_wait(&f, 2, 10)->max_tokens = 10;   /* 20 */
    fx_wait(&f, 3, 50)->max_tokens = 5;    /* 55 */
    expect_plan(p, &f.st, "2:10 3:50 1:100", "sjf: shortest first");
    /* blocks short: the longest running job is preempted */
    fx_init(&f, 0, 8, 512);
    li_req_view *a = fx_add(&f, 1, LI_REQ_RUNNING, 10, 7, 16); /* needs a block, short */
    a->max_tokens = 10;
    li_req_view *b = fx_add(&f, 2, LI_REQ_RUNNING, 40, 1, 40);
    b->max_tokens = 1000;
    li_req_view *c = fx_add(&f, 3, LI_REQ_RUNNING, 20, 12, 31);
    c->max_tokens = 20;
    expect_plan(p, &f.st, "1:1 3:1 | preempt 2", "sjf: longest preempted");
    p->ops->free(p);
}

static void test_fair(void) {
    li_policy *p = open_file("policies/fair.lua");
    if (!p) return;
    fx f;
    fx_init(&f, 100, 8, 120);
    fx_wait(&f, 1, 100)->tenant = "a";
    fx_wait(&f, 2, 100)->tenant = "a";
    fx_wait(&f, 3, 100)->tenant = "b";
    expect_plan(p, &f.st, "1:60 3:60", "fair: equal shares, step 0");
    f.st.step = 1;
    expect_plan(p, &f.st, "3:60 1:60", "fair: rotation, step 1");
    /* a light tenant (3 decodes) gets what it needs, the heavy one the rest,
     * interleaved round-robin */
    fx_init(&f, 100, 8, 64);
    fx_decode(&f, 1, 10, 1)->tenant = "a";
    fx_decode(&f, 2, 10, 1)->tenant = "a";
    fx_decode(&f, 3, 10, 1)->tenant = "a";
    fx_wait(&f, 4, 200)->tenant = "b";
    expect_plan(p, &f.st, "1:1 4:61 2:1 3:1", "fair: max-min shares");
    p->ops->free(p);
}

/* ---- sandbox ------------------------------------------------------------------ */

static void test_sandbox(void) {
    static const char *hidden[] = {
        "io", "os.execute", "os.exit", "os.getenv", "os.remove", "package", "debug", "load", "loadstring",
        "dofile", "loadfile", "ffi", "jit", "getfenv", "setfenv", "module", "newproxy", "collectgarbage",
        "string.dump", "coroutine",
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(hidden); i++) {
        char src[256];
        snprintf(src, sizeof src, "assert(%s == nil, '%s is visible'); return {}", hidden[i], hidden[i]);
        li_policy *p = open_src(src, NULL);
        if (p) p->ops->free(p);
    }
    static const char *visible[] = {
        "string.format", "string.rep", "table.insert", "table.sort", "math.floor", "math.random", "bit.band",
        "os.clock", "os.time", "pairs", "ipairs", "pcall", "setmetatable", "tostring", "unpack", "print",
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(visible); i++) {
        char src[256];
        snprintf(src, sizeof src, "assert(%s ~= nil, '%s missing'); return {}", visible[i], visible[i]);
        li_policy *p = open_src(src, NULL);
        if (p) p->ops->free(p);
    }
    /* require: only luainfer.policy */
    li_policy *p = open_src("local ok, e = pcall(require, 'ffi'); assert(not ok and e:find('not available'), e)\n"
                            "assert(not pcall(require, 'io'))\n"
                            "local P = require('luainfer.policy'); assert(P.fcfs and P.blocks_needed)\n"
                            "assert(require('luainfer.policy') == P)\n"
                            "return {}",
                            NULL);
    if (p) p->ops->free(p);
    /* the real string table stays out of reach; string methods still work */
    p = open_src("assert(getmetatable('') == 'string'); assert(('ab'):rep(2) == 'abab'); assert(('x').dump == nil)\n"
                 "return {}",
                 NULL);
    if (p) p->ops->free(p);
    /* unsafe mode gives the whole library */
    li_policy_lua_opts unsafe = {.allow_unsafe = true};
    p = open_src("assert(io and os.execute and require('ffi') and jit and debug); "
                 "assert(require('luainfer.policy').fcfs); return {}",
                 &unsafe);
    if (p) p->ops->free(p);
    /* precompiled bytecode is refused */
    li_error err = {0};
    CHECK(li_policy_lua_open(&p, NULL, "\033LJ\002garbage", NULL, &err) != 0 && strstr(err.msg, "bytecode"),
          "bytecode: %s", err.msg);

    /* deterministic math.random, per policy and seed */
    const char *rnd = "return { schedule = function() return { run = { { id = math.random(1, 1000000), tokens = 1 },"
                      " { id = math.random(1, 1000000), tokens = 1 } } } end }";
    li_policy_lua_opts s7 = {.seed = 7};
    li_policy *r1 = open_src(rnd, NULL), *r2 = open_src(rnd, NULL), *r3 = open_src(rnd, &s7);
    fx f;
    fx_init(&f, 10, 8, 64);
    char a[128] = "", b[128] = "", c[128] = "";
    li_plan plan;
    li_plan_init(&plan);
    if (r1 && r2 && r3) {
        CHECK(r1->ops->schedule(r1, &f.st, &plan, &err) == 0, "%s", err.msg);
        snprintf(a, sizeof a, "%s", plan_str(&plan));
        li_plan_clear(&plan);
        CHECK(r2->ops->schedule(r2, &f.st, &plan, &err) == 0, "%s", err.msg);
        snprintf(b, sizeof b, "%s", plan_str(&plan));
        li_plan_clear(&plan);
        CHECK(r3->ops->schedule(r3, &f.st, &plan, &err) == 0, "%s", err.msg);
        snprintf(c, sizeof c, "%s", plan_str(&plan));
        li_plan_clear(&plan);
        CHECK(strcmp(a, b) == 0, "same seed, same numbers: %s vs %s", a, b);
        CHECK(strcmp(a, c) != 0, "another seed, other numbers: %s vs %s", a, c);
    }
    li_plan_free(&plan);
    if (r1) r1->ops->free(r1);
    if (r2) r2->ops->free(r2);
    if (r3) r3->ops->free(r3);

    /* memory bombs: a clear error, and the policy works afterwards */
    li_policy_lua_opts small = {.mem_limit = 16 << 20};
    p = open_src("return { schedule = function(state)\n"
                 "  if state.step == 1 then return string.rep('x', 2^30) end\n"
                 "  if state.step == 2 then local t = {} for i = 1, 1e9 do t[i] = { i } end end\n"
                 "  if state.step == 3 then local s = 'x' while true do s = s .. s end end\n"
                 "  return { run = { { id = 1, tokens = 1 } } }\n"
                 "end }",
                 &small);
    if (p) {
        for (int step = 1; step <= 3; step++) {
            f.st.step = step;
            expect_error(p, &f.st, "memory limit (16 MiB)", "memory bomb");
        }
        f.st.step = 4;
        expect_plan(p, &f.st, "1:1", "after memory bombs");
        CHECK(li_policy_lua_mem_used(p) < (4u << 20), "memory back after the bomb: %zu", li_policy_lua_mem_used(p));
        p->ops->free(p);
    }
    CHECK(li_policy_lua_open(&p, NULL, "local t = {} for i = 1, 1e9 do t[i] = i end return {}", &small, &err) != 0 &&
              strstr(err.msg, "memory limit"),
          "memory bomb at load: %s", err.msg);
}

/* ---- garbage plans and failing policies ----------------------------------- */

static void test_garbage(void) {
    static const struct {
        const char *ret, *needle;
    } cases[] = {
        {"42", "must return a plan table"},
        {"nil", "got nil"},
        {"function() end", "got function"},
        {"{ run = 'x' }", "run must be a table"},
        {"{ run = { 1, 2 } }", "run[1] must be a table"},
        {"{ run = { { id = 1, tokens = -1 } } }", "tokens must be an integer"},
        {"{ run = { { id = 1, tokens = 0/0 } } }", "tokens must be an integer"},
        {"{ run = { { id = 1, tokens = 1e300 } } }", "tokens must be an integer"},
        {"{ run = { { id = 1, tokens = 1/0 } } }", "tokens must be an integer"},
        {"{ run = { { id = 1, tokens = 2.5 } } }", "tokens must be an integer"},
        {"{ run = { { id = 1, tokens = '3' } } }", "tokens must be an integer"},
        {"{ run = { { id = 1.5, tokens = 1 } } }", "id must be a request id"},
        {"{ run = { { id = -3, tokens = 1 } } }", "id must be a request id"},
        {"{ run = { { id = 2^60, tokens = 1 } } }", "id must be a request id"},
        {"{ run = { { id = { { { {} } } }, tokens = 1 } } }", "got table"},
        {"{ run = { { 1 } } }", "tokens must be an integer"},
        {"{ run = { [1] = { 1, 1 }, [3] = { 2, 2 } } }", "must be an array"},
        {"{ run = { { 1, 1 }, x = 5 } }", "must be an array"},
        {"{ run = {}, preempt = { 'a' } }", "preempt[1] must be a request id"},
        {"{ run = {}, preempt = 7 }", "preempt must be an array"},
        {"{ run = { { id = true, tokens = 1 } } }", "got boolean"},
    };
    fx f;
    fx_init(&f, 10, 8, 64);
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++) {
        char src[512];
        snprintf(src, sizeof src, "return { schedule = function() return %s end }", cases[i].ret);
        li_policy *p = open_src(src, NULL);
        if (!p) continue;
        expect_error(p, &f.st, cases[i].needle, cases[i].ret);
        p->ops->free(p);
    }
    /* accepted forms: shorthand {id, n}, 0 tokens skipped, unknown plan keys
     * ignored, metatables not consulted */
    li_policy *p = open_src("return { schedule = function() return { run = { { 1, 5 }, { id = 2, tokens = 1 },"
                            " { 3, 0 } }, preempt = { 4 }, future_field = { 'x' } } end }",
                            NULL);
    if (p) {
        expect_plan(p, &f.st, "1:5 2:1 | preempt 4", "shorthand entries");
        p->ops->free(p);
    }
    p = open_src("return { schedule = function() return setmetatable({}, { __index = function() error('nope') end })"
                 " end }",
                 NULL);
    if (p) {
        expect_plan(p, &f.st, "", "metatables not consulted");
        p->ops->free(p);
    }
    /* a policy that errors every step: errors with a traceback, no crash */
    p = open_src("local function inner() error('boom') end\n"
                 "return { schedule = function(state) inner() end }",
                 NULL);
    if (p) {
        for (int i = 0; i < 3; i++) expect_error(p, &f.st, "policy:1: boom", "erroring policy");
        li_plan plan;
        li_plan_init(&plan);
        li_error err = {0};
        p->ops->schedule(p, &f.st, &plan, &err);
        CHECK(strstr(err.msg, "stack traceback") != NULL, "traceback in: %s", err.msg);
        li_plan_free(&plan);
        p->ops->free(p);
    }
    p = open_src("return { schedule = function() error({}) end }", NULL);
    if (p) {
        expect_error(p, &f.st, "not a string", "error with a table");
        p->ops->free(p);
    }
    p = open_src("return { schedule = function(state) return state.nope.x end }", NULL);
    if (p) {
        expect_error(p, &f.st, "attempt to index", "runtime error");
        p->ops->free(p);
    }
    /* bad files */
    static const struct {
        const char *src, *needle;
    } bad[] = {
        {"return {", "policy:1:"},
        {"error('at load')", "at load"},
        {"return 5", "must return a table of hooks"},
        {"return { schedule = 5 }", "hook 'schedule' must be a function"},
        {"return { config = { block_size = 'x' } }", "config.block_size"},
        {"return { config = { max_num_seq = 4 } }", "unknown key 'max_num_seq'"},
        {"return { config = { kv_dtype = 'waytoolongname' } }", "config.kv_dtype"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        li_error err = {0};
        li_policy *q = NULL;
        int rc = li_policy_lua_open(&q, NULL, bad[i].src, NULL, &err);
        CHECK(rc != 0 && q == NULL && strstr(err.msg, bad[i].needle), "bad file %s: rc %d, %s", bad[i].src, rc,
              err.msg);
    }
    li_error err = {0};
    li_policy *q = NULL;
    CHECK(li_policy_lua_open(&q, "/nonexistent/x.lua", NULL, NULL, &err) != 0 && strstr(err.msg, "cannot open"),
          "missing file: %s", err.msg);
    /* config */
    q = open_src("return { config = { block_size = 32, kv_dtype = 'fp8', max_num_seqs = 8, max_batched_tokens = 256 } }",
                 NULL);
    if (q) {
        CHECK(q->config.block_size == 32 && !strcmp(q->config.kv_dtype, "fp8") && q->config.max_num_seqs == 8 &&
                  q->config.max_batched_tokens == 256,
              "config parsed");
        CHECK(!q->has_schedule, "no schedule hook");
        li_plan plan;
        li_plan_init(&plan);
        CHECK(q->ops->schedule(q, &f.st, &plan, &err) != 0, "schedule without the hook is an error");
        li_plan_free(&plan);
        q->ops->free(q);
    }
}

/* ---- admit and on_finish ----------------------------------------------------- */

static void test_admit_finish(void) {
    li_policy *p = open_src("local n, last = 0, ''\n"
                            "return {\n"
                            "  admit = function(req, state)\n"
                            "    if req.tenant == 'boom' then error('admit failed') end\n"
                            "    if req.prompt_len > 100 then return false, 'prompt too long for ' .. req.tenant end\n"
                            "    return #state.requests < 3\n"
                            "  end,\n"
                            "  on_finish = function(req, stats) n = n + 1; last = stats.finish_reason .. req.id end,\n"
                            "  schedule = function() return { run = { { n, #last } } } end,\n"
                            "}",
                            NULL);
    if (!p) return;
    fx f;
    fx_init(&f, 10, 8, 64);
    fx_wait(&f, 1, 10);
    li_req_view nr = f.r[0];
    nr.id = 9;
    nr.prompt_len = 500;
    nr.tenant = "t1";
    bool accept = true;
    char reason[128];
    li_error err = {0};
    CHECK(p->ops->admit(p, &nr, &f.st, &accept, reason, sizeof reason, &err) == 0, "%s", err.msg);
    CHECK(!accept && !strcmp(reason, "prompt too long for t1"), "rejected: %d %s", accept, reason);
    nr.prompt_len = 5;
    CHECK(p->ops->admit(p, &nr, &f.st, &accept, reason, sizeof reason, &err) == 0 && accept, "accepted");
    fx_wait(&f, 2, 10);
    fx_wait(&f, 3, 10);
    CHECK(p->ops->admit(p, &nr, &f.st, &accept, reason, sizeof reason, &err) == 0 && !accept &&
              !strcmp(reason, "rejected by policy"),
          "state seen by admit: %d %s", accept, reason);
    nr.tenant = "boom";
    CHECK(p->ops->admit(p, &nr, &f.st, &accept, reason, sizeof reason, &err) != 0 && accept &&
              strstr(err.msg, "admit failed"),
          "admit error = accept: %s", err.msg);
    p->ops->on_finish(p, &f.r[0], "stop");
    p->ops->on_finish(p, &f.r[1], "length");
    expect_plan(p, &f.st, "2:7", "on_finish seen"); /* n = 2, "length2" */
    p->ops->free(p);
}

/* ---- hot reload ---------------------------------------------------------------- */

static void test_reload(void) {
    li_policy *p = open_src("count = 0\n"
                            "return { schedule = function() count = count + 1; return { run = { { 1, count } } } end }",
                            NULL);
    if (!p) return;
    fx f;
    fx_init(&f, 10, 8, 64);
    expect_plan(p, &f.st, "1:1", "reload: v1 step 1");
    expect_plan(p, &f.st, "1:2", "reload: globals persist");
    li_error err = {0};
    CHECK(p->ops->reload(p, NULL, "count = 10\nreturn { schedule = function() count = count + 1;"
                                  " return { run = { { 2, count } } } end }",
                         &err) == 0,
          "reload v2: %s", err.msg);
    expect_plan(p, &f.st, "2:11", "reload: v2 in place, old state discarded");
    /* syntax error: old policy stays */
    CHECK(p->ops->reload(p, NULL, "return {\n  schedule = function() return {} \n", &err) != 0 &&
              strstr(err.msg, "policy:3:"),
          "syntax error reported with its line: %s", err.msg);
    expect_plan(p, &f.st, "2:12", "reload: failed reload keeps the old policy and its state");
    CHECK(p->ops->reload(p, NULL, "error('nope')", &err) != 0 && strstr(err.msg, "nope"), "runtime error: %s",
          err.msg);
    expect_plan(p, &f.st, "2:13", "reload: still the old one");
    /* from a file: the message names the file and line */
    char path[256];
    snprintf(path, sizeof path, "/tmp/li_policy_test_%d.lua", (int)getpid());
    FILE *fp = fopen(path, "w");
    fputs("-- a comment\nreturn { schedule = function() return { run = { { 3, 1 } } } end, config = 5 }\n", fp);
    fclose(fp);
    CHECK(p->ops->reload(p, path, NULL, &err) != 0 && strstr(err.msg, path) && strstr(err.msg, "config must be"),
          "file error: %s", err.msg);
    fp = fopen(path, "w");
    fputs("return { schedule = function() return { run = { { 3, 1 } } } end,\n  x = nil + 1 }\n", fp);
    fclose(fp);
    char want[300];
    snprintf(want, sizeof want, "%s:2:", path);
    CHECK(p->ops->reload(p, path, NULL, &err) != 0 && strstr(err.msg, want), "file:line in: %s", err.msg);
    fp = fopen(path, "w");
    fputs("return { schedule = function() return { run = { { 3, 1 } } } end }\n", fp);
    fclose(fp);
    CHECK(p->ops->reload(p, path, NULL, &err) == 0, "reload file: %s", err.msg);
    CHECK(!strcmp(p->name, path), "name follows the file: %s", p->name);
    expect_plan(p, &f.st, "3:1", "reload: from file");
    remove(path);
    p->ops->free(p);
}

/* ---- state tables are reused ------------------------------------------------- */

static void test_state_reuse(void) {
    /* The policy reports, through its plan, what it saw:
     *   id 1: tokens = 1 + number of (request, step) pairs whose table was the
     *         same object as on the request's first step
     *   id 2: tokens = 1 + number of times a request got a different table
     *   id 3: tokens = #state.requests; id 4: #state.waiting + 1
     *   id 5: 1 if state, state.requests, state.kv were the same objects */
    li_policy *p = open_src("local first, same, changed = {}, 0, 0\n"
                            "local S, R, KV\n"
                            "return { schedule = function(state)\n"
                            "  for _, r in ipairs(state.requests) do\n"
                            "    local f = first[r.id]\n"
                            "    if f == nil then first[r.id] = r elseif f == r then same = same + 1"
                            " else changed = changed + 1 end\n"
                            "    r.mine = (r.mine or 0) + 1\n"
                            "  end\n"
                            "  local ok = (S == nil or (S == state and R == state.requests and KV == state.kv)) and 1 or 2\n"
                            "  S, R, KV = state, state.requests, state.kv\n"
                            "  state.kv = 'vandalised'\n"
                            "  return { run = { { 1, same + 1 }, { 2, changed + 1 }, { 3, #state.requests },"
                            " { 4, #state.waiting + 1 }, { 5, ok } } }\n"
                            "end }",
                            NULL);
    if (!p) return;
    fx f;
    fx_init(&f, 10, 8, 64);
    fx_wait(&f, 10, 5);
    fx_wait(&f, 11, 5);
    fx_decode(&f, 12, 5, 1);
    expect_plan(p, &f.st, "1:1 2:1 3:3 4:3 5:1", "reuse: step 1");
    expect_plan(p, &f.st, "1:4 2:1 3:3 4:3 5:1", "reuse: step 2, same tables");
    /* 11 leaves; 10 starts running */
    fx_init(&f, 10, 8, 64);
    fx_decode(&f, 10, 5, 1);
    fx_decode(&f, 12, 5, 2);
    expect_plan(p, &f.st, "1:6 2:1 3:2 4:1 5:1", "reuse: departed cleared");
    /* 11 comes back (an id reused): its old table was dropped from the pool */
    fx_wait(&f, 11, 5);
    expect_plan(p, &f.st, "1:8 2:2 3:3 4:2 5:1", "reuse: departed table not resurrected");
    p->ops->free(p);
}

/* ---- speculate: what the hook sees ---------------------------------------- */

/* The policy answers ("eagle", 100 + the mask of the checks that failed) for
 * request 1, and ("ngram", 200 + mask) for request 2; two calls, the second
 * with some fields gone, so entries must also be removed from the tables
 * kept in place; between them the policy overwrites some of the tables it
 * was given, which the second call must not see. */
static void test_speculate_fields(void) {
    li_policy *p = open_src(
        "local calls, S1, SP1 = 0, nil, nil\n"
        "return { speculate = function(req, state)\n"
        "  local s, sp, bad, bit = req.speculation, state.spec, 0, 1\n"
        "  local function ck(ok) if not ok then bad = bad + bit end; bit = bit * 2 end\n"
        "  if req.id == 2 then\n"
        "    ck(s.drafted.ngram == 0 and s.acceptance.ngram == -1 and s.k == 0 and s.method == 'ngram')\n"
        "    ck(s.ngram == nil and s.ngram_match == nil)\n"
        "    return 'ngram', 200 + bad\n"
        "  end\n"
        "  calls = calls + 1\n"
        "  ck(s.method == 'eagle' and s.k == 8 and s.max_k == 16 and s.temperature == 0.5)\n"
        "  ck(s.acceptance.ngram == 0.25 and s.acceptance.eagle == -1 and s.drafted.ngram == 8 and s.drafted.eagle == 0)\n"
        "  ck(sp.batch_size == 2 and sp.step_time == 0.002 and sp.token_time == 0.001)\n"
        "  ck(sp.draft_time.eagle == 2e-4 and sp.draft_time.ngram == 0 and sp.available.eagle == true"
        " and sp.available.draft == false)\n"
        "  local n = 0 for _ in pairs(sp.row_time) do n = n + 1 end\n"
        "  if calls == 1 then\n"
        "    ck(s.ngram == 3 and s.ngram_match == 5)\n"
        "    ck(n == 2 and sp.row_time[1] == 0.001 and sp.row_time[3] == 0.003)\n"
        "    ck(sp.verify_time.greedy == 5e-6 and sp.verify_time.sampled == nil)\n"
        "    S1, SP1 = s, sp\n"
        "    s.acceptance, s.ngram, sp.row_time, sp.verify_time, sp.available = 5, 'x', 7, nil, {}\n"
        "    req.speculation = nil\n"
        "  else\n"
        "    ck(s.ngram == nil and s.ngram_match == nil)\n"
        "    ck(n == 2 and sp.row_time[1] == 0.001 and sp.row_time[2] == 0.002 and sp.row_time[3] == nil)\n"
        "    ck(sp.verify_time.greedy == nil and sp.verify_time.sampled == 1e-5)\n"
        "    ck(S1 == s and SP1 == sp)\n"
        "  end\n"
        "  return 'eagle', 100 + bad\n"
        "end }",
        NULL);
    if (!p) return;
    static const char *const names[5] = {"ngram", "draft", "layerskip", "medusa", "eagle"};
    const bool avail[5] = {true, false, false, false, true};
    const double draft_time[5] = {0, 0, 0, 0, 2e-4};
    double rows[LI_SPEC_COST_ROWS] = {0.001, 0, 0.003}, verify[2] = {5e-6, 0};
    const double acc1[5] = {0.25, -1, -1, -1, -1}, acc2[5] = {-1, -1, -1, -1, -1};
    const int64_t dr1[5] = {8, 0, 0, 0, 0}, dr2[5] = {0};
    fx f;
    fx_init(&f, 10, 8, 64);
    fx_decode(&f, 1, 5, 1);
    fx_decode(&f, 2, 5, 1);
    for (int call = 0; call < 2; call++) {
        li_spec_cand c[2] = {
            {.id = 1, .want_method = 4, .want_k = 8, .max_k = 16, .temperature = 0.5f, .acceptance = acc1,
             .drafted = dr1, .ngram = call ? -1 : 3, .ngram_match = call ? -1 : 5, .method = 4, .k = 8},
            {.id = 2, .want_method = -1, .want_k = 0, .max_k = 16, .temperature = 0, .acceptance = acc2,
             .drafted = dr2, .ngram = -1, .ngram_match = -1, .method = -1, .k = 0},
        };
        if (call) rows[1] = 0.002, rows[2] = 0, verify[0] = 0, verify[1] = 1e-5;
        const li_spec_state ss = {.methods = names, .available = avail, .n_methods = 5, .batch_size = 2,
                                  .step_time = 0.002, .token_time = 0.001, .draft_time = draft_time,
                                  .row_time = rows, .verify_time = verify};
        li_error err = {0};
        int rc = p->ops->speculate(p, &f.st, &ss, c, 2, &err);
        CHECK(rc == 0 && c[0].method == 4 && c[0].k == 100 && c[1].method == 0 && c[1].k == 200,
              "speculate call %d: req.speculation and state.spec as given, kept in place (rc %d, %s; "
              "answers %d/%d and %d/%d: k - 100 is the mask of failed checks)",
              call + 1, rc, err.msg, c[0].method, c[0].k, c[1].method, c[1].k);
    }
    p->ops->free(p);
}

/* ---- runaway loops ----------------------------------------------------------------- */

static void test_runaway(void) {
    fx f;
    fx_init(&f, 10, 8, 64);
    li_policy_lua_opts o = {.jit_off = true, .instr_budget = 2000000};
    li_policy *p = open_src("return { schedule = function(state)\n"
                            "  if state.step == 1 then while true do end end\n"
                            "  if state.step == 2 then while true do pcall(function() while true do end end) end end\n"
                            "  return { run = { { 1, 1 } } }\n"
                            "end }",
                            &o);
    if (p) {
        for (int step = 1; step <= 2; step++) {
            f.st.step = step;
            double t0 = now_s();
            expect_error(p, &f.st, "instruction budget", "runaway loop");
            double dt = now_s() - t0;
            CHECK(dt < 1.0, "stopped in %.3f s", dt);
        }
        f.st.step = 3;
        expect_plan(p, &f.st, "1:1", "after the runaway");
        p->ops->free(p);
    }
    /* jit.off() from an unsafe policy, and a loop at load time */
    li_policy_lua_opts u = {.allow_unsafe = true, .instr_budget = 2000000};
    p = open_src("jit.off()\nreturn { schedule = function() local x = 0 while true do x = x + 1 end end }", &u);
    if (p) {
        expect_error(p, &f.st, "instruction budget", "runaway with jit.off()");
        p->ops->free(p);
    }
    li_error err = {0};
    CHECK(li_policy_lua_open(&p, NULL, "while true do end", &o, &err) != 0 && strstr(err.msg, "instruction budget"),
          "runaway at load: %s", err.msg);
}

/* ---- hostile policies of issue 18: errors, never a crash or a hang ------------ */

static void test_hostile(void) {
    fx f;
    fx_init(&f, 10, 8, 64);
    fx_decode(&f, 1, 8, 2);
    /* the default options: JIT on for the engine, the budget, 64 MiB */
    static const struct {
        const char *src, *needle, *what;
    } cases[] = {
        {"local function g() return string.gsub('x', 'x', g) end\n"
         "return { schedule = function() g() end }", "recursion too deep", "gsub recursion"},
        {"local function g() return ('x'):gsub('x', g) end\n"
         "return { schedule = function() g() end }", "recursion too deep", "s:gsub recursion"},
        {"local r = setmetatable({}, {})\n"
         "getmetatable(r).__index = function() return ('x'):gsub('x', r) end\n"
         "return { schedule = function() ('y'):gsub('y', r) end }", "recursion too deep", "__index recursion"},
        {"local x = setmetatable({}, {__tostring = function(x) return tostring(x) end})\n"
         "return { schedule = function() return tostring(x) end }", "recursion too deep", "__tostring loop"},
        {"local function s() table.sort({3, 2, 1}, function(a, b) s() return a < b end) end\n"
         "return { schedule = function() s() end }", "recursion too deep", "sort comparator recursion"},
        {"local t = setmetatable({}, {})\n"
         "getmetatable(t).__index = function() return os.time(t) end\n"
         "return { schedule = function() os.time(t) end }", "recursion too deep", "os.time __index recursion"},
        {"return { schedule = function() string.find(('a'):rep(64), ('a*'):rep(32) .. 'b') end }",
         "pattern too costly", "backtracking find"},
        {"return { schedule = function() local s = ('a'):rep(5000) s:match('(.-)(.-)(.-)b') end }",
         "pattern too costly", "backtracking s:match"},
        {"return { schedule = function() while true do end end }", "instruction budget", "compiled-looking loop"},
        {"local function f() local x = 0 for i = 1, 1e12 do x = x + i end return x end\n"
         "return { schedule = function() return f() end }", "instruction budget", "hot numeric loop"},
        {"local function fill() local t = {} for i = 1, 1e9 do t[i] = i end end\n"
         "return { schedule = function() fill() end }", "memory limit", "memory in a hot loop"},
        {"return { schedule = function() local r, e = {}, { id = 1, tokens = 1 }\n"
         "  for i = 1, 262145 do r[i] = e end return { run = r } end }", "more than 262144", "plan over the limit"},
    };
    for (size_t k = 0; k < LI_ARRAY_LEN(cases); k++) {
        li_policy *p = open_src(cases[k].src, NULL);
        if (!p) continue;
        /* many steps: the memory case used to corrupt the VM after ~50-110 */
        int n = strstr(cases[k].what, "memory") ? 120 : 3;
        for (int i = 0; i < n; i++) expect_error(p, &f.st, cases[k].needle, cases[k].what);
        p->ops->free(p);
    }
    /* the guards leave honest use alone */
    li_policy *p = open_src("return { schedule = function(state)\n"
                            "  local a, b = ('tenant-42'):match('^(%a+)-(%d+)$')\n"
                            "  local s = ('x'):rep(100):gsub('x', function(c) return tostring(#c) end)\n"
                            "  assert(string.find(('a'):rep(10000), ('a*'):rep(32), 1, true) == nil)\n"
                            "  local t = { 3, 1, 2 } table.sort(t, function(x, y) return x < y end)\n"
                            "  assert(a == 'tenant' and b == '42' and #s == 100 and t[1] == 1)\n"
                            "  assert(string.format('%s', setmetatable({}, {__tostring = function() return 'ok' end})) == 'ok')\n"
                            "  return { run = { { 1, 1 } } }\n"
                            "end }",
                            NULL);
    if (p) {
        expect_plan(p, &f.st, "1:1", "honest patterns, callbacks and sort");
        p->ops->free(p);
    }
    /* policy files: regular files only, a FIFO is refused without blocking */
    char dir[] = "/tmp/li-policy-XXXXXX", fifo[64];
    if (mkdtemp(dir)) {
        snprintf(fifo, sizeof fifo, "%s/p.fifo", dir);
        char *text = NULL;
        size_t len = 0;
        li_error err = {0};
        CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
        CHECK(li_policy_read_file(fifo, &text, &len, &err) != 0 && strstr(err.msg, "FIFO"), "FIFO: %s", err.msg);
        CHECK(li_policy_read_file(dir, &text, &len, &err) != 0 && strstr(err.msg, "directory"), "dir: %s", err.msg);
        CHECK(li_policy_lua_open(&p, fifo, NULL, NULL, &err) != 0 && strstr(err.msg, "FIFO"), "open FIFO: %s", err.msg);
        unlink(fifo);
        rmdir(dir);
    }
}

/* ---- cost of one step --------------------------------------------------------------- */

static void bench(void) {
    li_policy *p = open_file("policies/default.lua");
    if (!p) return;
    fx f;
    fx_init(&f, 1000, 128, 2048);
    static char names[64][8];
    for (int i = 0; i < 64; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i % 4);
        fx_decode(&f, i + 1, 100 + i, 10 + i)->tenant = names[i];
    }
    li_plan plan;
    li_plan_init(&plan);
    li_error err = {0};
    for (int i = 0; i < 2000; i++) {
        li_plan_clear(&plan);
        f.st.step = i;
        p->ops->schedule(p, &f.st, &plan, &err);
    }
    CHECK(plan.n_run == 64, "bench plan has 64 entries: %d", plan.n_run);
    int n = 20000;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        li_plan_clear(&plan);
        f.st.step = i;
        p->ops->schedule(p, &f.st, &plan, &err);
    }
    double dt = now_s() - t0;
    printf("bench: default.lua schedule() with 64 running requests: %.1f us/step in-process (Lua heap %zu KiB)\n",
           dt / n * 1e6, li_policy_lua_mem_used(p) >> 10);
    li_plan_free(&plan);
    p->ops->free(p);
}

int main(void) {
    test_default();
    test_static();
    test_priority();
    test_sjf();
    test_fair();
    test_sandbox();
    test_garbage();
    test_admit_finish();
    test_reload();
    test_state_reuse();
    test_speculate_fields();
    test_runaway();
    test_hostile();
    bench();
    return t_summary("test_policy_lua");
}
