/* server.h — `luainfer serve`: msgpack-RPC and HTTP in front of one engine.
 *
 * Two threads meet here (see docs/server.md, "Threads"):
 *
 *   loop thread (libuv)                        engine thread
 *   ───────────────────                        ─────────────
 *   sockets, framing, HTTP, auth, limits  ──cmd──▶  li_engine_add / cancel / step
 *   replies, SSE, backpressure            ◀─events─ token deltas, finishes
 *
 * loop → engine: a mutex-protected command queue and a condition variable
 * (engine_thread.c). engine → loop: batches of events posted with
 * li_loop_post (mutex + uv_async_send, loop.c). li_engine_* is called only
 * from the engine thread; sockets are touched only from the loop thread.
 * Prompt preparation (chat template + tokenizer) runs on libuv's worker
 * pool, so neither thread waits for it.
 *
 * Files: loop.c (loop, posting, listeners, connections, backpressure),
 * rpc.c (msgpack framing + dispatch), http.c (HTTP, OpenAI, SSE, metrics),
 * engine_thread.c, api.c (the methods, declared once), serve.c (the
 * command), repl.c, lua_client.c (`luainfer.net` for Lua clients). */
#ifndef LI_SERVER_H
#define LI_SERVER_H

#include "engine/engine.h"
#include "lua/lua_env.h"
#include "request/request.h"
#include "util/mp_read.h"
#include "util/utf8.h"

#include <msgpack.h>
#include <uv.h>

/* ---- the subcommands (wired into core/main.c) ------------------------------ */

int li_cmd_serve(int argc, char **argv);
int li_cmd_repl(int argc, char **argv);

/* ---- limits and their documented defaults (docs/server.md) ----------------- */

#define LI_SRV_DEFAULT_PORT 7700
#define LI_SRV_MAX_FRAME (1u << 20)         /* bytes of one msgpack frame / HTTP body */
#define LI_SRV_MAX_DEPTH 32                 /* nesting of arrays and maps */
_Static_assert(LI_SRV_MAX_DEPTH <= LI_MP_MAX_DEPTH, "li_mp_scan_feed follows LI_MP_MAX_DEPTH levels at most");
#define LI_SRV_MAX_INFLIGHT 64              /* requests in flight per connection */
#define LI_SRV_MAX_CONNECTIONS 256
#define LI_SRV_MAX_QUEUED 4096              /* samples waiting + running, all connections together */
#define LI_SRV_WRITE_BUFFER (8u << 20)      /* unsent bytes per connection before reads stop */
#define LI_SRV_SLOW_CLIENT_SECONDS 30.0     /* over the write buffer this long: cancel + close */
#define LI_SRV_DRAIN_SECONDS 30.0
#define LI_SRV_MAX_STOP LI_REQ_MAX_STOP
#define LI_SRV_MAX_N LI_REQ_MAX_N

/* Error codes (the `code` of an error map; docs/server.md lists them). */
enum {
    LI_RPC_PARSE_ERROR = -32700,     /* bytes that are not msgpack (connection closed) */
    LI_RPC_INVALID_REQUEST = -32600, /* msgpack, but not a msgpack-rpc message */
    LI_RPC_METHOD_NOT_FOUND = -32601,
    LI_RPC_INVALID_PARAMS = -32602,
    LI_RPC_INTERNAL = -32603,
    LI_RPC_REJECTED = -32000,        /* the policy's admit hook said no */
    LI_RPC_ENGINE = -32001,          /* the engine failed the request */
    LI_RPC_UNAUTHORIZED = 401,
    LI_RPC_FORBIDDEN = 403,          /* admin method while --admin-token is unset */
    LI_RPC_NOT_FOUND = 404,
    LI_RPC_TOO_LARGE = 413,          /* frame over --max-frame-bytes (connection closed) */
    LI_RPC_TOO_MANY = 429,           /* --max-inflight (this connection) or --max-queued (server) reached */
    LI_RPC_UNAVAILABLE = 503,        /* shutting down, no engine, too many connections */
};

typedef struct li_server li_server;
typedef struct li_conn li_conn;
typedef struct li_srv_req li_srv_req;

/* ============================================================================
 * loop.c — a thin struct over uv_loop_t; other threads post work to it
 * ========================================================================== */

typedef void (*li_loop_fn)(void *data);
typedef struct li_loop_item li_loop_item;

typedef struct li_loop {
    uv_loop_t uv;
    uv_async_t async;       /* wakes the loop to run posted items */
    uv_mutex_t mu;          /* guards head/tail */
    li_loop_item *head, *tail;
} li_loop;

int li_loop_init(li_loop *l, li_error *err);
/* Runs fn(data) on the loop thread, soon. Safe from any thread. */
void li_loop_post(li_loop *l, li_loop_fn fn, void *data);
/* Runs what is posted now (the loop thread only). */
void li_loop_run_posted(li_loop *l);
/* Closes every handle, runs what is still posted, frees the loop. */
void li_loop_close(li_loop *l);

/* ---- connections ----------------------------------------------------------- */

typedef enum { LI_CONN_RPC, LI_CONN_HTTP } li_conn_kind;

typedef struct li_conn_ops {
    void (*on_data)(li_conn *c, const char *buf, size_t n);
    void (*on_close)(li_conn *c); /* before the handle closes: drop requests */
    void (*free)(li_conn *c);     /* after it closed */
} li_conn_ops;

struct li_conn {
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    const li_conn_ops *ops;
    li_server *srv;
    li_conn_kind kind;
    uint64_t serial;        /* unique per connection, for logs */
    size_t wbuf;            /* bytes handed to uv_write and not yet written */
    bool reading, paused, closing;
    bool want_read;         /* reading unless a protocol pause (HTTP: one request at a time) */
    double over_since;      /* when wbuf went over the limit (paused) */
    li_conn *prev, *next;   /* srv->conns */
};

/* Writes a copy of buf; never blocks. Past the write buffer the connection
 * stops reading (backpressure); see li_conn_check_slow. */
void li_conn_write(li_conn *c, const void *buf, size_t n);
/* Closes after queued writes; requests of the connection are cancelled. */
void li_conn_close(li_conn *c);
/* Closes now, dropping unsent bytes (shutdown of a client that does not read). */
void li_conn_force_close(li_conn *c);
/* Protocol-level read pause (independent of backpressure). */
void li_conn_set_reading(li_conn *c, bool on);

typedef struct li_listener {
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    li_server *srv;
    li_conn_kind kind;
    char addr[300];         /* printed form: "127.0.0.1:7700", "unix:/path" */
    char *unix_path;        /* unlinked at close */
    struct li_listener *next;
} li_listener;

/* Binds "HOST:PORT", "[V6]:PORT", ":PORT", "PORT" or "unix:PATH"; port 0
 * picks a free port and l->addr has the real one. */
int li_listener_open(li_server *srv, const char *spec, li_conn_kind kind, li_error *err);
void li_listeners_close(li_server *srv);

/* ============================================================================
 * the parsed request and its lifetime
 * ========================================================================== */

/* Per-sample output gathered on the loop thread. */
typedef struct li_sample_out {
    char *text;
    size_t text_len;
    int32_t *tokens;
    int64_t n_tokens;
    const char *finish_reason; /* a literal, NULL until finished */
    msgpack_sbuffer logprobs;  /* packed array items of {token, logprob, top}, when asked */
    int64_t n_logprobs;
} li_sample_out;

/* Who receives a request's output: an RPC connection or an HTTP exchange.
 * Called on the loop thread; never called once the owner is gone. */
typedef struct li_sink_ops {
    /* one token of sample `index` (text may be empty) */
    void (*delta)(li_srv_req *r, int32_t index, const char *text, size_t n, int32_t token, float logprob,
                  const li_token_logprob *top, int32_t n_top);
    void (*done)(li_srv_req *r);                            /* every sample finished */
    void (*error)(li_srv_req *r, int code, const char *msg); /* failed before generating */
} li_sink_ops;

typedef enum { LI_REQ_PREP, LI_REQ_QUEUED, LI_REQ_FINISHED } li_srv_req_state;

struct li_srv_req {
    li_server *srv;
    li_gen_params g;
    uv_work_t work;          /* prompt preparation on the worker pool */
    int32_t *prompt;         /* prepared tokens (worker → engine thread) */
    size_t n_prompt;
    int prep_code;
    char prep_msg[512];
    /* engine thread only */
    int64_t eng_id;          /* first sample's engine id, -1 until known */
    int32_t n_fin_engine;
    /* loop thread only */
    li_srv_req_state state;
    const li_sink_ops *sink; /* NULL once the owner went away */
    void *owner;             /* li_conn (RPC) or the HTTP exchange */
    uint32_t msgid;
    bool no_reply;           /* started by a notification: nothing is sent back */
    int64_t id;              /* engine id (known after the first event) */
    bool cancelled;
    int32_t n_done;
    li_sample_out *out;      /* (g.n) */
    int64_t n_prompt_tokens, n_cached_tokens;
    int32_t n_preemptions;
    double t_recv, t_first, t_finish; /* li_time_now() seconds */
    int64_t n_generated;
    li_srv_req *prev, *next; /* the owner's list */
};

/* ============================================================================
 * engine_thread.c
 * ========================================================================== */

typedef struct li_hist {
    int n;                  /* buckets */
    const double *le;       /* (n) upper bounds, seconds */
    uint64_t *count;        /* (n + 1): the last is +Inf */
    double sum;
    uint64_t total;
} li_hist;

void li_hist_init(li_hist *h, const double *le, int n);
void li_hist_free(li_hist *h);
void li_hist_add(li_hist *h, double v);
void li_hist_copy(li_hist *dst, const li_hist *src); /* dst initialised with the same buckets */

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

typedef struct li_engine_thread li_engine_thread;

typedef struct li_engine_thread_opts {
    li_model *model;
    li_backend *be;
    li_engine_config cfg;
    li_policy *policy;       /* owned from now on; may be NULL */
} li_engine_thread_opts;

int li_engine_thread_start(li_engine_thread **out, li_server *srv, const li_engine_thread_opts *o, li_error *err);
/* Queues a prepared request; its events come back through li_server_on_events. */
void li_engine_thread_add(li_engine_thread *t, li_srv_req *r);
/* Cancels every sample of r (no-op once finished). */
void li_engine_thread_cancel(li_engine_thread *t, li_srv_req *r);
/* Reloads the policy on the engine thread; done(ud, code, msg) runs on the loop thread. */
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

typedef struct li_event_batch {
    li_server *srv;
    li_srv_event *ev;
    int32_t n, cap;
} li_event_batch;

/* ============================================================================
 * the server (serve.c) and its metrics
 * ========================================================================== */

typedef struct li_server_limits {
    size_t max_frame;
    int max_depth;
    int max_inflight;
    int max_connections;
    int64_t max_queued;      /* samples accepted and not yet finished, server-wide */
    size_t write_buffer;
    double slow_client_seconds;
    double drain_seconds;
} li_server_limits;

void li_server_limits_default(li_server_limits *l);
/* policies/default.lua in the working directory, else in the source tree;
 * NULL when neither exists. */
const char *li_server_default_policy(void);

typedef struct li_metrics {
    uint64_t requests_by_reason[5];     /* stop, length, cancelled, error, rejected */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t rpc_calls, rpc_errors, http_requests, http_errors;
    uint64_t connections_total, connections_refused, slow_clients_closed, inflight_refused, queued_refused;
    li_hist ttft, tpot, e2e;
    uint64_t tok_ring[16];              /* generated tokens per second, ring of the last 16 s */
    int64_t tok_ring_sec;
} li_metrics;

struct li_server {
    li_loop loop;
    li_server_limits lim;
    const char *admin_token, *auth_token; /* NULL: off */
    li_model *model;                    /* NULL in the fuzz targets */
    char model_name[256];
    li_engine_config cfg;               /* what the engine runs with */
    li_engine_thread *eng;              /* NULL: generate answers 503 */
    li_listener *listeners;
    li_conn *conns;
    int n_conns;
    uint64_t next_serial;
    int64_t n_live;                     /* requests not yet finished */
    int64_t n_samples;                  /* their samples (n each): what --max-queued caps */
    bool draining, stopping;
    double drain_deadline, stop_deadline;
    double t_start;
    uv_timer_t tick;                    /* 100 ms: slow clients, drain */
    uv_signal_t sig_int, sig_term;
    bool handles_open;
    li_metrics m;
    /* Lua states for chat templates on the worker pool */
    uv_mutex_t lua_mu;
    lua_State **lua_free;
    int n_lua_free, cap_lua_free;
};

/* A server with no sockets, no model and no engine thread: what the fuzz
 * targets and unit tests feed bytes into. */
void li_server_init_detached(li_server *srv);
void li_server_free_detached(li_server *srv);

/* Events delivered on the loop thread (engine_thread.c posts them). */
void li_server_on_events(li_server *srv, li_event_batch *b);
/* Starts the graceful stop: no new connections or requests, in-flight ones
 * finish within drain_seconds, then the loop ends. */
void li_server_begin_drain(li_server *srv, const char *why);
/* Prometheus text; *out malloc'd. */
void li_server_metrics_text(li_server *srv, char **out, size_t *n);

/* ============================================================================
 * api.c — every method once
 * ========================================================================== */

/* One call in progress. Sync results are packed into `result`; an error
 * fills code/msg; async methods set `pending` and reply later. */
typedef struct li_call {
    li_server *srv;
    li_conn *conn;           /* the RPC connection (NULL for HTTP) */
    void *session;           /* rpc session of the connection */
    uint32_t msgid;
    bool notification;
    msgpack_sbuffer result;
    msgpack_packer pk;
    int code;
    char msg[512];
    bool pending;
} li_call;

void li_call_init(li_call *c, li_server *srv);
void li_call_free(li_call *c);
int li_call_fail(li_call *c, int code, const char *fmt, ...) LI_PRINTF(3, 4);

/* Runs method with params (a map; [map] is unwrapped by the caller). */
void li_api_dispatch(li_call *c, const char *method, size_t method_len, const msgpack_object *params);

/* Parses `generate` params. http: OpenAI defaults and unknown keys ignored;
 * otherwise luainfer's defaults and unknown keys are an error. */
typedef struct li_gen_defaults {
    bool openai;             /* temperature 1, top_p 1, top_k/min_p off, max_tokens 16 (completions) */
    bool chat;               /* messages required; max_tokens defaults to the context */
} li_gen_defaults;
int li_api_gen_parse(li_server *srv, const msgpack_object *params, const li_gen_defaults *d, li_gen_params *g,
                     li_error *err);
/* Starts a parsed request (takes g). On 0 the sink receives the output; on
 * failure g is freed and err says why (code in err->code: an LI_RPC_* code). */
li_srv_req *li_api_gen_start(li_server *srv, li_gen_params *g, const li_sink_ops *sink, void *owner,
                             li_error *err);
/* The owner went away: cancel, never call the sink again. */
void li_api_gen_orphan(li_srv_req *r);
/* Cancels a request the owner still holds. */
void li_api_gen_cancel(li_srv_req *r);
void li_srv_req_free(li_srv_req *r);

/* Helpers shared by rpc.c and http.c. */
/* The value of `key` in a params map (str or bin keys), or NULL. */
static inline const msgpack_object *li_mp_get(const msgpack_object *map, const char *key) {
    return li_mp_read_get(map, key, true);
}
void li_mp_pack_str(msgpack_packer *pk, const char *s);
void li_mp_pack_strn(msgpack_packer *pk, const char *s, size_t n);
/* Packs the stats map (method `stats`). */
void li_api_pack_stats(li_server *srv, msgpack_packer *pk);
/* The model list entry name. */
const char *li_api_model_name(li_server *srv);
/* A list of token ids (integers >= 0; not checked against a vocabulary)
 * as *out (owned), or LI_RPC_INVALID_PARAMS naming key. */
int li_api_parse_tokens(const msgpack_object *o, const char *key, int32_t **out, size_t *n_out, li_error *err);
/* The text of token ids (srv->model loaded): *text_out (len bytes, owned;
 * invalid UTF-8 as U+FFFD), or LI_RPC_INVALID_PARAMS for an id outside the
 * vocabulary. */
int li_api_detokenize(li_server *srv, const int32_t *ids, size_t n, bool special, char **text_out, size_t *len_out,
                      li_error *err);

/* ============================================================================
 * rpc.c — msgpack-RPC framing, shared by sockets and the fuzz target
 * ========================================================================== */

typedef struct li_rpc_session {
    li_server *srv;
    li_conn *conn;           /* NULL when detached (fuzz): output goes to `out` */
    msgpack_sbuffer *out;
    char *buf;               /* bytes of the frame being received */
    size_t n, cap;
    li_mp_scan scan;
    bool authed, closed;
    int inflight;
    li_srv_req *reqs;        /* requests in flight (generate) */
} li_rpc_session;

void li_rpc_session_init(li_rpc_session *s, li_server *srv, li_conn *conn, msgpack_sbuffer *out);
void li_rpc_session_free(li_rpc_session *s); /* orphans the session's requests */
/* Feeds received bytes: frames are parsed and dispatched; replies go to the
 * connection (or `out`). Returns false once the session must close. */
bool li_rpc_session_feed(li_rpc_session *s, const char *data, size_t n);
/* Pure: feeds bytes into a detached server and returns everything it would
 * have written back (fuzz_rpc). *out malloc'd. */
void li_rpc_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n);

/* Sends raw bytes on the session (connection or capture buffer). */
void li_rpc_session_send(li_rpc_session *s, const char *buf, size_t n);

li_conn *li_rpc_conn_new(li_server *srv);
/* generate over RPC: checks --max-inflight, tracks the request on the
 * session (cancelled when it closes). no_reply: started by a notification. */
li_srv_req *li_rpc_start_generate(li_rpc_session *s, uint32_t msgid, bool no_reply, li_gen_params *g, li_error *err);
/* A request of this session by engine id (any sample) or by msgid (-1: unused). */
li_srv_req *li_rpc_find(li_rpc_session *s, int64_t id, int64_t msgid);

/* ============================================================================
 * http.c
 * ========================================================================== */

li_conn *li_http_conn_new(li_server *srv);
/* Pure: an HTTP byte stream into a detached server; returns the response
 * bytes (fuzz_http). */
void li_http_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n);

/* ============================================================================
 * lua_client.c — `luainfer.net` for Lua clients
 * ========================================================================== */

/* Makes require("luainfer.net") available in L (sockets + msgpack). */
void li_lua_preload_net(lua_State *L);
int luaopen_luainfer_net(lua_State *L);

#endif
