/* test_tokenizer_small.c — the tokenizer paths SmolLM2 does not use, on
 * small vocabularies shipped under tests/golden/ (no model download):
 *
 *   spm_tiny.gguf                 SentencePiece BPE (tokenizer.ggml.model =
 *                                 "llama"): 2000 tokens, byte fallback, a
 *                                 user-defined <sep>; golden ids from
 *                                 llama.cpp (tools/gen_spm_test_model.py).
 *   tokenizer_llama3_tiny.gguf    byte-level BPE with pre = "llama-bpe":
 *                                 Llama 3 split rule, ignore_merges, BOS by
 *                                 default; golden ids from HF, which
 *                                 llama.cpp agrees with
 *                                 (tools/gen_bpe_test_model.py).
 *   spm_tiny_tokenizer.json,      the same SentencePiece vocabulary as a
 *   spm_tiny_legacy_tokenizer.json Hugging Face tokenizer.json (BPE with
 *                                 byte_fallback; Metaspace and the older
 *                                 Prepend/Replace normalizer), written by
 *                                 transformers' converter; golden ids from
 *                                 HF tokenizers (tools/gen_spm_hf_golden.py);
 *                                 spm_tiny_split_tokenizer.json: Metaspace
 *                                 with split and prepend_scheme "always". */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void src_path(char *out, size_t cap, const char *rel) {
    const char *root = getenv("LUAINFER_SOURCE_DIR");
    if (root && *root) snprintf(out, cap, "%s/%s", root, rel);
    else snprintf(out, cap, "%s", rel);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 24 ? " ...\n" : "\n");
}

/* ==== golden corpus ============================================================== */

static void test_golden(const li_tokenizer *t, const char *name, const char *rel) {
    char path[1024], cmd[1100];
    src_path(path, sizeof path, rel);
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run %s", cmd);
    if (!f) return;
    size_t n = 0, same = 0, rt_n = 0, rt_ok = 0, shown = 0;
    char *line = NULL, dec[4096];
    size_t line_cap = 0;
    while (getline(&line, &line_cap, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "text");
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "ids");
        if (!cJSON_IsString(jt) || !cJSON_IsArray(ji)) {
            CHECK(0, "bad golden line %zu", n + 1);
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
        CHECK(li_tokenizer_encode(t, text, len, false, true, &ids, &n_ids, &err) == 0, "%s", err.msg);
        n++;
        if (n_ids == (size_t)n_ref && (n_ids == 0 || memcmp(ids, ref, n_ids * sizeof *ids) == 0)) {
            same++;
        } else if (shown++ < 10) {
            fprintf(stderr, "MISMATCH text=\"%.80s\"\n", text);
            print_ids("ref", ref, (size_t)n_ref);
            print_ids("got", ids, n_ids);
        }
        if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "rt"))) {
            rt_n++;
            long dn = li_tokenizer_decode(t, ids, n_ids, true, dec, sizeof dec);
            if (dn == (long)len && memcmp(dec, text, len) == 0) rt_ok++;
            else if (shown++ < 10)
                fprintf(stderr, "ROUNDTRIP text=\"%.80s\" decoded=\"%.*s\"\n", text,
                        (int)LI_MIN(LI_MAX(dn, 0), (long)sizeof dec), dec);
        }
        free(ids);
        free(ref);
        cJSON_Delete(j);
    }
    free(line);
    int st = pclose(f);
    CHECK(st == 0 && n > 0, "reading %s failed (status %d, %zu lines)", path, st, n);
    printf("tokenizer %s: %zu/%zu identical, %zu/%zu round-trip\n", name, same, n, rt_ok, rt_n);
    CHECK(same == n, "%s: %zu strings differ", name, n - same);
    CHECK(rt_ok == rt_n, "%s: %zu strings do not round-trip", name, rt_n - rt_ok);
}

/* ==== unit checks ================================================================= */

static void test_spm(const li_tokenizer *t) {
    li_error err = {0};
    int32_t *ids;
    size_t n;
    CHECK(li_tokenizer_add_bos(t) && li_tokenizer_bos(t) == 1 && li_tokenizer_eos(t) == 2, "bos/eos");
    CHECK(li_tokenizer_is_eog(t, 2) && !li_tokenizer_is_eog(t, 1), "eog");

    /* add_special: BOS first; empty text gives only BOS. */
    CHECK(li_tokenizer_encode(t, "", 0, true, true, &ids, &n, &err) == 0 && n == 1 && ids[0] == 1, "BOS only");
    free(ids);
    CHECK(li_tokenizer_encode(t, "", 0, false, true, &ids, &n, &err) == 0 && n == 0, "empty");
    free(ids);

    /* A character outside the vocabulary goes out as its UTF-8 bytes. */
    const char *clef = "\xF0\x9D\x84\x9E"; /* U+1D11E */
    CHECK(li_tokenizer_encode(t, clef, 4, false, true, &ids, &n, &err) == 0, "encode");
    int32_t f0 = li_tokenizer_find(t, "<0xF0>", 6);
    CHECK(f0 >= 0 && n >= 4 && ids[n - 4] == f0, "byte fallback");
    char dec[64];
    long dn = li_tokenizer_decode(t, ids, n, true, dec, sizeof dec);
    CHECK(dn == 4 && memcmp(dec, clef, 4) == 0, "byte fallback round-trip (%ld)", dn);
    free(ids);

    /* Pieces: <0x41> is "A"; <unk> hidden is U+2585 as in llama.cpp; "▁" is a space. */
    char p[16];
    CHECK(li_tokenizer_token_to_piece(t, li_tokenizer_find(t, "<0x41>", 6), false, p, sizeof p) == 1 && p[0] == 'A',
          "byte piece");
    CHECK(li_tokenizer_token_to_piece(t, 0, false, p, sizeof p) == 3 && memcmp(p, "\xE2\x96\x85", 3) == 0, "unk");
    CHECK(li_tokenizer_token_to_piece(t, 0, true, p, sizeof p) == 5 && memcmp(p, "<unk>", 5) == 0, "unk text");
    CHECK(li_tokenizer_token_to_piece(t, li_tokenizer_find(t, "\xE2\x96\x81", 3), false, p, sizeof p) == 1 &&
              p[0] == ' ', "space piece");

    /* parse_special off: <s> is text, the user-defined <sep> still matches. */
    const char *s = "<s>a<sep>b";
    CHECK(li_tokenizer_encode(t, s, strlen(s), false, false, &ids, &n, &err) == 0, "encode");
    bool bos = false, sep = false;
    for (size_t i = 0; i < n; i++) {
        bos |= ids[i] == 1;
        sep |= ids[i] == li_tokenizer_find(t, "<sep>", 5);
    }
    CHECK(!bos && sep, "parse_special=false");
    free(ids);

    /* Streaming: the 4 byte tokens of U+1D11E give nothing until the last. */
    CHECK(li_tokenizer_encode(t, clef, 4, false, true, &ids, &n, &err) == 0, "encode");
    li_detok d;
    li_detok_init(&d);
    size_t k = 0;
    char out[64];
    for (size_t i = 0; i < n; i++) {
        int w = li_detok_push(&d, t, ids[i], true, out + k, sizeof out - k);
        CHECK(w >= 0, "push");
        if (w > 0) k += (size_t)w;
        if (i + 1 < n) CHECK(k <= 3 && (k == 0 || out[0] == ' '), "partial output at %zu", i);
    }
    CHECK(li_detok_flush(&d, out + k, sizeof out - k) == 0, "flush");
    CHECK(k >= 4 && memcmp(out + k - 4, clef, 4) == 0, "streamed clef");
    free(ids);
}

/* ==== hand-made GGUF files: odd and broken vocabularies ======================== */

/* A tiny in-memory GGUF v3 writer (no tensors). */
typedef struct gbuf {
    uint8_t b[8192];
    size_t n;
    uint64_t n_kv;
} gbuf;

static void put(gbuf *g, const void *p, size_t n) {
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void put_u32(gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(gbuf *g, uint64_t v) { put(g, &v, 8); }
static void put_str(gbuf *g, const char *s) {
    put_u64(g, strlen(s));
    put(g, s, strlen(s));
}
static void kv_str(gbuf *g, const char *k, const char *v) {
    put_str(g, k);
    put_u32(g, 8);
    put_str(g, v);
    g->n_kv++;
}
static void kv_i32(gbuf *g, const char *k, int32_t v) {
    put_str(g, k);
    put_u32(g, 5);
    put(g, &v, 4);
    g->n_kv++;
}
static void kv_strs(gbuf *g, const char *k, const char *const *v, size_t n) {
    put_str(g, k);
    put_u32(g, 9);
    put_u32(g, 8);
    put_u64(g, n);
    for (size_t i = 0; i < n; i++) put_str(g, v[i]);
    g->n_kv++;
}
static void kv_i32s(gbuf *g, const char *k, const int32_t *v, size_t n) {
    put_str(g, k);
    put_u32(g, 9);
    put_u32(g, 5);
    put_u64(g, n);
    put(g, v, 4 * n);
    g->n_kv++;
}

/* Prepends the header to the kv bytes in body and opens the result. */
static int open_gguf(li_gguf *out, const gbuf *body, uint8_t *file, size_t *size) {
    gbuf h = {.n = 0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, 0);
    put_u64(&h, body->n_kv);
    memcpy(file, h.b, h.n);
    memcpy(file + h.n, body->b, body->n);
    *size = h.n + body->n;
    while (*size % 32) file[(*size)++] = 0;
    li_error err = {0};
    return li_gguf_init_from_memory(out, file, *size, &err);
}

static int try_init(const gbuf *body, li_tokenizer **t, li_error *err) {
    static uint8_t file[16384];
    size_t size;
    li_gguf g;
    *t = NULL;
    if (open_gguf(&g, body, file, &size) != 0) return -100;
    int rc = li_tokenizer_init(t, &g, err);
    li_gguf_free(&g);
    return rc;
}

static void test_handmade(void) {
    static const char *const toks[] = {"a", "b", "ab", "<|x|>", "", "a", "\xC4\xA0"};
    static const int32_t types[] = {1, 1, 1, 3, 1, 1, 1};
    static const char *const merges[] = {"a b", "bad", "x y", " a", "b a"};
    li_error err = {0};
    li_tokenizer *t;
    gbuf g;

    g = (gbuf){.n = 0};
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    CHECK(try_init(&g, &t, &err) == LI_EINVAL, "no model: %s", err.msg);

    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "bert");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    CHECK(try_init(&g, &t, &err) == LI_EUNSUP, "bert: %s", err.msg);

    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "no-such-pre");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 5);
    CHECK(try_init(&g, &t, &err) == LI_EUNSUP, "unknown pre: %s", err.msg);

    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    CHECK(try_init(&g, &t, &err) == LI_EINVAL, "no merges: %s", err.msg);

    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 5);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 6);
    CHECK(try_init(&g, &t, &err) == LI_EINVAL, "type count: %s", err.msg);

    /* Valid but odd: a duplicate "a", an empty token, bad merges, ids out of range. */
    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "smollm");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 7);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 5);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 7);
    kv_i32(&g, "tokenizer.ggml.bos_token_id", 99);
    kv_i32(&g, "tokenizer.ggml.eos_token_id", -1);
    CHECK(try_init(&g, &t, &err) == 0, "odd vocab: %s", err.msg);
    if (t) {
        CHECK(li_tokenizer_bos(t) == -1 && li_tokenizer_eos(t) == -1, "ids out of range are none");
        CHECK(li_tokenizer_find(t, "a", 1) == 5, "a duplicate text maps to its last id");
        int32_t *ids;
        size_t n;
        const char *s = "ab<|x|>ba zz";
        CHECK(li_tokenizer_encode(t, s, strlen(s), true, true, &ids, &n, &err) == 0, "encode");
        /* "ab" merges; <|x|> is special; "ba" has no merge; " " spells; z is dropped. */
        int32_t want[] = {2, 3, 1, 5, 6};
        CHECK(n == 5 && memcmp(ids, want, sizeof want) == 0, "odd vocab ids (%zu)", n);
        char dec[32];
        long dn = li_tokenizer_decode(t, ids, n, true, dec, sizeof dec);
        CHECK(dn == 10 && memcmp(dec, "ab<|x|>ba ", 10) == 0, "odd vocab decode (%ld)", dn);
        free(ids);
        li_tokenizer_free(t);
    }

    /* SPM without scores or byte tokens: unknown characters become <unk>. */
    /* "\xE2\x96\x81" "a" is split because a is a hex digit (the parentheses
     * say the concatenation is meant) */
    static const char *const spm_toks[] = {"<unk>", "<s>", "</s>", ("\xE2\x96\x81" "a"), "a", "\xE2\x96\x81"};
    g = (gbuf){.n = 0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", spm_toks, 6);
    CHECK(try_init(&g, &t, &err) == 0, "bare spm: %s", err.msg);
    if (t) {
        int32_t *ids;
        size_t n;
        CHECK(li_tokenizer_encode(t, "a z", 3, true, true, &ids, &n, &err) == 0, "encode");
        int32_t want[] = {1, 3, 5, 0};
        CHECK(n == 4 && memcmp(ids, want, sizeof want) == 0, "bare spm ids (%zu)", n);
        free(ids);
        li_tokenizer_free(t);
    }
}

static void test_llama3(const li_tokenizer *t) {
    li_error err = {0};
    int32_t *ids;
    size_t n;
    int32_t bot = li_tokenizer_find(t, "<|begin_of_text|>", 17);
    int32_t eot = li_tokenizer_find(t, "<|eot_id|>", 10);
    int32_t eos = li_tokenizer_find(t, "<|end_of_text|>", 15);
    CHECK(li_tokenizer_add_bos(t) && li_tokenizer_bos(t) == bot && bot >= 0, "bos");
    CHECK(li_tokenizer_is_eog(t, eot) && li_tokenizer_is_eog(t, eos) && !li_tokenizer_is_eog(t, bot), "eog");
    CHECK(li_tokenizer_encode(t, "Hi", 2, true, true, &ids, &n, &err) == 0 && n >= 2 && ids[0] == bot, "BOS");
    free(ids);
    /* A whole-word token no merge reaches comes out whole (ignore_merges). */
    int32_t w = li_tokenizer_find(t, "\xC4\xA0" "flibbertigibbet", 17);
    CHECK(w >= 0, "test vocabulary lacks its unreachable word");
    CHECK(li_tokenizer_encode(t, " flibbertigibbet", 16, false, true, &ids, &n, &err) == 0 && n == 1 && ids[0] == w,
          "ignore_merges (%zu ids)", n);
    free(ids);
}

static li_tokenizer *load(const char *rel) {
    char path[1024];
    src_path(path, sizeof path, rel);
    li_gguf g;
    li_error err = {0};
    if (li_gguf_open(&g, path, &err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return NULL;
    }
    li_tokenizer *t = NULL;
    if (li_tokenizer_init(&t, &g, &err) != 0) fprintf(stderr, "FAIL: %s: %s\n", path, err.msg);
    li_gguf_free(&g);
    return t;
}

/* A tokenizer.json from the source tree. */
static li_tokenizer *load_json(const char *rel) {
    char path[1024];
    src_path(path, sizeof path, rel);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    li_tokenizer *t = NULL;
    li_error err = {0};
    if (got != (size_t)n || li_tokenizer_init_hf(&t, buf, (size_t)n, rel, NULL, &err) != 0)
        fprintf(stderr, "FAIL: %s: %s\n", path, err.msg);
    free(buf);
    return t;
}

/* spm_tiny_tokenizer.json with `from` replaced by `to` (once) must be refused
 * with a message holding `needle`. */
static void refuse_edit(const char *rel, const char *from, const char *to, const char *needle) {
    char path[1024];
    src_path(path, sizeof path, rel);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    rewind(f);
    char *buf = malloc(n + 1);
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    buf[got] = 0;
    char *at = strstr(buf, from);
    CHECK(at != NULL, "'%s' is not in %s", from, rel);
    if (at) {
        size_t fl = strlen(from), tl = strlen(to), head = (size_t)(at - buf);
        char *e = malloc(got - fl + tl + 1);
        memcpy(e, buf, head);
        memcpy(e + head, to, tl);
        memcpy(e + head + tl, at + fl, got - head - fl);
        li_tokenizer *t = NULL;
        li_error err = {0};
        int rc = li_tokenizer_init_hf(&t, e, got - fl + tl, rel, NULL, &err);
        CHECK(rc != 0 && strstr(err.msg, needle), "'%s' -> '%s': want an error with '%s', got rc %d '%s'", from, to,
              needle, rc, err.msg);
        li_tokenizer_free(t);
        free(e);
    }
    free(buf);
}

static void test_spm_json_refused(void) {
    const char *m = "tests/golden/spm_tiny_tokenizer.json", *l = "tests/golden/spm_tiny_legacy_tokenizer.json";
    refuse_edit(m, "\"prepend_scheme\": \"first\"", "\"prepend_scheme\": \"sometimes\"", "Metaspace");
    refuse_edit(m, "\"replacement\": \"\xE2\x96\x81\"", "\"replacement\": \"_\"", "Metaspace");
    refuse_edit(m, "\"type\": \"ByteFallback\"", "\"type\": \"WordPiece\"", "decoder step 'WordPiece'");
    refuse_edit(m, "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}", "not both");
    refuse_edit(l, "\"type\": \"Prepend\"", "\"type\": \"NFKC\"", "normalizer 'Sequence'");
    refuse_edit(l, "\"normalizer\": {", "\"pre_tokenizer2\": 0, \"normalizer\": null, \"x\": {", "neither");
}

/* The HF loader's SentencePiece tokenizer has the GGUF's vocabulary. */
static void test_spm_json_vocab(const li_tokenizer *h, const li_tokenizer *g) {
    CHECK(li_tokenizer_n_vocab(h) == li_tokenizer_n_vocab(g), "n_vocab %d vs %d", li_tokenizer_n_vocab(h),
          li_tokenizer_n_vocab(g));
    CHECK(li_tokenizer_vocab_hash(h) == li_tokenizer_vocab_hash(g), "vocab hash differs");
    char a[64], b[64];
    int32_t nl = li_tokenizer_find(g, "<0x0A>", 6);
    CHECK(nl >= 0 && li_tokenizer_token_to_piece(h, nl, true, a, sizeof a) == 1 && a[0] == '\n',
          "<0x0A> decodes to a newline");
    int na = li_tokenizer_token_to_piece(h, 260, true, a, sizeof a), nb = li_tokenizer_token_to_piece(g, 260, true, b, sizeof b);
    CHECK(na == nb && na > 0 && !memcmp(a, b, (size_t)na), "token 260's piece");
}

int main(void) {
    test_handmade();
    li_tokenizer *spm = load("tests/golden/spm_tiny.gguf");
    li_tokenizer *l3 = load("tests/golden/tokenizer_llama3_tiny.gguf");
    if (!spm || !l3) return 1;
    test_spm(spm);
    test_golden(spm, "spm", "tests/golden/spm_tiny.jsonl.gz");
    test_llama3(l3);
    test_golden(l3, "llama3", "tests/golden/tokenizer_llama3_tiny.jsonl.gz");
    li_tokenizer *hj = load_json("tests/golden/spm_tiny_tokenizer.json");
    li_tokenizer *hl = load_json("tests/golden/spm_tiny_legacy_tokenizer.json");
    CHECK(hj && hl, "the SentencePiece tokenizer.json files load");
    if (hj) {
        test_spm_json_vocab(hj, spm);
        test_golden(hj, "spm tokenizer.json (Metaspace)", "tests/golden/spm_tiny_hf.jsonl.gz");
    }
    if (hl) test_golden(hl, "spm tokenizer.json (Prepend/Replace)", "tests/golden/spm_tiny_legacy_hf.jsonl.gz");
    li_tokenizer *hs = load_json("tests/golden/spm_tiny_split_tokenizer.json");
    CHECK(hs != NULL, "the Metaspace split tokenizer.json loads");
    if (hs) test_golden(hs, "spm tokenizer.json (Metaspace split, always)", "tests/golden/spm_tiny_split_hf.jsonl.gz");
    li_tokenizer_free(hs);
    test_spm_json_refused();
    li_tokenizer_free(hj);
    li_tokenizer_free(hl);
    li_tokenizer_free(spm);
    li_tokenizer_free(l3);
    if (t_failed) {
        fprintf(stderr, "test_tokenizer_small: %d check(s) failed\n", t_failed);
        return 1;
    }
    printf("test_tokenizer_small: OK\n");
    return 0;
}
