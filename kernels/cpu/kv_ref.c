/* kv_ref.c — the scalar reference for the 8-bit KV cache: the quantizing
 * kv_store and paged attention over FP8 / INT8 codes with per-(token, kv
 * head) scales (the FP8 E4M3 <-> f32 conversions are in kernels/types.c,
 * with the other element types). Layout and scale rules: kv_kernels.h. */
#include "util/common.h"
#include "cpu/kv_kernels.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * kv_store
 * ---------------------------------------------------------------------- */

void li_kv8_head_ref(li_type t, const float *x, uint8_t *dst, float *scale, int D) {
    float amax = 0.0f;
    for (int d = 0; d < D; d++) {
        const float ax = fabsf(x[d]);
        if (ax > amax) amax = ax; /* NaN compares false: skipped */
    }
    float inv;
    *scale = li_kv8_scale(t, amax, &inv);
    for (int d = 0; d < D; d++) {
        const float y = x[d] * inv;
        dst[d] = t == LI_KV_TYPE_INT8 ? (uint8_t)li_kv_int8_encode(y) : li_fp32_to_fp8_e4m3(y);
    }
}

void li_kv8_store(const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot, int64_t n_tokens,
                  int n_head_kv, int head_dim, li_kv8_head_fn fn) {
    switch (kv->dtype) { /* once per call: fn and its per-element code choice trust it */
    case LI_KV_TYPE_FP8_E4M3:
    case LI_KV_TYPE_INT8: break;
    default: li_type_unreachable("cpu: kv8 store", kv->dtype);
    }
    const int64_t row = (int64_t)n_head_kv * head_dim;
    for (int64_t i = 0; i < n_tokens; i++)
        for (int h = 0; h < n_head_kv; h++) {
            const int64_t e = slot[i] * n_head_kv + h; /* (slot, head) */
            fn(kv->dtype, k + i * row + (int64_t)h * head_dim, (uint8_t *)kv->k + e * head_dim, kv->k_scale + e,
               head_dim);
            fn(kv->dtype, v + i * row + (int64_t)h * head_dim, (uint8_t *)kv->v + e * head_dim, kv->v_scale + e,
               head_dim);
        }
}

/* ------------------------------------------------------------------------
 * attention: token i, head h, the math of li_ref_attn_head with
 * K[p][d] = code_value(k[p][d]) * k_scale[p] (and the same for V); the
 * scale is taken out of the sums: q·K[p] = k_scale[p] * (q·codes[p]).
 * ---------------------------------------------------------------------- */

void li_kv8_attn_head_ref(const li_attn_args *a, int64_t i, int h, float *scores) {
    const int D = a->head_dim, nkv = a->n_head_kv;
    const int kvh = h / (a->n_head / nkv);
    const li_type t = a->kv->dtype;
    switch (t) { /* li_kv8_code_value's two-way choice trusts it */
    case LI_KV_TYPE_FP8_E4M3:
    case LI_KV_TYPE_INT8: break;
    default: li_type_unreachable("ref: kv8 attn_head", t);
    }
    const float *q = a->q + (i * a->n_head + h) * D;
    float *out = a->out + (i * a->n_head + h) * D;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;
    const int32_t *bt = li_attn_blocks(a, i);

    float max = -INFINITY;
    for (int64_t p = 0; p < n_pos; p++) {
        const int64_t e = ((int64_t)bt[p / a->block_size] * a->block_size + p % a->block_size) * nkv + kvh;
        const uint8_t *k = (const uint8_t *)a->kv->k + e * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += q[d] * li_kv8_code_value(t, k[d]);
        scores[p] = s * a->kv->k_scale[e] * a->scale;
        if (scores[p] > max) max = scores[p];
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < n_pos; p++) {
        scores[p] = expf(scores[p] - max);
        sum += scores[p];
    }
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int64_t p = 0; p < n_pos; p++) {
        const int64_t e = ((int64_t)bt[p / a->block_size] * a->block_size + p % a->block_size) * nkv + kvh;
        const uint8_t *v = (const uint8_t *)a->kv->v + e * D;
        const float w = scores[p] / sum * a->kv->v_scale[e];
        for (int d = 0; d < D; d++) out[d] += w * li_kv8_code_value(t, v[d]);
    }
}

/* ------------------------------------------------------------------------
 * per-ISA choice (cpu.c asks with its kernel table's isa name)
 * ---------------------------------------------------------------------- */

li_kv8_head_fn li_kv8_head_for(const char *isa) {
    if (!strcmp(isa, "avx512")) return li_kv8_head_avx512;
    if (!strcmp(isa, "avx2")) return li_kv8_head_avx2;
    return li_kv8_head_ref;
}

li_kv8_attn_head_fn li_kv8_attn_head_for(const char *isa) {
    if (!strcmp(isa, "avx512")) return li_kv8_attn_head_avx512;
    if (!strcmp(isa, "avx2")) return li_kv8_attn_head_avx2;
    return li_kv8_attn_head_ref;
}

li_kv16_row_fn li_kv16_row_for(const char *isa) {
    if (!strcmp(isa, "avx512")) return li_kv16_row_avx512;
    if (!strcmp(isa, "avx2")) return li_kv16_row_avx2;
    return NULL;
}

void li_kv16_store_rows(const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                        int64_t n_tokens, int64_t row, li_kv16_row_fn fn) {
    switch (kv->dtype) { /* once per call: fn's per-row F16 / BF16 choice trusts it */
    case LI_TYPE_F16:
    case LI_TYPE_BF16: break;
    default: li_type_unreachable("cpu: kv16 store", kv->dtype);
    }
    for (int64_t i = 0; i < n_tokens; i++) {
        fn(kv->dtype, (uint16_t *)kv->k + slot[i] * row, k + i * row, row);
        fn(kv->dtype, (uint16_t *)kv->v + slot[i] * row, v + i * row, row);
    }
}
