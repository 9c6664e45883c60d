/* quantize.c — `luainfer quantize` (quantize.h). Owns: the per-tensor
 * requantization, SmoothQuant's migration, the output's metadata keys and
 * the order tensors are written in (the input's). */
#define _GNU_SOURCE
#include "quant/quantize.h"
#include "quant/calib.h"
#include "quant/quant4.h"
#include "quant/rotate.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "runtime/runtime.h"
#include "util/progress.h"
#include "util/tmpguard.h"
#include "cpu/threadpool.h"

#include <libgen.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * methods
 * ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    li_type type;      /* GGUF type of the weights (plain methods), else LI_TYPE_COUNT */
    li_scheme scheme;  /* the scheme of the linear weights, or PLAIN */
    uint32_t ftype;    /* llama.cpp's general.file_type, 0: not written */
} methods[LI_QMETHOD_COUNT] = {
    [LI_QMETHOD_F16] = {"f16", LI_TYPE_F16, LI_SCHEME_PLAIN, 1},
    [LI_QMETHOD_BF16] = {"bf16", LI_TYPE_BF16, LI_SCHEME_PLAIN, 32},
    [LI_QMETHOD_Q8_0] = {"q8_0", LI_TYPE_Q8_0, LI_SCHEME_PLAIN, 7},
    [LI_QMETHOD_Q4_0] = {"q4_0", LI_TYPE_Q4_0, LI_SCHEME_PLAIN, 2},
    [LI_QMETHOD_Q4_1] = {"q4_1", LI_TYPE_Q4_1, LI_SCHEME_PLAIN, 3},
    [LI_QMETHOD_W8A8] = {"w8a8", LI_TYPE_COUNT, LI_SCHEME_W8A8, 0},
    [LI_QMETHOD_FP8] = {"fp8", LI_TYPE_COUNT, LI_SCHEME_FP8, 0},
    /* rtn4 stores AWQ's layout (u4 codes, group scales, zero points): the
     * same math without the search */
    [LI_QMETHOD_RTN4] = {"rtn4", LI_TYPE_COUNT, LI_SCHEME_AWQ, 0},
    [LI_QMETHOD_AWQ] = {"awq", LI_TYPE_COUNT, LI_SCHEME_AWQ, 0},
    [LI_QMETHOD_GPTQ] = {"gptq", LI_TYPE_COUNT, LI_SCHEME_GPTQ, 0},
    [LI_QMETHOD_W4A4] = {"w4a4", LI_TYPE_COUNT, LI_SCHEME_INT4, 0},
};

int li_qmethod_parse(const char *s, li_qmethod *out, li_error *err) {
    for (int i = 0; i < LI_QMETHOD_COUNT; i++)
        if (s && !strcmp(s, methods[i].name)) {
            *out = (li_qmethod)i;
            return 0;
        }
    return li_error_set(err, LI_EINVAL,
                        "quantize: unknown method '%s' (expected f16, bf16, q8_0, q4_0, q4_1, w8a8, fp8, rtn4, awq, "
                        "gptq or w4a4)",
                        s ? s : "");
}

const char *li_qmethod_name(li_qmethod m) { return (unsigned)m < LI_QMETHOD_COUNT ? methods[m].name : "unknown"; }

bool li_qmethod_is_q4(li_qmethod m) {
    return m == LI_QMETHOD_RTN4 || m == LI_QMETHOD_AWQ || m == LI_QMETHOD_GPTQ || m == LI_QMETHOD_W4A4;
}

bool li_qmethod_needs_calib(const li_quant_opts *o) {
    if (o->method == LI_QMETHOD_AWQ || o->method == LI_QMETHOD_GPTQ || o->gptq_grid) return true;
    return (o->method == LI_QMETHOD_W8A8 || o->method == LI_QMETHOD_FP8) && o->smooth != LI_SMOOTH_NONE &&
           o->alpha > 0;
}

/* ------------------------------------------------------------------------
 * output tensors, kept per input tensor until the file is written in the
 * input's order
 * ---------------------------------------------------------------------- */

typedef struct out_tensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[2];
    void *data;
    size_t nbytes;
} out_tensor;

typedef struct out_slot {
    out_tensor t[4];   /* the tensor, and a scheme weight's .scale (.zero, .perm) */
    int n;
    int64_t params;    /* weight elements it stands for (bits per weight) */
} out_slot;

static void slot_add(out_slot *s, const char *name, uint32_t type, int64_t ne0, int64_t ne1, void *data, size_t nbytes) {
    out_tensor *t = &s->t[s->n++];
    t->name = strdup(name);
    if (!t->name) abort();
    t->type = type;
    t->n_dims = ne1 > 1 || s->n > 1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->data = data;
    t->nbytes = nbytes;
}

/* A 2-D weight (m rows of k) of f32 values as GGUF type `type`. */
static int emit_plain(out_slot *s, const char *name, li_type type, const float *f, int64_t m, int64_t k,
                      li_error *err) {
    const li_type_traits *tr = li_type_get(type);
    size_t row;
    if (!li_type_row_size(type, k, &row))
        return li_error_set(err, LI_EINVAL, "quantize: tensor '%s' has rows of %lld elements, not a multiple of %s's "
                            "block of %lld", name, (long long)k, tr->name, (long long)tr->blck_size);
    uint8_t *d = li_xmalloc(row * (size_t)m);
    for (int64_t r = 0; r < m; r++) tr->from_float(f + r * k, d + (size_t)r * row, k);
    slot_add(s, name, type, k, m, d, row * (size_t)m);
    s->params = m * k;
    return 0;
}

/* A scheme weight with one scale per output channel from its codes (int8
 * bytes or e4m3 codes, (m, k)) and scales (m); takes both. */
static void emit_scheme_codes(out_slot *s, const char *name, uint8_t *codes, float *scales, int64_t m, int64_t k) {
    char sname[160];
    snprintf(sname, sizeof sname, "%s.scale", name);
    slot_add(s, name, LI_TYPE_I8, k, m, codes, (size_t)m * (size_t)k);
    slot_add(s, sname, LI_TYPE_F32, 1, m, scales, (size_t)m * sizeof(float));
    s->params = m * k;
}

/* A scheme weight with one scale per output channel: int8 codes round(w/s),
 * s = amax/127 (W8A8), or e4m3(w/s), s = amax/448 (FP8). */
static void emit_scheme(out_slot *s, const char *name, li_scheme scheme, const float *f, int64_t m, int64_t k) {
    int8_t *codes = li_xmalloc((size_t)m * (size_t)k);
    float *scales = li_xmalloc((size_t)m * sizeof(float));
    const float qmax = scheme == LI_SCHEME_W8A8 ? 127.0f : 448.0f;
    for (int64_t r = 0; r < m; r++) {
        const float *w = f + r * k;
        float amax = 0.0f;
        for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(w[j]));
        const float sc = amax / qmax, inv = sc > 0 ? 1.0f / sc : 0.0f;
        scales[r] = sc;
        int8_t *q = codes + r * k;
        for (int64_t j = 0; j < k; j++)
            q[j] = scheme == LI_SCHEME_W8A8 ? (int8_t)li_code_round(w[j] * inv, -127.0f, 127.0f)
                                            : (int8_t)li_fp32_to_fp8_e4m3(w[j] * inv);
    }
    emit_scheme_codes(s, name, (uint8_t *)codes, scales, m, k);
}

/* ------------------------------------------------------------------------
 * SmoothQuant: for input channel j of a weight group reading activation X,
 *   s_j = amax(X_j)^alpha / amax(W_j)^(1 - alpha)
 * X_j / s_j is folded into what produces X, W[:, j] * s_j into the weights.
 * ---------------------------------------------------------------------- */

static double smooth_scale(double ax, double aw, double alpha) {
    if (!(ax > 0) || !(aw > 0)) return 1.0;
    const double s = pow(ax, alpha) / pow(aw, 1.0 - alpha);
    return fmin(fmax(s, 1e-5), 1e5);
}

/* column j's max |w| over the rows of every weight in ws (k columns) */
static void col_amax(float *const *ws, const int64_t *rows, int n_w, int64_t k, double *out) {
    for (int64_t j = 0; j < k; j++) out[j] = 0;
    for (int i = 0; i < n_w; i++)
        for (int64_t r = 0; r < rows[i]; r++)
            for (int64_t j = 0; j < k; j++) out[j] = fmax(out[j], fabsf(ws[i][r * k + j]));
}

/* the f32 values of one layer's weights and norms */
typedef struct layer_f32 {
    float *w[7];       /* wq, wk, wv, wo, w_gate, w_up, w_down: (m, k) each */
    int64_t m[7], k[7];
    float *attn_norm, *ffn_norm; /* (n_embd) */
    double *in_s[7];   /* SmoothQuant's s per input column of each weight (k), or NULL: not smoothed */
} layer_f32;

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN };
/* blk.N.<name>.weight of each, in that order */
static const char *const names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

/* ---- --alpha-search: alpha per (layer, site) by the int8 matmul's error */

/* Calibration rows kept for the search: every stride-th row a site sees,
 * up to LI_SQ_ROWS, per (layer, site). */
#define LI_SQ_ROWS 256

typedef struct sq_rows {
    li_calib_amax *amax;
    float *x[LI_CALIB_N_SITES]; /* per site: (n_layer, LI_SQ_ROWS, k[site]) */
    int64_t *n, *seen;          /* (n_layer * sites) rows kept, rows seen */
    int64_t stride;
} sq_rows;

static void sq_collect(void *ctx, int layer, li_calib_site site, const float *x, int64_t n, int64_t k) {
    sq_rows *sr = ctx;
    li_calib_amax_collect(sr->amax, layer, site, x, n, k);
    if (layer < 0 || layer >= sr->amax->n_layer || k != sr->amax->k[site]) return;
    const int64_t i = (int64_t)layer * LI_CALIB_N_SITES + site;
    float *dst = sr->x[site] + (int64_t)layer * LI_SQ_ROWS * k;
    for (int64_t r = 0; r < n && sr->n[i] < LI_SQ_ROWS; r++, sr->seen[i]++)
        if (sr->seen[i] % sr->stride == 0) memcpy(dst + sr->n[i]++ * k, x + r * k, (size_t)k * sizeof(float));
}

/* The search's loops are LI_HOT_CLONES (util/common.h): AVX2 and plain
 * x86-64, the same bits (nothing in them is reassociated). */

/* NAME(wt, m8, k, x, dots): dots (4, m8) = 4 rows of x (4, k) times wt
 * (k, m8), the weights transposed; each output a sum in REAL over j
 * increasing, the order of a plain dot product, L outputs and four rows
 * side by side so the sums vectorize without being reassociated. */
#define SQ_DOTS(NAME, REAL, L)                                                                                 \
    LI_HOT_CLONES static void NAME(const float *wt, int64_t m8, int64_t k, const float *x, REAL *dots) {            \
        for (int64_t c0 = 0; c0 < m8; c0 += L) {                                                              \
            REAL a[4][L] = {{0}};                                                                             \
            for (int64_t j = 0; j < k; j++) {                                                                 \
                const float *w = wt + j * m8 + c0;                                                            \
                const REAL x0 = x[j], x1 = x[k + j], x2 = x[2 * k + j], x3 = x[3 * k + j];                    \
                for (int u = 0; u < L; u++) {                                                                 \
                    const REAL wu = w[u];                                                                     \
                    a[0][u] += wu * x0;                                                                       \
                    a[1][u] += wu * x1;                                                                       \
                    a[2][u] += wu * x2;                                                                       \
                    a[3][u] += wu * x3;                                                                       \
                }                                                                                             \
            }                                                                                                 \
            for (int t = 0; t < 4; t++)                                                                       \
                for (int u = 0; u < L; u++) dots[t * m8 + c0 + u] = a[t][u];                                  \
        }                                                                                                     \
    }

/* the quantized matmul's dots, in float as the int8 kernels' reference sums */
SQ_DOTS(sq_dots, float, 8)
/* the unquantized matmul the error is taken against, in double */
SQ_DOTS(sq_dots_f64, double, 4)

/* Weight rows wr[0..nr) (nr <= 8) smoothed by s and rounded to int8 per
 * row (the W8A8 weight grid), into columns c0.. of wt (k, m8), transposed
 * for sq_dots; buf: 8k floats of scratch. */
LI_HOT_CLONES static void sq_wq_block(const float *const *wr, int nr, int64_t k, const double *s, float *buf,
                                      float *wt, int64_t m8, int64_t c0) {
    for (int u = 0; u < nr; u++) {
        const float *w = wr[u];
        float *o = buf + u * k, amax = 0;
        for (int64_t j = 0; j < k; j++) {
            const float v = fabsf(o[j] = (float)(w[j] * s[j]));
            amax = v > amax ? v : amax; /* fmaxf's result (a NaN v leaves amax), without its call */
        }
        const float sc = amax / 127.0f, inv = sc > 0 ? 1.0f / sc : 0.0f;
        for (int64_t j = 0; j < k; j++) o[j] = li_code_round(o[j] * inv, -127.0f, 127.0f) * sc;
    }
    for (int64_t j = 0; j < k; j++)
        for (int u = 0; u < nr; u++) wt[j * m8 + c0 + u] = buf[u * k + j];
}

/* A search thread's scratch for a site of m weight rows of k inputs: the
 * weights transposed (k, m8), their columns past m zero; 4 rows of dots;
 * 8 weight rows and 4 activation rows of k. */
typedef struct sq_scratch {
    int64_t m, m8, k;
    float *wt, *dots, *wq, *xq;
} sq_scratch;

/* The output error, summed over the kept rows x (nx, k), of the int8
 * matmul of weights ws (stacked, sc->m rows) smoothed by s: per-row int8
 * RTN of W diag(s) times per-token int8 of x diag(s)^-1, against x W^T (y,
 * (nx, m), precomputed). The sums are those of plain dot products, each in
 * its order (sq_dots), so the alphas chosen do not depend on the vector
 * width. */
static double sq_error(float *const *ws, const int64_t *rows, int n_w, const double *s, const float *x, int64_t nx,
                       const double *y, sq_scratch *sc) {
    const int64_t m = sc->m, m8 = sc->m8, k = sc->k;
    const float *wr[8];
    int nr = 0;
    int64_t c0 = 0;
    for (int i = 0; i < n_w; i++)
        for (int64_t r = 0; r < rows[i]; r++) {
            wr[nr++] = ws[i] + r * k;
            if (nr == 8) sq_wq_block(wr, nr, k, s, sc->wq, sc->wt, m8, c0), c0 += 8, nr = 0;
        }
    if (nr) sq_wq_block(wr, nr, k, s, sc->wq, sc->wt, m8, c0);
    double e = 0;
    for (int64_t t0 = 0; t0 < nx; t0 += 4) {
        const int64_t nt = LI_MIN((int64_t)4, nx - t0);
        for (int64_t u = 0; u < nt; u++) {
            float *xu = sc->xq + u * k, amax = 0;
            for (int64_t j = 0; j < k; j++) {
                const float v = fabsf(xu[j] = (float)(x[(t0 + u) * k + j] / s[j]));
                amax = v > amax ? v : amax;
            }
            const float scale = amax / 127.0f, inv = scale > 0 ? 1.0f / scale : 0.0f;
            for (int64_t j = 0; j < k; j++) xu[j] = li_code_round(xu[j] * inv, -127.0f, 127.0f) * scale;
        }
        sq_dots(sc->wt, m8, k, sc->xq, sc->dots); /* rows past nt: stale, not read */
        for (int64_t u = 0; u < nt; u++)
            for (int64_t c = 0; c < m; c++) {
                const double d = (double)sc->dots[u * m8 + c] - y[(t0 + u) * m + c];
                e += d * d;
            }
    }
    return e;
}

/* One thread of sq_search: the grid's alphas taken in turn, each error
 * into e[g] (every alpha's error is the same sum whichever thread takes
 * it, so the choice does not depend on the thread count). */
typedef struct sq_grid_job {
    float *const *ws;
    const int64_t *rows;
    int n_w;
    int64_t k, m, nx;
    const double *a, *w, *y;
    const float *x;
    atomic_int next;
    double e[11];
} sq_grid_job;

static void *sq_grid_worker(void *arg) {
    sq_grid_job *j = arg;
    const int64_t k = j->k, m8 = (j->m + 7) / 8 * 8;
    sq_scratch sc = {.k = k, .m = j->m, .m8 = m8};
    sc.wt = li_xcalloc((size_t)(k * m8), sizeof(float));
    sc.dots = li_xmalloc((size_t)(4 * m8) * sizeof(float));
    sc.wq = li_xmalloc((size_t)(8 * k) * sizeof(float));
    sc.xq = li_xcalloc((size_t)(4 * k), sizeof(float));
    double *s = li_xmalloc((size_t)k * sizeof(double));
    for (int g; (g = atomic_fetch_add(&j->next, 1)) <= 10;) {
        const double al = g / 10.0;
        for (int64_t i = 0; i < k; i++) s[i] = smooth_scale(j->a[i], j->w[i], al);
        j->e[g] = sq_error(j->ws, j->rows, j->n_w, s, j->x, j->nx, j->y, &sc);
    }
    free(s);
    free(sc.wt);
    free(sc.dots);
    free(sc.wq);
    free(sc.xq);
    return NULL;
}

/* The alpha of 0, 0.1, ..., 1 whose scales s_j = smooth_scale(a[j], w[j],
 * alpha) give the least sq_error (ties: the smaller alpha), the grid over
 * up to n_threads threads. */
static double sq_search(float *const *ws, const int64_t *rows, int n_w, int64_t k, const double *a, const double *w,
                        const float *x, int64_t nx, int64_t n_threads) {
    int64_t m = 0;
    for (int i = 0; i < n_w; i++) m += rows[i];
    const int64_t m8 = (m + 7) / 8 * 8;
    /* y = x W^T in double, the weights as they are */
    float *wt = li_xcalloc((size_t)(k * m8), sizeof(float)), *xq = li_xcalloc((size_t)(4 * k), sizeof(float));
    double *dots64 = li_xmalloc((size_t)(4 * m8) * sizeof(double));
    double *y = li_xmalloc((size_t)(nx * m) * sizeof(double));
    for (int i = 0, c = 0; i < n_w; i++)
        for (int64_t r = 0; r < rows[i]; r++, c++)
            for (int64_t j = 0; j < k; j++) wt[j * m8 + c] = ws[i][r * k + j];
    for (int64_t t0 = 0; t0 < nx; t0 += 4) {
        const int64_t nt = LI_MIN((int64_t)4, nx - t0);
        memcpy(xq, x + t0 * k, (size_t)(nt * k) * sizeof(float)); /* rows past nt: stale, not read */
        sq_dots_f64(wt, m8, k, xq, dots64);
        for (int64_t u = 0; u < nt; u++) memcpy(y + (t0 + u) * m, dots64 + u * m8, (size_t)m * sizeof(double));
    }
    free(wt);
    free(xq);
    free(dots64);
    sq_grid_job j = {.ws = ws, .rows = rows, .n_w = n_w, .k = k, .m = m, .nx = nx, .a = a, .w = w, .y = y, .x = x};
    atomic_init(&j.next, 0);
    li_run_workers(sq_grid_worker, &j, LI_MIN(n_threads, (int64_t)11));
    free(y);
    double best = INFINITY, best_a = 0;
    for (int g = 0; g <= 10; g++)
        if (j.e[g] < best) best = j.e[g], best_a = g / 10.0;
    return best_a;
}

/* What smooth_layer searches with: the kept rows of every site (NULL:
 * one alpha for all) and the alphas chosen, (n_layer, sites), for the log. */
typedef struct sq_search_ctx {
    const sq_rows *rows;
    double *chosen;
    int64_t n_threads;
} sq_search_ctx;

/* site st's alpha in layer l: searched, or the fixed one */
static double sq_alpha(const sq_search_ctx *sc, int l, li_calib_site st, float *const *ws, const int64_t *rows,
                       int n_w, int64_t k, const double *a, const double *w, double alpha) {
    if (!sc) return alpha;
    const int64_t i = (int64_t)l * LI_CALIB_N_SITES + st;
    const float *x = sc->rows->x[st] + (int64_t)l * LI_SQ_ROWS * k;
    return sc->chosen[i] = sq_search(ws, rows, n_w, k, a, w, x, sc->rows->n[i], sc->n_threads);
}

/* The scales go into L->in_s too (the weights' inputs are X diag(s)^-1:
 * what GPTQ's Hessian must be taken of). */
static void smooth_layer(layer_f32 *L, const li_hparams *hp, li_calib_amax *am, int l, double alpha, li_smooth mode,
                         const sq_search_ctx *sc) {
    const int64_t d = hp->n_embd, ff = hp->n_ff, hd = hp->head_dim;
    double *aw = li_xmalloc((size_t)LI_MAX(d, ff) * sizeof(double));
    double *axd = li_xmalloc((size_t)LI_MAX(LI_MAX(d, ff), L->k[W_O]) * sizeof(double));
    double al;
    double *s_qkv = li_xmalloc((size_t)d * sizeof(double)), *s_gu = li_xmalloc((size_t)d * sizeof(double));
    L->in_s[W_Q] = L->in_s[W_K] = L->in_s[W_V] = s_qkv;
    L->in_s[W_GATE] = L->in_s[W_UP] = s_gu;
    /* q/k/v: the scales into the attention norm */
    const float *ax = li_calib_amax_row(am, l, LI_CALIB_QKV);
    col_amax((float *const[]){L->w[W_Q], L->w[W_K], L->w[W_V]}, (int64_t[]){L->m[W_Q], L->m[W_K], L->m[W_V]}, 3, d, aw);
    for (int64_t j = 0; j < d; j++) axd[j] = ax[j];
    al = sq_alpha(sc, l, LI_CALIB_QKV, (float *const[]){L->w[W_Q], L->w[W_K], L->w[W_V]},
                  (int64_t[]){L->m[W_Q], L->m[W_K], L->m[W_V]}, 3, d, axd, aw, alpha);
    for (int64_t j = 0; j < d; j++) {
        const double s = s_qkv[j] = smooth_scale(ax[j], aw[j], al);
        L->attn_norm[j] = (float)(L->attn_norm[j] / s);
        for (int i = W_Q; i <= W_V; i++)
            for (int64_t r = 0; r < L->m[i]; r++) L->w[i][r * d + j] = (float)(L->w[i][r * d + j] * s);
    }
    /* gate/up: into the FFN norm */
    ax = li_calib_amax_row(am, l, LI_CALIB_GU);
    col_amax((float *const[]){L->w[W_GATE], L->w[W_UP]}, (int64_t[]){L->m[W_GATE], L->m[W_UP]}, 2, d, aw);
    for (int64_t j = 0; j < d; j++) axd[j] = ax[j];
    al = sq_alpha(sc, l, LI_CALIB_GU, (float *const[]){L->w[W_GATE], L->w[W_UP]},
                  (int64_t[]){L->m[W_GATE], L->m[W_UP]}, 2, d, axd, aw, alpha);
    for (int64_t j = 0; j < d; j++) {
        const double s = s_gu[j] = smooth_scale(ax[j], aw[j], al);
        L->ffn_norm[j] = (float)(L->ffn_norm[j] / s);
        for (int i = W_GATE; i <= W_UP; i++)
            for (int64_t r = 0; r < L->m[i]; r++) L->w[i][r * d + j] = (float)(L->w[i][r * d + j] * s);
    }
    if (mode == LI_SMOOTH_ALL) {
        /* o_proj: channel (h, c) of its input is head h's weighted sum of V
         * rows of kv head h / G, so V's output row (h / G, c) carries the
         * scale, and the G query heads sharing it must share one */
        const int G = hp->n_head / hp->n_head_kv;
        const int64_t qd = L->k[W_O];
        ax = li_calib_amax_row(am, l, LI_CALIB_O);
        double *awo = li_xmalloc((size_t)qd * sizeof(double));
        double *s_o = L->in_s[W_O] = li_xmalloc((size_t)qd * sizeof(double));
        col_amax((float *const[]){L->w[W_O]}, (int64_t[]){L->m[W_O]}, 1, qd, awo);
        /* each column reads its kv channel's maxima over the G heads */
        double *wg = li_xmalloc((size_t)qd * sizeof(double));
        for (int kvh = 0; kvh < hp->n_head_kv; kvh++)
            for (int64_t c = 0; c < hd; c++) {
                double a = 0, w = 0;
                for (int g = 0; g < G; g++) {
                    const int64_t col = (int64_t)(kvh * G + g) * hd + c;
                    a = fmax(a, ax[col]);
                    w = fmax(w, awo[col]);
                }
                for (int g = 0; g < G; g++) axd[(int64_t)(kvh * G + g) * hd + c] = a, wg[(int64_t)(kvh * G + g) * hd + c] = w;
            }
        al = sq_alpha(sc, l, LI_CALIB_O, (float *const[]){L->w[W_O]}, (int64_t[]){L->m[W_O]}, 1, qd, axd, wg, alpha);
        for (int kvh = 0; kvh < hp->n_head_kv; kvh++)
            for (int64_t c = 0; c < hd; c++) {
                const int64_t col0 = (int64_t)(kvh * G) * hd + c;
                const double s = smooth_scale(axd[col0], wg[col0], al);
                float *vrow = L->w[W_V] + ((int64_t)kvh * hd + c) * d;
                for (int64_t j = 0; j < d; j++) vrow[j] = (float)(vrow[j] / s);
                for (int g = 0; g < G; g++) {
                    const int64_t col = (int64_t)(kvh * G + g) * hd + c;
                    s_o[col] = s;
                    for (int64_t r = 0; r < L->m[W_O]; r++) L->w[W_O][r * qd + col] = (float)(L->w[W_O][r * qd + col] * s);
                }
            }
        free(awo);
        free(wg);
        /* down_proj: its input silu(gate) * up is linear in up's rows */
        ax = li_calib_amax_row(am, l, LI_CALIB_DOWN);
        col_amax((float *const[]){L->w[W_DOWN]}, (int64_t[]){L->m[W_DOWN]}, 1, ff, aw);
        for (int64_t j = 0; j < ff; j++) axd[j] = ax[j];
        al = sq_alpha(sc, l, LI_CALIB_DOWN, (float *const[]){L->w[W_DOWN]}, (int64_t[]){L->m[W_DOWN]}, 1, ff, axd, aw,
                      alpha);
        double *s_down = L->in_s[W_DOWN] = li_xmalloc((size_t)ff * sizeof(double));
        for (int64_t j = 0; j < ff; j++) {
            const double s = s_down[j] = smooth_scale(ax[j], aw[j], al);
            float *urow = L->w[W_UP] + j * d;
            for (int64_t c = 0; c < d; c++) urow[c] = (float)(urow[c] / s);
            for (int64_t r = 0; r < L->m[W_DOWN]; r++) L->w[W_DOWN][r * ff + j] = (float)(L->w[W_DOWN][r * ff + j] * s);
        }
    }
    free(aw);
    free(axd);
}

/* ------------------------------------------------------------------------
 * the run
 * ---------------------------------------------------------------------- */

typedef struct qctx {
    const li_quant_opts *o;
    li_model *m;            /* the input, loaded (weights dequantized through it) */
    out_slot *slots;        /* (n_tensors of the input) */
    li_calib_amax amax;
    bool have_amax;
    sq_rows sq;             /* --alpha-search: kept calibration rows */
    sq_search_ctx sq_ctx;
    li_q4_calib *q4cal;     /* (n_layer, LI_CALIB_N_SITES): GPTQ / AWQ statistics, or NULL */
    int64_t group;          /* 4-bit methods: the group size used (0: per channel) */
    int64_t n_threads;      /* 4-bit methods: weights of a layer quantized at once */
    /* --sequential (GPTQ): the calibration model, its blocks below the one
     * calibrated replaced by their quantized values (f32, owned here) */
    li_runtime *seq_rt;
    struct li_threadpool *calib_tp; /* calibrate_q4's X^T X accumulation */
    int seq_layer;          /* the block whose statistics are collected */
    float **seq_w;          /* (n_layer * 7) */
    int32_t *seq_win;       /* the calibration windows, tokenized once for every block's pass */
} qctx;

static float *dequant(const li_weight *w) {
    float *f = li_xmalloc((size_t)w->m * (size_t)w->k * sizeof(float));
    for (int64_t r = 0; r < w->m; r++) li_weight_dequant_row_ref(w, r, f + r * w->k);
    return f;
}

static int64_t tensor_index(const li_model *m, const char *name) {
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        if (li_str_eq(m->gguf.tensors[i].name, name)) return (int64_t)i;
    return -1;
}

/* A linear weight in the method's form. */
static int emit_linear(qctx *q, out_slot *s, const char *name, const float *f, int64_t m, int64_t k, li_error *err) {
    const li_qmethod me = q->o->method;
    if (methods[me].scheme == LI_SCHEME_PLAIN) return emit_plain(s, name, methods[me].type, f, m, k, err);
    emit_scheme(s, name, methods[me].scheme, f, m, k);
    return 0;
}

static int emit_f32(out_slot *s, const char *name, const float *f, int64_t n) {
    float *d = li_xmalloc((size_t)n * sizeof(float));
    memcpy(d, f, (size_t)n * sizeof(float));
    slot_add(s, name, LI_TYPE_F32, n, 1, d, (size_t)n * sizeof(float));
    return 0;
}

/* ------------------------------------------------------------------------
 * 4-bit methods (quant4.h): a layer's f32 weights in, u4 codes + .scale
 * (+ .zero, .perm) out
 * ---------------------------------------------------------------------- */

/* Every linear weight's row length must be a multiple of the group: else
 * say so, naming the weight, and suggest the groups that do fit. */
static int check_group(const li_model *m, int64_t group, li_error *err) {
    if (group == 0) return 0;
    if (group < 0 || group % 2)
        return li_error_set(err, LI_EINVAL, "quantize: --group must be an even number of elements (or 0: one group "
                            "per row), got %lld", (long long)group);
    int64_t g = 0;
    const char *bad = NULL;
    int64_t bad_k = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const li_layer *L = &m->layers[l];
        const li_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            int64_t a = g, b = ws[i]->k; /* g = gcd of every row length */
            while (b) {
                const int64_t t = a % b;
                a = b, b = t;
            }
            g = a;
            if (!bad && ws[i]->k % group) bad = names[i], bad_k = ws[i]->k;
        }
    }
    if (!bad) return 0;
    char sugg[96] = "";
    int n = 0;
    for (int64_t c = 32; c <= g && c <= 512 && n < 4; c += 32)
        if (g % c == 0) {
            const size_t len = strlen(sugg);
            snprintf(sugg + len, sizeof sugg - len, "%s%lld", n ? ", " : "", (long long)c), n++;
        }
    return li_error_set(err, LI_EINVAL, "quantize: --group %lld does not divide the %lld-element rows of blk.*.%s."
                        "weight: use a group that divides %lld (%s%sor 0 for one group per row)", (long long)group,
                        (long long)bad_k, bad, (long long)g, sugg, n ? ", " : "");
}

/* Rows row0 .. row0+rows of r as the weight `name` (the AWQ scale is
 * already folded upstream, so not stored). */
static int emit_q4(out_slot *s, const char *name, li_scheme scheme, const li_q4_result *r, int64_t row0,
                   int64_t rows, li_error *err) {
    const int64_t k = r->n_in, ng = r->n_groups;
    li_q4_result sub = *r;
    sub.n_out = rows;
    sub.codes = r->codes + row0 * k;
    sub.scales = r->scales + row0 * ng;
    sub.zeros = r->zeros ? r->zeros + row0 * ng : NULL;
    sub.act_scale = NULL;
    const size_t rb = (size_t)k / 2;
    uint8_t *packed = li_xmalloc(rb * (size_t)rows);
    li_weight w;
    char why[160];
    if (li_q4_weight_view(&sub, scheme, r->act, packed, &w, why, sizeof why)) {
        free(packed);
        return li_error_set(err, LI_EINVAL, "quantize: %s: %s", name, why);
    }
    char cn[160];
    slot_add(s, name, LI_TYPE_I8, (int64_t)rb, rows, packed, rb * (size_t)rows);
    const size_t nsc = (size_t)(rows * ng) * sizeof(float);
    float *sc = li_xmalloc(nsc);
    memcpy(sc, sub.scales, nsc);
    snprintf(cn, sizeof cn, "%s.scale", name);
    slot_add(s, cn, LI_TYPE_F32, ng, rows, sc, nsc);
    if (sub.zeros) {
        float *z = li_xmalloc(nsc);
        memcpy(z, sub.zeros, nsc);
        snprintf(cn, sizeof cn, "%s.zero", name);
        slot_add(s, cn, LI_TYPE_F32, ng, rows, z, nsc);
    }
    if (r->perm) {
        int32_t *p = li_xmalloc((size_t)k * sizeof(int32_t));
        memcpy(p, r->perm, (size_t)k * sizeof(int32_t));
        snprintf(cn, sizeof cn, "%s.perm", name);
        slot_add(s, cn, LI_TYPE_I32, k, 1, p, (size_t)k * sizeof(int32_t));
    }
    s->params = rows * k;
    return 0;
}

static li_q4_calib *q4cal_of(qctx *q, int l, li_calib_site site) { return &q->q4cal[l * LI_CALIB_N_SITES + site]; }

/* an li_calib_fn: the rows into the (layer, site)'s X^T X and sum |x| */
static void q4cal_collect(void *ctx, int layer, li_calib_site site, const float *x, int64_t n, int64_t k) {
    qctx *q = ctx;
    if (q->seq_rt && layer != q->seq_layer) return;
    li_q4_calib *c = q4cal_of(q, layer, site);
    if (c->n_in == k) li_q4_calib_accumulate(c, x, n);
}

/* w: (m, k) rows of weights stacked (q/k/v or gate/up, which read one input) */
static float *stack_rows(float *const *ws, const int64_t *rows, int n_w, int64_t k, int64_t *total) {
    int64_t t = 0;
    for (int i = 0; i < n_w; i++) t += rows[i];
    float *f = li_xmalloc((size_t)(t * k) * sizeof(float));
    for (int i = 0, r0 = 0; i < n_w; r0 += (int)rows[i], i++)
        memcpy(f + (int64_t)r0 * k, ws[i], (size_t)(rows[i] * k) * sizeof(float));
    *total = t;
    return f;
}

static const li_calib_site weight_site[7] = {LI_CALIB_QKV, LI_CALIB_QKV, LI_CALIB_QKV, LI_CALIB_O,
                                             LI_CALIB_GU,  LI_CALIB_GU,  LI_CALIB_DOWN};

/* AWQ on a layer. The per-input-channel scale s must go where the input is
 * made, with no op added at run time:
 * - q/k/v (one input): searched jointly on the stacked rows (one s, the sum
 *   of their output errors), 1/s into the attention RMSNorm weight;
 * - gate/up: likewise, into the FFN RMSNorm weight;
 * - down: 1/s into up's rows (silu(gate) * up is linear in up), searched
 *   first so that gate/up are then quantized with up's folded rows;
 * - o_proj: its input channel (h, c) comes from kv head h / G's v row c,
 *   so a fold into v_proj needs one s per GQA group, which the per-layer
 *   search does not give (AutoAWQ also skips o_proj under GQA): o_proj
 *   gets s = 1 (a one-point grid, a = 0) and the clipping search only. */
/* An AWQ stack: q/k/v (st 0) or gate/up (st 1) searched as one, 1/s into
 * its norm, the result split into res[first..]. */
static int awq_stack(qctx *q, int l, int st, float **w, const int64_t *m, const int64_t *k, float *norm,
                     li_q4_result *res, const li_q4_opts *qo, char *why, size_t cap) {
    static const int first[2] = {W_Q, W_GATE}, count[2] = {3, 2};
    const int i0 = first[st];
    li_q4_result r = {0};
    int64_t tot;
    float *f = stack_rows(&w[i0], &m[i0], count[st], k[i0], &tot);
    const int rc = li_q4_awq(f, tot, k[i0], q4cal_of(q, l, weight_site[i0]), qo, &r, why, cap);
    free(f);
    if (rc) return -1;
    for (int64_t j = 0; j < k[i0]; j++) norm[j] /= r.act_scale[j];
    /* split by rows: shallow copies; res[i0] owns the arrays (it points at
     * their starts), the others are views into them */
    for (int i = 0, r0 = 0; i < count[st]; r0 += (int)m[i0 + i], i++) {
        li_q4_result *d = &res[i0 + i];
        *d = r;
        d->n_out = m[i0 + i];
        d->codes = r.codes + (int64_t)r0 * r.n_in;
        d->scales = r.scales + (int64_t)r0 * r.n_groups;
        d->zeros = r.zeros ? r.zeros + (int64_t)r0 * r.n_groups : NULL;
        d->act_scale = i ? NULL : r.act_scale;
    }
    return 0;
}

/* ---- a layer's weights quantized as independent tasks over threads (the
 * quantizers are pure functions, so the bytes do not depend on the split) */

typedef struct q4_job {
    qctx *q;
    int l;
    layer_f32 *L;
    const li_q4_opts *qo;
    li_q4_result *res;     /* (7) */
    uint8_t *codes8[7];    /* w8a8 / fp8 with --gptq: each weight's codes (m, k) and scales (m) */
    float *scales8[7];
    int task[8], n_task;   /* what to run, in order of decreasing cost */
    int rc[8];
    char why[8][200];
} q4_job;

/* task t: a weight index (rtn4, w4a4, gptq), or for AWQ 7 = down, then its
 * scale into up's rows, then the gate/up stack; 8 = o_proj (clipping only:
 * s = 1 from a one-point grid) then the q/k/v stack */
static int q4_task(q4_job *j, int t, char *why, size_t cap) {
    qctx *q = j->q;
    layer_f32 *L = j->L;
    const int l = j->l;
    switch (q->o->method) {
    case LI_QMETHOD_RTN4: return li_q4_rtn(L->w[t], L->m[t], L->k[t], j->qo, &j->res[t], why, cap);
    case LI_QMETHOD_W4A4: /* --gptq: its grid rounded by GPTQ (QuaRot's W4A4 with --rotate) */
        return li_q4_w4a4(L->w[t], L->m[t], L->k[t], q->o->gptq_grid ? q4cal_of(q, l, weight_site[t]) : NULL,
                          q->o->damp, &j->res[t], why, cap);
    case LI_QMETHOD_GPTQ:
        return li_q4_gptq(L->w[t], L->m[t], L->k[t], q4cal_of(q, l, weight_site[t]), j->qo, &j->res[t], why, cap);
    default: break;
    }
    if (t == 7) {
        if (li_q4_awq(L->w[W_DOWN], L->m[W_DOWN], L->k[W_DOWN], q4cal_of(q, l, LI_CALIB_DOWN), j->qo, &j->res[W_DOWN],
                      why, cap))
            return -1;
        for (int64_t r = 0; r < L->m[W_UP]; r++) {
            const float sr = j->res[W_DOWN].act_scale[r];
            for (int64_t c = 0; c < L->k[W_UP]; c++) L->w[W_UP][r * L->k[W_UP] + c] /= sr;
        }
        return awq_stack(q, l, 1, L->w, L->m, L->k, L->ffn_norm, j->res, j->qo, why, cap);
    }
    li_q4_opts qo1 = *j->qo;
    qo1.n_grid = 1;
    if (li_q4_awq(L->w[W_O], L->m[W_O], L->k[W_O], q4cal_of(q, l, LI_CALIB_O), &qo1, &j->res[W_O], why, cap))
        return -1;
    return awq_stack(q, l, 0, L->w, L->m, L->k, L->attn_norm, j->res, j->qo, why, cap);
}

/* w8a8 / fp8 with --gptq: weight t onto the scheme's grid by GPTQ, the
 * Hessian of its (smoothed) input */
static int q8_task(q4_job *j, int t, char *why, size_t cap) {
    const layer_f32 *L = j->L;
    j->codes8[t] = li_xmalloc((size_t)(L->m[t] * L->k[t]));
    j->scales8[t] = li_xmalloc((size_t)L->m[t] * sizeof(float));
    return li_q8_gptq(L->w[t], L->m[t], L->k[t], q4cal_of(j->q, j->l, weight_site[t]), j->q->o->damp,
                      j->q->o->method == LI_QMETHOD_FP8, L->in_s[t], j->codes8[t], j->scales8[t], why, cap);
}

/* Layers quantized together: their tasks in one queue, each layer's
 * dearest first (task k of every layer, then task k + 1), so that no
 * thread idles at a layer's end while another finishes its down_proj
 * (GPTQ: its 1536-wide factorizations were the critical path of every
 * layer, 17.2 s of wall time for 20.6 s of CPU on two threads). Two
 * layers' weights in f32 at once, not one; --sequential keeps one, as
 * block l + 1 is calibrated on block l's results. */
#define LAYER_GROUP 2

typedef struct group_job {
    q4_job *j[LAYER_GROUP];
    int g[8 * LAYER_GROUP], k[8 * LAYER_GROUP], n_task; /* task i: j[g[i]]'s task k[i] */
    atomic_int next;
} group_job;

static void *group_worker(void *arg) {
    group_job *G = arg;
    for (int i; (i = atomic_fetch_add(&G->next, 1)) < G->n_task;) {
        q4_job *j = G->j[G->g[i]];
        const int k = G->k[i];
        const bool q8 = !li_qmethod_is_q4(j->q->o->method);
        j->rc[k] = (q8 ? q8_task : q4_task)(j, j->task[k], j->why[k], sizeof j->why[k]);
    }
    return NULL;
}

/* Runs the tasks of n jobs (consecutive layers) on up to n_threads threads */
static void group_run(q4_job **jobs, int n, int n_threads) {
    group_job G = {.n_task = 0};
    for (int g = 0; g < n; g++) G.j[g] = jobs[g];
    for (int k = 0; k < 8; k++)
        for (int g = 0; g < n; g++)
            if (k < jobs[g]->n_task) G.g[G.n_task] = g, G.k[G.n_task++] = k;
    atomic_init(&G.next, 0);
    if (G.n_task) li_run_workers(group_worker, &G, LI_MIN((int64_t)G.n_task, n_threads));
}

/* j's first error, naming the layer */
static int q4_job_error(const q4_job *j, li_error *err) {
    for (int i = 0; i < j->n_task; i++)
        if (j->rc[i]) return li_error_set(err, LI_EINVAL, "quantize: layer %d: %s", j->l, j->why[i]);
    return 0;
}

static const int gptq_order[7] = {W_DOWN, W_GATE, W_UP, W_Q, W_O, W_K, W_V}; /* by decreasing cost */

/* w8a8 / fp8 with --gptq: the layer's seven weights, emitted (rc: the
 * tasks' outcome so far; on an error only freed) */
static int q8_layer_end(qctx *q, q4_job *j, int rc, li_error *err) {
    if (!rc) rc = q4_job_error(j, err);
    char name[96];
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", j->l, names[i]);
        if (!rc) emit_scheme_codes(&q->slots[tensor_index(q->m, name)], name, j->codes8[i], j->scales8[i],
                                   j->L->m[i], j->L->k[i]);
        else free(j->codes8[i]), free(j->scales8[i]);
    }
    return rc;
}

/* --sequential: block l of the calibration model becomes what it was
 * quantized to (GPTQ's results in f32, its norms unchanged), so the next
 * block is calibrated on the inputs the quantized model gives it */
static int seq_swap(qctx *q, int l, const li_q4_result *res, li_error *err) {
    li_backend *be = &q->seq_rt->be;
    li_layer *ML = &q->seq_rt->model->layers[l];
    li_weight *ws[7] = {&ML->wq, &ML->wk, &ML->wv, &ML->wo, &ML->w_gate, &ML->w_up, &ML->w_down};
    for (int i = 0; i < 7; i++) {
        li_weight *w = ws[i];
        float *f = q->seq_w[l * 7 + i] = li_xmalloc((size_t)(w->m * w->k) * sizeof(float));
        li_q4_result_dequant(&res[i], f);
        if (be->ops->weight_release) be->ops->weight_release(be, w);
        *w = (li_weight){.type = LI_TYPE_F32, .k = w->k, .m = w->m, .row_bytes = (size_t)w->k * sizeof(float),
                         .data = f, .name = w->name};
        if (be->ops->weight_prepare && be->ops->weight_prepare(be, w))
            return li_error_set(err, LI_EUNSUP, "quantize: --sequential: backend %s cannot run layer %d's quantized "
                                "values as f32 weights", be->ops->name, l);
    }
    return 0;
}

/* One layer in flight: its weights in f32, the 4-bit quantizers' options
 * and results, and its tasks */
typedef struct layer_work {
    layer_f32 L;
    li_q4_opts qo;
    li_q4_result res[7];
    bool shared[7]; /* res[i]'s arrays belong to another (AWQ's stacks) */
    q4_job j;
} layer_work;

static void q4_layer_begin(qctx *q, layer_work *w) {
    const li_quant_opts *o = q->o;
    li_q4_opts_default(&w->qo);
    w->qo.group_size = q->group;
    w->qo.damp = o->damp;
    w->qo.act_order = o->act_order;
    w->qo.clip = !o->no_clip;
    w->j.qo = &w->qo;
    w->j.res = w->res;
    if (o->method == LI_QMETHOD_AWQ) {
        w->j.task[w->j.n_task++] = 7;
        w->j.task[w->j.n_task++] = 8;
        w->shared[W_K] = w->shared[W_V] = w->shared[W_UP] = true;
    } else {
        for (int i = 0; i < 7; i++) w->j.task[w->j.n_task++] = gptq_order[i];
    }
}

static int q4_layer_end(qctx *q, layer_work *w, int rc, li_error *err) {
    const int l = w->j.l;
    if (!rc) rc = q4_job_error(&w->j, err);
    if (!rc && q->seq_rt) rc = seq_swap(q, l, w->res, err);
    char name[96];
    for (int i = 0; i < 7 && !rc; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
        rc = emit_q4(&q->slots[tensor_index(q->m, name)], name, methods[q->o->method].scheme, &w->res[i], 0,
                     w->res[i].n_out, err);
    }
    for (int i = 0; i < 7; i++)
        if (!w->shared[i]) li_q4_result_free(&w->res[i]);
    return rc;
}

/* Layer l's weights in f32, smoothed where the method smooths, and its
 * tasks (none for the methods that round each weight as it is emitted) */
static void layer_begin(qctx *q, int l, layer_work *w) {
    const li_hparams *hp = &q->m->hp;
    li_layer *ML = &q->m->layers[l];
    const li_weight *ws[7] = {&ML->wq, &ML->wk, &ML->wv, &ML->wo, &ML->w_gate, &ML->w_up, &ML->w_down};
    memset(w, 0, sizeof *w);
    layer_f32 *L = &w->L;
    for (int i = 0; i < 7; i++) {
        L->w[i] = dequant(ws[i]);
        L->m[i] = ws[i]->m;
        L->k[i] = ws[i]->k;
    }
    L->attn_norm = li_xmalloc((size_t)hp->n_embd * sizeof(float));
    L->ffn_norm = li_xmalloc((size_t)hp->n_embd * sizeof(float));
    memcpy(L->attn_norm, ML->attn_norm, (size_t)hp->n_embd * sizeof(float));
    memcpy(L->ffn_norm, ML->ffn_norm, (size_t)hp->n_embd * sizeof(float));
    if (q->have_amax)
        smooth_layer(L, hp, &q->amax, l, q->o->alpha, q->o->smooth, q->o->alpha_search ? &q->sq_ctx : NULL);
    w->j = (q4_job){.q = q, .l = l, .L = L};
    if (li_qmethod_is_q4(q->o->method)) q4_layer_begin(q, w);
    else if (q->o->gptq_grid)
        for (int i = 0; i < 7; i++) w->j.task[w->j.n_task++] = gptq_order[i];
}

/* Layer l emitted after its tasks ran (rc: an earlier layer's error, when
 * not 0: then only freed), and freed */
static int layer_end(qctx *q, layer_work *w, int rc, li_error *err) {
    const li_hparams *hp = &q->m->hp;
    const int l = w->j.l;
    layer_f32 L = w->L;
    char name[96];
    if (li_qmethod_is_q4(q->o->method)) rc = q4_layer_end(q, w, rc, err);
    else if (q->o->gptq_grid) rc = q8_layer_end(q, &w->j, rc, err);
    for (int i = 0; i < 7 && !rc && !li_qmethod_is_q4(q->o->method) && !q->o->gptq_grid; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
        rc = emit_linear(q, &q->slots[tensor_index(q->m, name)], name, L.w[i], L.m[i], L.k[i], err);
    }
    snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
    if (!rc) emit_f32(&q->slots[tensor_index(q->m, name)], name, L.attn_norm, hp->n_embd);
    snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
    if (!rc) emit_f32(&q->slots[tensor_index(q->m, name)], name, L.ffn_norm, hp->n_embd);
    for (int i = 0; i < 7; i++) free(L.w[i]);
    free(L.in_s[W_Q]); /* q/k/v share one, gate/up another */
    free(L.in_s[W_GATE]);
    free(L.in_s[W_O]);
    free(L.in_s[W_DOWN]);
    free(L.attn_norm);
    free(L.ffn_norm);
    return rc;
}

/* Layers l0 .. l0 + n - 1 (n <= LAYER_GROUP), their tasks run together */
static int do_layers(qctx *q, int l0, int n, li_error *err) {
    layer_work w[LAYER_GROUP];
    q4_job *jobs[LAYER_GROUP];
    for (int g = 0; g < n; g++) {
        layer_begin(q, l0 + g, &w[g]);
        jobs[g] = &w[g].j;
    }
    group_run(jobs, n, q->n_threads);
    int rc = 0;
    for (int g = 0; g < n; g++) rc = layer_end(q, &w[g], rc, err);
    return rc;
}

/* token_embd / output: the method's type, or q8_0 under a scheme (the
 * embedding is a row lookup, and tied, the largest matmul) */
static int do_embedding(qctx *q, const li_weight *w, const char *name, li_error *err) {
    const int64_t i = tensor_index(q->m, name);
    if (i < 0) return 0;
    float *f = dequant(w);
    const li_qmethod me = q->o->method;
    const li_type ty = methods[me].scheme == LI_SCHEME_PLAIN ? methods[me].type : LI_TYPE_Q8_0;
    const int rc = emit_plain(&q->slots[i], name, ty, f, w->m, w->k, err);
    free(f);
    return rc;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Calibration over the input model: per-channel max |x| of every site. */
static int calibrate(qctx *q, li_error *err) {
    li_runtime rt;
    int rc = li_runtime_open(&rt, q->o->in, q->o->threads, "auto", err);
    if (rc) return rc;
    li_calib_amax_init(&q->amax, &rt.model->hp);
    const li_calib_opts co = {.path = q->o->calib, .samples = q->o->samples, .seq_len = q->o->seq_len};
    if (q->o->alpha_search) { /* rows spread over every window */
        const int nl = q->amax.n_layer;
        q->sq = (sq_rows){.amax = &q->amax, .n = li_xcalloc((size_t)nl * LI_CALIB_N_SITES, sizeof(int64_t)),
                          .seen = li_xcalloc((size_t)nl * LI_CALIB_N_SITES, sizeof(int64_t)),
                          .stride = LI_MAX(1, co.samples * co.seq_len / LI_SQ_ROWS)};
        for (int st = 0; st < LI_CALIB_N_SITES; st++)
            q->sq.x[st] = li_xmalloc((size_t)nl * LI_SQ_ROWS * (size_t)q->amax.k[st] * sizeof(float));
        q->sq_ctx = (sq_search_ctx){.rows = &q->sq, .chosen = li_xcalloc((size_t)nl * LI_CALIB_N_SITES, sizeof(double)),
                                    .n_threads = q->n_threads};
        rc = li_calib_run(rt.model, &rt.be, &co, sq_collect, &q->sq, err);
    } else {
        rc = li_calib_run(rt.model, &rt.be, &co, li_calib_amax_collect, &q->amax, err);
    }
    li_runtime_close(&rt);
    if (rc) {
        li_calib_amax_free(&q->amax);
        return rc;
    }
    q->have_amax = true;
    /* what SmoothQuant is for: a few channels far above the rest */
    static const char *site_names[LI_CALIB_N_SITES] = {"attention-norm output", "attention output",
                                                       "ffn-norm output", "silu(gate)*up"};
    for (int st = 0; st < LI_CALIB_N_SITES; st++) {
        const int64_t k = q->amax.k[st];
        float *tmp = li_xmalloc((size_t)k * sizeof(float));
        double worst = 0, top = 0;
        int wl = 0;
        for (int l = 0; l < q->amax.n_layer; l++) {
            memcpy(tmp, li_calib_amax_row(&q->amax, l, (li_calib_site)st), (size_t)k * sizeof(float));
            float mx = 0;
            for (int64_t j = 0; j < k; j++) mx = fmaxf(mx, tmp[j]);
            /* the median by partial selection is not worth it here: a sort of <= n_ff floats per layer */
            qsort(tmp, (size_t)k, sizeof(float), cmp_float);
            const double ratio = tmp[k / 2] > 0 ? mx / tmp[k / 2] : 0;
            if (ratio > worst) worst = ratio, wl = l, top = mx;
        }
        li_log_info("calibration: %s: largest channel max|x| %.1f is %.0fx the median channel's (layer %d)",
                    site_names[st], top, worst, wl);
        free(tmp);
    }
    return 0;
}

/* Calibration for GPTQ / AWQ: every (layer, site)'s X^T X and sum |x|. */
static int calibrate_q4(qctx *q, li_error *err) {
    const li_hparams *hp = &q->m->hp;
    const int64_t k[LI_CALIB_N_SITES] = {[LI_CALIB_QKV] = hp->n_embd, [LI_CALIB_O] = q->m->layers[0].wo.k,
                                         [LI_CALIB_GU] = hp->n_embd, [LI_CALIB_DOWN] = hp->n_ff};
    q->q4cal = li_xcalloc((size_t)hp->n_layer * LI_CALIB_N_SITES, sizeof *q->q4cal);
    /* X^T X accumulates on its own pool, between the forward pass's matmuls (NULL: on the caller) */
    if (q->n_threads > 1) q->calib_tp = li_threadpool_init(q->n_threads);
    char why[160];
    for (int l = 0; l < hp->n_layer; l++)
        for (int st = 0; st < LI_CALIB_N_SITES; st++)
            if (li_q4_calib_init(q4cal_of(q, l, (li_calib_site)st), k[st], why, sizeof why))
                return li_error_set(err, LI_ENOMEM, "quantize: calibration statistics: %s", why);
            else q4cal_of(q, l, (li_calib_site)st)->tp = q->calib_tp;
    if (q->o->sequential) /* per block, as it is quantized (seq_calibrate) */
        return 0;
    li_runtime rt;
    int rc = li_runtime_open(&rt, q->o->in, q->o->threads, "auto", err);
    if (rc) return rc;
    const li_calib_opts co = {.path = q->o->calib, .samples = q->o->samples, .seq_len = q->o->seq_len};
    li_log_info("calibration: %lld windows of %lld tokens (X^T X of every layer input)", (long long)co.samples,
                (long long)co.seq_len);
    rc = li_calib_run(rt.model, &rt.be, &co, q4cal_collect, q, err);
    li_runtime_close(&rt);
    for (int i = 0; i < hp->n_layer * LI_CALIB_N_SITES && !rc; i++)
        if (li_q4_calib_finish(&q->q4cal[i], why, sizeof why))
            rc = li_error_set(err, LI_EINVAL, "quantize: calibration: %s", why);
    return rc;
}

/* --sequential: block l's statistics from the calibration model, whose
 * blocks below l are already quantized (seq_swap); the blocks above l do
 * not multiply (li_calib_opts.n_layers) */
static int seq_calibrate(qctx *q, int l, li_error *err) {
    li_calib_opts co = {.path = q->o->calib, .samples = q->o->samples, .seq_len = q->o->seq_len, .n_layers = l + 1};
    if (!q->seq_rt) {
        q->seq_rt = li_xcalloc(1, sizeof *q->seq_rt);
        int rc = li_runtime_open(q->seq_rt, q->o->in, q->o->threads, "auto", err);
        if (rc) {
            free(q->seq_rt);
            q->seq_rt = NULL;
            return rc;
        }
        q->seq_w = li_xcalloc((size_t)q->m->hp.n_layer * 7, sizeof *q->seq_w);
        if ((rc = li_calib_windows(q->seq_rt->model, &co, "quantize", &q->seq_win, err))) return rc;
        li_log_info("calibration: %lld windows of %lld tokens per block, through the blocks quantized below it",
                    (long long)q->o->samples, (long long)q->o->seq_len);
    }
    q->seq_layer = l;
    co.windows = q->seq_win;
    int rc = li_calib_run(q->seq_rt->model, &q->seq_rt->be, &co, q4cal_collect, q, err);
    char why[160];
    for (int st = 0; st < LI_CALIB_N_SITES && !rc; st++)
        if (li_q4_calib_finish(q4cal_of(q, l, (li_calib_site)st), why, sizeof why))
            rc = li_error_set(err, LI_EINVAL, "quantize: calibration of layer %d: %s", l, why);
    return rc;
}

static void seq_free(qctx *q) {
    if (!q->seq_rt) return;
    li_runtime_close(q->seq_rt); /* gives the swapped weights back before their memory goes */
    free(q->seq_rt);
    for (int i = 0; i < q->m->hp.n_layer * 7; i++) free(q->seq_w[i]);
    free(q->seq_w);
    free(q->seq_win);
}

static void q4cal_free(qctx *q) {
    if (!q->q4cal) return;
    for (int i = 0; i < q->m->hp.n_layer * LI_CALIB_N_SITES; i++) li_q4_calib_free(&q->q4cal[i]);
    free(q->q4cal);
    q->q4cal = NULL;
}

static bool is_companion(li_str name) {
    static const char *suf[] = {".scale", ".zero", ".perm"};
    for (size_t i = 0; i < LI_ARRAY_LEN(suf); i++) {
        const size_t n = strlen(suf[i]);
        if (name.len > n && !memcmp(name.ptr + name.len - n, suf[i], n)) return true;
    }
    return false;
}

static int write_metadata(qctx *q, li_gguf_writer *w, li_error *err) {
    const li_gguf *g = &q->m->gguf;
    const li_quant_opts *o = q->o;
    int rc = 0;
    for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
        const li_gguf_kv *kv = &g->kv[i];
        if (li_str_eq(kv->key, "general.file_type") ||
            (kv->key.len >= 15 && !memcmp(kv->key.ptr, "luainfer.quant.", 15)))
            continue;
        rc = li_gguf_writer_add_kv(w, kv, err);
    }
    const li_qmethod me = o->method;
    if (!rc && methods[me].ftype) rc = li_gguf_writer_add_u32(w, "general.file_type", methods[me].ftype, err);
    if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.method", methods[me].name, err);
    if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.version", LI_QUANT_FORMAT_VERSION, err);
    if (methods[me].scheme != LI_SCHEME_PLAIN) {
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.scheme", li_scheme_name(methods[me].scheme), err);
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.group_size", (uint32_t)q->group, err); /* 0: per channel */
        const li_act_quant act = me == LI_QMETHOD_W4A4 ? LI_ACT_INT4 : li_scheme_info(methods[me].scheme)->act;
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.activations", li_act_quant_name(act), err);
    }
    if (o->gptq_grid && !rc) rc = li_gguf_writer_add_bool(w, "luainfer.quant.gptq", true, err);
    if (me == LI_QMETHOD_GPTQ || o->gptq_grid) {
        if (!rc) rc = li_gguf_writer_add_f32(w, "luainfer.quant.gptq.damp", (float)o->damp, err);
        if (!rc && !o->gptq_grid) rc = li_gguf_writer_add_bool(w, "luainfer.quant.gptq.act_order", o->act_order, err);
        if (!rc && o->sequential) rc = li_gguf_writer_add_bool(w, "luainfer.quant.gptq.sequential", true, err);
    }
    if (me == LI_QMETHOD_AWQ && !rc) rc = li_gguf_writer_add_bool(w, "luainfer.quant.awq.clip", !o->no_clip, err);
    if (q->have_amax) {
        static const char *sm[] = {"none", "norm", "all"};
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.smooth", sm[o->smooth], err);
        if (!rc && !o->alpha_search) rc = li_gguf_writer_add_f32(w, "luainfer.quant.alpha", (float)o->alpha, err);
        if (!rc && o->alpha_search) rc = li_gguf_writer_add_bool(w, "luainfer.quant.alpha_search", true, err);
    }
    if (q->q4cal || q->have_amax) { /* one calibration text for both statistics */
        char *base = strdup(o->calib);
        if (!base) abort();
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.calib.file", basename(base), err);
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.calib.samples", (uint32_t)o->samples, err);
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.calib.seq_len", (uint32_t)o->seq_len, err);
        free(base);
    }
    return rc;
}

/* --rotate: the rotated model into a temporary file beside the output, then
 * that file quantized (so calibration runs on the rotated model: GPTQ's
 * X^T X sees the rotated inputs, the online Hadamard's at down_proj) */
static int quantize_rotated(const li_quant_opts *o, li_error *err) {
    const li_qmethod me = o->method;
    if (me == LI_QMETHOD_FP8)
        return li_error_set(err, LI_EUNSUP, "quantize: --rotate does not apply to fp8: e4m3's error is relative to each "
                            "element, and rotation spreads the few large products over all (KL 0.027 -> 0.073 in "
                            "docs/quant_rotation.md)");
    if (me != LI_QMETHOD_W8A8 && me != LI_QMETHOD_F16 && me != LI_QMETHOD_BF16 && !li_qmethod_is_q4(me))
        return li_error_set(err, LI_EUNSUP, "quantize: --rotate applies to w8a8, the 4-bit methods (rtn4, awq, gptq, "
                            "w4a4) and f16 / bf16 (float copies of the rotated model), not %s", methods[me].name);
    if (o->smooth != LI_SMOOTH_NONE || o->alpha_search)
        return li_error_set(err, LI_EINVAL, "quantize: --rotate runs without SmoothQuant (--smooth none): up->down "
                            "migration cannot cross the online Hadamard, and smoothing on top does not help");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.rot.tmp.%ld", o->out, (long)getpid()) >= (int)sizeof tmp)
        return li_error_set(err, LI_EINVAL, "quantize: output path too long");
    const li_rot_opts ro = {.seed = o->rot_seed, .down_block = o->rot_block ? o->rot_block : LI_ROT_DEFAULT_BLOCK,
                            .threads = o->threads, .scratch = true};
    li_log_info("rotate: norms folded, residual Hadamard Q, online Hadamard before down_proj in blocks of %lld "
                "(seed %llu)", (long long)ro.down_block, (unsigned long long)ro.seed);
    const int guard = li_tmpguard_add(tmp); /* SIGINT / SIGTERM remove the rotated copy too */
    int rc = li_rotate_model(o->in, tmp, &ro, err);
    if (!rc) {
        li_quant_opts o2 = *o;
        o2.in = tmp;
        o2.rotate = false;
        rc = li_quantize(&o2, err);
    }
    unlink(tmp);
    li_tmpguard_release(guard);
    return rc;
}

int li_quantize(const li_quant_opts *o, li_error *err) {
    if ((unsigned)o->method >= LI_QMETHOD_COUNT) return li_error_set(err, LI_EINVAL, "quantize: bad method");
    if (o->rotate) return quantize_rotated(o, err);
    const bool grouped = li_qmethod_is_q4(o->method) && o->method != LI_QMETHOD_W4A4;
    if (o->group_set && !grouped)
        return li_error_set(err, LI_EINVAL, "quantize: --group does not apply to %s (%s)", methods[o->method].name,
                            methods[o->method].scheme == LI_SCHEME_PLAIN ? "its blocks are 32 elements"
                                                                         : "its scales are per output channel");
    if (!(o->damp > 0 && o->damp < 1) && (o->method == LI_QMETHOD_GPTQ || o->gptq_grid))
        return li_error_set(err, LI_EINVAL, "quantize: --damp must be in (0, 1), a fraction of the mean Hessian diagonal");
    if (!(o->alpha >= 0 && o->alpha <= 1)) return li_error_set(err, LI_EINVAL, "quantize: --alpha must be in [0, 1]");
    if (o->sequential && o->method != LI_QMETHOD_GPTQ)
        return li_error_set(err, LI_EINVAL, "quantize: --sequential applies to gptq (each block calibrated on the "
                                            "inputs of the blocks quantized below it), not %s", methods[o->method].name);
    qctx q = {.o = o};
    int rc = li_model_load(&q.m, o->in, err);
    if (rc) {
        if (rc == LI_EUNSUP) /* a type we cannot read */
            return li_error_set(err, LI_EUNSUP, "quantize: cannot dequantize the input: %s", err->msg);
        return rc;
    }
    const li_hparams *hp = &q.m->hp;
    const li_gguf *g = &q.m->gguf;
    /* the schemes' per-layer statistics and folds assume one FFN width */
    if (hp->n_ff_layer && (methods[o->method].scheme != LI_SCHEME_PLAIN || li_qmethod_needs_calib(o))) {
        li_model_free(q.m);
        return li_error_set(err, LI_EUNSUP, "quantize: the blocks' FFN widths differ (a non-uniformly pruned model): "
                                            "only the GGUF block types apply (q8_0, q4_0, q4_1, f16, bf16), not %s",
                            methods[o->method].name);
    }
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    q.slots = li_xcalloc((size_t)g->n_tensors, sizeof *q.slots);
    q.group = grouped ? (o->group_set ? o->group : 128) : 0;
    q.n_threads = li_threads_or_cpus(o->threads);
    if (grouped && (rc = check_group(q.m, q.group, err))) goto done;
    if (li_qmethod_needs_calib(o)) {
        const bool smooth = !li_qmethod_is_q4(o->method) && o->smooth != LI_SMOOTH_NONE && o->alpha > 0;
        if (smooth && (rc = calibrate(&q, err))) goto done;
        /* X^T X of the unsmoothed inputs: GPTQ rescales it by the smoothing */
        if ((li_qmethod_is_q4(o->method) || o->gptq_grid) && (rc = calibrate_q4(&q, err))) goto done;
    }
    li_progress pg;
    li_progress_init(&pg, "quantize", "layers/s", hp->n_layer + 1);
    if ((rc = do_embedding(&q, &q.m->tok_embd, "token_embd.weight", err))) goto done;
    if (q.m->output.data != q.m->tok_embd.data && (rc = do_embedding(&q, &q.m->output, "output.weight", err))) goto done;
    const int group = o->sequential || q.n_threads < 2 ? 1 : LAYER_GROUP;
    for (int l = 0; l < hp->n_layer; l += group) {
        const int n = LI_MIN(group, hp->n_layer - l);
        char what[48];
        if (n > 1) snprintf(what, sizeof what, "layers %d-%d/%d", l + 1, l + n, hp->n_layer);
        else snprintf(what, sizeof what, "layer %d/%d", l + 1, hp->n_layer);
        li_progress_update(&pg, l + 1, what);
        if (o->sequential && (rc = seq_calibrate(&q, l, err))) goto done;
        if ((rc = do_layers(&q, l, n, err))) goto done;
    }
    if (o->alpha_search && q.have_amax) { /* what the search chose, per site */
        static const char *sn[LI_CALIB_N_SITES] = {"q/k/v", "o", "gate/up", "down"};
        for (int st = 0; st < LI_CALIB_N_SITES; st++) {
            if (st == LI_CALIB_O || st == LI_CALIB_DOWN) { if (o->smooth != LI_SMOOTH_ALL) continue; }
            char line[400];
            int len = snprintf(line, sizeof line, "alpha search: %s:", sn[st]);
            for (int l = 0; l < hp->n_layer && len < (int)sizeof line - 8; l++)
                len += snprintf(line + len, sizeof line - (size_t)len, " %.1f", q.sq_ctx.chosen[l * LI_CALIB_N_SITES + st]);
            li_log_info("%s", line);
        }
    }
    /* everything else (output_norm, ...): as f32 when it has a to_float, else as it is */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const li_gguf_tensor *t = &g->tensors[i];
        if (q.slots[i].n || is_companion(t->name)) continue;
        char name[160];
        snprintf(name, sizeof name, "%.*s", (int)LI_MIN(t->name.len, 159), t->name.ptr);
        const li_type_traits *tr = li_type_get(t->type);
        const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (!tr || !tr->to_float || t->n_dims > 2) {
            rc = li_error_set(err, LI_EUNSUP, "quantize: cannot dequantize tensor '%s' (%s)", name,
                              li_type_name(t->type));
            goto done;
        }
        float *f = li_xmalloc((size_t)n * sizeof(float));
        tr->to_float(t->data, f, n);
        slot_add(&q.slots[i], name, LI_TYPE_F32, t->ne[0], t->ne[1], f, (size_t)n * sizeof(float));
        q.slots[i].t[0].n_dims = t->n_dims;
    }
    if ((rc = write_metadata(&q, &w, err))) goto done;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        for (int j = 0; j < q.slots[i].n && !rc; j++) {
            out_tensor *t = &q.slots[i].t[j];
            rc = li_gguf_writer_add_tensor(&w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes, err);
            t->data = NULL; /* the writer owns it now */
        }
    if (!rc) rc = li_gguf_writer_write(&w, o->out, err);
    if (!rc) li_progress_finish(&pg);
done:
    for (uint64_t i = 0; i < g->n_tensors; i++)
        for (int j = 0; j < q.slots[i].n; j++) {
            free(q.slots[i].t[j].name);
            free(q.slots[i].t[j].data);
        }
    free(q.slots);
    if (q.have_amax) li_calib_amax_free(&q.amax);
    for (int st = 0; st < LI_CALIB_N_SITES; st++) free(q.sq.x[st]);
    free(q.sq.n);
    free(q.sq.seen);
    free(q.sq_ctx.chosen);
    seq_free(&q);
    q4cal_free(&q);
    if (q.calib_tp) li_threadpool_free(q.calib_tp);
    li_gguf_writer_free(&w);
    li_model_free(q.m);
    return rc;
}
