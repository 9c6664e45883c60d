/* tp.h — a tensor-parallel target: one runner per rank (docs/parallel.md).
 *
 * Rank r holds the model's shard r (dist/shard.h) prepared on a CPU backend
 * of its own (its own threads: the engine's backend's thread count split
 * over the ranks, at least one each), a forward state whose communicator
 * is rank r of a threads-as-ranks group (dist/comm.h), and KV storage for
 * its KV heads only. On cuda (the engine's backend on cuda:D), rank r is
 * a CUDA backend on device D + r and the communicators are NCCL's, made
 * together (li_comm_nccl_init_all). Rank 0's runner is the engine's target runner: its KV
 * cache is the block pool; the other ranks' caches follow it
 * (li_kv_cache_init_follower), so the engine's one block table and slot
 * numbering address every rank's storage, and forks, copy-on-write,
 * preemption and prefix-cache hits apply to all at once.
 *
 * li_tp_run runs one flat batch on every rank at once: rank 0 on the
 * calling thread, the others on a thread each, parked between steps. Only
 * rank 0 computes logits (the residual stream is the same bits on every
 * rank after each all-reduce, so its logits are every rank's). */
#ifndef LI_TP_H
#define LI_TP_H

#include "engine/runner.h"

typedef struct li_tp li_tp;

/* size >= 2 ranks over m (li_shard_plan's errors for a split m cannot
 * take); `like` is the CPU backend whose ISA and threads the ranks share
 * (LI_EUNSUP for another backend). rank0 receives the target runner (the
 * pool: num_blocks of block_size in kv_dtype). cap: tokens per pass. */
int li_tp_init(li_tp **out, li_model *m, const li_backend *like, int size, li_runner *rank0, li_type kv_dtype,
               int block_size, int32_t num_blocks, int64_t cap, li_error *err);
/* Frees every rank, rank 0's runner (given to li_tp_init) last. */
void li_tp_free(li_tp *tp);
/* The batch on every rank; rank0->logits then holds the logits. */
int li_tp_run(li_tp *tp, const li_batch *b, li_error *err);
int li_tp_size(const li_tp *tp);
/* KV bytes of every rank's storage together. */
size_t li_tp_kv_bytes(const li_tp *tp);
/* Seconds rank 0 spent inside all-reduces so far (a step's share of
 * time_forward that is communication and waiting for the slowest rank). */
double li_tp_comm_time(const li_tp *tp);
/* Tests: every rank computes the logits too (li_tp_rank_logits). */
void li_tp_set_all_logits(li_tp *tp, bool on);
/* Rank r's (n_logits, n_vocab) logits of the last run, or NULL. */
const float *li_tp_rank_logits(const li_tp *tp, int r);

#endif
