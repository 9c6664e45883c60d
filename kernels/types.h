/* types.h — the tensor element types, the weight schemes and their traits.
 *
 * Ids follow the GGUF/ggml numbering so file formats never shift; retired ids
 * keep their slot. One table (kernels/types.c, li_type_info) says, per type:
 * block size, bytes per block, element kind, whether it may appear in a GGUF
 * file, the activation type our kernels pair it with, and the scalar
 * dequantize / quantize references. A type whose traits have no to_float is
 * known by name but not supported. Ids 64.. are ours (no GGUF id): 8-bit and
 * 4-bit codes that mean something only with scales kept beside them (the KV
 * cache's per-(token, head) scales, a weight scheme's per-channel or
 * per-group scales). Nothing here depends on kernels/cpu/. */
#ifndef LI_TYPES_H
#define LI_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <math.h>

typedef enum li_type {
    LI_TYPE_F32 = 0,
    LI_TYPE_F16 = 1,
    LI_TYPE_Q4_0 = 2,
    LI_TYPE_Q4_1 = 3,
    /* 4, 5: retired (Q4_2, Q4_3) */
    LI_TYPE_Q5_0 = 6,
    LI_TYPE_Q5_1 = 7,
    LI_TYPE_Q8_0 = 8,
    LI_TYPE_Q8_1 = 9,
    LI_TYPE_Q2_K = 10,
    LI_TYPE_Q3_K = 11,
    LI_TYPE_Q4_K = 12,
    LI_TYPE_Q5_K = 13,
    LI_TYPE_Q6_K = 14,
    LI_TYPE_Q8_K = 15,
    LI_TYPE_IQ2_XXS = 16,
    LI_TYPE_IQ2_XS = 17,
    LI_TYPE_IQ3_XXS = 18,
    LI_TYPE_IQ1_S = 19,
    LI_TYPE_IQ4_NL = 20,
    LI_TYPE_IQ3_S = 21,
    LI_TYPE_IQ2_S = 22,
    LI_TYPE_IQ4_XS = 23,
    LI_TYPE_I8 = 24,
    LI_TYPE_I16 = 25,
    LI_TYPE_I32 = 26,
    LI_TYPE_I64 = 27,
    LI_TYPE_F64 = 28,
    LI_TYPE_IQ1_M = 29,
    LI_TYPE_BF16 = 30,
    LI_TYPE_COUNT = 31, /* the GGUF ids are 0 .. LI_TYPE_COUNT-1 */

    /* Scaled code types, not GGUF types: li_type_get() (the GGUF view)
     * returns NULL for them and GGUF loading refuses them; li_type_info()
     * has their rows. Each code means code_value * scale, the scale kept
     * beside the codes: one f32 per (token, kv head) in the KV cache
     * (li_kv_layer.k_scale / v_scale; docs/kv-cache.md), or a weight
     * scheme's per-channel / per-group scales (li_weight.scales). */
    LI_KV_TYPE_FP8_E4M3 = 64, /* KV: x = e4m3(code) * scale, scale = amax / 448 */
    LI_KV_TYPE_INT8 = 65,     /* KV: x = (int8)code * scale, scale = amax / 127 */
    LI_TYPE_U4 = 66,          /* unsigned 4-bit codes 0..15, two per byte: element 2j in
                               * the low nibble of byte j, 2j+1 in the high (weight schemes) */
    LI_TYPE_TABLE_SIZE = 67   /* ids of the traits table: 0 .. LI_TYPE_TABLE_SIZE-1 */
} li_type;

typedef void (*li_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*li_from_float_fn)(const float *src, void *dst, int64_t n);

/* What one element (or block) is. */
typedef enum li_type_kind {
    LI_KIND_NONE = 0,  /* an empty id (retired, unassigned) */
    LI_KIND_FLOAT,     /* an IEEE-style float per element (f32, f16, bf16, f64) */
    LI_KIND_INT,       /* an integer per element (i8..i64; the int8 and u4 codes) */
    LI_KIND_FP8,       /* an 8-bit float code per element (fp8 e4m3) */
    LI_KIND_BLOCK,     /* block-quantized: each block carries its own scales */
} li_type_kind;

typedef struct li_type_traits {
    const char *name;
    int64_t blck_size;   /* elements per block (1 for plain types, 2 for u4) */
    size_t type_size;    /* bytes per block */
    li_type_kind kind;
    bool gguf;           /* may appear in a GGUF file */
    bool scaled;         /* codes whose value needs an external scale (ids 64..) */
    /* the activation type our kernels multiply a weight of this type with:
     * Q8_0 / Q8_1 for the integer dot products, F32 for everything that is
     * dequantized to f32 (floats, Q8_1 weights, scaled codes, and types
     * without a to_float, which never reach a kernel) */
    li_type vec_dot_type;
    /* scalar dequantize reference, n elements (a multiple of blck_size);
     * scaled codes give code values, the scale not applied. NULL = unsupported */
    li_to_float_fn to_float;
    li_from_float_fn from_float; /* scalar reference quantizer; may be NULL */
} li_type_traits;

/* Any row of the table: GGUF types and the scaled code types (ids 64..);
 * NULL for retired / unassigned ids and ids past the table. */
const li_type_traits *li_type_info(uint32_t type);
/* The GGUF view of the table: NULL for ids that cannot appear in a GGUF
 * file (the scaled code types), as for ids outside the table. */
const li_type_traits *li_type_get(uint32_t type);
const char *li_type_name(uint32_t type); /* any row's name, "unknown" for none */
/* Bytes for n elements (any row); false if n is not a multiple of the block
 * size or the size overflows. */
bool li_type_row_size(uint32_t type, int64_t n, size_t *out);
/* For a kernel switch's default: the type reached a kernel that its
 * backend's init / weight_prepare should have refused (a bug). Prints
 * where and the type's name to stderr, then aborts. */
_Noreturn void li_type_unreachable(const char *where, uint32_t type);

/* ---- weight schemes ----
 * How a weight's codes (li_weight.type) become values beyond what the type's
 * blocks say: per-output-channel or per-group f32 scales, optional zero
 * points, an optional column permutation, and how the activations are
 * quantized before the product. GGUF weights are LI_SCHEME_PLAIN: the
 * blocks say everything. For element j of stored row r (g = its group):
 *
 *   w[r][perm ? perm[j] : j] = (code_value(r, j) - zero[r][g]) * scale[r][g]
 *
 * zero[r][g] = zeros ? zeros[r][g] : the scheme's implicit zero. Fields:
 * struct li_weight (backend.h); reference: li_weight_dequant_row_ref. */
typedef enum li_scheme {
    LI_SCHEME_PLAIN = 0, /* the type's own blocks (every GGUF weight); no scales */
    LI_SCHEME_W8A8,      /* int8 codes, per-channel / per-group scales; int8 activations */
    LI_SCHEME_FP8,       /* fp8 e4m3 codes, per-channel / per-group scales; fp8 activations */
    LI_SCHEME_AWQ,       /* u4 codes, per-group scales and zero points; f32 activations */
    LI_SCHEME_GPTQ,      /* AWQ's math plus an optional act-order column permutation */
    LI_SCHEME_INT4,      /* u4 codes, symmetric (implicit zero 8), per-channel / per-group scales */
    LI_SCHEME_COUNT
} li_scheme;

/* How activations are quantized (per row of x, dynamically) before the
 * product with a scheme weight; the reference simulates it exactly. */
typedef enum li_act_quant {
    LI_ACT_F32 = 0,  /* none: f32 activations */
    LI_ACT_INT8,     /* symmetric int8 per row: s = amax / 127, x' = round_even(x / s) * s */
    LI_ACT_FP8,      /* e4m3 per row: s = amax / 448, x' = e4m3(x / s) * s */
    LI_ACT_INT4,     /* symmetric int4 per row: s = amax / 7, x' = round_even(x / s) * s (W4A4) */
    LI_ACT_COUNT
} li_act_quant;

typedef struct li_scheme_traits {
    const char *name;
    li_type codes;       /* the one li_weight.type it stores (PLAIN: any GGUF type) */
    li_act_quant act;    /* the activation quantization it implies */
    float zero;          /* implicit zero point when li_weight.zeros is NULL */
    bool zeros;          /* li_weight.zeros allowed */
    bool perm;           /* li_weight.perm allowed */
    uint32_t acts;       /* other activation quantizations allowed, bit (1 << li_act_quant) */
} li_scheme_traits;

const li_scheme_traits *li_scheme_info(uint32_t scheme); /* NULL past the table */
const char *li_scheme_name(uint32_t scheme);            /* "unknown" past the table */
const char *li_act_quant_name(uint32_t act);            /* "f32", "int8", "fp8"; "unknown" */

/* ---- block layouts (little-endian, packed as in GGUF) ---- */
#define LI_QK4_0 32
typedef struct { uint16_t d; uint8_t qs[LI_QK4_0 / 2]; } li_block_q4_0;      /* x = (q-8)*d */
#define LI_QK4_1 32
typedef struct { uint16_t d, m; uint8_t qs[LI_QK4_1 / 2]; } li_block_q4_1;   /* x = q*d + m */
#define LI_QK8_0 32
typedef struct { uint16_t d; int8_t qs[LI_QK8_0]; } li_block_q8_0;          /* x = q*d */
#define LI_QK8_1 32
typedef struct { uint16_t d, s; int8_t qs[LI_QK8_1]; } li_block_q8_1;       /* s = d*sum(q) */

_Static_assert(sizeof(li_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(li_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(li_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(li_block_q8_1) == 36, "q8_1 block");

/* ---- scalar conversions ---- */
float li_fp16_to_fp32(uint16_t h);
uint16_t li_fp32_to_fp16(float f);  /* round to nearest even */
float li_bf16_to_fp32(uint16_t h);
uint16_t li_fp32_to_bf16(float f);  /* round to nearest even */
/* FP8 E4M3 ("FN": bias 7, no infinities, S.1111.111 is NaN, max finite 448,
 * smallest subnormal 2^-9). Encoding rounds to nearest even and saturates:
 * anything beyond ±448, infinities included, becomes ±448; NaN becomes
 * 0x7f with the input's sign. Scalar references in kernels/types.c. */
float li_fp8_e4m3_to_fp32(uint8_t c);
uint8_t li_fp32_to_fp8_e4m3(float f);
/* The integer codes' rounding (INT8 and U4 from_float, the 8-bit KV store's
 * scalar tails, LI_ACT_INT8): y rounded to nearest even, clamped to
 * [lo, hi]; NaN -> 0. Inline because the KV stores use it per element. */
static inline float li_code_round(float y, float lo, float hi) {
    if (y != y) return 0.0f;
    return nearbyintf(y < lo ? lo : y > hi ? hi : y);
}

/* ---- scalar references (kernels/types.c) ---- */
void li_quantize_row_q8_0_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q8_1_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q4_0_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q4_1_ref(const float *x, void *y, int64_t n);
/* Dot products of one weight row with one quantized activation row, n
 * elements: the pairing ggml uses (Q4_0·Q8_0, Q4_1·Q8_1, Q8_0·Q8_0). */
float li_vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *a);
float li_vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *a);
float li_vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *a);
/* The activation type a weight type is multiplied with: the table's
 * vec_dot_type (F32 for float weights and anything dequantized to f32). */
li_type li_type_vec_dot_type(li_type weight_type);
/* x(n) -> x(n) as the activation quantization `act` leaves it (LI_ACT_F32:
 * a copy); what a scheme kernel's quantized activations mean. */
void li_act_quant_row_ref(li_act_quant act, const float *x, float *out, int64_t n);

#endif
