/* prefix_cache.h — the prefix-cache manager: which of a sequence's leading
 * blocks are already cached, taking them, registering the blocks a step
 * filled, and eviction ahead of allocation.
 *
 * kv_cache.c keeps the mechanism (the hash -> block map, refcounts, the
 * evictable list in LRU order); this keeps the per-sequence side (the chain
 * of block hashes, what is registered, the last probe) and the decisions
 * around it. The engine asks it and never reads the cache's internals. An
 * eviction order comes from whoever the caller plugs in (the engine: the
 * policy's evict hook), so core/kv depends on no policy. */
#ifndef LI_KV_PREFIX_CACHE_H
#define LI_KV_PREFIX_CACHE_H

#include "kv/kv_cache.h"

/* An idle cached block that may be evicted. */
typedef struct li_prefix_candidate {
    int32_t block;
    double last_access; /* clock of its last hit or release */
    uint32_t hits;      /* prefix hits since it was filled */
    int32_t depth;      /* block index in its sequence (0 = first block of a prompt) */
} li_prefix_candidate;

/* Fills order[0..*n_order) with candidate blocks, most evictable first (at
 * least `want` wanted, n_cands at most). Non-zero = failed: LRU order is
 * used instead. */
typedef int (*li_prefix_order_fn)(void *ud, const li_prefix_candidate *cands, int32_t n_cands, int32_t want,
                                  int32_t *order, int32_t *n_order);
/* The clock that stamps hits and releases (the engine's). */
typedef double (*li_prefix_clock_fn)(const void *ud);

typedef struct li_prefix_cache {
    li_kv_cache *kv;             /* not owned */
    li_prefix_clock_fn clock;
    const void *clock_ud;
    li_prefix_candidate *cand;   /* (cap) eviction scratch: candidates, then */
    int32_t *order, cap;         /* (cap) the order that came back */
    int64_t query_tokens;        /* tokens looked up by li_prefix_acquire */
    int64_t hit_tokens;          /* of those, found cached */
} li_prefix_cache;

/* One sequence's side of the cache. */
typedef struct li_prefix_seq {
    li_block_hash *hash;         /* (cap_hash) hashes of its first n_hash full blocks */
    int32_t n_hash, cap_hash;
    int32_t n_registered;        /* leading blocks of its KV already in the cache */
    int32_t probe_hits;          /* li_prefix_probe's last answer: a lower bound while */
    uint64_t probe_version;      /* the map's removal count is this */
} li_prefix_seq;

/* With enabled, turns prefix caching on in kv; off, every call is a no-op
 * that finds nothing. */
void li_prefix_cache_init(li_prefix_cache *pc, li_kv_cache *kv, bool enabled, li_prefix_clock_fn clock,
                          const void *clock_ud);
void li_prefix_cache_free(li_prefix_cache *pc);
static inline bool li_prefix_cache_enabled(const li_prefix_cache *pc) { return pc->kv->prefix_caching; }
/* Blocks holding hashed (reusable) content, in use or idle. */
static inline int32_t li_prefix_cache_blocks(const li_prefix_cache *pc) { return pc->kv->n_hashed; }
/* Cached blocks evicted so far. */
static inline int64_t li_prefix_cache_evictions(const li_prefix_cache *pc) { return pc->kv->n_evictions; }

void li_prefix_seq_init(li_prefix_seq *ps);
void li_prefix_seq_free(li_prefix_seq *ps);

/* Leading blocks of toks (n_toks, salted by salt) found cached, for a
 * sequence that holds no KV yet (seq empty, num_computed 0; else 0). At
 * least one token is always left out: its logits give the next token. */
int32_t li_prefix_probe(li_prefix_cache *pc, li_prefix_seq *ps, const li_kv_seq *seq, int64_t num_computed,
                        const int32_t *toks, int64_t n_toks, const char *salt);
/* Takes the cached prefix into seq (same conditions as probe): returns the
 * tokens it covers, now computed (0: none). Counts the query and the hit. */
int64_t li_prefix_acquire(li_prefix_cache *pc, li_prefix_seq *ps, li_kv_seq *seq, int64_t num_computed,
                          const int32_t *toks, int64_t n_toks, const char *salt);
/* The full blocks among seq's first num_computed tokens join the cache
 * (only verified tokens may be counted in num_computed). */
void li_prefix_register(li_prefix_cache *pc, li_prefix_seq *ps, const li_kv_seq *seq, int64_t num_computed,
                        const int32_t *toks, const char *salt);
/* Returns seq's blocks; cached ones remember when (LRU and policies). */
void li_prefix_release(li_prefix_cache *pc, li_prefix_seq *ps, li_kv_seq *seq);
/* dst (empty, the same tokens) shares src's blocks, registered as far as src's. */
void li_prefix_seq_fork(li_prefix_seq *dst, const li_prefix_seq *src);

/* Frees at least `need` empty blocks ahead of allocation, in the order fn
 * gives. Asks for a batch (at least 1/16 of the pool) so that fn stays off
 * the per-block path; a short, wrong or failed answer is completed in LRU
 * order. Without fn, or while enough blocks are empty, it does nothing
 * (allocation evicts in LRU order by itself). Returns fn's result (0 when
 * not asked); *short_order is set when fn's order evicted fewer blocks than
 * it named (ids that were not candidates). */
int li_prefix_evict_for(li_prefix_cache *pc, int32_t need, li_prefix_order_fn fn, void *ud, bool *short_order);

#endif
