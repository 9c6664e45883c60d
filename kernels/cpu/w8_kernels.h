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
 * int8: the dot is exact in int32 (|sum| <= 127*127*k < 2^31 for k <= 2^16).
 * e4m3: every product of two e4m3 values is exact in f32 (4-bit
 * significands, far from subnormal), so the dot is an f32 sum in ONE FIXED
 * ORDER, the scalar kernel's (gemm_fp8_scalar), which depends only on k:
 * blocks of 32 (the last one zero-padded), element pair (2i, 2i+1) of each
 * block into lane i of 16, each lane adding the odd product, then the even
 * one (the order of AVX-512 BF16's VDPBF16PS, whose lanes are exact FMAs);
 * then lanes i + 8, i + 4, i + 2, i + 1 folded pairwise. Every ISA, tile
 * shape and thread split gives the same bits: batch invariance
 * (cpu_kernels.h). It differs from the exact dot by f32 rounding only.
 *
 * fp8 activations are kept as bf16 bits (e4m3 values are exact in bf16),
 * LI_W8_FP8_LDA(k) per row, zero past k. */
#ifndef LI_W8_KERNELS_H
#define LI_W8_KERNELS_H

#include "backend.h"
#include "cpu/threadpool.h"

/* ---- packed int8 weights (W8A8, w8.c) ----
 * weight_prepare copies a W8A8 weight whose k is a multiple of 4 into
 * panels of LI_PANEL = 16 rows, for ISAs with a packed kernel: one 64-byte
 * vector holds codes 4j..4j+3 of each of the 16 rows (lane l = row
 * 16p + l), stored as code + 128 (unsigned), so vpdpbusd takes them as its
 * unsigned operand and a broadcast word of 4 activation codes as the signed
 * one, and each lane accumulates its own row: no horizontal sums. The dot is
 * then sum((w + 128) a) - 128 sum(a), the same exact integer (the int32 sum
 * wraps, the difference does not: |dot| < 2^31). Rows past m hold code 0. */
#define LI_W8_MAGIC 0x4c4957385041434bull /* "LIW8PACK" */

typedef struct li_w8_packed {
    uint64_t magic;
    int64_t k, m, n_panels; /* k % 4 == 0; n_panels = ceil(m / 16) */
    uint8_t *codes;         /* (n_panels, k / 4, 64), 64-byte aligned */
    void *chunk;            /* the arena chunk holding codes (li_cpu_arena_alloc) */
} li_w8_packed;

static inline const li_w8_packed *li_w8_packed_of(const li_weight *w) {
    const li_w8_packed *p = w->packed;
    return p && p->magic == LI_W8_MAGIC ? p : NULL;
}

/* bf16 activations per row of k for fp8: k rounded up to a block of 32 */
#define LI_W8_FP8_LDA(k) (((k) + 31) & ~(int64_t)31)

/* The e4m3 code c as f32 (as li_fp8_e4m3_to_fp32, except that 0x7f/0xff,
 * NaN, never written by the quantizers, read as ±480): the code's low 7
 * bits shifted into an f32's exponent and significand, times 2^120. */
static inline float li_w8_fp8_widen(uint8_t c);

/* One ISA's kernels. quantize: one row x (k) -> codes and its scale (int8:
 * k codes; fp8: LI_W8_FP8_LDA(k) bf16 bits of the e4m3 values, zero past k).
 * gemm: y[r * ldy + c] for weight rows [c0, c1) and activation rows
 * [r0, r1), as above. */
typedef struct li_w8_kernels {
    const char *isa;
    void (*quantize_int8)(const float *x, int64_t k, int8_t *q, float *s);
    void (*quantize_fp8)(const float *x, int64_t k, uint16_t *qa, float *s);
    void (*gemm_int8)(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                      const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
    void (*gemm_fp8)(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const uint16_t *a,
                     const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
    /* panels [p0, p1) of a packed int8 weight (ws: its m scales) against
     * activation rows [r0, r1) (codes k apart, asum: each row's code sum):
     * y[r * ldy + c] for the rows c < m of those panels. NULL: no packing. */
    void (*gemm_int8_packed)(const li_w8_packed *w, const float *ws, int64_t p0, int64_t p1, const int8_t *a,
                             const int32_t *asum, const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
} li_w8_kernels;

extern const li_w8_kernels li_w8_kernels_scalar;
extern const li_w8_kernels li_w8_kernels_avx2;
extern const li_w8_kernels li_w8_kernels_avx512;
extern const li_w8_kernels li_w8_kernels_amx; /* AVX-512's; the packed gemm on AMX tiles (w8_amx.c) */
/* the packed int8 gemms of the two tables (the AMX one hands calls of few
 * rows to the AVX-512 one) */
void li_w8_gemm_int8_packed_avx512(const li_w8_packed *w, const float *ws, int64_t p0, int64_t p1, const int8_t *a,
                                   const int32_t *asum, const float *as, int64_t r0, int64_t r1, float *y,
                                   int64_t ldy);
void li_w8_gemm_int8_packed_amx(const li_w8_packed *w, const float *ws, int64_t p0, int64_t p1, const int8_t *a,
                                const int32_t *asum, const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);

/* the AVX2 kernels the AVX-512 table shares (w8_avx2.c); the fp8 gemm is
 * the AVX-512 table's on CPUs without AVX512_BF16 */
void li_w8_quantize_int8_avx2(const float *x, int64_t k, int8_t *q, float *s);
void li_w8_quantize_fp8_avx2(const float *x, int64_t k, uint16_t *qa, float *s);
/* out[i] = the bf16 bits of li_fp32_to_fp8_e4m3(v[i])'s value (NaN: 480) */
void li_w8_fp8_encode_avx2(const float *v, int64_t n, uint16_t *out);
void li_w8_gemm_fp8_avx2(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const uint16_t *a,
                         const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy);
/* true when this CPU runs the AVX-512 table's BF16 fp8 gemm (VDPBF16PS) */
bool li_w8_have_bf16(void);

/* The kernels for an ISA name ("scalar", "avx2", "avx512", "amx"). */
const li_w8_kernels *li_w8_kernels_for(const char *isa);
/* Builds w's int8 panels when kern has a packed kernel and w (W8A8, k % 4
 * == 0) fits: 0, LI_EUNSUP (left unpacked) or LI_ENOMEM. li_w8_pack_free
 * undoes it (nothing when w holds no int8 panels). */
int li_w8_pack(const li_w8_kernels *kern, li_weight *w);
void li_w8_pack_free(li_weight *w);
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
/* y(n, m) = x(n, k) . W^T with the scalar kernels on this thread (the
 * reference backend: ops_ref.c) */
void li_w8_matmul_ref(const li_weight *w, const float *x, float *y, int64_t n);

static inline float li_w8_fp8_widen(uint8_t c) {
    const uint32_t bits = (uint32_t)(c & 0x7f) << 20;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    f *= 0x1p120f;
    return c & 0x80 ? -f : f;
}

#endif
