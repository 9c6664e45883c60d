/* ggml_ref.c — the scalar reference of llama.cpp's x86 arithmetic (isa "ggml").
 *
 * Written from reading ggml-cpu's x86 code paths (arch/x86/quants.c, vec.h,
 * vec.cpp, ops.cpp, llamafile/sgemm.cpp) as llama-cpp-python 0.3.36 builds
 * them with GGML_NATIVE on an AVX-512 machine. Each function states the order
 * of float operations it reproduces. This file is compiled as ISO C11
 * (-ffp-contract=off in effect): every fused multiply-add is an explicit
 * fmaf, where the vector code (or GCC's contraction of ggml's GNU-mode C)
 * fuses one. See ggml_kernels.h. */
#include "util/common.h"
#include "cpu/ggml_kernels.h"
#include "cpu/cpu_kernels.h"
#include "cpu/ggml_impl.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * activation quantization (quantize_row_q8_0 / q8_1, AVX2 branch)
 * d = amax/127 (stored as fp16), multiplier 127/amax (not 1/d), round half
 * to even (_mm256_round_ps), saturating packs to int8. Q8_1's s is
 * fp16(d * sum(q)) with the unrounded d.
 * ---------------------------------------------------------------------- */

static float quantize_block(const float *x, int8_t *q, int32_t *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) { /* fmaxf's result (a NaN is skipped), without the libm call */
        const float v = fabsf(x[j]);
        amax = v > amax ? v : amax;
    }
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    uint32_t s = 0; /* wraps as _mm256_add_epi32 does */
    for (int j = 0; j < 32; j++) {
        float r = nearbyintf(x[j] * id); /* default rounding mode: half to even */
        /* vcvtps2dq: a NaN or out-of-range value becomes INT32_MIN (a
         * subnormal amax makes id infinite, and 0 * inf is NaN) */
        int32_t v = r >= -2147483648.0f && r < 2147483648.0f ? (int32_t)r : INT32_MIN;
        s += (uint32_t)v;
        q[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
    }
    *sum = (int32_t)s;
    return d;
}

void li_ggml_quantize_q8_0(const float *x, void *vy, int64_t k) { g_quantize_q8_0(x, vy, k, quantize_block); }
void li_ggml_quantize_q8_1(const float *x, void *vy, int64_t k) { g_quantize_q8_1(x, vy, k, quantize_block); }

void li_ggml_widen_q8_1(const void *q8_1, li_ggml_q8_1f *out, int64_t k) {
    const li_block_q8_1 *a = q8_1;
    for (int64_t b = 0; b < k / 32; b++) {
        out[b].d = li_fp16_to_fp32(a[b].d);
        out[b].s = li_fp16_to_fp32(a[b].s);
        memcpy(out[b].qs, a[b].qs, 32);
    }
}

/* ------------------------------------------------------------------------
 * quantized dots (ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0, AVX2 branch; the Q8_0
 * sgemm of a prompt batch accumulates the same way)
 * ---------------------------------------------------------------------- */

float li_ggml_dot_q4_1_q8_1_ref(int64_t k, const void *vw, const void *va) {
    const li_block_q4_1 *w = vw;
    const li_block_q8_1 *a = va;
    float acc[8] = {0};
    float summs = 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        const float d0 = li_fp16_to_fp32(w[b].d), d1 = li_fp16_to_fp32(a[b].d);
        /* summs += m*s in GNU-mode C: GCC contracts it to an FMA */
        summs = fmaf(li_fp16_to_fp32(w[b].m), li_fp16_to_fp32(a[b].s), summs);
        const float dd = d0 * d1;
        for (int l = 0; l < 8; l++) { /* lane l: elements 4l..4l+3 */
            int32_t isum = 0;
            for (int t = 0; t < 4; t++) {
                const int e = 4 * l + t;
                const int q = e < 16 ? (w[b].qs[e] & 15) : (w[b].qs[e - 16] >> 4);
                isum += q * a[b].qs[e];
            }
            acc[l] = fmaf(dd, (float)isum, acc[l]);
        }
    }
    return li_ggml_hsum8(acc) + summs;
}

float li_ggml_dot_q8_0_q8_0_ref(int64_t k, const void *vw, const void *va) {
    const li_block_q8_0 *w = vw;
    const li_block_q8_0 *a = va;
    float acc[8] = {0};
    for (int64_t b = 0; b < k / 32; b++) {
        const float dd = li_fp16_to_fp32(w[b].d) * li_fp16_to_fp32(a[b].d);
        for (int l = 0; l < 8; l++) {
            int32_t isum = 0;
            for (int t = 0; t < 4; t++) isum += w[b].qs[4 * l + t] * a[b].qs[4 * l + t];
            acc[l] = fmaf(dd, (float)isum, acc[l]);
        }
    }
    return li_ggml_hsum8(acc);
}

/* ------------------------------------------------------------------------
 * rmsnorm (ops.cpp): float squares summed in double, in order; the mean
 * rounded to float; scale 1/sqrtf(mean + eps); y = (x * scale) * w
 * ---------------------------------------------------------------------- */

void li_ggml_rmsnorm_row(const float *x, const float *w, float *y, int64_t dim, float eps) {
    double sum = 0.0;
    for (int64_t j = 0; j < dim; j++) sum += (double)(x[j] * x[j]);
    const float mean = (float)(sum / (double)dim);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t j = 0; j < dim; j++) y[j] = (x[j] * scale) * w[j];
}

/* ------------------------------------------------------------------------
 * rope (ops.cpp: ggml_rope_cache_init, rotate_pairs)
 * theta starts at the position and is multiplied by base^(-2/n_rot) once
 * per pair; the rotation's two products and sum are contracted by GCC
 * (GNU-mode C++) into one FMA each: x0*c - x1*s = fma(x0, c, -(x1*s)).
 * ---------------------------------------------------------------------- */

void li_ggml_rope_cache(float *cs, int32_t pos, int n_rot, float theta_base) {
    const float theta_scale = powf(theta_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int j = 0; j < n_rot / 2; j++) {
        cs[2 * j] = cosf(theta);
        cs[2 * j + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

void li_ggml_rope_head(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int j = 0; j < half; j++) {
        const float c = cs[2 * j], s = cs[2 * j + 1];
        float *p0 = neox ? &x[j] : &x[2 * j];
        float *p1 = neox ? &x[j + half] : &x[2 * j + 1];
        const float x0 = *p0, x1 = *p1;
        *p0 = fmaf(x0, c, -(x1 * s));
        *p1 = fmaf(x0, s, x1 * c);
    }
}


/* ------------------------------------------------------------------------
 * exported entry points of ggml_impl.h's generic build
 * ---------------------------------------------------------------------- */

float li_ggml_hsum16(const float v[16]) { return g_hsum16(v); }
float li_ggml_hsum8(const float v[8]) { return g_hsum8(v); }
float li_ggml_expf(float x) { return g_expf(x); }
void li_ggml_silu_mul(float *g, const float *u, int64_t n) { g_silu_mul(g, u, n); }
float li_ggml_dot_f16_vec(int64_t n, const float *x, const float *y) { return g_dot_f16_vec(n, x, y); }
float li_ggml_dot_f16_gemm(int64_t n, const float *x, const float *y) { return g_dot_f16_gemm(n, x, y); }
void li_ggml_attn_heads(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch) {
    g_attn_heads(a, i, h0, nh, gemm, scratch);
}

size_t li_ggml_attn_scratch(int64_t max_pos, int nh) {
    return (size_t)nh * ((((size_t)max_pos + 64) & ~(size_t)63) + 256) + 64 * 256 + 256;
}
