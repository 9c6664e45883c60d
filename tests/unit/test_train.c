/* test_train.c — training end to end on a tiny model (no download): a GGUF
 * written from tests/golden/spm_tiny.gguf's tokenizer (2000 tokens) and
 * random weights (16 wide, 2 blocks, 2 heads over 1 kv head, head_dim 8,
 * n_rot 6), then:
 *
 *   the training forward gives the engine's logits (li_session, F32 KV);
 *   AdamW makes a short sequence's loss fall by more than half;
 *   two micro-batches accumulate the gradient of their union;
 *   a checkpoint (F32, F16, a merged LoRA adapter) loads back in the engine
 *   with the training forward's logits;
 *   QAT (BF16 rounding): the passes see the rounded weights, AdamW steps
 *   the masters with their gradients, the file holds what was trained;
 *   per-block FFN widths (feed_forward_length as an array): block 1 cut to
 *   16 of 24 channels gives the uniform model's logits with those channels'
 *   gate rows zeroed, in the engine and the training forward; bad arrays
 *   are refused;
 *   NaN stops the run naming the step and keeps the last checkpoint;
 *   an interrupt writes a checkpoint;
 *   bad parameter sets are refused. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"
#include "tiny_model.h"
#include "train/train.h"
#include "train/train_internal.h"
#include "engine/session.h"
#include "quant/quantize.h"
#include "quant/rotate.h"
#include "model/gguf_write.h"
#include "runtime/runtime.h"
#include "cpu/threadpool.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* ==== the tiny model ======================================================== */

static li_hparams tiny_hp(void) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 2000;
    hp.n_embd = 16;
    hp.n_layer = 2;
    hp.n_head = 2;
    hp.n_head_kv = 1;
    hp.head_dim = 8;
    hp.n_ff = 24;
    hp.n_rot = 6;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.n_ctx_train = 64;
    return hp;
}

/* meta.gguf: spm_tiny's tokenizer with the tiny model's hyper-parameters;
 * base.gguf: that plus random weights (written by li_train_save) */
static int make_tiny(char *base, size_t cap) {
    const li_hparams hp = tiny_hp();
    return li_test_tiny_model(&hp, NULL, 3, 3.0f, dir, base, cap);
}

/* engine logits (n, V) of tokens through a session */
static int engine_logits(const char *path, const int32_t *tok, int n, float *out) {
    li_runtime rt = {0};
    li_error err = {0};
    int rc = li_runtime_open(&rt, path, 1, NULL, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return rc;
    li_session s;
    rc = li_session_init(&s, rt.model, &rt.be, 64, LI_TYPE_F32, 64, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (!rc) {
        rc = li_session_eval(&s, tok, n, true, out, &err);
        CHECK(rc == 0, "%s", err.msg);
        li_session_free(&s);
    }
    li_runtime_close(&rt);
    return rc;
}

/* the training forward's logits (T = n, B = 1) */
static void train_logits(const li_train_model *tm, const int32_t *tok, int n, float *out) {
    li_train_ws ws;
    li_error err = {0};
    int32_t lab[64];
    for (int i = 0; i < n; i++) lab[i] = -1;
    CHECK(li_train_ws_init(&ws, &tm->L, 1, n, &err) == 0, "%s", err.msg);
    li_train_batch b = {.B = 1, .T = n, .tokens = tok, .labels = lab};
    double loss;
    CHECK(li_train_forward_backward(tm, NULL, &b, NULL, &ws, NULL, &loss, NULL, &err) == 0, "%s", err.msg);
    memcpy(out, ws.logits, (size_t)n * tm->L.hp.n_vocab * sizeof(float));
    li_train_ws_free(&ws);
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? e / m : e;
}

#define SEQ 12
static const int32_t seq_tok[SEQ + 1] = {5, 17, 300, 1999, 42, 42, 7, 1500, 64, 3, 811, 90, 12};

/* ==== the run's batches ======================================================== */

typedef struct run_ctx {
    int32_t tok[SEQ], lab[SEQ];
    double first, last;
    li_train_model *tm;
    int nan_at;            /* a parameter becomes NaN before this step */
    int stop_at;           /* the stop flag is raised at this step */
    volatile sig_atomic_t stop;
} run_ctx;

static int next_batch(void *ctx, int step, int micro, li_train_batch *b, li_error *err) {
    run_ctx *c = ctx;
    if (step == c->nan_at) c->tm->params[c->tm->L.t[LI_TT_OUTPUT_NORM].off] = NAN;
    if (step == c->stop_at) c->stop = 1;
    *b = (li_train_batch){.B = 1, .T = SEQ, .tokens = c->tok, .labels = c->lab};
    return 0;
}

static void on_step(void *ctx, int step, double loss, double kl, double gnorm, double lr) {
    run_ctx *c = ctx;
    (void)lr;
    if (step == 1) c->first = loss;
    c->last = loss;
}

static void run_ctx_init(run_ctx *c, li_train_model *tm) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < SEQ; i++) {
        c->tok[i] = seq_tok[i];
        c->lab[i] = seq_tok[i + 1];
    }
    c->tm = tm;
}

/* ==== tests ================================================================== */

static void test_engine_match(const char *base, const char *what) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_model tm;
    li_train_select all = {.what = LI_TRAIN_ALL};
    CHECK(li_train_model_init(&tm, m, &all, 1, &err) == 0, "%s", err.msg);
    static float a[SEQ * 2000], b[SEQ * 2000];
    train_logits(&tm, seq_tok, SEQ, a);
    if (engine_logits(base, seq_tok, SEQ, b) == 0) {
        const double e = rel_diff(a, b, SEQ * 2000);
        report(e < 1e-5, "training forward = engine forward on %s (rel diff %.1e < 1e-5)", what, e);
    }
    li_train_model_free(&tm);
    li_model_free(m);
}

/* train, save, load back: logits agree */
static void test_train_save(const char *base, const char *what, li_ckpt_dtype dt, double tol, float lr) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_model tm;
    li_train_select sel;
    CHECK(li_train_select_parse(what, &sel, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init(&tm, m, &sel, 9, &err) == 0, "%s", err.msg);
    li_threadpool *tp = li_threadpool_init(2);
    run_ctx c;
    run_ctx_init(&c, &tm);
    char out[512];
    path_in(out, sizeof out, "ckpt.gguf");
    li_train_run_opts o = {.steps = 40, .n_micro = 1, .next_batch = next_batch, .on_step = on_step, .ctx = &c,
                           .adamw = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                     .clip = 1.0f},
                           .tp = tp, .out = out, .src = &m->gguf, .dtype = dt};
    int done = 0;
    CHECK(li_train_run(&tm, &o, &done, &err) == 0, "%s", err.msg);
    report(done == 40 && c.last < 0.5 * c.first, "%s: loss %.3f -> %.3f in 40 steps (falls by more than half)",
           what, c.first, c.last);
    static float a[SEQ * 2000], b[SEQ * 2000];
    train_logits(&tm, seq_tok, SEQ, a);
    if (engine_logits(out, seq_tok, SEQ, b) == 0) {
        const double e = rel_diff(b, a, SEQ * 2000);
        report(e < tol, "%s checkpoint (%s) loads; engine logits vs training forward rel diff %.1e < %.0e", what,
               dt == LI_CKPT_F16 ? "F16" : "F32", e, tol);
    }
    li_model *back;
    if (li_model_load(&back, out, &err) == 0) {
        const li_gguf_tensor *t = li_gguf_find_tensor(&back->gguf, "blk.0.attn_q.weight");
        report(t && t->type == (dt == LI_CKPT_F16 ? LI_TYPE_F16 : LI_TYPE_F32) &&
                   !li_gguf_find_tensor(&back->gguf, "output.weight") &&
                   !li_gguf_find_tensor(&back->gguf, "blk.0.attn_q.lora_a"),
               "%s checkpoint: matrices %s, the head tied, no adapter tensors", what,
               dt == LI_CKPT_F16 ? "F16" : "F32");
        li_model_free(back);
    }
    li_threadpool_free(tp);
    li_train_model_free(&tm);
    li_model_free(m);
}

static void test_accumulate(const char *base) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_model tm;
    li_train_select all = {.what = LI_TRAIN_ALL};
    CHECK(li_train_model_init(&tm, m, &all, 1, &err) == 0, "%s", err.msg);
    int32_t tok[2 * SEQ], lab[2 * SEQ];
    for (int i = 0; i < 2 * SEQ; i++) {
        tok[i] = seq_tok[i % SEQ];
        lab[i] = (int32_t)((seq_tok[(i + 1) % SEQ] * 7 + i) % 2000);
    }
    li_train_grads g1, g2;
    li_train_grads_init(&g1, &tm.L);
    li_train_grads_init(&g2, &tm.L);
    li_train_ws w2, w1;
    CHECK(li_train_ws_init(&w2, &tm.L, 2, SEQ, &err) == 0, "%s", err.msg);
    CHECK(li_train_ws_init(&w1, &tm.L, 1, SEQ, &err) == 0, "%s", err.msg);
    li_train_batch whole = {.B = 2, .T = SEQ, .tokens = tok, .labels = lab};
    li_train_batch half[2] = {{.B = 1, .T = SEQ, .tokens = tok, .labels = lab},
                              {.B = 1, .T = SEQ, .tokens = tok + SEQ, .labels = lab + SEQ}};
    double l;
    CHECK(li_train_forward_backward(&tm, &g1, &whole, NULL, &w2, NULL, &l, NULL, &err) == 0, "%s", err.msg);
    li_train_loss_opts o = {.grad_scale = 0.5f};
    for (int j = 0; j < 2; j++)
        CHECK(li_train_forward_backward(&tm, &g2, &half[j], &o, &w1, NULL, &l, NULL, &err) == 0, "%s", err.msg);
    const double e = nmse(g2.g, g1.g, (int64_t)g1.n);
    report(e < 1e-10, "two micro-batches of 1 x %d accumulate the gradient of one 2 x %d batch (nmse %.1e)", SEQ,
           SEQ, e);
    li_train_ws_free(&w1);
    li_train_ws_free(&w2);
    li_train_grads_free(&g1);
    li_train_grads_free(&g2);
    li_train_model_free(&tm);
    li_model_free(m);
}

/* QAT through BF16 (the tiny model's rows are too short for Q4/Q8 blocks;
 * the rounding path is the same for every type) */
enum { QAT_ROW_N = 32 * 40 };

/* x (QAT_ROW_N values) round-tripped by fast against type ty's reference
 * quantizer then its to_float, bit for bit; frees x */
static void qat_row_check(li_type ty, void (*fast)(const float *, float *, int64_t), float *x, const char *name) {
    enum { N = QAT_ROW_N };
    float *want = li_xmalloc(N * sizeof(float)), *got = li_xmalloc(N * sizeof(float));
    const li_type_traits *tr = li_type_info(ty);
    size_t row;
    li_type_row_size(ty, N, &row);
    uint8_t *q = li_xmalloc(row);
    tr->from_float(x, q, N);
    tr->to_float(q, want, N);
    fast(x, got, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += memcmp(&want[i], &got[i], sizeof(float)) != 0;
    report(bad == 0, "--qat's AVX2 %s round trip: the reference's values bit for bit (%d of %d differ)", name, bad, N);
    free(x), free(want), free(got), free(q);
}

/* random blocks, each a wider range than the one before */
static float *qat_row_input(void) {
    float *x = li_xmalloc(QAT_ROW_N * sizeof(float));
    for (int i = 0; i < QAT_ROW_N; i++) x[i] = rng_f() * (1 + i / 32);
    return x;
}

/* --qat's AVX2 round trip through Q4_1 gives the reference quantizer's
 * dequantized values bit for bit: random blocks, a constant block (d 0),
 * zeros of both signs, a block of one outlier, half steps, a range so
 * small that 1/d overflows, and a product a fused multiply-add would round
 * the other way */
static void test_qat_q4_1_row(void) {
    if (li_train_isa() < 1) {
        printf("skip --qat's AVX2 Q4_1 round trip: the CPU lacks AVX2 and FMA\n");
        return;
    }
    float *x = qat_row_input();
    for (int j = 0; j < 32; j++) x[32 + j] = 0.25f;                    /* constant: d = 0 */
    for (int j = 0; j < 32; j++) x[64 + j] = j % 2 ? 0.0f : -0.0f;     /* zeros of both signs */
    for (int j = 0; j < 32; j++) x[96 + j] = j == 7 ? 1e4f : 0.001f;   /* one outlier */
    for (int j = 0; j < 32; j++) x[128 + j] = (float)(j % 16) / 15.0f + (j % 3 ? 0.5f / 15.0f : 0.0f); /* half steps */
    /* 1/d overflows, the minimum -0: the reference's (int8_t) of NaN is 0, and +0 + -0 is +0 */
    for (int j = 0; j < 32; j++) x[160 + j] = j % 4 ? 1e-38f : -0.0f;
    /* an element whose (x - min)·(1/d) rounds up to 1/2 (a fused multiply-add would not) */
    for (int j = 0; j < 32; j++) x[192 + j] = j == 0 ? 0.0f : j == 1 ? 0x1.9a8628p-1f : j == 2 ? 0x1.b5e46cp-6f : 0.4f;
    qat_row_check(LI_TYPE_Q4_1, li_train_qat_q4_1_row_avx2, x, "Q4_1");
}

/* ... and through Q8_0: random blocks, zeros (d 0), an outlier, products
 * exactly on a half of both signs (roundf takes them away from zero), the
 * float just below a half (which floor(|v| + 0.5) would round up), a range
 * so small that 1/d overflows (the reference's (int8_t) of an infinite
 * product is 0), and a NaN element, which the reference's fmaxf passes over */
static void test_qat_q8_0_row(void) {
    if (li_train_isa() < 1) {
        printf("skip --qat's AVX2 Q8_0 round trip: the CPU lacks AVX2 and FMA\n");
        return;
    }
    float *x = qat_row_input();
    for (int j = 0; j < 32; j++) x[32 + j] = j % 2 ? 0.0f : -0.0f;                      /* d = 0 */
    for (int j = 0; j < 32; j++) x[64 + j] = j == 5 ? -3e3f : 0.01f * (float)(j - 16); /* one outlier */
    /* amax 127: d 1, 1/d 1, so each product is the element itself */
    for (int j = 0; j < 32; j++)
        x[96 + j] = j == 0 ? 127.0f : j < 16 ? (float)(j - 8) + 0.5f : j == 16 ? 0.49999997f : j == 17 ? -0.49999997f
                  : j == 18 ? -126.5f : (float)(j - 24) * 1.5f;
    for (int j = 0; j < 32; j++) x[128 + j] = j % 4 ? 1e-38f : -0.0f;                 /* 1/d overflows */
    for (int j = 0; j < 32; j++) x[160 + j] = j == 3 ? NAN : 0.5f - 0.03f * (float)j;  /* a NaN */
    qat_row_check(LI_TYPE_Q8_0, li_train_qat_q8_0_row_avx2, x, "Q8_0");
}

static void test_qat(const char *base) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_select all = {.what = LI_TRAIN_ALL};
    li_train_model a, b;
    CHECK(li_train_model_init(&a, m, &all, 1, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init(&b, m, &all, 1, &err) == 0, "%s", err.msg);
    report(li_train_qat_init(&a, &m->gguf, LI_CKPT_F32, NULL, &err) == LI_EINVAL && strstr(err.msg, "--dtype"),
           "--qat without a rounding type is refused: %s", err.msg);
    CHECK(li_train_qat_init(&a, &m->gguf, LI_CKPT_BF16, NULL, &err) == 0, "%s", err.msg);
    const size_t n = a.L.n_params;
    float *m0 = li_xmalloc(n * sizeof(float)), *r0 = li_xmalloc(n * sizeof(float));
    memcpy(m0, a.master, n * sizeof(float));
    memcpy(r0, a.params, n * sizeof(float));
    /* the passes see bf16(master) for matrices, the norms as they are */
    size_t bad = 0, changed = 0;
    for (int i = 0; i < a.L.n_tensors; i++) {
        const li_train_tensor *t = &a.L.t[i];
        if (i == LI_TT_OUTPUT && a.L.tied) continue; /* token_embd's elements */
        for (size_t e = t->off; e < t->off + (size_t)(t->rows * t->cols); e++) {
            const float want = t->rows == 1 ? m0[e] : li_bf16_to_fp32(li_fp32_to_bf16(m0[e]));
            bad += memcmp(&r0[e], &want, sizeof want) != 0;
            changed += r0[e] != m0[e];
        }
    }
    report(bad == 0 && changed > n / 2, "QAT: the passes see every matrix rounded to BF16 (%zu of %zu changed)",
           changed, n);
    /* b: the same rounded weights, no QAT: one step each sees the same loss,
     * and a's masters move by b's update (straight-through) */
    memcpy(b.params, r0, n * sizeof(float));
    run_ctx c;
    run_ctx_init(&c, &a);
    li_train_batch mb = {.B = 1, .T = SEQ, .tokens = c.tok, .labels = c.lab};
    li_train_grads ga, gb;
    li_train_grads_init(&ga, &a.L);
    li_train_grads_init(&gb, &b.L);
    li_adamw oa, ob;
    li_adamw_init(&oa, &a.L);
    li_adamw_init(&ob, &b.L);
    li_train_ws ws;
    CHECK(li_train_ws_init(&ws, &a.L, 1, SEQ, &err) == 0, "%s", err.msg);
    const li_adamw_opts ao = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f};
    double la, lb;
    CHECK(li_train_step(&a, &ga, &oa, &mb, 1, NULL, &ao, &ws, NULL, &la, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_train_step(&b, &gb, &ob, &mb, 1, NULL, &ao, &ws, NULL, &lb, NULL, NULL, &err) == 0, "%s", err.msg);
    double worst = 0;
    bad = 0;
    for (int i = 0; i < a.L.n_tensors; i++) {
        const li_train_tensor *t = &a.L.t[i];
        if (i == LI_TT_OUTPUT && a.L.tied) continue; /* token_embd's elements */
        for (size_t e = t->off; e < t->off + (size_t)(t->rows * t->cols); e++) {
            const double da = (double)a.master[e] - m0[e], db = (double)b.params[e] - r0[e];
            worst = fmax(worst, fabs(da - db) / (fabs(m0[e]) + 1e-6));
            const float want = t->rows == 1 ? a.master[e] : li_bf16_to_fp32(li_fp32_to_bf16(a.master[e]));
            bad += memcmp(&a.params[e], &want, sizeof want) != 0;
        }
    }
    report(la == lb && worst < 1e-6 && bad == 0,
           "QAT step: loss %.6f = %.6f on the rounded weights; masters moved by the rounded model's update "
           "(worst %.1e relative); the passes' weights re-rounded (%zu wrong)", la, lb, worst, bad);
    /* the file holds what was trained: a's checkpoint (from its masters)
     * gives the training forward's logits; b's, rounded at save, does not */
    static float tl[SEQ * 2000], el[SEQ * 2000];
    char out[512];
    path_in(out, sizeof out, "qat.gguf");
    CHECK(li_train_save(&a, &m->gguf, LI_CKPT_BF16, out, &err) == 0, "%s", err.msg);
    train_logits(&a, seq_tok, SEQ, tl);
    if (engine_logits(out, seq_tok, SEQ, el) == 0) {
        const double ea = rel_diff(el, tl, SEQ * 2000);
        CHECK(li_train_save(&b, &m->gguf, LI_CKPT_BF16, out, &err) == 0, "%s", err.msg);
        train_logits(&b, seq_tok, SEQ, tl);
        if (engine_logits(out, seq_tok, SEQ, el) == 0) {
            const double eb = rel_diff(el, tl, SEQ * 2000);
            report(ea < 1e-5 && eb > 10 * ea,
                   "QAT checkpoint = the trained weights: engine vs training logits rel diff %.1e (< 1e-5); "
                   "without QAT, rounded at save: %.1e", ea, eb);
        }
    }
    li_train_model lo;
    li_train_select lora = {.what = LI_TRAIN_LORA, .lora_rank = 2};
    CHECK(li_train_model_init(&lo, m, &lora, 1, &err) == 0, "%s", err.msg);
    report(li_train_qat_init(&lo, &m->gguf, LI_CKPT_BF16, NULL, &err) == LI_EINVAL && strstr(err.msg, "LoRA"),
           "--qat with LoRA is refused: %s", err.msg);
    li_train_model_free(&lo);
    free(m0);
    free(r0);
    li_train_ws_free(&ws);
    li_adamw_free(&oa);
    li_adamw_free(&ob);
    li_train_grads_free(&ga);
    li_train_grads_free(&gb);
    li_train_model_free(&a);
    li_train_model_free(&b);
    li_model_free(m);
}

/* ==== per-block FFN widths ===================================================== */

enum { W_UNIFORM_ZEROED, W_SLICED, W_EQUAL_ARRAY, W_SHORT_ARRAY, W_ZERO_WIDTH, W_FLOAT_ARRAY, W_DECI, W_HEADS_EQUAL,
       W_HEADS_DIFF };

/* base.gguf rewritten: W_SLICED keeps channels 0..15 of block 1 (and
 * feed_forward_length [24, 16]); W_UNIFORM_ZEROED keeps every channel and
 * zeroes block 1's gate rows 16..23 instead (silu(0) * u = 0: those
 * channels add nothing); the others write a trivial or bad
 * feed_forward_length over the unchanged tensors. */
static int write_widths(const char *base, int mode, char *out, size_t cap) {
    li_error err = {0};
    li_gguf g;
    CHECK(li_gguf_open(&g, base, &err) == 0, "%s", err.msg);
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    int rc = 0;
    /* W_DECI: the sliced file as llama.cpp's "deci" (every llama.* key renamed) */
    const bool deci = mode == W_DECI;
    const char *heads = mode == W_HEADS_EQUAL ? "llama.attention.head_count"
                        : mode == W_HEADS_DIFF ? "llama.attention.head_count_kv" : NULL;
    uint32_t hv[2] = {0, 0};
    for (uint64_t i = 0; i < g.n_kv && !rc; i++) {
        li_gguf_kv kv = g.kv[i];
        char key[96];
        if (li_str_eq(kv.key, "llama.feed_forward_length")) continue;
        if (heads && li_str_eq(kv.key, heads)) { /* [h, h], or [h, h + 1] */
            hv[0] = hv[1] = (uint32_t)kv.v.u64;
            hv[1] += mode == W_HEADS_DIFF;
            kv.type = LI_GGUF_ARRAY;
            kv.v.arr.type = LI_GGUF_UINT32;
            kv.v.arr.n = 2;
            kv.v.arr.data = (const uint8_t *)hv;
        }
        if (deci && li_str_eq(kv.key, "general.architecture")) {
            rc = li_gguf_writer_add_str(&w, "general.architecture", "deci", &err);
            continue;
        }
        if (deci && kv.key.len > 6 && !memcmp(kv.key.ptr, "llama.", 6)) {
            snprintf(key, sizeof key, "deci.%.*s", (int)kv.key.len - 6, kv.key.ptr + 6);
            kv.key = (li_str){key, strlen(key)};
        }
        rc = li_gguf_writer_add_kv(&w, &kv, &err);
    }
    static const uint32_t widths[9][3] = {{0}, {24, 16}, {24, 24}, {24, 24, 24}, {24, 0}, {0}, {24, 16}, {24, 24}, {24, 24}};
    static const float fw[2] = {24, 16};
    const char *ffk = deci ? "deci.feed_forward_length" : "llama.feed_forward_length";
    li_gguf_kv arr = {.key = {.ptr = ffk, .len = strlen(ffk)}, .type = LI_GGUF_ARRAY};
    arr.v.arr.type = mode == W_FLOAT_ARRAY ? LI_GGUF_FLOAT32 : LI_GGUF_UINT32;
    arr.v.arr.n = mode == W_SHORT_ARRAY ? 3 : 2;
    arr.v.arr.data = mode == W_FLOAT_ARRAY ? (const uint8_t *)fw : (const uint8_t *)widths[mode];
    if (!rc && mode == W_UNIFORM_ZEROED) rc = li_gguf_writer_add_u32(&w, "llama.feed_forward_length", 24, &err);
    else if (!rc) rc = li_gguf_writer_add_kv(&w, &arr, &err);
    for (uint64_t i = 0; i < g.n_tensors && !rc; i++) {
        const li_gguf_tensor *t = &g.tensors[i];
        const float *src = t->data; /* li_train_save wrote F32 */
        int64_t ne[2] = {t->ne[0], t->ne[1]};
        float *d = li_xmalloc(t->nbytes);
        memcpy(d, src, t->nbytes);
        const bool gate = li_str_eq(t->name, "blk.1.ffn_gate.weight"), up = li_str_eq(t->name, "blk.1.ffn_up.weight"),
                   down = li_str_eq(t->name, "blk.1.ffn_down.weight");
        if (mode == W_UNIFORM_ZEROED && gate) memset(d + 16 * ne[0], 0, (size_t)(8 * ne[0]) * sizeof(float));
        const bool sliced = mode == W_SLICED || mode == W_DECI;
        if (sliced && (gate || up)) ne[1] = 16; /* the first 16 rows */
        if (sliced && down) {                    /* the first 16 columns of every row */
            for (int64_t r = 0; r < ne[1]; r++) memmove(d + r * 16, src + r * ne[0], 16 * sizeof(float));
            ne[0] = 16;
        }
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        rc = li_gguf_writer_add_tensor(&w, name, LI_TYPE_F32, t->n_dims, ne, d,
                                       (size_t)(ne[0] * (t->n_dims > 1 ? ne[1] : 1)) * sizeof(float), &err);
    }
    static const char *names[] = {"zeroed", "sliced", "equal", "short", "zero", "float", "deci", "heads", "headsdiff"};
    snprintf(out, cap, "%s/widths_%s.gguf", dir, names[mode]);
    if (!rc) rc = li_gguf_writer_write(&w, out, &err);
    li_gguf_writer_free(&w);
    li_gguf_free(&g);
    CHECK(rc == 0, "%s", err.msg);
    return rc;
}

/* bytes of tensor `name` in both files are the same */
static bool same_tensor(const li_gguf *a, const li_gguf *b, const char *name) {
    const li_gguf_tensor *x = li_gguf_find_tensor(a, name), *y = li_gguf_find_tensor(b, name);
    return x && y && x->type == y->type && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
}

/* A rotated GPTQ file (act-order, so permuted columns) trains with its
 * online Hadamard and, with --dtype source, keeps its scheme: QAT rounds
 * each matrix onto the file's own grid, and the checkpoint holds those
 * codes beside the file's scales, zero points, permutations and signs. */
static void test_scheme_qat(const char *base, char *wide, size_t wide_cap) {
    char rot[512], q4[512], out[512], frozen[512], wdir[512];
    path_in(rot, sizeof rot, "rot.gguf");
    path_in(q4, sizeof q4, "rot_gptq.gguf");
    path_in(out, sizeof out, "rot_gptq_qat.gguf");
    path_in(frozen, sizeof frozen, "rot_gptq_norms.gguf");
    li_error err = {0};
    const li_rot_opts ro = {.seed = 5, .down_block = 8};
    CHECK(li_rotate_model(base, rot, &ro, &err) == 0, "%s", err.msg);
    test_engine_match(rot, "the rotated tiny model (online Hadamard before down_proj)");
    /* rows of 32, so the rotated head's Q8_0 blocks fit */
    path_in(wdir, sizeof wdir, "wide");
    CHECK(mkdir(wdir, 0700) == 0, "mkdir %s", wdir);
    li_hparams hp = tiny_hp();
    hp.n_embd = 32;
    hp.n_head = 4;
    hp.n_ff = 64;
    if (li_test_tiny_model(&hp, NULL, 4, 3.0f, wdir, wide, wide_cap)) {
        wide[0] = 0;
        return;
    }
    const li_quant_opts qo = {.in = wide, .out = q4, .method = LI_QMETHOD_GPTQ, .group = 8, .group_set = true,
                              .calib = "tests/data/plrabn12.txt", .samples = 4, .seq_len = 32, .threads = 1,
                              .damp = 0.01, .act_order = true, .rotate = true, .rot_block = 8, .rot_seed = 5};
    CHECK(li_quantize(&qo, &err) == 0, "%s", err.msg);
    li_model *m;
    CHECK(li_model_load(&m, q4, &err) == 0, "%s", err.msg);
    li_train_select all = {.what = LI_TRAIN_ALL};
    li_train_model a;
    CHECK(li_train_model_init(&a, m, &all, 1, &err) == 0, "%s", err.msg);
    const size_t n = a.L.n_params;
    float *p0 = li_xmalloc(n * sizeof(float));
    memcpy(p0, a.params, n * sizeof(float));
    /* the engine multiplies the Q8_0 head by Q8_0-rounded activations, the
     * training forward in f32: the untrained file's gap is the yardstick */
    static float tl[SEQ * 2000], el[SEQ * 2000];
    double gap0 = 1;
    train_logits(&a, seq_tok, SEQ, tl);
    if (engine_logits(q4, seq_tok, SEQ, el) == 0) gap0 = rel_diff(el, tl, SEQ * 2000);
    CHECK(li_train_qat_init(&a, &m->gguf, LI_CKPT_SOURCE, NULL, &err) == 0, "%s", err.msg);
    int n_grid = 0;
    for (int i = 0; i < a.L.n_tensors; i++) n_grid += li_type_info(a.qat_type[i])->scaled && a.src[i];
    report(n_grid == 7 * a.L.hp.n_layer && !memcmp(p0, a.params, n * sizeof(float)),
           "QAT on a GPTQ file: %d matrices on the file's grids; rounding them again changes no weight", n_grid);
    run_ctx c;
    run_ctx_init(&c, &a);
    li_train_batch mb = {.B = 1, .T = SEQ, .tokens = c.tok, .labels = c.lab};
    li_train_grads g;
    li_train_grads_init(&g, &a.L);
    li_adamw o;
    li_adamw_init(&o, &a.L);
    li_train_ws ws;
    CHECK(li_train_ws_init(&ws, &a.L, 1, SEQ, &err) == 0, "%s", err.msg);
    const li_adamw_opts ao = {.lr = 3e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f};
    double loss;
    for (int s = 0; s < 3; s++)
        CHECK(li_train_step(&a, &g, &o, &mb, 1, NULL, &ao, &ws, NULL, &loss, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_train_save(&a, &m->gguf, LI_CKPT_SOURCE, out, &err) == 0, "%s", err.msg);
    train_logits(&a, seq_tok, SEQ, tl);
    if (engine_logits(out, seq_tok, SEQ, el) == 0) {
        const double e = rel_diff(el, tl, SEQ * 2000);
        report(e < 1.5 * gap0, "QAT checkpoint of the rotated GPTQ file runs: engine vs training logits rel diff "
               "%.1e (the untrained file's: %.1e, the Q8_0 head's activation rounding)", e, gap0);
    }
    li_model *back;
    if (li_model_load(&back, out, &err) == 0) {
        /* loaded back, the file's weights are bit for bit what the last step's passes used */
        li_train_model r;
        CHECK(li_train_model_init(&r, back, &all, 1, &err) == 0, "%s", err.msg);
        report(r.L.n_params == n && !memcmp(r.params, a.params, n * sizeof(float)),
               "QAT checkpoint = the trained weights: all %zu parameters bit-identical when loaded back", n);
        li_train_model_free(&r);
        bool kept = back->quant_scheme == LI_SCHEME_GPTQ && back->rot_block == 8 && back->quant_group == 8;
        int moved = 0;
        for (int l = 0; l < a.L.hp.n_layer; l++) {
            char name[96];
            snprintf(name, sizeof name, LI_ROT_SIGNS_FMT, l);
            kept &= same_tensor(&m->gguf, &back->gguf, name);
            static const char *const w[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
            for (size_t k = 0; k < LI_ARRAY_LEN(w); k++) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, w[k]);
                moved += !same_tensor(&m->gguf, &back->gguf, name);
                const li_gguf_tensor *t = li_gguf_find_tensor(&back->gguf, name);
                kept &= t && t->type == li_gguf_find_tensor(&m->gguf, name)->type;
                static const char *const comp[] = {".scale", ".zero", ".perm"};
                for (size_t j = 0; j < 3; j++) {
                    char cn[128];
                    snprintf(cn, sizeof cn, "%s%s", name, comp[j]);
                    kept &= same_tensor(&m->gguf, &back->gguf, cn);
                }
            }
        }
        report(kept && moved > 0 && back->layers[0].wq.perm,
               "QAT checkpoint: gptq codes on the source's scales, zero points, permutations and rotation signs "
               "(all byte-identical), %d of %d matrices' codes moved", moved, 7 * a.L.hp.n_layer);
        li_model_free(back);
    } else {
        report(false, "QAT checkpoint loads: %s", err.msg);
    }
    /* norms only, no QAT: every matrix is written back byte for byte */
    li_train_model b;
    li_train_select norms = {.what = LI_TRAIN_NORMS};
    CHECK(li_train_model_init(&b, m, &norms, 1, &err) == 0, "%s", err.msg);
    CHECK(li_train_save(&b, &m->gguf, LI_CKPT_SOURCE, frozen, &err) == 0, "%s", err.msg);
    li_model *fb;
    if (li_model_load(&fb, frozen, &err) == 0) {
        bool same = fb->quant_scheme == LI_SCHEME_GPTQ;
        for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)m->gguf.tensors[i].name.len, m->gguf.tensors[i].name.ptr);
            same &= same_tensor(&m->gguf, &fb->gguf, name);
        }
        report(same && fb->gguf.n_tensors == m->gguf.n_tensors,
               "norms-only checkpoint of the GPTQ file: all %llu tensors byte-identical",
               (unsigned long long)m->gguf.n_tensors);
        li_model_free(fb);
    }
    li_train_model_free(&b);
    li_train_ws_free(&ws);
    li_adamw_free(&o);
    li_train_grads_free(&g);
    free(p0);
    li_train_model_free(&a);
    li_model_free(m);
}

/* the f64 loss (labels only) of tm's current parameters */
static double loss_f64(const li_train_model *tm, const int32_t *tok, const int32_t *lab, double *P, double *ws,
                       double *G) {
    for (size_t i = 0; i < tm->L.n_params; i++) P[i] = tm->params[i];
    return li_train_fb_f64(&tm->L, P, G, tok, lab, NULL, 1, SEQ, 0.0, 1.0, 1.0, ws, NULL, NULL, NULL);
}

/* --train scales on a scheme file: its group scales' gradients against
 * central differences of the loss (f64 passes, the matrices' values from
 * li_train_scales_refresh), then a few steps whose checkpoint keeps every
 * code, zero point and permutation and holds the trained scales. */
static void test_scales(const char *path, const char *what, bool grid_kept) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, path, &err) == 0, "%s", err.msg);
    li_train_select sel, all = {.what = LI_TRAIN_ALL};
    CHECK(li_train_select_parse("scales", &sel, &err) == 0, "%s", err.msg);
    li_train_model tm, ref;
    CHECK(li_train_model_init(&tm, m, &sel, 1, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init(&ref, m, &all, 1, &err) == 0, "%s", err.msg);
    const li_train_layout *L = &tm.L;
    int n_sc = 0;
    size_t n_a = 0;
    bool same = true;
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->qscale < 0) continue;
        n_sc++;
        n_a += (size_t)(L->t[t->qscale].rows * L->t[t->qscale].cols);
        same &= t->grad_only && !memcmp(tm.params + t->off, ref.params + ref.L.t[i].off,
                                        (size_t)(t->rows * t->cols) * sizeof(float));
    }
    report(n_sc == 7 * L->hp.n_layer && L->n_grads == n_a && same,
           "%s, --train scales: %d matrices' %zu group scales train; their values start bit-identical to the "
           "file's", what, n_sc, n_a);
    li_train_model_free(&ref);
    /* the activation rounding would make the loss a step function of the weights */
    uint8_t *act = tm.L.act;
    tm.L.act = NULL;
    int32_t tok[SEQ], lab[SEQ];
    for (int i = 0; i < SEQ; i++) tok[i] = seq_tok[i], lab[i] = seq_tok[i + 1];
    double *P = li_xmalloc(L->n_params * sizeof(double));
    double *ws = li_xcalloc(li_train_ws_reals_f64(L, 1, SEQ), sizeof(double));
    double *G = li_xcalloc(L->n_grads_all, sizeof(double));
    loss_f64(&tm, tok, lab, P, ws, G);
    li_train_grads g;
    CHECK(li_train_grads_init(&g, L) == 0, "grads");
    for (size_t i = 0; i < g.n; i++) g.g[i] = (float)G[i];
    li_train_scales_grad(&tm, &g, NULL);
    /* a few groups in every matrix, central differences of a */
    double worst = 0, gmax = 0;
    int checked = 0;
    const double h = 1e-3;
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->qscale < 0) continue;
        const li_train_tensor *a = &L->t[t->qscale];
        for (int e = 0; e < 3; e++) {
            const int64_t j = (int64_t)(e * 7919 + i * 31) % (a->rows * a->cols);
            float *pa = tm.params + a->off + j;
            *pa = (float)h;
            li_train_scales_refresh(&tm, NULL);
            const double lp = loss_f64(&tm, tok, lab, P, ws, NULL);
            *pa = (float)-h;
            li_train_scales_refresh(&tm, NULL);
            const double lm = loss_f64(&tm, tok, lab, P, ws, NULL);
            *pa = 0;
            const double num = (lp - lm) / (2 * h), an = g.g[a->goff + j];
            worst = fmax(worst, fabs(num - an));
            gmax = fmax(gmax, fabs(num));
            checked++;
        }
    }
    li_train_scales_refresh(&tm, NULL);
    report(gmax > 0 && worst < 3e-4 * gmax + 1e-9,
           "%s: %d group scales' gradients = central differences (max abs diff %.1e, largest gradient %.1e)", what,
           checked, worst, gmax);
    tm.L.act = act;
    /* train a few steps; the checkpoint keeps the codes and holds the scales */
    li_train_batch mb = {.B = 1, .T = SEQ, .tokens = tok, .labels = lab};
    li_adamw o;
    li_adamw_init(&o, L);
    li_train_ws fws;
    CHECK(li_train_ws_init(&fws, L, 1, SEQ, &err) == 0, "%s", err.msg);
    const li_adamw_opts ao = {.lr = 3e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f};
    double l0 = 0, l1 = 0;
    for (int s = 0; s < 4; s++)
        CHECK(li_train_step(&tm, &g, &o, &mb, 1, NULL, &ao, &fws, NULL, s ? &l1 : &l0, NULL, NULL, &err) == 0, "%s",
              err.msg);
    report(l1 < l0, "%s: the loss falls training only the scales (%.4f -> %.4f)", what, l0, l1);
    char out[512];
    path_in(out, sizeof out, "scales.gguf");
    CHECK(li_train_save(&tm, &m->gguf, LI_CKPT_SOURCE, out, &err) == 0, "%s", err.msg);
    li_model *back;
    if (li_model_load(&back, out, &err) == 0) {
        li_train_model r;
        CHECK(li_train_model_init(&r, back, &all, 1, &err) == 0, "%s", err.msg);
        bool eq = true, kept = true;
        int moved = 0;
        for (int i = 0; i < L->n_tensors; i++) {
            const li_train_tensor *t = &L->t[i];
            if (t->qscale < 0) continue;
            eq &= !memcmp(r.params + r.L.t[i].off, tm.params + t->off, (size_t)(t->rows * t->cols) * sizeof(float));
            kept &= same_tensor(&m->gguf, &back->gguf, t->name);
            char cn[128];
            snprintf(cn, sizeof cn, "%s.zero", t->name);
            kept &= !li_gguf_find_tensor(&m->gguf, cn) || same_tensor(&m->gguf, &back->gguf, cn);
            snprintf(cn, sizeof cn, "%s.perm", t->name);
            kept &= !li_gguf_find_tensor(&m->gguf, cn) || same_tensor(&m->gguf, &back->gguf, cn);
            snprintf(cn, sizeof cn, "%s.scale", t->name);
            moved += !same_tensor(&m->gguf, &back->gguf, cn);
        }
        report(eq && kept == grid_kept && moved == n_sc,
               "%s: the checkpoint loads back to the trained weights bit for bit; codes, zero points and "
               "permutations byte-identical, all %d scale tensors moved", what, moved);
        li_train_model_free(&r);
        li_model_free(back);
    } else {
        report(false, "%s: the scales checkpoint loads: %s", what, err.msg);
    }
    report(li_train_qat_init(&tm, &m->gguf, LI_CKPT_SOURCE, NULL, &err) == LI_EINVAL && strstr(err.msg, "--qat"),
           "--qat refused with --train scales: %s", err.msg);
    li_train_ws_free(&fws);
    li_adamw_free(&o);
    li_train_grads_free(&g);
    free(G);
    free(ws);
    free(P);
    li_train_model_free(&tm);
    li_model_free(m);
}

/* a file without a scheme has no scales to train */
static void test_scales_plain(const char *base) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_select sel = {.what = LI_TRAIN_SCALES};
    li_train_model tm;
    report(li_train_model_init(&tm, m, &sel, 1, &err) == LI_EINVAL && strstr(err.msg, "luainfer quantize"),
           "--train scales on a plain GGUF refused: %s", err.msg);
    li_model_free(m);
}

/* `in` rewritten to `out` with token_embd (the tied head) taken from
 * `embd` (an F32 file): the scheme files' Q8_0 head multiplies Q8_0-rounded
 * activations, which would hide what the test below compares */
static int with_f32_head(const char *in, const char *embd, const char *out) {
    li_gguf g, e;
    li_error err = {0};
    CHECK(li_gguf_open(&g, in, &err) == 0, "%s", err.msg);
    CHECK(li_gguf_open(&e, embd, &err) == 0, "%s", err.msg);
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    int rc = 0;
    for (uint64_t i = 0; i < g.n_kv && !rc; i++) rc = li_gguf_writer_add_kv(&w, &g.kv[i], &err);
    for (uint64_t i = 0; i < g.n_tensors && !rc; i++) {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)g.tensors[i].name.len, g.tensors[i].name.ptr);
        const li_gguf_tensor *t = strcmp(name, "token_embd.weight") ? &g.tensors[i] : li_gguf_find_tensor(&e, name);
        void *b = li_xmalloc(t->nbytes);
        memcpy(b, t->data, t->nbytes);
        rc = li_gguf_writer_add_tensor(&w, name, t->type, t->n_dims, t->ne, b, t->nbytes, &err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, out, &err);
    CHECK(rc == 0, "%s", err.msg);
    li_gguf_writer_free(&w);
    li_gguf_free(&e);
    li_gguf_free(&g);
    return rc;
}

/* W8A8, FP8 and W4A4 files: the engine rounds each matrix's input (int8,
 * e4m3, int4 rows); the training forward does the same (li_train_layout.act)
 * and then gives the engine's logits */
static void test_act_quant(const char *wide) {
    static const struct {
        li_qmethod m;
        const char *name;
    } cases[] = {{LI_QMETHOD_W8A8, "w8a8 (int8 rows)"}, {LI_QMETHOD_FP8, "fp8 (e4m3 rows)"},
                 {LI_QMETHOD_W4A4, "w4a4 (int4 rows)"}};
    for (size_t c = 0; c < LI_ARRAY_LEN(cases); c++) {
        char q[512], qf[512];
        path_in(q, sizeof q, "actq.gguf");
        path_in(qf, sizeof qf, "actq_f32head.gguf");
        li_error err = {0};
        const li_quant_opts qo = {.in = wide, .out = q, .method = cases[c].m, .threads = 1};
        CHECK(li_quantize(&qo, &err) == 0, "%s", err.msg);
        if (with_f32_head(q, wide, qf)) continue;
        li_model *m;
        CHECK(li_model_load(&m, qf, &err) == 0, "%s", err.msg);
        li_train_model tm;
        li_train_select all = {.what = LI_TRAIN_ALL};
        CHECK(li_train_model_init(&tm, m, &all, 1, &err) == 0, "%s", err.msg);
        static float a[SEQ * 2000], b[SEQ * 2000];
        if (engine_logits(qf, seq_tok, SEQ, b) == 0) {
            train_logits(&tm, seq_tok, SEQ, a);
            const double e1 = rel_diff(a, b, SEQ * 2000);
            uint8_t *act = tm.L.act;
            tm.L.act = NULL; /* the passes without the rounding */
            train_logits(&tm, seq_tok, SEQ, a);
            tm.L.act = act;
            const double e0 = rel_diff(a, b, SEQ * 2000);
            report(act && e1 < 1e-5 && e0 > 100 * e1,
                   "%s: training forward = engine forward with the activations rounded (rel diff %.1e; "
                   "without: %.1e)", cases[c].name, e1, e0);
        }
        li_train_model_free(&tm);
        li_model_free(m);
    }
}

static void test_ffn_widths(const char *base) {
    char zp[512], sp[512], p[512];
    if (write_widths(base, W_UNIFORM_ZEROED, zp, sizeof zp) || write_widths(base, W_SLICED, sp, sizeof sp)) return;
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, sp, &err) == 0, "%s", err.msg);
    report(m->hp.n_ff == 24 && m->hp.n_ff_layer && m->hp.n_ff_layer[0] == 24 && m->hp.n_ff_layer[1] == 16 &&
               li_hp_n_ff(&m->hp, 1) == 16,
           "feed_forward_length [24, 16]: n_ff 24 (the largest), block 1 16 wide");
    static float a[SEQ * 2000], b[SEQ * 2000];
    if (engine_logits(zp, seq_tok, SEQ, a) == 0 && engine_logits(sp, seq_tok, SEQ, b) == 0) {
        const double e = rel_diff(b, a, SEQ * 2000);
        report(e < 1e-5, "engine: block 1 cut to 16 channels = the uniform model with channels 16..23 silenced "
                         "(rel diff %.1e < 1e-5)", e);
    }
    li_train_model tm;
    li_train_select all = {.what = LI_TRAIN_ALL};
    CHECK(li_train_model_init(&tm, m, &all, 1, &err) == 0, "%s", err.msg);
    train_logits(&tm, seq_tok, SEQ, b);
    const double e = rel_diff(b, a, SEQ * 2000);
    report(e < 1e-5 && tm.L.t[li_train_tensor_index(1, LI_TL_DOWN)].cols == 16,
           "training forward of the cut model = the same (rel diff %.1e < 1e-5; down_proj 16 columns)", e);
    li_train_model_free(&tm);
    li_model_free(m);
    if (!write_widths(base, W_DECI, p, sizeof p) && engine_logits(sp, seq_tok, SEQ, b) == 0 &&
        engine_logits(p, seq_tok, SEQ, a) == 0) {
        const double d = rel_diff(b, a, SEQ * 2000);
        CHECK(li_model_load(&m, p, &err) == 0, "%s", err.msg);
        report(d == 0 && !strcmp(m->hp.arch, "deci") && m->hp.n_ff_layer && m->hp.n_ff_layer[1] == 16,
               "the same file as llama.cpp's \"deci\" (deci.* keys) loads and gives the same logits (rel diff %.1e)", d);
        li_model_free(m);
    }
    if (!write_widths(base, W_HEADS_EQUAL, p, sizeof p)) {
        CHECK(li_model_load(&m, p, &err) == 0, "%s", err.msg);
        report(m->hp.n_head > 0 && m->hp.n_head_kv > 0, "head_count as an array of equal counts is that count");
        li_model_free(m);
    }
    if (!write_widths(base, W_EQUAL_ARRAY, p, sizeof p)) {
        CHECK(li_model_load(&m, p, &err) == 0, "%s", err.msg);
        report(m->hp.n_ff == 24 && !m->hp.n_ff_layer, "an array of equal widths is a uniform model");
        li_model_free(m);
    }
    static const struct {
        int mode;
        const char *msg;
    } bad[] = {
        {W_SHORT_ARRAY, "an array of 3 entries, not 2"},
        {W_ZERO_WIDTH, "feed_forward_length[1] = 0 is out of range"},
        {W_FLOAT_ARRAY, "not 2 32-bit integers"},
        {W_HEADS_DIFF, "per-block head counts are not supported yet"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        if (write_widths(base, bad[i].mode, p, sizeof p)) continue;
        err = (li_error){0};
        const int rc = li_model_load(&m, p, &err);
        report(rc != 0 && strstr(err.msg, bad[i].msg), "refused: %s", err.msg);
        if (!rc) li_model_free(m);
    }
}

static void test_nan_and_stop(const char *base) {
    li_model *m;
    li_error err = {0};
    CHECK(li_model_load(&m, base, &err) == 0, "%s", err.msg);
    li_train_model tm;
    li_train_select sel = {.what = LI_TRAIN_NORMS};
    CHECK(li_train_model_init(&tm, m, &sel, 1, &err) == 0, "%s", err.msg);
    run_ctx c;
    run_ctx_init(&c, &tm);
    c.nan_at = 3;
    char out[512];
    path_in(out, sizeof out, "nan.gguf");
    unlink(out);
    li_train_run_opts o = {.steps = 10, .n_micro = 1, .next_batch = next_batch, .on_step = on_step, .ctx = &c,
                           .adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
                           .out = out, .src = &m->gguf, .dtype = LI_CKPT_F32, .ckpt_every = 2};
    int done = 0;
    const int rc = li_train_run(&tm, &o, &done, &err);
    report(rc == LI_ERANGE && strstr(err.msg, "step 3") && strstr(err.msg, "keeps step 2") && done == 2,
           "NaN stops the run at its step: \"%s\"", err.msg);
    li_model *back = NULL;
    int lr = li_model_load(&back, out, &err);
    bool finite = lr == 0;
    for (int64_t j = 0; finite && j < back->hp.n_embd; j++) finite = isfinite(back->output_norm[j]);
    report(finite, "the checkpoint of step 2 stays, loadable and finite");
    if (back) li_model_free(back);
    li_train_model_free(&tm);

    /* an interrupt (the stop flag) writes a checkpoint and ends the run */
    CHECK(li_train_model_init(&tm, m, &sel, 1, &err) == 0, "%s", err.msg);
    run_ctx_init(&c, &tm);
    c.stop_at = 2;
    path_in(out, sizeof out, "stop.gguf");
    unlink(out);
    o.ctx = &c;
    o.out = out;
    o.ckpt_every = 0;
    o.stop = &c.stop;
    CHECK(li_train_run(&tm, &o, &done, &err) == 0, "%s", err.msg);
    report(done == 2 && access(out, R_OK) == 0, "interrupt after step %d of 10 wrote %s", done, "stop.gguf");
    li_train_model_free(&tm);
    li_model_free(m);
}

/* AdamW against its formulas in double (two steps, clipping on the
 * second), and the same bits with and without the thread pool */
static void test_adamw(void) {
    li_hparams hp = tiny_hp();
    li_train_select all = {.what = LI_TRAIN_ALL};
    li_train_model a, b, sc; /* sc: the scalar update (li_train_mm_set_isa(0)) */
    li_error err = {0};
    CHECK(li_train_model_init_random(&a, &hp, true, &all, 5, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init_random(&b, &hp, true, &all, 5, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init_random(&sc, &hp, true, &all, 5, &err) == 0, "%s", err.msg);
    const size_t n = a.L.n_grads;
    double *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    for (size_t i = 0; i < n; i++) p[i] = a.params[i]; /* tied, all trained: parameters and slots line up */
    li_train_grads g;
    li_train_grads_init(&g, &a.L);
    li_adamw oa, ob, os;
    li_adamw_init(&oa, &a.L);
    li_adamw_init(&ob, &b.L);
    li_adamw_init(&os, &sc.L);
    li_threadpool *tp = li_threadpool_init(2);
    li_adamw_opts o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
    bool ok = true;
    for (int s = 1; s <= 2; s++) {
        for (size_t i = 0; i < n; i++) g.g[i] = rng_f() * (s == 2 ? 10.0f : 0.01f);
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)g.g[i] * g.g[i];
        o.clip = s == 2 ? 1.0f : 0.0f;
        const double clip = s == 2 && sqrt(ss) > 1 ? 1 / sqrt(ss) : 1;
        double gn;
        o.tp = NULL;
        CHECK(li_adamw_step(&oa, &a, &g, &o, &gn, &err) == 0, "%s", err.msg);
        o.tp = tp;
        CHECK(li_adamw_step(&ob, &b, &g, &o, NULL, &err) == 0, "%s", err.msg);
        const int isa = li_train_mm_set_isa(0);
        o.tp = NULL;
        CHECK(li_adamw_step(&os, &sc, &g, &o, NULL, &err) == 0, "%s", err.msg);
        li_train_mm_set_isa(isa);
        ok = ok && fabs(gn - sqrt(ss)) < 1e-9 * sqrt(ss);
        for (size_t i = 0; i < n; i++) {
            const double gi = g.g[i] * clip;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.99 * v[i] + 0.01 * gi * gi;
            p[i] -= 1e-2 * 0.1 * p[i];
            p[i] -= 1e-2 / (1 - pow(0.9, s)) * m[i] / (sqrt(v[i] / (1 - pow(0.99, s))) + 1e-8);
        }
    }
    double e = 0, es = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(a.params[i] - p[i])), es = fmax(es, fabs(sc.params[i] - p[i]));
    report(ok && e < 1e-6, "AdamW (bias correction, decoupled decay, clipping) = its formulas in double (max err %.1e)",
           e);
    report(es < 1e-6, "AdamW's scalar update = its formulas in double (max err %.1e)", es);
    report(!memcmp(a.params, b.params, a.L.n_params * sizeof(float)), "AdamW on 2 threads: the same bits");
    li_threadpool_free(tp);
    li_adamw_free(&oa);
    li_adamw_free(&ob);
    li_adamw_free(&os);
    li_train_grads_free(&g);
    li_train_model_free(&a);
    li_train_model_free(&sc);
    li_train_model_free(&b);
    free(p), free(m), free(v);
}

static void test_select(void) {
    li_train_select s;
    li_error err = {0};
    const char *bad[] = {"layers:5-2", "layers:x", "lora:0", "lora:3x", "bogus", "scales+", "scales+all"};
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++)
        report(li_train_select_parse(bad[i], &s, &err) == LI_EINVAL, "'%s' refused: %s", bad[i], err.msg);
    li_hparams hp = tiny_hp();
    li_train_layout L;
    CHECK(li_train_select_parse("layers:1-2", &s, &err) == 0, "%s", err.msg);
    report(li_train_layout_init(&L, &hp, true, &s, &err) == LI_EINVAL, "layers past the last block refused: %s",
           err.msg);
    CHECK(li_train_select_parse("layers:1", &s, &err) == 0, "%s", err.msg);
    CHECK(li_train_layout_init(&L, &hp, true, &s, &err) == 0, "%s", err.msg);
    report(L.bwd_stop == 1 && L.t[LI_TT_TOK_EMBD].goff < 0 && L.t[li_train_tensor_index(0, LI_TL_WQ)].goff < 0 &&
               L.t[li_train_tensor_index(1, LI_TL_WQ)].goff >= 0,
           "layers:1 trains block 1 only, backward stops at block %d", L.bwd_stop);
    li_train_layout_free(&L);
    CHECK(li_train_select_parse("scales+norms", &s, &err) == 0, "%s", err.msg);
    li_train_model tm;
    report(s.what == LI_TRAIN_SCALES && s.with_norms &&
               li_train_model_init_random(&tm, &hp, true, &s, 1, &err) == LI_EINVAL,
           "scales+norms parsed; a random model has no scales to train: %s", err.msg);
}

/* Forward and backward on 2 threads (RMSNorm, RoPE, SwiGLU, attention, the
 * loss and the matmuls on the pool) give the serial bits: loss and every
 * gradient. Widths that leave partial row and column ranges (39 rows,
 * d = 136: jobs of 16 rows, 64 columns). */
static void test_threads_same_bits(void) {
    li_hparams hp = tiny_hp();
    hp.n_embd = 136, hp.n_head = 17, hp.head_dim = 8, hp.n_ff = 40;
    li_train_select all = {.what = LI_TRAIN_ALL};
    li_train_model tm;
    li_error err = {0};
    CHECK(li_train_model_init_random(&tm, &hp, true, &all, 3, &err) == 0, "%s", err.msg);
    enum { B = 3, T = 13 };
    int32_t tok[B * T], lab[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 131 + 7) % 2000), lab[i] = (int32_t)((i * 37 + 1) % 2000);
    li_train_grads g1, g2;
    li_train_grads_init(&g1, &tm.L);
    li_train_grads_init(&g2, &tm.L);
    li_train_ws ws;
    CHECK(li_train_ws_init(&ws, &tm.L, B, T, &err) == 0, "%s", err.msg);
    li_train_batch b = {.B = B, .T = T, .tokens = tok, .labels = lab};
    li_threadpool *tp = li_threadpool_init(2);
    double l1 = 0, l2 = 1;
    CHECK(li_train_forward_backward(&tm, &g1, &b, NULL, &ws, NULL, &l1, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_train_forward_backward(&tm, &g2, &b, NULL, &ws, tp, &l2, NULL, &err) == 0, "%s", err.msg);
    report(l1 == l2 && !memcmp(g1.g, g2.g, g1.n * sizeof *g1.g),
           "forward + backward on 2 threads = the serial bits (loss %.6f, %zu gradients; 39 rows, d 136)", l1,
           (size_t)g1.n);
    li_threadpool_free(tp);
    li_train_ws_free(&ws);
    li_train_grads_free(&g1);
    li_train_grads_free(&g2);
    li_train_model_free(&tm);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/li_test_train.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base[512];
    if (make_tiny(base, sizeof base)) return t_failed ? 1 : 77;
    test_select();
    test_adamw();
    test_threads_same_bits();
    test_engine_match(base, "the tiny model");
    test_accumulate(base);
    test_train_save(base, "all", LI_CKPT_F32, 1e-5, 1e-2f);
    test_train_save(base, "all", LI_CKPT_F16, 1e-2, 1e-2f);
    test_train_save(base, "lora:4", LI_CKPT_F32, 1e-5, 2e-2f);
    test_qat_q4_1_row();
    test_qat_q8_0_row();
    test_qat(base);
    char wide[512] = "";
    test_scheme_qat(base, wide, sizeof wide);
    if (wide[0]) {
        test_act_quant(wide);
        char q[512];
        path_in(q, sizeof q, "rot_gptq.gguf");
        test_scales(q, "rotated act-order GPTQ", true);
        path_in(q, sizeof q, "w8.gguf");
        li_error err = {0};
        const li_quant_opts qo = {.in = wide, .out = q, .method = LI_QMETHOD_W8A8, .threads = 1};
        CHECK(li_quantize(&qo, &err) == 0, "%s", err.msg);
        test_scales(q, "W8A8 (a scale per row)", true);
    }
    test_scales_plain(base);
    test_ffn_widths(base);
    test_nan_and_stop(base);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("test_train");
}
