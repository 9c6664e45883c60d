/* kv_avx2.c — the 8-bit KV cache on AVX2 + FMA + F16C: the quantizing
 * store and paged attention over FP8 E4M3 / INT8 codes.
 *
 * Compiled with -mavx2 -mfma -mf16c; cpu.c calls in only after CPUID says
 * yes. The decoding trick (FP8 code bits moved into an f16, widened by
 * F16C, the 2^8 bias difference folded into the row scale) and the
 * bit-exact encoding are described in kv_avx512.c. Codes are decoded 16 at
 * a time (two 8-float halves); head_dim % 8 leftovers go through the scalar
 * reference functions. */
#include "util/common.h"
#include "cpu/kv_kernels.h"
#include "cpu/simd_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>



static inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }


/* ------------------------------------------------------------------------
 * decode
 * ---------------------------------------------------------------------- */

/* FP8 codes, sign-extended to 16 bits -> f16 bits of code value * 2^-8:
 * after the shift the sign is in bit 15 (and 14: masked off), exponent and
 * mantissa in bits 13..7. The NaN code (magnitude bits all ones) is the
 * only one where + 0x80 carries into bit 14; setting that bit makes it an
 * f16 NaN (exponent 11111, mantissa != 0). */
static inline __m256i fp8_to_f16_16(__m256i w) {
    const __m256i hb = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xbf80));
    const __m256i x = _mm256_add_epi16(hb, _mm256_set1_epi16(0x80));
    return _mm256_or_si256(hb, _mm256_and_si256(x, _mm256_set1_epi16(0x4000)));
}

static inline __m128i fp8_to_f16_8(__m128i w) {
    const __m128i hb = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16((short)0xbf80));
    const __m128i x = _mm_add_epi16(hb, _mm_set1_epi16(0x80));
    return _mm_or_si128(hb, _mm_and_si128(x, _mm_set1_epi16(0x4000)));
}

/* 16 codes -> lo (0..7), hi (8..15) */
static inline __attribute__((always_inline)) void code_load16(li_type t, const uint8_t *p, __m256 *lo, __m256 *hi) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    if (t == LI_KV_TYPE_INT8) {
        *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
    } else {
        const __m256i hb = fp8_to_f16_16(_mm256_cvtepi8_epi16(b));
        *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(hb));
        *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(hb, 1));
    }
}

/* 8 codes */
static inline __attribute__((always_inline)) __m256 code_load8(li_type t, const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    if (t == LI_KV_TYPE_INT8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    return _mm256_cvtph_ps(fp8_to_f16_8(_mm_cvtepi8_epi16(b)));
}

static inline float code_unit(li_type t) { return t == LI_KV_TYPE_INT8 ? 1.0f : 256.0f; }

/* ------------------------------------------------------------------------
 * encode (bit-identical to kv_ref.c)
 * ---------------------------------------------------------------------- */

static inline __m256i fp8_encode(__m256 y) {
    const __m256i sign =
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 24), _mm256_set1_epi32(0x80));
    const __m256 a = _mm256_min_ps(abs_ps(y), _mm256_set1_ps(448.0f)); /* NaN -> 448, patched below */
    const __m256i ab = _mm256_castps_si256(a);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ab, 20), _mm256_set1_epi32(1));
    const __m256i rnd = _mm256_add_epi32(ab, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd));
    const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rnd, 20), _mm256_set1_epi32(120 << 3));
    const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)),
                                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i small = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ));
    __m256i code = _mm256_blendv_epi8(normal, sub, small);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
    return _mm256_or_si256(code, sign);
}

static inline __m256i int8_encode(__m256 y) {
    y = _mm256_and_ps(y, _mm256_cmp_ps(y, y, _CMP_ORD_Q)); /* NaN -> 0 */
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(_mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __attribute__((always_inline)) void quant_head(li_type t, const float *x, uint8_t *dst, float *scale,
                                                             int D) {
    __m256 vmax = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) vmax = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + d)), vmax); /* NaN skipped */
    float amax = hmax256(vmax);
    for (int j = d; j < D; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) amax = ax;
    }
    float inv;
    *scale = li_kv8_scale(t, amax, &inv);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (d = 0; d + 8 <= D; d += 8) {
        const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + d), vinv);
        const __m256i c = t == LI_KV_TYPE_INT8 ? int8_encode(y) : fp8_encode(y);
        const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(dst + d), t == LI_KV_TYPE_INT8 ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w));
    }
    for (; d < D; d++) {
        const float y = x[d] * inv;
        dst[d] = t == LI_KV_TYPE_INT8 ? (uint8_t)li_kv_int8_encode(y) : li_fp32_to_fp8_e4m3(y);
    }
}

/* per (token, head): li_kv8_store let only FP8 / INT8 in */
void li_kv8_head_avx2(li_type t, const float *x, uint8_t *dst, float *scale, int D) {
    if (t == LI_KV_TYPE_INT8) quant_head(LI_KV_TYPE_INT8, x, dst, scale, D);
    else quant_head(LI_KV_TYPE_FP8_E4M3, x, dst, scale, D);
}

/* ------------------------------------------------------------------------
 * F16 / BF16 store (kv_kernels.h): the reference's bytes
 * ---------------------------------------------------------------------- */

/* bf16 bits of 8 floats in the low 128 bits, as li_fp32_to_bf16 (see
 * kv_avx512.c) */
static inline __m128i bf16_encode(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    const __m256i b = _mm256_srli_epi32(
        _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))), 16);
    /* 32 -> 16 bits (no saturation: every lane is below 2^16), lanes in order */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08));
}

static inline __attribute__((always_inline)) void store16_row(li_type t, uint16_t *dst, const float *src, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_loadu_ps(src + j);
        _mm_storeu_si128((__m128i *)(dst + j),
                         t == LI_TYPE_F16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT) : bf16_encode(x));
    }
    for (; j < n; j++) dst[j] = t == LI_TYPE_F16 ? li_fp32_to_fp16(src[j]) : li_fp32_to_bf16(src[j]);
}

/* One row of a token's K or V into an F16 / BF16 cache (kv_kernels.h). */
void li_kv16_row_avx2(li_type t, uint16_t *dst, const float *src, int64_t n) {
    /* per token: li_kv16_store_rows let only F16 / BF16 in */
    if (t == LI_TYPE_F16) store16_row(LI_TYPE_F16, dst, src, n);
    else store16_row(LI_TYPE_BF16, dst, src, n);
}

/* ------------------------------------------------------------------------
 * attention: one (token, head)
 * ---------------------------------------------------------------------- */

/* q · codes (without scale, in code_load units) */
static inline __attribute__((always_inline)) float code_dot(li_type t, const float *q, const uint8_t *c, int D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        __m256 lo, hi;
        code_load16(t, c + d, &lo, &hi);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), lo, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), hi, a1);
    }
    if (d + 8 <= D) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), code_load8(t, c + d), a0);
        d += 8;
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; d < D; d++) s += q[d] * (li_kv8_code_value(t, c[d]) / code_unit(t));
    return s;
}

/* out += w * codes */
static inline __attribute__((always_inline)) void code_axpy(li_type t, float *out, float w, const uint8_t *c, int D) {
    const __m256 vw = _mm256_set1_ps(w);
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        __m256 lo, hi;
        code_load16(t, c + d, &lo, &hi);
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vw, lo, _mm256_loadu_ps(out + d)));
        _mm256_storeu_ps(out + d + 8, _mm256_fmadd_ps(vw, hi, _mm256_loadu_ps(out + d + 8)));
    }
    if (d + 8 <= D) {
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vw, code_load8(t, c + d), _mm256_loadu_ps(out + d)));
        d += 8;
    }
    for (; d < D; d++) out[d] += w * (li_kv8_code_value(t, c[d]) / code_unit(t));
}

static inline __attribute__((always_inline)) void attn_t(li_type t, const int D, const li_attn_args *a, int64_t i,
                                                         int h, float *scores) {
    const int bs = a->block_size, nkv = a->n_head_kv;
    const int kvh = h / (a->n_head / nkv);
    const float *q = a->q + (i * a->n_head + h) * D;
    float *out = a->out + (i * a->n_head + h) * D;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;
    const int32_t *bt = li_attn_blocks(a, i);
    const size_t row = (size_t)nkv * D;
    const uint8_t *K = (const uint8_t *)a->kv->k + (size_t)kvh * D, *V = (const uint8_t *)a->kv->v + (size_t)kvh * D;
    const float *KS = a->kv->k_scale + kvh, *VS = a->kv->v_scale + kvh;
    const float unit = code_unit(t);

    float max = -INFINITY;
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const uint8_t *kb = K + (size_t)bt[bi] * bs * row;
        const float *ksb = KS + (size_t)bt[bi] * bs * nkv;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) {
            const float sc = code_dot(t, q, kb + s * row, D) * (ksb[s * nkv] * unit) * a->scale;
            scores[p0 + s] = sc;
            max = sc > max ? sc : max;
        }
    }
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= n_pos; p += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + p), vmax));
        _mm256_storeu_ps(scores + p, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum256(vsum);
    if (p < n_pos) { /* the last < 8 through a padded buffer */
        float tmp[8];
        for (int j = 0; j < 8; j++) tmp[j] = p + j < n_pos ? scores[p + j] - max : -INFINITY;
        _mm256_storeu_ps(tmp, exp256(_mm256_loadu_ps(tmp)));
        for (int j = 0; p + j < n_pos; j++) {
            scores[p + j] = tmp[j];
            sum += tmp[j];
        }
    }
    const float inv = 1.0f / sum;
    const __m256 vinv = _mm256_set1_ps(inv);
    if (D % 16 == 0 && D <= 128) { /* the output row in registers (spills a little at 128) */
        __m256 acc[16];
        for (int j = 0; j < D / 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
            const uint8_t *vb = V + (size_t)bt[bi] * bs * row;
            const float *vsb = VS + (size_t)bt[bi] * bs * nkv;
            const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
            for (int64_t s = 0; s < np; s++) {
                const __m256 w = _mm256_set1_ps(scores[p0 + s] * (vsb[s * nkv] * unit));
                for (int j = 0; j < D / 16; j++) {
                    __m256 lo, hi;
                    code_load16(t, vb + s * row + 16 * j, &lo, &hi);
                    acc[2 * j] = _mm256_fmadd_ps(w, lo, acc[2 * j]);
                    acc[2 * j + 1] = _mm256_fmadd_ps(w, hi, acc[2 * j + 1]);
                }
            }
        }
        for (int j = 0; j < D / 8; j++) _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(acc[j], vinv));
        return;
    }
    memset(out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const uint8_t *vb = V + (size_t)bt[bi] * bs * row;
        const float *vsb = VS + (size_t)bt[bi] * bs * nkv;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) code_axpy(t, out, scores[p0 + s] * (vsb[s * nkv] * unit), vb + s * row, D);
    }
    int d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), vinv));
    for (; d < D; d++) out[d] *= inv;
}

/* head_dim 64 and 128 get their own copies (loops unrolled, no tails) */
void li_kv8_attn_head_avx2(const li_attn_args *a, int64_t i, int h, float *scores) {
    const int D = a->head_dim;
    switch (a->kv->dtype) {
    case LI_KV_TYPE_INT8:
        if (D == 64) attn_t(LI_KV_TYPE_INT8, 64, a, i, h, scores);
        else if (D == 128) attn_t(LI_KV_TYPE_INT8, 128, a, i, h, scores);
        else attn_t(LI_KV_TYPE_INT8, D, a, i, h, scores);
        break;
    case LI_KV_TYPE_FP8_E4M3:
        if (D == 64) attn_t(LI_KV_TYPE_FP8_E4M3, 64, a, i, h, scores);
        else if (D == 128) attn_t(LI_KV_TYPE_FP8_E4M3, 128, a, i, h, scores);
        else attn_t(LI_KV_TYPE_FP8_E4M3, D, a, i, h, scores);
        break;
    default: li_type_unreachable("cpu avx2: kv8 attn_head", a->kv->dtype); /* cpu.c sends only FP8 / INT8 here */
    }
}
