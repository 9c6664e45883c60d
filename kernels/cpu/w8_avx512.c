/* w8_avx512.c — the W8A8 int8 gemm with AVX-512 VNNI (w8_kernels.h).
 * vpdpbusd multiplies unsigned by signed bytes, so activations go in as
 * a + 128 and the dot is corrected by 128 * sum(w), itself a vpdpbusd of
 * the weights with bytes of 128: exact integers, the same bits as the
 * scalar kernel. Activation quantization and fp8 use the AVX2 kernels
 * (every CPU with AVX-512 has AVX2). */
#include "util/common.h"
#include "cpu/w8_kernels.h"

#include <immintrin.h>

static inline int32_t dot_vnni(const int8_t *w, const int8_t *a, int64_t k) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i s = _mm512_setzero_si512(), c = _mm512_setzero_si512();
    int64_t j = 0;
    for (; j + 64 <= k; j += 64) {
        const __m512i va = _mm512_xor_si512(_mm512_loadu_si512(a + j), bias); /* a + 128 as u8 */
        const __m512i vw = _mm512_loadu_si512(w + j);
        s = _mm512_dpbusd_epi32(s, va, vw);
        c = _mm512_dpbusd_epi32(c, bias, vw); /* 128 * w */
    }
    int32_t sum = _mm512_reduce_add_epi32(_mm512_sub_epi32(s, c));
    for (; j < k; j++) sum += (int32_t)w[j] * a[j];
    return sum;
}

static void gemm_int8_avx512(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                             const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            y[r * ldy + c] = (float)dot_vnni(w + c * k, a + r * k, k) * (as[r] * ws[c]);
}

const li_w8_kernels li_w8_kernels_avx512 = {
    .isa = "avx512",
    .quantize_int8 = li_w8_quantize_int8_avx2,
    .quantize_fp8 = NULL, /* the scalar encoder */
    .gemm_int8 = gemm_int8_avx512,
    .gemm_fp8 = li_w8_gemm_fp8_avx2,
};
