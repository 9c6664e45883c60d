/* optim.c — AdamW (decoupled weight decay, bias correction) with
 * global-norm gradient clipping, over the trainable tensors only. */
#include "train/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int li_adamw_init(li_adamw *a, const li_train_layout *L) {
    memset(a, 0, sizeof *a);
    a->n = L->n_grads;
    const size_t bytes = LI_MAX(a->n, (size_t)1) * sizeof(float);
    a->m = li_aligned_alloc(bytes);
    a->v = li_aligned_alloc(bytes);
    if (!a->m || !a->v) {
        li_adamw_free(a);
        return LI_ENOMEM;
    }
    memset(a->m, 0, bytes);
    memset(a->v, 0, bytes);
    return 0;
}

void li_adamw_free(li_adamw *a) {
    li_aligned_free(a->m);
    li_aligned_free(a->v);
    memset(a, 0, sizeof *a);
}

double li_train_grad_norm(const li_train_grads *g) {
    double ss = 0;
    for (size_t i = 0; i < g->n; i++) ss += (double)g->g[i] * g->g[i];
    return sqrt(ss); /* NaN or Inf propagate */
}

int li_adamw_step(li_adamw *a, li_train_model *tm, const li_train_grads *g, const li_adamw_opts *o, double *norm,
                  li_error *err) {
    const double gn = li_train_grad_norm(g);
    if (norm) *norm = gn;
    if (!isfinite(gn))
        return li_error_set(err, LI_ERANGE, "train: step %lld: the gradients hold NaN or Inf (norm %g)",
                            (long long)a->step + 1, gn);
    /* clipping scales the whole gradient, keeping its direction */
    const float clip = o->clip > 0 && gn > o->clip ? (float)(o->clip / gn) : 1.0f;
    a->step++;
    const double bc1 = 1.0 - pow(o->beta1, (double)a->step), bc2 = 1.0 - pow(o->beta2, (double)a->step);
    const float lr = o->lr, b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = o->weight_decay;
    const float step_size = (float)(lr / bc1), inv_bc2 = (float)(1.0 / bc2);
    const li_train_layout *L = &tm->L;
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->goff < 0 || (i == LI_TT_OUTPUT && L->tied)) continue; /* frozen, or the same slots as token_embd */
        const int64_t n = t->rows * t->cols;
        float *p = tm->params + t->off;
        const float *gr = g->g + t->goff;
        float *m = a->m + t->goff, *v = a->v + t->goff;
        for (int64_t j = 0; j < n; j++) {
            const float gj = gr[j] * clip;
            m[j] = b1 * m[j] + (1 - b1) * gj;
            v[j] = b2 * v[j] + (1 - b2) * gj * gj;
            p[j] -= lr * wd * p[j];
            p[j] -= step_size * m[j] / (sqrtf(v[j] * inv_bc2) + eps);
        }
    }
    return 0;
}
