/* train_mm_avx512.c — the AVX-512 micro-kernel of train_mm.c's packed GEMM
 * (compiled with -mavx512f by the _avx512.c rule; run only when CPUID has
 * it): an MR x 32 tile of C in 2·MR zmm registers, one k step = two B
 * loads (one cache line each: the panels are 64-byte aligned), MR
 * broadcasts of A, 2·MR FMAs. Same FMA chain per element as the AVX2
 * kernel, so the same bits. */
#include "train/train_internal.h"

#include <immintrin.h>

void li_train_mm_kern_avx512(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load) {
    enum { MR = LI_TRAIN_MR512 };
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        c0[r] = load ? _mm512_loadu_ps(C + r * ldc) : _mm512_setzero_ps();
        c1[r] = load ? _mm512_loadu_ps(C + r * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t l = 0; l < kc; l++) {
        const __m512 b0 = _mm512_load_ps(Bp + l * 32), b1 = _mm512_load_ps(Bp + l * 32 + 16);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(Ap[l * MR + r]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(C + r * ldc, c0[r]);
        _mm512_storeu_ps(C + r * ldc + 16, c1[r]);
    }
}
