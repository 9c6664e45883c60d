/* api.h — the server's methods, each declared once (api.c), and the
 * lifecycle of a generate request: parse, prepare, run, deliver, free.
 * msgpack-RPC dispatches here (rpc.c); HTTP reuses the generate parser and
 * lifecycle (http.c). */
#ifndef LI_SERVER_API_H
#define LI_SERVER_API_H

#include "server/engine_thread.h"

typedef struct li_call_ops li_call_ops;

/* One call in progress. Sync results are packed into `result`; an error
 * fills code/msg; async methods set `pending` and reply later. */
typedef struct li_call {
    li_server *srv;
    li_conn *conn;           /* the RPC connection (NULL for HTTP) */
    void *session;           /* rpc session of the connection (NULL: none) */
    const li_call_ops *ops;  /* what the session does for the methods (set with session) */
    uint32_t msgid;
    bool notification;
    msgpack_sbuffer result;
    msgpack_packer pk;
    int code;
    char msg[512];
    bool pending;
} li_call;

/* The methods that need the caller's connection reach it through these
 * (rpc.c fills them), so this file knows no transport. */
struct li_call_ops {
    void (*authed)(void *session);
    /* generate: checks --max-inflight, tracks the request on the session */
    li_srv_req *(*start_generate)(void *session, uint32_t msgid, bool no_reply, li_gen_params *g, li_error *err);
    /* a request of the session by engine id or by msgid (-1: unused) */
    li_srv_req *(*find)(void *session, int64_t id, int64_t msgid);
};

void li_call_init(li_call *c, li_server *srv);
void li_call_free(li_call *c);
int li_call_fail(li_call *c, int code, const char *fmt, ...) LI_PRINTF(3, 4);

/* Runs method with params (a map; [map] is unwrapped by the caller). */
void li_api_dispatch(li_call *c, const char *method, size_t method_len, const msgpack_object *params);

/* Parses `generate` params with the one request parser (request/request.h)
 * and the server's error code. http: OpenAI defaults and unknown keys
 * ignored; otherwise luainfer's defaults and unknown keys are an error. */
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

/* The engine thread's events, delivered on the loop thread
 * (li_engine_thread_opts.on_events). */
void li_api_on_events(li_server *srv, li_event_batch *b);

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

#endif
