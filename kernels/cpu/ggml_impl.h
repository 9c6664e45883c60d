/* ggml_impl.h — the float-heavy "ggml" kernels as static inline code, built
 * twice: generic in ggml_ref.c (the reference, fmaf a libm call) and with FMA
 * enabled in ggml_avx2.c (fmaf one instruction). The C is the same and fmaf
 * is exact either way, so both builds give the same bits; the files compile
 * as ISO C11, so the compiler fuses nothing on its own (-ffp-contract=off).
 * Internal to kernels/cpu; see ggml_kernels.h. */
#ifndef LI_GGML_IMPL_H
#define LI_GGML_IMPL_H

#include "util/common.h"
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * reductions
 * ---------------------------------------------------------------------- */

/* _mm512_reduce_add_ps in GCC: halves, then quarters, then (0+2) + (1+3) */
static inline float g_hsum16(const float v[16]) {
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++) t8[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; i++) t4[i] = t8[4 + i] + t8[i];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* hsum_float_8 (quants.c): the same tree over 8 lanes */
static inline float g_hsum8(const float v[8]) {
    float t4[4];
    for (int i = 0; i < 4; i++) t4[i] = v[4 + i] + v[i];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* ------------------------------------------------------------------------
 * activation rows to Q8_0 / Q8_1 blocks, around a block quantizer that
 * returns d = amax/127 and the sum of its quants (ggml_ref.c, ggml_avx2.c)
 * ---------------------------------------------------------------------- */

typedef float (*g_qblock_fn)(const float *x, int8_t *q, int32_t *sum);

static inline __attribute__((always_inline)) void g_quantize_q8_0(const float *x, void *vy, int64_t k, g_qblock_fn f) {
    li_block_q8_0 *y = vy;
    for (int64_t b = 0; b < k / 32; b++) {
        int32_t s;
        y[b].d = li_fp32_to_fp16(f(x + b * 32, y[b].qs, &s));
    }
}

static inline __attribute__((always_inline)) void g_quantize_q8_1(const float *x, void *vy, int64_t k, g_qblock_fn f) {
    li_block_q8_1 *y = vy;
    for (int64_t b = 0; b < k / 32; b++) {
        int32_t s;
        const float d = f(x + b * 32, y[b].qs, &s);
        y[b].d = li_fp32_to_fp16(d);
        y[b].s = li_fp32_to_fp16(d * (float)s);
    }
}

/* ------------------------------------------------------------------------
 * exp, silu (vec.h: ggml_v_expf / ggml_v_silu, AVX-512 branch)
 * n = round(x/ln2) by the 1.5*2^23 shift, b = x - n*ln2 in two steps, a
 * degree-5 polynomial in b, scaled by 2^n; |n| > 192 saturates to 0 or inf.
 * ---------------------------------------------------------------------- */

static inline float g_expf(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    if (isnan(n)) return n;
    /* _mm512_scalef_ps: j * 2^n, correctly rounded. In double the product
     * is exact (|n| <= 192, j has 24 bits), so one rounding to float gives
     * what ldexpf gives, subnormals included, without a libm call */
    union { uint64_t u; double d; } p2 = {.u = (uint64_t)((int64_t)n + 1023) << 52};
    return (float)((double)j * p2.d);
}

static inline void g_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = (x / (1.0f + g_expf(0.0f - x))) * u[i];
    }
}

/* ------------------------------------------------------------------------
 * attention (llama-graph.cpp build_attn_mha, flash attention off)
 * kq = K·q with q rounded to F16; softmax(kq * scale) over the cache row;
 * kqv = V^T·p with p rounded to F16. One decode token goes through
 * ggml_vec_dot_f16; a batch of 2+ tokens through llamafile's tinyBLAS.
 * ---------------------------------------------------------------------- */

/* ggml_vec_dot_f16 (AVX-512): 4 accumulators of 16 lanes over 64-element
 * steps, folded (0+2, 1+3, then 0+1), reduced, then the tail in double */
static inline float g_dot_f16_vec(int64_t n, const float *x, const float *y) {
    float acc[4][16] = {{0}};
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 16; l++) acc[r][l] = fmaf(x[i + 16 * r + l], y[i + 16 * r + l], acc[r][l]);
    for (int l = 0; l < 16; l++) {
        acc[0][l] = acc[0][l] + acc[2][l];
        acc[1][l] = acc[1][l] + acc[3][l];
    }
    for (int l = 0; l < 16; l++) acc[0][l] = acc[0][l] + acc[1][l];
    double sum = g_hsum16(acc[0]);
    for (int64_t i = np; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

/* tinyBLAS<16, __m512>: one 16-lane accumulator over the whole row */
static inline float g_dot_f16_gemm(int64_t n, const float *x, const float *y) {
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    return g_hsum16(acc);
}

/* x rounded to F16 (nearest even) and back */
static inline float g_f16_round(float x) {
#ifdef LI_GGML_F16C
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
    return li_fp16_to_fp32(li_fp32_to_fp16(x));
#endif
}

/* one K or V row as floats (F16 -> F32 is exact, so any converter will do) */
static inline void g_load_row(li_type dt, const void *row, float *out, int D) {
#ifdef LI_GGML_F16C
    if (dt == LI_TYPE_F16) {
        int d = 0;
        for (; d + 8 <= D; d += 8)
            _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d))));
        for (; d < D; d++) out[d] = _cvtsh_ss(((const uint16_t *)row)[d]);
        return;
    }
#endif
    for (int d = 0; d < D; d++) out[d] = li_float_load(dt, row, d);
}


/* The two dot orders over positions, for every dimension of V at once:
 * accumulator (r, l) of dimension d sees positions p = 64c + 16r + l (vec)
 * or p = 16c + l (gemm) in increasing c, exactly as the row-by-row dot. */
static inline void g_attn_pv(const li_attn_args *a, int64_t i, int kvh, int64_t P, int64_t np, const float *w,
                             int gemm, float *acc, float *vf, float *out) {
    const int D = a->head_dim;
    memset(acc, 0, (size_t)64 * D * sizeof(float));
    li_kv_walk vw = li_kv_walk_init(a, a->kv->v, i, kvh);
    for (int64_t p = 0; p < np; p++) {
        const int slot = gemm ? (int)(p & 15) : (int)(p & 63); /* r*16 + l */
        float *ac = acc + (size_t)slot * D;
        if (p < P) {
            g_load_row(a->kv->dtype, li_kv_walk_next(&vw), vf, D);
            for (int d = 0; d < D; d++) ac[d] = fmaf(vf[d], w[p], ac[d]);
        } else { /* padding: a zero weight adds exactly nothing but keeps the shape */
            for (int d = 0; d < D; d++) ac[d] = fmaf(0.0f, w[p], ac[d]);
        }
    }
    float lanes[16];
    for (int d = 0; d < D; d++) {
        if (gemm) {
            for (int l = 0; l < 16; l++) lanes[l] = acc[(size_t)l * D + d];
        } else {
            for (int l = 0; l < 16; l++) {
                const float r0 = acc[(size_t)(0 * 16 + l) * D + d] + acc[(size_t)(2 * 16 + l) * D + d];
                const float r1 = acc[(size_t)(1 * 16 + l) * D + d] + acc[(size_t)(3 * 16 + l) * D + d];
                lanes[l] = r0 + r1;
            }
        }
        out[d] = g_hsum16(lanes); /* np % 64 == 0: no double-precision tail */
    }
}

/* Heads h0 .. h0+nh-1 of token i, all of one kv head: each K row is loaded
 * and converted once for the group. Every head's arithmetic is the single
 * head's, so grouping never changes a bit. scratch: li_ggml_attn_scratch. */
static inline void g_attn_heads(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch) {
    const int D = a->head_dim;
    const int kvh = h0 / (a->n_head / a->n_head_kv);
    const int64_t P = (int64_t)a->pos[i] + 1;      /* visible positions 0..pos */
    const int64_t np = (P + 63) & ~(int64_t)63;    /* llama.cpp's row is >= 256 cells; the rest weigh 0 */
    float *q16 = scratch;                          /* (nh, 256) */
    float *kf = q16 + (size_t)nh * 256;            /* (256) one K or V row */
    float *acc = kf + 256;                         /* (64, D) KQV accumulators */
    float *s = acc + 64 * 256;                     /* (nh, np) scores, then weights rounded to F16 */
    for (int g = 0; g < nh; g++) {
        const float *q = a->q + (i * a->n_head + h0 + g) * D;
        for (int d = 0; d < D; d++) q16[g * 256 + d] = g_f16_round(q[d]);
    }
    const int kq_gemm = gemm && D % 16 == 0;       /* tinyBLAS needs k % 16 == 0 */
    float max[64];
    for (int g = 0; g < nh; g++) max[g] = -INFINITY;
    li_kv_walk kw = li_kv_walk_init(a, a->kv->k, i, kvh);
    for (int64_t p = 0; p < P; p++) {
        g_load_row(a->kv->dtype, li_kv_walk_next(&kw), kf, D);
        for (int g = 0; g < nh; g++) {
            const float *qg = q16 + g * 256;
            const float kq = kq_gemm ? g_dot_f16_gemm(D, kf, qg) : g_dot_f16_vec(D, kf, qg);
            const float v = kq * a->scale;
            s[g * np + p] = v;
            if (v > max[g]) max[g] = v;
        }
    }
    for (int g = 0; g < nh; g++) {
        float *sg = s + g * np;
        /* softmax: exp by 16-lane chunks, each chunk's sum added in double */
        for (int64_t p = P; p < np; p++) sg[p] = 0.0f;
        for (int64_t p = 0; p < P; p++) sg[p] = g_expf(sg[p] - max[g]);
        double sum = 0.0;
        for (int64_t c = 0; c < np; c += 16) sum += (double)g_hsum16(sg + c);
        const float inv = (float)(1.0 / sum);
        for (int64_t p = 0; p < P; p++) sg[p] = g_f16_round(sg[p] * inv);
        g_attn_pv(a, i, kvh, P, np, sg, gemm, acc, kf, a->out + (i * a->n_head + h0 + g) * D);
    }
}

#endif
