/* test_kv.c — the block pool with exact block ids. */
#include "kv/kv_cache.h"
#include "test_util.h"

#include <string.h>

int main(void) {
    li_error err = {0};
    li_backend host_be = {.ops = li_backend_ref_ops()}; /* host buffers */
    li_kv_dims hp = {.n_layer = 2, .n_head_kv = 3, .head_dim = 8};
    li_kv_cache kv;
    CHECK(li_kv_bytes_per_token(&hp, LI_TYPE_F16) == 2u * 2 * 3 * 8 * 2, "bytes per token f16");
    CHECK(li_kv_bytes_per_token(&hp, LI_TYPE_F32) == 2u * 2 * 3 * 8 * 4, "bytes per token f32");
    CHECK(li_kv_blocks_for_budget(&hp, LI_TYPE_F16, 4, 192 * 4 * 10 + 5) == 10, "blocks for budget");
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, 4, 6, &err) == 0, "%s", err.msg);
    CHECK(kv.n_free == 6, "all free");

    /* allocation order is 0, 1, 2, ... */
    li_kv_seq a, b;
    li_kv_seq_init(&a);
    li_kv_seq_init(&b);
    CHECK(li_kv_seq_reserve(&kv, &a, 5) == 0, "reserve 5 tokens");
    CHECK(a.n_blocks == 2 && a.blocks[0] == 0 && a.blocks[1] == 1, "a = [0, 1]");
    CHECK(li_kv_seq_slot(&kv, &a, 4) == 1 * 4 + 0, "slot of position 4");
    CHECK(li_kv_seq_reserve(&kv, &a, 8) == 0 && a.n_blocks == 2, "8 tokens still fit in 2 blocks");
    CHECK(li_kv_seq_reserve(&kv, &b, 9) == 0, "reserve 9");
    CHECK(b.n_blocks == 3 && b.blocks[0] == 2 && b.blocks[1] == 3 && b.blocks[2] == 4, "b = [2, 3, 4]");
    CHECK(kv.n_free == 1, "one left");

    /* exhaustion: LI_ENOMEM, blocks taken so far stay with the sequence */
    CHECK(li_kv_seq_reserve(&kv, &a, 16) == LI_ENOMEM, "pool exhausted");
    CHECK(a.n_blocks == 3 && a.blocks[2] == 5 && kv.n_free == 0, "a took block 5");
    CHECK(li_kv_seq_reserve(&kv, &a, 1000) == LI_ENOMEM, "more than the pool");

    /* trim: blocks past ceil(n / block_size) go back, last first; a shared
     * one only loses a reference */
    li_kv_block_ref(&kv, 4);
    li_kv_seq_trim(&kv, &b, 9);
    CHECK(b.n_blocks == 3 && kv.n_free == 0, "9 tokens keep 3 blocks");
    li_kv_seq_trim(&kv, &b, 5);
    CHECK(b.n_blocks == 2 && kv.refcount[4] == 1 && kv.n_free == 0, "shared block 4 keeps its other holder");
    li_kv_block_unref(&kv, 4);
    CHECK(kv.n_free == 1, "block 4 free once its holder lets go");
    CHECK(li_kv_seq_reserve(&kv, &b, 9) == 0 && b.blocks[2] == 4, "b takes block 4 back");
    li_kv_seq_trim(&kv, &b, 0);
    CHECK(b.n_blocks == 0 && kv.n_free == 3, "trim to 0 releases all (free %d)", kv.n_free);
    CHECK(li_kv_seq_reserve(&kv, &b, 9) == 0 && b.blocks[0] == 2 && b.blocks[2] == 4, "b = [2, 3, 4] again");

    /* release: blocks come back; the next allocation reuses the most recently freed */
    li_kv_seq_release(&kv, &b);
    CHECK(kv.n_free == 3 && b.n_blocks == 0, "b released");
    CHECK(li_kv_block_alloc(&kv) == 2, "released head block comes back first");

    /* refcounts: a shared block frees only at zero; double free is ignored */
    li_kv_block_ref(&kv, 0);
    CHECK(kv.refcount[0] == 2, "refcount 2");
    li_kv_seq_release(&kv, &a);
    CHECK(kv.refcount[0] == 1 && kv.n_free == 4, "block 0 still held: free %d", kv.n_free);
    li_kv_block_unref(&kv, 0);
    CHECK(kv.n_free == 5, "block 0 freed");
    li_kv_block_unref(&kv, 0); /* logged, ignored */
    CHECK(kv.n_free == 5 && kv.refcount[0] == 0, "double free ignored");

    /* bad configurations are refused */
    li_kv_cache bad;
    CHECK(li_kv_cache_init(&bad, &host_be, &hp, LI_TYPE_F16, 0, 4, &err) != 0, "block size 0");
    CHECK(li_kv_cache_init(&bad, &host_be, &hp, LI_TYPE_F16, 16, 0, &err) == LI_ENOMEM, "no blocks");
    CHECK(li_kv_cache_init(&bad, &host_be, &hp, LI_TYPE_Q4_0, 16, 4, &err) == LI_EUNSUP, "unsupported dtype");
    li_type t;
    CHECK(li_kv_dtype_parse("bf16", &t, &err) == 0 && t == LI_TYPE_BF16, "parse bf16");
    CHECK(li_kv_dtype_parse("q4", &t, &err) != 0 && strstr(err.msg, "q4"), "parse unknown");

    li_kv_seq_free(&a);
    li_kv_seq_free(&b);
    li_kv_cache_free(&kv);

    /* fork + copy-on-write: children share full blocks; a write into a
     * shared block copies it (contents included) */
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, 4, 8, &err) == 0, "%s", err.msg);
    li_kv_seq p, c;
    li_kv_seq_init(&p);
    li_kv_seq_init(&c);
    CHECK(li_kv_seq_reserve(&kv, &p, 6) == 0 && p.n_blocks == 2, "parent [0, 1]");
    uint16_t *k0 = kv.layers[1].k;
    const size_t per_block = 4 * 3 * 8;
    k0[1 * per_block + 5] = 0x3c00; /* a value in block 1 of layer 1 */
    li_kv_seq_fork(&kv, &p, &c);
    CHECK(c.n_blocks == 2 && c.blocks[0] == 0 && c.blocks[1] == 1, "child shares [0, 1]");
    CHECK(kv.refcount[0] == 2 && kv.refcount[1] == 2 && kv.n_free == 6, "refcounts 2, no new block");
    CHECK(li_kv_seq_cow(&kv, &c, 6, 7) == 0, "cow");
    CHECK(c.blocks[0] == 0 && c.blocks[1] == 2, "child's block 1 copied to 2: [%d, %d]", c.blocks[0], c.blocks[1]);
    CHECK(kv.refcount[1] == 1 && kv.refcount[2] == 1 && kv.refcount[0] == 2, "refcounts after cow");
    CHECK(k0[2 * per_block + 5] == 0x3c00, "block contents copied");
    CHECK(li_kv_seq_cow(&kv, &p, 6, 7) == 0 && p.blocks[1] == 1, "parent now owns block 1 alone: no copy");
    li_kv_seq_release(&kv, &c);
    li_kv_seq_release(&kv, &p);
    CHECK(kv.n_free == 8, "all blocks back after fork/cow (%d)", kv.n_free);
    li_kv_seq_free(&p);
    li_kv_seq_free(&c);
    li_kv_cache_free(&kv);
    /* prefix cache: hashed blocks survive release, are found by hash, and
     * are evicted least-recently-released first; in-use blocks never */
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, 4, 4, &err) == 0, "%s", err.msg);
    li_kv_prefix_enable(&kv);
    int32_t toks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    li_block_hash z = {0, 0};
    li_block_hash h0 = li_kv_block_hash(z, toks, 4, NULL);
    li_block_hash h1 = li_kv_block_hash(h0, toks + 4, 4, NULL);
    li_block_hash h0s = li_kv_block_hash(z, toks, 4, "tenant-b");
    CHECK(h0.lo != h0s.lo || h0.hi != h0s.hi, "salt changes the hash");
    CHECK(h1.lo != li_kv_block_hash(z, toks + 4, 4, NULL).lo, "parent is part of the hash");
    li_kv_seq_init(&a);
    CHECK(li_kv_seq_reserve(&kv, &a, 12) == 0, "three blocks");
    li_block_hash h2 = li_kv_block_hash(h1, toks + 8, 4, NULL);
    CHECK(li_kv_prefix_register(&kv, a.blocks[0], h0, 0) && li_kv_prefix_register(&kv, a.blocks[1], h1, 1) &&
          li_kv_prefix_register(&kv, a.blocks[2], h2, 2), "registered");
    CHECK(!li_kv_prefix_register(&kv, 3, h0, 0), "a duplicate hash is not registered twice");
    CHECK(li_kv_prefix_lookup(&kv, h1) == a.blocks[1], "lookup finds block 1");
    CHECK(li_kv_prefix_lookup(&kv, h0s) == -1, "other salt misses");
    li_kv_seq_release(&kv, &a); /* tail first: blocks 2, 1, 0 enter the LRU in that order */
    CHECK(kv.n_free == 1 && kv.n_evictable == 3 && li_kv_available(&kv) == 4, "cached, not freed");
    CHECK(li_kv_prefix_lookup(&kv, h0) == 0, "still findable after release");
    /* a hit on block 0 takes it out of the evictable list */
    li_kv_prefix_acquire(&kv, 0, 1.0);
    CHECK(kv.refcount[0] == 1 && kv.n_evictable == 2 && kv.hit_count[0] == 1, "acquired");
    /* allocation: the empty block first, then LRU: block 2, then 1; block 0 is in use */
    CHECK(li_kv_block_alloc(&kv) == 3, "empty block first");
    CHECK(li_kv_block_alloc(&kv) == 2, "then the least recently released (deepest) block");
    CHECK(li_kv_prefix_lookup(&kv, h2) == -1 && kv.n_evictions == 1, "evicted block forgotten");
    CHECK(li_kv_block_alloc(&kv) == 1, "then the next");
    CHECK(li_kv_block_alloc(&kv) == -1, "in-use block 0 is never evicted");
    CHECK(li_kv_prefix_lookup(&kv, h0) == 0, "block 0 still cached");
    CHECK(!li_kv_prefix_evict(&kv, 0), "explicit eviction of an in-use block refused");
    li_kv_block_unref(&kv, 0);
    CHECK(li_kv_prefix_evict(&kv, 0) && kv.n_free == 1 && li_kv_prefix_lookup(&kv, h0) == -1, "explicit eviction");
    /* map deletion keeps probe chains intact: many registrations and evictions */
    li_kv_cache_free(&kv);
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, 4, 64, &err) == 0, "%s", err.msg);
    li_kv_prefix_enable(&kv);
    li_block_hash hs[64];
    for (int i = 0; i < 64; i++) {
        int32_t t[4] = {i, i * 7, i * 13, 5};
        hs[i] = li_kv_block_hash(z, t, 4, NULL);
        int32_t id = li_kv_block_alloc(&kv);
        li_kv_prefix_register(&kv, id, hs[i], 0);
        li_kv_block_unref(&kv, id);
    }
    int found = 0;
    for (int i = 0; i < 64; i += 2) li_kv_prefix_evict(&kv, li_kv_prefix_lookup(&kv, hs[i]));
    for (int i = 0; i < 64; i++) found += (li_kv_prefix_lookup(&kv, hs[i]) >= 0) == (i % 2 == 1);
    CHECK(found == 64, "lookups after interleaved evictions: %d/64 right", found);
    li_kv_seq_free(&a);
    li_kv_cache_free(&kv);
    return t_summary("kv");
}
