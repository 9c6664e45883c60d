/* attn_avx512.c — the AVX-512 attention kernels: one (token, head) over its
 * paged K/V, and tiles of queries that share a KV head (decode groups,
 * verification, prefill), K/V in F16 / BF16 / F32.
 *
 * Compiled with -mavx512*; cpu.c calls in only after CPUID says yes. FMA and
 * a SIMD exp: not the reference's bits, but the same arithmetic for a token
 * whatever else is in the batch. Apart from ops_avx512.c (GEMM, norms) so the
 * two compile side by side: these always-inline tiles, expanded per dtype
 * and head width, are the longest compile of the tree. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/simd_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

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
    const li_attn_head hd = li_attn_head_of(a, t, i, h);
    const int64_t n_pos = hd.n_pos;
    const size_t row = hd.row;

    /* scores, walking the block table block by block (no division per position) */
    float max = -INFINITY;
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *kb = hd.k + (size_t)hd.bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) {
            const float sc = kv_dot(t, hd.q, kb + s * row, D) * a->scale;
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
    memset(hd.out, 0, (size_t)D * sizeof(float));
    for (int64_t p0 = 0, bi = 0; p0 < n_pos; p0 += bs, bi++) {
        const char *vb = hd.v + (size_t)hd.bt[bi] * bs * row;
        const int64_t np = LI_MIN((int64_t)bs, n_pos - p0);
        for (int64_t s = 0; s < np; s++) kv_axpy(t, hd.out, scores[p0 + s], vb + s * row, D);
    }
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int d = 0; d < D; d += 16) {
        const __mmask16 mask = tail16(D - d);
        _mm512_mask_storeu_ps(hd.out + d, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, hd.out + d), vinv));
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

void li_avx512_attn_merge(const li_attn_args *a, const li_attn_part *part, int64_t i, int h) {
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

void li_avx512_attn_tile(const li_attn_args *a, int64_t i0, int nt, int kvh, int g0, int ng, int chunk,
                         const li_attn_part *part, float *scratch) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_tile_F16(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    case LI_TYPE_BF16: attn_tile_BF16(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    case LI_TYPE_F32: attn_tile_F32(a, i0, nt, kvh, g0, ng, chunk, part, scratch); break;
    default: li_type_unreachable("cpu avx512: attn_tile", a->kv->dtype); /* cpu.c tiles no 8-bit cache */
    }
}

void li_avx512_attn_head(const li_attn_args *a, int64_t i, int h, float *scores) {
    switch (a->kv->dtype) {
    case LI_TYPE_F16: attn_head_t(LI_TYPE_F16, a, i, h, scores); break;
    case LI_TYPE_BF16: attn_head_t(LI_TYPE_BF16, a, i, h, scores); break;
    case LI_TYPE_F32: attn_head_t(LI_TYPE_F32, a, i, h, scores); break;
    default: li_type_unreachable("cpu avx512: attn_head", a->kv->dtype); /* cpu.c sends FP8 / INT8 to kv_avx512.c */
    }
}
