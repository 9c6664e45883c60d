/* tok_json.c — a tokenizer from a Hugging Face tokenizer.json. Owns:
 * reading model.vocab / model.merges / added_tokens / pre_tokenizer /
 * post_processor into the same li_tokenizer the GGUF loader builds, and
 * refusing what that structure cannot express.
 *
 * Supported: model "BPE" (no subword prefix/suffix, no dropout) in two
 * families.
 * Byte-level (no byte_fallback): no normalizer, a ByteLevel decoder, and the
 * three splits tok_pretok.c implements, recognised by their exact JSON:
 *   ByteLevel(use_regex)                                   -> GPT-2
 *   Sequence[Digits(individual), ByteLevel(use_regex)]     -> SmolLM
 *   Sequence[Split(Llama 3 regex, Isolated), ByteLevel]    -> Llama 3
 * SentencePiece-style (byte_fallback: Llama 1/2, Mistral, TinyLlama), as
 * LI_TOK_MODEL_SPM with ranked merges, in its two shapes:
 *   normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre_tokenizer
 *   no normalizer, pre_tokenizer Metaspace("▁", prepend_scheme, split)
 * and a decoder made of Replace("▁", " ") / ByteFallback / Fuse /
 * Strip(" ", 1, 0) / Metaspace steps.
 * Added tokens: special -> CONTROL, others -> USER_DEFINED, as llama.cpp's
 * GGUF converter types them, so both loaders give the same tokenizer. */
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCAB (1 << 24)

/* transformers' _LLAMA3_SPLIT, the pattern Llama 3's tokenizer.json holds */
static const char LLAMA3_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct jctx {
    const char *name; /* the file, for messages */
    li_error *err;
} jctx;

#define JFAIL(c, code, ...) json_fail((c), (code), __VA_ARGS__)

static int json_fail(jctx *c, int code, const char *fmt, ...) LI_PRINTF(3, 4);
static int json_fail(jctx *c, int code, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return li_error_set(c->err, code, "tokenizer: %s: %s", c->name, msg);
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jtrue(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }

static bool jint(const cJSON *v, int32_t lo, int32_t hi, int32_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo) || !(v->valuedouble <= hi) ||
        (double)(int32_t)v->valuedouble != v->valuedouble)
        return false;
    *out = (int32_t)v->valuedouble;
    return true;
}

static const char *jtype(const cJSON *o) {
    const char *t = jstr(o, "type");
    return t ? t : "?";
}

/* ==== pre-tokenizer, normalizer, decoder ======================================== */

static bool is_byte_level(const cJSON *p, bool use_regex) {
    if (!cJSON_IsObject(p) || strcmp(jtype(p), "ByteLevel") != 0 || jtrue(p, "add_prefix_space")) return false;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    bool re = r ? cJSON_IsTrue(r) : true; /* tokenizers' default */
    return re == use_regex;
}

static int load_pre(li_tokenizer *t, const cJSON *root, jctx *c) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (is_byte_level(p, true)) {
        t->pre = LI_TOK_PRE_GPT2;
        return 0;
    }
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (cJSON_IsObject(p) && !strcmp(jtype(p), "Sequence") && cJSON_GetArraySize(seq) == 2) {
        const cJSON *a = seq->child, *b = a->next;
        if (!strcmp(jtype(a), "Digits") && jtrue(a, "individual_digits") && is_byte_level(b, true)) {
            t->pre = LI_TOK_PRE_SMOLLM;
            return 0;
        }
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(a, "pattern");
        const char *re = jstr(pat, "Regex"), *beh = jstr(a, "behavior");
        if (!strcmp(jtype(a), "Split") && re && !strcmp(re, LLAMA3_SPLIT) && beh && !strcmp(beh, "Isolated") &&
            !jtrue(a, "invert") && is_byte_level(b, false)) {
            t->pre = LI_TOK_PRE_LLAMA3;
            return 0;
        }
    }
    if (cJSON_IsNull(p) || !p)
        return JFAIL(c, LI_EUNSUP, "no pre_tokenizer (only byte-level BPE tokenizers are supported)");
    return JFAIL(c, LI_EUNSUP,
                 "pre_tokenizer '%.32s' is not one we implement (ByteLevel; Digits + ByteLevel; Llama 3 Split + ByteLevel)",
                 jtype(p));
}

static int check_normalizer_decoder(const cJSON *root, jctx *c) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (n && !cJSON_IsNull(n)) return JFAIL(c, LI_EUNSUP, "normalizer '%.32s' is not supported", jtype(n));
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (cJSON_IsObject(d) && !strcmp(jtype(d), "Sequence")) {
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (cJSON_GetArraySize(ds) == 1) d = ds->child;
    }
    if (!cJSON_IsObject(d) || strcmp(jtype(d), "ByteLevel") != 0)
        return JFAIL(c, LI_EUNSUP, "decoder '%.32s' is not supported (ByteLevel only)", d ? jtype(d) : "none");
    return 0;
}

/* ---- SentencePiece-style shapes ---- */

static bool is_str_replace(const cJSON *o, const char *from, const char *to) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *f = jstr(pat, "String"), *t = jstr(o, "content");
    return cJSON_IsObject(o) && !strcmp(jtype(o), "Replace") && f && t && !strcmp(f, from) && !strcmp(t, to);
}

/* Metaspace's prepend scheme as LI_TOK_PREFIX_*; -1 for another replacement. */
static int metaspace_scheme(const cJSON *m) {
    const char *rep = jstr(m, "replacement"), *scheme = jstr(m, "prepend_scheme");
    if (!rep || strcmp(rep, "\xE2\x96\x81") != 0) return -1;
    if (!scheme) /* tokenizers < 0.19 wrote add_prefix_space */
        return jtrue(m, "add_prefix_space") ? LI_TOK_PREFIX_META_ALWAYS : LI_TOK_PREFIX_NEVER;
    if (!strcmp(scheme, "first")) return LI_TOK_PREFIX_META_FIRST;
    if (!strcmp(scheme, "always")) return LI_TOK_PREFIX_META_ALWAYS;
    if (!strcmp(scheme, "never")) return LI_TOK_PREFIX_NEVER;
    return -1;
}

static int load_spm_shape(li_tokenizer *t, const cJSON *root, jctx *c) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    bool no_n = !n || cJSON_IsNull(n), no_p = !p || cJSON_IsNull(p);
    if (!no_n && no_p) {
        const cJSON *ns = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        const cJSON *a = cJSON_GetArraySize(ns) == 2 ? ns->child : NULL;
        const char *pre = a ? jstr(a, "prepend") : NULL;
        if (!a || strcmp(jtype(n), "Sequence") || strcmp(jtype(a), "Prepend") || !pre ||
            strcmp(pre, "\xE2\x96\x81") || !is_str_replace(a->next, " ", "\xE2\x96\x81"))
            return JFAIL(c, LI_EUNSUP, "normalizer '%.32s' is not supported with byte_fallback "
                         "(Sequence[Prepend(\"\xE2\x96\x81\"), Replace(\" \", \"\xE2\x96\x81\")] only)", jtype(n));
        t->spm_prefix = LI_TOK_PREFIX_EVERY;
    } else if (no_n && !no_p) {
        int scheme = !strcmp(jtype(p), "Metaspace") ? metaspace_scheme(p) : -1;
        if (scheme < 0)
            return JFAIL(c, LI_EUNSUP, "pre_tokenizer '%.32s' is not supported with byte_fallback (Metaspace(\"\xE2\x96\x81\") only)",
                         jtype(p));
        const cJSON *split = cJSON_GetObjectItemCaseSensitive(p, "split");
        t->spm_split = split ? cJSON_IsTrue(split) : true; /* tokenizers' default */
        t->spm_prefix = scheme;
    } else {
        return JFAIL(c, LI_EUNSUP, "byte_fallback BPE wants either a Prepend/Replace normalizer or a Metaspace "
                     "pre_tokenizer, not %s", no_n ? "neither" : "both");
    }
    /* the decoder: its steps, in order; Strip(" ", 1, 0) or a prepending
     * Metaspace drops the leading space the encoder added */
    const cJSON *steps = d;
    if (cJSON_IsObject(d) && !strcmp(jtype(d), "Sequence")) steps = cJSON_GetObjectItemCaseSensitive(d, "decoders");
    bool spaces = false, strip = false;
    for (const cJSON *x = cJSON_IsArray(steps) ? steps->child : (cJSON_IsObject(d) ? d : NULL); x; x = x->next) {
        const char *ty = jtype(x);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(x, "start"), *sp = cJSON_GetObjectItemCaseSensitive(x, "stop");
        const char *sc = jstr(x, "content");
        if (is_str_replace(x, "\xE2\x96\x81", " ")) {
            spaces = true;
        } else if (!strcmp(ty, "Metaspace") && metaspace_scheme(x) >= 0) {
            spaces = true;
            strip = metaspace_scheme(x) != LI_TOK_PREFIX_NEVER;
        } else if (!strcmp(ty, "Strip") && sc && !strcmp(sc, " ") && cJSON_IsNumber(st) && st->valuedouble == 1 &&
                   cJSON_IsNumber(sp) && sp->valuedouble == 0) {
            strip = true;
        } else if (strcmp(ty, "ByteFallback") != 0 && strcmp(ty, "Fuse") != 0) {
            return JFAIL(c, LI_EUNSUP, "decoder step '%.32s' is not supported with byte_fallback", ty);
        }
        if (x == d) break; /* a single decoder, not a list */
    }
    if (!spaces) return JFAIL(c, LI_EUNSUP, "the decoder does not turn \"\xE2\x96\x81\" back into spaces");
    t->add_space_prefix = strip; /* for SPM it drives the decoder's strip */
    return 0;
}

/* <0xXX> tokens of a SentencePiece vocabulary are its byte tokens. */
static void type_byte_tokens(li_tokenizer *t) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n;
        const char *s = li_tok_text(t, id, &n);
        if (t->type[id] == LI_TOKEN_TYPE_NORMAL && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' &&
            strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF", s[4]) && s[3] && s[4])
            t->type[id] = LI_TOKEN_TYPE_BYTE;
    }
}

/* ==== vocabulary ================================================================== */

typedef struct entry {
    const char *text; /* into the cJSON tree */
    uint8_t type;
} entry;

static int put(entry *v, int32_t id, const char *text, uint8_t type, jctx *c) {
    if (v[id].text && strcmp(v[id].text, text) != 0)
        return JFAIL(c, LI_EINVAL, "token id %d is both '%.40s' and '%.40s'", id, v[id].text, text);
    v[id].text = text;
    v[id].type = type;
    return 0;
}

static int load_vocab(li_tokenizer *t, const cJSON *root, const cJSON *model, int32_t n_min, jctx *c) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !vocab->child) return JFAIL(c, LI_EINVAL, "model.vocab is not a non-empty object");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return JFAIL(c, LI_EINVAL, "added_tokens is not an array");
    /* the id range first, so the table is sized once */
    int32_t n = n_min > 0 ? n_min : 0, id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!jint(e, 0, MAX_VOCAB - 1, &id))
            return JFAIL(c, LI_EINVAL, "model.vocab['%.40s'] is not a token id in [0, %d)", e->string, MAX_VOCAB);
        n = LI_MAX(n, id + 1);
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        if (!jint(cJSON_GetObjectItemCaseSensitive(a, "id"), 0, MAX_VOCAB - 1, &id))
            return JFAIL(c, LI_EINVAL, "an added_tokens entry has no id in [0, %d)", MAX_VOCAB);
        n = LI_MAX(n, id + 1);
    }
    entry *v = li_xcalloc((size_t)n, sizeof *v);
    int rc = 0;
    for (const cJSON *e = vocab->child; e && !rc; e = e->next) {
        jint(e, 0, MAX_VOCAB - 1, &id);
        if (!e->string[0]) rc = JFAIL(c, LI_EINVAL, "model.vocab has an empty token (id %d)", id);
        else rc = put(v, id, e->string, LI_TOKEN_TYPE_NORMAL, c);
    }
    for (const cJSON *a = added ? added->child : NULL; a && !rc; a = a->next) {
        jint(cJSON_GetObjectItemCaseSensitive(a, "id"), 0, MAX_VOCAB - 1, &id);
        const char *content = jstr(a, "content");
        if (!content || !content[0]) {
            rc = JFAIL(c, LI_EINVAL, "added token %d has no content", id);
        } else if (jtrue(a, "lstrip") || jtrue(a, "rstrip") || jtrue(a, "single_word")) {
            /* the special-token matcher takes tokens as they are written */
            rc = JFAIL(c, LI_EUNSUP, "added token '%.40s' uses lstrip/rstrip/single_word, which is not supported",
                       content);
        } else {
            rc = put(v, id, content, jtrue(a, "special") ? LI_TOKEN_TYPE_CONTROL : LI_TOKEN_TYPE_USER_DEFINED, c);
        }
    }
    if (rc) {
        free(v);
        return rc;
    }
    /* ids nobody names (and the embedding's spare rows): unused tokens,
     * spelled as llama.cpp's converter spells them */
    char (*pad)[24] = NULL;
    int32_t n_pad = 0;
    for (int32_t i = 0; i < n; i++) n_pad += !v[i].text;
    if (n_pad) pad = li_xmalloc((size_t)n_pad * sizeof *pad);
    uint64_t total = 0;
    for (int32_t i = 0, k = 0; i < n; i++) {
        if (!v[i].text) {
            snprintf(pad[k], sizeof pad[k], "[PAD%d]", i);
            v[i].text = pad[k++];
            v[i].type = LI_TOKEN_TYPE_UNUSED;
        }
        total += strlen(v[i].text);
    }
    if (total >= UINT32_MAX) rc = JFAIL(c, LI_EINVAL, "vocabulary text too large");
    if (!rc) {
        t->n_vocab = n;
        t->text = li_xmalloc(total + 1);
        t->text_off = li_xmalloc(((size_t)n + 1) * sizeof *t->text_off);
        t->type = li_xmalloc((size_t)n);
        uint32_t off = 0;
        for (int32_t i = 0; i < n; i++) {
            size_t len = strlen(v[i].text);
            t->text_off[i] = off;
            memcpy(t->text + off, v[i].text, len);
            off += (uint32_t)len;
            t->type[i] = v[i].type;
        }
        t->text_off[n] = off;
    }
    free(pad);
    free(v);
    return rc;
}

/* ==== merges ======================================================================== */

/* "left right" (the old format) or ["left", "right"] (tokenizers >= 0.20). */
static int load_merges(li_tokenizer *t, const cJSON *model, jctx *c) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return JFAIL(c, LI_EINVAL, "model.merges is not an array");
    int n = cJSON_GetArraySize(merges);
    li_tok_pairmap_init(&t->merges, (uint32_t)n);
    char *tmp = NULL;
    size_t cap = 0;
    int rc = 0, i = 0;
    for (const cJSON *m = merges->child; m && !rc; m = m->next, i++) {
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = s[0] ? strchr(s + 1, ' ') : NULL;
            if (sp && !strchr(sp + 1, ' ')) l = s, ln = (size_t)(sp - s), r = sp + 1, rn = strlen(r);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            l = m->child->valuestring, r = m->child->next->valuestring;
            ln = strlen(l), rn = strlen(r);
        }
        if (!l || !ln || !rn) {
            rc = JFAIL(c, LI_EINVAL, "model.merges[%d] is not a pair of tokens", i);
            break;
        }
        if (ln + rn > cap) tmp = li_xrealloc(tmp, cap = (ln + rn) * 2);
        memcpy(tmp, l, ln);
        memcpy(tmp + ln, r, rn);
        int32_t li = li_tok_strmap_get(&t->vocab, t, l, ln), ri = li_tok_strmap_get(&t->vocab, t, r, rn);
        int32_t res = li_tok_strmap_get(&t->vocab, t, tmp, ln + rn);
        /* tokenizers refuses such a file (MergeTokenOutOfVocabulary) */
        if (li < 0 || ri < 0 || res < 0)
            rc = JFAIL(c, LI_EINVAL, "model.merges[%d] ('%.30s' + '%.30s') names a token not in the vocabulary", i,
                       li < 0 ? "?" : l, ri < 0 ? "?" : r);
        else li_tok_pairmap_put(&t->merges, li, ri, i, res);
    }
    free(tmp);
    return rc;
}

/* ==== special ids ==================================================================== */

static int find_id(li_tokenizer *t, const char *text, const char *what, int32_t *out, jctx *c) {
    if (!text) return 0;
    int32_t id = li_tok_strmap_get(&t->vocab, t, text, strlen(text));
    if (id < 0) return JFAIL(c, LI_EINVAL, "%s '%.40s' is not in the vocabulary", what, text);
    *out = id;
    return 0;
}

/* TemplateProcessing's "single": a SpecialToken before the sequence is a
 * BOS the encoder adds, one after it an EOS. */
static int load_post(li_tokenizer *t, const cJSON *p, jctx *c) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *ty = jtype(p);
    if (!strcmp(ty, "ByteLevel")) return 0;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "processors");
        int rc = 0;
        for (const cJSON *x = cJSON_IsArray(ps) ? ps->child : NULL; x && !rc; x = x->next) rc = load_post(t, x, c);
        return rc;
    }
    if (strcmp(ty, "TemplateProcessing") != 0)
        return JFAIL(c, LI_EUNSUP, "post_processor '%.32s' is not supported", ty);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    bool seen_seq = false;
    for (const cJSON *x = cJSON_IsArray(single) ? single->child : NULL; x; x = x->next) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(x, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(x, "Sequence")) {
            seen_seq = true;
            continue;
        }
        const char *text = jstr(sp, "id");
        if (!text) return JFAIL(c, LI_EINVAL, "post_processor.single has an item that is neither Sequence nor SpecialToken");
        int32_t id = -1;
        int rc = find_id(t, text, "post_processor token", &id, c);
        if (rc) return rc;
        if (!seen_seq) {
            t->add_bos = true;
            t->bos = id;
        } else {
            t->add_eos = true;
            t->eos = id;
        }
    }
    return 0;
}

/* ==== init ============================================================================ */

static int build(li_tokenizer *t, const cJSON *root, const li_tokenizer_hf_opts *o, jctx *c) {
    if (!cJSON_IsObject(root)) return JFAIL(c, LI_EINVAL, "not a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return JFAIL(c, LI_EINVAL, "no \"model\" object");
    const char *mt = jstr(model, "type");
    if (!mt) mt = cJSON_GetObjectItemCaseSensitive(model, "merges") ? "BPE" : "?"; /* old files omit it */
    if (strcmp(mt, "BPE") != 0) return JFAIL(c, LI_EUNSUP, "tokenizer model '%.32s' is not supported (BPE only)", mt);
    const bool spm = jtrue(model, "byte_fallback");
    const char *pre = jstr(model, "continuing_subword_prefix"), *suf = jstr(model, "end_of_word_suffix");
    if ((pre && pre[0]) || (suf && suf[0]))
        return JFAIL(c, LI_EUNSUP, "BPE with a continuing_subword_prefix / end_of_word_suffix is not supported");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0) return JFAIL(c, LI_EUNSUP, "BPE dropout is not supported");
    int rc;
    if (spm) {
        t->model = LI_TOK_MODEL_SPM;
        t->spm_ranked = true;
        t->fuse_unk = jtrue(model, "fuse_unk");
        if ((rc = load_spm_shape(t, root, c))) return rc;
    } else {
        t->model = LI_TOK_MODEL_BPE;
        if ((rc = load_pre(t, root, c)) || (rc = check_normalizer_decoder(root, c))) return rc;
    }
    t->ignore_merges = jtrue(model, "ignore_merges");
    if ((rc = load_vocab(t, root, model, o ? o->n_vocab_min : 0, c))) return rc;
    if (spm) type_byte_tokens(t);
    li_tok_strmap_init(&t->vocab, t);
    if ((rc = load_merges(t, model, c))) return rc;
    if ((rc = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), c))) return rc;
    if ((rc = find_id(t, jstr(model, "unk_token"), "model.unk_token", &t->unk, c))) return rc;
    if (o) {
        if ((rc = find_id(t, o->bos_token, "bos_token", &t->bos, c)) ||
            (rc = find_id(t, o->eos_token, "eos_token", &t->eos, c)) ||
            (rc = find_id(t, o->unk_token, "unk_token", &t->unk, c)))
            return rc;
        if (o->add_bos >= 0) t->add_bos = o->add_bos;
    }
    if (t->add_bos && t->bos < 0) return JFAIL(c, LI_EINVAL, "adds a BOS token but names none");
    if (!spm) t->add_space_prefix = false;
    li_tok_finish(t);
    for (int i = 0; o && i < o->n_eog_ids; i++) {
        int32_t id = o->eog_ids[i];
        bool have = id < 0 || id >= t->n_vocab;
        for (int k = 0; k < t->n_eog && !have; k++) have = t->eog[k] == id;
        if (!have && t->n_eog < LI_TOK_MAX_EOG) t->eog[t->n_eog++] = id;
    }
    return 0;
}

int li_tokenizer_init_hf(li_tokenizer **out, const char *json, size_t len, const char *name,
                         const li_tokenizer_hf_opts *opts, li_error *err) {
    *out = NULL;
    jctx c = {name ? name : "tokenizer.json", err};
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return JFAIL(&c, LI_EINVAL, "not valid JSON");
    li_tokenizer *t = li_xcalloc(1, sizeof *t);
    t->bos = t->eos = t->unk = t->eot = t->eom = -1;
    int rc = build(t, root, opts, &c);
    cJSON_Delete(root);
    if (rc) {
        li_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
