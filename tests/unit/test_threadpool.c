/* test_threadpool.c — the CPU backend's thread pool (kernels/cpu/threadpool.c):
 *  - pools of 1..5 threads, jobs of every nth, with 0, 1, fewer chunks than
 *    threads, as many, and many more: every chunk runs exactly once, no two
 *    threads of a job share an ith, and the outputs (an order-sensitive float
 *    reduction per chunk) are bit-identical to a serial run;
 *  - a worker that stalls mid-chunk (as if descheduled by another process):
 *    run() still returns only once its chunk is written, the stall is
 *    counted, the next job runs on the caller alone (a probe of that mode)
 *    with the same outputs, and a later job is handed to the workers again.
 *    Built so that load cannot change the outcome: the pool is fresh (its
 *    first job goes to the workers), the caller of a job handed to the
 *    workers waits inside it until a worker has taken a chunk, and the
 *    stalled worker holds its chunk until the caller sleeps waiting for it,
 *    then twice as long as the caller took (so the wait outlasts the
 *    caller's share whatever the scheduler did);
 *  - thousands of back-to-back jobs with workers going in and out (the
 *    caller's sleep/wake handshake loses no wake-up: the test would hang);
 *  - the mode choice by measured throughput, on a clock the test keeps
 *    (li_threadpool_set_clock: a job lasts as long as the busier side's
 *    chunks cost, so load changes nothing): workers made slow (10 ms a
 *    chunk a worker takes, the caller 0.1 ms) and the caller settles on
 *    running jobs alone, probing the workers now and then; then the caller
 *    made slow instead (0.5 ms a chunk, the workers 0.01 ms) and the pool
 *    goes back to the workers; every job exact throughout. In a job handed
 *    to the workers the caller waits until a worker has taken a chunk
 *    (slow workers) or every chunk (slow caller), so the costs do not
 *    depend on who the scheduler ran first;
 *  - the classes of jobs, on the same clock: a GEMV-like job after a
 *    prefill of GEMM-like ones with the same work hint runs alone only in
 *    its probes when given its own shape (li_threadpool_run_shaped), and
 *    goes alone in one class with them (the mix-up the shapes prevent);
 *    one job 100x slow among fast ones (a worker held for a time slice)
 *    does not send the next ones alone;
 *  - signals: workers (the pool's, li_run_workers') block SIGINT and
 *    SIGTERM and the caller's own mask is as it was, so a signal sent to the
 *    process reaches the main thread (a Ctrl-C at the REPL's prompt, which
 *    libedit re-raises with kill(0, SIGINT), went to a worker and the
 *    prompt's read() never returned). */
#define _GNU_SOURCE
#include "cpu/threadpool.h"
#include "test_util.h"
#include "util/common.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNKS 1000
#define MAX_THREADS 8

typedef struct {
    int n_chunks;
    atomic_int next;
    atomic_int hits[MAX_CHUNKS];
    atomic_int in_use[MAX_THREADS]; /* threads inside the job per ith */
    atomic_int bad_ith, by_worker;
    float out[MAX_CHUNKS];
    bool stall;                     /* the first chunk a worker takes stalls (hold_stalled_chunk) */
    atomic_int stalled;
    double worker_cost, caller_cost; /* test-clock seconds per chunk by workers / by the caller */
    atomic_int by_caller;
    /* wait_worker: when the job was handed to the workers (tp's solo count
     * still solo_before as the caller enters), the caller takes no chunk
     * until a worker has taken one */
    bool wait_worker, wait_all;     /* wait_all: until the workers have taken every chunk */
    li_threadpool *tp;
    long solo_before;
    atomic_int worker_in;
    atomic_int caller_tid, caller_done;
    double t_before;                /* just before li_threadpool_run */
} job;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The scheduler state letter of thread tid of this process ('R', 'S', ...),
 * or 0 when /proc cannot tell. */
static char thread_state(int tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    return p && p[1] == ' ' ? p[2] : 0;
}

/* A worker's stalled chunk: held until the caller has left its share and
 * sleeps in run() waiting for this worker (so run() has read its clock
 * after the caller's share), then for twice the time since the job began
 * plus 20 ms. The pool's wait thus outlasts the caller's share by more than
 * its slack however long the scheduler kept anyone off the CPU. The waits
 * for the caller are bounded (5 s each) only so that a broken pool fails
 * the checks instead of hanging. */
static void hold_stalled_chunk(job *j) {
    const double t_guard = wall();
    while (!atomic_load(&j->caller_done) && wall() - t_guard < 5) sleep_s(1e-4);
    const int tid = atomic_load(&j->caller_tid);
    while (thread_state(tid) != 'S' && wall() - t_guard < 10) sleep_s(1e-4);
    sleep_s(2 * (wall() - j->t_before) + 20e-3);
}

/* An order-sensitive reduction: any change in how a chunk is summed shows. */
static float chunk_value(int c) {
    float acc = 0;
    for (int i = 0; i < 200; i++) acc += sinf((float)(c * 200 + i) * 0.37f) / (float)(i + 1);
    return acc;
}

static void work(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (ith < 0 || ith >= nth || ith >= MAX_THREADS || atomic_fetch_add(&j->in_use[ith], 1) != 0)
        atomic_fetch_add(&j->bad_ith, 1);
    if (ith == 0 && j->wait_worker) {
        atomic_store(&j->caller_tid, (int)syscall(SYS_gettid));
        long stalls, solo;
        li_threadpool_stats(j->tp, &stalls, &solo);
        const double t_guard = wall();
        if (solo == j->solo_before)
            while ((j->wait_all ? atomic_load(&j->next) < j->n_chunks : !atomic_load(&j->worker_in)) &&
                   wall() - t_guard < 10)
                sleep_s(1e-4);
    }
    for (;;) {
        const int c = atomic_fetch_add(&j->next, 1);
        if (c >= j->n_chunks) break;
        if (ith > 0) atomic_store(&j->worker_in, 1);
        if (ith > 0 && j->stall && atomic_exchange(&j->stalled, 1) == 0) hold_stalled_chunk(j);
        j->out[c] = chunk_value(c);
        atomic_fetch_add(&j->hits[c], 1);
        atomic_fetch_add(ith > 0 ? &j->by_worker : &j->by_caller, 1);
    }
    if (ith >= 0 && ith < MAX_THREADS) atomic_fetch_sub(&j->in_use[ith], 1);
    if (ith == 0) atomic_store(&j->caller_done, 1);
}

static float serial[MAX_CHUNKS];

static void job_reset(job *j, int n_chunks) {
    memset(j, 0, sizeof *j);
    j->n_chunks = n_chunks;
}

/* Every chunk once, right values, unique ith. */
static bool job_ok(const job *j) {
    bool ok = atomic_load(&j->bad_ith) == 0;
    for (int c = 0; c < j->n_chunks; c++)
        ok &= atomic_load(&j->hits[c]) == 1 && memcmp(&j->out[c], &serial[c], sizeof(float)) == 0;
    return ok;
}

static void test_sizes(void) {
    static const int chunks[] = {0, 1, 2, 3, 5, 7, 64, 1000};
    job *j = calloc(1, sizeof *j);
    for (int size = 1; size <= 5; size++) {
        li_threadpool *tp = li_threadpool_init(size);
        CHECK(tp && li_threadpool_size(tp) == size, "a pool of %d", size);
        if (!tp) continue;
        int bad = 0, jobs = 0;
        for (int nth = 1; nth <= size + 1; nth++) /* nth > size is capped */
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++)
                for (int rep = 0; rep < 20; rep++, jobs++) {
                    job_reset(j, chunks[k]);
                    li_threadpool_run(tp, work, j, nth);
                    if (!job_ok(j) && bad++ < 3)
                        fprintf(stderr, "pool %d, nth %d, %d chunks: a chunk missed, repeated or wrong\n", size, nth,
                                chunks[k]);
                }
        CHECK(bad == 0, "pool of %d: %d of %d jobs wrong", size, bad, jobs);
        li_threadpool_free(tp);
    }
    free(j);
}

/* One job of 200 chunks on tp, the caller waiting for a worker when the
 * job goes to the workers; returns whether it ran alone (the solo count
 * moved), and ANDs its exactness into *ok. */
static bool run_waiting(li_threadpool *tp, job *j, bool stall, bool *ok) {
    long stalls, solo;
    li_threadpool_stats(tp, &stalls, &solo);
    job_reset(j, 200);
    j->stall = stall;
    j->wait_worker = true;
    j->tp = tp;
    j->solo_before = solo;
    j->t_before = wall();
    li_threadpool_run(tp, work, j, 3);
    *ok &= job_ok(j); /* a stalled chunk is written when run returns */
    long s2, o2;
    li_threadpool_stats(tp, &s2, &o2);
    return o2 > solo;
}

static void test_stall(void) {
    job *j = calloc(1, sizeof *j);
    li_threadpool *tp = li_threadpool_init(3); /* fresh: its first job goes to the workers */
    bool ok = true;
    const bool first_solo = run_waiting(tp, j, true, &ok);
    long stalls, solo;
    li_threadpool_stats(tp, &stalls, &solo);
    CHECK(!first_solo && atomic_load(&j->stalled), "a fresh pool hands its first job to the workers");
    CHECK(stalls == 1, "a worker stalled mid-chunk is counted (%ld stalls)", stalls);
    /* a stall, and alone not measured yet for this job: the next job probes it */
    const bool next_solo = run_waiting(tp, j, false, &ok);
    CHECK(next_solo && atomic_load(&j->by_worker) == 0, "after a stall the caller runs the next job alone");
    /* probes of the workers come at most 1 s apart (wall), so within a few
     * jobs 0.25 s apart one goes to the workers; the bound (10 s of sleeps)
     * is for a pool that never hands them a job again */
    int n = 0, by_worker = 0;
    while (n++ < 40 && by_worker == 0) {
        sleep_s(0.25);
        if (!run_waiting(tp, j, false, &ok)) by_worker = atomic_load(&j->by_worker);
    }
    CHECK(by_worker > 0, "a later job goes to the workers again (job %d after the stall, %d chunks by workers)", n,
          by_worker);
    CHECK(ok, "jobs with a stalled worker, and those after it, are complete and exact");
    li_threadpool_free(tp);
    free(j);
}

static void test_back_to_back(void) {
    job *j = calloc(1, sizeof *j);
    li_threadpool *tp = li_threadpool_init(4);
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        job_reset(j, 1 + i % 9);
        li_threadpool_run(tp, work, j, 2 + i % 3);
        bad += !job_ok(j);
    }
    CHECK(bad == 0, "20000 back-to-back jobs: %d wrong", bad);
    li_threadpool_free(tp);
    free(j);
}

/* The test's clock: it moves only as jobs "cost", by the busier side of
 * the job running now (the pool reads it before and after each job). */
typedef struct {
    double base;
    job *cur;
} test_clock;

static double job_cost(const job *j) {
    const double caller = j->caller_cost * atomic_load(&j->by_caller);
    const double workers = j->worker_cost * atomic_load(&j->by_worker);
    return caller > workers ? caller : workers;
}

static double clock_read(void *arg) {
    test_clock *tc = arg;
    return tc->base + (tc->cur ? job_cost(tc->cur) : 0);
}

/* n jobs of `chunks` chunks at the given test-clock costs; returns how many
 * ran alone, and ANDs their exactness into *ok. */
static long run_jobs_shaped(li_threadpool *tp, test_clock *tc, job *j, int n, int chunks, double worker_cost,
                            double caller_cost, bool wait_all, int shape, bool *ok) {
    long stalls, solo0, solo1;
    li_threadpool_stats(tp, &stalls, &solo0);
    for (int i = 0; i < n; i++) {
        long s, before;
        li_threadpool_stats(tp, &s, &before);
        job_reset(j, chunks);
        j->worker_cost = worker_cost;
        j->caller_cost = caller_cost;
        j->wait_worker = true;
        j->wait_all = wait_all;
        j->tp = tp;
        j->solo_before = before;
        tc->cur = j;
        li_threadpool_run_shaped(tp, work, j, 2, chunks, shape);
        tc->base += job_cost(j);
        tc->cur = NULL;
        *ok &= job_ok(j);
    }
    li_threadpool_stats(tp, &stalls, &solo1);
    return solo1 - solo0;
}

static long run_jobs(li_threadpool *tp, test_clock *tc, job *j, int n, int chunks, double worker_cost,
                     double caller_cost, bool wait_all, bool *ok) {
    return run_jobs_shaped(tp, tc, j, n, chunks, worker_cost, caller_cost, wait_all, 0, ok);
}

/* A prefill of GEMM-like jobs (with the workers 0.2 ms, alone 0.38 ms),
 * then 400 decode steps of one GEMV-like job with the same work hint (1 ms,
 * alone 1.4 ms: memory-bound) and four others (0.25 ms, alone 0.3 ms):
 * the workers win every job. The GEMV's shape given (shapes 1, 2), it
 * runs alone only in its probes; both in one class (shape 0), the GEMV is
 * timed alone at the GEMM's cost per unit and goes alone. Returns the
 * GEMV jobs run alone (measured: 0 shaped, 16 mixed). */
static long decode_after_prefill(int gemv_shape, int gemm_shape, bool *ok) {
    job *j = calloc(1, sizeof *j);
    li_threadpool *tp = li_threadpool_init(2);
    test_clock tc = {0};
    li_threadpool_set_clock(tp, clock_read, &tc);
    run_jobs_shaped(tp, &tc, j, 2000, 10, 2e-5, 3.8e-5, true, gemm_shape, ok);
    long alone = 0;
    for (int step = 0; step < 400; step++) {
        alone += run_jobs_shaped(tp, &tc, j, 1, 10, 1e-4, 1.4e-4, true, gemv_shape, ok);
        run_jobs_shaped(tp, &tc, j, 4, 10, 2.5e-5, 3e-5, true, 3, ok);
    }
    li_threadpool_free(tp);
    free(j);
    return alone;
}

/* Jobs the workers win (0.2 ms, alone 0.4 ms) until both modes are timed,
 * then one job whose worker is held 20 ms (a host's time slice), then 500
 * more: the one slow job must not send them alone (a sample counts for at
 * most CLIP x its class's estimate). Returns the 500's jobs run alone
 * (measured: 3; 83 without the clip). */
static long one_stall(bool *ok) {
    job *j = calloc(1, sizeof *j);
    li_threadpool *tp = li_threadpool_init(2);
    test_clock tc = {0};
    li_threadpool_set_clock(tp, clock_read, &tc);
    run_jobs(tp, &tc, j, 2000, 10, 2e-5, 4e-5, true, ok); /* 0.4 s: probes have timed alone */
    run_jobs(tp, &tc, j, 1, 10, 2e-3, 4e-5, true, ok);
    const long alone = run_jobs(tp, &tc, j, 500, 10, 2e-5, 4e-5, true, ok);
    li_threadpool_free(tp);
    free(j);
    return alone;
}

static void test_shapes(void) {
    bool ok = true;
    const long shaped = decode_after_prefill(1, 2, &ok), mixed = decode_after_prefill(0, 0, &ok);
    CHECK(shaped <= 10, "GEMV and GEMM shapes apart: %ld of 400 GEMV jobs ran alone (probes only)", shaped);
    CHECK(mixed >= 12, "the same jobs in one class: %ld of 400 GEMV jobs ran alone (the mix-up shapes keep apart)",
          mixed);
    const long after_stall = one_stall(&ok);
    CHECK(after_stall <= 25, "one job 100x slow (a time slice): %ld of the next 500 ran alone (probes only)",
          after_stall);
    CHECK(ok, "every job exact whichever way it ran");
}

static void test_adaptive(void) {
    job *j = calloc(1, sizeof *j);
    li_threadpool *tp = li_threadpool_init(2);
    test_clock tc = {0};
    li_threadpool_set_clock(tp, clock_read, &tc);
    bool ok = true;
    long switches, probes, solo;
    int solo_mode = 0, n = 0;
    /* slow workers: a job handed to them costs >= 10 ms, alone 1 ms; the
     * caller must settle on alone (bounds in jobs, not seconds: a probe
     * comes within 1 s of the test clock) */
    do {
        run_jobs(tp, &tc, j, 1, 10, 10e-3, 1e-4, false, &ok);
        li_threadpool_mode_stats(tp, &switches, &probes, &solo_mode);
    } while (!solo_mode && ++n < 2000);
    CHECK(solo_mode, "slow workers: the caller runs jobs alone (%ld probes, %ld switches, %d jobs)", probes, switches,
          n);
    solo = run_jobs(tp, &tc, j, 100, 10, 10e-3, 1e-4, false, &ok);
    li_threadpool_mode_stats(tp, &switches, &probes, &solo_mode);
    CHECK(solo >= 95 && solo_mode, "slow workers: %ld of the next 100 jobs ran alone (%ld probes, %ld switches)",
          solo, probes, switches);
    /* a slow caller: alone 10 ms a job, with the workers 0.2 ms; a probe of
     * the workers (<= 1 s of the test clock, <= 100 jobs alone) wins */
    n = 0;
    do {
        run_jobs(tp, &tc, j, 1, 20, 1e-5, 5e-4, true, &ok);
        li_threadpool_mode_stats(tp, &switches, &probes, &solo_mode);
    } while (solo_mode && ++n < 2000);
    CHECK(!solo_mode, "slow caller: back to the workers (%ld probes, %ld switches, %d jobs)", probes, switches, n);
    solo = run_jobs(tp, &tc, j, 100, 20, 1e-5, 5e-4, true, &ok);
    CHECK(solo <= 5, "slow caller: %ld of the next 100 jobs ran alone", solo);
    CHECK(ok, "every job exact whichever way it ran");
    li_threadpool_free(tp);
    free(j);
}

/* Which threads ran a chunk, and whether SIGINT / SIGTERM were blocked there. */
typedef struct {
    pthread_t caller;
    atomic_int worker_chunks, worker_unblocked, caller_chunks, caller_blocked;
} mask_job;

static bool signals_blocked(void) {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    return sigismember(&cur, SIGINT) && sigismember(&cur, SIGTERM);
}

static void mask_chunk(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    mask_job *m = ctx;
    if (!pthread_equal(pthread_self(), m->caller)) {
        atomic_fetch_add(&m->worker_chunks, 1);
        if (!signals_blocked()) atomic_fetch_add(&m->worker_unblocked, 1);
        return;
    }
    atomic_fetch_add(&m->caller_chunks, 1);
    if (signals_blocked()) atomic_fetch_add(&m->caller_blocked, 1);
    /* the caller waits (10 s at most) until a worker has run a chunk, so the
     * workers' masks are seen whatever the scheduler does */
    for (int i = 0; i < 100000 && !atomic_load(&m->worker_chunks); i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static void *mask_worker(void *ctx) {
    mask_job *m = ctx;
    mask_chunk(m, 0, 1);
    return NULL;
}

static void test_signal_masks(void) {
    CHECK(!signals_blocked(), "the test starts with SIGINT and SIGTERM deliverable");
    li_threadpool *tp = li_threadpool_init(3); /* fresh: its first job goes to the workers */
    mask_job m = {.caller = pthread_self()};
    li_threadpool_run(tp, mask_chunk, &m, 3);
    CHECK(atomic_load(&m.worker_chunks) >= 1, "a worker ran a chunk (%d)", atomic_load(&m.worker_chunks));
    CHECK(atomic_load(&m.worker_unblocked) == 0, "the pool's workers block SIGINT and SIGTERM (%d did not)",
          atomic_load(&m.worker_unblocked));
    CHECK(atomic_load(&m.caller_blocked) == 0, "the caller's mask is unchanged");
    li_threadpool_free(tp);

    mask_job w = {.caller = pthread_self()};
    li_run_workers(mask_worker, &w, 3);
    CHECK(atomic_load(&w.worker_chunks) == 2 && atomic_load(&w.caller_chunks) == 1,
          "li_run_workers: 2 threads and the caller (%d, %d)", atomic_load(&w.worker_chunks),
          atomic_load(&w.caller_chunks));
    CHECK(atomic_load(&w.worker_unblocked) == 0, "li_run_workers' threads block SIGINT and SIGTERM");
    CHECK(!signals_blocked(), "the caller's mask is unchanged after both");
}

int main(void) {
    for (int c = 0; c < MAX_CHUNKS; c++) serial[c] = chunk_value(c);
    test_sizes();
    test_stall();
    test_back_to_back();
    test_adaptive();
    test_shapes();
    test_signal_masks();
    return t_summary("test_threadpool");
}
