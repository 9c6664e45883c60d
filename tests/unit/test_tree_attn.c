/* test_tree_attn.c — tree attention (li_batch.parent) on the real model.
 *
 * After a committed prefix of P tokens, one forward pass computes a tree of
 * candidates with two roots and several branches:
 *
 *   A(P) ─ B(P+1) ─ D(P+2) ─ G(P+3)     A B D G sit at their sequence's own
 *        │        └ E(P+2)              slots (no view needed); the other
 *        └ C(P+1) ─ F(P+2)              nodes have slots of their own
 *   H(P) ─ I(P+1)
 *
 * plus a decode token of another sequence in the same batch. Every node's
 * logits must equal, bit for bit, what its branch gives computed alone
 * (causal, in a copy-on-write fork of the prefix), for several ISAs and KV
 * dtypes. Malformed parents are refused. */
#include "engine/session.h"
#include "test_util.h"

#include <string.h>

enum { P = 10, N_TREE = 9, BS = 4 };

/* parent, token of each tree row; rows 0, 1, 3, 6 are the in-place branch */
static const int32_t parent[N_TREE] = {-1, 0, 0, 1, 1, 2, 3, -1, 7};
static const int32_t tok_of[N_TREE] = {510, 1200, 733, 91, 4040, 2222, 17, 880, 3001};
/* the branches, root first, as tree rows; together they cover every node */
static const int branch[4][4] = {{0, 1, 3, 6}, {0, 1, 4, -1}, {0, 2, 5, -1}, {7, 8, -1, -1}};

static int depth(int r) { return parent[r] < 0 ? 0 : depth(parent[r]) + 1; }

typedef struct {
    li_model *m;
    li_backend *be;
    li_kv_cache kv;
    li_forward fw;
    li_error err;
} ctx;

/* Runs n tokens of one sequence causally at positions p0.. and returns the
 * logits of every row (n, n_vocab) in out. */
static int run_chain(ctx *c, li_kv_seq *s, const int32_t *toks, int n, int p0, float *out) {
    if (li_kv_seq_reserve(&c->kv, s, p0 + n) || li_kv_seq_cow(&c->kv, s, p0, p0 + n)) return LI_ENOMEM;
    int32_t pos[16], seq[16], rows[16];
    int64_t slot[16];
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        seq[i] = 0;
        rows[i] = i;
        slot[i] = li_kv_seq_slot(&c->kv, s, p0 + i);
    }
    li_batch b = {.n = n, .tokens = toks, .pos = pos, .seq = seq, .slot = slot, .block_table = s->blocks,
                  .n_seqs = 1, .bt_stride = s->n_blocks, .logit_rows = rows, .n_logits = n};
    return li_forward_run(&c->fw, c->m, c->be, &c->kv, &b, out, &c->err);
}

static void check_config(li_model *m, const char *isa, li_type dtype) {
    li_backend be;
    ctx c = {.m = m, .be = &be};
    CHECK(li_backend_cpu_init(&be, 2, isa, &c.err) == 0, "%s", c.err.msg);
    CHECK(li_model_prepare(m, &be, &c.err) == 0, "%s", c.err.msg);
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    CHECK(li_kv_cache_init(&c.kv, &be, &dims, dtype, BS, 64, &c.err) == 0, "%s", c.err.msg);
    CHECK(li_forward_init(&c.fw, m, &be, 32, &c.err) == 0, "%s", c.err.msg);
    const int64_t nv = m->hp.n_vocab;
    float *tree = malloc(sizeof(float) * (N_TREE + 1) * (size_t)nv), *alone = malloc(sizeof(float) * 16 * (size_t)nv);

    /* the committed prefixes: sequence 0 (P tokens, room for the in-place
     * branch) and sequence 1 (6 tokens, then one decode token) */
    int32_t prefix[P], other[7];
    for (int i = 0; i < P; i++) prefix[i] = 300 + 37 * i;
    for (int i = 0; i < 7; i++) other[i] = 900 + 11 * i;
    li_kv_seq s0, s1, nodes;
    li_kv_seq_init(&s0);
    li_kv_seq_init(&s1);
    li_kv_seq_init(&nodes);
    CHECK(run_chain(&c, &s0, prefix, P, 0, alone) == 0, "prefix: %s", c.err.msg);
    CHECK(run_chain(&c, &s1, other, 6, 0, alone) == 0, "other prefix: %s", c.err.msg);
    CHECK(li_kv_seq_reserve(&c.kv, &s0, P + 4) == 0 && li_kv_seq_reserve(&c.kv, &s1, 7) == 0, "reserve");
    CHECK(li_kv_seq_reserve(&c.kv, &nodes, N_TREE) == 0, "slots for the displaced nodes");

    /* the tree batch: 9 nodes of sequence 0, then sequence 1's decode token */
    const int64_t stride = LI_MAX(s0.n_blocks, s1.n_blocks);
    int32_t *table = calloc(2 * (size_t)stride, sizeof(int32_t));
    memcpy(table, s0.blocks, (size_t)s0.n_blocks * sizeof(int32_t));
    memcpy(table + stride, s1.blocks, (size_t)s1.n_blocks * sizeof(int32_t));
    int32_t toks[N_TREE + 1], pos[N_TREE + 1], seq[N_TREE + 1], par[N_TREE + 1], rows[N_TREE + 1];
    int64_t slot[N_TREE + 1];
    for (int r = 0; r < N_TREE; r++) {
        const bool in_place = r == 0 || r == 1 || r == 3 || r == 6;
        toks[r] = tok_of[r];
        pos[r] = P + depth(r);
        seq[r] = 0;
        par[r] = parent[r];
        slot[r] = in_place ? li_kv_seq_slot(&c.kv, &s0, pos[r]) : li_kv_seq_slot(&c.kv, &nodes, r);
    }
    toks[N_TREE] = other[6];
    pos[N_TREE] = 6;
    seq[N_TREE] = 1;
    par[N_TREE] = -1;
    slot[N_TREE] = li_kv_seq_slot(&c.kv, &s1, 6);
    for (int r = 0; r <= N_TREE; r++) rows[r] = r;
    li_batch b = {.n = N_TREE + 1, .tokens = toks, .pos = pos, .seq = seq, .slot = slot, .block_table = table,
                  .n_seqs = 2, .bt_stride = stride, .logit_rows = rows, .n_logits = N_TREE + 1, .parent = par};
    const int32_t free0 = li_kv_available(&c.kv);
    CHECK(li_forward_run(&c.fw, m, &be, &c.kv, &b, tree, &c.err) == 0, "tree pass: %s", c.err.msg);
    CHECK(li_kv_available(&c.kv) == free0, "the views' scratch blocks went back to the pool");

    /* each branch alone, causally, in a fork of the prefix */
    bool same = true;
    int checked = 0;
    for (int k = 0; k < 4; k++) {
        int32_t bt[4];
        int len = 0;
        while (len < 4 && branch[k][len] >= 0) bt[len] = tok_of[branch[k][len]], len++;
        li_kv_seq f;
        li_kv_seq_init(&f);
        li_kv_seq pre = s0;
        pre.n_blocks = (P + BS - 1) / BS; /* the committed prefix's blocks only */
        li_kv_seq_fork(&c.kv, &pre, &f);
        CHECK(run_chain(&c, &f, bt, len, P, alone) == 0, "branch %d alone: %s", k, c.err.msg);
        for (int j = 0; j < len; j++, checked++) {
            const bool eq = !memcmp(alone + (size_t)j * nv, tree + (size_t)branch[k][j] * nv, sizeof(float) * nv);
            if (!eq) printf("  %s %s: node %d of branch %d differs\n", isa, li_kv_dtype_name(dtype), branch[k][j], k);
            same &= eq;
        }
        li_kv_seq_release(&c.kv, &f);
        li_kv_seq_free(&f);
    }
    CHECK(same, "%s, %s KV: all %d nodes (4 branches) have their branch's logits alone, bit for bit", isa,
          li_kv_dtype_name(dtype), checked);
    /* the other sequence's decode token is untouched by the tree beside it */
    li_kv_seq f1;
    li_kv_seq_init(&f1);
    li_kv_seq_fork(&c.kv, &s1, &f1);
    CHECK(run_chain(&c, &f1, &other[6], 1, 6, alone) == 0, "%s", c.err.msg);
    CHECK(!memcmp(alone, tree + (size_t)N_TREE * nv, sizeof(float) * nv),
          "%s, %s KV: a causal token beside the tree is unchanged", isa, li_kv_dtype_name(dtype));
    li_kv_seq_release(&c.kv, &f1);
    li_kv_seq_free(&f1);
    printf("%s, %s KV: %d tree nodes checked against their branches\n", isa, li_kv_dtype_name(dtype), checked);

    /* malformed trees are refused */
    par[2] = 5;
    CHECK(li_forward_run(&c.fw, m, &be, &c.kv, &b, NULL, &c.err) == LI_EINVAL && strstr(c.err.msg, "earlier"),
          "a parent after its child is refused: %s", c.err.msg);
    par[2] = 1; /* B is at P+1, as C: not the position before */
    CHECK(li_forward_run(&c.fw, m, &be, &c.kv, &b, NULL, &c.err) == LI_EINVAL && strstr(c.err.msg, "position"),
          "a parent at the wrong position is refused: %s", c.err.msg);
    par[2] = 0;
    par[N_TREE] = 8; /* another sequence's node */
    CHECK(li_forward_run(&c.fw, m, &be, &c.kv, &b, NULL, &c.err) == LI_EINVAL, "a parent of another sequence is refused");
    CHECK(li_kv_available(&c.kv) == free0, "no scratch block kept after a refusal");

    free(table);
    free(tree);
    free(alone);
    li_kv_seq_release(&c.kv, &s0);
    li_kv_seq_release(&c.kv, &s1);
    li_kv_seq_release(&c.kv, &nodes);
    li_kv_seq_free(&s0);
    li_kv_seq_free(&s1);
    li_kv_seq_free(&nodes);
    li_forward_free(&c.fw);
    li_kv_cache_free(&c.kv);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

int main(void) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(NULL), &err) != 0) {
        printf("SKIP: model not loadable (%s)\n", err.msg);
        return 77;
    }
    check_config(m, "auto", LI_TYPE_F16);
    check_config(m, "auto", LI_KV_TYPE_INT8);
    check_config(m, "scalar", LI_TYPE_BF16);
    li_model_free(m);
    return t_summary("tree_attn");
}
