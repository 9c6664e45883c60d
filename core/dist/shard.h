/* shard.h — a model cut into tensor-parallel shards (docs/parallel.md).
 *
 * Rank r of N holds a contiguous run of KV heads (the query heads that
 * share them come along) and a contiguous slice of the FFN's n_ff, as a
 * li_model view whose hyper-parameters are the rank's own (n_head,
 * n_head_kv, n_ff: what the forward pass sizes its scratch and the rank's
 * KV cache by):
 *   column-parallel: wq, wk, wv, w_gate, w_up keep the rank's rows (views
 *     into the mapped rows: rows are contiguous);
 *   row-parallel:    wo, w_down keep the matching columns (the k-slice of
 *     each row, copied into memory the view owns; a slice must start and
 *     end on whole quant blocks);
 *   replicated:      the embedding, the norms and the output head.
 * Uneven splits take the remainder on the first ranks: 3 KV heads over 2
 * ranks give 2 + 1, n_ff is split in units of w_down's block size. The
 * partial outputs of wo and w_down are summed across ranks (comm.h). */
#ifndef LI_SHARD_H
#define LI_SHARD_H

#include "model/model.h"

typedef struct li_shard {
    int rank, size;
    int32_t head_kv0, n_head_kv; /* KV heads [head_kv0, head_kv0 + n_head_kv) */
    int32_t head0, n_head;       /* query heads [head0, head0 + n_head) */
    int64_t ff0, n_ff;           /* FFN rows [ff0, ff0 + n_ff) */
} li_shard;

/* Rank `rank`'s share of m split over `size` ranks, or LI_EINVAL / LI_EUNSUP
 * saying why m cannot be split so (more ranks than KV heads, a slice that
 * cuts a quant block, a weight scheme). */
int li_shard_plan(const li_model *m, int rank, int size, li_shard *out, li_error *err);
/* A view of m holding rank's shard: shares m's mapping, tokenizer and
 * replicated weights (their packed layouts not: prepare the view on the
 * rank's backend, li_model_prepare). m outlives it; li_shard_model_free
 * frees what the view owns (never m's). */
int li_shard_model_init(li_model *view, const li_model *m, int rank, int size, li_error *err);
void li_shard_model_free(li_model *view);

#endif
