/* calib.c — the capture backend and the calibration run (calib.h). */
#include "quant/calib.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "util/progress.h"
#include "util/utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * the capture backend (calib.h): three ops wrapped
 * ---------------------------------------------------------------------- */

typedef li_calib_backend calib_backend;

/* Which layer and site reads through weight w; -1 for others (output). */
static int site_of(const li_model *m, const li_weight *w, li_calib_site *site) {
    for (int l = 0; l < m->hp.n_layer; l++) {
        const li_layer *L = &m->layers[l];
        if (w == &L->wq || w == &L->wk || w == &L->wv) *site = LI_CALIB_QKV;
        else if (w == &L->wo) *site = LI_CALIB_O;
        else if (w == &L->w_gate || w == &L->w_up) *site = LI_CALIB_GU;
        else if (w == &L->w_down) *site = LI_CALIB_DOWN;
        else continue;
        return l;
    }
    return -1;
}

/* hands x to fn; false when w's block is past n_layers (the matmul is skipped) */
static bool report(calib_backend *c, const li_weight *w, const float *x, int64_t n) {
    if (!c->fn && c->n_layers <= 0) return true;
    li_calib_site site;
    const int l = site_of(c->m, w, &site);
    if (c->n_layers > 0 && l >= c->n_layers) return false;
    if (c->fn && l >= 0) c->fn(c->ctx, l, site, x, n, w->k);
    return true;
}

static void cap_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    calib_backend *c = (calib_backend *)be;
    if (report(c, w, x, n)) c->real->matmul(be, w, x, y, n);
    else memset(y, 0, (size_t)(n * w->m) * sizeof(float));
}

static void cap_matmul_multi(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                             int64_t n) {
    calib_backend *c = (calib_backend *)be;
    if (!report(c, w[0], x, n)) { /* one input, read by all n_w */
        for (int i = 0; i < n_w; i++) memset(y[i], 0, (size_t)(n * w[i]->m) * sizeof(float));
        return;
    }
    if (c->real->matmul_multi) c->real->matmul_multi(be, w, n_w, x, y, n);
    else for (int i = 0; i < n_w; i++) c->real->matmul(be, w[i], x, y[i], n);
}

static void cap_matmul_add(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    calib_backend *c = (calib_backend *)be;
    if (!report(c, w, x, n)) { /* y = 0, res unchanged */
        memset(y, 0, (size_t)(n * w->m) * sizeof(float));
        return;
    }
    if (c->real->matmul_add) {
        c->real->matmul_add(be, w, x, y, res, n);
        return;
    }
    c->real->matmul(be, w, x, y, n);
    c->real->add(be, res, y, n * w->m);
}

void li_calib_backend_init(li_calib_backend *cb, const li_backend *real, const li_model *m, li_calib_fn fn, void *ctx) {
    *cb = (li_calib_backend){.be = *real, .real = real->ops, .m = m, .fn = fn, .ctx = ctx};
    cb->ops = *real->ops;
    cb->ops.matmul = cap_matmul;
    cb->ops.matmul_multi = cap_matmul_multi;
    cb->ops.matmul_add = cap_matmul_add;
    cb->be.ops = &cb->ops;
}

/* ------------------------------------------------------------------------
 * the run
 * ---------------------------------------------------------------------- */

int li_calib_windows(const li_model *m, const li_calib_opts *o, const char *who, int32_t **win, li_error *err) {
    *win = NULL;
    if (!o->path) return li_error_set(err, LI_EINVAL, "%s: this method needs a calibration text (--calib FILE)", who);
    if (o->samples <= 0 || o->seq_len < 2)
        return li_error_set(err, LI_EINVAL, "%s: --samples must be >= 1 and --seq-len >= 2", who);
    if (o->seq_len > m->hp.n_ctx_train)
        return li_error_set(err, LI_ERANGE, "%s: --seq-len %lld exceeds the model's context %d", who,
                            (long long)o->seq_len, m->hp.n_ctx_train);
    char *text = NULL;
    size_t len = 0;
    int rc = li_read_text(o->path, (size_t)1 << 30, "calibration file", &text, &len, err);
    if (rc) return rc;
    if (len == 0) {
        free(text);
        return li_error_set(err, LI_EINVAL, "%s: calibration file '%s' is empty", who, o->path);
    }
    int32_t *toks = NULL;
    size_t n_tok = 0;
    rc = li_tokenizer_encode(m->tok, text, len, false, false, &toks, &n_tok, err);
    free(text);
    if (rc) return rc;
    const size_t need = (size_t)o->samples * (size_t)o->seq_len;
    if (n_tok < need) {
        free(toks);
        return li_error_set(err, LI_EINVAL,
                            "%s: calibration file '%s' is too short: %zu tokens, --samples %lld x --seq-len %lld "
                            "needs %zu",
                            who, o->path, n_tok, (long long)o->samples, (long long)o->seq_len, need);
    }
    /* the windows are consecutive: the first `need` tokens, each window
     * starting with BOS when the model adds one */
    if (li_tokenizer_add_bos(m->tok) && li_tokenizer_bos(m->tok) >= 0)
        for (int64_t i = 0; i < o->samples; i++) toks[i * o->seq_len] = li_tokenizer_bos(m->tok);
    *win = toks;
    return 0;
}

int li_calib_run(li_model *m, li_backend *be, const li_calib_opts *o, li_calib_fn fn, void *ctx, li_error *err) {
    int32_t *own = NULL;
    int rc = o->windows ? 0 : li_calib_windows(m, o, "quantize", &own, err);
    if (rc) return rc;
    const int32_t *toks = o->windows ? o->windows : own;
    calib_backend cb;
    li_calib_backend_init(&cb, be, m, fn, ctx);
    cb.n_layers = o->n_layers;
    li_session s;
    if ((rc = li_session_init(&s, m, &cb.be, o->seq_len, LI_TYPE_F32, LI_MIN(o->seq_len, 512), err))) {
        free(own);
        return rc;
    }
    float *logits = li_xmalloc((size_t)m->hp.n_vocab * sizeof(float));
    int32_t *win = li_xmalloc((size_t)o->seq_len * sizeof *win);
    li_progress pg;
    li_progress_init(&pg, "calibrate", "samples/s", o->samples);
    for (int64_t i = 0; i < o->samples && !rc; i++) {
        memcpy(win, toks + i * o->seq_len, (size_t)o->seq_len * sizeof *win);
        li_session_reset(&s);
        rc = li_session_eval(&s, win, o->seq_len, false, logits, err);
        li_progress_update(&pg, i + 1, "samples");
    }
    if (!rc) li_progress_finish(&pg);
    li_session_free(&s);
    free(win);
    free(logits);
    free(own);
    return rc;
}

/* ------------------------------------------------------------------------
 * per-channel max |x|
 * ---------------------------------------------------------------------- */

void li_calib_amax_init(li_calib_amax *a, const li_hparams *hp) {
    memset(a, 0, sizeof *a);
    a->n_layer = hp->n_layer;
    a->k[LI_CALIB_QKV] = a->k[LI_CALIB_GU] = hp->n_embd;
    a->k[LI_CALIB_O] = (int64_t)hp->n_head * hp->head_dim;
    a->k[LI_CALIB_DOWN] = hp->n_ff;
    for (int s = 0; s < LI_CALIB_N_SITES; s++) {
        a->off[s] = a->per_layer;
        a->per_layer += (size_t)a->k[s];
    }
    a->amax = li_xcalloc(a->per_layer * (size_t)hp->n_layer, sizeof(float));
}

void li_calib_amax_free(li_calib_amax *a) {
    free(a->amax);
    memset(a, 0, sizeof *a);
}

float *li_calib_amax_row(li_calib_amax *a, int layer, li_calib_site site) {
    return a->amax + (size_t)layer * a->per_layer + a->off[site];
}

void li_calib_amax_collect(void *ctx, int layer, li_calib_site site, const float *x, int64_t n, int64_t k) {
    li_calib_amax *a = ctx;
    if (layer < 0 || layer >= a->n_layer || k != a->k[site]) return;
    float *mx = li_calib_amax_row(a, layer, site);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) mx[j] = fmaxf(mx[j], fabsf(x[r * k + j]));
    if (layer == 0 && site == LI_CALIB_QKV) a->rows += n;
}
