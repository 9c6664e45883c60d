/* kv_cache.h — paged KV storage: a pool of fixed-size blocks per layer, a
 * refcount per block, a free list, and per-sequence block tables.
 * Owns: the K/V bytes of every layer, in buffers of the backend that runs
 * attention over them (allocated, cleared and block-copied only through
 * it). The engine (core/engine) decides which sequence gets blocks; this
 * module only hands them out and takes them back. */
#ifndef LI_KV_CACHE_H
#define LI_KV_CACHE_H

#include "util/common.h"
#include "backend.h"

/* A full block's identity for prefix caching: a 128-bit hash of its
 * parent's hash, its tokens and (first block only) the request's cache_salt. */
typedef struct li_block_hash {
    uint64_t lo, hi;
} li_block_hash;

/* The model dimensions the cache needs (li_forward_kv_dims makes them from
 * a model's hyperparameters). */
typedef struct li_kv_dims {
    int n_layer, n_head_kv, head_dim;
} li_kv_dims;

typedef struct li_kv_cache {
    li_backend *be;        /* owns storage_buf and scales_buf */
    /* A pool's storage may be followed by other storages (a draft model's
     * KV: its own dims, the same dtype, block size and block ids). Only the
     * pool keeps bookkeeping; a block copy copies in every follower too, so
     * a block id means the same tokens in each. */
    struct li_kv_cache *pool;     /* follower: the pool it follows; else NULL */
    struct li_kv_cache *follower; /* pool: first follower; follower: the next one */
    li_type dtype;
    int n_layer, n_head_kv, head_dim, block_size;
    int32_t num_blocks;
    li_kv_layer *layers;   /* (n_layer) views into storage */
    li_buffer storage_buf, scales_buf;
    void *storage;         /* storage_buf.data: (n_layer, 2, num_blocks, block_size, n_head_kv, head_dim) */
    float *scales;         /* scales_buf.data, for 8-bit dtypes: (n_layer, 2, num_blocks, block_size,
                            * n_head_kv), f32 amax/448 (fp8) or amax/127 (int8) per (slot, kv head);
                            * else NULL */
    size_t bytes;          /* total bytes of storage + scales */
    int32_t *refcount;     /* (num_blocks) */
    int32_t *free_list;    /* stack of empty free block ids, (num_blocks) */
    int32_t n_free;        /* empty blocks: no cached content */

    /* prefix cache: full blocks keep their hash; at refcount 0 a hashed
     * block is not freed but parked in the evictable list (LRU order:
     * head = least recently released) until its slot is needed */
    bool prefix_caching;
    li_block_hash *hash;   /* (num_blocks) valid where hashed[] */
    uint8_t *hashed;       /* (num_blocks) */
    int32_t *lru_prev, *lru_next; /* (num_blocks) evictable list links, -1 = none */
    int32_t lru_head, lru_tail;
    int32_t n_evictable;   /* hashed blocks with refcount 0 */
    int32_t n_hashed;      /* hashed blocks, in use or not */
    double *last_access;   /* (num_blocks) engine clock of the last hit or release */
    uint32_t *hit_count;   /* (num_blocks) prefix hits since the block was filled */
    int32_t *depth;        /* (num_blocks) block index within its sequence */
    int32_t *map;          /* hash -> block: open addressing, -1 = empty */
    size_t map_mask;
    uint64_t map_version;  /* bumped whenever a hash leaves the map: a run of
                            * hits found stays a run of hits while it is unchanged */
    int64_t n_evictions;
} li_kv_cache;

/* A sequence's block table: position p lives in blocks[p / block_size]. */
typedef struct li_kv_seq {
    int32_t *blocks;
    int32_t n_blocks, cap;
} li_kv_seq;

/* Bytes one token's K and V take across all layers in `dtype`, scales
 * included (8-bit dtypes: head_dim bytes + one f32 per kv head and layer,
 * so 0.53x of f16 at head_dim 64, 0.52x at 128). */
size_t li_kv_bytes_per_token(const li_kv_dims *d, li_type dtype);
/* Blocks that fit in `budget_bytes`. */
int32_t li_kv_blocks_for_budget(const li_kv_dims *d, li_type dtype, int block_size, size_t budget_bytes);
/* "f16", "bf16", "f32", "fp8" (E4M3; also "fp8_e4m3", "e4m3"), "int8" (also "i8"). */
int li_kv_dtype_parse(const char *s, li_type *out, li_error *err);
/* The name li_kv_dtype_parse takes ("fp8", "int8", else li_type_name). */
const char *li_kv_dtype_name(li_type dtype);
/* FP8 and INT8 keep a scale per (token, kv head): see docs/kv-cache.md. */
bool li_kv_dtype_has_scales(li_type dtype);

/* The pool's bytes come from be's buffers (zeroed: an empty 8-bit row has
 * scale 0); be must outlive the cache. */
int li_kv_cache_init(li_kv_cache *kv, li_backend *be, const li_kv_dims *d, li_type dtype, int block_size,
                     int32_t num_blocks, li_error *err);
/* Storage only (no refcounts, free list or prefix tables), indexed by pool's
 * block ids: pool's dtype, block size and block count, d's layers and
 * heads. It follows pool's block copies until freed (before pool). */
int li_kv_cache_init_follower(li_kv_cache *kv, li_kv_cache *pool, li_backend *be, const li_kv_dims *d,
                              li_error *err);
void li_kv_cache_free(li_kv_cache *kv);

/* Blocks that can be handed out now: empty plus evictable cached ones. */
static inline int32_t li_kv_available(const li_kv_cache *kv) { return kv->n_free + kv->n_evictable; }

/* Turns prefix caching on (allocates its tables); off by default. */
void li_kv_prefix_enable(li_kv_cache *kv);
/* Hash of a full block: parent (zero for the first block), its tokens, and
 * salt (only hashed into the first block; the chain carries it on). */
li_block_hash li_kv_block_hash(li_block_hash parent, const int32_t *tokens, int n, const char *salt);
/* The block holding this hash, or -1. */
int32_t li_kv_prefix_lookup(const li_kv_cache *kv, li_block_hash h);
/* Takes a reference on a cached block found by lookup (removing it from the
 * evictable list when it was idle) and counts the hit. */
void li_kv_prefix_acquire(li_kv_cache *kv, int32_t id, double now);
/* Records a just-filled block under hash h; false (block left unhashed) when
 * another block already holds that content. */
bool li_kv_prefix_register(li_kv_cache *kv, int32_t id, li_block_hash h, int32_t depth);
/* Evicts one idle cached block (refcount 0): its hash is forgotten and it
 * becomes empty. False if the block is not evictable. */
bool li_kv_prefix_evict(li_kv_cache *kv, int32_t id);
/* Marks the release time used by LRU ordering. */
void li_kv_prefix_touch(li_kv_cache *kv, int32_t id, double now);

/* Takes a free block (refcount 1), or -1 when none is free. With prefix
 * caching an empty block is preferred; else the least recently used idle
 * cached block is evicted. */
int32_t li_kv_block_alloc(li_kv_cache *kv);
void li_kv_block_ref(li_kv_cache *kv, int32_t id);
/* Drops one reference; the block returns to the free list at zero. */
void li_kv_block_unref(li_kv_cache *kv, int32_t id);

void li_kv_seq_init(li_kv_seq *s);
/* Ensures blocks for positions [0, n_tokens); LI_ENOMEM when the pool runs
 * out (blocks taken so far stay with the sequence). */
int li_kv_seq_reserve(li_kv_cache *kv, li_kv_seq *s, int64_t n_tokens);
/* dst (empty) shares every block of src (refcounts +1): n > 1 samples of one
 * prompt keep a single copy of its KV. */
void li_kv_seq_fork(li_kv_cache *kv, const li_kv_seq *src, li_kv_seq *dst);
/* Copy-on-write before writing positions [from, to): any block in that range
 * that is shared gets a private copy. LI_ENOMEM when no block is free. */
int li_kv_seq_cow(li_kv_cache *kv, li_kv_seq *s, int64_t from, int64_t to);
/* Copies one block's K/V (and scales) in every layer: one backend copy per
 * storage (the pool's, then each follower's). */
void li_kv_block_copy(li_kv_cache *kv, int32_t dst, int32_t src);
/* Zeroes the K/V (and scales) of n slots in every layer of this storage
 * only (not its followers): positions whose rows were never computed read
 * as zeros, the same bits whatever held the slot before. */
void li_kv_slots_clear(li_kv_cache *kv, const int64_t *slots, int32_t n);
/* Returns the blocks past the first ceil(n_tokens / block_size) to the pool,
 * last first (a sequence that took room it did not use: speculative drafts
 * past the accepted ones). */
void li_kv_seq_trim(li_kv_cache *kv, li_kv_seq *s, int64_t n_tokens);
/* Returns every block of the sequence to the pool. */
void li_kv_seq_release(li_kv_cache *kv, li_kv_seq *s);
void li_kv_seq_free(li_kv_seq *s);
static inline int64_t li_kv_seq_slot(const li_kv_cache *kv, const li_kv_seq *s, int64_t pos) {
    return (int64_t)s->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif
