/* train_mm.c — the two matmul shapes of training, split over the thread
 * pool: y = x·W^T (forward) and C += A·B with A read through strides (the
 * backward's dX = dY·W and dW = dY^T·X, no transposed copies). Scalar
 * references here, AVX2 kernels in train_mm_avx2.c, chosen by CPUID. */
#include "train/train_internal.h"
#include "cpu/threadpool.h"

#include <stdatomic.h>

/* ==== scalar references ==================================================== */

void li_train_mm_nt_ref(const float *x, const float *W, float *y, int64_t n, int64_t m, int64_t k, int64_t j0,
                        int64_t j1) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = j0; j < j1; j++) {
            float s = 0;
            for (int64_t l = 0; l < k; l++) s += x[i * k + l] * W[j * k + l];
            y[i * m + j] = s;
        }
}

void li_train_mm_acc_ref(const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C, int64_t Lk,
                         int64_t K, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t l = 0; l < Lk; l++) {
            const float a = A[r * sa_r + l * sa_l];
            for (int64_t j = c0; j < c1; j++) C[r * K + j] += a * B[l * K + j];
        }
}

/* ==== dispatch ============================================================= */

static int mm_isa = -1; /* -1: not chosen yet */

static int mm_isa_best(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

int li_train_mm_set_isa(int isa) {
    int prev = mm_isa < 0 ? mm_isa_best() : mm_isa;
    mm_isa = isa > 0 && mm_isa_best() ? 1 : 0;
    return prev;
}

static int mm_isa_get(void) {
    if (mm_isa < 0) mm_isa = mm_isa_best();
    return mm_isa;
}

/* ==== threaded drivers ===================================================== */

#define NT_TILE 8    /* W rows per job: 8 x k floats stay in L1 */
#define ACC_RT 64    /* C rows per job */
#define ACC_CT 64    /* C columns per job */

typedef struct mm_job {
    const float *x, *W, *A, *B;
    float *y, *C;
    int64_t n, m, k, sa_r, sa_l, R, Lk, K, n_ct;
    int64_t n_jobs;
    atomic_long next;
    int isa;
} mm_job;

static void nt_run(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    for (;;) {
        const long t = atomic_fetch_add(&j->next, 1);
        if (t >= j->n_jobs) break;
        const int64_t j0 = t * NT_TILE, j1 = LI_MIN(j->m, j0 + NT_TILE);
        if (j->isa) li_train_mm_nt_avx2(j->x, j->W, j->y, j->n, j->m, j->k, j0, j1);
        else li_train_mm_nt_ref(j->x, j->W, j->y, j->n, j->m, j->k, j0, j1);
    }
}

static void acc_run(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    for (;;) {
        const long t = atomic_fetch_add(&j->next, 1);
        if (t >= j->n_jobs) break;
        const int64_t r0 = (t / j->n_ct) * ACC_RT, c0 = (t % j->n_ct) * ACC_CT;
        const int64_t r1 = LI_MIN(j->R, r0 + ACC_RT), c1 = LI_MIN(j->K, c0 + ACC_CT);
        if (j->isa) li_train_mm_acc_avx2(j->A, j->sa_r, j->sa_l, j->B, j->C, j->Lk, j->K, r0, r1, c0, c1);
        else li_train_mm_acc_ref(j->A, j->sa_r, j->sa_l, j->B, j->C, j->Lk, j->K, r0, r1, c0, c1);
    }
}

static void mm_launch(li_threadpool *tp, li_threadpool_fn fn, mm_job *j) {
    if (tp && j->n_jobs > 1) li_threadpool_run(tp, fn, j, (int)LI_MIN((int64_t)li_threadpool_size(tp), j->n_jobs));
    else fn(j, 0, 1);
}

void li_train_mm_nt(li_threadpool *tp, const float *x, const float *W, float *y, int64_t n, int64_t m,
                    int64_t k) {
    if (n <= 0 || m <= 0) return;
    mm_job j = {.x = x, .W = W, .y = y, .n = n, .m = m, .k = k, .n_jobs = (m + NT_TILE - 1) / NT_TILE,
                .isa = mm_isa_get()};
    atomic_init(&j.next, 0);
    mm_launch(tp, nt_run, &j);
}

void li_train_mm_acc(li_threadpool *tp, const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C,
                     int64_t R, int64_t Lk, int64_t K) {
    if (R <= 0 || K <= 0 || Lk <= 0) return;
    const int64_t n_ct = (K + ACC_CT - 1) / ACC_CT;
    mm_job j = {.A = A, .B = B, .C = C, .sa_r = sa_r, .sa_l = sa_l, .R = R, .Lk = Lk, .K = K, .n_ct = n_ct,
                .n_jobs = ((R + ACC_RT - 1) / ACC_RT) * n_ct, .isa = mm_isa_get()};
    atomic_init(&j.next, 0);
    mm_launch(tp, acc_run, &j);
}
