/* prefix_cache.c — the prefix-cache manager over kv_cache.c's block map. */
#include "kv/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

void li_prefix_cache_init(li_prefix_cache *pc, li_kv_cache *kv, bool enabled, li_prefix_clock_fn clock,
                          const void *clock_ud) {
    memset(pc, 0, sizeof *pc);
    pc->kv = kv;
    pc->clock = clock;
    pc->clock_ud = clock_ud;
    if (enabled) li_kv_prefix_enable(kv);
}

void li_prefix_cache_free(li_prefix_cache *pc) {
    free(pc->cand);
    free(pc->order);
    memset(pc, 0, sizeof *pc);
}

void li_prefix_seq_init(li_prefix_seq *ps) { memset(ps, 0, sizeof *ps); }

void li_prefix_seq_free(li_prefix_seq *ps) {
    free(ps->hash);
    memset(ps, 0, sizeof *ps);
}

static double now(const li_prefix_cache *pc) { return pc->clock ? pc->clock(pc->clock_ud) : 0; }

/* ---- a sequence's blocks -------------------------------------------------------- */

/* Hashes of the first n full blocks of toks, each computed once. */
static void ensure_hashes(const li_prefix_cache *pc, li_prefix_seq *ps, int32_t n, const int32_t *toks,
                          const char *salt) {
    const int bs = pc->kv->block_size;
    if (n > ps->cap_hash) {
        ps->cap_hash = n + 16;
        ps->hash = li_xrealloc(ps->hash, (size_t)ps->cap_hash * sizeof *ps->hash);
    }
    for (int32_t b = ps->n_hash; b < n; b++) {
        li_block_hash parent = b ? ps->hash[b - 1] : (li_block_hash){0, 0};
        ps->hash[b] = li_kv_block_hash(parent, toks + (int64_t)b * bs, bs, b == 0 ? salt : NULL);
    }
    if (n > ps->n_hash) ps->n_hash = n;
}

int32_t li_prefix_probe(li_prefix_cache *pc, li_prefix_seq *ps, const li_kv_seq *seq, int64_t num_computed,
                        const int32_t *toks, int64_t n_toks, const char *salt) {
    li_kv_cache *kv = pc->kv;
    if (!kv->prefix_caching || seq->n_blocks || num_computed) return 0;
    /* a waiting request is probed every step (state for the policy, FCFS,
     * admission). Blocks only join the map between removals, so while no
     * hash has left it the last answer still holds and the walk goes on
     * from there (one lookup); the tokens before it never change. */
    int32_t max_blocks = (int32_t)((n_toks - 1) / kv->block_size);
    ensure_hashes(pc, ps, max_blocks, toks, salt);
    int32_t hits = ps->probe_version == kv->map_version ? LI_MIN(ps->probe_hits, max_blocks) : 0;
    while (hits < max_blocks && li_kv_prefix_lookup(kv, ps->hash[hits]) >= 0) hits++;
    ps->probe_hits = hits;
    ps->probe_version = kv->map_version;
    return hits;
}

int64_t li_prefix_acquire(li_prefix_cache *pc, li_prefix_seq *ps, li_kv_seq *seq, int64_t num_computed,
                          const int32_t *toks, int64_t n_toks, const char *salt) {
    li_kv_cache *kv = pc->kv;
    int32_t hits = li_prefix_probe(pc, ps, seq, num_computed, toks, n_toks, salt);
    if (!kv->prefix_caching || seq->n_blocks || num_computed) return 0;
    pc->query_tokens += n_toks;
    if (hits == 0) return 0;
    if (seq->cap < hits) {
        seq->cap = hits + 8;
        seq->blocks = li_xrealloc(seq->blocks, (size_t)seq->cap * sizeof(int32_t));
    }
    double t = now(pc);
    for (int32_t b = 0; b < hits; b++) {
        int32_t id = li_kv_prefix_lookup(kv, ps->hash[b]);
        li_kv_prefix_acquire(kv, id, t);
        seq->blocks[b] = id;
    }
    seq->n_blocks = hits;
    ps->n_registered = hits;
    const int64_t computed = (int64_t)hits * kv->block_size;
    pc->hit_tokens += computed;
    return computed;
}

void li_prefix_register(li_prefix_cache *pc, li_prefix_seq *ps, const li_kv_seq *seq, int64_t num_computed,
                        const int32_t *toks, const char *salt) {
    li_kv_cache *kv = pc->kv;
    if (!kv->prefix_caching) return;
    int32_t full = (int32_t)(num_computed / kv->block_size);
    if (full <= ps->n_registered) return;
    ensure_hashes(pc, ps, full, toks, salt);
    double t = now(pc);
    for (int32_t b = ps->n_registered; b < full; b++)
        if (li_kv_prefix_register(kv, seq->blocks[b], ps->hash[b], b)) li_kv_prefix_touch(kv, seq->blocks[b], t);
    ps->n_registered = full;
}

void li_prefix_release(li_prefix_cache *pc, li_prefix_seq *ps, li_kv_seq *seq) {
    li_kv_cache *kv = pc->kv;
    if (kv->prefix_caching) {
        double t = now(pc);
        for (int32_t b = 0; b < seq->n_blocks; b++) li_kv_prefix_touch(kv, seq->blocks[b], t);
    }
    li_kv_seq_release(kv, seq);
    ps->n_registered = 0; /* the hashes stay: the tokens have not changed */
}

void li_prefix_seq_fork(li_prefix_seq *dst, const li_prefix_seq *src) { dst->n_registered = src->n_registered; }

/* ---- eviction ------------------------------------------------------------------- */

int li_prefix_evict_for(li_prefix_cache *pc, int32_t need, li_prefix_order_fn fn, void *ud, bool *short_order) {
    li_kv_cache *kv = pc->kv;
    *short_order = false;
    if (!kv->prefix_caching || !fn || kv->n_free >= need || !kv->n_evictable) return 0;
    int32_t want = LI_MIN(LI_MAX(need - kv->n_free, kv->num_blocks / 16), kv->n_evictable);
    int32_t n = kv->n_evictable;
    if (n > pc->cap) { /* grows to the pool size at most, then stays */
        pc->cap = LI_MAX(n, pc->cap * 2);
        pc->cand = li_xrealloc(pc->cand, (size_t)pc->cap * sizeof *pc->cand);
        pc->order = li_xrealloc(pc->order, (size_t)pc->cap * sizeof *pc->order);
    }
    int32_t k = 0;
    for (int32_t id = kv->lru_head; id >= 0 && k < n; id = kv->lru_next[id])
        pc->cand[k++] = (li_prefix_candidate){id, kv->last_access[id], kv->hit_count[id], kv->depth[id]};
    int32_t n_order = 0, done = 0;
    int rc = fn(ud, pc->cand, k, want, pc->order, &n_order);
    if (rc == 0) {
        for (int32_t i = 0; i < n_order && i < n && done < want; i++) done += li_kv_prefix_evict(kv, pc->order[i]);
        *short_order = done < LI_MIN(want, n_order);
    }
    /* a short, empty or failed answer is completed in LRU order here, so the
     * batch is whole and fn is not asked again for every request */
    while (done < want && kv->lru_head >= 0) done += li_kv_prefix_evict(kv, kv->lru_head);
    return rc;
}
