/* runner.h — one model's share of the engine: the model, the backend it
 * runs on, its forward state and its KV storage.
 *
 * The engine holds a target runner and optionally a draft runner (another
 * GGUF with the same vocabulary). The target's KV cache is the block pool:
 * refcounts, free list, prefix hashes. The draft's is storage that follows
 * the pool (li_kv_cache_init_follower): the same block ids, so a request's
 * one block table addresses its KV in both, and forks, copy-on-write,
 * preemption, release and prefix-cache hits apply to both at once. The
 * draft's KV is lazy: the speculation step computes a request's missing
 * positions (same tokens, positions and slots as the target's) just before
 * the request drafts with it, so a draft nobody uses costs nothing. */
#ifndef LI_RUNNER_H
#define LI_RUNNER_H

#include "kv/kv_cache.h"
#include "model/forward.h"

typedef struct li_runner {
    li_model *model;       /* not owned */
    li_backend *be;        /* not owned; runs the forward pass, owns the KV bytes */
    li_forward fw;
    li_kv_cache kv;        /* target: the pool and its storage; draft: a follower of the target's */
    float *logits;         /* (n_logits, n_vocab) host view of the last run's logits, or NULL */
} li_runner;

/* A runner with its own block pool of num_blocks blocks (pool == NULL), or
 * with storage following pool's blocks (num_blocks, dtype and block_size
 * then come from pool). cap: tokens per forward pass. */
int li_runner_init(li_runner *r, li_model *m, li_backend *be, li_kv_cache *pool, li_type kv_dtype,
                   int block_size, int32_t num_blocks, int64_t cap, li_error *err);
/* A follower is freed before its pool's runner. */
void li_runner_free(li_runner *r);
/* KV bytes per token of m's layers in dtype. */
size_t li_runner_kv_bytes_per_token(const li_model *m, li_type kv_dtype);
/* Runs the batch on the runner's model over its KV storage; r->logits then
 * holds the (b->n_logits, n_vocab) logits (NULL if none were asked), or,
 * when they are device memory, NULL until li_runner_logits copies them
 * back (a step sampled on the device never does). */
int li_runner_run(li_runner *r, const li_batch *b, li_error *err);
/* r->logits, copied back from the device first if need be */
float *li_runner_logits(li_runner *r);
/* One row of them (li_forward_logits_row): r->logits' when it is there */
const float *li_runner_logits_row(li_runner *r, int64_t row);

#endif
