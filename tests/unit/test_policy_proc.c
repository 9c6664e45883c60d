/* test_policy_proc.c — the isolated policy mode (a `luainfer policy-host`
 * child over a socket):
 *  - the shipped default policy gives the same plans through the host as
 *    in-process, on hand-made and generated states;
 *  - admit, on_finish and hot reload (success, and failure keeping the old
 *    policy) work through the host; a file that does not load fails open();
 *  - a host stuck in `while true do end` costs one deadline (+ slack), is
 *    killed, and the next steps work again after the restart;
 *  - a host that exits (os.exit in an unsafe policy) is restarted; one that
 *    keeps crashing is restarted with a back-off;
 *  - timing of one schedule() with 64 running requests (printed).
 * Needs the luainfer binary: $LUAINFER_BIN or build*\/luainfer; exits 77
 * (skipped) without one that has the policy-host command. */
#define _POSIX_C_SOURCE 200809L
#include "policy/policy_proc.h"
#include "test_util.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *src_dir(void) {
    const char *d = getenv("LUAINFER_SOURCE_DIR");
    return d && *d ? d : ".";
}

/* Whether `bin policy-host --help` is ours (an older binary lacks it). */
static bool has_policy_host(const char *bin) {
    if (access(bin, X_OK) != 0) return false;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' policy-host --help 2>&1", bin);
    FILE *f = popen(cmd, "r");
    if (!f) return false;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    pclose(f);
    return strstr(buf, "policy-host --fd") != NULL;
}

static char g_bin[1024];

static const char *find_bin(void) {
    const char *env = getenv("LUAINFER_BIN");
    if (env && *env) return has_policy_host(env) ? env : NULL;
    char pat[1024];
    snprintf(pat, sizeof pat, "%s/build*/luainfer", src_dir());
    glob_t g;
    const char *found = NULL;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && !found; i++)
            if (has_policy_host(g.gl_pathv[i])) {
                snprintf(g_bin, sizeof g_bin, "%s", g.gl_pathv[i]);
                found = g_bin;
            }
        globfree(&g);
    }
    return found;
}

/* ---- fixtures (as in test_policy_lua.c) -------------------------------------------- */

typedef struct fx {
    li_req_view r[256];
    li_step_state st;
} fx;

static void fx_init(fx *f, int32_t free_blocks, int32_t max_seqs, int32_t max_tokens) {
    memset(f, 0, sizeof *f);
    f->st = (li_step_state){.step = 0, .now = 100, .reqs = f->r, .kv_free_blocks = free_blocks,
                            .kv_total_blocks = 1000, .block_size = 16, .max_num_seqs = max_seqs,
                            .max_batched_tokens = max_tokens};
}

static li_req_view *fx_add(fx *f, int64_t id, li_req_state s, int64_t prompt, int64_t gen, int64_t computed) {
    li_req_view *v = &f->r[f->st.n_reqs++];
    *v = (li_req_view){.id = id, .state = s, .arrival = (double)id, .tenant = "t", .prompt_len = prompt,
                       .num_tokens = prompt + gen, .num_computed = computed, .num_generated = gen,
                       .max_tokens = 100, .n_blocks = (int32_t)((computed + 15) / 16), .spec_acceptance = -1};
    return v;
}

static const char *plan_str(const li_plan *p, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < p->n_run && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld:%d", i ? " " : "", (long long)p->run[i].id, p->run[i].n_tokens);
    if (p->n_preempt && n < cap) {
        n += (size_t)snprintf(buf + n, cap - n, " | preempt");
        for (int32_t i = 0; i < p->n_preempt && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, " %lld", (long long)p->preempt[i]);
    }
    return buf;
}

/* schedule() -> plan string (or "ERR: message") */
static const char *run(li_policy *p, const li_step_state *st, char *buf, size_t cap) {
    li_plan plan;
    li_plan_init(&plan);
    li_error err = {0};
    if (p->ops->schedule(p, st, &plan, &err)) snprintf(buf, cap, "ERR: %s", err.msg);
    else plan_str(&plan, buf, cap);
    li_plan_free(&plan);
    return buf;
}

static char tmp_paths[8][256];
static int n_tmp;

static const char *write_tmp(const char *text) {
    char *path = tmp_paths[n_tmp++];
    snprintf(path, 256, "/tmp/li_policy_proc_%d_%d.lua", (int)getpid(), n_tmp);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static li_policy_proc_opts g_opts;

static void test_same_plans(void) {
    char path[1024], a[2048], b[2048];
    snprintf(path, sizeof path, "%s/policies/default.lua", src_dir());
    li_policy *iso = NULL, *inp = NULL;
    li_error err = {0};
    CHECK(li_policy_proc_open(&iso, path, &g_opts, &err) == 0, "open isolated: %s", err.msg);
    CHECK(li_policy_lua_open(&inp, path, NULL, NULL, &err) == 0, "open in-process: %s", err.msg);
    if (!iso || !inp) return;
    CHECK(iso->has_schedule && !strcmp(iso->ops->kind, "process"), "isolated default has schedule");
    fx f;
    fx_init(&f, 100, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 5, 14);
    fx_add(&f, 2, LI_REQ_RUNNING, 20, 3, 22);
    fx_add(&f, 3, LI_REQ_RUNNING, 100, 0, 32);
    fx_add(&f, 4, LI_REQ_WAITING, 50, 0, 0);
    fx_add(&f, 5, LI_REQ_WAITING, 30, 0, 0);
    CHECK(!strcmp(run(iso, &f.st, a, sizeof a), "1:1 2:1 3:68 4:50 5:8"), "isolated default plan: %s", a);
    fx_init(&f, 0, 8, 128);
    fx_add(&f, 1, LI_REQ_RUNNING, 10, 7, 16);
    fx_add(&f, 2, LI_REQ_RUNNING, 20, 12, 31);
    fx_add(&f, 3, LI_REQ_RUNNING, 40, 1, 40);
    fx_add(&f, 4, LI_REQ_WAITING, 50, 0, 0);
    CHECK(!strcmp(run(iso, &f.st, a, sizeof a), "1:1 2:1 4:32 | preempt 3"), "isolated preemption plan: %s", a);
    /* generated states: both transports agree */
    srand(42);
    int agree = 0, total = 200;
    for (int k = 0; k < total; k++) {
        fx_init(&f, rand() % 40, 1 + rand() % 16, 16 + rand() % 512);
        f.st.step = k;
        int n = rand() % 40;
        for (int i = 0; i < n; i++) {
            int s = rand() % 3;
            int64_t prompt = 1 + rand() % 300, gen = s == 1 ? rand() % 50 : 0;
            int64_t computed = s == 1 ? (rand() % 2 ? prompt + gen - 1 : rand() % prompt) : 0;
            li_req_view *v = fx_add(&f, 1000 * k + i, (li_req_state)s, prompt, gen, computed);
            v->priority = rand() % 3;
        }
        run(iso, &f.st, a, sizeof a);
        run(inp, &f.st, b, sizeof b);
        if (!strcmp(a, b)) agree++;
        else if (agree + 3 > k) fprintf(stderr, "state %d: isolated \"%s\" vs in-process \"%s\"\n", k, a, b);
    }
    CHECK(agree == total, "isolated and in-process plans agree on %d/%d states", agree, total);
    iso->ops->free(iso);
    inp->ops->free(inp);
}

static void test_hooks_and_reload(void) {
    const char *path = write_tmp("local n = 0\n"
                                 "return {\n"
                                 "  config = { max_num_seqs = 7 },\n"
                                 "  admit = function(req, state)\n"
                                 "    if req.prompt_len > 100 then return false, 'too long for ' .. req.tenant end\n"
                                 "    return true\n"
                                 "  end,\n"
                                 "  on_finish = function(req, stats) n = n + 1 end,\n"
                                 "  schedule = function(state) return { run = { { 1, n + 1 } } } end,\n"
                                 "}\n");
    li_policy *p = NULL;
    li_error err = {0};
    CHECK(li_policy_proc_open(&p, path, &g_opts, &err) == 0, "open: %s", err.msg);
    if (!p) return;
    CHECK(p->config.max_num_seqs == 7, "config through the host: %d", p->config.max_num_seqs);
    fx f;
    fx_init(&f, 10, 8, 64);
    li_req_view *r = fx_add(&f, 1, LI_REQ_WAITING, 500, 0, 0);
    bool accept = true;
    char reason[128] = "", a[512];
    CHECK(p->ops->admit(p, r, &f.st, &accept, reason, sizeof reason, &err) == 0, "admit: %s", err.msg);
    CHECK(!accept && !strcmp(reason, "too long for t"), "admit through the host: %d '%s'", accept, reason);
    r->prompt_len = 5;
    CHECK(p->ops->admit(p, r, NULL, &accept, reason, sizeof reason, &err) == 0 && accept, "admit accepts");
    p->ops->on_finish(p, r, "stop");
    p->ops->on_finish(p, r, "length");
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:3"), "on_finish seen by the host: %s", a);
    /* reload: failure keeps the old policy, success swaps */
    CHECK(p->ops->reload(p, NULL, "return {\n schedule = function( return {} end }", &err) != 0 &&
              strstr(err.msg, "policy:2:"),
          "failed reload reports file:line: %s", err.msg);
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:3"), "old policy (and its state) kept: %s", a);
    CHECK(p->ops->reload(p, NULL, "return { schedule = function() return { run = { { 9, 9 } } } end }", &err) == 0,
          "reload: %s", err.msg);
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "9:9"), "new policy after reload: %s", a);
    CHECK(p->config.max_num_seqs == 0, "config follows the reload");
    /* schedule errors travel back as errors; the host stays */
    CHECK(p->ops->reload(p, NULL, "return { schedule = function() return 42 end }", &err) == 0, "%s", err.msg);
    run(p, &f.st, a, sizeof a);
    CHECK(strstr(a, "must return a plan table") != NULL, "policy error through the host: %s", a);
    li_policy_proc_stats s;
    li_policy_proc_stats_get(p, &s);
    CHECK(s.restarts == 0 && s.crashes == 0, "no restarts for policy errors: %lld", (long long)s.restarts);
    p->ops->free(p);

    /* a file that does not load: open fails with the message */
    const char *bad = write_tmp("return {\n  schedule = function() end,\n  x = = 1 }\n");
    CHECK(li_policy_proc_open(&p, bad, &g_opts, &err) != 0 && strstr(err.msg, ":3:"), "bad file: %s", err.msg);
}

static void test_runaway(void) {
    const char *path = write_tmp("return { schedule = function(state)\n"
                                 "  if state.step == 2 then local x = 0 while true do x = x + 1 end end\n"
                                 "  return { run = { { 1, 1 } } }\n"
                                 "end }\n");
    li_policy_proc_opts o = g_opts;
    o.lua.instr_budget = -1; /* nothing but the deadline stops it */
    li_policy *p = NULL;
    li_error err = {0};
    CHECK(li_policy_proc_open(&p, path, &o, &err) == 0, "open: %s", err.msg);
    if (!p) return;
    fx f;
    fx_init(&f, 10, 8, 64);
    char a[512];
    f.st.step = 1;
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:1"), "step 1: %s", a);
    f.st.step = 2;
    double t0 = now_s();
    run(p, &f.st, a, sizeof a);
    double dt = (now_s() - t0) * 1000;
    CHECK(strstr(a, "ERR: ") && strstr(a, "timed out after 50 ms"), "looping host times out: %s", a);
    CHECK(dt < 50 + 150, "the engine waited %.1f ms (deadline 50)", dt);
    printf("runaway host: schedule returned after %.1f ms (deadline 50 ms)\n", dt);
    /* the next step does not wait for the new host beyond the deadline */
    f.st.step = 3;
    t0 = now_s();
    run(p, &f.st, a, sizeof a);
    dt = (now_s() - t0) * 1000;
    CHECK(dt < 50 + 150, "a step while the host restarts took %.1f ms", dt);
    CHECK(li_policy_proc_wait_ready(p, 10000, &err) == 0, "restarted: %s", err.msg);
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:1"), "after the restart: %s", a);
    li_policy_proc_stats s;
    li_policy_proc_stats_get(p, &s);
    CHECK(s.timeouts == 1 && s.restarts == 1, "stats: %lld timeouts, %lld restarts", (long long)s.timeouts,
          (long long)s.restarts);
    p->ops->free(p);
}

static void test_crash(void) {
    const char *path = write_tmp("return { schedule = function(state)\n"
                                 "  if state.step == 2 then os.exit(1) end\n"
                                 "  if state.step >= 10 then os.exit(3) end\n"
                                 "  return { run = { { 1, 1 } } }\n"
                                 "end }\n");
    li_policy_proc_opts o = g_opts;
    o.lua.allow_unsafe = true;
    li_policy *p = NULL;
    li_error err = {0};
    CHECK(li_policy_proc_open(&p, path, &o, &err) == 0, "open: %s", err.msg);
    if (!p) return;
    li_policy_proc_stats s0, s;
    li_policy_proc_stats_get(p, &s0);
    fx f;
    fx_init(&f, 10, 8, 64);
    char a[512];
    f.st.step = 2;
    run(p, &f.st, a, sizeof a);
    CHECK(strstr(a, "ERR: ") && strstr(a, "exited"), "crashed host: %s", a);
    CHECK(li_policy_proc_wait_ready(p, 10000, &err) == 0, "restarted: %s", err.msg);
    li_policy_proc_stats_get(p, &s);
    CHECK(s.pid > 0 && s.pid != s0.pid && s.crashes == 1 && s.restarts == 1, "new host %d (was %d)", s.pid, s0.pid);
    f.st.step = 3;
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:1"), "after the restart: %s", a);
    /* a host that crashes on every step: restarts back off */
    f.st.step = 10;
    run(p, &f.st, a, sizeof a); /* crash 1: restarted at once */
    CHECK(li_policy_proc_wait_ready(p, 10000, &err) == 0, "restarted: %s", err.msg);
    run(p, &f.st, a, sizeof a); /* crash 2: back-off */
    double t0 = now_s();
    run(p, &f.st, a, sizeof a);
    double dt = (now_s() - t0) * 1000;
    CHECK(strstr(a, "back-off") != NULL && dt < 20, "third call fails fast during the back-off (%.1f ms): %s", dt, a);
    p->ops->free(p);
}

/* Replacing a broken policy is always possible: a reload while the host is
 * in its restart back-off (or has just been killed) starts a fresh host
 * with the new text at once instead of being refused. */
static void test_reload_in_backoff(void) {
    const char *path = write_tmp("return { schedule = function(state) os.exit(3) end }\n");
    li_policy_proc_opts o = g_opts;
    o.lua.allow_unsafe = true;
    li_policy *p = NULL;
    li_error err = {0};
    CHECK(li_policy_proc_open(&p, path, &o, &err) == 0, "open: %s", err.msg);
    if (!p) return;
    fx f;
    fx_init(&f, 10, 8, 64);
    char a[512];
    run(p, &f.st, a, sizeof a); /* crash 1: restarted at once */
    CHECK(li_policy_proc_wait_ready(p, 10000, &err) == 0, "restarted: %s", err.msg);
    run(p, &f.st, a, sizeof a); /* crash 2: back-off */
    run(p, &f.st, a, sizeof a);
    CHECK(strstr(a, "back-off") != NULL, "in back-off: %s", a);
    const char *good = write_tmp("return { schedule = function(state) return { run = { { 1, 1 } } } end }\n");
    err = (li_error){0};
    int rc = p->ops->reload(p, good, NULL, &err);
    CHECK(rc == 0, "reload during the back-off: %s", err.msg);
    CHECK(!strcmp(run(p, &f.st, a, sizeof a), "1:1"), "the new policy serves: %s", a);
    p->ops->free(p);
}

static void bench(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/policies/default.lua", src_dir());
    li_policy *p = NULL;
    li_error err = {0};
    /* what this measures is the round trip, not the deadline (test_runaway
     * does): a generous one, so a descheduled host on a loaded machine (an
     * ASan build beside other jobs) does not fail every step after it */
    li_policy_proc_opts o = g_opts;
    o.deadline_ms = 5000;
    if (li_policy_proc_open(&p, path, &o, &err)) return;
    fx f;
    fx_init(&f, 1000, 128, 2048);
    for (int i = 0; i < 64; i++) fx_add(&f, i + 1, LI_REQ_RUNNING, 100 + i, 10 + i, 109 + 2 * i);
    li_plan plan;
    li_plan_init(&plan);
    int n = 3000, ok = 0;
    for (int i = 0; i < 500; i++) {
        li_plan_clear(&plan);
        p->ops->schedule(p, &f.st, &plan, &err);
    }
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        li_plan_clear(&plan);
        f.st.step = i;
        ok += p->ops->schedule(p, &f.st, &plan, &err) == 0;
    }
    double dt = now_s() - t0;
    CHECK(ok == n && plan.n_run == 64, "bench: %d/%d ok, %d entries", ok, n, plan.n_run);
    printf("bench: default.lua schedule() with 64 running requests: %.1f us/step isolated\n", dt / n * 1e6);
    li_plan_free(&plan);
    p->ops->free(p);
}

int main(void) {
    const char *bin = find_bin();
    if (!bin) {
        printf("SKIP: no luainfer binary with the policy-host command (set LUAINFER_BIN or build into build*/)\n");
        return 77;
    }
    printf("host binary: %s\n", bin);
    g_opts = (li_policy_proc_opts){.deadline_ms = 50, .start_timeout_ms = 10000, .host_bin = bin};
    test_same_plans();
    test_hooks_and_reload();
    test_runaway();
    test_crash();
    test_reload_in_backoff();
    bench();
    for (int i = 0; i < n_tmp; i++) remove(tmp_paths[i]);
    /* no host left behind */
    CHECK(waitpid(-1, NULL, WNOHANG) <= 0, "all hosts reaped");
    return t_summary("test_policy_proc");
}
