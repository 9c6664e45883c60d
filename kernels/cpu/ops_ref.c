/* ops_ref.c — the scalar reference backend.
 *
 * Every op of li_backend_ops in plain C, single-threaded, written to read like
 * the math. It is what the threaded and SIMD CPU paths (and later device
 * backends) are tested against, so clarity beats speed here. Where llama.cpp
 * fixes an order of float operations (rmsnorm sums in double, rope steps
 * theta by repeated multiplication, quantized matmul goes through the integer
 * vec_dot) we do the same, so our logits track theirs. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/kv_kernels.h"
#include "cpu/w8_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef float (*vec_dot_fn)(int64_t n, const void *w, const void *a);

/* the integer dot for a weight type the table pairs with Q8_0 / Q8_1
 * activations (ref_matmul asks only for those) */
static vec_dot_fn vec_dot_for(li_type w_type) {
    switch (w_type) {
    case LI_TYPE_Q4_0: return li_vec_dot_q4_0_q8_0_ref;
    case LI_TYPE_Q4_1: return li_vec_dot_q4_1_q8_1_ref;
    case LI_TYPE_Q8_0: return li_vec_dot_q8_0_q8_0_ref;
    default: break;
    }
    fprintf(stderr, "luainfer: ref matmul: no integer dot for %s weights (types.c pairs it with %s)\n",
            li_type_name(w_type), li_type_name(li_type_vec_dot_type(w_type)));
    abort();
}

static float dot_f32(int64_t n, const float *a, const float *b) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) sum += a[j] * b[j];
    return sum;
}

/* ------------------------------------------------------------------------
 * matmul: y(n, m) = x(n, k) · W(m, k)^T
 * ---------------------------------------------------------------------- */

static void ref_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    const int64_t k = w->k, m = w->m;
    const li_type at = li_type_vec_dot_type(w->type);
    if (at != LI_TYPE_F32 && w->scheme == LI_SCHEME_PLAIN) {
        /* quantized weights: quantize each activation row once, then the
         * integer dot of every weight row with it */
        const li_type_traits *qt = li_type_get(at);
        size_t arow = (size_t)(k / qt->blck_size) * qt->type_size;
        char *qa = li_xmalloc(arow * (size_t)n);
        for (int64_t r = 0; r < n; r++) qt->from_float(x + r * k, qa + r * arow, k);
        const vec_dot_fn dot = vec_dot_for(w->type);
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < m; i++)
                y[r * m + i] = dot(k, (const char *)w->data + i * w->row_bytes, qa + r * arow);
        free(qa);
        return;
    }
    float *wf = li_xmalloc((size_t)k * sizeof(float));
    if (w->scheme == LI_SCHEME_PLAIN) {
        /* float (or any other dequantizable) weights: convert a row to f32, dot */
        const li_type_traits *wt = li_type_info(w->type);
        for (int64_t i = 0; i < m; i++) {
            wt->to_float((const char *)w->data + i * w->row_bytes, wf, k);
            for (int64_t r = 0; r < n; r++) y[r * m + i] = dot_f32(k, x + r * k, wf);
        }
    } else if (li_w8_supported(w)) {
        /* per-channel W8A8 / FP8: the scalar kernels' dot of the codes (the
         * one order every ISA keeps), then the two scales (w8_kernels.h) */
        li_w8_matmul_ref(w, x, y, n);
    } else {
        /* scheme weights: the activations as the scheme quantizes them, each
         * row through li_weight_dequant_row_ref (scales, zeros, permutation) */
        float *xa = li_xmalloc((size_t)(n * k) * sizeof(float));
        for (int64_t r = 0; r < n; r++) li_act_quant_row_ref(w->act, x + r * k, xa + r * k, k);
        for (int64_t i = 0; i < m; i++) {
            li_weight_dequant_row_ref(w, i, wf);
            for (int64_t r = 0; r < n; r++) y[r * m + i] = dot_f32(k, xa + r * k, wf);
        }
        free(xa);
    }
    free(wf);
}

/* out(n, k) = dequantized rows ids of W (scheme weights: with their scales) */
static void ref_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    if (w->scheme != LI_SCHEME_PLAIN) {
        for (int64_t r = 0; r < n; r++) li_weight_dequant_row_ref(w, ids[r], out + r * w->k);
        return;
    }
    const li_type_traits *wt = li_type_info(w->type);
    for (int64_t r = 0; r < n; r++)
        wt->to_float((const char *)w->data + (int64_t)ids[r] * w->row_bytes, out + r * w->k, w->k);
}

/* ------------------------------------------------------------------------
 * elementwise and per-row ops
 * ---------------------------------------------------------------------- */

static void ref_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim,
                        float eps) {
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double sum = 0.0; /* as ggml: squares summed in double */
        for (int64_t j = 0; j < dim; j++) sum += (double)(xr[j] * xr[j]);
        const float scale = 1.0f / sqrtf((float)(sum / (double)dim) + eps);
        for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] * scale) * w[j];
    }
}

static void ref_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim,
                     int n_rot, float theta, int neox) {
    /* theta_j = pos * theta^(-2j/n_rot), stepped by one multiply per pair as
     * ggml does, so the rounding of the angles matches llama.cpp */
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    for (int64_t i = 0; i < n; i++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (i * n_heads + h) * head_dim;
            float angle = (float)pos[i];
            for (int j = 0; j < half; j++, angle *= theta_scale) {
                const float c = cosf(angle), s = sinf(angle);
                const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
                const float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * c - x1 * s;
                v[i1] = x0 * s + x1 * c;
            }
        }
    }
}

void li_ref_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t j = 0; j < n; j++) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
}

static void ref_silu_mul(li_backend *be, float *g, const float *u, int64_t n, int64_t dim) {
    li_ref_silu_mul(g, u, n * dim);
}

void li_ref_hadamard(float *x, const float *s, int64_t dim, int64_t block) {
    const float scale = 1.0f / sqrtf((float)block);
    for (int64_t j = 0; j < dim; j++) x[j] *= s[j];
    for (int64_t b0 = 0; b0 < dim; b0 += block) {
        float *v = x + b0;
        /* stage h pairs (j, j + h) inside each run of 2h: Sylvester's order, H_b[i][j] = (-1)^popcount(i & j) */
        for (int64_t h = 1; h < block; h *= 2)
            for (int64_t i = 0; i < block; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float a = v[j], c = v[j + h];
                    v[j] = a + c;
                    v[j + h] = a - c;
                }
        for (int64_t j = 0; j < block; j++) v[j] *= scale;
    }
}

static void ref_hadamard(li_backend *be, float *x, const float *s, int64_t n, int64_t dim, int64_t block) {
    (void)be;
    for (int64_t r = 0; r < n; r++) li_ref_hadamard(x + r * dim, s, dim, block);
}

static void ref_add(li_backend *be, float *y, const float *x, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] += x[j];
}

/* ------------------------------------------------------------------------
 * paged KV and attention
 * ---------------------------------------------------------------------- */

static void kv_store_row(li_type dtype, void *dst, const float *src, int64_t n) {
    switch (dtype) {
    case LI_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case LI_TYPE_F16:
        for (int64_t j = 0; j < n; j++) ((uint16_t *)dst)[j] = li_fp32_to_fp16(src[j]);
        break;
    case LI_TYPE_BF16:
        for (int64_t j = 0; j < n; j++) ((uint16_t *)dst)[j] = li_fp32_to_bf16(src[j]);
        break;
    default: li_type_unreachable("ref: kv_store", dtype); /* kv_cache_init refuses other dtypes; 8-bit: kv_ref.c */
    }
}

static void ref_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                         int64_t n_tokens, int n_head_kv, int head_dim) {
    if (li_kv_is_8bit(kv->dtype)) { /* FP8 / INT8 with scales: kv_ref.c */
        li_kv8_store(kv, k, v, slot, n_tokens, n_head_kv, head_dim, li_kv8_head_ref);
        return;
    }
    const int64_t row = (int64_t)n_head_kv * head_dim; /* one token's K (or V), all kv heads */
    const size_t es = li_kv_elem_size(kv->dtype);
    for (int64_t i = 0; i < n_tokens; i++) {
        kv_store_row(kv->dtype, (char *)kv->k + slot[i] * row * es, k + i * row, row);
        kv_store_row(kv->dtype, (char *)kv->v + slot[i] * row * es, v + i * row, row);
    }
}

/* Token i, head h: out = softmax(scale * q·K^T) · V over positions 0..pos[i]
 * of the token's sequence, K/V read through its block table. GQA: query
 * heads are grouped, n_head / n_head_kv per kv head. */
void li_ref_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    if (li_kv_is_8bit(a->kv->dtype)) { /* FP8 / INT8 with scales: kv_ref.c */
        li_kv8_attn_head_ref(a, i, h, scores);
        return;
    }
    const int D = a->head_dim;
    const int kvh = h / (a->n_head / a->n_head_kv);
    const li_type dt = a->kv->dtype;
    const float *q = a->q + (i * a->n_head + h) * D;
    float *out = a->out + (i * a->n_head + h) * D;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;

    float max = -INFINITY;
    for (int64_t p = 0; p < n_pos; p++) {
        const void *k = li_kv_row(a, a->kv->k, i, p, kvh);
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += q[d] * li_float_load(dt, k, d);
        scores[p] = s * a->scale;
        if (scores[p] > max) max = scores[p];
    }
    /* softmax, shifted by the max so exp never overflows */
    float sum = 0.0f;
    for (int64_t p = 0; p < n_pos; p++) {
        scores[p] = expf(scores[p] - max);
        sum += scores[p];
    }
    for (int64_t p = 0; p < n_pos; p++) scores[p] /= sum;

    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int64_t p = 0; p < n_pos; p++) {
        const void *v = li_kv_row(a, a->kv->v, i, p, kvh);
        for (int d = 0; d < D; d++) out[d] += scores[p] * li_float_load(dt, v, d);
    }
}

static void ref_attention(li_backend *be, const li_attn_args *a) {
    int64_t max_pos = 0;
    for (int64_t i = 0; i < a->n_tokens; i++) max_pos = LI_MAX(max_pos, (int64_t)a->pos[i]);
    float *scores = li_xmalloc((size_t)(max_pos + 1) * sizeof(float));
    for (int64_t i = 0; i < a->n_tokens; i++)
        for (int h = 0; h < a->n_head; h++) li_ref_attn_head(a, i, h, scores);
    free(scores);
}

static const li_backend_ops ref_ops = {
    .name = "ref",
    LI_HOST_BUFFER_OPS,
    .matmul = ref_matmul,
    .get_rows = ref_get_rows,
    .rmsnorm = ref_rmsnorm,
    .rope = ref_rope,
    .silu_mul = ref_silu_mul,
    .add = ref_add,
    .hadamard = ref_hadamard,
    .kv_store = ref_kv_store,
    .attention = ref_attention,
    .weight_prepare = NULL,
    .weight_release = NULL,
};

const li_backend_ops *li_backend_ref_ops(void) { return &ref_ops; }
