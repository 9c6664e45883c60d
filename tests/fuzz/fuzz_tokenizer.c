/* fuzz_tokenizer.c — arbitrary bytes through encode, decode and the
 * streaming detokenizer of the real model's tokenizer (byte-level BPE, SmolLM
 * rules), and of the small test vocabularies in tests/golden/
 * (SentencePiece from GGUF and from a Metaspace tokenizer.json; byte-level
 * BPE with Llama 3 rules).
 *
 * Oracles beyond "no crash": for byte-level BPE, decode(encode(x)) must be x
 * with only the bytes the vocabulary cannot spell removed; every id must be
 * in range; the streamed text must be valid UTF-8. Both tokenizers are loaded
 * once, lazily; one whose file is missing is skipped (LUAINFER_MODEL, else
 * models/SmolLM2-135M-Instruct.Q4_1.gguf under the source tree). */
#define _GNU_SOURCE
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef LI_SOURCE_DIR
#define LI_SOURCE_DIR "."
#endif

typedef struct target {
    li_tokenizer *t;
    bool byte_level;     /* decode(encode(x)) is x minus unspellable bytes */
    bool spellable[256]; /* bytes the vocabulary has a token for */
} target;

static target targets[4];

static li_tokenizer *load(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    li_gguf g;
    li_error err = {0};
    if (li_gguf_open(&g, path, &err) != 0) return NULL;
    li_tokenizer *t = NULL;
    if (li_tokenizer_init(&t, &g, &err) != 0) t = NULL;
    li_gguf_free(&g);
    return t;
}

static li_tokenizer *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = n > 0 ? malloc((size_t)n) : NULL;
    li_tokenizer *t = NULL;
    li_error err = {0};
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n || li_tokenizer_init_hf(&t, buf, (size_t)n, path, NULL, &err) != 0)
        t = NULL;
    free(buf);
    fclose(f);
    return t;
}

static void init_once(void) {
    static bool done;
    if (done) return;
    done = true;
    const char *model = getenv("LUAINFER_MODEL");
    targets[0].t = load(model && *model ? model : LI_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    targets[0].byte_level = true;
    targets[1].t = load(LI_SOURCE_DIR "/tests/golden/tokenizer_llama3_tiny.gguf");
    targets[1].byte_level = true;
    targets[2].t = load(LI_SOURCE_DIR "/tests/golden/spm_tiny.gguf");
    targets[3].t = load_json(LI_SOURCE_DIR "/tests/golden/spm_tiny_tokenizer.json");
    for (size_t k = 0; k < 2; k++) {
        if (!targets[k].t) continue;
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            int32_t *ids;
            size_t n;
            li_error err = {0};
            if (li_tokenizer_encode(targets[k].t, &c, 1, false, false, &ids, &n, &err) == 0)
                targets[k].spellable[b] = n == 1;
            free(ids);
        }
    }
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || len > n - i) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

/* Encodes, decodes and streams; returns the decoded text (malloc'd). */
static char *run(const li_tokenizer *t, const uint8_t *data, size_t size, bool add_special, bool parse_special,
                 long *dn) {
    int32_t *ids;
    size_t n;
    li_error err = {0};
    if (li_tokenizer_encode(t, (const char *)data, size, add_special, parse_special, &ids, &n, &err) != 0) abort();
    int32_t nv = li_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) abort();

    *dn = li_tokenizer_decode(t, ids, n, true, NULL, 0);
    if (*dn < 0) abort();
    char *dec = malloc((size_t)*dn + 1);
    if (li_tokenizer_decode(t, ids, n, true, dec, (size_t)*dn + 1) != *dn) abort();

    /* Streaming output is always valid UTF-8, piece by piece. */
    size_t cap = (size_t)*dn * 3 + 16, k = 0;
    char *out = malloc(cap);
    li_detok d;
    li_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        int w = li_detok_push(&d, t, ids[i], true, out + k, cap - k);
        if (w < 0) abort();
        k += (size_t)w;
    }
    int w = li_detok_flush(&d, out + k, cap - k);
    if (w < 0) abort();
    k += (size_t)w;
    if (!valid_utf8(out, k)) abort();
    free(out);
    free(ids);
    return dec;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    if (size > (1u << 16)) return 0;
    char *want = malloc(size + 1);
    for (size_t k = 0; k < LI_ARRAY_LEN(targets); k++) {
        const target *tg = &targets[k];
        if (!tg->t) continue;
        if (!tg->byte_level) {
            long dn;
            free(run(tg->t, data, size, true, size > 0 && (data[0] & 1), &dn));
            continue;
        }
        /* Byte-level BPE loses only the bytes it cannot spell. */
        size_t wn = 0;
        for (size_t i = 0; i < size; i++)
            if (tg->spellable[data[i]]) want[wn++] = (char)data[i];
        for (int ps = 0; ps < 2; ps++) {
            long dn;
            char *dec = run(tg->t, data, size, false, ps, &dn);
            if ((size_t)dn != wn || memcmp(dec, want, wn) != 0) abort();
            free(dec);
        }
    }
    free(want);
    return 0;
}
