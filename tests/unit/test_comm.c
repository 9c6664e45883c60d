/* test_comm.c — the threads-as-ranks communicator (dist/comm.h).
 *
 * For 1, 2, 3 and 5 ranks (one thread each) and odd lengths (SIMD tails,
 * chunks that leave ranks idle):
 *  - all_reduce_sum leaves in every rank's buffer exactly the fixed-order
 *    float sum b0 + b1 + ... + b(N-1) (checked bit for bit against a serial
 *    sum; inputs of mixed magnitudes, so that another order would differ,
 *    which the test also confirms), the same bits on every rank and on a
 *    second run;
 *  - barrier: no rank leaves round k before every rank has entered it;
 *  - an abort by one rank makes the others' collectives fail instead of
 *    hanging; lengths that differ between ranks are an error on every rank;
 *  - bad group sizes and ranks are refused. */
#include "dist/comm.h"
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

enum { MAX_N = 4099, ROUNDS = 3 };

typedef struct {
    li_comm comm;
    float *buf;       /* (n) this rank's buffer */
    int64_t n;
    int rc;
    int mode;         /* 0 all-reduce, 1 barrier rounds, 2 abort, 3 length mismatch */
    atomic_int *counter;
    int barrier_bad;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    li_error err = {0};
    switch (a->mode) {
    case 0: a->rc = li_comm_all_reduce_sum(&a->comm, a->buf, a->n, &err); break;
    case 1:
        for (int k = 0; k < ROUNDS; k++) {
            atomic_fetch_add(a->counter, 1);
            if ((a->rc = li_comm_barrier(&a->comm, &err))) break;
            /* every rank has counted round k */
            if (atomic_load(a->counter) < (k + 1) * a->comm.size) a->barrier_bad++;
            if ((a->rc = li_comm_barrier(&a->comm, &err))) break;
        }
        break;
    case 2:
        if (a->comm.rank == a->comm.size - 1) li_comm_abort(&a->comm); /* fails before the collective */
        else a->rc = li_comm_all_reduce_sum(&a->comm, a->buf, a->n, &err);
        break;
    case 3: a->rc = li_comm_all_reduce_sum(&a->comm, a->buf, a->n - a->comm.rank, &err); break;
    }
    return NULL;
}

/* Runs `mode` on N rank threads over g; bufs[r] is rank r's buffer. */
static void run_ranks(li_comm_group *g, int N, int mode, float **bufs, int64_t n, rank_arg *args) {
    pthread_t th[LI_COMM_MAX_RANKS];
    atomic_int counter = 0;
    li_comm_group_reset(g);
    for (int r = 0; r < N; r++) {
        li_error err = {0};
        memset(&args[r], 0, sizeof args[r]);
        CHECK(li_comm_threads_init(&args[r].comm, g, r, &err) == 0, "%s", err.msg);
        args[r].buf = bufs ? bufs[r] : NULL;
        args[r].n = n;
        args[r].mode = mode;
        args[r].counter = &counter;
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++) li_comm_free(&args[r].comm);
}

static float mixed(void) {
    /* magnitudes from 1e-3 to 1e3: float addition is far from associative */
    const float e = (float)(rng_u32() % 7) - 3.0f;
    return rng_f() * powf(10.0f, e);
}

static void test_all_reduce(int N, int64_t n) {
    li_comm_group *g = NULL;
    li_error err = {0};
    CHECK(li_comm_group_init(&g, N, &err) == 0, "%s", err.msg);
    float *in[LI_COMM_MAX_RANKS], *out[LI_COMM_MAX_RANKS], *again[LI_COMM_MAX_RANKS];
    for (int r = 0; r < N; r++) {
        in[r] = malloc((size_t)n * sizeof(float));
        out[r] = malloc((size_t)n * sizeof(float));
        again[r] = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) in[r][i] = mixed();
        memcpy(out[r], in[r], (size_t)n * sizeof(float));
        memcpy(again[r], in[r], (size_t)n * sizeof(float));
    }
    rank_arg args[LI_COMM_MAX_RANKS];
    run_ranks(g, N, 0, out, n, args);
    for (int r = 0; r < N; r++) CHECK(args[r].rc == 0, "ranks %d n %lld: rank %d failed", N, (long long)n, r);
    run_ranks(g, N, 0, again, n, args);
    int64_t wrong = 0, differ = 0, unlike_run = 0, reorder_differs = 0;
    for (int64_t i = 0; i < n; i++) {
        float s = in[0][i], rev = in[N - 1][i];
        for (int j = 1; j < N; j++) s += in[j][i];
        for (int j = N - 2; j >= 0; j--) rev += in[j][i];
        reorder_differs += memcmp(&s, &rev, sizeof s) != 0;
        for (int r = 0; r < N; r++) {
            wrong += memcmp(&out[r][i], &s, sizeof s) != 0;
            differ += memcmp(&out[r][i], &out[0][i], sizeof s) != 0;
            unlike_run += memcmp(&again[r][i], &out[r][i], sizeof s) != 0;
        }
    }
    report(wrong == 0 && differ == 0 && unlike_run == 0,
           "all_reduce %d ranks, n %lld: fixed-order sum on every rank (%lld wrong, %lld unlike rank 0, %lld unlike "
           "the first run)",
           N, (long long)n, (long long)wrong, (long long)differ, (long long)unlike_run);
    /* the order is observable: reversed, some sums change (else the check above proves nothing) */
    if (N >= 3 && n >= 1000)
        report(reorder_differs > 0, "  %d ranks: %lld of %lld sums change when added in reverse order", N,
               (long long)reorder_differs, (long long)n);
    for (int r = 0; r < N; r++) free(in[r]), free(out[r]), free(again[r]);
    li_comm_group_free(g);
}

static void test_barrier_abort(int N) {
    li_comm_group *g = NULL;
    li_error err = {0};
    CHECK(li_comm_group_init(&g, N, &err) == 0, "%s", err.msg);
    rank_arg args[LI_COMM_MAX_RANKS];
    run_ranks(g, N, 1, NULL, 0, args);
    int bad = 0, failed = 0;
    for (int r = 0; r < N; r++) bad += args[r].barrier_bad, failed += args[r].rc != 0;
    report(bad == 0 && failed == 0, "barrier %d ranks x %d rounds: nobody passed early (%d early, %d failed)", N,
           ROUNDS, bad, failed);
    if (N >= 2) {
        float *bufs[LI_COMM_MAX_RANKS];
        for (int r = 0; r < N; r++) bufs[r] = calloc(64, sizeof(float));
        run_ranks(g, N, 2, bufs, 64, args);
        int eio = 0;
        for (int r = 0; r < N - 1; r++) eio += args[r].rc == LI_EIO;
        report(eio == N - 1, "abort by rank %d: the other %d ranks' all_reduce returned LI_EIO (%d did)", N - 1, N - 1,
               eio);
        run_ranks(g, N, 3, bufs, 64, args);
        int einval = 0;
        for (int r = 0; r < N; r++) einval += args[r].rc == LI_EINVAL;
        report(einval == N, "lengths that differ: every rank's all_reduce fails (%d of %d)", einval, N);
        /* and the group still works after a reset */
        run_ranks(g, N, 0, bufs, 64, args);
        int ok = 0;
        for (int r = 0; r < N; r++) ok += args[r].rc == 0;
        report(ok == N, "after reset: all_reduce works again (%d of %d)", ok, N);
        for (int r = 0; r < N; r++) free(bufs[r]);
    }
    li_comm_group_free(g);
}

static void test_errors(void) {
    li_comm_group *g = NULL;
    li_error err = {0};
    report(li_comm_group_init(&g, 0, &err) == LI_EINVAL && !g, "a group of 0 ranks is refused: %s", err.msg);
    report(li_comm_group_init(&g, LI_COMM_MAX_RANKS + 1, &err) == LI_EINVAL, "a group of %d ranks is refused",
           LI_COMM_MAX_RANKS + 1);
    CHECK(li_comm_group_init(&g, 2, &err) == 0, "%s", err.msg);
    li_comm c;
    report(li_comm_threads_init(&c, g, 2, &err) == LI_EINVAL, "rank 2 of 2 is refused: %s", err.msg);
    report(li_comm_threads_init(&c, g, -1, &err) == LI_EINVAL, "rank -1 is refused");
    li_comm_group_free(g);
    li_comm_nccl_id id;
    const int rc = li_comm_nccl_unique_id(&id, &err);
    if (li_comm_nccl_available()) printf("note: NCCL is built in (test_comm_nccl runs it where a GPU is)\n");
    else report(rc == LI_EUNSUP, "without NCCL in the build, its entry says so: %s", err.msg);
}

int main(void) {
    static const int ranks[] = {1, 2, 3, 5};
    static const int64_t lens[] = {1, 7, 33, 255, 1001, MAX_N};
    for (size_t a = 0; a < LI_ARRAY_LEN(ranks); a++)
        for (size_t b = 0; b < LI_ARRAY_LEN(lens); b++) test_all_reduce(ranks[a], lens[b]);
    for (size_t a = 0; a < LI_ARRAY_LEN(ranks); a++) test_barrier_abort(ranks[a]);
    test_errors();
    return t_summary("test_comm");
}
