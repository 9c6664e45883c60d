/* lua_engine.c — the `luainfer` Lua module's C half: an engine object for
 * scripts (`luainfer run`), the REPL and tests.
 *
 *   local luainfer = require("luainfer")
 *   local e = luainfer.engine{ policy = "policies/default.lua", max_num_seqs = 8 }
 *   local id = e:add{ prompt = "Hello", max_tokens = 16, temperature = 0 }
 *   e:run()
 *   print(e:result(id).text)
 *
 * e:result(id) is {id, finished, finish_reason, text, tokens, prompt_tokens,
 * preemptions, cached_tokens, ttft, latency, finish_time}, plus, when the
 * request was added with `logprobs = k` (0..20; true = 0), `logprobs`: one
 * {token, logprob, top = {{id, logprob}, ...k}} per generated token, the
 * shape msgpack-RPC's generate returns. logprob is the chosen token's raw
 * log-softmax (before penalties and temperature); top lists the k likeliest.
 *
 * The engine runs on the calling thread; every call is synchronous. */
#include "lua/lua_engine.h"
#include "runtime/runtime.h"
#include "engine/engine.h"
#include "lua/lua_env.h"
#include "request/request.h"
#include "spec/ngram.h"
#include "runtime/policy_open.h"
#include "tokenizer/tokenizer.h"
#include "util/mp_read.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#define ENGINE_MT "luainfer.engine"

/* The logprobs of one request that asked for them: the engine reports
 * them only to its event callback, so they are kept here until release. */
typedef struct lp_rec {
    int64_t id;
    int32_t n_top;            /* alternatives per token */
    int64_t n, cap;           /* tokens recorded */
    int32_t *token;
    float *logprob;
    li_token_logprob *top;    /* (cap * n_top) */
} lp_rec;

typedef struct lua_engine {
    li_runtime rt;
    li_engine *eng;
    li_policy *policy;
    bool open;
    li_policy_kind kind; /* of the policies it opens: in process, or in a policy-host child */
    int32_t deadline_ms;
    lp_rec *lps;        /* requests added with logprobs */
    int32_t n_lps, cap_lps;
} lua_engine;

static lua_engine *check_engine(lua_State *L) {
    lua_engine *le = luaL_checkudata(L, 1, ENGINE_MT);
    if (!le->open) luaL_error(L, "engine is closed");
    return le;
}

/* ---- option readers: clear errors for wrong types ------------------------- */

static double opt_num(lua_State *L, int t, const char *k, double def) {
    lua_getfield(L, t, k);
    double v = def;
    if (!lua_isnil(L, -1)) {
        if (!lua_isnumber(L, -1)) luaL_error(L, "option '%s' must be a number, got %s", k, luaL_typename(L, -1));
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

static int64_t opt_int(lua_State *L, int t, const char *k, int64_t def, int64_t lo, int64_t hi) {
    double v = opt_num(L, t, k, (double)def);
    if (v != (double)(int64_t)v || v < (double)lo || v > (double)hi) {
        /* lua_pushfstring knows no %lld / %g: format here */
        char msg[160];
        snprintf(msg, sizeof msg, "option '%s' must be an integer in [%lld, %lld], got %.17g", k, (long long)lo,
                 (long long)hi, v);
        luaL_error(L, "%s", msg);
    }
    return (int64_t)v;
}

static const char *opt_str(lua_State *L, int t, const char *k, const char *def) {
    lua_getfield(L, t, k);
    const char *v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "option '%s' must be a string, got %s", k, luaL_typename(L, -1));
        v = lua_tostring(L, -1);
    }
    lua_pop(L, 1); /* strings stay alive: the caller's table holds them */
    return v;
}

static bool opt_bool(lua_State *L, int t, const char *k, bool def) {
    lua_getfield(L, t, k);
    bool v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* ---- logprobs ------------------------------------------------------------------ */

static lp_rec *lp_find(lua_engine *le, int64_t id) {
    for (int32_t i = 0; i < le->n_lps; i++)
        if (le->lps[i].id == id) return &le->lps[i];
    return NULL;
}

static lp_rec *lp_get(lua_engine *le, int64_t id, int32_t n_top) {
    lp_rec *r = lp_find(le, id);
    if (r) return r;
    if (le->n_lps == le->cap_lps) {
        le->cap_lps = le->cap_lps * 2 + 8;
        le->lps = li_xrealloc(le->lps, (size_t)le->cap_lps * sizeof *le->lps);
    }
    r = &le->lps[le->n_lps++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->n_top = n_top;
    return r;
}

static void lp_remove(lua_engine *le, int64_t id) {
    lp_rec *r = lp_find(le, id);
    if (!r) return;
    free(r->token);
    free(r->logprob);
    free(r->top);
    *r = le->lps[--le->n_lps];
}

/* The engine's callback for requests with logprobs (runs inside add/step). */
static void lp_on_event(void *ud, const li_event *ev) {
    if (ev->kind != LI_EVENT_TOKEN || ev->token < 0) return; /* < 0: a text flush */
    lua_engine *le = ud;
    lp_rec *r = lp_get(le, ev->id, ev->n_top);
    if (r->n == r->cap) {
        r->cap = r->cap * 2 + 16;
        r->token = li_xrealloc(r->token, (size_t)r->cap * sizeof *r->token);
        r->logprob = li_xrealloc(r->logprob, (size_t)r->cap * sizeof *r->logprob);
        if (r->n_top) r->top = li_xrealloc(r->top, (size_t)(r->cap * r->n_top) * sizeof *r->top);
    }
    r->token[r->n] = ev->token;
    r->logprob[r->n] = ev->logprob;
    int32_t k = LI_MIN(ev->n_top, r->n_top);
    if (k > 0 && ev->top) memcpy(r->top + r->n * r->n_top, ev->top, (size_t)k * sizeof *r->top);
    for (int32_t i = LI_MAX(k, 0); i < r->n_top; i++) r->top[r->n * r->n_top + i] = (li_token_logprob){-1, 0};
    r->n++;
}

/* Pushes {{token, logprob, top = {{id, logprob}...}}...}. */
static void lp_push(lua_State *L, const lp_rec *r) {
    lua_createtable(L, (int)r->n, 0);
    for (int64_t i = 0; i < r->n; i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, r->token[i]);
        lua_setfield(L, -2, "token");
        lua_pushnumber(L, r->logprob[i]);
        lua_setfield(L, -2, "logprob");
        lua_createtable(L, r->n_top, 0);
        for (int32_t k = 0; k < r->n_top; k++) {
            const li_token_logprob *t = &r->top[i * r->n_top + k];
            lua_createtable(L, 2, 0);
            lua_pushinteger(L, t->id);
            lua_rawseti(L, -2, 1);
            lua_pushnumber(L, t->logprob);
            lua_rawseti(L, -2, 2);
            lua_rawseti(L, -2, k + 1);
        }
        lua_setfield(L, -2, "top");
        lua_rawseti(L, -2, (int)i + 1);
    }
}

/* ---- engine lifecycle --------------------------------------------------------- */

static int install_policy(lua_State *L, lua_engine *le, const char *path, const char *source) {
    li_error err = {0};
    li_policy *p = NULL;
    if (le->kind == LI_POLICY_PROCESS && !path)
        return luaL_error(L, "policy_isolation = 'process' needs a policy file path");
    li_policy_open_opts po = {.kind = le->kind, .path = path, .source = source, .deadline_ms = le->deadline_ms};
    if (li_policy_open(&p, &po, &err) != 0) return luaL_error(L, "%s", err.msg);
    if (le->policy) le->policy->ops->free(le->policy);
    le->policy = p;
    li_engine_set_policy(le->eng, p);
    return 0;
}

/* Raises on a string key of table t not in known (NULL-ended): a typo such
 * as max_token would otherwise be ignored without a word. */
static void check_keys(lua_State *L, int t, const char *what, const char *const *known) {
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) continue;
        const char *k = lua_tostring(L, -1);
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) luaL_error(L, "%s: unknown option '%s'", what, k);
    }
}

static int l_engine_new(lua_State *L) {
    if (lua_isnoneornil(L, 1)) lua_newtable(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const known[] = {"model", "isa", "policy", "policy_source", "policy_isolation",
                                        "policy_deadline_ms", "kv_dtype", "kv_memory", "block_size", "max_num_seqs",
                                        "max_batched_tokens", "max_model_len", "prefix_caching", "threads",
                                        "spec_tokens", "spec_ngram_max", "spec_ngram_min", "spec_disable_batch",
                                        "draft_model", "spec_method", "spec_layers", "tensor_parallel", "q4_act", "medusa",
                                        "medusa_tree", "device", "eagle", "eagle_idle_steps", "eagle_lazy", "spec_calibrate",
                                        "device_sampling", NULL};
    check_keys(L, 1, "luainfer.engine", known);
    li_engine_config cfg;
    li_engine_config_default(&cfg);
    const char *model = opt_str(L, 1, "model", NULL);
    const char *draft = opt_str(L, 1, "draft_model", NULL);
    const char *medusa = opt_str(L, 1, "medusa", NULL);
    const char *medusa_tree = opt_str(L, 1, "medusa_tree", NULL);
    const char *eagle = opt_str(L, 1, "eagle", NULL);
    const char *isa = opt_str(L, 1, "isa", "auto");
    const char *device = opt_str(L, 1, "device", NULL); /* cpu or cuda */
    const char *q4_act = opt_str(L, 1, "q4_act", NULL);
    const char *policy = opt_str(L, 1, "policy", NULL);
    const char *policy_source = opt_str(L, 1, "policy_source", NULL);
    const char *kv_dtype = opt_str(L, 1, "kv_dtype", "f16");
    const char *isolation = opt_str(L, 1, "policy_isolation", "inprocess");
    int64_t deadline_ms = opt_int(L, 1, "policy_deadline_ms", 50, 1, 60000);
    li_policy_kind kind;
    li_error err = {0};
    if (li_policy_isolation_parse(isolation, "option 'policy_isolation'", &kind, &err)) return luaL_error(L, "%s", err.msg);
    int64_t threads = opt_int(L, 1, "threads", 0, 0, 1024);
    cfg.block_size = (int32_t)opt_int(L, 1, "block_size", cfg.block_size, 1, 1024);
    cfg.max_num_seqs = (int32_t)opt_int(L, 1, "max_num_seqs", cfg.max_num_seqs, 1, 4096);
    cfg.max_batched_tokens = (int32_t)opt_int(L, 1, "max_batched_tokens", cfg.max_batched_tokens, 1, 65536);
    cfg.kv_memory = (size_t)opt_int(L, 1, "kv_memory", (int64_t)cfg.kv_memory, 1, (int64_t)1 << 40);
    cfg.max_model_len = opt_int(L, 1, "max_model_len", 0, 0, 1 << 24);
    cfg.prefix_caching = opt_bool(L, 1, "prefix_caching", cfg.prefix_caching);
    cfg.spec_tokens = (int32_t)opt_int(L, 1, "spec_tokens", 0, 0, LI_SPEC_MAX_TOKENS);
    cfg.spec_ngram_max = (int32_t)opt_int(L, 1, "spec_ngram_max", cfg.spec_ngram_max, 1, 64);
    cfg.spec_ngram_min = (int32_t)opt_int(L, 1, "spec_ngram_min", cfg.spec_ngram_min, 1, 64);
    cfg.spec_disable_batch = (int32_t)opt_int(L, 1, "spec_disable_batch", cfg.spec_disable_batch, 0, 1 << 20);
    cfg.eagle_idle_steps = (int32_t)opt_int(L, 1, "eagle_idle_steps", cfg.eagle_idle_steps, 0, 1 << 20);
    cfg.spec_calibrate = opt_bool(L, 1, "spec_calibrate", cfg.spec_calibrate);
    cfg.eagle_lazy = opt_bool(L, 1, "eagle_lazy", cfg.eagle_lazy);
    cfg.device_sampling = opt_bool(L, 1, "device_sampling", cfg.device_sampling);
    if (li_kv_dtype_parse(kv_dtype, &cfg.kv_dtype, &err)) return luaL_error(L, "%s", err.msg);
    const char *spec_method = opt_str(L, 1, "spec_method", NULL);
    const int64_t spec_layers = opt_int(L, 1, "spec_layers", 0, 0, 4096);
    cfg.tensor_parallel = (int32_t)opt_int(L, 1, "tensor_parallel", 1, 1, 64);

    lua_engine *le = lua_newuserdata(L, sizeof *le);
    memset(le, 0, sizeof *le);
    luaL_getmetatable(L, ENGINE_MT);
    lua_setmetatable(L, -2);
    if (li_runtime_open_device(&le->rt, model, threads, isa, device, "device", &err)) return luaL_error(L, "%s", err.msg);
    if ((draft && li_runtime_open_draft(&le->rt, draft, &err)) ||
        (medusa && li_runtime_open_medusa(&le->rt, medusa, medusa_tree, &err)) ||
        (!medusa && medusa_tree && li_error_set(&err, LI_EINVAL, "luainfer.engine: medusa_tree needs medusa")) ||
        (eagle && li_runtime_open_eagle(&le->rt, eagle, &err)) ||
        li_runtime_set_q4_act(&le->rt, q4_act, "q4_act", &err) ||
        li_runtime_spec_config(&cfg, &le->rt, spec_method, cfg.spec_tokens, spec_layers, "spec_", &err)) {
        li_runtime_close(&le->rt);
        return luaL_error(L, "%s", err.msg);
    }
    le->open = true;
    le->kind = kind;
    le->deadline_ms = (int32_t)deadline_ms;
    if (li_engine_init_runners(&le->eng, le->rt.model, le->rt.draft, &le->rt.be, &cfg, &err)) {
        li_runtime_close(&le->rt);
        le->open = false;
        return luaL_error(L, "%s", err.msg);
    }
    if (policy || policy_source) install_policy(L, le, policy, policy_source);
    return 1;
}

static void engine_close(lua_engine *le) {
    if (!le->open) return;
    li_engine_free(le->eng);
    while (le->n_lps > 0) lp_remove(le, le->lps[0].id);
    free(le->lps);
    le->lps = NULL;
    le->cap_lps = 0;
    if (le->policy) le->policy->ops->free(le->policy);
    li_runtime_close(&le->rt);
    le->open = false;
}

static int l_engine_gc(lua_State *L) {
    engine_close(luaL_checkudata(L, 1, ENGINE_MT));
    return 0;
}

static int l_engine_close(lua_State *L) {
    engine_close(luaL_checkudata(L, 1, ENGINE_MT));
    return 0;
}

/* ---- requests ---------------------------------------------------------------------- */

/* engine:add{...} reads its table with the server's request parser
 * (request/request.h): the table is packed as msgpack and parsed like a
 * msgpack-RPC `generate`, so every field has the same name, default and
 * range on all three paths, and a bad value fails with the same message. */

/* Packs the Lua value at idx. Never raises (the caller frees the buffer
 * whatever happens); as_map forces a table to a map (logit_bias: {[1] = 5}
 * is not the list {5}). */
static int pack_lua(lua_State *L, int idx, msgpack_packer *pk, int depth, bool as_map, li_error *err) {
    if (depth > LI_MP_MAX_DEPTH) return li_error_set(err, LI_EINVAL, "invalid params: tables nest deeper than %d (a cycle?)", LI_MP_MAX_DEPTH);
    if (!lua_checkstack(L, 4)) return li_error_set(err, LI_ENOMEM, "invalid params: tables nest too deep");
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    switch (lua_type(L, idx)) {
    case LUA_TNIL: msgpack_pack_nil(pk); return 0;
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, idx)) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
        return 0;
    case LUA_TNUMBER: {
        const double v = lua_tonumber(L, idx);
        if (v == floor(v) && v >= -9.2e18 && v <= 9.2e18) msgpack_pack_int64(pk, (int64_t)v);
        else msgpack_pack_double(pk, v);
        return 0;
    }
    case LUA_TSTRING: {
        size_t n;
        const char *str = lua_tolstring(L, idx, &n);
        msgpack_pack_str(pk, n);
        msgpack_pack_str_body(pk, str, n);
        return 0;
    }
    case LUA_TTABLE: {
        size_t len = lua_objlen(L, idx), count = 0;
        for (lua_pushnil(L); lua_next(L, idx); lua_pop(L, 1)) count++;
        if (!as_map && count == len) { /* a sequence (or empty) */
            msgpack_pack_array(pk, len);
            for (size_t i = 1; i <= len; i++) {
                lua_rawgeti(L, idx, (int)i);
                int rc = pack_lua(L, -1, pk, depth + 1, false, err);
                lua_pop(L, 1);
                if (rc) return rc;
            }
            return 0;
        }
        msgpack_pack_map(pk, count);
        for (lua_pushnil(L); lua_next(L, idx); lua_pop(L, 1)) {
            /* at the top, logit_bias's table is a map whatever its keys */
            const bool map_val = depth == 0 && lua_type(L, -2) == LUA_TSTRING && !strcmp(lua_tostring(L, -2), "logit_bias");
            int rc = pack_lua(L, -2, pk, depth + 1, false, err);
            if (!rc) rc = pack_lua(L, -1, pk, depth + 1, map_val, err);
            if (rc) {
                lua_pop(L, 2);
                return rc;
            }
        }
        return 0;
    }
    default:
        return li_error_set(err, LI_EINVAL, "invalid params: a %s is no parameter value", luaL_typename(L, idx));
    }
}

int li_lua_request_parse(lua_State *L, int idx, int32_t n_vocab, li_gen_params *g, li_error *err) {
    memset(g, 0, sizeof *g); /* nothing owned if the packing fails */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = pack_lua(L, idx, &pk, 0, false, err);
    size_t off = 0;
    if (!rc && msgpack_unpack_next(&u, sb.data, sb.size, &off) != MSGPACK_UNPACK_SUCCESS)
        rc = li_error_set(err, LI_EINVAL, "invalid params: the request table cannot be read");
    const li_req_opts o = {.profile = LI_REQ_LUAINFER, .n_vocab = n_vocab, .no_stream = true};
    if (!rc) rc = li_request_parse(&u.data, &o, g, err);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* The prompt's token ids: tokens as given, prompt tokenized, or messages
 * through the model's chat template first (as the server does). */
static int prompt_tokens(lua_State *L, lua_engine *le, const li_gen_params *g, int32_t **toks, size_t *n,
                         li_error *err) {
    if (g->tokens) {
        *toks = li_xmalloc((g->n_tokens ? g->n_tokens : 1) * sizeof **toks);
        memcpy(*toks, g->tokens, g->n_tokens * sizeof **toks);
        *n = g->n_tokens;
        return 0;
    }
    char *chat = NULL;
    const char *text = g->prompt;
    size_t len = g->prompt_len;
    if (g->msgs) {
        int rc = li_chat_format(L, le->rt.model->chat_template, g->msgs, g->n_msgs, true, &chat, err);
        if (rc) return rc;
        text = chat;
        len = strlen(chat);
    }
    int rc = li_tokenizer_encode(le->rt.model->tok, text, len, true, true, toks, n, err);
    free(chat);
    return rc;
}

static int l_engine_add(lua_State *L) {
    lua_engine *le = check_engine(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    li_gen_params g;
    li_error err = {0};
    if (li_lua_request_parse(L, 2, le->rt.model->hp.n_vocab, &g, &err)) return luaL_error(L, "%s", err.msg);
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = prompt_tokens(L, le, &g, &toks, &n, &err);
    int64_t id = -1;
    li_request_params p;
    if (!rc) {
        li_gen_params_to_request(&g, toks, (int64_t)n, &p);
        if (p.sampling.logprob) {
            p.on_event = lp_on_event;
            p.ud = le;
        }
        rc = li_engine_add(le->eng, &p, &id, &err);
    }
    const bool want_lp = g.logprobs >= 0;
    const int32_t n_top = g.logprobs > 0 ? g.logprobs : 0, n_samples = g.n;
    free(toks);
    li_gen_params_free(&g);
    if (rc) return luaL_error(L, "%s", err.msg);
    /* a record per sample, so that a request with no tokens still reports {} */
    for (int32_t i = 0; want_lp && i < LI_MAX(n_samples, 1); i++) lp_get(le, id + i, n_top);
    lua_pushnumber(L, (lua_Number)id);
    return 1;
}

static int l_engine_step(lua_State *L) {
    lua_engine *le = check_engine(L);
    li_error err = {0};
    if (li_engine_step(le->eng, &err)) return luaL_error(L, "%s", err.msg);
    lua_pushboolean(L, li_engine_has_work(le->eng));
    return 1;
}

static int l_engine_run(lua_State *L) {
    lua_engine *le = check_engine(L);
    int64_t max_steps = luaL_optinteger(L, 2, 0), steps = 0;
    li_error err = {0};
    while (li_engine_has_work(le->eng) && (max_steps <= 0 || steps < max_steps)) {
        if (li_engine_step(le->eng, &err)) return luaL_error(L, "%s", err.msg);
        steps++;
    }
    lua_pushnumber(L, (lua_Number)steps);
    return 1;
}

static int l_engine_has_work(lua_State *L) {
    lua_pushboolean(L, li_engine_has_work(check_engine(L)->eng));
    return 1;
}

static int l_engine_result(lua_State *L) {
    lua_engine *le = check_engine(L);
    const li_request_result *r = li_engine_result(le->eng, (int64_t)luaL_checknumber(L, 2));
    if (!r) {
        lua_pushnil(L);
        return 1;
    }
    lua_createtable(L, 0, 10);
    lua_pushnumber(L, (lua_Number)r->id);
    lua_setfield(L, -2, "id");
    lua_pushboolean(L, r->finished);
    lua_setfield(L, -2, "finished");
    if (r->finish_reason) {
        lua_pushstring(L, r->finish_reason);
        lua_setfield(L, -2, "finish_reason");
    }
    lua_pushlstring(L, r->text, r->text_len);
    lua_setfield(L, -2, "text");
    lua_createtable(L, (int)r->n_tokens, 0);
    for (int64_t i = 0; i < r->n_tokens; i++) {
        lua_pushinteger(L, r->tokens[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "tokens");
    lua_pushnumber(L, (lua_Number)r->n_prompt);
    lua_setfield(L, -2, "prompt_tokens");
    lua_pushnumber(L, r->n_preemptions);
    lua_setfield(L, -2, "preemptions");
    lua_pushnumber(L, (lua_Number)r->cached_tokens);
    lua_setfield(L, -2, "cached_tokens");
    if (r->t_first_token >= 0) {
        lua_pushnumber(L, r->t_first_token - r->t_arrival);
        lua_setfield(L, -2, "ttft");
    }
    if (r->t_first_scheduled >= 0) { /* queueing delay: arrival to the first step that computed it */
        lua_pushnumber(L, r->t_first_scheduled - r->t_arrival);
        lua_setfield(L, -2, "queue_delay");
    }
    /* the engine-clock stamps themselves (a replay measures from the trace's arrivals) */
    lua_pushnumber(L, r->t_arrival);
    lua_setfield(L, -2, "arrival_time");
    if (r->t_first_token >= 0) {
        lua_pushnumber(L, r->t_first_token);
        lua_setfield(L, -2, "first_token_time");
    }
    if (r->t_first_scheduled >= 0) {
        lua_pushnumber(L, r->t_first_scheduled);
        lua_setfield(L, -2, "first_scheduled_time");
    }
    if (r->finished) {
        lua_pushnumber(L, r->t_finish - r->t_arrival);
        lua_setfield(L, -2, "latency");
        lua_pushnumber(L, r->t_finish);
        lua_setfield(L, -2, "finish_time");
    }
    const lp_rec *lp = lp_find(le, r->id);
    if (lp) {
        lp_push(L, lp);
        lua_setfield(L, -2, "logprobs");
    }
    return 1;
}

static int l_engine_release(lua_State *L) {
    lua_engine *le = check_engine(L);
    int64_t id = (int64_t)luaL_checknumber(L, 2);
    li_engine_release(le->eng, id);
    lp_remove(le, id);
    return 0;
}

static int l_engine_cancel(lua_State *L) {
    lua_pushboolean(L, li_engine_cancel(check_engine(L)->eng, (int64_t)luaL_checknumber(L, 2)) == 0);
    return 1;
}

#define SET_NUM(name, v)            \
    do {                            \
        lua_pushnumber(L, (lua_Number)(v)); \
        lua_setfield(L, -2, name);  \
    } while (0)

static int l_engine_stats(lua_State *L) {
    lua_engine *le = check_engine(L);
    li_engine_stats s;
    li_engine_stats_get(le->eng, &s);
    lua_createtable(L, 0, 24);
    SET_NUM("steps", s.steps);
    SET_NUM("tokens_computed", s.tokens_computed);
    SET_NUM("tokens_device_sampled", s.tokens_device_sampled);
    SET_NUM("tokens_device_undecided", s.tokens_device_undecided);
    SET_NUM("tokens_generated", s.tokens_generated);
    SET_NUM("preemptions", s.preemptions);
    SET_NUM("policy_errors", s.policy_errors);
    SET_NUM("plans_trimmed", s.plans_trimmed);
    SET_NUM("fallback_steps", s.fallback_steps);
    SET_NUM("livelock_steps", s.livelock_steps);
    SET_NUM("requests_finished", s.requests_finished);
    SET_NUM("requests_rejected", s.requests_rejected);
    SET_NUM("waiting", s.n_waiting);
    SET_NUM("running", s.n_running);
    SET_NUM("preempted", s.n_preempted);
    SET_NUM("kv_free_blocks", s.kv_free_blocks);
    SET_NUM("kv_total_blocks", s.kv_total_blocks);
    SET_NUM("block_size", s.block_size);
    SET_NUM("kv_bytes", s.kv_bytes);
    SET_NUM("kv_bytes_per_token", s.kv_bytes_per_token);
    SET_NUM("kv_draft_bytes", s.kv_draft_bytes);
    SET_NUM("prefix_query_tokens", s.prefix_query_tokens);
    SET_NUM("prefix_hit_tokens", s.prefix_hit_tokens);
    SET_NUM("prefix_hit_rate", s.prefix_query_tokens ? (double)s.prefix_hit_tokens / (double)s.prefix_query_tokens : 0.0);
    SET_NUM("prefix_evictions", s.prefix_evictions);
    SET_NUM("kv_cached_blocks", s.kv_cached_blocks);
    SET_NUM("spec_drafted", s.spec_drafted);
    SET_NUM("spec_accepted", s.spec_accepted);
    SET_NUM("time_policy", s.time_policy);
    SET_NUM("time_forward", s.time_forward);
    SET_NUM("time_total", s.time_total);
    SET_NUM("time_propose", s.time_propose);
    SET_NUM("draft_sync_tokens", s.draft_sync_tokens);
    SET_NUM("draft_sync_dropped", s.draft_sync_dropped);
    SET_NUM("time_draft_sync", s.time_draft_sync);
    SET_NUM("time_calibrate", s.time_calibrate);
    SET_NUM("time_verify", s.time_verify);
    SET_NUM("calibrated_rows", s.calibrated_rows);
    SET_NUM("tensor_parallel", s.tensor_parallel);
    SET_NUM("time_allreduce", s.time_allreduce);
    /* spec_by = { ngram = {drafted, accepted, rounds}, draft = ..., layerskip = ... } */
    lua_createtable(L, 0, LI_SPEC_N_METHODS);
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
        lua_createtable(L, 0, 3);
        SET_NUM("drafted", s.spec_drafted_by[m]);
        SET_NUM("accepted", s.spec_accepted_by[m]);
        SET_NUM("rounds", s.spec_rounds_by[m]);
        lua_setfield(L, -2, li_spec_method_name(m));
    }
    lua_setfield(L, -2, "spec_by");
    return 1;
}

static int l_engine_tokenize(lua_State *L) {
    lua_engine *le = check_engine(L);
    size_t len;
    const char *s = luaL_checklstring(L, 2, &len);
    bool special = lua_isnoneornil(L, 3) ? true : lua_toboolean(L, 3);
    int32_t *ids;
    size_t n;
    li_error err = {0};
    if (li_tokenizer_encode(le->rt.model->tok, s, len, special, special, &ids, &n, &err))
        return luaL_error(L, "%s", err.msg);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    free(ids);
    return 1;
}

static int l_engine_detokenize(lua_State *L) {
    lua_engine *le = check_engine(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    char piece[256];
    int n = (int)lua_objlen(L, 2);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        int32_t id = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
        int k = li_tokenizer_token_to_piece(le->rt.model->tok, id, true, piece, sizeof piece);
        if (k < 0) return luaL_error(L, "detokenize: token id %d is outside the vocabulary", id);
        luaL_addlstring(&b, piece, (size_t)LI_MIN(k, (int)sizeof piece));
    }
    luaL_pushresult(&b);
    return 1;
}

static int l_engine_set_policy(lua_State *L) {
    lua_engine *le = check_engine(L);
    if (lua_isnoneornil(L, 2)) {
        if (le->policy) le->policy->ops->free(le->policy);
        le->policy = NULL;
        li_engine_set_policy(le->eng, NULL);
        return 0;
    }
    const char *path = luaL_checkstring(L, 2);
    return install_policy(L, le, path, NULL);
}

/* Hot reload: path or source; the old policy stays on failure. */
static int l_engine_reload_policy(lua_State *L) {
    lua_engine *le = check_engine(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *path = opt_str(L, 2, "path", NULL), *source = opt_str(L, 2, "source", NULL);
    if (!le->policy) {
        install_policy(L, le, path, source); /* raises on failure */
        lua_pushboolean(L, 1);
        return 1;
    }
    li_error err = {0};
    if (le->policy->ops->reload(le->policy, path, source, &err) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int l_engine_info(lua_State *L) {
    lua_engine *le = check_engine(L);
    const li_hparams *hp = &le->rt.model->hp;
    const li_engine_config *c = li_engine_get_config(le->eng);
    lua_createtable(L, 0, 12);
    lua_pushstring(L, le->rt.model->path);
    lua_setfield(L, -2, "model");
    lua_pushstring(L, hp->arch);
    lua_setfield(L, -2, "architecture");
    SET_NUM("n_vocab", hp->n_vocab);
    SET_NUM("n_layer", hp->n_layer);
    SET_NUM("n_embd", hp->n_embd);
    SET_NUM("n_ctx_train", hp->n_ctx_train);
    SET_NUM("block_size", c->block_size);
    SET_NUM("max_num_seqs", c->max_num_seqs);
    SET_NUM("max_batched_tokens", c->max_batched_tokens);
    SET_NUM("max_model_len", c->max_model_len);
    lua_pushstring(L, li_kv_dtype_name(c->kv_dtype));
    lua_setfield(L, -2, "kv_dtype");
    lua_pushstring(L, le->policy ? le->policy->name : "builtin-fcfs");
    lua_setfield(L, -2, "policy");
    lua_pushstring(L, li_runtime_isa(&le->rt));
    lua_setfield(L, -2, "isa");
    SET_NUM("threads", le->rt.be.n_threads);
    const int32_t *eog = NULL; /* the end-of-generation ids: a reply ends on one unless ignore_eos */
    const int n_eog = li_tokenizer_eog_ids(le->rt.model->tok, &eog);
    lua_createtable(L, n_eog, 0);
    for (int i = 0; i < n_eog; i++) {
        lua_pushinteger(L, eog[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "eog_ids");
    if (le->rt.model->chat_template) { /* the GGUF's, for luainfer.chat.format */
        lua_pushstring(L, le->rt.model->chat_template);
        lua_setfield(L, -2, "chat_template");
    }
    return 1;
}

/* e:set_clock(nil | {a, b, c, d, policy_scale, start}): wall time, or the
 * model clock with that step cost (engine.h, li_step_cost) from `start`
 * seconds (default: the current time). */
static int l_engine_set_clock(lua_State *L) {
    lua_engine *le = check_engine(L);
    if (lua_isnoneornil(L, 2)) {
        li_engine_set_model_clock(le->eng, NULL, -1);
        return 0;
    }
    luaL_checktype(L, 2, LUA_TTABLE);
    li_step_cost c = {0};
    double *f[] = {&c.a, &c.b, &c.c, &c.d, &c.policy_scale};
    const char *names[] = {"a", "b", "c", "d", "policy_scale"};
    for (int i = 0; i < 5; i++) {
        lua_getfield(L, 2, names[i]);
        if (!lua_isnil(L, -1)) {
            if (!lua_isnumber(L, -1)) return luaL_error(L, "set_clock: '%s' must be a number", names[i]);
            *f[i] = lua_tonumber(L, -1);
            if (!(*f[i] >= 0) || *f[i] > 1e6) return luaL_error(L, "set_clock: '%s' must be in [0, 1e6]", names[i]);
        }
        lua_pop(L, 1);
    }
    lua_getfield(L, 2, "start");
    const double start = lua_isnil(L, -1) ? -1 : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    li_engine_set_model_clock(le->eng, &c, start);
    return 0;
}

/* e:advance_clock(t): the model clock moves forward to t (an idle wait). */
static int l_engine_advance_clock(lua_State *L) {
    lua_engine *le = check_engine(L);
    li_engine_clock_advance(le->eng, luaL_checknumber(L, 2));
    return 0;
}

static int l_engine_now(lua_State *L) {
    lua_pushnumber(L, li_engine_now(check_engine(L)->eng));
    return 1;
}

static const luaL_Reg engine_methods[] = {
    {"set_clock", l_engine_set_clock},
    {"advance_clock", l_engine_advance_clock},
    {"now", l_engine_now},
    {"add", l_engine_add},
    {"step", l_engine_step},
    {"run", l_engine_run},
    {"has_work", l_engine_has_work},
    {"result", l_engine_result},
    {"release", l_engine_release},
    {"cancel", l_engine_cancel},
    {"stats", l_engine_stats},
    {"info", l_engine_info},
    {"tokenize", l_engine_tokenize},
    {"detokenize", l_engine_detokenize},
    {"set_policy", l_engine_set_policy},
    {"reload_policy", l_engine_reload_policy},
    {"close", l_engine_close},
    {NULL, NULL},
};

/* luainfer.ngram_draft(tokens, n_max, n_min, k [, stop]): the drafts n-gram
 * lookup makes for a token list (li_spec_ngram_lookup, what the engine
 * drafts with), cut after the first of the ids in the table stop (as the
 * engine cuts a request's drafts after a token that would end it), and how
 * many last tokens the copied occurrence matches (a speculate hook's
 * req.speculation.ngram_match), for tools that replay speculation offline. */
static int l_ngram_draft(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    const lua_Integer nmax = luaL_checkinteger(L, 2), nmin = luaL_checkinteger(L, 3), k = luaL_checkinteger(L, 4);
    luaL_argcheck(L, nmin >= 1 && nmin <= nmax && nmax <= 64, 3, "want 1 <= n_min <= n_max <= 64");
    luaL_argcheck(L, k >= 0 && k <= 1024, 4, "want 0 <= k <= 1024");
    if (!lua_isnoneornil(L, 5)) luaL_checktype(L, 5, LUA_TTABLE);
    const size_t n = lua_objlen(L, 1);
    int32_t *toks = malloc((n ? n : 1) * sizeof *toks), out[1024];
    if (!toks) return luaL_error(L, "ngram_draft: out of memory");
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 1, (int)i + 1);
        if (!lua_isnumber(L, -1)) {
            free(toks);
            return luaL_error(L, "ngram_draft: token %d is not a number", (int)i + 1);
        }
        toks[i] = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    int32_t match;
    int32_t m = li_spec_ngram_lookup(toks, (int64_t)n, (int)nmax, (int)nmin, (int32_t)k, out, &match);
    free(toks);
    /* each stop id read once: the drafts end after the first that is one */
    const size_t ns = lua_isnoneornil(L, 5) ? 0 : lua_objlen(L, 5);
    for (size_t i = 0; i < ns; i++) {
        lua_rawgeti(L, 5, (int)i + 1);
        if (!lua_isnumber(L, -1)) return luaL_error(L, "ngram_draft: stop id %d is not a number", (int)i + 1);
        const lua_Integer id = lua_tointeger(L, -1);
        lua_pop(L, 1);
        for (int32_t j = 0; j + 1 < m; j++)
            if (out[j] == id) m = j + 1;
    }
    lua_createtable(L, m, 0);
    for (int32_t i = 0; i < m; i++) {
        lua_pushinteger(L, out[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushinteger(L, match);
    return 2;
}

int li_lua_open_core(lua_State *L) {
    if (luaL_newmetatable(L, ENGINE_MT)) {
        lua_newtable(L);
        luaL_register(L, NULL, engine_methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_engine_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushcfunction(L, l_engine_new);
    lua_setfield(L, -2, "engine");
    lua_pushcfunction(L, l_ngram_draft);
    lua_setfield(L, -2, "ngram_draft");
    lua_pushstring(L, li_model_default_path(NULL));
    lua_setfield(L, -2, "default_model");
    return 1;
}

void li_lua_preload(lua_State *L, const char *name, int (*open)(lua_State *L)) {
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, open);
    lua_setfield(L, -2, name);
    lua_pop(L, 2);
}

void li_lua_preload_core(lua_State *L) { li_lua_preload(L, "luainfer.core", li_lua_open_core); }
