/* ops_q4g_avx512.c — 4-bit group-quantized weights, A8 with AVX-512 VNNI
 * (q4g_kernels.h). A16 is the AVX2 kernel.
 *
 * A8 runs 512-bit vectors on the 16-row panels of a8codes: lane l is
 * weight row 16p + l. Per chunk of 8 elements one 64-byte load gives
 * 4 codes per lane in the low nibbles and 4 in the high ones; the low
 * ones are b & 0x0f, the high ones are taken as b & 0xf0 (16 times the
 * code: no shift) into a sum of their own, which is divided by 16 once per
 * group (exact: every term is a multiple of 16; |sum| <= 240 * 127 * gs / 2
 * fits in int32 for any gs below 2^17); with 4 rows or more they are
 * shifted down instead (and at 7-8 rows share the low ones' sum). vpdpbusd multiplies them (unsigned)
 * with a broadcast word of 4 activation codes (signed) and adds the four
 * products. A group's integer sum is then lo + hi / 16 - zero * xsum and
 * the float steps are the reference's: acc = acc + scale * (float)isum,
 * y = acc * s_x, so the bits are li_q4g_a8_row_ref's.
 *
 * Up to 3 rows (decode) read the panels in address order, one stream;
 * more run a panel against up to 8 rows at a time, the unpacked codes
 * serving every row. Compiled everywhere, run only where CPUID has
 * AVX-512 VNNI. */
#include "util/common.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

/* acc += the 4-byte dots of unsigned u and the signed 4-byte word at s,
 * broadcast to every 32-bit lane (_mm512_dpbusd_epi32, no register for
 * s). Inline asm ties acc to its register: with the intrinsic GCC 12
 * copied every accumulator before each vpdpbusd (84 register moves in
 * this file), as w8_avx512.c found. */
static inline __m512i dpbusd_b(__m512i acc, __m512i u, const uint8_t *s) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)s));
    return acc;
}

/* A group's float step, the reference's: acc + scale * (float)(isum - zero * xsum) */
static inline __m512 group_add(__m512 acc, __m512i isum, __m512i z, __m512 s, int32_t xsum) {
    return _mm512_add_ps(acc, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                   isum, _mm512_mullo_epi32(z, _mm512_set1_epi32(xsum))))));
}

/* y[i][16pp + l] = acc[i] * s_x[i] for the valid rows l of panel pp */
static inline __attribute__((always_inline)) void store_panel(const li_q4g_packed *p, int64_t pp, const __m512 *acc,
                                                              const float *sx, const int NR, float *y, int64_t ldy) {
    const __mmask16 mask = li_cpu_panel_mask(p->m, pp);
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
        _mm512_mask_storeu_ps(y + i * ldy + pp * LI_PANEL, mask, _mm512_mul_ps(acc[i], _mm512_set1_ps(sx[i])));
}

/* NR (4..8) rows against panel pp. The high nibbles are shifted down; up
 * to 6 rows sum them apart from the low ones (two vpdpbusd chains per row),
 * 7 and 8 into the same sum (two per row would not fit the 32 registers).
 * pf: the first pass over this panel, which prefetches ahead of itself */
static inline __attribute__((always_inline)) void a8_panel(const li_q4g_packed *p, int64_t pp, const uint8_t *act,
                                                             size_t act_stride, const int NR, float *y, int64_t ldy,
                                                             bool pf) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng;
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512 acc[8];
    float sx[8];
    const int32_t *xsum[8];
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        xsum[i] = (const int32_t *)(act + (size_t)i * act_stride + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
        acc[i] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
        const uint8_t *grp = li_q4g_a8_group(p, pp, g), *zs = grp + (t1 - t0) * 64;
        if (pf) {
            __asm__ volatile("prefetcht0 %0" : : "m"(*(zs + LI_GEMV_PREFETCH)));
            __asm__ volatile("prefetcht0 %0" : : "m"(*(zs + LI_GEMV_PREFETCH + 64)));
        }
        __m512i sm[8], sh[8]; /* sh: the high nibbles' own sums, up to 6 rows */
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++) sm[i] = sh[i] = _mm512_setzero_si512();
        for (int64_t t = t0; t < t1; t++) {
            const uint8_t *src = grp + (t - t0) * 64;
            if (pf) __asm__ volatile("prefetcht0 %0" : : "m"(*(src + LI_GEMV_PREFETCH)));
            const __m512i b = _mm512_load_si512(src);
            const __m512i lo = _mm512_and_si512(b, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
#pragma GCC unroll 8
            for (int i = 0; i < NR; i++) {
                const uint8_t *ai = act + (size_t)i * act_stride + t * 8;
                sm[i] = dpbusd_b(sm[i], lo, ai);
                if (NR <= 6) sh[i] = dpbusd_b(sh[i], hi, ai + 4);
                else sm[i] = dpbusd_b(sm[i], hi, ai + 4);
            }
        }
        const __m512i z = _mm512_load_si512(zs);
        const __m512 s = _mm512_load_ps((const float *)(zs + 64));
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++)
            acc[i] = group_add(acc[i], NR <= 6 ? _mm512_add_epi32(sm[i], sh[i]) : sm[i], z, s, xsum[i][g]);
    }
    store_panel(p, pp, acc, sx, NR, y, ldy);
}

/* Decode: NR (1..3) rows against panels [q0, q1), one panel after the
 * other, so the weights are one stream read in address order, prefetched
 * LI_GEMV_PREFETCH bytes ahead into L1 as Q4_1's GEMV does (running
 * several panels side by side, with their prefetches, left A8 decode at
 * 0.7-0.9x Q4_1 when the weights came from memory: bench_kernels
 * --q4-stream). Chunks go in pairs, four integer sums per row. */
static inline __attribute__((always_inline)) void a8_gemv(const li_q4g_packed *p, int64_t q0, int64_t q1,
                                                          const uint8_t *act, size_t as, const int NR, float *y,
                                                          int64_t ldy) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    const int32_t *xsum[3];
    float sx[3];
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++) {
        xsum[i] = (const int32_t *)(act + (size_t)i * as + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
    }
    for (int64_t pp = q0; pp < q1; pp++) {
        __m512 acc[3];
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
            const uint8_t *grp = li_q4g_a8_group(p, pp, g), *zs = grp + (t1 - t0) * 64;
            __m512i l0[3], l1[3], h0[3], h1[3];
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) l0[i] = l1[i] = h0[i] = h1[i] = _mm512_setzero_si512();
            for (int64_t t = t0; t < t1; t += 2) {
                const uint8_t *src = grp + (t - t0) * 64;
                __asm__ volatile("prefetcht0 %0" : : "m"(*(src + LI_GEMV_PREFETCH)));
                __asm__ volatile("prefetcht0 %0" : : "m"(*(src + LI_GEMV_PREFETCH + 64)));
                /* an odd last chunk pairs with zero codes: its products add 0 (the activation
                 * words read past the group are the next group's or the row's sums, in bounds) */
                const __m512i b0 = _mm512_load_si512(src),
                              b1 = t + 1 < t1 ? _mm512_load_si512(src + 64) : _mm512_setzero_si512();
                const __m512i lo0 = _mm512_and_si512(b0, lo4), hi0 = _mm512_and_si512(b0, hi4);
                const __m512i lo1 = _mm512_and_si512(b1, lo4), hi1 = _mm512_and_si512(b1, hi4);
#pragma GCC unroll 3
                for (int i = 0; i < NR; i++) {
                    const uint8_t *ai = act + (size_t)i * as + t * 8;
                    l0[i] = dpbusd_b(l0[i], lo0, ai);
                    h0[i] = dpbusd_b(h0[i], hi0, ai + 4);
                    l1[i] = dpbusd_b(l1[i], lo1, ai + 8);
                    h1[i] = dpbusd_b(h1[i], hi1, ai + 12);
                }
            }
            __asm__ volatile("prefetcht0 %0" : : "m"(*(zs + LI_GEMV_PREFETCH)));
            __asm__ volatile("prefetcht0 %0" : : "m"(*(zs + LI_GEMV_PREFETCH + 64)));
            const __m512i z = _mm512_load_si512(zs);
            const __m512 s = _mm512_load_ps((const float *)(zs + 64));
#pragma GCC unroll 3
            for (int i = 0; i < NR; i++) {
                const __m512i sl = _mm512_add_epi32(l0[i], l1[i]), sh = _mm512_add_epi32(h0[i], h1[i]);
                acc[i] = group_add(acc[i], _mm512_add_epi32(sl, _mm512_srai_epi32(sh, 4)), z, s, xsum[i][g]);
            }
        }
        store_panel(p, pp, acc, sx, NR, y, ldy);
    }
}

void li_q4g_a8_avx512(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy) {
    if (!p->a8codes || r0 % LI_PANEL) {
        li_q4g_kernels_scalar.a8(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    const int64_t q0 = r0 / LI_PANEL, q1 = (r1 + LI_PANEL - 1) / LI_PANEL;
    /* r1 < m only at a panel boundary (the driver's units are panels) */
    if (n <= 3) {
        if (n == 1) a8_gemv(p, q0, q1, act, act_stride, 1, y, ldy);
        else if (n == 2) a8_gemv(p, q0, q1, act, act_stride, 2, y, ldy);
        else a8_gemv(p, q0, q1, act, act_stride, 3, y, ldy);
        return;
    }
    /* 4-8 rows in one group (one pass over the weights); more in groups of
     * at most 6, as even as possible (the two sums per row keep vpdpbusd's
     * latency hidden where the products are compute-bound). The first
     * group streams the weights, the others find them in L2 */
    const int64_t groups = n <= 8 ? 1 : (n + 5) / 6;
    for (int64_t gi = 0, i = 0; gi < groups; gi++) {
        const int64_t nr = (n - i + (groups - gi) - 1) / (groups - gi);
        const uint8_t *a = act + (size_t)i * act_stride;
        float *yi = y + i * ldy;
        const bool pf = gi == 0;
        for (int64_t pp = q0; pp < q1; pp++) switch (nr) {
            case 8: a8_panel(p, pp, a, act_stride, 8, yi, ldy, pf); break;
            case 7: a8_panel(p, pp, a, act_stride, 7, yi, ldy, pf); break;
            case 6: a8_panel(p, pp, a, act_stride, 6, yi, ldy, pf); break;
            case 5: a8_panel(p, pp, a, act_stride, 5, yi, ldy, pf); break;
            default: a8_panel(p, pp, a, act_stride, 4, yi, ldy, pf); break;
            }
        i += nr;
    }
}
const li_q4g_kernels li_q4g_kernels_avx512 = {.isa = "avx512", .a16 = li_q4g_a16_avx2, .a8 = li_q4g_a8_avx512,
                                              .act = li_q4g_act_quantize_avx2};
