/* kv_cache.h — paged KV storage: a pool of fixed-size blocks per layer, a
 * refcount per block, a free list, and per-sequence block tables.
 * Owns: the K/V bytes of every layer. The engine (core/engine) decides which
 * sequence gets blocks; this module only hands them out and takes them back. */
#ifndef LI_KV_CACHE_H
#define LI_KV_CACHE_H

#include "util/common.h"
#include "model/model.h"

typedef struct li_kv_cache {
    li_type dtype;
    int n_layer, n_head_kv, head_dim, block_size;
    int32_t num_blocks;
    li_kv_layer *layers;   /* (n_layer) views into storage */
    void *storage;         /* (n_layer, 2, num_blocks, block_size, n_head_kv, head_dim) */
    float *scales;         /* for 8-bit dtypes: (n_layer, 2, num_blocks, block_size, n_head_kv) */
    size_t bytes;          /* total bytes of storage + scales */
    int32_t *refcount;     /* (num_blocks) */
    int32_t *free_list;    /* stack of free block ids, (num_blocks) */
    int32_t n_free;
} li_kv_cache;

/* A sequence's block table: position p lives in blocks[p / block_size]. */
typedef struct li_kv_seq {
    int32_t *blocks;
    int32_t n_blocks, cap;
} li_kv_seq;

/* Bytes one token's K and V take across all layers in `dtype`. */
size_t li_kv_bytes_per_token(const li_hparams *hp, li_type dtype);
/* Blocks that fit in `budget_bytes`. */
int32_t li_kv_blocks_for_budget(const li_hparams *hp, li_type dtype, int block_size, size_t budget_bytes);
int li_kv_dtype_parse(const char *s, li_type *out, li_error *err);

int li_kv_cache_init(li_kv_cache *kv, const li_hparams *hp, li_type dtype, int block_size, int32_t num_blocks,
                     li_error *err);
void li_kv_cache_free(li_kv_cache *kv);

/* Takes a free block (refcount 1), or -1 when none is free. */
int32_t li_kv_block_alloc(li_kv_cache *kv);
void li_kv_block_ref(li_kv_cache *kv, int32_t id);
/* Drops one reference; the block returns to the free list at zero. */
void li_kv_block_unref(li_kv_cache *kv, int32_t id);

void li_kv_seq_init(li_kv_seq *s);
/* Ensures blocks for positions [0, n_tokens); LI_ENOMEM when the pool runs
 * out (blocks taken so far stay with the sequence). */
int li_kv_seq_reserve(li_kv_cache *kv, li_kv_seq *s, int64_t n_tokens);
/* Returns every block of the sequence to the pool. */
void li_kv_seq_release(li_kv_cache *kv, li_kv_seq *s);
void li_kv_seq_free(li_kv_seq *s);
static inline int64_t li_kv_seq_slot(const li_kv_cache *kv, const li_kv_seq *s, int64_t pos) {
    return (int64_t)s->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif
