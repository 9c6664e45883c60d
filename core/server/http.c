/* http.c — the HTTP face of the server: OpenAI-compatible completions and
 * chat completions (JSON or Server-Sent Events), /v1/models, /health and
 * /metrics (Prometheus text format).
 *
 * One request at a time per connection (HTTP/1.1 keep-alive; pipelined
 * requests wait: the parser pauses at the end of each message and reading
 * stops until the response is complete). A JSON body is converted to
 * msgpack and parsed by the same li_api_gen_parse as the RPC `generate`,
 * with OpenAI's defaults (temperature 1, top_p 1, max_tokens 16 for
 * completions, up to the context for chat). Streamed responses use
 * chunked transfer encoding: `data: {json}\n\n` per delta, then
 * `data: [DONE]\n\n`.
 *
 * Errors are OpenAI-style: {"error": {"message", "type", "param", "code"}}
 * with the HTTP status (400 bad JSON or parameters, 401, 404, 405, 413,
 * 429, 503). */
#define _GNU_SOURCE
#include "server/http.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <http_parser.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <utf8proc.h>

#define MAX_URL 8192
#define MAX_HEADER_VALUE 1024

/* ---- a growable byte buffer with printf ------------------------------------- */

static void sb_printf(msgpack_sbuffer *sb, const char *fmt, ...) LI_PRINTF(2, 3);
static void sb_printf(msgpack_sbuffer *sb, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        msgpack_sbuffer_write(sb, small, (size_t)n);
        return;
    }
    char *big = li_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    msgpack_sbuffer_write(sb, big, (size_t)n);
    free(big);
}

/* ---- the HTTP session (socket-independent) --------------------------------------- */

typedef enum { H_NONE, H_AUTH, H_OTHER } hdr_kind;

typedef struct http_sess {
    li_server *srv;
    li_conn *conn;             /* NULL when detached: output goes to `out` */
    msgpack_sbuffer *out;
    http_parser p;
    bool closed;
    /* the request being parsed */
    char *url;
    size_t url_len;
    char field[32];
    size_t field_len;
    bool field_done;
    hdr_kind cur;
    char auth[MAX_HEADER_VALUE];
    size_t auth_len;
    char *body;
    size_t body_len;
    bool too_large;
    bool keep_alive;
    bool head;                 /* HEAD: the GET response's headers, no body */
    /* the response in progress */
    bool busy;
    char *pending;             /* bytes that arrived while busy */
    size_t n_pending;
    li_srv_req *req;
    bool chat, sse, include_usage;
    uint64_t role_sent;        /* chat streams: the first delta of sample i carries the role */
    double lp_offset[LI_SRV_MAX_N]; /* completions streams: text_offset of sample i's next token */
    long created;
} http_sess;

static void hwrite(http_sess *h, const void *buf, size_t n) {
    if (h->conn) li_conn_write(h->conn, buf, n);
    else if (h->out) msgpack_sbuffer_write(h->out, buf, n);
}

static const char *status_text(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

static void http_done(http_sess *h);

static void respond(http_sess *h, int status, const char *ctype, const char *body, size_t n) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    sb_printf(&sb,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n%s\r\n", status,
              status_text(status), ctype, n, h->keep_alive ? "keep-alive" : "close",
              status == 401 ? "WWW-Authenticate: Bearer\r\n" : "");
    if (!h->head) msgpack_sbuffer_write(&sb, body, n); /* HEAD keeps Content-Length, sends no body */
    hwrite(h, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    if (status >= 400) h->srv->m.http_errors++;
    http_done(h);
}

/* ---- JSON output ---------------------------------------------------------------------- */

/* Responses are built with jansson, which keeps string lengths: a NUL in
 * generated text goes out as \u0000, exactly (cJSON took C strings). */

/* Compact, every double written back to the same bits. */
static char *json_text(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!s) {
        li_log_error("out of memory writing a JSON response");
        abort();
    }
    json_decref(j);
    return s;
}

/* A number as cJSON wrote one: integral values as integers, the others as
 * doubles, non-finite ones (JSON has none) as null. */
static json_t *jnum(double x) {
    if (!isfinite(x)) return json_null();
    if (x == floor(x) && fabs(x) < 9007199254740992.0) return json_integer((json_int_t)x);
    return json_real(x);
}

/* Text (n bytes, NULs included) as a JSON string. Invalid UTF-8 cannot
 * occur (the engine emits whole characters or U+FFFD; token_string and
 * error messages scrub theirs); should some come anyway, it is scrubbed
 * here rather than dropping the field. */
static json_t *str_n(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (!j) {
        char *z = li_xmalloc(n + 1);
        memcpy(z, s, n);
        z[n] = 0;
        li_utf8_scrub(z, n);
        j = json_stringn_nocheck(z, n);
        free(z);
    }
    return j;
}

static json_t *jstr(const char *s) { return str_n(s, strlen(s)); }

static void jset(json_t *o, const char *key, json_t *v) { json_object_set_new(o, key, v); }

static json_t *jobj_add(json_t *o, const char *key) {
    json_t *c = json_object();
    json_object_set_new(o, key, c);
    return c;
}

static json_t *jarr_add(json_t *o, const char *key) {
    json_t *c = json_array();
    json_object_set_new(o, key, c);
    return c;
}

static void respond_json(http_sess *h, int status, json_t *j) {
    char *s = json_text(j);
    respond(h, status, "application/json", s, strlen(s));
    free(s);
}

static json_t *error_object(int status, const char *msg) {
    const char *type = status == 401 ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    json_t *j = json_object();
    json_t *e = jobj_add(j, "error");
    jset(e, "message", jstr(msg));
    jset(e, "type", jstr(type));
    jset(e, "param", json_null());
    jset(e, "code", json_null());
    return j;
}

static void respond_error(http_sess *h, int status, const char *fmt, ...) LI_PRINTF(3, 4);
static void respond_error(http_sess *h, int status, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    li_utf8_scrub(msg, strlen(msg));
    respond_json(h, status, error_object(status, msg));
}

/* RPC error codes → HTTP statuses. */
static int http_status_of(int code) {
    switch (code) {
    case LI_RPC_UNAUTHORIZED: return 401;
    case LI_RPC_NOT_FOUND: return 404;
    case LI_RPC_TOO_LARGE: return 413;
    case LI_RPC_TOO_MANY: return 429;
    case LI_RPC_UNAVAILABLE: return 503;
    case LI_RPC_INTERNAL: case LI_RPC_ENGINE: return 500;
    default: return 400;
    }
}

/* ---- SSE ----------------------------------------------------------------------------- */

static void sse_begin(http_sess *h) {
    static const char hdr[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                              "Transfer-Encoding: chunked\r\n";
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    sb_printf(&sb, "%sConnection: %s\r\n\r\n", hdr, h->keep_alive ? "keep-alive" : "close");
    hwrite(h, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    h->sse = true;
}

/* One chunk holding `data: <json>\n\n`. */
static void sse_send(http_sess *h, const char *data, size_t n) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    sb_printf(&sb, "%zx\r\ndata: ", n + 8);
    msgpack_sbuffer_write(&sb, data, n);
    msgpack_sbuffer_write(&sb, "\n\n\r\n", 4);
    hwrite(h, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static void sse_json(http_sess *h, json_t *j) {
    char *s = json_text(j);
    sse_send(h, s, strlen(s));
    free(s);
}

static void sse_end(http_sess *h) {
    sse_send(h, "[DONE]", 6);
    hwrite(h, "0\r\n\r\n", 5);
    http_done(h);
}

/* ---- OpenAI response objects ------------------------------------------------------------ */

static json_t *base_object(http_sess *h, const li_srv_req *r, bool chunk) {
    char id[64];
    snprintf(id, sizeof id, "%s-%lld", h->chat ? "chatcmpl" : "cmpl", (long long)(r->id >= 0 ? r->id : 0));
    json_t *j = json_object();
    jset(j, "id", jstr(id));
    jset(j, "object", jstr(h->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion"));
    jset(j, "created", jnum((double)h->created));
    jset(j, "model", jstr(li_api_model_name(h->srv)));
    return j;
}

static json_t *usage_object(const li_srv_req *r) {
    int64_t completion = 0;
    for (int32_t i = 0; i < r->g.n; i++) completion += r->out[i].n_tokens;
    json_t *u = json_object();
    jset(u, "prompt_tokens", jnum((double)r->n_prompt_tokens));
    jset(u, "completion_tokens", jnum((double)completion));
    jset(u, "total_tokens", jnum((double)(r->n_prompt_tokens + completion)));
    json_t *d = jobj_add(u, "prompt_tokens_details");
    jset(d, "cached_tokens", jnum((double)r->n_cached_tokens));
    return u;
}

/* ---- logprobs in OpenAI's two shapes ---------------------------------------------------- */

/* A token's text: its bytes, each byte that does not start a valid UTF-8
 * character replaced by U+FFFD (a byte-level token may hold part of a
 * character); a NUL stays a NUL (\u0000). */
static json_t *token_string(li_server *srv, int32_t id, json_t **bytes_out) {
    char piece[256];
    int k = srv->model ? li_tokenizer_token_to_piece(srv->model->tok, id, true, piece, sizeof piece) : -1;
    size_t n = k < 0 ? 0 : LI_MIN((size_t)k, sizeof piece);
    if (bytes_out) {
        *bytes_out = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes_out, json_integer((unsigned char)piece[i]));
    }
    char out[3 * sizeof piece];
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)piece + i, (utf8proc_ssize_t)(n - i), &cp);
        if (len > 0) {
            memcpy(out + o, piece + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    return str_n(out, o);
}

typedef struct lp_acc {
    json_t *obj;                 /* the "logprobs" value */
    json_t *content;             /* chat: [{token, logprob, bytes, top_logprobs}] */
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset; /* completions */
    double offset;
} lp_acc;

static void lp_init(lp_acc *a, bool chat, double offset) {
    memset(a, 0, sizeof *a);
    a->obj = json_object();
    a->offset = offset;
    if (chat) {
        a->content = jarr_add(a->obj, "content");
    } else {
        a->tokens = jarr_add(a->obj, "tokens");
        a->token_logprobs = jarr_add(a->obj, "token_logprobs");
        a->top_logprobs = jarr_add(a->obj, "top_logprobs");
        a->text_offset = jarr_add(a->obj, "text_offset");
    }
}

static void lp_add(li_server *srv, lp_acc *a, int32_t token, double lp, const li_token_logprob *top, int32_t n_top) {
    if (a->content) {
        json_t *e = json_object(), *bytes;
        jset(e, "token", token_string(srv, token, &bytes));
        jset(e, "logprob", jnum(lp));
        jset(e, "bytes", bytes);
        json_t *tl = jarr_add(e, "top_logprobs");
        for (int32_t i = 0; i < n_top; i++) {
            json_t *t = json_object(), *tb;
            jset(t, "token", token_string(srv, top[i].id, &tb));
            jset(t, "logprob", jnum(top[i].logprob));
            jset(t, "bytes", tb);
            json_array_append_new(tl, t);
        }
        json_array_append_new(a->content, e);
        return;
    }
    json_t *ts = token_string(srv, token, NULL);
    double len = (double)json_string_length(ts);
    json_array_append_new(a->tokens, ts);
    json_array_append_new(a->token_logprobs, jnum(lp));
    json_t *m = json_object();
    for (int32_t i = 0; i < n_top; i++) {
        json_t *t = token_string(srv, top[i].id, NULL);
        const char *key = json_string_value(t);
        const size_t key_len = json_string_length(t);
        if (!json_object_getn(m, key, key_len)) json_object_setn_new(m, key, key_len, jnum(top[i].logprob));
        json_decref(t);
    }
    json_array_append_new(a->top_logprobs, m);
    json_array_append_new(a->text_offset, jnum(a->offset));
    a->offset += len;
}

/* The sample's packed logprob entries ({token, logprob, top = [[id, lp]...]}, see api.c). */
static json_t *lp_of_sample(li_server *srv, const li_sample_out *o, bool chat) {
    lp_acc a;
    lp_init(&a, chat, 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    while (o->logprobs.size && msgpack_unpack_next(&u, o->logprobs.data, o->logprobs.size, &off) == MSGPACK_UNPACK_SUCCESS) {
        const msgpack_object *tok = li_mp_get(&u.data, "token"), *lp = li_mp_get(&u.data, "logprob"),
                             *top = li_mp_get(&u.data, "top");
        li_token_logprob t[20];
        int32_t nt = 0;
        for (uint32_t i = 0; top && top->type == MSGPACK_OBJECT_ARRAY && i < top->via.array.size && nt < 20; i++) {
            const msgpack_object *pair = &top->via.array.ptr[i];
            if (pair->type != MSGPACK_OBJECT_ARRAY || pair->via.array.size != 2) continue;
            t[nt].id = (int32_t)pair->via.array.ptr[0].via.i64;
            t[nt].logprob = (float)pair->via.array.ptr[1].via.f64;
            nt++;
        }
        lp_add(srv, &a, tok ? (int32_t)tok->via.i64 : -1, lp ? lp->via.f64 : 0, t, nt);
    }
    msgpack_unpacked_destroy(&u);
    return a.obj;
}

static void http_delta(li_srv_req *r, int32_t index, const char *text, size_t n, int32_t token, float logprob,
                       const li_token_logprob *top, int32_t n_top) {
    http_sess *h = r->owner;
    if (!h->sse) sse_begin(h);
    bool first = h->chat && index < 64 && !(h->role_sent >> index & 1);
    bool lp = r->g.logprobs >= 0 && token >= 0;
    if (n == 0 && !first && !lp) return;
    if (first) h->role_sent |= 1ull << index;
    json_t *j = base_object(h, r, true);
    json_t *choices = jarr_add(j, "choices");
    json_t *c = json_object();
    jset(c, "index", jnum(index));
    if (h->chat) {
        json_t *d = jobj_add(c, "delta");
        if (first) jset(d, "role", jstr("assistant"));
        jset(d, "content", str_n(text, n));
    } else {
        jset(c, "text", str_n(text, n));
    }
    if (lp) {
        /* text_offset counts from the start of the sample's text, as in the
         * non-streamed response, not from this chunk */
        bool have = index >= 0 && index < LI_SRV_MAX_N;
        lp_acc a;
        lp_init(&a, h->chat, have ? h->lp_offset[index] : 0);
        lp_add(h->srv, &a, token, logprob, top, n_top);
        if (have) h->lp_offset[index] = a.offset;
        jset(c, "logprobs", a.obj);
    } else {
        jset(c, "logprobs", json_null());
    }
    jset(c, "finish_reason", json_null());
    json_array_append_new(choices, c);
    sse_json(h, j);
}

static void http_done_req(li_srv_req *r) {
    http_sess *h = r->owner;
    h->req = NULL;
    if (r->g.stream) {
        if (!h->sse) sse_begin(h);
        for (int32_t i = 0; i < r->g.n; i++) {
            json_t *j = base_object(h, r, true);
            json_t *choices = jarr_add(j, "choices");
            json_t *c = json_object();
            jset(c, "index", jnum(i));
            if (h->chat) jobj_add(c, "delta");
            else jset(c, "text", jstr(""));
            jset(c, "logprobs", json_null());
            jset(c, "finish_reason", jstr(r->out[i].finish_reason ? r->out[i].finish_reason : "error"));
            json_array_append_new(choices, c);
            sse_json(h, j);
        }
        if (h->include_usage) {
            json_t *j = base_object(h, r, true);
            jarr_add(j, "choices");
            jset(j, "usage", usage_object(r));
            sse_json(h, j);
        }
        sse_end(h);
        return;
    }
    json_t *j = base_object(h, r, false);
    json_t *choices = jarr_add(j, "choices");
    for (int32_t i = 0; i < r->g.n; i++) {
        const li_sample_out *o = &r->out[i];
        json_t *c = json_object();
        jset(c, "index", jnum(i));
        if (h->chat) {
            json_t *m = jobj_add(c, "message");
            jset(m, "role", jstr("assistant"));
            jset(m, "content", str_n(o->text ? o->text : "", o->text_len));
        } else {
            jset(c, "text", str_n(o->text ? o->text : "", o->text_len));
        }
        if (r->g.logprobs >= 0) jset(c, "logprobs", lp_of_sample(h->srv, o, h->chat));
        else jset(c, "logprobs", json_null());
        jset(c, "finish_reason", jstr(o->finish_reason ? o->finish_reason : "error"));
        json_array_append_new(choices, c);
    }
    jset(j, "usage", usage_object(r));
    respond_json(h, 200, j);
}

static void http_error_req(li_srv_req *r, int code, const char *msg) {
    http_sess *h = r->owner;
    h->req = NULL;
    if (h->sse) { /* headers are out: report in-band, then end the stream */
        json_t *j = error_object(http_status_of(code), msg);
        sse_json(h, j);
        sse_end(h);
        return;
    }
    respond_error(h, http_status_of(code), "%s", msg);
}

static const li_sink_ops http_sink = {http_delta, http_done_req, http_error_req};

/* ---- routes ------------------------------------------------------------------------------------ */

/* The body, a JSON object, as msgpack for the parsers the RPC methods use:
 * true with *u set (destroy u and sb after), or false with a 400 sent.
 * jansson reads it (request_json.c): strings keep their lengths, so a
 * "\u0000" in a prompt, a message or a stop string stays there exactly as
 * over msgpack-RPC. */
static bool body_msgpack(http_sess *h, msgpack_sbuffer *sb, msgpack_unpacked *u) {
    if (!h->body_len) {
        respond_error(h, 400, "the request body must be a JSON object");
        return false;
    }
    if (!li_utf8_valid(h->body, h->body_len)) {
        respond_error(h, 400, "the request body is not valid UTF-8");
        return false;
    }
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    li_error err = {0};
    if (li_request_pack_json_text(&pk, h->body, h->body_len, LI_SRV_MAX_DEPTH, &err)) {
        msgpack_sbuffer_destroy(sb);
        respond_error(h, 400, "%s", err.msg);
        return false;
    }
    msgpack_unpacked_init(u);
    size_t off = 0;
    if (msgpack_unpack_next(u, sb->data, sb->size, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(u);
        msgpack_sbuffer_destroy(sb);
        respond_error(h, 400, "the request body could not be read");
        return false;
    }
    return true;
}

static void route_completions(http_sess *h, bool chat) {
    li_server *srv = h->srv;
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    if (!body_msgpack(h, &sb, &u)) return;
    const msgpack_object *so = li_mp_get(li_mp_get(&u.data, "stream_options"), "include_usage");
    h->include_usage = so && so->type == MSGPACK_OBJECT_BOOLEAN && so->via.boolean;
    li_gen_params g;
    li_error err = {0};
    li_gen_defaults d = {.openai = true, .chat = chat};
    int rc = li_api_gen_parse(srv, &u.data, &d, &g, &err);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    if (rc) {
        respond_error(h, http_status_of(err.code), "%s", err.msg);
        return;
    }
    if (!chat && g.msgs) {
        li_gen_params_free(&g);
        respond_error(h, 400, "/v1/completions takes 'prompt'; use /v1/chat/completions for 'messages'");
        return;
    }
    h->chat = chat;
    h->sse = false;
    h->role_sent = 0;
    memset(h->lp_offset, 0, sizeof h->lp_offset);
    h->created = (long)time(NULL);
    li_srv_req *r = li_api_gen_start(srv, &g, &http_sink, h, &err);
    if (!r) {
        respond_error(h, http_status_of(err.code), "%s", err.msg);
        return;
    }
    h->req = r; /* the sink answers; h->busy stays set until then */
}

/* vLLM's POST /tokenize {prompt, add_special_tokens = true} ->
 * {count, max_model_len, tokens}. */
static void route_tokenize(http_sess *h) {
    li_server *srv = h->srv;
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    if (!body_msgpack(h, &sb, &u)) return;
    const msgpack_object *po = li_mp_get(&u.data, "prompt"), *so = li_mp_get(&u.data, "add_special_tokens");
    const char *prompt = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    li_error err = {0};
    if (!po || !li_mp_read_str(po, false, &prompt, &len)) li_error_set(&err, 400, "'prompt' must be a string");
    else if (so && so->type != MSGPACK_OBJECT_BOOLEAN && so->type != MSGPACK_OBJECT_NIL)
        li_error_set(&err, 400, "'add_special_tokens' must be true or false");
    else if (!srv->model) li_error_set(&err, 503, "no model is loaded");
    else {
        const bool sp = !(so && so->type == MSGPACK_OBJECT_BOOLEAN && !so->via.boolean);
        if (li_tokenizer_encode(srv->model->tok, prompt, len, sp, sp, &ids, &n, &err)) err.code = 400;
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    if (err.code) {
        respond_error(h, err.code, "%s", err.msg);
        return;
    }
    json_t *out = json_object();
    jset(out, "count", jnum((double)n));
    jset(out, "max_model_len", jnum((double)srv->cfg.max_model_len));
    json_t *arr = jarr_add(out, "tokens");
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, jnum(ids[i]));
    free(ids);
    respond_json(h, 200, out);
}

/* vLLM's POST /detokenize {tokens} -> {prompt}: the text of the ids
 * (special tokens skipped; invalid UTF-8 as U+FFFD). */
static void route_detokenize(http_sess *h) {
    li_server *srv = h->srv;
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    if (!body_msgpack(h, &sb, &u)) return;
    const msgpack_object *to = li_mp_get(&u.data, "tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t len = 0;
    li_error err = {0};
    if (!to) li_error_set(&err, LI_RPC_INVALID_PARAMS, "'tokens' is required");
    else if (!li_api_parse_tokens(to, "tokens", &ids, &n, &err)) {
        if (!srv->model) li_error_set(&err, LI_RPC_UNAVAILABLE, "no model is loaded");
        else li_api_detokenize(srv, ids, n, false, &text, &len, &err);
    }
    free(ids);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    if (err.code) {
        respond_error(h, http_status_of(err.code), "%s", err.msg);
        return;
    }
    json_t *out = json_object();
    jset(out, "prompt", str_n(text, len));
    free(text);
    respond_json(h, 200, out);
}

static void route_models(http_sess *h) {
    json_t *j = json_object();
    jset(j, "object", jstr("list"));
    json_t *data = jarr_add(j, "data");
    json_t *m = json_object();
    jset(m, "id", jstr(li_api_model_name(h->srv)));
    jset(m, "object", jstr("model"));
    jset(m, "created", jnum((double)(long)time(NULL)));
    jset(m, "owned_by", jstr("luainfer"));
    if (h->srv->model) jset(m, "max_model_len", jnum((double)h->srv->cfg.max_model_len));
    json_array_append_new(data, m);
    respond_json(h, 200, j);
}

static void route_health(http_sess *h) {
    json_t *j = json_object();
    jset(j, "status", jstr(h->srv->draining ? "draining" : "ok"));
    respond_json(h, h->srv->draining ? 503 : 200, j);
}

static void route_metrics(http_sess *h) {
    char *text;
    size_t n;
    li_http_metrics_text(h->srv, &text, &n);
    respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", text, n);
    free(text);
}

static bool path_is(const char *path, size_t n, const char *want) {
    return strlen(want) == n && !memcmp(path, want, n);
}

static bool authorized(http_sess *h) {
    const char *tok = h->srv->auth_token;
    if (!tok) return true;
    size_t n = strlen(tok);
    if (h->auth_len != n + 7 || strncasecmp(h->auth, "Bearer ", 7)) return false;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(h->auth[7 + i] ^ tok[i]);
    return d == 0;
}

static void route(http_sess *h) {
    li_server *srv = h->srv;
    srv->m.http_requests++;
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    const char *path = "";
    size_t plen = 0;
    if (h->url && http_parser_parse_url(h->url, h->url_len, 0, &pu) == 0 && (pu.field_set & (1 << UF_PATH))) {
        path = h->url + pu.field_data[UF_PATH].off;
        plen = pu.field_data[UF_PATH].len;
    }
    int method = h->p.method;
    if (path_is(path, plen, "/health")) {
        if (method != HTTP_GET && method != HTTP_HEAD) respond_error(h, 405, "use GET /health");
        else route_health(h);
        return;
    }
    /* as vLLM's --api-key: probes and Prometheus scrapers (an endpoint
     * picker's too) need no key; they see counts, never text */
    if (path_is(path, plen, "/metrics")) {
        if (method != HTTP_GET && method != HTTP_HEAD) respond_error(h, 405, "use GET /metrics");
        else route_metrics(h);
        return;
    }
    if (!authorized(h)) {
        respond_error(h, 401, "missing or wrong 'Authorization: Bearer' token (--api-key)");
        return;
    }
    if (path_is(path, plen, "/v1/models")) {
        if (method != HTTP_GET && method != HTTP_HEAD) respond_error(h, 405, "use GET /v1/models");
        else route_models(h);
    } else if (path_is(path, plen, "/v1/completions") || path_is(path, plen, "/v1/chat/completions")) {
        if (method != HTTP_POST) respond_error(h, 405, "use POST");
        else route_completions(h, plen > 10 && path[4] == 'c' && path[5] == 'h');
    } else if (path_is(path, plen, "/tokenize") || path_is(path, plen, "/detokenize")) {
        if (method != HTTP_POST) respond_error(h, 405, "use POST");
        else if (path[1] == 't') route_tokenize(h);
        else route_detokenize(h);
    } else {
        char shown[80];
        size_t k = 0;
        for (size_t i = 0; i < plen && k < 64; i++) shown[k++] = path[i] >= 0x20 && path[i] < 0x7f && path[i] != '"' ? path[i] : '?';
        shown[k] = 0;
        respond_error(h, 404, "no route for '%s' (try /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics)", shown);
    }
}

/* ---- http_parser callbacks ---------------------------------------------------------------------- */

static int on_message_begin(http_parser *p) {
    http_sess *h = p->data;
    if (h->conn) li_conn_set_phase(h->conn, LI_CONN_HEADER, true); /* --header-timeout from here */
    free(h->url);
    free(h->body);
    h->url = h->body = NULL;
    h->url_len = h->body_len = h->auth_len = h->field_len = 0;
    h->field_done = false;
    h->cur = H_NONE;
    h->too_large = false;
    h->head = false;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
    http_sess *h = p->data;
    if (h->url_len + n > MAX_URL) return -1;
    h->url = li_xrealloc(h->url, h->url_len + n + 1);
    memcpy(h->url + h->url_len, at, n);
    h->url_len += n;
    h->url[h->url_len] = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
    http_sess *h = p->data;
    if (h->field_done) { /* a new header begins */
        h->field_len = 0;
        h->field_done = false;
    }
    size_t k = LI_MIN(n, sizeof h->field - 1 - h->field_len);
    memcpy(h->field + h->field_len, at, k);
    h->field_len += k;
    h->field[h->field_len] = 0;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
    http_sess *h = p->data;
    if (!h->field_done) {
        h->field_done = true;
        h->cur = !strcasecmp(h->field, "authorization") ? H_AUTH : H_OTHER;
        if (h->cur == H_AUTH) h->auth_len = 0;
    }
    if (h->cur == H_AUTH) {
        size_t k = LI_MIN(n, sizeof h->auth - 1 - h->auth_len);
        memcpy(h->auth + h->auth_len, at, k);
        h->auth_len += k;
    }
    return 0;
}

static int on_headers_complete(http_parser *p) {
    http_sess *h = p->data;
    if (h->conn) li_conn_set_phase(h->conn, LI_CONN_BODY, true); /* --body-timeout from here */
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > h->srv->lim.max_frame) {
        h->too_large = true;
        return -1;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
    http_sess *h = p->data;
    if (h->body_len + n > h->srv->lim.max_frame) {
        h->too_large = true;
        return -1;
    }
    h->body = li_xrealloc(h->body, h->body_len + n + 1);
    memcpy(h->body + h->body_len, at, n);
    h->body_len += n;
    h->body[h->body_len] = 0;
    return 0;
}

static int on_message_complete(http_parser *p) {
    http_sess *h = p->data;
    h->keep_alive = http_should_keep_alive(p) && !h->srv->draining;
    h->head = p->method == HTTP_HEAD;
    h->busy = true;
    if (h->conn) li_conn_set_phase(h->conn, LI_CONN_BUSY, false);
    http_parser_pause(p, 1); /* one request at a time: the rest waits */
    route(h);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void sess_init(http_sess *h, li_server *srv, li_conn *conn, msgpack_sbuffer *out) {
    memset(h, 0, sizeof *h);
    h->srv = srv;
    h->conn = conn;
    h->out = out;
    http_parser_init(&h->p, HTTP_REQUEST);
    h->p.data = h;
}

static void sess_free(http_sess *h) {
    if (h->req) {
        li_api_gen_orphan(h->req);
        h->req = NULL;
    }
    free(h->url);
    free(h->body);
    free(h->pending);
    h->url = h->body = h->pending = NULL;
    h->n_pending = 0;
}

static void sess_feed(http_sess *h, const char *data, size_t n);

static void close_sess(http_sess *h) {
    h->closed = true;
    if (h->conn) li_conn_close(h->conn);
}

/* The response is complete: next request, or close. */
static void http_done(http_sess *h) {
    h->busy = false;
    h->sse = false;
    h->head = false;
    if (!h->keep_alive) {
        close_sess(h);
        return;
    }
    if (h->conn) {
        li_conn_set_phase(h->conn, LI_CONN_IDLE, true); /* keep-alive: --idle-timeout from here */
        li_conn_set_reading(h->conn, true);
    }
    if (h->n_pending && !h->closed) {
        char *buf = h->pending;
        size_t n = h->n_pending;
        h->pending = NULL;
        h->n_pending = 0;
        sess_feed(h, buf, n);
        free(buf);
    }
}

static void sess_feed(http_sess *h, const char *data, size_t n) {
    while (n > 0 && !h->closed) {
        if (h->busy) {
            if (h->n_pending + n > h->srv->lim.max_frame + MAX_URL + 65536) {
                close_sess(h); /* a pipelining client far ahead of us */
                return;
            }
            h->pending = li_xrealloc(h->pending, h->n_pending + n);
            memcpy(h->pending + h->n_pending, data, n);
            h->n_pending += n;
            if (h->conn) li_conn_set_reading(h->conn, false);
            return;
        }
        size_t done = http_parser_execute(&h->p, &settings, data, n);
        enum http_errno e = HTTP_PARSER_ERRNO(&h->p);
        if (e == HPE_PAUSED) {
            http_parser_pause(&h->p, 0);
            data += done;
            n -= done;
            continue;
        }
        if (e != HPE_OK) {
            if (h->closed) return;
            h->keep_alive = false;
            h->busy = true;
            if (h->too_large) respond_error(h, 413, "request body larger than %zu bytes", h->srv->lim.max_frame);
            else respond_error(h, 400, "malformed HTTP request: %s", http_errno_description(e));
            return;
        }
        data += done;
        n -= done;
        if (done == 0) break;
    }
}

/* ---- sockets ------------------------------------------------------------------------------------ */

typedef struct http_conn {
    li_conn base;
    http_sess h;
} http_conn;

static void hc_on_data(li_conn *c, const char *buf, size_t n) { sess_feed(&((http_conn *)c)->h, buf, n); }
static void hc_on_close(li_conn *c) { sess_free(&((http_conn *)c)->h); }
static void hc_free(li_conn *c) { free(c); }
static const li_conn_ops http_conn_ops = {hc_on_data, hc_on_close, hc_free};

static li_conn *http_conn_new(void *srv) {
    http_conn *hc = li_xcalloc(1, sizeof *hc);
    hc->base.ops = &http_conn_ops;
    hc->base.idle_timeout = ((li_server *)srv)->lim.idle_timeout;
    hc->base.idle_flag = "--idle-timeout";
    hc->base.header_first = true; /* the first request, like every head, within --header-timeout */
    sess_init(&hc->h, srv, &hc->base, NULL);
    return &hc->base;
}

/* A refused connection (too many or draining: 503; the per-address limit:
 * 429) gets that status before it closes. */
static void http_refuse(li_conn *c, int code, const char *why) {
    char resp[512];
    int k = snprintf(resp, sizeof resp,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n{\"error\":{\"message\":\"%s\"}}",
                     code, status_text(code), strlen(why) + 24, why);
    if (k > 0 && (size_t)k < sizeof resp) li_conn_write(c, resp, (size_t)k);
}

/* A timeout or eviction: a request half-sent gets 408 (or 503) before the
 * close; a connection between requests is closed silently, as a keep-alive
 * close is (nginx does the same), since there is no request to answer. */
static void http_expire(li_conn *c, int code, const char *why) {
    if (c->phase == LI_CONN_HEADER || c->phase == LI_CONN_BODY) http_refuse(c, code, why);
}

const li_protocol li_http_protocol = {"http", http_conn_new, http_refuse, http_expire};

void li_http_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n) {
    li_server srv;
    li_server_init(&srv);
    if (n > 0 && (data[n - 1] & 1)) srv.auth_token = "secret";
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    http_sess h;
    sess_init(&h, &srv, NULL, &sb);
    size_t off = 0, step = 1;
    while (off < n && !h.closed) {
        size_t k = LI_MIN(step, n - off);
        sess_feed(&h, (const char *)data + off, k);
        off += k;
        step = step * 2 + 3;
    }
    sess_free(&h);
    li_server_free(&srv);
    *out_n = sb.size;
    *out = sb.data ? sb.data : li_xmalloc(1);
}

/* ---- /metrics ------------------------------------------------------------------------------------ */

static void prom_hist(msgpack_sbuffer *sb, const char *name, const char *help, const li_hist *h) {
    sb_printf(sb, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        sb_printf(sb, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[h->n];
    sb_printf(sb, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)cum, name,
              h->sum, name, (unsigned long long)h->total);
}

static void prom(msgpack_sbuffer *sb, const char *name, const char *type, const char *help, double v) {
    sb_printf(sb, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* The Gateway API Inference Extension's model-server gauges (its endpoint
 * picker routes on them), under luainfer's names and vLLM's, which the
 * picker's defaults (--total-queued-requests-metric and its siblings) read.
 *   queued:  samples accepted and not running: being tokenized, waiting for
 *            a first step, or preempted (vLLM counts preempted ones as waiting)
 *   running: samples holding KV blocks in the batch (<= max_num_seqs)
 *   KV:      blocks in use / blocks, 0..1 (cached prefix blocks no request
 *            holds are free: they are evicted on demand) */
static void metrics_gateway(msgpack_sbuffer *sb, li_server *srv, const li_engine_stats *st) {
    double running = st->n_running;
    double queued = (double)srv->n_samples - running;
    if (queued < 0) queued = 0; /* the snapshot is a step old: a finished sample may still count as running */
    double kv = st->kv_total_blocks ? 1.0 - (double)st->kv_free_blocks / st->kv_total_blocks : 0.0;
    /* luainfer_requests_running and luainfer_kv_usage_ratio above are the other two */
    prom(sb, "luainfer_requests_queued", "gauge",
         "Samples accepted and not running (preparing, waiting, preempted): the queue a router balances.", queued);
    char name[300];
    size_t k = 0;
    for (const char *c = li_api_model_name(srv); *c && k < sizeof name - 2; c++)
        if (*c != '"' && *c != '\\' && *c != '\n') name[k++] = *c; /* a label value: no quotes */
    name[k] = 0;
    static const struct { const char *name, *help; } vl[] = {
        {"vllm:num_requests_waiting", "Same as luainfer_requests_queued (vLLM's name)."},
        {"vllm:num_requests_running", "Same as luainfer_requests_running (vLLM's name)."},
        {"vllm:kv_cache_usage_perc", "Same as luainfer_kv_usage_ratio, 0..1 (vLLM's name)."},
        {"vllm:gpu_cache_usage_perc", "Same as luainfer_kv_usage_ratio, 0..1 (vLLM's older name)."},
    };
    const double v[] = {queued, running, kv, kv};
    for (size_t i = 0; i < LI_ARRAY_LEN(vl); i++)
        sb_printf(sb, "# HELP %s %s\n# TYPE %s gauge\n%s{model_name=\"%s\"} %.17g\n", vl[i].name, vl[i].help, vl[i].name,
                  vl[i].name, name, v[i]);
    /* what the picker's prefix-aware scorer reads (block size), and "no LoRA adapters" */
    sb_printf(sb, "# HELP vllm:cache_config_info KV-cache configuration (labels).\n# TYPE vllm:cache_config_info gauge\n"
                  "vllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\",enable_prefix_caching=\"%s\"} 1\n",
              (int)srv->cfg.block_size, (int)st->kv_total_blocks, srv->cfg.prefix_caching ? "True" : "False");
    sb_printf(sb, "# HELP vllm:lora_requests_info LoRA adapters (none are served).\n# TYPE vllm:lora_requests_info gauge\n"
                  "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} %.17g\n",
              (double)time(NULL) - (li_time_now() - srv->t_start)); /* when serving began (unix s) */
}

static const double step_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

void li_http_metrics_text(li_server *srv, char **out, size_t *n) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const li_metrics *m = &srv->m;
    li_engine_snapshot snap;
    memset(&snap, 0, sizeof snap);
    if (srv->eng) li_engine_thread_snapshot(srv->eng, &snap);
    else li_hist_init(&snap.step_time, step_le, (int)LI_ARRAY_LEN(step_le));
    const li_engine_stats *st = &snap.st;
    static const char *const reasons[] = {"stop", "length", "cancelled", "error", "rejected"};
    sb_printf(&sb, "# HELP luainfer_requests_total Finished requests (samples) by finish reason.\n"
                   "# TYPE luainfer_requests_total counter\n");
    for (int i = 0; i < 5; i++)
        sb_printf(&sb, "luainfer_requests_total{finish_reason=\"%s\"} %llu\n", reasons[i],
                  (unsigned long long)m->requests_by_reason[i]);
    prom(&sb, "luainfer_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", (double)m->prompt_tokens);
    prom(&sb, "luainfer_generation_tokens_total", "counter", "Generated tokens delivered.", (double)m->generation_tokens);
    prom_hist(&sb, "luainfer_time_to_first_token_seconds", "From receipt to the first generated token.", &m->ttft);
    prom_hist(&sb, "luainfer_time_per_output_token_seconds", "Mean time between tokens after the first, per request.", &m->tpot);
    prom_hist(&sb, "luainfer_e2e_request_latency_seconds", "From receipt to the last token.", &m->e2e);
    prom_hist(&sb, "luainfer_step_duration_seconds", "Wall time of one engine step with work.", &snap.step_time);
    prom(&sb, "luainfer_kv_blocks_used", "gauge", "KV blocks in use.", st->kv_total_blocks - st->kv_free_blocks);
    prom(&sb, "luainfer_kv_blocks_total", "gauge", "KV blocks in the pool.", st->kv_total_blocks);
    prom(&sb, "luainfer_kv_usage_ratio", "gauge", "Fraction of KV blocks in use.",
         st->kv_total_blocks ? 1.0 - (double)st->kv_free_blocks / st->kv_total_blocks : 0.0);
    prom(&sb, "luainfer_kv_cached_blocks", "gauge", "KV blocks holding reusable prefix-cache content.",
         st->kv_cached_blocks);
    prom(&sb, "luainfer_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.",
         (double)st->prefix_query_tokens);
    prom(&sb, "luainfer_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
         (double)st->prefix_hit_tokens);
    prom(&sb, "luainfer_prefix_cache_hit_ratio", "gauge", "Prefix-cache hit tokens / query tokens.",
         st->prefix_query_tokens ? (double)st->prefix_hit_tokens / (double)st->prefix_query_tokens : 0.0);
    prom(&sb, "luainfer_prefix_cache_evictions_total", "counter", "Cached blocks evicted.", (double)st->prefix_evictions);
    prom(&sb, "luainfer_requests_running", "gauge", "Requests holding KV blocks.", st->n_running);
    prom(&sb, "luainfer_requests_waiting", "gauge", "Requests waiting for their first step.", st->n_waiting);
    prom(&sb, "luainfer_requests_preempted", "gauge", "Requests preempted, waiting to recompute.", st->n_preempted);
    prom(&sb, "luainfer_preemptions_total", "counter", "Preemptions (recompute).", (double)st->preemptions);
    prom(&sb, "luainfer_policy_errors_total", "counter", "Policy hook failures.", (double)st->policy_errors);
    prom(&sb, "luainfer_policy_fallback_steps_total", "counter", "Steps planned by the built-in FCFS after a bad plan.",
         (double)st->fallback_steps);
    prom(&sb, "luainfer_policy_plans_trimmed_total", "counter", "Plan entries dropped or shortened by validation.",
         (double)st->plans_trimmed);
    prom(&sb, "luainfer_policy_livelock_steps_total", "counter",
         "Steps taken from a policy whose plans made no progress (the built-in FCFS ran).", (double)st->livelock_steps);
    prom(&sb, "luainfer_engine_steps_total", "counter", "Engine steps that computed something.", (double)snap.steps_busy);
    prom(&sb, "luainfer_engine_tokens_computed_total", "counter", "Tokens through the forward pass.", (double)st->tokens_computed);
    prom(&sb, "luainfer_engine_tokens_device_sampled_total", "counter",
         "Tokens sampled on the device (only their largest logits copied back).", (double)st->tokens_device_sampled);
    prom(&sb, "luainfer_engine_tokens_device_undecided_total", "counter",
         "Rows whose largest logits could not decide the draw: their logits were copied back.",
         (double)st->tokens_device_undecided);
    prom(&sb, "luainfer_connections_open", "gauge", "Open client connections.", srv->net.n_conns);
    prom(&sb, "luainfer_connections_refused_total", "counter", "Connections refused (limit or draining).",
         (double)srv->net.connections_refused);
    prom(&sb, "luainfer_connections_timed_out_total", "counter",
         "Connections closed by --header-timeout, --body-timeout or an idle timeout.", (double)srv->net.timeouts_total);
    prom(&sb, "luainfer_connections_evicted_total", "counter",
         "Idle connections closed to make room for a new one at --max-connections.", (double)srv->net.evicted_total);
    prom(&sb, "luainfer_connections_refused_per_ip_total", "counter",
         "Connections refused by --max-connections-per-ip.", (double)srv->net.per_ip_refused);
    prom(&sb, "luainfer_slow_clients_closed_total", "counter", "Connections closed for not reading their output.",
         (double)m->slow_clients_closed);
    prom(&sb, "luainfer_rpc_calls_total", "counter", "msgpack-RPC calls.", (double)m->rpc_calls);
    prom(&sb, "luainfer_rpc_errors_total", "counter", "msgpack-RPC errors sent.", (double)m->rpc_errors);
    prom(&sb, "luainfer_http_requests_total", "counter", "HTTP requests.", (double)m->http_requests);
    prom(&sb, "luainfer_http_errors_total", "counter", "HTTP error responses.", (double)m->http_errors);
    prom(&sb, "luainfer_requests_live", "gauge", "Requests received and not yet finished.", (double)srv->n_live);
    metrics_gateway(&sb, srv, st);
    /* speculation by proposer */
    static const char *const spec_names[] = {"luainfer_spec_draft_tokens_total", "luainfer_spec_accepted_tokens_total",
                                             "luainfer_spec_acceptance_ratio"};
    static const char *const spec_help[] = {"Draft tokens verified, by proposer.", "Draft tokens accepted, by proposer.",
                                            "Accepted / verified draft tokens, by proposer."};
    for (int f = 0; f < 3; f++) {
        sb_printf(&sb, "# HELP %s %s\n# TYPE %s %s\n", spec_names[f], spec_help[f], spec_names[f], f < 2 ? "counter" : "gauge");
        for (int i = 0; i < LI_SPEC_N_METHODS; i++) {
            const double d = (double)st->spec_drafted_by[i], a = (double)st->spec_accepted_by[i];
            sb_printf(&sb, "%s{method=\"%s\"} %.17g\n", spec_names[f], li_spec_method_name(i),
                      f == 0 ? d : f == 1 ? a : d > 0 ? a / d : 0.0);
        }
    }
    li_hist_free(&snap.step_time);
    *n = sb.size;
    *out = sb.data ? sb.data : li_xmalloc(1);
}
