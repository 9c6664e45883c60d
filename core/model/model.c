/* model.c — loading a Llama-family GGUF: read hyper-parameters, find and
 * shape-check every weight tensor, build the tokenizer. Owns: li_model. */
#define _GNU_SOURCE
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int get_u32_req(const li_gguf *g, const char *arch, const char *suffix, int32_t *out,
                       li_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = li_gguf_get_u32(g, key, &v, err);
    if (rc == 1) return li_error_set(err, LI_EINVAL, "model: missing metadata key '%s'", key);
    if (rc) return rc;
    if (v == 0 || v > (1u << 24)) return li_error_set(err, LI_EINVAL, "model: %s = %u is out of range", key, v);
    *out = (int32_t)v;
    return 0;
}

/* <arch>.SUFFIX as one u32, or (llama.cpp's per-layer form: n_ff_arr,
 * n_head_arr) an array of n_layer 32-bit integers. *out is the largest
 * entry; *per (malloc'd) holds them when they differ, else NULL. 1 when the
 * key is absent. */
static int read_per_block(li_model *m, const char *suffix, int32_t *out, int32_t **per, li_error *err) {
    li_hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.%s", hp->arch, suffix);
    *per = NULL;
    const li_gguf_kv *kv = li_gguf_find_kv(&m->gguf, key);
    if (!kv) return 1;
    if (kv->type != LI_GGUF_ARRAY) return get_u32_req(&m->gguf, hp->arch, suffix, out, err);
    const li_gguf_vtype et = kv->v.arr.type;
    if ((et != LI_GGUF_UINT32 && et != LI_GGUF_INT32) || kv->v.arr.n != (uint64_t)hp->n_layer)
        return li_error_set(err, LI_EINVAL, "model: %s is an array of %llu entries, not %d 32-bit integers (one per block)",
                            key, (unsigned long long)kv->v.arr.n, hp->n_layer);
    int32_t *w = li_xmalloc((size_t)hp->n_layer * sizeof *w);
    bool same = true;
    *out = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        uint32_t v;
        memcpy(&v, kv->v.arr.data + 4 * (size_t)l, 4);
        if (v == 0 || v > (1u << 24)) {
            free(w);
            return li_error_set(err, LI_EINVAL, "model: %s[%d] = %d is out of range", key, l, (int32_t)v);
        }
        w[l] = (int32_t)v;
        same &= w[l] == w[0];
        *out = LI_MAX(*out, w[l]);
    }
    if (same) free(w);
    else *per = w;
    return 0;
}

/* feed_forward_length: hp->n_ff the largest, hp->n_ff_layer set (in
 * m->n_ff_own) only when the blocks differ */
static int read_n_ff(li_model *m, li_error *err) {
    int rc = read_per_block(m, "feed_forward_length", &m->hp.n_ff, &m->n_ff_own, err);
    if (rc == 1) return get_u32_req(&m->gguf, m->hp.arch, "feed_forward_length", &m->hp.n_ff, err);
    m->hp.n_ff_layer = m->n_ff_own;
    return rc;
}

/* attention.head_count / head_count_kv: one count for every block (an array
 * of equal entries is that count; different ones are refused) */
static int read_heads(li_model *m, const char *suffix, int32_t *out, bool required, li_error *err) {
    int32_t *per;
    int rc = read_per_block(m, suffix, out, &per, err);
    if (rc == 1) return required ? get_u32_req(&m->gguf, m->hp.arch, suffix, out, err) : 0;
    if (rc) return rc;
    if (per) {
        int l = 1;
        while (per[l] == per[0]) l++;
        rc = li_error_set(err, LI_EUNSUP, "model: %s.%s differs between blocks (%d in block 0, %d in block %d); "
                          "per-block head counts are not supported yet", m->hp.arch, suffix, per[0], per[l], l);
        free(per);
    }
    return rc;
}

static int get_u32_opt(const li_gguf *g, const char *arch, const char *suffix, int32_t *out,
                       li_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = li_gguf_get_u32(g, key, &v, err);
    if (rc == 1) return 0;
    if (rc) return rc;
    if (v == 0 || v > (1u << 24)) return li_error_set(err, LI_EINVAL, "model: %s = %u is out of range", key, v);
    *out = (int32_t)v;
    return 0;
}

static int get_f32_opt(const li_gguf *g, const char *arch, const char *suffix, float *out, li_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = li_gguf_get_f32(g, key, out, err);
    return rc == 1 ? 0 : rc;
}

static int read_hparams(li_model *m, li_error *err) {
    const li_gguf *g = &m->gguf;
    li_hparams *hp = &m->hp;
    li_str arch;
    int rc = li_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc == 1) return li_error_set(err, LI_EINVAL, "model: missing general.architecture");
    if (rc) return rc;
    if (arch.len >= sizeof hp->arch) return li_error_set(err, LI_EINVAL, "model: architecture name too long");
    memcpy(hp->arch, arch.ptr, arch.len);
    hp->arch[arch.len] = 0;
    /* Llama-family layouts: same tensors, same math ("deci": llama.cpp's
     * Llama with per-block widths, which its "llama" does not read) */
    static const char *supported[] = {"llama", "mistral", "granite", "deci"};
    bool ok = false;
    for (size_t i = 0; i < LI_ARRAY_LEN(supported); i++) ok |= !strcmp(hp->arch, supported[i]);
    if (!ok) return li_error_set(err, LI_EUNSUP, "model: architecture '%s' is not supported (llama family only)", hp->arch);
    const char *a = hp->arch;
    if ((rc = get_u32_req(g, a, "embedding_length", &hp->n_embd, err)) ||
        (rc = get_u32_req(g, a, "block_count", &hp->n_layer, err)) ||
        (rc = read_heads(m, "attention.head_count", &hp->n_head, true, err)) || (rc = read_n_ff(m, err)))
        return rc;
    hp->n_head_kv = hp->n_head;
    if ((rc = read_heads(m, "attention.head_count_kv", &hp->n_head_kv, false, err))) return rc;
    hp->n_ctx_train = 2048;
    hp->rope_theta = 10000.0f;
    hp->norm_eps = 1e-5f;
    if ((rc = get_u32_opt(g, a, "context_length", &hp->n_ctx_train, err)) ||
        (rc = get_f32_opt(g, a, "rope.freq_base", &hp->rope_theta, err)) ||
        (rc = get_f32_opt(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err)))
        return rc;
    if (hp->n_embd % hp->n_head != 0)
        return li_error_set(err, LI_EINVAL, "model: embedding_length %d is not a multiple of head_count %d",
                            hp->n_embd, hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = get_u32_opt(g, a, "attention.key_length", &hp->head_dim, err))) return rc;
    hp->n_rot = hp->head_dim;
    if ((rc = get_u32_opt(g, a, "rope.dimension_count", &hp->n_rot, err))) return rc;
    if (hp->n_head % hp->n_head_kv != 0)
        return li_error_set(err, LI_EINVAL, "model: head_count %d is not a multiple of head_count_kv %d",
                            hp->n_head, hp->n_head_kv);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return li_error_set(err, LI_EINVAL, "model: rope.dimension_count %d is invalid for head size %d",
                            hp->n_rot, hp->head_dim);
    if (!(hp->rope_theta > 0) || !(hp->norm_eps > 0))
        return li_error_set(err, LI_EINVAL, "model: rope.freq_base and rms epsilon must be positive");
    li_str st;
    char sk[64];
    snprintf(sk, sizeof sk, "%s.rope.scaling.type", a);
    rc = li_gguf_get_str(g, sk, &st, err);
    if (rc < 0) return rc;
    if (rc == 0 && !li_str_eq(st, "none"))
        return li_error_set(err, LI_EUNSUP, "model: rope scaling '%.*s' is not supported yet", (int)st.len, st.ptr);
    if (li_gguf_find_tensor(g, "rope_freqs.weight"))
        return li_error_set(err, LI_EUNSUP, "model: rope frequency factors (Llama 3.1 scaling) are not supported yet");
    hp->rope_neox = 0;
    return 0;
}

/* ------------------------------------------------------------------------
 * scheme weights (`luainfer quantize`): an I8 tensor of codes, row bytes x
 * rows, and NAME.scale (f32, groups x rows), NAME.zero (f32, groups x rows)
 * and NAME.perm (i32, k) beside it
 * ---------------------------------------------------------------------- */

static int read_scheme(li_model *m, li_error *err) {
    li_str s;
    int rc = li_gguf_get_str(&m->gguf, "luainfer.quant.scheme", &s, err);
    m->quant_scheme = LI_SCHEME_PLAIN;
    if (rc == 1) return 0;
    if (rc) return rc;
    for (int i = 1; i < LI_SCHEME_COUNT; i++)
        if (li_str_eq(s, li_scheme_name((uint32_t)i))) m->quant_scheme = (li_scheme)i;
    if (m->quant_scheme == LI_SCHEME_PLAIN)
        return li_error_set(err, LI_EUNSUP, "model: unknown weight scheme '%.*s' (luainfer.quant.scheme)", (int)s.len,
                            s.ptr);
    uint32_t v = 1, g = 0;
    if ((rc = li_gguf_get_u32(&m->gguf, "luainfer.quant.version", &v, err)) < 0) return rc;
    if (v != 1)
        return li_error_set(err, LI_EUNSUP, "model: luainfer.quant.version %u is not supported (this build reads 1)", v);
    if ((rc = li_gguf_get_u32(&m->gguf, "luainfer.quant.group_size", &g, err)) < 0) return rc;
    m->quant_group = g;
    /* the activations, when the file names them: the scheme's own or one it allows */
    li_str a;
    if ((rc = li_gguf_get_str(&m->gguf, "luainfer.quant.activations", &a, err)) != 0 && rc != 1) return rc;
    if (rc == 0) {
        const li_scheme_traits *st = li_scheme_info(m->quant_scheme);
        int act = -1;
        for (int i = 0; i < LI_ACT_COUNT; i++)
            if (li_str_eq(a, li_act_quant_name((uint32_t)i))) act = i;
        if (act < 0 || (act != (int)st->act && !(st->acts & (1u << act))))
            return li_error_set(err, LI_EUNSUP, "model: scheme %s does not run with '%.*s' activations "
                                "(luainfer.quant.activations)", st->name, (int)a.len, a.ptr);
        if (act != (int)st->act) m->quant_act = (li_act_quant)act;
    }
    return 0;
}

/* The companion NAME.SUFFIX of type `type` with ne0 x ne1 elements, or
 * NULL (err set when it exists with another type or shape). */
static const void *companion(li_model *m, const char *name, const char *suffix, uint32_t type, int64_t ne0,
                             int64_t ne1, li_error *err) {
    char cn[128];
    snprintf(cn, sizeof cn, "%s.%s", name, suffix);
    const li_gguf_tensor *t = li_gguf_find_tensor(&m->gguf, cn);
    if (!t) return NULL;
    if (t->type != type || t->ne[0] != ne0 || t->ne[1] != ne1 || t->n_dims > 2 || (uintptr_t)t->data % 4) {
        li_error_set(err, LI_EINVAL, "model: tensor '%s' must be %s [%lld, %lld]", cn, li_type_name(type),
                     (long long)ne0, (long long)ne1);
        return NULL;
    }
    m->weight_bytes += t->nbytes;
    return t->data;
}

static int bind_scheme_weight(li_model *m, li_weight *w, const li_gguf_tensor *t, const char *name, int64_t k,
                              int64_t rows, li_error *err) {
    const li_scheme_traits *st = li_scheme_info(m->quant_scheme);
    size_t row_bytes;
    if (!li_type_row_size(st->codes, k, &row_bytes) || t->n_dims > 2 || t->ne[0] != (int64_t)row_bytes ||
        t->ne[1] != rows)
        return li_error_set(err, LI_EINVAL, "model: %s tensor '%s' has shape [%lld, %lld], expected [%zu, %lld]",
                            st->name, name, (long long)t->ne[0], (long long)t->ne[1], row_bytes, (long long)rows);
    memset(w, 0, sizeof *w);
    w->type = st->codes;
    w->k = k;
    w->m = rows;
    w->row_bytes = row_bytes;
    w->data = t->data;
    w->scheme = m->quant_scheme;
    w->act = m->quant_act != LI_ACT_F32 ? m->quant_act : st->act;
    w->group_size = m->quant_group;
    const int64_t ng = li_weight_n_groups(w);
    li_error ce = {0};
    w->scales = companion(m, name, "scale", LI_TYPE_F32, ng, rows, &ce);
    w->zeros = companion(m, name, "zero", LI_TYPE_F32, ng, rows, &ce);
    w->perm = companion(m, name, "perm", LI_TYPE_I32, k, 1, &ce);
    if (ce.code) return li_error_set(err, ce.code, "%s", ce.msg);
    char why[160];
    if (li_weight_check(w, why, sizeof why)) return li_error_set(err, LI_EINVAL, "model: tensor '%s': %s", name, why);
    m->weight_bytes += t->nbytes;
    return 0;
}

/* Binds a 2-D weight of shape (m rows, k) and checks its type is usable. */
static int bind_weight(li_model *m, li_weight *w, const char *name, int64_t k, int64_t rows, li_error *err) {
    const li_gguf_tensor *t = li_gguf_find_tensor(&m->gguf, name);
    if (!t) return li_error_set(err, LI_EINVAL, "model: missing tensor '%s'", name);
    if (t->type == LI_TYPE_I8 && m->quant_scheme != LI_SCHEME_PLAIN) return bind_scheme_weight(m, w, t, name, k, rows, err);
    if (t->n_dims > 2 || t->ne[0] != k || t->ne[1] != rows)
        return li_error_set(err, LI_EINVAL, "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)k, (long long)rows);
    const li_type_traits *tr = li_type_get(t->type);
    if (!tr || !tr->to_float)
        return li_error_set(err, LI_EUNSUP, "model: tensor '%s' has type %s, which is not supported yet", name,
                            li_type_name(t->type));
    w->type = (li_type)t->type;
    w->k = k;
    w->m = rows;
    li_type_row_size(t->type, k, &w->row_bytes);
    w->data = t->data;
    w->packed = NULL;
    w->name = NULL;
    /* a GGUF weight is plain: its blocks say everything (no scheme fields) */
    w->scheme = LI_SCHEME_PLAIN;
    w->act = LI_ACT_F32;
    w->group_size = 0;
    w->scales = w->zeros = NULL;
    w->perm = NULL;
    m->weight_bytes += t->nbytes;
    return 0;
}

/* A 1-D norm weight as f32: points into the file when stored F32. */
static int bind_norm(li_model *m, const float **out, const char *name, int64_t n, li_error *err) {
    const li_gguf_tensor *t = li_gguf_find_tensor(&m->gguf, name);
    if (!t) return li_error_set(err, LI_EINVAL, "model: missing tensor '%s'", name);
    if (t->n_dims != 1 || t->ne[0] != n)
        return li_error_set(err, LI_EINVAL, "model: tensor '%s' has %lld elements, expected %lld", name,
                            (long long)t->ne[0], (long long)n);
    m->weight_bytes += t->nbytes;
    if (t->type == LI_TYPE_F32 && ((uintptr_t)t->data % 4) == 0) {
        *out = t->data;
        return 0;
    }
    const li_type_traits *tr = li_type_get(t->type);
    if (!tr || !tr->to_float)
        return li_error_set(err, LI_EUNSUP, "model: tensor '%s' has unsupported type %s", name, li_type_name(t->type));
    float *f = li_xmalloc((size_t)n * sizeof(float));
    tr->to_float(t->data, f, n);
    m->owned = li_xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = f;
    *out = f;
    return 0;
}

/* luainfer.rotation.*: the block of the online Hadamard (0: not rotated) */
static int read_rotation(li_model *m, li_error *err) {
    li_str s;
    int rc = li_gguf_get_str(&m->gguf, LI_ROT_KEY_METHOD, &s, err);
    m->rot_block = 0;
    if (rc == 1) return 0;
    if (rc) return rc;
    if (!li_str_eq(s, LI_ROT_METHOD))
        return li_error_set(err, LI_EUNSUP, "model: unknown rotation '%.*s' (" LI_ROT_KEY_METHOD ")", (int)s.len, s.ptr);
    uint32_t v = 0, b = 0;
    if ((rc = li_gguf_get_u32(&m->gguf, LI_ROT_KEY_VERSION, &v, err)) < 0) return rc;
    if (v != LI_ROT_VERSION)
        return li_error_set(err, LI_EUNSUP, "model: " LI_ROT_KEY_VERSION " %u is not supported (this build reads %d)", v,
                            LI_ROT_VERSION);
    if ((rc = li_gguf_get_u32(&m->gguf, LI_ROT_KEY_BLOCK, &b, err)) < 0) return rc;
    bool divides = true;
    for (int l = 0; l < m->hp.n_layer && b; l++) divides &= li_hp_n_ff(&m->hp, l) % b == 0;
    if (rc == 1 || b == 0 || (b & (b - 1)) || b > (uint32_t)m->hp.n_ff || !divides)
        return li_error_set(err, LI_EINVAL, "model: " LI_ROT_KEY_BLOCK " %u is not a power of two dividing n_ff %d", b,
                            m->hp.n_ff);
    m->rot_block = (int32_t)b;
    return 0;
}

int li_model_refuse_rotated(const li_model *m, const char *what, li_error *err) {
    if (!m->rot_block) return 0;
    return li_error_set(err, LI_EUNSUP, "%s: %s is a rotated model (luainfer quantize --rotate): its hidden states and "
                        "channels are in a rotated basis; use the unrotated file", what, m->path ? m->path : "the model");
}

static int bind_weights(li_model *m, li_error *err) {
    const li_hparams *hp = &m->hp;
    int rc;
    const li_gguf_tensor *emb = li_gguf_find_tensor(&m->gguf, "token_embd.weight");
    if (!emb) return li_error_set(err, LI_EINVAL, "model: missing tensor 'token_embd.weight'");
    hp = &m->hp;
    m->hp.n_vocab = (int32_t)emb->ne[1];
    if ((rc = bind_weight(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, err))) return rc;
    if ((rc = bind_norm(m, &m->output_norm, "output_norm.weight", hp->n_embd, err))) return rc;
    if (li_gguf_find_tensor(&m->gguf, "output.weight")) {
        if ((rc = bind_weight(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, err))) return rc;
    } else {
        m->output = m->tok_embd; /* tied embeddings */
    }
    m->layers = li_xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
#define BIND_W(field, tname, k, rows)                                                        \
    do {                                                                                     \
        snprintf(name, sizeof name, "blk.%d." tname ".weight", l);                           \
        if ((rc = bind_weight(m, &L->field, name, k, rows, err))) return rc;                 \
    } while (0)
#define BIND_N(field, tname)                                                                 \
    do {                                                                                     \
        snprintf(name, sizeof name, "blk.%d." tname ".weight", l);                           \
        if ((rc = bind_norm(m, &L->field, name, hp->n_embd, err))) return rc;                \
    } while (0)
    for (int l = 0; l < hp->n_layer; l++) {
        li_layer *L = &m->layers[l];
        BIND_N(attn_norm, "attn_norm");
        BIND_W(wq, "attn_q", hp->n_embd, q_dim);
        BIND_W(wk, "attn_k", hp->n_embd, kv_dim);
        BIND_W(wv, "attn_v", hp->n_embd, kv_dim);
        BIND_W(wo, "attn_output", q_dim, hp->n_embd);
        BIND_N(ffn_norm, "ffn_norm");
        const int32_t ff = li_hp_n_ff(hp, l);
        BIND_W(w_gate, "ffn_gate", hp->n_embd, ff);
        BIND_W(w_up, "ffn_up", hp->n_embd, ff);
        BIND_W(w_down, "ffn_down", ff, hp->n_embd);
        if (m->rot_block) {
            snprintf(name, sizeof name, LI_ROT_SIGNS_FMT, l);
            if ((rc = bind_norm(m, &L->down_had, name, ff, err))) return rc;
        }
    }
#undef BIND_W
#undef BIND_N
    return 0;
}

int li_model_load(li_model **out, const char *path, li_error *err) {
    *out = NULL;
    li_model *m = li_xcalloc(1, sizeof *m);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face directory */
        m->path = strdup(path);
        int rc = li_model_load_hf(m, path, err);
        if (rc) {
            li_model_free(m);
            return rc;
        }
        *out = m;
        return 0;
    }
    int rc = li_gguf_open(&m->gguf, path, err);
    if (rc) {
        free(m);
        return rc;
    }
    m->path = strdup(path);
    if ((rc = read_hparams(m, err)) || (rc = read_scheme(m, err)) || (rc = read_rotation(m, err)) ||
        (rc = bind_weights(m, err)))
        goto fail;
    if ((rc = li_tokenizer_init(&m->tok, &m->gguf, err))) goto fail;
    if (li_tokenizer_n_vocab(m->tok) != m->hp.n_vocab) {
        rc = li_error_set(err, LI_EINVAL, "model: tokenizer has %d tokens but the embedding has %d rows",
                          li_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    li_str tmpl;
    rc = li_gguf_get_str(&m->gguf, "tokenizer.chat_template", &tmpl, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        m->chat_template = li_xmalloc(tmpl.len + 1);
        memcpy(m->chat_template, tmpl.ptr, tmpl.len);
        m->chat_template[tmpl.len] = 0;
    }
    *out = m;
    return 0;
fail:
    li_model_free(m);
    return rc;
}

void li_model_free(li_model *m) {
    if (!m) return;
    if (m->tok) li_tokenizer_free(m->tok);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->n_ff_own);
    free(m->chat_template);
    free(m->path);
    li_model_free_hf(m);
    li_gguf_free(&m->gguf);
    free(m);
}

#define FOR_EACH_WEIGHT(m, w, body)                                                   \
    do {                                                                              \
        li_weight *w;                                                                 \
        w = &(m)->tok_embd; body;                                                     \
        if ((m)->output.data != (m)->tok_embd.data) { w = &(m)->output; body; }      \
        for (int l_ = 0; l_ < (m)->hp.n_layer; l_++) {                               \
            li_layer *L_ = &(m)->layers[l_];                                          \
            li_weight *all_[] = {&L_->wq, &L_->wk, &L_->wv, &L_->wo,                  \
                                 &L_->w_gate, &L_->w_up, &L_->w_down};                \
            for (size_t i_ = 0; i_ < LI_ARRAY_LEN(all_); i_++) { w = all_[i_]; body; } \
        }                                                                             \
    } while (0)

int li_model_prepare(li_model *m, li_backend *be, li_error *err) {
    if (m->rot_block && !be->ops->hadamard)
        return li_error_set(err, LI_EUNSUP, "model: backend %s has no hadamard op, which a rotated model needs",
                            be->ops->name);
    if (!be->ops->weight_prepare) return 0;
    int rc = 0;
    const li_weight *bad = NULL;
    FOR_EACH_WEIGHT(m, w, if (!rc && (rc = be->ops->weight_prepare(be, w))) bad = w);
    if (rc == LI_EUNSUP) /* the backend logged which kernel it lacks */
        return li_error_set(err, rc, "model: backend %s has no matmul kernel for %s weights (scheme %s, %lld x %lld)",
                            be->ops->name, li_type_name(bad->type), li_scheme_name(bad->scheme), (long long)bad->m,
                            (long long)bad->k);
    if (rc) return li_error_set(err, rc, "model: backend %s failed to prepare weights", be->ops->name);
    if (m->output.data == m->tok_embd.data) m->output = m->tok_embd;
    return 0;
}

void li_model_release(li_model *m, li_backend *be) {
    if (!be->ops->weight_release) return;
    FOR_EACH_WEIGHT(m, w, be->ops->weight_release(be, w));
    if (m->output.data == m->tok_embd.data) m->output.packed = NULL;
}

void li_model_warm(li_model *m, li_backend *be) {
    if (!be->ops->weight_warm) return;
    FOR_EACH_WEIGHT(m, w, be->ops->weight_warm(be, w));
}

const char *li_model_default_path(const char *explicit_path) {
    if (explicit_path && *explicit_path) return explicit_path;
    const char *env = getenv("LUAINFER_MODEL");
    if (env && *env) return env;
    return LI_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}
