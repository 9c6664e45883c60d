/* ops_q4g_avx512.c — 4-bit group-quantized weights, A8 with AVX-512 VNNI
 * (q4g_kernels.h): the AVX2 A8 kernel's panels with vpdpbusd doing the
 * multiply, sum of four and accumulate of maddubs + madd + add in one
 * instruction (on 256-bit vectors, AVX-512 VL). Integer sums are exact, so
 * the bits are the AVX2 kernel's and the reference's. A16 is the AVX2
 * kernel. Compiled everywhere, run only where CPUID has AVX-512 VNNI. */
#include "util/common.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

/* NR activation rows against A8 panel p8 (8 weight rows), NR <= 4 */
static inline __attribute__((always_inline)) void a8_block(const li_q4g_packed *p, int64_t p8, const uint8_t *act,
                                                           size_t act_stride, int NR, float *y, int64_t ldy,
                                                           int64_t rows) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng, pp = p8 / 2, half = (p8 % 2) * 8;
    const uint8_t *cd = p->a8codes + p8 * (k / 8) * 32;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc[4];
    float sx[4];
    const int32_t *xsum[4];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        acc[i] = _mm256_setzero_ps();
        xsum[i] = (const int32_t *)(act + (size_t)i * act_stride + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
    }
    for (int64_t g = 0; g < ng; g++) {
        const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
        __m256i isum[4];
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) isum[i] = _mm256_setzero_si256();
        for (int64_t t = t0; t < t1;) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(cd + t * 32));
            const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                const int32_t *a = (const int32_t *)(act + (size_t)i * act_stride + t * 8);
                isum[i] = _mm256_dpbusd_epi32(isum[i], lo, _mm256_set1_epi32(a[0]));
                isum[i] = _mm256_dpbusd_epi32(isum[i], hi, _mm256_set1_epi32(a[1]));
            }
            t++;
        }
        const __m256i z = _mm256_loadu_si256((const __m256i *)(p->izero + (pp * ng + g) * LI_PANEL + half));
        const __m256 s = _mm256_loadu_ps(p->sz + (pp * ng + g) * 32 + half);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            const __m256i d = _mm256_sub_epi32(isum[i], _mm256_mullo_epi32(z, _mm256_set1_epi32(xsum[i][g])));
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(s, _mm256_cvtepi32_ps(d)));
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        float out[8];
        _mm256_storeu_ps(out, _mm256_mul_ps(acc[i], _mm256_set1_ps(sx[i])));
        memcpy(y + i * ldy + p8 * 8, out, (size_t)rows * sizeof(float));
    }
}

static void avx512_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy) {
    if (!p->a8_simd || r0 % 8) {
        li_q4g_kernels_scalar.a8(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    for (int64_t p8 = r0 / 8; p8 * 8 < r1; p8++) {
        const int64_t rows = LI_MIN((int64_t)8, r1 - p8 * 8);
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
            a8_block(p, p8, act + (size_t)i * act_stride, act_stride, 4, y + i * ldy, ldy, rows);
        for (; i < n; i++) a8_block(p, p8, act + (size_t)i * act_stride, act_stride, 1, y + i * ldy, ldy, rows);
    }
}

const li_q4g_kernels li_q4g_kernels_avx512 = {.isa = "avx512", .a16 = li_q4g_a16_avx2, .a8 = avx512_a8,
                                              .act = li_q4g_act_quantize_avx2};
