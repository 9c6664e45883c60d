/* kv_cache.c — the paged KV block pool. */
#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

static size_t dtype_bytes(li_type t) {
    switch (t) {
    case LI_TYPE_F32: return 4;
    case LI_TYPE_F16: case LI_TYPE_BF16: return 2;
    default: return 0;
    }
}

int li_kv_dtype_parse(const char *s, li_type *out, li_error *err) {
    if (!strcmp(s, "f16")) *out = LI_TYPE_F16;
    else if (!strcmp(s, "bf16")) *out = LI_TYPE_BF16;
    else if (!strcmp(s, "f32")) *out = LI_TYPE_F32;
    else return li_error_set(err, LI_EINVAL, "unknown KV dtype '%s' (expected f16, bf16 or f32)", s);
    return 0;
}

size_t li_kv_bytes_per_token(const li_hparams *hp, li_type dtype) {
    return 2u * (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)hp->head_dim * dtype_bytes(dtype);
}

int32_t li_kv_blocks_for_budget(const li_hparams *hp, li_type dtype, int block_size, size_t budget) {
    size_t per_block = li_kv_bytes_per_token(hp, dtype) * (size_t)block_size;
    size_t n = per_block ? budget / per_block : 0;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

int li_kv_cache_init(li_kv_cache *kv, const li_hparams *hp, li_type dtype, int block_size, int32_t num_blocks,
                     li_error *err) {
    memset(kv, 0, sizeof *kv);
    size_t es = dtype_bytes(dtype);
    if (!es) return li_error_set(err, LI_EUNSUP, "kv: dtype %s is not supported", li_type_name(dtype));
    if (block_size <= 0 || block_size > 1024)
        return li_error_set(err, LI_EINVAL, "kv: block size %d out of range (1..1024)", block_size);
    if (num_blocks <= 0) return li_error_set(err, LI_ENOMEM, "kv: the memory budget holds no block");
    kv->dtype = dtype;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->block_size = block_size;
    kv->num_blocks = num_blocks;
    size_t per_layer_one = (size_t)num_blocks * block_size * hp->n_head_kv * hp->head_dim * es;
    kv->bytes = per_layer_one * 2 * hp->n_layer;
    kv->storage = li_aligned_alloc(kv->bytes);
    memset(kv->storage, 0, kv->bytes);
    kv->layers = li_xcalloc((size_t)hp->n_layer, sizeof *kv->layers);
    for (int l = 0; l < hp->n_layer; l++) {
        kv->layers[l].dtype = dtype;
        kv->layers[l].k = (char *)kv->storage + per_layer_one * (2 * (size_t)l);
        kv->layers[l].v = (char *)kv->storage + per_layer_one * (2 * (size_t)l + 1);
    }
    kv->refcount = li_xcalloc((size_t)num_blocks, sizeof(int32_t));
    kv->free_list = li_xmalloc((size_t)num_blocks * sizeof(int32_t));
    /* pop order 0, 1, 2, ...: the stack holds ids in reverse */
    for (int32_t i = 0; i < num_blocks; i++) kv->free_list[i] = num_blocks - 1 - i;
    kv->n_free = num_blocks;
    return 0;
}

void li_kv_cache_free(li_kv_cache *kv) {
    li_aligned_free(kv->storage);
    free(kv->scales);
    free(kv->layers);
    free(kv->refcount);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

int32_t li_kv_block_alloc(li_kv_cache *kv) {
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
    if (--kv->refcount[id] == 0) kv->free_list[kv->n_free++] = id;
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

void li_kv_seq_release(li_kv_cache *kv, li_kv_seq *s) {
    /* release tail first so a later alloc reuses the most recent blocks last */
    for (int32_t i = s->n_blocks - 1; i >= 0; i--) li_kv_block_unref(kv, s->blocks[i]);
    s->n_blocks = 0;
}

void li_kv_seq_free(li_kv_seq *s) {
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
