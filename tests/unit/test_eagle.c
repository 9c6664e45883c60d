/* test_eagle.c — EAGLE drafts (spec/eagle.h), the input projection of the
 * forward pass, and the eagle proposer in the engine.
 *
 * A tiny model (tests/golden/spm_tiny.gguf's 2000-token vocabulary, random
 * weights, 36 wide, 2 blocks) and draft files written here (write_draft:
 * random, or "echo": W_fc takes the last feature block and everything after
 * it is zero, so the draft's first logits are exactly the target's at the
 * position before, i.e. it drafts the last token again):
 *  - a good file loads; every check of the format refuses a bad one with a
 *    one-line error naming the field; another base name alone loads;
 *  - the block's forward (li_forward_run on the draft's model: rows fed the
 *    target's captured rows, then a chain row fed its own output) equals a
 *    float64 transcription of docs/eagle.md's block at odd sizes, over the
 *    draft vocabulary, on the auto ISA and the scalar one, F32 and F16;
 *  - li_batch.capture gives the residual stream after the asked blocks;
 *  - the engine: greedy output with eagle drafts (random, echo, a draft
 *    vocabulary) equals the engine without speculation, token for token
 *    and logit bit for bit, over a batch of requests (one with n = 2
 *    samples) with chunked prefill, under preemption and with prefix-cache
 *    hits; at temperature 0.8 the same seed gives the same tokens;
 *  - with --real, the real model with an echo draft on a repeating text:
 *    the accepted count is what its greedy output predicts;
 *  - refusals: EAGLE with Medusa heads, tensor_parallel 2, the ggml ISA,
 *    method eagle without a draft. */
#define _POSIX_C_SOURCE 200809L
#include "engine/engine.h"
#include "engine/session.h"
#include "model/gguf_write.h"
#include "spec/eagle.h"
#include "spec/medusa.h"
#include "spec/proposer.h"
#include "policy/policy_lua.h"
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

/* ==== draft files =========================================================== */

typedef struct draft_opt {
    li_type type;          /* of the matrices: F32 or F16 */
    float scale;           /* of the random matrices */
    uint64_t seed;
    bool echo;             /* W_fc = [0 .. I], output_norm = the base's, the rest zero */
    int32_t n_draft;       /* draft vocabulary (0: all of it): every 3rd id from 1 */
    int32_t n_head, n_head_kv, n_ff; /* 0: the base's */
    /* corruptions */
    const char *arch, *hash, *base_name;
    int version, n_embd, base_layers, head_dim, feat1, fc_rows;
    bool norm_f16, vocab_unsorted, vocab_oob, no_wq;
} draft_opt;

enum { N_FEAT = 2 }; /* the tiny model's blocks 0 and 1 */

static int add_mat(li_gguf_writer *w, const char *name, int64_t rows, int64_t cols, const draft_opt *o,
                   const float *vals, li_error *err) {
    const int64_t ne[2] = {cols, rows};
    const size_t n = (size_t)(rows * cols);
    if (o->type == LI_TYPE_F16) {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) d[i] = li_fp32_to_fp16(vals ? vals[i] : o->echo ? 0 : o->scale * rng_f());
        return li_gguf_writer_add_tensor(w, name, LI_TYPE_F16, 2, ne, d, n * 2, err);
    }
    float *d = malloc(n * 4);
    for (size_t i = 0; i < n; i++) d[i] = vals ? vals[i] : o->echo ? 0 : o->scale * rng_f();
    return li_gguf_writer_add_tensor(w, name, LI_TYPE_F32, 2, ne, d, n * 4, err);
}

static int add_norm(li_gguf_writer *w, const char *name, int64_t d, const float *vals, bool f16, li_error *err) {
    if (f16) {
        uint16_t *x = malloc((size_t)d * 2);
        for (int64_t i = 0; i < d; i++) x[i] = li_fp32_to_fp16(1.0f);
        return li_gguf_writer_add_tensor(w, name, LI_TYPE_F16, 1, &d, x, (size_t)d * 2, err);
    }
    float *x = malloc((size_t)d * 4);
    for (int64_t i = 0; i < d; i++) x[i] = vals ? vals[i] : 1.0f + 0.25f * rng_f();
    return li_gguf_writer_add_tensor(w, name, LI_TYPE_F32, 1, &d, x, (size_t)d * 4, err);
}

static int write_draft(const char *path, const li_model *m, const draft_opt *o) {
    li_error err = {0};
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    const li_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, F = N_FEAT;
    const int32_t H = o->n_head ? o->n_head : hp->n_head, KV = o->n_head_kv ? o->n_head_kv : hp->n_head_kv;
    const int32_t hd = o->head_dim ? o->head_dim : hp->head_dim, ff = o->n_ff ? o->n_ff : hp->n_ff;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)li_tokenizer_vocab_hash(m->tok));
    int rc = li_gguf_writer_add_str(&w, "general.architecture", o->arch ? o->arch : "eagle", &err);
    const struct {
        const char *k;
        int64_t v;
    } u[] = {{"eagle.version", o->version ? o->version : 1}, {"eagle.n_embd", o->n_embd ? o->n_embd : d},
             {"eagle.n_vocab", hp->n_vocab}, {"eagle.n_head", H}, {"eagle.n_head_kv", KV}, {"eagle.head_dim", hd},
             {"eagle.n_ff", ff}, {"eagle.n_features", F}, {"eagle.base.n_layer", o->base_layers ? o->base_layers : hp->n_layer},
             {"eagle.feature_layer.0", 0}, {"eagle.feature_layer.1", o->feat1 ? o->feat1 : 1}};
    for (size_t i = 0; i < LI_ARRAY_LEN(u) && !rc; i++) rc = li_gguf_writer_add_u32(&w, u[i].k, (uint32_t)u[i].v, &err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "eagle.base.name", o->base_name ? o->base_name : "tiny-eagle-base", &err);
    if (!rc) rc = li_gguf_writer_add_str(&w, "eagle.base.vocab_hash", o->hash ? o->hash : hash, &err);
    rng_seed(o->seed ? o->seed : 11);
    float *fc = NULL;
    if (o->echo) { /* hid = the last feature block: the target's residual stream after its last block */
        fc = calloc((size_t)(d * F * d), sizeof *fc);
        for (int64_t i = 0; i < d; i++) fc[i * F * d + (F - 1) * d + i] = 1.0f;
    }
    if (!rc) rc = add_mat(&w, "eagle.fc.weight", o->fc_rows ? o->fc_rows : d, F * d, o, fc, &err);
    free(fc);
    if (!rc) rc = add_norm(&w, "eagle.enorm.weight", d, NULL, o->norm_f16, &err);
    if (!rc) rc = add_norm(&w, "eagle.hnorm.weight", d, NULL, false, &err);
    if (!rc && !o->no_wq) rc = add_mat(&w, "eagle.attn_q.weight", (int64_t)H * hd, 2 * d, o, NULL, &err);
    if (!rc) rc = add_mat(&w, "eagle.attn_k.weight", (int64_t)KV * hd, 2 * d, o, NULL, &err);
    if (!rc) rc = add_mat(&w, "eagle.attn_v.weight", (int64_t)KV * hd, 2 * d, o, NULL, &err);
    if (!rc) rc = add_mat(&w, "eagle.attn_output.weight", d, (int64_t)H * hd, o, NULL, &err);
    if (!rc) rc = add_norm(&w, "eagle.ffn_norm.weight", d, NULL, false, &err);
    if (!rc) rc = add_mat(&w, "eagle.ffn_gate.weight", ff, d, o, NULL, &err);
    if (!rc) rc = add_mat(&w, "eagle.ffn_up.weight", ff, d, o, NULL, &err);
    if (!rc) rc = add_mat(&w, "eagle.ffn_down.weight", d, ff, o, NULL, &err);
    if (!rc) rc = add_norm(&w, "eagle.output_norm.weight", d, o->echo ? m->output_norm : NULL, false, &err);
    if (!rc && o->n_draft) {
        const int64_t n = o->n_draft;
        int32_t *v = malloc((size_t)n * sizeof *v);
        for (int64_t i = 0; i < n; i++) v[i] = (int32_t)(1 + 3 * i);
        if (o->vocab_unsorted) v[2] = v[1];
        if (o->vocab_oob) v[n - 1] = hp->n_vocab;
        rc = li_gguf_writer_add_tensor(&w, "eagle.vocab", LI_TYPE_I32, 1, &n, v, (size_t)n * 4, &err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, &err);
    li_gguf_writer_free(&w);
    CHECK(rc == 0, "write %s: %s", path, err.msg);
    return rc;
}

/* ==== loading checks ========================================================= */

static void expect_refused(const li_model *m, const draft_opt *o, const char *what, const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    if (write_draft(path, m, o)) return;
    li_eagle *eg = NULL;
    li_error err = {0};
    const int rc = li_eagle_load(&eg, path, m, &err);
    CHECK(rc != 0 && !eg && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "%s refused (%s): %s", what, needle,
          err.msg);
    li_eagle_free(eg);
}

static void test_load(const li_model *m) {
    char path[512];
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    li_error err = {0};
    write_draft(path, m, &(draft_opt){.type = LI_TYPE_F16, .scale = 0.3f, .n_draft = 101});
    li_eagle *eg = NULL;
    CHECK(li_eagle_load(&eg, path, m, &err) == 0, "a good draft loads: %s", err.msg);
    if (eg) {
        CHECK(eg->f.n_draft == 101 && eg->m.hp.n_vocab == 101 && eg->vocab[100] == 301 && eg->m.output.m == 101 &&
                  eg->f.n_features == 2 && eg->inproj.in_width == 2 * m->hp.n_embd && eg->m.hp.n_layer == 1,
              "its fields: %d draft ids, %d features", eg->f.n_draft, eg->f.n_features);
        /* the draft's head rows are the base's, bit for bit (a plain type) */
        CHECK(eg->m.output.type == m->output.type && !memcmp(eg->m.output.data, (const char *)m->output.data +
                                                             m->output.row_bytes, m->output.row_bytes),
              "the first head row is base row 1");
        CHECK(!memcmp((const char *)eg->m.output.data + 100 * m->output.row_bytes,
                      (const char *)m->output.data + 301 * m->output.row_bytes, m->output.row_bytes),
              "the last head row is base row 301");
    }
    li_eagle_free(eg);
    CHECK(li_eagle_load(&eg, "/nonexistent/draft.gguf", m, &err) != 0 && !eg, "a missing file: %s", err.msg);
    write_draft(path, m, &(draft_opt){.type = LI_TYPE_F32, .scale = 0.3f, .base_name = "another-name"});
    CHECK(li_eagle_load(&eg, path, m, &err) == 0 && eg && eg->f.n_draft == m->hp.n_vocab,
          "another base name alone loads (the whole vocabulary): %s", err.msg);
    li_eagle_free(eg);
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .arch = "medusa"}, "another architecture", "general.architecture");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .version = 2}, "version 2", "eagle.version");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .hash = "0123456789abcdef"}, "another vocabulary", "vocab hash");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .hash = "xyz"}, "a malformed hash", "16 lowercase hex");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .n_embd = 40}, "another width", "n_embd 40");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .base_layers = 5}, "another depth", "5 blocks");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .head_dim = 6, .n_head = 6, .n_head_kv = 2},
                   "another head_dim", "head_dim 6");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .feat1 = 7}, "a feature block past the base", "feature_layer.1");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .fc_rows = 35}, "a matrix of another shape", "eagle.fc.weight");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .norm_f16 = true}, "an f16 norm", "eagle.enorm.weight");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .no_wq = true}, "a missing tensor", "eagle.attn_q.weight");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .n_draft = 9, .vocab_unsorted = true}, "a repeated vocabulary id",
                   "strictly ascending");
    expect_refused(m, &(draft_opt){.type = LI_TYPE_F32, .n_draft = 9, .vocab_oob = true}, "an id past the vocabulary",
                   "strictly ascending");
    /* a truncated file */
    write_draft(path, m, &(draft_opt){.type = LI_TYPE_F32, .scale = 0.3f});
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, 0, SEEK_END);
        const long n = ftell(f);
        fclose(f);
        CHECK(truncate(path, n / 2) == 0, "truncate");
    }
    CHECK(li_eagle_load(&eg, path, m, &err) != 0 && !eg && !strchr(err.msg, '\n'), "a truncated file: %s", err.msg);
}

/* ==== the block against float64 ============================================== */

static double wval(const li_gguf_tensor *t, int64_t i) {
    return t->type == LI_TYPE_F16 ? li_fp16_to_fp32(((const uint16_t *)t->data)[i]) : ((const float *)t->data)[i];
}

/* y (rows) = W x, W the tensor t (rows, cols) */
static void ref_mv(const li_gguf_tensor *t, const double *x, double *y) {
    const int64_t cols = t->ne[0], rows = t->ne[1];
    for (int64_t r = 0; r < rows; r++) {
        double a = 0;
        for (int64_t c = 0; c < cols; c++) a += wval(t, r * cols + c) * x[c];
        y[r] = a;
    }
}

static void ref_rms(const double *x, const float *w, double *y, int64_t d, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / (double)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * s * w[i];
}

/* llama's RoPE on adjacent pairs, per head */
static void ref_rope(double *x, int heads, int hd, int n_rot, double theta, int pos) {
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < n_rot / 2; j++) {
            const double a = pos * pow(theta, -2.0 * j / n_rot), c = cos(a), s = sin(a);
            double *v = x + h * hd + 2 * j;
            const double x0 = v[0], x1 = v[1];
            v[0] = x0 * c - x1 * s;
            v[1] = x0 * s + x1 * c;
        }
}

enum { RT = 6, RD = 36 }; /* rows of the check, the tiny model's width */

/* The block over rows 0..T-1 of one sequence at positions 0..T-1: row t
 * reads tok[t] and in[t] (in_width floats when t < n_proj, then the
 * previous row's x'), logits over the draft vocabulary into lg (T, n_draft),
 * x' into xo (T, d). */
static void ref_block(const li_eagle *eg, const li_model *base, const int32_t *tok, const float *in, int T, int n_proj,
                      double *lg, double *xo) {
    const li_hparams *hp = &eg->m.hp;
    const int d = hp->n_embd, H = hp->n_head, KV = hp->n_head_kv, hd = hp->head_dim, ff = hp->n_ff;
    const li_gguf_tensor *const *t = eg->f.t;
    static double K[RT][RD * 4], V[RT][RD * 4];
    float row[RD];
    for (int r = 0; r < T; r++) {
        double hid[RD], e[RD], z[2 * RD], q[RD * 4], att[RD * 4], x[RD], n[RD], y[RD];
        if (r < n_proj) {
            double g[RD * N_FEAT];
            for (int i = 0; i < eg->inproj.in_width; i++) g[i] = in[r * eg->inproj.in_width + i];
            ref_mv(t[LI_EAGLE_FC], g, hid);
        } else {
            for (int i = 0; i < d; i++) hid[i] = xo[(r - 1) * d + i];
        }
        li_weight_dequant_row_ref(&base->tok_embd, tok[r], row);
        for (int i = 0; i < d; i++) e[i] = row[i];
        ref_rms(e, eg->inproj.norm_e, z, d, hp->norm_eps);
        ref_rms(hid, eg->inproj.norm_h, z + d, d, hp->norm_eps);
        ref_mv(t[LI_EAGLE_WQ], z, q);
        ref_mv(t[LI_EAGLE_WK], z, K[r]);
        ref_mv(t[LI_EAGLE_WV], z, V[r]);
        ref_rope(q, H, hd, hp->n_rot, hp->rope_theta, r);
        ref_rope(K[r], KV, hd, hp->n_rot, hp->rope_theta, r);
        for (int h = 0; h < H; h++) {
            const int kh = h / (H / KV);
            double s[RT], mx = -1e300, sum = 0;
            for (int u = 0; u <= r; u++) {
                s[u] = 0;
                for (int i = 0; i < hd; i++) s[u] += q[h * hd + i] * K[u][kh * hd + i];
                s[u] /= sqrt((double)hd);
                mx = fmax(mx, s[u]);
            }
            for (int u = 0; u <= r; u++) sum += s[u] = exp(s[u] - mx);
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int u = 0; u <= r; u++) a += s[u] / sum * V[u][kh * hd + i];
                att[h * hd + i] = a;
            }
        }
        double o[RD];
        ref_mv(t[LI_EAGLE_WO], att, o);
        for (int i = 0; i < d; i++) x[i] = hid[i] + o[i];
        ref_rms(x, eg->layer.ffn_norm, n, d, hp->norm_eps);
        double gt[64], up[64], dn[RD];
        ref_mv(t[LI_EAGLE_GATE], n, gt);
        ref_mv(t[LI_EAGLE_UP], n, up);
        for (int i = 0; i < ff; i++) gt[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
        ref_mv(t[LI_EAGLE_DOWN], gt, dn);
        for (int i = 0; i < d; i++) x[i] += dn[i], xo[r * d + i] = x[i];
        ref_rms(x, eg->m.output_norm, y, d, hp->norm_eps);
        for (int v = 0; v < eg->f.n_draft; v++) {
            li_weight_dequant_row_ref(&base->output, eg->vocab[v], row);
            double a = 0;
            for (int i = 0; i < d; i++) a += row[i] * y[i];
            lg[r * eg->f.n_draft + v] = a;
        }
    }
}

static void test_forward(li_model *m, const char *isa, li_type wtype) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, isa, &err) == 0, "%s", err.msg);
    CHECK(li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/fw.gguf", dir);
    write_draft(path, m, &(draft_opt){.type = wtype, .scale = 0.3f, .seed = 99, .n_draft = 77, .n_ff = 27});
    li_eagle *eg = NULL;
    CHECK(li_eagle_load(&eg, path, m, &err) == 0 && li_eagle_prepare(eg, m, &be, &err) == 0, "%s", err.msg);
    li_session s;
    CHECK(eg && li_session_init(&s, &eg->m, &be, 32, LI_TYPE_F32, 16, &err) == 0, "session: %s", err.msg);
    if (!eg || t_failed) return;
    const int d = m->hp.n_embd, W = eg->inproj.in_width, nd = eg->f.n_draft;
    /* rows 0..RT-2 fed "captured" rows, row RT-1 a chain step fed row RT-2's x' */
    int32_t tok[RT], pos[RT], rows[RT];
    int64_t slot[RT];
    static float in[RT * RD * N_FEAT];
    rng_seed(5);
    for (int i = 0; i < RT; i++) tok[i] = (int32_t)(rng_u32() % 2000), pos[i] = i, rows[i] = i;
    for (int i = 0; i < RT * W; i++) in[i] = 3 * rng_f();
    CHECK(li_kv_seq_reserve(&s.kv, &s.seq, RT) == 0, "reserve");
    for (int i = 0; i < RT; i++) slot[i] = li_kv_seq_slot(&s.kv, &s.seq, i);
    li_batch b = {.n = RT - 1, .tokens = tok, .pos = pos, .seq = s.seq_idx, .slot = slot, .block_table = s.seq.blocks,
                  .n_seqs = 1, .bt_stride = s.seq.n_blocks, .logit_rows = rows, .n_logits = RT - 1,
                  .hidden = LI_HIDDEN_PRE_NORM, .in_hidden = in, .in_width = W};
    static float got_lg[RT * 2000], got_x[RT * RD];
    CHECK(li_forward_run(&s.fw, &eg->m, &be, &s.kv, &b, got_lg, &err) == 0, "run: %s", err.msg);
    const float *hx = li_forward_hidden(&s.fw, &eg->m);
    if (hx) memcpy(got_x, hx, sizeof(float) * (size_t)((RT - 1) * d));
    /* the chain row: its own previous x' */
    li_batch c = {.n = 1, .tokens = tok + RT - 1, .pos = pos + RT - 1, .seq = s.seq_idx, .slot = slot + RT - 1,
                  .block_table = s.seq.blocks, .n_seqs = 1, .bt_stride = s.seq.n_blocks, .logit_rows = rows,
                  .n_logits = 1, .hidden = LI_HIDDEN_PRE_NORM, .in_hidden = got_x + (RT - 2) * d, .in_width = d};
    CHECK(li_forward_run(&s.fw, &eg->m, &be, &s.kv, &c, got_lg + (RT - 1) * nd, &err) == 0, "chain run: %s", err.msg);
    static double want_lg[RT * 2000], want_x[RT * RD];
    ref_block(eg, m, tok, in, RT, RT - 1, want_lg, want_x);
    double worst = 0, scale = 0;
    for (int i = 0; i < RT * nd; i++) scale = fmax(scale, fabs(want_lg[i]));
    for (int i = 0; i < RT * nd; i++) worst = fmax(worst, fabs(got_lg[i] - want_lg[i]) / scale);
    CHECK(scale > 0.1 && worst < 2e-4, "%s, %s draft: logits over %d draft ids match float64 (worst %.2e of max %.2f)",
          isa, li_type_name(wtype), nd, worst, scale);
    /* refusals: no in_hidden, a width that is neither */
    b.in_hidden = NULL;
    CHECK(li_forward_run(&s.fw, &eg->m, &be, &s.kv, &b, NULL, &err) == LI_EINVAL && strstr(err.msg, "in_hidden"),
          "no in_hidden refused: %s", err.msg);
    b.in_hidden = in, b.in_width = d + 1;
    CHECK(li_forward_run(&s.fw, &eg->m, &be, &s.kv, &b, NULL, &err) == LI_EINVAL && strstr(err.msg, "in_hidden"),
          "a wrong width refused: %s", err.msg);
    li_session_free(&s);
    li_eagle_free(eg);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

/* li_batch.capture: block l's residual stream, checked against a model cut
 * after block l (its pre-norm hidden state is that residual stream) */
static void test_capture(li_model *m) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    li_session s, s1;
    li_model cut;
    CHECK(li_spec_layer_view(&cut, m, 1, &err) == 0, "%s", err.msg);
    CHECK(li_session_init(&s, m, &be, 32, LI_TYPE_F32, 16, &err) == 0 &&
              li_session_init(&s1, &cut, &be, 32, LI_TYPE_F32, 16, &err) == 0,
          "%s", err.msg);
    enum { N = 7 };
    int32_t tok[N], pos[N], rows[N];
    int64_t slot[N], slot1[N];
    for (int i = 0; i < N; i++) tok[i] = 17 + 113 * i, pos[i] = i, rows[i] = i;
    li_kv_seq_reserve(&s.kv, &s.seq, N);
    li_kv_seq_reserve(&s1.kv, &s1.seq, N);
    for (int i = 0; i < N; i++) slot[i] = li_kv_seq_slot(&s.kv, &s.seq, i), slot1[i] = li_kv_seq_slot(&s1.kv, &s1.seq, i);
    const int32_t cap[2] = {0, 1};
    li_batch b = {.n = N, .tokens = tok, .pos = pos, .seq = s.seq_idx, .slot = slot, .block_table = s.seq.blocks,
                  .n_seqs = 1, .bt_stride = s.seq.n_blocks, .logit_rows = rows, .n_logits = N,
                  .hidden = LI_HIDDEN_PRE_NORM, .capture = cap, .n_capture = 2};
    CHECK(li_forward_run(&s.fw, m, &be, &s.kv, &b, NULL, &err) == 0, "%s", err.msg);
    const int d = m->hp.n_embd;
    static float c2[N * RD * 2], last[N * RD];
    const float *cp = li_forward_captured(&s.fw), *hl = li_forward_hidden(&s.fw, m);
    CHECK(cp && hl, "captured and hidden rows");
    if (!cp || !hl) return;
    memcpy(c2, cp, sizeof(float) * N * 2 * d);
    memcpy(last, hl, sizeof(float) * N * d);
    li_batch b1 = b;
    b1.seq = s1.seq_idx, b1.slot = slot1, b1.block_table = s1.seq.blocks, b1.capture = NULL, b1.n_capture = 0;
    CHECK(li_forward_run(&s1.fw, &cut, &be, &s1.kv, &b1, NULL, &err) == 0, "%s", err.msg);
    const float *h1 = li_forward_hidden(&s1.fw, &cut);
    bool ok0 = h1 != NULL, ok1 = true;
    for (int r = 0; r < N && h1; r++) {
        ok0 &= !memcmp(c2 + r * 2 * d, h1 + r * d, sizeof(float) * d);
        ok1 &= !memcmp(c2 + r * 2 * d + d, last + r * d, sizeof(float) * d);
    }
    CHECK(ok0 && ok1, "capture: block 0's rows equal a 1-block cut's output, block 1's the model's pre-norm rows");
    const int32_t bad[2] = {1, 0};
    b.capture = bad;
    CHECK(li_forward_run(&s.fw, m, &be, &s.kv, &b, NULL, &err) == LI_EINVAL && strstr(err.msg, "ascending"),
          "descending capture blocks refused: %s", err.msg);
    li_session_free(&s);
    li_session_free(&s1);
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
    li_eagle *eagle;
    int32_t k;
    float temperature;
    size_t kv_memory;
    int32_t max_batched;
    bool repeat;           /* prompts that repeat a phrase (echo drafts get accepted) */
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
    if (rc->eagle) {
        c.eagle = rc->eagle;
        c.spec_method = LI_SPEC_EAGLE;
        c.spec_tokens = rc->k;
    }
    li_engine *e;
    if (li_engine_init(&e, m, be, &c, &err)) {
        CHECK(0, "engine: %s", err.msg);
        return -1;
    }
    int32_t prompts[N_REQ][48];
    int lens[N_REQ] = {7, 40, 40, 3, 21};
    for (int r = 0; r < N_REQ; r++)
        for (int i = 0; i < lens[r]; i++)
            prompts[r][i] = rc->repeat ? 5 + (r * 31 + i % 3) % 1990 : 5 + (r * 131 + i * 7) % 1990;
    for (int i = 0; i < 33; i++) prompts[2][i] = prompts[1][i];
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

static bool same_bits(const run_out *a, const run_out *b) {
    bool eq = true;
    for (int r = 1; r <= N_IDS; r++)
        eq &= a->n[r] == b->n[r] && !memcmp(a->toks[r], b->toks[r], sizeof a->toks[r]) && a->hash[r] == b->hash[r];
    return eq;
}

static void test_engine(li_model *m) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char rp[512], ep[512], vp[512];
    snprintf(rp, sizeof rp, "%s/random.gguf", dir);
    snprintf(ep, sizeof ep, "%s/echo.gguf", dir);
    snprintf(vp, sizeof vp, "%s/vocab.gguf", dir);
    write_draft(rp, m, &(draft_opt){.type = LI_TYPE_F16, .scale = 0.3f, .seed = 21});
    write_draft(ep, m, &(draft_opt){.type = LI_TYPE_F32, .echo = true});
    write_draft(vp, m, &(draft_opt){.type = LI_TYPE_F32, .echo = true, .n_draft = 600});
    li_eagle *rnd = NULL, *echo = NULL, *voc = NULL;
    CHECK(li_eagle_load(&rnd, rp, m, &err) == 0 && li_eagle_load(&echo, ep, m, &err) == 0 &&
              li_eagle_load(&voc, vp, m, &err) == 0,
          "%s", err.msg);
    if (t_failed) return;
    const size_t roomy = (size_t)4 << 20;
    /* the tiny model's KV: 2 layers x 1 head x 12 x f16 x 2 = 96 bytes per token, the draft's 48 */
    const size_t tight = (size_t)144 * 16 * 9; /* 9 blocks: preempts */
    int64_t accepted = 0;
    const struct {
        const char *what;
        size_t kv;
        int32_t mbt;
        bool repeat;
    } cases[] = {{"roomy", roomy, 512, false}, {"chunked prefill", roomy, 24, true}, {"preemption", tight, 64, true},
                 {"repeating prompts", roomy, 512, true}};
    for (size_t ci = 0; ci < LI_ARRAY_LEN(cases); ci++) {
        run_out base, r, z, v;
        const run_cfg c0 = {.kv_memory = cases[ci].kv, .max_batched = cases[ci].mbt, .repeat = cases[ci].repeat};
        run_cfg c1 = c0, c2 = c0, c3 = c0;
        c1.eagle = rnd, c1.k = 4;
        c2.eagle = echo, c2.k = 3;
        c3.eagle = voc, c3.k = 5;
        run(m, &be, &c0, &base);
        run(m, &be, &c1, &r);
        run(m, &be, &c2, &z);
        run(m, &be, &c3, &v);
        CHECK(base.n[1] == MAX_TOK && base.st.spec_drafted == 0, "%s: the plain run ran", cases[ci].what);
        CHECK(same_bits(&base, &r), "%s, random draft: the same tokens and logit bits as no speculation (%lld drafted, %lld accepted)",
              cases[ci].what, (long long)r.st.spec_drafted, (long long)r.st.spec_accepted);
        CHECK(same_bits(&base, &z), "%s, echo draft: the same tokens and logit bits (%lld drafted, %lld accepted)",
              cases[ci].what, (long long)z.st.spec_drafted, (long long)z.st.spec_accepted);
        CHECK(same_bits(&base, &v), "%s, echo draft over 600 ids: the same tokens and logit bits (%lld drafted, %lld accepted)",
              cases[ci].what, (long long)v.st.spec_drafted, (long long)v.st.spec_accepted);
        CHECK(z.st.spec_drafted > 0 && z.st.spec_drafted == z.st.spec_drafted_by[LI_SPEC_EAGLE] &&
                  z.st.draft_sync_tokens > 0,
              "%s: counted as eagle, the draft ran over the target's rows (%lld)", cases[ci].what,
              (long long)z.st.draft_sync_tokens);
        if (ci == 2) CHECK(base.st.preemptions > 0 && z.st.preemptions > 0, "the tight KV preempts (%lld, %lld)",
                           (long long)base.st.preemptions, (long long)z.st.preemptions);
        printf("%s: random %lld/%lld, echo %lld/%lld, echo over 600 ids %lld/%lld accepted/drafted; %lld preemptions, "
               "%lld cached\n",
               cases[ci].what, (long long)r.st.spec_accepted, (long long)r.st.spec_drafted,
               (long long)z.st.spec_accepted, (long long)z.st.spec_drafted, (long long)v.st.spec_accepted,
               (long long)v.st.spec_drafted, (long long)z.st.preemptions, (long long)z.st.prefix_hit_tokens);
        accepted += z.st.spec_accepted;
    }
    CHECK(accepted > 0, "echo drafts were accepted (%lld)", (long long)accepted);
    /* temperature > 0: a seed reproduces its tokens */
    run_out s1, s2;
    const run_cfg ct = {.eagle = echo, .k = 3, .temperature = 0.8f, .kv_memory = roomy, .max_batched = 512, .repeat = true};
    run(m, &be, &ct, &s1);
    run(m, &be, &ct, &s2);
    CHECK(same_bits(&s1, &s2) && s1.n[1] == MAX_TOK && s1.st.spec_drafted > 0,
          "temperature 0.8: the same seed gives the same tokens (%lld accepted of %lld)", (long long)s1.st.spec_accepted,
          (long long)s1.st.spec_drafted);
    /* refusals */
    li_engine *e = NULL;
    li_engine_config c;
    li_engine_config_default(&c);
    c.spec_method = LI_SPEC_EAGLE;
    c.spec_tokens = 3;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EINVAL && strstr(err.msg, "--eagle"), "eagle without a draft: %s",
          err.msg);
    li_engine_config_default(&c);
    c.eagle = echo;
    c.tensor_parallel = 2;
    CHECK(li_engine_init(&e, m, &be, &c, &err) != 0 && strstr(err.msg, "tensor_parallel"), "with TP 2: %s",
          err.msg);
    li_engine_config_default(&c);
    c.eagle = echo;
    c.medusa = (li_medusa *)1; /* refused before it is read */
    CHECK(li_engine_init(&e, m, &be, &c, &err) != 0 && strstr(err.msg, "EAGLE") && strstr(err.msg, "Medusa"),
          "with Medusa heads: %s", err.msg);
    li_eagle_free(rnd);
    li_eagle_free(echo);
    li_eagle_free(voc);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
    /* the ggml ISA is batch-variant: refused */
    CHECK(li_backend_cpu_init(&be, 1, "ggml", &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    CHECK(li_eagle_load(&echo, ep, m, &err) == 0, "%s", err.msg);
    li_engine_config_default(&c);
    c.eagle = echo;
    CHECK(li_engine_init(&e, m, &be, &c, &err) == LI_EINVAL && strstr(err.msg, "batch-invariant"), "ggml: %s", err.msg);
    li_eagle_free(echo);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

/* ==== the draft's KV in the engine equals the draft run alone =============== */

enum { OBS_MAX = 64 };

typedef struct obs_log {
    int n;
    int nd;
    int64_t id[OBS_MAX];
    int32_t pos[OBS_MAX];
    float *lg; /* (OBS_MAX, nd) */
} obs_log;

static void observe(void *ud, int64_t id, int32_t pos, const float *logits) {
    obs_log *o = ud;
    if (o->n == OBS_MAX) return;
    o->id[o->n] = id;
    o->pos[o->n] = pos;
    memcpy(o->lg + (size_t)o->n * o->nd, logits, (size_t)o->nd * sizeof(float));
    o->n++;
}

enum { ALONE_MAX = 128 };

/* The first draft step's logits for a request whose tokens are toks[0..pos]:
 * the target alone over positions [0, pos) capturing its feature blocks,
 * then the draft alone over rows 0..pos reading the capture of the row
 * before (zeros for row 0, and for row zero_at: the first after a prefix
 * hit; -1 none). zero_below > 0: the draft's KV of positions [0, zero_below)
 * is zeroed before row pos runs (what an idle request's drop leaves). */
static int alone(li_model *m, li_eagle *eg, li_backend *be, li_type kv, const int32_t *toks, int32_t pos,
                 int32_t zero_at, int32_t zero_below, float *lg) {
    li_error err = {0};
    li_session t, d;
    if (li_session_init(&t, m, be, ALONE_MAX, kv, ALONE_MAX, &err) ||
        li_session_init(&d, &eg->m, be, ALONE_MAX, kv, ALONE_MAX, &err)) {
        CHECK(0, "sessions: %s", err.msg);
        return -1;
    }
    const int n = pos + 1, W = eg->inproj.in_width;
    int32_t p[ALONE_MAX], rows[ALONE_MAX];
    int64_t st[ALONE_MAX], sd[ALONE_MAX];
    li_kv_seq_reserve(&t.kv, &t.seq, n);
    li_kv_seq_reserve(&d.kv, &d.seq, n);
    for (int i = 0; i < n; i++) {
        p[i] = i, rows[i] = i;
        st[i] = li_kv_seq_slot(&t.kv, &t.seq, i), sd[i] = li_kv_seq_slot(&d.kv, &d.seq, i);
    }
    static float in[ALONE_MAX * RD * N_FEAT];
    memset(in, 0, sizeof in);
    int rc = 0;
    if (pos > 0) {
        li_batch b = {.n = pos, .tokens = toks, .pos = p, .seq = t.seq_idx, .slot = st, .block_table = t.seq.blocks,
                      .n_seqs = 1, .bt_stride = t.seq.n_blocks, .capture = eg->f.feature_layer,
                      .n_capture = eg->f.n_features};
        rc = li_forward_run(&t.fw, m, be, &t.kv, &b, NULL, &err);
        const float *cp = rc ? NULL : li_forward_captured(&t.fw);
        if (cp) memcpy(in + W, cp, sizeof(float) * (size_t)pos * W);
        if (zero_at > 0 && zero_at <= pos) memset(in + (size_t)zero_at * W, 0, sizeof(float) * (size_t)W);
    }
    li_batch b = {.n = n, .tokens = toks, .pos = p, .seq = d.seq_idx, .slot = sd, .block_table = d.seq.blocks,
                  .n_seqs = 1, .bt_stride = d.seq.n_blocks, .logit_rows = rows + pos, .n_logits = 1,
                  .in_hidden = in, .in_width = W};
    if (!rc && zero_below > 0 && pos > 0) { /* rows [0, pos), the zeros, then row pos (batch-invariant) */
        li_batch b0 = b;
        b0.n = pos, b0.logit_rows = NULL, b0.n_logits = 0, b0.no_logits = true;
        rc = li_forward_run(&d.fw, &eg->m, be, &d.kv, &b0, NULL, &err);
        li_kv_slots_clear(&d.kv, sd, LI_MIN(zero_below, pos));
        b.n = 1, b.tokens = toks + pos, b.pos = p + pos, b.slot = sd + pos, b.logit_rows = rows, b.in_hidden = in + (size_t)pos * W;
    }
    if (!rc) rc = li_forward_run(&d.fw, &eg->m, be, &d.kv, &b, lg, &err);
    CHECK(rc == 0, "alone: %s", err.msg);
    li_session_free(&t);
    li_session_free(&d);
    return rc;
}

/* Rows wait for the draft (e_pend) until a request drafts with EAGLE, a
 * block is about to join the prefix cache, or LI_EAGLE_PENDING_MAX wait:
 * this policy drafts at every third length only, so rows wait steps long. */
static const char *SOMETIMES = "return { speculate = function(req, s)\n"
                               "  if req.num_tokens % 3 == 0 then return 'eagle', 3 end\n"
                               "  return 0 end }";
/* ... and this one only past 70 tokens: without a prefix cache, rows wait
 * until LI_EAGLE_PENDING_MAX of them do. */
static const char *LATE = "return { speculate = function(req, s)\n"
                          "  if req.num_tokens > 70 then return 'eagle', 3 end\n"
                          "  return 0 end }";

typedef struct sync_case {
    const char *what;
    int32_t mbt;       /* max_batched_tokens */
    const char *policy; /* SOMETIMES, LATE, or NULL: every step */
    bool no_cache;     /* prefix caching off */
    int n_prompt;      /* 0: three prompts of 7, 10, 13 tokens; else two equal ones, the second after the first
                        * finished (a prefix hit) */
    int samples;       /* 2: each prompt two samples, forked from it when its prefill ends */
    int idle;          /* eagle_idle_steps (0: never drop) */
    int zero_below;    /* idle: each request's draft KV below this position is dropped (zeros); with
                        * n_prompt, the second request's (the blocks of the hit) */
    bool lazy;         /* eagle_lazy */
} sync_case;

static void sync_run(li_model *m, li_backend *be, li_eagle *eg, const sync_case *sc) {
    li_error err = {0};
    li_engine_config c;
    li_engine_config_default(&c);
    c.eagle = eg;
    c.spec_method = LI_SPEC_EAGLE;
    c.spec_tokens = 3;
    c.spec_disable_batch = 0;
    c.max_batched_tokens = sc->mbt;
    c.prefix_caching = !sc->no_cache;
    c.eagle_idle_steps = sc->idle;
    c.eagle_lazy = sc->lazy;
    li_engine *e = NULL;
    CHECK(li_engine_init(&e, m, be, &c, &err) == 0, "%s", err.msg);
    if (!e) return;
    li_policy *pol = NULL;
    if (sc->policy) {
        CHECK(li_policy_lua_open(&pol, "policy.lua", sc->policy, NULL, &err) == 0, "%s", err.msg);
        li_engine_set_policy(e, pol);
    }
    obs_log o = {.nd = eg->f.n_draft};
    o.lg = malloc(sizeof(float) * OBS_MAX * (size_t)o.nd);
    li_engine_draft_observe(e, observe, &o);
    if (sc->idle && sc->no_cache) {
        /* a request that drafts from its first step leaves real draft KV in the blocks it frees, which
         * the next requests take again (the free list is a stack): a drop must zero them, not find zeros */
        int32_t warm[72];
        for (int i = 0; i < 72; i++) warm[i] = 5 + (i * 37) % 1990;
        li_request_params p = {.prompt = warm, .n_prompt = 72, .max_tokens = 8, .ignore_eos = true};
        li_sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        int64_t wid;
        CHECK(li_engine_add(e, &p, &wid, &err) == 0, "%s", err.msg);
        while (li_engine_has_work(e) && li_engine_step(e, &err) == 0) {}
        o.n = 0;
    }
    const int nr = sc->n_prompt ? 2 : 3;
    int32_t prompt[3][ALONE_MAX];
    int np[3];
    int64_t ids[3];
    li_engine_stats st0 = {0};
    for (int r = 0; r < nr; r++) {
        np[r] = sc->n_prompt ? sc->n_prompt : 7 + 3 * r;
        for (int i = 0; i < np[r]; i++) prompt[r][i] = 3 + ((sc->n_prompt ? 0 : r) * 577 + i * 41) % 1990;
        li_request_params p = {.prompt = prompt[r], .n_prompt = np[r], .max_tokens = sc->policy == LATE ? 80 : 12,
                               .ignore_eos = true, .n = sc->samples};
        li_sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        if (sc->n_prompt && r == 0) p.spec_set = true, p.spec_k = 0; /* the first never drafts: all its rows wait */
        CHECK(li_engine_add(e, &p, &ids[r], &err) == 0, "%s", err.msg);
        if (sc->n_prompt) {
            while (li_engine_has_work(e) && li_engine_step(e, &err) == 0) {}
            if (r == 0) li_engine_stats_get(e, &st0);
        }
    }
    while (li_engine_has_work(e) && li_engine_step(e, &err) == 0) {}
    li_engine_stats st;
    li_engine_stats_get(e, &st);
    int checked = 0, same = 0;
    float *want = malloc(sizeof(float) * (size_t)o.nd);
    for (int i = 0; i < o.n; i++) {
        int r = 0; /* the prompt of the request observed (a sample's id follows its prompt's) */
        while (r < nr && !(o.id[i] >= ids[r] && o.id[i] < ids[r] + LI_MAX(sc->samples, 1))) r++;
        const li_request_result *res = r < nr ? li_engine_result(e, o.id[i]) : NULL;
        if (!res) continue;
        int32_t toks[ALONE_MAX];
        memcpy(toks, prompt[r], sizeof(int32_t) * (size_t)np[r]);
        memcpy(toks + np[r], res->tokens, sizeof(int32_t) * (size_t)res->n_tokens);
        if (o.pos[i] >= np[r] + res->n_tokens) continue;
        if (alone(m, eg, be, c.kv_dtype, toks, o.pos[i], (int32_t)res->cached_tokens, sc->zero_below, want)) break;
        checked++;
        same += !memcmp(want, o.lg + (size_t)i * o.nd, sizeof(float) * (size_t)o.nd);
    }
    CHECK(checked >= (sc->policy || sc->n_prompt ? 5 : 10) && same == checked,
          "%s: %d of %d first draft steps equal the draft run alone over the target's captured rows, bit for bit",
          sc->what, same, checked);
    if (sc->idle && !sc->n_prompt)
        CHECK(st.draft_sync_dropped == (int64_t)nr * sc->zero_below,
              "%s: each request's positions below %d were dropped (%lld dropped, want %lld)", sc->what,
              sc->zero_below, (long long)st.draft_sync_dropped, (long long)nr * sc->zero_below);
    if (sc->n_prompt && sc->lazy) {
        const li_request_result *a = li_engine_result(e, ids[0]), *b = li_engine_result(e, ids[1]);
        /* every position the first computed (all but its last token's) waited in vain */
        CHECK(a && b && b->cached_tokens == sc->zero_below && st0.draft_sync_tokens == 0 &&
                  st0.draft_sync_dropped == np[0] + a->n_tokens - 1,
              "%s: the first request never drafted and computed no draft KV (%lld rows; %lld dropped at its end), "
              "the second hit %lld tokens of zeros",
              sc->what, (long long)st0.draft_sync_tokens, (long long)st0.draft_sync_dropped,
              b ? (long long)b->cached_tokens : -1LL);
    } else if (sc->lazy && !sc->idle) {
        CHECK(st.draft_sync_dropped == 0, "%s: every request drafted, so nothing waited in vain (%lld dropped)",
              sc->what, (long long)st.draft_sync_dropped);
    } else if (sc->n_prompt && sc->idle) {
        const li_request_result *b = li_engine_result(e, ids[1]);
        CHECK(b && b->cached_tokens == sc->zero_below && st0.draft_sync_dropped >= sc->zero_below,
              "%s: the first request dropped its rows (%lld) and the second hit %lld tokens of them", sc->what,
              (long long)st0.draft_sync_dropped, b ? (long long)b->cached_tokens : -1LL);
    } else if (sc->n_prompt) {
        const li_request_result *b = li_engine_result(e, ids[1]);
        CHECK(b && b->cached_tokens == 32 && st0.spec_drafted == 0 && st0.draft_sync_tokens >= 32,
              "%s: the first request never drafted, yet its blocks got their draft KV before joining the cache "
              "(%lld rows), and the second hit them (%lld tokens)",
              sc->what, (long long)st0.draft_sync_tokens, b ? (long long)b->cached_tokens : -1LL);
    }
    printf("eagle sync, %s: %d first drafts checked, %lld rows caught up, %lld dropped, %lld drafted\n", sc->what,
           checked, (long long)st.draft_sync_tokens, (long long)st.draft_sync_dropped, (long long)st.spec_drafted);
    free(want);
    free(o.lg);
    li_engine_free(e);
    if (pol) pol->ops->free(pol);
}

static void test_sync(li_model *m) {
    li_error err = {0};
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    char rp[512];
    snprintf(rp, sizeof rp, "%s/sync.gguf", dir);
    write_draft(rp, m, &(draft_opt){.type = LI_TYPE_F16, .scale = 0.3f, .seed = 77, .n_draft = 333});
    li_eagle *eg = NULL;
    CHECK(li_eagle_load(&eg, rp, m, &err) == 0 && li_eagle_prepare(eg, m, &be, &err) == 0, "%s", err.msg);
    if (!eg) return;
    const sync_case cases[] = {
        {"whole prompts", 256, NULL, false, 0, 0, 0, 0, false},
        {"chunks of 5 (a feature kept across chunks)", 5, NULL, false, 0, 0, 0, 0, false},
        {"drafting every third length", 256, SOMETIMES, false, 0, 0, 0, 0, false},
        {"drafting every third length, no prefix cache", 256, SOMETIMES, true, 0, 0, 0, 0, false},
        {"drafting every third length, chunks of 5, no prefix cache", 5, SOMETIMES, true, 0, 0, 0, 0, false},
        {"drafting past 70 tokens, no prefix cache", 256, LATE, true, 0, 0, 0, 0, false},
        {"a prefix hit on a request that never drafted", 256, NULL, false, 40, 0, 0, 0, false},
        {"two samples of each prompt (forks share the prompt's blocks and its waiting rows)", 256, SOMETIMES, true, 0, 2, 0, 0, false},
        /* idle requests: no draft before 71 tokens, so with eagle_idle_steps 2 the catch-ups before are
         * drops: at 65 pending rows without a prefix cache, at each full block (16) with one */
        {"drafting past 70 tokens, idle after 2 steps, no prefix cache", 256, LATE, true, 0, 0, 2, 65, false},
        {"drafting past 70 tokens, idle after 2 steps", 256, LATE, false, 0, 0, 2, 64, false},
        /* chunks of 5: the never-drafting first request is idle from its fourth step, so its prompt's
         * blocks join the cache with zeros; the second hits them */
        {"a prefix hit on the blocks an idle request dropped", 5, NULL, false, 40, 0, 2, 32, false},
        /* eagle_lazy: rows wait from the prompt on until a request's first EAGLE draft, past the blocks
         * joining the prefix cache; the first drafts are the same bits */
        {"eagle_lazy, drafting from the first step", 256, NULL, false, 0, 0, 0, 0, true},
        {"eagle_lazy, chunks of 5", 5, NULL, false, 0, 0, 0, 0, true},
        {"eagle_lazy, drafting every third length", 256, SOMETIMES, false, 0, 0, 0, 0, true},
        {"eagle_lazy, drafting past 70 tokens", 256, LATE, false, 0, 0, 0, 0, true},
        {"eagle_lazy, two samples of each prompt", 256, SOMETIMES, false, 0, 2, 0, 0, true},
        {"eagle_lazy, two samples of each prompt drafting past 70 tokens", 256, LATE, false, 0, 2, 0, 0, true},
        /* the first request never drafts: its blocks join the cache with zeros, which the second hits */
        {"eagle_lazy, a prefix hit on a request that never drafted", 256, NULL, false, 40, 0, 0, 32, true},
        /* idle first: as without eagle_lazy */
        {"eagle_lazy, drafting past 70 tokens, idle after 2 steps", 256, LATE, false, 0, 0, 2, 64, true},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++) sync_run(m, &be, eg, &cases[i]);
    li_eagle_free(eg);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
}

/* ==== the real model: an echo draft's acceptance is predictable ============= */

enum { REP_TOK = 24 };

/* What each step of a run did: tokens before it, drafts verified, accepted. */
typedef struct rep_steps {
    int n;
    int64_t before[4 * REP_TOK], drafted[4 * REP_TOK], accepted[4 * REP_TOK];
} rep_steps;

static int rep_run(li_model *m, li_backend *be, li_eagle *eg, const char *text, int32_t *out, li_engine_stats *st,
                   rep_steps *rs) {
    li_error err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(li_tokenizer_encode(m->tok, text, strlen(text), true, false, &ids, &n_ids, &err) == 0, "%s", err.msg);
    li_engine_config c;
    li_engine_config_default(&c);
    if (eg) {
        c.eagle = eg;
        c.spec_method = LI_SPEC_EAGLE;
        c.spec_tokens = 2;
    }
    li_engine *e = NULL;
    int n = -1;
    CHECK(li_engine_init(&e, m, be, &c, &err) == 0, "%s", err.msg);
    li_request_params rp = {.prompt = ids, .n_prompt = (int64_t)n_ids, .max_tokens = REP_TOK, .ignore_eos = true};
    li_sampling_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    int64_t id;
    CHECK(e && li_engine_add(e, &rp, &id, &err) == 0, "%s", err.msg);
    memset(rs, 0, sizeof *rs);
    memset(st, 0, sizeof *st);
    while (e && li_engine_has_work(e) && rs->n < 4 * REP_TOK) {
        const li_request_result *r0 = li_engine_result(e, id);
        const int64_t before = r0 ? r0->n_tokens : 0, dr = st->spec_drafted, ac = st->spec_accepted;
        if (li_engine_step(e, &err)) break;
        li_engine_stats_get(e, st);
        rs->before[rs->n] = before;
        rs->drafted[rs->n] = st->spec_drafted - dr;
        rs->accepted[rs->n++] = st->spec_accepted - ac;
    }
    const li_request_result *res = e ? li_engine_result(e, id) : NULL;
    if (res) {
        n = (int)(res->n_tokens < REP_TOK ? res->n_tokens : REP_TOK);
        memcpy(out, res->tokens, (size_t)n * sizeof *out);
    }
    li_engine_free(e);
    free(ids);
    return n;
}

static void test_real(void) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(NULL), &err)) {
        printf("SKIP real model: %s\n", err.msg);
        return;
    }
    li_backend be;
    CHECK(li_backend_cpu_init(&be, 2, NULL, &err) == 0 && li_model_prepare(m, &be, &err) == 0, "%s", err.msg);
    /* an echo draft over the real model (written through the same writer,
     * the real shapes: 2 features, the first and last blocks) */
    char ep[512];
    snprintf(ep, sizeof ep, "%s/real_echo.gguf", dir);
    draft_opt o = {.type = LI_TYPE_F32, .echo = true, .feat1 = m->hp.n_layer - 1};
    if (write_draft(ep, m, &o)) return;
    li_eagle *eg;
    CHECK(li_eagle_load(&eg, ep, m, &err) == 0, "%s", err.msg);
    if (t_failed) return;
    const char *ha = "ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha";
    int32_t plain[REP_TOK], spec[REP_TOK];
    li_engine_stats st;
    rep_steps rs;
    const int n_plain = rep_run(m, &be, NULL, ha, plain, &st, &rs), n_spec = rep_run(m, &be, eg, ha, spec, &st, &rs);
    CHECK(n_plain == REP_TOK && n_spec == n_plain && !memcmp(plain, spec, sizeof plain), "repeating text: the same tokens");
    /* step 0 drafts the last token again (the target's own logits at the
     * position before: bit for bit, an F32 identity fc is exact), a chain
     * step feeds that hidden state back: the same token again. So a step
     * that verifies k drafts after token i accepts the repeats of plain[i]
     * that follow it, up to k (k itself is the engine's: room, blocks) */
    bool ok = true;
    int64_t drafted = 0;
    for (int s = 0; s < rs.n; s++) {
        if (!rs.drafted[s]) continue;
        const int64_t i = rs.before[s] - 1;
        int64_t a = 0;
        while (a < rs.drafted[s] && i + 1 + a < n_plain && plain[i + 1 + a] == plain[i]) a++;
        ok &= rs.accepted[s] == a;
        drafted += rs.drafted[s];
    }
    CHECK(ok && drafted >= 12 && st.spec_accepted > 0,
          "echo draft on a repeating text: every step accepted the repeats its greedy output predicts (%lld of %lld)",
          (long long)st.spec_accepted, (long long)drafted);
    printf("real model: %lld drafted, %lld accepted\n", (long long)st.spec_drafted, (long long)st.spec_accepted);
    li_eagle_free(eg);
    li_model_release(m, &be);
    li_backend_cpu_free(&be);
    li_model_free(m);
}

int main(int argc, char **argv) {
    const bool real = argc > 1 && !strcmp(argv[1], "--real");
    snprintf(dir, sizeof dir, "/tmp/li_test_eagle.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base[512];
    const li_hparams hp = tiny_hp();
    if (li_test_tiny_model(&hp, "tiny-eagle-base", 5, 4.0f, dir, base, sizeof base)) return t_failed ? 1 : 77;
    li_error err = {0};
    li_model *m;
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    if (real) {
        test_real();
    } else {
        test_load(m);
        test_forward(m, "auto", LI_TYPE_F32);
        test_forward(m, "scalar", LI_TYPE_F16);
        test_capture(m);
        test_sync(m);
        test_engine(m);
    }
    li_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("test_eagle");
}
