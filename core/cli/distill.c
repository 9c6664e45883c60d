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
#include "cli/train_opts.h"
#include "runtime/args.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "train/train.h"
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

static void on_step(void *ctx, int step, double loss, double kl, double gnorm, double lr) {
    dctx *c = ctx;
    printf("step %d/%d: loss %.4f  kl %.4f  grad-norm %.3f  lr %.4g  (%.1f s)\n", step, c->steps, loss, kl, gnorm,
           lr, li_time_now() - c->t0);
    fflush(stdout);
    li_progress_update(&c->prog, step, NULL);
}

/* ==== the command ============================================================ */

int li_cmd_distill(int argc, char **argv) {
    const char *teacher_path = NULL, *student_path = NULL, *train = "norms";
    int64_t accum = 1, streams = 16;
    bool qat = false;
    static const li_cli_train_spec spec = {
        .who = "distill", .steps = 20, .lr = 1e-4, .min_seq_len = 2,
        .self_generate_help = "train on N tokens the teacher samples (temperature 1, --seed) instead of --data",
        .seq_len_help = "tokens per sequence (default 64)",
        .batch_help = "sequences per micro-batch (default 1)",
        .dtype_help = "checkpoint matrices: f32, f16, bf16, q8_0, q4_0, q4_1, or source: each in the student file's "
                      "type, so a healed model keeps its size and speed (default f32)",
        .dtypes = 1u << LI_CKPT_BF16 | 1u << LI_CKPT_Q8_0 | 1u << LI_CKPT_Q4_0 | 1u << LI_CKPT_Q4_1 | 1u << LI_CKPT_SOURCE,
        .seed_help = "seed of the LoRA initialization and of --self-generate (default 1)"};
    li_cli_train_opts to;
    li_opt opts[6 + LI_CLI_TRAIN_N_OPTS] = {
        {"teacher", LI_OPT_STR, &teacher_path, "the teacher model (required)"},
        {"student", LI_OPT_STR, &student_path, "the student GGUF; same vocabulary (required)"},
        {"accum", LI_OPT_INT, &accum, "micro-batches accumulated per step (default 1)"},
        {"train", LI_OPT_STR, &train, "what trains: all, norms, layers:A-B, lora:R, scales (a scheme file's group scales, its codes "
                                      "kept), scales+norms (default norms)"},
        {"streams", LI_OPT_INT, &streams,
         "--self-generate: sequences sampled side by side, 1..256 (default 16; 1: one stream, as before)"},
        {"qat", LI_OPT_FLAG, &qat,
         "quantization-aware: train through --dtype's rounding (float32 masters, straight-through gradients), so "
         "the file holds the weights that were trained"},
    };
    li_cli_train_opts_init(&to, &spec, opts + 6);
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (to.help) {
        li_args_usage("distill", "--teacher T.gguf --student S.gguf --data FILE | --self-generate N [options] OUT.gguf",
                      opts, n_opts);
        return 0;
    }
    if (!teacher_path || !student_path || (!to.data && !to.self_gen))
        return li_runtime_fail(&(li_error){LI_EINVAL, "distill: --teacher, --student and --data (or --self-generate N) "
                                                      "are required"});
    if ((rc = li_cli_train_opts_check(&to, &spec, &err))) return li_runtime_fail(&err);
    if (n_pos != 1) return li_runtime_fail(&(li_error){LI_EINVAL, "distill: expected one output file OUT.gguf"});
    if (accum < 1 || accum > 64) return li_runtime_fail(&(li_error){LI_EINVAL, "distill: --accum must be in 1..64"});
    if (streams < 1 || streams > 256)
        return li_runtime_fail(&(li_error){LI_EINVAL, "distill: --streams must be in 1..256"});
    const li_ckpt_dtype dtype = to.dtype;
    li_train_select sel;
    if ((rc = li_train_select_parse(train, &sel, &err))) return li_runtime_fail(&err);
    if ((rc = li_cli_check_output("distill", pos[0], &err))) return li_runtime_fail(&err);

    li_runtime rt = {0};
    li_model *student = NULL;
    li_train_model tm = {0};
    li_session ts = {0};
    bool ts_ready = false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    li_threadpool *tp = NULL;
    dctx c = {0};
    if ((rc = li_runtime_open(&rt, teacher_path, to.threads, NULL, &err))) goto done;
    if ((rc = li_model_load(&student, student_path, &err))) goto done;
    if (student->hf) {
        rc = li_error_set(&err, LI_EINVAL, "distill: the student must be a GGUF file (the checkpoint copies its metadata)");
        goto done;
    }
    if ((rc = check_vocab(rt.model, student, &err))) goto done;
    char need[64];
    snprintf(need, sizeof need, "--seq-len + 1 = %lld", (long long)to.seq_len + 1);
    if ((rc = li_cli_train_tokens("distill", rt.model, &rt.be, &to, (int)streams, true, false, to.seq_len + 1, need,
                                  &ids, &n_ids, &err)))
        goto done;
    if ((rc = li_train_model_init(&tm, student, &sel, (uint64_t)to.seed, &err))) goto done;
    if (to.alpha > 0) {
        if ((rc = li_session_init(&ts, rt.model, &rt.be, to.seq_len, LI_TYPE_F32, to.seq_len, &err))) goto done;
        ts_ready = true;
    }
    const int n_thr = li_threads_or_cpus(to.threads);
    if (!(tp = li_threadpool_init(n_thr))) {
        rc = li_error_set(&err, LI_ENOMEM, "distill: cannot start %d threads", n_thr);
        goto done;
    }
    if (qat && (rc = li_train_qat_init(&tm, &student->gguf, dtype, tp, &err))) goto done;
    const int32_t V = rt.model->hp.n_vocab;
    const size_t BT = (size_t)(to.batch * to.seq_len);
    c = (dctx){.ids = ids, .n_ids = (int64_t)n_ids, .n_windows = ((int64_t)n_ids - 1) / to.seq_len, .B = (int)to.batch,
               .T = (int)to.seq_len, .n_micro = (int)accum, .V = V, .ts = &ts, .steps = (int)to.steps, .err = &err};
    c.tok = li_xmalloc(BT * (size_t)accum * sizeof *c.tok);
    c.lab = li_xmalloc(BT * (size_t)accum * sizeof *c.lab);
    if (to.alpha > 0) {
        c.teacher = malloc(BT * (size_t)accum * (size_t)V * sizeof(float));
        if (!c.teacher) {
            rc = li_error_set(&err, LI_ENOMEM, "distill: cannot hold the teacher's logits (%zu MB)",
                              BT * (size_t)accum * (size_t)V * 4 >> 20);
            goto done;
        }
    }
    printf("distill: %s -> %s, train %s%s: %.1fM of %.1fM parameters, %zu tokens of %s (%lld windows of %lld)\n",
           student_path, pos[0], train, qat ? " (quantization-aware)" : "", (double)tm.L.n_grads / 1e6,
           (double)tm.L.n_params / 1e6, n_ids,
           to.data ? "text" : "the teacher's samples",
           (long long)c.n_windows, (long long)to.seq_len);
    for (int i = 0; tm.L.act && i < tm.L.n_tensors; i++)
        if (tm.L.act[i]) { /* one scheme a file: its first rounded matrix says which */
            printf("the student's matrices read %s-rounded activations, as its scheme runs them\n",
                   li_act_quant_name(tm.L.act[i]));
            break;
        }
    printf("loss = %.2f * KL(T = %.2f) * T^2 + %.2f * CE; AdamW lr %g (%s, warmup %d), %lld x %lld x %lld tokens "
           "per step\n",
           to.alpha, to.temperature, 1 - to.alpha, to.lr, to.sched_s, to.sched.warmup, (long long)accum,
           (long long)to.batch, (long long)to.seq_len);
    fflush(stdout);
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    li_progress_init(&c.prog, "distill", "steps/s", to.steps);
    c.t0 = li_time_now();
    li_train_run_opts o = {
        .steps = (int)to.steps, .n_micro = (int)accum, .next_batch = next_batch, .on_step = on_step, .ctx = &c,
        .loss = {.alpha = (float)to.alpha, .temperature = (float)to.temperature},
        .adamw = {.lr = (float)to.lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = (float)to.wd,
                  .clip = (float)to.clip},
        .sched = to.sched, .tp = tp, .out = pos[0], .src = &student->gguf, .dtype = dtype,
        .ckpt_every = (int)to.ckpt_every, .stop = &stop_flag};
    int done_steps = 0;
    rc = li_train_run(&tm, &o, &done_steps, &err);
    sigaction(SIGINT, &old_sa, NULL);
    li_progress_finish(&c.prog);
    if (!rc) {
        if (done_steps < to.steps) printf("interrupted after step %d: checkpoint written to %s\n", done_steps, pos[0]);
        else printf("wrote %s (%s weights)\n", pos[0], li_ckpt_dtype_name(dtype));
    }
done:
    free(c.tok);
    free(c.lab);
    free(c.teacher);
    if (tp) li_threadpool_free(tp);
    li_train_model_free(&tm);
    if (ts_ready) li_session_free(&ts);
    free(ids);
    if (student) li_model_free(student);
    li_runtime_close(&rt);
    if (rc) return li_runtime_fail(&err);
    return stop_flag ? 130 : 0;
}
