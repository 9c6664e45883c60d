/* train.c — the training model: its layout (which tensors, where, which
 * train), float32 master copies from a loaded model, gradients, the
 * workspace, and the checked entry to the forward + backward pass of
 * train_tmpl.h (docs/training.md). */
#include "train/train_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== trainable subsets ==================================================== */

int li_train_select_parse(const char *s, li_train_select *sel, li_error *err) {
    memset(sel, 0, sizeof *sel);
    if (!s || !strcmp(s, "all")) {
        sel->what = LI_TRAIN_ALL;
        return 0;
    }
    if (!strcmp(s, "norms")) {
        sel->what = LI_TRAIN_NORMS;
        return 0;
    }
    char tail;
    int a, b;
    if (!strncmp(s, "layers:", 7)) {
        sel->what = LI_TRAIN_LAYERS;
        if (sscanf(s + 7, "%d-%d%c", &a, &b, &tail) == 2) {
        } else if (sscanf(s + 7, "%d%c", &a, &tail) == 1) {
            b = a;
        } else {
            return li_error_set(err, LI_EINVAL, "train: '%s': expected layers:A-B (block numbers, A <= B)", s);
        }
        if (a < 0 || b < a) return li_error_set(err, LI_EINVAL, "train: '%s': expected layers:A-B with 0 <= A <= B", s);
        sel->layer_lo = a;
        sel->layer_hi = b;
        return 0;
    }
    if (!strcmp(s, "scales") || !strcmp(s, "scales+norms")) {
        sel->what = LI_TRAIN_SCALES;
        sel->with_norms = s[6] == '+';
        return 0;
    }
    if (!strncmp(s, "lora:", 5)) {
        sel->what = LI_TRAIN_LORA;
        if (sscanf(s + 5, "%d%c", &a, &tail) != 1 || a < 1 || a > 1024)
            return li_error_set(err, LI_EINVAL, "train: '%s': expected lora:R with a rank R in 1..1024", s);
        sel->lora_rank = a;
        return 0;
    }
    return li_error_set(err, LI_EINVAL, "train: unknown parameter set '%s' (all, norms, layers:A-B, lora:R, scales, "
                                        "scales+norms)", s);
}

/* ==== layout =============================================================== */

static const char *const layer_names[LI_TL_N] = {
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
};
/* the linear weights that get an adapter, in the order of the workspace's xa slots */
static const int lora_kinds[7] = {LI_TL_WQ, LI_TL_WK, LI_TL_WV, LI_TL_WO, LI_TL_GATE, LI_TL_UP, LI_TL_DOWN};

static bool is_norm(int layer, int kind) {
    return layer < 0 ? kind == LI_TT_OUTPUT_NORM : (kind == LI_TL_ATTN_NORM || kind == LI_TL_FFN_NORM);
}

static bool trains(const li_train_select *sel, int layer, int kind) {
    switch (sel->what) {
    case LI_TRAIN_ALL: return true;
    case LI_TRAIN_NORMS: return is_norm(layer, kind);
    case LI_TRAIN_LAYERS: return layer >= sel->layer_lo && layer <= sel->layer_hi;
    case LI_TRAIN_LORA: return false;
    case LI_TRAIN_SCALES: return sel->with_norms && is_norm(layer, kind); /* the matrices: li_train_scales_layout */
    }
    return false;
}

int li_train_layout_init(li_train_layout *L, const li_hparams *hp, bool tied, const li_train_select *sel,
                         li_error *err) {
    memset(L, 0, sizeof *L);
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0 ||
        hp->n_ff <= 0 || hp->n_vocab <= 0 || hp->n_head % hp->n_head_kv || hp->n_rot < 0 || hp->n_rot % 2 ||
        hp->n_rot > hp->head_dim)
        return li_error_set(err, LI_EINVAL, "train: unsupported hyper-parameters (heads %d/%d, head_dim %d, n_rot %d)",
                            hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot);
    if (sel->what == LI_TRAIN_LAYERS && sel->layer_hi >= hp->n_layer)
        return li_error_set(err, LI_EINVAL, "train: layers:%d-%d: the model has blocks 0..%d", sel->layer_lo,
                            sel->layer_hi, hp->n_layer - 1);
    L->hp = *hp;
    L->tied = tied;
    L->sel = *sel;
    const int nl = hp->n_layer;
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool lora = sel->what == LI_TRAIN_LORA;
    L->n_lora = lora ? 7 * nl : 0;
    L->lora_rank = lora ? sel->lora_rank : 0;
    L->lora_scale = lora ? (sel->lora_alpha > 0 ? sel->lora_alpha : (float)sel->lora_rank) / (float)sel->lora_rank : 0;
    L->n_tensors = LI_TT_N_GLOBAL + LI_TL_N * nl + 2 * L->n_lora;
    L->t = li_xcalloc((size_t)L->n_tensors, sizeof *L->t);
    size_t off = 0;
    int64_t goff = 0;
    int stop = nl;
#define ADD(idx, nm, r_, c_, lyr, knd, train)                                  \
    do {                                                                       \
        li_train_tensor *t_ = &L->t[idx];                                      \
        snprintf(t_->name, sizeof t_->name, "%s", nm);                         \
        t_->rows = (r_);                                                       \
        t_->cols = (c_);                                                       \
        t_->layer = (lyr);                                                     \
        t_->kind = (knd);                                                      \
        t_->lora_a = t_->lora_b = t_->qscale = -1;                             \
        t_->off = off;                                                         \
        off += (size_t)(t_->rows * t_->cols);                                  \
        t_->goff = -1;                                                         \
        if (train) {                                                           \
            t_->goff = goff;                                                   \
            goff += t_->rows * t_->cols;                                       \
            if ((lyr) >= 0 && (lyr) < stop) stop = (lyr);                      \
        }                                                                      \
    } while (0)
    char nm[64];
    ADD(LI_TT_TOK_EMBD, "token_embd.weight", hp->n_vocab, d, -1, LI_TT_TOK_EMBD, trains(sel, -1, LI_TT_TOK_EMBD));
    ADD(LI_TT_OUTPUT_NORM, "output_norm.weight", 1, d, -1, LI_TT_OUTPUT_NORM, trains(sel, -1, LI_TT_OUTPUT_NORM));
    if (tied) {
        li_train_tensor *t = &L->t[LI_TT_OUTPUT];
        *t = L->t[LI_TT_TOK_EMBD]; /* the same parameters and gradient slots */
        snprintf(t->name, sizeof t->name, "output.weight");
        t->kind = LI_TT_OUTPUT;
    } else {
        ADD(LI_TT_OUTPUT, "output.weight", hp->n_vocab, d, -1, LI_TT_OUTPUT, trains(sel, -1, LI_TT_OUTPUT));
    }
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < LI_TL_N; k++) {
            const int64_t ff = li_hp_n_ff(hp, l);
            const int64_t rows = k == LI_TL_ATTN_NORM || k == LI_TL_FFN_NORM ? 1
                                 : k == LI_TL_WQ                           ? qd
                                 : k == LI_TL_WK || k == LI_TL_WV          ? kvd
                                 : k == LI_TL_WO || k == LI_TL_DOWN        ? d
                                                                           : ff;
            const int64_t cols = k == LI_TL_WO ? qd : k == LI_TL_DOWN ? ff : d;
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, layer_names[k]);
            ADD(li_train_tensor_index(l, k), nm, rows, cols, l, k, trains(sel, l, k));
        }
    int idx = LI_TT_N_GLOBAL + LI_TL_N * nl;
    for (int l = 0; l < L->n_lora / 7; l++)
        for (int j = 0; j < 7; j++) {
            li_train_tensor *w = &L->t[li_train_tensor_index(l, lora_kinds[j])];
            const int64_t rows = w->rows, cols = w->cols;
            w->lora_a = idx;
            snprintf(nm, sizeof nm, "blk.%d.%s.lora_a", l, layer_names[lora_kinds[j]]);
            ADD(idx, nm, L->lora_rank, cols, l, lora_kinds[j], true);
            idx++;
            L->t[li_train_tensor_index(l, lora_kinds[j])].lora_b = idx;
            snprintf(nm, sizeof nm, "blk.%d.%s.lora_b", l, layer_names[lora_kinds[j]]);
            ADD(idx, nm, rows, L->lora_rank, l, lora_kinds[j], true);
            idx++;
        }
#undef ADD
    if (L->t[LI_TT_TOK_EMBD].goff >= 0) stop = 0;
    L->bwd_stop = stop;
    L->n_params = off;
    L->n_grads = (size_t)goff;
    return 0;
}

void li_train_layout_free(li_train_layout *L) {
    free(L->t);
    free(L->down_had);
    free(L->act);
    memset(L, 0, sizeof *L);
}

/* ==== model ================================================================ */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* uniform in [-1, 1) */
static float rng_uniform(uint64_t *s) { return (float)(rng_next(s) >> 40) / 8388608.0f - 1.0f; }

/* adapters: A ~ U(-1, 1)/sqrt(cols) (seeded), B = 0, so W + scale·B·A = W at step 0 */
static void init_adapters(li_train_model *tm, uint64_t *rs) {
    for (int i = LI_TT_N_GLOBAL + LI_TL_N * tm->L.hp.n_layer; i < tm->L.n_tensors; i++) {
        const li_train_tensor *t = &tm->L.t[i];
        float *p = tm->params + t->off;
        const bool is_a = strstr(t->name, ".lora_a") != NULL;
        const float a = 1.0f / sqrtf((float)t->cols);
        for (int64_t j = 0; j < t->rows * t->cols; j++) p[j] = is_a ? a * rng_uniform(rs) : 0.0f;
    }
}

static int alloc_params(li_train_model *tm, li_error *err) {
    size_t bytes;
    if (li_mul_overflow(tm->L.n_params, sizeof(float), &bytes) || !(tm->params = li_aligned_alloc(bytes)))
        return li_error_set(err, LI_ENOMEM, "train: cannot allocate %zu float32 parameters", tm->L.n_params);
    return 0;
}

int li_train_model_init_random(li_train_model *tm, const li_hparams *hp, bool tied, const li_train_select *sel,
                               uint64_t seed, li_error *err) {
    memset(tm, 0, sizeof *tm);
    int rc;
    if (sel->what == LI_TRAIN_SCALES)
        return li_error_set(err, LI_EINVAL, "train: a random model has no quantization scales to train");
    if ((rc = li_train_layout_init(&tm->L, hp, tied, sel, err))) return rc;
    if ((rc = alloc_params(tm, err))) {
        li_train_layout_free(&tm->L);
        return rc;
    }
    uint64_t rs = seed ? seed : 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < LI_TT_N_GLOBAL + LI_TL_N * hp->n_layer; i++) {
        const li_train_tensor *t = &tm->L.t[i];
        if (i == LI_TT_OUTPUT && tied) continue;
        float *p = tm->params + t->off;
        const bool norm = t->rows == 1;
        const float a = 1.0f / sqrtf((float)t->cols);
        for (int64_t j = 0; j < t->rows * t->cols; j++)
            p[j] = norm ? 1.0f + 0.1f * rng_uniform(&rs) : a * rng_uniform(&rs);
    }
    init_adapters(tm, &rs);
    return 0;
}

static void copy_weight(float *dst, const li_weight *w) {
    for (int64_t r = 0; r < w->m; r++) li_weight_dequant_row_ref(w, r, dst + r * w->k);
}

int li_train_model_init(li_train_model *tm, const li_model *m, const li_train_select *sel, uint64_t seed,
                        li_error *err) {
    memset(tm, 0, sizeof *tm);
    const bool tied = m->output.data == m->tok_embd.data;
    int rc;
    if ((rc = li_train_layout_init(&tm->L, &m->hp, tied, sel, err))) return rc;
    li_train_layout *L = &tm->L;
    tm->src = li_xcalloc((size_t)L->n_tensors, sizeof *tm->src);
    tm->src[LI_TT_TOK_EMBD] = &m->tok_embd;
    if (!tied) tm->src[LI_TT_OUTPUT] = &m->output;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const li_layer *ly = &m->layers[l];
        const li_weight *w[LI_TL_N] = {NULL, &ly->wq, &ly->wk, &ly->wv, &ly->wo, NULL, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int k = 0; k < LI_TL_N; k++) tm->src[li_train_tensor_index(l, k)] = w[k];
    }
    if (sel->what == LI_TRAIN_SCALES) {
        const int n0 = L->n_tensors;
        if ((rc = li_train_scales_layout(L, tm->src, err))) {
            li_train_model_free(tm);
            return rc;
        }
        tm->src = li_xrealloc(tm->src, (size_t)L->n_tensors * sizeof *tm->src);
        for (int i = n0; i < L->n_tensors; i++) tm->src[i] = NULL;
    }
    if ((rc = alloc_params(tm, err))) {
        li_train_model_free(tm);
        return rc;
    }
    /* a rotated model trains with its online Hadamard (train_tmpl.h) */
    if (m->rot_block) {
        const int64_t ff = m->hp.n_ff;
        L->rot_block = m->rot_block;
        L->down_had = li_xmalloc((size_t)(m->hp.n_layer * ff) * sizeof(float));
        for (int l = 0; l < m->hp.n_layer; l++)
            memcpy(L->down_had + l * ff, m->layers[l].down_had, (size_t)li_hp_n_ff(&m->hp, l) * sizeof(float));
    }
    float *P = tm->params;
    const size_t d = (size_t)m->hp.n_embd;
    copy_weight(P + L->t[LI_TT_TOK_EMBD].off, &m->tok_embd);
    memcpy(P + L->t[LI_TT_OUTPUT_NORM].off, m->output_norm, d * sizeof(float));
    if (!tied) copy_weight(P + L->t[LI_TT_OUTPUT].off, &m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const li_layer *ly = &m->layers[l];
        for (int k = 0; k < LI_TL_N; k++) {
            const int i = li_train_tensor_index(l, k);
            float *dst = P + L->t[i].off;
            if (k == LI_TL_ATTN_NORM) memcpy(dst, ly->attn_norm, d * sizeof(float));
            else if (k == LI_TL_FFN_NORM) memcpy(dst, ly->ffn_norm, d * sizeof(float));
            else copy_weight(dst, tm->src[i]);
        }
    }
    if (sel->what == LI_TRAIN_SCALES) li_train_scales_init(tm, NULL);
    /* a scheme's activation rounding, where the engine does it */
    for (int i = 0; i < L->n_tensors; i++) {
        if (!tm->src[i] || tm->src[i]->act == LI_ACT_F32) continue;
        if (!L->act) L->act = li_xcalloc((size_t)L->n_tensors, 1);
        L->act[i] = (uint8_t)tm->src[i]->act;
    }
    uint64_t rs = seed ? seed : 0x9e3779b97f4a7c15ull;
    init_adapters(tm, &rs);
    return 0;
}

void li_train_model_free(li_train_model *tm) {
    li_aligned_free(tm->params);
    li_aligned_free(tm->master);
    free(tm->qat_type);
    for (int i = 0; tm->qw && i < tm->L.n_tensors; i++) free((void *)tm->qw[i].scales);
    free(tm->qw);
    free(tm->src);
    li_train_layout_free(&tm->L);
    memset(tm, 0, sizeof *tm);
}

/* ==== gradients, workspace ================================================= */

int li_train_grads_init(li_train_grads *g, const li_train_layout *L) {
    g->n = LI_MAX(L->n_grads, L->n_grads_all);
    g->g = li_aligned_alloc(LI_MAX(g->n, (size_t)1) * sizeof(float));
    if (!g->g) return LI_ENOMEM;
    li_train_grads_zero(g);
    return 0;
}

void li_train_grads_zero(li_train_grads *g) { memset(g->g, 0, g->n * sizeof(float)); }

void li_train_grads_free(li_train_grads *g) {
    li_aligned_free(g->g);
    memset(g, 0, sizeof *g);
}

int li_train_ws_init(li_train_ws *ws, const li_train_layout *L, int B, int T, li_error *err) {
    memset(ws, 0, sizeof *ws);
    if (B < 1 || T < 1 || (int64_t)B * T > (1 << 20))
        return li_error_set(err, LI_EINVAL, "train: batch %d x %d out of range", B, T);
    ws->B = B;
    ws->T = T;
    ws->n = li_train_ws_reals_f32(L, B, T);
    if (!(ws->buf = li_aligned_alloc(ws->n * sizeof(float))))
        return li_error_set(err, LI_ENOMEM, "train: cannot allocate %.1f MB of activations",
                            (double)ws->n * 4 / 1e6);
    memset(ws->buf, 0, ws->n * sizeof(float)); /* padding between carved arrays stays defined */
    return 0;
}

void li_train_ws_free(li_train_ws *ws) {
    li_aligned_free(ws->buf);
    memset(ws, 0, sizeof *ws);
}

/* ==== forward + backward =================================================== */

int li_train_forward_backward(const li_train_model *tm, li_train_grads *g, const li_train_batch *b,
                              const li_train_loss_opts *o, li_train_ws *ws, struct li_threadpool *tp,
                              double *loss, double *kl, li_error *err) {
    const li_train_layout *L = &tm->L;
    if (b->B != ws->B || b->T != ws->T)
        return li_error_set(err, LI_EINVAL, "train: batch %d x %d but the workspace is %d x %d", b->B, b->T, ws->B,
                            ws->T);
    const int64_t N = (int64_t)b->B * b->T, V = L->hp.n_vocab;
    for (int64_t i = 0; i < N; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= V)
            return li_error_set(err, LI_EINVAL, "train: token %d at %lld outside the vocabulary (%lld)",
                                b->tokens[i], (long long)i, (long long)V);
        if (b->labels[i] < -1 || b->labels[i] >= V)
            return li_error_set(err, LI_EINVAL, "train: label %d at %lld outside the vocabulary (%lld)",
                                b->labels[i], (long long)i, (long long)V);
    }
    const float temp = o && o->temperature > 0 ? o->temperature : 1.0f;
    const float alpha = o ? o->alpha : 0.0f;
    if (alpha < 0 || alpha > 1) return li_error_set(err, LI_EINVAL, "train: alpha %g outside [0, 1]", alpha);
    const float gs = o && o->grad_scale > 0 ? o->grad_scale : 1.0f;
    float *logits = NULL;
    double kl_v = 0;
    const double l = li_train_fb_f32(L, tm->params, g ? g->g : NULL, b->tokens, b->labels, b->teacher, b->B, b->T,
                                     alpha, temp, gs, ws->buf, tp, &kl_v, &logits);
    ws->logits = logits;
    if (loss) *loss = l;
    if (kl) *kl = kl_v;
    return 0;
}
