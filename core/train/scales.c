/* scales.c — `distill --train scales`: a scheme file's group scales trained
 * end to end with its codes frozen (EfficientQAT's E2E-QP, Chen et al.
 * 2024). Rounding the matrices through their grids (--qat) cannot move a
 * weight by less than half a step, so small learning rates do nothing and
 * larger ones flip whole matrices (docs/benchmarks.md, session 39); a
 * group's scale moves its weights continuously and the file keeps its codes.
 *
 * Each scheme matrix W (m, k) gets a parameter tensor a (m, n_groups),
 * zero at the start: its group g's scale is s0_g · (1 + a_g), so
 *   w_c = (q_j - z_g) · s0_g · (1 + a_g),  c = perm[j], g = j / group_size,
 *   dL/da_g = s0_g · sum over the group's j of (q_j - z_g) · dL/dw_c.
 * The backward pass computes dL/dW as for a trained matrix (its slots lie
 * past the optimizer's, grad_only); the reduction is here. */
#include "train/train_internal.h"
#include "types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_matrix_kind(int kind) { return kind != LI_TL_ATTN_NORM && kind != LI_TL_FFN_NORM; }

int li_train_scales_layout(li_train_layout *L, const li_weight *const *w, li_error *err) {
    const int nl = L->hp.n_layer, n0 = L->n_tensors;
    int n_add = 0;
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < LI_TL_N; k++) {
            const li_weight *x = w[li_train_tensor_index(l, k)];
            n_add += is_matrix_kind(k) && x && x->scheme != LI_SCHEME_PLAIN;
        }
    if (!n_add)
        return li_error_set(err, LI_EINVAL, "train: --train scales trains a scheme file's group scales, and no matrix "
                                            "here has a scheme (make one with luainfer quantize --method w8a8, fp8, "
                                            "awq, gptq, rtn4 or w4a4)");
    L->t = li_xrealloc(L->t, (size_t)(n0 + n_add) * sizeof *L->t);
    size_t off = L->n_params, goff = L->n_grads;
    int idx = n0;
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < LI_TL_N; k++) {
            const int i = li_train_tensor_index(l, k);
            const li_weight *x = w[i];
            if (!is_matrix_kind(k) || !x || x->scheme == LI_SCHEME_PLAIN) continue;
            li_train_tensor *t = &L->t[idx];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%.*s.qscale", (int)(strlen(L->t[i].name) - strlen(".weight")),
                     L->t[i].name);
            t->rows = x->m;
            t->cols = li_weight_n_groups(x);
            t->layer = l;
            t->kind = k;
            t->lora_a = t->lora_b = t->qscale = -1;
            t->off = off;
            t->goff = (int64_t)goff;
            off += (size_t)(t->rows * t->cols);
            goff += (size_t)(t->rows * t->cols);
            L->t[i].qscale = idx++;
        }
    L->n_tensors = idx;
    L->n_params = off;
    L->n_grads = goff;
    /* the matrices' dW past the optimizer's slots; the backward pass runs
     * down to the lowest of them */
    for (int i = 0; i < n0; i++) {
        li_train_tensor *t = &L->t[i];
        if (t->qscale < 0) continue;
        t->grad_only = true;
        t->goff = (int64_t)goff;
        goff += (size_t)(t->rows * t->cols);
        if (t->layer < L->bwd_stop) L->bwd_stop = t->layer;
    }
    L->n_grads_all = goff;
    return 0;
}

typedef struct scales_job {
    li_train_model *tm;
    li_train_grads *g;     /* NULL: refresh */
} scales_job;

/* job i: tensor i, when it is a matrix with a qscale tensor */
static void refresh_job(void *ctx, int64_t i) {
    scales_job *c = ctx;
    li_train_model *tm = c->tm;
    const li_train_tensor *t = &tm->L.t[i];
    if (t->qscale < 0) return;
    const li_train_tensor *a = &tm->L.t[t->qscale];
    li_weight *w = &tm->qw[i];
    const float *s0 = tm->src[i]->scales, *pa = tm->params + a->off;
    float *s = (float *)w->scales;
    for (int64_t e = 0; e < a->rows * a->cols; e++) s[e] = s0[e] * (1.0f + pa[e]);
    float *scratch = li_xmalloc((size_t)w->k * sizeof(float));
    for (int64_t r = 0; r < t->rows; r++)
        li_weight_dequant_row(w, r, tm->params + t->off + (size_t)(r * t->cols), scratch);
    free(scratch);
}

static void grad_job(void *ctx, int64_t i) {
    scales_job *c = ctx;
    const li_train_model *tm = c->tm;
    const li_train_tensor *t = &tm->L.t[i];
    if (t->qscale < 0) return;
    const li_train_tensor *a = &tm->L.t[t->qscale];
    const li_weight *w = &tm->qw[i];
    const li_type_traits *tr = li_type_info(w->type);
    const int64_t ng = a->cols, gs = w->group_size > 0 ? w->group_size : w->k;
    const float zero = li_scheme_info(w->scheme)->zero, *s0 = tm->src[i]->scales;
    float *q = li_xmalloc((size_t)w->k * sizeof(float));
    double *acc = li_xmalloc((size_t)ng * sizeof(double));
    for (int64_t r = 0; r < t->rows; r++) {
        const float *dw = c->g->g + t->goff + r * t->cols, *zp = w->zeros ? w->zeros + r * ng : NULL;
        tr->to_float((const char *)w->data + r * w->row_bytes, q, w->k); /* codes, stored order */
        memset(acc, 0, (size_t)ng * sizeof(double));
        for (int64_t e = 0; e < w->k; e++) {
            const int64_t g = e / gs;
            acc[g] += (double)(q[e] - (zp ? zp[g] : zero)) * dw[w->perm ? w->perm[e] : e];
        }
        float *da = c->g->g + a->goff + r * ng;
        for (int64_t g = 0; g < ng; g++) da[g] = (float)(acc[g] * s0[r * ng + g]);
    }
    free(acc);
    free(q);
}

void li_train_scales_init(li_train_model *tm, struct li_threadpool *tp) {
    const li_train_layout *L = &tm->L;
    tm->qw = li_xcalloc((size_t)L->n_tensors, sizeof *tm->qw);
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->qscale < 0) continue;
        const li_train_tensor *a = &L->t[t->qscale];
        const size_t n = (size_t)(a->rows * a->cols);
        tm->qw[i] = *tm->src[i];
        tm->qw[i].packed = NULL; /* the reference reads it; the engine's layout is not ours */
        float *s = li_xmalloc(n * sizeof(float));
        memcpy(s, tm->src[i]->scales, n * sizeof(float));
        tm->qw[i].scales = s;
        memset(tm->params + a->off, 0, n * sizeof(float));
    }
    li_train_scales_refresh(tm, tp);
}

void li_train_scales_refresh(li_train_model *tm, struct li_threadpool *tp) {
    if (!tm->qw) return;
    scales_job c = {.tm = tm};
    li_train_par(tp, refresh_job, &c, tm->L.n_tensors, 7);
}

void li_train_scales_grad(const li_train_model *tm, li_train_grads *g, struct li_threadpool *tp) {
    if (!tm->qw) return;
    scales_job c = {.tm = (li_train_model *)tm, .g = g};
    li_train_par(tp, grad_job, &c, tm->L.n_tensors, 8);
}
