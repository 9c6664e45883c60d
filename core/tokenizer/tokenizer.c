/* tokenizer.c — the tokenizer subsystem. Owns: building a tokenizer from a
 * GGUF vocabulary, special-token matching, the encode driver, token pieces,
 * whole-sequence decoding and the streaming detokenizer.
 *
 * Encoding is: split the text at special tokens (leftmost-longest), then for
 * each plain fragment either pre-tokenize + byte-level BPE (gpt2) or escape +
 * SentencePiece BPE (llama). See tok_pretok.c and tok_bpe.c. */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== loading ================================================================ */

/* Looks up an optional token id key; a negative or out-of-range id means
 * "none" (-1), as in llama.cpp, rather than a broken file. */
static int load_id(const li_gguf *g, const char *key, int32_t n_vocab, int32_t *out, li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return 0;
    if (kv->type == LI_GGUF_INT8 || kv->type == LI_GGUF_INT16 || kv->type == LI_GGUF_INT32 ||
        kv->type == LI_GGUF_INT64) {
        if (kv->v.i64 < 0) {
            *out = -1;
            return 0;
        }
    }
    uint64_t v;
    int rc = li_gguf_get_u64(g, key, &v, err);
    if (rc < 0) return rc;
    if (v < (uint64_t)n_vocab) {
        *out = (int32_t)v;
    } else {
        li_log_warn("tokenizer: %s = %llu is outside the vocabulary (%d), ignored", key,
                    (unsigned long long)v, n_vocab);
        *out = -1;
    }
    return 0;
}

static int load_bool(const li_gguf *g, const char *key, bool *out, li_error *err) {
    int rc = li_gguf_get_bool(g, key, out, err);
    return rc < 0 ? rc : 0;
}

static bool str_in(li_str s, const char *const *names) {
    for (; *names; names++)
        if (li_str_eq(s, *names)) return true;
    return false;
}

/* Which split rule a `tokenizer.ggml.pre` name means (llama.cpp's grouping).
 * Names we have not checked against a reference are refused rather than
 * guessed, since a wrong split silently changes every prompt. */
static int load_pre(li_tokenizer *t, const li_gguf *g, li_error *err) {
    static const char *const gpt2[] = {"gpt2", "mpt", "olmo", "jais", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", "command-r", "codeshell",
                                         "exaone", "minerva-7b", NULL};
    /* Llama 3 and its kin also skip merging for words that are whole tokens
     * ("ignore_merges" in their tokenizer.json) and add BOS by default. */
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                         "pixtral", "midm-2.0", "lfm2", NULL};
    static const char *const llama3_regex[] = {"dbrx", "smaug-bpe", NULL};
    li_str s;
    int rc = li_gguf_get_str(g, "tokenizer.ggml.pre", &s, err);
    if (rc < 0) return rc;
    if (rc == 1 || li_str_eq(s, "default")) {
        /* llama.cpp's "default" adds punctuation and 3-digit splits of its
         * own; no HF tokenizer does that, so we use plain GPT-2 rules. */
        li_log_warn("tokenizer: pre-tokenizer '%s', using GPT-2 rules",
                    rc == 1 ? "(missing)" : "default");
        t->pre = LI_TOK_PRE_GPT2;
    } else if (str_in(s, gpt2)) {
        t->pre = LI_TOK_PRE_GPT2;
    } else if (str_in(s, smollm)) {
        t->pre = LI_TOK_PRE_SMOLLM;
    } else if (str_in(s, llama3)) {
        t->pre = LI_TOK_PRE_LLAMA3;
        t->ignore_merges = true;
        t->add_bos = true;
    } else if (str_in(s, llama3_regex)) {
        t->pre = LI_TOK_PRE_LLAMA3;
    } else {
        return li_error_set(err, LI_EUNSUP, "tokenizer: pre-tokenizer '%.*s' is not supported",
                            (int)LI_MIN(s.len, 64), s.ptr);
    }
    return 0;
}

static int load_vocab(li_tokenizer *t, const li_gguf *g, li_error *err) {
    const li_gguf_kv *kv = li_gguf_get_arr(g, "tokenizer.ggml.tokens", LI_GGUF_STRING, err);
    if (!kv) {
        if (li_gguf_find_kv(g, "tokenizer.ggml.tokens")) return LI_EINVAL;
        return li_error_set(err, LI_EINVAL, "tokenizer: no tokenizer.ggml.tokens in the file");
    }
    if (kv->v.arr.n == 0 || kv->v.arr.n > (uint64_t)INT32_MAX - 1)
        return li_error_set(err, LI_EINVAL, "tokenizer: bad vocabulary size %llu",
                            (unsigned long long)kv->v.arr.n);
    t->n_vocab = (int32_t)kv->v.arr.n;
    uint64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += kv->v.arr.strs[i].len;
    if (total >= UINT32_MAX)
        return li_error_set(err, LI_EINVAL, "tokenizer: vocabulary text too large (%llu bytes)",
                            (unsigned long long)total);
    t->text = li_xmalloc(total + 1);
    t->text_off = li_xmalloc(((size_t)t->n_vocab + 1) * sizeof *t->text_off);
    uint32_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        li_str s = kv->v.arr.strs[i];
        t->text_off[i] = off;
        if (s.len) memcpy(t->text + off, s.ptr, s.len);
        off += (uint32_t)s.len;
    }
    t->text_off[t->n_vocab] = off;

    t->type = li_xmalloc((size_t)t->n_vocab);
    memset(t->type, LI_TOKEN_TYPE_NORMAL, (size_t)t->n_vocab);
    if (li_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        const li_gguf_kv *ty = li_gguf_get_arr(g, "tokenizer.ggml.token_type", LI_GGUF_INT32, err);
        if (!ty) return LI_EINVAL;
        if (ty->v.arr.n != (uint64_t)t->n_vocab)
            return li_error_set(err, LI_EINVAL, "tokenizer: %llu token types for %d tokens",
                                (unsigned long long)ty->v.arr.n, t->n_vocab);
        for (int32_t i = 0; i < t->n_vocab; i++) {
            int32_t v;
            memcpy(&v, ty->v.arr.data + 4 * (size_t)i, 4);
            t->type[i] = v >= 0 && v <= LI_TOKEN_TYPE_BYTE ? (uint8_t)v : LI_TOKEN_TYPE_UNDEFINED;
        }
    }

    if (li_gguf_find_kv(g, "tokenizer.ggml.scores")) {
        const li_gguf_kv *sc = li_gguf_get_arr(g, "tokenizer.ggml.scores", LI_GGUF_FLOAT32, err);
        if (!sc) return LI_EINVAL;
        if (sc->v.arr.n != (uint64_t)t->n_vocab)
            return li_error_set(err, LI_EINVAL, "tokenizer: %llu scores for %d tokens",
                                (unsigned long long)sc->v.arr.n, t->n_vocab);
        t->score = li_xmalloc((size_t)t->n_vocab * sizeof *t->score);
        memcpy(t->score, sc->v.arr.data, (size_t)t->n_vocab * sizeof *t->score);
    }
    return 0;
}

static int load_merges(li_tokenizer *t, const li_gguf *g, li_error *err) {
    const li_gguf_kv *kv = li_gguf_get_arr(g, "tokenizer.ggml.merges", LI_GGUF_STRING, err);
    if (!kv) {
        if (li_gguf_find_kv(g, "tokenizer.ggml.merges")) return LI_EINVAL;
        return li_error_set(err, LI_EINVAL, "tokenizer: gpt2 vocabulary without tokenizer.ggml.merges");
    }
    if (kv->v.arr.n > (uint64_t)INT32_MAX)
        return li_error_set(err, LI_EINVAL, "tokenizer: too many merges");
    uint32_t n = (uint32_t)kv->v.arr.n;
    li_tok_pairmap_init(&t->merges, n);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    uint32_t skipped = 0;
    for (uint32_t i = 0; i < n; i++) {
        li_str s = kv->v.arr.strs[i];
        /* "left right", split at the first space after the first byte. */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            skipped++;
            continue;
        }
        size_t ln = (size_t)(sp - s.ptr), rn = s.len - ln - 1;
        int32_t l = li_tok_strmap_get(&t->vocab, t, s.ptr, ln);
        int32_t r = li_tok_strmap_get(&t->vocab, t, sp + 1, rn);
        if (ln + rn > tmp_cap) {
            tmp_cap = (ln + rn) * 2;
            tmp = li_xrealloc(tmp, tmp_cap);
        }
        memcpy(tmp, s.ptr, ln);
        memcpy(tmp + ln, sp + 1, rn);
        int32_t res = li_tok_strmap_get(&t->vocab, t, tmp, ln + rn);
        if (l < 0 || r < 0 || res < 0) {
            /* HF refuses such a file; llama.cpp would build a symbol no
             * token spells. Neither can be matched, so the merge is dropped. */
            skipped++;
            continue;
        }
        li_tok_pairmap_put(&t->merges, l, r, (int32_t)i, res);
    }
    free(tmp);
    if (skipped) li_log_warn("tokenizer: %u of %u merges skipped (malformed or not in vocabulary)", skipped, n);
    return 0;
}

/* ---- pieces: the bytes each token decodes to --------------------------------- */

static size_t utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses "<0xXX>"; -1 if s is not that shape. */
static int parse_byte_token(const char *s, uint32_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Writes token id's decoded bytes to o and returns their count. Decoding
 * never makes a token longer than its text, so o needs that much room. */
static uint32_t piece_build(const li_tokenizer *t, int32_t id, const int16_t *cp_byte, char *o) {
    uint32_t n;
    const char *s = li_tok_text(t, id, &n);
    int ty = t->type[id];
    if (ty == LI_TOKEN_TYPE_CONTROL || ty == LI_TOKEN_TYPE_USER_DEFINED || ty == LI_TOKEN_TYPE_UNKNOWN) {
        memcpy(o, s, n);
        return n;
    }
    if (ty != LI_TOKEN_TYPE_NORMAL && ty != LI_TOKEN_TYPE_BYTE) return 0; /* unused, undefined */
    uint32_t k = 0;
    if (t->model == LI_TOK_MODEL_SPM) {
        if (ty == LI_TOKEN_TYPE_BYTE) {
            int b = parse_byte_token(s, n);
            if (b >= 0) o[k++] = (char)b;
            return k;
        }
        for (uint32_t i = 0; i < n;) {
            if (n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                o[k++] = ' ';
                i += 3;
            } else {
                o[k++] = s[i++];
            }
        }
        return k;
    }
    if (ty == LI_TOKEN_TYPE_BYTE) return 0; /* llama.cpp prints nothing for these in BPE */
    /* Byte-level: every char of the GPT-2 alphabet is one byte. A char
     * outside it passes through as UTF-8, like HF's ByteLevel decoder. */
    for (uint32_t i = 0; i < n;) {
        int len = li_tok_utf8_check((const uint8_t *)s + i, n - i);
        if (len <= 0) {
            o[k++] = s[i++];
            continue;
        }
        uint32_t cp;
        const uint8_t *u = (const uint8_t *)s + i;
        cp = len == 1 ? u[0] : len == 2 ? (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F) : 0xFFFFFFFF;
        if (cp < 0x200 && cp_byte[cp] >= 0) {
            o[k++] = (char)cp_byte[cp];
        } else {
            memcpy(o + k, s + i, (size_t)len);
            k += (uint32_t)len;
        }
        i += (uint32_t)len;
    }
    return k;
}

static void load_pieces(li_tokenizer *t) {
    int16_t cp_byte[0x200];
    for (int i = 0; i < 0x200; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[li_tok_byte_to_cp((uint8_t)b)] = (int16_t)b;
    /* A piece is never longer than the token's text. */
    t->piece = li_xmalloc((size_t)t->text_off[t->n_vocab] + 1);
    t->piece_off = li_xmalloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    uint32_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = off;
        off += piece_build(t, id, cp_byte, t->piece + off);
    }
    t->piece_off[t->n_vocab] = off;
}

/* ---- special tokens and end-of-generation ------------------------------------- */

typedef struct special_key {
    uint32_t len;
    int32_t id;
} special_key;

static int special_cmp(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void load_specials(li_tokenizer *t) {
    special_key *keys = li_xmalloc((size_t)t->n_vocab * sizeof *keys);
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int ty = t->type[id];
        uint32_t len;
        const char *s = li_tok_text(t, id, &len);
        if (len == 0) continue;
        if (ty == LI_TOKEN_TYPE_CONTROL || ty == LI_TOKEN_TYPE_USER_DEFINED || ty == LI_TOKEN_TYPE_UNKNOWN) {
            keys[n++] = (special_key){.len = len, .id = id};
            t->special_first[(uint8_t)s[0]] = 1;
        }
    }
    /* Longest first, so the first hit at a position is the longest one. */
    qsort(keys, (size_t)n, sizeof *keys, special_cmp);
    t->special = li_xmalloc(((size_t)n + 1) * sizeof *t->special);
    for (int32_t i = 0; i < n; i++) t->special[i] = keys[i].id;
    t->n_special = n;
    free(keys);
}

static void eog_add(li_tokenizer *t, int32_t id) {
    if (id < 0 || t->n_eog >= LI_TOK_MAX_EOG) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

static void load_eog(li_tokenizer *t) {
    /* The texts llama.cpp's vocabulary loader treats as end of generation. */
    static const char *const names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", NULL};
    eog_add(t, t->eos);
    eog_add(t, t->eot);
    eog_add(t, t->eom);
    for (int i = 0; names[i]; i++) eog_add(t, li_tok_strmap_get(&t->vocab, t, names[i], strlen(names[i])));
}

/* ---- init / free ------------------------------------------------------------------ */

void li_tok_finish(li_tokenizer *t) {
    bool spm = t->model == LI_TOK_MODEL_SPM;
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t n;
        if (spm) n = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
        else n = utf8_encode(li_tok_byte_to_cp((uint8_t)b), buf);
        t->byte_tok[b] = li_tok_strmap_get(&t->vocab, t, buf, n);
    }
    load_pieces(t);
    load_specials(t);
    load_eog(t);
}

int li_tokenizer_init(li_tokenizer **out, const li_gguf *g, li_error *err) {
    *out = NULL;
    li_tokenizer *t = li_xcalloc(1, sizeof *t);
    t->bos = t->eos = t->unk = t->eot = t->eom = -1;
    int rc;

    li_str model;
    rc = li_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc < 0) goto fail;
    if (rc == 1) {
        rc = li_error_set(err, LI_EINVAL, "tokenizer: no tokenizer.ggml.model in the file");
        goto fail;
    }
    if (li_str_eq(model, "gpt2")) {
        t->model = LI_TOK_MODEL_BPE;
        if ((rc = load_pre(t, g, err))) goto fail;
    } else if (li_str_eq(model, "llama")) {
        t->model = LI_TOK_MODEL_SPM;
    } else {
        rc = li_error_set(err, LI_EUNSUP, "tokenizer: tokenizer model '%.*s' is not supported",
                          (int)LI_MIN(model.len, 64), model.ptr);
        goto fail;
    }

    if ((rc = load_vocab(t, g, err))) goto fail;
    li_tok_strmap_init(&t->vocab, t);
    if (t->model == LI_TOK_MODEL_BPE && (rc = load_merges(t, g, err))) goto fail;

    /* llama.cpp's defaults for SentencePiece files that leave these out. */
    bool spm = t->model == LI_TOK_MODEL_SPM;
    if (spm) {
        t->unk = 0;
        t->bos = t->n_vocab > 1 ? 1 : -1;
        t->eos = t->n_vocab > 2 ? 2 : -1;
    }
    t->add_bos = t->add_bos || spm;
    t->add_space_prefix = spm;
    if ((rc = load_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err)) ||
        (rc = load_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err)) ||
        (rc = load_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err)) ||
        (rc = load_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err)) ||
        (rc = load_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err)) ||
        (rc = load_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
        (rc = load_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err)) ||
        (rc = load_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)))
        goto fail;

    li_tok_finish(t);
    *out = t;
    return 0;

fail:
    li_tokenizer_free(t);
    return rc;
}

void li_tokenizer_free(li_tokenizer *t) {
    if (!t) return;
    li_tok_strmap_free(&t->vocab);
    li_tok_pairmap_free(&t->merges);
    free(t->text);
    free(t->text_off);
    free(t->piece);
    free(t->piece_off);
    free(t->type);
    free(t->score);
    free(t->special);
    free(t);
}

/* ==== accessors ================================================================ */

int32_t li_tokenizer_n_vocab(const li_tokenizer *t) { return t->n_vocab; }
int32_t li_tokenizer_bos(const li_tokenizer *t) { return t->bos; }
int32_t li_tokenizer_eos(const li_tokenizer *t) { return t->eos; }
bool li_tokenizer_add_bos(const li_tokenizer *t) { return t->add_bos; }

bool li_tokenizer_is_eog(const li_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

int li_tokenizer_eog_ids(const li_tokenizer *t, const int32_t **ids) {
    *ids = t->eog;
    return t->n_eog;
}

int32_t li_tokenizer_find(const li_tokenizer *t, const char *text, size_t len) {
    return li_tok_strmap_get(&t->vocab, t, text, len);
}

const char *li_tokenizer_token_text(const li_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    uint32_t n;
    const char *s = li_tok_text(t, id, &n);
    *len = n;
    return s;
}

uint64_t li_tokenizer_vocab_hash(const li_tokenizer *t) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t prime = 0x100000001b3ull;
    const uint32_t nv = (uint32_t)t->n_vocab;
    for (int i = 0; i < 4; i++) h = (h ^ ((nv >> (8 * i)) & 0xff)) * prime;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n;
        const unsigned char *s = (const unsigned char *)li_tok_text(t, id, &n);
        for (uint32_t j = 0; j < n; j++) h = (h ^ s[j]) * prime;
        h = h * prime; /* the 0 byte: h ^ 0 == h */
    }
    return h;
}

li_token_type li_tokenizer_token_type(const li_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return LI_TOKEN_TYPE_UNDEFINED;
    return (li_token_type)t->type[id];
}

/* ==== encoding ================================================================== */

typedef struct encode_ctx {
    const li_tokenizer *t;
    li_tok_work *w;
    const uint8_t *frag;
    li_tok_ids *out;
} encode_ctx;

static void encode_word(void *ctx, size_t start, size_t end) {
    encode_ctx *e = ctx;
    if (e->t->ignore_merges) {
        int32_t id = li_tok_bpe_whole(e->t, e->w, e->frag + start, end - start);
        if (id >= 0) {
            li_tok_ids_push(e->out, id);
            return;
        }
    }
    li_tok_bpe_word(e->t, e->w, e->frag + start, end - start, e->out);
}

/* The longest special token allowed here that text[i..] starts with, or -1. */
static int32_t match_special(const li_tokenizer *t, const char *s, size_t n, bool parse_special,
                             size_t *len) {
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        /* llama.cpp: user-defined tokens are always matched, control and
         * unknown ones only when parse_special. HF matches all added tokens. */
        if (!parse_special && t->type[id] != LI_TOKEN_TYPE_USER_DEFINED) continue;
        uint32_t tn;
        const char *ts = li_tok_text(t, id, &tn);
        if (tn <= n && memcmp(ts, s, tn) == 0) {
            *len = tn;
            return id;
        }
    }
    return -1;
}

/* Whether the SPM fragment f (n > 0 bytes; `first`: at the text's start)
 * gets a leading "▁". */
static bool spm_prefix(const li_tokenizer *t, const char *f, size_t n, bool first, bool prev_special) {
    /* Metaspace leaves a fragment that already starts with "▁" (or a space, which becomes one) alone */
    bool spaced = f[0] == ' ' || (n >= 3 && memcmp(f, "\xE2\x96\x81", 3) == 0);
    switch (t->spm_prefix) {
    case LI_TOK_PREFIX_EVERY: return true;
    case LI_TOK_PREFIX_META_FIRST: return first && !spaced;
    case LI_TOK_PREFIX_META_ALWAYS: return !spaced;
    case LI_TOK_PREFIX_NEVER: return false;
    default:
        /* llama.cpp prefixes a space to the text's first fragment and to
         * every fragment after a special token. */
        return t->add_space_prefix && prev_special;
    }
}

int li_tokenizer_encode(const li_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t **out, size_t *n_out, li_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!text && len) return li_error_set(err, LI_EINVAL, "tokenizer: NULL text");
    if (len >= UINT32_MAX / 4)
        return li_error_set(err, LI_ERANGE, "tokenizer: text of %zu bytes is too long", len);

    li_tok_ids ids = {0};
    li_tok_work w = {0};
    encode_ctx e = {.t = t, .w = &w, .out = &ids};
    if (add_special && t->add_bos && t->bos >= 0) li_tok_ids_push(&ids, t->bos);

    /* Specials are found leftmost-longest, as HF's added-token matcher does.
     * (llama.cpp instead takes each special longest-first over the whole
     * text; the two differ only when specials overlap one another.) */
    bool prev_special = true;
    size_t frag = 0;
    for (size_t i = 0; i <= len; i++) {
        size_t mlen = 0;
        int32_t id = -1;
        if (i < len) {
            if (!t->special_first[(uint8_t)text[i]]) continue;
            id = match_special(t, text + i, len - i, parse_special, &mlen);
            if (id < 0) continue;
        }
        if (i > frag) {
            if (t->model == LI_TOK_MODEL_SPM) {
                li_tok_spm_fragment(t, &w, text + frag, i - frag, spm_prefix(t, text + frag, i - frag, frag == 0, prev_special),
                                    &ids);
            } else {
                e.frag = (const uint8_t *)text + frag;
                li_tok_pretokenize(t->pre, text + frag, i - frag, encode_word, &e);
            }
            prev_special = false;
        }
        if (id >= 0) {
            li_tok_ids_push(&ids, id);
            prev_special = true;
            i += mlen - 1;
            frag = i + 1;
        }
    }

    if (add_special && t->add_eos && t->eos >= 0) li_tok_ids_push(&ids, t->eos);
    li_tok_work_free(&w);
    *out = ids.v;
    *n_out = ids.n;
    return 0;
}

/* ==== decoding ==================================================================== */

/* The bytes `id` decodes to; false for a bad id. */
static bool piece_view(const li_tokenizer *t, int32_t id, bool special, const char **p, size_t *n) {
    if (id < 0 || id >= t->n_vocab) return false;
    int ty = t->type[id];
    if (!special && (ty == LI_TOKEN_TYPE_CONTROL || ty == LI_TOKEN_TYPE_UNKNOWN)) {
        /* llama.cpp shows an SPM unknown token as U+2585 "▅". */
        bool block = ty == LI_TOKEN_TYPE_UNKNOWN && t->model == LI_TOK_MODEL_SPM;
        *p = block ? "\xE2\x96\x85" : "";
        *n = block ? 3 : 0;
        return true;
    }
    *p = t->piece + t->piece_off[id];
    *n = t->piece_off[id + 1] - t->piece_off[id];
    return true;
}

int li_tokenizer_token_to_piece(const li_tokenizer *t, int32_t id, bool special, char *buf, size_t cap) {
    const char *p;
    size_t n;
    if (!piece_view(t, id, special, &p, &n)) return -1;
    if (buf && cap) memcpy(buf, p, LI_MIN(n, cap));
    return (int)n;
}

long li_tokenizer_decode(const li_tokenizer *t, const int32_t *ids, size_t n, bool special, char *buf,
                         size_t cap) {
    size_t total = 0;
    bool strip = t->model == LI_TOK_MODEL_SPM && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pn;
        if (!piece_view(t, ids[i], special, &p, &pn)) return -1;
        if (pn == 0) continue;
        if (strip) {
            strip = false;
            if (p[0] == ' ') {
                p++;
                pn--;
            }
        }
        if (buf && total < cap) memcpy(buf + total, p, LI_MIN(pn, cap - total));
        total += pn;
    }
    return (long)total;
}

/* ---- streaming ----------------------------------------------------------------------- */

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

void li_detok_init(li_detok *d) { memset(d, 0, sizeof *d); }

/* Runs pending ++ p through the UTF-8 checker. Without `apply` it only
 * counts; with it, writes the output to o and updates d. Returns output bytes. */
static size_t detok_feed(li_detok *d, const char *p, size_t n, char *o, bool apply) {
    size_t np = (size_t)d->n_pending, total = np + n, i = 0, k = 0;
    while (i < total) {
        uint8_t win[4];
        size_t wn = LI_MIN((size_t)4, total - i);
        for (size_t j = 0; j < wn; j++)
            win[j] = (uint8_t)(i + j < np ? d->pending[i + j] : p[i + j - np]);
        int r = li_tok_utf8_check(win, wn);
        if (r == 0) { /* a character still missing bytes: hold it */
            if (apply) {
                memcpy(d->pending, win, wn);
                d->n_pending = (int)wn;
            }
            return k;
        }
        if (r > 0) {
            if (apply) memcpy(o + k, win, (size_t)r);
            k += (size_t)r;
            i += (size_t)r;
        } else {
            if (apply) memcpy(o + k, REPLACEMENT, 3);
            k += 3;
            i += (size_t)-r;
        }
    }
    if (apply) d->n_pending = 0;
    return k;
}

int li_detok_push(li_detok *d, const li_tokenizer *t, int32_t id, bool special, char *buf, size_t cap) {
    const char *p;
    size_t n;
    if (!piece_view(t, id, special, &p, &n)) return -1;
    size_t need = detok_feed(d, p, n, NULL, false);
    if (need > cap || need > INT32_MAX) return -1;
    return (int)detok_feed(d, p, n, buf, true);
}

int li_detok_flush(li_detok *d, char *buf, size_t cap) {
    if (d->n_pending == 0) return 0;
    if (cap < 3) return -1;
    memcpy(buf, REPLACEMENT, 3);
    d->n_pending = 0;
    return 3;
}
