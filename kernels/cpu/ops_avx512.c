/* ops_avx512.c — the CPU kernels for AVX-512 (F/BW/VL/DQ/VNNI) + FMA + F16C.
 *
 * Compiled with -mavx512*; cpu.c calls in only after CPUID says yes.
 *
 * Quantized matmul: a 512-bit vector holds two 32-element blocks. The
 * integer dot of a block pair is one vpdpbusd (u8 x s8 -> s32, 4 products
 * per lane), which needs one unsigned operand:
 *   Q4_1   nibbles q are already unsigned:            dpbusd(q, a)
 *   Q4_0   w = q - 8, Q8_0 w = q are signed: the sign moves onto the
 *          activation:                                 dpbusd(|w|, sign(w)*a)
 * (activations lie in [-127, 127], so negating one never overflows).
 * Lanes 0-7 hold block b, lanes 8-15 block b+1; the per-lane scale vector is
 * d_w pair x d_a pair (the packed activation stores d_a 8 times per block).
 * Each pass over a weight row serves up to 4 activation rows, so a prefill
 * batch reads its weights once per 4 rows instead of once per row. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define NR 4 /* activation rows per weight-row pass */

static inline uint16_t load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum512(__m512 v) {
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* roundf() semantics (halves away from zero), which the ggml reference
 * quantizer uses; the FPU's own mode would round halves to even */
static inline __m512 round_away(__m512 y) {
    const __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(y, _mm512_set1_ps(-0.0f)));
    return _mm512_mask_add_ps(t, up, t, one);
}

/* exp(x), Cephes-style: 2^n * p(r), |r| <= ln2/2; about 1 ulp */
static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* ------------------------------------------------------------------------
 * activation quantization (bit-identical to li_quantize_row_q8_*_ref)
 * ---------------------------------------------------------------------- */

static void avx512_quantize_act(li_type at, const float *x, void *dst, int64_t k) {
    int8_t *qs = dst;
    float *d8 = li_qact_d8(dst, k), *s8 = li_qact_s8(dst, k);
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
        _mm256_storeu_ps(d8 + b * 8, _mm256_set1_ps(_cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT))));
        if (at == LI_TYPE_Q8_1) {
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            const float s = _cvtsh_ss(_cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT));
            _mm256_storeu_ps(s8 + b * 8, _mm256_setr_ps(s, 0, 0, 0, 0, 0, 0, 0));
        }
    }
}

/* ------------------------------------------------------------------------
 * quantized GEMM
 * ---------------------------------------------------------------------- */

static inline size_t block_bytes(li_type t) {
    return t == LI_TYPE_Q4_0 ? sizeof(li_block_q4_0) : t == LI_TYPE_Q4_1 ? sizeof(li_block_q4_1) : sizeof(li_block_q8_0);
}

/* The 64 weights of blocks at p0, p1 (!full: only p0, the rest zero) as
 * int8: Q4_0 q-8, Q4_1 q, Q8_0 q, in element order. */
static inline __m512i load_w_pair(li_type t, int full, const char *p0, const char *p1) {
    if (t == LI_TYPE_Q8_0) {
        const __m512i lo = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2)));
        return full ? _mm512_inserti64x4(lo, _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1) : lo;
    }
    const size_t off = t == LI_TYPE_Q4_0 ? 2 : 4;
    __m256i q = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + off)));
    if (full) q = _mm256_inserti128_si256(q, _mm_loadu_si128((const __m128i *)(p1 + off)), 1);
    /* 128-bit lanes [q0, q0, q1, q1]; lanes 1 and 3 take the high nibbles
     * (byte j: element j low, element j+16 high) */
    __m512i z = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), _mm512_castsi256_si512(q));
    z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);
    z = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
    if (t == LI_TYPE_Q4_0) z = _mm512_sub_epi8(z, _mm512_set1_epi8(8));
    return z;
}

/* Scale vectors of a block pair: dw = [d0 x8, d1 x8] and, for Q4_1,
 * mw = [m0 x8, m1 x8], from the fp16 fields at the block starts (d at 0, m
 * at 2); !full: block 1 absent, its lanes zero. One conversion for all. */
static inline __attribute__((always_inline)) void pair_scales(li_type t, int full, const char *p0, const char *p1,
                                                              __m512 *dw, __m512 *mw) {
    const __m512i lo8 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    if (t == LI_TYPE_Q4_1) {
        uint32_t h0, h1 = 0; /* (d, m) of each block */
        memcpy(&h0, p0, 4);
        if (full) memcpy(&h1, p1, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)(h0 | (uint64_t)h1 << 32))); /* d0 m0 d1 m1 */
        const __m512 f5 = _mm512_castps128_ps512(f);
        *dw = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f5);
        *mw = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), f5);
    } else {
        const uint32_t h = load_u16(p0) | (uint32_t)(full ? load_u16(p1) : 0) << 16;
        *dw = _mm512_permutexvar_ps(lo8, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)h))));
    }
}

/* One block pair (or, !full, the last lone block) of a weight row against
 * nr activation rows: acc[r] gathers d_w*d_a*sum(q_w*q_a), accm[r] the Q4_1
 * m_w*s_a terms (a separate chain, so the two FMAs do not wait on each
 * other). t, nr and full are constants after inlining. */
static inline __attribute__((always_inline)) void
qpair_step(li_type t, int nr, int full, const char *p0, const char *p1, const char *act, size_t act_stride,
           size_t d8off, size_t s8off, int64_t b, __m512 *acc, __m512 *accm) {
    const __m512i w = load_w_pair(t, full, p0, p1);
    __m512 dw, mw = _mm512_setzero_ps();
    pair_scales(t, full, p0, p1, &dw, &mw);
    __m512i u = w;
    __mmask64 neg = 0;
    if (t != LI_TYPE_Q4_1) {
        u = _mm512_abs_epi8(w);
        neg = _mm512_movepi8_mask(w);
    }
    const __mmask64 qmask = full ? ~(__mmask64)0 : 0xffffffffu;
    const __mmask16 fmask = full ? 0xffff : 0x00ff;
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const char *ar = act + r * act_stride;
        __m512i a = _mm512_maskz_loadu_epi8(qmask, ar + b * 32);
        if (t != LI_TYPE_Q4_1) a = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
        const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a);
        const __m512 da = _mm512_maskz_loadu_ps(fmask, ar + d8off + b * 32);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(dw, da), acc[r]);
        if (t == LI_TYPE_Q4_1)
            accm[r] = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(fmask, ar + s8off + b * 32), accm[r]);
    }
}

static inline __attribute__((always_inline)) void gemm_q_rows(li_type t, int nr, int64_t k, const char *w,
                                                              size_t w_stride, int64_t m, const char *act,
                                                              size_t act_stride, float *y, int64_t ldy) {
    const size_t bs = block_bytes(t);
    const int64_t nb = k / 32;
    const size_t d8off = li_qact_qs_bytes(k), s8off = d8off + (size_t)nb * 32;
    for (int64_t i = 0; i < m; i++) {
        const char *wr = w + i * w_stride;
        __m512 acc[NR], accm[NR];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) acc[r] = accm[r] = _mm512_setzero_ps();
        int64_t b = 0;
        if (nr == 1) {
            /* one activation row: alternate two accumulators so the FMA
             * latency of one pair overlaps the next */
            for (; b + 4 <= nb; b += 4) {
                qpair_step(t, 1, 1, wr + b * bs, wr + (b + 1) * bs, act, act_stride, d8off, s8off, b, acc, accm);
                qpair_step(t, 1, 1, wr + (b + 2) * bs, wr + (b + 3) * bs, act, act_stride, d8off, s8off, b + 2,
                           acc + 1, accm + 1);
            }
            acc[0] = _mm512_add_ps(acc[0], acc[1]);
            accm[0] = _mm512_add_ps(accm[0], accm[1]);
        }
        for (; b + 2 <= nb; b += 2)
            qpair_step(t, nr, 1, wr + b * bs, wr + (b + 1) * bs, act, act_stride, d8off, s8off, b, acc, accm);
        if (b < nb) qpair_step(t, nr, 0, wr + b * bs, NULL, act, act_stride, d8off, s8off, b, acc, accm);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) y[r * ldy + i] = hsum512(t == LI_TYPE_Q4_1 ? _mm512_add_ps(acc[r], accm[r]) : acc[r]);
    }
}

#define GEMM_Q_TYPE(T, name)                                                                                   \
    static void name(int nr, int64_t k, const char *w, size_t ws, int64_t m, const char *act, size_t as,     \
                     float *y, int64_t ldy) {                                                                \
        switch (nr) {                                                                                        \
        case 4: gemm_q_rows(T, 4, k, w, ws, m, act, as, y, ldy); break;                                      \
        case 3: gemm_q_rows(T, 3, k, w, ws, m, act, as, y, ldy); break;                                      \
        case 2: gemm_q_rows(T, 2, k, w, ws, m, act, as, y, ldy); break;                                      \
        default: gemm_q_rows(T, 1, k, w, ws, m, act, as, y, ldy); break;                                     \
        }                                                                                                    \
    }
GEMM_Q_TYPE(LI_TYPE_Q4_0, gemm_q4_0)
GEMM_Q_TYPE(LI_TYPE_Q4_1, gemm_q4_1)
GEMM_Q_TYPE(LI_TYPE_Q8_0, gemm_q8_0)

static void avx512_gemm_q(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const void *act,
                          size_t act_stride, int64_t n, float *y, int64_t ldy) {
    for (int64_t r0 = 0; r0 < n; r0 += NR) {
        const int nr = (int)LI_MIN((int64_t)NR, n - r0);
        const char *a = (const char *)act + r0 * act_stride;
        float *yr = y + r0 * ldy;
        switch (wt) {
        case LI_TYPE_Q4_0: gemm_q4_0(nr, k, w, w_stride, m, a, act_stride, yr, ldy); break;
        case LI_TYPE_Q4_1: gemm_q4_1(nr, k, w, w_stride, m, a, act_stride, yr, ldy); break;
        default: gemm_q8_0(nr, k, w, w_stride, m, a, act_stride, yr, ldy); break;
        }
    }
}

/* ------------------------------------------------------------------------
 * float GEMM (F32 / F16 / BF16 weights)
 * ---------------------------------------------------------------------- */

/* 16 elements j.. of an F32/F16/BF16 row as f32; mask selects a tail */
static inline __m512 load_f(li_type t, const void *p, int64_t j, __mmask16 mask) {
    switch (t) {
    case LI_TYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + j));
    case LI_TYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + j)), 16));
    default: return _mm512_maskz_loadu_ps(mask, (const float *)p + j);
    }
}

static inline __attribute__((always_inline)) void gemm_f_rows(li_type t, int nr, int64_t k, const char *w,
                                                              size_t w_stride, int64_t m, const float *x,
                                                              int64_t ldx, float *y, int64_t ldy) {
    for (int64_t i = 0; i < m; i++) {
        const char *wr = w + i * w_stride;
        /* two accumulators per row: one FMA chain alone is latency-bound */
        __m512 acc0[NR], acc1[NR];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 32 <= k; j += 32) {
            const __m512 w0 = load_f(t, wr, j, 0xffff), w1 = load_f(t, wr, j + 16, 0xffff);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * ldx + j), acc0[r]);
                acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * ldx + j + 16), acc1[r]);
            }
        }
        for (; j < k; j += 16) {
            const __mmask16 mask = k - j >= 16 ? 0xffff : (__mmask16)((1u << (k - j)) - 1);
            const __m512 w0 = load_f(t, wr, j, mask);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc0[r] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mask, x + r * ldx + j), acc0[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) y[r * ldy + i] = hsum512(_mm512_add_ps(acc0[r], acc1[r]));
    }
}

#define GEMM_F_TYPE(T, name)                                                                                   \
    static void name(int nr, int64_t k, const char *w, size_t ws, int64_t m, const float *x, int64_t ldx,    \
                     float *y, int64_t ldy) {                                                                \
        switch (nr) {                                                                                        \
        case 4: gemm_f_rows(T, 4, k, w, ws, m, x, ldx, y, ldy); break;                                       \
        case 3: gemm_f_rows(T, 3, k, w, ws, m, x, ldx, y, ldy); break;                                       \
        case 2: gemm_f_rows(T, 2, k, w, ws, m, x, ldx, y, ldy); break;                                       \
        default: gemm_f_rows(T, 1, k, w, ws, m, x, ldx, y, ldy); break;                                      \
        }                                                                                                    \
    }
GEMM_F_TYPE(LI_TYPE_F32, gemm_f32)
GEMM_F_TYPE(LI_TYPE_F16, gemm_f16)
GEMM_F_TYPE(LI_TYPE_BF16, gemm_bf16)

static void avx512_gemm_f(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const float *x,
                          int64_t ldx, int64_t n, float *y, int64_t ldy) {
    for (int64_t r0 = 0; r0 < n; r0 += NR) {
        const int nr = (int)LI_MIN((int64_t)NR, n - r0);
        const float *xr = x + r0 * ldx;
        float *yr = y + r0 * ldy;
        switch (wt) {
        case LI_TYPE_F16: gemm_f16(nr, k, w, w_stride, m, xr, ldx, yr, ldy); break;
        case LI_TYPE_BF16: gemm_bf16(nr, k, w, w_stride, m, xr, ldx, yr, ldy); break;
        default: gemm_f32(nr, k, w, w_stride, m, xr, ldx, yr, ldy); break;
        }
    }
}

/* ------------------------------------------------------------------------
 * attention: one (token, head), K/V in F16 / BF16 / F32
 * ---------------------------------------------------------------------- */

static inline __attribute__((always_inline)) float kv_dot(li_type t, const float *q, const void *k, int D) {
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = D - d >= 16 ? 0xffff : (__mmask16)((1u << (D - d)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + d), load_f(t, k, d, mask), acc);
    }
    return hsum512(acc);
}

static inline __attribute__((always_inline)) void kv_axpy(li_type t, float *out, float p, const void *v, int D) {
    const __m512 vp = _mm512_set1_ps(p);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = D - d >= 16 ? 0xffff : (__mmask16)((1u << (D - d)) - 1);
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
    const int32_t *bt = a->block_tables[a->seq[i]];
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
        const __mmask16 mask = D - d >= 16 ? 0xffff : (__mmask16)((1u << (D - d)) - 1);
        _mm512_mask_storeu_ps(out + d, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, out + d), vinv));
    }
}

static void avx512_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_head_t(LI_TYPE_F16, a, i, h, scores); break;
    case LI_TYPE_BF16: attn_head_t(LI_TYPE_BF16, a, i, h, scores); break;
    default: attn_head_t(LI_TYPE_F32, a, i, h, scores); break;
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

const li_cpu_kernels li_cpu_kernels_avx512 = {
    .isa = "avx512",
    .quantize_act = avx512_quantize_act,
    .gemm_q = avx512_gemm_q,
    .gemm_f = avx512_gemm_f,
    .attn_head = avx512_attn_head,
    .silu_mul = avx512_silu_mul,
};
