/* kv_avx512.c — the 8-bit KV cache on AVX-512 (F/BW/VL) + F16C: the
 * quantizing store and paged attention over FP8 E4M3 / INT8 codes.
 *
 * Compiled with -mavx512*; cpu.c calls in only after CPUID says yes.
 *
 * Decoding 16 codes at a time:
 *   INT8  sign-extend to 32 bits, convert: the code's value exactly.
 *   FP8   move the code's bits into an f16: sign to bit 15, the 4-bit
 *         exponent and 3-bit mantissa to bits 13..7 (the f16 exponent field
 *         is one bit wider, bias 15 instead of 7). F16C then widens it
 *         exactly, subnormals included, and the result is the code's value
 *         times 2^-8 (the bias difference); the 2^8 goes into the per-row
 *         scale, a power of two, so nothing is rounded. The NaN code
 *         (S.1111.111) would read as 480: it is patched to an f16 NaN.
 * Encoding follows kv_ref.c step by step (same scale, same multiply by
 * 1/scale, same rounding), so the bytes match the reference exactly. */
#include "util/common.h"
#include "cpu/kv_kernels.h"
#include "cpu/simd_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>




/* ------------------------------------------------------------------------
 * decode: 16 codes (lanes outside m read as 0)
 * ---------------------------------------------------------------------- */

static inline __m512 fp8_load(const uint8_t *p, __mmask16 m) {
    /* sign-extending puts the sign in bit 15 (and 14: masked off) and
     * leaves exponent and mantissa in bits 13..7 after the shift */
    const __m256i hb = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, p)), 7),
                                        _mm256_set1_epi16((short)0xbf80));
    /* NaN code: magnitude bits 13..7 all ones, so + 0x80 carries into bit
     * 14, and hb | bit 14 is an f16 NaN (exponent 11111, mantissa != 0);
     * no other code carries. One add and one ternary-logic hb | (x & 0x4000). */
    const __m256i x = _mm256_add_epi16(hb, _mm256_set1_epi16(0x80));
    return _mm512_cvtph_ps(_mm256_ternarylogic_epi32(hb, x, _mm256_set1_epi16(0x4000), 0xf8));
}

static inline __m512 int8_load(const uint8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

static inline __attribute__((always_inline)) __m512 code_load(li_type t, const uint8_t *p, __mmask16 m) {
    return t == LI_KV_TYPE_INT8 ? int8_load(p, m) : fp8_load(p, m);
}

/* what code_load's values are multiplied by to give the codes' values */
static inline float code_unit(li_type t) { return t == LI_KV_TYPE_INT8 ? 1.0f : 256.0f; }

/* ------------------------------------------------------------------------
 * encode: 16 scaled values -> 16 codes in int32 lanes
 * ---------------------------------------------------------------------- */

static inline __m512i fp8_encode(__m512 y) {
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(y), 24), _mm512_set1_epi32(0x80));
    /* |y| saturated at 448 (a NaN becomes 448 here and is patched below) */
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(y), _mm512_set1_ps(448.0f));
    const __m512i ab = _mm512_castps_si512(a);
    /* normal: round the low 20 mantissa bits to nearest even, re-bias */
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ab, 20), _mm512_set1_epi32(1));
    const __m512i rnd = _mm512_add_epi32(ab, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), odd));
    const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(rnd, 20), _mm512_set1_epi32(120 << 3));
    /* below 2^-6: round(a * 2^9) */
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
    __m512i code = _mm512_mask_mov_epi32(normal, small, sub);
    code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(0x7f));
    return _mm512_or_si512(code, sign);
}

static inline __m512i int8_encode(__m512 y) {
    y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), y); /* NaN -> 0 */
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __attribute__((always_inline)) void quant_head(li_type t, const float *x, uint8_t *dst, float *scale,
                                                             int D) {
    __m512 vmax = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) /* max(|x|, acc): a NaN |x| leaves acc, as the reference skips it */
        vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail16(D - d), x + d)), vmax);
    float inv;
    *scale = li_kv8_scale(t, _mm512_reduce_max_ps(vmax), &inv);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 m = tail16(D - d);
        const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + d), vinv);
        _mm512_mask_cvtepi32_storeu_epi8(dst + d, m, t == LI_KV_TYPE_INT8 ? int8_encode(y) : fp8_encode(y));
    }
}

/* per (token, head): li_kv8_store let only FP8 / INT8 in */
void li_kv8_head_avx512(li_type t, const float *x, uint8_t *dst, float *scale, int D) {
    if (t == LI_KV_TYPE_INT8) quant_head(LI_KV_TYPE_INT8, x, dst, scale, D);
    else quant_head(LI_KV_TYPE_FP8_E4M3, x, dst, scale, D);
}

/* ------------------------------------------------------------------------
 * F16 / BF16 store (kv_kernels.h): the reference's bytes
 * ---------------------------------------------------------------------- */

/* bf16 bits of 16 floats, as li_fp32_to_bf16: round to nearest even by an
 * integer add, NaN -> its top half with the quiet bit set */
static inline __m256i bf16_encode(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    const __m512i nan = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    const __m512i b = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), nan);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

static inline __attribute__((always_inline)) void store16_row(li_type t, uint16_t *dst, const float *src, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(m, src + j);
        _mm256_mask_storeu_epi16(dst + j, m,
                                 t == LI_TYPE_F16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT) : bf16_encode(x));
    }
}

/* One row of a token's K or V into an F16 / BF16 cache (kv_kernels.h). */
void li_kv16_row_avx512(li_type t, uint16_t *dst, const float *src, int64_t n) {
    /* per token: li_kv16_store_rows let only F16 / BF16 in */
    if (t == LI_TYPE_F16) store16_row(LI_TYPE_F16, dst, src, n);
    else store16_row(LI_TYPE_BF16, dst, src, n);
}

/* ------------------------------------------------------------------------
 * attention: one (token, head)
 * ---------------------------------------------------------------------- */

static inline __attribute__((always_inline)) void attn_t(li_type t, const int D, const li_attn_args *a, int64_t i,
                                                         int h, float *scores) {
    const int bs = a->block_size, nkv = a->n_head_kv;
    const int kvh = h / (a->n_head / nkv);
    const float *q = a->q + (i * a->n_head + h) * D;
    float *out = a->out + (i * a->n_head + h) * D;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;
    const int32_t *bt = li_attn_blocks(a, i);
    const size_t row = (size_t)nkv * D; /* bytes per slot */
    const uint8_t *K = (const uint8_t *)a->kv->k + (size_t)kvh * D, *V = (const uint8_t *)a->kv->v + (size_t)kvh * D;
    const float *KS = a->kv->k_scale + kvh, *VS = a->kv->v_scale + kvh;
    const float unit = code_unit(t);

    /* scores: q · codes, times the row's scale; block by block */
    float max = -INFINITY;
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const uint8_t *kb = K + (size_t)bt[bi] * bs * row;
        const float *ksb = KS + (size_t)bt[bi] * bs * nkv;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) {
            const uint8_t *kr = kb + s * row;
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16) {
                const __mmask16 m = tail16(D - d);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), code_load(t, kr + d, m), acc);
            }
            const float sc = hsum512(acc) * (ksb[s * nkv] * unit) * a->scale;
            scores[p0 + s] = sc;
            max = sc > max ? sc : max;
        }
    }
    /* softmax numerators and their sum */
    const __m512 vmax = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_pos; p += 16) {
        const __mmask16 m = tail16(n_pos - p);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + p), vmax));
        _mm512_mask_storeu_ps(scores + p, m, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
    }
    const float inv = 1.0f / hsum512(vsum);
    const __m512 vinv = _mm512_set1_ps(inv);
    /* out = sum_p e_p * v_scale_p * codes_p / sum */
    if (D % 16 == 0 && D <= 128) { /* the whole output row in registers */
        __m512 acc[8];
        for (int j = 0; j < D / 16; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
            const uint8_t *vb = V + (size_t)bt[bi] * bs * row;
            const float *vsb = VS + (size_t)bt[bi] * bs * nkv;
            const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
            for (int64_t s = 0; s < np; s++) {
                const __m512 w = _mm512_set1_ps(scores[p0 + s] * (vsb[s * nkv] * unit));
                for (int j = 0; j < D / 16; j++)
                    acc[j] = _mm512_fmadd_ps(w, code_load(t, vb + s * row + 16 * j, 0xffff), acc[j]);
            }
        }
        for (int j = 0; j < D / 16; j++) _mm512_storeu_ps(out + 16 * j, _mm512_mul_ps(acc[j], vinv));
        return;
    }
    memset(out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const uint8_t *vb = V + (size_t)bt[bi] * bs * row;
        const float *vsb = VS + (size_t)bt[bi] * bs * nkv;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) {
            const __m512 w = _mm512_set1_ps(scores[p0 + s] * (vsb[s * nkv] * unit));
            const uint8_t *vr = vb + s * row;
            for (int d = 0; d < D; d += 16) {
                const __mmask16 m = tail16(D - d);
                const __m512 o = _mm512_maskz_loadu_ps(m, out + d);
                _mm512_mask_storeu_ps(out + d, m, _mm512_fmadd_ps(w, code_load(t, vr + d, m), o));
            }
        }
    }
    for (int d = 0; d < D; d += 16) {
        const __mmask16 m = tail16(D - d);
        _mm512_mask_storeu_ps(out + d, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, out + d), vinv));
    }
}

/* head_dim 64 and 128 (the common ones) get their own copies, where the
 * loops over d unroll and the tail masks are constants */
void li_kv8_attn_head_avx512(const li_attn_args *a, int64_t i, int h, float *scores) {
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
    default: li_type_unreachable("cpu avx512: kv8 attn_head", a->kv->dtype); /* cpu.c sends only FP8 / INT8 here */
    }
}
