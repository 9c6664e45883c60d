/* ops_avx512.c — the CPU kernels for AVX-512 (F/BW/VL/DQ/VNNI) + FMA + F16C.
 *
 * Compiled with -mavx512*; cpu.c calls in only after CPUID says yes.
 *
 * Matmul runs on packed weight panels (cpu_kernels.h, repack.c): a vector
 * lane per weight row, 16 rows per vector, so each output is summed in its
 * own lane in the reference's order and the result is bit-identical to
 * li_backend_ref_ops() for any number of activation rows (batch
 * invariance). Integer block dots are vpdpbusd (u8 x s8 -> s32).
 * Silu uses FMA and a SIMD exp: not the reference's bits, but the same
 * arithmetic for a token whatever else is in the batch. Attention is in
 * attn_avx512.c. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/simd_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* roundf() semantics (halves away from zero), which the ggml reference
 * quantizer uses; the FPU's own mode would round halves to even */
static inline __m512 round_away(__m512 y) {
    const __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(y, _mm512_set1_ps(-0.0f)));
    return _mm512_mask_add_ps(t, up, t, one);
}


/* ------------------------------------------------------------------------
 * activation quantization (bit-identical to li_quantize_row_q8_*_ref)
 * ---------------------------------------------------------------------- */

static void avx512_quantize_act(li_type at, const float *x, void *dst, int64_t k) {
    int8_t *qs = dst;
    float *dd = li_qact_d(dst, k), *ss = li_qact_s(dst, k);
    int32_t *sum = li_qact_sum(dst, k);
    for (int64_t b = 0; b < k / 32; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(v0, vid)));
        const __m512i q1 = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(v1, vid)));
        _mm_storeu_si128((__m128i *)(qs + b * 32), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(qs + b * 32 + 16), _mm512_cvtsepi32_epi8(q1));
        dd[b] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        const int s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        sum[b] = s;
        ss[b] = at == LI_TYPE_Q8_1 ? _cvtsh_ss(_cvtss_sh((float)s * d, _MM_FROUND_TO_NEAREST_INT)) : 0.0f;
    }
}

/* ------------------------------------------------------------------------
 * quantized GEMM on panels
 *
 * Lane l of every vector is weight row l of the panel. Per block b and
 * activation row r:
 *   isum = sum over the block of w*a, integers: 8 vpdpbusd, each taking 4
 *          weight bytes per lane and one broadcast activation word. The
 *          weights must be the unsigned operand: Q4_1 nibbles are; Q4_0 is
 *          multiplied as q (not q-8) and Q8_0 as q+128, the accumulator
 *          starting at -8*sum(a), -128*sum(a) instead of 0 (exact);
 *   y   += isum * (d_w * d_a)  [+ m_w * s_a for Q4_1], one float operation
 *          at a time in the reference's order (li_vec_dot_*_ref), so the
 *          result is the reference's, bit for bit, whatever n is.
 * The weight panel is unpacked once per block and serves NR activation rows.
 * ---------------------------------------------------------------------- */

#define NR 10        /* activation rows per pass over a panel: 10 x 16 sums in registers */

static inline __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}


static inline __attribute__((always_inline)) void q_panel(li_type t, int nr, int64_t k, const uint8_t *panel,
                                                          const char *act, size_t as, float *y, int64_t ldy,
                                                          __mmask16 mask, bool pf) {
    const int64_t nb = k / 32;
    const size_t qsb = t == LI_TYPE_Q8_0 ? 512 : 256;
    const uint8_t *qs = panel, *dd = panel + nb * qsb, *mm = dd + nb * 32;
    const size_t d_off = li_qact_qs_bytes(k);
    const size_t s_off = d_off + (size_t)nb * 4, sum_off = s_off + (size_t)nb * 4;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[NR];
#pragma GCC unroll 10
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    const size_t step = qsb + 32 * (t == LI_TYPE_Q4_1 ? 2 : 1); /* panel bytes per block */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = qs + b * qsb;
        if (pf) /* the first pass over this panel: run ahead of the hardware prefetcher */
            for (size_t o = 0; o < step; o += 64) li_cpu_prefetch_l1(panel + LI_GEMV_PREFETCH + b * step + o);
        __m512i w[8];
        if (t == LI_TYPE_Q8_0) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) w[c] = _mm512_load_si512(q + 64 * c);
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m512i raw = _mm512_load_si512(q + 64 * c);
                w[2 * c] = _mm512_and_si512(raw, low4);                         /* elements 4c.. */
                w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4); /* elements 16+4c.. */
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dd + b * 32)));
        __m512 mw = _mm512_setzero_ps();
        if (t == LI_TYPE_Q4_1) mw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mm + b * 32)));
#pragma GCC unroll 10
        for (int r = 0; r < nr; r++) {
            const char *a = act + r * as;
            const int8_t *aq = (const int8_t *)a + b * 32;
            const int32_t asum = ((const int32_t *)(a + sum_off))[b];
            __m512i i0 = t == LI_TYPE_Q4_1 ? _mm512_setzero_si512()
                                           : _mm512_set1_epi32((t == LI_TYPE_Q4_0 ? -8 : -128) * asum);
            __m512i i1 = _mm512_setzero_si512(); /* a second chain: half the latency */
            if (t == LI_TYPE_Q8_0) {
#pragma GCC unroll 4
                for (int c = 0; c < 8; c += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, w[c], bcast32(aq + 4 * c));
                    i1 = _mm512_dpbusd_epi32(i1, w[c + 1], bcast32(aq + 4 * c + 4));
                }
            } else {
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    i0 = _mm512_dpbusd_epi32(i0, w[2 * c], bcast32(aq + 4 * c));
                    i1 = _mm512_dpbusd_epi32(i1, w[2 * c + 1], bcast32(aq + 16 + 4 * c));
                }
            }
            const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
            const __m512 dwa = _mm512_mul_ps(dw, _mm512_set1_ps(((const float *)(a + d_off))[b]));
            __m512 term = _mm512_mul_ps(dwa, isum);
            if (t == LI_TYPE_Q4_1)
                term = _mm512_add_ps(term, _mm512_mul_ps(mw, _mm512_set1_ps(((const float *)(a + s_off))[b])));
            acc[r] = _mm512_add_ps(acc[r], term);
        }
    }
#pragma GCC unroll 10
    for (int r = 0; r < nr; r++) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

/* rows [r0, r1) of panel p, NR rows per pass, then the rest in one; the first
 * pass prefetches the weights ahead of itself when pf */
static inline __attribute__((always_inline)) void rows_q(li_type t, const li_cpu_packed *w, int64_t p, const char *act,
                                                         size_t as, int64_t r0, int64_t r1, float *y, int64_t ldy,
                                                         bool pf) {
    const uint8_t *panel = w->data + p * w->panel_bytes;
    const __mmask16 mask = li_cpu_panel_mask(w->m, p);
    float *yp = y + p * LI_PANEL;
    int64_t r = r0;
#define ROWS_Q(NRR) q_panel(t, NRR, w->k, panel, act + r * as, as, yp + r * ldy, ldy, mask, pf && r == r0)
    for (; r + NR <= r1; r += NR) ROWS_Q(NR);
    switch (r1 - r) { /* the rest in one pass: a verify's 9 rows are one */
    case 9: ROWS_Q(9); break;
    case 8: ROWS_Q(8); break;
    case 7: ROWS_Q(7); break;
    case 6: ROWS_Q(6); break;
    case 5: ROWS_Q(5); break;
    case 4: ROWS_Q(4); break;
    case 3: ROWS_Q(3); break;
    case 2: ROWS_Q(2); break;
    case 1: ROWS_Q(1); break;
    default: break;
    }
#undef ROWS_Q
}

#define GEMM_CHUNK_BYTES (256 << 10) /* weight panels per sweep of the row groups: they stay in L2 */

/* panels [p0, p1) x all n rows; t constant after inlining.
 * One row group (NR rows) goes over a chunk of panels, then the next group
 * over the same chunk: the first group streams the weights from memory
 * (prefetching ahead), the others find them in L2, and each group's
 * activations stay in L1 all along. (Every group over one panel before the
 * next panel instead cycles all n rows' activations through L1 with the
 * panel and the output tiles: at 32 rows that overflows it.) */
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

void li_avx512_gemm_q_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t as, int64_t n,
                             float *y, int64_t ldy) {
    switch (w->type) {
    case LI_TYPE_Q4_0: gemm_q_t(LI_TYPE_Q4_0, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q4_1: gemm_q_t(LI_TYPE_Q4_1, w, p0, p1, act, as, n, y, ldy); break;
    case LI_TYPE_Q8_0: gemm_q_t(LI_TYPE_Q8_0, w, p0, p1, act, as, n, y, ldy); break;
    default: li_type_unreachable("cpu avx512: gemm_q_packed", w->type); /* repack.c packs no other */
    }
}

/* ------------------------------------------------------------------------
 * float GEMM on panels (F32 / F16 / BF16 weights): y += x_j * w_j, one
 * element at a time in order, a multiply then an add (the reference's
 * dot, bit for bit). Lane-parallel over rows, so np panels x nr rows of
 * independent sums hide the add latency.
 * ---------------------------------------------------------------------- */

/* 16 elements of an F32/F16/BF16 vector as f32 */
static inline __m512 load16(li_type t, const void *p) {
    switch (t) {
    case LI_TYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    case LI_TYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    case LI_TYPE_F32: return _mm512_loadu_ps((const float *)p);
    default: __builtin_unreachable(); /* t is a constant of gemm_f_packed's switch */
    }
}

static inline __attribute__((always_inline)) void f_panels(li_type t, int np, int nr, const li_cpu_packed *w,
                                                           int64_t p, const float *x, int64_t ldx, float *y,
                                                           int64_t ldy) {
    const size_t es = w->qs_bytes, step = (size_t)LI_PANEL * es;
    const int64_t k = w->k;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < np; i++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j++) {
#pragma GCC unroll 4
        for (int i = 0; i < np; i++) {
            const __m512 wv = load16(t, w->data + (p + i) * w->panel_bytes + (size_t)j * step);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc[i][r] = _mm512_add_ps(acc[i][r], _mm512_mul_ps(wv, _mm512_set1_ps(x[r * ldx + j])));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < np; i++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            _mm512_mask_storeu_ps(y + r * ldy + (p + i) * LI_PANEL, li_cpu_panel_mask(w->m, p + i), acc[i][r]);
}

static inline __attribute__((always_inline)) void gemm_f_t(li_type t, const li_cpu_packed *w, int64_t p0, int64_t p1,
                                                           const float *x, int64_t ldx, int64_t n, float *y,
                                                           int64_t ldy) {
    for (int64_t p = p0; p < p1;) {
        if (n == 1) { /* one row: 4 panels at a time for independent sums */
            if (p + 4 <= p1) {
                f_panels(t, 4, 1, w, p, x, ldx, y, ldy);
                p += 4;
            } else {
                f_panels(t, 1, 1, w, p, x, ldx, y, ldy);
                p++;
            }
            continue;
        }
        int64_t r = 0;
        for (; r + 4 <= n; r += 4) f_panels(t, 1, 4, w, p, x + r * ldx, ldx, y + r * ldy, ldy);
        switch (n - r) {
        case 3: f_panels(t, 1, 3, w, p, x + r * ldx, ldx, y + r * ldy, ldy); break;
        case 2: f_panels(t, 1, 2, w, p, x + r * ldx, ldx, y + r * ldy, ldy); break;
        case 1: f_panels(t, 1, 1, w, p, x + r * ldx, ldx, y + r * ldy, ldy); break;
        default: break;
        }
        p++;
    }
}

static void avx512_gemm_f_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const float *x, int64_t ldx,
                                 int64_t n, float *y, int64_t ldy) {
    switch (w->type) {
    case LI_TYPE_F16: gemm_f_t(LI_TYPE_F16, w, p0, p1, x, ldx, n, y, ldy); break;
    case LI_TYPE_BF16: gemm_f_t(LI_TYPE_BF16, w, p0, p1, x, ldx, n, y, ldy); break;
    case LI_TYPE_F32: gemm_f_t(LI_TYPE_F32, w, p0, p1, x, ldx, n, y, ldy); break;
    default: li_type_unreachable("cpu avx512: gemm_f_packed", w->type); /* repack.c packs no other */
    }
}

/* ------------------------------------------------------------------------
 * silu
 * ---------------------------------------------------------------------- */

static void avx512_silu_mul(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 mask = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(mask, g + j);
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(g + j, mask, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask, u + j)));
    }
}

/* ------------------------------------------------------------------------
 * rmsnorm: the reference sums each row's squares in double, one dependent
 * add per element. Eight rows go side by side, one double lane per row:
 * 8x8 blocks of squares are transposed in registers, so lane i adds row i's
 * squares in the reference's order, and eight chains cost one.
 * ---------------------------------------------------------------------- */

/* in: v[i] = row i, columns c0..c0+7; out: v[c] = column c of rows 0..7 */
static inline void transpose8(__m256 v[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        v[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
        v[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
    }
}

static void rmsnorm_scale_row(const float *x, const float *w, float *y, int64_t dim, double sum, float eps) {
    const float scale = 1.0f / sqrtf((float)(sum / (double)dim) + eps);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < dim; j += 16) {
        const __mmask16 m = dim - j >= 16 ? 0xffff : (__mmask16)((1u << (dim - j)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vs);
        _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + j)));
    }
}

static void avx512_rmsnorm(const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps) {
    int64_t r = 0;
    for (; r + 8 <= n; r += 8) {
        const float *xr = x + r * dim;
        __m512d acc = _mm512_setzero_pd();
        int64_t j = 0;
        for (; j + 8 <= dim; j += 8) {
            __m256 v[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256 a = _mm256_loadu_ps(xr + i * dim + j);
                v[i] = _mm256_mul_ps(a, a);
            }
            transpose8(v);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(v[c]));
        }
        double sum[8];
        _mm512_storeu_pd(sum, acc);
        for (int i = 0; i < 8; i++) {
            for (int64_t jj = j; jj < dim; jj++) sum[i] += (double)(xr[i * dim + jj] * xr[i * dim + jj]);
            rmsnorm_scale_row(xr + i * dim, w, y + (r + i) * dim, dim, sum[i], eps);
        }
    }
    for (; r < n; r++) {
        const float *xr = x + r * dim;
        double sum = 0.0;
        for (int64_t j = 0; j < dim; j++) sum += (double)(xr[j] * xr[j]);
        rmsnorm_scale_row(xr, w, y + r * dim, dim, sum, eps);
    }
}

/* ------------------------------------------------------------------------
 * rope rotation: x0' = x0 c - x1 s, x1' = x0 s + x1 c, each product
 * rounded, then the sum (no FMA), as the reference. Interleaved pairs take
 * a pair swap and duplicated cos/sin lanes.
 * ---------------------------------------------------------------------- */

static void avx512_rope_rotate(float *x, const float *cs, int64_t n, int n_heads, int head_dim, int half, int neox) {
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    for (int64_t i = 0; i < n; i++, cs += 2 * half) {
        const float *c = cs, *s = cs + half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (i * n_heads + h) * head_dim;
            if (neox) {
                for (int j = 0; j < half; j += 16) {
                    const __mmask16 m = half - j >= 16 ? 0xffff : (__mmask16)((1u << (half - j)) - 1);
                    const __m512 x0 = _mm512_maskz_loadu_ps(m, v + j), x1 = _mm512_maskz_loadu_ps(m, v + half + j);
                    const __m512 vc = _mm512_maskz_loadu_ps(m, c + j), vs = _mm512_maskz_loadu_ps(m, s + j);
                    _mm512_mask_storeu_ps(v + j, m, _mm512_sub_ps(_mm512_mul_ps(x0, vc), _mm512_mul_ps(x1, vs)));
                    _mm512_mask_storeu_ps(v + half + j, m,
                                          _mm512_add_ps(_mm512_mul_ps(x0, vs), _mm512_mul_ps(x1, vc)));
                }
            } else {
                for (int j = 0; j < half; j += 8) { /* pairs j..j+7: 16 floats of v from 2j */
                    const int np = half - j >= 8 ? 8 : half - j;
                    const __mmask16 m = (__mmask16)((1u << (2 * np)) - 1);
                    const __mmask8 m8 = (__mmask8)((1u << np) - 1);
                    const __m512 xv = _mm512_maskz_loadu_ps(m, v + 2 * j);
                    const __m512 vc = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, c + j)));
                    const __m512 vs = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, s + j)));
                    const __m512 a = _mm512_mul_ps(xv, vc);                          /* x0 c, x1 c */
                    const __m512 b = _mm512_mul_ps(_mm512_permute_ps(xv, 0xb1), vs); /* x1 s, x0 s */
                    /* even lanes a - b (x0 c - x1 s), odd lanes b + a (x0 s + x1 c) */
                    _mm512_mask_storeu_ps(v + 2 * j, m, _mm512_mask_add_ps(_mm512_sub_ps(a, b), 0xaaaa, b, a));
                }
            }
        }
    }
}

/* every kernel but the quantized GEMM, which the AMX table replaces;
 * unprepared weights (gemm_q / gemm_f NULL) run cpu.c's scalar kernels,
 * and the hadamard op is memory-light (AVX2's 8 lanes keep up) */
#define AVX512_SHARED                                                                                           \
    .family = "avx512", .quantize_act = avx512_quantize_act, .gemm_q = NULL, .gemm_f = NULL,                    \
    .gemm_f_packed = avx512_gemm_f_packed, .attn_head = li_avx512_attn_head, .attn_tile = li_avx512_attn_tile, \
    .attn_merge = li_avx512_attn_merge,                                                                         \
    .silu_mul = avx512_silu_mul, .hadamard = li_avx2_hadamard, .rmsnorm = avx512_rmsnorm,                      \
    .rope_rotate = avx512_rope_rotate

const li_cpu_kernels li_cpu_kernels_avx512 = {.isa = "avx512", .gemm_q_packed = li_avx512_gemm_q_packed,
                                              AVX512_SHARED};

/* AVX-512 with the quantized GEMM on AMX tiles (ops_amx.c): the same bits */
const li_cpu_kernels li_cpu_kernels_amx = {.isa = "amx", .gemm_q_packed = li_amx_gemm_q_packed, AVX512_SHARED};
