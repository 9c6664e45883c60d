/* test_prefix_cache.c — the prefix-cache manager (core/kv/prefix_cache.c)
 * on a tiny KV pool:
 *  - disabled, nothing is found, taken or registered;
 *  - registering a sequence's full blocks, then probing: the shared full
 *    blocks are found, one token is always left to compute, a different
 *    salt finds nothing, a sequence holding KV is not probed;
 *  - acquire shares the very blocks (refcounts), counts query and hit;
 *  - the probe shortcut: an eviction (a hash leaving the map) makes the next
 *    probe walk again, while blocks joining extend the last answer;
 *  - release stamps the clock; eviction ahead of allocation hands the
 *    callback the idle blocks in LRU order with their depth and hits, takes
 *    its order, completes a short, wrong or failed answer in LRU order, and
 *    does nothing without a callback or while enough blocks are empty. */
#include "kv/prefix_cache.h"
#include "test_util.h"

#include <string.h>

static double clock_now;
static double fake_clock(const void *ud) {
    (void)ud;
    return clock_now;
}

static const li_kv_dims hp = {.n_layer = 1, .n_head_kv = 1, .head_dim = 4};
static li_backend host_be; /* the reference ops' host buffers (set in main) */
enum { BS = 4, NBLOCKS = 32 };

typedef struct sq {
    int32_t toks[64];
    int64_t n, computed;
    li_kv_seq seq;
    li_prefix_seq ps;
    const char *salt;
} sq;

static void sq_init(sq *s, const int32_t *toks, int64_t n, const char *salt) {
    memset(s, 0, sizeof *s);
    memcpy(s->toks, toks, (size_t)n * sizeof *toks);
    s->n = n;
    s->salt = salt;
    li_kv_seq_init(&s->seq);
    li_prefix_seq_init(&s->ps);
}

static int32_t probe(li_prefix_cache *pc, sq *s) {
    return li_prefix_probe(pc, &s->ps, &s->seq, s->computed, s->toks, s->n, s->salt);
}

/* Computes all of s (new blocks) and registers its full blocks. */
static void fill(li_prefix_cache *pc, sq *s) {
    CHECK(li_kv_seq_reserve(pc->kv, &s->seq, s->n) == 0, "reserve");
    s->computed = s->n;
    li_prefix_register(pc, &s->ps, &s->seq, s->computed, s->toks, s->salt);
}

static void sq_free(li_prefix_cache *pc, sq *s) {
    li_prefix_release(pc, &s->ps, &s->seq);
    li_kv_seq_free(&s->seq);
    li_prefix_seq_free(&s->ps);
}

static void test_disabled(void) {
    li_kv_cache kv;
    li_error err = {0};
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, BS, NBLOCKS, &err) == 0, "%s", err.msg);
    li_prefix_cache pc;
    li_prefix_cache_init(&pc, &kv, false, fake_clock, NULL);
    CHECK(!li_prefix_cache_enabled(&pc), "off");
    int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    sq a, b;
    sq_init(&a, t, 12, "");
    sq_init(&b, t, 12, "");
    fill(&pc, &a);
    CHECK(li_prefix_cache_blocks(&pc) == 0, "nothing registered");
    CHECK(probe(&pc, &b) == 0, "nothing found");
    CHECK(li_prefix_acquire(&pc, &b.ps, &b.seq, 0, b.toks, b.n, "") == 0 && b.seq.n_blocks == 0, "nothing taken");
    CHECK(pc.query_tokens == 0, "no query counted");
    sq_free(&pc, &a);
    sq_free(&pc, &b);
    li_prefix_cache_free(&pc);
    li_kv_cache_free(&kv);
}

static void test_probe_acquire(void) {
    li_kv_cache kv;
    li_error err = {0};
    CHECK(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, BS, NBLOCKS, &err) == 0, "%s", err.msg);
    li_prefix_cache pc;
    li_prefix_cache_init(&pc, &kv, true, fake_clock, NULL);
    CHECK(li_prefix_cache_enabled(&pc), "on");

    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 100 + i;
    sq a;
    sq_init(&a, t, 14, "");
    clock_now = 1;
    fill(&pc, &a); /* 3 full blocks of 4, 2 tokens in a 4th */
    CHECK(li_prefix_cache_blocks(&pc) == 3 && a.ps.n_registered == 3, "3 full blocks registered: %d",
          li_prefix_cache_blocks(&pc));
    CHECK(kv.last_access[a.seq.blocks[0]] == 1, "registration stamps the clock");
    li_prefix_register(&pc, &a.ps, &a.seq, a.computed, a.toks, a.salt);
    CHECK(li_prefix_cache_blocks(&pc) == 3, "registering twice adds nothing");

    sq b, c, d, e;
    int32_t tb[16];
    memcpy(tb, t, sizeof tb);
    tb[12] = 7; /* same 3 blocks, then different */
    sq_init(&b, tb, 14, "");
    sq_init(&c, t, 12, "");    /* exactly 3 blocks: the last must stay uncomputed */
    sq_init(&d, t, 14, "x");   /* another salt */
    sq_init(&e, t, 14, "");
    CHECK(probe(&pc, &b) == 3, "3 shared blocks: %d", probe(&pc, &b));
    CHECK(probe(&pc, &c) == 2, "12 tokens: 2 blocks, one token left: %d", probe(&pc, &c));
    CHECK(probe(&pc, &d) == 0, "another salt finds nothing");
    e.computed = 3;
    CHECK(probe(&pc, &e) == 0, "a sequence with computed tokens is not probed");

    clock_now = 2;
    int64_t got = li_prefix_acquire(&pc, &b.ps, &b.seq, 0, b.toks, b.n, b.salt);
    CHECK(got == 12 && b.seq.n_blocks == 3, "acquire: %lld tokens, %d blocks", (long long)got, b.seq.n_blocks);
    for (int i = 0; i < 3; i++)
        CHECK(b.seq.blocks[i] == a.seq.blocks[i] && kv.refcount[a.seq.blocks[i]] == 2 &&
                  kv.hit_count[a.seq.blocks[i]] == 1 && kv.last_access[a.seq.blocks[i]] == 2,
              "block %d shared, counted and stamped", i);
    CHECK(b.ps.n_registered == 3, "taken blocks count as registered");
    CHECK(pc.query_tokens == 14 && pc.hit_tokens == 12, "query %lld hit %lld", (long long)pc.query_tokens,
          (long long)pc.hit_tokens);
    CHECK(li_prefix_acquire(&pc, &b.ps, &b.seq, 12, b.toks, b.n, b.salt) == 0 && pc.query_tokens == 14,
          "a sequence holding KV takes nothing more");
    got = li_prefix_acquire(&pc, &d.ps, &d.seq, 0, d.toks, d.n, d.salt);
    CHECK(got == 0 && pc.query_tokens == 28 && pc.hit_tokens == 12, "a miss counts the query only");

    /* fork: the child is registered as far as its parent */
    li_prefix_seq f;
    li_prefix_seq_init(&f);
    li_prefix_seq_fork(&f, &b.ps);
    CHECK(f.n_registered == 3, "fork copies the registered count");
    li_prefix_seq_free(&f);

    /* release: blocks go idle (evictable) and remember when */
    clock_now = 3;
    li_prefix_release(&pc, &a.ps, &a.seq);
    clock_now = 4;
    li_prefix_release(&pc, &b.ps, &b.seq);
    CHECK(kv.n_evictable == 3 && b.seq.n_blocks == 0 && b.ps.n_registered == 0, "idle after release: %d",
          kv.n_evictable);
    CHECK(kv.last_access[a.seq.blocks[0]] == 4, "the last release stamps the clock");

    /* the probe shortcut: c found 2 at this map version; evicting block 1
     * changes the version, and the next probe must walk again */
    CHECK(probe(&pc, &c) == 2, "c before eviction");
    const int32_t blk1 = li_kv_prefix_lookup(&kv, c.ps.hash[1]);
    CHECK(li_kv_prefix_evict(&kv, blk1), "evict block 1");
    CHECK(probe(&pc, &c) == 1, "after an eviction the walk starts over: %d", probe(&pc, &c));
    CHECK(probe(&pc, &b) == 1, "b too: %d", probe(&pc, &b));
    /* blocks joining the map keep the version: the walk resumes from the last answer */
    const uint64_t v = kv.map_version;
    sq g;
    sq_init(&g, t, 14, "");
    fill(&pc, &g); /* registers block 1 and 2 again (block 0 is already cached) */
    CHECK(kv.map_version == v, "registration bumps no version");
    CHECK(probe(&pc, &c) == 2, "the walk goes on from 1: %d", probe(&pc, &c));

    sq_free(&pc, &a);
    sq_free(&pc, &b);
    sq_free(&pc, &c);
    sq_free(&pc, &d);
    sq_free(&pc, &e);
    sq_free(&pc, &g);
    li_prefix_cache_free(&pc);
    li_kv_cache_free(&kv);
}

/* ---- eviction -------------------------------------------------------------------- */

typedef struct order_fx {
    int calls, fail;
    li_prefix_candidate seen[NBLOCKS];
    int32_t n_seen, want;
    int32_t answer[NBLOCKS], n_answer;
} order_fx;

static int order_cb(void *ud, const li_prefix_candidate *c, int32_t n, int32_t want, int32_t *order, int32_t *n_order) {
    order_fx *o = ud;
    o->calls++;
    memcpy(o->seen, c, (size_t)n * sizeof *c);
    o->n_seen = n;
    o->want = want;
    memcpy(order, o->answer, (size_t)o->n_answer * sizeof *order);
    *n_order = o->n_answer;
    return o->fail;
}

/* A pool of NBLOCKS with 8 idle cached blocks (4 sequences of 2 full blocks,
 * released at clock 10, 11, 12, 13) and the rest held by a filler sequence,
 * leaving `empty` blocks empty. */
static void evict_fixture(li_kv_cache *kv, li_prefix_cache *pc, li_kv_seq *filler, int32_t empty, int32_t ids[8]) {
    li_error err = {0};
    CHECK(li_kv_cache_init(kv, &host_be, &hp, LI_TYPE_F16, BS, NBLOCKS, &err) == 0, "%s", err.msg);
    li_prefix_cache_init(pc, kv, true, fake_clock, NULL);
    for (int s = 0; s < 4; s++) {
        int32_t t[9];
        for (int i = 0; i < 9; i++) t[i] = 1000 * (s + 1) + i;
        sq q;
        sq_init(&q, t, 9, "");
        fill(pc, &q);
        ids[2 * s] = q.seq.blocks[0];
        ids[2 * s + 1] = q.seq.blocks[1];
        clock_now = 10 + s;
        sq_free(pc, &q); /* its third (partial) block is empty again */
    }
    li_kv_seq_init(filler);
    CHECK(li_kv_seq_reserve(kv, filler, (int64_t)(kv->n_free - empty) * BS) == 0, "filler");
    CHECK(kv->n_free == empty && kv->n_evictable == 8, "fixture: %d empty, %d idle", kv->n_free, kv->n_evictable);
}

static void evict_done(li_kv_cache *kv, li_prefix_cache *pc, li_kv_seq *filler) {
    li_kv_seq_release(kv, filler);
    li_kv_seq_free(filler);
    li_prefix_cache_free(pc);
    li_kv_cache_free(kv);
}

static void test_evict(void) {
    li_kv_cache kv;
    li_prefix_cache pc;
    li_kv_seq filler;
    int32_t ids[8];
    order_fx o;
    bool short_order;

    /* the callback sees the idle blocks in LRU order and its order is used */
    evict_fixture(&kv, &pc, &filler, 0, ids);
    memset(&o, 0, sizeof o);
    o.answer[0] = ids[7];
    o.answer[1] = ids[6];
    o.n_answer = 2;
    int rc = li_prefix_evict_for(&pc, 2, order_cb, &o, &short_order);
    CHECK(rc == 0 && o.calls == 1 && !short_order, "asked once");
    CHECK(o.n_seen == 8 && o.want == 2, "8 candidates, want 2 (the batch is max(need, pool/16 = 2)): %d %d", o.n_seen,
          o.want);
    bool lru = true;
    for (int i = 0; i < 8 && i < o.n_seen; i++)
        /* a sequence is released tail first: its block 1 idles before its block 0 */
        lru &= o.seen[i].block == ids[i ^ 1] && o.seen[i].last_access == 10 + i / 2 && o.seen[i].depth == 1 - i % 2 &&
               o.seen[i].hits == 0;
    CHECK(lru, "candidates in LRU order with their clock and depth");
    CHECK(!kv.hashed[ids[7]] && !kv.hashed[ids[6]] && kv.hashed[ids[0]] && kv.n_free == 2,
          "the callback's choice was evicted, LRU's was not");
    CHECK(li_prefix_cache_evictions(&pc) == 2, "evictions counted");
    /* enough empty blocks: nobody is asked */
    CHECK(li_prefix_evict_for(&pc, 2, order_cb, &o, &short_order) == 0 && o.calls == 1,
          "not asked when enough are empty");
    evict_done(&kv, &pc, &filler);

    /* a short answer with a wrong id: completed in LRU order, flagged */
    evict_fixture(&kv, &pc, &filler, 0, ids);
    memset(&o, 0, sizeof o);
    o.answer[0] = filler.blocks[0]; /* in use: not a candidate */
    o.answer[1] = ids[5];
    o.n_answer = 2;
    li_prefix_evict_for(&pc, 3, order_cb, &o, &short_order);
    CHECK(short_order, "a wrong id makes the order short");
    CHECK(kv.refcount[filler.blocks[0]] == 1, "a block in use is never evicted");
    CHECK(!kv.hashed[ids[5]] && !kv.hashed[ids[0]] && !kv.hashed[ids[1]] && kv.hashed[ids[2]] && kv.n_free == 3,
          "ids[5] then LRU (0, 1): %d free", kv.n_free);
    evict_done(&kv, &pc, &filler);

    /* a failed callback: its error comes back, LRU does the batch */
    evict_fixture(&kv, &pc, &filler, 0, ids);
    memset(&o, 0, sizeof o);
    o.fail = 5;
    o.answer[0] = ids[7];
    o.n_answer = 1;
    rc = li_prefix_evict_for(&pc, 1, order_cb, &o, &short_order);
    CHECK(rc == 5 && !short_order, "the callback's error is returned");
    CHECK(kv.hashed[ids[7]] && !kv.hashed[ids[0]] && !kv.hashed[ids[1]] && kv.n_free == 2,
          "a failed answer is ignored: LRU evicts the batch of 2");
    evict_done(&kv, &pc, &filler);

    /* no callback: nothing now (allocation evicts LRU by itself) */
    evict_fixture(&kv, &pc, &filler, 0, ids);
    CHECK(li_prefix_evict_for(&pc, 4, NULL, NULL, &short_order) == 0 && kv.n_free == 0 && kv.n_evictable == 8,
          "no callback, no eviction");
    /* need beyond the batch size, capped by what is idle */
    memset(&o, 0, sizeof o);
    li_prefix_evict_for(&pc, 20, order_cb, &o, &short_order);
    CHECK(o.want == 8 && kv.n_free == 8 && kv.n_evictable == 0, "want capped at the idle blocks: %d", o.want);
    evict_done(&kv, &pc, &filler);
}

int main(void) {
    host_be.ops = li_backend_ref_ops();
    test_disabled();
    test_probe_acquire();
    test_evict();
    return t_summary("test_prefix_cache");
}
