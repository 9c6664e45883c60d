/* cuda_math.h — the per-element math of the CUDA kernels, written once for
 * the device and the host.
 *
 * Everything here is plain C that nvcc compiles as __host__ __device__ and
 * a C compiler compiles as static inline: backend_cuda.cu calls it inside
 * its kernels, tests/unit/test_cuda_ops.c calls the very same code on the
 * CPU against the scalar references (kernels/types.c, cpu/ops_ref.c), so
 * the dequantization, the conversions and the 8-bit KV encoding are tested
 * on every build, with or without a GPU. Only C features both sides share:
 * no references, no templates, fixed-width integers, bit copies through a
 * union. Nothing here includes kernels/cpu/. */
#ifndef LI_CUDA_MATH_H
#define LI_CUDA_MATH_H

#include <stdint.h>
#include <math.h>

#include "types.h"

#ifdef __CUDACC__
#define LI_HD __host__ __device__ __forceinline__
#else
#define LI_HD static inline
#endif

typedef union { float f; uint32_t u; } li_cu_bits;

#ifdef __CUDA_ARCH__
LI_HD float li_cu_f32(uint32_t u) { return __uint_as_float(u); }
LI_HD uint32_t li_cu_u32(float f) { return __float_as_uint(f); }
#else
LI_HD float li_cu_f32(uint32_t u) { li_cu_bits b; b.u = u; return b.f; }
LI_HD uint32_t li_cu_u32(float f) { li_cu_bits b; b.f = f; return b.u; }
#endif

/* ---- conversions (the same bits as kernels/types.c) ---- */

LI_HD float li_cu_fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return li_cu_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) return li_cu_f32(sign | li_cu_u32((float)man * 5.9604644775390625e-8f)); /* man * 2^-24 */
    return li_cu_f32(sign | ((exp + 112) << 23) | (man << 13));
}

LI_HD uint16_t li_cu_f32_to_fp16(float f) {
    const uint32_t x = li_cu_u32(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {
        const float t = li_cu_f32(ax) + 0.5f; /* subnormal: units of 2^-24, rounded to even by the FPU */
        return (uint16_t)(sign | (uint16_t)(li_cu_u32(t) - 0x3f000000u));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1);
    return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

LI_HD float li_cu_bf16_to_f32(uint16_t h) { return li_cu_f32((uint32_t)h << 16); }

LI_HD uint16_t li_cu_f32_to_bf16(float f) {
    const uint32_t x = li_cu_u32(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

LI_HD float li_cu_fp8_to_f32(uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80) << 24, e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) v = li_cu_f32(0x7fc00000u);
    else if (e == 0) v = (float)m * 0.001953125f; /* m * 2^-9 */
    else v = li_cu_f32(((e + 120u) << 23) | (m << 20));
    return li_cu_f32(li_cu_u32(v) | sign);
}

LI_HD uint8_t li_cu_f32_to_fp8(float f) {
    const uint8_t sign = (uint8_t)((li_cu_u32(f) >> 24) & 0x80);
    if (f != f) return (uint8_t)(sign | 0x7f);
    const float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    if (a < 0.015625f) return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f)); /* below 2^-6: steps of 2^-9 */
    uint32_t u = li_cu_u32(a);
    u += 0x7ffffu + ((u >> 20) & 1);
    return (uint8_t)(sign | (uint8_t)((u >> 20) - (120u << 3)));
}

/* li_code_round: nearest even, clamped, NaN -> 0 (rintf rounds to even) */
LI_HD float li_cu_code_round(float y, float lo, float hi) {
    if (y != y) return 0.0f;
    return rintf(y < lo ? lo : y > hi ? hi : y);
}

/* ---- one element of a weight row ----
 * Element j of a row of `type` starting at `row` (its codes' value for the
 * scheme code types). The block layouts of types.h: Q4_0 / Q4_1 byte i of
 * a block holds element i (low nibble) and i + 16 (high). Returns NAN for a
 * type the backend refused at weight_prepare (li_cu_type_ok). */
LI_HD int li_cu_type_ok(int type) {
    switch (type) {
    case LI_TYPE_F32: case LI_TYPE_F16: case LI_TYPE_BF16: case LI_TYPE_Q8_0: case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1: case LI_KV_TYPE_INT8: case LI_KV_TYPE_FP8_E4M3: case LI_TYPE_U4: return 1;
    default: return 0;
    }
}

LI_HD uint16_t li_cu_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

LI_HD float li_cu_elem(int type, const uint8_t *row, int64_t j) {
    switch (type) {
    case LI_TYPE_F32: return ((const float *)row)[j];
    case LI_TYPE_F16: return li_cu_fp16_to_f32(((const uint16_t *)row)[j]);
    case LI_TYPE_BF16: return li_cu_bf16_to_f32(((const uint16_t *)row)[j]);
    case LI_TYPE_Q8_0: {
        const uint8_t *b = row + (j / 32) * 34;
        return (float)(int8_t)b[2 + j % 32] * li_cu_fp16_to_f32(li_cu_u16(b));
    }
    case LI_TYPE_Q4_0: {
        const uint8_t *b = row + (j / 32) * 18;
        const int i = (int)(j % 32);
        const int q = i < 16 ? (b[2 + i] & 0x0f) : (b[2 + i - 16] >> 4);
        return (float)(q - 8) * li_cu_fp16_to_f32(li_cu_u16(b));
    }
    case LI_TYPE_Q4_1: {
        const uint8_t *b = row + (j / 32) * 20;
        const int i = (int)(j % 32);
        const int q = i < 16 ? (b[4 + i] & 0x0f) : (b[4 + i - 16] >> 4);
        return (float)q * li_cu_fp16_to_f32(li_cu_u16(b)) + li_cu_fp16_to_f32(li_cu_u16(b + 2));
    }
    case LI_KV_TYPE_INT8: return (float)((const int8_t *)row)[j];
    case LI_KV_TYPE_FP8_E4M3: return li_cu_fp8_to_f32(row[j]);
    case LI_TYPE_U4: return (float)(j & 1 ? row[j / 2] >> 4 : row[j / 2] & 0x0f);
    default: return li_cu_f32(0x7fc00000u);
    }
}

/* The scheme's value of a stored element (li_weight_dequant_row_ref):
 * (code - zero) * scale of its group; sc / zp point at the row's groups. */
LI_HD float li_cu_scheme_value(float code, const float *sc, const float *zp, float zero, int64_t j, int64_t gs) {
    const int64_t g = j / gs;
    return (code - (zp ? zp[g] : zero)) * sc[g];
}

/* ---- activation quantization (li_act_quant_row_ref), one element ----
 * s = amax / (127, 7 or 448), inv = s > 0 ? 1/s : 0. */
LI_HD float li_cu_act_divisor(int act) { return act == LI_ACT_INT8 ? 127.0f : act == LI_ACT_INT4 ? 7.0f : 448.0f; }

LI_HD float li_cu_act_value(int act, float x, float s, float inv) {
    const float y = x * inv;
    return (act == LI_ACT_INT8   ? li_cu_code_round(y, -127.0f, 127.0f)
            : act == LI_ACT_INT4 ? li_cu_code_round(y, -7.0f, 7.0f)
                                 : li_cu_fp8_to_f32(li_cu_f32_to_fp8(y))) * s;
}

/* ---- 8-bit KV (cpu/kv_kernels.h li_kv8_scale, li_kv8_head_ref) ---- */
LI_HD float li_cu_kv8_scale(int t, float amax, float *inv) {
    if (amax > 3.40282347e38f) amax = 3.40282347e38f;
    const float scale = amax / (t == LI_KV_TYPE_INT8 ? 127.0f : 448.0f);
    if (!(scale >= 1.17549435e-38f)) {
        *inv = 0.0f;
        return 0.0f;
    }
    *inv = 1.0f / scale;
    return scale;
}

LI_HD uint8_t li_cu_kv8_encode(int t, float y) {
    return t == LI_KV_TYPE_INT8 ? (uint8_t)(int8_t)li_cu_code_round(y, -127.0f, 127.0f) : li_cu_f32_to_fp8(y);
}

LI_HD float li_cu_kv8_value(int t, uint8_t c) { return t == LI_KV_TYPE_INT8 ? (float)(int8_t)c : li_cu_fp8_to_f32(c); }

/* ---- attention: the online softmax of one warp, and the merge of the
 * warps' partial results (k_attention). A warp keeps the running max m,
 * the running sum l of exp(s - m), and acc[d] = sum exp(s - m) * v[d].
 * Step: a new score s rescales what is there by *corr and weighs the new
 * row by *w (m = -inf, l = 0 at the start: corr = 0). ---- */
LI_HD void li_cu_softmax_step(float *m, float *l, float s, float *corr, float *w) {
    const float m_new = fmaxf(*m, s);
    *corr = expf(*m - m_new);
    *w = expf(s - m_new);
    *l = *l * *corr + *w;
    *m = m_new;
}

/* The weight of warp part (m_w, l_w) in the merge, given M = the max of the
 * parts' m: exp(m_w - M), or 0 for a warp that saw no position (l_w = 0).
 * out[d] = sum_w f_w * acc_w[d] / sum_w f_w * l_w. */
LI_HD float li_cu_merge_weight(float m_w, float l_w, float M) { return l_w > 0.0f ? expf(m_w - M) : 0.0f; }

/* ---- rope: the angle of pair j at position pos, stepped by one multiply
 * per pair from pos as ops_ref.c does (theta_scale = powf(theta, -2/n_rot),
 * computed once on the host) ---- */
LI_HD float li_cu_rope_angle(float pos, float theta_scale, int j) {
    float a = pos;
    for (int t = 0; t < j; t++) a *= theta_scale;
    return a;
}

/* ---- q8 blocks: v as the q8_0 block whose largest |x| is amax stores it,
 * round(v / d) * fp16(d), d = amax / 127 (li_quantize_row_q8_0_ref,
 * dequantized, bit for bit): what a GEMV over q8-dot weights reads ---- */
/* round(v / d) as a float, d = amax / 127 (0 when amax is) */
LI_HD float li_cu_q8_round(float v, float amax) {
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return roundf(v * id);
}
/* the block's d as stored, fp16 */
LI_HD float li_cu_q8_dh(float amax) { return li_cu_fp16_to_f32(li_cu_f32_to_fp16(amax / 127.0f)); }

LI_HD float li_cu_q8_value(float v, float amax) {
    return (li_cu_q8_round(v, amax) + 0.0f) * li_cu_q8_dh(amax); /* + 0: an int8 code has no -0 */
}

/* the same block's int8 code of v (what li_cu_q8_value multiplies; NaN 0):
 * k_mmq's activations */
LI_HD int li_cu_q8_code(float v, float amax) {
    const float r = li_cu_q8_round(v, amax);
    return r >= 127.0f ? 127 : r <= -127.0f ? -127 : r == r ? (int)r : 0;
}

/* ---- the GGUF block GEMV (q4_0, q4_1, q8_0), a lane's share ----
 * A warp takes a weight row (two under swiglu); four lanes a 32-element
 * block, eight blocks a warp at a time, so a row of k = 576 takes 3 trips,
 * not 18. Lane sub s = lane % 4 of a block reads its scale (and min), 4
 * bytes of nibbles (elements 4s..4s+3 and 16+4s..16+4s+3) or 8 int8 codes
 * (8s..8s+7), and the matching activations in runs of 4 (li_cu_gemv_offs).
 * The activations come as they are, or normalized (x * inv * nw[j], the
 * rmsnorm's expression, inv its row's 1 / rms), and the warp rounds each
 * block to the CPU's q8 blocks itself: the largest |v| of the four lanes'
 * eight (two shuffles), then li_cu_q8_value. So no producer writes q8
 * blocks for a GEMV and rmsnorm and silu can live inside it. The device
 * kernel (backend_cuda.cu gemv_blk) and test_cuda_math's re-enactment of
 * its 32 lanes call these in the same order. */
LI_HD int li_cu_blk_bytes(int t) { return t == LI_TYPE_Q4_0 ? 18 : t == LI_TYPE_Q4_1 ? 20 : 34; }

enum { LI_CU_GEMV_NB = 8 }; /* activation rows a GEMV pass takes */

#ifdef __CUDA_ARCH__ /* the device pass: loops over constant bounds unrolled, acc in registers */
#define LI_CU_UNROLL _Pragma("unroll")
#define LI_CU_UNROLL2 _Pragma("unroll 2")
#else
#define LI_CU_UNROLL
#define LI_CU_UNROLL2
#endif

/* loads: wide ones on the device (the blocks' alignment allows them: a
 * q4_1 block's 4-byte nibble runs, 2 bytes elsewhere; activation runs of 4
 * at 16 bytes), the same little-endian bytes on the host */
#ifdef __CUDA_ARCH__
LI_HD uint32_t li_cu_ld16(const uint8_t *p) { return *(const uint16_t *)p; }
LI_HD uint32_t li_cu_ld32(const uint8_t *p, int aligned4) {
    return aligned4 ? *(const uint32_t *)p : li_cu_ld16(p) | li_cu_ld16(p + 2) << 16;
}
#define LI_CU_LD4(p, a)                                                                                            \
    do {                                                                                                           \
        const float4 q4_ = *(const float4 *)(p);                                                                   \
        a[0] = q4_.x, a[1] = q4_.y, a[2] = q4_.z, a[3] = q4_.w;                                                    \
    } while (0)
#else
LI_HD uint32_t li_cu_ld16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
LI_HD uint32_t li_cu_ld32(const uint8_t *p, int aligned4) {
    (void)aligned4;
    return li_cu_ld16(p) | li_cu_ld16(p + 2) << 16;
}
#define LI_CU_LD4(p, a) (a[0] = (p)[0], a[1] = (p)[1], a[2] = (p)[2], a[3] = (p)[3])
#endif

/* the first element of each of the lane's two runs of 4 in block blk */
LI_HD void li_cu_gemv_offs(int t, int64_t blk, int sub, int64_t *o0, int64_t *o1) {
    *o0 = blk * 32 + (t == LI_TYPE_Q8_0 ? 8 : 4) * sub;
    *o1 = *o0 + (t == LI_TYPE_Q8_0 ? 4 : 16);
}

/* the weight row's 8 values the lane reads in block blk */
LI_HD void li_cu_gemv_wv(int t, const uint8_t *row, int64_t blk, int sub, float *wv) {
    const uint8_t *bp = row + blk * li_cu_blk_bytes(t);
    const float d = li_cu_fp16_to_f32((uint16_t)li_cu_ld16(bp));
    if (t == LI_TYPE_Q8_0) {
        const uint8_t *qp = bp + 2 + 8 * sub;
        LI_CU_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t v = li_cu_ld16(qp + 2 * i);
            wv[2 * i] = (float)(int8_t)(v & 0xff) * d;
            wv[2 * i + 1] = (float)(int8_t)(v >> 8) * d;
        }
        return;
    }
    const uint32_t q = li_cu_ld32(bp + (t == LI_TYPE_Q4_1 ? 4 : 2) + 4 * sub, t == LI_TYPE_Q4_1);
    const float mn = t == LI_TYPE_Q4_1 ? li_cu_fp16_to_f32((uint16_t)li_cu_ld16(bp + 2)) : 0.0f;
    LI_CU_UNROLL
    for (int i = 0; i < 4; i++) {
        const int lo = (int)(q >> (8 * i)) & 0x0f, hi = (int)(q >> (8 * i + 4)) & 0x0f;
        wv[i] = t == LI_TYPE_Q4_1 ? (float)lo * d + mn : (float)(lo - 8) * d;
        wv[4 + i] = t == LI_TYPE_Q4_1 ? (float)hi * d + mn : (float)(hi - 8) * d;
    }
}

/* the lane's 8 activations of row xr (normalized when nw: (x * inv) *
 * nw[j]); the largest |v| among them (fmaxf: NaNs skipped) */
LI_HD float li_cu_gemv_xv(const float *xr, int64_t o0, int64_t o1, const float *nw, float inv, float *xv) {
    LI_CU_LD4(xr + o0, xv);
    LI_CU_LD4(xr + o1, (xv + 4));
    if (nw) {
        float a[4], c[4];
        LI_CU_LD4(nw + o0, a);
        LI_CU_LD4(nw + o1, c);
        LI_CU_UNROLL
        for (int i = 0; i < 4; i++) {
            xv[i] = (xv[i] * inv) * a[i];
            xv[4 + i] = (xv[4 + i] * inv) * c[i];
        }
    }
    float amax = 0.0f;
    LI_CU_UNROLL
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(xv[i]));
    return amax;
}

/* xv as the q8 block whose largest |v| is amax stores it */
LI_HD void li_cu_gemv_round(float *xv, float amax) {
    LI_CU_UNROLL
    for (int i = 0; i < 8; i++) xv[i] = li_cu_q8_value(xv[i], amax);
}

/* the lane's 8 products, added in one order */
LI_HD float li_cu_gemv_dot8(const float *wv, const float *xv) {
    return wv[0] * xv[0] + wv[1] * xv[1] + wv[2] * xv[2] + wv[3] * xv[3] + wv[4] * xv[4] + wv[5] * xv[5] +
           wv[6] * xv[6] + wv[7] * xv[7];
}

/* silu(g) * u, as the silu_mul op computes it */
LI_HD float li_cu_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* ---- the GEMV of the other types (f32, f16, bf16; the schemes' int8,
 * fp8 and u4 codes with their scales and zero points), a lane's share ----
 * Lane l takes 8 consecutive elements, 256 a warp at a time (a row of 576
 * in 3 trips, not the 18 of one element a lane), each value as li_cu_elem
 * and li_cu_scheme_value give it (sc NULL for a plain type), x as it is
 * (a scheme's activations are quantized before); acc[b] gets the lane's
 * sums for nb (<= 8) activation rows. A row's tail past a multiple of 8
 * is read element by element. Not for a permuted input (act-order). */
LI_HD void li_cu_gemv8_lane(int t, const uint8_t *row, int64_t k, const float *sc, const float *zp, float zero,
                            int64_t gs, const float *x, int nb, int lane, float *acc) {
    for (int64_t j0 = (int64_t)lane * 8; j0 < k; j0 += 256) {
        const int cnt = k - j0 >= 8 ? 8 : (int)(k - j0);
        float wv[8];
        LI_CU_UNROLL
        for (int i = 0; i < 8; i++) {
            float c = i < cnt ? li_cu_elem(t, row, j0 + i) : 0.0f;
            if (sc && i < cnt) c = li_cu_scheme_value(c, sc, zp, zero, j0 + i, gs);
            wv[i] = c;
        }
        LI_CU_UNROLL
        for (int b = 0; b < LI_CU_GEMV_NB; b++)
            if (b < nb) {
                const float *xr = x + b * k + j0;
                float xv[8];
                if (cnt == 8 && k % 4 == 0) {
                    LI_CU_LD4(xr, xv);
                    LI_CU_LD4(xr + 4, (xv + 4));
                } else {
                    for (int i = 0; i < 8; i++) xv[i] = i < cnt ? xr[i] : 0.0f;
                }
                acc[b] += li_cu_gemv_dot8(wv, xv);
            }
    }
}

/* ---- the block GEMM on the int8 tensor cores (k_mmq: q4_0, q4_1, q8_0) ----
 * One mma.m16n8k32 (s8 x s8 -> s32) multiplies a 32-element block of 16
 * weight rows by the q8 codes of that block of 8 activation rows. In the
 * PTX ISA's fragment layouts, lane l (g = l / 4, s = l % 4) holds A's
 * words of weight rows g and g + 8 at elements 4s..4s+3 and 16+4s..16+4s+3,
 * B's words of activation row g at the same elements, and C's sums of
 * weight rows g, g + 8 by activation rows 2s, 2s + 1. A block's sums then
 * take its scales in f32: d_w d_x sum + m_w s_x, s_x = d_x * sum(codes):
 * the q4_1 . q8_1 dot's two terms (m_w 0 for q4_0 and q8_0). */

/* four bytes' nibbles less 8 each, with no carry between bytes (q4_0's codes) */
LI_HD uint32_t li_cu_nib_less8(uint32_t nib) { return ((nib | 0x80808080u) - 0x08080808u) ^ 0x80808080u; }

/* the int8 codes of a block's elements 4s..4s+3 (hi: 16+4s..16+4s+3) as one word */
LI_HD uint32_t li_cu_mmq_word(int t, const uint8_t *bp, int s, int hi) {
    if (t == LI_TYPE_Q8_0) return li_cu_ld32(bp + 2 + 16 * hi + 4 * s, 0);
    const uint32_t q = li_cu_ld32(bp + (t == LI_TYPE_Q4_1 ? 4 : 2) + 4 * s, t == LI_TYPE_Q4_1);
    const uint32_t nib = (hi ? q >> 4 : q) & 0x0f0f0f0fu;
    return t == LI_TYPE_Q4_0 ? li_cu_nib_less8(nib) : nib;
}

/* a block's scale and its min (0 but for q4_1) */
LI_HD void li_cu_mmq_scale(int t, const uint8_t *bp, float *d, float *mn) {
    *d = li_cu_fp16_to_f32((uint16_t)li_cu_ld16(bp));
    *mn = t == LI_TYPE_Q4_1 ? li_cu_fp16_to_f32((uint16_t)li_cu_ld16(bp + 2)) : 0.0f;
}

/* a block's int32 sum as the f32 it adds to its output */
LI_HD float li_cu_mmq_term(float dw, float mw, float dx, float sx, int32_t sum) {
    return dw * dx * (float)sum + mw * sx;
}

#endif
