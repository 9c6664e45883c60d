/* kv_cache.c — the paged KV block pool. */
#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* bytes per stored element (0: not a KV dtype). The one list of KV dtypes:
 * storage_init refuses the rest by name, so no attention or kv_store kernel
 * ever sees another (their switches end in li_type_unreachable). */
static size_t dtype_bytes(li_type t) {
    switch (t) {
    case LI_TYPE_F32: return 4;
    case LI_TYPE_F16: case LI_TYPE_BF16: return 2;
    case LI_KV_TYPE_FP8_E4M3: case LI_KV_TYPE_INT8: return 1;
    default: return 0;
    }
}

bool li_kv_dtype_has_scales(li_type t) { return t == LI_KV_TYPE_FP8_E4M3 || t == LI_KV_TYPE_INT8; }

const char *li_kv_dtype_name(li_type t) {
    switch (t) {
    case LI_KV_TYPE_FP8_E4M3: return "fp8";
    case LI_KV_TYPE_INT8: return "int8";
    default: return li_type_name(t);
    }
}

int li_kv_dtype_parse(const char *s, li_type *out, li_error *err) {
    if (!strcmp(s, "f16")) *out = LI_TYPE_F16;
    else if (!strcmp(s, "bf16")) *out = LI_TYPE_BF16;
    else if (!strcmp(s, "f32")) *out = LI_TYPE_F32;
    else if (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3") || !strcmp(s, "e4m3")) *out = LI_KV_TYPE_FP8_E4M3;
    else if (!strcmp(s, "int8") || !strcmp(s, "i8")) *out = LI_KV_TYPE_INT8;
    else return li_error_set(err, LI_EINVAL, "unknown KV dtype '%s' (expected f16, bf16, f32, fp8 or int8)", s);
    return 0;
}

size_t li_kv_bytes_per_token(const li_kv_dims *hp, li_type dtype) {
    /* per layer, K and V: n_head_kv rows of head_dim elements, plus one f32
     * scale per row for the 8-bit dtypes */
    const size_t row = (size_t)hp->head_dim * dtype_bytes(dtype) + (li_kv_dtype_has_scales(dtype) ? sizeof(float) : 0);
    return 2u * (size_t)hp->n_layer * (size_t)hp->n_head_kv * row;
}

int32_t li_kv_blocks_for_budget(const li_kv_dims *hp, li_type dtype, int block_size, size_t budget) {
    size_t per_block = li_kv_bytes_per_token(hp, dtype) * (size_t)block_size;
    size_t n = per_block ? budget / per_block : 0;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

/* ---- storage ------------------------------------------------------------- */

/* Allocates kv's K/V bytes (and scales) for num_blocks blocks through be and
 * lays out the per-layer views; no bookkeeping. */
static int storage_init(li_kv_cache *kv, li_backend *be, const li_kv_dims *hp, li_type dtype, int block_size,
                        int32_t num_blocks, li_error *err) {
    memset(kv, 0, sizeof *kv);
    size_t es = dtype_bytes(dtype);
    if (!es)
        return li_error_set(err, LI_EUNSUP, "kv: dtype %s (type %u) is not supported (f32, f16, bf16, fp8 or int8)",
                            li_type_name(dtype), (unsigned)dtype);
    if (block_size <= 0 || block_size > 1024)
        return li_error_set(err, LI_EINVAL, "kv: block size %d out of range (1..1024)", block_size);
    if (num_blocks <= 0) return li_error_set(err, LI_ENOMEM, "kv: the memory budget holds no block");
    if (hp->n_layer <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0)
        return li_error_set(err, LI_EINVAL, "kv: %d layers, %d kv heads of %d dims", hp->n_layer, hp->n_head_kv,
                            hp->head_dim);
    size_t per_layer_one = (size_t)num_blocks * block_size * hp->n_head_kv * hp->head_dim * es;
    size_t data_bytes = per_layer_one * 2 * hp->n_layer;
    /* 8-bit dtypes: one f32 scale per (slot, kv head) for K and for V,
     * (n_layer, 2, num_blocks, block_size, n_head_kv); zero = an empty row */
    size_t scales_one = li_kv_dtype_has_scales(dtype) ? (size_t)num_blocks * block_size * hp->n_head_kv : 0;
    int rc = li_buffer_alloc(be, data_bytes, &kv->storage_buf, err);
    if (!rc && scales_one) rc = li_buffer_alloc(be, scales_one * 2 * hp->n_layer * sizeof(float), &kv->scales_buf, err);
    if (rc) {
        li_buffer_free(be, &kv->storage_buf);
        return rc;
    }
    kv->be = be;
    kv->dtype = dtype;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->block_size = block_size;
    kv->num_blocks = num_blocks;
    kv->storage = kv->storage_buf.data;
    kv->scales = scales_one ? kv->scales_buf.data : NULL;
    kv->bytes = data_bytes + scales_one * 2 * hp->n_layer * sizeof(float);
    kv->layers = li_xcalloc((size_t)hp->n_layer, sizeof *kv->layers);
    for (int l = 0; l < hp->n_layer; l++) {
        kv->layers[l].dtype = dtype;
        kv->layers[l].k = (char *)kv->storage + per_layer_one * (2 * (size_t)l);
        kv->layers[l].v = (char *)kv->storage + per_layer_one * (2 * (size_t)l + 1);
        if (kv->scales) {
            kv->layers[l].k_scale = kv->scales + scales_one * (2 * (size_t)l);
            kv->layers[l].v_scale = kv->scales + scales_one * (2 * (size_t)l + 1);
        }
    }
    return 0;
}

static void storage_free(li_kv_cache *kv) {
    li_buffer_free(kv->be, &kv->storage_buf);
    li_buffer_free(kv->be, &kv->scales_buf);
    free(kv->layers);
}

int li_kv_cache_init(li_kv_cache *kv, li_backend *be, const li_kv_dims *hp, li_type dtype, int block_size,
                     int32_t num_blocks, li_error *err) {
    int rc = storage_init(kv, be, hp, dtype, block_size, num_blocks, err);
    if (rc) return rc;
    kv->refcount = li_xcalloc((size_t)num_blocks, sizeof(int32_t));
    kv->free_list = li_xmalloc((size_t)num_blocks * sizeof(int32_t));
    /* pop order 0, 1, 2, ...: the stack holds ids in reverse */
    for (int32_t i = 0; i < num_blocks; i++) kv->free_list[i] = num_blocks - 1 - i;
    kv->n_free = num_blocks;
    return 0;
}

int li_kv_cache_init_follower(li_kv_cache *kv, li_kv_cache *pool, li_backend *be, const li_kv_dims *d,
                              li_error *err) {
    if (pool->pool) return li_error_set(err, LI_EINVAL, "kv: a follower's storage cannot be followed");
    int rc = storage_init(kv, be, d, pool->dtype, pool->block_size, pool->num_blocks, err);
    if (rc) return rc;
    kv->pool = pool;
    kv->follower = pool->follower;
    pool->follower = kv;
    return 0;
}

void li_kv_cache_free(li_kv_cache *kv) {
    free(kv->hash);
    free(kv->hashed);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv->last_access);
    free(kv->hit_count);
    free(kv->depth);
    free(kv->map);
    storage_free(kv);
    if (kv->pool) /* unlink from the pool's followers */
        for (li_kv_cache **f = &kv->pool->follower; *f; f = &(*f)->follower)
            if (*f == kv) {
                *f = kv->follower;
                break;
            }
    free(kv->refcount);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

/* ---- prefix cache ---------------------------------------------------------- */

void li_kv_prefix_enable(li_kv_cache *kv) {
    if (kv->prefix_caching) return;
    const size_t n = (size_t)kv->num_blocks;
    kv->prefix_caching = true;
    kv->hash = li_xcalloc(n, sizeof *kv->hash);
    kv->hashed = li_xcalloc(n, 1);
    kv->lru_prev = li_xmalloc(n * sizeof(int32_t));
    kv->lru_next = li_xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) kv->lru_prev[i] = kv->lru_next[i] = -1;
    kv->lru_head = kv->lru_tail = -1;
    kv->last_access = li_xcalloc(n, sizeof *kv->last_access);
    kv->hit_count = li_xcalloc(n, sizeof *kv->hit_count);
    kv->depth = li_xcalloc(n, sizeof *kv->depth);
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    kv->map = li_xmalloc(cap * sizeof(int32_t));
    for (size_t i = 0; i < cap; i++) kv->map[i] = -1;
    kv->map_mask = cap - 1;
}

li_block_hash li_kv_block_hash(li_block_hash parent, const int32_t *tokens, int n, const char *salt) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, &parent, sizeof parent);
    XXH3_128bits_update(&st, tokens, (size_t)n * sizeof *tokens);
    if (salt && *salt) XXH3_128bits_update(&st, salt, strlen(salt));
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (li_block_hash){h.low64, h.high64};
}

static bool hash_eq(li_block_hash a, li_block_hash b) { return a.lo == b.lo && a.hi == b.hi; }

int32_t li_kv_prefix_lookup(const li_kv_cache *kv, li_block_hash h) {
    if (!kv->prefix_caching) return -1;
    for (size_t i = (size_t)h.lo & kv->map_mask;; i = (i + 1) & kv->map_mask) {
        int32_t id = kv->map[i];
        if (id < 0) return -1;
        if (hash_eq(kv->hash[id], h)) return id;
    }
}

static void map_remove(li_kv_cache *kv, int32_t id) {
    kv->map_version++;
    size_t i = (size_t)kv->hash[id].lo & kv->map_mask;
    while (kv->map[i] != id) i = (i + 1) & kv->map_mask;
    /* backward-shift deletion keeps every probe chain unbroken */
    for (size_t j = (i + 1) & kv->map_mask; kv->map[j] >= 0; j = (j + 1) & kv->map_mask) {
        size_t home = (size_t)kv->hash[kv->map[j]].lo & kv->map_mask;
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            kv->map[i] = kv->map[j];
            i = j;
        }
    }
    kv->map[i] = -1;
}

static void lru_unlink(li_kv_cache *kv, int32_t id) {
    int32_t p = kv->lru_prev[id], n = kv->lru_next[id];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->lru_prev[id] = kv->lru_next[id] = -1;
    kv->n_evictable--;
}

static void lru_push_tail(li_kv_cache *kv, int32_t id) {
    kv->lru_prev[id] = kv->lru_tail;
    kv->lru_next[id] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = id;
    else kv->lru_head = id;
    kv->lru_tail = id;
    kv->n_evictable++;
}

void li_kv_prefix_acquire(li_kv_cache *kv, int32_t id, double now) {
    if (kv->refcount[id] == 0) lru_unlink(kv, id);
    kv->refcount[id]++;
    kv->hit_count[id]++;
    kv->last_access[id] = now;
}

bool li_kv_prefix_register(li_kv_cache *kv, int32_t id, li_block_hash h, int32_t depth) {
    if (!kv->prefix_caching || kv->hashed[id] || li_kv_prefix_lookup(kv, h) >= 0) return false;
    kv->hash[id] = h;
    kv->hashed[id] = 1;
    kv->hit_count[id] = 0;
    kv->depth[id] = depth;
    kv->n_hashed++;
    size_t i = (size_t)h.lo & kv->map_mask;
    while (kv->map[i] >= 0) i = (i + 1) & kv->map_mask;
    kv->map[i] = id;
    return true;
}

bool li_kv_prefix_evict(li_kv_cache *kv, int32_t id) {
    if (!kv->prefix_caching || id < 0 || id >= kv->num_blocks || !kv->hashed[id] || kv->refcount[id] != 0)
        return false;
    lru_unlink(kv, id);
    map_remove(kv, id);
    kv->hashed[id] = 0;
    kv->n_hashed--;
    kv->n_evictions++;
    kv->free_list[kv->n_free++] = id;
    return true;
}

void li_kv_prefix_touch(li_kv_cache *kv, int32_t id, double now) {
    if (kv->prefix_caching) kv->last_access[id] = now;
}

/* ---- allocation ---------------------------------------------------------------- */

int32_t li_kv_block_alloc(li_kv_cache *kv) {
    if (kv->n_free == 0 && kv->n_evictable > 0) li_kv_prefix_evict(kv, kv->lru_head);
    if (kv->n_free == 0) return -1;
    int32_t id = kv->free_list[--kv->n_free];
    kv->refcount[id] = 1;
    return id;
}

void li_kv_block_ref(li_kv_cache *kv, int32_t id) { kv->refcount[id]++; }

void li_kv_block_unref(li_kv_cache *kv, int32_t id) {
    if (kv->refcount[id] <= 0) {
        li_log_error("kv: block %d released twice (ignored)", id);
        return;
    }
    if (--kv->refcount[id] > 0) return;
    /* a cached block stays findable until its slot is needed */
    if (kv->prefix_caching && kv->hashed[id]) lru_push_tail(kv, id);
    else kv->free_list[kv->n_free++] = id;
}

void li_kv_seq_init(li_kv_seq *s) { memset(s, 0, sizeof *s); }

int li_kv_seq_reserve(li_kv_cache *kv, li_kv_seq *s, int64_t n_tokens) {
    int64_t need = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (need > kv->num_blocks) return LI_ENOMEM;
    if (need > s->cap) {
        int32_t cap = s->cap ? s->cap : 8;
        while (cap < need) cap *= 2;
        s->blocks = li_xrealloc(s->blocks, (size_t)cap * sizeof(int32_t));
        s->cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t id = li_kv_block_alloc(kv);
        if (id < 0) return LI_ENOMEM;
        s->blocks[s->n_blocks++] = id;
    }
    return 0;
}

void li_kv_seq_fork(li_kv_cache *kv, const li_kv_seq *src, li_kv_seq *dst) {
    if (dst->cap < src->n_blocks) {
        dst->cap = src->n_blocks + 8;
        dst->blocks = li_xrealloc(dst->blocks, (size_t)dst->cap * sizeof(int32_t));
    }
    for (int32_t i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        li_kv_block_ref(kv, src->blocks[i]);
    }
    dst->n_blocks = src->n_blocks;
}

/* One storage's copy of block src into dst. */
static void storage_block_copy(li_kv_cache *kv, int32_t dst, int32_t src) {
    /* K and V of every layer are runs of one block's bytes in storage, the
     * scales runs of one block's scales: two backend copies in all */
    const size_t per_block = (size_t)kv->block_size * kv->n_head_kv * kv->head_dim * dtype_bytes(kv->dtype);
    const size_t per_layer_one = per_block * (size_t)kv->num_blocks;
    enum { MAX_RUNS = 64 };
    size_t d_off[MAX_RUNS], s_off[MAX_RUNS];
    for (int r0 = 0; r0 < 2 * kv->n_layer; r0 += MAX_RUNS) { /* run r: layer r/2, K (even) or V (odd) */
        const int nr = LI_MIN(MAX_RUNS, 2 * kv->n_layer - r0);
        for (int r = 0; r < nr; r++) {
            d_off[r] = per_layer_one * (size_t)(r0 + r) + (size_t)dst * per_block;
            s_off[r] = per_layer_one * (size_t)(r0 + r) + (size_t)src * per_block;
        }
        kv->be->ops->buffer_copy(kv->be, &kv->storage_buf, &kv->storage_buf, d_off, s_off, nr, per_block);
        if (!kv->scales) continue;
        const size_t sb = (size_t)kv->block_size * kv->n_head_kv * sizeof(float);
        const size_t s_layer_one = sb * (size_t)kv->num_blocks;
        for (int r = 0; r < nr; r++) {
            d_off[r] = s_layer_one * (size_t)(r0 + r) + (size_t)dst * sb;
            s_off[r] = s_layer_one * (size_t)(r0 + r) + (size_t)src * sb;
        }
        kv->be->ops->buffer_copy(kv->be, &kv->scales_buf, &kv->scales_buf, d_off, s_off, nr, sb);
    }
}

/* Zeroes row `row` bytes at slot slots[0] of each of the runs (one backend
 * set each), then copies it to the other slots in one backend copy: two
 * calls per run and one in all, not one per slot and run (a device
 * backend's set is a transfer from the host). */
static void rows_clear(li_kv_cache *kv, li_buffer *buf, size_t row, size_t run, int runs, const int64_t *slots,
                       int32_t n) {
    void *zeros = li_xcalloc(1, row);
    for (int r = 0; r < runs; r++)
        kv->be->ops->buffer_set(kv->be, buf, run * (size_t)r + (size_t)slots[0] * row, zeros, row);
    free(zeros);
    if (n < 2) return;
    const size_t nr = (size_t)runs * (size_t)(n - 1);
    size_t *d_off = li_xmalloc(2 * nr * sizeof *d_off), *s_off = d_off + nr;
    for (int r = 0; r < runs; r++)
        for (int32_t i = 1; i < n; i++) {
            d_off[(size_t)r * (n - 1) + i - 1] = run * (size_t)r + (size_t)slots[i] * row;
            s_off[(size_t)r * (n - 1) + i - 1] = run * (size_t)r + (size_t)slots[0] * row;
        }
    kv->be->ops->buffer_copy(kv->be, buf, buf, d_off, s_off, (int)nr, row);
    free(d_off);
}

void li_kv_slots_clear(li_kv_cache *kv, const int64_t *slots, int32_t n) {
    /* a slot is one row of n_head_kv * head_dim elements in each run (layer l,
     * K or V), its scales one row of n_head_kv floats */
    if (n <= 0) return;
    const size_t slots_all = (size_t)kv->num_blocks * (size_t)kv->block_size;
    const size_t row = (size_t)kv->n_head_kv * kv->head_dim * dtype_bytes(kv->dtype);
    rows_clear(kv, &kv->storage_buf, row, row * slots_all, 2 * kv->n_layer, slots, n);
    if (kv->scales) {
        const size_t srow = (size_t)kv->n_head_kv * sizeof(float);
        rows_clear(kv, &kv->scales_buf, srow, srow * slots_all, 2 * kv->n_layer, slots, n);
    }
}

void li_kv_block_copy(li_kv_cache *kv, int32_t dst, int32_t src) {
    /* a block id addresses the same tokens in the pool's storage and in
     * every follower's: copy-on-write copies it in each */
    for (li_kv_cache *s = kv; s; s = s->follower) storage_block_copy(s, dst, src);
}

int li_kv_seq_cow(li_kv_cache *kv, li_kv_seq *s, int64_t from, int64_t to) {
    if (to <= from) return 0;
    int64_t b0 = from / kv->block_size, b1 = LI_MIN((to - 1) / kv->block_size, (int64_t)s->n_blocks - 1);
    for (int64_t b = b0; b <= b1; b++) {
        int32_t old = s->blocks[b];
        if (kv->refcount[old] <= 1) continue;
        int32_t fresh = li_kv_block_alloc(kv);
        if (fresh < 0) return LI_ENOMEM;
        li_kv_block_copy(kv, fresh, old);
        li_kv_block_unref(kv, old);
        s->blocks[b] = fresh;
    }
    return 0;
}

void li_kv_seq_trim(li_kv_cache *kv, li_kv_seq *s, int64_t n_tokens) {
    const int64_t keep = n_tokens > 0 ? (n_tokens + kv->block_size - 1) / kv->block_size : 0;
    while (s->n_blocks > keep) li_kv_block_unref(kv, s->blocks[--s->n_blocks]);
}

void li_kv_seq_release(li_kv_cache *kv, li_kv_seq *s) {
    /* release tail first so a later alloc reuses the most recent blocks last */
    for (int32_t i = s->n_blocks - 1; i >= 0; i--) li_kv_block_unref(kv, s->blocks[i]);
    s->n_blocks = 0;
}

void li_kv_seq_free(li_kv_seq *s) {
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
