/* eagle.c — an EAGLE draft block as a training model (eagle.h): its layout
 * and seeded start, the draft vocabulary, the workspace, the checked entry
 * to eagle_tmpl.h's passes, the base's side (one engine pass per window with
 * its captured feature blocks), and the draft file (docs/eagle.md). */
#include "train/eagle.h"
#include "train/train_internal.h"
#include "model/gguf_write.h"
#include "engine/session.h"
#include "types.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== the draft ============================================================ */

/* A tensor's (rows, cols) in the training layout (GGUF dims are [cols, rows]). */
static void tensor_shape(const li_hparams *hp, int F, li_eagle_tensor t, int64_t *rows, int64_t *cols) {
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    *rows = 1;
    *cols = d;
    switch (t) {
    case LI_EAGLE_FC: *rows = d, *cols = (int64_t)F * d; break;
    case LI_EAGLE_WQ: *rows = qd, *cols = 2 * d; break;
    case LI_EAGLE_WK:
    case LI_EAGLE_WV: *rows = kvd, *cols = 2 * d; break;
    case LI_EAGLE_WO: *rows = d, *cols = qd; break;
    case LI_EAGLE_GATE:
    case LI_EAGLE_UP: *rows = ff, *cols = d; break;
    case LI_EAGLE_DOWN: *rows = d, *cols = ff; break;
    default: break; /* the norms */
    }
}

static bool is_norm(li_eagle_tensor t) {
    return t == LI_EAGLE_ENORM || t == LI_EAGLE_HNORM || t == LI_EAGLE_FFN_NORM || t == LI_EAGLE_OUTPUT_NORM;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* N(0, 1) by Box–Muller from two uniforms in (0, 1] */
static double rng_normal(uint64_t *s) {
    const double u1 = ((double)(rng_next(s) >> 11) + 1) / 9007199254740992.0,
                 u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static int check_vocab(const li_hparams *hp, const int32_t *vocab, int32_t n_draft, li_error *err) {
    if (vocab && (n_draft < 1 || n_draft > hp->n_vocab))
        return li_error_set(err, LI_EINVAL, "eagle: a draft vocabulary of %d ids, the base has %d", n_draft,
                            hp->n_vocab);
    for (int32_t i = 0; vocab && i < n_draft; i++)
        if (vocab[i] < 0 || vocab[i] >= hp->n_vocab || (i && vocab[i] <= vocab[i - 1]))
            return li_error_set(err, LI_EINVAL, "eagle: draft vocabulary id %d: ids must be ascending in [0, %d)",
                                vocab[i], hp->n_vocab);
    return 0;
}

/* vocab checked; e->hp set */
static void set_vocab(li_train_eagle *e, const int32_t *vocab, int32_t n_draft) {
    free(e->vocab);
    free(e->vmap);
    e->vocab = NULL;
    e->n_draft = vocab ? n_draft : e->hp.n_vocab;
    e->vmap = li_xmalloc((size_t)e->hp.n_vocab * sizeof *e->vmap);
    for (int32_t i = 0; i < e->hp.n_vocab; i++) e->vmap[i] = vocab ? -1 : i;
    if (vocab) {
        e->vocab = li_xmalloc((size_t)n_draft * sizeof *e->vocab);
        memcpy(e->vocab, vocab, (size_t)n_draft * sizeof *vocab);
        for (int32_t i = 0; i < n_draft; i++) e->vmap[vocab[i]] = i;
    }
}

int li_train_eagle_set_vocab(li_train_eagle *e, const int32_t *vocab, int32_t n_draft, li_error *err) {
    int rc = check_vocab(&e->hp, vocab, n_draft, err);
    if (!rc) set_vocab(e, vocab, n_draft);
    return rc;
}

int li_train_eagle_init(li_train_eagle *e, const li_hparams *hp, int F, const int32_t *feat, const int32_t *vocab,
                        int32_t n_draft, const float *out_norm, uint64_t seed, li_error *err) {
    memset(e, 0, sizeof *e);
    if (hp->n_embd < 1 || hp->n_vocab < 1 || hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv ||
        hp->head_dim < 1 || hp->n_ff < 1 || hp->n_rot < 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        return li_error_set(err, LI_EINVAL, "eagle: unsupported block (heads %d/%d, head_dim %d, n_rot %d, n_ff %d)",
                            hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->n_ff);
    if (F < 1 || F > LI_EAGLE_MAX_FEATURES)
        return li_error_set(err, LI_EINVAL, "eagle: %d feature blocks, expected 1..%d", F, LI_EAGLE_MAX_FEATURES);
    for (int i = 0; i < F; i++)
        if (feat[i] < 0 || feat[i] >= hp->n_layer || (i && feat[i] <= feat[i - 1]))
            return li_error_set(err, LI_EINVAL, "eagle: feature block %d: blocks must be ascending in [0, %d)",
                                feat[i], hp->n_layer);
    int rc = check_vocab(hp, vocab, n_draft, err);
    if (rc) return rc;
    e->hp = *hp;
    e->hp.n_ff_layer = NULL; /* the draft block is hp->n_ff wide whatever the base's blocks are */
    e->F = F;
    memcpy(e->feat, feat, (size_t)F * sizeof *feat);
    set_vocab(e, vocab, n_draft);
    li_train_layout *L = &e->tm.L;
    L->hp = e->hp;
    L->n_tensors = LI_EAGLE_N_TENSORS;
    L->t = li_xcalloc(LI_EAGLE_N_TENSORS, sizeof *L->t);
    size_t off = 0;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        li_train_tensor *t = &L->t[i];
        snprintf(t->name, sizeof t->name, "%s", li_eagle_tensor_name((li_eagle_tensor)i));
        tensor_shape(hp, F, (li_eagle_tensor)i, &t->rows, &t->cols);
        t->off = off;
        t->goff = (int64_t)off; /* everything trains: the gradients mirror the parameters */
        t->lora_a = t->lora_b = -1;
        t->layer = -1;
        t->kind = i;
        off += ((size_t)(t->rows * t->cols) + 15) & ~(size_t)15; /* 64-byte aligned tensors */
    }
    L->n_params = L->n_grads = off;
    if (!(e->tm.params = li_aligned_alloc(off * sizeof(float)))) {
        li_train_eagle_free(e);
        return li_error_set(err, LI_ENOMEM, "eagle: cannot allocate %zu parameters", off);
    }
    memset(e->tm.params, 0, off * sizeof(float));
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        const li_train_tensor *t = &L->t[i];
        float *p = e->tm.params + t->off;
        const int64_t n = t->rows * t->cols;
        if (i == LI_EAGLE_OUTPUT_NORM && out_norm) memcpy(p, out_norm, (size_t)n * sizeof(float));
        else if (is_norm((li_eagle_tensor)i))
            for (int64_t j = 0; j < n; j++) p[j] = 1.0f;
        else
            for (int64_t j = 0; j < n; j++) p[j] = (float)(0.02 * rng_normal(&rs));
    }
    return 0;
}

void li_train_eagle_free(li_train_eagle *e) {
    li_train_model_free(&e->tm);
    free(e->vocab);
    free(e->vmap);
    memset(e, 0, sizeof *e);
}

int li_train_eagle_default_features(int n_layer, int32_t *feat) {
    int32_t c[3] = {LI_MIN(2, n_layer - 1), n_layer / 2, n_layer - 1};
    for (int i = 1; i < 3; i++) /* ascending (a shallow base puts n_layer / 2 below 2) */
        for (int j = i; j > 0 && c[j] < c[j - 1]; j--) {
            const int32_t t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    int F = 0;
    for (int i = 0; i < 3; i++)
        if (c[i] >= 0 && (!F || c[i] > feat[F - 1])) feat[F++] = c[i];
    return F;
}

/* ==== the draft vocabulary ================================================== */

typedef struct vcount {
    int64_t n;
    int32_t id;
} vcount;

/* most frequent first, ties to the lower id */
static int vcount_cmp(const void *a, const void *b) {
    const vcount *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int id_cmp(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void li_train_eagle_vocab_select(const int32_t *ids, int64_t n_ids, int32_t n_vocab, int32_t n, int32_t *out) {
    vcount *c = li_xmalloc((size_t)n_vocab * sizeof *c);
    for (int32_t i = 0; i < n_vocab; i++) c[i] = (vcount){0, i};
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] >= 0 && ids[i] < n_vocab) c[ids[i]].n++;
    qsort(c, (size_t)n_vocab, sizeof *c, vcount_cmp);
    for (int32_t i = 0; i < n; i++) out[i] = c[i].id;
    qsort(out, (size_t)n, sizeof *out, id_cmp);
    free(c);
}

/* ==== statistics, workspace ================================================ */

void li_train_eagle_stats_add(li_train_eagle_stats *a, const li_train_eagle_stats *b) {
    const int64_t n = a->rows + b->rows;
    if (!n) return;
    const double wa = (double)a->rows / (double)n, wb = (double)b->rows / (double)n;
    a->J = b->J;
    a->loss = wa * a->loss + wb * b->loss;
    for (int j = 0; j < b->J; j++) {
        a->loss_j[j] = wa * a->loss_j[j] + wb * b->loss_j[j];
        a->kl_j[j] = wa * a->kl_j[j] + wb * b->kl_j[j];
        a->agree_j[j] += b->agree_j[j];
    }
    a->rows = n;
}

static li_train_eagle_dims eagle_dims(const li_train_eagle *e, int L, int J) {
    const li_hparams *hp = &e->hp;
    return (li_train_eagle_dims){.d = hp->n_embd, .ff = hp->n_ff, .Vd = e->n_draft, .F = e->F, .H = hp->n_head,
                                 .Hkv = hp->n_head_kv, .hd = hp->head_dim, .n_rot = hp->n_rot,
                                 .neox = hp->rope_neox, .theta = hp->rope_theta, .eps = hp->norm_eps, .L = L, .J = J};
}

int li_train_eagle_ws_init(li_train_eagle_ws *ws, const li_train_eagle *e, int L, int J, li_error *err) {
    memset(ws, 0, sizeof *ws);
    if (J < 1 || J > LI_TRAIN_EAGLE_MAX_TTT)
        return li_error_set(err, LI_EINVAL, "eagle: %d training-time-test steps, expected 1..%d", J,
                            LI_TRAIN_EAGLE_MAX_TTT);
    if (L < J + 2 || L > 65536)
        return li_error_set(err, LI_EINVAL, "eagle: a window of %d tokens leaves %d steps no row (needs >= %d)", L,
                            J, J + 2);
    const li_train_eagle_dims D = eagle_dims(e, L, J);
    ws->n = li_train_eagle_ws_reals_f32(&D);
    if (!(ws->buf = li_aligned_alloc(ws->n * sizeof(float))))
        return li_error_set(err, LI_ENOMEM, "eagle: cannot allocate %.1f MB of activations", (double)ws->n * 4 / 1e6);
    memset(ws->buf, 0, ws->n * sizeof(float));
    ws->L = L;
    ws->J = J;
    if (e->vocab) ws->teacher = li_xmalloc((size_t)L * (size_t)e->n_draft * sizeof *ws->teacher);
    ws->emb = li_xmalloc((size_t)L * (size_t)e->hp.n_embd * sizeof *ws->emb);
    ws->labv = li_xmalloc((size_t)L * sizeof *ws->labv);
    ws->argmax = li_xmalloc((size_t)J * (size_t)(L - J - 1) * sizeof *ws->argmax);
    return 0;
}

void li_train_eagle_ws_free(li_train_eagle_ws *ws) {
    li_aligned_free(ws->buf);
    free(ws->teacher);
    free(ws->emb);
    free(ws->labv);
    free(ws->argmax);
    memset(ws, 0, sizeof *ws);
}

/* ==== forward + backward ==================================================== */

int li_train_eagle_forward_backward(const li_train_eagle *e, li_train_grads *g, const float *EV,
                                    const li_train_eagle_window *w, const li_train_eagle_opts *o,
                                    li_train_eagle_ws *ws, struct li_threadpool *tp, li_train_eagle_stats *st,
                                    li_error *err) {
    const int L = w->L, J = o->J;
    if (L != ws->L || J != ws->J)
        return li_error_set(err, LI_EINVAL, "eagle: a window of %d tokens and %d steps, scratch for %d and %d", L, J,
                            ws->L, ws->J);
    if (g && g->n != e->tm.L.n_grads) return li_error_set(err, LI_EINVAL, "eagle: gradients of another shape");
    if (!(o->alpha >= 0 && o->alpha <= 1) || !(o->temperature > 0))
        return li_error_set(err, LI_EINVAL, "eagle: alpha %g outside [0, 1] or temperature %g <= 0", o->alpha,
                            o->temperature);
    const int64_t V = e->hp.n_vocab, Vd = e->n_draft;
    for (int i = 0; i < L; i++) {
        if (w->tok[i] < 0 || w->tok[i] >= V)
            return li_error_set(err, LI_EINVAL, "eagle: token %d at position %d is outside the vocabulary (%lld)",
                                w->tok[i], i, (long long)V);
        ws->labv[i] = e->vmap[w->tok[i]];
    }
    const float *teacher = w->base_v ? w->base_v : w->base;
    if (e->vocab && !w->base_v) { /* the base's logits over V: the KL's p, renormalized over V by its softmax */
        for (int p = 0; p < L; p++) {
            const float *src = w->base + (int64_t)p * V;
            float *dst = ws->teacher + (int64_t)p * Vd;
            for (int64_t i = 0; i < Vd; i++) dst[i] = src[e->vocab[i]];
        }
        teacher = ws->teacher;
    }
    size_t off[LI_EAGLE_N_TENSORS];
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) off[i] = e->tm.L.t[i].off;
    const li_train_eagle_dims D = eagle_dims(e, L, J);
    const float gs = o->grad_scale != 0 ? o->grad_scale : 1.0f;
    li_train_eagle_fb_f32(&D, off, e->tm.params, g ? g->g : NULL, w->emb, w->feat, teacher, ws->labv, EV, o->alpha,
                          o->temperature, gs, ws->buf, tp, st, ws->argmax);
    return 0;
}

/* ==== the base, frozen ====================================================== */

int li_train_eagle_base_window(li_session *s, const int32_t *tok, int64_t n, const int32_t *feat, int F,
                               const float *EV, int32_t n_ev, struct li_threadpool *tp, float *logits,
                               float *captured, li_error *err) {
    li_batch b;
    int rc = li_session_window(s, tok, n, "eagle", &b, err);
    if (rc) return rc;
    b.capture = feat;
    b.n_capture = F;
    if (EV) {
        b.no_logits = true;
        b.hidden = LI_HIDDEN_POST_NORM;
    }
    rc = li_forward_run(&s->fw, s->model, s->be, &s->kv, &b, EV ? NULL : logits, err);
    if (rc) return rc;
    const float *c = li_forward_captured(&s->fw);
    if (!c) return li_error_set(err, LI_EINVAL, "eagle: the engine returned no captured rows");
    memcpy(captured, c, (size_t)n * (size_t)F * (size_t)s->model->hp.n_embd * sizeof(float));
    if (EV) {
        const float *h = li_forward_hidden(&s->fw, s->model);
        if (!h) return li_error_set(err, LI_EINVAL, "eagle: the engine returned no hidden states");
        li_train_mm_nt(tp, h, EV, logits, n, n_ev, s->model->hp.n_embd);
    }
    s->n_past = n;
    return 0;
}

float *li_train_eagle_output_f32(const li_model *m, const int32_t *vocab, int32_t n_draft) {
    const int64_t n = vocab ? n_draft : m->hp.n_vocab, d = m->hp.n_embd;
    float *E = li_aligned_alloc((size_t)n * (size_t)d * sizeof(float));
    if (!E) return NULL;
    for (int64_t r = 0; r < n; r++) li_weight_dequant_row_ref(&m->output, vocab ? vocab[r] : r, E + r * d);
    return E;
}

void li_train_eagle_embed(const li_model *m, const int32_t *tok, int64_t n, float *out) {
    const int64_t d = m->hp.n_embd;
    for (int64_t i = 0; i < n; i++) li_weight_dequant_row_ref(&m->tok_embd, tok[i], out + i * d);
}

/* ==== the draft file ========================================================= */

int li_train_eagle_save(const li_train_eagle *e, const li_train_eagle_meta *meta, li_ckpt_dtype dtype,
                        const char *path, li_error *err) {
    const li_hparams *hp = &e->hp;
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    char hash[17], key[64];
    snprintf(hash, sizeof hash, "%016" PRIx64, meta->vocab_hash);
    int rc = li_gguf_writer_add_str(&w, "general.architecture", "eagle", err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.version", 1, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_embd", (uint32_t)hp->n_embd, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_vocab", (uint32_t)hp->n_vocab, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_head", (uint32_t)hp->n_head, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_head_kv", (uint32_t)hp->n_head_kv, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.head_dim", (uint32_t)hp->head_dim, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_ff", (uint32_t)hp->n_ff, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.n_features", (uint32_t)e->F, err);
    for (int i = 0; i < e->F && !rc; i++) {
        snprintf(key, sizeof key, "eagle.feature_layer.%d", i);
        rc = li_gguf_writer_add_u32(&w, key, (uint32_t)e->feat[i], err);
    }
    if (!rc) rc = li_gguf_writer_add_str(&w, "eagle.base.name", meta->base_name ? meta->base_name : "", err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "eagle.base.vocab_hash", hash, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.base.n_layer", (uint32_t)hp->n_layer, err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.train.steps", (uint32_t)LI_MIN(meta->steps, UINT32_MAX), err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.train.tokens", (uint32_t)LI_MIN(meta->tokens, UINT32_MAX), err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "eagle.train.ttt", (uint32_t)meta->ttt, err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "eagle.train.alpha", meta->alpha, err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "eagle.train.temperature", meta->temperature, err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "eagle.train.lr", meta->lr, err);
    if (!rc && meta->data) rc = li_gguf_writer_add_str(&w, "eagle.train.data", meta->data, err);
    for (int i = 0; i < LI_EAGLE_N_TENSORS && !rc; i++) {
        const li_train_tensor *t = &e->tm.L.t[i];
        const float *src = e->tm.params + t->off;
        const size_t n = (size_t)(t->rows * t->cols);
        const bool norm = is_norm((li_eagle_tensor)i);
        const int64_t ne[2] = {t->cols, t->rows};
        /* a block type (q8_0, q4_0, q4_1) when the rows are whole blocks */
        const li_type qt = norm ? LI_TYPE_F32 : (li_type)li_ckpt_matrix_type(dtype, NULL, t->name, t->cols);
        if (qt == LI_TYPE_F32) {
            float *f = li_xmalloc(n * sizeof *f);
            memcpy(f, src, n * sizeof *f);
            rc = li_gguf_writer_add_tensor(&w, t->name, LI_TYPE_F32, norm ? 1 : 2, ne, f, n * sizeof *f, err);
        } else if (qt != LI_TYPE_F16) {
            const li_type_traits *tr = li_type_get(qt);
            size_t rb;
            li_type_row_size(qt, t->cols, &rb);
            uint8_t *q = li_xmalloc(rb * (size_t)t->rows);
            for (int64_t r = 0; r < t->rows; r++) tr->from_float(src + r * t->cols, q + r * rb, t->cols);
            rc = li_gguf_writer_add_tensor(&w, t->name, qt, 2, ne, q, rb * (size_t)t->rows, err);
        } else {
            uint16_t *h = li_xmalloc(n * sizeof *h);
            for (size_t j = 0; j < n; j++) h[j] = li_fp32_to_fp16(src[j]);
            rc = li_gguf_writer_add_tensor(&w, t->name, LI_TYPE_F16, 2, ne, h, n * sizeof *h, err);
        }
    }
    if (!rc && e->vocab) {
        int32_t *v = li_xmalloc((size_t)e->n_draft * sizeof *v);
        memcpy(v, e->vocab, (size_t)e->n_draft * sizeof *v);
        const int64_t ne[1] = {e->n_draft};
        rc = li_gguf_writer_add_tensor(&w, "eagle.vocab", LI_TYPE_I32, 1, ne, v, (size_t)e->n_draft * sizeof *v, err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, err);
    li_gguf_writer_free(&w);
    return rc;
}

int li_train_eagle_load(li_train_eagle *e, const char *path, const li_hparams *hp, const li_eagle_base *base,
                        li_error *err) {
    memset(e, 0, sizeof *e);
    li_gguf g;
    int rc = li_gguf_open(&g, path, err);
    if (rc) return rc;
    li_eagle_file f;
    if ((rc = li_eagle_file_check(&g, path, base, &f, err))) goto done;
    li_hparams bh = *hp; /* the base's rope and eps, the file's block */
    bh.n_head = f.n_head;
    bh.n_head_kv = f.n_head_kv;
    bh.n_ff = f.n_ff;
    if ((rc = li_train_eagle_init(e, &bh, f.n_features, f.feature_layer, f.vocab, f.n_draft, NULL, 0, err)))
        goto done;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        const li_gguf_tensor *t = f.t[i];
        const li_train_tensor *tt = &e->tm.L.t[i];
        float *dst = e->tm.params + tt->off;
        const size_t n = (size_t)(tt->rows * tt->cols);
        const uint16_t *h = (const uint16_t *)t->data;
        if (t->type == LI_TYPE_F32) memcpy(dst, t->data, n * sizeof(float));
        else if (t->type == LI_TYPE_F16)
            for (size_t j = 0; j < n; j++) dst[j] = li_fp16_to_fp32(h[j]);
        else if (t->type == LI_TYPE_BF16)
            for (size_t j = 0; j < n; j++) dst[j] = li_bf16_to_fp32(h[j]);
        else { /* a block type (li_eagle_file_check allows q8_0, q4_0, q4_1): --resume trains on from its values */
            const li_type_traits *tr = li_type_get(t->type);
            size_t rb;
            if (!tr || !tr->to_float || !li_type_row_size(t->type, tt->cols, &rb)) {
                rc = li_error_set(err, LI_EUNSUP, "eagle: %s: tensor '%s' of type %s cannot be read back", path,
                                  tt->name, li_type_name(t->type));
                goto done;
            }
            for (int64_t r = 0; r < tt->rows; r++)
                tr->to_float((const uint8_t *)t->data + r * rb, dst + r * tt->cols, tt->cols);
        }
    }
done:
    li_gguf_free(&g);
    return rc;
}
