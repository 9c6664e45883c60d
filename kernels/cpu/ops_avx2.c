/* ops_avx2.c — the CPU kernels for AVX2 + FMA + F16C.
 *
 * Compiled with -mavx2 -mfma -mf16c; cpu.c calls in only after CPUID says
 * yes. One 32-element block per 256-bit vector. The integer block dot is
 * vpmaddubsw (u8 x s8 -> pairs of s16) then vpmaddwd with ones (-> s32):
 * Q4_1 nibbles are unsigned as they are; for Q4_0 (q-8) and Q8_0 the sign
 * of w moves onto the activation (|w| x sign(w)*a). No overflow: a pair sum
 * is at most 2 x 128 x 127 < 32768. Each pass over a weight row serves up to
 * 4 activation rows. */
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

static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* roundf() semantics (halves away from zero), as the ggml reference */
static inline __m256 round_away(__m256 y) {
    const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 absfrac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(y, t));
    const __m256 up = _mm256_cmp_ps(absfrac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(y, _mm256_set1_ps(-0.0f)));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* exp(x), Cephes-style, inputs clamped to [-87.3, 88] so 2^n stays a normal */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n through the exponent field; n in [-126, 127] */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
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
    float *d8 = li_qact_d8(dst, k), *s8 = li_qact_s8(dst, k);
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
        for (int l = 0; l < 4; l++) q[l] = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v[l], vid)));
        /* pack 32 x s32 -> 32 x s8; the packs work per 128-bit lane, so put
         * the dwords back in order afterwards */
        const __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + b * 32), p8);
        _mm256_storeu_ps(d8 + b * 8, _mm256_set1_ps(_cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT))));
        if (at == LI_TYPE_Q8_1) {
            const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            const float s = _cvtsh_ss(_cvtss_sh((float)hsum256_epi32(s4) * d, _MM_FROUND_TO_NEAREST_INT));
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

/* The 32 weights of the block at p as int8, in element order: Q4_0 q-8,
 * Q4_1 q, Q8_0 q. */
static inline __m256i load_w(li_type t, const char *p) {
    if (t == LI_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(p + 2));
    const __m128i q = _mm_loadu_si128((const __m128i *)(p + (t == LI_TYPE_Q4_0 ? 2 : 4)));
    __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    z = _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
    if (t == LI_TYPE_Q4_0) z = _mm256_sub_epi8(z, _mm256_set1_epi8(8));
    return z;
}

static inline __attribute__((always_inline)) void gemm_q_rows(li_type t, int nr, int64_t k, const char *w,
                                                              size_t w_stride, int64_t m, const char *act,
                                                              size_t act_stride, float *y, int64_t ldy) {
    const size_t bs = block_bytes(t);
    const int64_t nb = k / 32;
    const size_t d8off = li_qact_qs_bytes(k), s8off = d8off + (size_t)nb * 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < m; i++) {
        const char *wr = w + i * w_stride;
        /* acc: d_w*d_a*sum(q_w*q_a); accm: Q4_1's m_w*s_a, a separate chain */
        __m256 acc[NR], accm[NR];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) acc[r] = accm[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const char *p = wr + b * bs;
            const __m256i wv = load_w(t, p);
            const __m256i u = t == LI_TYPE_Q4_1 ? wv : _mm256_sign_epi8(wv, wv); /* |w| */
            const __m256 dw = _mm256_set1_ps(_cvtsh_ss(load_u16(p)));
            __m256 mw = _mm256_setzero_ps();
            if (t == LI_TYPE_Q4_1) mw = _mm256_set1_ps(_cvtsh_ss(load_u16(p + 2)));
            /* one activation row: odd blocks go to a second accumulator so
             * the FMA latency of one block overlaps the next */
            const int alt = nr == 1 ? (int)(b & 1) : 0;
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const char *ar = act + r * act_stride;
                __m256i a = _mm256_loadu_si256((const __m256i *)(ar + b * 32));
                if (t != LI_TYPE_Q4_1) a = _mm256_sign_epi8(a, wv);
                const __m256i dp = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones);
                const __m256 da = _mm256_loadu_ps((const float *)(ar + d8off) + b * 8);
                acc[r + alt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_mul_ps(dw, da), acc[r + alt]);
                if (t == LI_TYPE_Q4_1)
                    accm[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps((const float *)(ar + s8off) + b * 8), accm[r]);
            }
        }
        if (nr == 1) acc[0] = _mm256_add_ps(acc[0], acc[1]);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) y[r * ldy + i] = hsum256(_mm256_add_ps(acc[r], accm[r]));
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

static void avx2_gemm_q(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const void *act,
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

/* 8 elements j.. of an F32/F16/BF16 row as f32 */
static inline __m256 load_f(li_type t, const void *p, int64_t j) {
    switch (t) {
    case LI_TYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + j)));
    case LI_TYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + j))), 16));
    default: return _mm256_loadu_ps((const float *)p + j);
    }
}

/* the same for the n < 8 elements left at j (no reads past them) */
static inline __m256 load_f_tail(li_type t, const void *p, int64_t j, int64_t n) {
    float tmp[8] = {0};
    for (int64_t l = 0; l < n; l++) tmp[l] = li_float_load(t, p, j + l);
    return _mm256_loadu_ps(tmp);
}

static inline __attribute__((always_inline)) void gemm_f_rows(li_type t, int nr, int64_t k, const char *w,
                                                              size_t w_stride, int64_t m, const float *x,
                                                              int64_t ldx, float *y, int64_t ldy) {
    for (int64_t i = 0; i < m; i++) {
        const char *wr = w + i * w_stride;
        __m256 acc0[NR], acc1[NR];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= k; j += 16) {
            const __m256 w0 = load_f(t, wr, j), w1 = load_f(t, wr, j + 8);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + j), acc0[r]);
                acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + j + 8), acc1[r]);
            }
        }
        for (; j < k; j += 8) {
            const int64_t left = k - j;
            const __m256 w0 = left >= 8 ? load_f(t, wr, j) : load_f_tail(t, wr, j, left);
            const __m256i mask = tail_mask(left);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc0[r] = _mm256_fmadd_ps(w0, _mm256_maskload_ps(x + r * ldx + j, mask), acc0[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) y[r * ldy + i] = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
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

static void avx2_gemm_f(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const float *x,
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
    memset(out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *vb = V + (size_t)bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) kv_axpy(t, out, scores[p0 + s], vb + s * row, D);
    }
    for (int d = 0; d < D; d++) out[d] *= inv;
}

static void avx2_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_head_t(LI_TYPE_F16, a, i, h, scores); break;
    case LI_TYPE_BF16: attn_head_t(LI_TYPE_BF16, a, i, h, scores); break;
    default: attn_head_t(LI_TYPE_F32, a, i, h, scores); break;
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

const li_cpu_kernels li_cpu_kernels_avx2 = {
    .isa = "avx2",
    .quantize_act = avx2_quantize_act,
    .gemm_q = avx2_gemm_q,
    .gemm_f = avx2_gemm_f,
    .attn_head = avx2_attn_head,
    .silu_mul = avx2_silu_mul,
};
