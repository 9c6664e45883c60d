/* test_tokenizer.c — the SmolLM2 tokenizer against Hugging Face golden ids.
 *
 * tests/golden/tokenizer_smollm2.jsonl.gz (tools/gen_tokenizer_golden.py)
 * holds >= 10,000 strings with HF's ids; every one must encode to the same
 * ids and decode back to the same bytes. Then unit checks: streaming
 * detokenization, invalid UTF-8, empty input, end-of-generation ids.
 *
 * Needs the real model: LUAINFER_MODEL, else
 * models/SmolLM2-135M-Instruct.Q4_1.gguf relative to the working directory;
 * without it the test prints SKIP and exits 77. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GOLDEN "tests/golden/tokenizer_smollm2.jsonl.gz"

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 24 ? " ...\n" : "\n");
}

/* ==== golden corpus =========================================================== */

static void test_golden(const li_tokenizer *t) {
    char path[1024], cmd[1100];
    const char *root = getenv("LUAINFER_SOURCE_DIR");
    if (root && *root) snprintf(path, sizeof path, "%s/%s", root, GOLDEN);
    else snprintf(path, sizeof path, "%s", GOLDEN);
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run %s", cmd);
    if (!f) return;

    size_t n = 0, same = 0, rt_n = 0, rt_ok = 0, shown = 0;
    double t_enc = 0;
    char *line = NULL, *dec = NULL;
    size_t line_cap = 0, dec_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, f)) > 0) {
        cJSON *j = cJSON_Parse(line);
        CHECK(j != NULL, "bad JSON line %zu", n + 1);
        if (!j) continue;
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "text");
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "ids");
        const cJSON *jr = cJSON_GetObjectItemCaseSensitive(j, "rt");
        if (!cJSON_IsString(jt) || !cJSON_IsArray(ji)) {
            CHECK(0, "line %zu lacks text/ids", n + 1);
            cJSON_Delete(j);
            continue;
        }
        const char *text = jt->valuestring;
        size_t len = strlen(text);
        int n_ref = cJSON_GetArraySize(ji);
        int32_t *ref = malloc(((size_t)n_ref + 1) * sizeof *ref);
        for (int i = 0; i < n_ref; i++) ref[i] = (int32_t)cJSON_GetArrayItem(ji, i)->valuedouble;

        int32_t *ids;
        size_t n_ids;
        li_error err = {0};
        double t0 = li_time_now();
        int rc = li_tokenizer_encode(t, text, len, false, true, &ids, &n_ids, &err);
        t_enc += li_time_now() - t0;
        CHECK(rc == 0, "encode: %s", err.msg);
        n++;
        if (n_ids == (size_t)n_ref && (n_ids == 0 || memcmp(ids, ref, n_ids * sizeof *ids) == 0)) {
            same++;
        } else if (shown++ < 10) {
            fprintf(stderr, "MISMATCH text=\"%.80s\"\n", text);
            print_ids("hf ", ref, (size_t)n_ref);
            print_ids("got", ids, n_ids);
        }

        /* The golden file says whether HF itself round-trips the string: it
         * cannot when the text has bytes the vocabulary lacks. */
        if (!cJSON_IsFalse(jr)) {
            rt_n++;
            long dn = li_tokenizer_decode(t, ids, n_ids, true, NULL, 0);
            if (dn >= 0 && (size_t)dn + 1 > dec_cap) {
                dec_cap = (size_t)dn + 1;
                dec = realloc(dec, dec_cap);
            }
            if (dn >= 0) li_tokenizer_decode(t, ids, n_ids, true, dec, dec_cap);
            if (dn == (long)len && memcmp(dec, text, len) == 0) rt_ok++;
            else if (shown++ < 10)
                fprintf(stderr, "ROUNDTRIP text=\"%.80s\" decoded=\"%.*s\"\n", text, (int)LI_MAX(dn, 0), dec);
        }
        free(ids);
        free(ref);
        cJSON_Delete(j);
    }
    free(line);
    free(dec);
    int st = pclose(f);
    CHECK(st == 0 && n > 0, "reading %s failed (status %d, %zu lines)", path, st, n);
    printf("tokenizer: %zu/%zu identical, %zu/%zu round-trip (%zu have bytes the vocab lacks)\n", same, n,
           rt_ok, rt_n, n - rt_n);
    printf("tokenizer: encode %.1f ms for %zu strings (%.1f ms per 10k)\n", t_enc * 1e3, n,
           n ? t_enc * 1e3 * 10000.0 / (double)n : 0.0);
    CHECK(same == n, "%zu of %zu strings differ from HF", n - same, n);
    CHECK(rt_ok == rt_n, "%zu of %zu strings do not round-trip", rt_n - rt_ok, rt_n);
    CHECK(n >= 10000, "golden corpus has only %zu strings", n);
}

/* ==== unit checks ============================================================== */

static int32_t *encode(const li_tokenizer *t, const char *s, size_t len, bool parse_special, size_t *n) {
    int32_t *ids;
    li_error err = {0};
    int rc = li_tokenizer_encode(t, s, len, false, parse_special, &ids, n, &err);
    CHECK(rc == 0, "encode failed: %s", err.msg);
    return rc == 0 ? ids : NULL;
}

static void test_streaming(const li_tokenizer *t) {
    /* A family emoji (ZWJ sequence, 25 bytes) spans several byte-level tokens
     * whose edges fall inside characters: nothing may come out until a
     * character is complete, and the whole must come out in the end. */
    const char *text = "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok \xF0\x9F\x98\x80";
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), true, &n);
    CHECK(n >= 2, "emoji should take several tokens, got %zu", n);
    li_detok d;
    li_detok_init(&d);
    char out[256];
    size_t k = 0;
    int n_partial = 0;
    for (size_t i = 0; i < n; i++) {
        char piece[64];
        int pn = li_tokenizer_token_to_piece(t, ids[i], true, piece, sizeof piece);
        int w = li_detok_push(&d, t, ids[i], true, out + k, sizeof out - k);
        CHECK(w >= 0, "push failed");
        if (w < 0) break;
        /* Whatever came out ends on a character boundary of the text. */
        k += (size_t)w;
        CHECK(k == strlen(text) || ((uint8_t)text[k] & 0xC0) != 0x80, "emitted a partial char at %zu", k);
        if (w < pn) n_partial++;
    }
    int w = li_detok_flush(&d, out + k, sizeof out - k);
    CHECK(w == 0, "nothing should be pending at the end, flush gave %d", w);
    CHECK(k == strlen(text) && memcmp(out, text, k) == 0, "streamed text differs");
    CHECK(n_partial > 0, "expected some token to end mid-character");
    free(ids);

    /* "😀" alone: if it takes more than one token, all but the last give nothing. */
    const char *smile = "\xF0\x9F\x98\x80";
    ids = encode(t, smile, 4, true, &n);
    li_detok_init(&d);
    k = 0;
    for (size_t i = 0; i < n; i++) {
        w = li_detok_push(&d, t, ids[i], true, out + k, sizeof out - k);
        CHECK(i + 1 == n ? w == 4 : w == 0, "token %zu of %zu gave %d bytes", i, n, w);
        if (w > 0) k += (size_t)w;
    }
    free(ids);

    /* A lone lead byte is held, then comes out as U+FFFD at flush. */
    int32_t f0 = li_tokenizer_find(t, "\xC3\xB0", 2); /* GPT-2 char for byte 0xF0 */
    CHECK(f0 >= 0, "no token for byte 0xF0");
    li_detok_init(&d);
    w = li_detok_push(&d, t, f0, true, out, sizeof out);
    CHECK(w == 0, "lead byte should be held, got %d", w);
    w = li_detok_flush(&d, out, sizeof out);
    CHECK(w == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "flush should give U+FFFD, got %d", w);
    /* A lead byte followed by a non-continuation: U+FFFD, then the char. */
    int32_t a = li_tokenizer_find(t, "a", 1);
    li_detok_init(&d);
    li_detok_push(&d, t, f0, true, out, sizeof out);
    w = li_detok_push(&d, t, a, true, out, sizeof out);
    CHECK(w == 4 && memcmp(out, "\xEF\xBF\xBD" "a", 4) == 0, "expected U+FFFD a, got %d bytes", w);
    /* Too small a buffer: -1 and nothing consumed. */
    int32_t hello = li_tokenizer_find(t, "Hello", 5);
    li_detok_init(&d);
    CHECK(li_detok_push(&d, t, hello, true, out, 2) == -1, "cap 2 should fail");
    CHECK(li_detok_push(&d, t, hello, true, out, sizeof out) == 5, "Hello after a failed push");
    CHECK(li_detok_push(&d, t, -5, true, out, sizeof out) == -1, "bad id");
}

static void test_invalid_utf8(const li_tokenizer *t) {
    static const char *cases[] = {"\xFF", "\xC3", "\xE2\x82", "abc\x80\x80 def", "\xED\xA0\x80 surrogate",
                                  "\xF4\x90\x80\x80", "\xC0\xAF overlong", "x\xF0\x9F\x98", "\xFE\xFF<|im_end|>\xFF"};
    for (size_t c = 0; c < LI_ARRAY_LEN(cases); c++) {
        size_t n;
        int32_t *ids = encode(t, cases[c], strlen(cases[c]), true, &n);
        for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < li_tokenizer_n_vocab(t), "bad id");
        free(ids);
    }
    /* Random bytes: every byte the vocabulary can spell must come back. */
    bool spellable[256];
    for (int b = 0; b < 256; b++) {
        char buf[1] = {(char)b};
        size_t n;
        int32_t *ids = encode(t, buf, 1, false, &n);
        spellable[b] = n == 1;
        free(ids);
    }
    size_t ok = 0, tried = 0;
    for (int it = 0; it < 2000; it++) {
        char buf[64];
        size_t len = rng_u32() % sizeof buf;
        for (size_t i = 0; i < len; i++) {
            uint8_t b;
            do b = (uint8_t)rng_u32(); while (!spellable[b]);
            buf[i] = (char)b;
        }
        size_t n;
        int32_t *ids = encode(t, buf, len, false, &n);
        char dec[128];
        long dn = li_tokenizer_decode(t, ids, n, true, dec, sizeof dec);
        tried++;
        if (dn == (long)len && memcmp(dec, buf, len) == 0) ok++;
        free(ids);
    }
    CHECK(ok == tried, "random bytes: %zu/%zu round-trip", ok, tried);
    printf("tokenizer: random bytes %zu/%zu round-trip\n", ok, tried);
}

static void test_basics(const li_tokenizer *t) {
    size_t n;
    int32_t *ids = encode(t, "", 0, true, &n);
    CHECK(n == 0 && ids == NULL, "empty text gave %zu ids", n);
    free(ids);
    li_error err = {0};
    CHECK(li_tokenizer_encode(t, "", 0, true, true, &ids, &n, &err) == 0 && n == 0, "empty + add_special");
    free(ids);

    CHECK(li_tokenizer_n_vocab(t) == 49152, "n_vocab %d", li_tokenizer_n_vocab(t));
    /* the vocabulary fingerprint, spelled out from tokenizer.h's definition */
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char nv[4] = {0x00, 0xc0, 0x00, 0x00}; /* 49152 little-endian */
    for (int i = 0; i < 4; i++) h = (h ^ nv[i]) * 0x100000001b3ull;
    for (int32_t id = 0; id < 49152; id++) {
        size_t len;
        const unsigned char *s = (const unsigned char *)li_tokenizer_token_text(t, id, &len);
        for (size_t j = 0; j < len; j++) h = (h ^ s[j]) * 0x100000001b3ull;
        h = (h ^ 0u) * 0x100000001b3ull;
    }
    CHECK(li_tokenizer_vocab_hash(t) == h, "vocab hash %016llx, spelled out %016llx",
          (unsigned long long)li_tokenizer_vocab_hash(t), (unsigned long long)h);
    CHECK(!li_tokenizer_add_bos(t), "SmolLM2 does not add BOS");
    CHECK(li_tokenizer_bos(t) == 1 && li_tokenizer_eos(t) == 2, "bos/eos");
    int32_t im_end = li_tokenizer_find(t, "<|im_end|>", 10);
    int32_t eot = li_tokenizer_find(t, "<|endoftext|>", 13);
    int32_t im_start = li_tokenizer_find(t, "<|im_start|>", 12);
    CHECK(im_end == 2 && eot == 0 && im_start == 1, "special ids %d %d %d", im_end, eot, im_start);
    CHECK(li_tokenizer_is_eog(t, im_end), "<|im_end|> is eog");
    CHECK(li_tokenizer_is_eog(t, eot), "<|endoftext|> is eog");
    CHECK(!li_tokenizer_is_eog(t, im_start), "<|im_start|> is not eog");
    CHECK(!li_tokenizer_is_eog(t, li_tokenizer_find(t, "Hello", 5)), "Hello is not eog");
    CHECK(li_tokenizer_find(t, "no-such-token-xyz", 17) == -1, "find miss");

    /* parse_special: on, the string is one id; off, plain text that still round-trips. */
    const char *chat = "<|im_start|>user\nHi<|im_end|>";
    ids = encode(t, chat, strlen(chat), true, &n);
    CHECK(n >= 3 && ids[0] == im_start && ids[n - 1] == im_end, "specials parsed");
    free(ids);
    ids = encode(t, chat, strlen(chat), false, &n);
    bool any = false;
    for (size_t i = 0; i < n; i++) any |= ids[i] == im_start || ids[i] == im_end;
    CHECK(!any && n > 6, "specials must not be parsed");
    char dec[128];
    long dn = li_tokenizer_decode(t, ids, n, true, dec, sizeof dec);
    CHECK(dn == (long)strlen(chat) && memcmp(dec, chat, (size_t)dn) == 0, "plain-text specials round-trip");
    free(ids);

    /* Pieces: special tokens only with `special`; bad ids are -1. */
    char piece[32];
    CHECK(li_tokenizer_token_to_piece(t, im_end, true, piece, sizeof piece) == 10 &&
              memcmp(piece, "<|im_end|>", 10) == 0, "special piece");
    CHECK(li_tokenizer_token_to_piece(t, im_end, false, piece, sizeof piece) == 0, "hidden special");
    CHECK(li_tokenizer_token_to_piece(t, li_tokenizer_find(t, "\xC4\xA0" "world", 7), false, piece,
                                      sizeof piece) == 6 && memcmp(piece, " world", 6) == 0, "' world'");
    CHECK(li_tokenizer_token_to_piece(t, -1, true, piece, sizeof piece) == -1, "bad id");
    CHECK(li_tokenizer_token_to_piece(t, 49152, true, piece, sizeof piece) == -1, "bad id");
    CHECK(li_tokenizer_decode(t, (int32_t[]){5, 99999}, 2, true, dec, sizeof dec) == -1, "decode bad id");

    /* add_special with a model that asks for nothing adds nothing. */
    CHECK(li_tokenizer_encode(t, "Hi", 2, true, true, &ids, &n, &err) == 0 && n == 1, "Hi is one token");
    free(ids);
}

int main(void) {
    const char *path = getenv("LUAINFER_MODEL");
    if (!path || !*path) path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("SKIP: model not found at %s\n", path);
        return 77;
    }
    li_gguf g;
    li_error err = {0};
    if (li_gguf_open(&g, path, &err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    li_tokenizer *t;
    double t0 = li_time_now();
    int rc = li_tokenizer_init(&t, &g, &err);
    double t_init = li_time_now() - t0;
    li_gguf_free(&g); /* the tokenizer must not need the file any more */
    if (rc != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    printf("tokenizer: init %.1f ms\n", t_init * 1e3);

    test_basics(t);
    test_streaming(t);
    test_invalid_utf8(t);
    test_golden(t);
    li_tokenizer_free(t);
    if (t_failed) {
        fprintf(stderr, "test_tokenizer: %d check(s) failed\n", t_failed);
        return 1;
    }
    printf("test_tokenizer: OK\n");
    return 0;
}
