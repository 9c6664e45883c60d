/* comm_threads.c — threads as ranks: the N ranks of a group are N threads
 * of one process (comm.h). Owns: li_comm_group.
 *
 * all_reduce_sum in two barriers: every rank posts its buffer's address;
 * then rank r sums chunk r of the buffers, b0[i] + b1[i] + ... + b(N-1)[i]
 * in rank order, and writes the sum into chunk r of every buffer. Chunks
 * are disjoint, so no rank reads what another writes; the second barrier
 * keeps every buffer (and every posted address) alive until all chunks are
 * written. Who sums a chunk changes nothing: each element's order is fixed. */
#include "dist/comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct li_comm_group {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;          /* ranks in the current barrier */
    uint64_t generation;  /* bumped as each barrier opens */
    bool aborted;
    float *bufs[LI_COMM_MAX_RANKS]; /* the current all-reduce's buffers, by rank */
    int64_t n;                      /* and their length (rank 0's) */
    int64_t ns[LI_COMM_MAX_RANKS];  /* each rank's length: must agree */
};

int li_comm_group_init(li_comm_group **out, int size, li_error *err) {
    *out = NULL;
    if (size < 1 || size > LI_COMM_MAX_RANKS)
        return li_error_set(err, LI_EINVAL, "comm: a group of %d ranks (1 to %d)", size, LI_COMM_MAX_RANKS);
    li_comm_group *g = li_xcalloc(1, sizeof *g);
    g->size = size;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return 0;
}

void li_comm_group_free(li_comm_group *g) {
    if (!g) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void li_comm_group_reset(li_comm_group *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = false;
    g->arrived = 0;
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------------
 * the barrier: a generation count under one mutex, broken by an abort
 * ---------------------------------------------------------------------- */

static int group_wait(li_comm_group *g, li_error *err) {
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) {
        const uint64_t gen = g->generation;
        if (++g->arrived == g->size) {
            g->arrived = 0;
            g->generation++;
            pthread_cond_broadcast(&g->cv);
        } else {
            while (gen == g->generation && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        }
    }
    const bool aborted = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return aborted ? li_error_set(err, LI_EIO, "comm: the group was aborted (another rank failed)") : 0;
}

static void group_abort(li_comm_group *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------------
 * the vtable
 * ---------------------------------------------------------------------- */

/* chunks of whole cache lines: ranks write disjoint lines */
#define CHUNK_ALIGN 16

static int threads_all_reduce(li_comm *c, float *buf, int64_t n, li_error *err) {
    li_comm_group *g = c->impl;
    const int N = g->size, r = c->rank;
    if (n < 0) return li_error_set(err, LI_EINVAL, "comm: all_reduce of %lld elements", (long long)n);
    if (N == 1) return 0;
    g->bufs[r] = buf;
    g->ns[r] = n;
    int rc = group_wait(g, err);
    if (rc) return rc;
    for (int j = 0; j < N; j++)
        if (g->ns[j] != g->ns[0]) {
            /* every rank sees the same mismatch and fails the same way */
            group_wait(g, NULL);
            return li_error_set(err, LI_EINVAL, "comm: all_reduce lengths differ (rank %d: %lld, rank 0: %lld)", j,
                                (long long)g->ns[j], (long long)g->ns[0]);
        }
    const int64_t per = ((n + N - 1) / N + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
    const int64_t i0 = LI_MIN(n, (int64_t)r * per), i1 = LI_MIN(n, i0 + per);
    float *const *b = g->bufs;
    for (int64_t i = i0; i < i1; i++) {
        float s = b[0][i];
        for (int j = 1; j < N; j++) s += b[j][i];
        for (int j = 0; j < N; j++) b[j][i] = s;
    }
    return group_wait(g, err);
}

static int threads_barrier(li_comm *c, li_error *err) { return group_wait(c->impl, err); }

static void threads_abort(li_comm *c) { group_abort(c->impl); }

static void threads_free(li_comm *c) { (void)c; }

static const li_comm_ops threads_ops = {
    .name = "threads",
    .all_reduce_sum = threads_all_reduce,
    .barrier = threads_barrier,
    .abort = threads_abort,
    .free = threads_free,
};

int li_comm_threads_init(li_comm *c, li_comm_group *g, int rank, li_error *err) {
    memset(c, 0, sizeof *c);
    if (!g) return li_error_set(err, LI_EINVAL, "comm: no group");
    if (rank < 0 || rank >= g->size)
        return li_error_set(err, LI_EINVAL, "comm: rank %d outside a group of %d", rank, g->size);
    c->ops = &threads_ops;
    c->rank = rank;
    c->size = g->size;
    c->impl = g;
    return 0;
}

void li_comm_free(li_comm *c) {
    if (c->ops && c->ops->free) c->ops->free(c);
    memset(c, 0, sizeof *c);
}
