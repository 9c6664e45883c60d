/* w8_amx.c — the W8A8 int8 gemm on Intel AMX tiles (w8_kernels.h).
 *
 * Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags; used by the
 * "amx" table only (cpu.c checks li_cpu_amx_usable()).
 *
 * The int8 panels (li_w8_pack) are already AMX's B layout: 64 bytes per 4
 * codes of k, 4 bytes for each of 16 weight rows, stored as code + 128. So
 * a K step of 64 codes is one TDPBSUD of an A tile (up to 16 activation
 * rows x 64 signed codes, straight from the quantized rows) by 16 such
 * lines of a panel. Unlike the Q4/Q8_0 blocks (ops_amx.c) a W8A8 row has
 * one scale, so the int32 sums stay in the tile over the whole of k and
 * leave it once: (sum - 128 sum(a)) converted, times as * ws, the AVX-512
 * kernel's operations, so the same bits. Tiles: C0-C3 sums of 2 row groups
 * x 2 panels, A4/A5 the row groups' codes, B6/B7 the panels' lines. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/amx.h"
#include "cpu/w8_kernels.h"

#include <immintrin.h>
#include <string.h>

/* Below this many activation rows the AVX-512 kernel takes the call:
 * decode is memory-bound, and a tile of a few rows does 16 rows' work */
#define W8_AMX_MIN_ROWS 4

/* C0, C1: nr0 rows; C2, C3: nr1 rows (unused when 0); A4: nr0 x 64,
 * A5: nr1 x 64; B6, B7: 16 x 64 */
static void config(int nr0, int nr1) {
    const uint8_t r0 = (uint8_t)nr0, r1 = (uint8_t)nr1;
    li_amx_config((const uint8_t[8]){r0, r0, r1, r1, r0, r1, 16, 16}, (const uint16_t[8]){64, 64, 64, 64, 64, 64, 64, 64});
}

/* y for rows [0, nr) of one row group against panel p: C's sums in cs */
static inline void out_rows(const int32_t (*cs)[16], int nr, const int32_t *asum, const float *as, const float *ws,
                            int64_t m, int64_t p, float *y, int64_t ldy) {
    const __mmask16 mask = li_cpu_panel_mask(m, p);
    const __m512 vs = _mm512_maskz_loadu_ps(mask, ws + p * 16);
    for (int i = 0; i < nr; i++) { /* (dot - 128 sum a) * (as * ws): the scalar kernel's operations */
        const __m512i d = _mm512_sub_epi32(_mm512_load_si512(cs[i]), _mm512_set1_epi32(128 * asum[i]));
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(as[i]), vs);
        _mm512_mask_storeu_ps(y + i * ldy + p * 16, mask, _mm512_mul_ps(_mm512_cvtepi32_ps(d), s));
    }
}

/* One K step: A tiles from a0 / a1 (stride sa), B from b0 / b1 (stride 64).
 * The tile numbers must be constants, so the four cases are spelled out. */
#define K_STEP(A0, A1, SA, B0, B1, NR1, TWO)                                                                         \
    do {                                                                                                             \
        _tile_loadd(4, (A0), (long)(SA));                                                                            \
        _tile_loadd(6, (B0), 64);                                                                                    \
        _tile_dpbsud(0, 4, 6);                                                                                       \
        if (NR1) {                                                                                                   \
            _tile_loadd(5, (A1), (long)(SA));                                                                        \
            _tile_dpbsud(2, 5, 6);                                                                                   \
        }                                                                                                            \
        if (TWO) {                                                                                                   \
            _tile_loadd(7, (B1), 64);                                                                                \
            _tile_dpbsud(1, 4, 7);                                                                                   \
            if (NR1) _tile_dpbsud(3, 5, 7);                                                                          \
        }                                                                                                            \
    } while (0)

void li_w8_gemm_int8_packed_amx(const li_w8_packed *w, const float *ws, int64_t p0, int64_t p1, const int8_t *a,
                                const int32_t *asum, const float *as, int64_t r0, int64_t r1, float *y,
                                int64_t ldy) {
    if (r1 - r0 < W8_AMX_MIN_ROWS) {
        li_w8_gemm_int8_packed_avx512(w, ws, p0, p1, a, asum, as, r0, r1, y, ldy);
        return;
    }
    const int64_t k = w->k, kfull = k & ~(int64_t)63, tail = k - kfull, pstride = k * 16;
    _Alignas(64) int32_t cs[4][16][16];
    _Alignas(64) int8_t at[32][64];     /* the rows' last codes, zero past k */
    _Alignas(64) uint8_t bt[2][16][64]; /* the panels' last lines, zero past k */
    int cfg0 = -1, cfg1 = -1;
    for (int64_t r = r0; r < r1; r += 32) {
        const int nr0 = (int)LI_MIN((int64_t)16, r1 - r), nr1 = (int)LI_MAX((int64_t)0, LI_MIN((int64_t)16, r1 - r - 16));
        if (nr0 != cfg0 || nr1 != cfg1) config(cfg0 = nr0, cfg1 = nr1);
        const int8_t *a0 = a + r * k, *a1 = nr1 ? a0 + 16 * k : a0; /* (a1 unread without a second group) */
        if (tail) { /* zero-padded copies: 0 x anything adds 0 (and nothing past the panels is read) */
            memset(at, 0, sizeof at);
            for (int i = 0; i < nr0 + nr1; i++) memcpy(at[i], a0 + i * k + kfull, (size_t)tail);
        }
        for (int64_t p = p0; p < p1; p += 2) {
            const bool two = p + 1 < p1;
            const uint8_t *b0 = w->codes + p * pstride, *b1 = b0 + pstride;
            _tile_zero(0);
            _tile_zero(1);
            if (nr1) {
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t j = 0; j < kfull; j += 64) {
                if (nr1 && two) K_STEP(a0 + j, a1 + j, k, b0 + j * 16, b1 + j * 16, 1, 1);
                else if (nr1) K_STEP(a0 + j, a1 + j, k, b0 + j * 16, b1 + j * 16, 1, 0);
                else if (two) K_STEP(a0 + j, a1 + j, k, b0 + j * 16, b1 + j * 16, 0, 1);
                else K_STEP(a0 + j, a1 + j, k, b0 + j * 16, b1 + j * 16, 0, 0);
            }
            if (tail) {
                memset(bt, 0, sizeof bt);
                memcpy(bt[0], b0 + kfull * 16, (size_t)tail * 16);
                if (two) memcpy(bt[1], b1 + kfull * 16, (size_t)tail * 16);
                if (nr1 && two) K_STEP(at[0], at[16], 64, bt[0][0], bt[1][0], 1, 1);
                else if (nr1) K_STEP(at[0], at[16], 64, bt[0][0], bt[1][0], 1, 0);
                else if (two) K_STEP(at[0], at[16], 64, bt[0][0], bt[1][0], 0, 1);
                else K_STEP(at[0], at[16], 64, bt[0][0], bt[1][0], 0, 0);
            }
            _tile_stored(0, cs[0], 64);
            if (two) _tile_stored(1, cs[1], 64);
            if (nr1) {
                _tile_stored(2, cs[2], 64);
                if (two) _tile_stored(3, cs[3], 64);
            }
            float *yr = y + r * ldy;
            out_rows(cs[0], nr0, asum + r, as + r, ws, w->m, p, yr, ldy);
            if (two) out_rows(cs[1], nr0, asum + r, as + r, ws, w->m, p + 1, yr, ldy);
            if (nr1) {
                out_rows(cs[2], nr1, asum + r + 16, as + r + 16, ws, w->m, p, yr + 16 * ldy, ldy);
                if (two) out_rows(cs[3], nr1, asum + r + 16, as + r + 16, ws, w->m, p + 1, yr + 16 * ldy, ldy);
            }
        }
    }
    _tile_release();
}
