/* test_request.c — one request parser for the three paths: the same
 * request as a msgpack map (msgpack-RPC), as a JSON body through
 * li_request_pack_json (HTTP) and as a Lua table through
 * li_lua_request_parse (engine:add) parses to the same li_gen_params, field
 * by field; the defaults are one set; and bad values are refused on every
 * path with the same message. No model needed. */
#include "lua/lua_engine.h"
#include "request/request.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <string.h>

#define N_VOCAB 1000

/* ---- the three paths ------------------------------------------------------ */

static int parse_mp(const msgpack_sbuffer *sb, li_req_profile prof, li_gen_params *g, li_error *err) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, sb->data, sb->size, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return li_error_set(err, LI_EINVAL, "test: bad msgpack");
    }
    li_req_opts o = {.profile = prof, .n_vocab = N_VOCAB};
    int rc = li_request_parse(&u.data, &o, g, err);
    msgpack_unpacked_destroy(&u);
    return rc;
}

static int parse_json(const char *json, li_req_profile prof, li_gen_params *g, li_error *err) {
    cJSON *j = cJSON_Parse(json);
    if (!j) return li_error_set(err, LI_EINVAL, "test: bad JSON %s", json);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    bool ok = li_request_pack_json(&pk, j, 32);
    cJSON_Delete(j);
    int rc = ok ? parse_mp(&sb, prof, g, err) : li_error_set(err, LI_EINVAL, "test: too deep");
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static int parse_lua(lua_State *L, const char *table, li_gen_params *g, li_error *err) {
    char chunk[4096];
    snprintf(chunk, sizeof chunk, "return %s", table);
    if (luaL_dostring(L, chunk)) {
        li_error_set(err, LI_EINVAL, "test: bad Lua %s: %s", table, lua_tostring(L, -1));
        lua_pop(L, 1);
        return LI_EINVAL;
    }
    int rc = li_lua_request_parse(L, -1, N_VOCAB, g, err);
    lua_pop(L, 1);
    return rc;
}

/* ---- comparison ------------------------------------------------------------ */

static bool same_str(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* Every field of a and b; seed too unless ignore_seed. Prints the first
 * difference. */
static bool gen_eq(const li_gen_params *a, const li_gen_params *b, bool ignore_seed, const char *what) {
#define DIFF(cond, name)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "%s: '%s' differs\n", what, name); \
            return false;                                 \
        }                                                 \
    } while (0)
    DIFF(same_str(a->prompt, b->prompt) && a->prompt_len == b->prompt_len, "prompt");
    DIFF(a->n_msgs == b->n_msgs, "messages");
    for (int i = 0; i < a->n_msgs; i++)
        DIFF(same_str(a->msgs[i].role, b->msgs[i].role) && same_str(a->msgs[i].content, b->msgs[i].content), "messages");
    DIFF(a->n_tokens == b->n_tokens && (!a->n_tokens || !memcmp(a->tokens, b->tokens, a->n_tokens * 4)), "tokens");
    DIFF(a->sp.temperature == b->sp.temperature, "temperature");
    DIFF(a->sp.top_k == b->sp.top_k, "top_k");
    DIFF(a->sp.top_p == b->sp.top_p, "top_p");
    DIFF(a->sp.min_p == b->sp.min_p, "min_p");
    DIFF(a->sp.repeat_penalty == b->sp.repeat_penalty, "repetition_penalty");
    DIFF(a->sp.presence_penalty == b->sp.presence_penalty, "presence_penalty");
    DIFF(a->sp.frequency_penalty == b->sp.frequency_penalty, "frequency_penalty");
    DIFF(a->sp.penalty_last_n == b->sp.penalty_last_n, "penalty_last_n");
    DIFF(ignore_seed || a->sp.seed == b->sp.seed, "seed");
    DIFF(a->sp.n_logit_bias == b->sp.n_logit_bias, "logit_bias");
    for (int i = 0; i < a->sp.n_logit_bias; i++) {
        bool found = false; /* map order may differ between encoders */
        for (int k = 0; k < b->sp.n_logit_bias; k++)
            found |= a->sp.logit_bias[i].id == b->sp.logit_bias[k].id && a->sp.logit_bias[i].bias == b->sp.logit_bias[k].bias;
        DIFF(found, "logit_bias");
    }
    DIFF(a->max_tokens == b->max_tokens, "max_tokens");
    DIFF(a->min_tokens == b->min_tokens, "min_tokens");
    DIFF(a->n == b->n, "n");
    DIFF(a->n_stop == b->n_stop, "stop");
    for (int i = 0; i < a->n_stop; i++) DIFF(same_str(a->stop[i], b->stop[i]), "stop");
    DIFF(a->n_stop_token_ids == b->n_stop_token_ids &&
             (!a->n_stop_token_ids || !memcmp(a->stop_token_ids, b->stop_token_ids, (size_t)a->n_stop_token_ids * 4)),
         "stop_token_ids");
    DIFF(a->stream == b->stream, "stream");
    DIFF(a->ignore_eos == b->ignore_eos, "ignore_eos");
    DIFF(a->logprobs == b->logprobs, "logprobs");
    DIFF(a->priority == b->priority, "priority");
    DIFF(same_str(a->tenant, b->tenant), "tenant");
    DIFF(same_str(a->cache_salt, b->cache_salt), "cache_salt");
    return true;
#undef DIFF
}

static void pk_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* ---- one full request, three ways ------------------------------------------- */

static void test_same_request(lua_State *L) {
    /* msgpack, the way a Python msgpack client packs it (integer bias keys) */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 21);
    pk_str(&pk, "prompt"), pk_str(&pk, "Once upon a time");
    pk_str(&pk, "max_tokens"), msgpack_pack_int(&pk, 7);
    pk_str(&pk, "temperature"), msgpack_pack_double(&pk, 0.5);
    pk_str(&pk, "top_p"), msgpack_pack_double(&pk, 0.9);
    pk_str(&pk, "top_k"), msgpack_pack_int(&pk, 12);
    pk_str(&pk, "min_p"), msgpack_pack_double(&pk, 0.1);
    pk_str(&pk, "repeat_penalty"), msgpack_pack_double(&pk, 1.1); /* the alias */
    pk_str(&pk, "presence_penalty"), msgpack_pack_double(&pk, 0.25);
    pk_str(&pk, "frequency_penalty"), msgpack_pack_double(&pk, -0.5);
    pk_str(&pk, "penalty_last_n"), msgpack_pack_int(&pk, 32);
    pk_str(&pk, "seed"), msgpack_pack_int(&pk, 42);
    pk_str(&pk, "stop"), msgpack_pack_array(&pk, 2), pk_str(&pk, "\n\n"), pk_str(&pk, "END");
    pk_str(&pk, "stop_token_ids"), msgpack_pack_array(&pk, 2), msgpack_pack_int(&pk, 2), msgpack_pack_int(&pk, 3);
    pk_str(&pk, "min_tokens"), msgpack_pack_int(&pk, 1);
    pk_str(&pk, "logit_bias"), msgpack_pack_map(&pk, 2), msgpack_pack_int(&pk, 1), msgpack_pack_int(&pk, -100),
        msgpack_pack_int(&pk, 2), msgpack_pack_double(&pk, 2.5);
    pk_str(&pk, "n"), msgpack_pack_int(&pk, 2);
    pk_str(&pk, "logprobs"), msgpack_pack_int(&pk, 3);
    pk_str(&pk, "ignore_eos"), msgpack_pack_true(&pk);
    pk_str(&pk, "priority"), msgpack_pack_int(&pk, -4);
    pk_str(&pk, "tenant"), pk_str(&pk, "team-a");
    pk_str(&pk, "cache_salt"), pk_str(&pk, "salt");
    const char *json =
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 12,"
        " \"min_p\": 0.1, \"repeat_penalty\": 1.1, \"presence_penalty\": 0.25, \"frequency_penalty\": -0.5,"
        " \"penalty_last_n\": 32, \"seed\": 42, \"stop\": [\"\\n\\n\", \"END\"], \"stop_token_ids\": [2, 3],"
        " \"min_tokens\": 1, \"logit_bias\": {\"1\": -100, \"2\": 2.5}, \"n\": 2, \"logprobs\": 3,"
        " \"ignore_eos\": true, \"priority\": -4, \"tenant\": \"team-a\", \"cache_salt\": \"salt\"}";
    /* {[1] = -100, [2] = 2.5} would be the list {-100, 2.5} to a plain packer: engine:add
     * packs logit_bias as a map whatever its keys */
    const char *lua =
        "{ prompt = 'Once upon a time', max_tokens = 7, temperature = 0.5, top_p = 0.9, top_k = 12, min_p = 0.1,"
        " repeat_penalty = 1.1, presence_penalty = 0.25, frequency_penalty = -0.5, penalty_last_n = 32, seed = 42,"
        " stop = { '\\n\\n', 'END' }, stop_token_ids = { 2, 3 }, min_tokens = 1, logit_bias = { [1] = -100, [2] = 2.5 },"
        " n = 2, logprobs = 3, ignore_eos = true, priority = -4, tenant = 'team-a', cache_salt = 'salt' }";
    li_gen_params a, b, c, d;
    li_error err = {0};
    CHECK(parse_mp(&sb, LI_REQ_LUAINFER, &a, &err) == 0, "msgpack: %s", err.msg);
    CHECK(parse_json(json, LI_REQ_LUAINFER, &b, &err) == 0, "JSON: %s", err.msg);
    CHECK(parse_json(json, LI_REQ_OPENAI, &d, &err) == 0, "JSON (OpenAI defaults): %s", err.msg);
    CHECK(parse_lua(L, lua, &c, &err) == 0, "Lua: %s", err.msg);
    msgpack_sbuffer_destroy(&sb);
    /* the values themselves, once */
    CHECK(a.max_tokens == 7 && a.sp.temperature == 0.5f && a.sp.top_k == 12 && a.sp.repeat_penalty == 1.1f &&
              a.sp.penalty_last_n == 32 && a.sp.seed == 42 && a.n_stop == 2 && a.n_stop_token_ids == 2 &&
              a.sp.n_logit_bias == 2 && a.n == 2 && a.logprobs == 3 && a.ignore_eos && a.priority == -4 &&
              a.tenant && !strcmp(a.tenant, "team-a"),
          "the msgpack request parsed to what it says");
    CHECK(gen_eq(&a, &b, false, "msgpack vs JSON"), "msgpack-RPC and HTTP parse the same");
    CHECK(gen_eq(&a, &c, false, "msgpack vs Lua"), "msgpack-RPC and engine:add parse the same");
    CHECK(gen_eq(&a, &d, false, "msgpack vs JSON (OpenAI)"), "every field given: the OpenAI defaults do not matter");
    li_request_params p, q;
    li_gen_params_to_request(&a, NULL, 0, &p);
    li_gen_params_to_request(&c, NULL, 0, &q);
    CHECK(p.sampling.logprob && p.sampling.n_logprobs == 3 && q.sampling.n_logprobs == 3 && p.max_tokens == q.max_tokens,
          "the engine's request is the same too");
    li_gen_params_free(&a);
    li_gen_params_free(&b);
    li_gen_params_free(&c);
    li_gen_params_free(&d);
}

/* ---- one set of defaults ------------------------------------------------------ */

static void test_defaults(lua_State *L) {
    li_gen_params a, b, c, oa, chat;
    li_error err = {0};
    CHECK(parse_json("{\"prompt\": \"x\"}", LI_REQ_LUAINFER, &a, &err) == 0, "%s", err.msg);
    CHECK(parse_lua(L, "{ prompt = 'x' }", &c, &err) == 0, "%s", err.msg);
    CHECK(parse_json("{\"tokens\": [1, 2]}", LI_REQ_LUAINFER, &b, &err) == 0, "%s", err.msg);
    CHECK(gen_eq(&a, &c, true, "defaults: RPC vs Lua"), "msgpack-RPC and engine:add share every default");
    CHECK(a.max_tokens == 128 && c.max_tokens == 128, "max_tokens defaults to 128 (%lld, Lua %lld)",
          (long long)a.max_tokens, (long long)c.max_tokens);
    CHECK(a.sp.temperature == 0.8f && a.sp.top_k == 40 && a.sp.top_p == 0.95f && a.sp.min_p == 0.05f &&
              a.sp.repeat_penalty == 1.0f && a.sp.penalty_last_n == 64 && a.n == 1 && a.logprobs == -1 &&
              !a.ignore_eos && !a.stream && a.min_tokens == 0 && a.n_stop == 0 && a.sp.n_logit_bias == 0,
          "luainfer's sampling defaults (llama.cpp's)");
    CHECK(b.n_tokens == 2 && b.tokens[1] == 2, "tokens");
    CHECK(parse_json("{\"prompt\": \"x\"}", LI_REQ_OPENAI, &oa, &err) == 0, "%s", err.msg);
    CHECK(oa.max_tokens == 16 && oa.sp.temperature == 1.0f && oa.sp.top_p == 1.0f && oa.sp.top_k == 0 &&
              oa.sp.min_p == 0.0f,
          "OpenAI's defaults on /v1/completions");
    CHECK(parse_json("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", LI_REQ_OPENAI_CHAT, &chat, &err) == 0,
          "%s", err.msg);
    CHECK(chat.max_tokens == -1 && chat.n_msgs == 1 && !strcmp(chat.msgs[0].content, "hi"),
          "chat: max_tokens is the rest of the context");
    li_gen_params_free(&a);
    li_gen_params_free(&b);
    li_gen_params_free(&c);
    li_gen_params_free(&oa);
    li_gen_params_free(&chat);
}

/* ---- the same refusals -------------------------------------------------------------- */

static void test_refusals(lua_State *L) {
    static const struct {
        const char *json, *lua, *want;
    } bad[] = {
        {"{\"prompt\": \"x\", \"temperature\": -1}", "{ prompt = 'x', temperature = -1 }", "'temperature' must be a number in [0, 100]"},
        {"{\"prompt\": \"x\", \"temperature\": \"hot\"}", "{ prompt = 'x', temperature = 'hot' }", "'temperature'"},
        {"{\"prompt\": \"x\", \"top_p\": 0}", "{ prompt = 'x', top_p = 0 }", "'top_p' must be in (0, 1]"},
        {"{\"prompt\": \"x\", \"max_tokens\": 2000000}", "{ prompt = 'x', max_tokens = 2000000 }", "'max_tokens'"},
        {"{\"prompt\": \"x\", \"max_tokens\": 1.5}", "{ prompt = 'x', max_tokens = 1.5 }", "'max_tokens'"},
        {"{\"prompt\": \"x\", \"n\": 65}", "{ prompt = 'x', n = 65 }", "'n' must be an integer in [1, 64]"},
        {"{\"prompt\": \"x\", \"seed\": -5}", "{ prompt = 'x', seed = -5 }", "'seed'"},
        {"{\"prompt\": \"x\", \"penalty_last_n\": -2}", "{ prompt = 'x', penalty_last_n = -2 }", "'penalty_last_n'"},
        {"{\"prompt\": \"x\", \"repetition_penalty\": 0}", "{ prompt = 'x', repetition_penalty = 0 }", "'repetition_penalty'"},
        {"{\"prompt\": \"x\", \"logprobs\": 21}", "{ prompt = 'x', logprobs = 21 }", "'logprobs'"},
        {"{\"prompt\": \"x\", \"ignore_eos\": 1}", "{ prompt = 'x', ignore_eos = 1 }", "'ignore_eos' must be true or false"},
        {"{\"prompt\": \"x\", \"stop\": [\"\"]}", "{ prompt = 'x', stop = { '' } }", "'stop'"},
        {"{\"prompt\": \"x\", \"stop_token_ids\": [-1]}", "{ prompt = 'x', stop_token_ids = { -1 } }", "list of token ids"},
        {"{\"prompt\": \"x\", \"stop_token_ids\": [1000]}", "{ prompt = 'x', stop_token_ids = { 1000 } }", "outside the vocabulary"},
        {"{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", "{ prompt = 'x', logit_bias = { [5] = 101 } }", "[-100, 100]"},
        {"{\"prompt\": \"x\", \"logit_bias\": {\"1000\": 1}}", "{ prompt = 'x', logit_bias = { [1000] = 1 } }", "outside the vocabulary"},
        {"{\"prompt\": \"x\", \"logit_bias\": \"no\"}", "{ prompt = 'x', logit_bias = 'no' }", "'logit_bias' must be a table"},
        {"{\"prompt\": \"x\", \"max_tokens\": 4, \"min_tokens\": 5}", "{ prompt = 'x', max_tokens = 4, min_tokens = 5 }", "'min_tokens' (5)"},
        {"{\"prompt\": \"x\", \"bogus\": 1}", "{ prompt = 'x', bogus = 1 }", "unknown parameter 'bogus'"},
        {"{\"prompt\": \"\"}", "{ prompt = '' }", "'prompt' is empty"},
        {"{\"tokens\": [1, 1000]}", "{ tokens = { 1, 1000 } }", "outside the vocabulary"},
        {"{\"max_tokens\": 3}", "{ max_tokens = 3 }", "one of 'prompt', 'messages' or 'tokens' is required"},
        {"{\"prompt\": \"x\", \"tokens\": [1]}", "{ prompt = 'x', tokens = { 1 } }", "give only one"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        li_gen_params g;
        li_error e1 = {0}, e2 = {0};
        int r1 = parse_json(bad[i].json, LI_REQ_LUAINFER, &g, &e1);
        int r2 = parse_lua(L, bad[i].lua, &g, &e2);
        CHECK(r1 == LI_EINVAL && strstr(e1.msg, bad[i].want) && !strncmp(e1.msg, "invalid params: ", 16),
              "%s refused: %s", bad[i].json, e1.msg);
        CHECK(r2 == LI_EINVAL && !strcmp(e1.msg, e2.msg), "Lua %s: the same message (%s | %s)", bad[i].lua, e1.msg,
              e2.msg);
    }
    /* the Lua path cannot stream; a function is no value */
    li_gen_params g;
    li_error e = {0};
    CHECK(parse_lua(L, "{ prompt = 'x', stream = true }", &g, &e) == LI_EINVAL && strstr(e.msg, "'stream'"), "%s", e.msg);
    CHECK(parse_lua(L, "{ prompt = 'x', seed = print }", &g, &e) == LI_EINVAL && strstr(e.msg, "function"), "%s", e.msg);
    CHECK(parse_lua(L, "{ prompt = 'x', [1] = 2 }", &g, &e) == LI_EINVAL && strstr(e.msg, "names must be strings"), "%s",
          e.msg);
    /* a table nested in itself is refused, not followed forever */
    luaL_dostring(L, "local t = { prompt = 'x' }; t.stop = { t }; return t");
    CHECK(li_lua_request_parse(L, -1, N_VOCAB, &g, &e) == LI_EINVAL && strstr(e.msg, "deeper"), "%s", e.msg);
    lua_pop(L, 1);
}

/* ---- OpenAI fields that change what the reply must be --------------------------------- */

static void test_openai_unserved(void) {
    static const struct {
        li_req_profile prof;
        const char *json, *want; /* want NULL: accepted (a neutral value, or a field that changes nothing) */
    } cases[] = {
        {LI_REQ_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_object\"}}", "'response_format' other than"},
        {LI_REQ_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {}}}", "'response_format'"},
        {LI_REQ_OPENAI_CHAT, "{\"response_format\": \"json\"}", "'response_format'"},
        {LI_REQ_OPENAI_CHAT, "{\"response_format\": {\"type\": \"text\"}}", NULL},
        {LI_REQ_OPENAI_CHAT, "{\"response_format\": null}", NULL},
        {LI_REQ_OPENAI_CHAT, "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", "'tools' is not supported"},
        {LI_REQ_OPENAI_CHAT, "{\"tools\": []}", NULL},
        {LI_REQ_OPENAI_CHAT, "{\"functions\": [{\"name\": \"f\"}]}", "'functions' is not supported"},
        {LI_REQ_OPENAI_CHAT, "{\"tool_choice\": \"required\"}", "'tool_choice' is not supported"},
        {LI_REQ_OPENAI_CHAT, "{\"tool_choice\": {\"type\": \"function\"}}", "'tool_choice'"},
        {LI_REQ_OPENAI_CHAT, "{\"tool_choice\": \"none\"}", NULL},
        {LI_REQ_OPENAI_CHAT, "{\"guided_json\": {}}", "'guided_json' is not supported"},
        {LI_REQ_OPENAI_CHAT, "{\"user\": \"u1\", \"store\": false, \"prediction\": {\"type\": \"content\"}}", NULL},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"echo\": true}", "'echo' is not supported"},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"echo\": false}", NULL},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"suffix\": \"end\"}", "'suffix' is not supported"},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"suffix\": \"\"}", NULL},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"best_of\": 3, \"n\": 2}", "'best_of' (3) more than 'n' (2)"},
        {LI_REQ_OPENAI, "{\"best_of\": 2, \"n\": 2, \"prompt\": \"x\"}", NULL},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"best_of\": 0}", "'best_of' must be an integer >= 1"},
        {LI_REQ_OPENAI, "{\"prompt\": \"x\", \"grammar\": \"root ::= x\"}", "'grammar' is not supported"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++) {
        char json[512];
        const char *body = cases[i].json + 1; /* the case's fields, after a chat's messages */
        if (cases[i].prof == LI_REQ_OPENAI_CHAT)
            snprintf(json, sizeof json, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s", body);
        else
            snprintf(json, sizeof json, "%s", cases[i].json);
        li_gen_params g;
        li_error e = {0};
        int rc = parse_json(json, cases[i].prof, &g, &e);
        if (cases[i].want)
            CHECK(rc == LI_EINVAL && strstr(e.msg, cases[i].want) && !strncmp(e.msg, "invalid params: ", 16),
                  "%s refused: %s", json, e.msg);
        else {
            CHECK(rc == 0, "%s accepted: %s", json, e.msg);
            if (rc == 0) li_gen_params_free(&g);
        }
    }
    /* a past assistant turn's tool calls would be lost from the prompt: refused on every path */
    li_gen_params g;
    li_error e = {0};
    const char *calls = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                        "\"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\"}]}]}";
    CHECK(parse_json(calls, LI_REQ_OPENAI_CHAT, &g, &e) == LI_EINVAL && strstr(e.msg, "messages[1].tool_calls"), "%s", e.msg);
    CHECK(parse_json(calls, LI_REQ_LUAINFER, &g, &e) == LI_EINVAL && strstr(e.msg, "messages[1].tool_calls"), "%s", e.msg);
    const char *none = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": []}]}";
    CHECK(parse_json(none, LI_REQ_OPENAI_CHAT, &g, &e) == 0, "an empty tool_calls list is accepted: %s", e.msg);
    li_gen_params_free(&g);
    /* luainfer's own paths keep refusing every key they do not know, these included */
    CHECK(parse_json("{\"prompt\": \"x\", \"response_format\": {\"type\": \"text\"}}", LI_REQ_LUAINFER, &g, &e) ==
              LI_EINVAL && strstr(e.msg, "unknown parameter 'response_format'"),
          "%s", e.msg);
}

int main(void) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    test_same_request(L);
    test_defaults(L);
    test_refusals(L);
    test_openai_unserved();
    CHECK(lua_gettop(L) == 0, "the Lua stack is balanced (%d)", lua_gettop(L));
    lua_close(L);
    return t_summary("test_request");
}
