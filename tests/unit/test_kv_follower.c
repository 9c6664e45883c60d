/* test_kv_follower.c — storage that follows a block pool (a draft model's
 * KV): same block ids, its own dims; copy-on-write copies in both. */
#include "kv/kv_cache.h"
#include "test_util.h"

#include <string.h>

/* fills block id of every layer's K, V (and scales) with bytes seed + offset */
static void fill(li_kv_cache *kv, int32_t id, unsigned seed) {
    const size_t row = (size_t)kv->head_dim * (kv->dtype == LI_TYPE_F16 ? 2 : 1);
    const size_t per = (size_t)kv->block_size * kv->n_head_kv * row;
    for (int l = 0; l < kv->n_layer; l++) {
        unsigned char *k = (unsigned char *)kv->layers[l].k + (size_t)id * per;
        unsigned char *v = (unsigned char *)kv->layers[l].v + (size_t)id * per;
        for (size_t i = 0; i < per; i++) k[i] = (unsigned char)(seed + i + 3 * l), v[i] = (unsigned char)(seed + 7 * i + l);
        if (kv->scales)
            for (int i = 0; i < kv->block_size * kv->n_head_kv; i++) {
                kv->layers[l].k_scale[(size_t)id * kv->block_size * kv->n_head_kv + i] = (float)(seed + i + l);
                kv->layers[l].v_scale[(size_t)id * kv->block_size * kv->n_head_kv + i] = (float)(seed * 2 + i + l);
            }
    }
}

/* block a equals block b in every layer's K, V and scales */
static bool same_block(const li_kv_cache *kv, int32_t a, int32_t b) {
    const size_t row = (size_t)kv->head_dim * (kv->dtype == LI_TYPE_F16 ? 2 : 1);
    const size_t per = (size_t)kv->block_size * kv->n_head_kv * row, ns = (size_t)kv->block_size * kv->n_head_kv;
    bool ok = true;
    for (int l = 0; l < kv->n_layer; l++) {
        ok &= !memcmp((char *)kv->layers[l].k + a * per, (char *)kv->layers[l].k + b * per, per);
        ok &= !memcmp((char *)kv->layers[l].v + a * per, (char *)kv->layers[l].v + b * per, per);
        if (kv->scales) {
            ok &= !memcmp(kv->layers[l].k_scale + a * ns, kv->layers[l].k_scale + b * ns, ns * sizeof(float));
            ok &= !memcmp(kv->layers[l].v_scale + a * ns, kv->layers[l].v_scale + b * ns, ns * sizeof(float));
        }
    }
    return ok;
}

static void check_dtype(li_backend *be, li_type dtype) {
    li_error err = {0};
    const li_kv_dims tgt = {.n_layer = 3, .n_head_kv = 2, .head_dim = 8}, drf = {.n_layer = 1, .n_head_kv = 1, .head_dim = 16};
    li_kv_cache pool, fol, fol2;
    CHECK(li_kv_cache_init(&pool, be, &tgt, dtype, 4, 6, &err) == 0, "%s", err.msg);
    CHECK(li_kv_cache_init_follower(&fol, &pool, be, &drf, &err) == 0, "%s", err.msg);
    CHECK(fol.num_blocks == 6 && fol.block_size == 4 && fol.dtype == dtype && fol.n_layer == 1 && fol.head_dim == 16,
          "the follower takes the pool's blocks and dtype, its own dims");
    CHECK(fol.bytes == li_kv_bytes_per_token(&drf, dtype) * 4 * 6, "the follower's bytes (%zu)", fol.bytes);
    CHECK(!fol.refcount && !fol.free_list && pool.follower == &fol && fol.pool == &pool, "no bookkeeping of its own");
    CHECK(li_kv_cache_init_follower(&fol2, &fol, be, &drf, &err) == LI_EINVAL, "a follower cannot be followed");

    /* a prompt of 6 tokens, forked; the fork writes position 6: block 1 is copied */
    li_kv_seq a, b;
    li_kv_seq_init(&a);
    li_kv_seq_init(&b);
    CHECK(li_kv_seq_reserve(&pool, &a, 6) == 0, "reserve");
    fill(&pool, a.blocks[1], 11);
    fill(&fol, a.blocks[1], 29);
    li_kv_seq_fork(&pool, &a, &b);
    CHECK(li_kv_seq_cow(&pool, &b, 6, 7) == 0 && b.blocks[1] != a.blocks[1], "copy-on-write gave b a fresh block");
    CHECK(same_block(&pool, b.blocks[1], a.blocks[1]), "the pool's storage copied");
    CHECK(same_block(&fol, b.blocks[1], a.blocks[1]), "the follower's storage copied");

    /* clearing two slots of block 1 (its rows 1 and 2) in the follower: zeros there in K, V and
     * scales; the rest of the block and the pool's storage as they were */
    {
        const int32_t blk = a.blocks[1], spare = li_kv_block_alloc(&pool);
        li_kv_block_copy(&pool, spare, blk); /* the pool's block before */
        const int64_t slots[2] = {(int64_t)blk * 4 + 1, (int64_t)blk * 4 + 2};
        const size_t row = (size_t)fol.n_head_kv * fol.head_dim * (dtype == LI_TYPE_F16 ? 2 : 1);
        const size_t per = row * 4, ns = 4 * (size_t)fol.n_head_kv;
        unsigned char kb[128], vb[128];
        float ks[4] = {0}, vs[4] = {0};
        memcpy(kb, (char *)fol.layers[0].k + blk * per, per);
        memcpy(vb, (char *)fol.layers[0].v + blk * per, per);
        if (fol.scales) {
            memcpy(ks, fol.layers[0].k_scale + blk * ns, ns * sizeof(float));
            memcpy(vs, fol.layers[0].v_scale + blk * ns, ns * sizeof(float));
        }
        li_kv_slots_clear(&fol, slots, 2);
        memset(kb + row, 0, 2 * row);
        memset(vb + row, 0, 2 * row);
        ks[1] = ks[2] = vs[1] = vs[2] = 0;
        bool ok = !memcmp(kb, (char *)fol.layers[0].k + blk * per, per) &&
                  !memcmp(vb, (char *)fol.layers[0].v + blk * per, per);
        if (fol.scales)
            ok = ok && !memcmp(ks, fol.layers[0].k_scale + blk * ns, ns * sizeof(float)) &&
                 !memcmp(vs, fol.layers[0].v_scale + blk * ns, ns * sizeof(float));
        CHECK(ok && (!fol.scales || ks[0] != 0) && kb[0] != 0, "li_kv_slots_clear zeroed two slots' K, V and scales of the follower, "
                                              "and nothing else of the block");
        CHECK(same_block(&pool, spare, blk), "the pool's storage is untouched");
        li_kv_block_unref(&pool, spare);
        fill(&fol, blk, 29);
    }

    /* a freed follower no longer follows */
    li_kv_cache_free(&fol);
    CHECK(pool.follower == NULL, "unlinked");
    li_kv_seq c;
    li_kv_seq_init(&c);
    li_kv_seq_fork(&pool, &a, &c);
    CHECK(li_kv_seq_cow(&pool, &c, 4, 5) == 0 && same_block(&pool, c.blocks[1], a.blocks[1]),
          "copy-on-write without a follower");
    li_kv_seq_release(&pool, &a);
    li_kv_seq_release(&pool, &b);
    li_kv_seq_release(&pool, &c);
    li_kv_seq_free(&c);
    CHECK(pool.n_free == 6, "all blocks back");
    li_kv_seq_free(&a);
    li_kv_seq_free(&b);
    li_kv_cache_free(&pool);
}

int main(void) {
    li_backend host_be = {.ops = li_backend_ref_ops()}; /* host buffers */
    check_dtype(&host_be, LI_TYPE_F16);
    check_dtype(&host_be, LI_KV_TYPE_INT8);
    return t_summary("kv_follower");
}
