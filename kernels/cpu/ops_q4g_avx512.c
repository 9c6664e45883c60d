/* ops_q4g_avx512.c — 4-bit group-quantized weights, A8 with AVX-512 VNNI
 * (q4g_kernels.h): the AVX2 A8 kernel's scheme with vpdpbusd doing the
 * multiply, pair sum and accumulate of maddubs + madd + add in one
 * instruction (on 256-bit vectors, AVX-512 VL). Integer sums are exact, so
 * the bits are the AVX2 kernel's and the reference's. A16 is the AVX2
 * kernel. Compiled everywhere, run only where CPUID has AVX-512 VNNI. */
#include "util/common.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

static inline __m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i a = _mm256_hadd_epi32(v0, v1), b = _mm256_hadd_epi32(v2, v3);
    const __m256i c = _mm256_hadd_epi32(a, b);
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

static inline __m256i dot64(const uint8_t *wb, const int8_t *a, __m256i acc) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i b = _mm256_loadu_si256((const __m256i *)wb);
    const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    acc = _mm256_dpbusd_epi32(acc, lo, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_dpbusd_epi32(acc, hi, _mm256_loadu_si256((const __m256i *)(a + 32)));
}

static void avx512_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy) {
    if (!p->a8_simd) {
        li_q4g_kernels_scalar.a8(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    const int64_t k = w->k, gs = p->gs, ng = p->ng;
    const size_t rb = w->row_bytes;
    int64_t r = r0;
    for (; r + 4 <= r1 && (r % 4) == 0; r += 4) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
        const int64_t pp = r / LI_PANEL, l = r % LI_PANEL;
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *a = act + (size_t)i * act_stride;
            const int32_t *xsum = (const int32_t *)(a + ((k + 3) & ~3));
            float sx;
            memcpy(&sx, xsum + ng, sizeof sx);
            __m128 acc = _mm_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                __m256i v0 = _mm256_setzero_si256(), v1 = v0, v2 = v0, v3 = v0;
                const int64_t j1 = LI_MIN((g + 1) * gs, k);
                for (int64_t j = g * gs; j < j1; j += 64) {
                    const int8_t *aj = (const int8_t *)a + j;
                    v0 = dot64(wr + j / 2, aj, v0);
                    v1 = dot64(wr + rb + j / 2, aj, v1);
                    v2 = dot64(wr + 2 * rb + j / 2, aj, v2);
                    v3 = dot64(wr + 3 * rb + j / 2, aj, v3);
                }
                const int64_t t = (pp * ng + g) * LI_PANEL + l;
                const __m128i z = _mm_loadu_si128((const __m128i *)(p->izero + t));
                const __m128i isum =
                    _mm_sub_epi32(hsum4(v0, v1, v2, v3), _mm_mullo_epi32(z, _mm_set1_epi32(xsum[g])));
                const __m128 s = _mm_loadu_ps(p->sz + (pp * ng + g) * 32 + l);
                acc = _mm_add_ps(acc, _mm_mul_ps(s, _mm_cvtepi32_ps(isum)));
            }
            _mm_storeu_ps(y + i * ldy + r, _mm_mul_ps(acc, _mm_set1_ps(sx)));
        }
    }
    if (r < r1) li_q4g_kernels_scalar.a8(w, p, r, r1, act, act_stride, n, y, ldy);
}

const li_q4g_kernels li_q4g_kernels_avx512 = {.isa = "avx512", .a16 = li_q4g_a16_avx2, .a8 = avx512_a8};
