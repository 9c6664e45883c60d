/* server.h — `luainfer serve`: the server object its files share.
 *
 * Two threads meet in the server (see docs/server.md, "Threads"):
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
 * Files, each with its header, lowest first (no include runs back up;
 * tools/check_includes.py checks it):
 *   hist.c, loop.c (loop, posting, listeners, connections, backpressure:
 *   no protocol) → server.c (this object, its limits, draining) →
 *   engine_thread.c → api.c (the methods, declared once; the request
 *   lifecycle) → rpc.c (msgpack framing + dispatch), http.c (HTTP, OpenAI,
 *   SSE, metrics) → serve.c (the command), repl.c; lua_client.c
 *   (`luainfer.net` for Lua clients) stands beside them. */
#ifndef LI_SERVER_H
#define LI_SERVER_H

#include "engine/engine.h"
#include "request/request.h"
#include "server/hist.h"
#include "server/loop.h"
#include "util/mp_read.h"
#include "util/utf8.h"

#include <msgpack.h>
#include <uv.h>

typedef struct lua_State lua_State;

/* ---- limits and their documented defaults (docs/server.md) ----------------- */

#define LI_SRV_DEFAULT_PORT 7700
#define LI_SRV_DEFAULT_HTTP_PORT 8000
#define LI_SRV_MAX_FRAME (1u << 20)         /* bytes of one msgpack frame / HTTP body */
#define LI_SRV_MAX_DEPTH 32                 /* nesting of arrays and maps */
_Static_assert(LI_SRV_MAX_DEPTH <= LI_MP_MAX_DEPTH, "li_mp_scan_feed follows LI_MP_MAX_DEPTH levels at most");
#define LI_SRV_MAX_INFLIGHT 64              /* requests in flight per connection */
#define LI_SRV_MAX_CONNECTIONS 256
#define LI_SRV_MAX_QUEUED 4096              /* samples waiting + running, all connections together */
#define LI_SRV_WRITE_BUFFER (8u << 20)      /* unsent bytes per connection before reads stop */
#define LI_SRV_SLOW_CLIENT_SECONDS 30.0     /* over the write buffer this long: cancel + close */
#define LI_SRV_DRAIN_SECONDS 30.0
#define LI_SRV_HEADER_TIMEOUT 10.0          /* s: HTTP request head (and the wait for the first request) */
#define LI_SRV_BODY_TIMEOUT 30.0            /* s: HTTP body / msgpack frame, from its first byte */
#define LI_SRV_IDLE_TIMEOUT 60.0            /* s: HTTP keep-alive between requests */
#define LI_SRV_RPC_IDLE_TIMEOUT 0.0         /* s: msgpack-RPC between calls (0: sessions stay open) */
#define LI_SRV_EVICT_IDLE_SECONDS 2.0       /* at --max-connections: close one idle this long for a new one */
#define LI_SRV_MAX_CONNECTIONS_PER_IP 0     /* 0: no per-address limit */
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
    LI_RPC_TIMEOUT = 408,            /* a header/body/frame/idle timeout (connection closed) */
    LI_RPC_TOO_LARGE = 413,          /* frame over --max-frame-bytes (connection closed) */
    LI_RPC_TOO_MANY = 429,           /* --max-inflight (this connection) or --max-queued (server) reached */
    LI_RPC_UNAVAILABLE = 503,        /* shutting down, no engine, too many connections */
};

typedef struct li_server li_server;
typedef struct li_srv_req li_srv_req;
typedef struct li_engine_thread li_engine_thread;

/* ============================================================================
 * the parsed request and its lifetime (api.c)
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
 * the server
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
    /* connections (loop.h's li_net has the copies the loop uses); 0 = off */
    double header_timeout, body_timeout, idle_timeout, rpc_idle_timeout, evict_idle_seconds;
    int max_connections_per_ip;
} li_server_limits;

void li_server_limits_default(li_server_limits *l);
/* Copies srv->lim's connection limits into srv->net (after changing lim). */
void li_server_apply_limits(li_server *srv);
/* policies/default.lua in the working directory, else in the source tree;
 * NULL when neither exists. */
const char *li_server_default_policy(void);

typedef struct li_metrics {
    uint64_t requests_by_reason[5];     /* stop, length, cancelled, error, rejected */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t rpc_calls, rpc_errors, http_requests, http_errors;
    uint64_t slow_clients_closed, inflight_refused, queued_refused; /* connections: in net */
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
    li_net net;                         /* connections and listeners (net.loop = &loop) */
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

/* A server with no sockets, no model and no engine thread yet: serve.c
 * adds them; the fuzz targets feed bytes into one as it is. */
void li_server_init(li_server *srv);
void li_server_free(li_server *srv);

/* Starts the graceful stop: no new connections or requests, in-flight ones
 * finish within drain_seconds, then the loop ends (serve.c's tick). */
void li_server_begin_drain(li_server *srv, const char *why);

/* ---- msgpack helpers shared by the server's files ----------------------------- */

/* The value of `key` in a params map (str or bin keys), or NULL. */
static inline const msgpack_object *li_mp_get(const msgpack_object *map, const char *key) {
    return li_mp_read_get(map, key, true);
}
void li_mp_pack_str(msgpack_packer *pk, const char *s);
void li_mp_pack_strn(msgpack_packer *pk, const char *s, size_t n);

#endif
