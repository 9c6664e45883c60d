/* ops_avx2.c — the CPU kernels for AVX2 + FMA + F16C.
 *
 * Compiled with -mavx2 -mfma -mf16c; cpu.c calls in only after CPUID says
 * yes. Matmul reads the packed weight panels (cpu_kernels.h) 8 lanes at a
 * time and is bit-identical to the reference, like the AVX-512 kernels;
 * attention and silu use FMA and a SIMD exp (the same arithmetic for a token
 * whatever else is in the batch). */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/simd_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* lanes [0, n) set, for tails of fewer than 8 elements */
static inline __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ------------------------------------------------------------------------
 * activation quantization (bit-identical to li_quantize_row_q8_*_ref)
 * ---------------------------------------------------------------------- */

static void avx2_quantize_act(li_type at, const float *x, void *dst, int64_t k) {
    int8_t *qs = dst;
    float *dd = li_qact_d(dst, k), *ss = li_qact_s(dst, k);
    int32_t *sum = li_qact_sum(dst, k);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < k / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int l = 0; l < 4; l++) {
            v[l] = _mm256_loadu_ps(x + b * 32 + l * 8);
            m = _mm256_max_ps(m, _mm256_and_ps(v[l], absm));
        }
        const float d = hmax256(m) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int l = 0; l < 4; l++) q[l] = _mm256_cvtps_epi32(round_away256(_mm256_mul_ps(v[l], vid)));
        /* pack 32 x s32 -> 32 x s8; the packs work per 128-bit lane, so put
         * the dwords back in order afterwards */
        const __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + b * 32), p8);
        dd[b] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        const int s = hsum256_epi32(s4);
        sum[b] = s;
        ss[b] = at == LI_TYPE_Q8_1 ? _cvtsh_ss(_cvtss_sh((float)s * d, _MM_FROUND_TO_NEAREST_INT)) : 0.0f;
    }
}

/* ------------------------------------------------------------------------
 * quantized GEMM on panels
 *
 * The AVX-512 kernel's scheme (see ops_avx512.c) on 8 lanes: a 16-row panel
 * is two halves, lanes 0-7 and 8-15 (the low and high 32 bytes of each
 * 64-byte chunk). Without VNNI the 4-byte dot per lane is vpmaddubsw
 * (u8 x s8 -> s16 pairs) then vpmaddwd by ones (-> s32). Q4 nibbles are
 * unsigned and a pair sum stays below 2 x 15 x 127; Q8_0 (stored q+128)
 * would overflow s16, so it is turned back into signed q and its sign moved
 * onto the activation: |q| x sign(q)*a, at most 2 x 128 x 127 < 32768.
 * The float steps are the reference's, in its order: bit-identical.
 * ---------------------------------------------------------------------- */

#define NR 4 /* activation rows per pass over a half panel */

static inline __m256i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* y[0..rows) (rows <= 8) from the lanes of v */
static inline void store_rows(float *y, __m256 v, int rows) {
    if (rows >= 8) _mm256_storeu_ps(y, v);
    else _mm256_maskstore_ps(y, tail_mask(rows), v);
}

/* Half h of a panel (lanes 8h..8h+7) x nr activation rows. Each 64-byte
 * chunk of the block is loaded (and its nibbles split) once for all nr rows.
 * 4-bit weights: each int16 lane of a vpmaddubsw is at most 2 * 15 * 127 =
 * 3810, so a row's 8 products of the block add up in int16 (<= 30480) and
 * one vpmaddwd widens them: 9 multiply instructions a block in place of 16,
 * the same integers. Q8_0 widens after each product. */
static inline __attribute__((always_inline)) void q_half(li_type t, int nr, int64_t k, const uint8_t *panel, int h,
                                                         const char *act, size_t as, float *y, int64_t ldy, int rows,
                                                         bool pf) {
    const int64_t nb = k / 32;
    const size_t qsb = t == LI_TYPE_Q8_0 ? 512 : 256;
    const uint8_t *qs = panel + 32 * h, *dd = panel + nb * qsb + 16 * h, *mm = dd + nb * 32;
    const size_t d_off = li_qact_qs_bytes(k), s_off = d_off + (size_t)nb * 4, sum_off = s_off + (size_t)nb * 4;
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const size_t step = qsb + 32 * (t == LI_TYPE_Q4_1 ? 2 : 1); /* panel bytes per block */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = qs + b * qsb;
        if (pf && h == 0) /* the first pass streams from memory: run ahead of the hardware prefetcher */
            for (size_t o = 0; o < step; o += 64)
                __asm__ volatile("prefetcht0 %0" : : "m"(*(panel + LI_GEMV_PREFETCH + b * step + o)));
        __m256i is[NR]; /* per row: int16 sums (4-bit) or int32 sums (Q8_0) of the block */
        if (t == LI_TYPE_Q8_0) {
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) is[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                /* stored q+128: back to signed q, its sign moved onto the activation */
                const __m256i wq = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(q + 64 * c)),
                                                    _mm256_set1_epi8((char)0x80));
                const __m256i aw = _mm256_abs_epi8(wq);
#pragma GCC unroll 4
                for (int r = 0; r < nr; r++) {
                    const int8_t *aq = (const int8_t *)(act + r * as) + b * 32;
                    is[r] = _mm256_add_epi32(
                        is[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast32(aq + 4 * c), wq)), ones));
                    __asm__("" : "+x"(is[r])); /* in order, as below */
                }
            }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i raw = _mm256_load_si256((const __m256i *)(q + 64 * c));
                const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
#pragma GCC unroll 4
                for (int r = 0; r < nr; r++) {
                    const int8_t *aq = (const int8_t *)(act + r * as) + b * 32;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast32(aq + 4 * c)),
                                                       _mm256_maddubs_epi16(hi, bcast32(aq + 16 + 4 * c)));
                    is[r] = c == 0 ? p : _mm256_add_epi16(is[r], p);
                    /* a register here: otherwise GCC reassociates the 4 x nr sums into a tree
                     * whose partial products do not fit in 16 ymm registers (spills) */
                    __asm__("" : "+x"(is[r]));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) is[r] = _mm256_madd_epi16(is[r], ones);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(dd + b * 32)));
        __m256 mw = _mm256_setzero_ps();
        if (t == LI_TYPE_Q4_1) mw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(mm + b * 32)));
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const char *a = act + r * as;
            __m256i i = is[r];
            if (t == LI_TYPE_Q4_0) i = _mm256_add_epi32(i, _mm256_set1_epi32(-8 * ((const int32_t *)(a + sum_off))[b]));
            const __m256 isum = _mm256_cvtepi32_ps(i);
            /* the reference's float steps, in its order */
            const __m256 dwa = _mm256_mul_ps(dw, _mm256_set1_ps(((const float *)(a + d_off))[b]));
            __m256 term = _mm256_mul_ps(dwa, isum);
            if (t == LI_TYPE_Q4_1)
                term = _mm256_add_ps(term, _mm256_mul_ps(mw, _mm256_set1_ps(((const float *)(a + s_off))[b])));
            acc[r] = _mm256_add_ps(acc[r], term);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) store_rows(y + r * ldy, acc[r], rows);
}

/* rows [r0, r1) of panel p, both halves, NR rows per pass and the rest in
 * one; the first pass prefetches the weights ahead of itself when pf */
static inline __attribute__((always_inline)) void rows_q(li_type t, const li_cpu_packed *w, int64_t p, const char *act,
                                                         size_t as, int64_t r0, int64_t r1, float *y, int64_t ldy,
                                                         bool pf) {
    const uint8_t *panel = w->data + p * w->panel_bytes;
    for (int h = 0; h < 2; h++) {
        const int rows = (int)LI_MIN((int64_t)8, w->m - p * LI_PANEL - 8 * h);
        if (rows <= 0) break;
        float *yp = y + p * LI_PANEL + 8 * h;
        int64_t r = r0;
#define ROWS_Q(NRR) q_half(t, NRR, w->k, panel, h, act + r * as, as, yp + r * ldy, ldy, rows, pf && r == r0)
        for (; r + NR <= r1; r += NR) ROWS_Q(NR);
        switch (r1 - r) {
        case 3: ROWS_Q(3); break;
        case 2: ROWS_Q(2); break;
        case 1: ROWS_Q(1); break;
        default: break;
        }
#undef ROWS_Q
    }
}

#define GEMM_CHUNK_BYTES (256 << 10) /* as ops_avx512.c: panels per sweep of the row groups stay in L2 */

/* panels [p0, p1) x all n rows: each NR-row group sweeps a chunk of panels
 * before the next group, so its activations stay in L1 and the first group
 * streams the weights that the others find in L2 (ops_avx512.c) */
static inline __attribute__((always_inline)) void gemm_q_t(li_type t, const li_cpu_packed *w, int64_t p0, int64_t p1,
                                                           const char *act, size_t as, int64_t n, float *y,
                                                           int64_t ldy) {
    if (n <= NR) {
        for (int64_t p = p0; p < p1; p++) rows_q(t, w, p, act, as, 0, n, y, ldy, true);
        return;
    }
    const int64_t chunk = LI_MAX((int64_t)1, (int64_t)(GEMM_CHUNK_BYTES / w->panel_bytes));
    for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
        const int64_t c1 = LI_MIN(c0 + chunk, p1);
        for (int64_t r = 0; r < n; r += NR)
            for (int64_t p = c0; p < c1; p++) rows_q(t, w, p, act, as, r, LI_MIN(r + NR, n), y, ldy, r == 0);
    }
}

static void avx2_gemm_q_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t as,
                               int64_t n, float *y, int64_t ldy) {
    switch (w->type) {
    case LI_TYPE_Q4_0: gemm_q_t(LI_TYPE_Q4_0, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q4_1: gemm_q_t(LI_TYPE_Q4_1, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q8_0: gemm_q_t(LI_TYPE_Q8_0, w, p0, p1, act, as, n, y, ldy); break;
    default: li_type_unreachable("cpu avx2: gemm_q_packed", w->type); /* repack.c packs no other */
    }
}

/* ------------------------------------------------------------------------
 * float GEMM on panels: as ops_avx512.c, 8 lanes (half a panel) at a time
 * ---------------------------------------------------------------------- */

/* 8 elements of an F32/F16/BF16 vector as f32 */
static inline __m256 load8(li_type t, const void *p) {
    switch (t) {
    case LI_TYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case LI_TYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    case LI_TYPE_F32: return _mm256_loadu_ps((const float *)p);
    default: __builtin_unreachable(); /* t is a constant of gemm_f_packed's switch */
    }
}

static inline __attribute__((always_inline)) void f_half(li_type t, int nr, const li_cpu_packed *w, int64_t p, int h,
                                                         const float *x, int64_t ldx, float *y, int64_t ldy,
                                                         int rows) {
    const size_t es = w->qs_bytes, step = (size_t)LI_PANEL * es;
    const uint8_t *base = w->data + p * w->panel_bytes + 8 * h * es;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < w->k; j++) {
        const __m256 wv = load8(t, base + (size_t)j * step);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(wv, _mm256_set1_ps(x[r * ldx + j])));
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) store_rows(y + r * ldy + p * LI_PANEL + 8 * h, acc[r], rows);
}

/* Both halves of panel p x nr activation rows: 2 * nr independent sums (one
 * half's nr leave the adder waiting on each add's latency), each lane's the
 * same sequence as f_half's */
static inline __attribute__((always_inline)) void f_panel(li_type t, int nr, const li_cpu_packed *w, int64_t p,
                                                          const float *x, int64_t ldx, float *y, int64_t ldy,
                                                          int rows1) {
    const size_t es = w->qs_bytes, step = (size_t)LI_PANEL * es;
    const uint8_t *base = w->data + p * w->panel_bytes;
    __m256 a0[4], a1[4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < w->k; j++) {
        const __m256 w0 = load8(t, base + (size_t)j * step), w1 = load8(t, base + (size_t)j * step + 8 * es);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m256 xb = _mm256_set1_ps(x[r * ldx + j]);
            a0[r] = _mm256_add_ps(a0[r], _mm256_mul_ps(w0, xb));
            a1[r] = _mm256_add_ps(a1[r], _mm256_mul_ps(w1, xb));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        store_rows(y + r * ldy + p * LI_PANEL, a0[r], 8);
        store_rows(y + r * ldy + p * LI_PANEL + 8, a1[r], rows1);
    }
}

/* One activation row over np (1 or 2) panels, both halves: f_half with one
 * row is a single chain of dependent adds (one per 3-4 cycles); 4 chains
 * side by side keep the adder busy. Each lane's sum is the same sequence. */
static inline __attribute__((always_inline)) void f_gemv(li_type t, int np, const li_cpu_packed *w, int64_t p,
                                                         const float *x, float *y) {
    const size_t es = w->qs_bytes, step = (size_t)LI_PANEL * es;
    const uint8_t *base = w->data + p * w->panel_bytes;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < 2 * np; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < w->k; j++) {
        const __m256 xb = _mm256_set1_ps(x[j]);
#pragma GCC unroll 4
        for (int c = 0; c < 2 * np; c++) {
            const __m256 wv = load8(t, base + (size_t)(c >> 1) * w->panel_bytes + (size_t)j * step + 8 * (c & 1) * es);
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(wv, xb));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 2 * np; c++) {
        const int rows = (int)LI_MIN((int64_t)8, w->m - (p + (c >> 1)) * LI_PANEL - 8 * (c & 1));
        if (rows > 0) store_rows(y + (p + (c >> 1)) * LI_PANEL + 8 * (c & 1), acc[c], rows);
    }
}

static inline __attribute__((always_inline)) void gemm_f_t(li_type t, const li_cpu_packed *w, int64_t p0, int64_t p1,
                                                           const float *x, int64_t ldx, int64_t n, float *y,
                                                           int64_t ldy) {
    if (n == 1) {
        int64_t p = p0;
        for (; p + 2 <= p1; p += 2) f_gemv(t, 2, w, p, x, y);
        if (p < p1) f_gemv(t, 1, w, p, x, y);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const int rows1 = (int)LI_MIN((int64_t)8, w->m - p * LI_PANEL - 8);
        if (rows1 > 0) { /* a full first half: both halves at once */
            int64_t r = 0;
            for (; r + 4 <= n; r += 4) f_panel(t, 4, w, p, x + r * ldx, ldx, y + r * ldy, ldy, rows1);
            switch (n - r) {
            case 3: f_panel(t, 3, w, p, x + r * ldx, ldx, y + r * ldy, ldy, rows1); break;
            case 2: f_panel(t, 2, w, p, x + r * ldx, ldx, y + r * ldy, ldy, rows1); break;
            case 1: f_panel(t, 1, w, p, x + r * ldx, ldx, y + r * ldy, ldy, rows1); break;
            default: break;
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            const int rows = (int)LI_MIN((int64_t)8, w->m - p * LI_PANEL - 8 * h);
            if (rows <= 0) break;
            int64_t r = 0;
            for (; r + 4 <= n; r += 4) f_half(t, 4, w, p, h, x + r * ldx, ldx, y + r * ldy, ldy, rows);
            switch (n - r) {
            case 3: f_half(t, 3, w, p, h, x + r * ldx, ldx, y + r * ldy, ldy, rows); break;
            case 2: f_half(t, 2, w, p, h, x + r * ldx, ldx, y + r * ldy, ldy, rows); break;
            case 1: f_half(t, 1, w, p, h, x + r * ldx, ldx, y + r * ldy, ldy, rows); break;
            default: break;
            }
        }
    }
}

static void avx2_gemm_f_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const float *x, int64_t ldx,
                               int64_t n, float *y, int64_t ldy) {
    switch (w->type) {
    case LI_TYPE_F16: gemm_f_t(LI_TYPE_F16, w, p0, p1, x, ldx, n, y, ldy); break;
    case LI_TYPE_BF16: gemm_f_t(LI_TYPE_BF16, w, p0, p1, x, ldx, n, y, ldy); break;
    case LI_TYPE_F32: gemm_f_t(LI_TYPE_F32, w, p0, p1, x, ldx, n, y, ldy); break;
    default: li_type_unreachable("cpu avx2: gemm_f_packed", w->type); /* repack.c packs no other */
    }
}

/* 8 elements j.. of an F32/F16/BF16 row as f32 */
static inline __m256 load_f(li_type t, const void *p, int64_t j) {
    switch (t) {
    case LI_TYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + j)));
    case LI_TYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + j))), 16));
    case LI_TYPE_F32: return _mm256_loadu_ps((const float *)p + j);
    default: li_type_unreachable("cpu avx2: load_f", t); /* t is a constant of the kernels' dispatch */
    }
}

/* ------------------------------------------------------------------------
 * attention: one (token, head), K/V in F16 / BF16 / F32
 * ---------------------------------------------------------------------- */

static inline __attribute__((always_inline)) float kv_dot(li_type t, const float *q, const void *k, int D) {
    __m256 acc = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f(t, k, d), acc);
    float s = hsum256(acc);
    for (; d < D; d++) s += q[d] * li_float_load(t, k, d);
    return s;
}

static inline __attribute__((always_inline)) void kv_axpy(li_type t, float *out, float p, const void *v, int D) {
    const __m256 vp = _mm256_set1_ps(p);
    int d = 0;
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vp, load_f(t, v, d), _mm256_loadu_ps(out + d)));
    for (; d < D; d++) out[d] += p * li_float_load(t, v, d);
}

/* kv_dot of 4 slots side by side: four independent FMA chains instead of
 * one (a single chain waits on each FMA's latency), each slot's sum the
 * same sequence as kv_dot's */
static inline __attribute__((always_inline)) void kv_dot4(li_type t, const float *q, const char *k, size_t row, int D,
                                                          float *sc) {
    __m256 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[j] = _mm256_fmadd_ps(qv, load_f(t, k + j * row, d), acc[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        float s = hsum256(acc[j]);
        for (int e = d; e < D; e++) s += q[e] * li_float_load(t, k + j * row, e);
        sc[j] = s;
    }
}

/* out[d0, d0 + 64) += p_s * V_s over np slots, the 64 sums held in
 * registers instead of loaded and stored per slot: each element's adds
 * are kv_axpy's, in the same slot order */
static inline __attribute__((always_inline)) void kv_axpy64(li_type t, float *out, const float *p, const char *v,
                                                            size_t row, int64_t np) {
    __m256 o[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) o[c] = _mm256_loadu_ps(out + 8 * c);
    for (int64_t s = 0; s < np; s++) {
        const __m256 vp = _mm256_set1_ps(p[s]);
        const char *vs = v + (size_t)s * row;
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(vp, load_f(t, vs, 8 * c), o[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + 8 * c, o[c]);
}

static inline __attribute__((always_inline)) void attn_head_t(li_type t, const li_attn_args *a, int64_t i, int h,
                                                              float *scores) {
    const int D = a->head_dim, bs = a->block_size;
    const li_attn_head hd = li_attn_head_of(a, t, i, h);
    const int64_t n_pos = hd.n_pos;
    const size_t row = hd.row;

    float max = -INFINITY;
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *kb = hd.k + (size_t)hd.bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        int64_t s = 0;
        for (; s + 4 <= np; s += 4) {
            float d4[4];
            kv_dot4(t, hd.q, kb + s * row, row, D, d4);
            for (int j = 0; j < 4; j++) {
                const float sc = d4[j] * a->scale;
                scores[p0 + s + j] = sc;
                max = sc > max ? sc : max;
            }
        }
        for (; s < np; s++) {
            const float sc = kv_dot(t, hd.q, kb + s * row, D) * a->scale;
            scores[p0 + s] = sc;
            max = sc > max ? sc : max;
        }
    }
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= n_pos; p += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + p), vmax));
        _mm256_storeu_ps(scores + p, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum256(vsum);
    for (; p < n_pos; p++) {
        float tmp[8] = {scores[p] - max};
        _mm256_storeu_ps(tmp, exp256(_mm256_loadu_ps(tmp)));
        scores[p] = tmp[0];
        sum += tmp[0];
    }
    const float inv = 1.0f / sum;
    memset(hd.out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *vb = hd.v + (size_t)hd.bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        int d0 = 0; /* 64 columns at a time in registers, the rest as before */
        for (; d0 + 64 <= D; d0 += 64) kv_axpy64(t, hd.out + d0, scores + p0, vb + (size_t)d0 * hd.es, row, np);
        if (d0 < D)
            for (int64_t s = 0; s < np; s++)
                kv_axpy(t, hd.out + d0, scores[p0 + s], vb + s * row + (size_t)d0 * hd.es, D - d0);
    }
    for (int d = 0; d < D; d++) hd.out[d] *= inv;
}

static void avx2_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_head_t(LI_TYPE_F16, a, i, h, scores); break;
    case LI_TYPE_BF16: attn_head_t(LI_TYPE_BF16, a, i, h, scores); break;
    case LI_TYPE_F32: attn_head_t(LI_TYPE_F32, a, i, h, scores); break;
    default: li_type_unreachable("cpu avx2: attn_head", a->kv->dtype); /* cpu.c sends FP8 / INT8 to kv_avx2.c */
    }
}

/* ------------------------------------------------------------------------
 * silu
 * ---------------------------------------------------------------------- */

static void avx2_silu_mul(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_loadu_ps(g + j);
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(g + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
    }
    if (j < n) li_ref_silu_mul(g + j, u + j, n - j);
}

/* li_ref_hadamard with 8 lanes: every output is the same add or subtract of
 * the same pair as there (a + c commutes bit for bit; a - c keeps its order),
 * the stages 1, 2, 4 inside a register by swapping lanes, the rest between
 * registers */
void li_avx2_hadamard(float *x, const float *s, int64_t dim, int64_t block) {
    if (block < 8 || dim % 8) {
        li_ref_hadamard(x, s, dim, block);
        return;
    }
    const __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)block));
    for (int64_t j = 0; j < dim; j += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(s + j));
        /* h = 1: lanes (0,1) (2,3) ..: lower a + c, upper a - c with a the lower lane */
        __m256 w = _mm256_permute_ps(v, 0xb1);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xaa);
        /* h = 2: lanes (0,2) (1,3) */
        w = _mm256_permute_ps(v, 0x4e);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xcc);
        /* h = 4: the 128-bit halves */
        w = _mm256_permute2f128_ps(v, v, 0x01);
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xf0);
        _mm256_storeu_ps(x + j, v);
    }
    for (int64_t b0 = 0; b0 < dim; b0 += block) {
        float *v = x + b0;
        for (int64_t h = 8; h < block; h *= 2)
            for (int64_t i = 0; i < block; i += 2 * h)
                for (int64_t j = i; j < i + h; j += 8) {
                    const __m256 a = _mm256_loadu_ps(v + j), c = _mm256_loadu_ps(v + j + h);
                    _mm256_storeu_ps(v + j, _mm256_add_ps(a, c));
                    _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, c));
                }
        for (int64_t j = 0; j < block; j += 8) _mm256_storeu_ps(v + j, _mm256_mul_ps(_mm256_loadu_ps(v + j), scale));
    }
}

const li_cpu_kernels li_cpu_kernels_avx2 = {
    .isa = "avx2",
    .family = "avx2",
    .quantize_act = avx2_quantize_act,
    .gemm_q = NULL, /* unprepared weights: cpu.c uses the scalar kernels */
    .gemm_f = NULL,
    .gemm_q_packed = avx2_gemm_q_packed,
    .gemm_f_packed = avx2_gemm_f_packed,
    .attn_head = avx2_attn_head,
    .silu_mul = avx2_silu_mul,
    .hadamard = li_avx2_hadamard,
};
