/* w8_kernels.h — the W8A8 (int8) and FP8 (e4m3) scheme kernels.
 *
 * Internal to kernels/cpu. A scheme weight here has one f32 scale per
 * output row (group_size 0) and codes stored as the scheme says (int8, or
 * e4m3 bytes); activations are quantized per row, dynamically, as
 * li_act_quant_row_ref defines (int8: s = amax/127, q = round_even(x/s);
 * fp8: s = amax/448, q = e4m3(x/s)). Each output is then
 *
 *   y[r][c] = (float)dot(qa[r], qw[c]) * (sa[r] * sw[c])
 *
 * with the dot computed EXACTLY: int8 in int32 (|sum| <= 127*127*k), e4m3
 * as f32 products (4-bit significands: every product is exact in f32) summed
 * in f64 (each product is an integer multiple of 2^-18 below 2^18, so sums
 * of up to 2^17 of them are exact in f64's 53 bits). Exact sums do not
 * depend on their order, so every ISA, tile shape and thread split gives the
 * same bits: batch invariance (cpu_kernels.h) for free. These differ from
 * the float reference (li_weight_dequant_row_ref, which sums rounded f32
 * products in order) only by that reference's rounding. */
#ifndef LI_W8_KERNELS_H
#define LI_W8_KERNELS_H

#include "backend.h"
#include "cpu/threadpool.h"

/* The e4m3 code c as f32 (as li_fp8_e4m3_to_fp32, except that 0x7f/0xff,
 * NaN, never written by the quantizers, read as ±480): the code's low 7
 * bits shifted into an f32's exponent and significand, times 2^120. */
static inline float li_w8_fp8_widen(uint8_t c);

/* One ISA's kernels. quantize: x (n, k) -> codes (n, k) and scales (n)
 * (fp8: codes are e4m3 bytes, widened to f32 for the gemm in xf (n, k)).
 * gemm: y[r * ldy + c] for weight rows [c0, c1) and activation rows
 * [r0, r1), as above. */
typedef struct li_w8_kernels {
    const char *isa;
    void (*quantize_int8)(const float *x, int64_t k, int8_t *q, float *s);
    void (*quantize_fp8)(const float *x, int64_t k, float *xf, float *s);
    void (*gemm_int8)(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                      const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
    void (*gemm_fp8)(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const float *a,
                     const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
} li_w8_kernels;

extern const li_w8_kernels li_w8_kernels_scalar;
extern const li_w8_kernels li_w8_kernels_avx2;
extern const li_w8_kernels li_w8_kernels_avx512;

/* the AVX2 kernels the AVX-512 table shares (w8_avx2.c) */
void li_w8_quantize_int8_avx2(const float *x, int64_t k, int8_t *q, float *s);
void li_w8_gemm_fp8_avx2(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const float *a,
                         const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);

/* The kernels for an ISA name ("scalar", "avx2", "avx512"). */
const li_w8_kernels *li_w8_kernels_for(const char *isa);
/* true when w is a W8A8 / FP8 weight these kernels run (per channel) */
bool li_w8_supported(const li_weight *w);
/* true when w[0..n_w) run as one job: all supported, one scheme, one k, n_w <= 4 */
bool li_w8_same_job(const li_weight *const *w, int n_w);
/* y[i](n, m_i) = x(n, k) . W[i]^T for weights reading one input: the
 * activations quantized once (res: only with n_w == 1) */
void li_w8_matmul_multi(const li_w8_kernels *kern, li_threadpool *tp, int n_threads, const li_weight *const *w,
                        int n_w, const float *x, float *const *y, float *res, int64_t n);
/* y(n, m) = x(n, k) . W^T (then res += y when res), on up to n_threads of tp */
void li_w8_matmul(const li_w8_kernels *kern, li_threadpool *tp, int n_threads, const li_weight *w, const float *x,
                  float *y, float *res, int64_t n);

static inline float li_w8_fp8_widen(uint8_t c) {
    const uint32_t bits = (uint32_t)(c & 0x7f) << 20;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    f *= 0x1p120f;
    return c & 0x80 ? -f : f;
}

#endif
