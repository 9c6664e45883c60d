/* train_f64.c — train_tmpl.h in double, for the gradient checks: central
 * differences of a double forward pass resolve gradients to ~1e-8, which
 * float's rounding would drown. Plain loops, one thread. */
#include "train/train_internal.h"

#include <math.h>

#define real double
#define TR(name) name##_f64
#define TR_SQRT sqrt
#define TR_EXP exp
#define TR_LOG log
#define TR_POW pow
#define TR_COS cos
#define TR_SIN sin

void li_train_mm_nt_f64(const double *x, const double *W, double *y, int64_t n, int64_t m, int64_t k) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++) s += x[i * k + l] * W[j * k + l];
            y[i * m + j] = s;
        }
}

void li_train_mm_acc_f64(const double *A, int64_t sa_r, int64_t sa_l, const double *B, double *C, int64_t R,
                         int64_t Lk, int64_t K) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t l = 0; l < Lk; l++) {
            const double a = A[r * sa_r + l * sa_l];
            for (int64_t j = 0; j < K; j++) C[r * K + j] += a * B[l * K + j];
        }
}

#define TR_MM_NT(tp, x, W, y, n, m, k) li_train_mm_nt_f64(x, W, y, n, m, k)
#define TR_MM_ACC(tp, A, sa_r, sa_l, B, C, R, Lk, K) li_train_mm_acc_f64(A, sa_r, sa_l, B, C, R, Lk, K)

#include "train/train_tmpl.h"
