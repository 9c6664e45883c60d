/* ops_q4g_avx512.c — 4-bit group-quantized weights, A8 with AVX-512 VNNI
 * (q4g_kernels.h). A16 is the AVX2 kernel.
 *
 * A8 runs 512-bit vectors on the 16-row panels of a8codes: lane l is
 * weight row 16p + l. Per chunk of 8 elements one 64-byte load gives
 * 4 codes per lane in the low nibbles and 4 in the high ones; the low
 * ones are b & 0x0f, the high ones are taken as b & 0xf0 (16 times the
 * code: no shift) into a sum of their own, which is divided by 16 once per
 * group (exact: every term is a multiple of 16; |sum| <= 240 * 127 * gs / 2
 * fits in int32 for any gs below 2^17). vpdpbusd multiplies them (unsigned)
 * with a broadcast word of 4 activation codes (signed) and adds the four
 * products. A group's integer sum is then lo + hi / 16 - zero * xsum and
 * the float steps are the reference's: acc = acc + scale * (float)isum,
 * y = acc * s_x, so the bits are li_q4g_a8_row_ref's.
 *
 * Decode (one activation row) runs four panels side by side: eight
 * independent vpdpbusd chains hide its latency, and the broadcasts are
 * shared. More rows run a panel against up to 4 rows (2 panels x 2-3
 * rows for 2-3): the unpacked codes serve every row. Compiled
 * everywhere, run only where CPUID has AVX-512 VNNI. */
#include "util/common.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

/* acc += the 4-byte dots of unsigned u and signed s per 32-bit lane
 * (_mm512_dpbusd_epi32). Inline asm ties acc to its register: with the
 * intrinsic GCC 12 copied every accumulator before each vpdpbusd (84
 * register moves in this file), as w8_avx512.c found. */
static inline __m512i dpbusd_r(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
/* the same with s a 4-byte word in memory broadcast to every lane (no
 * register for it) */
static inline __m512i dpbusd_b(__m512i acc, __m512i u, const uint8_t *s) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)s));
    return acc;
}

/* NR activation rows against NP panels from pp; NP * NR <= 6. pf: the
 * first pass over these panels, which prefetches the next NP panels
 * (the same line of each) as it goes */
static inline __attribute__((always_inline)) void a8_block(const li_q4g_packed *p, int64_t pp, const int NP,
                                                           const uint8_t *act, size_t act_stride, const int NR,
                                                           float *y, int64_t ldy, bool pf) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng, pb = p->a8_pb;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    __m512 acc[4][6];
    float sx[6];
    const int32_t *xsum[6];
#pragma GCC unroll 6
    for (int i = 0; i < NR; i++) {
        xsum[i] = (const int32_t *)(act + (size_t)i * act_stride + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++) acc[a][i] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
        const uint8_t *grp = li_q4g_a8_group(p, pp, g), *zs = grp + (t1 - t0) * 64;
        if (pf) /* the next panels' zeros and scales of this group (their codes: below) */
#pragma GCC unroll 4
            for (int a = 0; a < NP; a++) {
                _mm_prefetch((const char *)zs + (NP + a) * pb, _MM_HINT_T0);
                _mm_prefetch((const char *)zs + (NP + a) * pb + 64, _MM_HINT_T0);
            }
        __m512i sl[4][6], sh[4][6];
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++)
#pragma GCC unroll 6
            for (int i = 0; i < NR; i++) sl[a][i] = sh[a][i] = _mm512_setzero_si512();
        for (int64_t t = t0; t < t1; t++) {
            __m512i al[6], ah[6]; /* broadcasts shared by the panels (one panel: from memory) */
#pragma GCC unroll 6
            for (int i = 0; NP > 1 && i < NR; i++) {
                int32_t v[2];
                memcpy(v, act + (size_t)i * act_stride + t * 8, sizeof v);
                al[i] = _mm512_set1_epi32(v[0]);
                ah[i] = _mm512_set1_epi32(v[1]);
            }
#pragma GCC unroll 4
            for (int a = 0; a < NP; a++) {
                const uint8_t *src = grp + a * pb + (t - t0) * 64;
                /* to L2: 4 panels ahead is over 48 KiB at k = 1536, more than L1 holds */
                if (pf) _mm_prefetch((const char *)src + NP * pb, _MM_HINT_T1);
                const __m512i b = _mm512_load_si512(src);
                const __m512i lo = _mm512_and_si512(b, lo4), hi = _mm512_and_si512(b, hi4);
#pragma GCC unroll 6
                for (int i = 0; i < NR; i++) {
                    if (NP > 1) {
                        sl[a][i] = dpbusd_r(sl[a][i], lo, al[i]);
                        sh[a][i] = dpbusd_r(sh[a][i], hi, ah[i]);
                    } else {
                        const uint8_t *ai = act + (size_t)i * act_stride + t * 8;
                        sl[a][i] = dpbusd_b(sl[a][i], lo, ai);
                        sh[a][i] = dpbusd_b(sh[a][i], hi, ai + 4);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++) {
            const __m512i z = _mm512_load_si512(zs + a * pb);
            const __m512 s = _mm512_load_ps((const float *)(zs + a * pb + 64));
#pragma GCC unroll 6
            for (int i = 0; i < NR; i++) {
                const __m512i d = _mm512_sub_epi32(_mm512_add_epi32(sl[a][i], _mm512_srai_epi32(sh[a][i], 4)),
                                                   _mm512_mullo_epi32(z, _mm512_set1_epi32(xsum[i][g])));
                acc[a][i] = _mm512_add_ps(acc[a][i], _mm512_mul_ps(s, _mm512_cvtepi32_ps(d)));
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < NP; a++) {
        const int64_t left = p->m - (pp + a) * LI_PANEL;
        const __mmask16 mask = left >= LI_PANEL ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 6
        for (int i = 0; i < NR; i++)
            _mm512_mask_storeu_ps(y + i * ldy + (pp + a) * LI_PANEL, mask,
                                  _mm512_mul_ps(acc[a][i], _mm512_set1_ps(sx[i])));
    }
}

/* NR rows over panels [q0, q1), NP at a time (then fewer) */
static inline __attribute__((always_inline)) void a8_rows(const li_q4g_packed *p, int64_t q0, int64_t q1,
                                                          const int NP, const uint8_t *act, size_t as, const int NR,
                                                          float *y, int64_t ldy, bool pf) {
    int64_t pp = q0;
    for (; pp + NP <= q1; pp += NP) a8_block(p, pp, NP, act, as, NR, y, ldy, pf);
    if (NP >= 4 && pp + 3 <= q1) {
        a8_block(p, pp, 3, act, as, NR, y, ldy, pf);
        pp += 3;
    }
    if (NP >= 3 && pp + 2 <= q1) {
        a8_block(p, pp, 2, act, as, NR, y, ldy, pf);
        pp += 2;
    }
    for (; pp < q1; pp++) a8_block(p, pp, 1, act, as, NR, y, ldy, pf);
}

static void avx512_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy) {
    if (!p->a8_simd || r0 % LI_PANEL) {
        li_q4g_kernels_scalar.a8(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    const int64_t q0 = r0 / LI_PANEL, q1 = (r1 + LI_PANEL - 1) / LI_PANEL;
    /* r1 < m only at a panel boundary (the driver's units are panels) */
    /* groups of at most 6 rows, as even as possible (8 = 4 + 4, not 6 + 2:
     * a short group keeps too few sums in flight) */
    const int64_t groups = (n + 5) / 6;
    for (int64_t gi = 0, i = 0; gi < groups; gi++) {
        const int64_t nr = (n - i + (groups - gi) - 1) / (groups - gi);
        const uint8_t *a = act + (size_t)i * act_stride;
        float *yi = y + i * ldy;
        const bool pf = gi == 0;
        switch (nr) {
        case 6: a8_rows(p, q0, q1, 1, a, act_stride, 6, yi, ldy, pf); break;
        case 5: a8_rows(p, q0, q1, 1, a, act_stride, 5, yi, ldy, pf); break;
        case 4: a8_rows(p, q0, q1, 1, a, act_stride, 4, yi, ldy, pf); break;
        case 3: a8_rows(p, q0, q1, 1, a, act_stride, 3, yi, ldy, pf); break;
        case 2: a8_rows(p, q0, q1, 2, a, act_stride, 2, yi, ldy, pf); break;
        default: a8_rows(p, q0, q1, 4, a, act_stride, 1, yi, ldy, pf); break;
        }
        i += nr;
    }
}

const li_q4g_kernels li_q4g_kernels_avx512 = {.isa = "avx512", .a16 = li_q4g_a16_avx2, .a8 = avx512_a8,
                                              .act = li_q4g_act_quantize_avx2};
