/* comm.h — collectives between the ranks of a tensor-parallel group.
 *
 * A rank is one shard of the model on one backend; the ranks of a group run
 * the same forward pass on the same batch, each over its slice of the
 * weights (docs/parallel.md), and meet twice per layer in all_reduce_sum.
 * Two implementations sit behind one vtable:
 *
 *  - threads (comm_threads.c): N ranks are N threads of one process sharing
 *    a li_comm_group. all_reduce_sum adds the ranks' buffers element by
 *    element in a FIXED order, ((b0 + b1) + b2) + ... + b(N-1), and writes
 *    that one sum into every rank's buffer: the result is deterministic (the
 *    same bits run after run) and identical on every rank, so every rank
 *    keeps the same residual stream and computes the same logits. This is
 *    what runs the sharded forward pass in CI.
 *  - NCCL (comm_nccl.c over kernels/cuda/comm_nccl.cu; built with LI_CUDA
 *    where NCCL is found, LI_HAVE_NCCL): one ncclComm per rank, buffers in
 *    device memory, ncclAllReduce(ncclSum). NCCL picks its own reduction
 *    order (ring or tree): results are identical across ranks but need not
 *    match the threads' order bit for bit.
 *
 * Every collective must be entered by every rank of the group, in the same
 * order. A rank that fails before a collective calls li_comm_abort: the
 * others' pending and later collectives return LI_EIO instead of waiting
 * forever (the threads group; NCCL has ncclCommAbort for the same). */
#ifndef LI_COMM_H
#define LI_COMM_H

#include "util/common.h"

typedef struct li_comm li_comm;

typedef struct li_comm_ops {
    const char *name; /* "threads", "nccl" */
    /* buf(n) = the sum over ranks of every rank's buf(n), in the rank's
     * backend memory (host for threads, device for NCCL) */
    int (*all_reduce_sum)(li_comm *c, float *buf, int64_t n, li_error *err);
    /* returns when every rank has entered it */
    int (*barrier)(li_comm *c, li_error *err);
    /* makes every pending and later collective of the group fail (LI_EIO) */
    void (*abort)(li_comm *c);
    void (*free)(li_comm *c);
} li_comm_ops;

struct li_comm {
    const li_comm_ops *ops;
    int rank, size; /* 0 <= rank < size */
    void *impl;
};

static inline int li_comm_all_reduce_sum(li_comm *c, float *buf, int64_t n, li_error *err) {
    return c->ops->all_reduce_sum(c, buf, n, err);
}
static inline int li_comm_barrier(li_comm *c, li_error *err) { return c->ops->barrier(c, err); }
static inline void li_comm_abort(li_comm *c) { c->ops->abort(c); }
/* Frees one rank's communicator (a zeroed one is a no-op). */
void li_comm_free(li_comm *c);

/* ---- threads as ranks (comm_threads.c) ---------------------------------- */

/* The state the N ranks' threads share. */
typedef struct li_comm_group li_comm_group;

/* A group of `size` ranks, 1 <= size <= LI_COMM_MAX_RANKS. */
#define LI_COMM_MAX_RANKS 64
int li_comm_group_init(li_comm_group **out, int size, li_error *err);
/* After every rank's li_comm_free. */
void li_comm_group_free(li_comm_group *g);
/* Clears an abort (between steps, when no rank is inside a collective). */
void li_comm_group_reset(li_comm_group *g);
/* Rank `rank`'s communicator over g (g outlives it). */
int li_comm_threads_init(li_comm *c, li_comm_group *g, int rank, li_error *err);

/* ---- NCCL (comm_nccl.c; LI_HAVE_NCCL) ----------------------------------- */

/* ncclUniqueId's bytes: made once (li_comm_nccl_unique_id), given to every
 * rank's li_comm_nccl_init. */
typedef struct li_comm_nccl_id {
    char bytes[128];
} li_comm_nccl_id;

/* Whether this build has NCCL (false: the functions below return LI_EUNSUP). */
bool li_comm_nccl_available(void);
int li_comm_nccl_unique_id(li_comm_nccl_id *id, li_error *err);
/* Rank `rank` of `size` on CUDA device `device`; in one process the ranks'
 * threads call it concurrently (ncclCommInitRank blocks until all have). */
int li_comm_nccl_init(li_comm *c, const li_comm_nccl_id *id, int rank, int size, int device, li_error *err);
/* All `size` ranks of one process at once (ncclCommInitAll, from one
 * thread): *c[r] is rank r on CUDA device devices[r]. */
int li_comm_nccl_init_all(li_comm *const *c, int size, const int *devices, li_error *err);

#endif
