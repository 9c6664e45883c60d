/* engine_thread.h — the one thread that steps the engine, its commands
 * (add, cancel, reload) and the events it posts back to the loop. */
#ifndef LI_SERVER_ENGINE_THREAD_H
#define LI_SERVER_ENGINE_THREAD_H

#include "runtime/policy_open.h"
#include "server/server.h"

#include <stdio.h>

/* What the engine thread publishes after each step (under snap_mu). */
typedef struct li_engine_snapshot {
    li_engine_stats st;
    int64_t commands, steps_busy;
    double busy_seconds;     /* wall time inside steps */
    li_hist step_time;
    char policy[256];
    char policy_kind[16];    /* "lua", "process", "builtin" */
    int64_t policy_reloads, policy_reload_errors;
    /* --policy-isolation process: the host's round trips */
    int64_t host_calls, host_timeouts, host_crashes, host_restarts;
} li_engine_snapshot;

typedef struct li_event_batch li_event_batch;

typedef struct li_engine_thread_opts {
    li_model *model;
    li_model *draft;         /* NULL, or a draft model on be (li_engine_init_runners) */
    li_backend *be;
    li_engine_config cfg;
    li_policy *policy;       /* owned from now on; may be NULL */
    /* Receives each batch of events on the loop thread (li_api_on_events):
     * a callback, so this file needs nothing above it. */
    void (*on_events)(li_server *srv, li_event_batch *b);
    /* How policy.reload opens its policy (kind, sandbox options, deadline;
     * path and source are ignored): the server's own isolation mode. A
     * zero kind (LI_POLICY_BUILTIN) means in-process. */
    li_policy_open_opts reload;
    /* serve --step-log: one JSON line per step that computed something
     * (li_engine_thread_log_open); owned from now on, closed at stop. NULL: off. */
    FILE *step_log;
} li_engine_thread_opts;

/* Opens (appends to) a --step-log file, line-buffered; a clear error when it
 * cannot be written. */
int li_engine_thread_log_open(FILE **out, const char *path, li_error *err);

int li_engine_thread_start(li_engine_thread **out, li_server *srv, const li_engine_thread_opts *o, li_error *err);
/* Queues a prepared request; its events come back through opts.on_events. */
void li_engine_thread_add(li_engine_thread *t, li_srv_req *r);
/* Cancels every sample of r (no-op once finished). */
void li_engine_thread_cancel(li_engine_thread *t, li_srv_req *r);
/* Reloads the policy; done(ud, code, msg) runs on the loop thread. The file
 * at path is read here, on the caller's thread (a regular file only, at
 * most LI_POLICY_FILE_MAX bytes): the engine thread never waits on a path.
 * The new policy is opened fresh (for the process mode: a new host with the
 * new text, at once, whatever state the old host is in), its config is
 * checked as serve checks it at start-up, and only then swapped in. */
typedef void (*li_reload_done_fn)(void *ud, int code, const char *msg);
void li_engine_thread_reload(li_engine_thread *t, const char *path, const char *source, li_reload_done_fn done,
                             void *ud);
void li_engine_thread_snapshot(li_engine_thread *t, li_engine_snapshot *out); /* free out->step_time after */
/* Stops and joins the thread; requests still live are cancelled. */
void li_engine_thread_stop(li_engine_thread *t);

/* Events from the engine thread (posted to the loop in batches). */
typedef enum { LI_EV_DELTA, LI_EV_FINISH, LI_EV_ERROR } li_srv_event_kind;

typedef struct li_srv_event {
    li_srv_event_kind kind;
    li_srv_req *req;
    int64_t id;              /* engine id of this sample */
    int32_t index;           /* sample index (id - first id) */
    double t;                /* li_time_now() when it happened */
    /* DELTA */
    int32_t token;           /* -1: a text flush */
    float logprob;
    li_token_logprob *top;   /* malloc'd (n_top) */
    int32_t n_top;
    char *text;              /* malloc'd */
    size_t text_len;
    /* FINISH */
    const char *finish_reason;
    int32_t *tokens;         /* malloc'd (n_tokens) */
    int64_t n_tokens, n_prompt, n_cached;
    int32_t n_preemptions;
    double t_first;          /* li_time_now() clock; -1 if none */
    /* ERROR */
    int code;
} li_srv_event;

struct li_event_batch {
    li_server *srv;
    void (*on_events)(li_server *srv, li_event_batch *b); /* opts.on_events */
    li_srv_event *ev;
    int32_t n, cap;
};

#endif
