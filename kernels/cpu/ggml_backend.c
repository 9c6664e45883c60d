/* ggml_backend.c — the CPU backend with llama.cpp's arithmetic (isa "ggml").
 *
 * `--isa ggml` reproduces llama.cpp's x86 CPU results bit for bit on the
 * types llama.cpp multiplies with its plain vec_dot (Q4_1, Q8_0 weights; an
 * F16 KV cache), to check an output against llama.cpp's or to reproduce
 * one. It reads the GGUF rows as they are (no repacking) and splits only the
 * matmuls and attention over threads; each output is still computed whole by
 * one thread, so the thread count never changes a result. What does change
 * one, as in llama.cpp, is whether the batch has one token or more
 * (attention's summation order, ggml_kernels.h). Other weight types and
 * 8-bit KV caches use luainfer's reference ops. */
#define _GNU_SOURCE
#include "util/common.h"
#include "cpu/ggml_kernels.h"
#include "cpu/cpu_kernels.h"
#include "cpu/kv_kernels.h"
#include "cpu/threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef float (*qdot_fn)(int64_t k, const void *w, const void *a);
typedef void (*qdot4_fn)(int64_t k, const void *w, const void *a, size_t a_stride, int nr, float *out);

typedef struct li_ggml {
    li_threadpool *tp;
    int n_threads;
    bool avx2;
    void *act;           /* quantized activation rows, act_cap bytes */
    size_t act_cap;
    float **scratch;     /* (n_threads) attention scratch, scratch_cap floats each */
    size_t scratch_cap;
} li_ggml;

static const li_backend_ops ggml_ops;

static li_ggml *ggml_of(li_backend *be) { return be->impl; }

/* ------------------------------------------------------------------------
 * matmul: quantize each activation row once, then (16 weight rows x all
 * activation rows) items taken from a counter
 * ---------------------------------------------------------------------- */

typedef struct {
    const li_weight *w;
    const char *act;
    size_t act_row;
    float *y;
    int64_t n;
    qdot_fn dot;
    qdot4_fn dot4; /* NULL: dot one row at a time */
    atomic_int_fast64_t next;
} mm_job;

#define MM_ROWS 16

static void mm_work(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    mm_job *j = p;
    const int64_t m = j->w->m, k = j->w->k;
    const int64_t items = (m + MM_ROWS - 1) / MM_ROWS;
    for (int64_t t; (t = atomic_fetch_add(&j->next, 1)) < items;) {
        const int64_t i1 = LI_MIN(m, (t + 1) * MM_ROWS);
        if (j->dot4) {
            for (int64_t r = 0; r < j->n; r += 4) {
                const int nr = (int)LI_MIN((int64_t)4, j->n - r);
                for (int64_t i = t * MM_ROWS; i < i1; i++) {
                    float o[4];
                    j->dot4(k, (const char *)j->w->data + i * j->w->row_bytes, j->act + r * j->act_row, j->act_row,
                            nr, o);
                    for (int q = 0; q < nr; q++) j->y[(r + q) * m + i] = o[q];
                }
            }
            continue;
        }
        for (int64_t r = 0; r < j->n; r++)
            for (int64_t i = t * MM_ROWS; i < i1; i++)
                j->y[r * m + i] = j->dot(k, (const char *)j->w->data + i * j->w->row_bytes, j->act + r * j->act_row);
    }
}

static void ggml_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    li_ggml *g = ggml_of(be);
    void (*quantize)(const float *, void *, int64_t);
    qdot_fn dot;
    qdot4_fn dot4;
    size_t block;
    bool widen = false; /* Q4_1 with dot4: rows of li_ggml_q8_1f */
    if (w->scheme != LI_SCHEME_PLAIN) li_type_unreachable("cpu ggml: matmul of a scheme weight", w->type);
    switch (w->type) {
    case LI_TYPE_Q4_1:
        quantize = g->avx2 ? li_ggml_quantize_q8_1_avx2 : li_ggml_quantize_q8_1;
        dot = li_ggml_dot_q4_1_q8_1_ref;
        dot4 = g->avx2 ? li_ggml_dot4_q4_1_q8_1_avx2 : NULL;
        widen = dot4 != NULL;
        block = widen ? sizeof(li_ggml_q8_1f) : sizeof(li_block_q8_1);
        break;
    case LI_TYPE_Q8_0:
        quantize = g->avx2 ? li_ggml_quantize_q8_0_avx2 : li_ggml_quantize_q8_0;
        dot = li_ggml_dot_q8_0_q8_0_ref;
        dot4 = g->avx2 ? li_ggml_dot4_q8_0_q8_0_avx2 : NULL;
        block = sizeof(li_block_q8_0);
        break;
    case LI_TYPE_Q4_0: /* llama.cpp repacks Q4_0 and has its own paths for these: our reference */
    case LI_TYPE_Q8_1:
    case LI_TYPE_F32:
    case LI_TYPE_F16:
    case LI_TYPE_BF16: li_backend_ref_ops()->matmul(be, w, x, y, n); return;
    default: li_type_unreachable("cpu ggml: matmul", w->type); /* ggml_weight_prepare refuses the rest */
    }
    const size_t act_row = (size_t)(w->k / 32) * block;
    const size_t q_row = (size_t)(w->k / 32) * sizeof(li_block_q8_1); /* room to quantize one row before widening */
    const size_t need = act_row * (size_t)n + (widen ? q_row : 0);
    if (need > g->act_cap) {
        free(g->act);
        g->act_cap = need;
        g->act = li_xmalloc(g->act_cap);
    }
    char *qtmp = (char *)g->act + act_row * (size_t)n;
    for (int64_t r = 0; r < n; r++) {
        char *row = (char *)g->act + r * act_row;
        if (widen) {
            quantize(x + r * w->k, qtmp, w->k);
            li_ggml_widen_q8_1(qtmp, (li_ggml_q8_1f *)row, w->k);
        } else {
            quantize(x + r * w->k, row, w->k);
        }
    }
    mm_job j = {.w = w, .act = g->act, .act_row = act_row, .y = y, .n = n, .dot = dot, .dot4 = dot4};
    atomic_init(&j.next, 0);
    const int64_t items = (w->m + MM_ROWS - 1) / MM_ROWS;
    li_threadpool_run(g->tp, mm_work, &j, (int)LI_MIN((int64_t)g->n_threads, items));
}

/* ------------------------------------------------------------------------
 * attention: (token, kv head group) items, or (token, head) when few
 * ---------------------------------------------------------------------- */

typedef struct {
    const li_attn_args *a;
    float **scratch;
    int gemm;
    int group; /* heads per item: a kv head's whole group, or 1 when items would be too few */
    void (*heads)(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch);
    atomic_int_fast64_t next;
} attn_job;

static void attn_work(void *p, int ith, int nth) {
    (void)nth;
    attn_job *j = p;
    const int per_tok = j->a->n_head / j->group;
    const int64_t items = j->a->n_tokens * per_tok;
    for (int64_t t; (t = atomic_fetch_add(&j->next, 1)) < items;)
        j->heads(j->a, t / per_tok, (int)(t % per_tok) * j->group, j->group, j->gemm, j->scratch[ith]);
}

static void ggml_attention(li_backend *be, const li_attn_args *a) {
    li_ggml *g = ggml_of(be);
    const int G = a->n_head / a->n_head_kv;
    if (li_kv_is_8bit(a->kv->dtype) || a->head_dim > 256 || G > 64) {
        li_backend_ref_ops()->attention(be, a);
        return;
    }
    /* a group per item when that still gives every thread a few items */
    const int group = a->n_tokens * a->n_head_kv >= 4 * (int64_t)g->n_threads ? G : 1;
    int64_t max_pos = 0;
    for (int64_t i = 0; i < a->n_tokens; i++) max_pos = LI_MAX(max_pos, (int64_t)a->pos[i]);
    const size_t need = li_ggml_attn_scratch(max_pos, group);
    if (need > g->scratch_cap) {
        for (int t = 0; t < g->n_threads; t++) {
            free(g->scratch[t]);
            g->scratch[t] = li_xmalloc(need * sizeof(float));
        }
        g->scratch_cap = need;
    }
    /* llama.cpp hands a batch of 2+ tokens to tinyBLAS, one token to vec_dot */
    attn_job j = {.a = a, .scratch = g->scratch, .gemm = a->n_tokens >= 2, .group = group,
                  .heads = g->avx2 ? li_ggml_attn_heads_avx2 : li_ggml_attn_heads};
    atomic_init(&j.next, 0);
    li_threadpool_run(g->tp, attn_work, &j,
                      (int)LI_MIN((int64_t)g->n_threads, a->n_tokens * (a->n_head / group)));
}

/* ------------------------------------------------------------------------
 * per-row ops
 * ---------------------------------------------------------------------- */

static void ggml_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim,
                         float eps) {
    (void)be;
    for (int64_t r = 0; r < n; r++) li_ggml_rmsnorm_row(x + r * dim, w, y + r * dim, dim, eps);
}

static void ggml_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int n_rot,
                      float theta, int neox) {
    float cs[512];
    if (n_rot > 512) { /* no such model; keep the op correct anyway */
        li_backend_ref_ops()->rope(be, x, pos, n, n_heads, head_dim, n_rot, theta, neox);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        li_ggml_rope_cache(cs, pos[i], n_rot, theta);
        for (int h = 0; h < n_heads; h++) li_ggml_rope_head(x + (i * n_heads + h) * head_dim, cs, n_rot, neox);
    }
}

static void ggml_silu_mul(li_backend *be, float *g, const float *u, int64_t n, int64_t dim) {
    (ggml_of(be)->avx2 ? li_ggml_silu_mul_avx2 : li_ggml_silu_mul)(g, u, n * dim);
}

static void ggml_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    li_backend_ref_ops()->get_rows(be, w, ids, n, out); /* dequantize_row_*: the same products */
}

static void ggml_add(li_backend *be, float *y, const float *x, int64_t n) { li_backend_ref_ops()->add(be, y, x, n); }
/* llama.cpp has no such op: the reference's */
static void ggml_hadamard(li_backend *be, float *x, const float *s, int64_t n, int64_t dim, int64_t block) {
    li_backend_ref_ops()->hadamard(be, x, s, n, dim, block);
}

static void ggml_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                          int64_t n_tokens, int n_head_kv, int head_dim) {
    /* F16: round to nearest even, as ggml's F32 -> F16 copy */
    li_backend_ref_ops()->kv_store(be, kv, k, v, slot, n_tokens, n_head_kv, head_dim);
}

/* Nothing to repack (the GGUF rows are read as they are); refuses, with
 * the type's name, what ggml_matmul has no path for, and scheme weights
 * (llama.cpp has no such arithmetic to reproduce). */
static int ggml_weight_prepare(li_backend *be, li_weight *w) {
    if (w->scheme != LI_SCHEME_PLAIN) {
        li_log_error("cpu ggml: no matmul kernel for %s weights (%s codes): llama.cpp has no such arithmetic",
                     li_scheme_name(w->scheme), li_type_name(w->type));
        return LI_EUNSUP;
    }
    switch (w->type) {
    case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1:
    case LI_TYPE_Q8_0:
    case LI_TYPE_Q8_1:
    case LI_TYPE_F32:
    case LI_TYPE_F16:
    case LI_TYPE_BF16: return 0;
    default: li_log_error("cpu ggml: no matmul kernel for %s weights", li_type_name(w->type)); return LI_EUNSUP;
    }
}

static const li_backend_ops ggml_ops = {
    .name = "cpu-ggml",
    LI_HOST_BUFFER_OPS,
    .batch_variant = true,
    .matmul = ggml_matmul,
    .get_rows = ggml_get_rows,
    .rmsnorm = ggml_rmsnorm,
    .rope = ggml_rope,
    .silu_mul = ggml_silu_mul,
    .add = ggml_add,
    .hadamard = ggml_hadamard,
    .kv_store = ggml_kv_store,
    .attention = ggml_attention,
    .weight_prepare = ggml_weight_prepare,
};

/* ------------------------------------------------------------------------
 * init / free
 * ---------------------------------------------------------------------- */

int li_backend_ggml_init(li_backend *be, int n_threads, bool avx2, li_error *err) {
    memset(be, 0, sizeof *be);
    if (n_threads < 1) n_threads = 1;
    li_ggml *g = li_xcalloc(1, sizeof *g);
    g->n_threads = n_threads;
    g->tp = li_threadpool_init(n_threads);
    if (!g->tp) {
        free(g);
        return li_error_set(err, LI_ENOMEM, "cpu: cannot start %d threads", n_threads);
    }
    g->avx2 = avx2;
    g->scratch = li_xcalloc((size_t)n_threads, sizeof *g->scratch);
    be->ops = &ggml_ops;
    be->n_threads = n_threads;
    be->impl = g;
    return 0;
}

void li_backend_ggml_free(li_backend *be) {
    li_ggml *g = be->impl;
    if (!g) return;
    li_threadpool_free(g->tp);
    for (int t = 0; t < g->n_threads; t++) free(g->scratch[t]);
    free(g->scratch);
    free(g->act);
    free(g);
    memset(be, 0, sizeof *be);
}

bool li_backend_is_ggml(const li_backend *be) { return be->ops == &ggml_ops; }
