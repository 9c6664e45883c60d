/* types.h — the tensor element types and their traits.
 *
 * Ids follow the GGUF/ggml numbering so file formats never shift; retired ids
 * keep their slot. One table (li_type_traits) says, per type, the block size,
 * bytes per block and the scalar dequantization reference. A type whose
 * traits have no to_float is known by name but not supported. */
#ifndef LI_TYPES_H
#define LI_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

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
    LI_TYPE_COUNT = 31,

    /* KV-cache-only storage types. GGUF has no FP8 id, so these live outside
     * the GGUF table: li_type_get() returns NULL for them and they never
     * appear in a file, only in li_kv_layer.dtype and the engine's kv_dtype.
     * Both keep one f32 scale per (token, kv head) next to the 8-bit codes
     * (li_kv_layer.k_scale / v_scale; see docs/kv-cache.md). */
    LI_KV_TYPE_FP8_E4M3 = 64, /* x = e4m3(code) * scale, scale = amax / 448 */
    LI_KV_TYPE_INT8 = 65      /* x = (int8)code * scale, scale = amax / 127 */
} li_type;

typedef void (*li_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*li_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct li_type_traits {
    const char *name;
    int64_t blck_size;   /* elements per block (1 for plain types) */
    size_t type_size;    /* bytes per block */
    li_to_float_fn to_float;     /* scalar reference; NULL = unsupported */
    li_from_float_fn from_float; /* scalar reference quantizer; may be NULL */
} li_type_traits;

const li_type_traits *li_type_get(uint32_t type); /* NULL for ids outside the table */
const char *li_type_name(uint32_t type);
/* Bytes for n elements; false if n is not a multiple of the block size or the
 * size overflows. */
bool li_type_row_size(uint32_t type, int64_t n, size_t *out);

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
 * 0x7f with the input's sign. Scalar references in kernels/cpu/kv_ref.c. */
float li_fp8_e4m3_to_fp32(uint8_t c);
uint8_t li_fp32_to_fp8_e4m3(float f);

/* ---- scalar references (kernels/cpu/quant_ref.c) ---- */
void li_quantize_row_q8_0_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q8_1_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q4_0_ref(const float *x, void *y, int64_t n);
void li_quantize_row_q4_1_ref(const float *x, void *y, int64_t n);
/* Dot products of one weight row with one quantized activation row, n
 * elements: the pairing ggml uses (Q4_0·Q8_0, Q4_1·Q8_1, Q8_0·Q8_0). */
float li_vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *a);
float li_vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *a);
float li_vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *a);
/* The activation type a weight type is multiplied with (F32 for float weights). */
li_type li_type_vec_dot_type(li_type weight_type);

#endif
