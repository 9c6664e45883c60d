/* request.c — generation parameters from a msgpack map: one field table
 * (name, alias, type, range, luainfer's default, OpenAI's default) read by
 * every path (request.h). docs/server.md, "generate parameters", is this
 * table in prose; keep them together.
 *
 * Plain fields (numbers, integers, booleans, short strings) are parsed by
 * the table alone; the few with a shape of their own (prompt, messages,
 * stop, logit_bias, ...) name a handler. */
#define _GNU_SOURCE
#include "request/request.h"
#include "util/mp_read.h"
#include "util/utf8.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ============================================================================
 * readers
 * ========================================================================== */

/* Text may come as str or bin, a float is an integer up to about the int64
 * range, and a number is any finite one (each field checks its range). */
static bool as_bytes(const msgpack_object *o, const char **p, size_t *n) { return li_mp_read_str(o, true, p, n); }
static bool as_int(const msgpack_object *o, int64_t *v) { return li_mp_read_int(o, 9.2e18, v); }
static bool as_num(const msgpack_object *o, double *v) { return li_mp_read_num(o, v); }

static char *dup_n(const char *s, size_t n) {
    char *p = li_xmalloc(n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static uint64_t random_seed(void) {
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (++counter * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define BAD(...) return li_error_set(err, LI_EINVAL, "invalid params: " __VA_ARGS__)

/* ============================================================================
 * OpenAI fields not served
 * ========================================================================== */

/* The HTTP routes ignore the fields of OpenAI's API they do not serve: most
 * change how a reply is delivered or billed (user, store, metadata,
 * service_tier, prediction, ...). These change what the reply must be; a
 * request that sets one to anything but its neutral value is refused, so a
 * client asking for JSON or a tool call is not answered with free text as if
 * it had not asked (vLLM's structured-output and llama.cpp's grammar fields
 * too). best_of is checked against n after the loop. */
static bool is_str(const msgpack_object *v, const char *want) { return li_mp_read_str_is(v, true, want); }

static int openai_unserved(const char *name, const msgpack_object *v, int64_t *best_of, li_error *err) {
    if (v->type == MSGPACK_OBJECT_NIL) return 0;
    if (!strcmp(name, "response_format")) {
        const msgpack_object *t = v->type == MSGPACK_OBJECT_MAP ? li_mp_read_get(v, "type", true) : NULL;
        if (t && is_str(t, "text")) return 0;
        BAD("'response_format' other than {\"type\": \"text\"} is not supported: luainfer does not constrain "
            "decoding, so the reply would not be sure to follow the format (ask for it in the prompt and check the reply)");
    }
    if (!strcmp(name, "tools") || !strcmp(name, "functions")) {
        if (v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 0) return 0;
        BAD("'%s' is not supported: tool calling is not served (the model would not be shown the tools)", name);
    }
    if (!strcmp(name, "tool_choice") || !strcmp(name, "function_call")) {
        if (is_str(v, "none") || is_str(v, "auto")) return 0;
        BAD("'%s' is not supported: tool calling is not served", name);
    }
    if (!strcmp(name, "echo")) {
        if (v->type == MSGPACK_OBJECT_BOOLEAN && !v->via.boolean) return 0;
        BAD("'echo' is not supported: the reply holds the completion only");
    }
    if (!strcmp(name, "suffix")) {
        if (is_str(v, "")) return 0;
        BAD("'suffix' is not supported: luainfer completes after the prompt only");
    }
    if (!strcmp(name, "best_of")) {
        if (!as_int(v, best_of) || *best_of < 1) BAD("'best_of' must be an integer >= 1");
        return 0;
    }
    static const char *const constrained[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                              "structured_outputs", "grammar", "json_schema"};
    for (size_t i = 0; i < LI_ARRAY_LEN(constrained); i++)
        if (!strcmp(name, constrained[i]))
            BAD("'%s' is not supported: luainfer does not constrain decoding to a grammar, a schema or a pattern", name);
    return 0;
}

/* ============================================================================
 * the field table
 * ========================================================================== */

typedef enum { T_I32, T_I64, T_F32, T_BOOL, T_STR, T_SPECIAL, T_F64 } ftype;

/* What one parse carries besides g (fields that combine at the end). */
typedef struct parse_state {
    const li_req_opts *o;
    bool have_seed, logprobs_bool;
    int64_t top_logprobs;
} parse_state;

typedef int (*field_fn)(parse_state *st, const char *name, const msgpack_object *v, li_gen_params *g,
                        li_error *err);

typedef struct field {
    const char *name, *alias;
    ftype type;
    size_t off;              /* offsetof(li_gen_params, ...) for plain fields */
    double lo, hi;           /* range; top_p's lo is exclusive (lo_open) */
    bool lo_open;
    bool minus_one_off;      /* -1 means "off" and is stored as 0 (top_k) */
    double def, def_openai;  /* NAN: no default written */
    field_fn fn;             /* T_SPECIAL */
} field;

static int f_prompt(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_messages(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_tokens(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_seed(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_stop(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_stop_ids(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_logit_bias(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_logprobs(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_top_logprobs(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_stream(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_model(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);
static int f_speculation(parse_state *, const char *, const msgpack_object *, li_gen_params *, li_error *);

#define OFF(m) offsetof(li_gen_params, m)
#define SPECIAL(name, fn) {name, NULL, T_SPECIAL, 0, 0, 0, false, false, NAN, NAN, fn}
#define I32MIN ((double)INT32_MIN)
#define I32MAX ((double)INT32_MAX)

/* The defaults of the sampling fields are llama.cpp's (li_sampling_params_default). */
static const field fields[] = {
    SPECIAL("prompt", f_prompt),
    SPECIAL("messages", f_messages),
    SPECIAL("tokens", f_tokens),
    {"max_tokens", "max_completion_tokens", T_I64, OFF(max_tokens), 0, LI_REQ_MAX_TOKENS, false, false, 128, 16, NULL},
    {"temperature", NULL, T_F32, OFF(sp.temperature), 0, 100, false, false, 0.8, 1, NULL},
    {"top_p", NULL, T_F32, OFF(sp.top_p), 0, 1, true, false, 0.95, 1, NULL},
    {"top_k", NULL, T_I32, OFF(sp.top_k), -1, LI_REQ_MAX_TOKENS, false, true, 40, 0, NULL},
    {"min_p", NULL, T_F32, OFF(sp.min_p), 0, 1, false, false, 0.05, 0, NULL},
    {"repetition_penalty", "repeat_penalty", T_F32, OFF(sp.repeat_penalty), 0.01, 10, false, false, 1, 1, NULL},
    {"presence_penalty", NULL, T_F32, OFF(sp.presence_penalty), -2, 2, false, false, 0, 0, NULL},
    {"frequency_penalty", NULL, T_F32, OFF(sp.frequency_penalty), -2, 2, false, false, 0, 0, NULL},
    {"penalty_last_n", NULL, T_I32, OFF(sp.penalty_last_n), -1, LI_REQ_MAX_TOKENS, false, false, 64, 64, NULL},
    SPECIAL("seed", f_seed),
    SPECIAL("stop", f_stop),
    SPECIAL("stop_token_ids", f_stop_ids),
    {"min_tokens", NULL, T_I64, OFF(min_tokens), 0, LI_REQ_MAX_TOKENS, false, false, 0, 0, NULL},
    SPECIAL("logit_bias", f_logit_bias),
    {"n", NULL, T_I32, OFF(n), 1, LI_REQ_MAX_N, false, false, 1, 1, NULL},
    SPECIAL("logprobs", f_logprobs),
    SPECIAL("top_logprobs", f_top_logprobs),
    SPECIAL("stream", f_stream),
    {"ignore_eos", NULL, T_BOOL, OFF(ignore_eos), 0, 0, false, false, 0, 0, NULL},
    {"priority", NULL, T_I32, OFF(priority), I32MIN, I32MAX, false, false, 0, 0, NULL},
    {"tenant", NULL, T_STR, OFF(tenant), 0, 256, false, false, NAN, NAN, NULL},
    {"cache_salt", NULL, T_STR, OFF(cache_salt), 0, 256, false, false, NAN, NAN, NULL},
    SPECIAL("model", f_model),
    SPECIAL("speculation", f_speculation),
    /* latency objectives a policy may schedule by (0 = none); at most a day */
    {"slo_ttft_ms", NULL, T_F64, OFF(slo_ttft_ms), 0, LI_REQ_MAX_SLO_MS, false, false, 0, 0, NULL},
    {"slo_tpot_ms", NULL, T_F64, OFF(slo_tpot_ms), 0, LI_REQ_MAX_SLO_MS, false, false, 0, 0, NULL},
};

static const field *find_field(const char *name) {
    for (size_t i = 0; i < LI_ARRAY_LEN(fields); i++)
        if (!strcmp(name, fields[i].name) || (fields[i].alias && !strcmp(name, fields[i].alias))) return &fields[i];
    return NULL;
}

static void store(const field *f, li_gen_params *g, double v) {
    char *dst = (char *)g + f->off;
    switch (f->type) {
    case T_I32: *(int32_t *)dst = (int32_t)v; break;
    case T_I64: *(int64_t *)dst = (int64_t)v; break;
    case T_F32: *(float *)dst = (float)v; break;
    case T_F64: *(double *)dst = v; break;
    case T_BOOL: *(bool *)dst = v != 0; break;
    default: break;
    }
}

static void set_defaults(li_gen_params *g, const li_req_opts *o) {
    memset(g, 0, sizeof *g);
    li_sampling_params_default(&g->sp); /* what the table leaves alone (seed, logprob) */
    const bool openai = o->profile != LI_REQ_LUAINFER;
    for (size_t i = 0; i < LI_ARRAY_LEN(fields); i++) {
        const double d = openai ? fields[i].def_openai : fields[i].def;
        if (fields[i].type != T_SPECIAL && fields[i].type != T_STR && !isnan(d)) store(&fields[i], g, d);
    }
    if (o->profile == LI_REQ_OPENAI_CHAT) g->max_tokens = -1; /* the rest of the context */
    g->logprobs = -1;
}

/* A plain field: the value's type and range, then the store. */
static int parse_plain(const field *f, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    switch (f->type) {
    case T_I32:
    case T_I64: {
        int64_t v;
        if (!as_int(val, &v) || (double)v < f->lo || (double)v > f->hi)
            BAD("'%s' must be an integer in [%lld, %lld]", name, (long long)f->lo, (long long)f->hi);
        store(f, g, f->minus_one_off && v < 0 ? 0 : (double)v);
        return 0;
    }
    case T_F32:
    case T_F64: {
        double v;
        if (!as_num(val, &v) || !(v >= f->lo && v <= f->hi)) BAD("'%s' must be a number in [%g, %g]", name, f->lo, f->hi);
        if (f->lo_open && v <= f->lo) BAD("'%s' must be in (%g, %g]", name, f->lo, f->hi);
        store(f, g, v);
        return 0;
    }
    case T_BOOL:
        if (val->type != MSGPACK_OBJECT_BOOLEAN) BAD("'%s' must be true or false", name);
        store(f, g, val->via.boolean);
        return 0;
    case T_STR: {
        const char *p;
        size_t n;
        if (!as_bytes(val, &p, &n) || n > (size_t)f->hi || !li_utf8_valid(p, n))
            BAD("'%s' must be a UTF-8 string of at most %d bytes", name, (int)f->hi);
        /* the engine keeps these as C strings: refuse what it would cut */
        if (memchr(p, 0, n)) BAD("'%s' cannot hold a NUL character (\\u0000)", name);
        char **dst = (char **)((char *)g + f->off);
        free(*dst);
        *dst = dup_n(p, n);
        return 0;
    }
    default: return 0;
    }
}

/* ============================================================================
 * fields with a shape of their own
 * ========================================================================== */

int li_request_parse_tokens(const msgpack_object *o, const char *key, int32_t **out, size_t *n_out, li_error *err) {
    if (o->type != MSGPACK_OBJECT_ARRAY) BAD("'%s' must be a list of token ids", key);
    uint32_t n = o->via.array.size;
    int32_t *t = li_xmalloc(((size_t)n + 1) * sizeof *t);
    for (uint32_t i = 0; i < n; i++) {
        int64_t v;
        if (!as_int(&o->via.array.ptr[i], &v) || v < 0 || v > INT32_MAX) {
            free(t);
            BAD("'%s' must be a list of token ids: [%u] is not an integer >= 0", key, i);
        }
        t[i] = (int32_t)v;
    }
    *out = t;
    *n_out = n;
    return 0;
}

static int f_prompt(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    const char *p;
    size_t n;
    /* the key is unique (checked); tokens may already come from 'tokens' */
    if (g->prompt || g->tokens) BAD("give only one of 'prompt', 'messages' and 'tokens'");
    if (as_bytes(val, &p, &n) ||
        (val->type == MSGPACK_OBJECT_ARRAY && val->via.array.size == 1 && as_bytes(&val->via.array.ptr[0], &p, &n))) {
        /* a string, or OpenAI's list of one prompt */
        if (!li_utf8_valid(p, n)) BAD("'prompt' is not valid UTF-8");
        g->prompt = dup_n(p, n);
        g->prompt_len = n;
        return 0;
    }
    if (val->type == MSGPACK_OBJECT_ARRAY && st->o->profile != LI_REQ_LUAINFER)
        return li_request_parse_tokens(val, "prompt", &g->tokens, &g->n_tokens, err); /* OpenAI: token ids */
    BAD("'prompt' must be a string");
}

/* Chat message content: a string, or OpenAI's list of {type = "text", text}. */
static int parse_content(const msgpack_object *o, char **out, li_error *err, uint32_t mi) {
    const char *p = NULL;
    size_t n = 0;
    if (as_bytes(o, &p, &n)) {
        if (!li_utf8_valid(p, n)) BAD("messages[%u].content is not valid UTF-8", mi);
        /* the chat template takes C strings: refuse what it would cut */
        if (memchr(p, 0, n)) BAD("messages[%u].content cannot hold a NUL character (\\u0000)", mi);
        *out = dup_n(p, n);
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NIL) {
        *out = dup_n("", 0);
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_ARRAY) BAD("messages[%u].content must be a string or a list of text parts", mi);
    size_t total = 0;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *t = li_mp_read_get(&o->via.array.ptr[i], "text", true);
        if (!t || !as_bytes(t, &p, &n)) BAD("messages[%u].content[%u] must be {type = \"text\", text = ...}", mi, i);
        if (!li_utf8_valid(p, n)) BAD("messages[%u].content[%u].text is not valid UTF-8", mi, i);
        if (memchr(p, 0, n)) BAD("messages[%u].content[%u].text cannot hold a NUL character (\\u0000)", mi, i);
        total += n;
    }
    char *s = li_xmalloc(total + 1);
    size_t k = 0;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        as_bytes(li_mp_read_get(&o->via.array.ptr[i], "text", true), &p, &n);
        memcpy(s + k, p, n);
        k += n;
    }
    s[k] = 0;
    *out = s;
    return 0;
}

static int f_messages(parse_state *st, const char *name, const msgpack_object *o, li_gen_params *g, li_error *err) {
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0) BAD("'messages' must be a non-empty list of {role, content}");
    if (o->via.array.size > LI_REQ_MAX_MESSAGES) BAD("'messages' holds more than %d messages", LI_REQ_MAX_MESSAGES);
    uint32_t n = o->via.array.size;
    g->msgs = li_xcalloc(n, sizeof *g->msgs);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *m = &o->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP) BAD("messages[%u] must be a map {role, content}", i);
        const msgpack_object *role = li_mp_read_get(m, "role", true), *content = li_mp_read_get(m, "content", true);
        const char *p;
        size_t len;
        if (!role || !as_bytes(role, &p, &len) || len == 0 || len > 64 || !li_utf8_valid(p, len))
            BAD("messages[%u].role must be a string such as \"system\", \"user\" or \"assistant\"", i);
        if (memchr(p, 0, len)) BAD("messages[%u].role cannot hold a NUL character (\\u0000)", i);
        if (!content) BAD("messages[%u].content is required", i);
        /* an assistant turn's tool calls would be dropped from the prompt */
        const msgpack_object *calls = li_mp_read_get(m, "tool_calls", true);
        if (calls && calls->type != MSGPACK_OBJECT_NIL && !(calls->type == MSGPACK_OBJECT_ARRAY && calls->via.array.size == 0))
            BAD("messages[%u].tool_calls is not supported: tool calling is not served", i);
        calls = li_mp_read_get(m, "function_call", true);
        if (calls && calls->type != MSGPACK_OBJECT_NIL)
            BAD("messages[%u].function_call is not supported: tool calling is not served", i);
        char *text = NULL;
        int rc = parse_content(content, &text, err, i);
        if (rc) return rc;
        g->msgs[i].role = dup_n(p, len);
        g->msgs[i].content = text;
        g->n_msgs = (int)i + 1;
    }
    return 0;
}

static int f_tokens(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    if (g->tokens) BAD("give only one of 'prompt', 'messages' and 'tokens'"); /* OpenAI's prompt as ids */
    return li_request_parse_tokens(val, "tokens", &g->tokens, &g->n_tokens, err);
}

static int f_seed(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    int64_t v;
    if (!as_int(val, &v) || v < 0) BAD("'seed' must be an integer >= 0");
    g->sp.seed = (uint64_t)v;
    st->have_seed = true;
    return 0;
}

static int f_stop(parse_state *st, const char *name, const msgpack_object *o, li_gen_params *g, li_error *err) {
    const char *p;
    size_t n;
    const msgpack_object *items = o;
    uint32_t count = 1;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        items = o->via.array.ptr;
        count = o->via.array.size;
    }
    if (count > LI_REQ_MAX_STOP) BAD("'stop' holds more than %d strings", LI_REQ_MAX_STOP);
    for (uint32_t i = 0; i < count; i++) {
        if (!as_bytes(&items[i], &p, &n)) BAD("'stop' must be a string or a list of strings");
        if (n == 0 || n > LI_REQ_MAX_STOP_LEN) BAD("'stop' strings must be 1..%d bytes", LI_REQ_MAX_STOP_LEN);
        if (!li_utf8_valid(p, n)) BAD("'stop' is not valid UTF-8");
        /* matched as C strings (engine/output.c): refuse what would be cut */
        if (memchr(p, 0, n)) BAD("'stop' strings cannot hold a NUL character (\\u0000)");
        g->stop[g->n_stop++] = dup_n(p, n);
    }
    return 0;
}

static int f_stop_ids(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    if (val->type == MSGPACK_OBJECT_ARRAY && val->via.array.size > LI_REQ_MAX_STOP_TOKEN_IDS)
        BAD("'stop_token_ids' holds more than %d ids (at most %d)", LI_REQ_MAX_STOP_TOKEN_IDS, LI_REQ_MAX_STOP_TOKEN_IDS);
    size_t n = 0;
    int rc = li_request_parse_tokens(val, "stop_token_ids", &g->stop_token_ids, &n, err);
    g->n_stop_token_ids = (int)n;
    return rc;
}

static int cmp_bias_id(const void *a, const void *b) {
    const li_logit_bias *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* OpenAI's logit_bias: {token id: bias}; JSON gives the ids as strings of
 * digits, msgpack (and Lua) may give integers. */
static int f_logit_bias(parse_state *st, const char *name, const msgpack_object *o, li_gen_params *g, li_error *err) {
    if (o->type != MSGPACK_OBJECT_MAP) BAD("'logit_bias' must be a table (a map) of token id to bias");
    const uint32_t n = o->via.map.size;
    if (n > LI_LOGIT_BIAS_MAX) BAD("'logit_bias' holds more than %d entries", LI_LOGIT_BIAS_MAX);
    free(g->logit_bias);
    g->logit_bias = li_xmalloc(((size_t)n + 1) * sizeof *g->logit_bias);
    g->sp.logit_bias = g->logit_bias;
    g->sp.n_logit_bias = 0;
    const int32_t nv = st->o->n_vocab > 0 ? st->o->n_vocab : INT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *val = &o->via.map.ptr[i].val;
        int64_t id = -1;
        const char *p;
        size_t len;
        if (as_bytes(k, &p, &len)) {
            if (len == 0 || len > 10) BAD("'logit_bias' keys must be token ids");
            id = 0;
            for (size_t j = 0; j < len; j++) {
                if (p[j] < '0' || p[j] > '9') BAD("'logit_bias' keys must be token ids (key '%.*s' is not a token id)", (int)len, p);
                id = id * 10 + (p[j] - '0');
            }
        } else if (!as_int(k, &id) || id < 0) {
            BAD("'logit_bias' keys must be token ids");
        }
        if (id >= nv) BAD("'logit_bias': token %lld is outside the vocabulary [0, %d)", (long long)id, nv);
        double b;
        if (!as_num(val, &b) || !(b >= -LI_LOGIT_BIAS_RANGE && b <= LI_LOGIT_BIAS_RANGE))
            BAD("'logit_bias': the bias of token %lld must be a number in [-100, 100]", (long long)id);
        g->logit_bias[i] = (li_logit_bias){(int32_t)id, (float)b};
        g->sp.n_logit_bias = (int32_t)i + 1;
    }
    /* one entry per id: a map repeating a key is a client bug, not a sum */
    li_logit_bias *sorted = li_xmalloc(((size_t)n + 1) * sizeof *sorted);
    memcpy(sorted, g->logit_bias, (size_t)n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_bias_id);
    for (uint32_t i = 1; i < n; i++)
        if (sorted[i].id == sorted[i - 1].id) {
            const int32_t dup = sorted[i].id;
            free(sorted);
            BAD("'logit_bias': token %d given twice", dup);
        }
    free(sorted);
    return 0;
}

/* logprobs: false = off, true = the chosen token's alone, k = and the top k */
static int f_logprobs(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    if (val->type == MSGPACK_OBJECT_BOOLEAN) {
        st->logprobs_bool = true;
        g->logprobs = val->via.boolean ? 0 : -1;
        return 0;
    }
    int64_t v;
    if (!as_int(val, &v) || v < 0 || v > 20) BAD("'logprobs' must be an integer in [0, 20]");
    g->logprobs = (int32_t)v;
    return 0;
}

/* OpenAI chat: logprobs = true, top_logprobs = k */
static int f_top_logprobs(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g,
                          li_error *err) {
    int64_t v;
    if (!as_int(val, &v) || v < 0 || v > 20) BAD("'top_logprobs' must be an integer in [0, 20]");
    st->top_logprobs = v;
    return 0;
}

static int f_stream(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    if (val->type != MSGPACK_OBJECT_BOOLEAN) BAD("'stream' must be true or false");
    if (val->via.boolean && st->o->no_stream) BAD("'stream' is not available here (engine:add has no stream)");
    g->stream = val->via.boolean;
    return 0;
}

/* one model per server: any name is accepted */
static int f_model(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g, li_error *err) {
    return 0;
}

/* speculation = {method = "ngram" | "draft" | "layerskip" | "medusa" | "eagle", k = 0..16}
 * (k 0: off; method defaults to ngram), or false: off. The engine checks
 * that the method is available; a policy's speculate hook has the last word. */
static int f_speculation(parse_state *st, const char *name, const msgpack_object *val, li_gen_params *g,
                         li_error *err) {
    (void)st;
    (void)name;
    g->spec_set = true;
    g->spec_method = LI_SPEC_NGRAM;
    g->spec_k = 0;
    if (val->type == MSGPACK_OBJECT_BOOLEAN && !val->via.boolean) return 0;
    if (val->type != MSGPACK_OBJECT_MAP) BAD("'speculation' must be a map {method, k} or false");
    for (uint32_t i = 0; i < val->via.map.size; i++) {
        const msgpack_object *k = &val->via.map.ptr[i].key, *v = &val->via.map.ptr[i].val;
        const char *kp, *vp;
        size_t kn, vn;
        if (!as_bytes(k, &kp, &kn)) BAD("'speculation' keys must be strings");
        if (kn == 6 && !memcmp(kp, "method", 6)) {
            char m[32];
            if (!as_bytes(v, &vp, &vn) || vn >= sizeof m) BAD("'speculation.method' must be ngram, draft, layerskip, medusa or eagle");
            memcpy(m, vp, vn);
            m[vn] = 0;
            li_error e2 = {0};
            if (li_spec_method_parse(m, "speculation.method", &g->spec_method, &e2)) BAD("%s", e2.msg);
        } else if (kn == 1 && kp[0] == 'k') {
            int64_t x;
            if (!as_int(v, &x) || x < 0 || x > LI_SPEC_MAX_TOKENS)
                BAD("'speculation.k' must be an integer in [0, %d]", LI_SPEC_MAX_TOKENS);
            g->spec_k = (int32_t)x;
        } else {
            BAD("unknown key '%.*s' in 'speculation' (method, k)", (int)LI_MIN(kn, 64), kp);
        }
    }
    return 0;
}

/* ============================================================================
 * the parser
 * ========================================================================== */

static int parse(const msgpack_object *params, const li_req_opts *o, li_gen_params *g, li_error *err) {
    set_defaults(g, o);
    parse_state st = {.o = o, .top_logprobs = -1};
    const bool openai = o->profile != LI_REQ_LUAINFER;
    int64_t best_of = 1;
    if (!params || params->type != MSGPACK_OBJECT_MAP) BAD("want a map of parameters");
    if (params->via.map.size > LI_REQ_MAX_PARAMS) BAD("more than %d parameters", LI_REQ_MAX_PARAMS);
    for (uint32_t i = 0; i < params->via.map.size; i++) {
        const msgpack_object *key = &params->via.map.ptr[i].key, *val = &params->via.map.ptr[i].val;
        const char *k;
        size_t kn;
        if (!as_bytes(key, &k, &kn)) BAD("parameter names must be strings");
        /* msgpack maps and JSON objects may repeat a key; every field is
         * filled once (stop strings, messages, ... into fixed room) */
        for (uint32_t j = 0; j < i; j++) {
            const char *k2;
            size_t kn2;
            if (as_bytes(&params->via.map.ptr[j].key, &k2, &kn2) && kn2 == kn && !memcmp(k, k2, kn))
                BAD("parameter '%.*s' given twice", (int)LI_MIN(kn, (size_t)32), k);
        }
        char name[40];
        if (kn >= sizeof name) {
            if (openai) continue;
            BAD("unknown parameter '%.*s...'", 32, k);
        }
        memcpy(name, k, kn);
        name[kn] = 0;
        if (memchr(k, 0, kn)) BAD("parameter names must not contain NUL");
        const field *f = find_field(name);
        if (!f) {
            if (!openai) BAD("unknown parameter '%s'", name);
            int rc = openai_unserved(name, val, &best_of, err); /* the rest: fields OpenAI clients send */
            if (rc) return rc;
            continue;
        }
        if (val->type == MSGPACK_OBJECT_NIL && f->fn != f_prompt && f->fn != f_messages && f->fn != f_tokens)
            continue; /* null = the default */
        int rc = f->type == T_SPECIAL ? f->fn(&st, name, val, g, err) : parse_plain(f, name, val, g, err);
        if (rc) return rc;
    }
    if (best_of > g->n)
        BAD("'best_of' (%lld) more than 'n' (%d) is not supported: every sample drawn is returned",
            (long long)best_of, g->n);
    if (st.logprobs_bool && g->logprobs >= 0 && st.top_logprobs > 0) g->logprobs = (int32_t)st.top_logprobs;
    int given = (g->prompt != NULL) + (g->msgs != NULL) + (g->tokens != NULL);
    if (o->profile == LI_REQ_OPENAI_CHAT && !g->msgs) BAD("'messages' is required");
    if (given == 0) BAD("one of 'prompt', 'messages' or 'tokens' is required");
    if (given > 1) BAD("give only one of 'prompt', 'messages' and 'tokens'");
    if (g->prompt && g->prompt_len == 0) BAD("'prompt' is empty");
    if (g->tokens && g->n_tokens == 0) BAD("'tokens' is empty");
    if (o->n_vocab > 0) {
        for (size_t i = 0; g->tokens && i < g->n_tokens; i++)
            if (g->tokens[i] >= o->n_vocab) BAD("token %d is outside the vocabulary [0, %d)", g->tokens[i], o->n_vocab);
        for (int i = 0; i < g->n_stop_token_ids; i++)
            if (g->stop_token_ids[i] >= o->n_vocab)
                BAD("'stop_token_ids': token %d is outside the vocabulary [0, %d)", g->stop_token_ids[i], o->n_vocab);
    }
    if (g->max_tokens >= 0 && g->min_tokens > g->max_tokens)
        BAD("'min_tokens' (%lld) is more than 'max_tokens' (%lld)", (long long)g->min_tokens, (long long)g->max_tokens);
    if (!st.have_seed) g->sp.seed = random_seed();
    li_sampling_params sp = g->sp;
    sp.n_logprobs = g->logprobs > 0 ? g->logprobs : 0;
    li_error verr = {0};
    if (li_sampling_params_validate(&sp, &verr)) BAD("%s", verr.msg);
    return 0;
}

int li_request_parse(const msgpack_object *params, const li_req_opts *o, li_gen_params *g, li_error *err) {
    int rc = parse(params, o, g, err);
    if (rc) li_gen_params_free(g);
    return rc;
}

void li_gen_params_free(li_gen_params *g) {
    free(g->prompt);
    for (int i = 0; i < g->n_msgs; i++) {
        free((char *)g->msgs[i].role);
        free((char *)g->msgs[i].content);
    }
    free(g->msgs);
    free(g->tokens);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->tenant);
    free(g->cache_salt);
    free(g->logit_bias);
    free(g->stop_token_ids);
    memset(g, 0, sizeof *g);
}

void li_gen_params_to_request(const li_gen_params *g, const int32_t *prompt, int64_t n_prompt,
                              li_request_params *p) {
    *p = (li_request_params){
        .prompt = prompt, .n_prompt = n_prompt, .sampling = g->sp, .max_tokens = g->max_tokens, .n = g->n,
        .stop = (const char *const *)g->stop, .n_stop = g->n_stop, .ignore_eos = g->ignore_eos,
        .stop_token_ids = g->stop_token_ids, .n_stop_token_ids = g->n_stop_token_ids, .min_tokens = g->min_tokens,
        .priority = g->priority, .tenant = g->tenant, .cache_salt = g->cache_salt,
        .spec_set = g->spec_set, .spec_method = g->spec_method, .spec_k = g->spec_k,
        .slo_ttft_ms = g->slo_ttft_ms, .slo_tpot_ms = g->slo_tpot_ms,
    };
    p->sampling.n_logprobs = g->logprobs > 0 ? g->logprobs : 0;
    p->sampling.logprob = g->logprobs >= 0;
}
