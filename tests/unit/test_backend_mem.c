/* test_backend_mem.c — everything the forward pass and the engine touch is
 * memory the backend handed out.
 *
 * A recording backend wraps the CPU backend: it records every buffer it
 * allocates (and frees), every weight given to weight_prepare, and checks
 * that each pointer an op receives — activations, KV rows, block table,
 * batch arrays — lies inside a live buffer (weights: inside a prepared
 * weight, or one of the model's norm vectors). Run through it: a prefill and
 * decode steps (li_session), and the engine with n > 1 samples
 * (copy-on-write forks of shared blocks) under a KV budget small enough to
 * preempt. The outputs must equal the plain CPU backend's, token for token.
 *
 * The recorder also has graph ops, as a device backend would (backend.h):
 * between graph_begin and graph_end it stores each op's arguments instead
 * of running it, and graph_launch runs the stored ops. So the runs above
 * take the forward's recorded passes (padded batches, replays, recordings
 * made stale) on the CPU, and any host transfer issued while recording is
 * a violation, as it would fail on a device. */
#include "engine/engine.h"
#include "engine/session.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * the recorder
 * ---------------------------------------------------------------------- */

enum { MAX_BUFS = 256, MAX_WEIGHTS = 512 };

typedef struct {
    const char *lo;
    size_t n;
} range;

static struct {
    li_backend *inner;
    range bufs[MAX_BUFS];   /* live buffers; n == 0 and lo == NULL: a free entry */
    int n_bufs;
    range weights[MAX_WEIGHTS];
    const void *packed[MAX_WEIGHTS];
    int n_weights;
    long allocs, frees, violations, op_calls, kv_copies;
    int n_layer;           /* a KV block copy is 2 * n_layer runs (K, V per layer) */
    /* graph ops */
    bool recording;
    struct rec_graph *cur; /* the recording under way */
    long gen;              /* recordings of another generation are stale */
    long recordings, launches, padded_rows, stale_every;
    long argmax_rows;      /* greedy rows sampled through argmax */
    long topk_rows;        /* rows whose largest logits topk fetched */
    long lse_rows;         /* rows whose log-sum-exp lse computed */
    long n_vocab, get_rows, get_full; /* logits copied back: one row, or every row of a run */
    long gathered;                    /* edited ids' logits read by gather */
    long lse_scaled;                  /* rows whose lse at a temperature lse computed */
    long norm_matmuls;                /* the forward's fused norm + matmuls */
    long rope_stores;                 /* the forward's fused rope + kv_store */
} g;

/* one op's arguments, as a recording keeps them */
enum { OP_MATMUL, OP_MULTI, OP_MATMUL_ADD, OP_ROWS, OP_NORM, OP_ROPE, OP_SILU, OP_ADD, OP_HAD, OP_KV, OP_ATTN };
typedef struct {
    int kind;
    const li_weight *w[4];
    int n_w;
    const float *x, *nw, *kk, *vv;
    float *y[4], *io, *res;
    const int32_t *ids;
    const int64_t *slot;
    const li_kv_layer *kv;
    int64_t n, dim, blk;
    int i1, i2, i3, i4;
    float f1;
    li_attn_args at;
} rec_op;

typedef struct rec_graph {
    rec_op *ops;
    int n, cap;
    long gen;
} rec_graph;

/* true while recording: the op is stored, not run */
static bool record(const rec_op *o) {
    if (!g.recording) return false;
    rec_graph *r = g.cur;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        r->ops = realloc(r->ops, (size_t)r->cap * sizeof *r->ops);
    }
    r->ops[r->n++] = *o;
    return true;
}

static void violation(const char *what, const void *p, size_t n) {
    if (g.violations++ < 10) fprintf(stderr, "  outside backend memory: %s %p (+%zu bytes)\n", what, p, n);
}

static bool in(const range *r, int nr, const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < nr; i++)
        if (r[i].lo && c >= r[i].lo && c + n <= r[i].lo + r[i].n) return true;
    return false;
}

/* p[0, n) lies in a live buffer */
static void buf_check(const char *what, const void *p, size_t n) {
    if (!p || !in(g.bufs, g.n_bufs, p, n)) violation(what, p, n);
}

static void weight_check(const char *what, const li_weight *w) {
    bool ok = in(g.weights, g.n_weights, w->data, (size_t)w->m * w->row_bytes);
    if (ok && w->packed) {
        ok = false;
        for (int i = 0; i < g.n_weights; i++) ok |= g.packed[i] == w->packed;
    }
    if (!ok) violation(what, w->data, (size_t)w->m * w->row_bytes);
}

static void vec_check(const char *what, const float *w, int64_t n) {
    if (!in(g.weights, g.n_weights, w, (size_t)n * sizeof(float))) violation(what, w, (size_t)n * sizeof(float));
}

static void weight_add(const void *p, size_t n, const void *packed) {
    if (g.n_weights == MAX_WEIGHTS) return;
    g.weights[g.n_weights] = (range){p, n};
    g.packed[g.n_weights++] = packed;
}

#define F4(n) ((size_t)(n) * 4)

static int r_alloc(li_backend *be, size_t size, li_buffer *out, li_error *err) {
    if (g.recording) violation("buffer_alloc while recording", NULL, size);
    int rc = g.inner->ops->buffer_alloc(g.inner, size, out, err);
    if (rc) return rc;
    g.allocs++;
    int i = 0;
    while (i < g.n_bufs && g.bufs[i].lo) i++;
    if (i == MAX_BUFS) {
        violation("too many buffers", out->data, size);
        return 0;
    }
    g.bufs[i] = (range){out->data, size};
    if (i == g.n_bufs) g.n_bufs++;
    out->host = false; /* as a device's: nothing may read it but through the ops */
    return 0;
}

static void r_free(li_backend *be, li_buffer *b) {
    if (g.recording) violation("buffer_free while recording", b->data, 0);
    for (int i = 0; i < g.n_bufs; i++)
        if (g.bufs[i].lo == b->data && b->data) {
            g.bufs[i] = (range){NULL, 0};
            g.frees++;
            b->host = true; /* the inner backend's own */
            g.inner->ops->buffer_free(g.inner, b);
            return;
        }
    violation("free of a buffer never allocated", b->data, b->size);
}

static void r_set(li_backend *be, li_buffer *b, size_t off, const void *src, size_t n) {
    if (g.recording) violation("buffer_set while recording", b->data, 0);
    buf_check("buffer_set", (const char *)b->data + off, n);
    g.inner->ops->buffer_set(g.inner, b, off, src, n);
}

static void r_get(li_backend *be, const li_buffer *b, size_t off, void *dst, size_t n) {
    if (g.recording) violation("buffer_get while recording", b->data, 0);
    buf_check("buffer_get", (const char *)b->data + off, n);
    g.inner->ops->buffer_get(g.inner, b, off, dst, n);
    const size_t row = (size_t)g.n_vocab * sizeof(float);
    if (g.n_vocab && n == row) g.get_rows++;
    else if (g.n_vocab && n > row && n % row == 0) g.get_full++;
}

static void r_copy(li_backend *be, li_buffer *dst, const li_buffer *src, const size_t *doff, const size_t *soff,
                   int n_runs, size_t n) {
    for (int i = 0; i < n_runs; i++) {
        buf_check("buffer_copy dst", (const char *)dst->data + doff[i], n);
        buf_check("buffer_copy src", (const char *)src->data + soff[i], n);
        if (dst->data == src->data && doff[i] == soff[i]) violation("buffer_copy onto itself", dst->data, n);
    }
    if (g.recording) violation("buffer_copy while recording (its offsets are the host's)", dst->data, n);
    if (n_runs == 2 * g.n_layer) g.kv_copies++; /* a KV block */
    g.inner->ops->buffer_copy(g.inner, dst, src, doff, soff, n_runs, n);
}

static void r_clear(li_backend *be, li_buffer *b, uint8_t v) {
    if (g.recording) violation("buffer_clear while recording", b->data, 0);
    buf_check("buffer_clear", b->data, b->size);
    g.inner->ops->buffer_clear(g.inner, b, v);
}

static void r_sync(li_backend *be) {
    if (g.recording) violation("synchronize while recording", NULL, 0);
    g.inner->ops->synchronize(g.inner);
}

static void r_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    g.op_calls++;
    weight_check("matmul w", w);
    buf_check("matmul x", x, F4(n * w->k));
    buf_check("matmul y", y, F4(n * w->m));
    if (record(&(rec_op){.kind = OP_MATMUL, .w = {w}, .x = x, .y = {y}, .n = n})) return;
    g.inner->ops->matmul(g.inner, w, x, y, n);
}

static void r_matmul_multi(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                           int64_t n) {
    g.op_calls++;
    buf_check("matmul_multi x", x, F4(n * w[0]->k));
    for (int i = 0; i < n_w; i++) {
        weight_check("matmul_multi w", w[i]);
        buf_check("matmul_multi y", y[i], F4(n * w[i]->m));
    }
    rec_op o = {.kind = OP_MULTI, .n_w = n_w, .x = x, .n = n};
    for (int i = 0; i < n_w && i < 4; i++) {
        o.w[i] = w[i];
        o.y[i] = y[i];
    }
    if (n_w > 4) violation("matmul_multi of more than 4 weights", x, 0);
    if (record(&o)) return;
    g.inner->ops->matmul_multi(g.inner, w, n_w, x, y, n);
}

static void r_matmul_add(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    g.op_calls++;
    weight_check("matmul_add w", w);
    buf_check("matmul_add x", x, F4(n * w->k));
    buf_check("matmul_add y", y, F4(n * w->m));
    buf_check("matmul_add res", res, F4(n * w->m));
    if (record(&(rec_op){.kind = OP_MATMUL_ADD, .w = {w}, .x = x, .y = {y}, .res = res, .n = n})) return;
    g.inner->ops->matmul_add(g.inner, w, x, y, res, n);
}

static void r_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    g.op_calls++;
    weight_check("get_rows w", w);
    buf_check("get_rows ids", ids, F4(n));
    buf_check("get_rows out", out, F4(n * w->k));
    if (record(&(rec_op){.kind = OP_ROWS, .w = {w}, .ids = ids, .n = n, .io = out})) return;
    g.inner->ops->get_rows(g.inner, w, ids, n, out);
}

static void r_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps) {
    g.op_calls++;
    buf_check("rmsnorm x", x, F4(n * dim));
    buf_check("rmsnorm y", y, F4(n * dim));
    vec_check("rmsnorm w", w, dim);
    if (record(&(rec_op){.kind = OP_NORM, .x = x, .nw = w, .io = y, .n = n, .dim = dim, .f1 = eps})) return;
    g.inner->ops->rmsnorm(g.inner, x, w, y, n, dim, eps);
}

static void r_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int n_rot,
                   float theta, int neox) {
    g.op_calls++;
    buf_check("rope x", x, F4(n * n_heads * head_dim));
    buf_check("rope pos", pos, F4(n));
    if (record(&(rec_op){.kind = OP_ROPE, .io = x, .ids = pos, .n = n, .i1 = n_heads, .i2 = head_dim, .i3 = n_rot,
                         .f1 = theta, .i4 = neox}))
        return;
    g.inner->ops->rope(g.inner, x, pos, n, n_heads, head_dim, n_rot, theta, neox);
}

static void r_silu_mul(li_backend *be, float *gg, const float *u, int64_t n, int64_t dim) {
    g.op_calls++;
    buf_check("silu_mul g", gg, F4(n * dim));
    buf_check("silu_mul u", u, F4(n * dim));
    if (record(&(rec_op){.kind = OP_SILU, .io = gg, .x = u, .n = n, .dim = dim})) return;
    g.inner->ops->silu_mul(g.inner, gg, u, n, dim);
}

/* norm_matmul as the three ops it stands for, each checked and recorded:
 * the forward's fused call issues what it promises */
static void r_norm_matmul(li_backend *be, const float *x, const float *nw, float eps, float *h,
                          const li_weight *const *w, int n_w, float *const *y, int64_t n, bool swiglu) {
    g.norm_matmuls++;
    if (swiglu && (n_w != 2 || w[0]->m != w[1]->m)) violation("norm_matmul swiglu of unequal weights", x, 0);
    r_rmsnorm(be, x, nw, h, n, w[0]->k, eps);
    if (g.inner->ops->matmul_multi) r_matmul_multi(be, w, n_w, h, y, n);
    else
        for (int i = 0; i < n_w; i++) r_matmul(be, w[i], h, y[i], n);
    if (swiglu) r_silu_mul(be, y[0], y[1], n, w[0]->m);
}

static void r_add(li_backend *be, float *y, const float *x, int64_t n) {
    g.op_calls++;
    buf_check("add y", y, F4(n));
    buf_check("add x", x, F4(n));
    if (record(&(rec_op){.kind = OP_ADD, .io = y, .x = x, .n = n})) return;
    g.inner->ops->add(g.inner, y, x, n);
}

static size_t kv_es(li_type t) { return t == LI_TYPE_F32 ? 4 : t == LI_TYPE_F16 || t == LI_TYPE_BF16 ? 2 : 1; }

/* the K and V rows (and scales) of cache slot `slot` */
static void slot_check(const char *what, const li_kv_layer *kv, int64_t slot, int nkv, int hd) {
    const size_t row = (size_t)nkv * hd * kv_es(kv->dtype);
    buf_check(what, (const char *)kv->k + (size_t)slot * row, row);
    buf_check(what, (const char *)kv->v + (size_t)slot * row, row);
    if (kv->k_scale) {
        buf_check(what, kv->k_scale + (size_t)slot * nkv, F4(nkv));
        buf_check(what, kv->v_scale + (size_t)slot * nkv, F4(nkv));
    }
}

/* The rows a graph backend stores: those with a slot (a padded batch's
 * padding rows come last, slot -1). */
static void kv_store_rows(const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot, int64_t n,
                          int nkv, int hd) {
    int64_t m = 0;
    while (m < n && slot[m] >= 0) m++;
    for (int64_t i = m; i < n; i++)
        if (slot[i] >= 0) violation("a stored row after a padding row", slot + i, 8);
    g.padded_rows += n - m;
    if (m) g.inner->ops->kv_store(g.inner, kv, k, v, slot, m, nkv, hd);
}

static void r_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                       int64_t n, int nkv, int hd) {
    g.op_calls++;
    buf_check("kv_store k", k, F4(n * nkv * hd));
    buf_check("kv_store v", v, F4(n * nkv * hd));
    buf_check("kv_store slot", slot, (size_t)n * 8);
    for (int64_t i = 0; i < n; i++)
        if (slot[i] >= 0) slot_check("kv_store row", kv, slot[i], nkv, hd);
    if (record(&(rec_op){.kind = OP_KV, .kv = kv, .kk = k, .vv = v, .slot = slot, .n = n, .i1 = nkv, .i2 = hd}))
        return;
    kv_store_rows(kv, k, v, slot, n, nkv, hd);
}

static void r_hadamard(li_backend *be, float *x, const float *sg, int64_t n, int64_t dim, int64_t block) {
    g.op_calls++;
    buf_check("hadamard x", x, F4(n * dim));
    if (record(&(rec_op){.kind = OP_HAD, .io = x, .nw = sg, .n = n, .dim = dim, .blk = block})) return;
    g.inner->ops->hadamard(g.inner, x, sg, n, dim, block);
}

/* greedy ids where the logits are (sampler.h's rule, computed here by the
 * sampler itself over the host memory the buffer really is) */
static void r_argmax(li_backend *be, const float *x, int64_t n, int64_t dim, int32_t *out) {
    g.op_calls++;
    buf_check("argmax x", x, F4(n * dim));
    buf_check("argmax out", out, F4(n));
    if (g.recording) violation("argmax while recording", x, 0);
    li_sampling_params p;
    li_sampling_params_default(&p);
    p.temperature = 0;
    li_sampler s;
    li_error err = {0};
    if (li_sampler_init(&s, &p, (int32_t)dim, &err)) {
        violation("argmax: sampler", x, 0);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = li_sampler_sample(&s, x + i * dim, NULL, NULL);
    li_sampler_free(&s);
    g.argmax_rows += n;
}

/* each row's k largest (test_util.h's full sort), NaN rows flagged */
static void r_topk(li_backend *be, const float *x, int64_t n, int64_t dim, int k, float *vals, int32_t *ids) {
    g.op_calls++;
    buf_check("topk x", x, F4(n * dim));
    buf_check("topk vals", vals, F4(n * k));
    buf_check("topk ids", ids, F4(n * k));
    if (g.recording) violation("topk while recording", x, 0);
    t_topk_ref(x, n, dim, k, vals, ids);
    g.topk_rows += n;
}

/* the raw logits at flat indices */
static void r_gather(li_backend *be, const float *x, const int64_t *idx, int64_t n, float *out) {
    (void)be;
    buf_check("gather idx", idx, (size_t)n * sizeof *idx);
    buf_check("gather out", out, F4(n));
    if (g.recording) violation("gather while recording", x, 0);
    for (int64_t i = 0; i < n; i++) out[i] = x[idx[i]];
    g.gathered += n;
}

/* each row's log-sum-exp: the sampler's own (li_sampler_lse) */
static void r_lse(li_backend *be, const float *x, int64_t n, int64_t dim, const float *scale, float *out) {
    g.op_calls++;
    buf_check("lse x", x, F4(n * dim));
    buf_check("lse out", out, F4(n));
    if (scale) buf_check("lse scale", scale, F4(n));
    if (g.recording) violation("lse while recording", x, 0);
    for (int64_t i = 0; i < n; i++)
        out[i] = li_sampler_lse_scaled(x + i * dim, (int32_t)dim, scale ? (double)scale[i] : 1.0);
    g.lse_rows += n;
    g.lse_scaled += scale ? n : 0;
}

/* ---- graph ops ---- */

static int r_graph_begin(li_backend *be) {
    if (g.recording) violation("graph_begin while recording", NULL, 0);
    g.cur = calloc(1, sizeof *g.cur);
    g.cur->gen = g.gen;
    g.recording = true;
    return 0;
}

static void *r_graph_end(li_backend *be) {
    if (!g.recording) violation("graph_end without graph_begin", NULL, 0);
    g.recording = false;
    g.recordings++;
    rec_graph *r = g.cur;
    g.cur = NULL;
    return r;
}

static void r_graph_launch(li_backend *be, void *gp) {
    if (g.recording) violation("graph_launch while recording", gp, 0);
    const rec_graph *r = gp;
    const li_backend_ops *in = g.inner->ops;
    li_backend *ib = g.inner;
    for (int i = 0; i < r->n; i++) {
        const rec_op *o = &r->ops[i];
        switch (o->kind) {
        case OP_MATMUL: in->matmul(ib, o->w[0], o->x, o->y[0], o->n); break;
        case OP_MULTI: in->matmul_multi(ib, o->w, o->n_w, o->x, o->y, o->n); break;
        case OP_MATMUL_ADD: in->matmul_add(ib, o->w[0], o->x, o->y[0], o->res, o->n); break;
        case OP_ROWS: in->get_rows(ib, o->w[0], o->ids, o->n, o->io); break;
        case OP_NORM: in->rmsnorm(ib, o->x, o->nw, o->io, o->n, o->dim, o->f1); break;
        case OP_ROPE: in->rope(ib, o->io, o->ids, o->n, o->i1, o->i2, o->i3, o->f1, o->i4); break;
        case OP_SILU: in->silu_mul(ib, o->io, o->x, o->n, o->dim); break;
        case OP_ADD: in->add(ib, o->io, o->x, o->n); break;
        case OP_HAD: in->hadamard(ib, o->io, o->nw, o->n, o->dim, o->blk); break;
        case OP_KV: kv_store_rows(o->kv, o->kk, o->vv, o->slot, o->n, o->i1, o->i2); break;
        case OP_ATTN: in->attention(ib, &o->at); break;
        }
    }
    /* every stale_every-th launch makes the recordings so far stale, as a
     * device backend's grown scratch would */
    if (g.stale_every && ++g.launches % g.stale_every == 0) g.gen++;
    else if (!g.stale_every) g.launches++;
}

static bool r_graph_valid(li_backend *be, const void *gp) { return ((const rec_graph *)gp)->gen == g.gen; }

static void r_graph_free(li_backend *be, void *gp) {
    rec_graph *r = gp;
    free(r->ops);
    free(r);
}

static void r_attention(li_backend *be, const li_attn_args *a) {
    g.op_calls++;
    const int64_t n = a->n_tokens;
    buf_check("attention q", a->q, F4(n * a->n_head * a->head_dim));
    buf_check("attention out", a->out, F4(n * a->n_head * a->head_dim));
    buf_check("attention pos", a->pos, F4(n));
    buf_check("attention seq", a->seq, F4(n));
    for (int64_t i = 0; i < n; i++) {
        const int32_t *bt = li_attn_blocks(a, i);
        const int64_t nb = a->pos[i] / a->block_size + 1;
        buf_check("attention block table row", bt, F4(nb));
        for (int64_t b = 0; b < nb; b++)
            for (int s = 0; s < a->block_size; s += a->block_size - 1 > 0 ? a->block_size - 1 : 1)
                slot_check("attention KV block", a->kv, (int64_t)bt[b] * a->block_size + s, a->n_head_kv,
                           a->head_dim);
    }
    if (record(&(rec_op){.kind = OP_ATTN, .at = *a})) return;
    g.inner->ops->attention(g.inner, a);
}

/* rope_store as the three ops it stands for (rope on q, on k, kv_store) */
static void r_rope_store(li_backend *be, float *q, float *k, const float *v, const int32_t *pos, int64_t n, int hq,
                         int hk, int hd, int n_rot, float theta, int neox, const li_kv_layer *kv,
                         const int64_t *slot) {
    g.rope_stores++;
    r_rope(be, q, pos, n, hq, hd, n_rot, theta, neox);
    r_rope(be, k, pos, n, hk, hd, n_rot, theta, neox);
    r_kv_store(be, kv, k, v, slot, n, hk, hd);
}

static int r_weight_prepare(li_backend *be, li_weight *w) {
    int rc = g.inner->ops->weight_prepare ? g.inner->ops->weight_prepare(g.inner, w) : 0;
    weight_add(w->data, (size_t)w->m * w->row_bytes, w->packed);
    return rc;
}

static void r_weight_release(li_backend *be, li_weight *w) {
    if (g.inner->ops->weight_release) g.inner->ops->weight_release(g.inner, w);
}

static li_backend_ops rec_ops;

static void recorder_init(li_backend *rec, li_backend *inner) {
    memset(&g, 0, sizeof g);
    g.inner = inner;
    rec_ops = *inner->ops;
    rec_ops.name = "recording";
    rec_ops.buffer_alloc = r_alloc;
    rec_ops.buffer_free = r_free;
    rec_ops.buffer_wrap = NULL;
    rec_ops.buffer_set = r_set;
    rec_ops.buffer_get = r_get;
    rec_ops.buffer_copy = r_copy;
    rec_ops.buffer_clear = r_clear;
    rec_ops.synchronize = r_sync;
    rec_ops.matmul = r_matmul;
    rec_ops.matmul_multi = inner->ops->matmul_multi ? r_matmul_multi : NULL;
    rec_ops.matmul_add = inner->ops->matmul_add ? r_matmul_add : NULL;
    rec_ops.get_rows = r_get_rows;
    rec_ops.rmsnorm = r_rmsnorm;
    rec_ops.rope = r_rope;
    rec_ops.silu_mul = r_silu_mul;
    rec_ops.norm_matmul = r_norm_matmul;
    rec_ops.rope_store = r_rope_store;
    rec_ops.add = r_add;
    rec_ops.kv_store = r_kv_store;
    rec_ops.attention = r_attention;
    rec_ops.weight_prepare = r_weight_prepare;
    rec_ops.weight_release = r_weight_release;
    rec_ops.hadamard = inner->ops->hadamard ? r_hadamard : NULL;
    rec_ops.argmax = r_argmax;
    rec_ops.topk = r_topk;
    rec_ops.lse = r_lse;
    rec_ops.gather = r_gather;
    rec_ops.graph_begin = r_graph_begin;
    rec_ops.graph_end = r_graph_end;
    rec_ops.graph_launch = r_graph_launch;
    rec_ops.graph_valid = r_graph_valid;
    rec_ops.graph_free = r_graph_free;
    *rec = (li_backend){.ops = &rec_ops, .n_threads = inner->n_threads};
}

/* The norm vectors are the model's own f32 arrays: registered as weights. */
static void register_norms(const li_model *m) {
    const size_t d = (size_t)m->hp.n_embd * sizeof(float);
    weight_add(m->output_norm, d, NULL);
    for (int l = 0; l < m->hp.n_layer; l++) {
        weight_add(m->layers[l].attn_norm, d, NULL);
        weight_add(m->layers[l].ffn_norm, d, NULL);
    }
}

/* ------------------------------------------------------------------------
 * scenarios
 * ---------------------------------------------------------------------- */

/* Prefill in chunks, then decode a few tokens greedily; writes the tokens. */
static int run_session(li_model *m, li_backend *be, const int32_t *prompt, int64_t n, int32_t *out, int n_out) {
    li_error err = {0};
    li_session s;
    if (li_session_init(&s, m, be, 256, LI_TYPE_F16, 8, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    int rc = li_session_eval(&s, prompt, n, false, logits, &err);
    for (int t = 0; !rc && t < n_out; t++) {
        int32_t best = 0;
        for (int32_t j = 1; j < m->hp.n_vocab; j++)
            if (logits[j] > logits[best]) best = j;
        out[t] = best;
        rc = li_session_eval(&s, &best, 1, false, logits, &err);
    }
    if (rc) fprintf(stderr, "%s\n", err.msg);
    free(logits);
    li_session_free(&s);
    return rc;
}

enum { N_REQ = 4, N_SAMPLES = 3, N_SEQS = N_REQ + N_SAMPLES - 1, MAX_TOK = 24 };

typedef struct {
    int64_t ids[N_REQ];
    int32_t toks[N_SEQS][MAX_TOK];
    int64_t n_toks[N_SEQS];
    int64_t preemptions, dev_sampled, dev_undecided;
    uint64_t lp_hash; /* every token event's logprob and top alternatives, hashed */
    int64_t lp_events;
} engine_out;

static void lp_event(void *ud, const li_event *ev) {
    engine_out *o = ud;
    if (ev->kind != LI_EVENT_TOKEN || ev->token < 0) return;
    uint64_t h = o->lp_hash ^ (uint64_t)ev->id;
    const unsigned char *p = (const unsigned char *)&ev->logprob;
    for (size_t i = 0; i < sizeof ev->logprob; i++) h = (h ^ p[i]) * 1099511628211ull;
    p = (const unsigned char *)ev->top;
    for (size_t i = 0; ev->top && i < (size_t)ev->n_top * sizeof *ev->top; i++) h = (h ^ p[i]) * 1099511628211ull;
    o->lp_hash = h;
    o->lp_events++;
}

/* The engine under a KV budget of 14 blocks of 8 tokens: four requests of
 * ~30-token prompts and 24 new tokens each, one of them drawing 3 samples
 * (forked blocks, copied on write), cannot all stay resident. */
/* "greedy": request 0 greedy with logprobs, 1 greedy (its 3 samples too), 2
 * at temperature 1 and top_p 0.9 alone (from the 64 largest and the row's
 * lse, or its logits), 3 at temperature 0.8, top_k 40 with a repetition
 * penalty (its window's logits gathered beside the candidates) */
static int run_engine(li_model *m, li_backend *be, const int32_t *prompt, int64_t n, engine_out *o, bool greedy) {
    li_error err = {0};
    li_engine_config c;
    li_engine_config_default(&c);
    c.block_size = 8;
    c.max_num_seqs = 8;
    c.max_batched_tokens = 32;
    c.prefix_caching = false;
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    c.kv_memory = li_kv_bytes_per_token(&dims, c.kv_dtype) * 8 * 14;
    li_engine *e;
    if (li_engine_init(&e, m, be, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    memset(o, 0, sizeof *o);
    for (int r = 0; r < N_REQ; r++) {
        li_request_params p = {.prompt = prompt + r, .n_prompt = n - r, .max_tokens = MAX_TOK, .ignore_eos = true,
                               .n = r == 1 ? N_SAMPLES : 1};
        li_sampling_params_default(&p.sampling);
        p.sampling.seed = 42 + (uint64_t)r;
        if (greedy) p.sampling.temperature = 0;
        if (greedy && r == 2) { /* temperature and top-p alone: the 64 largest and the row's lse, or the logits */
            p.min_tokens = 6;
            p.sampling.temperature = 1.0f;
            p.sampling.top_k = 0;
            p.sampling.top_p = 0.9f;
        }
        if (greedy && r == 3) p.sampling.temperature = 0.8f; /* llama.cpp's defaults, top_k 40: from the candidates */
        if (greedy && r == 0) p.sampling.n_logprobs = 3;        /* logprobs from the candidates and the row's lse */
        if (greedy && r == 3) p.sampling.repeat_penalty = 1.3f; /* its rows read their logits, the others' not */
        if (greedy && r == 3) p.sampling.logprob = true;
        p.on_event = lp_event;
        p.ud = o;
        if (li_engine_add(e, &p, &o->ids[r], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            li_engine_free(e);
            return -1;
        }
    }
    int rc = 0;
    for (int guard = 0; !rc && li_engine_has_work(e) && guard < 10000; guard++) rc = li_engine_step(e, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    /* the samples' ids follow their parent's (engine.h) */
    int k = 0;
    for (int r = 0; r < N_REQ; r++)
        for (int s = 0; s < (r == 1 ? N_SAMPLES : 1); s++, k++) {
            const li_request_result *res = li_engine_result(e, o->ids[r] + s);
            if (!res) continue;
            o->n_toks[k] = LI_MIN(res->n_tokens, (int64_t)MAX_TOK);
            memcpy(o->toks[k], res->tokens, (size_t)o->n_toks[k] * sizeof(int32_t));
        }
    li_engine_stats st;
    li_engine_stats_get(e, &st);
    o->preemptions = st.preemptions;
    o->dev_sampled = st.tokens_device_sampled;
    o->dev_undecided = st.tokens_device_undecided;
    li_engine_free(e);
    return rc;
}

/* Decode steps of 5 sequences at once, from position 0, straight through
 * li_forward (5 rows: padded to the size class 6 on a graph backend); the
 * logits of every step into out (steps, 5, n_vocab). */
enum { B5 = 5, B5_STEPS = 6 };
static int run_batch5(li_model *m, li_backend *be, float *out) {
    li_error err = {0};
    li_kv_cache kv;
    li_forward fw;
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    if (li_kv_cache_init(&kv, be, &dims, LI_TYPE_F16, 4, 32, &err) || li_forward_init(&fw, m, be, 8, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    li_kv_seq sq[B5];
    int32_t table[B5 * 4], tok[B5], pos[B5], seq[B5], rows[B5];
    int64_t slot[B5];
    for (int s = 0; s < B5; s++) {
        li_kv_seq_init(&sq[s]);
        li_kv_seq_reserve(&kv, &sq[s], 16);
        memcpy(table + 4 * s, sq[s].blocks, (size_t)sq[s].n_blocks * sizeof *table);
    }
    int rc = 0;
    for (int t = 0; !rc && t < B5_STEPS; t++) {
        for (int s = 0; s < B5; s++) {
            tok[s] = 100 + 37 * s + 11 * t;
            pos[s] = t;
            seq[s] = s;
            rows[s] = s;
            slot[s] = li_kv_seq_slot(&kv, &sq[s], t);
        }
        li_batch b = {.n = B5, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .block_table = table,
                      .n_seqs = B5, .bt_stride = 4, .logit_rows = rows, .n_logits = B5};
        rc = li_forward_run(&fw, m, be, &kv, &b, out + (size_t)t * B5 * (size_t)m->hp.n_vocab, &err);
    }
    if (rc) fprintf(stderr, "%s\n", err.msg);
    /* one row of the last step's logits at a time: what the run returned,
     * each a single row's transfer from device memory */
    if (!rc) {
        const size_t nv = (size_t)m->hp.n_vocab;
        const float *lg = out + (size_t)(B5_STEPS - 1) * B5 * nv;
        const long rows0 = g.get_rows;
        bool ok = li_forward_logits_row(&fw, m, B5) == NULL && li_forward_logits_row(&fw, m, -1) == NULL;
        for (int r = 4; r >= 0; r -= 3) {
            const float *row = li_forward_logits_row(&fw, m, r);
            ok &= row && !memcmp(row, lg + r * nv, nv * sizeof(float)) && row == li_forward_logits_row(&fw, m, r);
        }
        CHECK(ok, "li_forward_logits_row: rows 4 and 1 as the run returned them, none past the run's");
        if (!fw.logits.host) CHECK(g.get_rows - rows0 == 2, "device logits: one row's transfer a row (%ld)",
                                   g.get_rows - rows0);
    }
    /* sampling where the logits are: on host memory the caller reads them;
     * k out of [1, LI_TOPK_MAX] is refused; the ids match the logits' argmax */
    if (!rc) {
        int32_t ids[B5 * (LI_TOPK_MAX + 1)], am[B5];
        float vals[B5 * (LI_TOPK_MAX + 1)], lse[B5];
        li_error e2 = {0};
        const bool dev = be->ops->topk && !fw.logits.host;
        if (!dev) {
            CHECK(li_forward_topk(&fw, m, &(li_logit_fetch){.k = 4, .vals = vals, .ids = ids}, &e2) == LI_EUNSUP &&
                      li_forward_argmax(&fw, m, am, &e2) == LI_EUNSUP,
                  "host logits: topk and argmax refused (%s)", e2.msg);
        } else {
            const int64_t nv = m->hp.n_vocab, bad_idx = B5 * nv;
            float gv[7], sc[B5] = {1.0f / 0.7f, 1.0f, 2.0f, 0.5f, 1.0f / 1.3f}, lse_t[B5];
            CHECK(li_forward_topk(&fw, m, &(li_logit_fetch){.k = 0, .vals = vals, .ids = ids}, &e2) == LI_EINVAL &&
                      li_forward_topk(&fw, m, &(li_logit_fetch){.k = LI_TOPK_MAX + 1, .vals = vals, .ids = ids},
                                      &e2) == LI_EINVAL &&
                      li_forward_topk(&fw, m,
                                      &(li_logit_fetch){.k = 3, .vals = vals, .ids = ids, .gidx = &bad_idx,
                                                        .n_gather = 1, .gout = gv},
                                      &e2) == LI_EINVAL,
                  "topk of 0 or %d logits, a gather past the logits refused (%s)", LI_TOPK_MAX + 1, e2.msg);
            const int64_t gidx[7] = {0, nv - 1, nv, 3 * nv + 17, 4 * nv + 5, 2 * nv + 9, 0};
            const li_logit_fetch q = {.k = 3, .vals = vals, .ids = ids, .lse = lse, .lse_scale = sc, .lse_t = lse_t,
                                      .gidx = gidx, .n_gather = 7, .gout = gv};
            CHECK(li_forward_topk(&fw, m, &q, &e2) == 0 && li_forward_argmax(&fw, m, am, &e2) == 0,
                  "topk, lse, lse at temperatures, gather and argmax of the last step: %s", e2.msg[0] ? e2.msg : "ran");
            const float *lg = out + (size_t)(B5_STEPS - 1) * B5 * (size_t)m->hp.n_vocab;
            bool ok = true;
            for (int r = 0; r < B5; r++) {
                const float *row = lg + (size_t)r * m->hp.n_vocab;
                ok &= ids[r * 3] == am[r] && vals[r * 3] == row[am[r]] && vals[r * 3 + 1] <= vals[r * 3] &&
                      lse[r] == li_sampler_lse(row, m->hp.n_vocab) &&
                      lse_t[r] == li_sampler_lse_scaled(row, m->hp.n_vocab, sc[r]);
            }
            for (int i = 0; i < 7; i++) ok &= gv[i] == lg[gidx[i]];
            CHECK(ok, "each row's top-3 starts at its argmax, falls, its lse (and at its temperature) is the "
                  "sampler's, the gathered logits are the run's");
        }
    }
    for (int s = 0; s < B5; s++) {
        li_kv_seq_release(&kv, &sq[s]);
        li_kv_seq_free(&sq[s]);
    }
    li_forward_free(&fw);
    li_kv_cache_free(&kv);
    return rc;
}

/* Resident bytes of this process (/proc/self/statm), or -1. */
static long long resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = -1, rss = -1;
    if (f) {
        if (fscanf(f, "%lld %lld", &pages, &rss) != 2) rss = -1;
        fclose(f);
    }
    return rss < 0 ? -1 : rss * 4096;
}

/* Host buffers are zero-filled whatever their size; large ones (a KV cache
 * sized for the whole context) are mapped and become resident only where
 * written. Odd sizes on both sides of the mapping threshold. */
static void test_host_buffers(li_backend *be) {
    li_error err = {0};
    const size_t sizes[] = {0, 1, 63, 4097, LI_HOST_BUFFER_MAP_MIN - 1, LI_HOST_BUFFER_MAP_MIN + 65,
                            ((size_t)96 << 20) + 13};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        li_buffer b;
        const long long before = resident_bytes();
        CHECK(li_buffer_alloc(be, sizes[i], &b, &err) == 0 && (sizes[i] == 0 || b.data), "%zu bytes: %s", sizes[i],
              err.msg);
        if (!b.data) continue;
        const long long after = resident_bytes();
        CHECK(((uintptr_t)b.data % LI_HOST_BUFFER_ALIGN) == 0, "%zu bytes: aligned", sizes[i]);
        size_t nonzero = 0;
        for (size_t j = 0; j < sizes[i]; j += 4093) nonzero += ((const unsigned char *)b.data)[j] != 0;
        if (sizes[i]) nonzero += ((const unsigned char *)b.data)[sizes[i] - 1] != 0;
        CHECK(nonzero == 0, "%zu bytes: zero-filled (%zu bytes were not)", sizes[i], nonzero);
        if (sizes[i] > ((size_t)64 << 20)) {
#if defined(__SANITIZE_ADDRESS__)
            printf("SKIP: resident size of a large buffer (ASan: host buffers come from malloc, all touched)\n");
            (void)before;
            (void)after;
#else
            CHECK(before > 0 && after - before < (8ll << 20),
                  "96 MiB allocated: %lld KiB resident more (touched only where written)", (after - before) >> 10);
#endif
        }
        memset(b.data, 0x5a, sizes[i]);
        be->ops->buffer_clear(be, &b, 0);
        nonzero = 0;
        for (size_t j = 0; j < sizes[i]; j++) nonzero += ((const unsigned char *)b.data)[j] != 0;
        CHECK(nonzero == 0, "%zu bytes: written, then cleared", sizes[i]);
        li_buffer_free(be, &b);
        CHECK(!b.data && !b.size && !b.mapped, "%zu bytes: freed and zeroed", sizes[i]);
    }
}

int main(void) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(NULL), &err) != 0) {
        printf("SKIP: model not loadable (%s)\n", err.msg);
        return 77;
    }
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 100 + (i * 7919) % 20000;

    li_backend cpu, rec;
    CHECK(li_backend_cpu_init(&cpu, 2, "auto", &err) == 0, "%s", err.msg);
    CHECK(li_backend_check(&cpu, &err) == 0, "cpu backend has the buffer interface: %s", err.msg);
    li_backend bad = {.ops = &(li_backend_ops){.api_version = LI_BACKEND_API_VERSION - 1, .name = "old"}};
    CHECK(li_backend_check(&bad, &err) == LI_EUNSUP && strstr(err.msg, "API version"),
          "a backend of another API version is refused: %s", err.msg);
    li_buffer nb;
    CHECK(li_buffer_alloc(&bad, 64, &nb, &err) == LI_EUNSUP && !nb.data, "no buffer from a refused backend");
    test_host_buffers(&cpu);

    /* the reference outputs: the plain CPU backend */
    CHECK(li_model_prepare(m, &cpu, &err) == 0, "%s", err.msg);
    int32_t want[8], got[8];
    CHECK(run_session(m, &cpu, prompt, 30, want, 8) == 0, "session on cpu");
    engine_out ew, eg;
    CHECK(run_engine(m, &cpu, prompt, 30, &ew, false) == 0, "engine on cpu");
    engine_out gw, gg;
    CHECK(run_engine(m, &cpu, prompt, 30, &gw, true) == 0, "greedy engine on cpu");
    const size_t n5 = (size_t)B5_STEPS * B5 * (size_t)m->hp.n_vocab;
    float *l5_want = malloc(n5 * sizeof(float)), *l5_got = malloc(n5 * sizeof(float));
    CHECK(run_batch5(m, &cpu, l5_want) == 0, "5 sequences on cpu");
    li_model_release(m, &cpu);

    /* the same through the recorder (weights prepared through it) */
    recorder_init(&rec, &cpu);
    CHECK(li_model_prepare(m, &rec, &err) == 0, "%s", err.msg);
    register_norms(m);
    g.n_layer = m->hp.n_layer;
    g.n_vocab = m->hp.n_vocab;

    CHECK(run_session(m, &rec, prompt, 30, got, 8) == 0, "session through the recorder");
    printf("prefill + decode: %ld ops, %ld buffers allocated, %ld freed, %ld violations\n", g.op_calls, g.allocs,
           g.frees, g.violations);
    CHECK(g.op_calls > 100 && g.allocs >= 4, "the session ran through the recorder (%ld ops, %ld buffers)", g.op_calls,
          g.allocs);
    CHECK(g.violations == 0, "prefill and decode touched only backend memory (%ld violations)", g.violations);
    CHECK(g.norm_matmuls >= 2L * m->hp.n_layer, "the forward asked norm_matmul for both norms of every block (%ld "
          "calls)", g.norm_matmuls);
    CHECK(g.rope_stores >= m->hp.n_layer, "the forward asked rope_store for every block (%ld calls)", g.rope_stores);
    CHECK(g.allocs == g.frees, "every buffer freed (%ld of %ld)", g.frees, g.allocs);
    CHECK(!memcmp(want, got, sizeof want), "the same tokens as the plain CPU backend");
    printf("session: %ld recordings, %ld launches\n", g.recordings, g.launches);
    CHECK(g.recordings >= 1 && g.launches >= 5, "decode steps replayed a recorded pass (%ld recordings, %ld launches)",
          g.recordings, g.launches);

    const long ops0 = g.op_calls;
    g.violations = 0;
    CHECK(run_engine(m, &rec, prompt, 30, &eg, false) == 0, "engine through the recorder");
    printf("engine: %ld ops, %ld KV block copies, %lld preemptions, %ld violations\n", g.op_calls - ops0,
           g.kv_copies, (long long)eg.preemptions, g.violations);
    CHECK(eg.preemptions > 0, "the tiny KV budget preempted (%lld)", (long long)eg.preemptions);
    CHECK(g.kv_copies > 0, "the forked samples copied shared blocks on write (%ld)", g.kv_copies);
    CHECK(g.violations == 0, "fork, copy-on-write and preemption touched only backend memory (%ld violations)",
          g.violations);
    CHECK(g.allocs == g.frees, "every buffer freed (%ld of %ld)", g.frees, g.allocs);
    bool same = ew.preemptions == eg.preemptions;
    for (int k = 0; k < N_SEQS; k++)
        same &= ew.n_toks[k] == MAX_TOK && eg.n_toks[k] == ew.n_toks[k] &&
                !memcmp(ew.toks[k], eg.toks[k], sizeof(int32_t) * (size_t)ew.n_toks[k]);
    CHECK(same, "the engine's tokens equal the plain CPU backend's");
    printf("engine: %ld recordings, %ld launches, %ld padding rows\n", g.recordings, g.launches, g.padded_rows);

    /* greedy: steps whose every row is plain greedy sample through argmax,
     * the logits never read back */
    g.violations = 0;
    g.argmax_rows = 0;
    g.get_rows = g.get_full = g.gathered = 0;
    CHECK(run_engine(m, &rec, prompt, 30, &gg, true) == 0, "greedy engine through the recorder");
    printf("greedy engine: %ld rows sampled by argmax, %ld by topk, %ld violations; %lld tokens from candidates, "
           "%lld rows undecided; logits read back: %ld single rows, %ld whole runs; %ld gathered\n", g.argmax_rows,
           g.topk_rows, g.violations, (long long)gg.dev_sampled, (long long)gg.dev_undecided, g.get_rows, g.get_full,
           g.gathered);
    CHECK(gg.dev_undecided > 0 && gg.dev_sampled > MAX_TOK * 3 && g.get_rows >= gg.dev_undecided && g.get_full == 0,
          "rows the candidates could not decide read their logits alone (%ld rows for %lld), the others sampled "
          "from candidates (%lld)", g.get_rows, (long long)gg.dev_undecided, (long long)gg.dev_sampled);
    CHECK(g.gathered >= MAX_TOK, "the penalized request's window read by gather (%ld logits)", g.gathered);
    same = gw.preemptions == gg.preemptions;
    for (int k = 0; k < N_SEQS; k++)
        same &= gw.n_toks[k] == MAX_TOK && gg.n_toks[k] == gw.n_toks[k] &&
                !memcmp(gw.toks[k], gg.toks[k], sizeof(int32_t) * (size_t)gw.n_toks[k]);
    CHECK(same && g.violations == 0, "greedy rows sampled where the logits are: the CPU's tokens");
    CHECK(g.argmax_rows > 10 && g.topk_rows > 20 && g.lse_rows > 10,
          "steps sampled through argmax (%ld rows) and topk (%ld rows, %ld with their lse)", g.argmax_rows, g.topk_rows,
          g.lse_rows);
    CHECK(gg.lp_events == gw.lp_events && gg.lp_hash == gw.lp_hash,
          "logprobs reported from the candidates and the row's lse: the CPU's, bit for bit (%lld token events)",
          (long long)gg.lp_events);

    const long pad0 = g.padded_rows, launch0 = g.launches;
    g.violations = 0;
    CHECK(run_batch5(m, &rec, l5_got) == 0, "5 sequences through the recorder");
    printf("5 sequences: %ld padding rows, %ld launches\n", g.padded_rows - pad0, g.launches - launch0);
    CHECK(g.padded_rows - pad0 == (long)B5_STEPS * m->hp.n_layer && g.launches - launch0 == B5_STEPS - 1,
          "5 rows padded to 6 at every step and layer; recorded at the second step, then replayed");
    CHECK(!memcmp(l5_want, l5_got, n5 * sizeof(float)) && g.violations == 0,
          "a padded, replayed batch: the same logits, bit for bit");
    free(l5_want);
    free(l5_got);

    /* recordings made stale every third launch: the forward records again */
    const long rec0 = g.recordings;
    g.stale_every = 3;
    engine_out es;
    g.violations = 0;
    CHECK(run_engine(m, &rec, prompt, 30, &es, false) == 0, "engine through the recorder, recordings going stale");
    printf("stale every 3 launches: %ld recordings, %ld launches, %ld violations\n", g.recordings - rec0, g.launches,
           g.violations);
    same = es.preemptions == ew.preemptions;
    for (int k = 0; k < N_SEQS; k++)
        same &= es.n_toks[k] == ew.n_toks[k] && !memcmp(ew.toks[k], es.toks[k], sizeof(int32_t) * (size_t)ew.n_toks[k]);
    CHECK(same && g.violations == 0, "stale recordings: the same tokens (%ld violations)", g.violations);
    CHECK(g.recordings - rec0 > 5, "stale recordings were recorded again (%ld)", g.recordings - rec0);
    g.stale_every = 0;

    li_model_release(m, &rec);
    li_backend_cpu_free(&cpu);
    li_model_free(m);
    return t_summary("backend_mem");
}
