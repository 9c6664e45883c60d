/* ops_q4g_avx2.c — 4-bit group-quantized weights with AVX2 (q4g_kernels.h).
 *
 * A16: one lane per weight row over the panels, input columns in order,
 * (code - zero) * scale then x * w added with separate multiplies and adds:
 * the reference's operations exactly. Decode has one activation row, so
 * several panels run side by side to keep enough independent sums in
 * flight; prefill runs four activation rows per panel.
 *
 * A8: four weight rows at a time; per 64-element chunk the 32 packed bytes
 * split into low nibbles (even elements) and high nibbles (odd), each
 * multiplied with its activation bytes by vpmaddubsw (15 * 127 * 2 fits in
 * int16) and widened by vpmaddwd; a group's four sums then reduce into one
 * vector for the four rows' float steps. */
#include "util/common.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * A16
 * ---------------------------------------------------------------------- */

/* NP panels from pp x NR activation rows from x; NP * NR <= 4 */
static inline __attribute__((always_inline)) void a16_block(const li_q4g_packed *p, int64_t pp, int NP,
                                                            const float *x, int64_t ldx, int NR, float *y,
                                                            int64_t ldy) {
    const int64_t k = p->k, ng = p->ng;
    __m256 acc[4][4][2];
    for (int a = 0; a < NP; a++)
        for (int i = 0; i < NR; i++) acc[a][i][0] = acc[a][i][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int64_t c = 0; c < k; c += 2) {
        const int32_t g0 = p->gidx[c], g1 = p->gidx[c + 1];
        __m256 xa[4], xb[4];
        for (int i = 0; i < NR; i++) {
            xa[i] = _mm256_broadcast_ss(x + i * ldx + c);
            xb[i] = _mm256_broadcast_ss(x + i * ldx + c + 1);
        }
        for (int a = 0; a < NP; a++) {
            const uint8_t *cd = p->codes + ((pp + a) * (k / 2) + c / 2) * LI_PANEL;
            const __m128i b = _mm_loadu_si128((const __m128i *)cd);
            const __m256i v0 = _mm256_cvtepu8_epi32(b), v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
            const float *s0 = p->sz + ((pp + a) * ng + g0) * 32, *s1 = p->sz + ((pp + a) * ng + g1) * 32;
            /* (q - zero) * scale for column c (low nibbles) and c + 1 (high) */
            const __m256 w00 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m4)),
                                                           _mm256_loadu_ps(s0 + 16)), _mm256_loadu_ps(s0));
            const __m256 w01 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m4)),
                                                           _mm256_loadu_ps(s0 + 24)), _mm256_loadu_ps(s0 + 8));
            const __m256 w10 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)),
                                                           _mm256_loadu_ps(s1 + 16)), _mm256_loadu_ps(s1));
            const __m256 w11 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)),
                                                           _mm256_loadu_ps(s1 + 24)), _mm256_loadu_ps(s1 + 8));
            for (int i = 0; i < NR; i++) {
                acc[a][i][0] = _mm256_add_ps(acc[a][i][0], _mm256_mul_ps(xa[i], w00));
                acc[a][i][1] = _mm256_add_ps(acc[a][i][1], _mm256_mul_ps(xa[i], w01));
                acc[a][i][0] = _mm256_add_ps(acc[a][i][0], _mm256_mul_ps(xb[i], w10));
                acc[a][i][1] = _mm256_add_ps(acc[a][i][1], _mm256_mul_ps(xb[i], w11));
            }
        }
    }
    for (int a = 0; a < NP; a++) {
        const int64_t row0 = (pp + a) * LI_PANEL, rows = LI_MIN((int64_t)LI_PANEL, p->m - row0);
        for (int i = 0; i < NR; i++) {
            float out[LI_PANEL];
            _mm256_storeu_ps(out, acc[a][i][0]);
            _mm256_storeu_ps(out + 8, acc[a][i][1]);
            memcpy(y + i * ldy + row0, out, (size_t)rows * sizeof(float));
        }
    }
}

void li_q4g_a16_avx2(const li_q4g_packed *p, int64_t p0, int64_t p1, const float *x, int64_t ldx, int64_t n,
                     float *y, int64_t ldy) {
    for (int64_t i = 0; i < n;) {
        const int64_t left = n - i;
        if (left >= 4) {
            for (int64_t pp = p0; pp < p1; pp++) a16_block(p, pp, 1, x + i * ldx, ldx, 4, y + i * ldy, ldy);
            i += 4;
        } else if (left >= 2) {
            int64_t pp = p0;
            for (; pp + 2 <= p1; pp += 2) a16_block(p, pp, 2, x + i * ldx, ldx, 2, y + i * ldy, ldy);
            for (; pp < p1; pp++) a16_block(p, pp, 1, x + i * ldx, ldx, 2, y + i * ldy, ldy);
            i += 2;
        } else { /* decode: four panels side by side */
            int64_t pp = p0;
            for (; pp + 4 <= p1; pp += 4) a16_block(p, pp, 4, x + i * ldx, ldx, 1, y + i * ldy, ldy);
            for (; pp < p1; pp++) a16_block(p, pp, 1, x + i * ldx, ldx, 1, y + i * ldy, ldy);
            i += 1;
        }
    }
}

/* ------------------------------------------------------------------------
 * A8
 * ---------------------------------------------------------------------- */

/* the four int32 vectors' lane sums, as one vector (row l in lane l) */
static inline __m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i a = _mm256_hadd_epi32(v0, v1), b = _mm256_hadd_epi32(v2, v3);
    const __m256i c = _mm256_hadd_epi32(a, b); /* lanes 0-3 and 4-7: halves of rows 0..3 */
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

static inline __m256i dot64(const uint8_t *wb, const int8_t *a, __m256i acc) {
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i b = _mm256_loadu_si256((const __m256i *)wb);
    const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    const __m256i pr = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a)),
                                        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32))));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pr, ones));
}

static void avx2_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
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
    if (r < r1) li_q4g_kernels_scalar.a8(w, p, r, r1, act, act_stride, n, y, ldy); /* the tail: same bits */
}

const li_q4g_kernels li_q4g_kernels_avx2 = {.isa = "avx2", .a16 = li_q4g_a16_avx2, .a8 = avx2_a8};
