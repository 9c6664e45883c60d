/* medusa.c — Medusa-1 heads as a training model (medusa.h): zero heads,
 * the workspace, the checked entry to medusa_tmpl.h's passes, the loss's
 * rows on the thread pool, and the heads file (docs/medusa.md). */
#include "train/medusa.h"
#include "train/train_internal.h"
#include "model/gguf_write.h"
#include "engine/session.h"
#include "cpu/threadpool.h"
#include "types.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== heads, workspace ====================================================== */

int li_train_medusa_init(li_train_medusa *h, int K, int64_t d, int64_t V, li_error *err) {
    memset(h, 0, sizeof *h);
    if (K < 1 || K > LI_TRAIN_MEDUSA_MAX_HEADS)
        return li_error_set(err, LI_EINVAL, "medusa: %d heads, expected 1..%d", K, LI_TRAIN_MEDUSA_MAX_HEADS);
    if (d < 1 || d > 65536 || V < 1 || V > (1 << 24))
        return li_error_set(err, LI_EINVAL, "medusa: n_embd %lld, n_vocab %lld out of range", (long long)d,
                            (long long)V);
    h->K = K;
    h->d = d;
    h->V = V;
    li_train_layout *L = &h->tm.L;
    L->n_tensors = 2 * K;
    L->t = li_xcalloc((size_t)L->n_tensors, sizeof *L->t);
    size_t off = 0;
    for (int k = 0; k < K; k++)
        for (int j = 0; j < 2; j++) {
            li_train_tensor *t = &L->t[2 * k + j];
            snprintf(t->name, sizeof t->name, "medusa.%d.%s", k, j ? "bias" : "weight");
            t->rows = j ? 1 : d;
            t->cols = d;
            t->off = off;
            t->goff = (int64_t)off; /* everything trains: the gradients mirror the parameters */
            t->lora_a = t->lora_b = -1;
            t->layer = k;
            t->kind = j;
            off += (size_t)(t->rows * t->cols);
        }
    L->n_params = L->n_grads = off;
    L->tied = false;
    if (!(h->tm.params = li_aligned_alloc(off * sizeof(float)))) {
        li_train_medusa_free(h);
        return li_error_set(err, LI_ENOMEM, "medusa: cannot allocate %zu parameters", off);
    }
    memset(h->tm.params, 0, off * sizeof(float));
    return 0;
}

void li_train_medusa_free(li_train_medusa *h) {
    li_train_model_free(&h->tm);
    memset(h, 0, sizeof *h);
}

size_t li_train_medusa_ws_reals(int64_t d, int64_t V, int64_t N) {
    const size_t nd = ((size_t)(N * d) + 15) & ~(size_t)15, nv = ((size_t)(N * V) + 15) & ~(size_t)15;
    return 3 * nd + 2 * nv;
}

int li_train_medusa_ws_init(li_train_medusa_ws *ws, const li_train_medusa *h, int N, li_error *err) {
    memset(ws, 0, sizeof *ws);
    if (N < 1 || (int64_t)N * h->V > ((int64_t)1 << 31))
        return li_error_set(err, LI_EINVAL, "medusa: a window of %d positions is out of range", N);
    const size_t n = li_train_medusa_ws_reals(h->d, h->V, N), nd = ((size_t)(N * h->d) + 15) & ~(size_t)15;
    if (!(ws->buf = li_aligned_alloc(n * sizeof(float))))
        return li_error_set(err, LI_ENOMEM, "medusa: cannot allocate %.1f MB of scratch", (double)n * 4 / 1e6);
    memset(ws->buf, 0, n * sizeof(float));
    ws->N = N;
    ws->A = ws->buf;
    ws->Z = ws->buf + nd;
    ws->dZ = ws->buf + 2 * nd;
    ws->logits = ws->buf + 3 * nd;
    ws->dlogits = ws->logits + (((size_t)N * (size_t)h->V + 15) & ~(size_t)15);
    ws->lab = li_xmalloc((size_t)N * sizeof *ws->lab);
    return 0;
}

void li_train_medusa_ws_free(li_train_medusa_ws *ws) {
    li_aligned_free(ws->buf);
    free(ws->lab);
    memset(ws, 0, sizeof *ws);
}

/* ==== the loss's rows on the pool =========================================== */

#define LOSS_ROWS 2 /* rows per job: a job is ~2 · 5 · V exps */

typedef struct loss_job {
    const float *logits, *teacher;
    const int32_t *lab;
    float *dlogits;
    int64_t N, V, cnt;
    float alpha, temp, gscale;
    double *part_loss, *part_kl; /* per job, weighted by its rows' count */
    int64_t n_jobs;
    atomic_long next;
} loss_job;

static void loss_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    loss_job *j = ctx;
    for (;;) {
        const long c = atomic_fetch_add(&j->next, 1);
        if (c >= j->n_jobs) break;
        const int64_t r0 = c * LOSS_ROWS, r1 = LI_MIN(j->N, r0 + LOSS_ROWS);
        int64_t cj = 0;
        for (int64_t r = r0; r < r1; r++) cj += j->lab[r] >= 0;
        /* li_trop_loss scales by 1/(its own count): give it gscale·cj/cnt so
         * every row gets gscale/cnt, the whole window's mean */
        const float gs = j->cnt ? j->gscale * (float)cj / (float)j->cnt : 0;
        double kl = 0;
        const double l = li_trop_loss_f32(j->logits + r0 * j->V, j->lab + r0, j->teacher ? j->teacher + r0 * j->V : NULL,
                                          j->dlogits + r0 * j->V, r1 - r0, j->V, j->alpha, j->temp, gs, &kl);
        j->part_loss[c] = l * (double)cj;
        j->part_kl[c] = kl * (double)cj;
    }
}

/* li_trop_loss_f32 over N rows, split into jobs whose results add up in a
 * fixed order (the same bits on any number of threads). */
double li_train_medusa_loss_par(struct li_threadpool *tp, const float *logits, const int32_t *lab, const float *teacher,
                          float *dlogits, int64_t N, int64_t V, float alpha, float temp, float gscale, double *kl);
double li_train_medusa_loss_par(struct li_threadpool *tp, const float *logits, const int32_t *lab, const float *teacher,
                          float *dlogits, int64_t N, int64_t V, float alpha, float temp, float gscale, double *kl) {
    loss_job j = {.logits = logits, .teacher = teacher, .lab = lab, .dlogits = dlogits, .N = N, .V = V,
                  .alpha = alpha, .temp = temp, .gscale = gscale, .n_jobs = (N + LOSS_ROWS - 1) / LOSS_ROWS};
    for (int64_t i = 0; i < N; i++) j.cnt += lab[i] >= 0;
    j.part_loss = li_xcalloc((size_t)LI_MAX(j.n_jobs, 1), sizeof(double));
    j.part_kl = li_xcalloc((size_t)LI_MAX(j.n_jobs, 1), sizeof(double));
    atomic_store(&j.next, 0);
    if (tp && j.n_jobs > 1)
        li_threadpool_run_sized(tp, loss_run, &j, (int)LI_MIN((int64_t)li_threadpool_size(tp), j.n_jobs), N * V);
    else loss_run(&j, 0, 1);
    double l = 0, k = 0;
    for (int64_t c = 0; c < j.n_jobs; c++) {
        l += j.part_loss[c];
        k += j.part_kl[c];
    }
    free(j.part_loss);
    free(j.part_kl);
    if (kl) *kl = j.cnt ? k / (double)j.cnt : 0;
    return j.cnt ? l / (double)j.cnt : 0;
}

/* ==== forward + backward ==================================================== */

int li_train_medusa_forward_backward(const li_train_medusa *h, li_train_grads *g, const float *E, const float *H,
                               const float *base, const int32_t *tok, int N, const li_train_loss_opts *o,
                               li_train_medusa_ws *ws, struct li_threadpool *tp, double *loss, double *loss_k,
                               double *kl_k, li_error *err) {
    if (N < 1 || N > ws->N) return li_error_set(err, LI_EINVAL, "medusa: a window of %d positions (scratch for %d)", N, ws->N);
    if (g && g->n != h->tm.L.n_grads) return li_error_set(err, LI_EINVAL, "medusa: gradients of another shape");
    for (int i = 0; i < N; i++)
        if (tok[i] < 0 || tok[i] >= h->V)
            return li_error_set(err, LI_EINVAL, "medusa: token %d at position %d is outside the vocabulary (%lld)",
                                tok[i], i, (long long)h->V);
    const float alpha = o ? o->alpha : 0, temp = o && o->temperature > 0 ? o->temperature : 1,
                gs = o && o->grad_scale != 0 ? o->grad_scale : 1;
    double lk[LI_TRAIN_MEDUSA_MAX_HEADS], kk[LI_TRAIN_MEDUSA_MAX_HEADS];
    const double l = li_train_medusa_fb_f32(h->tm.params, g ? g->g : NULL, h->K, E, H, base, tok, N, h->d, h->V, alpha,
                                      temp, gs, ws->buf, ws->lab, tp, lk, kk);
    if (loss) *loss = l;
    for (int k = 0; k < h->K; k++) {
        if (loss_k) loss_k[k] = lk[k];
        if (kl_k) kl_k[k] = kk[k];
    }
    return 0;
}

void li_train_medusa_head_logits(const li_train_medusa *h, int k, const float *E, const float *H, int N, li_train_medusa_ws *ws,
                           struct li_threadpool *tp) {
    li_train_medusa_head_fwd_f32(H, li_train_medusa_w(h, k), li_train_medusa_b(h, k), E, ws->A, ws->Z, ws->logits, N, h->d, h->V, tp);
}

/* ==== the heads file ========================================================= */

int li_train_medusa_save(const li_train_medusa *h, const li_train_medusa_meta *meta, li_ckpt_dtype dtype, const char *path,
                   li_error *err) {
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    char hash[17];
    snprintf(hash, sizeof hash, "%016" PRIx64, meta->vocab_hash);
    int rc = li_gguf_writer_add_str(&w, "general.architecture", "medusa", err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.version", 1, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_heads", (uint32_t)h->K, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_embd", (uint32_t)h->d, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_vocab", (uint32_t)h->V, err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.base.name", meta->base_name ? meta->base_name : "", err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.base.vocab_hash", hash, err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.hidden", "post_norm", err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.train.steps", (uint32_t)LI_MIN(meta->steps, UINT32_MAX), err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.train.tokens", (uint32_t)LI_MIN(meta->tokens, UINT32_MAX), err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "medusa.train.alpha", meta->alpha, err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "medusa.train.temperature", meta->temperature, err);
    if (!rc && meta->data) rc = li_gguf_writer_add_str(&w, "medusa.train.data", meta->data, err);
    const size_t dd = (size_t)(h->d * h->d);
    for (int k = 0; k < h->K && !rc; k++) {
        char name[64];
        snprintf(name, sizeof name, "medusa.%d.weight", k);
        const int64_t ne[2] = {h->d, h->d};
        const float *W = li_train_medusa_w(h, k);
        if (dtype == LI_CKPT_F16) {
            uint16_t *hw = li_xmalloc(dd * sizeof *hw);
            for (size_t j = 0; j < dd; j++) hw[j] = li_fp32_to_fp16(W[j]);
            rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F16, 2, ne, hw, dd * sizeof *hw, err);
        } else {
            float *fw = li_xmalloc(dd * sizeof *fw);
            memcpy(fw, W, dd * sizeof *fw);
            rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F32, 2, ne, fw, dd * sizeof *fw, err);
        }
        if (rc) break;
        snprintf(name, sizeof name, "medusa.%d.bias", k);
        float *fb = li_xmalloc((size_t)h->d * sizeof *fb);
        memcpy(fb, li_train_medusa_b(h, k), (size_t)h->d * sizeof *fb);
        rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F32, 1, ne, fb, (size_t)h->d * sizeof *fb, err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, err);
    li_gguf_writer_free(&w);
    return rc;
}

int li_train_medusa_load(li_train_medusa *h, const char *path, int64_t d, int64_t V, uint64_t vocab_hash, li_error *err) {
    memset(h, 0, sizeof *h);
    li_gguf g;
    int rc = li_gguf_open(&g, path, err);
    if (rc) return rc;
    const li_medusa_base base = {.n_embd = d, .n_vocab = V, .vocab_hash = vocab_hash};
    li_medusa_file f;
    if ((rc = li_medusa_file_check(&g, path, &base, &f, err))) goto done;
    if ((rc = li_train_medusa_init(h, f.n_heads, d, V, err))) goto done;
    for (int k = 0; k < f.n_heads; k++)
        for (int j = 0; j < 2; j++) {
            const li_gguf_tensor *t = j ? f.b[k] : f.w[k];
            float *dst = h->tm.params + h->tm.L.t[2 * k + j].off;
            const size_t n = (size_t)(j ? d : d * d);
            if (t->type == LI_TYPE_F32) memcpy(dst, t->data, n * sizeof(float));
            else
                for (size_t i = 0; i < n; i++) dst[i] = li_fp16_to_fp32(((const uint16_t *)t->data)[i]);
        }
done:
    li_gguf_free(&g);
    return rc;
}

/* ==== the base, frozen ======================================================= */

int li_train_medusa_base_window(li_session *s, const int32_t *tok, int64_t n, float *logits, float *hidden, li_error *err) {
    li_batch b;
    int rc = li_session_window(s, tok, n, "medusa", &b, err);
    if (rc) return rc;
    b.hidden = LI_HIDDEN_POST_NORM;
    rc = li_forward_run(&s->fw, s->model, s->be, &s->kv, &b, logits, err);
    if (rc) return rc;
    const float *h = li_forward_hidden(&s->fw, s->model);
    if (!h) return li_error_set(err, LI_EINVAL, "medusa: the engine returned no hidden states");
    memcpy(hidden, h, (size_t)n * (size_t)s->model->hp.n_embd * sizeof(float));
    s->n_past = n;
    return 0;
}

float *li_train_medusa_output_f32(const li_model *m) {
    const int64_t V = m->hp.n_vocab, d = m->hp.n_embd;
    float *E = li_aligned_alloc((size_t)V * (size_t)d * sizeof(float));
    if (!E) return NULL;
    for (int64_t r = 0; r < V; r++) li_weight_dequant_row_ref(&m->output, r, E + r * d);
    return E;
}
