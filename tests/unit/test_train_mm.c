/* test_train_mm.c — the packed GEMM of core/train/train_mm.c (the three
 * shapes of training: y = x·W^T, dX = dY·W, dW = dY^T·X) against a double
 * reference at odd sizes that hit every tail: partial MR x NR tiles, more
 * than one k pass (k > 256), more than one row block (rows > 256), narrow
 * column blocks, a thread's packed A kept over its column blocks and (k
 * past 7,000: 28+ passes) packed again each pass. Each kernel (scalar, AVX2, AVX-512: those the CPU runs)
 * within 1e-5 of the scale; the SIMD kernels give the same bits as each
 * other and on 1, 2 and 3 threads (one FMA chain per element). */
#include "test_util.h"
#include "train/train_internal.h"
#include "cpu/threadpool.h"

#include <string.h>

typedef struct mm_out {
    float *y, *dx, *dw;
} mm_out;

static void mm_run(li_threadpool *tp, const float *x, const float *W, const float *dy, const float *dx0,
                   const float *dw0, mm_out *o, int64_t n, int64_t m, int64_t k) {
    li_train_mm_nt(tp, x, W, o->y, n, m, k);
    memcpy(o->dx, dx0, (size_t)(n * k) * 4); /* the acc shapes add into what is there */
    memcpy(o->dw, dw0, (size_t)(m * k) * 4);
    li_train_mm_acc(tp, dy, m, 1, W, o->dx, n, m, k);
    li_train_mm_acc(tp, dy, 1, m, x, o->dw, m, n, k);
}

/* max |a − e| / max(1, max |e|) */
static double err(const float *a, const double *e, int64_t cnt) {
    double d = 0, s = 1;
    for (int64_t i = 0; i < cnt; i++) {
        d = fmax(d, fabs(a[i] - e[i]));
        s = fmax(s, fabs(e[i]));
    }
    return d / s;
}

static void test_shape(li_threadpool **tps, int64_t n, int64_t m, int64_t k) {
    float *x = malloc(n * k * 4), *W = malloc(m * k * 4), *dy = malloc(n * m * 4);
    float *dx0 = malloc(n * k * 4), *dw0 = malloc(m * k * 4);
    double *ey = calloc(n * m, 8), *ex = calloc(n * k, 8), *ew = calloc(m * k, 8);
    for (int64_t i = 0; i < n * k; i++) x[i] = rng_f(), dx0[i] = rng_f();
    for (int64_t i = 0; i < m * k; i++) W[i] = rng_f(), dw0[i] = rng_f();
    for (int64_t i = 0; i < n * m; i++) dy[i] = rng_f();
    for (int64_t i = 0; i < n * k; i++) ex[i] = dx0[i];
    for (int64_t i = 0; i < m * k; i++) ew[i] = dw0[i];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++)
            for (int64_t l = 0; l < k; l++) {
                ey[i * m + j] += (double)x[i * k + l] * W[j * k + l];
                ex[i * k + l] += (double)dy[i * m + j] * W[j * k + l];
                ew[j * k + l] += (double)dy[i * m + j] * x[i * k + l];
            }
    const int best = li_train_mm_set_isa(99);
    static const char *names[] = {"scalar", "AVX2", "AVX-512"};
    mm_out ref = {0}; /* the first SIMD kernel's, one thread */
    for (int isa = 0; isa <= 2; isa++) {
        if (isa > best) {
            printf("skip %s matmuls (%lld x %lld x %lld): the CPU lacks it\n", names[isa], (long long)n,
                   (long long)m, (long long)k);
            continue;
        }
        li_train_mm_set_isa(isa);
        for (int t = 0; t < 3; t++) {
            mm_out o = {malloc(n * m * 4), malloc(n * k * 4), malloc(m * k * 4)};
            mm_run(tps[t], x, W, dy, dx0, dw0, &o, n, m, k);
            const double e1 = err(o.y, ey, n * m), e2 = err(o.dx, ex, n * k), e3 = err(o.dw, ew, m * k);
            /* float sums of k (or n) products of |v| < 1: a few ulps × sqrt(k) */
            const double tol = 1e-5;
            if (t == 0)
                report(e1 < tol && e2 < tol && e3 < tol, "%s matmuls (%lld x %lld x %lld): y %.1e, dX %.1e, dW %.1e",
                       names[isa], (long long)n, (long long)m, (long long)k, e1, e2, e3);
            if (isa == 0) {
                free(o.y), free(o.dx), free(o.dw);
                continue;
            }
            if (!ref.y) {
                ref = o;
                continue;
            }
            const bool same = !memcmp(o.y, ref.y, n * m * 4) && !memcmp(o.dx, ref.dx, n * k * 4) &&
                              !memcmp(o.dw, ref.dw, m * k * 4);
            report(same, "%s on %d thread(s): the bits of AVX2 on one", names[isa], t + 1);
            free(o.y), free(o.dx), free(o.dw);
        }
    }
    li_train_mm_set_isa(best);
    free(ref.y), free(ref.dx), free(ref.dw);
    free(x), free(W), free(dy), free(dx0), free(dw0), free(ey), free(ex), free(ew);
}

int main(void) {
    rng_seed(777);
    li_threadpool *tps[3] = {NULL, li_threadpool_init(2), li_threadpool_init(3)};
    test_shape(tps, 7, 37, 45);    /* every tile partial */
    test_shape(tps, 13, 70, 301);  /* two k passes of y and dX, a partial third */
    test_shape(tps, 131, 33, 17);  /* dW's 33 x 17 from k = 131 */
    test_shape(tps, 263, 41, 19);  /* two row blocks of y and dX */
    test_shape(tps, 9, 40, 7781);  /* y's A too long to keep (31 k passes); dX's kept over 31 column blocks */
    test_shape(tps, 64, 520, 96);  /* 64 tokens: full 8 x 32 and 6 x 16 tiles, NC split */
    test_shape(tps, 1, 5, 3);      /* one row */
    li_threadpool_free(tps[1]);
    li_threadpool_free(tps[2]);
    return t_summary("test_train_mm");
}
