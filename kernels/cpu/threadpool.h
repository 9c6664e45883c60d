/* threadpool.h — a persistent pool of worker threads for the CPU backend.
 *
 * Threads are created once at init. li_threadpool_run opens a job, the
 * calling thread works on it as thread 0, and workers join while it is
 * open; it returns once the caller is done and every worker that joined has
 * left. A worker that is slow to wake (descheduled by another process) finds
 * the job closed and skips it, so nobody waits for it. Hence the rule for
 * job functions: take work dynamically (an atomic counter), never by thread
 * index; the caller alone may end up doing all of it. ith is unique among
 * the threads running a job (use it for per-thread scratch).
 *
 * Between jobs workers spin briefly (a decode step issues hundreds of small
 * jobs microseconds apart, and a futex wake-up costs more than the job),
 * then park on a condition variable. */
#ifndef LI_THREADPOOL_H
#define LI_THREADPOOL_H

#include <stdint.h>

/* fn(ctx, ith, nth): ith in [0, nth), nth the most threads that may join. */
typedef void (*li_threadpool_fn)(void *ctx, int ith, int nth);

typedef struct li_threadpool li_threadpool;

/* n_threads counts the caller; n_threads - 1 workers are started. NULL when
 * a thread cannot be created. */
li_threadpool *li_threadpool_init(int n_threads);
void li_threadpool_free(li_threadpool *tp);
int li_threadpool_size(const li_threadpool *tp);
/* Runs fn on the caller and up to nth - 1 workers (nth <= size). The
 * caller may run it alone instead, when that has measured faster (another
 * process on the cores: threadpool.c). */
void li_threadpool_run(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth);
/* The same, with `work` a rough cost of the job in any unit the caller
 * keeps the same for that fn (e.g. multiply-adds; <= 0: unknown). Jobs are
 * timed per unit of work in classes of fn, nth and log2(work), so jobs of
 * one fn but very different sizes are judged apart. */
void li_threadpool_run_sized(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth, int64_t work);
/* The same, jobs of one fn and size also judged apart by `shape` when their
 * cost per unit of work differs: a matmul of one activation row streams its
 * weights from memory (two threads: ~1.4x one), one of 16 rows with the same
 * multiply-adds computes (~2x). Timed in one class, the GEMV's cost per
 * multiply-add reads 5x the GEMM's, and the comparison of the modes mixes
 * them up (the caller alone then looks faster than it is). */
void li_threadpool_run_shaped(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth, int64_t work, int shape);
/* The shape of a job over `rows` activation rows of one weight kind (any
 * small int, e.g. its li_type): the rows in powers of two up to 128. */
static inline int li_threadpool_rows_shape(int kind, int64_t rows) {
    int b = 0;
    while (b < 7 && ((int64_t)2 << b) <= rows) b++;
    return kind * 8 + b + 1;
}
/* The shape of jobs that one dispatching fn runs for many inner functions
 * (a row op, a training op): the inner function's address and an op id. */
static inline int li_threadpool_fn_shape(uintptr_t inner, int op) {
    return (int)(((inner >> 4) ^ ((uintptr_t)(unsigned)op * 40503u)) & 0xffffff);
}
/* Jobs that stalled on a descheduled worker, and jobs the caller ran alone
 * though it had workers, since init. */
void li_threadpool_stats(const li_threadpool *tp, long *n_stalls, long *n_solo);
/* Mode changes (workers <-> alone) and probes of the other mode since init;
 * *solo: the caller runs jobs alone now. */
void li_threadpool_mode_stats(const li_threadpool *tp, long *n_switches, long *n_probes, int *solo);

/* For tests: the clock (seconds) the mode choice reads, NULL for
 * CLOCK_MONOTONIC, so that a test can give each mode a cost that the
 * machine's load cannot change. Stalls are still timed by the real clock.
 * Call between jobs. */
void li_threadpool_set_clock(li_threadpool *tp, double (*clock)(void *arg), void *arg);

#endif
