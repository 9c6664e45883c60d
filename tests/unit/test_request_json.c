/* test_request_json.c — li_request_pack_json_text, the HTTP routes' JSON
 * reader (jansson): a "\u0000" stays in a string with its length; a body
 * without one packs to the same msgpack bytes as the older cJSON path
 * (li_request_pack_json); and every refusal is a one-line 400: not JSON, not
 * an object, a key given twice, nesting past the limit (also far past
 * jansson's own), an integer beyond 64 bits. No model needed. */
#include "request/request.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <string.h>

/* JSON text -> msgpack bytes in *sb (initialized here); returns the rc. */
static int pack_text(const char *json, size_t n, int depth, msgpack_sbuffer *sb, li_error *err) {
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    return li_request_pack_json_text(&pk, json, n, depth, err);
}

static int parse_packed(const msgpack_sbuffer *sb, li_gen_params *g, li_error *err) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc = msgpack_unpack_next(&u, sb->data, sb->size, &off) == MSGPACK_UNPACK_SUCCESS ? 0 : -1;
    if (!rc) {
        li_req_opts o = {.profile = LI_REQ_LUAINFER, .n_vocab = 1000};
        rc = li_request_parse(&u.data, &o, g, err);
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}

static void test_nul_kept(void) {
    static const char body[] = "{\"prompt\": \"Hello\\u0000 world\", \"max_tokens\": 3}";
    msgpack_sbuffer sb;
    li_error err = {0};
    int rc = pack_text(body, sizeof body - 1, 32, &sb, &err);
    CHECK(rc == 0, "packs (%s)", err.msg);
    li_gen_params g;
    rc = parse_packed(&sb, &g, &err);
    CHECK(rc == 0, "parses (%s)", err.msg);
    if (!rc) {
        CHECK(g.prompt_len == 12 && !memcmp(g.prompt, "Hello\0 world", 12), "the prompt keeps its NUL (%zu bytes)",
              g.prompt_len);
        li_gen_params_free(&g);
    }
    msgpack_sbuffer_destroy(&sb);
    /* a stop string with a NUL: refused, not cut to "ab" */
    static const char stop[] = "{\"prompt\": \"x\", \"stop\": [\"ab\\u0000c\"]}";
    rc = pack_text(stop, sizeof stop - 1, 32, &sb, &err);
    CHECK(rc == 0, "packs (%s)", err.msg);
    rc = parse_packed(&sb, &g, &err);
    CHECK(rc != 0 && strstr(err.msg, "NUL"), "a NUL in a stop string is refused (%s)", err.msg);
    msgpack_sbuffer_destroy(&sb);
}

/* Without NULs, the same msgpack bytes as the cJSON path (numbers, order, nesting). */
static void test_same_as_cjson(void) {
    static const char *const bodies[] = {
        "{\"prompt\": \"caf\\u00e9 \\ud83d\\ude00\", \"temperature\": 0.5, \"max_tokens\": 5.0, \"n\": 2,"
        " \"stop\": [\"a\", \"b\"], \"logit_bias\": {\"12\": -100, \"7\": 1.5}, \"stream\": false, \"seed\": null,"
        " \"x\": [[1, [2, {\"y\": -3}]], 1e300, -0.0]}",
        "{}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}]}",
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(bodies); i++) {
        msgpack_sbuffer a, b;
        li_error err = {0};
        int rc = pack_text(bodies[i], strlen(bodies[i]), 32, &a, &err);
        cJSON *j = cJSON_Parse(bodies[i]);
        msgpack_sbuffer_init(&b);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
        bool ok = j && li_request_pack_json(&pk, j, 32);
        cJSON_Delete(j);
        CHECK(rc == 0 && ok && a.size == b.size && !memcmp(a.data, b.data, a.size),
              "body %zu: the same msgpack as cJSON's (%zu vs %zu bytes; %s)", i, a.size, b.size, err.msg);
        msgpack_sbuffer_destroy(&a);
        msgpack_sbuffer_destroy(&b);
    }
}

static void expect_refused(const char *json, size_t n, const char *want) {
    msgpack_sbuffer sb;
    li_error err = {0};
    int rc = pack_text(json, n, 32, &sb, &err);
    CHECK(rc != 0 && err.code == 400 && strstr(err.msg, want) && !strchr(err.msg, '\n'),
          "'%.40s' refused with '%s' (got rc %d: %s)", json, want, rc, err.msg);
    msgpack_sbuffer_destroy(&sb);
}

static void test_refusals(void) {
    static const char dup[] = "{\"prompt\": \"x\", \"prompt\": \"y\"}";
    expect_refused(dup, sizeof dup - 1, "duplicate");
    static const char arr[] = "[1, 2]";
    expect_refused(arr, sizeof arr - 1, "must be a JSON object");
    static const char bad[] = "{\"prompt\": ";
    expect_refused(bad, sizeof bad - 1, "not valid JSON");
    static const char big[] = "{\"seed\": 123456789012345678901234567890}";
    expect_refused(big, sizeof big - 1, "too big integer");
    static const char nul[] = "{\"prompt\": \"a\0b\"}"; /* a raw NUL byte is not JSON */
    expect_refused(nul, sizeof nul - 1, "not valid JSON");
    /* nesting: just past our limit, and far past jansson's own (2048) */
    for (int depth = 33; depth <= 100000; depth = depth == 33 ? 5000 : 100001) {
        size_t n = 2 + 6 + 2 * (size_t)depth;
        char *s = li_xmalloc(n + 1), *p = s;
        p += sprintf(p, "{\"a\":");
        for (int i = 0; i < depth; i++) *p++ = '[';
        for (int i = 0; i < depth; i++) *p++ = ']';
        *p++ = '}';
        *p = 0;
        expect_refused(s, (size_t)(p - s), "nests deeper than 32");
        free(s);
    }
}

int main(void) {
    test_nul_kept();
    test_same_as_cjson();
    test_refusals();
    return t_summary("test_request_json");
}
