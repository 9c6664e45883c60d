/* eagle_file.c — the one check of an EAGLE draft file (spec/eagle_file.h). */
#include "spec/eagle_file.h"

#include "spec/draft_base.h"

#include <stdio.h>
#include <string.h>

static const char *const tensor_names[LI_EAGLE_N_TENSORS] = {
    [LI_EAGLE_FC] = "eagle.fc.weight",
    [LI_EAGLE_ENORM] = "eagle.enorm.weight",
    [LI_EAGLE_HNORM] = "eagle.hnorm.weight",
    [LI_EAGLE_WQ] = "eagle.attn_q.weight",
    [LI_EAGLE_WK] = "eagle.attn_k.weight",
    [LI_EAGLE_WV] = "eagle.attn_v.weight",
    [LI_EAGLE_WO] = "eagle.attn_output.weight",
    [LI_EAGLE_FFN_NORM] = "eagle.ffn_norm.weight",
    [LI_EAGLE_GATE] = "eagle.ffn_gate.weight",
    [LI_EAGLE_UP] = "eagle.ffn_up.weight",
    [LI_EAGLE_DOWN] = "eagle.ffn_down.weight",
    [LI_EAGLE_OUTPUT_NORM] = "eagle.output_norm.weight",
};

const char *li_eagle_tensor_name(li_eagle_tensor t) {
    return (unsigned)t < LI_EAGLE_N_TENSORS ? tensor_names[t] : "?";
}

static int get_u32(const li_gguf *g, const char *path, const char *key, int32_t *v, li_error *err) {
    uint32_t u;
    if (li_gguf_get_u32(g, key, &u, NULL))
        return li_error_set(err, LI_EINVAL, "eagle: %s: missing or not a u32: '%s'", path, key);
    if (u > (1u << 24)) return li_error_set(err, LI_EINVAL, "eagle: %s: '%s' is %u, out of range", path, key, u);
    *v = (int32_t)u;
    return 0;
}

/* A tensor's expected shape (cols, rows; rows 0: a vector) per kind. */
static void tensor_shape(const li_eagle_file *f, li_eagle_tensor t, int64_t *cols, int64_t *rows) {
    const int64_t d = f->n_embd, q = (int64_t)f->n_head * f->head_dim, kv = (int64_t)f->n_head_kv * f->head_dim;
    *rows = 0;
    switch (t) {
    case LI_EAGLE_FC: *cols = (int64_t)f->n_features * d, *rows = d; break;
    case LI_EAGLE_WQ: *cols = 2 * d, *rows = q; break;
    case LI_EAGLE_WK:
    case LI_EAGLE_WV: *cols = 2 * d, *rows = kv; break;
    case LI_EAGLE_WO: *cols = q, *rows = d; break;
    case LI_EAGLE_GATE:
    case LI_EAGLE_UP: *cols = d, *rows = f->n_ff; break;
    case LI_EAGLE_DOWN: *cols = f->n_ff, *rows = d; break;
    default: *cols = d; break; /* the norms */
    }
}

static int check_tensor(const li_gguf *g, const char *path, li_eagle_file *f, li_eagle_tensor t, li_error *err) {
    const char *name = tensor_names[t];
    const li_gguf_tensor *x = li_gguf_find_tensor(g, name);
    if (!x) return li_error_set(err, LI_EINVAL, "eagle: %s: missing tensor '%s'", path, name);
    int64_t cols, rows;
    tensor_shape(f, t, &cols, &rows);
    if (!rows) {
        if (x->type != LI_TYPE_F32 || x->n_dims != 1 || x->ne[0] != cols)
            return li_error_set(err, LI_EINVAL, "eagle: %s: tensor '%s' is %s [%lld], want f32 [%lld]", path, name,
                                li_type_name(x->type), (long long)x->ne[0], (long long)cols);
    } else {
        if (x->type != LI_TYPE_F32 && x->type != LI_TYPE_F16 && x->type != LI_TYPE_BF16 && x->type != LI_TYPE_Q8_0 &&
            x->type != LI_TYPE_Q4_0 && x->type != LI_TYPE_Q4_1)
            return li_error_set(err, LI_EUNSUP,
                                "eagle: %s: tensor '%s' has type %s, want f32, f16, bf16, q8_0, q4_0 or q4_1", path,
                                name, li_type_name(x->type));
        if (x->n_dims != 2 || x->ne[0] != cols || x->ne[1] != rows)
            return li_error_set(err, LI_EINVAL, "eagle: %s: tensor '%s' has shape [%lld, %lld], want [%lld, %lld]",
                                path, name, (long long)x->ne[0], (long long)(x->n_dims > 1 ? x->ne[1] : 1),
                                (long long)cols, (long long)rows);
    }
    f->t[t] = x;
    return 0;
}

/* eagle.vocab: strictly ascending ids of the base (absent: all of them). */
static int check_vocab(const li_gguf *g, const char *path, li_eagle_file *f, li_error *err) {
    const li_gguf_tensor *x = li_gguf_find_tensor(g, "eagle.vocab");
    f->vocab = NULL;
    f->n_draft = f->n_vocab;
    if (!x) return 0;
    if (x->type != LI_TYPE_I32 || x->n_dims != 1 || x->ne[0] < 1 || x->ne[0] > f->n_vocab)
        return li_error_set(err, LI_EINVAL, "eagle: %s: tensor 'eagle.vocab' is %s [%lld], want i32 [1..%d]", path,
                            li_type_name(x->type), (long long)x->ne[0], f->n_vocab);
    const int32_t *v = (const int32_t *)x->data;
    for (int64_t i = 0; i < x->ne[0]; i++)
        if (v[i] < 0 || v[i] >= f->n_vocab || (i && v[i] <= v[i - 1]))
            return li_error_set(err, LI_EINVAL,
                                "eagle: %s: eagle.vocab[%lld] is %d: ids must be strictly ascending in [0, %d)", path,
                                (long long)i, v[i], f->n_vocab);
    f->vocab = v;
    f->n_draft = (int32_t)x->ne[0];
    return 0;
}

int li_eagle_file_check(const li_gguf *g, const char *path, const li_eagle_base *base, li_eagle_file *f,
                        li_error *err) {
    *f = (li_eagle_file){0};
    char arch[64] = "";
    if (!li_gguf_copy_str(g, "general.architecture", arch, sizeof arch) || strcmp(arch, "eagle"))
        return li_error_set(err, LI_EINVAL,
                            "eagle: %s: general.architecture is '%s', expected 'eagle' (not an EAGLE draft)", path, arch);
    int32_t version, n_layer;
    int rc;
    if ((rc = get_u32(g, path, "eagle.version", &version, err))) return rc;
    if (version != 1)
        return li_error_set(err, LI_EUNSUP, "eagle: %s: eagle.version is %d, this build reads version 1", path, version);
    if ((rc = get_u32(g, path, "eagle.n_embd", &f->n_embd, err)) ||
        (rc = get_u32(g, path, "eagle.n_vocab", &f->n_vocab, err)) ||
        (rc = get_u32(g, path, "eagle.n_head", &f->n_head, err)) ||
        (rc = get_u32(g, path, "eagle.n_head_kv", &f->n_head_kv, err)) ||
        (rc = get_u32(g, path, "eagle.head_dim", &f->head_dim, err)) ||
        (rc = get_u32(g, path, "eagle.n_ff", &f->n_ff, err)) ||
        (rc = get_u32(g, path, "eagle.n_features", &f->n_features, err)) ||
        (rc = get_u32(g, path, "eagle.base.n_layer", &n_layer, err)))
        return rc;
    if (f->n_embd < 1 || f->n_vocab < 1 || f->n_ff < 1 || f->head_dim < 2 || f->head_dim % 2 || f->n_head_kv < 1 ||
        f->n_head < f->n_head_kv || f->n_head % f->n_head_kv)
        return li_error_set(err, LI_EINVAL,
                            "eagle: %s: n_embd %d, n_head %d, n_head_kv %d, head_dim %d, n_ff %d do not make a block",
                            path, f->n_embd, f->n_head, f->n_head_kv, f->head_dim, f->n_ff);
    if (f->n_features < 1 || f->n_features > LI_EAGLE_MAX_FEATURES)
        return li_error_set(err, LI_EINVAL, "eagle: %s: eagle.n_features is %d, must be in [1, %d]", path,
                            f->n_features, LI_EAGLE_MAX_FEATURES);
    for (int32_t i = 0; i < f->n_features; i++) {
        char key[64];
        snprintf(key, sizeof key, "eagle.feature_layer.%d", i);
        if ((rc = get_u32(g, path, key, &f->feature_layer[i], err))) return rc;
        if (f->feature_layer[i] >= n_layer || (i && f->feature_layer[i] <= f->feature_layer[i - 1]))
            return li_error_set(err, LI_EINVAL, "eagle: %s: %s is %d: blocks must be ascending in [0, %d)", path, key,
                                f->feature_layer[i], n_layer);
    }
    f->base_n_layer = n_layer;
    /* base NULL: the file alone (luainfer info) */
    const li_draft_model_ref mref = {base ? base->name : NULL, base ? base->vocab_hash : 0};
    char who[160]; /* " 'name'" of the base, when known */
    if ((rc = li_draft_base_read(g, path, "eagle", "draft", base ? &mref : NULL, f->base_name, sizeof f->base_name,
                                 &f->vocab_hash, who, sizeof who, err)))
        return rc;
    if (base) {
        if ((int64_t)f->n_embd != base->n_embd || (int64_t)f->n_vocab != base->n_vocab ||
            (int64_t)n_layer != base->n_layer || (int64_t)f->head_dim != base->head_dim)
            return li_error_set(err, LI_EINVAL,
                                "eagle: draft made for '%s' (n_embd %d, n_vocab %d, %d blocks, head_dim %d), the model%s "
                                "has n_embd %lld, n_vocab %lld, %lld blocks, head_dim %lld",
                                f->base_name, f->n_embd, f->n_vocab, n_layer, f->head_dim, who, (long long)base->n_embd,
                                (long long)base->n_vocab, (long long)base->n_layer, (long long)base->head_dim);
        li_draft_base_warn_name("eagle", "draft", f->base_name, &mref);
    }
    for (int t = 0; t < LI_EAGLE_N_TENSORS; t++)
        if ((rc = check_tensor(g, path, f, (li_eagle_tensor)t, err))) return rc;
    return check_vocab(g, path, f, err);
}
