/* ops_avx512.c — the CPU kernels for AVX-512 (F/BW/VL/DQ/VNNI) + FMA + F16C.
 *
 * Compiled with -mavx512*; cpu.c calls in only after CPUID says yes.
 *
 * Matmul runs on packed weight panels (cpu_kernels.h, repack.c): a vector
 * lane per weight row, 16 rows per vector, so each output is summed in its
 * own lane in the reference's order and the result is bit-identical to
 * li_backend_ref_ops() for any number of activation rows (batch
 * invariance). Integer block dots are vpdpbusd (u8 x s8 -> s32).
 * Attention and silu use FMA and a SIMD exp: not the reference's bits, but
 * the same arithmetic for a token whatever else is in the batch. */
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

/* 16 elements j.. of an F32/F16/BF16 row as f32; mask selects a tail */
static inline __m512 load_f(li_type t, const void *p, int64_t j, __mmask16 mask) {
    switch (t) {
    case LI_TYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + j));
    case LI_TYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + j)), 16));
    case LI_TYPE_F32: return _mm512_maskz_loadu_ps(mask, (const float *)p + j);
    default: li_type_unreachable("cpu avx512: load_f", t); /* t is a constant of the kernels' dispatch */
    }
}

/* ------------------------------------------------------------------------
 * attention: one (token, head), K/V in F16 / BF16 / F32
 * ---------------------------------------------------------------------- */

static inline __attribute__((always_inline)) float kv_dot(li_type t, const float *q, const void *k, int D) {
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = tail16(D - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + d), load_f(t, k, d, mask), acc);
    }
    return hsum512(acc);
}

static inline __attribute__((always_inline)) void kv_axpy(li_type t, float *out, float p, const void *v, int D) {
    const __m512 vp = _mm512_set1_ps(p);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = tail16(D - d);
        const __m512 o = _mm512_maskz_loadu_ps(mask, out + d);
        _mm512_mask_storeu_ps(out + d, mask, _mm512_fmadd_ps(vp, load_f(t, v, d, mask), o));
    }
}

static inline __attribute__((always_inline)) void attn_head_t(li_type t, const li_attn_args *a, int64_t i, int h,
                                                              float *scores) {
    const int D = a->head_dim, bs = a->block_size;
    const int kvh = h / (a->n_head / a->n_head_kv);
    const float *q = a->q + (i * a->n_head + h) * D;
    float *out = a->out + (i * a->n_head + h) * D;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;
    const int32_t *bt = li_attn_blocks(a, i);
    const size_t es = li_kv_elem_size(t), row = (size_t)a->n_head_kv * D * es; /* bytes per slot */
    const char *K = (const char *)a->kv->k + (size_t)kvh * D * es, *V = (const char *)a->kv->v + (size_t)kvh * D * es;

    /* scores, walking the block table block by block (no division per position) */
    float max = -INFINITY;
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *kb = K + (size_t)bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) {
            const float sc = kv_dot(t, q, kb + s * row, D) * a->scale;
            scores[p0 + s] = sc;
            max = sc > max ? sc : max;
        }
    }
    /* softmax numerators and their sum */
    const __m512 vmax = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_pos; p += 16) {
        const __mmask16 mask = n_pos - p >= 16 ? 0xffff : (__mmask16)((1u << (n_pos - p)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + p), vmax));
        _mm512_mask_storeu_ps(scores + p, mask, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(mask, e));
    }
    const float inv = 1.0f / hsum512(vsum);
    /* out = sum_p e_p v_p / sum */
    memset(out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *vb = V + (size_t)bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) kv_axpy(t, out, scores[p0 + s], vb + s * row, D);
    }
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = tail16(D - d);
        _mm512_mask_storeu_ps(out + d, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, out + d), vinv));
    }
}

/* ------------------------------------------------------------------------
 * attention tiles: several tokens of one sequence x the query heads of one
 * kv head, so each K/V row is loaded and converted once for all of them.
 *
 * The arithmetic of one (token, head) is fixed, whatever else shares its
 * tile (batch invariance):
 *   score_p = scale * T(q·k_p), the 16-lane products summed over the
 *             head_dim chunks in order (a multiply, then FMAs), then the
 *             lanes by the fixed tree T (lane j + lane j+8, then +4, +2, +1),
 *             16 positions at a time;
 *   e_p     = exp(score_p - max), sum = T(16-lane partial sums in order);
 *   out     = (sum_p e_p v_p, an FMA per position in order) * (1/sum).
 * ---------------------------------------------------------------------- */

/* lane j of the result = T(a[j]): the 16 lane sums of a[0..15] */
static inline __m512 reduce16(const __m512 *a) {
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* lanes j + j+8 */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++) /* + j+4: block k of y[i] holds a[4i+k] */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++) /* + j+2 */
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0xee));
    /* + j+1: lane 4k+m of w holds the sum of a[4m+k]; put lane j at j */
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xdd));
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), w);
}

/* Prefetch the rows of positions [p0, p1) (`bytes` each, one kv head's
 * part of a slot) into L2, or into L1 when l1: in decode the cache was last
 * touched a whole layer ago, and a block table scatters it, so the hardware
 * prefetcher does not help. Far ahead into L2 covers the memory latency,
 * one chunk of 16 positions ahead into L1 the L2 latency. */
static inline void kv_prefetch(const char *base, const int32_t *bt, int bs, size_t row, size_t bytes, int64_t p0,
                               int64_t p1, bool l1) {
    if (p0 >= p1) return;
    /* (a power-of-two block size, the usual one, without a division: one
     * call per 16 positions, and an idiv was ~5% of a verify's attention) */
    const int sh = (bs & (bs - 1)) ? -1 : __builtin_ctz((unsigned)bs);
    int64_t blk = sh >= 0 ? p0 >> sh : p0 / bs, off = sh >= 0 ? p0 & (bs - 1) : p0 % bs;
    for (int64_t p = p0; p < p1; p++) {
        const char *r = base + ((size_t)bt[blk] * bs + off) * row;
        for (size_t o = 0; o < bytes; o += 64) {
            if (l1) li_cpu_prefetch_l1(r + o);
            else li_cpu_prefetch_l2(r + o);
        }
        if (++off == bs) {
            off = 0;
            blk++;
        }
    }
}

#define ATT_PF_AHEAD 128 /* positions of K (V) rows prefetched ahead of use */

/* K/V row chunk c of ND (16 lanes each, the last one masked to D) */
#define ATT_CHUNK_MASK(c, ND, dlast) ((c) == (ND) - 1 ? (dlast) : (__mmask16)0xffff)

/* Scores of nq queries (rows qp[]) against positions [0, n_max), 16 at a
 * time, into S (nq, ncap). ND = head_dim chunks, constant after inlining
 * (0: the generic loop for odd head sizes). */
static inline __attribute__((always_inline)) void
attn_scores(li_type t, int ND, int nd, const li_attn_args *a, const char *K, size_t row, const int32_t *bt,
            const float *const *qp, int nq, int64_t n_max, int64_t ncap, __mmask16 dlast, float *S, __m512 *tmp) {
    const int bs = a->block_size;
    const int n = ND ? ND : nd;
    const __m512 vscale = _mm512_set1_ps(a->scale);
    const size_t bytes = (size_t)a->head_dim * li_kv_elem_size(t);
    kv_prefetch(K, bt, bs, row, bytes, 0, LI_MIN(n_max, (int64_t)ATT_PF_AHEAD), false);
    int64_t blk = 0, off = 0; /* position c0 + pp = blk * bs + off, walked without divisions */
    for (int64_t c0 = 0; c0 < n_max; c0 += 16) {
        const int np = (int)LI_MIN((int64_t)16, n_max - c0);
        if (c0 + ATT_PF_AHEAD < n_max)
            kv_prefetch(K, bt, bs, row, bytes, c0 + ATT_PF_AHEAD, LI_MIN(n_max, c0 + ATT_PF_AHEAD + 16), false);
        kv_prefetch(K, bt, bs, row, bytes, c0 + 16, LI_MIN(n_max, c0 + 32), true);
        for (int pp = 0; pp < 16; pp++) {
            __m512 kv[16];
            if (pp < np) {
                const char *kr = K + ((size_t)bt[blk] * bs + off) * row;
                if (++off == bs) {
                    off = 0;
                    blk++;
                }
#pragma GCC unroll 16
                for (int c = n; c < 16; c++) kv[c] = _mm512_setzero_ps();
#pragma GCC unroll 16
                for (int c = 0; c < n; c++) kv[c] = load_f(t, kr, 16 * c, ATT_CHUNK_MASK(c, n, dlast));
            } else {
#pragma GCC unroll 16
                for (int c = 0; c < n; c++) kv[c] = _mm512_setzero_ps();
            }
            for (int qi = 0; qi < nq; qi++) {
                const float *q = qp[qi];
                __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(ATT_CHUNK_MASK(0, n, dlast), q), kv[0]);
#pragma GCC unroll 16
                for (int c = 1; c < n; c++)
                    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(ATT_CHUNK_MASK(c, n, dlast), q + 16 * c), kv[c], acc);
                tmp[qi * 16 + pp] = acc;
            }
        }
        for (int qi = 0; qi < nq; qi++)
            _mm512_store_ps(S + qi * ncap + c0, _mm512_mul_ps(reduce16(tmp + qi * 16), vscale));
    }
}

/* ------------------------------------------------------------------------
 * The same scores with positions in the lanes, for tiles of ATT_NQ_V
 * queries or more. attn_scores holds a (query, position) pair's 16
 * head-dim lanes in one register and sums them with shuffles (reduce16:
 * ~3 shuffles and adds a pair, and the sums pass through memory); here 16
 * positions' K rows are transposed once for all the tile's queries, lane l
 * of every pair becomes a register of 16 positions, A_l = q_l k_l + q_(16+l)
 * k_(16+l) + ... (the same multiply and FMAs in the same order), and the
 * tree T is 15 vertical adds of those registers in T's own pairing. So each
 * score has attn_scores' bits, and a token's output does not depend on
 * which of the two its tile ran (test_kernels: alone, in tiles, reversed).
 * ---------------------------------------------------------------------- */

#define ATT_NQ_V 6 /* a tile's queries from which the transposes pay (verify, prefill) */
#define ATT_QG 4   /* queries summed together: 5 of their partial sums live at most, 20 registers */

/* In place: lane j of r[i] <- lane i of r[j] */
static inline __attribute__((always_inline)) void transpose16(__m512 *r) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* interleave rows 2i, 2i+1 by 32 bits */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* by 64 bits: u[4i + c], 128-bit lane L, holds column 4L + c of rows 4i..4i+3 */
        const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* the 128-bit lanes: column c + 4L from the four row groups */
        const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(a, e, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(a, e, 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(b, f, 0xdd);
    }
}

/* A[j] = lane l of query j's chunk sums at 16 positions (kt[d]: dimension d
 * of the 16 K rows): q_l k_l, then FMAs over the chunks in order */
static inline __attribute__((always_inline)) void lane_dot(int ND, int QG, int l, const __m512 *kt,
                                                           const float *const *q, __m512 *A) {
    const __m512 k0 = kt[l];
#pragma GCC unroll 4
    for (int j = 0; j < QG; j++) A[j] = _mm512_mul_ps(_mm512_set1_ps(q[j][l]), k0);
#pragma GCC unroll 16
    for (int c = 1; c < ND; c++) {
        const __m512 k = kt[16 * c + l];
#pragma GCC unroll 4
        for (int j = 0; j < QG; j++) A[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][16 * c + l]), k, A[j]);
    }
}

/* out[j][0..15] = scale * T(lanes) of QG queries at the 16 positions of kt:
 * s1_m = A_m + A_(m+8), s2_m = s1_m + s1_(m+4), s3_m = s2_m + s2_(m+2),
 * T = s3_0 + s3_1 (reduce16's pairing), lanes taken in that order so at
 * most 5 partial sums per query are live */
static inline __attribute__((always_inline)) void scores_v_group(int ND, int QG, const __m512 *kt,
                                                                 const float *const *q, float *const *out,
                                                                 __m512 vscale) {
    __m512 s3[2][ATT_QG];
#pragma GCC unroll 2
    for (int m3 = 0; m3 < 2; m3++) {
        __m512 s2[ATT_QG];
#pragma GCC unroll 2
        for (int h2 = 0; h2 < 2; h2++) {
            __m512 s1[ATT_QG];
#pragma GCC unroll 2
            for (int h4 = 0; h4 < 2; h4++) {
                __m512 x[ATT_QG], y[ATT_QG];
                const int l = m3 + 2 * h2 + 4 * h4;
                lane_dot(ND, QG, l, kt, q, x);
                lane_dot(ND, QG, l + 8, kt, q, y);
#pragma GCC unroll 4
                for (int j = 0; j < QG; j++) {
                    x[j] = _mm512_add_ps(x[j], y[j]);
                    s1[j] = h4 ? _mm512_add_ps(s1[j], x[j]) : x[j];
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < QG; j++) s2[j] = h2 ? _mm512_add_ps(s2[j], s1[j]) : s1[j];
        }
#pragma GCC unroll 4
        for (int j = 0; j < QG; j++) s3[m3][j] = s2[j];
    }
#pragma GCC unroll 4
    for (int j = 0; j < QG; j++) _mm512_store_ps(out[j], _mm512_mul_ps(_mm512_add_ps(s3[0][j], s3[1][j]), vscale));
}

/* attn_scores for head_dim 16 * ND (ND > 0) with positions in the lanes;
 * kt: scratch of 16 * ND vectors */
static inline __attribute__((always_inline)) void
attn_scores_v(li_type t, int ND, const li_attn_args *a, const char *K, size_t row, const int32_t *bt,
              const float *const *qp, int nq, int64_t n_max, int64_t ncap, float *S, __m512 *kt) {
    const int bs = a->block_size;
    const __m512 vscale = _mm512_set1_ps(a->scale);
    const size_t bytes = (size_t)a->head_dim * li_kv_elem_size(t);
    kv_prefetch(K, bt, bs, row, bytes, 0, LI_MIN(n_max, (int64_t)ATT_PF_AHEAD), false);
    int64_t blk = 0, off = 0; /* position c0 + pp = blk * bs + off */
    for (int64_t c0 = 0; c0 < n_max; c0 += 16) {
        const int np = (int)LI_MIN((int64_t)16, n_max - c0);
        if (c0 + ATT_PF_AHEAD < n_max)
            kv_prefetch(K, bt, bs, row, bytes, c0 + ATT_PF_AHEAD, LI_MIN(n_max, c0 + ATT_PF_AHEAD + 16), false);
        kv_prefetch(K, bt, bs, row, bytes, c0 + 16, LI_MIN(n_max, c0 + 32), true);
        const char *kr[16];
        for (int pp = 0; pp < np; pp++) {
            kr[pp] = K + ((size_t)bt[blk] * bs + off) * row;
            if (++off == bs) {
                off = 0;
                blk++;
            }
        }
#pragma GCC unroll 16
        for (int c = 0; c < ND; c++) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int pp = 0; pp < 16; pp++) r[pp] = pp < np ? load_f(t, kr[pp], 16 * c, 0xffff) : _mm512_setzero_ps();
            transpose16(r);
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) kt[16 * c + l] = r[l];
        }
        int q0 = 0;
        for (; q0 + ATT_QG <= nq; q0 += ATT_QG) {
            float *out[ATT_QG];
            for (int j = 0; j < ATT_QG; j++) out[j] = S + (q0 + j) * ncap + c0;
            scores_v_group(ND, ATT_QG, kt, qp + q0, out, vscale);
        }
        float *out[ATT_QG];
        for (int j = 0; j < nq - q0; j++) out[j] = S + (q0 + j) * ncap + c0;
        switch (nq - q0) {
        case 3: scores_v_group(ND, 3, kt, qp + q0, out, vscale); break;
        case 2: scores_v_group(ND, 2, kt, qp + q0, out, vscale); break;
        case 1: scores_v_group(ND, 1, kt, qp + q0, out, vscale); break;
        default: break;
        }
    }
}

/* For QV queries (e_p of query v at sp[v]): out_v = (sum over its positions
 * [0, npos[v]) of e_p v_p, one FMA per position in order) * inv[v]. */
static inline __attribute__((always_inline)) void
attn_pv(li_type t, int ND, int nd, int QV, const li_attn_args *a, const char *V, size_t row, const int32_t *bt,
        const float *const *sp, const int64_t *npos, __mmask16 dlast, float *const *outp, const float *inv, bool pf) {
    const int bs = a->block_size;
    const int n = ND ? ND : nd;
    int64_t lo = INT64_MAX, hi = 0; /* every query needs the positions below lo */
#pragma GCC unroll 8
    for (int v = 0; v < QV; v++) {
        lo = LI_MIN(lo, npos[v]);
        hi = LI_MAX(hi, npos[v]);
    }
    __m512 acc[8][16];
#pragma GCC unroll 8
    for (int v = 0; v < QV; v++)
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) acc[v][c] = _mm512_setzero_ps(); /* (the generic head size may use all) */
    const size_t bytes = (size_t)a->head_dim * li_kv_elem_size(t);
    int64_t blk = 0, off = 0; /* p = blk * bs + off */
    for (int64_t p = 0; p < hi; p++) {
        if (pf && p % 16 == 0) {
            if (p + ATT_PF_AHEAD < hi)
                kv_prefetch(V, bt, bs, row, bytes, p + ATT_PF_AHEAD, LI_MIN(hi, p + ATT_PF_AHEAD + 16), false);
            kv_prefetch(V, bt, bs, row, bytes, p + 16, LI_MIN(hi, p + 32), true);
        }
        const char *vr = V + ((size_t)bt[blk] * bs + off) * row;
        if (++off == bs) {
            off = 0;
            blk++;
        }
        __m512 vv[16];
#pragma GCC unroll 16
        for (int c = n; c < 16; c++) vv[c] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int c = 0; c < n; c++) vv[c] = load_f(t, vr, 16 * c, ATT_CHUNK_MASK(c, n, dlast));
        if (p < lo) {
#pragma GCC unroll 8
            for (int v = 0; v < QV; v++) {
                const __m512 e = _mm512_set1_ps(sp[v][p]);
#pragma GCC unroll 16
                for (int c = 0; c < n; c++) acc[v][c] = _mm512_fmadd_ps(e, vv[c], acc[v][c]);
            }
        } else {
#pragma GCC unroll 8
            for (int v = 0; v < QV; v++) {
                if (p >= npos[v]) continue;
                const __m512 e = _mm512_set1_ps(sp[v][p]);
#pragma GCC unroll 16
                for (int c = 0; c < n; c++) acc[v][c] = _mm512_fmadd_ps(e, vv[c], acc[v][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < QV; v++) {
        const __m512 vi = _mm512_set1_ps(inv[v]);
#pragma GCC unroll 16
        for (int c = 0; c < n; c++)
            _mm512_mask_storeu_ps(outp[v] + 16 * c, ATT_CHUNK_MASK(c, n, dlast), _mm512_mul_ps(acc[v][c], vi));
    }
}

static inline __attribute__((always_inline)) void attn_tile_t(li_type t, int ND, const li_attn_args *a, int64_t i0,
                                                              int nt, int kvh, int g0, int ng, int chunk,
                                                              const li_attn_part *part, float *scratch) {
    const int D = a->head_dim, nd = (D + 15) / 16, G = a->n_head / a->n_head_kv;
    const __mmask16 dlast = (D % 16) ? (__mmask16)((1u << (D % 16)) - 1) : (__mmask16)0xffff;
    /* this item's positions [lo, lo + LI_ATTN_CHUNK) (the whole context
     * without chunks); from here on positions are counted from lo, and the
     * block table from lo's block */
    const int64_t lo = part ? (int64_t)chunk * LI_ATTN_CHUNK : 0;
    const int32_t *bt = li_attn_blocks(a, i0) + lo / a->block_size;
    const size_t es = li_kv_elem_size(t), row = (size_t)a->n_head_kv * D * es; /* bytes per slot */
    const char *K = (const char *)a->kv->k + (size_t)kvh * D * es, *V = (const char *)a->kv->v + (size_t)kvh * D * es;
    /* the queries with positions here (token i0 + j / ng, head kvh*G + g0 +
     * j % ng): a token of LI_ATTN_CHUNK positions or fewer has them all in
     * chunk 0 and gets its output; a longer one gets this chunk's partial
     * sums (li_attn_part), merged when its last chunk is done (cpu.c) */
    int64_t npos[64], n_max = 0;
    const float *qp[64];
    float *outp[64], *mp[64];
    int nq = 0;
    for (int j = 0; j < ng * nt; j++) {
        const int64_t i = i0 + j / ng, h = (int64_t)kvh * G + g0 + j % ng, n = (int64_t)a->pos[i] + 1;
        const bool whole = !part || n <= LI_ATTN_CHUNK;
        if (whole ? lo > 0 : n <= lo) continue;
        npos[nq] = whole ? n : LI_MIN(n - lo, (int64_t)LI_ATTN_CHUNK);
        n_max = LI_MAX(n_max, npos[nq]);
        qp[nq] = a->q + (i * a->n_head + h) * D;
        if (whole) {
            outp[nq] = a->out + (i * a->n_head + h) * D;
            mp[nq] = NULL;
        } else {
            outp[nq] = li_attn_part_at(part, i, (int)h, chunk);
            mp[nq] = outp[nq] + D;
        }
        nq++;
    }
    if (nq == 0) return;
    const int64_t ncap = (n_max + 15) & ~(int64_t)15;
    kv_prefetch(V, bt, a->block_size, row, (size_t)D * es, 0, LI_MIN(n_max, (int64_t)ATT_PF_AHEAD), false);
    float *S = scratch;                                                         /* (nq, ncap) */
    __m512 *tmp = (__m512 *)(((uintptr_t)(S + nq * ncap) + 63) & ~(uintptr_t)63); /* (nq, 16) */
    if (ND && nq >= ATT_NQ_V) attn_scores_v(t, ND, a, K, row, bt, qp, nq, n_max, ncap, S, tmp);
    else attn_scores(t, ND, nd, a, K, row, bt, qp, nq, n_max, ncap, dlast, S, tmp);

    /* softmax numerators and 1/sum, per query over its own positions (a
     * partial: its max and sum kept, the sums of e_p v_p left unscaled) */
    float inv[64];
    const float *sp[64];
    for (int qi = 0; qi < nq; qi++) {
        float *sq = S + qi * ncap;
        sp[qi] = sq;
        const int64_t n = npos[qi];
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t p = 0; p < n; p += 16) {
            const __mmask16 m = n - p >= 16 ? 0xffff : (__mmask16)((1u << (n - p)) - 1);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_load_ps(sq + p));
        }
        const float mx1 = _mm512_reduce_max_ps(vmax);
        const __m512 mx = _mm512_set1_ps(mx1);
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t p = 0; p < n; p += 16) {
            const __mmask16 m = n - p >= 16 ? 0xffff : (__mmask16)((1u << (n - p)) - 1);
            const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_load_ps(sq + p), mx)));
            _mm512_store_ps(sq + p, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        const float sum = hsum512(vsum);
        if (mp[qi]) {
            mp[qi][0] = mx1;
            mp[qi][1] = sum;
            inv[qi] = 1.0f;
        } else {
            inv[qi] = 1.0f / sum;
        }
    }

    /* out = sum_p e_p v_p / sum, up to 24 / ND queries per pass over V
     * (their accumulators fill the registers) */
    const int QV = ND ? LI_MAX(1, 24 / ND) : 1;
    for (int q0 = 0; q0 < nq;) {
        const int nv = LI_MIN(QV, nq - q0);
#define ATT_PV(NV) attn_pv(t, ND, nd, NV, a, V, row, bt, sp + q0, npos + q0, dlast, outp + q0, inv + q0, q0 == 0)
        switch (ND ? nv : 1) {
        case 6: ATT_PV(6); break;
        case 5: ATT_PV(5); break;
        case 4: ATT_PV(4); break;
        case 3: ATT_PV(3); break;
        case 2: ATT_PV(2); break;
        default: ATT_PV(1); break;
        }
#undef ATT_PV
        q0 += ND ? nv : 1;
    }
}

#define ATTN_TILE_DTYPE(T)                                                                                     \
    static void attn_tile_##T(const li_attn_args *a, int64_t i0, int nt, int kvh, int g0, int ng, int chunk,         \
                              const li_attn_part *part, float *scratch) {                                          \
        switch (a->head_dim) {                                                                               \
        case 64: attn_tile_t(LI_TYPE_##T, 4, a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;           \
        case 128: attn_tile_t(LI_TYPE_##T, 8, a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;          \
        default: attn_tile_t(LI_TYPE_##T, 0, a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;           \
        }                                                                                                    \
    }
ATTN_TILE_DTYPE(F16)
ATTN_TILE_DTYPE(BF16)
ATTN_TILE_DTYPE(F32)

static void avx512_attn_merge(const li_attn_args *a, const li_attn_part *part, int64_t i, int h) {
    const int D = a->head_dim;
    const int nc = (int)li_attn_n_chunks((int64_t)a->pos[i] + 1);
    float m = -INFINITY, s = 0.0f;
    for (int c = 0; c < nc; c++) m = fmaxf(m, li_attn_part_at(part, i, h, c)[D]);
    float *out = a->out + (i * a->n_head + h) * D;
    memset(out, 0, (size_t)D * sizeof(float));
    for (int c = 0; c < nc; c++) {
        const float *pc = li_attn_part_at(part, i, h, c), w = expf(pc[D] - m);
        s = fmaf(w, pc[D + 1], s);
        const __m512 vw = _mm512_set1_ps(w);
        for (int d = 0; d < D; d += 16) {
            const __mmask16 mask = tail16(D - d);
            _mm512_mask_storeu_ps(out + d, mask, _mm512_fmadd_ps(vw, _mm512_maskz_loadu_ps(mask, pc + d),
                                                                 _mm512_maskz_loadu_ps(mask, out + d)));
        }
    }
    const __m512 vinv = _mm512_set1_ps(1.0f / s);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = tail16(D - d);
        _mm512_mask_storeu_ps(out + d, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, out + d), vinv));
    }
}

static void avx512_attn_tile(const li_attn_args *a, int64_t i0, int nt, int kvh, int g0, int ng, int chunk,
                             const li_attn_part *part, float *scratch) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_tile_F16(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    case LI_TYPE_BF16: attn_tile_BF16(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    case LI_TYPE_F32: attn_tile_F32(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    default: li_type_unreachable("cpu avx512: attn_tile", a->kv->dtype); /* cpu.c tiles no 8-bit cache */
    }
}

static void avx512_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_head_t(LI_TYPE_F16, a, i, h, scores); break;
    case LI_TYPE_BF16: attn_head_t(LI_TYPE_BF16, a, i, h, scores); break;
    case LI_TYPE_F32: attn_head_t(LI_TYPE_F32, a, i, h, scores); break;
    default: li_type_unreachable("cpu avx512: attn_head", a->kv->dtype); /* cpu.c sends FP8 / INT8 to kv_avx512.c */
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
    .gemm_f_packed = avx512_gemm_f_packed, .attn_head = avx512_attn_head, .attn_tile = avx512_attn_tile, .attn_merge = avx512_attn_merge, \
    .silu_mul = avx512_silu_mul, .hadamard = li_avx2_hadamard, .rmsnorm = avx512_rmsnorm,                      \
    .rope_rotate = avx512_rope_rotate

const li_cpu_kernels li_cpu_kernels_avx512 = {.isa = "avx512", .gemm_q_packed = li_avx512_gemm_q_packed,
                                              AVX512_SHARED};

/* AVX-512 with the quantized GEMM on AMX tiles (ops_amx.c): the same bits */
const li_cpu_kernels li_cpu_kernels_amx = {.isa = "amx", .gemm_q_packed = li_amx_gemm_q_packed, AVX512_SHARED};
