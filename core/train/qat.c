/* qat.c — quantization-aware training (`distill --qat`).
 *
 * A healed model written in a quantized type loses part of what healing
 * gained when its float weights are simply rounded at the end (the pruned
 * model's healed KLD 0.731 in F16, 0.829 re-rounded to its Q4_1/Q8_0 types:
 * docs/benchmarks.md, session 20). With QAT the forward and backward passes
 * see every matrix as the checkpoint will store it, dequant(quant(master)),
 * and AdamW updates float32 master copies with those gradients (the
 * straight-through estimator). The checkpoint quantizes the masters, so the
 * file holds exactly the weights the last step trained. */
#include "train/train.h"
#include "train/train_internal.h"
#include "cpu/threadpool.h"
#include "types.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct qat_job {
    li_train_model *tm;
    bool trainable_only;
    atomic_long next;      /* tensor index handed out next */
} qat_job;

static bool rounded(const li_train_model *tm, int i, bool trainable_only) {
    const li_train_tensor *t = &tm->L.t[i];
    if (i == LI_TT_OUTPUT && tm->L.tied) return false; /* the alias of token_embd */
    return tm->qat_type[i] != LI_TYPE_F32 && (!trainable_only || t->goff >= 0);
}

/* The AVX2 round trip of a row of n values through ty (the reference
 * pair's values bit for bit, a tenth of the time: qat_avx2.c), or NULL
 * where the reference pair runs: another type, another ISA, a row not
 * whole blocks */
typedef void (*qat_row_fn)(const float *x, float *y, int64_t n);
static qat_row_fn qat_fast_row(li_type ty, int64_t n) {
    if (li_train_isa() < 1) return NULL;
    if (ty == LI_TYPE_Q4_1 && n % LI_QK4_1 == 0) return li_train_qat_q4_1_row_avx2;
    if (ty == LI_TYPE_Q8_0 && n % LI_QK8_0 == 0) return li_train_qat_q8_0_row_avx2;
    return NULL;
}

static void refresh_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    qat_job *j = ctx;
    li_train_model *tm = j->tm;
    uint8_t *q = NULL;
    float *scratch = NULL;
    size_t cap = 0, scap = 0;
    for (;;) {
        const long i = atomic_fetch_add(&j->next, 1);
        if (i >= tm->L.n_tensors) break;
        if (!rounded(tm, (int)i, j->trainable_only)) continue;
        const li_train_tensor *t = &tm->L.t[i];
        const li_type_traits *tr = li_type_info(tm->qat_type[i]);
        /* a scheme's code type: the matrix rounds onto its file's grid (li_train_qat_init) */
        const li_weight *grid = tr->scaled ? tm->src[i] : NULL;
        const qat_row_fn fast = qat_fast_row(tm->qat_type[i], t->cols);
        size_t row;
        li_type_row_size(tm->qat_type[i], t->cols, &row);
        if (row > cap) q = li_xrealloc(q, cap = row);
        if (grid && (size_t)t->cols > scap) scratch = li_xrealloc(scratch, (scap = (size_t)t->cols) * sizeof(float));
        for (int64_t r = 0; r < t->rows; r++) {
            const size_t o = t->off + (size_t)(r * t->cols);
            if (grid) { /* its own scales, zero points, permutation */
                li_weight_requant_row_ref(grid, r, tm->master + o, q, tm->params + o, scratch);
                continue;
            }
            if (fast) {
                fast(tm->master + o, tm->params + o, t->cols);
                continue;
            }
            tr->from_float(tm->master + o, q, t->cols);
            tr->to_float(q, tm->params + o, t->cols);
        }
    }
    free(q);
    free(scratch);
}

void li_train_qat_refresh(li_train_model *tm, bool trainable_only, struct li_threadpool *tp) {
    if (!tm->master) return;
    /* unrounded trainable tensors (norms) follow their masters unchanged */
    for (int i = 0; i < tm->L.n_tensors; i++) {
        const li_train_tensor *t = &tm->L.t[i];
        if (tm->qat_type[i] == LI_TYPE_F32 && (!trainable_only || t->goff >= 0))
            memcpy(tm->params + t->off, tm->master + t->off, (size_t)(t->rows * t->cols) * sizeof(float));
    }
    qat_job j = {.tm = tm, .trainable_only = trainable_only};
    atomic_store(&j.next, 0);
    if (tp) li_threadpool_run_sized(tp, refresh_run, &j, li_threadpool_size(tp), tm->L.n_tensors);
    else refresh_run(&j, 0, 1);
}

int li_train_qat_init(li_train_model *tm, const li_gguf *src, li_ckpt_dtype dtype, struct li_threadpool *tp,
                      li_error *err) {
    if (dtype == LI_CKPT_F32)
        return li_error_set(err, LI_EINVAL, "train: --qat trains through the checkpoint's rounding: give --dtype "
                                            "f16, bf16, q8_0, q4_0, q4_1 or source");
    if (tm->L.n_lora)
        return li_error_set(err, LI_EINVAL, "train: --qat does not apply to LoRA (the adapters are merged into "
                                            "their weights after training): train all, norms or layers:A-B");
    if (tm->qw)
        return li_error_set(err, LI_EINVAL, "train: --train scales keeps every matrix on its file's codes and trains "
                                            "their scales; --qat does not apply");
    const size_t n = tm->L.n_params;
    tm->master = li_aligned_alloc(n * sizeof(float));
    if (!tm->master) return li_error_set(err, LI_ENOMEM, "train: no memory for the --qat master copies");
    memcpy(tm->master, tm->params, n * sizeof(float));
    tm->qat_type = li_xmalloc((size_t)tm->L.n_tensors * sizeof *tm->qat_type);
    for (int i = 0; i < tm->L.n_tensors; i++) {
        const li_train_tensor *t = &tm->L.t[i];
        const li_weight *g = li_train_scheme_weight(tm, dtype, i);
        tm->qat_type[i] = t->rows == 1 ? LI_TYPE_F32 : g ? g->type : li_ckpt_matrix_type(dtype, src, t->name, t->cols);
    }
    li_train_qat_refresh(tm, false, tp);
    return 0;
}
