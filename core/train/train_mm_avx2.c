/* train_mm_avx2.c — AVX2/FMA kernels of train_mm.c (compiled with -mavx2
 * -mfma by the _avx2.c rule; run only when CPUID has them). Each keeps a
 * register tile of outputs: 4 x-rows by 2 W-rows of dot products for
 * y = x·W^T, 4 rows by 16 columns of C for C += A·B. Tails are the scalar
 * reference's loops. test_train_grad.c compares them with the reference. */
#include "train/train_internal.h"

#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[i0..i0+ni, j0..j0+nj] (ni <= 4, nj <= 2; constants after inlining) */
static inline __attribute__((always_inline)) void nt_tile(const float *x, const float *W, float *y, int64_t m,
                                                           int64_t k, int64_t i0, int64_t j0, int ni, int nj) {
    __m256 acc[4][2];
    for (int a = 0; a < ni; a++)
        for (int b = 0; b < nj; b++) acc[a][b] = _mm256_setzero_ps();
    int64_t l = 0;
    for (; l + 8 <= k; l += 8) {
        __m256 w[2];
        for (int b = 0; b < nj; b++) w[b] = _mm256_loadu_ps(W + (j0 + b) * k + l);
        for (int a = 0; a < ni; a++) {
            const __m256 xv = _mm256_loadu_ps(x + (i0 + a) * k + l);
            for (int b = 0; b < nj; b++) acc[a][b] = _mm256_fmadd_ps(xv, w[b], acc[a][b]);
        }
    }
    for (int a = 0; a < ni; a++)
        for (int b = 0; b < nj; b++) {
            float s = hsum(acc[a][b]);
            for (int64_t t = l; t < k; t++) s += x[(i0 + a) * k + t] * W[(j0 + b) * k + t];
            y[(i0 + a) * m + j0 + b] = s;
        }
}

void li_train_mm_nt_avx2(const float *x, const float *W, float *y, int64_t n, int64_t m, int64_t k, int64_t j0,
                         int64_t j1) {
    /* x rows outer: a job's few W rows stay in L1 while each group of 4
     * x rows is read once per job */
    const int64_t jv = j0 + (j1 - j0) / 2 * 2;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int64_t j = j0; j < jv; j += 2) nt_tile(x, W, y, m, k, i, j, 4, 2);
        if (jv < j1) nt_tile(x, W, y, m, k, i, jv, 4, 1);
    }
    for (; i < n; i++) {
        for (int64_t j = j0; j < jv; j += 2) nt_tile(x, W, y, m, k, i, j, 1, 2);
        if (jv < j1) nt_tile(x, W, y, m, k, i, jv, 1, 1);
    }
}

#define ACC_LB 128 /* rows of B per pass: a 128 x 16 panel stays in L1 */

/* C[r0..r0+nr, c..c+16] += A[., l0..l1] · B[l0..l1, c..c+16] (nr <= 4) */
static inline __attribute__((always_inline)) void acc_tile(const float *A, int64_t sa_r, int64_t sa_l,
                                                            const float *B, float *C, int64_t K, int64_t r0,
                                                            int nr, int64_t c, int64_t l0, int64_t l1) {
    __m256 acc[4][2];
    for (int a = 0; a < nr; a++) {
        acc[a][0] = _mm256_loadu_ps(C + (r0 + a) * K + c);
        acc[a][1] = _mm256_loadu_ps(C + (r0 + a) * K + c + 8);
    }
    for (int64_t l = l0; l < l1; l++) {
        const __m256 b0 = _mm256_loadu_ps(B + l * K + c), b1 = _mm256_loadu_ps(B + l * K + c + 8);
        for (int a = 0; a < nr; a++) {
            const __m256 av = _mm256_broadcast_ss(A + (r0 + a) * sa_r + l * sa_l);
            acc[a][0] = _mm256_fmadd_ps(av, b0, acc[a][0]);
            acc[a][1] = _mm256_fmadd_ps(av, b1, acc[a][1]);
        }
    }
    for (int a = 0; a < nr; a++) {
        _mm256_storeu_ps(C + (r0 + a) * K + c, acc[a][0]);
        _mm256_storeu_ps(C + (r0 + a) * K + c + 8, acc[a][1]);
    }
}

void li_train_mm_acc_avx2(const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C, int64_t Lk,
                          int64_t K, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const int64_t cv = c0 + (c1 - c0) / 16 * 16; /* columns the vector tiles cover */
    for (int64_t l0 = 0; l0 < Lk; l0 += ACC_LB) {
        const int64_t l1 = LI_MIN(Lk, l0 + ACC_LB);
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4)
            for (int64_t c = c0; c < cv; c += 16) acc_tile(A, sa_r, sa_l, B, C, K, r, 4, c, l0, l1);
        for (; r < r1; r++)
            for (int64_t c = c0; c < cv; c += 16) acc_tile(A, sa_r, sa_l, B, C, K, r, 1, c, l0, l1);
        if (cv < c1)
            li_train_mm_acc_ref(A + l0 * sa_l, sa_r, sa_l, B + l0 * K, C, l1 - l0, K, r0, r1, cv, c1);
    }
}
