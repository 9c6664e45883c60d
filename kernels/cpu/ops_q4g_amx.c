/* ops_q4g_amx.c — 4-bit group-quantized weights, A8, on Intel AMX tiles
 * (q4g_kernels.h). Compiled with -mamx-tile -mamx-int8 and the AVX-512
 * flags; the "amx" table only (cpu.c checks li_cpu_amx_usable()).
 *
 * An A8 panel chunk (64 bytes: 4 codes of each of 16 weight rows in the low
 * nibbles, the next 4 in the high ones) is two lines of AMX's B layout once
 * the nibbles are split into bytes, so 8 chunks make the B tile of a K step
 * of 64 codes, and the A tile is up to 16 activation rows' 64 codes, read
 * in place. A group's int32 sums stay in the tile for its gs / 64 steps and
 * leave it once; then the AVX-512 kernel's float step: acc + scale *
 * (float)(isum - zero * xsum), y = acc * s_x: the same bits. Groups whose
 * size is not a multiple of 64, and calls of few rows, go to the AVX-512
 * kernel. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/amx.h"
#include "cpu/q4g_kernels.h"

#include <immintrin.h>
#include <string.h>

/* Fewer activation rows than this: the AVX-512 kernel (decode streams the
 * weights; a tile of few rows costs what 16 do) */
#define Q4G_AMX_MIN_ROWS 12

/* C0, C1: nr x 16 int32; A4: nr x 64; B6, B7: 16 x 64 */
static void config(int nr) {
    const uint8_t r = (uint8_t)nr;
    li_amx_config((const uint8_t[8]){r, r, 0, 0, r, 0, 16, 16}, (const uint16_t[8]){64, 64, 0, 0, 64, 0, 64, 64});
}

/* 8 chunks (64 codes of 16 rows) -> 16 tile lines: chunk c's low nibbles
 * are codes 8c..8c+3 (line 2c), its high ones 8c+4..8c+7 (line 2c+1) */
static inline void unpack64(const uint8_t *src, uint8_t *dst) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 8; c++) {
        const __m512i b = _mm512_load_si512(src + 64 * c);
        _mm512_store_si512(dst + 128 * c, _mm512_and_si512(b, lo4));
        _mm512_store_si512(dst + 128 * c + 64, _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4));
    }
}

/* rows [0, nr) (act: the first, xsum / sx: theirs) against panels
 * [q0, q1); tiles configured for nr rows. Two panels at a time share the
 * A tile of each step. */
static void rows_amx(const li_q4g_packed *p, int64_t q0, int64_t q1, const uint8_t *act, size_t as, int nr,
                     float *y, int64_t ldy) {
    const int64_t k = p->k, gs = p->gs, ng = p->ng, steps = gs / 64;
    _Alignas(64) uint8_t bl[2][1024];
    _Alignas(64) int32_t cs[2][16][16];
    const int32_t *xsum[16];
    float sx[16];
    for (int i = 0; i < nr; i++) {
        xsum[i] = (const int32_t *)(act + (size_t)i * as + ((k + 3) & ~3));
        memcpy(&sx[i], xsum[i] + ng, sizeof(float));
    }
    for (int64_t pp = q0; pp < q1; pp += 2) {
        const bool two = pp + 1 < q1;
        __m512 acc[2][16];
        for (int i = 0; i < nr; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *g0 = li_q4g_a8_group(p, pp, g), *g1 = two ? li_q4g_a8_group(p, pp + 1, g) : NULL;
            _tile_zero(0);
            if (two) _tile_zero(1);
            for (int64_t s = 0; s < steps; s++) {
                unpack64(g0 + s * 512, bl[0]);
                _tile_loadd(4, act + g * gs + s * 64, (long)as);
                _tile_loadd(6, bl[0], 64);
                _tile_dpbsud(0, 4, 6);
                if (two) {
                    unpack64(g1 + s * 512, bl[1]);
                    _tile_loadd(7, bl[1], 64);
                    _tile_dpbsud(1, 4, 7);
                }
            }
            _tile_stored(0, cs[0], 64);
            if (two) _tile_stored(1, cs[1], 64);
            for (int h = 0; h < (two ? 2 : 1); h++) {
                const uint8_t *zs = (h ? g1 : g0) + steps * 512;
                const __m512i z = _mm512_load_si512(zs);
                const __m512 sc = _mm512_load_ps((const float *)(zs + 64));
                for (int i = 0; i < nr; i++) { /* the reference's float step */
                    const __m512i isum = _mm512_sub_epi32(_mm512_load_si512(cs[h][i]),
                                                          _mm512_mullo_epi32(z, _mm512_set1_epi32(xsum[i][g])));
                    acc[h][i] = _mm512_add_ps(acc[h][i], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(isum)));
                }
            }
        }
        for (int h = 0; h < (two ? 2 : 1); h++) {
            const __mmask16 mask = li_cpu_panel_mask(p->m, pp + h);
            for (int i = 0; i < nr; i++)
                _mm512_mask_storeu_ps(y + i * ldy + (pp + h) * LI_PANEL, mask,
                                      _mm512_mul_ps(acc[h][i], _mm512_set1_ps(sx[i])));
        }
    }
}

static void amx_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                   size_t act_stride, int64_t n, float *y, int64_t ldy) {
    /* the tile path needs whole 64-code steps in every group (the last one too) */
    if (!p->a8codes || r0 % LI_PANEL || p->gs % 64 || p->k % p->gs) {
        li_q4g_a8_avx512(w, p, r0, r1, act, act_stride, n, y, ldy);
        return;
    }
    const int64_t q0 = r0 / LI_PANEL, q1 = (r1 + LI_PANEL - 1) / LI_PANEL;
    int cfg = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const int nr = (int)LI_MIN((int64_t)16, n - i);
        if (nr < Q4G_AMX_MIN_ROWS) { /* few rows, or a short last group */
            li_q4g_a8_avx512(w, p, r0, r1, act + (size_t)i * act_stride, act_stride, nr, y + i * ldy, ldy);
            continue;
        }
        if (nr != cfg) config(cfg = nr);
        rows_amx(p, q0, q1, act + (size_t)i * act_stride, act_stride, nr, y + i * ldy, ldy);
    }
    if (cfg) _tile_release();
}

const li_q4g_kernels li_q4g_kernels_amx = {.isa = "amx", .a16 = li_q4g_a16_avx2, .a8 = amx_a8,
                                           .act = li_q4g_act_quantize_avx2};
