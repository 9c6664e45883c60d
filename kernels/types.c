/* types.c — element types and weight schemes: the traits tables, the
 * fp16 / bf16 / fp8 conversions, the scalar quantize / dequantize / dot
 * references and the scheme weights' row dequantization.
 *
 * Owns the meaning of every block format and code type. The math follows ggml's `_ref`
 * functions exactly (same rounding, same order of float operations), because
 * our logits are checked against llama.cpp's; SIMD kernels elsewhere are
 * tested against these. */
#include "types.h"
#include "backend.h" /* struct li_weight: li_weight_dequant_row_ref */

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * fp16 / bf16 <-> fp32
 * ---------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float li_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf, nan (payload kept) */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in f32 */
        float f = (float)man * 0x1p-24f;
        return f32_from_bits(sign | f32_bits(f));
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13)); /* rebias 15 -> 127 */
}

uint16_t li_fp32_to_fp16(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* nan: quiet it, keep the top payload bits (what F16C does) */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (65504 is odd, the tie goes up) */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {
        /* below 2^-14: a subnormal half. Adding 0.5 puts the value's units of
         * 2^-24 in the low mantissa bits, rounded to nearest even by the FPU;
         * a carry into 0x400 is exactly the smallest normal's encoding. */
        float t = f32_from_bits(ax) + 0.5f;
        return sign | (uint16_t)(f32_bits(t) - 0x3f000000u);
    }
    /* normal: rebias the exponent and round the 13 dropped bits to even;
     * a mantissa carry correctly bumps the exponent */
    ax += 0xc8000fffu + ((ax >> 13) & 1);
    return sign | (uint16_t)(ax >> 13);
}

float li_bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t li_fp32_to_bf16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ------------------------------------------------------------------------
 * FP8 E4M3 (bias 7, no infinities, NaN = S.1111.111, max 448)
 * ---------------------------------------------------------------------- */

float li_fp8_e4m3_to_fp32(uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80) << 24, e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) {
        v = NAN;
    } else if (e == 0) {
        v = (float)m * 0x1p-9f; /* subnormal: m/8 * 2^(1-7) */
    } else {
        const uint32_t bits = ((e + 120u) << 23) | (m << 20); /* 2^(e-7) * (1 + m/8) as an f32 */
        memcpy(&v, &bits, 4);
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    u |= sign;
    memcpy(&v, &u, 4);
    return v;
}

uint8_t li_fp32_to_fp8_e4m3(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    if (f != f) return sign | 0x7f;
    const float a = fabsf(f);
    /* saturate: beyond 448 (the next step, 480, would be the NaN code) */
    if (a >= 448.0f) return sign | 0x7e;
    /* below 2^-6 the codes are evenly spaced by 2^-9: code = round(a * 2^9),
     * 0..8, where 8 is 2^-6, the smallest normal (exponent 1, mantissa 0) */
    if (a < 0x1p-6f) return sign | (uint8_t)nearbyintf(a * 512.0f);
    /* normal: keep the top 3 of the 23 mantissa bits, rounding the other 20
     * to nearest even (a carry moves into the exponent), then re-bias the
     * exponent from 127 to 7 */
    uint32_t u;
    memcpy(&u, &a, 4);
    u += 0x7ffffu + ((u >> 20) & 1);
    return sign | (uint8_t)((u >> 20) - (120u << 3));
}

#define FP16(h) li_fp16_to_fp32(h)

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* ------------------------------------------------------------------------
 * plain types
 * ---------------------------------------------------------------------- */

static void f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = li_fp16_to_fp32(s[i]);
}

static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = li_fp32_to_fp16(src[i]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = li_bf16_to_fp32(s[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = li_fp32_to_bf16(src[i]);
}

/* scaled codes: the code values, without the scale kept beside them */
static void fp8_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = li_fp8_e4m3_to_fp32(s[i]);
}

static void fp8_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = li_fp32_to_fp8_e4m3(src[i]);
}

static void int8_to_float(const void *src, float *dst, int64_t n) {
    const int8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
}

static void int8_from_float(const float *src, void *dst, int64_t n) {
    int8_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = (int8_t)li_code_round(src[i], -127.0f, 127.0f);
}

static void u4_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n / 2; i++) {
        dst[2 * i] = (float)(s[i] & 0x0f);
        dst[2 * i + 1] = (float)(s[i] >> 4);
    }
}

static void u4_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n / 2; i++)
        d[i] = (uint8_t)((int)li_code_round(src[2 * i], 0.0f, 15.0f) |
                         (int)li_code_round(src[2 * i + 1], 0.0f, 15.0f) << 4);
}

/* ------------------------------------------------------------------------
 * quantize (as ggml's quantize_row_*_ref)
 * ---------------------------------------------------------------------- */

void li_quantize_row_q8_0_ref(const float *x, void *vy, int64_t n) {
    li_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / LI_QK8_0; b++, x += LI_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < LI_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = li_fp32_to_fp16(d);
        for (int j = 0; j < LI_QK8_0; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void li_quantize_row_q8_1_ref(const float *x, void *vy, int64_t n) {
    li_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / LI_QK8_1; b++, x += LI_QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < LI_QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < LI_QK8_1; j++) {
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = li_fp32_to_fp16(d);
        y[b].s = li_fp32_to_fp16((float)sum * d); /* with the unrounded d, as ggml */
    }
}

/* Byte j holds element j in its low nibble and element j+16 in its high. */
void li_quantize_row_q4_0_ref(const float *x, void *vy, int64_t n) {
    li_block_q4_0 *y = vy;
    for (int64_t b = 0; b < n / LI_QK4_0; b++, x += LI_QK4_0) {
        /* the signed value of largest magnitude maps to -8, using the full range */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < LI_QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = li_fp32_to_fp16(d);
        for (int j = 0; j < LI_QK4_0 / 2; j++) {
            const int q0 = min_int(15, (int8_t)(x[j] * id + 8.5f));
            const int q1 = min_int(15, (int8_t)(x[j + LI_QK4_0 / 2] * id + 8.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void li_quantize_row_q4_1_ref(const float *x, void *vy, int64_t n) {
    li_block_q4_1 *y = vy;
    for (int64_t b = 0; b < n / LI_QK4_1; b++, x += LI_QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < LI_QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = li_fp32_to_fp16(d);
        y[b].m = li_fp32_to_fp16(min);
        for (int j = 0; j < LI_QK4_1 / 2; j++) {
            const int q0 = min_int(15, (int8_t)((x[j] - min) * id + 0.5f));
            const int q1 = min_int(15, (int8_t)((x[j + LI_QK4_1 / 2] - min) * id + 0.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ------------------------------------------------------------------------
 * dequantize
 * ---------------------------------------------------------------------- */

static void q4_0_to_float(const void *src, float *y, int64_t n) {
    const li_block_q4_0 *x = src;
    for (int64_t b = 0; b < n / LI_QK4_0; b++, y += LI_QK4_0) {
        const float d = FP16(x[b].d);
        for (int j = 0; j < LI_QK4_0 / 2; j++) {
            y[j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
            y[j + LI_QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_to_float(const void *src, float *y, int64_t n) {
    const li_block_q4_1 *x = src;
    for (int64_t b = 0; b < n / LI_QK4_1; b++, y += LI_QK4_1) {
        const float d = FP16(x[b].d), m = FP16(x[b].m);
        for (int j = 0; j < LI_QK4_1 / 2; j++) {
            y[j] = (float)(x[b].qs[j] & 0x0f) * d + m;
            y[j + LI_QK4_1 / 2] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

static void q8_0_to_float(const void *src, float *y, int64_t n) {
    const li_block_q8_0 *x = src;
    for (int64_t b = 0; b < n / LI_QK8_0; b++, y += LI_QK8_0) {
        const float d = FP16(x[b].d);
        for (int j = 0; j < LI_QK8_0; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

static void q8_1_to_float(const void *src, float *y, int64_t n) {
    const li_block_q8_1 *x = src;
    for (int64_t b = 0; b < n / LI_QK8_1; b++, y += LI_QK8_1) {
        const float d = FP16(x[b].d);
        for (int j = 0; j < LI_QK8_1; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

/* ------------------------------------------------------------------------
 * dot products: integer sum per block, then one float multiply-add per
 * block in block order (ggml's vec_dot_*_generic)
 * ---------------------------------------------------------------------- */

float li_vec_dot_q4_0_q8_0_ref(int64_t n, const void *vw, const void *va) {
    const li_block_q4_0 *w = vw;
    const li_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LI_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < LI_QK4_0 / 2; j++) {
            sumi += ((w[b].qs[j] & 0x0f) - 8) * a[b].qs[j];
            sumi += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + LI_QK4_0 / 2];
        }
        sum += (float)sumi * (FP16(w[b].d) * FP16(a[b].d));
    }
    return sum;
}

float li_vec_dot_q4_1_q8_1_ref(int64_t n, const void *vw, const void *va) {
    const li_block_q4_1 *w = vw;
    const li_block_q8_1 *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LI_QK8_1; b++) {
        int sumi = 0;
        for (int j = 0; j < LI_QK4_1 / 2; j++) {
            sumi += (w[b].qs[j] & 0x0f) * a[b].qs[j];
            sumi += (w[b].qs[j] >> 4) * a[b].qs[j + LI_QK4_1 / 2];
        }
        /* sum(q_w*d_w + m_w)(q_a*d_a) = d_w*d_a*sum(q_w*q_a) + m_w*(d_a*sum(q_a)) */
        sum += (FP16(w[b].d) * FP16(a[b].d)) * (float)sumi + FP16(w[b].m) * FP16(a[b].s);
    }
    return sum;
}

float li_vec_dot_q8_0_q8_0_ref(int64_t n, const void *vw, const void *va) {
    const li_block_q8_0 *w = vw;
    const li_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LI_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < LI_QK8_0; j++) sumi += w[b].qs[j] * a[b].qs[j];
        sum += (float)sumi * (FP16(w[b].d) * FP16(a[b].d));
    }
    return sum;
}

/* ------------------------------------------------------------------------
 * the traits table, indexed by id (ggml's type_traits is the model). Every
 * assigned id has its whole row written out; retired ids 4 and 5 and the
 * unassigned 31..63 stay empty (kind LI_KIND_NONE, name NULL).
 * ---------------------------------------------------------------------- */

/* a GGUF type known by name and size only (no reference yet) */
#define KNOWN(nm, blck, size, kd) \
    {.name = nm, .blck_size = blck, .type_size = size, .kind = kd, .gguf = true, .vec_dot_type = LI_TYPE_F32}

static const li_type_traits type_traits[LI_TYPE_TABLE_SIZE] = {
    [LI_TYPE_F32] = {.name = "f32", .blck_size = 1, .type_size = 4, .kind = LI_KIND_FLOAT, .gguf = true,
                     .vec_dot_type = LI_TYPE_F32, .to_float = f32_to_float, .from_float = f32_from_float},
    [LI_TYPE_F16] = {.name = "f16", .blck_size = 1, .type_size = 2, .kind = LI_KIND_FLOAT, .gguf = true,
                     .vec_dot_type = LI_TYPE_F32, .to_float = f16_to_float, .from_float = f16_from_float},
    [LI_TYPE_Q4_0] = {.name = "q4_0", .blck_size = LI_QK4_0, .type_size = sizeof(li_block_q4_0),
                      .kind = LI_KIND_BLOCK, .gguf = true, .vec_dot_type = LI_TYPE_Q8_0, .to_float = q4_0_to_float,
                      .from_float = li_quantize_row_q4_0_ref},
    [LI_TYPE_Q4_1] = {.name = "q4_1", .blck_size = LI_QK4_1, .type_size = sizeof(li_block_q4_1),
                      .kind = LI_KIND_BLOCK, .gguf = true, .vec_dot_type = LI_TYPE_Q8_1, .to_float = q4_1_to_float,
                      .from_float = li_quantize_row_q4_1_ref},
    [LI_TYPE_Q5_0] = KNOWN("q5_0", 32, 22, LI_KIND_BLOCK),
    [LI_TYPE_Q5_1] = KNOWN("q5_1", 32, 24, LI_KIND_BLOCK),
    [LI_TYPE_Q8_0] = {.name = "q8_0", .blck_size = LI_QK8_0, .type_size = sizeof(li_block_q8_0),
                      .kind = LI_KIND_BLOCK, .gguf = true, .vec_dot_type = LI_TYPE_Q8_0, .to_float = q8_0_to_float,
                      .from_float = li_quantize_row_q8_0_ref},
    /* Q8_1 is an activation type; as a weight it is dequantized to f32 */
    [LI_TYPE_Q8_1] = {.name = "q8_1", .blck_size = LI_QK8_1, .type_size = sizeof(li_block_q8_1),
                      .kind = LI_KIND_BLOCK, .gguf = true, .vec_dot_type = LI_TYPE_F32, .to_float = q8_1_to_float,
                      .from_float = li_quantize_row_q8_1_ref},
    [LI_TYPE_Q2_K] = KNOWN("q2_K", 256, 84, LI_KIND_BLOCK),
    [LI_TYPE_Q3_K] = KNOWN("q3_K", 256, 110, LI_KIND_BLOCK),
    [LI_TYPE_Q4_K] = KNOWN("q4_K", 256, 144, LI_KIND_BLOCK),
    [LI_TYPE_Q5_K] = KNOWN("q5_K", 256, 176, LI_KIND_BLOCK),
    [LI_TYPE_Q6_K] = KNOWN("q6_K", 256, 210, LI_KIND_BLOCK),
    [LI_TYPE_Q8_K] = KNOWN("q8_K", 256, 292, LI_KIND_BLOCK),
    [LI_TYPE_IQ2_XXS] = KNOWN("iq2_xxs", 256, 66, LI_KIND_BLOCK),
    [LI_TYPE_IQ2_XS] = KNOWN("iq2_xs", 256, 74, LI_KIND_BLOCK),
    [LI_TYPE_IQ3_XXS] = KNOWN("iq3_xxs", 256, 98, LI_KIND_BLOCK),
    [LI_TYPE_IQ1_S] = KNOWN("iq1_s", 256, 50, LI_KIND_BLOCK),
    [LI_TYPE_IQ4_NL] = KNOWN("iq4_nl", 32, 18, LI_KIND_BLOCK),
    [LI_TYPE_IQ3_S] = KNOWN("iq3_s", 256, 110, LI_KIND_BLOCK),
    [LI_TYPE_IQ2_S] = KNOWN("iq2_s", 256, 82, LI_KIND_BLOCK),
    [LI_TYPE_IQ4_XS] = KNOWN("iq4_xs", 256, 136, LI_KIND_BLOCK),
    [LI_TYPE_I8] = KNOWN("i8", 1, 1, LI_KIND_INT),
    [LI_TYPE_I16] = KNOWN("i16", 1, 2, LI_KIND_INT),
    [LI_TYPE_I32] = KNOWN("i32", 1, 4, LI_KIND_INT),
    [LI_TYPE_I64] = KNOWN("i64", 1, 8, LI_KIND_INT),
    [LI_TYPE_F64] = KNOWN("f64", 1, 8, LI_KIND_FLOAT),
    [LI_TYPE_IQ1_M] = KNOWN("iq1_m", 256, 56, LI_KIND_BLOCK),
    [LI_TYPE_BF16] = {.name = "bf16", .blck_size = 1, .type_size = 2, .kind = LI_KIND_FLOAT, .gguf = true,
                      .vec_dot_type = LI_TYPE_F32, .to_float = bf16_to_float, .from_float = bf16_from_float},
    /* scaled codes (not GGUF): the KV cache's 8-bit types, also the codes of
     * the W8A8 / FP8 / 4-bit weight schemes */
    [LI_KV_TYPE_FP8_E4M3] = {.name = "fp8_e4m3", .blck_size = 1, .type_size = 1, .kind = LI_KIND_FP8,
                             .scaled = true, .vec_dot_type = LI_TYPE_F32, .to_float = fp8_to_float,
                             .from_float = fp8_from_float},
    [LI_KV_TYPE_INT8] = {.name = "int8", .blck_size = 1, .type_size = 1, .kind = LI_KIND_INT, .scaled = true,
                         .vec_dot_type = LI_TYPE_F32, .to_float = int8_to_float, .from_float = int8_from_float},
    [LI_TYPE_U4] = {.name = "u4", .blck_size = 2, .type_size = 1, .kind = LI_KIND_INT, .scaled = true,
                    .vec_dot_type = LI_TYPE_F32, .to_float = u4_to_float, .from_float = u4_from_float},
};

#undef KNOWN

const li_type_traits *li_type_info(uint32_t type) {
    if (type >= LI_TYPE_TABLE_SIZE || !type_traits[type].name) return NULL;
    return &type_traits[type];
}

const li_type_traits *li_type_get(uint32_t type) {
    const li_type_traits *t = li_type_info(type);
    return t && t->gguf ? t : NULL;
}

const char *li_type_name(uint32_t type) {
    const li_type_traits *t = li_type_info(type);
    return t ? t->name : "unknown";
}

bool li_type_row_size(uint32_t type, int64_t n, size_t *out) {
    const li_type_traits *t = li_type_info(type);
    if (!t || n < 0 || n % t->blck_size != 0) return false;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)(n / t->blck_size), t->type_size, &bytes)) return false;
    *out = bytes;
    return true;
}

void li_type_unreachable(const char *where, uint32_t type) {
    fprintf(stderr, "luainfer: %s: no kernel for %s (type %u): it should have been refused earlier\n", where,
            li_type_name(type), (unsigned)type);
    abort();
}

li_type li_type_vec_dot_type(li_type weight_type) {
    const li_type_traits *t = li_type_info(weight_type);
    return t ? t->vec_dot_type : LI_TYPE_F32;
}

/* ------------------------------------------------------------------------
 * weight schemes
 * ---------------------------------------------------------------------- */

static const li_scheme_traits scheme_traits[LI_SCHEME_COUNT] = {
    [LI_SCHEME_PLAIN] = {.name = "plain", .codes = LI_TYPE_COUNT, .act = LI_ACT_F32},
    [LI_SCHEME_W8A8] = {.name = "w8a8", .codes = LI_KV_TYPE_INT8, .act = LI_ACT_INT8},
    [LI_SCHEME_FP8] = {.name = "fp8", .codes = LI_KV_TYPE_FP8_E4M3, .act = LI_ACT_FP8},
    [LI_SCHEME_AWQ] = {.name = "awq", .codes = LI_TYPE_U4, .act = LI_ACT_F32, .zeros = true},
    [LI_SCHEME_GPTQ] = {.name = "gptq", .codes = LI_TYPE_U4, .act = LI_ACT_F32, .zeros = true, .perm = true},
    /* also W4A4: per-channel int4 weights with int4 activations per token */
    [LI_SCHEME_INT4] = {.name = "int4", .codes = LI_TYPE_U4, .act = LI_ACT_F32, .zero = 8.0f,
                        .acts = 1u << LI_ACT_INT4},
};

const li_scheme_traits *li_scheme_info(uint32_t scheme) {
    return scheme < LI_SCHEME_COUNT ? &scheme_traits[scheme] : NULL;
}

const char *li_scheme_name(uint32_t scheme) {
    const li_scheme_traits *s = li_scheme_info(scheme);
    return s ? s->name : "unknown";
}

const char *li_act_quant_name(uint32_t act) {
    static const char *const names[LI_ACT_COUNT] = {[LI_ACT_F32] = "f32", [LI_ACT_INT8] = "int8",
                                                    [LI_ACT_FP8] = "fp8", [LI_ACT_INT4] = "int4"};
    return act < LI_ACT_COUNT ? names[act] : "unknown";
}

void li_act_quant_row_ref(li_act_quant act, const float *x, float *out, int64_t n) {
    if (act == LI_ACT_F32) {
        memcpy(out, x, (size_t)n * sizeof(float));
        return;
    }
    float amax = 0.0f;
    for (int64_t j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j])); /* fmaxf skips NaNs */
    const float s = amax / (act == LI_ACT_INT8 ? 127.0f : act == LI_ACT_INT4 ? 7.0f : 448.0f);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float y = x[j] * inv;
        out[j] = (act == LI_ACT_INT8   ? li_code_round(y, -127.0f, 127.0f)
                  : act == LI_ACT_INT4 ? li_code_round(y, -7.0f, 7.0f)
                                       : li_fp8_e4m3_to_fp32(li_fp32_to_fp8_e4m3(y))) * s;
    }
}

int64_t li_weight_n_groups(const li_weight *w) {
    return w->group_size > 0 ? (w->k + w->group_size - 1) / w->group_size : 1;
}

int li_weight_check(const li_weight *w, char *why, size_t cap) {
    const li_scheme_traits *s = li_scheme_info(w->scheme);
    const li_type_traits *t = li_type_info(w->type);
#define WHY(...) return (snprintf(why, cap, __VA_ARGS__), -1)
    if (!s) WHY("unknown weight scheme %u", (unsigned)w->scheme);
    if (!t || !t->to_float) WHY("%s weights: type %s has no dequantization", s->name, li_type_name(w->type));
    if (w->k <= 0 || w->m <= 0 || w->k % t->blck_size) WHY("%s weights: bad shape (%lld, %lld) for %s", s->name,
                                                            (long long)w->m, (long long)w->k, t->name);
    if (w->act >= LI_ACT_COUNT) WHY("%s weights: unknown activation quantization %u", s->name, (unsigned)w->act);
    if (w->scheme == LI_SCHEME_PLAIN) {
        if (w->scales || w->zeros || w->perm || w->group_size || w->act != LI_ACT_F32 || t->scaled)
            WHY("plain %s weights carry no scales, zero points, groups, permutation or activation quantization",
                t->name);
        return 0;
    }
    if (w->type != s->codes) WHY("%s weights store %s codes, not %s", s->name, li_type_name(s->codes), t->name);
    if (w->act != s->act && !(s->acts & (1u << w->act)))
        WHY("%s weights quantize activations as %s, not %s", s->name, li_act_quant_name(s->act),
            li_act_quant_name(w->act));
    if (!w->scales) WHY("%s weights need scales", s->name);
    if (w->group_size < 0 || (w->group_size > 0 && w->group_size % t->blck_size))
        WHY("%s weights: group size %lld is not a positive multiple of %lld", s->name, (long long)w->group_size,
            (long long)t->blck_size);
    if (w->zeros && !s->zeros) WHY("%s weights have no zero points", s->name);
    if (w->perm && !s->perm) WHY("%s weights have no column permutation", s->name);
    if (w->perm) { /* every column exactly once */
        uint8_t *seen = calloc((size_t)w->k, 1);
        if (!seen) WHY("%s weights: out of memory checking the permutation", s->name);
        int64_t bad = -1;
        for (int64_t j = 0; j < w->k && bad < 0; j++) {
            if (w->perm[j] < 0 || w->perm[j] >= w->k || seen[w->perm[j]]) bad = j;
            else seen[w->perm[j]] = 1;
        }
        free(seen);
        if (bad >= 0) WHY("%s weights: perm[%lld] = %d is not a permutation of 0..%lld", s->name, (long long)bad,
                          (int)w->perm[bad], (long long)w->k - 1);
    }
#undef WHY
    return 0;
}

/* Code values q (stored order) of row `row` as values: (q - zero) * scale
 * per group, each stored column j put at its input column perm[j]. q may be
 * out when there is no permutation. */
static void scheme_values(const li_weight *w, int64_t row, const float *q, float *out) {
    const int64_t ng = li_weight_n_groups(w), gs = w->group_size > 0 ? w->group_size : w->k;
    const float *sc = w->scales + row * ng, *zp = w->zeros ? w->zeros + row * ng : NULL;
    const float zero = li_scheme_info(w->scheme)->zero;
    for (int64_t j = 0; j < w->k; j++) {
        const int64_t g = j / gs;
        out[w->perm ? w->perm[j] : j] = (q[j] - (zp ? zp[g] : zero)) * sc[g];
    }
}

void li_weight_dequant_row(const li_weight *w, int64_t row, float *out, float *scratch) {
    const li_type_traits *t = li_type_info(w->type);
    const void *src = (const char *)w->data + row * w->row_bytes;
    if (w->scheme == LI_SCHEME_PLAIN) { /* GGUF weights: the blocks say everything */
        t->to_float(src, out, w->k);
        return;
    }
    float *q = w->perm ? scratch : out; /* codes in stored order, then placed */
    t->to_float(src, q, w->k);
    scheme_values(w, row, q, out);
}

void li_weight_dequant_row_ref(const li_weight *w, int64_t row, float *out) {
    float *scratch = w->perm ? malloc((size_t)w->k * sizeof(float)) : NULL;
    if (w->perm && !scratch) abort(); /* tiny and rare (the reference); like li_xmalloc */
    li_weight_dequant_row(w, row, out, scratch);
    free(scratch);
}

int li_weight_requant_row_ref(const li_weight *w, int64_t row, const float *x, void *codes, float *out,
                              float *scratch) {
    const li_type_traits *t = li_type_info(w->type);
    if (w->scheme == LI_SCHEME_PLAIN || !t || !t->from_float || !t->to_float) return -1;
    const int64_t ng = li_weight_n_groups(w), gs = w->group_size > 0 ? w->group_size : w->k;
    const float *sc = w->scales + row * ng, *zp = w->zeros ? w->zeros + row * ng : NULL;
    const float zero = li_scheme_info(w->scheme)->zero;
    /* stored order: x at each stored column's input column, in code units */
    for (int64_t j = 0; j < w->k; j++) {
        const int64_t g = j / gs;
        const float z = zp ? zp[g] : zero, v = x[w->perm ? w->perm[j] : j];
        /* a zero group keeps its zero point; no + 0 (it would turn fp8's -0 code into +0) */
        scratch[j] = sc[g] == 0.0f ? z : z != 0.0f ? v / sc[g] + z : v / sc[g];
    }
    t->from_float(scratch, codes, w->k);
    if (out) { /* the codes' values, as li_weight_dequant_row_ref reads them */
        t->to_float(codes, scratch, w->k);
        scheme_values(w, row, scratch, out);
    }
    return 0;
}
