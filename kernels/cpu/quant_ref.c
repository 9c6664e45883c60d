/* quant_ref.c — element types: the traits table, fp16/bf16 conversions and
 * the scalar quantize / dequantize / dot references.
 *
 * Owns the meaning of every block format. The math follows ggml's `_ref`
 * functions exactly (same rounding, same order of float operations), because
 * our logits are checked against llama.cpp's; SIMD kernels elsewhere are
 * tested against these. */
#include "types.h"

#include <float.h>
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

li_type li_type_vec_dot_type(li_type weight_type) {
    switch (weight_type) {
    case LI_TYPE_Q4_0: return LI_TYPE_Q8_0;
    case LI_TYPE_Q4_1: return LI_TYPE_Q8_1;
    case LI_TYPE_Q8_0: return LI_TYPE_Q8_0;
    default: return LI_TYPE_F32; /* float weights, or any other type dequantized to f32 */
    }
}

/* ------------------------------------------------------------------------
 * the traits table: indexed by id, retired ids 4 and 5 left empty
 * ---------------------------------------------------------------------- */

static const li_type_traits type_traits[LI_TYPE_COUNT] = {
    [LI_TYPE_F32] = {"f32", 1, 4, f32_to_float, f32_from_float},
    [LI_TYPE_F16] = {"f16", 1, 2, f16_to_float, f16_from_float},
    [LI_TYPE_Q4_0] = {"q4_0", LI_QK4_0, sizeof(li_block_q4_0), q4_0_to_float, li_quantize_row_q4_0_ref},
    [LI_TYPE_Q4_1] = {"q4_1", LI_QK4_1, sizeof(li_block_q4_1), q4_1_to_float, li_quantize_row_q4_1_ref},
    [LI_TYPE_Q5_0] = {"q5_0", 32, 22, NULL, NULL},
    [LI_TYPE_Q5_1] = {"q5_1", 32, 24, NULL, NULL},
    [LI_TYPE_Q8_0] = {"q8_0", LI_QK8_0, sizeof(li_block_q8_0), q8_0_to_float, li_quantize_row_q8_0_ref},
    [LI_TYPE_Q8_1] = {"q8_1", LI_QK8_1, sizeof(li_block_q8_1), q8_1_to_float, li_quantize_row_q8_1_ref},
    [LI_TYPE_Q2_K] = {"q2_K", 256, 84, NULL, NULL},
    [LI_TYPE_Q3_K] = {"q3_K", 256, 110, NULL, NULL},
    [LI_TYPE_Q4_K] = {"q4_K", 256, 144, NULL, NULL},
    [LI_TYPE_Q5_K] = {"q5_K", 256, 176, NULL, NULL},
    [LI_TYPE_Q6_K] = {"q6_K", 256, 210, NULL, NULL},
    [LI_TYPE_Q8_K] = {"q8_K", 256, 292, NULL, NULL},
    [LI_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, NULL, NULL},
    [LI_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, NULL, NULL},
    [LI_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, NULL, NULL},
    [LI_TYPE_IQ1_S] = {"iq1_s", 256, 50, NULL, NULL},
    [LI_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, NULL, NULL},
    [LI_TYPE_IQ3_S] = {"iq3_s", 256, 110, NULL, NULL},
    [LI_TYPE_IQ2_S] = {"iq2_s", 256, 82, NULL, NULL},
    [LI_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, NULL, NULL},
    [LI_TYPE_I8] = {"i8", 1, 1, NULL, NULL},
    [LI_TYPE_I16] = {"i16", 1, 2, NULL, NULL},
    [LI_TYPE_I32] = {"i32", 1, 4, NULL, NULL},
    [LI_TYPE_I64] = {"i64", 1, 8, NULL, NULL},
    [LI_TYPE_F64] = {"f64", 1, 8, NULL, NULL},
    [LI_TYPE_IQ1_M] = {"iq1_m", 256, 56, NULL, NULL},
    [LI_TYPE_BF16] = {"bf16", 1, 2, bf16_to_float, bf16_from_float},
};

const li_type_traits *li_type_get(uint32_t type) {
    if (type >= LI_TYPE_COUNT || !type_traits[type].name) return NULL;
    return &type_traits[type];
}

const char *li_type_name(uint32_t type) {
    const li_type_traits *t = li_type_get(type);
    return t ? t->name : "unknown";
}

bool li_type_row_size(uint32_t type, int64_t n, size_t *out) {
    const li_type_traits *t = li_type_get(type);
    if (!t || n < 0 || n % t->blck_size != 0) return false;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)(n / t->blck_size), t->type_size, &bytes)) return false;
    *out = bytes;
    return true;
}
