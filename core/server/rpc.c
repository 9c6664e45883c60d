/* rpc.c — msgpack-RPC over a byte stream, exactly per the msgpack-rpc spec:
 *
 *   request       [0, msgid, method, params]   → response [1, msgid, error, result]
 *   notification  [2, method, params]          (no response, even on error)
 *
 * params is a map, or an array holding one map (what msgpack-rpc client
 * libraries send for a call with one argument), or empty/nil.
 *
 * Framing never trusts a declared length: li_mp_scan_feed (util/mp_read.c)
 * walks object headers as bytes arrive (resumable, so a frame dribbled in one
 * byte at a time costs O(n) overall), rejects a frame whose declared size
 * exceeds the frame limit or whose nesting exceeds the depth limit before
 * buffering it, and only a complete, in-limit frame is handed to msgpack-c
 * to unpack.
 * Bytes that are not msgpack, or a frame over the limit, end the
 * connection after an error notification [2, "error", {code, message}]
 * (there is no msgid to answer). A well-formed frame that is not a valid
 * message gets an error response when it carries a msgid, an error
 * notification otherwise, and the connection stays open.
 *
 * The session (framing state + in-flight requests) is independent of
 * sockets: li_rpc_process_bytes runs it on a detached server for the fuzz
 * target. */
#define _GNU_SOURCE
#include "server/rpc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sessions -------------------------------------------------------------------- */

void li_rpc_session_init(li_rpc_session *s, li_server *srv, li_conn *conn, msgpack_sbuffer *out) {
    memset(s, 0, sizeof *s);
    s->srv = srv;
    s->conn = conn;
    s->out = out;
    s->authed = srv->auth_token == NULL;
}

void li_rpc_session_send(li_rpc_session *s, const char *buf, size_t n) {
    if (s->conn) li_conn_write(s->conn, buf, n);
    else if (s->out) msgpack_sbuffer_write(s->out, buf, n);
}

void li_rpc_session_free(li_rpc_session *s) {
    while (s->reqs) {
        li_srv_req *r = s->reqs;
        s->reqs = r->next;
        r->prev = r->next = NULL;
        li_api_gen_orphan(r);
    }
    s->inflight = 0;
    free(s->buf);
    s->buf = NULL;
    s->n = s->cap = 0;
}

static void send_packed(li_rpc_session *s, msgpack_sbuffer *sb) {
    li_rpc_session_send(s, sb->data, sb->size);
    msgpack_sbuffer_clear(sb);
}

/* [2, "error", {code, message}] into an initialized sb: for errors with no
 * msgid to answer, and for refused connections. */
static void pack_error_note(msgpack_sbuffer *sb, int code, const char *msg) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int(&pk, 2);
    li_mp_pack_str(&pk, "error");
    msgpack_pack_map(&pk, 2);
    li_mp_pack_str(&pk, "code");
    msgpack_pack_int(&pk, code);
    li_mp_pack_str(&pk, "message");
    li_mp_pack_str(&pk, msg);
}

static void send_error_note(li_rpc_session *s, int code, const char *msg) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_error_note(&sb, code, msg);
    send_packed(s, &sb);
    msgpack_sbuffer_destroy(&sb);
}

static void send_error_response(li_rpc_session *s, uint32_t msgid, int code, const char *msg) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_uint32(&pk, msgid);
    msgpack_pack_map(&pk, 2);
    li_mp_pack_str(&pk, "code");
    msgpack_pack_int(&pk, code);
    li_mp_pack_str(&pk, "message");
    li_mp_pack_str(&pk, msg);
    msgpack_pack_nil(&pk);
    send_packed(s, &sb);
    msgpack_sbuffer_destroy(&sb);
}

/* [1, msgid, nil, <result bytes>] */
static void send_result(li_rpc_session *s, uint32_t msgid, const msgpack_sbuffer *result) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_uint32(&pk, msgid);
    msgpack_pack_nil(&pk);
    if (result->size) msgpack_sbuffer_write(&sb, result->data, result->size);
    else msgpack_pack_nil(&pk);
    send_packed(s, &sb);
    msgpack_sbuffer_destroy(&sb);
}

/* Ends the session: a last error notification, then the connection closes. */
static bool fatal(li_rpc_session *s, int code, const char *msg) {
    s->srv->m.rpc_errors++;
    send_error_note(s, code, msg);
    s->closed = true;
    return false;
}

/* ---- generate's RPC sink: deltas as notifications, the final response ----------- */

static void pack_logprob_entry(msgpack_packer *pk, int32_t token, float logprob, const li_token_logprob *top,
                               int32_t n_top) {
    msgpack_pack_map(pk, 3);
    li_mp_pack_str(pk, "token");
    msgpack_pack_int32(pk, token);
    li_mp_pack_str(pk, "logprob");
    msgpack_pack_double(pk, logprob);
    li_mp_pack_str(pk, "top");
    msgpack_pack_array(pk, (size_t)LI_MAX(n_top, 0));
    for (int32_t i = 0; i < n_top; i++) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_int32(pk, top[i].id);
        msgpack_pack_double(pk, top[i].logprob);
    }
}

static void rpc_delta(li_srv_req *r, int32_t index, const char *text, size_t n, int32_t token, float logprob,
                      const li_token_logprob *top, int32_t n_top) {
    li_rpc_session *s = r->owner;
    if (!r->g.stream || r->no_reply) return;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int(&pk, 2);
    li_mp_pack_str(&pk, "generate.delta");
    bool lp = r->g.logprobs >= 0 && token >= 0;
    msgpack_pack_map(&pk, lp ? 6 : 5);
    li_mp_pack_str(&pk, "id");
    msgpack_pack_int64(&pk, r->id);
    li_mp_pack_str(&pk, "request_id");
    msgpack_pack_uint32(&pk, r->msgid);
    li_mp_pack_str(&pk, "index");
    msgpack_pack_int32(&pk, index);
    li_mp_pack_str(&pk, "text");
    li_mp_pack_strn(&pk, text, n);
    li_mp_pack_str(&pk, "tokens");
    if (token >= 0) {
        msgpack_pack_array(&pk, 1);
        msgpack_pack_int32(&pk, token);
    } else {
        msgpack_pack_array(&pk, 0);
    }
    if (lp) {
        li_mp_pack_str(&pk, "logprobs");
        msgpack_pack_array(&pk, 1);
        pack_logprob_entry(&pk, token, logprob, top, n_top);
    }
    send_packed(s, &sb);
    msgpack_sbuffer_destroy(&sb);
}

/* What the connection is doing, for its timeouts (loop.h): a partial frame
 * has the body timeout from its first byte; with calls in flight it waits
 * for nothing; else it is idle. restart: the partial frame is a new one. */
static void update_phase(li_rpc_session *s, bool restart) {
    if (!s->conn) return;
    if (s->n > 0) li_conn_set_phase(s->conn, LI_CONN_BODY, restart);
    else li_conn_set_phase(s->conn, s->inflight > 0 ? LI_CONN_BUSY : LI_CONN_IDLE, false);
}

static void untrack(li_rpc_session *s, li_srv_req *r) {
    if (r->prev) r->prev->next = r->next;
    else if (s->reqs == r) s->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    s->inflight--;
    update_phase(s, false);
}

static void pack_sample(msgpack_packer *pk, const li_srv_req *r, const li_sample_out *o, int index, bool with_index) {
    bool lp = r->g.logprobs >= 0;
    msgpack_pack_map(pk, (size_t)(3 + (with_index ? 1 : 0) + (lp ? 1 : 0)));
    if (with_index) {
        li_mp_pack_str(pk, "index");
        msgpack_pack_int(pk, index);
    }
    li_mp_pack_str(pk, "text");
    li_mp_pack_strn(pk, o->text ? o->text : "", o->text_len);
    li_mp_pack_str(pk, "tokens");
    msgpack_pack_array(pk, (size_t)o->n_tokens);
    for (int64_t i = 0; i < o->n_tokens; i++) msgpack_pack_int32(pk, o->tokens[i]);
    li_mp_pack_str(pk, "finish_reason");
    li_mp_pack_str(pk, o->finish_reason ? o->finish_reason : "error");
    if (lp) {
        li_mp_pack_str(pk, "logprobs");
        msgpack_pack_array(pk, (size_t)o->n_logprobs);
        if (o->logprobs.size) msgpack_sbuffer_write(pk->data, o->logprobs.data, o->logprobs.size);
    }
}

/* The final result: {id, text, tokens, finish_reason, usage, timings} or,
 * for n > 1, {id, choices = [{index, text, tokens, finish_reason}], usage, timings}. */
static void rpc_done(li_srv_req *r) {
    li_rpc_session *s = r->owner;
    untrack(s, r);
    if (r->no_reply) return;
    msgpack_sbuffer res;
    msgpack_sbuffer_init(&res);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &res, msgpack_sbuffer_write);
    int32_t n = r->g.n;
    int64_t completion = 0;
    for (int32_t i = 0; i < n; i++) completion += r->out[i].n_tokens;
    bool lp = r->g.logprobs >= 0;
    msgpack_pack_map(&pk, n > 1 ? 4 : (size_t)(6 + (lp ? 1 : 0)));
    li_mp_pack_str(&pk, "id");
    msgpack_pack_int64(&pk, r->id);
    if (n > 1) {
        li_mp_pack_str(&pk, "choices");
        msgpack_pack_array(&pk, (size_t)n);
        for (int32_t i = 0; i < n; i++) pack_sample(&pk, r, &r->out[i], i, true);
    } else {
        const li_sample_out *o = &r->out[0];
        li_mp_pack_str(&pk, "text");
        li_mp_pack_strn(&pk, o->text ? o->text : "", o->text_len);
        li_mp_pack_str(&pk, "tokens");
        msgpack_pack_array(&pk, (size_t)o->n_tokens);
        for (int64_t i = 0; i < o->n_tokens; i++) msgpack_pack_int32(&pk, o->tokens[i]);
        li_mp_pack_str(&pk, "finish_reason");
        li_mp_pack_str(&pk, o->finish_reason ? o->finish_reason : "error");
        if (lp) {
            li_mp_pack_str(&pk, "logprobs");
            msgpack_pack_array(&pk, (size_t)o->n_logprobs);
            if (o->logprobs.size) msgpack_sbuffer_write(&res, o->logprobs.data, o->logprobs.size);
        }
    }
    li_mp_pack_str(&pk, "usage");
    msgpack_pack_map(&pk, 4);
    li_mp_pack_str(&pk, "prompt_tokens");
    msgpack_pack_int64(&pk, r->n_prompt_tokens);
    li_mp_pack_str(&pk, "cached_tokens");
    msgpack_pack_int64(&pk, r->n_cached_tokens);
    li_mp_pack_str(&pk, "completion_tokens");
    msgpack_pack_int64(&pk, completion);
    li_mp_pack_str(&pk, "preemptions");
    msgpack_pack_int32(&pk, r->n_preemptions);
    li_mp_pack_str(&pk, "timings");
    msgpack_pack_map(&pk, 3);
    double ttft = r->t_first > 0 ? (r->t_first - r->t_recv) * 1e3 : 0;
    double total = (r->t_finish - r->t_recv) * 1e3;
    int64_t per_sample = completion / n;
    double tpot = per_sample > 1 && r->t_first > 0 ? (r->t_finish - r->t_first) * 1e3 / (double)(per_sample - 1) : 0;
    li_mp_pack_str(&pk, "ttft_ms");
    msgpack_pack_double(&pk, ttft);
    li_mp_pack_str(&pk, "tpot_ms");
    msgpack_pack_double(&pk, tpot);
    li_mp_pack_str(&pk, "total_ms");
    msgpack_pack_double(&pk, total);
    send_result(s, r->msgid, &res);
    msgpack_sbuffer_destroy(&res);
}

static void rpc_error(li_srv_req *r, int code, const char *msg) {
    li_rpc_session *s = r->owner;
    untrack(s, r);
    s->srv->m.rpc_errors++;
    if (!r->no_reply) send_error_response(s, r->msgid, code, msg);
}

static const li_sink_ops rpc_sink = {rpc_delta, rpc_done, rpc_error};

/* Used by api.c's generate/cancel for calls that came over RPC. */
li_srv_req *li_rpc_start_generate(li_rpc_session *s, uint32_t msgid, bool no_reply, li_gen_params *g, li_error *err) {
    if (s->inflight >= s->srv->lim.max_inflight) {
        li_gen_params_free(g);
        s->srv->m.inflight_refused++;
        li_error_set(err, LI_RPC_TOO_MANY, "too many requests in flight on this connection (limit %d)",
                     s->srv->lim.max_inflight);
        return NULL;
    }
    li_srv_req *r = li_api_gen_start(s->srv, g, &rpc_sink, s, err);
    if (!r) return NULL;
    r->msgid = msgid;
    r->no_reply = no_reply;
    r->next = s->reqs;
    if (s->reqs) s->reqs->prev = r;
    s->reqs = r;
    s->inflight++;
    return r;
}

li_srv_req *li_rpc_find(li_rpc_session *s, int64_t id, int64_t msgid) {
    for (li_srv_req *r = s->reqs; r; r = r->next)
        if ((id >= 0 && r->id >= 0 && id >= r->id && id < r->id + r->g.n) ||
            (msgid >= 0 && !r->no_reply && r->msgid == (uint64_t)msgid))
            return r;
    return NULL;
}

/* What the methods (api.c) reach of the session. */
static void call_authed(void *s) { ((li_rpc_session *)s)->authed = true; }
static li_srv_req *call_start_generate(void *s, uint32_t msgid, bool no_reply, li_gen_params *g, li_error *err) {
    return li_rpc_start_generate(s, msgid, no_reply, g, err);
}
static li_srv_req *call_find(void *s, int64_t id, int64_t msgid) { return li_rpc_find(s, id, msgid); }
static const li_call_ops rpc_call_ops = {call_authed, call_start_generate, call_find};

/* ---- messages --------------------------------------------------------------------- */

static bool as_method(const msgpack_object *o, const char **p, size_t *n) {
    return li_mp_read_str(o, true, p, n) && *n > 0 && *n <= 64;
}

static const msgpack_object empty_map = {.type = MSGPACK_OBJECT_MAP};

/* params: map, [map], [] or nil → the map; NULL for anything else. */
static const msgpack_object *params_map(const msgpack_object *p) {
    if (p->type == MSGPACK_OBJECT_MAP) return p;
    if (p->type == MSGPACK_OBJECT_NIL) return &empty_map;
    if (p->type == MSGPACK_OBJECT_ARRAY) {
        if (p->via.array.size == 0) return &empty_map;
        if (p->via.array.size == 1 && p->via.array.ptr[0].type == MSGPACK_OBJECT_MAP) return &p->via.array.ptr[0];
        if (p->via.array.size == 1 && p->via.array.ptr[0].type == MSGPACK_OBJECT_NIL) return &empty_map;
    }
    return NULL;
}

static bool handle_message(li_rpc_session *s, const msgpack_object *o) {
    li_server *srv = s->srv;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 3 || o->via.array.size > 4 ||
        o->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        srv->m.rpc_errors++;
        send_error_note(s, LI_RPC_INVALID_REQUEST,
                        "invalid message: want [0, msgid, method, params] or [2, method, params]");
        return true;
    }
    const msgpack_object *a = o->via.array.ptr;
    uint64_t type = a[0].via.u64;
    bool is_request = type == 0 && o->via.array.size == 4;
    bool is_note = type == 2 && o->via.array.size == 3;
    if (!is_request && !is_note) {
        srv->m.rpc_errors++;
        if (type == 0 && a[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER && a[1].via.u64 <= UINT32_MAX)
            send_error_response(s, (uint32_t)a[1].via.u64, LI_RPC_INVALID_REQUEST,
                                "invalid request: want [0, msgid, method, params]");
        else
            send_error_note(s, LI_RPC_INVALID_REQUEST,
                            type == 1 ? "invalid message: the server does not take responses"
                                      : "invalid message: want [0, msgid, method, params] or [2, method, params]");
        return true;
    }
    uint32_t msgid = 0;
    const msgpack_object *m = &a[1], *p = &a[2];
    if (is_request) {
        if (a[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[1].via.u64 > UINT32_MAX) {
            srv->m.rpc_errors++;
            send_error_note(s, LI_RPC_INVALID_REQUEST, "invalid request: msgid must be an integer in [0, 2^32)");
            return true;
        }
        msgid = (uint32_t)a[1].via.u64;
        m = &a[2];
        p = &a[3];
    }
    srv->m.rpc_calls++;
    const char *method;
    size_t mlen;
    if (!as_method(m, &method, &mlen)) {
        srv->m.rpc_errors++;
        if (is_request) send_error_response(s, msgid, LI_RPC_INVALID_REQUEST, "invalid request: method must be a string of 1..64 bytes");
        return true;
    }
    if (!s->authed && !(mlen == 4 && !memcmp(method, "auth", 4))) {
        /* --auth-token: nothing but `auth` before authenticating */
        srv->m.rpc_errors++;
        if (is_request) send_error_response(s, msgid, LI_RPC_UNAUTHORIZED, "unauthorized: call auth {token} first");
        else send_error_note(s, LI_RPC_UNAUTHORIZED, "unauthorized: call auth {token} first");
        s->closed = true;
        return false;
    }
    const msgpack_object *params = params_map(p);
    if (!params) {
        srv->m.rpc_errors++;
        if (is_request) send_error_response(s, msgid, LI_RPC_INVALID_PARAMS, "invalid params: want a map, or an array holding one map");
        return true;
    }
    li_call c;
    li_call_init(&c, srv);
    c.conn = s->conn;
    c.session = s;
    c.ops = &rpc_call_ops;
    c.msgid = msgid;
    c.notification = is_note;
    li_api_dispatch(&c, method, mlen, params);
    if (!c.pending) {
        if (c.code) {
            srv->m.rpc_errors++;
            if (is_request) send_error_response(s, msgid, c.code, c.msg);
        } else if (is_request) {
            send_result(s, msgid, &c.result);
        }
    }
    bool unauth = c.code == LI_RPC_UNAUTHORIZED && mlen == 4 && !memcmp(method, "auth", 4);
    li_call_free(&c);
    if (unauth) {
        s->closed = true;
        return false;
    }
    return !s->closed;
}

static bool handle_frame(li_rpc_session *s, const char *p, size_t n) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&u, p, n, &off);
    bool ok;
    if (rc != MSGPACK_UNPACK_SUCCESS || off != n) ok = fatal(s, LI_RPC_PARSE_ERROR, "parse error: malformed msgpack frame");
    else ok = handle_message(s, &u.data);
    msgpack_unpacked_destroy(&u);
    return ok;
}

bool li_rpc_session_feed(li_rpc_session *s, const char *data, size_t n) {
    if (s->closed) return false;
    li_server *srv = s->srv;
    bool began = s->n == 0; /* these bytes start a frame */
    if (s->n + n > s->cap) {
        size_t cap = LI_MAX(s->cap * 2, s->n + n);
        s->buf = li_xrealloc(s->buf, cap);
        s->cap = cap;
    }
    memcpy(s->buf + s->n, data, n);
    s->n += n;
    size_t start = 0;
    bool ok = true;
    while (ok && start < s->n) {
        size_t flen = 0;
        const char *why = "";
        int rc = li_mp_scan_feed(&s->scan, (const uint8_t *)s->buf + start, s->n - start, srv->lim.max_frame,
                                 srv->lim.max_depth, &flen, &why);
        if (rc == LI_SCAN_MORE) break;
        if (rc < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s: %s (limit %zu bytes, depth %d); closing", rc == LI_SCAN_TOO_LARGE ? "frame too large" : "parse error",
                     why, srv->lim.max_frame, srv->lim.max_depth);
            ok = fatal(s, rc == LI_SCAN_TOO_LARGE ? LI_RPC_TOO_LARGE : LI_RPC_PARSE_ERROR, msg);
            break;
        }
        ok = handle_frame(s, s->buf + start, flen);
        start += flen;
        memset(&s->scan, 0, sizeof s->scan);
    }
    if (!ok) {
        s->n = 0;
        return false;
    }
    if (start) {
        memmove(s->buf, s->buf + start, s->n - start);
        s->n -= start;
    }
    update_phase(s, began || start > 0);
    /* keep a big buffer only while a big frame is arriving */
    if (s->n == 0 && s->cap > 256 * 1024) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
    return true;
}

/* ---- sockets ------------------------------------------------------------------------ */

typedef struct rpc_conn {
    li_conn base;
    li_rpc_session s;
} rpc_conn;

static void rpc_on_data(li_conn *c, const char *buf, size_t n) {
    rpc_conn *rc = (rpc_conn *)c;
    if (!li_rpc_session_feed(&rc->s, buf, n)) li_conn_close(c);
}

static void rpc_on_close(li_conn *c) {
    rpc_conn *rc = (rpc_conn *)c;
    li_rpc_session_free(&rc->s); /* cancels what is in flight; frees its KV blocks */
}

static void rpc_free(li_conn *c) { free(c); }

static const li_conn_ops rpc_conn_ops = {rpc_on_data, rpc_on_close, rpc_free};

static li_conn *rpc_conn_new(void *srv) {
    rpc_conn *rc = li_xcalloc(1, sizeof *rc);
    rc->base.ops = &rpc_conn_ops;
    /* a session between calls (a REPL, a client pool) may wait long */
    rc->base.idle_timeout = ((li_server *)srv)->lim.rpc_idle_timeout;
    rc->base.idle_flag = "--rpc-idle-timeout";
    li_rpc_session_init(&rc->s, srv, &rc->base, NULL);
    return &rc->base;
}

/* A refused connection (too many, draining, per-address limit) or one closed
 * by a timeout or to make room learns why from an error notification
 * [2, "error", {code, message}] before it closes. */
static void rpc_refuse(li_conn *c, int code, const char *why) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_error_note(&sb, code, why);
    li_conn_write(c, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

const li_protocol li_rpc_protocol = {"msgpack-rpc", rpc_conn_new, rpc_refuse, rpc_refuse};

/* ---- the pure entry point for fuzzing ------------------------------------------------- */

void li_rpc_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n) {
    li_server srv;
    li_server_init(&srv);
    if (n > 0 && (data[0] & 1)) srv.auth_token = "secret"; /* exercise the auth gate too */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    li_rpc_session s;
    li_rpc_session_init(&s, &srv, NULL, &sb);
    /* feed in uneven pieces so that resumable scanning is exercised */
    size_t off = 0, step = 1;
    while (off < n) {
        size_t k = LI_MIN(step, n - off);
        if (!li_rpc_session_feed(&s, (const char *)data + off, k)) break;
        off += k;
        step = step * 3 + 1;
    }
    li_rpc_session_free(&s);
    li_server_free(&srv);
    *out_n = sb.size;
    *out = sb.data ? sb.data : li_xmalloc(1);
}
