/* quantize.c — `luainfer quantize` (quantize.h). Owns: the per-tensor
 * requantization, SmoothQuant's migration, the output's metadata keys and
 * the order tensors are written in (the input's). */
#define _GNU_SOURCE
#include "quant/quantize.h"
#include "quant/calib.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "runtime/runtime.h"
#include "util/progress.h"

#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

int li_qmethod_parse(const char *s, li_qmethod *out, li_error *err) {
    for (int i = 0; i < LI_QMETHOD_COUNT; i++)
        if (s && !strcmp(s, methods[i].name)) {
            *out = (li_qmethod)i;
            return 0;
        }
    static const char *later[] = {"awq", "gptq", "w4a4", "rtn4"};
    for (size_t i = 0; i < LI_ARRAY_LEN(later); i++)
        if (s && !strcmp(s, later[i]))
            return li_error_set(err, LI_EUNSUP, "quantize: method '%s' is not built yet (issue 14, 4-bit part)", s);
    return li_error_set(err, LI_EINVAL,
                        "quantize: unknown method '%s' (expected f16, bf16, q8_0, q4_0, q4_1, w8a8 or fp8)",
                        s ? s : "");
}

const char *li_qmethod_name(li_qmethod m) { return (unsigned)m < LI_QMETHOD_COUNT ? methods[m].name : "unknown"; }

bool li_qmethod_needs_calib(const li_quant_opts *o) {
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
    out_tensor t[2];   /* the tensor, and its scales for a scheme weight */
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
    char sname[160];
    snprintf(sname, sizeof sname, "%s.scale", name);
    slot_add(s, name, LI_TYPE_I8, k, m, codes, (size_t)m * (size_t)k);
    slot_add(s, sname, LI_TYPE_F32, 1, m, scales, (size_t)m * sizeof(float));
    s->params = m * k;
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
} layer_f32;

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN };

static void smooth_layer(layer_f32 *L, const li_hparams *hp, li_calib_amax *am, int l, double alpha, li_smooth mode) {
    const int64_t d = hp->n_embd, ff = hp->n_ff, hd = hp->head_dim;
    double *aw = li_xmalloc((size_t)LI_MAX(d, ff) * sizeof(double));
    /* q/k/v: the scales into the attention norm */
    const float *ax = li_calib_amax_row(am, l, LI_CALIB_QKV);
    col_amax((float *const[]){L->w[W_Q], L->w[W_K], L->w[W_V]}, (int64_t[]){L->m[W_Q], L->m[W_K], L->m[W_V]}, 3, d, aw);
    for (int64_t j = 0; j < d; j++) {
        const double s = smooth_scale(ax[j], aw[j], alpha);
        L->attn_norm[j] = (float)(L->attn_norm[j] / s);
        for (int i = W_Q; i <= W_V; i++)
            for (int64_t r = 0; r < L->m[i]; r++) L->w[i][r * d + j] = (float)(L->w[i][r * d + j] * s);
    }
    /* gate/up: into the FFN norm */
    ax = li_calib_amax_row(am, l, LI_CALIB_GU);
    col_amax((float *const[]){L->w[W_GATE], L->w[W_UP]}, (int64_t[]){L->m[W_GATE], L->m[W_UP]}, 2, d, aw);
    for (int64_t j = 0; j < d; j++) {
        const double s = smooth_scale(ax[j], aw[j], alpha);
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
        col_amax((float *const[]){L->w[W_O]}, (int64_t[]){L->m[W_O]}, 1, qd, awo);
        for (int kvh = 0; kvh < hp->n_head_kv; kvh++)
            for (int64_t c = 0; c < hd; c++) {
                double a = 0, w = 0;
                for (int g = 0; g < G; g++) {
                    const int64_t col = (int64_t)(kvh * G + g) * hd + c;
                    a = fmax(a, ax[col]);
                    w = fmax(w, awo[col]);
                }
                const double s = smooth_scale(a, w, alpha);
                float *vrow = L->w[W_V] + ((int64_t)kvh * hd + c) * d;
                for (int64_t j = 0; j < d; j++) vrow[j] = (float)(vrow[j] / s);
                for (int g = 0; g < G; g++) {
                    const int64_t col = (int64_t)(kvh * G + g) * hd + c;
                    for (int64_t r = 0; r < L->m[W_O]; r++) L->w[W_O][r * qd + col] = (float)(L->w[W_O][r * qd + col] * s);
                }
            }
        free(awo);
        /* down_proj: its input silu(gate) * up is linear in up's rows */
        ax = li_calib_amax_row(am, l, LI_CALIB_DOWN);
        col_amax((float *const[]){L->w[W_DOWN]}, (int64_t[]){L->m[W_DOWN]}, 1, ff, aw);
        for (int64_t j = 0; j < ff; j++) {
            const double s = smooth_scale(ax[j], aw[j], alpha);
            float *urow = L->w[W_UP] + j * d;
            for (int64_t c = 0; c < d; c++) urow[c] = (float)(urow[c] / s);
            for (int64_t r = 0; r < L->m[W_DOWN]; r++) L->w[W_DOWN][r * ff + j] = (float)(L->w[W_DOWN][r * ff + j] * s);
        }
    }
    free(aw);
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

static int do_layer(qctx *q, int l, li_error *err) {
    const li_hparams *hp = &q->m->hp;
    li_layer *ML = &q->m->layers[l];
    const li_weight *ws[7] = {&ML->wq, &ML->wk, &ML->wv, &ML->wo, &ML->w_gate, &ML->w_up, &ML->w_down};
    static const char *names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    layer_f32 L = {0};
    for (int i = 0; i < 7; i++) {
        L.w[i] = dequant(ws[i]);
        L.m[i] = ws[i]->m;
        L.k[i] = ws[i]->k;
    }
    L.attn_norm = li_xmalloc((size_t)hp->n_embd * sizeof(float));
    L.ffn_norm = li_xmalloc((size_t)hp->n_embd * sizeof(float));
    memcpy(L.attn_norm, ML->attn_norm, (size_t)hp->n_embd * sizeof(float));
    memcpy(L.ffn_norm, ML->ffn_norm, (size_t)hp->n_embd * sizeof(float));
    if (q->have_amax) smooth_layer(&L, hp, &q->amax, l, q->o->alpha, q->o->smooth);
    int rc = 0;
    char name[96];
    for (int i = 0; i < 7 && !rc; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
        rc = emit_linear(q, &q->slots[tensor_index(q->m, name)], name, L.w[i], L.m[i], L.k[i], err);
    }
    snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
    if (!rc) emit_f32(&q->slots[tensor_index(q->m, name)], name, L.attn_norm, hp->n_embd);
    snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
    if (!rc) emit_f32(&q->slots[tensor_index(q->m, name)], name, L.ffn_norm, hp->n_embd);
    for (int i = 0; i < 7; i++) free(L.w[i]);
    free(L.attn_norm);
    free(L.ffn_norm);
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
    rc = li_calib_run(rt.model, &rt.be, &co, li_calib_amax_collect, &q->amax, err);
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
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.group_size", 0, err); /* per channel */
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.activations",
                                             li_act_quant_name(li_scheme_info(methods[me].scheme)->act), err);
    }
    if (q->have_amax) {
        static const char *sm[] = {"none", "norm", "all"};
        char *base = strdup(o->calib);
        if (!base) abort();
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.smooth", sm[o->smooth], err);
        if (!rc) rc = li_gguf_writer_add_f32(w, "luainfer.quant.alpha", (float)o->alpha, err);
        if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.quant.calib.file", basename(base), err);
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.calib.samples", (uint32_t)o->samples, err);
        if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.quant.calib.seq_len", (uint32_t)o->seq_len, err);
        free(base);
    }
    return rc;
}

int li_quantize(const li_quant_opts *o, li_error *err) {
    if ((unsigned)o->method >= LI_QMETHOD_COUNT) return li_error_set(err, LI_EINVAL, "quantize: bad method");
    if (o->group)
        return li_error_set(err, LI_EINVAL, "quantize: --group does not apply to %s (%s)", methods[o->method].name,
                            methods[o->method].scheme == LI_SCHEME_PLAIN ? "its blocks are 32 elements"
                                                                         : "its scales are per output channel");
    if (!(o->alpha >= 0 && o->alpha <= 1)) return li_error_set(err, LI_EINVAL, "quantize: --alpha must be in [0, 1]");
    qctx q = {.o = o};
    int rc = li_model_load(&q.m, o->in, err);
    if (rc) {
        if (rc == LI_EUNSUP) /* a type we cannot read */
            return li_error_set(err, LI_EUNSUP, "quantize: cannot dequantize the input: %s", err->msg);
        return rc;
    }
    const li_hparams *hp = &q.m->hp;
    const li_gguf *g = &q.m->gguf;
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    q.slots = li_xcalloc((size_t)g->n_tensors, sizeof *q.slots);
    if (li_qmethod_needs_calib(o) && (rc = calibrate(&q, err))) goto done;
    li_progress pg;
    li_progress_init(&pg, "quantize", "layers/s", hp->n_layer + 1);
    if ((rc = do_embedding(&q, &q.m->tok_embd, "token_embd.weight", err))) goto done;
    if (q.m->output.data != q.m->tok_embd.data && (rc = do_embedding(&q, &q.m->output, "output.weight", err))) goto done;
    for (int l = 0; l < hp->n_layer; l++) {
        char what[32];
        snprintf(what, sizeof what, "layer %d/%d", l + 1, hp->n_layer);
        li_progress_update(&pg, l + 1, what);
        if ((rc = do_layer(&q, l, err))) goto done;
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
    li_gguf_writer_free(&w);
    li_model_free(q.m);
    return rc;
}
