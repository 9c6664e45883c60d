/* train_par.c — li_train_par: the parallel-for of train_tmpl.h's ops
 * (attention, the loss) on the thread pool, jobs taken from an atomic
 * counter so a descheduled worker never holds the others up. */
#include "train/train_internal.h"
#include "cpu/threadpool.h"

#include <stdatomic.h>

typedef struct par_ctx {
    li_train_job_fn fn;
    void *ctx;
    int64_t n;
    atomic_long next;
} par_ctx;

static void par_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    par_ctx *p = ctx;
    for (;;) {
        const long j = atomic_fetch_add(&p->next, 1);
        if (j >= p->n) break;
        p->fn(p->ctx, j);
    }
}

void li_train_par(void *tp, li_train_job_fn fn, void *ctx, int64_t n, int op) {
    if (n <= 0) return;
    li_threadpool *pool = tp;
    if (!pool || n == 1 || li_threadpool_size(pool) < 2) {
        for (int64_t j = 0; j < n; j++) fn(ctx, j);
        return;
    }
    par_ctx p = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&p.next, 0);
    /* every op runs through par_run: its fn and op are the class, its jobs
     * (of a similar size each) the work */
    li_threadpool_run_shaped(pool, par_run, &p, (int)LI_MIN((int64_t)li_threadpool_size(pool), n), n,
                             li_threadpool_fn_shape((uintptr_t)fn, op));
}
