/* ggml_kernels.h — llama.cpp's x86 CPU arithmetic, op by op (isa "ggml").
 *
 * luainfer's own kernels (cpu_kernels.h) fix one order of float operations
 * for every path, which makes them batch-invariant but not bit-identical to
 * llama.cpp. These compute exactly what llama.cpp's CPU backend computes when
 * built for an x86 machine with AVX-512 (GGML_NATIVE): the same rounding of
 * activations to Q8 (127/amax, round half to even), the same 8-lane FMA
 * accumulation of quantized dot products, F16 attention inputs, the same
 * polynomial exp in softmax and SiLU, and the same summation trees. Like
 * llama.cpp, attention sums in a different order when the batch has more
 * than one token (its "sgemm" path) than for a single decode token, so
 * results depend on the batch size: this is a reproducibility mode
 * (`--isa ggml`), not the engine's default.
 *
 * Scope: Q4_1 and Q8_0 weights, an F16 KV cache, flash attention off (the
 * llama-cpp-python default), one sequence at a time. With several sequences
 * in one batch llama.cpp's softmax lanes follow its KV cell layout, which
 * luainfer's paged cache does not mirror, so there the results agree to
 * rounding noise only.
 *
 * ggml_ref.c is the scalar reference (plain C, fmaf where llama.cpp fuses);
 * ggml_avx2.c holds the fast quantized dots and an FMA build of the float
 * code (ggml_impl.h), tested bit-identical to it; ggml_backend.c is the
 * backend that uses them. */
#ifndef LI_GGML_KERNELS_H
#define LI_GGML_KERNELS_H

#include "backend.h"

/* activation rows as llama.cpp's x86 quantize_row_q8_0 / q8_1 write them */
void li_ggml_quantize_q8_0(const float *x, void *y, int64_t k);
void li_ggml_quantize_q8_1(const float *x, void *y, int64_t k);
/* the same, 8 lanes at a time (AVX2): bit-identical */
void li_ggml_quantize_q8_0_avx2(const float *x, void *y, int64_t k);
void li_ggml_quantize_q8_1_avx2(const float *x, void *y, int64_t k);

/* llama.cpp's AVX2 vec_dot: per 32-block, 8 lanes of 4 integer products,
 * each lane accumulated with an FMA by the block scale product; the lanes
 * summed at the end as hsum_float_8 does (Q4_1: plus the sum of m*s) */
float li_ggml_dot_q4_1_q8_1_ref(int64_t k, const void *w, const void *a);
float li_ggml_dot_q8_0_q8_0_ref(int64_t k, const void *w, const void *a);
/* A Q8_1 activation block with its F16 scales widened to float (exactly):
 * the fast dot reads the same values without two conversions per use. */
typedef struct {
    float d, s;
    int8_t qs[32];
} li_ggml_q8_1f;
void li_ggml_widen_q8_1(const void *q8_1, li_ggml_q8_1f *out, int64_t k);
/* one weight row against nr <= 4 activation rows a_stride bytes apart:
 * out[r] is bit-identical to the single dot of row r (Q4_1: rows of
 * li_ggml_q8_1f, Q8_0: rows of li_block_q8_0) */
void li_ggml_dot4_q4_1_q8_1_avx2(int64_t k, const void *w, const void *a, size_t a_stride, int nr, float *out);
void li_ggml_dot4_q8_0_q8_0_avx2(int64_t k, const void *w, const void *a, size_t a_stride, int nr, float *out);

/* sum of 16 lanes in the tree _mm512_reduce_add_ps (GCC) uses, and of 8 in
 * hsum_float_8's */
float li_ggml_hsum16(const float v[16]);
float li_ggml_hsum8(const float v[8]);

/* exp of the AVX-512 ggml_v_expf (a degree-5 polynomial after range
 * reduction), one lane */
float li_ggml_expf(float x);

/* y(dim) = (x * (1/sqrt(mean(x^2) + eps))) * w, squares summed in double */
void li_ggml_rmsnorm_row(const float *x, const float *w, float *y, int64_t dim, float eps);
/* cos/sin of one position, llama.cpp's rope cache: cs[2j] = cos, cs[2j+1] = sin */
void li_ggml_rope_cache(float *cs, int32_t pos, int n_rot, float theta_base);
/* rotate the first n_rot dims of one head (pairs as in li_backend_ops.rope) */
void li_ggml_rope_head(float *x, const float *cs, int n_rot, int neox);
/* g(n) = silu(g) * u with ggml_v_silu: x / (1 + exp(-x)) */
void li_ggml_silu_mul(float *g, const float *u, int64_t n);

/* F16 dot products of n elements, in the order of ggml_vec_dot_f16 (4 x 16
 * lanes, used for one token) and of llamafile's tinyBLAS (16 lanes, used for
 * a batch of 2+ tokens; n % 16 == 0) */
float li_ggml_dot_f16_vec(int64_t n, const float *x, const float *y);
float li_ggml_dot_f16_gemm(int64_t n, const float *x, const float *y);

/* Attention of token i, heads h0 .. h0+nh-1 (nh <= 64, all of one kv
 * head), as llama.cpp's non-flash path computes each with an F16 cache: q
 * and the softmax weights rounded to F16, KQ and KQV in the vec or gemm
 * order (gemm = the batch has 2+ tokens), softmax by 16-lane chunks summed
 * in double. A group shares each K row's load; every head's result is the
 * one it has alone. scratch: li_ggml_attn_scratch(pos[i], nh) floats;
 * head_dim <= 256. */
void li_ggml_attn_heads(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch);
/* the same two with FMA instructions (ggml_avx2.c; needs AVX2, FMA, F16C) */
void li_ggml_attn_heads_avx2(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch);
void li_ggml_silu_mul_avx2(float *g, const float *u, int64_t n);
size_t li_ggml_attn_scratch(int64_t max_pos, int nh);

/* The backend (ggml_backend.c), made by li_backend_cpu_init(be, n, "ggml",
 * err), which passes whether the CPU has AVX2, FMA and F16C. */
int li_backend_ggml_init(li_backend *be, int n_threads, bool avx2, struct li_error *err);
void li_backend_ggml_free(li_backend *be);
bool li_backend_is_ggml(const li_backend *be);

#endif
