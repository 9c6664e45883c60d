/* test_proposer.c — the proposer interface (spec/proposer.h) without a model:
 *  - method names and parsing, unknown names refused with the choices;
 *  - the n-gram proposer drafts what li_spec_ngram_draft drafts, per seq,
 *    deterministically (no q), k capping each seq;
 *  - li_spec_draft_dist: argmax with ties to the lowest id, a one-hot at
 *    t <= 0, softmax(l / t) against a float64 reference at t > 0;
 *  - li_spec_layer_view: a view of the first N layers sharing the weights,
 *    N outside [1, n_layer - 1] refused;
 *  - a model proposer over storage that does not fit the model is refused. */
#include "spec/ngram.h"
#include "spec/proposer.h"
#include "test_util.h"

#include <string.h>

static void test_methods(void) {
    CHECK(!strcmp(li_spec_method_name(LI_SPEC_NGRAM), "ngram"), "ngram");
    CHECK(!strcmp(li_spec_method_name(LI_SPEC_DRAFT), "draft"), "draft");
    CHECK(!strcmp(li_spec_method_name(LI_SPEC_LAYERSKIP), "layerskip"), "layerskip");
    CHECK(!strcmp(li_spec_method_name(-1), "?") && !strcmp(li_spec_method_name(LI_SPEC_N_METHODS), "?"), "range");
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
        li_spec_method got = LI_SPEC_N_METHODS;
        CHECK(li_spec_method_parse(li_spec_method_name(m), "x", &got, NULL) == 0 && (int)got == m, "parse %d", m);
    }
    li_error err = {0};
    li_spec_method got;
    CHECK(li_spec_method_parse("lookahead", "--spec-method", &got, &err) == LI_EINVAL, "unknown refused");
    CHECK(strstr(err.msg, "--spec-method") && strstr(err.msg, "'lookahead'") && strstr(err.msg, "layerskip"),
          "the message names the option, the value and the choices: %s", err.msg);
    CHECK(li_spec_method_parse(NULL, "x", &got, NULL) == LI_EINVAL, "NULL refused");
}

static void test_ngram(void) {
    li_proposer *p = li_proposer_ngram_new(4, 2, 100);
    CHECK(p && p->method == LI_SPEC_NGRAM && p->n_vocab == 100, "ngram proposer");
    rng_seed(7);
    int32_t toks[3][64], out[3][16], want[16];
    li_spec_seq s[3];
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 3; i++) {
            const int64_t n = 4 + (int64_t)(rng_u32() % 60);
            for (int64_t j = 0; j < n; j++) toks[i][j] = (int32_t)(rng_u32() % 5); /* small alphabet: matches */
            s[i] = (li_spec_seq){.id = i, .toks = toks[i], .n_toks = n, .k = 1 + (int32_t)(rng_u32() % 16),
                                 .temperature = 0.7f, .draft = out[i], .has_q = true, .n_draft = -1};
        }
        CHECK(p->ops->propose(p, s, 3, NULL) == 0, "propose");
        for (int i = 0; i < 3; i++) {
            const int32_t m = li_spec_ngram_draft(s[i].toks, s[i].n_toks, 4, 2, s[i].k, want);
            CHECK(s[i].n_draft == m && !memcmp(out[i], want, (size_t)m * sizeof *want) && m <= s[i].k,
                  "round %d seq %d: the proposer drafts what li_spec_ngram_draft does (%d vs %d)", round, i, s[i].n_draft,
                  m);
            CHECK(!s[i].has_q, "n-gram drafts are deterministic: no q");
        }
    }
    li_proposer_free(p);
    li_proposer_free(NULL);
}

static void test_dist(void) {
    const float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -3.0f};
    float probs[6];
    CHECK(li_spec_draft_dist(l, 6, 0, NULL) == 1, "argmax, ties to the lowest id");
    CHECK(li_spec_draft_dist(l, 6, 0, probs) == 1 && probs[1] == 1 && probs[3] == 0 && probs[0] == 0,
          "t = 0: one-hot");
    for (float t = 0.25f; t < 4; t *= 2) {
        li_spec_draft_dist(l, 6, t, probs);
        double z = 0, sum = 0;
        for (int i = 0; i < 6; i++) z += exp((double)l[i] / t);
        for (int i = 0; i < 6; i++) {
            const double want = exp((double)l[i] / t) / z;
            CHECK(fabs(probs[i] - want) < 1e-6 * want + 1e-12, "t %g id %d: %g vs %g", t, i, probs[i], want);
            sum += probs[i];
        }
        CHECK(fabs(sum - 1) < 1e-6, "t %g: sums to 1 (%g)", t, sum);
    }
}

static void test_layer_view(void) {
    li_layer layers[4];
    li_model m;
    memset(&m, 0, sizeof m);
    m.hp.n_layer = 4;
    m.hp.n_vocab = 10;
    m.layers = layers;
    li_model v;
    li_error err = {0};
    CHECK(li_spec_layer_view(&v, &m, 2, &err) == 0 && v.hp.n_layer == 2 && v.layers == layers && v.hp.n_vocab == 10,
          "a view of 2 of 4 layers shares the weights");
    CHECK(m.hp.n_layer == 4, "the model is untouched");
    CHECK(li_spec_layer_view(&v, &m, 4, &err) == LI_EINVAL && strstr(err.msg, "[1, 3]"), "all layers refused: %s",
          err.msg);
    CHECK(li_spec_layer_view(&v, &m, 0, &err) == LI_EINVAL, "0 layers refused");

    /* storage of 2 layers cannot hold a 4-layer model's KV */
    li_kv_cache kv;
    memset(&kv, 0, sizeof kv);
    kv.n_layer = 2;
    m.hp.n_head_kv = kv.n_head_kv = 1;
    m.hp.head_dim = kv.head_dim = 8;
    li_proposer *p = NULL;
    CHECK(li_proposer_model_new(&p, LI_SPEC_DRAFT, &m, NULL, &kv, 4, &err) == LI_EINVAL && !p &&
              strstr(err.msg, "does not fit"),
          "storage too small refused: %s", err.msg);
    CHECK(li_proposer_model_new(&p, LI_SPEC_NGRAM, &m, NULL, &kv, 4, &err) == LI_EINVAL && !p, "ngram is no model");
    CHECK(li_proposer_model_new(&p, LI_SPEC_DRAFT, &m, NULL, &kv, 0, &err) == LI_EINVAL && !p, "capacity 0 refused");
}

int main(void) {
    test_methods();
    test_ngram();
    test_dist();
    test_layer_view();
    return t_summary("test_proposer");
}
