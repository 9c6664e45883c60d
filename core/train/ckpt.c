/* ckpt.c — a training model written as a GGUF the engine loads: the
 * source's metadata (hyper-parameters, tokenizer, chat template), the
 * matrices as F32, F16, BF16, Q8_0, Q4_0, Q4_1 or each in its source type
 * (norms F32, as llama.cpp writes them), quantized by the types' reference
 * quantizers (kernels/types.c, the ones `luainfer quantize` uses), adapters
 * merged into their weights. */
#include "train/train.h"
#include "model/gguf_write.h"
#include "types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* per li_ckpt_dtype: its --dtype name, the label the "wrote" lines print,
 * the GGUF type of its matrices and llama.cpp's general.file_type
 * (LLAMA_FTYPE_*); source: each matrix's own */
static const struct {
    const char *name, *label;
    uint32_t type, file_type;
} dtypes[] = {
    [LI_CKPT_F32] = {"f32", "F32", LI_TYPE_F32, 0},       [LI_CKPT_F16] = {"f16", "F16", LI_TYPE_F16, 1},
    [LI_CKPT_Q8_0] = {"q8_0", "Q8_0", LI_TYPE_Q8_0, 7},   [LI_CKPT_BF16] = {"bf16", "BF16", LI_TYPE_BF16, 32},
    [LI_CKPT_Q4_0] = {"q4_0", "Q4_0", LI_TYPE_Q4_0, 2},   [LI_CKPT_Q4_1] = {"q4_1", "Q4_1", LI_TYPE_Q4_1, 3},
    [LI_CKPT_SOURCE] = {"source", "source", LI_TYPE_F16, 0},
};

int li_ckpt_dtype_parse(const char *name, li_ckpt_dtype *out) {
    for (int d = 0; name && d < (int)LI_ARRAY_LEN(dtypes); d++)
        if (!strcmp(name, dtypes[d].name)) return *out = (li_ckpt_dtype)d, 0;
    return -1;
}

const char *li_ckpt_dtype_name(li_ckpt_dtype d) {
    return (unsigned)d < LI_ARRAY_LEN(dtypes) ? dtypes[d].name : "unknown";
}

const char *li_ckpt_dtype_label(li_ckpt_dtype d) {
    return (unsigned)d < LI_ARRAY_LEN(dtypes) ? dtypes[d].label : "unknown";
}

uint32_t li_ckpt_matrix_type(li_ckpt_dtype d, const li_gguf *src, const char *name, int64_t cols) {
    uint32_t t = dtypes[d].type;
    if (d == LI_CKPT_SOURCE) {
        const li_gguf_tensor *st = li_gguf_find_tensor(src, name);
        if (st) t = st->type;
    }
    const li_type_traits *tr = li_type_get(t);
    size_t row;
    if (t == LI_TYPE_F32 || t == LI_TYPE_F16) return t;
    /* a scaled type (w8a8, fp8, 4-bit schemes) needs its scale tensors: F16 */
    return tr && tr->from_float && !tr->scaled && tr->kind != LI_KIND_INT && li_type_row_size(t, cols, &row)
               ? t : LI_TYPE_F16;
}

static bool has_prefix(li_str key, const char *p) { return key.len >= strlen(p) && !memcmp(key.ptr, p, strlen(p)); }

/* luainfer's own keys describe the source's tensors: its weight scheme
 * stays when some matrix is written in it, its rotation always (the
 * trained function is the rotated one) */
static bool skip_key(li_str key, bool scheme, bool rotated) {
    if (li_str_eq(key, "general.file_type")) return true;
    if (!has_prefix(key, "luainfer.")) return false;
    return !(scheme && has_prefix(key, "luainfer.quant.")) && !(rotated && has_prefix(key, "luainfer.rotation."));
}

const li_weight *li_train_scheme_weight(const li_train_model *tm, li_ckpt_dtype dtype, int i) {
    if (dtype != LI_CKPT_SOURCE || !tm->src || !tm->src[i]) return NULL;
    const li_weight *w = tm->src[i];
    const li_type_traits *tr = li_type_info(w->type);
    return w->scheme != LI_SCHEME_PLAIN && tr && tr->from_float ? w : NULL;
}

/* src's tensor `name` copied as it is; absent: nothing (0) */
static int copy_tensor(li_gguf_writer *w, const li_gguf *src, const char *name, li_error *err) {
    const li_gguf_tensor *t = li_gguf_find_tensor(src, name);
    if (!t) return 0;
    void *b = li_xmalloc(LI_MAX(t->nbytes, (size_t)1));
    memcpy(b, t->data, t->nbytes);
    return li_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, b, t->nbytes, err);
}

/* the trained scales of matrix i (--train scales) as its source's .scale tensor */
static int write_scales(li_gguf_writer *w, const li_train_model *tm, int i, const li_gguf *src, li_error *err) {
    const li_train_tensor *t = &tm->L.t[i], *a = &tm->L.t[t->qscale];
    char cn[96];
    snprintf(cn, sizeof cn, "%s.scale", t->name);
    const li_gguf_tensor *st = li_gguf_find_tensor(src, cn);
    const size_t n = (size_t)(a->rows * a->cols);
    if (!st || st->type != LI_TYPE_F32 || st->nbytes != n * sizeof(float))
        return li_error_set(err, LI_EINVAL, "train: %s: the source's scales are not the f32 (%lld, %lld) its weight "
                            "reads", cn, (long long)a->rows, (long long)a->cols);
    float *s = li_xmalloc(n * sizeof(float));
    memcpy(s, tm->qw[i].scales, n * sizeof(float));
    return li_gguf_writer_add_tensor(w, cn, st->type, st->n_dims, st->ne, s, st->nbytes, err);
}

/* Matrix i on its scheme weight g's grid: the codes in the source tensor's
 * GGUF type and shape, its scales, zero points and permutation copied. A
 * matrix that did not train is copied byte for byte; one whose scales
 * trained (--train scales) keeps its codes and gets its new scales. */
static int write_scheme(li_gguf_writer *w, const li_train_model *tm, int i, const li_weight *g, const float *f,
                        const li_gguf *src, li_error *err) {
    const li_train_tensor *t = &tm->L.t[i];
    const li_gguf_tensor *st = li_gguf_find_tensor(src, t->name);
    if (!st || st->nbytes != g->row_bytes * (size_t)g->m)
        return li_error_set(err, LI_EINVAL, "train: %s: the source's codes are not where its weight says", t->name);
    int rc;
    if ((t->goff < 0 || t->grad_only) && t->lora_a < 0) {
        rc = copy_tensor(w, src, t->name, err);
    } else {
        uint8_t *q = li_xmalloc(st->nbytes);
        float *scratch = li_xmalloc((size_t)t->cols * sizeof(float));
        for (int64_t r = 0; r < t->rows; r++)
            li_weight_requant_row_ref(g, r, f + r * t->cols, q + (size_t)r * g->row_bytes, NULL, scratch);
        free(scratch);
        rc = li_gguf_writer_add_tensor(w, t->name, st->type, st->n_dims, st->ne, q, st->nbytes, err);
    }
    static const char *const companions[] = {".scale", ".zero", ".perm"};
    for (size_t c = 0; c < LI_ARRAY_LEN(companions) && !rc; c++) {
        char cn[96];
        snprintf(cn, sizeof cn, "%s%s", t->name, companions[c]);
        rc = c == 0 && t->qscale >= 0 ? write_scales(w, tm, i, src, err) : copy_tensor(w, src, cn, err);
    }
    return rc;
}

/* tensor i's values with its adapter merged: W + scale · B·A (malloc'd) */
static float *merged(const li_train_model *tm, int i) {
    const li_train_tensor *t = &tm->L.t[i];
    const size_t n = (size_t)(t->rows * t->cols);
    float *w = li_xmalloc(n * sizeof(float));
    /* with QAT, the masters: quantizing them gives the very codes the passes trained */
    memcpy(w, (tm->master ? tm->master : tm->params) + t->off, n * sizeof(float));
    if (t->lora_a >= 0) {
        const li_train_tensor *A = &tm->L.t[t->lora_a], *B = &tm->L.t[t->lora_b];
        const int64_t r = A->rows;
        float *sb = li_xmalloc((size_t)(t->rows * r) * sizeof(float));
        for (int64_t j = 0; j < t->rows * r; j++) sb[j] = tm->L.lora_scale * tm->params[B->off + (size_t)j];
        li_train_mm_acc(NULL, sb, r, 1, tm->params + A->off, w, t->rows, r, t->cols);
        free(sb);
    }
    return w;
}

int li_train_save(const li_train_model *tm, const li_gguf *src, li_ckpt_dtype dtype, const char *path,
                  li_error *err) {
    if (!src->kv || !li_gguf_find_kv(src, "tokenizer.ggml.model"))
        return li_error_set(err, LI_EINVAL, "train: a checkpoint needs a GGUF source model (its metadata and tokenizer)");
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    int rc = 0;
    const li_train_layout *L = &tm->L;
    bool scheme = false;
    for (int i = 0; i < L->n_tensors; i++) scheme |= li_train_scheme_weight(tm, dtype, i) != NULL;
    for (uint64_t i = 0; i < src->n_kv && !rc; i++)
        if (!skip_key(src->kv[i].key, scheme, L->rot_block > 0)) rc = li_gguf_writer_add_kv(&w, &src->kv[i], err);
    /* a source-typed file keeps the source's file type (copied when it has one) */
    if (!rc && dtype != LI_CKPT_SOURCE)
        rc = li_gguf_writer_add_u32(&w, "general.file_type", dtypes[dtype].file_type, err);
    else if (!rc && li_gguf_find_kv(src, "general.file_type"))
        rc = li_gguf_writer_add_kv(&w, li_gguf_find_kv(src, "general.file_type"), err);
    for (int i = 0; i < LI_TT_N_GLOBAL + LI_TL_N * L->hp.n_layer && !rc; i++) {
        const li_train_tensor *t = &L->t[i];
        if (i == LI_TT_OUTPUT && L->tied) continue;
        float *f = merged(tm, i);
        const bool norm = t->rows == 1;
        const int64_t ne[2] = {t->cols, t->rows};
        const uint32_t type = norm ? LI_TYPE_F32 : li_ckpt_matrix_type(dtype, src, t->name, t->cols);
        const li_weight *g = norm ? NULL : li_train_scheme_weight(tm, dtype, i);
        if (g) {
            rc = write_scheme(&w, tm, i, g, f, src, err);
            free(f);
        } else if (type == LI_TYPE_F32) {
            rc = li_gguf_writer_add_tensor(&w, t->name, LI_TYPE_F32, norm ? 1 : 2, ne, f,
                                           (size_t)(t->rows * t->cols) * sizeof(float), err);
        } else {
            size_t row;
            li_type_row_size(type, t->cols, &row);
            uint8_t *q = li_xmalloc(row * (size_t)t->rows);
            const li_type_traits *tr = li_type_get(type);
            for (int64_t r = 0; r < t->rows; r++) tr->from_float(f + r * t->cols, q + (size_t)r * row, t->cols);
            free(f);
            f = NULL;
            rc = li_gguf_writer_add_tensor(&w, t->name, type, 2, ne, q, row * (size_t)t->rows, err);
        }
    }
    /* a rotated model's signs of the online Hadamard */
    for (int l = 0; l < L->hp.n_layer && L->rot_block && !rc; l++) {
        char name[64];
        snprintf(name, sizeof name, LI_ROT_SIGNS_FMT, l);
        rc = copy_tensor(&w, src, name, err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, err);
    li_gguf_writer_free(&w);
    return rc;
}
