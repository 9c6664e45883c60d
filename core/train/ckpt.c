/* ckpt.c — a training model written as a GGUF the engine loads: the
 * source's metadata (hyper-parameters, tokenizer, chat template), the
 * weights as F32 or F16 (norms F32, as llama.cpp writes them), adapters
 * merged into their weights. */
#include "train/train.h"
#include "model/gguf_write.h"
#include "types.h"

#include <stdlib.h>
#include <string.h>

static bool skip_key(li_str key) {
    return li_str_eq(key, "general.file_type") || (key.len >= 9 && !memcmp(key.ptr, "luainfer.", 9));
}

/* tensor i's values with its adapter merged: W + scale · B·A (malloc'd) */
static float *merged(const li_train_model *tm, int i) {
    const li_train_tensor *t = &tm->L.t[i];
    const size_t n = (size_t)(t->rows * t->cols);
    float *w = li_xmalloc(n * sizeof(float));
    memcpy(w, tm->params + t->off, n * sizeof(float));
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
    for (uint64_t i = 0; i < src->n_kv && !rc; i++)
        if (!skip_key(src->kv[i].key)) rc = li_gguf_writer_add_kv(&w, &src->kv[i], err);
    /* llama.cpp's LLAMA_FTYPE_ALL_F32 = 0, MOSTLY_F16 = 1 */
    if (!rc) rc = li_gguf_writer_add_u32(&w, "general.file_type", dtype == LI_CKPT_F16 ? 1 : 0, err);
    const li_train_layout *L = &tm->L;
    for (int i = 0; i < LI_TT_N_GLOBAL + LI_TL_N * L->hp.n_layer && !rc; i++) {
        const li_train_tensor *t = &L->t[i];
        if (i == LI_TT_OUTPUT && L->tied) continue;
        float *f = merged(tm, i);
        const size_t n = (size_t)(t->rows * t->cols);
        const bool norm = t->rows == 1;
        const int64_t ne[2] = {t->cols, t->rows};
        if (norm || dtype == LI_CKPT_F32) {
            rc = li_gguf_writer_add_tensor(&w, t->name, LI_TYPE_F32, norm ? 1 : 2, ne, f, n * sizeof(float), err);
        } else {
            uint16_t *h = li_xmalloc(n * sizeof(uint16_t));
            for (size_t j = 0; j < n; j++) h[j] = li_fp32_to_fp16(f[j]);
            free(f);
            rc = li_gguf_writer_add_tensor(&w, t->name, LI_TYPE_F16, 2, ne, h, n * sizeof(uint16_t), err);
        }
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, err);
    li_gguf_writer_free(&w);
    return rc;
}
