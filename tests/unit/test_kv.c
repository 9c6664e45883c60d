/* test_kv.c — the block pool with exact block ids. */
#include "kv/kv_cache.h"
#include "test_util.h"

#include <string.h>

int main(void) {
    li_error err = {0};
    li_hparams hp = {.n_layer = 2, .n_head_kv = 3, .head_dim = 8};
    li_kv_cache kv;
    CHECK(li_kv_bytes_per_token(&hp, LI_TYPE_F16) == 2u * 2 * 3 * 8 * 2, "bytes per token f16");
    CHECK(li_kv_bytes_per_token(&hp, LI_TYPE_F32) == 2u * 2 * 3 * 8 * 4, "bytes per token f32");
    CHECK(li_kv_blocks_for_budget(&hp, LI_TYPE_F16, 4, 96 * 4 * 10 + 5) == 10, "blocks for budget");
    CHECK(li_kv_cache_init(&kv, &hp, LI_TYPE_F16, 4, 6, &err) == 0, "%s", err.msg);
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
    CHECK(li_kv_cache_init(&bad, &hp, LI_TYPE_F16, 0, 4, &err) != 0, "block size 0");
    CHECK(li_kv_cache_init(&bad, &hp, LI_TYPE_F16, 16, 0, &err) == LI_ENOMEM, "no blocks");
    CHECK(li_kv_cache_init(&bad, &hp, LI_TYPE_Q4_0, 16, 4, &err) == LI_EUNSUP, "unsupported dtype");
    li_type t;
    CHECK(li_kv_dtype_parse("bf16", &t, &err) == 0 && t == LI_TYPE_BF16, "parse bf16");
    CHECK(li_kv_dtype_parse("q4", &t, &err) != 0 && strstr(err.msg, "q4"), "parse unknown");

    li_kv_seq_free(&a);
    li_kv_seq_free(&b);
    li_kv_cache_free(&kv);
    return t_summary("kv");
}
