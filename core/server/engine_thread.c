/* engine_thread.c — the one thread that steps the engine.
 *
 * Everything that touches the li_engine or the policy happens here. The
 * loop thread hands work over through a mutex-protected command queue and
 * wakes this thread with a condition variable; this thread answers with
 * batches of events posted to the loop (li_loop_post: mutex +
 * uv_async_send), one batch per step, so a step with 128 decodes costs one
 * wake-up of the loop, not 128.
 *
 *   for (;;) {
 *       wait until: a command, or the engine has work, or quit
 *       run the commands (add, cancel, reload) in order
 *       one li_engine_step() if there is work
 *       release finished requests, publish the stats snapshot, post events
 *   }
 *
 * Lifetimes: a li_srv_req belongs to the loop thread, which frees it only
 * after the FINISH event of its last sample (or its ERROR) arrived. A
 * cancel command may still be queued by then, so commands name requests by
 * pointer and this thread only dereferences one that is in its own set of
 * live requests (checked by address; the queue is FIFO, so a freed and
 * reused address is added back only after the stale cancel ran). The set is
 * a hash of addresses, not an index kept in the request: finding a pointer
 * there never reads through it, and a lookup costs O(1) with thousands
 * queued. */
#define _GNU_SOURCE
#include "server/engine_thread.h"
#include "policy/policy_proc.h"
#include "runtime/policy_open.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { CMD_ADD, CMD_CANCEL, CMD_RELOAD } cmd_kind;

typedef struct cmd {
    cmd_kind kind;
    li_srv_req *req;
    char *path, *source;  /* reload: the name and the text (read on the loop thread) */
    char *error;          /* reload: why the file could not be read (the reply, in order) */
    li_reload_done_fn done;
    void *ud;
    struct cmd *next;
} cmd;

struct li_engine_thread {
    li_server *srv;
    void (*on_events)(li_server *srv, li_event_batch *b);
    li_engine *eng;
    li_policy *policy;
    uv_thread_t tid;
    bool started;
    /* loop → engine */
    uv_mutex_t mu;
    uv_cond_t cv;
    cmd *head, *tail;
    bool quit;
    /* engine thread only */
    li_event_batch *batch;
    li_srv_req **live;        /* open addressing by address, NULL = empty, at most half full */
    int32_t n_live, cap_live; /* cap_live: 0 or a power of two */
    int64_t *release;
    int32_t n_release, cap_release;
    li_hist step_time;
    double busy;
    int64_t commands, steps_busy, reloads, reload_errors;
    li_policy_open_opts reload_opts; /* how reloads open a policy (kind, sandbox) */
    li_policy_proc_stats host_past;  /* counters of the isolated hosts of replaced policies */
    /* --step-log (NULL: off). A step's line is written when its iteration
     * ends: at the next step's start (less the time this thread slept with
     * nothing to do in between), or at stop. */
    FILE *step_log;
    bool log_pending;                /* a logged step whose iteration still runs */
    li_step_shape log_shape;
    int64_t log_step, log_events;
    double log_t0, log_step_s, log_forward_s, log_policy_s, log_waited;
    /* engine → anyone: the stats snapshot */
    uv_mutex_t snap_mu;
    li_engine_snapshot snap;
};

static const double step_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

/* ---- events -------------------------------------------------------------------- */

static li_srv_event *push_event(li_engine_thread *t) {
    li_event_batch *b = t->batch;
    if (!b) {
        b = t->batch = li_xcalloc(1, sizeof *b);
        b->srv = t->srv;
        b->on_events = t->on_events;
    }
    if (b->n == b->cap) {
        b->cap = b->cap * 2 + 16;
        b->ev = li_xrealloc(b->ev, (size_t)b->cap * sizeof *b->ev);
    }
    li_srv_event *e = &b->ev[b->n++];
    memset(e, 0, sizeof *e);
    e->t = li_time_now();
    return e;
}

static void deliver(void *data) {
    li_event_batch *b = data;
    b->on_events(b->srv, b);
    free(b->ev);
    free(b);
}

static void flush_events(li_engine_thread *t) {
    if (!t->batch) return;
    li_loop_post(&t->srv->loop, deliver, t->batch);
    t->batch = NULL;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = li_xmalloc(n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- the set of live requests ------------------------------------------------- */

static uint32_t live_home(const li_engine_thread *t, const li_srv_req *r) {
    uint64_t h = (uint64_t)(uintptr_t)r;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull; /* mixes the aligned low bits away */
    h ^= h >> 33;
    return (uint32_t)h & (uint32_t)(t->cap_live - 1);
}

/* The slot holding r, or the empty slot where it would go; -1 when empty. */
static int32_t live_slot(const li_engine_thread *t, const li_srv_req *r) {
    if (t->cap_live == 0) return -1;
    uint32_t mask = (uint32_t)t->cap_live - 1, i = live_home(t, r);
    while (t->live[i] && t->live[i] != r) i = (i + 1) & mask;
    return (int32_t)i;
}

static bool live_has(const li_engine_thread *t, const li_srv_req *r) {
    int32_t i = live_slot(t, r);
    return i >= 0 && t->live[i] == r;
}

static void live_add(li_engine_thread *t, li_srv_req *r) {
    if (2 * (t->n_live + 1) > t->cap_live) {
        li_srv_req **old = t->live;
        int32_t old_cap = t->cap_live;
        t->cap_live = old_cap ? old_cap * 2 : 64;
        t->live = li_xcalloc((size_t)t->cap_live, sizeof *t->live);
        for (int32_t i = 0; i < old_cap; i++)
            if (old[i]) t->live[live_slot(t, old[i])] = old[i];
        free(old);
    }
    t->live[live_slot(t, r)] = r;
    t->n_live++;
}

static void live_remove(li_engine_thread *t, const li_srv_req *r) {
    int32_t at = live_slot(t, r);
    if (at < 0 || t->live[at] != r) return;
    /* backward-shift deletion: no tombstones, so probes stay short */
    uint32_t mask = (uint32_t)t->cap_live - 1, hole = (uint32_t)at;
    t->live[hole] = NULL;
    for (uint32_t j = (hole + 1) & mask; t->live[j]; j = (j + 1) & mask) {
        uint32_t home = live_home(t, t->live[j]);
        if (((j - home) & mask) >= ((j - hole) & mask)) { /* the hole lies on its probe path */
            t->live[hole] = t->live[j];
            t->live[j] = NULL;
            hole = j;
        }
    }
    t->n_live--;
}

/* The engine's callback (this thread, inside add/step/cancel). */
static void on_engine_event(void *ud, const li_event *ev) {
    li_srv_req *r = ud;
    li_engine_thread *t = r->srv->eng;
    if (r->eng_id < 0) r->eng_id = ev->id; /* events during li_engine_add (max_tokens = 0) */
    int32_t index = (int32_t)(ev->id - r->eng_id);
    if (ev->kind == LI_EVENT_TOKEN) {
        /* non-streamed requests without logprobs need nothing until the end,
         * except the first token's time and the token count */
        li_srv_event *e = push_event(t);
        e->kind = LI_EV_DELTA;
        e->req = r;
        e->id = ev->id;
        e->index = index;
        e->token = ev->token;
        e->logprob = ev->logprob;
        if (r->g.stream) e->text = dup_bytes(ev->text ? ev->text : "", ev->text_len), e->text_len = ev->text_len;
        if (r->g.logprobs >= 0 && ev->token >= 0 && ev->n_top > 0 && ev->top) {
            e->n_top = ev->n_top;
            e->top = li_xmalloc((size_t)ev->n_top * sizeof *e->top);
            memcpy(e->top, ev->top, (size_t)ev->n_top * sizeof *e->top);
        }
        return;
    }
    const li_request_result *res = li_engine_result(t->eng, ev->id);
    li_srv_event *e = push_event(t);
    e->kind = LI_EV_FINISH;
    e->req = r;
    e->id = ev->id;
    e->index = index;
    e->finish_reason = ev->finish_reason;
    e->t_first = -1;
    if (res) {
        e->text = dup_bytes(res->text, res->text_len);
        e->text_len = res->text_len;
        e->n_tokens = res->n_tokens;
        if (res->n_tokens > 0) {
            e->tokens = li_xmalloc((size_t)res->n_tokens * sizeof *e->tokens);
            memcpy(e->tokens, res->tokens, (size_t)res->n_tokens * sizeof *e->tokens);
        }
        e->n_prompt = res->n_prompt;
        e->n_cached = res->cached_tokens;
        e->n_preemptions = res->n_preemptions;
        if (res->t_first_token >= 0) e->t_first = e->t - (li_engine_now(t->eng) - res->t_first_token);
    }
    if (t->n_release == t->cap_release) {
        t->cap_release = t->cap_release * 2 + 16;
        t->release = li_xrealloc(t->release, (size_t)t->cap_release * sizeof *t->release);
    }
    t->release[t->n_release++] = ev->id;
    if (++r->n_fin_engine == r->g.n) live_remove(t, r);
}

static void push_error(li_engine_thread *t, li_srv_req *r, int code, const char *msg) {
    li_srv_event *e = push_event(t);
    e->kind = LI_EV_ERROR;
    e->req = r;
    e->code = code;
    e->text = dup_bytes(msg, strlen(msg));
    e->text_len = strlen(msg);
}

/* ---- commands ------------------------------------------------------------------- */

static void run_add(li_engine_thread *t, li_srv_req *r) {
    li_gen_params *g = &r->g;
    li_request_params p;
    li_gen_params_to_request(g, r->prompt, (int64_t)r->n_prompt, &p);
    p.on_event = on_engine_event;
    p.ud = r;
    r->eng_id = -1;
    r->n_fin_engine = 0;
    live_add(t, r);
    li_error err = {0};
    int64_t id;
    if (li_engine_add(t->eng, &p, &id, &err) != 0) {
        live_remove(t, r);
        int code = err.code == LI_EREJECTED ? LI_RPC_REJECTED
                   : err.code == LI_EINVAL || err.code == LI_ERANGE ? LI_RPC_INVALID_PARAMS
                                                                    : LI_RPC_ENGINE;
        push_error(t, r, code, err.msg);
        return;
    }
    r->eng_id = id;
}

static void run_cancel(li_engine_thread *t, li_srv_req *r) {
    if (!live_has(t, r)) return; /* finished already (or never added) */
    int64_t first = r->eng_id;
    int32_t n = r->g.n;
    for (int32_t i = 0; i < n; i++) li_engine_cancel(t->eng, first + i);
}

typedef struct reload_reply {
    li_reload_done_fn done;
    void *ud;
    int code;
    char msg[512];
} reload_reply;

static void deliver_reload(void *data) {
    reload_reply *rr = data;
    rr->done(rr->ud, rr->code, rr->msg);
    free(rr);
}

/* What serve refuses at start-up in a policy's config, refused at reload
 * too (the engine's own config does not change at reload). */
static int check_config(const li_policy_config *pc, li_error *err) {
    li_type dt;
    if (pc->kv_dtype[0] && li_kv_dtype_parse(pc->kv_dtype, &dt, err)) return err->code;
    return 0;
}

static void run_reload(li_engine_thread *t, cmd *c) {
    li_error err = {0};
    int rc;
    if (c->error) {
        rc = li_error_set(&err, LI_EINVAL, "%s", c->error);
    } else {
        /* a fresh policy: a broken one (a host in back-off, a state that
         * keeps failing) never stands in the way of its replacement */
        li_policy *p = NULL;
        li_policy_open_opts po = t->reload_opts;
        if (po.kind != LI_POLICY_PROCESS) po.kind = LI_POLICY_LUA;
        po.path = c->path;
        po.source = c->source;
        rc = li_policy_open(&p, &po, &err);
        if (rc == 0 && (rc = check_config(&p->config, &err)) != 0) {
            char m[sizeof err.msg];
            snprintf(m, sizeof m, "%s", err.msg);
            li_error_set(&err, rc, "%s: config: %s", p->name, m);
            p->ops->free(p);
        } else if (rc == 0) {
            li_policy *old = t->policy;
            if (li_policy_kind_of(old) == LI_POLICY_PROCESS) {
                li_policy_proc_stats ps;
                li_policy_proc_stats_get(old, &ps);
                t->host_past.calls += ps.calls;
                t->host_past.timeouts += ps.timeouts;
                t->host_past.crashes += ps.crashes;
                t->host_past.restarts += ps.restarts;
                t->host_past.dropped += ps.dropped;
            }
            t->policy = p;
            li_engine_set_policy(t->eng, p);
            if (old) old->ops->free(old);
        }
    }
    if (rc) t->reload_errors++;
    else t->reloads++;
    /* the reply goes after this step's events, so the caller sees order kept */
    flush_events(t);
    reload_reply *rr = li_xcalloc(1, sizeof *rr);
    rr->done = c->done;
    rr->ud = c->ud;
    rr->code = rc;
    snprintf(rr->msg, sizeof rr->msg, "%s", rc ? err.msg : (t->policy ? t->policy->name : ""));
    li_loop_post(&t->srv->loop, deliver_reload, rr);
}

static void release_finished(li_engine_thread *t) {
    for (int32_t i = 0; i < t->n_release; i++) li_engine_release(t->eng, t->release[i]);
    t->n_release = 0;
}

static void publish(li_engine_thread *t) {
    uv_mutex_lock(&t->snap_mu);
    li_engine_stats_get(t->eng, &t->snap.st);
    t->snap.commands = t->commands;
    t->snap.steps_busy = t->steps_busy;
    t->snap.busy_seconds = t->busy;
    li_hist_copy(&t->snap.step_time, &t->step_time);
    snprintf(t->snap.policy, sizeof t->snap.policy, "%s", t->policy ? t->policy->name : "builtin-fcfs");
    const li_policy_kind kind = li_policy_kind_of(t->policy);
    snprintf(t->snap.policy_kind, sizeof t->snap.policy_kind, "%s", li_policy_kind_name(kind));
    if (kind == LI_POLICY_PROCESS) {
        li_policy_proc_stats ps;
        li_policy_proc_stats_get(t->policy, &ps);
        t->snap.host_calls = t->host_past.calls + ps.calls;
        t->snap.host_timeouts = t->host_past.timeouts + ps.timeouts;
        t->snap.host_crashes = t->host_past.crashes + ps.crashes;
        t->snap.host_restarts = t->host_past.restarts + ps.restarts;
    }
    t->snap.policy_reloads = t->reloads;
    t->snap.policy_reload_errors = t->reload_errors;
    uv_mutex_unlock(&t->snap_mu);
}

/* ---- --step-log ------------------------------------------------------------------ */

int li_engine_thread_log_open(FILE **out, const char *path, li_error *err) {
    /* appended, not written whole and renamed: a killed server keeps every
     * line but the one being written */
    FILE *f = fopen(path, "a");
    if (!f) return li_error_set(err, LI_EIO, "--step-log: cannot write %s: %s", path, strerror(errno));
    setvbuf(f, NULL, _IOLBF, 0);
    *out = f;
    return 0;
}

/* The pending step's iteration ended at `end`: its line goes out now. */
static void log_write(li_engine_thread *t, double end) {
    if (!t->log_pending) return;
    t->log_pending = false;
    const li_step_shape *s = &t->log_shape;
    int n = fprintf(t->step_log,
                    "{\"step\":%lld,\"prefill_tokens\":%lld,\"decode_rows\":%lld,\"context\":%.17g,"
                    "\"step_s\":%.9g,\"forward_s\":%.9g,\"policy_s\":%.9g,\"iter_s\":%.9g,\"events\":%lld}\n",
                    (long long)t->log_step, (long long)s->prefill_tokens, (long long)s->decode_rows, s->context,
                    t->log_step_s, t->log_forward_s, t->log_policy_s, end - t->log_t0 - t->log_waited,
                    (long long)t->log_events);
    if (n < 0 || fflush(t->step_log) != 0) {
        li_log_error("serve: --step-log: write failed (%s): the step log stops here", strerror(errno));
        fclose(t->step_log);
        t->step_log = NULL;
    }
}

/* After a step (t0: its start, dt: its wall time) and its publish: keeps its
 * numbers for the line written when the iteration ends. */
static void log_step(li_engine_thread *t, double t0, double dt, double forward0, double policy0) {
    li_step_shape sh;
    li_engine_last_step(t->eng, &sh);
    if (sh.prefill_tokens == 0 && sh.decode_rows == 0) return; /* computed nothing */
    const li_engine_stats *st = &t->snap.st;
    t->log_pending = true;
    t->log_shape = sh;
    t->log_step = st->steps;
    t->log_t0 = t0;
    t->log_step_s = dt;
    t->log_forward_s = st->time_forward - forward0;
    t->log_policy_s = st->time_policy - policy0;
    t->log_events = t->batch ? t->batch->n : 0;
}

static void thread_main(void *arg) {
    li_engine_thread *t = arg;
    for (;;) {
        uv_mutex_lock(&t->mu);
        while (!t->head && !t->quit && !li_engine_has_work(t->eng)) {
            const double w0 = t->step_log ? li_time_now() : 0;
            uv_cond_wait(&t->cv, &t->mu);
            if (t->step_log) t->log_waited += li_time_now() - w0; /* idle: no iteration's cost */
        }
        cmd *list = t->head;
        t->head = t->tail = NULL;
        bool quit = t->quit;
        uv_mutex_unlock(&t->mu);

        for (cmd *c = list, *next; c; c = next) {
            next = c->next;
            t->commands++;
            if (c->kind == CMD_ADD) run_add(t, c->req);
            else if (c->kind == CMD_CANCEL) run_cancel(t, c->req);
            else run_reload(t, c);
            free(c->path);
            free(c->source);
            free(c->error);
            free(c);
        }
        if (quit) {
            /* stop: whatever is still live ends as cancelled */
            for (int32_t i = 0; i < t->cap_live && t->n_live > 0;) {
                li_srv_req *r = t->live[i];
                if (!r) {
                    i++;
                    continue;
                }
                run_cancel(t, r); /* removes r; a later entry may shift into slot i */
                if (t->live[i] == r) live_remove(t, r); /* cannot happen; never spin */
            }
            release_finished(t);
            publish(t);
            flush_events(t);
            if (t->step_log) log_write(t, li_time_now());
            return;
        }
        double t0 = 0, dt = -1, forward0 = 0, policy0 = 0;
        if (li_engine_has_work(t->eng)) {
            li_error err = {0};
            t0 = li_time_now();
            if (t->step_log) {
                log_write(t, t0);
                t->log_waited = 0;
                forward0 = t->snap.st.time_forward; /* this thread's own last publish */
                policy0 = t->snap.st.time_policy;
            }
            if (li_engine_step(t->eng, &err) != 0) li_log_error("serve: engine step failed: %s", err.msg);
            dt = li_time_now() - t0;
            li_hist_add(&t->step_time, dt);
            t->busy += dt;
            t->steps_busy++;
        }
        release_finished(t);
        publish(t);
        if (t->step_log && dt >= 0) log_step(t, t0, dt, forward0, policy0);
        flush_events(t);
    }
}

/* ---- the loop thread's side -------------------------------------------------------- */

static void push_cmd(li_engine_thread *t, cmd *c) {
    uv_mutex_lock(&t->mu);
    if (t->tail) t->tail->next = c;
    else t->head = c;
    t->tail = c;
    uv_cond_signal(&t->cv);
    uv_mutex_unlock(&t->mu);
}

void li_engine_thread_add(li_engine_thread *t, li_srv_req *r) {
    cmd *c = li_xcalloc(1, sizeof *c);
    c->kind = CMD_ADD;
    c->req = r;
    push_cmd(t, c);
}

void li_engine_thread_cancel(li_engine_thread *t, li_srv_req *r) {
    cmd *c = li_xcalloc(1, sizeof *c);
    c->kind = CMD_CANCEL;
    c->req = r;
    push_cmd(t, c);
}

void li_engine_thread_reload(li_engine_thread *t, const char *path, const char *source, li_reload_done_fn done,
                             void *ud) {
    cmd *c = li_xcalloc(1, sizeof *c);
    c->kind = CMD_RELOAD;
    c->path = path ? strdup(path) : NULL;
    if (source) {
        c->source = strdup(source);
    } else if (path) {
        /* read here: a FIFO, a slow disk or a huge file never holds up the engine thread */
        li_error err = {0};
        size_t len;
        if (li_policy_read_file(path, &c->source, &len, &err)) c->error = strdup(err.msg);
        else if (memchr(c->source, 0, len)) {
            /* bytecode (--policy-unsafe): the engine thread loads the
             * regular file just checked by its path, with its length */
            free(c->source);
            c->source = NULL;
        }
    } else {
        c->error = strdup("policy reload: neither a path nor source text given");
    }
    c->done = done;
    c->ud = ud;
    push_cmd(t, c);
}

void li_engine_thread_snapshot(li_engine_thread *t, li_engine_snapshot *out) {
    uv_mutex_lock(&t->snap_mu);
    *out = t->snap;
    li_hist_init(&out->step_time, t->snap.step_time.le, t->snap.step_time.n);
    li_hist_copy(&out->step_time, &t->snap.step_time);
    uv_mutex_unlock(&t->snap_mu);
}

int li_engine_thread_start(li_engine_thread **out, li_server *srv, const li_engine_thread_opts *o, li_error *err) {
    *out = NULL;
    li_engine_thread *t = li_xcalloc(1, sizeof *t);
    t->srv = srv;
    t->on_events = o->on_events;
    int rc = li_engine_init_runners(&t->eng, o->model, o->draft, o->be, &o->cfg, err);
    if (rc) {
        if (o->policy) o->policy->ops->free(o->policy); /* owned from the call on */
        if (o->step_log) fclose(o->step_log);
        free(t);
        return rc;
    }
    t->policy = o->policy;
    t->reload_opts = o->reload;
    t->step_log = o->step_log;
    li_engine_set_policy(t->eng, t->policy);
    li_hist_init(&t->step_time, step_buckets, (int)LI_ARRAY_LEN(step_buckets));
    li_hist_init(&t->snap.step_time, step_buckets, (int)LI_ARRAY_LEN(step_buckets));
    uv_mutex_init(&t->mu);
    uv_cond_init(&t->cv);
    uv_mutex_init(&t->snap_mu);
    publish(t);
    srv->eng = t; /* the callback finds the thread through the server */
    li_thread_signals_begin();
    rc = uv_thread_create(&t->tid, thread_main, t);
    li_thread_signals_end();
    if (rc != 0) {
        srv->eng = NULL;
        li_engine_thread_stop(t);
        return li_error_set(err, LI_EIO, "serve: cannot start the engine thread: %s", uv_strerror(rc));
    }
    t->started = true;
    *out = t;
    return 0;
}

void li_engine_thread_stop(li_engine_thread *t) {
    if (!t) return;
    if (t->started) {
        uv_mutex_lock(&t->mu);
        t->quit = true;
        uv_cond_signal(&t->cv);
        uv_mutex_unlock(&t->mu);
        uv_thread_join(&t->tid);
    }
    for (cmd *c = t->head, *next; c; c = next) { /* commands that came too late */
        next = c->next;
        free(c->path);
        free(c->source);
        free(c->error);
        free(c);
    }
    li_engine_free(t->eng);
    if (t->policy) t->policy->ops->free(t->policy);
    if (t->step_log) fclose(t->step_log);
    uv_mutex_destroy(&t->mu);
    uv_cond_destroy(&t->cv);
    uv_mutex_destroy(&t->snap_mu);
    li_hist_free(&t->step_time);
    li_hist_free(&t->snap.step_time);
    free(t->live);
    free(t->release);
    free(t);
}
