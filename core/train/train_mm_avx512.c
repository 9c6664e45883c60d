/* train_mm_avx512.c — the AVX-512 micro-kernel of train_mm.c's packed GEMM
 * (compiled with -mavx512f by the _avx512.c rule; run only when CPUID has
 * it): an MR x NR tile of C (8 x 32: 16 zmm accumulators), one k step =
 * NR/16 B loads (one cache line each: the panels are 64-byte aligned), MR
 * broadcasts of A, MR·NR/16 FMAs. 8 x 48 measured no faster (its 48 KB B
 * panel leaves L1). Same FMA chain per element as the AVX2
 * kernel, so the same bits. */
#include "train/train_internal.h"

#include <immintrin.h>

void li_train_mm_kern_avx512(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load) {
    enum { MR = LI_TRAIN_MR512, NV = LI_TRAIN_NR512 / 16 };
    __m512 c[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = load ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t l = 0; l < kc; l++) {
        __m512 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_load_ps(Bp + l * LI_TRAIN_NR512 + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(Ap[l * MR + r]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
}
