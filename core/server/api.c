/* api.c — the server's methods, each declared once in `methods[]` with its
 * doc line. rpc.c dispatches msgpack-RPC calls here; http.c reuses the
 * same `generate` parser (li_api_gen_parse, after turning its JSON body into
 * msgpack) and the same request lifecycle (li_api_gen_start), so a
 * parameter means the same thing on both transports.
 *
 * A generate request travels:
 *   parse (loop) → prepare: chat template + tokenizer (libuv worker pool)
 *   → add (engine thread) → events (loop) → the owner's sink → free (loop).
 * The owner (an RPC connection or an HTTP exchange) may go away at any
 * point: li_api_gen_orphan cancels the request and nothing is sent after. */
#define _GNU_SOURCE
#include "server/api.h"
#include "lua/lua_env.h"
#include "tokenizer/tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small helpers -------------------------------------------------------- */


/* Parameter readers (util/mp_read.h): text may come as str or bin, a float
 * is an integer up to about the int64 range, and a number is any finite one
 * (each caller then checks its own small range). */
static bool as_bytes(const msgpack_object *o, const char **p, size_t *n) { return li_mp_read_str(o, true, p, n); }
static bool as_int(const msgpack_object *o, int64_t *v) { return li_mp_read_int(o, 9.2e18, v); }

static char *dup_n(const char *s, size_t n) {
    char *p = li_xmalloc(n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- calls ------------------------------------------------------------------ */

void li_call_init(li_call *c, li_server *srv) {
    memset(c, 0, sizeof *c);
    c->srv = srv;
    msgpack_sbuffer_init(&c->result);
    msgpack_packer_init(&c->pk, &c->result, msgpack_sbuffer_write);
}

void li_call_free(li_call *c) { msgpack_sbuffer_destroy(&c->result); }

int li_call_fail(li_call *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    li_utf8_scrub(c->msg, strlen(c->msg));
    c->code = code;
    msgpack_sbuffer_clear(&c->result);
    return code;
}

/* Parameter readers: each failure is an "invalid params" error naming the key. */
static bool get_str(li_call *c, const msgpack_object *params, const char *key, const char **p, size_t *n, bool required) {
    const msgpack_object *o = li_mp_get(params, key);
    if (!o || o->type == MSGPACK_OBJECT_NIL) {
        if (required) li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: '%s' is required", key);
        *p = NULL;
        *n = 0;
        return !required;
    }
    if (!as_bytes(o, p, n)) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: '%s' must be a string", key);
        return false;
    }
    if (!li_utf8_valid(*p, *n)) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: '%s' is not valid UTF-8", key);
        return false;
    }
    return true;
}

static bool consttime_eq(const char *a, size_t an, const char *b) {
    size_t bn = strlen(b);
    unsigned char d = an != bn;
    for (size_t i = 0; i < an; i++) d |= (unsigned char)(a[i] ^ b[i % (bn ? bn : 1)]);
    return d == 0;
}

static bool check_admin(li_call *c, const msgpack_object *params) {
    if (!c->srv->admin_token) {
        li_call_fail(c, LI_RPC_FORBIDDEN, "forbidden: admin methods are disabled (start the server with --admin-token)");
        return false;
    }
    const msgpack_object *o = li_mp_get(params, "admin_token");
    const char *p;
    size_t n;
    if (!o || !as_bytes(o, &p, &n) || !consttime_eq(p, n, c->srv->admin_token)) {
        li_call_fail(c, LI_RPC_UNAUTHORIZED, "unauthorized: wrong or missing 'admin_token'");
        return false;
    }
    return true;
}

/* ---- generate: parameters ------------------------------------------------------ */

/* The one request parser (request/request.h) with the server's error code. */
int li_api_gen_parse(li_server *srv, const msgpack_object *params, const li_gen_defaults *d, li_gen_params *g,
                     li_error *err) {
    li_req_opts o = {
        .profile = !d->openai ? LI_REQ_LUAINFER : d->chat ? LI_REQ_OPENAI_CHAT : LI_REQ_OPENAI,
        .n_vocab = srv->model ? srv->model->hp.n_vocab : 0,
    };
    int rc = li_request_parse(params, &o, g, err);
    if (rc) err->code = LI_RPC_INVALID_PARAMS;
    return rc ? LI_RPC_INVALID_PARAMS : 0;
}

int li_api_parse_tokens(const msgpack_object *o, const char *key, int32_t **out, size_t *n_out, li_error *err) {
    int rc = li_request_parse_tokens(o, key, out, n_out, err);
    if (rc) err->code = LI_RPC_INVALID_PARAMS;
    return rc ? LI_RPC_INVALID_PARAMS : 0;
}

/* ---- generate: preparation on the worker pool --------------------------------------- */

static lua_State *lua_get(li_server *srv, li_error *err) {
    uv_mutex_lock(&srv->lua_mu);
    lua_State *L = srv->n_lua_free ? srv->lua_free[--srv->n_lua_free] : NULL;
    uv_mutex_unlock(&srv->lua_mu);
    return L ? L : li_lua_new(err);
}

static void lua_put(li_server *srv, lua_State *L) {
    uv_mutex_lock(&srv->lua_mu);
    if (srv->n_lua_free == srv->cap_lua_free) {
        srv->cap_lua_free = srv->cap_lua_free * 2 + 4;
        srv->lua_free = li_xrealloc(srv->lua_free, (size_t)srv->cap_lua_free * sizeof *srv->lua_free);
    }
    srv->lua_free[srv->n_lua_free++] = L;
    uv_mutex_unlock(&srv->lua_mu);
}

static void prep_work(uv_work_t *w) {
    li_srv_req *r = w->data;
    li_server *srv = r->srv;
    li_gen_params *g = &r->g;
    li_error err = {0};
    char *chat = NULL;
    const char *text = g->prompt;
    size_t len = g->prompt_len;
    if (g->msgs) {
        lua_State *L = lua_get(srv, &err);
        if (!L) goto fail;
        int rc = li_chat_format(L, srv->model->chat_template, g->msgs, g->n_msgs, true, &chat, &err);
        lua_put(srv, L);
        if (rc) goto fail;
        text = chat;
        len = strlen(chat);
    }
    if (g->tokens) {
        r->prompt = li_xmalloc(g->n_tokens * sizeof *r->prompt);
        memcpy(r->prompt, g->tokens, g->n_tokens * sizeof *r->prompt);
        r->n_prompt = g->n_tokens;
    } else if (li_tokenizer_encode(srv->model->tok, text, len, true, true, &r->prompt, &r->n_prompt, &err)) {
        goto fail;
    }
    free(chat);
    chat = NULL;
    if (r->n_prompt == 0) {
        li_error_set(&err, LI_RPC_INVALID_PARAMS, "invalid params: the prompt has no tokens");
        goto fail;
    }
    if ((int64_t)r->n_prompt >= srv->cfg.max_model_len) {
        li_error_set(&err, LI_RPC_INVALID_PARAMS, "invalid params: the prompt has %zu tokens, the context holds %lld",
                     r->n_prompt, (long long)srv->cfg.max_model_len);
        goto fail;
    }
    if (g->max_tokens < 0) g->max_tokens = srv->cfg.max_model_len - (int64_t)r->n_prompt;
    r->prep_code = 0;
    return;
fail:
    free(chat);
    r->prep_code = err.code < 0 && err.code > -100 ? LI_RPC_INVALID_PARAMS : err.code;
    if (!r->prep_code) r->prep_code = LI_RPC_INTERNAL;
    snprintf(r->prep_msg, sizeof r->prep_msg, "%s", err.msg);
}

static void finish_metrics(li_server *srv, li_srv_req *r);

/* Ends a request that never reached the engine (cancelled or failed). */
static void end_locally(li_srv_req *r, int code, const char *msg) {
    li_server *srv = r->srv;
    r->state = LI_REQ_FINISHED;
    r->t_finish = li_time_now();
    if (code) {
        srv->m.requests_by_reason[code == LI_RPC_REJECTED ? 4 : 3]++;
        if (r->sink) r->sink->error(r, code, msg);
    } else {
        for (int32_t i = 0; i < r->g.n; i++) r->out[i].finish_reason = "cancelled";
        finish_metrics(srv, r);
        if (r->sink) r->sink->done(r);
    }
    li_srv_req_free(r);
}

static void prep_done(uv_work_t *w, int status) {
    li_srv_req *r = w->data;
    li_server *srv = r->srv;
    if (status == UV_ECANCELED || r->cancelled) end_locally(r, 0, NULL);
    else if (r->prep_code) end_locally(r, r->prep_code, r->prep_msg);
    else if (!srv->eng || srv->stopping) end_locally(r, LI_RPC_UNAVAILABLE, "server is shutting down");
    else {
        r->state = LI_REQ_QUEUED;
        li_engine_thread_add(srv->eng, r);
    }
}

li_srv_req *li_api_gen_start(li_server *srv, li_gen_params *g, const li_sink_ops *sink, void *owner, li_error *err) {
    if (!srv->eng || !srv->model) {
        li_gen_params_free(g);
        li_error_set(err, LI_RPC_UNAVAILABLE, "no engine is running");
        return NULL;
    }
    if (srv->draining) {
        li_gen_params_free(g);
        li_error_set(err, LI_RPC_UNAVAILABLE, "server is shutting down: no new requests");
        return NULL;
    }
    /* the server-wide cap: per-connection limits alone let many connections
     * queue without bound; refused at once, nothing else changes */
    if (srv->n_samples + g->n > srv->lim.max_queued) {
        li_error_set(err, LI_RPC_TOO_MANY,
                     "server busy: %lld requests (samples) waiting or running, this one adds %d, the limit "
                     "(--max-queued) is %lld; retry later",
                     (long long)srv->n_samples, (int)g->n, (long long)srv->lim.max_queued);
        li_gen_params_free(g);
        srv->m.queued_refused++;
        return NULL;
    }
    li_srv_req *r = li_xcalloc(1, sizeof *r);
    r->srv = srv;
    r->g = *g;
    memset(g, 0, sizeof *g);
    r->sink = sink;
    r->owner = owner;
    r->id = -1;
    r->eng_id = -1;
    r->state = LI_REQ_PREP;
    r->t_recv = li_time_now();
    r->out = li_xcalloc((size_t)r->g.n, sizeof *r->out);
    for (int32_t i = 0; i < r->g.n; i++) msgpack_sbuffer_init(&r->out[i].logprobs);
    r->work.data = r;
    srv->n_live++;
    srv->n_samples += r->g.n;
    int rc = uv_queue_work(&srv->loop.uv, &r->work, prep_work, prep_done);
    if (rc) {
        li_error_set(err, LI_RPC_INTERNAL, "cannot queue the request: %s", uv_strerror(rc));
        r->sink = NULL;
        li_srv_req_free(r);
        return NULL;
    }
    return r;
}

void li_srv_req_free(li_srv_req *r) {
    r->srv->n_live--;
    r->srv->n_samples -= r->g.n; /* before li_gen_params_free clears g */
    if (r->out)
        for (int32_t k = 0; k < r->g.n; k++) {
            free(r->out[k].text);
            free(r->out[k].tokens);
            msgpack_sbuffer_destroy(&r->out[k].logprobs);
        }
    li_gen_params_free(&r->g);
    free(r->prompt);
    free(r->out);
    free(r);
}

void li_api_gen_cancel(li_srv_req *r) {
    if (r->cancelled || r->state == LI_REQ_FINISHED) return;
    r->cancelled = true;
    if (r->state == LI_REQ_QUEUED) {
        if (r->srv->eng) li_engine_thread_cancel(r->srv->eng, r);
    }
    /* PREP: prep_done sees `cancelled` and ends it */
}

void li_api_gen_orphan(li_srv_req *r) {
    r->sink = NULL;
    r->owner = NULL;
    li_api_gen_cancel(r);
}

/* ---- events from the engine thread ---------------------------------------------------- */

static const char *const reasons[] = {"stop", "length", "cancelled", "error"};

static void finish_metrics(li_server *srv, li_srv_req *r) {
    li_metrics *m = &srv->m;
    for (int32_t i = 0; i < r->g.n; i++) {
        const char *fr = r->out[i].finish_reason ? r->out[i].finish_reason : "error";
        int k = 3;
        for (int j = 0; j < 4; j++)
            if (!strcmp(fr, reasons[j])) k = j;
        m->requests_by_reason[k]++;
    }
    m->prompt_tokens += (uint64_t)r->n_prompt_tokens;
    if (r->t_first > 0) {
        li_hist_add(&m->ttft, r->t_first - r->t_recv);
        int64_t per = r->n_generated / r->g.n;
        if (per > 1) li_hist_add(&m->tpot, (r->t_finish - r->t_first) / (double)(per - 1));
    }
    li_hist_add(&m->e2e, r->t_finish - r->t_recv);
}

static void count_token(li_metrics *m, double t) {
    int64_t sec = (int64_t)t;
    if (sec != m->tok_ring_sec) {
        for (int64_t s = LI_MAX(m->tok_ring_sec + 1, sec - 15); s <= sec; s++) m->tok_ring[s & 15] = 0;
        m->tok_ring_sec = sec;
    }
    m->tok_ring[sec & 15]++;
    m->generation_tokens++;
}

static void free_event(li_srv_event *e) {
    free(e->text);
    free(e->top);
    free(e->tokens);
}

void li_api_on_events(li_server *srv, li_event_batch *b) {
    for (int32_t i = 0; i < b->n; i++) {
        li_srv_event *e = &b->ev[i];
        li_srv_req *r = e->req;
        if (e->kind == LI_EV_ERROR) {
            end_locally(r, e->code, e->text ? e->text : "error");
            free_event(e);
            continue;
        }
        if (r->id < 0 || e->id < r->id) r->id = e->id - e->index;
        if (e->index < 0 || e->index >= r->g.n) { /* cannot happen; never index out of range */
            free_event(e);
            continue;
        }
        li_sample_out *o = &r->out[e->index];
        if (e->kind == LI_EV_DELTA) {
            if (e->token >= 0) {
                if (r->t_first <= 0) r->t_first = e->t;
                r->n_generated++;
                count_token(&srv->m, e->t);
                if (r->g.logprobs >= 0) {
                    msgpack_packer pk;
                    msgpack_packer_init(&pk, &o->logprobs, msgpack_sbuffer_write);
                    msgpack_pack_map(&pk, 3);
                    li_mp_pack_str(&pk, "token");
                    msgpack_pack_int32(&pk, e->token);
                    li_mp_pack_str(&pk, "logprob");
                    msgpack_pack_double(&pk, e->logprob);
                    li_mp_pack_str(&pk, "top");
                    msgpack_pack_array(&pk, (size_t)e->n_top);
                    for (int32_t k = 0; k < e->n_top; k++) {
                        msgpack_pack_array(&pk, 2);
                        msgpack_pack_int32(&pk, e->top[k].id);
                        msgpack_pack_double(&pk, e->top[k].logprob);
                    }
                    o->n_logprobs++;
                }
            }
            if (r->sink && !r->cancelled && r->g.stream)
                r->sink->delta(r, e->index, e->text ? e->text : "", e->text_len, e->token, e->logprob, e->top, e->n_top);
            free_event(e);
            continue;
        }
        /* FINISH of one sample */
        o->finish_reason = e->finish_reason;
        o->text = e->text;
        o->text_len = e->text_len;
        o->tokens = e->tokens;
        o->n_tokens = e->n_tokens;
        e->text = NULL;
        e->tokens = NULL;
        r->n_prompt_tokens = e->n_prompt;
        if (e->index == 0) r->n_cached_tokens = e->n_cached;
        r->n_preemptions += e->n_preemptions;
        free_event(e);
        if (e->t_first > 0 && (r->t_first <= 0 || e->t_first < r->t_first)) r->t_first = e->t_first;
        if (++r->n_done < r->g.n) continue;
        r->state = LI_REQ_FINISHED;
        r->t_finish = e->t;
        finish_metrics(srv, r);
        if (r->sink) r->sink->done(r);
        li_srv_req_free(r);
    }
}

/* ---- the methods ----------------------------------------------------------------------- */


const char *li_api_model_name(li_server *srv) { return srv->model_name[0] ? srv->model_name : "luainfer"; }

/** auth {token}: authenticates the connection (needed first when the server runs with --auth-token). */
static void api_auth(li_call *c, const msgpack_object *params) {
    const char *p;
    size_t n;
    if (!get_str(c, params, "token", &p, &n, true)) return;
    if (c->srv->auth_token && !consttime_eq(p, n, c->srv->auth_token)) {
        li_call_fail(c, LI_RPC_UNAUTHORIZED, "unauthorized: wrong token");
        return;
    }
    if (c->session) c->ops->authed(c->session);
    msgpack_pack_map(&c->pk, 1);
    li_mp_pack_str(&c->pk, "ok");
    msgpack_pack_true(&c->pk);
}

/** generate {prompt | messages | tokens, max_tokens, temperature, ...}: text from the model;
 *  stream = true sends ["generate.delta", {...}] notifications before the response. */
static void api_generate(li_call *c, const msgpack_object *params) {
    li_gen_params g;
    li_error err = {0};
    li_gen_defaults d = {0};
    if (li_api_gen_parse(c->srv, params, &d, &g, &err)) {
        li_call_fail(c, err.code, "%s", err.msg);
        return;
    }
    if (!c->session) {
        li_gen_params_free(&g);
        li_call_fail(c, LI_RPC_INTERNAL, "generate needs a connection");
        return;
    }
    /* a notification runs it and sends nothing back: no per-token text or
     * logprobs to prepare for nobody */
    if (c->notification) {
        g.stream = false;
        g.logprobs = -1;
    }
    if (!c->ops->start_generate(c->session, c->msgid, c->notification, &g, &err)) {
        li_call_fail(c, err.code ? err.code : LI_RPC_INTERNAL, "%s", err.msg);
        return;
    }
    c->pending = true;
}

/** cancel {id | request_id}: stops a generate of this connection (engine id, or the msgid that started it). */
static void api_cancel(li_call *c, const msgpack_object *params) {
    const msgpack_object *oid = li_mp_get(params, "id"), *omsg = li_mp_get(params, "request_id");
    int64_t id = -1, msgid = -1;
    if (oid && oid->type != MSGPACK_OBJECT_NIL && (!as_int(oid, &id) || id < 0)) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: 'id' must be an integer >= 0");
        return;
    }
    if (omsg && omsg->type != MSGPACK_OBJECT_NIL && (!as_int(omsg, &msgid) || msgid < 0)) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: 'request_id' must be an integer >= 0");
        return;
    }
    if (id < 0 && msgid < 0) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: 'id' or 'request_id' is required");
        return;
    }
    li_srv_req *r = c->session ? c->ops->find(c->session, id, msgid) : NULL;
    if (r) li_api_gen_cancel(r);
    msgpack_pack_map(&c->pk, 1);
    li_mp_pack_str(&c->pk, "cancelled");
    if (r) msgpack_pack_true(&c->pk);
    else msgpack_pack_false(&c->pk);
}

static bool need_model(li_call *c) {
    if (c->srv->model) return true;
    li_call_fail(c, LI_RPC_UNAVAILABLE, "no model is loaded");
    return false;
}

/** tokenize {text, special = true}: token ids (special: add BOS and match special-token text). */
static void api_tokenize(li_call *c, const msgpack_object *params) {
    const char *p;
    size_t n;
    if (!get_str(c, params, "text", &p, &n, true)) return;
    bool special = true;
    const msgpack_object *o = li_mp_get(params, "special");
    if (o && o->type != MSGPACK_OBJECT_NIL) {
        if (o->type != MSGPACK_OBJECT_BOOLEAN) {
            li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: 'special' must be true or false");
            return;
        }
        special = o->via.boolean;
    }
    if (!need_model(c)) return;
    int32_t *ids;
    size_t k;
    li_error err = {0};
    if (li_tokenizer_encode(c->srv->model->tok, p, n, special, special, &ids, &k, &err)) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "%s", err.msg);
        return;
    }
    msgpack_pack_map(&c->pk, 2);
    li_mp_pack_str(&c->pk, "tokens");
    msgpack_pack_array(&c->pk, k);
    for (size_t i = 0; i < k; i++) msgpack_pack_int32(&c->pk, ids[i]);
    li_mp_pack_str(&c->pk, "count");
    msgpack_pack_uint64(&c->pk, k);
    free(ids);
}

int li_api_detokenize(li_server *srv, const int32_t *ids, size_t n, bool special, char **text_out, size_t *len_out,
                      li_error *err) {
    const li_tokenizer *tok = srv->model->tok;
    li_detok dt;
    li_detok_init(&dt);
    size_t cap = 64 + n * 32, len = 0;
    char *text = li_xmalloc(cap);
    for (size_t i = 0; i < n; i++) {
        if (cap - len < 256) text = li_xrealloc(text, cap *= 2);
        int k = li_detok_push(&dt, tok, ids[i], special, text + len, cap - len);
        if (k < 0) {
            free(text);
            return li_error_set(err, LI_RPC_INVALID_PARAMS, "invalid params: token %d is outside the vocabulary", ids[i]);
        }
        len += (size_t)k;
    }
    if (cap - len < 16) text = li_xrealloc(text, cap += 16);
    int k = li_detok_flush(&dt, text + len, cap - len);
    if (k > 0) len += (size_t)k;
    *text_out = text;
    *len_out = len;
    return 0;
}

/** detokenize {tokens, special = false}: the text of token ids (invalid UTF-8 bytes become U+FFFD). */
static void api_detokenize(li_call *c, const msgpack_object *params) {
    const msgpack_object *o = li_mp_get(params, "tokens");
    if (!o) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: 'tokens' is required");
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    li_error err = {0};
    if (li_api_parse_tokens(o, "tokens", &ids, &n, &err)) {
        li_call_fail(c, err.code, "%s", err.msg);
        return;
    }
    bool special = false;
    const msgpack_object *so = li_mp_get(params, "special");
    if (so && so->type == MSGPACK_OBJECT_BOOLEAN) special = so->via.boolean;
    char *text = NULL;
    size_t len = 0;
    if (!need_model(c) || li_api_detokenize(c->srv, ids, n, special, &text, &len, &err)) {
        if (err.code) li_call_fail(c, err.code, "%s", err.msg);
        free(ids);
        return;
    }
    msgpack_pack_map(&c->pk, 1);
    li_mp_pack_str(&c->pk, "text");
    li_mp_pack_strn(&c->pk, text, len);
    free(ids);
    free(text);
}

/** models {}: the model this server runs (a list of one). */
static void api_models(li_call *c, const msgpack_object *params) {
    (void)params;
    li_server *srv = c->srv;
    msgpack_packer *pk = &c->pk;
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, srv->model ? 6 : 1);
    li_mp_pack_str(pk, "id");
    li_mp_pack_str(pk, li_api_model_name(srv));
    if (srv->model) {
        li_mp_pack_str(pk, "path");
        li_mp_pack_str(pk, srv->model->path ? srv->model->path : "");
        li_mp_pack_str(pk, "architecture");
        li_mp_pack_str(pk, srv->model->hp.arch);
        li_mp_pack_str(pk, "n_vocab");
        msgpack_pack_int32(pk, srv->model->hp.n_vocab);
        li_mp_pack_str(pk, "n_ctx_train");
        msgpack_pack_int32(pk, srv->model->hp.n_ctx_train);
        li_mp_pack_str(pk, "max_model_len");
        msgpack_pack_int64(pk, srv->cfg.max_model_len);
    }
}

/** health {}: {status = "ok" | "draining", uptime_s}. */
static void api_health(li_call *c, const msgpack_object *params) {
    (void)params;
    msgpack_pack_map(&c->pk, 2);
    li_mp_pack_str(&c->pk, "status");
    li_mp_pack_str(&c->pk, c->srv->draining ? "draining" : "ok");
    li_mp_pack_str(&c->pk, "uptime_s");
    msgpack_pack_double(&c->pk, c->srv->eng ? li_time_now() - c->srv->t_start : 0);
}

/** stats {}: queues, KV usage, preemptions, policy errors and fallbacks, throughput, requests. */
static void api_stats(li_call *c, const msgpack_object *params) {
    (void)params;
    li_api_pack_stats(c->srv, &c->pk);
}

typedef struct reload_ctx {
    li_server *srv;
    bool no_reply;
    uint32_t msgid;
    uint64_t serial;
} reload_ctx;

static void reload_done(void *ud, int code, const char *msg) {
    reload_ctx *rc = ud;
    li_server *srv = rc->srv;
    /* the connection may be gone: find it by serial */
    li_conn *conn = NULL;
    for (li_conn *k = srv->net.conns; k; k = k->next)
        if (k->serial == rc->serial && !k->closing) conn = k;
    if (conn && !rc->no_reply) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 4);
        msgpack_pack_int(&pk, 1);
        msgpack_pack_uint32(&pk, rc->msgid);
        if (code) {
            msgpack_pack_map(&pk, 2);
            li_mp_pack_str(&pk, "code");
            msgpack_pack_int(&pk, LI_RPC_INVALID_PARAMS);
            li_mp_pack_str(&pk, "message");
            char m[600];
            snprintf(m, sizeof m, "policy.reload failed (the old policy stays): %s", msg);
            li_mp_pack_str(&pk, m);
            msgpack_pack_nil(&pk);
        } else {
            msgpack_pack_nil(&pk);
            msgpack_pack_map(&pk, 1);
            li_mp_pack_str(&pk, "policy");
            li_mp_pack_str(&pk, msg);
        }
        li_conn_write(conn, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
    free(rc);
}

/** policy.reload {path | source, admin_token}: swaps the scheduling policy live; on error the old one stays. */
static void api_policy_reload(li_call *c, const msgpack_object *params) {
    if (!check_admin(c, params)) return;
    const char *path, *source;
    size_t np, ns;
    if (!get_str(c, params, "path", &path, &np, false) || !get_str(c, params, "source", &source, &ns, false)) return;
    if (!path == !source) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: give exactly one of 'path' and 'source'");
        return;
    }
    if ((path && memchr(path, 0, np)) || (source && memchr(source, 0, ns))) {
        li_call_fail(c, LI_RPC_INVALID_PARAMS, "invalid params: NUL byte in 'path' or 'source'");
        return;
    }
    if (!c->srv->eng || !c->conn) {
        li_call_fail(c, LI_RPC_UNAVAILABLE, "no engine is running");
        return;
    }
    char *p = path ? dup_n(path, np) : NULL, *s = source ? dup_n(source, ns) : NULL;
    reload_ctx *rc = li_xcalloc(1, sizeof *rc);
    rc->srv = c->srv;
    rc->msgid = c->msgid;
    rc->no_reply = c->notification;
    rc->serial = c->conn->serial;
    li_engine_thread_reload(c->srv->eng, p, s, reload_done, rc);
    free(p);
    free(s);
    c->pending = true;
}

/** shutdown {admin_token}: stops accepting, lets requests in flight finish (--drain-seconds), exits 0. */
static void api_shutdown(li_call *c, const msgpack_object *params) {
    if (!check_admin(c, params)) return;
    msgpack_pack_map(&c->pk, 1);
    li_mp_pack_str(&c->pk, "ok");
    msgpack_pack_true(&c->pk);
    li_server_begin_drain(c->srv, "shutdown requested over RPC");
}

static void api_methods(li_call *c, const msgpack_object *params);

typedef struct li_method {
    const char *name;
    void (*fn)(li_call *c, const msgpack_object *params);
    const char *doc;
} li_method;

/* Every method, once. */
static const li_method methods[] = {
    {"auth", api_auth, "auth {token}: authenticate the connection (first call when the server has --auth-token)"},
    {"generate", api_generate, "generate {prompt|messages|tokens, max_tokens, temperature, top_p, top_k, min_p, "
                               "repetition_penalty, presence_penalty, frequency_penalty, logit_bias, seed, stop, stop_token_ids, "
                               "min_tokens, n, logprobs, "
                               "stream, priority, tenant, cache_salt, ignore_eos, speculation, slo_ttft_ms, slo_tpot_ms}"},
    {"cancel", api_cancel, "cancel {id | request_id}: stop a generate of this connection"},
    {"tokenize", api_tokenize, "tokenize {text, special=true}: token ids"},
    {"detokenize", api_detokenize, "detokenize {tokens, special=false}: text"},
    {"models", api_models, "models {}: the served model"},
    {"health", api_health, "health {}: status and uptime"},
    {"stats", api_stats, "stats {}: queues, KV usage, preemptions, policy errors, throughput"},
    {"methods", api_methods, "methods {}: this list"},
    {"policy.reload", api_policy_reload, "policy.reload {path|source, admin_token}: swap the policy live"},
    {"shutdown", api_shutdown, "shutdown {admin_token}: drain and exit"},
};

/** methods {}: every method name with its one-line doc. */
static void api_methods(li_call *c, const msgpack_object *params) {
    (void)params;
    msgpack_pack_map(&c->pk, LI_ARRAY_LEN(methods));
    for (size_t i = 0; i < LI_ARRAY_LEN(methods); i++) {
        li_mp_pack_str(&c->pk, methods[i].name);
        li_mp_pack_str(&c->pk, methods[i].doc);
    }
}

void li_api_dispatch(li_call *c, const char *method, size_t len, const msgpack_object *params) {
    for (size_t i = 0; i < LI_ARRAY_LEN(methods); i++)
        if (strlen(methods[i].name) == len && !memcmp(methods[i].name, method, len)) {
            methods[i].fn(c, params);
            return;
        }
    char shown[80];
    size_t k = 0;
    for (size_t i = 0; i < len && k < 64; i++) /* never echo raw bytes back */
        shown[k++] = method[i] >= 0x20 && method[i] < 0x7f ? method[i] : '?';
    shown[k] = 0;
    li_call_fail(c, LI_RPC_METHOD_NOT_FOUND, "unknown method '%s' (call 'methods' for the list)", shown);
}

/* ---- stats ------------------------------------------------------------------------------- */

#define KV(name, packfn, v)                 \
    do {                                    \
        li_mp_pack_str(pk, name);           \
        packfn(pk, v);                      \
    } while (0)

void li_api_pack_stats(li_server *srv, msgpack_packer *pk) {
    li_engine_snapshot snap;
    memset(&snap, 0, sizeof snap);
    if (srv->eng) li_engine_thread_snapshot(srv->eng, &snap);
    const li_engine_stats *st = &snap.st;
    const li_metrics *m = &srv->m;
    double now = li_time_now();
    double up = srv->eng ? now - srv->t_start : 0;
    uint64_t recent = 0;
    int64_t sec = (int64_t)now;
    for (int64_t s = sec - 10; s < sec; s++)
        if (s > m->tok_ring_sec - 16 && s <= m->tok_ring_sec) recent += m->tok_ring[s & 15];

    msgpack_pack_map(pk, 11);
    KV("uptime_s", msgpack_pack_double, up);
    li_mp_pack_str(pk, "requests");
    msgpack_pack_map(pk, 10);
    KV("live", msgpack_pack_int64, srv->n_live);
    KV("samples", msgpack_pack_int64, srv->n_samples);
    for (int i = 0; i < 4; i++) KV(reasons[i], msgpack_pack_uint64, m->requests_by_reason[i]);
    KV("rejected", msgpack_pack_uint64, m->requests_by_reason[4]);
    KV("inflight_refused", msgpack_pack_uint64, m->inflight_refused);
    KV("queued_refused", msgpack_pack_uint64, m->queued_refused);
    KV("engine_finished", msgpack_pack_int64, st->requests_finished);
    li_mp_pack_str(pk, "queues");
    msgpack_pack_map(pk, 3);
    KV("waiting", msgpack_pack_int32, st->n_waiting);
    KV("running", msgpack_pack_int32, st->n_running);
    KV("preempted", msgpack_pack_int32, st->n_preempted);
    li_mp_pack_str(pk, "kv");
    msgpack_pack_map(pk, 12);
    KV("blocks_total", msgpack_pack_int32, st->kv_total_blocks);
    KV("blocks_free", msgpack_pack_int32, st->kv_free_blocks);
    KV("blocks_used", msgpack_pack_int32, st->kv_total_blocks - st->kv_free_blocks);
    KV("usage", msgpack_pack_double, st->kv_total_blocks ? 1.0 - (double)st->kv_free_blocks / st->kv_total_blocks : 0.0);
    KV("block_size", msgpack_pack_int32, st->block_size);
    KV("bytes", msgpack_pack_uint64, st->kv_bytes);
    KV("draft_bytes", msgpack_pack_uint64, st->kv_draft_bytes); /* 0 without --draft */
    /* prefix cache: idle cached blocks count as free (they are evictable) */
    KV("cached_blocks", msgpack_pack_int32, st->kv_cached_blocks);
    KV("prefix_query_tokens", msgpack_pack_int64, st->prefix_query_tokens);
    KV("prefix_hit_tokens", msgpack_pack_int64, st->prefix_hit_tokens);
    KV("prefix_hit_rate", msgpack_pack_double,
       st->prefix_query_tokens ? (double)st->prefix_hit_tokens / (double)st->prefix_query_tokens : 0.0);
    KV("prefix_evictions", msgpack_pack_int64, st->prefix_evictions);
    li_mp_pack_str(pk, "engine");
    msgpack_pack_map(pk, 14);
    KV("steps", msgpack_pack_int64, snap.steps_busy);
    KV("spec_drafted", msgpack_pack_int64, st->spec_drafted);
    KV("spec_accepted", msgpack_pack_int64, st->spec_accepted);
    KV("tokens_computed", msgpack_pack_int64, st->tokens_computed);
    KV("tokens_device_sampled", msgpack_pack_int64, st->tokens_device_sampled);
    KV("tokens_device_undecided", msgpack_pack_int64, st->tokens_device_undecided);
    KV("tokens_generated", msgpack_pack_int64, st->tokens_generated);
    KV("preemptions", msgpack_pack_int64, st->preemptions);
    KV("requests_finished", msgpack_pack_int64, st->requests_finished);
    KV("requests_rejected", msgpack_pack_int64, st->requests_rejected);
    KV("time_step_s", msgpack_pack_double, st->time_total);
    KV("time_forward_s", msgpack_pack_double, st->time_forward);
    KV("time_policy_s", msgpack_pack_double, st->time_policy);
    KV("busy_s", msgpack_pack_double, snap.busy_seconds);
    li_mp_pack_str(pk, "policy");
    msgpack_pack_map(pk, 12);
    li_mp_pack_str(pk, "name");
    li_mp_pack_str(pk, snap.policy[0] ? snap.policy : "none");
    li_mp_pack_str(pk, "kind");
    li_mp_pack_str(pk, snap.policy_kind[0] ? snap.policy_kind : "builtin");
    KV("host_calls", msgpack_pack_int64, snap.host_calls);
    KV("host_timeouts", msgpack_pack_int64, snap.host_timeouts);
    KV("host_crashes", msgpack_pack_int64, snap.host_crashes);
    KV("host_restarts", msgpack_pack_int64, snap.host_restarts);
    KV("errors", msgpack_pack_int64, st->policy_errors);
    KV("fallback_steps", msgpack_pack_int64, st->fallback_steps);
    KV("plans_trimmed", msgpack_pack_int64, st->plans_trimmed);
    KV("livelock_steps", msgpack_pack_int64, st->livelock_steps);
    KV("reloads", msgpack_pack_int64, snap.policy_reloads);
    KV("reload_errors", msgpack_pack_int64, snap.policy_reload_errors);
    li_mp_pack_str(pk, "throughput");
    msgpack_pack_map(pk, 3);
    KV("generated_tokens_per_s", msgpack_pack_double, (double)recent / 10.0);
    KV("generated_tokens_per_s_avg", msgpack_pack_double, up > 0 ? (double)m->generation_tokens / up : 0.0);
    KV("prompt_tokens_total", msgpack_pack_uint64, m->prompt_tokens);
    li_mp_pack_str(pk, "connections");
    int n_paused = 0; /* over --write-buffer: not read from until the client catches up */
    for (const li_conn *c = srv->net.conns; c; c = c->next) n_paused += c->paused && !c->closing;
    msgpack_pack_map(pk, 8);
    KV("open", msgpack_pack_int, srv->net.n_conns);
    KV("paused", msgpack_pack_int, n_paused);
    KV("total", msgpack_pack_uint64, srv->net.connections_total);
    KV("refused", msgpack_pack_uint64, srv->net.connections_refused);
    KV("slow_closed", msgpack_pack_uint64, m->slow_clients_closed);
    KV("timed_out", msgpack_pack_uint64, srv->net.timeouts_total);
    KV("evicted", msgpack_pack_uint64, srv->net.evicted_total);
    KV("refused_per_ip", msgpack_pack_uint64, srv->net.per_ip_refused);
    li_mp_pack_str(pk, "calls");
    msgpack_pack_map(pk, 4);
    KV("rpc", msgpack_pack_uint64, m->rpc_calls);
    KV("rpc_errors", msgpack_pack_uint64, m->rpc_errors);
    KV("http", msgpack_pack_uint64, m->http_requests);
    KV("http_errors", msgpack_pack_uint64, m->http_errors);
    li_mp_pack_str(pk, "config");
    msgpack_pack_map(pk, 7);
    KV("max_num_seqs", msgpack_pack_int32, srv->cfg.max_num_seqs);
    KV("max_batched_tokens", msgpack_pack_int32, srv->cfg.max_batched_tokens);
    KV("block_size", msgpack_pack_int32, srv->cfg.block_size);
    li_mp_pack_str(pk, "kv_dtype");
    li_mp_pack_str(pk, li_kv_dtype_name(srv->cfg.kv_dtype));
    KV("max_model_len", msgpack_pack_int64, srv->cfg.max_model_len);
    KV("max_queued", msgpack_pack_int64, srv->lim.max_queued);
    KV("draining", msgpack_pack_int, srv->draining ? 1 : 0);
    /* speculation: the engine's default, and drafts by proposer */
    li_mp_pack_str(pk, "speculation");
    msgpack_pack_map(pk, 6);
    li_mp_pack_str(pk, "method");
    li_mp_pack_str(pk, li_spec_method_name(srv->cfg.spec_method));
    KV("k", msgpack_pack_int32, srv->cfg.spec_tokens);
    KV("drafted", msgpack_pack_int64, st->spec_drafted);
    KV("accepted", msgpack_pack_int64, st->spec_accepted);
    KV("acceptance", msgpack_pack_double, st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0);
    li_mp_pack_str(pk, "by_method");
    msgpack_pack_map(pk, LI_SPEC_N_METHODS);
    for (int i = 0; i < LI_SPEC_N_METHODS; i++) {
        li_mp_pack_str(pk, li_spec_method_name(i));
        msgpack_pack_map(pk, 4);
        KV("drafted", msgpack_pack_int64, st->spec_drafted_by[i]);
        KV("accepted", msgpack_pack_int64, st->spec_accepted_by[i]);
        KV("acceptance", msgpack_pack_double,
           st->spec_drafted_by[i] ? (double)st->spec_accepted_by[i] / (double)st->spec_drafted_by[i] : 0.0);
        KV("rounds", msgpack_pack_int64, st->spec_rounds_by[i]);
    }
    li_hist_free(&snap.step_time);
}
