/* forward.c — the Llama-family transformer, written as the math:
 *   x = embed(tokens)
 *   per layer:  x += Wo · attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))
 *               x += Wdown · (silu(Wgate·n(x)) * Wup·n(x))
 *   logits = Wout · n(x)   (only for the rows asked for)
 * Every op goes through the backend vtable. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int li_forward_init(li_forward *f, const li_model *m, int64_t cap, li_error *err) {
    memset(f, 0, sizeof *f);
    if (cap <= 0) return li_error_set(err, LI_EINVAL, "forward: batch capacity must be positive");
    const li_hparams *hp = &m->hp;
    const size_t c = (size_t)cap;
    f->cap = cap;
    f->x = li_aligned_alloc(c * hp->n_embd * sizeof(float));
    f->h = li_aligned_alloc(c * hp->n_embd * sizeof(float));
    f->q = li_aligned_alloc(c * hp->n_head * hp->head_dim * sizeof(float));
    f->k = li_aligned_alloc(c * hp->n_head_kv * hp->head_dim * sizeof(float));
    f->v = li_aligned_alloc(c * hp->n_head_kv * hp->head_dim * sizeof(float));
    f->att = li_aligned_alloc(c * hp->n_head * hp->head_dim * sizeof(float));
    f->g = li_aligned_alloc(c * hp->n_ff * sizeof(float));
    f->u = li_aligned_alloc(c * hp->n_ff * sizeof(float));
    f->sel = li_aligned_alloc(c * hp->n_embd * sizeof(float));
    return 0;
}

void li_forward_free(li_forward *f) {
    float *bufs[] = {f->x, f->h, f->q, f->k, f->v, f->att, f->g, f->u, f->sel};
    for (size_t i = 0; i < LI_ARRAY_LEN(bufs); i++) li_aligned_free(bufs[i]);
    memset(f, 0, sizeof *f);
}

/* Weights that read the same input in one call when the backend can. */
static void matmul_shared(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                          int64_t n) {
    if (be->ops->matmul_multi) {
        be->ops->matmul_multi(be, w, n_w, x, y, n);
        return;
    }
    for (int i = 0; i < n_w; i++) be->ops->matmul(be, w[i], x, y[i], n);
}

/* y = x · W^T and the residual stream res += y, fused when the backend can. */
static void matmul_residual(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (be->ops->matmul_add) {
        be->ops->matmul_add(be, w, x, y, res, n);
        return;
    }
    be->ops->matmul(be, w, x, y, n);
    be->ops->add(be, res, y, n * w->m);
}

int li_forward_run(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *b,
                   float *logits, li_error *err) {
    const li_hparams *hp = &m->hp;
    const li_backend_ops *op = be->ops;
    const int64_t n = b->n;
    if (n <= 0 || n > f->cap)
        return li_error_set(err, LI_EINVAL, "forward: batch of %lld tokens (capacity %lld)", (long long)n,
                            (long long)f->cap);
    for (int64_t i = 0; i < n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab)
            return li_error_set(err, LI_EINVAL, "forward: token id %d out of range [0, %d)", b->tokens[i],
                                hp->n_vocab);
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim;

    op->get_rows(be, &m->tok_embd, b->tokens, n, f->x);

    li_attn_args aa = {
        .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .block_size = kv->block_size, .q = f->q, .out = f->att, .pos = b->pos, .seq = b->seq,
        .block_tables = b->block_tables, .scale = 1.0f / sqrtf((float)hp->head_dim),
    };
    for (int l = 0; l < hp->n_layer; l++) {
        const li_layer *L = &m->layers[l];
        /* attention block */
        op->rmsnorm(be, f->x, L->attn_norm, f->h, n, d, hp->norm_eps);
        matmul_shared(be, (const li_weight *const[]){&L->wq, &L->wk, &L->wv}, 3, f->h,
                      (float *const[]){f->q, f->k, f->v}, n);
        op->rope(be, f->q, b->pos, n, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_theta, hp->rope_neox);
        op->rope(be, f->k, b->pos, n, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta, hp->rope_neox);
        op->kv_store(be, &kv->layers[l], f->k, f->v, b->slot, n, hp->n_head_kv, hp->head_dim);
        aa.kv = &kv->layers[l];
        op->attention(be, &aa);
        matmul_residual(be, &L->wo, f->att, f->h, f->x, n);
        /* feed-forward block */
        op->rmsnorm(be, f->x, L->ffn_norm, f->h, n, d, hp->norm_eps);
        matmul_shared(be, (const li_weight *const[]){&L->w_gate, &L->w_up}, 2, f->h, (float *const[]){f->g, f->u},
                      n);
        op->silu_mul(be, f->g, f->u, n, hp->n_ff);
        matmul_residual(be, &L->w_down, f->g, f->h, f->x, n);
    }
    (void)q_dim;
    if (b->n_logits <= 0) return 0;
    /* gather only the rows that need logits: the vocab matmul is the largest */
    for (int64_t i = 0; i < b->n_logits; i++) {
        int32_t r = b->logit_rows[i];
        if (r < 0 || r >= n) return li_error_set(err, LI_EINVAL, "forward: logit row %d out of range", r);
        memcpy(f->sel + i * d, f->x + (int64_t)r * d, (size_t)d * sizeof(float));
    }
    op->rmsnorm(be, f->sel, m->output_norm, f->h, b->n_logits, d, hp->norm_eps);
    op->matmul(be, &m->output, f->h, logits, b->n_logits);
    return 0;
}
