/* cpu_kernels.h — what the CPU backend (cpu.c) needs from one ISA level.
 *
 * Internal to kernels/cpu: each ISA file (ops_scalar.c, ops_avx2.c,
 * ops_avx512.c) fills one li_cpu_kernels table; cpu.c picks one by CPUID and
 * splits the work over threads. Every entry is checked against the scalar
 * reference (ops_ref.c, quant_ref.c) by tests/unit/test_kernels.c. */
#ifndef LI_CPU_KERNELS_H
#define LI_CPU_KERNELS_H

#include "backend.h"

/* ---- packed quantized activations ----
 * matmul quantizes each activation row once (to the weight's vec_dot type,
 * Q8_0 or Q8_1, bit-identical to the ggml blocks) and stores it unpacked so
 * SIMD loads need no gathers:
 *
 *   int8_t qs[k]               the quants, contiguous   (offset 0)
 *   float  d8[k/32][8]         block scale (fp16-rounded), 8 copies: one
 *                              load gives a per-lane scale vector (offset li_qact_qs_bytes(k))
 *   float  s8[k/32][8]         Q8_1 only: block s = d*sum(q) (fp16-rounded)
 *                              in lane 0, zeros in 1..7, so a lane sum adds it once
 *
 * Row stride li_qact_row_bytes(type, k) is a multiple of 64. */
static inline size_t li_qact_qs_bytes(int64_t k) { return ((size_t)k + 63) & ~(size_t)63; }
static inline size_t li_qact_row_bytes(li_type act_type, int64_t k) {
    size_t nb = (size_t)k / 32;
    return li_qact_qs_bytes(k) + nb * 32 * (act_type == LI_TYPE_Q8_1 ? 2 : 1);
}
static inline float *li_qact_d8(void *row, int64_t k) { return (float *)((char *)row + li_qact_qs_bytes(k)); }
static inline float *li_qact_s8(void *row, int64_t k) { return li_qact_d8(row, k) + (k / 32) * 8; }

typedef struct li_cpu_kernels {
    const char *isa;
    /* x(k) -> one packed activation row; act_type Q8_0 or Q8_1, k % 32 == 0 */
    void (*quantize_act)(li_type act_type, const float *x, void *dst, int64_t k);
    /* y[r*ldy + i] = W_i · a_r for i < m, r < n. W rows are w_stride bytes
     * apart, of type Q4_0, Q4_1 or Q8_0; act rows act_stride bytes apart */
    void (*gemm_q)(li_type w_type, int64_t k, const void *w, size_t w_stride, int64_t m, const void *act,
                   size_t act_stride, int64_t n, float *y, int64_t ldy);
    /* the same for W of type F32, F16 or BF16 and f32 activations x(n, ldx) */
    void (*gemm_f)(li_type w_type, int64_t k, const void *w, size_t w_stride, int64_t m, const float *x,
                   int64_t ldx, int64_t n, float *y, int64_t ldy);
    /* attention output of token i, head h; scores: scratch of pos[i]+1 floats */
    void (*attn_head)(const li_attn_args *a, int64_t i, int h, float *scores);
    /* g(n) = silu(g) * u */
    void (*silu_mul)(float *g, const float *u, int64_t n);
} li_cpu_kernels;

extern const li_cpu_kernels li_cpu_kernels_scalar;
extern const li_cpu_kernels li_cpu_kernels_avx2;   /* needs AVX2, FMA, F16C */
extern const li_cpu_kernels li_cpu_kernels_avx512; /* needs AVX-512 F/BW/VL/DQ/VNNI, FMA, F16C */

/* ---- pieces of the scalar reference shared with the scalar kernels (ops_ref.c) ---- */
void li_ref_attn_head(const li_attn_args *a, int64_t i, int h, float *scores);
void li_ref_silu_mul(float *g, const float *u, int64_t n);
/* Element idx of an array stored as F32, F16 or BF16 (a K/V row, a weight row). */
static inline float li_float_load(li_type dtype, const void *base, int64_t idx) {
    switch (dtype) {
    case LI_TYPE_F16: return li_fp16_to_fp32(((const uint16_t *)base)[idx]);
    case LI_TYPE_BF16: return li_bf16_to_fp32(((const uint16_t *)base)[idx]);
    default: return ((const float *)base)[idx];
    }
}
static inline size_t li_kv_elem_size(li_type dtype) { return dtype == LI_TYPE_F32 ? 4 : 2; }
/* Start of the K or V row for (kv head kvh) at position p of token i's sequence. */
static inline const void *li_kv_row(const li_attn_args *a, const void *base, int64_t i, int64_t p, int kvh) {
    const int32_t blk = a->block_tables[a->seq[i]][p / a->block_size];
    const int64_t slot = (int64_t)blk * a->block_size + p % a->block_size;
    return (const char *)base + ((slot * a->n_head_kv + kvh) * a->head_dim) * li_kv_elem_size(a->kv->dtype);
}

#endif
