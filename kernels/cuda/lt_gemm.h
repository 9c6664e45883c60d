// lt_gemm.h — tensor-core GEMMs through cuBLASLt for the CUDA backend
// (backend_cuda.cu; docs/cuda.md). Internal to kernels/cuda/.
//
// One call: D(n, m) = B(n, k) . A(m, k)^T, both operands row-major as the
// backend stores them (weights (m, k), activations (n, k)), D row-major
// (n, m): cuBLASLt's column-major "TN" product. The kinds:
//   LI_LT_INT8   int8 x int8, exact int32 sums (W8A8: the CPU's integers)
//   LI_LT_FP8    e4m3 x e4m3, f32 out (FP8 on sm_90)
//   LI_LT_BF16   bf16 x bf16, f32 out
//   LI_LT_F16    f16 x f16, f32 out
// cuBLASLt is dlopen'ed (as cuBLAS is: linked, its libraries would load into
// every luainfer process). A plan (descriptors and the heuristic's algorithm)
// is kept per shape, so a recorded pass finds it made. Any failure returns
// nonzero with the reason; the caller then runs its other path.
#ifndef LI_LT_GEMM_H
#define LI_LT_GEMM_H

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

enum li_lt_kind { LI_LT_INT8, LI_LT_FP8, LI_LT_BF16, LI_LT_F16, LI_LT_N };

struct li_lt;

// NULL with the reason in why when cuBLASLt cannot be opened
li_lt *li_lt_create(char *why, size_t why_len);
void li_lt_destroy(li_lt *lt);
// 0, or nonzero with the reason (no algorithm for this shape and kind, a
// cuBLASLt error): nothing was issued then
int li_lt_matmul(li_lt *lt, cudaStream_t st, li_lt_kind kind, int64_t m, int64_t n, int64_t k, const void *a,
                 const void *b, void *d, void *ws, size_t ws_bytes, char *why, size_t why_len);
// the shapes a kind can take: rows of A and B (k elements) in multiples of
// 16 bytes, and m a multiple of 16 (int8's "TN" kernels want m % 4, FP8's
// the output's leading dimension in 16-byte multiples: one rule for all)
bool li_lt_shape_ok(li_lt_kind kind, int64_t m, int64_t k);

#endif
