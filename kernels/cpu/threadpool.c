/* threadpool.c — see threadpool.h.
 *
 * A job is announced by bumping `gen`; workers watch it. Parking is a
 * Dekker-style handshake: a worker counts itself in `n_parked` before its
 * last look at `gen`, and run() bumps `gen` before looking at `n_parked`, so
 * (both seq_cst) at least one sees the other and no wake-up is lost.
 *
 * `job` says who is inside the current job: JOB_CLOSED plus the number of
 * workers in it. run() opens it (0), workers enter with a CAS while it is
 * open, and run() closes it when its own share is done, then waits only
 * for those inside. The job fields (fn, ctx, nth) are read after entering,
 * so a worker always runs the job that is open, never a stale one.
 *
 * Contention (another process on our cores). A worker descheduled in the
 * middle of a chunk holds the job open until the scheduler runs it again,
 * a time slice (milliseconds) at every op it happens in, while the caller
 * spun. So the caller spins only briefly, then sleeps on `done_cv` (its core
 * goes idle, and the kernel may move the stalled worker onto it); the last
 * worker out wakes it. And a job that stalled like that (the wait longer
 * than the caller's own share plus STALL_SLACK) makes the caller run the
 * next jobs alone for a back-off time, doubling while stalls repeat (up to
 * BACKOFF_MAX), then try the workers again; one clean job resets it. Alone
 * is always allowed: job functions take work dynamically, so the results
 * are the same whoever runs which chunk. */
#define _GNU_SOURCE
#include "cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* How long a worker spins on `gen` before it parks: longer than the gap
 * between the ops of one forward pass, short enough not to burn a core
 * while the engine is idle. */
#define SPIN_SECONDS 200e-6
#define POLLS_PER_CLOCK 256 /* polls between clock reads */
#define JOB_CLOSED (1 << 30)
#define WAIT_SPIN_SECONDS 20e-6 /* the caller's spin for workers still inside, before it sleeps */
#define STALL_SLACK 50e-6       /* a wait this much longer than the caller's own share is a stall */
#define BACKOFF_MIN 2e-3        /* alone after a stall, at first */
#define BACKOFF_MAX 128e-3

struct li_threadpool {
    int n_threads;
    pthread_t *threads;    /* (n_threads - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;       /* bumped for each job (and for stop) */
    atomic_int n_parked;   /* workers asleep (or about to be) on cv */
    atomic_int job;        /* JOB_CLOSED | workers inside the job */
    atomic_int stop;
    /* the open job, written while `job` is closed */
    li_threadpool_fn fn;
    void *ctx;
    int nth;
    /* the caller's wait (job closed, workers still inside) */
    pthread_mutex_t done_mu;
    pthread_cond_t done_cv;
    atomic_int caller_sleeps; /* set (seq_cst) before the caller's last look at `job` */
    /* contention back-off, the caller's alone */
    double solo_until;        /* run jobs alone until this time */
    double backoff;           /* the next back-off (0: no stall lately) */
    long n_stalls, n_solo;    /* counters for li_threadpool_stats */
};

typedef struct {
    li_threadpool *tp;
    int ith;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Enters the open job, runs it, leaves; nothing if it is closed. */
static void worker_try_job(li_threadpool *tp, int ith) {
    int s = atomic_load_explicit(&tp->job, memory_order_relaxed);
    while (!(s & JOB_CLOSED)) {
        if (atomic_compare_exchange_weak_explicit(&tp->job, &s, s + 1, memory_order_acquire,
                                                  memory_order_relaxed)) {
            if (ith < tp->nth) tp->fn(tp->ctx, ith, tp->nth);
            /* seq_cst, against the caller's caller_sleeps-then-job: the last
             * one out of a closed job sees the caller asleep, or the caller
             * sees the job empty */
            if (atomic_fetch_sub(&tp->job, 1) == (JOB_CLOSED | 1) && atomic_load(&tp->caller_sleeps)) {
                pthread_mutex_lock(&tp->done_mu);
                pthread_cond_signal(&tp->done_cv);
                pthread_mutex_unlock(&tp->done_mu);
            }
            return;
        }
    }
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    li_threadpool *tp = wa->tp;
    const int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        /* wait for a new job: spin, then park */
        int polls = 0;
        const double t0 = now();
        while (atomic_load_explicit(&tp->gen, memory_order_acquire) == seen) {
            cpu_relax();
            if (++polls % POLLS_PER_CLOCK || now() - t0 < SPIN_SECONDS) continue;
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->n_parked, 1);
            while (atomic_load(&tp->gen) == seen) pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->n_parked, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        seen = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (atomic_load_explicit(&tp->stop, memory_order_relaxed)) break;
        worker_try_job(tp, ith);
    }
    return NULL;
}

/* Wakes the workers for a new job (or the stop flag). */
static void publish(li_threadpool *tp) {
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: ordered before the n_parked load */
    if (atomic_load(&tp->n_parked) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
}

li_threadpool *li_threadpool_init(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    li_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads) {
        free(tp);
        return NULL;
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    pthread_mutex_init(&tp->done_mu, NULL);
    pthread_cond_init(&tp->done_cv, NULL);
    atomic_init(&tp->caller_sleeps, 0);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->n_parked, 0);
    atomic_init(&tp->job, JOB_CLOSED);
    atomic_init(&tp->stop, 0);
    tp->n_threads = 1;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){tp, i};
        if (!wa || pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            li_threadpool_free(tp); /* stops and joins the workers started so far */
            return NULL;
        }
        tp->n_threads = i + 1;
    }
    return tp;
}

void li_threadpool_free(li_threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    publish(tp);
    for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->threads[i - 1], NULL);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->done_cv);
    pthread_mutex_destroy(&tp->done_mu);
    free(tp->threads);
    free(tp);
}

int li_threadpool_size(const li_threadpool *tp) { return tp->n_threads; }

void li_threadpool_stats(const li_threadpool *tp, long *n_stalls, long *n_solo) {
    *n_stalls = tp->n_stalls;
    *n_solo = tp->n_solo;
}

static inline bool job_busy(li_threadpool *tp) {
    return (atomic_load_explicit(&tp->job, memory_order_acquire) & ~JOB_CLOSED) != 0;
}

/* After closing the job: until the workers inside have left. Spins for
 * WAIT_SPIN_SECONDS, then sleeps. */
static void wait_workers(li_threadpool *tp) {
    int polls = 0;
    const double t0 = now();
    while (job_busy(tp)) {
        cpu_relax();
        if (++polls % 64 || now() - t0 < WAIT_SPIN_SECONDS) continue;
        pthread_mutex_lock(&tp->done_mu);
        atomic_store(&tp->caller_sleeps, 1);
        while ((atomic_load(&tp->job) & ~JOB_CLOSED) != 0) pthread_cond_wait(&tp->done_cv, &tp->done_mu);
        atomic_store(&tp->caller_sleeps, 0);
        pthread_mutex_unlock(&tp->done_mu);
    }
}

void li_threadpool_run(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth) {
    if (nth > tp->n_threads) nth = tp->n_threads;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    const double t0 = now();
    if (t0 < tp->solo_until) { /* backing off after a stall: no hand-off */
        tp->n_solo++;
        fn(ctx, 0, nth);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->nth = nth;
    atomic_store_explicit(&tp->job, 0, memory_order_release); /* open */
    publish(tp);
    fn(ctx, 0, nth);
    /* close, then wait for the workers that got in */
    atomic_fetch_or_explicit(&tp->job, JOB_CLOSED, memory_order_relaxed);
    if (!job_busy(tp)) {
        tp->backoff = 0;
        return;
    }
    const double t1 = now();
    wait_workers(tp);
    const double t2 = now();
    if (t2 - t1 > (t1 - t0) + STALL_SLACK) {
        /* a worker was off the CPU mid-chunk: go alone for a while */
        tp->n_stalls++;
        tp->backoff = tp->backoff > 0 ? 2 * tp->backoff : BACKOFF_MIN;
        if (tp->backoff > BACKOFF_MAX) tp->backoff = BACKOFF_MAX;
        tp->solo_until = t2 + tp->backoff;
    } else {
        tp->backoff = 0;
    }
}
