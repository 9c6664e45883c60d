/* test_runner.c — an engine with a target and a draft runner.
 *
 * The draft is the real model cut to its first 4 layers (tools/make_draft.py,
 * made next to this test's binary on first use). Engines run the real model
 * as target over a mix of requests: different lengths, n = 2 samples of one
 * prompt (copy-on-write of shared blocks), a KV budget small enough to
 * preempt, and a second wave repeating prompts (prefix-cache hits). Checked:
 *  - with the draft configured but not drafting, the target's tokens and the
 *    logit bits of every token event equal an engine without a draft holding
 *    the same number of blocks, and the draft computes nothing (its KV is
 *    lazy);
 *  - drafting with it at temperature 0.8, every first draft step's logits
 *    (request, position) equal, bit for bit, the draft model run alone over
 *    that request's tokens: the lazy catch-up and the KV kept from accepted
 *    drafts followed the request through paging, forks, rejections,
 *    preemption and the prefix cache;
 *  - the target as its own draft, greedy: every verified draft is accepted
 *    and the tokens are the target's alone;
 *  - a draft with another vocabulary is refused; stats count the draft's KV. */
#include "engine/engine.h"
#include "engine/runner.h"
#include "test_util.h"

#include <string.h>
#include <sys/stat.h>

enum { BS = 8, NB = 16, N_REQ = 6, MAX_TOK = 10, MAX_IDS = 16, MAX_ROWS = 512 };

/* ------------------------------------------------------------------------
 * a run: per request id, its tokens and a hash of its events' logit bits
 * ---------------------------------------------------------------------- */

typedef struct {
    int64_t n_ids;
    int64_t id[MAX_IDS];
    uint64_t hash[MAX_IDS];     /* FNV-1a over each token event's token and logit bits */
    int32_t n_prompt[MAX_IDS];
    const int32_t *prompt[MAX_IDS];
    int32_t toks[MAX_IDS][MAX_TOK];
    int64_t n_toks[MAX_IDS];
    /* the draft proposer's first-step rows */
    int32_t n_rows;
    int64_t row_id[MAX_ROWS];
    int32_t row_pos[MAX_ROWS];
    float *row_logits;          /* (MAX_ROWS, n_vocab) */
    int32_t n_vocab;
    li_engine_stats st;
} run_out;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static int slot_of(run_out *o, int64_t id) {
    for (int i = 0; i < o->n_ids; i++)
        if (o->id[i] == id) return i;
    return -1;
}

static void on_event(void *ud, const li_event *ev) {
    run_out *o = ud;
    int s = slot_of(o, ev->id);
    if (s < 0 || ev->kind != LI_EVENT_TOKEN) return;
    o->hash[s] = fnv(o->hash[s], &ev->token, sizeof ev->token);
    o->hash[s] = fnv(o->hash[s], ev->logits, (size_t)ev->n_vocab * sizeof(float));
}

static float g_temp; /* the run's temperature */

static int add(li_engine *e, run_out *o, const int32_t *prompt, int n_prompt, int n, uint64_t seed) {
    li_error err = {0};
    li_request_params p = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = MAX_TOK, .ignore_eos = true,
                           .n = n, .on_event = on_event, .ud = o};
    li_sampling_params_default(&p.sampling);
    p.sampling.temperature = g_temp;
    p.sampling.seed = seed;
    int64_t id;
    /* the samples' ids follow the first's (engine.h): known before any event */
    for (int s = 0; s < n; s++) {
        o->prompt[o->n_ids + s] = prompt;
        o->n_prompt[o->n_ids + s] = n_prompt;
    }
    int64_t base = o->n_ids;
    o->n_ids += n;
    if (li_engine_add(e, &p, &id, &err)) {
        fprintf(stderr, "add: %s\n", err.msg);
        return -1;
    }
    for (int s = 0; s < n; s++) o->id[base + s] = id + s, o->hash[base + s] = 0xcbf29ce484222325ull;
    return 0;
}

static void on_draft_row(void *ud, int64_t id, int32_t pos, const float *logits) {
    run_out *o = ud;
    if (!o->row_logits || o->n_rows == MAX_ROWS) {
        o->n_rows = MAX_ROWS + 1; /* overflow: fails the check */
        return;
    }
    o->row_id[o->n_rows] = id;
    o->row_pos[o->n_rows] = pos;
    memcpy(o->row_logits + (size_t)o->n_rows * o->n_vocab, logits, (size_t)o->n_vocab * sizeof(float));
    o->n_rows++;
}

static int drain(li_engine *e) {
    li_error err = {0};
    for (int guard = 0; li_engine_has_work(e) && guard < 10000; guard++)
        if (li_engine_step(e, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            return -1;
        }
    return 0;
}

/* The mix: wave 1 all at once (preemption, a fork), wave 2 repeats prompts
 * one at a time (prefix hits). draft == NULL: the target alone; spec_k > 0:
 * requests draft k tokens with the draft model. */
static int run(li_model *m, li_model *draft, li_backend *be, const int32_t *prompt, int spec_k, run_out *o) {
    li_error err = {0};
    li_engine_config c;
    li_engine_config_default(&c);
    c.block_size = BS;
    c.max_num_seqs = 8;
    c.max_batched_tokens = 32;
    c.spec_tokens = spec_k;
    c.spec_method = LI_SPEC_DRAFT;
    /* NB blocks in both engines: the same schedule */
    c.kv_memory = (size_t)NB * BS *
                  (li_runner_kv_bytes_per_token(m, c.kv_dtype) + (draft ? li_runner_kv_bytes_per_token(draft, c.kv_dtype) : 0));
    li_engine *e;
    if (li_engine_init_runners(&e, m, draft, be, &c, &err)) {
        fprintf(stderr, "init: %s\n", err.msg);
        return -1;
    }
    o->n_vocab = m->hp.n_vocab;
    li_engine_draft_observe(e, on_draft_row, o);
    int rc = add(e, o, prompt, 40, 1, 1) || add(e, o, prompt + 50, 30, 2, 2) || add(e, o, prompt + 100, 17, 1, 3) ||
             add(e, o, prompt + 150, 25, 1, 4) || drain(e);
    /* repeats: the first prompt, the forked one */
    rc = rc || add(e, o, prompt, 40, 1, 5) || drain(e) || add(e, o, prompt + 50, 30, 1, 6) || drain(e);
    for (int i = 0; !rc && i < o->n_ids; i++) {
        const li_request_result *res = li_engine_result(e, o->id[i]);
        if (!res) {
            rc = -1;
            break;
        }
        o->n_toks[i] = LI_MIN(res->n_tokens, (int64_t)MAX_TOK);
        memcpy(o->toks[i], res->tokens, (size_t)o->n_toks[i] * sizeof(int32_t));
    }
    li_engine_stats_get(e, &o->st);
    li_engine_free(e);
    return rc;
}

/* Two runs gave the same tokens and logit bits for every request. */
static bool same_output(const run_out *a, const run_out *b) {
    bool same = a->n_ids == b->n_ids;
    for (int i = 0; same && i < a->n_ids; i++)
        same = a->id[i] == b->id[i] && a->n_toks[i] == MAX_TOK && b->n_toks[i] == MAX_TOK &&
               !memcmp(a->toks[i], b->toks[i], sizeof a->toks[i]) && a->hash[i] == b->hash[i];
    return same;
}

/* The draft model alone over request slot i's tokens: every row at the
 * positions `want` (n_want of them), one forward pass. */
static int draft_alone(li_model *d, li_backend *be, const run_out *o, int i, float *logits) {
    li_error err = {0};
    const int32_t np = o->n_prompt[i];
    const int32_t len = np + (int32_t)o->n_toks[i] - 1; /* the last token is never fed */
    int32_t tok[64], pos[64], seq[64], rows[64], table[8];
    int64_t slot[64];
    if (len > 64) return -1;
    for (int32_t p = 0; p < len; p++) {
        tok[p] = p < np ? o->prompt[i][p] : o->toks[i][p - np];
        pos[p] = p, seq[p] = 0, slot[p] = p, rows[p] = p;
    }
    for (int b = 0; b < 8; b++) table[b] = b;
    li_runner r;
    if (li_runner_init(&r, d, be, NULL, LI_TYPE_F16, BS, 8, 64, &err)) {
        fprintf(stderr, "runner: %s\n", err.msg);
        return -1;
    }
    li_batch b = {.n = len, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .block_table = table, .n_seqs = 1,
                  .bt_stride = 8, .logit_rows = rows, .n_logits = len};
    int rc = li_runner_run(&r, &b, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    else memcpy(logits, r.logits, (size_t)len * d->hp.n_vocab * sizeof(float));
    li_runner_free(&r);
    return rc;
}

/* The draft next to the test's binary, made once from the real model. */
static int draft_path(char *out, size_t cap, const char *argv0, const char *model) {
    const char *slash = strrchr(argv0, '/');
    int dir = slash ? (int)(slash - argv0) : 1;
    snprintf(out, cap, "%.*s/test_runner_draft4.gguf", dir, slash ? argv0 : ".");
    struct stat sb;
    if (stat(out, &sb) == 0) return 0;
    const char *src = getenv("LUAINFER_SOURCE_DIR");
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s/.venv/bin/python' '%s/tools/make_draft.py' '%s' '%s' --layers 4 >/dev/null",
             src ? src : ".", src ? src : ".", model, out);
    return system(cmd);
}

int main(int argc, char **argv) {
    (void)argc;
    li_error err = {0};
    li_model *m, *d;
    const char *mp = li_model_default_path(NULL);
    if (li_model_load(&m, mp, &err) != 0) {
        printf("SKIP: model not loadable (%s)\n", err.msg);
        return 77;
    }
    char dp[4096];
    if (draft_path(dp, sizeof dp, argv[0], mp) != 0) {
        printf("SKIP: could not make the draft model with tools/make_draft.py (needs .venv with gguf)\n");
        li_model_free(m);
        return 77;
    }
    CHECK(li_model_load(&d, dp, &err) == 0, "draft %s: %s", dp, err.msg);
    if (t_failed) return t_summary("runner");
    CHECK(d->hp.n_layer == 4 && d->hp.n_vocab == m->hp.n_vocab, "the draft: 4 layers (%d), the target's vocabulary",
          d->hp.n_layer);
    const int32_t nv = m->hp.n_vocab;

    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = 100 + (i * 7919) % 20000;

    li_backend cpu;
    CHECK(li_backend_cpu_init(&cpu, 2, "auto", &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(m, &cpu, &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(d, &cpu, &err) == 0, "%s", err.msg);

    /* a draft of another vocabulary is refused */
    li_engine_config c;
    li_engine_config_default(&c);
    li_engine *e = NULL;
    d->hp.n_vocab--;
    int rc = li_engine_init_runners(&e, m, d, &cpu, &c, &err);
    d->hp.n_vocab++;
    CHECK(rc == LI_EINVAL && !e && strstr(err.msg, "vocabulary"), "another vocabulary refused: %s", err.msg);

    /* 1: the draft configured, not drafting: the target's output, and the draft computes nothing */
    static run_out plain, idle, spec, gplain, self;
    g_temp = 0.8f;
    CHECK(run(m, NULL, &cpu, prompt, 0, &plain) == 0, "the target alone");
    CHECK(run(m, d, &cpu, prompt, 0, &idle) == 0, "target + idle draft");
    printf("target + idle draft: %lld steps, %lld preemptions, %lld prefix-hit tokens, KV %zu + %zu bytes\n",
           (long long)idle.st.steps, (long long)idle.st.preemptions, (long long)idle.st.prefix_hit_tokens,
           idle.st.kv_bytes, idle.st.kv_draft_bytes);
    CHECK(idle.st.preemptions > 0, "the tiny KV budget preempted (%lld)", (long long)idle.st.preemptions);
    CHECK(idle.st.prefix_hit_tokens > 0, "the repeated prompts hit the prefix cache");
    CHECK(idle.st.kv_total_blocks == NB && plain.st.kv_total_blocks == NB, "%d blocks in each", NB);
    CHECK(idle.st.kv_bytes == plain.st.kv_bytes && plain.st.kv_draft_bytes == 0 &&
              idle.st.kv_draft_bytes == (size_t)NB * BS * li_runner_kv_bytes_per_token(d, LI_TYPE_F16),
          "stats: the target's KV bytes, and the draft's (%zu)", idle.st.kv_draft_bytes);
    CHECK(same_output(&plain, &idle) && plain.st.preemptions == idle.st.preemptions &&
              plain.st.prefix_hit_tokens == idle.st.prefix_hit_tokens,
          "the target's tokens and logit bits equal the engine without a draft");
    CHECK(memcmp(idle.toks[1], idle.toks[2], sizeof idle.toks[1]) != 0, "the two samples of one prompt drew different tokens");
    CHECK(idle.st.draft_sync_tokens == 0 && idle.st.spec_drafted == 0,
          "a draft nobody drafts with computes nothing (%lld positions)", (long long)idle.st.draft_sync_tokens);

    /* 2: drafting with it, sampled: every first draft step equals the draft alone over the same tokens */
    spec.row_logits = li_xmalloc((size_t)MAX_ROWS * nv * sizeof(float));
    CHECK(run(m, d, &cpu, prompt, 3, &spec) == 0, "target + drafting draft");
    const li_engine_stats *ss = &spec.st;
    printf("drafting: %lld steps, %lld preemptions, %lld prefix-hit tokens, %lld drafted, %lld accepted, "
           "%lld positions caught up, %d first draft steps\n",
           (long long)ss->steps, (long long)ss->preemptions, (long long)ss->prefix_hit_tokens,
           (long long)ss->spec_drafted, (long long)ss->spec_accepted, (long long)ss->draft_sync_tokens, spec.n_rows);
    CHECK(ss->preemptions > 0 && ss->prefix_hit_tokens > 0, "drafting: preempted (%lld) and hit the prefix cache (%lld)",
          (long long)ss->preemptions, (long long)ss->prefix_hit_tokens);
    CHECK(ss->spec_accepted > 0 && ss->spec_accepted < ss->spec_drafted,
          "drafts accepted and rejected (%lld of %lld)", (long long)ss->spec_accepted, (long long)ss->spec_drafted);
    CHECK(ss->draft_sync_tokens > 0 && ss->time_draft_sync > 0 && ss->time_propose > 0,
          "the catch-up is counted (%lld positions, %.4f s)", (long long)ss->draft_sync_tokens, ss->time_draft_sync);
    float *ref = li_xmalloc((size_t)64 * nv * sizeof(float));
    int checked = 0, bad = 0, differ_from_target = 0, per_id[MAX_IDS] = {0};
    for (int i = 0; i < spec.n_ids; i++) {
        if (draft_alone(d, &cpu, &spec, i, ref)) {
            bad++;
            continue;
        }
        for (int32_t r = 0; r < spec.n_rows && r < MAX_ROWS; r++) {
            if (spec.row_id[r] != spec.id[i]) continue;
            const int32_t p = spec.row_pos[r];
            const float *got = spec.row_logits + (size_t)r * nv;
            if (p < 0 || p >= spec.n_prompt[i] + spec.n_toks[i] - 1 || memcmp(got, ref + (size_t)p * nv, (size_t)nv * 4)) {
                if (bad++ < 5) fprintf(stderr, "  request %lld position %d: the draft's logits differ\n",
                                       (long long)spec.id[i], p);
                continue;
            }
            checked++;
            per_id[i]++;
        }
    }
    /* the target's logits at a row are not the draft's: the draft really is another model */
    {
        float *tl = li_xmalloc((size_t)nv * sizeof(float));
        li_runner t;
        CHECK(li_runner_init(&t, m, &cpu, NULL, LI_TYPE_F16, BS, 8, 64, &err) == 0, "%s", err.msg);
        int32_t tok = spec.prompt[0][0], pos = 0, seq = 0, row = 0, table = 0;
        int64_t slot = 0;
        li_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .slot = &slot, .block_table = &table,
                      .n_seqs = 1, .bt_stride = 1, .logit_rows = &row, .n_logits = 1};
        CHECK(li_runner_run(&t, &b, &err) == 0, "%s", err.msg);
        memcpy(tl, t.logits, (size_t)nv * sizeof(float));
        CHECK(draft_alone(d, &cpu, &spec, 0, ref) == 0, "draft alone");
        differ_from_target = memcmp(tl, ref, (size_t)nv * 4) != 0;
        li_runner_free(&t);
        free(tl);
    }
    bool every_id = true;
    for (int i = 0; i < spec.n_ids; i++) every_id &= per_id[i] > 0;
    printf("first draft steps: %d checked, %d differ\n", checked, bad);
    CHECK(bad == 0 && checked == spec.n_rows, "every first draft step equals the draft alone (%d of %d, %d differ)",
          checked, spec.n_rows, bad);
    CHECK(every_id, "every request drafted with the draft model");
    CHECK(differ_from_target, "the draft's logits are not the target's");

    /* 3: the target as its own draft, greedy: every verified draft is accepted, the tokens are the target's */
    g_temp = 0;
    CHECK(run(m, NULL, &cpu, prompt, 0, &gplain) == 0, "the target alone, greedy");
    CHECK(run(m, m, &cpu, prompt, 3, &self) == 0, "the target drafting for itself");
    printf("self-drafting: %lld drafted, %lld accepted, %lld preemptions, %lld prefix-hit tokens\n",
           (long long)self.st.spec_drafted, (long long)self.st.spec_accepted, (long long)self.st.preemptions,
           (long long)self.st.prefix_hit_tokens);
    CHECK(self.st.spec_drafted > 0 && self.st.spec_accepted == self.st.spec_drafted,
          "self-drafting: every verified draft accepted (%lld of %lld)", (long long)self.st.spec_accepted,
          (long long)self.st.spec_drafted);
    bool same_toks = gplain.n_ids == self.n_ids;
    for (int i = 0; same_toks && i < self.n_ids; i++) same_toks = !memcmp(gplain.toks[i], self.toks[i], sizeof self.toks[i]);
    CHECK(same_toks, "self-drafting gives the target's greedy tokens");

    free(ref);
    free(spec.row_logits);
    li_model_release(d, &cpu);
    li_model_release(m, &cpu);
    li_backend_cpu_free(&cpu);
    li_model_free(d);
    li_model_free(m);
    return t_summary("runner");
}
