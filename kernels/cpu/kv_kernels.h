/* kv_kernels.h — the 8-bit KV cache (FP8 E4M3 and INT8, with scales).
 *
 * Internal to kernels/cpu. Storage, per layer (core/kv/kv_cache.c):
 *
 *   k, v              uint8 codes   [block][slot][kv_head][head_dim]
 *   k_scale, v_scale  f32           [block][slot][kv_head]
 *
 * One scale per (token, kv head): element d of that head's row is
 * code_value(code[d]) * scale, with scale = amax / 448 (FP8, so the largest
 * |x| lands on the largest finite E4M3) or amax / 127 (INT8, symmetric).
 * docs/kv-cache.md says why this granularity.
 *
 *   kv_ref.c     the scalar reference store and attention (the FP8
 *                conversions: kernels/types.c)
 *   kv_avx2.c    AVX2 + FMA + F16C store and attention
 *   kv_avx512.c  AVX-512 F/BW/VL store and attention
 *
 * The F16 / BF16 stores per ISA live in kv_avx2.c / kv_avx512.c too (their
 * reference is kv_store in ops_ref.c).
 *
 * The SIMD stores write the reference's bytes exactly (the tests compare
 * them with memcmp); the SIMD attention differs from the reference only in
 * the order of float additions. A token's output depends on nothing but its
 * own query and the cache rows it reads, so batching never changes it. */
#ifndef LI_KV_KERNELS_H
#define LI_KV_KERNELS_H

#include "cpu/cpu_kernels.h"

#include <math.h>

static inline bool li_kv_is_8bit(li_type t) { return t == LI_KV_TYPE_FP8_E4M3 || t == LI_KV_TYPE_INT8; }

/* The scale of one head row from its largest finite-or-infinite |x| (NaNs
 * are skipped; an infinite amax counts as FLT_MAX). Returns the scale and
 * puts 1/scale in *inv; a zero (or vanishing) row gets scale 0, inv 0, and
 * codes 0. Shared by every ISA so their bytes agree. */
static inline float li_kv8_scale(li_type t, float amax, float *inv) {
    if (amax > 3.40282347e38f) amax = 3.40282347e38f;
    float scale = amax / (t == LI_KV_TYPE_INT8 ? 127.0f : 448.0f);
    if (!(scale >= 1.17549435e-38f)) { /* zero, denormal: 1/scale would overflow */
        *inv = 0.0f;
        return 0.0f;
    }
    *inv = 1.0f / scale;
    return scale;
}

/* INT8 code of an already scaled value: NaN -> 0, clamped to [-127, 127],
 * rounded to nearest even -- the INT8 row's from_float (kernels/types.c),
 * one rounding for both. The SIMD encoders are tested against it. */
static inline int8_t li_kv_int8_encode(float y) { return (int8_t)li_code_round(y, -127.0f, 127.0f); }

/* The value of one code, without the scale; t is FP8 or INT8 (the callers'
 * entry checked it: this sits in per-element loops). */
static inline float li_kv8_code_value(li_type t, uint8_t c) {
    return t == LI_KV_TYPE_INT8 ? (float)(int8_t)c : li_fp8_e4m3_to_fp32(c);
}

/* One kv head's D values of one token -> D codes and their scale. */
typedef void (*li_kv8_head_fn)(li_type t, const float *x, uint8_t *dst, float *scale, int D);
void li_kv8_head_ref(li_type t, const float *x, uint8_t *dst, float *scale, int D);
void li_kv8_head_avx2(li_type t, const float *x, uint8_t *dst, float *scale, int D);
void li_kv8_head_avx512(li_type t, const float *x, uint8_t *dst, float *scale, int D);
/* kv_store for 8-bit dtypes (the contract of li_backend_ops.kv_store), every
 * (token, kv head) of K and V through fn */
void li_kv8_store(const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot, int64_t n_tokens,
                  int n_head_kv, int head_dim, li_kv8_head_fn fn);

/* Attention of token i, head h over an 8-bit cache (li_cpu_kernels.attn_head contract). */
typedef void (*li_kv8_attn_head_fn)(const li_attn_args *a, int64_t i, int h, float *scores);
void li_kv8_attn_head_ref(const li_attn_args *a, int64_t i, int h, float *scores);
void li_kv8_attn_head_avx2(const li_attn_args *a, int64_t i, int h, float *scores);
void li_kv8_attn_head_avx512(const li_attn_args *a, int64_t i, int h, float *scores);

/* kv_store for F16 / BF16 (same contract), writing exactly the scalar
 * reference's bytes (ops_ref.c: li_fp32_to_fp16 / li_fp32_to_bf16, round to
 * nearest even, NaNs quieted): F16 by F16C, BF16 by integer ops (AVX512-BF16's
 * conversion flushes subnormals, so it is not used). */
typedef void (*li_kv16_row_fn)(li_type t, uint16_t *dst, const float *src, int64_t n);
void li_kv16_row_avx2(li_type t, uint16_t *dst, const float *src, int64_t n);
void li_kv16_row_avx512(li_type t, uint16_t *dst, const float *src, int64_t n);
/* Every token's K and V rows (row = n_head_kv * head_dim floats) through fn. */
void li_kv16_store_rows(const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                        int64_t n_tokens, int64_t row, li_kv16_row_fn fn);

/* The functions for an ISA level name ("scalar", "avx2", "avx512").
 * li_kv16_row_for gives NULL for the scalar level (use the reference). */
li_kv8_head_fn li_kv8_head_for(const char *isa);
li_kv8_attn_head_fn li_kv8_attn_head_for(const char *isa);
li_kv16_row_fn li_kv16_row_for(const char *isa);

#endif
