/* distill.c — `luainfer distill --teacher T.gguf --student S.gguf --data FILE | --self-generate N OUT.gguf`
 * (core/train/, docs/training.md).
 *
 * The student trains on windows of the text (or of tokens the teacher
 * samples) with the seed's loss:
 * alpha · KL(softmax(teacher/T) ‖ softmax(student/T)) · T² + (1 − alpha) · CE,
 * the teacher's logits computed by the inference engine (a session per
 * window, every row's logits), the student's by core/train/'s forward. The
 * loss, its KL part and the gradient norm are printed every step; Ctrl-C
 * writes a checkpoint and stops; NaN/Inf stops naming the step, leaving
 * the last checkpoint. */
#define _GNU_SOURCE
#include "cli/cli.h"
#include "runtime/args.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "train/train.h"
#include "train/selfgen.h"
#include "util/progress.h"
#include "cpu/threadpool.h"

#include <errno.h>
#include <math.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig) {
    (void)sig;
    stop_flag = 1;
}

/* ==== checks before any work ================================================ */

/* The same vocabulary: the same size and the same token at every id. */
static int check_vocab(const li_model *teacher, const li_model *student, li_error *err) {
    const int32_t nt = teacher->hp.n_vocab, ns = student->hp.n_vocab;
    if (nt != ns)
        return li_error_set(err, LI_EINVAL, "distill: the student's vocabulary has %d tokens, the teacher's %d", ns, nt);
    for (int32_t i = 0; i < nt; i++) {
        size_t la, lb;
        const char *a = li_tokenizer_token_text(teacher->tok, i, &la), *b = li_tokenizer_token_text(student->tok, i, &lb);
        if (la != lb || memcmp(a, b, la))
            return li_error_set(err, LI_EINVAL, "distill: token %d differs: the teacher's is '%.*s', the student's '%.*s'",
                                i, (int)LI_MIN(la, 40), a, (int)LI_MIN(lb, 40), b);
    }
    return 0;
}

/* ==== batches ================================================================ */

typedef struct dctx {
    const int32_t *ids;    /* (n_ids) the text's tokens */
    int64_t n_ids;
    int64_t n_windows;     /* windows of T + 1 tokens, T apart */
    int64_t next;          /* the next window */
    int B, T, n_micro;
    int32_t *tok, *lab;    /* (n_micro, B, T) */
    float *teacher;        /* (n_micro, B, T, V) or NULL (alpha 0) */
    int32_t V;
    li_session *ts;        /* the teacher's session */
    li_progress prog;
    int steps;
    double t0;
    li_error *err;
} dctx;

static int next_batch(void *ctx, int step, int micro, li_train_batch *b, li_error *err) {
    dctx *c = ctx;
    const int64_t BT = (int64_t)c->B * c->T;
    int32_t *tok = c->tok + micro * BT, *lab = c->lab + micro * BT;
    float *tl = c->teacher ? c->teacher + (size_t)(micro * BT) * (size_t)c->V : NULL;
    for (int s = 0; s < c->B; s++) {
        const int64_t start = (c->next++ % c->n_windows) * c->T;
        memcpy(tok + s * c->T, c->ids + start, (size_t)c->T * sizeof *tok);
        memcpy(lab + s * c->T, c->ids + start + 1, (size_t)c->T * sizeof *lab);
        if (tl) {
            li_session_reset(c->ts);
            int rc = li_session_eval(c->ts, tok + s * c->T, c->T, true, tl + (size_t)(s * c->T) * (size_t)c->V, err);
            if (rc) return rc;
        }
    }
    *b = (li_train_batch){.B = c->B, .T = c->T, .tokens = tok, .labels = lab, .teacher = tl};
    return 0;
}

static void on_step(void *ctx, int step, double loss, double kl, double gnorm) {
    dctx *c = ctx;
    printf("step %d/%d: loss %.4f  kl %.4f  grad-norm %.3f  (%.1f s)\n", step, c->steps, loss, kl, gnorm,
           li_time_now() - c->t0);
    fflush(stdout);
    li_progress_update(&c->prog, step, NULL);
}

/* ==== the command ============================================================ */

int li_cmd_distill(int argc, char **argv) {
    const char *teacher_path = NULL, *student_path = NULL, *data = NULL, *train = "norms", *dtype_s = "f32";
    int64_t steps = 20, seq_len = 64, batch = 1, accum = 1, threads = 0, ckpt_every = 0, seed = 1, self_gen = 0;
    double alpha = 0.5, temperature = 2.0, lr = 1e-4, wd = 0.0, clip = 1.0;
    bool help = false;
    li_opt opts[] = {
        {"teacher", LI_OPT_STR, &teacher_path, "the teacher model (required)"},
        {"student", LI_OPT_STR, &student_path, "the student GGUF; same vocabulary (required)"},
        {"data", LI_OPT_STR, &data, "training text (this or --self-generate)"},
        {"self-generate", LI_OPT_INT, &self_gen, "train on N tokens the teacher samples (temperature 1, --seed) instead of --data"},
        {"alpha", LI_OPT_FLOAT, &alpha, "weight of the KL term in [0, 1] (default 0.5)"},
        {"temperature", LI_OPT_FLOAT, &temperature, "softmax temperature of the KL term (default 2)"},
        {"steps", LI_OPT_INT, &steps, "optimizer steps (default 20)"},
        {"lr", LI_OPT_FLOAT, &lr, "AdamW learning rate (default 1e-4)"},
        {"weight-decay", LI_OPT_FLOAT, &wd, "AdamW decoupled weight decay (default 0)"},
        {"clip", LI_OPT_FLOAT, &clip, "global gradient-norm clip, 0 = none (default 1)"},
        {"seq-len", LI_OPT_INT, &seq_len, "tokens per sequence (default 64)"},
        {"batch", LI_OPT_INT, &batch, "sequences per micro-batch (default 1)"},
        {"accum", LI_OPT_INT, &accum, "micro-batches accumulated per step (default 1)"},
        {"train", LI_OPT_STR, &train, "what trains: all, norms, layers:A-B, lora:R (default norms)"},
        {"dtype", LI_OPT_STR, &dtype_s, "checkpoint weights: f32 or f16 (default f32)"},
        {"ckpt-every", LI_OPT_INT, &ckpt_every, "write OUT every N steps too (default: only at the end)"},
        {"threads", LI_OPT_INT, &threads, "compute threads (default: all cores)"},
        {"seed", LI_OPT_INT, &seed, "seed of the LoRA initialization and of --self-generate (default 1)"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("distill", "--teacher T.gguf --student S.gguf --data FILE | --self-generate N [options] OUT.gguf",
                      opts, n_opts);
        return 0;
    }
#define FAIL(...) return li_runtime_fail(&(li_error){LI_EINVAL, __VA_ARGS__})
    if (!teacher_path || !student_path || (!data && !self_gen))
        FAIL("distill: --teacher, --student and --data (or --self-generate N) are required");
    if (data && self_gen) FAIL("distill: --data and --self-generate exclude each other");
    if (self_gen < 0 || self_gen > 10000000) FAIL("distill: --self-generate must be in 1..10000000");
    if (n_pos != 1) FAIL("distill: expected one output file OUT.gguf");
    if (!(alpha >= 0 && alpha <= 1)) FAIL("distill: --alpha must be in [0, 1]");
    if (!(temperature > 0 && temperature <= 100)) FAIL("distill: --temperature must be in (0, 100]");
    if (steps < 1 || steps > 10000000) FAIL("distill: --steps must be at least 1");
    if (!(lr > 0 && lr < 1)) FAIL("distill: --lr must be in (0, 1)");
    if (!(wd >= 0 && wd < 1) || !(clip >= 0)) FAIL("distill: --weight-decay must be in [0, 1), --clip >= 0");
    if (seq_len < 2 || seq_len > 4096) FAIL("distill: --seq-len must be in 2..4096");
    if (batch < 1 || batch > 64 || accum < 1 || accum > 64) FAIL("distill: --batch and --accum must be in 1..64");
    if (ckpt_every < 0) FAIL("distill: --ckpt-every must be >= 0");
    li_ckpt_dtype dtype;
    if (!strcmp(dtype_s, "f32")) dtype = LI_CKPT_F32;
    else if (!strcmp(dtype_s, "f16")) dtype = LI_CKPT_F16;
    else FAIL("distill: --dtype must be f32 or f16");
#undef FAIL
    li_train_select sel;
    if ((rc = li_train_select_parse(train, &sel, &err))) return li_runtime_fail(&err);
    if ((rc = li_cli_check_output("distill", pos[0], &err))) return li_runtime_fail(&err);

    li_runtime rt = {0};
    li_model *student = NULL;
    li_train_model tm = {0};
    li_session ts = {0};
    bool ts_ready = false;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, text_len = 0;
    li_threadpool *tp = NULL;
    dctx c = {0};
    if ((rc = li_runtime_open(&rt, teacher_path, threads, NULL, &err))) goto done;
    if ((rc = li_model_load(&student, student_path, &err))) goto done;
    if (student->hf) {
        rc = li_error_set(&err, LI_EINVAL, "distill: the student must be a GGUF file (the checkpoint copies its metadata)");
        goto done;
    }
    if ((rc = check_vocab(rt.model, student, &err))) goto done;
    if (data) {
        if ((rc = li_read_file(data, (size_t)256 << 20, "training text", &text, &text_len, &err))) goto done;
        if ((rc = li_tokenizer_encode(rt.model->tok, text, text_len, false, false, &ids, &n_ids, &err))) goto done;
    } else {
        if ((rc = li_train_self_generate(rt.model, &rt.be, self_gen, (uint64_t)seed, &ids, &err))) goto done;
        n_ids = (size_t)self_gen;
    }
    if ((int64_t)n_ids < seq_len + 1) {
        rc = li_error_set(&err, LI_EINVAL, "distill: %s has %zu tokens, fewer than --seq-len + 1 = %lld",
                          data ? data : "--self-generate", n_ids, (long long)seq_len + 1);
        goto done;
    }
    if ((rc = li_train_model_init(&tm, student, &sel, (uint64_t)seed, &err))) goto done;
    if (alpha > 0) {
        if ((rc = li_session_init(&ts, rt.model, &rt.be, seq_len, LI_TYPE_F32, seq_len, &err))) goto done;
        ts_ready = true;
    }
    const int n_thr = threads > 0 ? (int)threads : (int)LI_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
    if (!(tp = li_threadpool_init(n_thr))) {
        rc = li_error_set(&err, LI_ENOMEM, "distill: cannot start %d threads", n_thr);
        goto done;
    }
    const int32_t V = rt.model->hp.n_vocab;
    const size_t BT = (size_t)(batch * seq_len);
    c = (dctx){.ids = ids, .n_ids = (int64_t)n_ids, .n_windows = ((int64_t)n_ids - 1) / seq_len, .B = (int)batch,
               .T = (int)seq_len, .n_micro = (int)accum, .V = V, .ts = &ts, .steps = (int)steps, .err = &err};
    c.tok = li_xmalloc(BT * (size_t)accum * sizeof *c.tok);
    c.lab = li_xmalloc(BT * (size_t)accum * sizeof *c.lab);
    if (alpha > 0) {
        c.teacher = malloc(BT * (size_t)accum * (size_t)V * sizeof(float));
        if (!c.teacher) {
            rc = li_error_set(&err, LI_ENOMEM, "distill: cannot hold the teacher's logits (%zu MB)",
                              BT * (size_t)accum * (size_t)V * 4 >> 20);
            goto done;
        }
    }
    printf("distill: %s -> %s, train %s: %.1fM of %.1fM parameters, %zu tokens of %s (%lld windows of %lld)\n",
           student_path, pos[0], train, (double)tm.L.n_grads / 1e6, (double)tm.L.n_params / 1e6, n_ids,
           data ? "text" : "the teacher's samples",
           (long long)c.n_windows, (long long)seq_len);
    printf("loss = %.2f * KL(T = %.2f) * T^2 + %.2f * CE; AdamW lr %g, %lld x %lld x %lld tokens per step\n", alpha,
           temperature, 1 - alpha, lr, (long long)accum, (long long)batch, (long long)seq_len);
    fflush(stdout);
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    li_progress_init(&c.prog, "distill", "steps/s", steps);
    c.t0 = li_time_now();
    li_train_run_opts o = {
        .steps = (int)steps, .n_micro = (int)accum, .next_batch = next_batch, .on_step = on_step, .ctx = &c,
        .loss = {.alpha = (float)alpha, .temperature = (float)temperature},
        .adamw = {.lr = (float)lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = (float)wd,
                  .clip = (float)clip},
        .tp = tp, .out = pos[0], .src = &student->gguf, .dtype = dtype, .ckpt_every = (int)ckpt_every,
        .stop = &stop_flag};
    int done_steps = 0;
    rc = li_train_run(&tm, &o, &done_steps, &err);
    sigaction(SIGINT, &old_sa, NULL);
    li_progress_finish(&c.prog);
    if (!rc) {
        if (done_steps < steps) printf("interrupted after step %d: checkpoint written to %s\n", done_steps, pos[0]);
        else printf("wrote %s (%s weights)\n", pos[0], dtype == LI_CKPT_F16 ? "F16" : "F32");
    }
done:
    free(c.tok);
    free(c.lab);
    free(c.teacher);
    if (tp) li_threadpool_free(tp);
    li_train_model_free(&tm);
    if (ts_ready) li_session_free(&ts);
    free(ids);
    free(text);
    if (student) li_model_free(student);
    li_runtime_close(&rt);
    if (rc) return li_runtime_fail(&err);
    return stop_flag ? 130 : 0;
}
