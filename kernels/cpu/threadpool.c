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
 * a time slice (milliseconds), while the caller waits; and a worker spinning
 * between jobs takes a share of the core the caller needs. So the caller
 * spins only briefly, then sleeps on `done_cv` (its core goes idle, and the
 * kernel may move the stalled worker onto it); the last worker out wakes it.
 *
 * And it picks the faster of two modes by measured throughput: POOL (hand
 * the job to the workers) or SOLO (run it alone; the workers park). Jobs are
 * grouped in classes (fn, nth, log2 of the work hint, the caller's shape:
 * a GEMV and a GEMM of the same multiply-adds cost 5x apart per unit);
 * each class keeps an EWMA of seconds per unit of work in each mode, its
 * first job in a mode left out (cold: pages faulted, caches empty, a parked
 * worker woken; measured at 20x a warm job). The mode is global, since one
 * mode's cost depends on the other jobs (workers spinning or parked; a mode
 * per class was tried: SOLO classes park the workers, every POOL job after
 * them pays a wake-up, and prefill fell 1.5x):
 *  - every job in the running mode updates its class's estimate, and in
 *    POOL, every WINDOW seconds of jobs, the caller compares what they took
 *    with what SOLO's estimates say they would have taken (decayed sums over
 *    windows, stalls being rare and large); SOLO wins only by MARGIN_SOLO,
 *    wider than MARGIN: contention costs time slices (several x), while
 *    an idle machine's noise made SOLO look up to ~1.4x faster;
 *  - now and then (every probe_every seconds of wall time, doubling from
 *    PROBE_MIN to PROBE_MAX while probes confirm the mode) a PROBE_SPAN-long
 *    run of jobs goes the other way, refreshing its estimates, and wins if
 *    it beat the running mode's estimates by MARGIN_SOLO / MARGIN (POOL's
 *    probes are the only way back to the workers; one the next windows prove
 *    wrong counts as confirming SOLO). A probe waits for PROBE_SPAN of jobs
 *    in the running mode since the last (else, jobs further apart than the
 *    interval would all be probes), and one made mostly of classes the
 *    running mode never timed confirms nothing (no backing off). So probing
 *    costs a bounded share of the time (PROBE_SPAN / PROBE_MIN at most,
 *    about PROBE_SPAN / PROBE_MAX in steady state), and uncontended, where
 *    POOL wins every comparison, the jobs split as they always did;
 *  - a stall while SOLO is still unmeasured for that class starts a probe
 *    at once;
 *  - a sample counts for at most CLIP x its class's estimate, in the EWMA
 *    and in the window's sums: one time slice of the host must not decide,
 *    while contention, slowing job after job, still does.
 * SOLO is always allowed: job functions take work dynamically and every
 * chunk is computed whole by one thread, so the results are the same
 * whoever runs which chunk. */
#define _GNU_SOURCE
#include "cpu/threadpool.h"
#include "util/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
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
#define N_CLASSES 128           /* job classes, direct-mapped (a collision restarts the class) */
#define EWMA_RUN 0.125          /* weight of a sample in the running mode */
#define EWMA_PROBE 0.25         /* weight of a probe's sample (few, so each counts more) */
#define WINDOW 4e-3             /* seconds of jobs between comparisons in the running mode */
#define MARGIN 1.1              /* the workers must be this much faster to take over */
#define MARGIN_SOLO 1.5         /* and alone this much: contention costs more (time slices), while
                                 * uncontended jobs measured alone up to ~1.4x faster by noise */
#define PROBE_SPAN 1e-3         /* seconds of jobs a probe runs the other mode */
#define PROBE_MIN 32e-3         /* wall seconds between probes, at first */
#define PROBE_MAX 1.0
#define MISLED 0.25             /* back to SOLO this soon after a probe chose POOL: the probe misled */

enum { MODE_POOL, MODE_SOLO };

typedef struct {
    li_threadpool_fn fn;      /* key: fn, nth, size class, shape (fn NULL: empty) */
    int nth, size, shape;
    double est[2];            /* seconds per unit of work in MODE_POOL, MODE_SOLO (0: not measured) */
    int n[2];                 /* jobs timed in each mode (the first not counted in est) */
} job_class;

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
    /* the mode choice (threadpool.c's header), the caller's alone */
    job_class classes[N_CLASSES];
    int mode;                 /* MODE_POOL or MODE_SOLO, the running mode */
    double probe_until;       /* probing the other mode: job seconds left (0: not probing) */
    double probe_t, probe_alt;/* the probe's job seconds, and the running mode's estimate of them */
    double probe_known;       /* of probe_t, the seconds of classes the running mode has timed */
    double run_since;         /* job seconds in the running mode since the last probe */
    double next_probe;        /* wall time of the next probe */
    double probe_every;       /* wall seconds between probes */
    double win_t;             /* job seconds in the current window */
    double win_known, win_alt;/* of those, with an estimate in the other mode, and that estimate */
    double dec_known, dec_alt;/* decayed sums of past windows */
    bool switch_by_probe;     /* the last mode change came from a probe */
    double switch_t;          /* and happened then */
    double (*clock)(void *);  /* the mode choice's clock (NULL: now()), and its argument */
    void *clock_arg;
    long n_stalls, n_solo;    /* counters for li_threadpool_stats */
    long n_switches, n_probes;
    long n_jobs;              /* jobs offered to more than one thread */
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
    li_thread_signals_begin();
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){tp, i};
        if (!wa || pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            li_thread_signals_end();
            li_threadpool_free(tp); /* stops and joins the workers started so far */
            return NULL;
        }
        tp->n_threads = i + 1;
    }
    li_thread_signals_end();
    return tp;
}

void li_threadpool_free(li_threadpool *tp) {
    if (tp && getenv("LI_POOL_STATS")) /* what the mode choice did, for whoever tunes it */
        fprintf(stderr, "threadpool: %ld jobs, %ld alone, %ld stalls, %ld probes, %ld mode switches\n",
                tp->n_jobs, tp->n_solo, tp->n_stalls, tp->n_probes, tp->n_switches);
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

void li_threadpool_mode_stats(const li_threadpool *tp, long *n_switches, long *n_probes, int *solo) {
    *n_switches = tp->n_switches;
    *n_probes = tp->n_probes;
    *solo = tp->mode == MODE_SOLO;
}

void li_threadpool_set_clock(li_threadpool *tp, double (*clock)(void *arg), void *arg) {
    tp->clock = clock;
    tp->clock_arg = arg;
}

static double mode_clock(const li_threadpool *tp) { return tp->clock ? tp->clock(tp->clock_arg) : now(); }

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

/* ------------------------------------------------------------------------
 * running a job
 * ---------------------------------------------------------------------- */

/* Hands the job to the workers too; returns when all of it is done. *stalled:
 * a worker was off the CPU mid-chunk (the wait outlasted the caller's share). */
static void run_pool(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth, bool *stalled) {
    const double t0 = now();
    tp->fn = fn;
    tp->ctx = ctx;
    tp->nth = nth;
    atomic_store_explicit(&tp->job, 0, memory_order_release); /* open */
    publish(tp);
    fn(ctx, 0, nth);
    /* close, then wait for the workers that got in */
    atomic_fetch_or_explicit(&tp->job, JOB_CLOSED, memory_order_relaxed);
    *stalled = false;
    if (!job_busy(tp)) return;
    const double t1 = now();
    wait_workers(tp);
    const double t2 = now();
    if (t2 - t1 > (t1 - t0) + STALL_SLACK) {
        tp->n_stalls++;
        *stalled = true;
    }
}

static job_class *class_of(li_threadpool *tp, li_threadpool_fn fn, int nth, int size, int shape) {
    uintptr_t h = (uintptr_t)fn;
    h ^= h >> 17;
    h = h * 31 + (uintptr_t)nth * 7 + (uintptr_t)size * 131 + (uintptr_t)(unsigned)shape * 2654435761u;
    h ^= h >> 9;
    job_class *c = &tp->classes[h % N_CLASSES];
    if (c->fn != fn || c->nth != nth || c->size != size || c->shape != shape)
        *c = (job_class){.fn = fn, .nth = nth, .size = size, .shape = shape};
    return c;
}

/* A class's first job in a mode is left out of its estimate: first jobs
 * are cold (their weights' pages faulted, caches empty, a parked worker
 * woken) and were measured at 20x a warm job, enough for one probe of the
 * other mode to look 20x faster and switch every class's mode. */
#define EST_MIN_JOBS 2
/* seconds per unit of work of the class in mode, 0 while unknown */
static double est_of(const job_class *c, int mode) { return c->n[mode] >= EST_MIN_JOBS ? c->est[mode] : 0; }

/* A sample counts for at most CLIP times the estimate it updates: one
 * worker descheduled for a time slice (the host's, on an idle machine)
 * made a 0.4 ms GEMM read 1.6 ms, and one such window switched every job
 * to SOLO. Contention slows job after job, and the estimate still grows
 * geometrically (x1.375 a job at EWMA_RUN). */
#define CLIP 4.0
static double clipped(const job_class *c, int mode, double sample) {
    const double cap = est_of(c, mode) > 0 ? CLIP * est_of(c, mode) : sample;
    return sample < cap ? sample : cap;
}

static void ewma(job_class *c, int mode, double sample, double w) {
    double *est = &c->est[mode];
    if (c->n[mode]++ == 0) return;
    sample = clipped(c, mode, sample);
    *est = *est > 0 ? *est + w * (sample - *est) : sample;
}

static void set_mode(li_threadpool *tp, int mode, bool by_probe, double t) {
    if (mode != tp->mode) tp->n_switches++;
    tp->mode = mode;
    tp->win_t = tp->win_known = tp->win_alt = tp->dec_known = tp->dec_alt = 0;
    tp->switch_by_probe = by_probe;
    tp->switch_t = t;
}

/* After a job of the running mode: its estimate, and the window's
 * comparison. Only POOL is left this way: its jobs measure it all the time,
 * while SOLO's view of POOL comes from probes alone, so only a probe may
 * bring the workers back. */
static void account_run(li_threadpool *tp, job_class *c, double dt, double units, double t_end) {
    const int other = !tp->mode;
    dt = clipped(c, tp->mode, dt / units) * units; /* the window's sums too */
    ewma(c, tp->mode, dt / units, EWMA_RUN);
    tp->win_t += dt;
    tp->run_since += dt;
    if (est_of(c, other) > 0) {
        tp->win_known += dt;
        tp->win_alt += est_of(c, other) * units;
    }
    if (tp->win_t < WINDOW) return;
    tp->dec_known = 0.5 * tp->dec_known + tp->win_known;
    tp->dec_alt = 0.5 * tp->dec_alt + tp->win_alt;
    const bool covered = tp->win_known >= 0.5 * tp->win_t;
    tp->win_t = tp->win_known = tp->win_alt = 0;
    if (tp->mode == MODE_POOL && covered && tp->dec_alt * MARGIN_SOLO < tp->dec_known) {
        /* a probe that brought the workers back just now misled us (a
         * woken worker often runs at once, then shares a core): probe less;
         * otherwise things changed (contention began): look again soon */
        if (tp->switch_by_probe && t_end - tp->switch_t < MISLED)
            tp->probe_every = 2 * tp->probe_every < PROBE_MAX ? 2 * tp->probe_every : PROBE_MAX;
        else
            tp->probe_every = PROBE_MIN;
        set_mode(tp, MODE_SOLO, false, t_end);
        tp->next_probe = t_end + tp->probe_every;
    }
}

/* After a job of a probe (the other mode). */
static void account_probe(li_threadpool *tp, job_class *c, double dt, double units, double t_end) {
    const int other = !tp->mode;
    ewma(c, other, dt / units, EWMA_PROBE);
    tp->probe_t += dt;
    if (est_of(c, tp->mode) > 0) {
        tp->probe_alt += est_of(c, tp->mode) * units;
        tp->probe_known += dt;
    } else {
        tp->probe_alt += dt; /* no comparison for this class: neutral */
    }
    tp->probe_until -= dt;
    if (tp->probe_until > 0) return;
    tp->probe_until = 0;
    /* a probe made mostly of jobs the running mode never timed (it began
     * just before them) confirms nothing: no backing off, or a wrong mode
     * could stand for PROBE_MAX */
    if (tp->probe_t * (other == MODE_SOLO ? MARGIN_SOLO : MARGIN) < tp->probe_alt) {
        set_mode(tp, other, true, t_end);
    } else if (tp->probe_known >= 0.5 * tp->probe_t && tp->probe_every < PROBE_MAX) {
        tp->probe_every = 2 * tp->probe_every < PROBE_MAX ? 2 * tp->probe_every : PROBE_MAX;
    }
    tp->next_probe = t_end + tp->probe_every;
}

void li_threadpool_run(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth) {
    li_threadpool_run_sized(tp, fn, ctx, nth, 0);
}

void li_threadpool_run_sized(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth, int64_t work) {
    li_threadpool_run_shaped(tp, fn, ctx, nth, work, 0);
}

void li_threadpool_run_shaped(li_threadpool *tp, li_threadpool_fn fn, void *ctx, int nth, int64_t work, int shape) {
    if (nth > tp->n_threads) nth = tp->n_threads;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    const int size = work > 0 ? 64 - __builtin_clzll((unsigned long long)work) : 0;
    const double units = work > 0 ? (double)work : 1.0;
    job_class *c = class_of(tp, fn, nth, size, shape);
    const double t0 = mode_clock(tp);
    if (tp->probe_every == 0) { /* the first job */
        tp->probe_every = PROBE_MIN;
        tp->next_probe = t0 + PROBE_MIN;
    }
    /* a probe is due by wall time, but not before the running mode has
     * had as many job seconds since the last: where jobs come further
     * apart than the probe interval every job would be a probe, and the
     * running mode never timed again */
    if (tp->probe_until == 0 && t0 >= tp->next_probe && tp->run_since >= PROBE_SPAN) {
        tp->n_probes++;
        tp->probe_until = PROBE_SPAN;
        tp->probe_t = tp->probe_alt = tp->probe_known = tp->run_since = 0;
    }
    tp->n_jobs++;
    const bool probing = tp->probe_until > 0;
    const int mode = probing ? !tp->mode : tp->mode;
    bool stalled = false;
    if (mode == MODE_SOLO) {
        tp->n_solo++;
        fn(ctx, 0, nth);
    } else {
        run_pool(tp, fn, ctx, nth, &stalled);
    }
    const double t1 = mode_clock(tp);
    if (probing) {
        account_probe(tp, c, t1 - t0, units, t1);
    } else {
        account_run(tp, c, t1 - t0, units, t1);
        if (stalled && tp->mode == MODE_POOL && est_of(c, MODE_SOLO) == 0 && tp->probe_until == 0) {
            /* SOLO unmeasured and the workers look slow: find out now */
            tp->n_probes++;
            tp->probe_until = PROBE_SPAN;
            tp->probe_t = tp->probe_alt = tp->probe_known = tp->run_since = 0;
        }
    }
}
