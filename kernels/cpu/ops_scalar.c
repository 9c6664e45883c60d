/* ops_scalar.c — the CPU kernels in plain C (isa "scalar").
 *
 * The same arithmetic as the reference, in the same order, on the packed
 * activation layout of cpu_kernels.h: results are bit-identical to
 * ops_ref.c, only split over threads by cpu.c. Also the fallback on CPUs
 * without AVX2. */
#include "util/common.h"
#include "cpu/cpu_kernels.h"

#include <string.h>

#define FP16(h) li_fp16_to_fp32(h)

static void scalar_quantize_act(li_type at, const float *x, void *dst, int64_t k) {
    int8_t *qs = dst;
    float *d = li_qact_d(dst, k), *s = li_qact_s(dst, k);
    int32_t *sum = li_qact_sum(dst, k);
    for (int64_t b = 0; b < k / 32; b++) {
        /* one ggml block at a time, then unpacked */
        li_block_q8_1 blk; /* the Q8_0 block is its prefix {d, qs} with s unused */
        if (at == LI_TYPE_Q8_1) { /* else Q8_0: cpu.c's matmul_path gives no other */
            li_quantize_row_q8_1_ref(x + b * 32, &blk, 32);
            s[b] = FP16(blk.s);
        } else {
            li_block_q8_0 b0;
            li_quantize_row_q8_0_ref(x + b * 32, &b0, 32);
            blk.d = b0.d;
            memcpy(blk.qs, b0.qs, 32);
            s[b] = 0.0f;
        }
        memcpy(qs + b * 32, blk.qs, 32);
        d[b] = FP16(blk.d);
        int32_t t = 0;
        for (int j = 0; j < 32; j++) t += blk.qs[j];
        sum[b] = t;
    }
}

/* W_i · a, as li_vec_dot_*_ref but reading the packed activation row */
static float dot_q(li_type wt, int64_t k, const void *w, const void *act) {
    const int8_t *a = act;
    const float *d8 = li_qact_d((void *)act, k), *s8 = li_qact_s((void *)act, k);
    float sum = 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        const int8_t *ab = a + b * 32;
        const float da = d8[b];
        int sumi = 0;
        switch (wt) {
        case LI_TYPE_Q4_0: {
            const li_block_q4_0 *x = (const li_block_q4_0 *)w + b;
            for (int j = 0; j < 16; j++)
                sumi += ((x->qs[j] & 0x0f) - 8) * ab[j] + ((x->qs[j] >> 4) - 8) * ab[j + 16];
            sum += (float)sumi * (FP16(x->d) * da);
            break;
        }
        case LI_TYPE_Q4_1: {
            const li_block_q4_1 *x = (const li_block_q4_1 *)w + b;
            for (int j = 0; j < 16; j++) sumi += (x->qs[j] & 0x0f) * ab[j] + (x->qs[j] >> 4) * ab[j + 16];
            sum += (FP16(x->d) * da) * (float)sumi + FP16(x->m) * s8[b];
            break;
        }
        case LI_TYPE_Q8_0: {
            const li_block_q8_0 *x = (const li_block_q8_0 *)w + b;
            for (int j = 0; j < 32; j++) sumi += x->qs[j] * ab[j];
            sum += (float)sumi * (FP16(x->d) * da);
            break;
        }
        default: __builtin_unreachable(); /* scalar_gemm_q let only the three in */
        }
    }
    return sum;
}

static void scalar_gemm_q(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const void *act,
                          size_t act_stride, int64_t n, float *y, int64_t ldy) {
    switch (wt) { /* once per call: dot_q's per-block switch then needs no default */
    case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1:
    case LI_TYPE_Q8_0: break;
    default: li_type_unreachable("cpu scalar: gemm_q", wt);
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < m; i++)
            y[r * ldy + i] = dot_q(wt, k, (const char *)w + i * w_stride, (const char *)act + r * act_stride);
}

static void scalar_gemm_f(li_type wt, int64_t k, const void *w, size_t w_stride, int64_t m, const float *x,
                          int64_t ldx, int64_t n, float *y, int64_t ldy) {
    switch (wt) { /* li_float_load reads these three (and refuses the rest) */
    case LI_TYPE_F32:
    case LI_TYPE_F16:
    case LI_TYPE_BF16: break;
    default: li_type_unreachable("cpu scalar: gemm_f", wt);
    }
    for (int64_t i = 0; i < m; i++) {
        const void *wr = (const char *)w + i * w_stride;
        for (int64_t r = 0; r < n; r++) {
            const float *xr = x + r * ldx;
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += xr[j] * li_float_load(wt, wr, j);
            y[r * ldy + i] = sum;
        }
    }
}

const li_cpu_kernels li_cpu_kernels_scalar = {
    .isa = "scalar",
    .family = "scalar",
    .quantize_act = scalar_quantize_act,
    .gemm_q = scalar_gemm_q,
    .gemm_f = scalar_gemm_f,
    .gemm_q_packed = NULL, /* the scalar ISA reads the original rows */
    .gemm_f_packed = NULL,
    .attn_head = li_ref_attn_head,
    .silu_mul = li_ref_silu_mul,
};
