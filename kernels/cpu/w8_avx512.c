/* w8_avx512.c — the W8A8 int8 gemm with AVX-512 VNNI and the FP8 gemm
 * with AVX-512 BF16 (w8_kernels.h).
 * int8: vpdpbusd multiplies unsigned by signed bytes, so activations go in
 * as a + 128 and the dot is corrected by 128 * sum(w), itself a vpdpbusd of
 * the weights with bytes of 128: exact integers, the same bits as the
 * scalar kernel.
 * fp8: vdpbf16ps, lane i += w[2i+1] a[2i+1], then += w[2i] a[2i], each an
 * FMA rounded to nearest even (DAZ / FTZ: no operand or sum of e4m3
 * products is subnormal), is the scalar kernel's order, 32 elements a
 * block. Weights are widened e4m3 -> bf16 by a 128-entry table (two
 * vpermt2w) and the sign bit; for more than 4 activation rows 4 weight
 * rows are widened once into a buffer and read by every row.
 * Activation quantization uses the AVX2 kernels (every CPU with AVX-512 has
 * AVX2), as does fp8 on a CPU without AVX512_BF16. */
#include "util/common.h"
#include "cpu/cpu_kernels.h" /* li_cpu_panel_mask */
#include "cpu/w8_kernels.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>

/* acc += the 4-byte dots of unsigned u and signed s, per 32-bit lane
 * (_mm512_dpbusd_epi32). Inline asm ties acc to its register: with the
 * intrinsic GCC 12 copies each accumulator before the instruction and
 * spills the copy at every step of the k loop. */
static inline __m512i dpbusd_r(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

/* int8: a tile of up to 4 weight rows (nc real) x nr activation rows in zmm
 * accumulators, 64 bytes of k a step (the tail by masked loads: masked
 * bytes are 0 in both operands, so they add 0). 128 * sum(w) of each
 * weight row comes from one pass of its own (bias bytes against w). */
/* the sums of a0..a3's lanes, as 4 int32 (a transpose-add tree: a
 * quarter of four horizontal reductions' work) */
static inline __m128i hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline __attribute__((always_inline)) void tile_int8(const int8_t *const wp[4], const int8_t *a, int64_t k,
                                                            const int nr, int nc, const int32_t corr[4],
                                                            const float *as, const float *ws, float *y, int64_t ldy) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) acc[i][u] = _mm512_setzero_si512();
    for (int64_t j = 0; j < k; j += 64) {
        const __mmask64 m = k - j >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - j)) - 1);
        __m512i vw[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            _mm_prefetch((const char *)(wp[u] + j) + 16 * k, _MM_HINT_T0); /* the rows 4 blocks on */
            vw[u] = _mm512_maskz_loadu_epi8(m, wp[u] + j);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const __m512i va = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, a + i * k + j), bias); /* a + 128 as u8 */
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[i][u] = dpbusd_r(acc[i][u], va, vw[u]);
        }
    }
    const __m128i vc = _mm_loadu_si128((const __m128i *)corr);
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) {
        int32_t d[4];
        _mm_storeu_si128((__m128i *)d, _mm_sub_epi32(hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), vc));
        for (int u = 0; u < nc; u++) y[i * ldy + u] = (float)d[u] * (as[i] * ws[u]);
    }
}

/* 128 * sum(w) over k: what a + 128 adds to the dot */
static inline int32_t bias_corr(const int8_t *w, int64_t k) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i c = _mm512_setzero_si512();
    for (int64_t j = 0; j < k; j += 64) {
        const __mmask64 m = k - j >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - j)) - 1);
        c = _mm512_dpbusd_epi32(c, bias, _mm512_maskz_loadu_epi8(m, w + j));
    }
    return _mm512_reduce_add_epi32(c);
}

static void gemm_int8_avx512(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                             const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t c = c0; c < c1; c += 4) {
        const int nc = (int)LI_MIN(4, c1 - c);
        const int8_t *wp[4];
        int32_t corr[4];
        for (int u = 0; u < 4; u++) {
            wp[u] = w + (c + (u < nc ? u : 0)) * k; /* a short block repeats row c */
            corr[u] = u < nc ? bias_corr(wp[u], k) : corr[0];
        }
        for (int64_t r = r0; r < r1; r += 4) {
            const int8_t *ar = a + r * k;
            float *yr = y + r * ldy + c;
            switch ((int)LI_MIN(4, r1 - r)) { /* constant row counts keep the accumulators in registers */
            case 4: tile_int8(wp, ar, k, 4, nc, corr, as + r, ws + c, yr, ldy); break;
            case 3: tile_int8(wp, ar, k, 3, nc, corr, as + r, ws + c, yr, ldy); break;
            case 2: tile_int8(wp, ar, k, 2, nc, corr, as + r, ws + c, yr, ldy); break;
            default: tile_int8(wp, ar, k, 1, nc, corr, as + r, ws + c, yr, ldy); break;
            }
        }
    }
}

/* int8 on panels (w8_kernels.h): NP panels x NR activation rows of int32
 * sums in registers, lane l of a sum = row 16p + l; per 4 codes of k, NP
 * weight loads and NR broadcast words. Inlined with constant NP and NR. */
#define W8P_NP 4
#define W8P_NR 6
#define W8P_PREFETCH 16384 /* bytes ahead in each panel's stream, on the first pass over it */


static inline __attribute__((always_inline)) void tile_int8_packed(const uint8_t *w0, int64_t pstride, const int np,
                                                                   const int nr, int64_t k, const int8_t *a,
                                                                   const int32_t *asum, const float *as,
                                                                   const float *ws, int64_t m, float *y, int64_t ldy,
                                                                   bool pf) {
    /* one small array per row, not one [NR][NP] array: GCC keeps
     * aggregates of up to ~1 KiB in registers, and 24 zmm are 1.5 KiB */
    __m512i c0[W8P_NP], c1[W8P_NP], c2[W8P_NP], c3[W8P_NP], c4[W8P_NP], c5[W8P_NP];
#pragma GCC unroll 4
    for (int p = 0; p < np; p++)
        c0[p] = c1[p] = c2[p] = c3[p] = c4[p] = c5[p] = _mm512_setzero_si512();
    for (int64_t j = 0; j < k; j += 4) {
        __m512i vw[W8P_NP];
#pragma GCC unroll 4
        for (int p = 0; p < np; p++) {
            if (pf) _mm_prefetch((const char *)(w0 + p * pstride + j * 16) + W8P_PREFETCH, _MM_HINT_T0); /* a line a step */
            vw[p] = _mm512_load_si512(w0 + p * pstride + j * 16);
        }
#define ROW(I, C)                                                                                                  \
    if (I < nr) {                                                                                                  \
        int32_t word;                                                                                              \
        __builtin_memcpy(&word, a + I * k + j, 4);                                                                 \
        const __m512i va = _mm512_set1_epi32(word);                                                                \
        _Pragma("GCC unroll 4") for (int p = 0; p < np; p++) C[p] = dpbusd_r(C[p], vw[p], va);               \
    }
        ROW(0, c0) ROW(1, c1) ROW(2, c2) ROW(3, c3) ROW(4, c4) ROW(5, c5)
#undef ROW
    }
#pragma GCC unroll 4
    for (int p = 0; p < np; p++) {
        const __mmask16 mask = li_cpu_panel_mask(m, p);
        const __m512 vs = _mm512_maskz_loadu_ps(mask, ws + p * 16);
        /* (dot - 128 sum a) * (as * ws): the scalar kernel's operations */
#define OUT(I, C)                                                                                                  \
    if (I < nr) {                                                                                                  \
        const __m512i d = _mm512_sub_epi32(C[p], _mm512_set1_epi32(128 * asum[I]));                              \
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(as[I]), vs);                                                 \
        _mm512_mask_storeu_ps(y + I * ldy + p * 16, mask, _mm512_mul_ps(_mm512_cvtepi32_ps(d), s));                \
    }
        OUT(0, c0) OUT(1, c1) OUT(2, c2) OUT(3, c3) OUT(4, c4) OUT(5, c5)
#undef OUT
    }
}

/* rows [r0, r1) against NP panels from pp (np of them real) */
static inline __attribute__((always_inline)) void rows_int8_packed(const li_w8_packed *w, const float *ws, int64_t pp,
                                                                   const int np, const int8_t *a, const int32_t *asum,
                                                                   const float *as, int64_t r0, int64_t r1, float *y,
                                                                   int64_t ldy) {
    const int64_t k = w->k, pstride = k * 16, m = w->m - pp * 16;
    const uint8_t *w0 = w->codes + pp * pstride;
    const float *wsp = ws + pp * 16;
    float *yp = y + pp * 16;
    /* groups of at most W8P_NR rows, as even as possible: a short last
     * group has too few sums in flight to hide vpdpbusd's latency */
    const int64_t groups = (r1 - r0 + W8P_NR - 1) / W8P_NR;
    for (int64_t g = 0, r = r0; g < groups; g++) {
        const int64_t nr = (r1 - r + (groups - g) - 1) / (groups - g);
#define T(NR) tile_int8_packed(w0, pstride, np, NR, k, a + r * k, asum + r, as + r, wsp, m, yp + r * ldy, ldy, g == 0)
        switch (nr) {
        case 6: T(6); break;
        case 5: T(5); break;
        case 4: T(4); break;
        case 3: T(3); break;
        case 2: T(2); break;
        default: T(1); break;
        }
#undef T
        r += nr;
    }
}

void li_w8_gemm_int8_packed_avx512(const li_w8_packed *w, const float *ws, int64_t p0, int64_t p1, const int8_t *a,
                                   const int32_t *asum, const float *as, int64_t r0, int64_t r1, float *y,
                                   int64_t ldy) {
    int64_t pp = p0;
    for (; pp + W8P_NP <= p1; pp += W8P_NP) rows_int8_packed(w, ws, pp, W8P_NP, a, asum, as, r0, r1, y, ldy);
    switch (p1 - pp) {
    case 3: rows_int8_packed(w, ws, pp, 3, a, asum, as, r0, r1, y, ldy); break;
    case 2: rows_int8_packed(w, ws, pp, 2, a, asum, as, r0, r1, y, ldy); break;
    case 1: rows_int8_packed(w, ws, pp, 1, a, asum, as, r0, r1, y, ldy); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------
 * fp8
 * ---------------------------------------------------------------------- */

/* CPUID leaf 7 subleaf 1, EAX bit 5 (AVX-512 itself: have_avx512, cpu.c) */
bool li_w8_have_bf16(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

/* bf16 bits of the e4m3 magnitudes 0..127 as li_w8_fp8_widen reads them
 * (0-7: m * 2^-9; then (c << 4) + (120 << 7); 127: 480), 32 a register.
 * Every code runs in tests/unit/test_w8.c, bit for bit with the scalar. */
static const uint16_t fp8_bf16_tab[128] __attribute__((aligned(64))) = {
    0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60,
    0x3c80, 0x3c90, 0x3ca0, 0x3cb0, 0x3cc0, 0x3cd0, 0x3ce0, 0x3cf0,
    0x3d00, 0x3d10, 0x3d20, 0x3d30, 0x3d40, 0x3d50, 0x3d60, 0x3d70,
    0x3d80, 0x3d90, 0x3da0, 0x3db0, 0x3dc0, 0x3dd0, 0x3de0, 0x3df0,
    0x3e00, 0x3e10, 0x3e20, 0x3e30, 0x3e40, 0x3e50, 0x3e60, 0x3e70,
    0x3e80, 0x3e90, 0x3ea0, 0x3eb0, 0x3ec0, 0x3ed0, 0x3ee0, 0x3ef0,
    0x3f00, 0x3f10, 0x3f20, 0x3f30, 0x3f40, 0x3f50, 0x3f60, 0x3f70,
    0x3f80, 0x3f90, 0x3fa0, 0x3fb0, 0x3fc0, 0x3fd0, 0x3fe0, 0x3ff0,
    0x4000, 0x4010, 0x4020, 0x4030, 0x4040, 0x4050, 0x4060, 0x4070,
    0x4080, 0x4090, 0x40a0, 0x40b0, 0x40c0, 0x40d0, 0x40e0, 0x40f0,
    0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
    0x4180, 0x4190, 0x41a0, 0x41b0, 0x41c0, 0x41d0, 0x41e0, 0x41f0,
    0x4200, 0x4210, 0x4220, 0x4230, 0x4240, 0x4250, 0x4260, 0x4270,
    0x4280, 0x4290, 0x42a0, 0x42b0, 0x42c0, 0x42d0, 0x42e0, 0x42f0,
    0x4300, 0x4310, 0x4320, 0x4330, 0x4340, 0x4350, 0x4360, 0x4370,
    0x4380, 0x4390, 0x43a0, 0x43b0, 0x43c0, 0x43d0, 0x43e0, 0x43f0,
};

typedef struct {
    __m512i t[4];
} bf16_lut;

static inline void lut_init(bf16_lut *l) {
    for (int i = 0; i < 4; i++) l->t[i] = _mm512_load_si512(fp8_bf16_tab + 32 * i);
}

/* 32 e4m3 bytes (the last block: n < 32 of them, zeros after) as bf16 */
static inline __m512i widen32(const bf16_lut *l, const uint8_t *p, int64_t n) {
    const __m256i b = n >= 32 ? _mm256_loadu_si256((const __m256i *)p)
                              : _mm256_maskz_loadu_epi8((__mmask32)((1ull << n) - 1), p);
    const __m512i x = _mm512_cvtepu8_epi16(b);
    const __m512i lo = _mm512_permutex2var_epi16(l->t[0], x, l->t[1]); /* index bits 0-5 */
    const __m512i hi = _mm512_permutex2var_epi16(l->t[2], x, l->t[3]);
    const __m512i m = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)), lo, hi);
    return _mm512_ternarylogic_epi32(m, _mm512_slli_epi16(x, 8), _mm512_set1_epi16((short)0x8000), 0xf8); /* m | (s & 0x8000) */
}

static inline __m512 dp(__m512 acc, __m512i a, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)w);
}

/* the 16 lanes folded 8, 4, 2, 1 (w8_kernels.h) */
static inline float fold16(__m512 v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* NR activation rows x 4 weight rows (nc of them stored), into y. wp: the
 * weights' rows (widened in registers), or wb: 4 rows already widened,
 * stride lda. Inlined with a constant nr, so the accumulators stay in
 * registers. */
static inline __attribute__((always_inline)) void block_fp8(const bf16_lut *l, const uint8_t *const wp[4],
                                                            const uint16_t *wb, int64_t k, const uint16_t *a,
                                                            int64_t lda, const int nr, int nc, const float *as,
                                                            const float *ws, float *y, int64_t ldy) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) acc[i][u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k; b += 32) {
        __m512i vw[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            if (!wb) _mm_prefetch((const char *)(wp[u] + b) + 16 * k, _MM_HINT_T0); /* the rows 4 blocks on */
            vw[u] = wb ? _mm512_load_si512(wb + u * lda + b) : widen32(l, wp[u] + b, k - b);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const __m512i va = _mm512_loadu_si512(a + i * lda + b);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[i][u] = dp(acc[i][u], va, vw[u]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            if (u < nc) y[i * ldy + u] = fold16(acc[i][u]) * (as[i] * ws[u]);
}

static void gemm_fp8_avx512(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const uint16_t *a,
                            const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    static atomic_int bf16 = -1; /* CPUID once (a VM exit each time) */
    int has = atomic_load_explicit(&bf16, memory_order_relaxed);
    if (has < 0) atomic_store_explicit(&bf16, has = li_w8_have_bf16(), memory_order_relaxed);
    if (!has) {
        li_w8_gemm_fp8_avx2(w, ws, k, c0, c1, a, as, r0, r1, y, ldy);
        return;
    }
    bf16_lut l;
    lut_init(&l);
    const int64_t lda = LI_W8_FP8_LDA(k);
    const bool buffered = r1 - r0 > 4;
    uint16_t *wb = buffered ? li_aligned_alloc((size_t)(4 * lda) * sizeof(uint16_t)) : NULL;
    for (int64_t c = c0; c < c1; c += 4) {
        const int nc = (int)LI_MIN((int64_t)4, c1 - c);
        const uint8_t *wp[4];
        for (int u = 0; u < 4; u++) wp[u] = w + (c + (u < nc ? u : 0)) * k; /* short block: row c again */
        if (buffered)
            for (int u = 0; u < 4; u++)
                for (int64_t b = 0; b < k; b += 32) _mm512_store_si512(wb + u * lda + b, widen32(&l, wp[u] + b, k - b));
        for (int64_t r = r0; r < r1; r += 4) {
            const int nr = (int)LI_MIN((int64_t)4, r1 - r);
            const uint16_t *ar = a + r * lda;
            float *yr = y + r * ldy + c;
            /* constant row counts and a constant wb (NULL or not) */
#define BLOCK(WB, NR) block_fp8(&l, wp, WB, k, ar, lda, NR, nc, as + r, ws + c, yr, ldy)
            if (buffered) {
                if (nr == 4) BLOCK(wb, 4);
                else if (nr == 3) BLOCK(wb, 3);
                else if (nr == 2) BLOCK(wb, 2);
                else BLOCK(wb, 1);
            } else {
                if (nr == 4) BLOCK(NULL, 4);
                else if (nr == 3) BLOCK(NULL, 3);
                else if (nr == 2) BLOCK(NULL, 2);
                else BLOCK(NULL, 1);
            }
#undef BLOCK
        }
    }
    li_aligned_free(wb);
}

/* the two tables differ in the packed int8 gemm only */
#define W8_AVX512_SHARED                                                                                        \
    .quantize_int8 = li_w8_quantize_int8_avx2, .quantize_fp8 = li_w8_quantize_fp8_avx2,                        \
    .gemm_int8 = gemm_int8_avx512, .gemm_fp8 = gemm_fp8_avx512

const li_w8_kernels li_w8_kernels_avx512 = {.isa = "avx512", .gemm_int8_packed = li_w8_gemm_int8_packed_avx512,
                                            W8_AVX512_SHARED};

/* AVX-512's, with the packed int8 gemm on AMX tiles (w8_amx.c: the same bits) */
const li_w8_kernels li_w8_kernels_amx = {.isa = "amx", .gemm_int8_packed = li_w8_gemm_int8_packed_amx,
                                         W8_AVX512_SHARED};
