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
 * vector for the four rows' float steps.
 *
 * The loops over panels and rows are unrolled by pragma: without it GCC
 * kept the accumulator arrays on the stack (a load and a store around
 * every add), which made A8 run at half of Q4_1's speed. */
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
    #pragma GCC unroll 4
    for (int a = 0; a < NP; a++)
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) acc[a][i][0] = acc[a][i][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int64_t c = 0; c < k; c += 2) {
        const int32_t g0 = p->gidx[c], g1 = p->gidx[c + 1];
        __m256 xa[4], xb[4];
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            xa[i] = _mm256_broadcast_ss(x + i * ldx + c);
            xb[i] = _mm256_broadcast_ss(x + i * ldx + c + 1);
        }
        #pragma GCC unroll 4
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
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                acc[a][i][0] = _mm256_add_ps(acc[a][i][0], _mm256_mul_ps(xa[i], w00));
                acc[a][i][1] = _mm256_add_ps(acc[a][i][1], _mm256_mul_ps(xa[i], w01));
                acc[a][i][0] = _mm256_add_ps(acc[a][i][0], _mm256_mul_ps(xb[i], w10));
                acc[a][i][1] = _mm256_add_ps(acc[a][i][1], _mm256_mul_ps(xb[i], w11));
            }
        }
    }
    #pragma GCC unroll 4
    for (int a = 0; a < NP; a++) {
        const int64_t row0 = (pp + a) * LI_PANEL, rows = LI_MIN((int64_t)LI_PANEL, p->m - row0);
        #pragma GCC unroll 4
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

/* NR activation rows against NP A8 panels from p8 (8 weight rows each),
 * NP * NR <= 4: the activation broadcasts are shared by the panels, the
 * weight loads by the rows */
static inline __attribute__((always_inline)) void a8_block(const li_q4g_packed *p, int64_t p8, int NP,
                                                           const uint8_t *act, size_t act_stride, int NR, float *y,
                                                           int64_t ldy, int64_t r1) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[4][4];
    float sx[4];
    const int32_t *xsum[4];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        xsum[i] = (const int32_t *)(act + (size_t)i * act_stride + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
        #pragma GCC unroll 4
        for (int a = 0; a < NP; a++) acc[a][i] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
        __m256i isum[4][4];
        #pragma GCC unroll 4
        for (int a = 0; a < NP; a++)
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) isum[a][i] = _mm256_setzero_si256();
        for (int64_t t = t0; t < t1;) {
            /* up to 4 chunks summed in int16 (4 * 2 * 2 * 15 * 127 < 32768), then widened */
            const int64_t t2 = LI_MIN(t + 4, t1);
            __m256i s16[4][4];
            #pragma GCC unroll 4
            for (int a = 0; a < NP; a++)
                #pragma GCC unroll 4
                for (int i = 0; i < NR; i++) s16[a][i] = _mm256_setzero_si256();
            for (; t < t2; t++) {
                __m256i al[4], ah[4];
                #pragma GCC unroll 4
                for (int i = 0; i < NR; i++) {
                    const int32_t *ai = (const int32_t *)(act + (size_t)i * act_stride + t * 8);
                    al[i] = _mm256_set1_epi32(ai[0]);
                    ah[i] = _mm256_set1_epi32(ai[1]);
                }
                #pragma GCC unroll 4
                for (int a = 0; a < NP; a++) {
                    const uint8_t *src = li_q4g_a8_group(p, (p8 + a) / 2, g) + (t - t0) * 64 + (p8 + a) % 2 * 32;
                    /* decode streams from memory: run ahead of the hardware prefetcher (a line per 16-row panel) */
                    if (NR == 1 && (p8 + a) % 2 == 0) _mm_prefetch((const char *)src + LI_GEMV_PREFETCH, _MM_HINT_T0);
                    const __m256i b = _mm256_loadu_si256((const __m256i *)src);
                    const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
                    #pragma GCC unroll 4
                    for (int i = 0; i < NR; i++) {
                        s16[a][i] = _mm256_add_epi16(s16[a][i], _mm256_maddubs_epi16(lo, al[i]));
                        s16[a][i] = _mm256_add_epi16(s16[a][i], _mm256_maddubs_epi16(hi, ah[i]));
                        /* in a register, in this order (ops_avx2.c's q_half: reassociated, the
                         * products spill) */
                        __asm__("" : "+x"(s16[a][i]));
                    }
                }
            }
            #pragma GCC unroll 4
            for (int a = 0; a < NP; a++)
                #pragma GCC unroll 4
                for (int i = 0; i < NR; i++)
                    isum[a][i] = _mm256_add_epi32(isum[a][i], _mm256_madd_epi16(s16[a][i], ones));
        }
        #pragma GCC unroll 4
        for (int a = 0; a < NP; a++) {
            const uint8_t *zs = li_q4g_a8_group(p, (p8 + a) / 2, g) + (t1 - t0) * 64 + ((p8 + a) % 2) * 32;
            if (NR == 1 && (p8 + a) % 2 == 0) { /* the stream's zero and scale lines, as its chunks above */
                _mm_prefetch((const char *)zs + LI_GEMV_PREFETCH, _MM_HINT_T0);
                _mm_prefetch((const char *)zs + LI_GEMV_PREFETCH + 64, _MM_HINT_T0);
            }
            const __m256i z = _mm256_loadu_si256((const __m256i *)zs);
            const __m256 s = _mm256_loadu_ps((const float *)(zs + 64));
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                const __m256i d = _mm256_sub_epi32(isum[a][i], _mm256_mullo_epi32(z, _mm256_set1_epi32(xsum[i][g])));
                acc[a][i] = _mm256_add_ps(acc[a][i], _mm256_mul_ps(s, _mm256_cvtepi32_ps(d)));
            }
        }
    }
    #pragma GCC unroll 4
    for (int a = 0; a < NP; a++) {
        const int64_t row0 = (p8 + a) * 8, rows = LI_MIN((int64_t)8, r1 - row0);
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(acc[a][i], _mm256_set1_ps(sx[i])));
            memcpy(y + i * ldy + row0, out, (size_t)rows * sizeof(float));
        }
    }
}

static void avx2_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                    size_t act_stride, int64_t n, float *y, int64_t ldy) {
    if (!p->a8codes || r0 % 8) {
        li_q4g_kernels_scalar.a8(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    const int64_t q0 = r0 / 8, q1 = (r1 + 7) / 8;
    for (int64_t i = 0; i < n;) {
        const uint8_t *a = act + (size_t)i * act_stride;
        float *yi = y + i * ldy;
        if (n - i >= 4) {
            for (int64_t p8 = q0; p8 < q1; p8++) a8_block(p, p8, 1, a, act_stride, 4, yi, ldy, r1);
            i += 4;
        } else if (n - i >= 2) {
            int64_t p8 = q0;
            for (; p8 + 2 <= q1; p8 += 2) a8_block(p, p8, 2, a, act_stride, 2, yi, ldy, r1);
            for (; p8 < q1; p8++) a8_block(p, p8, 1, a, act_stride, 2, yi, ldy, r1);
            i += 2;
        } else { /* decode: four panels (32 rows) share each activation broadcast */
            int64_t p8 = q0;
            for (; p8 + 4 <= q1; p8 += 4) a8_block(p, p8, 4, a, act_stride, 1, yi, ldy, r1);
            for (; p8 < q1; p8++) a8_block(p, p8, 1, a, act_stride, 1, yi, ldy, r1);
            i += 1;
        }
    }
}

/* ------------------------------------------------------------------------
 * A8 activation rows
 * ---------------------------------------------------------------------- */

/* The reference's steps, 8 lanes at a time: amax by vmaxps (its second
 * operand wins over a NaN, as fmaxf(amax, |x|) skips one; max is exact and
 * order-free), y = x * inv by one multiply, NaN -> 0, clamp to [-127, 127],
 * then round half to even (nearbyintf in the default rounding mode). */
void li_q4g_act_quantize_avx2(const li_weight *w, const li_q4g_packed *p, const float *x, uint8_t *dst) {
    const int64_t k = w->k, k8 = k & ~(int64_t)7;
    const int32_t *perm = w->perm;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 vmax = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j < k8; j += 8) vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vmax);
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) amax = lanes[l] > amax ? lanes[l] : amax;
    for (; j < k; j++) {
        const float a = x[j] < 0 ? -x[j] : x[j];
        amax = a > amax ? a : amax; /* false for a NaN: skipped */
    }
    const float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    int8_t *q = (int8_t *)dst;
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (j = 0; j < k8; j += 8) {
        const __m256 xv = perm ? _mm256_i32gather_ps(x, _mm256_loadu_si256((const __m256i *)(perm + j)), 4)
                               : _mm256_loadu_ps(x + j);
        __m256 y = _mm256_mul_ps(xv, vinv);
        y = _mm256_and_ps(y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
        y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
        const __m256i v = _mm256_cvtps_epi32(_mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m128i h16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(q + j), _mm_packs_epi16(h16, h16));
    }
    for (; j < k; j++) q[j] = (int8_t)li_code_round(x[perm ? perm[j] : j] * inv, -127.0f, 127.0f);
    int32_t *xsum = (int32_t *)(dst + ((k + 3) & ~3));
    for (int64_t g = 0; g < p->ng; g++) {
        const int64_t j1 = LI_MIN((g + 1) * p->gs, k);
        int64_t i = g * p->gs;
        __m256i vs = _mm256_setzero_si256(); /* 8 codes a step: 15% of A8 decode was this loop scalar */
        for (; i + 8 <= j1; i += 8)
            vs = _mm256_add_epi32(vs, _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(vs), _mm256_extracti128_si256(vs, 1));
        const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        int32_t sum = _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
        for (; i < j1; i++) sum += q[i];
        xsum[g] = sum;
    }
    memcpy(xsum + p->ng, &s, sizeof s);
}

const li_q4g_kernels li_q4g_kernels_avx2 = {.isa = "avx2", .a16 = li_q4g_a16_avx2, .a8 = avx2_a8,
                                            .act = li_q4g_act_quantize_avx2};
