/* test_medusa.c — Medusa heads (spec/medusa.h) and their tree in the engine.
 *
 * A tiny model (tests/golden/spm_tiny.gguf's 2000-token vocabulary, random
 * weights, 36 wide: no SIMD width divides it) and heads files written here
 * (write_heads: random or zero, F32 or F16; no dependency on train-medusa):
 *  - a good file loads; every check of the format refuses a bad one with a
 *    one-line error naming the field: architecture, version, K = 0 and 9,
 *    the vocabulary hash, n_embd, a weight's shape and type, a bias's type,
 *    a truncated file; another base name alone loads;
 *  - the heads' forward on the CPU backend (auto ISA and scalar) equals a
 *    float64 transcription of h + SiLU(W h + b), then output · that, at
 *    5 rows;
 *  - tree specs: the default's order (the top-1 chain first, parents before
 *    children), prefixes added, bad specs refused;
 *  - the proposer drafts each node's rank of its head's top-k;
 *  - the engine: greedy output with Medusa (random and zero heads) equals
 *    the engine without speculation, token for token and logit bit for bit,
 *    over a batch of requests (one with n = 2 samples sharing its prompt's
 *    blocks) with chunked prefill, under preemption (a tiny
 *    KV) and with prefix-cache hits; tree drafts off the chain are accepted
 *    (their KV moved) on the way. At temperature 0.8 the same seed gives the
 *    same tokens;
 *  - with --real (ctest unit/test_medusa_real, label slow), the real model
 *    with zero heads: greedy output equals no speculation, with tree drafts
 *    off the chain accepted (this is the run that fails when the KV of
 *    accepted drafts is not moved to their positions' slots);
 *  - refusals: Medusa with tensor_parallel 2, on the ggml ISA, a bad tree. */
#define _POSIX_C_SOURCE 200809L
#include "engine/engine.h"
#include "model/gguf_write.h"
#include "spec/medusa.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"
#include "train/train.h"
#include "test_util.h"
#include "tiny_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

/* ==== the tiny model ======================================================== */

static li_hparams tiny_hp(void) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 2000;
    hp.n_embd = 36;
    hp.n_layer = 2;
    hp.n_head = 3;
    hp.n_head_kv = 1;
    hp.head_dim = 12;
    hp.n_ff = 40;
    hp.n_rot = 12;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.n_ctx_train = 256;
    return hp;
}

static int make_tiny(char *base, size_t cap) {
    const li_hparams hp = tiny_hp();
    return li_test_tiny_model(&hp, "tiny-medusa-base", 5, 4.0f, dir, base, cap);
}

/* ==== heads files =========================================================== */

typedef struct heads_opt {
    int k;                 /* heads */
    li_type type;          /* of the weights: F32 or F16 */
    float scale;           /* of the random weights and biases; 0 = zero heads */
    uint64_t seed;
    /* corruptions */
    const char *arch, *hash, *base_name, *hidden;
    int version, n_heads, n_embd; /* 0 = right */
    int weight_rows;       /* 0 = n_embd */
    bool bias_f16, no_bias1;
} heads_opt;

static int write_heads(const char *path, const li_model *m, const heads_opt *o) {
    li_error err = {0};
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    const int64_t E = m->hp.n_embd;
    const int k = o->k;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)li_tokenizer_vocab_hash(m->tok));
    int rc = li_gguf_writer_add_str(&w, "general.architecture", o->arch ? o->arch : "medusa", &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.version", o->version ? (uint32_t)o->version : 1, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_heads", o->n_heads ? (uint32_t)(o->n_heads < 0 ? 0 : o->n_heads) : (uint32_t)k, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_embd", o->n_embd ? (uint32_t)o->n_embd : (uint32_t)E, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "medusa.n_vocab", (uint32_t)m->hp.n_vocab, &err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.base.name", o->base_name ? o->base_name : "tiny-medusa-base", &err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.base.vocab_hash", o->hash ? o->hash : hash, &err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "medusa.hidden", o->hidden ? o->hidden : "post_norm", &err);
    rng_seed(o->seed ? o->seed : 11);
    for (int h = 0; h < k && !rc; h++) {
        char name[64];
        const int64_t rows = o->weight_rows ? o->weight_rows : E;
        const int64_t ne[2] = {E, rows};
        const size_t n = (size_t)(E * rows);
        void *data;
        size_t bytes;
        if (o->type == LI_TYPE_F16 || o->type == LI_TYPE_BF16) {
            uint16_t *d = malloc(n * 2);
            for (size_t i = 0; i < n; i++) d[i] = li_fp32_to_fp16(o->scale * rng_f());
            data = d, bytes = n * 2;
        } else {
            float *d = malloc(n * 4);
            for (size_t i = 0; i < n; i++) d[i] = o->scale * rng_f();
            data = d, bytes = n * 4;
        }
        snprintf(name, sizeof name, "medusa.%d.weight", h);
        rc = li_gguf_writer_add_tensor(&w, name, o->type, 2, ne, data, bytes, &err);
        if (rc || (o->no_bias1 && h == 1)) continue;
        snprintf(name, sizeof name, "medusa.%d.bias", h);
        if (o->bias_f16) {
            uint16_t *b = calloc((size_t)E, 2);
            rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F16, 1, &E, b, (size_t)E * 2, &err);
        } else {
            float *b = malloc((size_t)E * 4);
            for (int64_t i = 0; i < E; i++) b[i] = o->scale * rng_f();
            rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F32, 1, &E, b, (size_t)E * 4, &err);
        }
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, &err);
    li_gguf_writer_free(&w);
    CHECK(rc == 0, "write %s: %s", path, err.msg);
    return rc;
}

/* ==== loading checks ========================================================= */

static void expect_refused(const li_model *m, const heads_opt *o, const char *what, const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    if (write_heads(path, m, o)) return;
    li_medusa *h = NULL;
    li_error err = {0};
    const int rc = li_medusa_load(&h, path, m, &err);
    CHECK(rc != 0 && !h && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "%s refused (%s): %s", what, needle,
          err.msg);
    li_medusa_free(h);
}

static void test_load(const li_model *m) {
    char path[512];
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    heads_opt o = {.k = 3, .type = LI_TYPE_F32, .scale = 0.3f};
    CHECK(write_heads(path, m, &o) == 0, "write");
    li_medusa *h = NULL;
    li_error err = {0};
    CHECK(li_medusa_load(&h, path, m, &err) == 0 && h && h->n_heads == 3 && h->n_embd == m->hp.n_embd,
          "a good heads file loads: %s", err.msg);
    li_medusa_free(h);
    heads_opt b = o;
    b.arch = "llama";
    expect_refused(m, &b, "another architecture", "general.architecture");
    b = o, b.version = 2;
    expect_refused(m, &b, "version 2", "medusa.version");
    b = o, b.n_heads = -1;
    expect_refused(m, &b, "K = 0", "medusa.n_heads");
    b = o, b.n_heads = 9;
    expect_refused(m, &b, "K = 9", "medusa.n_heads");
    b = o, b.hash = "0123456789abcdef";
    expect_refused(m, &b, "another vocabulary", "vocab hash 0123456789abcdef");
    b = o, b.hash = "xyz";
    expect_refused(m, &b, "a malformed hash", "vocab_hash");
    b = o, b.n_embd = 40;
    expect_refused(m, &b, "another n_embd", "n_embd 40");
    b = o, b.weight_rows = 35;
    expect_refused(m, &b, "a weight of the wrong shape", "medusa.0.weight");
    b = o, b.type = LI_TYPE_BF16;
    expect_refused(m, &b, "a bf16 weight", "medusa.0.weight");
    b = o, b.bias_f16 = true;
    expect_refused(m, &b, "an f16 bias", "medusa.0.bias");
    b = o, b.no_bias1 = true;
    expect_refused(m, &b, "a missing bias", "medusa.1.bias");
    b = o, b.hidden = "pre_norm";
    expect_refused(m, &b, "pre-norm heads", "medusa.hidden");
    /* the base named otherwise: a warning only */
    b = o, b.base_name = "some-quantized-copy";
    snprintf(path, sizeof path, "%s/renamed.gguf", dir);
    write_heads(path, m, &b);
    CHECK(li_medusa_load(&h, path, m, &err) == 0, "another base name alone loads: %s", err.msg);
    li_medusa_free(h);
    /* truncated: a good file cut short */
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    FILE *f = fopen(path, "rb");
    char cut[512];
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    FILE *g = fopen(cut, "wb");
    char buf[4096];
    size_t total = 0, n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0 && total < 3000) fwrite(buf, 1, n, g), total += n;
    fclose(f);
    fclose(g);
    h = NULL;
    CHECK(li_medusa_load(&h, cut, m, &err) != 0 && !h && !strchr(err.msg, '\n'), "a truncated file is refused: %s",
          err.msg);
    CHECK(li_medusa_load(&h, "/nonexistent/heads.gguf", m, &err) != 0, "a missing file is refused: %s", err.msg);
}

/* ==== the forward against float64 ========================================== */

static void test_forward(li_model *m, const char *isa, li_type wtype) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, isa, &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/fw.gguf", dir);
    heads_opt o = {.k = 3, .type = wtype, .scale = 0.4f, .seed = 99};
    write_heads(path, m, &o);
    li_medusa *h;
    CHECK(li_medusa_load(&h, path, m, &err) == 0, "%s", err.msg);
    CHECK(li_medusa_prepare(h, m, &be, 8, &err) == 0, "%s", err.msg);
    enum { N = 5 };
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    float hid[N * 64];
    rng_seed(3);
    for (int i = 0; i < N * E; i++) hid[i] = 2 * rng_f();
    const float *lg = li_medusa_run(h, hid, N, 3, &err);
    CHECK(lg != NULL, "run: %s", err.msg);
    /* float64: the file's weights as stored (f16 widened), the model's output rows dequantized */
    double worst = 0;
    float *orow = malloc(sizeof(float) * (size_t)E);
    for (int k = 0; k < 3 && lg; k++)
        for (int r = 0; r < N; r++) {
            double z[64];
            for (int o2 = 0; o2 < E; o2++) {
                double acc = h->b[k][o2];
                for (int i = 0; i < E; i++) {
                    const double wv = wtype == LI_TYPE_F16 ? li_fp16_to_fp32(((const uint16_t *)h->w[k].data)[o2 * E + i])
                                                           : ((const float *)h->w[k].data)[o2 * E + i];
                    acc += wv * hid[r * E + i];
                }
                z[o2] = hid[r * E + o2] + acc / (1 + exp(-acc));
            }
            for (int v = 0; v < V; v++) {
                li_weight_dequant_row_ref(&m->output, v, orow);
                double want = 0;
                for (int i = 0; i < E; i++) want += (double)orow[i] * z[i];
                const double got = lg[((size_t)k * N + r) * V + v];
                worst = fmax(worst, fabs(got - want) / (1 + fabs(want)));
            }
        }
    free(orow);
    CHECK(worst < 1e-4, "%s, %s heads: the heads' logits match float64 (worst rel. diff %.2e)", isa,
          li_type_name(wtype), worst);
    CHECK(li_medusa_run(h, hid, 9, 3, &err) == NULL && strstr(err.msg, "capacity"), "more rows than prepared refused");
    li_medusa_free(h);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

/* ==== trees ================================================================= */

static void test_tree(void) {
    li_medusa_tree t;
    li_error err = {0};
    CHECK(li_medusa_tree_parse(NULL, 4, &t, &err) == 0 && t.n == 15 && t.chain == 4 && t.max_depth == 4,
          "the default over 4 heads: 15 nodes, a chain of 4 (%d, %d)", t.n, t.chain);
    bool ok = true;
    for (int i = 0; i < t.n; i++) {
        ok &= t.parent[i] < i && (t.parent[i] < 0 ? t.depth[i] == 1 : t.depth[t.parent[i]] + 1 == t.depth[i]);
        if (i < t.chain) ok &= t.depth[i] == i + 1 && t.rank[i] == 0;
    }
    CHECK(ok, "parents first, the top-1 chain at the front");
    CHECK(t.top[0] == 4 && t.top[1] == 3 && t.top[2] == 2 && t.top[3] == 1, "candidates per head 4 3 2 1");
    CHECK(li_medusa_tree_parse(NULL, 2, &t, &err) == 0 && t.n == 10 && t.max_depth == 2,
          "the default is cut to 2 heads: %d nodes", t.n);
    CHECK(li_medusa_tree_parse("2,1,0", 3, &t, &err) == 0 && t.n == 6 && t.chain == 3,
          "a path brings its prefixes and the chain: %d nodes", t.n);
    CHECK(t.depth[5] == 3 && t.rank[5] == 0 && t.parent[5] == 4 && t.rank[4] == 1 && t.parent[4] == 3 && t.rank[3] == 2,
          "2 -> 2,1 -> 2,1,0");
    CHECK(li_medusa_tree_parse("0; 1 ;0,0", 2, &t, &err) == 0 && t.n == 3, "spaces allowed");
    const char *bad[] = {"", "a", "0;;1", "0,", "16", "0,0,0", "0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;0,0", "0:1"};
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        err.msg[0] = 0;
        CHECK(li_medusa_tree_parse(bad[i], 2, &t, &err) == LI_EINVAL && strstr(err.msg, "medusa tree"),
              "'%s' refused: %s", bad[i], err.msg);
    }
}

/* ==== the proposer ========================================================== */

static void test_proposer(li_model *m) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/prop.gguf", dir);
    write_heads(path, m, &(heads_opt){.k = 3, .type = LI_TYPE_F32, .scale = 0.5f, .seed = 5});
    li_medusa *h;
    CHECK(li_medusa_load(&h, path, m, &err) == 0 && li_medusa_prepare(h, m, &be, 4, &err) == 0, "%s", err.msg);
    li_medusa_tree t;
    li_medusa_tree_parse(NULL, 3, &t, &err);
    li_proposer *p;
    CHECK(li_proposer_medusa_new(&p, h, &t, 4, &err) == 0 && p->method == LI_SPEC_MEDUSA, "%s", err.msg);
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    float hid[3][64];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < E; i++) hid[s][i] = 2 * rng_f();
    int32_t toks[4] = {1, 2, 3, 4}, draft[3][16], parent[3][16];
    li_spec_seq seqs[3];
    const int32_t ks[3] = {16, 5, 2};
    for (int s = 0; s < 3; s++)
        seqs[s] = (li_spec_seq){.id = s, .toks = toks, .n_toks = 4, .k = ks[s], .draft = draft[s], .parent = parent[s],
                                .hidden = s == 2 ? NULL : hid[s]};
    CHECK(p->ops->propose(p, seqs, 3, &err) == 0, "propose: %s", err.msg);
    CHECK(seqs[0].n_draft == t.n && seqs[1].n_draft == 5 && seqs[2].n_draft == 0 && !seqs[0].has_q,
          "nodes: the tree's, capped by k, none without a hidden state (%d %d %d)", seqs[0].n_draft, seqs[1].n_draft,
          seqs[2].n_draft);
    /* each node = its rank among its head's logits */
    bool ok = true;
    for (int s = 0; s < 2; s++) {
        const float *lg = li_medusa_run(h, hid[s], 1, 3, &err);
        for (int i = 0; i < seqs[s].n_draft; i++) {
            const float *row = lg + (size_t)(t.depth[i] - 1) * V;
            const int32_t tok = draft[s][i];
            int better = 0;
            for (int v = 0; v < V; v++) better += row[v] > row[tok] || (row[v] == row[tok] && v < tok);
            ok &= better == t.rank[i] && parent[s][i] == t.parent[i];
        }
    }
    CHECK(ok, "every draft is its node's rank in its head's logits, with the tree's parents");
    li_proposer_free(p);
    li_medusa_free(h);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

/* ==== the engine ============================================================= */

enum { N_REQ = 5, N_IDS = N_REQ + 1, MAX_TOK = 40 }; /* request 4 has n = 2 samples */

typedef struct run_out {
    int32_t toks[N_IDS + 1][MAX_TOK];
    int64_t n[N_IDS + 1];
    uint64_t hash[N_IDS + 1];
    li_engine_stats st;
} run_out;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static void on_event(void *ud, const li_event *ev) {
    run_out *o = ud;
    if (ev->kind != LI_EVENT_TOKEN || ev->id < 1 || ev->id > N_IDS) return;
    o->hash[ev->id] = fnv(o->hash[ev->id], &ev->token, sizeof ev->token);
    if (ev->logits) o->hash[ev->id] = fnv(o->hash[ev->id], ev->logits, (size_t)ev->n_vocab * sizeof(float));
}

typedef struct run_cfg {
    li_medusa *heads;
    const char *tree;
    float temperature;
    size_t kv_memory;
    int32_t max_batched;
} run_cfg;

/* N_REQ requests (two share a long prefix: a prefix-cache hit), greedy or sampled */
static int run(li_model *m, li_backend *be, const run_cfg *rc, run_out *o) {
    memset(o, 0, sizeof *o);
    li_error err = {0};
    li_engine_config c;
    li_engine_config_default(&c);
    c.block_size = 16;
    c.kv_memory = rc->kv_memory;
    c.max_batched_tokens = rc->max_batched;
    c.spec_disable_batch = 0;
    if (rc->heads) {
        c.medusa = rc->heads;
        c.medusa_tree = rc->tree;
        c.spec_method = LI_SPEC_MEDUSA;
        c.spec_tokens = 16;
    }
    li_engine *e;
    if (li_engine_init(&e, m, be, &c, &err)) {
        CHECK(0, "engine: %s", err.msg);
        return -1;
    }
    int32_t prompts[N_REQ][48];
    int lens[N_REQ] = {7, 40, 40, 3, 21};
    for (int r = 0; r < N_REQ; r++)
        for (int i = 0; i < lens[r]; i++) prompts[r][i] = 5 + (r == 2 ? (i < 32 ? 1 : 2) * 1 + i * 7 : r * 131 + i * 7) % 1990;
    for (int i = 0; i < 40; i++) prompts[2][i] = i < 33 ? prompts[1][i] : prompts[2][i];
    for (int r = 0; r < N_REQ; r++) {
        li_request_params p = {.prompt = prompts[r], .n_prompt = lens[r], .max_tokens = MAX_TOK, .ignore_eos = true,
                               .on_event = on_event, .ud = o, .n = r == 3 ? 2 : 1};
        li_sampling_params_default(&p.sampling);
        p.sampling.temperature = rc->temperature;
        p.sampling.seed = 1000 + (uint64_t)r;
        int64_t id;
        CHECK(li_engine_add(e, &p, &id, &err) == 0, "add: %s", err.msg);
        if (r == 1) /* request 2 arrives once 1's prompt is cached */
            for (int s = 0; s < 3; s++) li_engine_step(e, &err);
    }
    int steps = 0;
    while (li_engine_has_work(e) && steps++ < 5000)
        if (li_engine_step(e, &err)) {
            CHECK(0, "step: %s", err.msg);
            break;
        }
    for (int64_t id = 1; id <= N_IDS; id++) {
        const li_request_result *res = li_engine_result(e, id);
        o->n[id] = res ? res->n_tokens : -1;
        for (int64_t i = 0; res && i < res->n_tokens && i < MAX_TOK; i++) o->toks[id][i] = res->tokens[i];
    }
    li_engine_stats_get(e, &o->st);
    li_engine_free(e);
    return 0;
}

static bool same(const run_out *a, const run_out *b) {
    bool eq = true;
    for (int r = 1; r <= N_IDS; r++) eq &= a->n[r] == b->n[r] && !memcmp(a->toks[r], b->toks[r], sizeof a->toks[r]);
    return eq;
}

static bool same_bits(const run_out *a, const run_out *b) {
    bool eq = same(a, b);
    for (int r = 1; r <= N_IDS; r++) eq &= a->hash[r] == b->hash[r];
    return eq;
}

static void test_engine(li_model *m) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char zp[512], rp[512];
    snprintf(zp, sizeof zp, "%s/zero.gguf", dir);
    snprintf(rp, sizeof rp, "%s/random.gguf", dir);
    write_heads(zp, m, &(heads_opt){.k = 3, .type = LI_TYPE_F32, .scale = 0});
    write_heads(rp, m, &(heads_opt){.k = 4, .type = LI_TYPE_F16, .scale = 0.5f, .seed = 21});
    li_medusa *zero, *rnd;
    CHECK(li_medusa_load(&zero, zp, m, &err) == 0 && li_medusa_load(&rnd, rp, m, &err) == 0, "%s", err.msg);
    const size_t roomy = (size_t)4 << 20;
    /* the tiny model's KV: 2 layers x 1 head x 12 x f16 x 2 = 96 bytes per token */
    const size_t tight = (size_t)96 * 16 * 9; /* 9 blocks: preempts */
    int64_t moves = 0, accepted = 0;
    const struct {
        const char *what;
        size_t kv;
        int32_t mbt;
        const char *tree;
    } cases[] = {{"roomy", roomy, 512, NULL}, {"chunked prefill", roomy, 24, NULL}, {"preemption", tight, 64, NULL},
                 {"a wide tree", roomy, 512, "0;1;2;3;4;5;6;7;0,0;0,1;1,0;1,1;2,0"}};
    for (size_t c = 0; c < LI_ARRAY_LEN(cases); c++) {
        run_out base, z, r;
        run(m, &be, &(run_cfg){.kv_memory = cases[c].kv, .max_batched = cases[c].mbt}, &base);
        run(m, &be, &(run_cfg){.heads = zero, .tree = cases[c].tree, .kv_memory = cases[c].kv, .max_batched = cases[c].mbt}, &z);
        run(m, &be, &(run_cfg){.heads = rnd, .tree = cases[c].tree ? "0;1;0,0;0,0,0" : NULL, .kv_memory = cases[c].kv,
                               .max_batched = cases[c].mbt},
            &r);
        CHECK(base.n[1] == MAX_TOK && base.st.spec_drafted == 0, "%s: the plain run ran", cases[c].what);
        CHECK(same_bits(&base, &z), "%s, zero heads: the same tokens and logit bits as no speculation (%lld drafted, %lld accepted, %lld moved)",
              cases[c].what, (long long)z.st.spec_drafted, (long long)z.st.spec_accepted, (long long)z.st.spec_tree_moves);
        CHECK(same_bits(&base, &r), "%s, random heads: the same tokens and logit bits (%lld drafted, %lld accepted)",
              cases[c].what, (long long)r.st.spec_drafted, (long long)r.st.spec_accepted);
        CHECK(z.st.spec_drafted_by[LI_SPEC_MEDUSA] > 0 && z.st.spec_drafted == z.st.spec_drafted_by[LI_SPEC_MEDUSA],
              "%s: counted as medusa", cases[c].what);
        if (c == 2) CHECK(base.st.preemptions > 0 && z.st.preemptions > 0, "the tight KV preempts (%lld, %lld)",
                          (long long)base.st.preemptions, (long long)z.st.preemptions);
        printf("%s: zero heads %lld drafted, %lld accepted, %lld moved, %lld preemptions, %lld cached; random heads %lld "
               "drafted, %lld accepted\n",
               cases[c].what, (long long)z.st.spec_drafted, (long long)z.st.spec_accepted, (long long)z.st.spec_tree_moves,
               (long long)z.st.preemptions, (long long)z.st.prefix_hit_tokens, (long long)r.st.spec_drafted,
               (long long)r.st.spec_accepted);
        moves += z.st.spec_tree_moves + r.st.spec_tree_moves;
        accepted += z.st.spec_accepted + r.st.spec_accepted;
    }
    CHECK(accepted > 0 && moves > 0, "tree drafts were accepted (%lld), off the chain too (%lld KV rows moved)",
          (long long)accepted, (long long)moves);
    /* temperature > 0: a seed reproduces its tokens */
    run_out s1, s2;
    run(m, &be, &(run_cfg){.heads = zero, .temperature = 0.8f, .kv_memory = roomy, .max_batched = 512}, &s1);
    run(m, &be, &(run_cfg){.heads = zero, .temperature = 0.8f, .kv_memory = roomy, .max_batched = 512}, &s2);
    CHECK(same_bits(&s1, &s2) && s1.n[1] == MAX_TOK, "temperature 0.8: the same seed gives the same tokens (%lld accepted of %lld)",
          (long long)s1.st.spec_accepted, (long long)s1.st.spec_drafted);
    /* refusals */
    li_engine_config c;
    li_engine_config_default(&c);
    c.medusa = zero;
    c.medusa_tree = "0,0,0,0";
    li_engine *e = NULL;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EINVAL && strstr(err.msg, "medusa tree"), "a tree deeper than the heads: %s", err.msg);
    li_engine_config_default(&c);
    c.spec_method = LI_SPEC_MEDUSA;
    c.spec_tokens = 4;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EINVAL && strstr(err.msg, "--medusa"), "medusa without heads: %s", err.msg);
    li_medusa_free(zero);
    li_medusa_free(rnd);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
    /* the ggml ISA is batch-variant: refused */
    CHECK(li_backend_cpu_init(&be, 1, "ggml", &err) == 0, "%s", err.msg);
    CHECK(li_medusa_load(&zero, zp, m, &err) == 0, "%s", err.msg);
    li_engine_config_default(&c);
    c.medusa = zero;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EINVAL && strstr(err.msg, "batch-invariant"), "ggml: %s", err.msg);
    li_medusa_free(zero);
    li_backend_cpu_free(&be);
}

enum { REP_TOK = 20 };

/* One greedy request of TEXT for REP_TOK tokens, with zero heads H drafting
 * the chain "0;0,0" or without speculation (H NULL): its tokens and stats. */
static int rep_run(li_model *m, li_backend *be, li_medusa *h, const char *text, int32_t *out, li_engine_stats *st) {
    li_error err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(li_tokenizer_encode(m->tok, text, strlen(text), true, false, &ids, &n_ids, &err) == 0, "%s", err.msg);
    li_engine_config c;
    li_engine_config_default(&c);
    if (h) {
        c.medusa = h;
        c.medusa_tree = "0;0,0";
        c.spec_method = LI_SPEC_MEDUSA;
        c.spec_tokens = 16;
    }
    li_engine *e = NULL;
    int n = -1;
    CHECK(li_engine_init(&e, m, be, &c, &err) == 0, "%s", err.msg);
    li_request_params rp = {.prompt = ids, .n_prompt = (int64_t)n_ids, .max_tokens = REP_TOK, .ignore_eos = true};
    li_sampling_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    int64_t id;
    CHECK(e && li_engine_add(e, &rp, &id, &err) == 0, "%s", err.msg);
    while (e && li_engine_has_work(e) && li_engine_step(e, &err) == 0) {}
    const li_request_result *res = e ? li_engine_result(e, id) : NULL;
    if (res) {
        n = (int)(res->n_tokens < REP_TOK ? res->n_tokens : REP_TOK);
        memcpy(out, res->tokens, (size_t)n * sizeof *out);
    }
    if (e) li_engine_stats_get(e, st);
    li_engine_free(e);
    free(ids);
    return n;
}

/* The real model with zero heads: greedy output equals no speculation. */
static void test_real(void) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(NULL), &err)) {
        printf("SKIP real model: %s\n", err.msg);
        return;
    }
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char zp[512];
    snprintf(zp, sizeof zp, "%s/real_zero.gguf", dir);
    char name[128] = "";
    li_str nm;
    if (!li_gguf_get_str(&m->gguf, "general.name", &nm, NULL)) snprintf(name, sizeof name, "%.*s", (int)nm.len, nm.ptr);
    write_heads(zp, m, &(heads_opt){.k = 2, .type = LI_TYPE_F16, .scale = 0, .base_name = name});
    li_medusa *h;
    CHECK(li_medusa_load(&h, zp, m, &err) == 0, "%s", err.msg);
    run_out base, z;
    run(m, &be, &(run_cfg){.kv_memory = (size_t)16 << 20, .max_batched = 64}, &base);
    run(m, &be, &(run_cfg){.heads = h, .kv_memory = (size_t)16 << 20, .max_batched = 64}, &z);
    CHECK(same_bits(&base, &z), "real model, zero heads: the same tokens and logit bits (%lld drafted, %lld accepted, %lld moved)",
          (long long)z.st.spec_drafted, (long long)z.st.spec_accepted, (long long)z.st.spec_tree_moves);
    CHECK(z.st.spec_tree_moves > 0, "real model: accepted drafts off the chain had their KV moved");
    printf("real model: %lld drafted, %lld accepted, %lld moved\n", (long long)z.st.spec_drafted,
           (long long)z.st.spec_accepted, (long long)z.st.spec_tree_moves);
    /* the hidden state is the row that predicted the last token, so zero
     * heads draft that token again on every node of the chain "0;0,0": the
     * accepted count follows from the plain greedy output, whatever the
     * model makes of the text (it differs between CPUs' kernels) */
    const char *ha = "ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha";
    int32_t plain[REP_TOK], spec[REP_TOK];
    li_engine_stats st;
    int n_plain = rep_run(m, &be, NULL, ha, plain, &st), n_spec = rep_run(m, &be, h, ha, spec, &st);
    int64_t want_drafted = 0, want_accepted = 0;
    for (int i = 0; i + 1 < n_plain;) { /* plain[i] was just emitted; drafts plain[i], plain[i] */
        /* at most max_tokens - generated - 1 drafts: the last token of the
         * request is always the verification's own (spec_room) */
        const int k = n_plain - i - 2 < 2 ? n_plain - i - 2 : 2;
        int a = 0;
        while (a < k && plain[i + 1 + a] == plain[i]) a++;
        want_drafted += k;
        want_accepted += a;
        i += a + 1;
    }
    CHECK(n_plain == REP_TOK && n_spec == n_plain && !memcmp(plain, spec, sizeof plain), "repeating text: the same tokens");
    /* (steps near max_tokens draft fewer: drafted is at most the chain per step) */
    CHECK(want_accepted > 0 && st.spec_accepted == want_accepted && st.spec_drafted > 0 && st.spec_drafted <= want_drafted,
          "zero heads on a repeating text: %lld of %lld drafts accepted, as its greedy output predicts (%lld of <= %lld)",
          (long long)st.spec_accepted, (long long)st.spec_drafted, (long long)want_accepted, (long long)want_drafted);
    li_engine *e = NULL;
    li_engine_config c;
    li_engine_config_default(&c);
    c.medusa = h;
    c.tensor_parallel = 2;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EUNSUP && strstr(err.msg, "Medusa"), "tensor_parallel 2: %s", err.msg);
    li_medusa_free(h);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
    li_model_free(m);
}

int main(int argc, char **argv) {
    const bool real = argc > 1 && !strcmp(argv[1], "--real");
    snprintf(dir, sizeof dir, "/tmp/li_test_medusa.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base[512];
    if (make_tiny(base, sizeof base)) return t_failed ? 1 : 77;
    li_error err = {0};
    li_model *m;
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    if (real) { /* ctest unit/test_medusa_real (label slow): the real model */
        test_real();
    } else {
        test_tree();
        test_load(m);
        test_forward(m, "auto", LI_TYPE_F32);
        test_forward(m, "scalar", LI_TYPE_F16);
        test_proposer(m);
        test_engine(m);
    }
    li_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("test_medusa");
}
