/* ops_amx.c — quantized matmul on Intel AMX tiles (AMX-TILE + AMX-INT8).
 *
 * Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags; cpu.c calls in
 * only after li_cpu_amx_usable() (CPUID, XCR0, and the kernel's permission).
 *
 * The same panels (cpu_kernels.h, repack.c) and the same float arithmetic
 * as ops_avx512.c's GEMM: only the integer block dots move to the tile unit.
 * One TDPBSUD per block multiplies the block's activations of up to 16 rows
 * (A: rows x 32 signed bytes, straight from the packed activation rows) by
 * the 16 weight rows of a panel (B: 8 rows x 64 unsigned bytes, 4 elements
 * of each weight row a tile row, which is the panel's own layout: Q8_0's
 * codes as stored, Q4's nibbles split into their own bytes). The int32 sums
 * are exact, so each output gets the bits of the AVX-512 kernel (and of the
 * scalar reference): isum (+ the Q4_0/Q8_0 offset), converted, times
 * d_w*d_a, [+ m_w*s_a], added to the row's sum, block after block.
 * Groups of fewer than AMX_MIN_ROWS rows go to the AVX-512 kernel.
 *
 * What it buys is bounded by that float arithmetic (6 vector operations a
 * row and block, against the AVX-512 kernel's 15 with its 8 vpdpbusd), and
 * the tile loads and stores do not overlap the vector loads: measured
 * 1.1-1.2x at 12-512 rows (docs/benchmarks.md, session 35). */
#define _GNU_SOURCE /* syscall() */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * can this process use AMX?
 * ---------------------------------------------------------------------- */

#define ARCH_REQ_XCOMP_PERM 0x1023 /* asm/prctl.h, Linux 5.16 */
#define XFEATURE_XTILEDATA 18

static int amx_state; /* 0 not asked yet, 1 usable, -1 not */

/* CPUID.7.0:EDX bits 24 (AMX-TILE) and 25 (AMX-INT8); XCR0 bits 17-18 (the
 * OS saves tile state); then the kernel's leave to use the 8 KiB of tile
 * data (Linux asks each process to request it: without it the first tile
 * instruction faults). Asked once; the answer holds for all threads. */
bool li_cpu_amx_usable(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    unsigned a, b, c, d;
    bool ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 25));
    if (ok && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE: xgetbv is allowed */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        ok = (lo & (3u << 17)) == (3u << 17);
    } else {
        ok = false;
    }
    if (ok) ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    __atomic_store_n(&amx_state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
}

/* ------------------------------------------------------------------------
 * tiles
 *   0-3  C: block sums, rows x 16 int32 (4 blocks in flight)
 *   4, 6 A: activations of a block, rows x 32 int8
 *   5, 7 B: a panel's block, 8 x 64 uint8
 * ---------------------------------------------------------------------- */

static void amx_config(int nr) {
    const uint8_t r = (uint8_t)nr;
    li_amx_config((const uint8_t[8]){r, r, r, r, r, 8, r, 8}, (const uint16_t[8]){64, 64, 64, 64, 32, 64, 32, 64});
}

#define GROUP 16                     /* activation rows a tile holds */
#define CHUNK_BYTES (256 << 10)      /* weight panels per sweep of the row groups: they stay in L2 */


/* The float arithmetic of blocks [b, b + q) for rows [0, nr), their int32
 * sums in cs: each row's terms added to acc[r] in block order */
static inline __attribute__((always_inline)) void epilogue(li_type t, const uint8_t *dd, const uint8_t *mm,
                                                           const char *act, size_t as, size_t d_off, size_t s_off,
                                                           size_t sum_off, int nr, int64_t b, int q,
                                                           int32_t (*cs)[GROUP][16], __m512 *acc) {
    const int corr = t == LI_TYPE_Q4_0 ? -8 : -128; /* Q4_1: none */
    __m512 dw[4], mw[4];
    for (int j = 0; j < q; j++) {
        dw[j] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dd + (b + j) * 32)));
        mw[j] = t == LI_TYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mm + (b + j) * 32)))
                                  : _mm512_setzero_ps();
    }
#pragma GCC unroll 16
    for (int r = 0; r < GROUP; r++) {
        if (r >= nr) break;
        const char *a = act + r * as;
        const float *da = (const float *)(a + d_off) + b, *sa = (const float *)(a + s_off) + b;
        const int32_t *asum = (const int32_t *)(a + sum_off) + b;
        for (int j = 0; j < q; j++) {
            __m512i is = _mm512_load_si512(cs[j][r]);
            if (t != LI_TYPE_Q4_1) is = _mm512_add_epi32(is, _mm512_set1_epi32(corr * asum[j]));
            const __m512 dwa = _mm512_mul_ps(dw[j], _mm512_set1_ps(da[j]));
            __m512 term = _mm512_mul_ps(dwa, _mm512_cvtepi32_ps(is));
            if (t == LI_TYPE_Q4_1) term = _mm512_add_ps(term, _mm512_mul_ps(mw[j], _mm512_set1_ps(sa[j])));
            acc[r] = _mm512_add_ps(acc[r], term);
        }
    }
}

/* Rows [0, nr) of one row group (act: its first row) against panel `panel`,
 * the tiles configured for nr rows. Blocks go 4 at a time: their B tiles
 * unpacked (Q4), four TDPBSUD, the sums stored; the float arithmetic of
 * the previous four runs while the tile unit works on these (the sums of a
 * tile store reach vector loads only once the store has retired). */
static inline __attribute__((always_inline)) void panel_group(li_type t, int64_t k, const uint8_t *panel,
                                                              const char *act, size_t as, int nr, float *y,
                                                              int64_t ldy, __mmask16 mask, bool pf) {
    const int64_t nb = k / 32;
    const size_t qsb = t == LI_TYPE_Q8_0 ? 512 : 256;
    const uint8_t *dd = panel + nb * qsb, *mm = dd + nb * 32;
    const size_t d_off = li_qact_qs_bytes(k);
    const size_t s_off = d_off + (size_t)nb * 4, sum_off = s_off + (size_t)nb * 4;
    const size_t step = qsb + 32 * (t == LI_TYPE_Q4_1 ? 2 : 1);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    _Alignas(64) uint8_t ub[4][512];
    _Alignas(64) int32_t cs[2][4][GROUP][16];
    __m512 acc[GROUP];
#pragma GCC unroll 16
    for (int r = 0; r < GROUP; r++) acc[r] = _mm512_setzero_ps();
    int64_t prev = -1; /* the first block of the four stored last time */
    for (int64_t b = 0; b < nb; b += 4) {
        const int q = nb - b < 4 ? (int)(nb - b) : 4;
        if (pf)
            for (size_t o = 0; o < step * (size_t)q; o += 64) li_cpu_prefetch_l1(panel + LI_GEMV_PREFETCH + b * step + o);
        const uint8_t *bt[4] = {0};
        for (int j = 0; j < q; j++) {
            const uint8_t *qs = panel + (b + j) * qsb;
            if (t == LI_TYPE_Q8_0) {
                bt[j] = qs; /* the panel is already 8 tile rows of 64 bytes */
                continue;
            }
            for (int c = 0; c < 4; c++) { /* chunk c: elements 4c.. (low nibbles), 16+4c.. (high) */
                const __m512i raw = _mm512_load_si512(qs + 64 * c);
                _mm512_store_si512(ub[j] + 64 * c, _mm512_and_si512(raw, low4));
                _mm512_store_si512(ub[j] + 256 + 64 * c, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
            }
            bt[j] = ub[j];
        }
        const char *a0 = act + b * 32;
        int32_t(*c)[GROUP][16] = cs[(b / 4) & 1];
        /* block J of the four into C tile TC (A, B tiles TA, TB); tile numbers must be constants */
#define BLOCK_DP(J, TC, TA, TB)                                                                                    \
    do {                                                                                                           \
        _tile_zero(TC);                                                                                            \
        _tile_loadd(TA, a0 + 32 * (J), (long)as);                                                                  \
        _tile_loadd(TB, bt[J], 64);                                                                                \
        _tile_dpbsud(TC, TA, TB);                                                                                  \
    } while (0)
        BLOCK_DP(0, 0, 4, 5);
        if (q > 1) BLOCK_DP(1, 1, 6, 7);
        if (q > 2) BLOCK_DP(2, 2, 4, 5);
        if (q > 3) BLOCK_DP(3, 3, 6, 7);
#undef BLOCK_DP
        if (prev >= 0) epilogue(t, dd, mm, act, as, d_off, s_off, sum_off, nr, prev, 4, cs[(prev / 4) & 1], acc);
        _tile_stored(0, c[0], 64);
        if (q > 1) _tile_stored(1, c[1], 64);
        if (q > 2) _tile_stored(2, c[2], 64);
        if (q > 3) _tile_stored(3, c[3], 64);
        prev = b;
    }
    if (prev >= 0) epilogue(t, dd, mm, act, as, d_off, s_off, sum_off, nr, prev, (int)(nb - prev), cs[(prev / 4) & 1], acc);
#pragma GCC unroll 16
    for (int r = 0; r < GROUP; r++) {
        if (r >= nr) break;
        _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
    }
}

/* Below this many rows a group's tiles cost more than they save: each
 * block's sums leave the tile unit through memory (a store of ~14 cycles
 * whatever the rows), so the AVX-512 kernel takes them (bench_kernels 1
 * amx against avx512: the two meet at 10 rows on a Xeon with AMX) */
#define AMX_MIN_ROWS 11

/* panels [p0, p1) x rows [0, n): row groups of 16 over chunks of panels that
 * stay in L2 (the first group streams them from memory, prefetching), so the
 * tiles are configured once per group; a last group under AMX_MIN_ROWS rows
 * goes to the AVX-512 kernel */
static inline __attribute__((always_inline)) void gemm_t(li_type t, const li_cpu_packed *w, int64_t p0, int64_t p1,
                                                         const char *act, size_t as, int64_t n, float *y,
                                                         int64_t ldy) {
    const int64_t chunk = LI_MAX((int64_t)1, (int64_t)(CHUNK_BYTES / w->panel_bytes));
    int cfg = 0;
    for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
        const int64_t c1 = LI_MIN(c0 + chunk, p1);
        for (int64_t r = 0; r < n; r += GROUP) {
            const int nr = (int)LI_MIN((int64_t)GROUP, n - r);
            if (nr < AMX_MIN_ROWS) {
                li_avx512_gemm_q_packed(w, c0, c1, act + r * as, as, nr, y + r * ldy, ldy);
                continue;
            }
            if (nr != cfg) amx_config(cfg = nr);
            for (int64_t p = c0; p < c1; p++)
                panel_group(t, w->k, w->data + p * w->panel_bytes, act + r * as, as, nr, y + r * ldy + p * LI_PANEL,
                            ldy, li_cpu_panel_mask(w->m, p), r == 0);
        }
    }
    if (cfg) _tile_release();
}

void li_amx_gemm_q_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t as, int64_t n,
                          float *y, int64_t ldy) {
    if (n < AMX_MIN_ROWS) { /* one short group: gemm_t would hand it over chunk by chunk */
        li_avx512_gemm_q_packed(w, p0, p1, act, as, n, y, ldy);
        return;
    }
    switch (w->type) {
    case LI_TYPE_Q4_0: gemm_t(LI_TYPE_Q4_0, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q4_1: gemm_t(LI_TYPE_Q4_1, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q8_0: gemm_t(LI_TYPE_Q8_0, w, p0, p1, act, as, n, y, ldy); break;
    default: li_type_unreachable("cpu amx: gemm_q_packed", w->type); /* repack.c packs no other */
    }
}
