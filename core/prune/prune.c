/* prune.c — `luainfer prune` (prune.h): calibration, ranking, the choice of
 * what to remove, the predicted quality and the output file. */
#define _GNU_SOURCE
#include "prune/prune.h"
#include "util/tmpguard.h"
#include "engine/session.h"
#include "quant/calib.h"
#include "quant/quant4.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "train/selfgen.h"
#include "util/progress.h"
#include "cpu/threadpool.h"

#include <cjson/cJSON.h>
#include <strings.h>

#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * names
 * ---------------------------------------------------------------------- */

static const char *what_names[] = {"layers", "heads", "ffn"};
static const char *rank_names[] = {"bi", "kld", "act", "obs"};

int li_prune_what_parse(const char *s, li_prune_what *out, li_error *err) {
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, what_names[i])) return *out = (li_prune_what)i, 0;
    return li_error_set(err, LI_EINVAL, "prune: --what must be layers, heads or ffn (got '%s')", s ? s : "");
}

int li_prune_rank_parse(const char *s, li_prune_rank *out, li_error *err) {
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, rank_names[i])) return *out = (li_prune_rank)i, 0;
    return li_error_set(err, LI_EINVAL, "prune: --rank must be bi, kld, act or obs (got '%s')", s ? s : "");
}

int li_prune_refit_type_parse(const char *s, uint32_t *out, li_error *err) {
    static const uint32_t types[] = {LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_Q8_0, LI_TYPE_Q4_0, LI_TYPE_Q4_1};
    for (size_t i = 0; s && i < LI_ARRAY_LEN(types); i++)
        if (!strcasecmp(s, li_type_name(types[i]))) {
            *out = types[i];
            return 0;
        }
    return li_error_set(err, LI_EINVAL, "prune: --refit-dtype must be f16, bf16, q8_0, q4_0 or q4_1 (got '%s')",
                        s ? s : "");
}

const char *li_prune_what_name(li_prune_what w) { return (unsigned)w < 3 ? what_names[w] : "unknown"; }
const char *li_prune_rank_name(li_prune_rank r) { return (unsigned)r < 4 ? rank_names[r] : "unknown"; }

/* ------------------------------------------------------------------------
 * the calibration windows and the original's distributions
 * ---------------------------------------------------------------------- */

/* The original's distributions are kept for the KL steps (the prediction,
 * --rank kld) over the first windows that fit in this many bytes; the
 * statistics (ranking, refit) use every window. */
#define LI_PRUNE_LP_CAP ((double)((size_t)2 << 30))

typedef struct calib_set {
    int64_t samples, seq_len;
    int64_t n_eval;      /* the first n_eval windows: the KL steps' */
    int32_t *win;        /* (samples, seq_len) tokens, BOS first when the model adds one */
    float *base_lp;      /* (n_eval * seq_len, n_vocab) the original's log-probabilities */
} calib_set;

/* The windows: from the calibration text, or (--self-generate) the model's
 * own samples, each window BOS (when the model adds one) and then the next
 * seq_len - 1 sampled tokens. */
static int calib_load(calib_set *c, li_model *m, li_backend *be, const li_prune_opts *o, li_error *err) {
    int rc;
    if (o->self_generate) {
        const bool bos = li_tokenizer_add_bos(m->tok) && li_tokenizer_bos(m->tok) >= 0;
        const int64_t per = o->seq_len - (bos ? 1 : 0);
        int32_t *toks;
        if ((rc = li_train_self_generate_n(m, be, o->samples * per, o->seed, 16, &toks, err))) return rc;
        c->win = li_xmalloc((size_t)(o->samples * o->seq_len) * sizeof(int32_t));
        for (int64_t w = 0; w < o->samples; w++) {
            int32_t *d = c->win + w * o->seq_len;
            if (bos) *d++ = li_tokenizer_bos(m->tok);
            memcpy(d, toks + w * per, (size_t)per * sizeof(int32_t));
        }
        free(toks);
    } else {
        const li_calib_opts co = {.path = o->calib, .samples = o->samples, .seq_len = o->seq_len};
        if ((rc = li_calib_windows(m, &co, "prune", &c->win, err))) return rc;
    }
    c->samples = o->samples;
    c->seq_len = o->seq_len;
    const double per = (double)o->seq_len * (double)m->hp.n_vocab * sizeof(float);
    c->n_eval = LI_MAX((int64_t)1, LI_MIN(o->samples, (int64_t)(LI_PRUNE_LP_CAP / per)));
    c->base_lp = li_xmalloc((size_t)c->n_eval * (size_t)o->seq_len * (size_t)m->hp.n_vocab * sizeof(float));
    return 0;
}

static void calib_free(calib_set *c) {
    free(c->win);
    free(c->base_lp);
}

/* KL of model m's distributions (on be) against the original's over every
 * calibration position: mean, max, top-1 agreement. */
typedef struct kl_stats {
    double mean, max, top1;
} kl_stats;

static int eval_kl(li_model *m, li_backend *be, const calib_set *c, kl_stats *st, li_error *err) {
    const int64_t nv = m->hp.n_vocab;
    li_session s;
    int rc = li_session_init(&s, m, be, c->seq_len, LI_TYPE_F32, c->seq_len, err);
    if (rc) return rc;
    float *logits = li_xmalloc((size_t)c->seq_len * (size_t)nv * sizeof(float));
    double sum = 0, mx = 0;
    int64_t agree = 0, n = 0;
    for (int64_t w = 0; w < c->n_eval && !rc; w++) {
        li_session_reset(&s);
        if ((rc = li_session_eval(&s, c->win + w * c->seq_len, c->seq_len, true, logits, err))) break;
        for (int64_t t = 0; t < c->seq_len; t++, n++) {
            const float *lp = c->base_lp + (size_t)n * nv, *lg = logits + (size_t)t * nv;
            const double kl = li_prune_kl_row(lp, lg, nv);
            sum += kl;
            mx = fmax(mx, kl);
            int64_t ab = 0, am = 0;
            for (int64_t i = 1; i < nv; i++) {
                if (lp[i] > lp[ab]) ab = i;
                if (lg[i] > lg[am]) am = i;
            }
            agree += ab == am;
        }
    }
    free(logits);
    li_session_free(&s);
    if (!rc) *st = (kl_stats){sum / (double)n, mx, (double)agree / (double)n};
    return rc;
}

/* ------------------------------------------------------------------------
 * the capture backend: calib.h's, whose o/down inputs give head and channel
 * importance, with rmsnorm (block inputs and outputs: Block Influence)
 * wrapped too. `cb` comes first, so an op handed &cap->cb.be finds it.
 * ---------------------------------------------------------------------- */

typedef struct capture {
    li_calib_backend cb;
    const li_model *m;
    bool bi, heads, ffn;
    /* Block Influence: the last block input seen, and per layer the sum of
     * 1 - cos over tokens */
    float *prev;          /* (seq_len, n_embd) */
    int64_t prev_n;
    double *bi_sum;       /* (n_layer) */
    int64_t bi_rows;      /* tokens counted at the last layer */
    /* heads: o_proj dequantized, per layer and group the sum of ||W_o[:, g] att[g]|| */
    float **wo;           /* (n_layer) of (n_embd, n_head*head_dim) */
    double *head_sum;     /* (n_layer, n_head_kv) */
    /* ffn: per layer and channel the sum of |silu(g)*u| */
    double *ffn_sum;      /* (n_layer, n_ff) */
    /* --ffn-alloc: per layer the sum over tokens of ||residual stream after the block||^2 */
    double *sig;          /* (n_layer), or NULL */
    /* refit / obs: per layer X^T X of o_proj's (heads) or down_proj's (ffn) inputs */
    li_calib_site gram_site;
    li_q4_calib *gram;    /* (n_layer), or NULL */
    struct li_threadpool *gram_tp; /* their accumulation's threads, or NULL */
    int64_t rows;         /* tokens seen (layer 0's o_proj or down) */
} capture;

static void block_io(capture *c, int l, const float *x, int64_t n) {
    const int64_t d = c->m->hp.n_embd;
    if (l > 0 && c->prev_n == n) {
        for (int64_t t = 0; t < n; t++) c->bi_sum[l - 1] += 1.0 - li_prune_cosine(c->prev + t * d, x + t * d, d);
        if (l == c->m->hp.n_layer) c->bi_rows += n;
    }
    if (l < c->m->hp.n_layer) {
        memcpy(c->prev, x, (size_t)(n * d) * sizeof(float));
        c->prev_n = n;
    }
}

/* the residual stream entering block l (l = n_layer: the output norm's input) */
static void stream_io(capture *c, int l, const float *x, int64_t n) {
    if (c->bi) block_io(c, l, x, n);
    if (c->sig && l > 0) {
        double ss = 0;
        for (int64_t i = 0; i < n * c->m->hp.n_embd; i++) ss += (double)x[i] * x[i];
        c->sig[l - 1] += ss;
    }
}

static void cap_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps) {
    capture *c = (capture *)be;
    if (c->bi || c->sig) {
        if (w == c->m->output_norm) stream_io(c, c->m->hp.n_layer, x, n);
        else
            for (int l = 0; l < c->m->hp.n_layer; l++)
                if (w == c->m->layers[l].attn_norm) {
                    stream_io(c, l, x, n);
                    break;
                }
    }
    c->cb.real->rmsnorm(be, x, w, y, n, dim, eps);
}

static void heads_io(capture *c, int l, const float *att, int64_t n) {
    const li_hparams *hp = &c->m->hp;
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t gw = qd / hp->n_head_kv; /* columns per group */
    const float *wo = c->wo[l];
    double *y = li_xmalloc((size_t)(hp->n_head_kv * d) * sizeof(double));
    for (int64_t t = 0; t < n; t++) {
        const float *a = att + t * qd;
        for (int64_t i = 0; i < d; i++)
            for (int g = 0; g < hp->n_head_kv; g++) {
                float s = 0;
                for (int64_t j = g * gw; j < (g + 1) * gw; j++) s += wo[i * qd + j] * a[j];
                y[g * d + i] = s;
            }
        for (int g = 0; g < hp->n_head_kv; g++) {
            double ss = 0;
            for (int64_t i = 0; i < d; i++) ss += y[g * d + i] * y[g * d + i];
            c->head_sum[(size_t)l * hp->n_head_kv + g] += sqrt(ss);
        }
    }
    free(y);
    if (l == 0) c->rows += n;
}

static void ffn_io(capture *c, int l, const float *x, int64_t n) {
    const int64_t f = c->m->hp.n_ff;
    double *s = c->ffn_sum + (size_t)l * f;
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < f; j++) s[j] += fabsf(x[t * f + j]);
    if (l == 0) c->rows += n;
}

/* li_calib_fn: the inputs of o_proj (heads) and down_proj (FFN channels) */
static void on_input(void *ctx, int l, li_calib_site site, const float *x, int64_t n, int64_t k) {
    capture *c = ctx;
    (void)k;
    if (c->gram && site == c->gram_site) li_q4_calib_accumulate(&c->gram[l], x, n);
    if (site == LI_CALIB_O && c->heads) heads_io(c, l, x, n);
    else if (site == LI_CALIB_DOWN && c->ffn) ffn_io(c, l, x, n);
}

static float *dequant(const li_weight *w) {
    float *f = li_xmalloc((size_t)w->m * (size_t)w->k * sizeof(float));
    for (int64_t r = 0; r < w->m; r++) li_weight_dequant_row_ref(w, r, f + r * w->k);
    return f;
}

/* One pass of the full model over the windows: the original's
 * log-probabilities, and the statistics the ranking asks for. */
static int calibrate(capture *c, li_model *m, li_backend *be, calib_set *cs, li_error *err) {
    const li_hparams *hp = &m->hp;
    li_calib_backend_init(&c->cb, be, m, c->heads || c->ffn || c->gram ? on_input : NULL, c);
    c->cb.ops.rmsnorm = cap_rmsnorm;
    c->m = m;
    c->prev = li_xmalloc((size_t)(cs->seq_len * hp->n_embd) * sizeof(float));
    c->bi_sum = li_xcalloc((size_t)hp->n_layer, sizeof(double));
    if (c->heads) {
        c->wo = li_xcalloc((size_t)hp->n_layer, sizeof *c->wo);
        for (int l = 0; l < hp->n_layer; l++) c->wo[l] = dequant(&m->layers[l].wo);
        c->head_sum = li_xcalloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(double));
    }
    if (c->ffn) c->ffn_sum = li_xcalloc((size_t)hp->n_layer * hp->n_ff, sizeof(double));
    li_session s;
    int rc = li_session_init(&s, m, &c->cb.be, cs->seq_len, LI_TYPE_F32, cs->seq_len, err);
    if (rc) return rc;
    const int64_t nv = hp->n_vocab;
    float *logits = li_xmalloc((size_t)cs->seq_len * (size_t)nv * sizeof(float));
    li_progress pg;
    li_progress_init(&pg, "calibrate", "samples/s", cs->samples);
    for (int64_t w = 0; w < cs->samples && !rc; w++) {
        li_session_reset(&s);
        c->prev_n = 0;
        if ((rc = li_session_eval(&s, cs->win + w * cs->seq_len, cs->seq_len, true, logits, err))) break;
        for (int64_t t = 0; t < cs->seq_len && w < cs->n_eval; t++)
            li_prune_log_softmax(logits + (size_t)t * nv, cs->base_lp + ((size_t)(w * cs->seq_len + t)) * nv, nv);
        li_progress_update(&pg, w + 1, "samples");
    }
    if (!rc) li_progress_finish(&pg);
    free(logits);
    li_session_free(&s);
    return rc;
}

static void capture_free(capture *c, int n_layer) {
    free(c->prev);
    free(c->bi_sum);
    if (c->wo)
        for (int l = 0; l < n_layer; l++) free(c->wo[l]);
    free(c->wo);
    free(c->head_sum);
    free(c->ffn_sum);
    free(c->sig);
    if (c->gram)
        for (int l = 0; l < n_layer; l++) li_q4_calib_free(&c->gram[l]);
    free(c->gram);
    if (c->gram_tp) li_threadpool_free(c->gram_tp);
}

/* ------------------------------------------------------------------------
 * ranking
 * ---------------------------------------------------------------------- */

/* KL of the model with block l skipped, for every l: a shallow copy of the
 * model whose layer table leaves l out (its KV cache one layer smaller). */
static int rank_layers_kld(li_model *m, li_backend *be, const calib_set *cs, double *score, li_error *err) {
    const int nl = m->hp.n_layer;
    li_layer *sub = li_xmalloc((size_t)nl * sizeof *sub);
    li_progress pg;
    li_progress_init(&pg, "rank", "layers/s", nl);
    int rc = 0;
    for (int l = 0; l < nl && !rc; l++) {
        li_model mm = *m;
        for (int j = 0, k = 0; j < nl; j++)
            if (j != l) sub[k++] = m->layers[j];
        mm.layers = sub;
        mm.hp.n_layer = nl - 1;
        kl_stats st;
        if (!(rc = eval_kl(&mm, be, cs, &st, err))) score[l] = st.mean;
        li_progress_update(&pg, l + 1, "layers");
    }
    if (!rc) li_progress_finish(&pg);
    free(sub);
    return rc;
}

/* The KL of masking one KV group of one layer, for every (layer, group): a
 * backend whose o_proj of that layer reads the attention output with the
 * group's columns zeroed, which is exactly the model without the group (its
 * q, k and v rows feed only those columns). */
typedef struct mask_backend {
    li_backend be;
    li_backend_ops ops;
    const li_backend_ops *real;
    const li_weight *w;   /* the masked o_proj */
    int64_t c0, c1;       /* its zeroed input columns */
    float *buf;           /* (seq_len, k) */
} mask_backend;

static const float *masked(mask_backend *mb, const li_weight *w, const float *x, int64_t n) {
    if (w != mb->w) return x;
    memcpy(mb->buf, x, (size_t)(n * w->k) * sizeof(float));
    for (int64_t t = 0; t < n; t++) memset(mb->buf + t * w->k + mb->c0, 0, (size_t)(mb->c1 - mb->c0) * sizeof(float));
    return mb->buf;
}

static void mask_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    mask_backend *mb = (mask_backend *)be;
    mb->real->matmul(be, w, masked(mb, w, x, n), y, n);
}

static void mask_matmul_add(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    mask_backend *mb = (mask_backend *)be;
    x = masked(mb, w, x, n);
    if (mb->real->matmul_add) {
        mb->real->matmul_add(be, w, x, y, res, n);
        return;
    }
    mb->real->matmul(be, w, x, y, n);
    mb->real->add(be, res, y, n * w->m);
}

static int rank_heads_kld(li_model *m, li_backend *be, const calib_set *cs, double *score, li_error *err) {
    const li_hparams *hp = &m->hp;
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim, gw = qd / hp->n_head_kv;
    mask_backend mb = {.be = *be, .real = be->ops, .ops = *be->ops};
    mb.ops.matmul = mask_matmul;
    mb.ops.matmul_add = mask_matmul_add;
    mb.be.ops = &mb.ops;
    mb.buf = li_xmalloc((size_t)(cs->seq_len * qd) * sizeof(float));
    const int64_t units = (int64_t)hp->n_layer * hp->n_head_kv;
    li_progress pg;
    li_progress_init(&pg, "rank", "groups/s", units);
    int rc = 0;
    for (int64_t u = 0; u < units && !rc; u++) {
        mb.w = &m->layers[u / hp->n_head_kv].wo;
        mb.c0 = (u % hp->n_head_kv) * gw;
        mb.c1 = mb.c0 + gw;
        kl_stats st;
        if (!(rc = eval_kl(m, &mb.be, cs, &st, err))) score[u] = st.mean;
        li_progress_update(&pg, u + 1, "groups");
    }
    if (!rc) li_progress_finish(&pg);
    free(mb.buf);
    return rc;
}

/* ffn score: mean |silu(g_j) u_j| x ||W_down[:, j]|| */
static void ffn_scores(const li_model *m, const capture *c, double *score) {
    const li_hparams *hp = &m->hp;
    const int64_t f = hp->n_ff, d = hp->n_embd;
    float *row = li_xmalloc((size_t)f * sizeof(float));
    double *norm = li_xmalloc((size_t)f * sizeof(double));
    for (int l = 0; l < hp->n_layer; l++) {
        memset(norm, 0, (size_t)f * sizeof(double));
        for (int64_t i = 0; i < d; i++) {
            li_weight_dequant_row_ref(&m->layers[l].w_down, i, row);
            for (int64_t j = 0; j < f; j++) norm[j] += (double)row[j] * row[j];
        }
        for (int64_t j = 0; j < f; j++)
            score[(size_t)l * f + j] = c->ffn_sum[(size_t)l * f + j] / (double)c->rows * sqrt(norm[j]);
    }
    free(row);
    free(norm);
}

/* ------------------------------------------------------------------------
 * refit and obs (prune_obs.c): one layer per job, the layers on threads
 * ---------------------------------------------------------------------- */

/* Layers handed to --threads workers one at a time, the first error kept,
 * one progress line (all guarded by mu) */
typedef struct layer_queue {
    pthread_mutex_t mu;
    int n, next, done, rc;
    li_error err;
    li_progress pg;
} layer_queue;

static void queue_init(layer_queue *q, int n, const char *what) {
    *q = (layer_queue){.n = n};
    pthread_mutex_init(&q->mu, NULL);
    li_progress_init(&q->pg, what, "layers/s", n);
}

/* the next layer, or -1 when they are all taken or one failed */
static int queue_take(layer_queue *q) {
    pthread_mutex_lock(&q->mu);
    const int l = q->rc ? q->n : q->next++;
    pthread_mutex_unlock(&q->mu);
    return l < q->n ? l : -1;
}

static void queue_done(layer_queue *q, int rc, const li_error *e) {
    pthread_mutex_lock(&q->mu);
    if (rc && !q->rc) q->rc = rc, q->err = *e;
    li_progress_update(&q->pg, ++q->done, "layers");
    pthread_mutex_unlock(&q->mu);
}

/* 0, or the first failure (its error into *err); the progress line ends */
static int queue_finish(layer_queue *q, li_error *err) {
    pthread_mutex_destroy(&q->mu);
    if (q->rc) *err = q->err;
    else li_progress_finish(&q->pg);
    return q->rc;
}

typedef struct refit_job {
    const li_model *m;
    capture *cap;
    li_prune_what what;
    bool choose;          /* obs: choose the units; else refit those in drop */
    int64_t k, width, units;
    double damp;
    uint8_t *drop;        /* (n_layer, units) */
    double *score;        /* (n_layer, units), or NULL */
    float **refit;        /* (n_layer) out: the refit weight, (d_out, n) (removed columns 0) */
    layer_queue q;
} refit_job;

static int refit_layer(refit_job *j, int l, li_error *err) {
    const li_weight *wt = j->what == LI_PRUNE_HEADS ? &j->m->layers[l].wo : &j->m->layers[l].w_down;
    const int64_t d = wt->m, n = wt->k;
    li_q4_calib *g = &j->cap->gram[l];
    char why[160];
    if (li_q4_calib_finish(g, why, sizeof why)) return li_error_set(err, LI_EINVAL, "prune: layer %d: %s", l, why);
    double *w = li_aligned_alloc((size_t)(d * n) * sizeof(double)); /* 64-byte rows: the refit's vector loads */
    float *row = li_xmalloc((size_t)n * sizeof(float));
    for (int64_t r = 0; r < d; r++) {
        li_weight_dequant_row_ref(wt, r, row);
        for (int64_t i = 0; i < n; i++) w[r * n + i] = row[i];
    }
    int64_t k = j->k; /* refit: the units this layer drops (--ffn-alloc: its own count) */
    if (!j->choose) {
        k = 0;
        for (int64_t u = 0; u < j->units; u++) k += j->drop[(size_t)l * j->units + u];
    }
    int rc = li_prune_obs(w, d, n, g->xtx, j->width, k, j->damp, j->choose, j->drop + (size_t)l * j->units,
                          j->score ? j->score + (size_t)l * j->units : NULL, err);
    li_q4_calib_free(g); /* its X^T X was the elimination's scratch */
    free(row);
    if (rc) {
        li_aligned_free(w);
        return rc;
    }
    float *out = li_xmalloc((size_t)(d * n) * sizeof(float)); /* every column: the writer gathers the kept */
    for (int64_t i = 0; i < d * n; i++) out[i] = (float)w[i];
    j->refit[l] = out;
    li_aligned_free(w);
    return 0;
}

static void *refit_worker(void *arg) {
    refit_job *j = arg;
    for (int l; (l = queue_take(&j->q)) >= 0;) {
        li_error e = {0};
        const int rc = refit_layer(j, l, &e);
        queue_done(&j->q, rc, &e);
    }
    return NULL;
}

/* Layer l's down_proj inputs' X^T X made ready (li_q4_calib_finish) and its
 * weight as doubles into w (n_embd, n_ff); row: n_ff floats of scratch. */
static int down_layer(const li_model *m, capture *cap, int l, double *w, float *row, li_error *err) {
    char why[160];
    if (li_q4_calib_finish(&cap->gram[l], why, sizeof why))
        return li_error_set(err, LI_EINVAL, "prune: layer %d: %s", l, why);
    const int64_t d = m->hp.n_embd, n = m->hp.n_ff;
    for (int64_t r = 0; r < d; r++) {
        li_weight_dequant_row_ref(&m->layers[l].w_down, r, row);
        for (int64_t i = 0; i < n; i++) w[r * n + i] = row[i];
    }
    return 0;
}

/* --ffn-alloc error's curves, a layer a task on --threads workers (each
 * layer's curve is its own: the same numbers on any count of threads) */
typedef struct curve_job {
    const li_model *m;
    capture *cap;
    const double *score;
    double damp;
    double **curve;       /* (n_layer) out: (n_ff + 1) each */
    layer_queue q;
} curve_job;

static void *curve_worker(void *arg) {
    curve_job *j = arg;
    const int64_t d = j->m->hp.n_embd, n = j->m->hp.n_ff;
    double *w = li_xmalloc((size_t)(d * n) * sizeof *w);
    float *row = li_xmalloc((size_t)n * sizeof *row);
    for (int l; (l = queue_take(&j->q)) >= 0;) {
        li_error e = {0};
        int rc = down_layer(j->m, j->cap, l, w, row, &e);
        if (!rc) rc = li_prune_ffn_curve(j->cap->gram[l].xtx, w, d, n, j->score + (size_t)l * n, j->damp, j->curve[l],
                                         &e);
        queue_done(&j->q, rc, &e);
    }
    free(w);
    free(row);
    return NULL;
}

/* --ffn-alloc: each block's channel count from its refit error curve
 * (prune_alloc.c), then each block's lowest-scoring channels into drop */
static int alloc_ffn(const li_model *m, capture *cap, const li_prune_opts *o, const double *score, int64_t k,
                     uint8_t *drop, li_error *err) {
    const li_hparams *hp = &m->hp;
    const int nl = hp->n_layer;
    const int64_t n = hp->n_ff;
    double **curve = li_xcalloc((size_t)nl, sizeof *curve);
    for (int l = 0; l < nl; l++) curve[l] = li_xmalloc((size_t)(n + 1) * sizeof **curve);
    int64_t *keep = li_xmalloc((size_t)nl * sizeof *keep);
    curve_job j = {.m = m, .cap = cap, .score = score, .damp = o->damp, .curve = curve};
    queue_init(&j.q, nl, "ffn-alloc");
    li_run_workers(curve_worker, &j, LI_MIN((long)li_threads_or_cpus(o->threads), (long)nl));
    int rc = queue_finish(&j.q, err);
    /* whole 32-channel blocks of down_proj's rows; no block below --ffn-floor of the uniform count
     * (the curves alone over-cut the middle blocks: docs/pruning.md) */
    const int64_t floor = LI_MAX((int64_t)32, (int64_t)(o->ffn_floor * (double)(n - k)) / 32 * 32);
    if (!rc) rc = li_prune_ffn_allocate((const double *const *)curve, cap->sig, nl, n, 32, floor, k * nl, keep, err);
    for (int l = 0; l < nl && !rc; l++) li_prune_lowest(score + (size_t)l * n, n, n - keep[l], drop + (size_t)l * n);
    for (int l = 0; l < nl; l++) free(curve[l]);
    free(curve);
    free(keep);
    return rc;
}

/* --ffn-alloc kl: the KL steps of one block's curve use at most this many
 * calibration windows (the statistics use all): a point costs one forward
 * over them, and the model gets n_layer x LI_PRUNE_KL_POINTS points. */
#define LI_PRUNE_KL_WINDOWS 8
#define LI_PRUNE_KL_POINTS 4

/* --ffn-alloc kl's measurements, for the printout and --json */
typedef struct kl_points {
    int n_pts;
    int64_t removed[LI_PRUNE_KL_POINTS]; /* channels removed at each point, ascending */
    int64_t windows;                     /* calibration windows the KL steps used */
    double *kl;                          /* (n_layer, n_pts) mean KLD with that block alone cut */
} kl_points;

/* --ffn-alloc kl: for every block, the model with only that block cut to a
 * few widths (its lowest-scoring channels, down_proj refit as --refit does,
 * the refit run as an f32 weight) against the original's distributions on
 * the first windows; the measured KL curves then go through the greedy of
 * --ffn-alloc error (prune_alloc.c) unscaled. The widths remove 1/2, 1, 3/2 and 2
 * times the uniform cut's count (whole 32-channel blocks, at least 32 kept). */
static int alloc_ffn_kl(const li_model *m, li_backend *be, capture *cap, const calib_set *cs, const li_prune_opts *o,
                        const double *score, int64_t k, uint8_t *drop, kl_points *pts, FILE *out, li_error *err) {
    const li_hparams *hp = &m->hp;
    const int nl = hp->n_layer;
    const int64_t n = hp->n_ff, d = hp->n_embd;
    int64_t *removed = pts->removed;
    int n_pts = 0;
    for (int j = 1; j <= LI_PRUNE_KL_POINTS; j++) {
        const int64_t r = LI_MIN(n - 32, (int64_t)llround((double)k * j / 2.0 / 32.0) * 32);
        if (r > 0 && (n_pts == 0 || r > removed[n_pts - 1])) removed[n_pts++] = r;
    }
    if (!n_pts) return li_error_set(err, LI_ERANGE, "prune: --ffn-alloc kl: the cut is under 32 channels per block");
    calib_set sub = *cs; /* the first windows: base_lp's rows come in window order */
    sub.n_eval = LI_MIN(cs->n_eval, (int64_t)LI_PRUNE_KL_WINDOWS);
    double **curve = li_xcalloc((size_t)nl, sizeof *curve);
    double *kl = pts->kl = li_xmalloc((size_t)(nl * n_pts) * sizeof *kl);
    pts->n_pts = n_pts;
    pts->windows = sub.n_eval;
    double *w0 = li_xmalloc((size_t)(d * n) * sizeof *w0), *w = li_aligned_alloc((size_t)(d * n) * sizeof *w);
    double *h = li_aligned_alloc((size_t)(n * n) * sizeof *h); /* 64-byte rows, as the refit's */
    float *row = li_xmalloc((size_t)n * sizeof *row), *wf = li_xmalloc((size_t)(d * n) * sizeof *wf);
    uint8_t *mask = li_xmalloc((size_t)n);
    li_layer *layers = li_xmalloc((size_t)nl * sizeof *layers);
    int64_t *keep = li_xmalloc((size_t)nl * sizeof *keep);
    int rc = 0;
    li_progress pg;
    li_progress_init(&pg, "ffn-alloc", "points/s", (int64_t)nl * n_pts);
    for (int l = 0; l < nl && !rc; l++) {
        if ((rc = down_layer(m, cap, l, w0, row, err))) break;
        for (int j = 0; j < n_pts && !rc; j++) {
            li_prune_lowest(score + (size_t)l * n, n, removed[j], mask);
            memcpy(w, w0, (size_t)(d * n) * sizeof *w);
            memcpy(h, cap->gram[l].xtx, (size_t)(n * n) * sizeof *h); /* li_prune_obs destroys it */
            if ((rc = li_prune_obs(w, d, n, h, 1, removed[j], o->damp, false, mask, NULL, err))) break;
            for (int64_t i = 0; i < d * n; i++) wf[i] = (float)w[i];
            li_weight wt = {.type = LI_TYPE_F32, .k = n, .m = d, .row_bytes = (size_t)n * sizeof(float), .data = wf,
                            .name = "ffn_down (--ffn-alloc kl)"};
            if (be->ops->weight_prepare && be->ops->weight_prepare(be, &wt)) {
                rc = li_error_set(err, LI_EUNSUP, "prune: --ffn-alloc kl: the '%s' backend cannot run an f32 "
                                                  "down_proj", be->ops->name);
                break;
            }
            memcpy(layers, m->layers, (size_t)nl * sizeof *layers);
            layers[l].w_down = wt;
            li_model mm = *m;
            mm.layers = layers;
            kl_stats st;
            if (!(rc = eval_kl(&mm, be, &sub, &st, err))) kl[l * n_pts + j] = st.mean;
            if (be->ops->weight_release) be->ops->weight_release(be, &layers[l].w_down);
            li_progress_update(&pg, (int64_t)l * n_pts + j + 1, "points");
        }
        if (rc) break;
        curve[l] = li_xmalloc((size_t)(n + 1) * sizeof **curve);
        li_prune_ffn_curve_interp(removed, kl + (size_t)l * n_pts, n_pts, n, curve[l]);
    }
    if (!rc) {
        li_progress_finish(&pg);
        fprintf(out, "ffn-alloc kl: mean KLD on %lld x %lld tokens with one block cut by", (long long)sub.n_eval,
                (long long)sub.seq_len);
        for (int j = 0; j < n_pts; j++) fprintf(out, " %lld", (long long)removed[j]);
        fprintf(out, " channels:\n");
        for (int l = 0; l < nl; l++) {
            fprintf(out, "  block %2d:", l);
            for (int j = 0; j < n_pts; j++) fprintf(out, " %.5f", kl[l * n_pts + j]);
            fprintf(out, "\n");
        }
        rc = li_prune_ffn_allocate((const double *const *)curve, NULL, nl, n, 32, 32, k * nl, keep, err);
    }
    for (int l = 0; l < nl && !rc; l++) li_prune_lowest(score + (size_t)l * n, n, n - keep[l], drop + (size_t)l * n);
    for (int l = 0; l < nl; l++) free(curve[l]);
    free(curve), free(w0), li_aligned_free(w), li_aligned_free(h), free(row), free(wf), free(mask), free(layers),
        free(keep);
    return rc;
}

/* Runs the refit (or obs's choice and refit) of every layer; the result
 * in *refit_out (n_layer arrays, owned by the caller). */
static int refit_layers(const li_model *m, capture *cap, const li_prune_opts *o, bool choose, int64_t k,
                        uint8_t *drop, double *score, float ***refit_out, li_error *err) {
    const li_hparams *hp = &m->hp;
    refit_job j = {.m = m, .cap = cap, .what = o->what, .choose = choose, .k = k, .damp = o->damp,
                   .drop = drop, .score = score};
    j.units = o->what == LI_PRUNE_HEADS ? hp->n_head_kv : hp->n_ff;
    j.width = o->what == LI_PRUNE_HEADS ? (int64_t)hp->n_head * hp->head_dim / hp->n_head_kv : 1;
    j.refit = li_xcalloc((size_t)hp->n_layer, sizeof *j.refit);
    queue_init(&j.q, hp->n_layer, choose ? "obs" : "refit");
    li_run_workers(refit_worker, &j, LI_MIN((long)li_threads_or_cpus(o->threads), (long)hp->n_layer));
    const int rc = queue_finish(&j.q, err);
    if (rc) {
        for (int l = 0; l < hp->n_layer; l++) free(j.refit[l]);
        free(j.refit);
        return rc;
    }
    *refit_out = j.refit;
    return 0;
}

/* ------------------------------------------------------------------------
 * how many units: from --ratio or --keep
 * ---------------------------------------------------------------------- */

static int choose_count(const li_model *m, const li_prune_opts *o, const li_prune_params *pp, int64_t *n_remove,
                        li_error *err) {
    const li_hparams *hp = &m->hp;
    int64_t units, per;
    const char *unit;
    switch (o->what) {
    case LI_PRUNE_LAYERS: units = hp->n_layer, per = pp->per_layer, unit = "layers"; break;
    case LI_PRUNE_HEADS: units = hp->n_head_kv, per = pp->per_group * hp->n_layer, unit = "KV groups per layer"; break;
    default: units = hp->n_ff, per = pp->per_channel * hp->n_layer, unit = "FFN channels per layer"; break;
    }
    int64_t k;
    if (o->ratio > 0) {
        k = llround(o->ratio * (double)pp->total / (double)per);
        if (o->what == LI_PRUNE_FFN) /* keep whole 32-element blocks of down_proj's rows */
            k = units - LI_MAX((int64_t)0, (int64_t)llround((double)(units - k) / 32.0) * 32);
        if (k < 1)
            return li_error_set(err, LI_ERANGE, "prune: --ratio %g removes nothing: one unit (%s) is %.2f%% of the "
                                "parameters", o->ratio, unit, 100.0 * (double)per / (double)pp->total);
        if (k >= units)
            return li_error_set(err, LI_ERANGE, "prune: --ratio %g would remove all %lld %s (at most %lld can go, "
                                "%.1f%% of the parameters)", o->ratio, (long long)units, unit,
                                (long long)(o->what == LI_PRUNE_FFN ? units - 32 : units - 1),
                                100.0 * (double)((o->what == LI_PRUNE_FFN ? units - 32 : units - 1) * per) /
                                    (double)pp->total);
    } else {
        if (o->keep < 1 || o->keep >= units)
            return li_error_set(err, LI_ERANGE, "prune: --keep %lld is out of range: the model has %lld %s, keep 1 to "
                                "%lld", (long long)o->keep, (long long)units, unit, (long long)(units - 1));
        if (o->what == LI_PRUNE_FFN && o->keep % 32)
            return li_error_set(err, LI_EINVAL, "prune: --keep %lld: FFN channels are kept in multiples of 32 (the "
                                "quantized blocks of down_proj's rows)", (long long)o->keep);
        k = units - o->keep;
    }
    *n_remove = k;
    return 0;
}

/* ------------------------------------------------------------------------
 * the command
 * ---------------------------------------------------------------------- */

static int check_model(const li_model *m, const li_prune_opts *o, li_error *err) {
    if (m->hf) return li_error_set(err, LI_EUNSUP, "prune: '%s' is a Hugging Face directory; prune a GGUF file", o->in);
    if (strcmp(m->hp.arch, "llama") && strcmp(m->hp.arch, "deci"))
        return li_error_set(err, LI_EUNSUP, "prune: '%s' is a '%s' model; prune reads Llama GGUFs only", o->in,
                            m->hp.arch);
    if (m->quant_scheme != LI_SCHEME_PLAIN && o->what != LI_PRUNE_LAYERS)
        return li_error_set(err, LI_EUNSUP, "prune: '%s' holds %s scheme weights; prune heads or ffn before "
                            "quantizing with a scheme", o->in, li_scheme_name(m->quant_scheme));
    return 0;
}

static void print_ranking(FILE *out, const li_model *m, const li_prune_opts *o, const double *score,
                          const uint8_t *drop) {
    const li_hparams *hp = &m->hp;
    const char *how = o->rank == LI_PRUNE_RANK_BI    ? "block influence, 1 - mean cos(in, out)"
                      : o->rank == LI_PRUNE_RANK_KLD && o->what == LI_PRUNE_LAYERS ? "mean KLD with the block skipped"
                      : o->rank == LI_PRUNE_RANK_KLD ? "mean KLD with the group masked"
                      : o->rank == LI_PRUNE_RANK_OBS ? "OBS: output error with the rest refit, a removed unit's "
                                                       "at its turn, a kept one's at the end"
                      : o->what == LI_PRUNE_HEADS    ? "mean ||W_o[:, group] att[group]||"
                                                     : "mean |silu(g)u| x ||W_down[:, j]||";
    fprintf(out, "ranking (%s; lowest removed):\n", how);
    if (o->what == LI_PRUNE_LAYERS) {
        fprintf(out, "  %-10s %12s\n", "unit", "score");
        for (int l = 0; l < hp->n_layer; l++)
            fprintf(out, "  layer %-4d %12.6f%s\n", l, score[l], drop[l] ? "  removed" : "");
    } else if (o->what == LI_PRUNE_HEADS) {
        fprintf(out, "  %-14s %12s\n", "unit", "score");
        for (int l = 0; l < hp->n_layer; l++)
            for (int g = 0; g < hp->n_head_kv; g++) {
                const size_t i = (size_t)l * hp->n_head_kv + g;
                fprintf(out, "  layer %2d kv %-3d %12.6f%s\n", l, g, score[i], drop[i] ? "  removed" : "");
            }
    } else {
        /* n_ff rows per layer would be thousands: the removed channels' share of the score */
        fprintf(out, "  %-10s %8s %12s %12s %12s\n", "unit", "removed", "min kept", "max removed", "removed share");
        for (int l = 0; l < hp->n_layer; l++) {
            double tot = 0, rem = 0, mk = INFINITY, mr = 0;
            int64_t nr = 0;
            for (int64_t j = 0; j < hp->n_ff; j++) {
                const double s = score[(size_t)l * hp->n_ff + j];
                tot += s;
                if (drop[(size_t)l * hp->n_ff + j]) rem += s, nr++, mr = fmax(mr, s);
                else mk = fmin(mk, s);
            }
            fprintf(out, "  layer %-4d %8lld %12.6f %12.6f %11.2f%%\n", l, (long long)nr, mk, mr,
                   tot > 0 ? 100.0 * rem / tot : 0.0);
        }
    }
}

static void print_json(const li_prune_opts *o, const li_hparams *hp, const li_prune_plan *p, const double *score,
                       const uint8_t *drop, int64_t n_scores, int64_t removed, int64_t total, const kl_stats *st,
                       const kl_points *klp) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "what", li_prune_what_name(o->what));
    cJSON_AddStringToObject(j, "rank", li_prune_rank_name(o->rank));
    cJSON *sc = cJSON_AddArrayToObject(j, "scores"), *rm = cJSON_AddArrayToObject(j, "removed");
    for (int64_t i = 0; i < n_scores; i++) {
        cJSON_AddItemToArray(sc, cJSON_CreateNumber(score[i]));
        if (drop[i]) cJSON_AddItemToArray(rm, cJSON_CreateNumber((double)i));
    }
    cJSON_AddNumberToObject(j, "removed_params", (double)removed);
    cJSON_AddNumberToObject(j, "total_params", (double)total);
    cJSON_AddNumberToObject(j, "fraction", (double)removed / (double)total);
    cJSON_AddNumberToObject(j, "block_count", p->n_layer_keep);
    cJSON_AddNumberToObject(j, "head_count", p->n_group_keep * (hp->n_head / hp->n_head_kv));
    cJSON_AddNumberToObject(j, "head_count_kv", p->n_group_keep);
    cJSON_AddNumberToObject(j, "feed_forward_length", (double)p->n_ff_keep);
    if (p->ff_keep_layer) {
        cJSON *fl = cJSON_AddArrayToObject(j, "feed_forward_length_per_block");
        for (int l = 0; l < hp->n_layer; l++) cJSON_AddItemToArray(fl, cJSON_CreateNumber((double)p->ff_keep_layer[l]));
    }
    if (klp) { /* --ffn-alloc kl: the measured points, KL per block */
        cJSON *a = cJSON_AddObjectToObject(j, "ffn_alloc_kl");
        cJSON_AddNumberToObject(a, "windows", (double)klp->windows);
        cJSON *rr = cJSON_AddArrayToObject(a, "removed"), *kk = cJSON_AddArrayToObject(a, "kld");
        for (int i = 0; i < klp->n_pts; i++) cJSON_AddItemToArray(rr, cJSON_CreateNumber((double)klp->removed[i]));
        for (int l = 0; l < hp->n_layer; l++) {
            cJSON *row = cJSON_CreateArray();
            for (int i = 0; i < klp->n_pts; i++) cJSON_AddItemToArray(row, cJSON_CreateNumber(klp->kl[l * klp->n_pts + i]));
            cJSON_AddItemToArray(kk, row);
        }
    }
    cJSON *q = cJSON_AddObjectToObject(j, "predicted");
    cJSON_AddNumberToObject(q, "kld_mean", st->mean);
    cJSON_AddNumberToObject(q, "kld_max", st->max);
    cJSON_AddNumberToObject(q, "top1_agree", st->top1);
    char *txt = cJSON_PrintUnformatted(j);
    printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}

/* the plan from the drop masks (ffn blocks may drop different counts: --ffn-alloc) */
static void make_plan(const li_model *m, li_prune_what what, const uint8_t *drop, int64_t k, li_prune_plan *p) {
    const li_hparams *hp = &m->hp;
    memset(p, 0, sizeof *p);
    p->what = what;
    p->n_layer_keep = hp->n_layer;
    p->n_group_keep = hp->n_head_kv;
    p->n_ff_keep = hp->n_ff;
    p->keep_layer = li_xmalloc((size_t)hp->n_layer * sizeof(int32_t));
    if (what == LI_PRUNE_LAYERS) {
        p->n_layer_keep = 0;
        for (int l = 0; l < hp->n_layer; l++)
            if (!drop[l]) p->keep_layer[p->n_layer_keep++] = l;
        return;
    }
    for (int l = 0; l < hp->n_layer; l++) p->keep_layer[l] = l;
    const int64_t units = what == LI_PRUNE_HEADS ? hp->n_head_kv : hp->n_ff;
    bool uneven = false; /* ffn blocks dropping different counts (--ffn-alloc) */
    for (int l = 0; l < hp->n_layer && what == LI_PRUNE_FFN; l++) {
        int64_t c = 0;
        for (int64_t j = 0; j < units; j++) c += drop[(size_t)l * units + j];
        uneven |= c != k;
    }
    if (uneven) { /* rows of n_ff, the first ff_keep_layer[l] of row l used */
        p->ff_keep_layer = li_xmalloc((size_t)hp->n_layer * sizeof *p->ff_keep_layer);
        p->keep_ff = li_xmalloc((size_t)(hp->n_layer * units) * sizeof(int32_t));
        p->n_ff_keep = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            int64_t n = 0;
            for (int64_t j = 0; j < units; j++)
                if (!drop[(size_t)l * units + j]) p->keep_ff[(size_t)l * units + n++] = (int32_t)j;
            p->ff_keep_layer[l] = n;
            p->n_ff_keep = LI_MAX(p->n_ff_keep, n);
        }
        return;
    }
    int32_t *keep = li_xmalloc((size_t)(hp->n_layer * (units - k)) * sizeof(int32_t));
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t n = 0;
        for (int64_t j = 0; j < units; j++)
            if (!drop[(size_t)l * units + j]) keep[(size_t)l * (units - k) + n++] = (int32_t)j;
    }
    if (what == LI_PRUNE_HEADS) p->keep_group = keep, p->n_group_keep = (int32_t)(units - k);
    else p->keep_ff = keep, p->n_ff_keep = units - k;
}

int li_prune(const li_prune_opts *o, li_error *err) {
    if (!o->calib == !o->self_generate)
        return li_error_set(err, LI_EINVAL, "prune: give one of --calib FILE (the calibration text) and "
                            "--self-generate (the model's own samples)");
    if (o->ratio != 0 && !(o->ratio > 0 && o->ratio < 1))
        return li_error_set(err, LI_ERANGE, "prune: --ratio must be in (0, 1) (got %g)", o->ratio);
    if ((o->ratio > 0) == (o->keep != 0))
        return li_error_set(err, LI_EINVAL, "prune: give exactly one of --ratio R and --keep N");
    if (o->samples < 1 || o->seq_len < 2)
        return li_error_set(err, LI_EINVAL, "prune: --samples must be >= 1 and --seq-len >= 2");
    if (o->samples > ((int64_t)1 << 30) / o->seq_len) /* and no product below overflows */
        return li_error_set(err, LI_ERANGE, "prune: --samples %lld x --seq-len %lld is over 2^30 calibration tokens",
                            (long long)o->samples, (long long)o->seq_len);
    if (o->rank == LI_PRUNE_RANK_BI && o->what != LI_PRUNE_LAYERS)
        return li_error_set(err, LI_EINVAL, "prune: --rank bi (block influence) ranks layers; %s rank by act",
                            li_prune_what_name(o->what));
    if (o->rank == LI_PRUNE_RANK_ACT && o->what == LI_PRUNE_LAYERS)
        return li_error_set(err, LI_EINVAL, "prune: --rank act ranks heads and ffn channels; layers rank by bi or kld");
    if (o->rank == LI_PRUNE_RANK_OBS && o->what == LI_PRUNE_LAYERS)
        return li_error_set(err, LI_EINVAL, "prune: --rank obs ranks heads and ffn channels (by the refit o_proj / "
                            "down_proj); layers rank by bi or kld");
    if (o->refit && o->what == LI_PRUNE_LAYERS)
        return li_error_set(err, LI_EINVAL, "prune: --refit refits o_proj or down_proj after removing heads or ffn "
                            "channels; a removed layer leaves no linear to refit");
    if (o->refit_type && !o->refit && o->rank != LI_PRUNE_RANK_OBS)
        return li_error_set(err, LI_EINVAL, "prune: --refit-dtype sets the refit tensor's type; give --refit or "
                            "--rank obs");
    if (!(o->damp >= 0 && o->damp <= 1))
        return li_error_set(err, LI_ERANGE, "prune: --damp must be in [0, 1] (got %g)", o->damp);
    if (o->rank == LI_PRUNE_RANK_KLD && o->what == LI_PRUNE_FFN)
        return li_error_set(err, LI_EUNSUP, "prune: --rank kld ranks layers and heads (one run per unit: not per FFN "
                            "channel); ffn ranks by act");
    if (o->ffn_alloc == LI_PRUNE_ALLOC_ERROR && !(o->ffn_floor > 0 && o->ffn_floor <= 1))
        return li_error_set(err, LI_ERANGE, "prune: --ffn-floor must be in (0, 1] (got %g)", o->ffn_floor);
    if (o->ffn_alloc && (o->what != LI_PRUNE_FFN || o->rank != LI_PRUNE_RANK_ACT || !o->refit))
        return li_error_set(err, LI_EINVAL, "prune: --ffn-alloc %s sizes each block's FFN from the refit's %s: it "
                            "needs --what ffn --rank act --refit", o->ffn_alloc == LI_PRUNE_ALLOC_KL ? "kl" : "error",
                            o->ffn_alloc == LI_PRUNE_ALLOC_KL ? "measured KL" : "error curve");
    if (o->calib && access(o->calib, R_OK) != 0)
        return li_error_set(err, LI_EIO, "prune: cannot read calibration file '%s'", o->calib);

    li_runtime rt;
    int rc = li_runtime_open(&rt, o->in, o->threads, "auto", err);
    if (rc) return rc;
    if ((rc = li_model_refuse_rotated(rt.model, "prune", err))) { /* its channel scores would be of mixed channels */
        li_runtime_close(&rt);
        return rc;
    }
    if (rt.model->hp.n_ff_layer) { /* the rankings and the writer take one width */
        li_runtime_close(&rt);
        return li_error_set(err, LI_EUNSUP, "prune: %s's blocks have different FFN widths (pruned with --ffn-alloc "
                                            "error); prune its uniform original instead", o->in);
    }
    li_model *m = rt.model;
    const li_hparams *hp = &m->hp;
    calib_set cs = {0};
    capture cap = {.bi = o->rank == LI_PRUNE_RANK_BI, .heads = o->what == LI_PRUNE_HEADS && o->rank == LI_PRUNE_RANK_ACT,
                   .ffn = o->what == LI_PRUNE_FFN && o->rank == LI_PRUNE_RANK_ACT};
    const bool obs = o->rank == LI_PRUNE_RANK_OBS, refit = obs || o->refit;
    float **refit_w = NULL;
    li_prune_plan plan = {0};
    double *score = NULL;
    uint8_t *drop = NULL;
    char *tmp = NULL;
    int guard = -1; /* the temporary output while it exists: SIGINT / SIGTERM remove it */
    li_model *pm = NULL;
    li_prune_params pp;
    kl_points klp = {0};
    int64_t k = 0;
    if ((rc = check_model(m, o, err))) goto done;
    if (o->seq_len > hp->n_ctx_train) {
        rc = li_error_set(err, LI_ERANGE, "prune: --seq-len %lld exceeds the model's context %d", (long long)o->seq_len,
                          hp->n_ctx_train);
        goto done;
    }
    FILE *out = o->json ? stderr : stdout; /* --json: stdout holds the object alone */
    li_prune_count(m, &pp);
    if ((rc = choose_count(m, o, &pp, &k, err))) goto done;
    if ((rc = calib_load(&cs, m, &rt.be, o, err))) goto done;
    if (cs.n_eval < cs.samples)
        fprintf(out, "note: the KL steps use the first %lld of the %lld windows (2 GiB of the original's "
                "distributions); the statistics use all\n", (long long)cs.n_eval, (long long)cs.samples);
    if (refit) {
        const int64_t gn = o->what == LI_PRUNE_HEADS ? (int64_t)hp->n_head * hp->head_dim : hp->n_ff;
        cap.gram_site = o->what == LI_PRUNE_HEADS ? LI_CALIB_O : LI_CALIB_DOWN;
        cap.gram = li_xcalloc((size_t)hp->n_layer, sizeof *cap.gram);
        const int nt = li_threads_or_cpus(o->threads);
        if (nt > 1) cap.gram_tp = li_threadpool_init(nt);
        for (int l = 0; l < hp->n_layer && !rc; l++) {
            char why[160];
            if (li_q4_calib_init(&cap.gram[l], gn, why, sizeof why))
                rc = li_error_set(err, LI_ENOMEM, "prune: %s", why);
            else cap.gram[l].tp = cap.gram_tp;
        }
        if (rc) goto done;
        if (o->ffn_alloc == LI_PRUNE_ALLOC_ERROR) cap.sig = li_xcalloc((size_t)hp->n_layer, sizeof *cap.sig);
        if (o->samples * o->seq_len < gn)
            fprintf(out, "note: %lld calibration tokens for %lld-wide inputs: the refit leans on --damp %g; more "
                    "--samples refit better\n", (long long)(o->samples * o->seq_len), (long long)gn, o->damp);
    }
    if ((rc = calibrate(&cap, m, &rt.be, &cs, err))) goto done;

    const int64_t per_layer_units = o->what == LI_PRUNE_HEADS ? hp->n_head_kv : hp->n_ff;
    const int64_t n_scores = o->what == LI_PRUNE_LAYERS ? hp->n_layer : hp->n_layer * per_layer_units;
    score = li_xcalloc((size_t)n_scores, sizeof *score);
    drop = li_xcalloc((size_t)n_scores, 1);
    if (o->rank == LI_PRUNE_RANK_BI) {
        for (int l = 0; l < hp->n_layer; l++) score[l] = cap.bi_sum[l] / (double)cap.bi_rows;
    } else if (o->rank == LI_PRUNE_RANK_KLD && o->what == LI_PRUNE_LAYERS) {
        if ((rc = rank_layers_kld(m, &rt.be, &cs, score, err))) goto done;
    } else if (o->rank == LI_PRUNE_RANK_KLD) {
        if ((rc = rank_heads_kld(m, &rt.be, &cs, score, err))) goto done;
    } else if (obs) {
        if ((rc = refit_layers(m, &cap, o, true, k, drop, score, &refit_w, err))) goto done;
    } else if (o->what == LI_PRUNE_HEADS) {
        for (int64_t i = 0; i < n_scores; i++) score[i] = cap.head_sum[i] / (double)cap.rows;
    } else {
        ffn_scores(m, &cap, score);
    }
    if (o->what == LI_PRUNE_LAYERS) li_prune_lowest(score, hp->n_layer, k, drop);
    else if (o->ffn_alloc == LI_PRUNE_ALLOC_ERROR) {
        if ((rc = alloc_ffn(m, &cap, o, score, k, drop, err))) goto done;
    } else if (o->ffn_alloc == LI_PRUNE_ALLOC_KL) {
        if ((rc = alloc_ffn_kl(m, &rt.be, &cap, &cs, o, score, k, drop, &klp, out, err))) goto done;
    } else if (!obs)
        for (int l = 0; l < hp->n_layer; l++) /* per layer: the same count everywhere */
            li_prune_lowest(score + (size_t)l * per_layer_units, per_layer_units, k,
                            drop + (size_t)l * per_layer_units);
    if (refit && !obs && (rc = refit_layers(m, &cap, o, false, k, drop, NULL, &refit_w, err))) goto done;
    print_ranking(out, m, o, score, drop);
    make_plan(m, o->what, drop, k, &plan);
    if (refit_w) plan.refit = refit_w, plan.n_refit = hp->n_layer, plan.refit_type = o->refit_type, refit_w = NULL;
    const int64_t removed = o->what == LI_PRUNE_LAYERS ? k * pp.per_layer
                            : o->what == LI_PRUNE_HEADS ? k * pp.per_group * hp->n_layer
                                                        : k * pp.per_channel * hp->n_layer;
    fprintf(out, "removing %lld %s: %lld of %lld parameters (%.4f%%)\n", (long long)k,
           o->what == LI_PRUNE_LAYERS ? "layers" : o->what == LI_PRUNE_HEADS ? "KV groups per layer"
           : plan.ff_keep_layer ? "FFN channels per layer on average" : "FFN channels per layer",
           (long long)removed, (long long)pp.total, 100.0 * (double)removed / (double)pp.total);
    fprintf(out, "new shape: block_count %d, head_count %d, head_count_kv %d, feed_forward_length %s%lld\n", plan.n_layer_keep,
           plan.n_group_keep * (hp->n_head / hp->n_head_kv), plan.n_group_keep, plan.ff_keep_layer ? "at most " : "",
           (long long)plan.n_ff_keep);
    if (plan.ff_keep_layer) {
        fprintf(out, "feed_forward_length per block:");
        for (int l = 0; l < hp->n_layer; l++) fprintf(out, " %lld", (long long)plan.ff_keep_layer[l]);
        fprintf(out, "\n");
        fprintf(out, "architecture: deci (llama.cpp reads per-block widths for it, not for llama)\n");
    }
    fflush(out);

    /* the file, loaded back and scored before it takes OUT's name */
    const size_t tl = strlen(o->out) + 32;
    tmp = li_xmalloc(tl);
    snprintf(tmp, tl, "%s.prune.%d", o->out, (int)getpid());
    guard = li_tmpguard_add(tmp);
    if ((rc = li_prune_write(m, &plan, li_prune_rank_name(o->rank), tmp, err))) goto done;
    if ((rc = li_model_load(&pm, tmp, err)) || (rc = li_model_prepare(pm, &rt.be, err))) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = li_error_set(err, rc, "prune: the pruned file does not load back: %s", why);
        goto done;
    }
    kl_stats st;
    if ((rc = eval_kl(pm, &rt.be, &cs, &st, err))) goto done;
    fprintf(out, "predicted quality on the calibration %s (%lld x %lld tokens): mean KLD %.6f, max %.4f, top-1 agreement "
           "%.2f%%\n", o->self_generate ? "samples" : "text", (long long)cs.n_eval, (long long)cs.seq_len, st.mean, st.max, 100.0 * st.top1);
    li_model_release(pm, &rt.be);
    li_model_free(pm);
    pm = NULL;
    if (o->json) print_json(o, hp, &plan, score, drop, n_scores, removed, pp.total, &st, klp.kl ? &klp : NULL);
    if (o->dry_run) {
        fprintf(out, "dry run: nothing written\n");
    } else if (rename(tmp, o->out) != 0) {
        rc = li_error_set(err, LI_EIO, "prune: cannot rename '%s' to '%s'", tmp, o->out);
    } else {
        fprintf(out, "wrote %s\n", o->out);
    }
done:
    if (pm) {
        li_model_release(pm, &rt.be);
        li_model_free(pm);
    }
    if (tmp) {
        unlink(tmp); /* gone after the rename; removes it on a dry run or an error */
        li_tmpguard_release(guard);
        free(tmp);
    }
    li_prune_plan_free(&plan);
    if (refit_w)
        for (int l = 0; l < hp->n_layer; l++) free(refit_w[l]);
    free(refit_w);
    free(score);
    free(drop);
    free(klp.kl);
    capture_free(&cap, hp->n_layer);
    calib_free(&cs);
    li_runtime_close(&rt);
    return rc;
}
