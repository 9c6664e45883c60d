/* optim.c — AdamW (decoupled weight decay, bias correction) with
 * global-norm gradient clipping, over the trainable tensors only. The
 * update and the norm run in fixed chunks on the thread pool: each chunk's
 * arithmetic is the same whoever runs it, and the norm's partial sums are
 * added in chunk order, so the result does not depend on the threads.
 * Where the training kernels run AVX-512 or AVX2 the update does too
 * (optim_avx512.c, optim_avx2.c). The learning-rate schedules are here too. */
#include "train/train_internal.h"
#include "train/optim_tmpl.h"
#include "cpu/threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK ((size_t)1 << 16) /* elements per job */

double li_train_lr_at(const li_lr_schedule *s, double lr, int step, int total) {
    const double s0 = step - 1, w = s->warmup; /* their 0-based step */
    if (s0 < w) return lr * s0 / (w > 1 ? w : 1);
    const double span = total - w > 1 ? total - w : 1, progress = (s0 - w) / span;
    switch (s->kind) {
    case LI_LR_COSINE: return lr * fmax(0.0, 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
    case LI_LR_LINEAR: return lr * fmax(0.0, (total - s0) / span);
    default: return lr;
    }
}

int li_lr_kind_parse(const char *name, li_lr_kind *kind) {
    static const char *const names[] = {"constant", "cosine", "linear"};
    for (int i = 0; i < (int)LI_ARRAY_LEN(names); i++)
        if (!strcmp(name, names[i])) {
            *kind = (li_lr_kind)i;
            return 0;
        }
    return -1;
}

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

/* ==== chunked jobs ========================================================= */

typedef struct opt_job {
    /* norm: partial sums of squares per chunk of the gradient array */
    const float *g;
    size_t n;
    double *partial;
    /* update: chunk c is elements [c0, c1) of tensor tix[c] */
    li_train_model *tm;
    li_adamw *a;
    const li_adamw_opts *o;
    int32_t *tix;
    size_t *c0, *c1;
    float clip, step_size, inv_bc2;
    size_t n_chunks;
    atomic_long next;
} opt_job;

static void norm_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    opt_job *j = ctx;
    for (;;) {
        const long c = atomic_fetch_add(&j->next, 1);
        if ((size_t)c >= j->n_chunks) break;
        const size_t i0 = (size_t)c * CHUNK, i1 = LI_MIN(j->n, i0 + CHUNK);
        /* eight independent sums (one chain waits 4 cycles an add), added
         * in a fixed tree: the same bits on any CPU */
        double s[8] = {0};
        size_t i = i0;
        for (; i + 8 <= i1; i += 8)
            for (int k = 0; k < 8; k++) s[k] += (double)j->g[i + k] * j->g[i + k];
        for (int k = 0; i < i1; i++, k++) s[k] += (double)j->g[i] * j->g[i];
        j->partial[c] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

static void update_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    opt_job *j = ctx;
    const li_adamw_coef cf = {.clip = j->clip, .b1 = j->o->beta1, .b2 = j->o->beta2, .lr = j->o->lr,
                              .wd = j->o->weight_decay, .step_size = j->step_size, .inv_bc2 = j->inv_bc2,
                              .eps = j->o->eps};
    const int isa = li_train_isa();
    for (;;) {
        const long c = atomic_fetch_add(&j->next, 1);
        if ((size_t)c >= j->n_chunks) break;
        const li_train_tensor *t = &j->tm->L.t[j->tix[c]];
        /* QAT (qat.c): the gradients of the rounded weights step the float32 masters */
        float *p = (j->tm->master ? j->tm->master : j->tm->params) + t->off + j->c0[c];
        const float *gr = j->g + t->goff + j->c0[c];
        float *m = j->a->m + t->goff + j->c0[c], *v = j->a->v + t->goff + j->c0[c];
        const size_t n = j->c1[c] - j->c0[c];
        if (isa == 2) {
            li_adamw_update_avx512(p, gr, m, v, n, &cf);
            continue;
        }
        if (isa == 1) {
            li_adamw_update_avx2(p, gr, m, v, n, &cf);
            continue;
        }
        li_adamw_update_scalar(p, gr, m, v, n, &cf);
    }
}

static void launch(li_threadpool *tp, li_threadpool_fn fn, opt_job *j) {
    atomic_store(&j->next, 0);
    if (tp && j->n_chunks > 1)
        li_threadpool_run_sized(tp, fn, j, (int)LI_MIN((size_t)li_threadpool_size(tp), j->n_chunks),
                                (int64_t)j->n_chunks);
    else fn(j, 0, 1);
}

/* the norm of g's first n elements */
static double grad_norm(const float *g, size_t n, li_threadpool *tp) {
    opt_job j = {.g = g, .n = n, .n_chunks = (n + CHUNK - 1) / CHUNK};
    j.partial = li_xcalloc(LI_MAX(j.n_chunks, (size_t)1), sizeof *j.partial);
    launch(tp, norm_run, &j);
    double ss = 0;
    for (size_t c = 0; c < j.n_chunks; c++) ss += j.partial[c];
    free(j.partial);
    return sqrt(ss); /* NaN or Inf propagate */
}

double li_train_grad_norm(const li_train_grads *g) { return grad_norm(g->g, g->n, NULL); }

int li_adamw_step(li_adamw *a, li_train_model *tm, const li_train_grads *g, const li_adamw_opts *o, double *norm,
                  li_error *err) {
    /* what the optimizer steps: not the grad_only matrices' dW past n_grads (--train scales) */
    const double gn = grad_norm(g->g, LI_MIN(g->n, tm->L.n_grads), o->tp);
    if (norm) *norm = gn;
    if (!isfinite(gn))
        return li_error_set(err, LI_ERANGE, "train: step %lld: the gradients hold NaN or Inf (norm %g)",
                            (long long)a->step + 1, gn);
    a->step++;
    const double bc1 = 1.0 - pow(o->beta1, (double)a->step), bc2 = 1.0 - pow(o->beta2, (double)a->step);
    const li_train_layout *L = &tm->L;
    /* chunks of the trainable tensors (the tied head shares token_embd's slots) */
    size_t n_chunks = 0;
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->goff >= 0 && !t->grad_only && !(i == LI_TT_OUTPUT && L->tied))
            n_chunks += ((size_t)(t->rows * t->cols) + CHUNK - 1) / CHUNK;
    }
    opt_job j = {.g = g->g, .tm = tm, .a = a, .o = o, .n_chunks = n_chunks,
                 /* clipping scales the whole gradient, keeping its direction */
                 .clip = o->clip > 0 && gn > o->clip ? (float)(o->clip / gn) : 1.0f,
                 .step_size = (float)(o->lr / bc1), .inv_bc2 = (float)(1.0 / bc2)};
    j.tix = li_xmalloc(LI_MAX(n_chunks, (size_t)1) * sizeof *j.tix);
    j.c0 = li_xmalloc(LI_MAX(n_chunks, (size_t)1) * sizeof *j.c0);
    j.c1 = li_xmalloc(LI_MAX(n_chunks, (size_t)1) * sizeof *j.c1);
    size_t c = 0;
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->goff < 0 || t->grad_only || (i == LI_TT_OUTPUT && L->tied)) continue;
        const size_t n = (size_t)(t->rows * t->cols);
        for (size_t e = 0; e < n; e += CHUNK, c++) {
            j.tix[c] = i;
            j.c0[c] = e;
            j.c1[c] = LI_MIN(n, e + CHUNK);
        }
    }
    launch(o->tp, update_run, &j);
    free(j.tix);
    free(j.c0);
    free(j.c1);
    return 0;
}
