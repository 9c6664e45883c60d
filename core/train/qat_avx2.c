/* qat_avx2.c — --qat's dequant(quant(row)) for Q4_1 and Q8_0 with AVX2, 8 floats
 * at a time (compiled with -mavx2 by the _avx2.c rule; qat.c calls it when
 * the training kernels run AVX2). The values of li_quantize_row_q4_1_ref
 * then Q4_1's to_float (types.c), bit for bit: per block the same scalar
 * min, max, d and 1/d and the same half-precision d and m; per element the
 * same float operations in the same order, none fused (ISO C: no
 * contraction), x - min, times 1/d, plus 0.5, truncated, at most 15, then
 * q·d + m. (The reference's min keeps the first of two equal zeros, a
 * vector min either; their sign cannot change q or the sum q·d + m.)
 * The scalar pair was a tenth of a `distill --qat` step. */
#include "train/train_internal.h"
#include "cpu/simd_avx2.h"
#include "types.h"

#include <immintrin.h>

void li_train_qat_q4_1_row_avx2(const float *x, float *y, int64_t n) {
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256i fifteen = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < n / LI_QK4_1; b++, x += LI_QK4_1, y += LI_QK4_1) {
        __m256 v[LI_QK4_1 / 8];
        for (int i = 0; i < LI_QK4_1 / 8; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        __m256 lo = v[0], hi = v[0];
        for (int i = 1; i < LI_QK4_1 / 8; i++) lo = _mm256_min_ps(lo, v[i]), hi = _mm256_max_ps(hi, v[i]);
        const float min = hmin256(lo), max = hmax256(hi);
        const float d = (max - min) / 15.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const __m256 vmin = _mm256_set1_ps(min), vid = _mm256_set1_ps(id);
        const __m256 d16 = _mm256_set1_ps(li_fp16_to_fp32(li_fp32_to_fp16(d)));
        const __m256 m16 = _mm256_set1_ps(li_fp16_to_fp32(li_fp32_to_fp16(min)));
        for (int i = 0; i < LI_QK4_1 / 8; i++) {
            const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[i], vmin), vid), half);
            /* truncated to int32, then to its low byte as the reference's (int8_t) cast does on x86
             * (a block whose range underflows 1/d: inf or NaN, INT_MIN, 0), then at most 15 */
            __m256i q = _mm256_cvttps_epi32(t);
            q = _mm256_min_epi32(_mm256_srai_epi32(_mm256_slli_epi32(q, 24), 24), fifteen);
            _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d16), m16));
        }
    }
}

/* The same for Q8_0 (li_quantize_row_q8_0_ref, then q8_0_to_float): the
 * block's largest magnitude as fmaxf takes it (a NaN element is passed
 * over: max_ps returns its second operand, the running maximum, when
 * either is NaN), d = amax / 127 and 1/d as the reference computes them,
 * roundf's halves away from zero (round_away256), then the reference's
 * (int8_t) cast (an infinite or NaN product: 0) and q·d. */
void li_train_qat_q8_0_row_avx2(const float *x, float *y, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / LI_QK8_0; b++, x += LI_QK8_0, y += LI_QK8_0) {
        __m256 v[LI_QK8_0 / 8];
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < LI_QK8_0 / 8; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);
        }
        const float d = hmax256(amax) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id), d16 = _mm256_set1_ps(li_fp16_to_fp32(li_fp32_to_fp16(d)));
        for (int i = 0; i < LI_QK8_0 / 8; i++) {
            __m256i q = _mm256_cvttps_epi32(round_away256(_mm256_mul_ps(v[i], vid)));
            q = _mm256_srai_epi32(_mm256_slli_epi32(q, 24), 24);
            _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d16));
        }
    }
}
