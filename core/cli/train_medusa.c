/* train_medusa.c — `luainfer train-medusa --model M.gguf --heads K (--data FILE | --self-generate N) OUT.gguf`
 * (core/train/medusa.h, docs/medusa.md).
 *
 * Medusa-1 heads on a frozen base: each step takes windows of --seq-len
 * tokens of the text (or of the base's own samples), runs the base in the
 * inference engine for every row's logits and post-norm hidden state, and
 * trains the heads (zero at the start) with AdamW on the seed's loss
 * against the base's distributions at the shifted positions. The heads
 * file is written to a temporary and renamed; Ctrl-C writes what it has
 * and exits 130; NaN/Inf stops naming the step. --eval FILE measures each
 * head's top-1 and top-5 agreement with the base's greedy token at its
 * offset on held-out text, after training or, with --heads-file, alone. */
#define _GNU_SOURCE
#include "cli/cli.h"
#include "cli/train_opts.h"
#include "runtime/args.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "train/medusa.h"
#include "util/progress.h"
#include "cpu/threadpool.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
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

/* ==== agreement on held-out text ============================================== */

/* For each head k, over windows of L tokens of ids: at position t the
 * base's greedy token for t+k+2 (the argmax of its row t+k+1) against the
 * head's logits at t: top-1 and top-5 agreement; also the head's top-1
 * against the text's own token t+k+2. */
static int eval_heads(const li_train_medusa *h, li_session *s, const float *E, const int32_t *ids, int64_t n_ids, int L,
                      li_threadpool *tp, li_error *err) {
    const int64_t d = h->d, V = h->V;
    li_train_medusa_ws ws;
    int rc = li_train_medusa_ws_init(&ws, h, L, err);
    if (rc) return rc;
    float *lg = li_xmalloc((size_t)L * (size_t)V * sizeof *lg), *H = li_xmalloc((size_t)L * (size_t)d * sizeof *H);
    int32_t *greedy = li_xmalloc((size_t)L * sizeof *greedy);
    int64_t n1[LI_TRAIN_MEDUSA_MAX_HEADS] = {0}, n5[LI_TRAIN_MEDUSA_MAX_HEADS] = {0}, nt[LI_TRAIN_MEDUSA_MAX_HEADS] = {0},
            cnt[LI_TRAIN_MEDUSA_MAX_HEADS] = {0}, base_text = 0, base_cnt = 0;
    const int64_t n_win = n_ids / L;
    li_progress prog;
    li_progress_init(&prog, "eval", "windows/s", n_win);
    for (int64_t w = 0; w < n_win && !rc; w++) {
        const int32_t *tok = ids + w * L;
        if ((rc = li_train_medusa_base_window(s, tok, L, lg, H, err))) break;
        for (int t = 0; t < L; t++) {
            const float *r = lg + (size_t)t * (size_t)V;
            int32_t best = 0;
            for (int64_t j = 1; j < V; j++)
                if (r[j] > r[best]) best = (int32_t)j;
            greedy[t] = best;
            if (t + 1 < L) base_text += best == tok[t + 1], base_cnt++;
        }
        for (int k = 0; k < h->K; k++) {
            li_train_medusa_head_logits(h, k, E, H, L, &ws, tp);
            for (int t = 0; t + k + 2 < L; t++) {
                const float *r = ws.logits + (size_t)t * (size_t)V;
                const int32_t g = greedy[t + k + 1];
                int64_t above = 0, best = 0;
                for (int64_t j = 0; j < V; j++) {
                    above += r[j] > r[g];
                    if (r[j] > r[best]) best = j;
                }
                n1[k] += above == 0;
                n5[k] += above < 5;
                nt[k] += best == tok[t + k + 2];
                cnt[k]++;
            }
        }
        li_progress_update(&prog, w + 1, NULL);
    }
    li_progress_finish(&prog);
    if (!rc) {
        printf("agreement with the base's greedy token, %lld windows of %d tokens (%lld tokens):\n",
               (long long)n_win, L, (long long)(n_win * L));
        printf("  head  predicts  positions   top-1    top-5   top-1 vs text\n");
        printf("  base  t+1       %9lld   100.00%%  100.00%%  %6.2f%%\n", (long long)base_cnt,
               base_cnt ? 100.0 * (double)base_text / (double)base_cnt : 0.0);
        for (int k = 0; k < h->K; k++) {
            const double c = cnt[k] ? (double)cnt[k] : 1;
            printf("  %4d  t+%-7d %9lld   %6.2f%%  %6.2f%%  %6.2f%%\n", k + 1, k + 2, (long long)cnt[k],
                   100.0 * (double)n1[k] / c, 100.0 * (double)n5[k] / c, 100.0 * (double)nt[k] / c);
        }
        fflush(stdout);
    }
    free(lg);
    free(H);
    free(greedy);
    li_train_medusa_ws_free(&ws);
    return rc;
}

/* ==== the command ============================================================ */

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

int li_cmd_train_medusa(int argc, char **argv) {
    const char *model_path = NULL, *eval_path = NULL, *heads_file = NULL;
    int64_t K = 0, eval_tokens = 4096, streams = 16;
    static const li_cli_train_spec spec = {
        .who = "train-medusa", .steps = 100, .lr = 1e-3, .min_seq_len = 3,
        .self_generate_help = "train on N tokens the base samples (temperature 1, --seed) instead of --data",
        .seq_len_help = "tokens per window (default 64)",
        .batch_help = "windows per step (default 1)",
        .dtype_help = "head weights in the file: f32 or f16 (default f32)",
        .seed_help = "seed of --self-generate and of the window order (default 1)"};
    li_cli_train_opts to;
    li_opt opts[6 + LI_CLI_TRAIN_N_OPTS] = {
        {"model", LI_OPT_STR, &model_path, "the base model, frozen (default: LUAINFER_MODEL or the bundled one)"},
        {"heads", LI_OPT_INT, &K, "Medusa heads to train, 1..8 (required unless --heads-file)"},
        {"streams", LI_OPT_INT, &streams, "--self-generate: sequences sampled side by side, 1..256 (default 16)"},
        {"eval", LI_OPT_STR, &eval_path, "held-out text: print each head's top-1/top-5 agreement with the base"},
        {"eval-tokens", LI_OPT_INT, &eval_tokens, "tokens of --eval to use (default 4096)"},
        {"heads-file", LI_OPT_STR, &heads_file, "evaluate these heads (with --eval) instead of training"},
    };
    li_cli_train_opts_init(&to, &spec, opts + 6);
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (to.help) {
        li_args_usage("train-medusa",
                      "--model M.gguf --heads K --data FILE | --self-generate N [options] OUT.gguf\n"
                      "       luainfer train-medusa --model M.gguf --heads-file H.gguf --eval FILE",
                      opts, n_opts);
        return 0;
    }
    const bool train = !heads_file;
#define FAIL(...)                                 \
    do {                                          \
        li_error_set(&err, LI_EINVAL, __VA_ARGS__); \
        return li_runtime_fail(&err);             \
    } while (0)
    if (!train) {
        if (!eval_path) FAIL("train-medusa: --heads-file needs --eval FILE (it evaluates, it does not train)");
        if (to.data || to.self_gen || K || n_pos) FAIL("train-medusa: --heads-file evaluates only: no --heads, --data, --self-generate or OUT");
    } else {
        if (K < 1 || K > LI_TRAIN_MEDUSA_MAX_HEADS) FAIL("train-medusa: --heads must be in 1..%d", LI_TRAIN_MEDUSA_MAX_HEADS);
        if (!to.data && !to.self_gen) FAIL("train-medusa: --data FILE or --self-generate N is required");
        if (n_pos != 1) FAIL("train-medusa: expected one output file OUT.gguf");
    }
    if ((rc = li_cli_train_opts_check(&to, &spec, &err))) return li_runtime_fail(&err);
    if (streams < 1 || streams > 256) FAIL("train-medusa: --streams must be in 1..256");
    if (train && to.seq_len < K + 3) FAIL("train-medusa: --seq-len %lld leaves head %lld no position (needs >= %lld)",
                                          (long long)to.seq_len, (long long)K, (long long)K + 3);
    if (eval_tokens < 1) FAIL("train-medusa: --eval-tokens must be >= 1");
    const li_ckpt_dtype dtype = to.dtype;
#undef FAIL
    if (train && (rc = li_cli_check_output("train-medusa", pos[0], &err))) return li_runtime_fail(&err);

    li_runtime rt = {0};
    li_session s = {0};
    bool s_ready = false;
    li_train_medusa h = {0};
    li_train_grads g = {0};
    li_adamw opt = {0};
    li_train_medusa_ws ws = {0};
    li_threadpool *tp = NULL;
    char *base_name = NULL;
    int32_t *ids = NULL, *eids = NULL, *order = NULL;
    size_t n_ids = 0, n_eids = 0;
    float *E = NULL, *lg = NULL, *H = NULL;
    if ((rc = li_runtime_open(&rt, li_model_default_path(model_path), to.threads, NULL, &err))) goto done;
    /* heads read the hidden state, which is in the rotated basis there */
    if ((rc = li_model_refuse_rotated(rt.model, "train-medusa", &err))) goto done;
    li_model *m = rt.model;
    const int64_t d = m->hp.n_embd, V = m->hp.n_vocab, L = to.seq_len;
    const uint64_t vhash = li_tokenizer_vocab_hash(m->tok);
    char need[48];
    snprintf(need, sizeof need, "--seq-len %lld", (long long)L);
    /* the evaluation text first: a bad path fails before any training */
    if (eval_path && (rc = li_cli_text_tokens("train-medusa", m->tok, eval_path, "evaluation text", false, eval_tokens, L,
                                              need, &eids, &n_eids, &err)))
        goto done;
    if (train) {
        if ((rc = li_cli_train_tokens("train-medusa", m, &rt.be, &to, (int)streams, false, false, L, need, &ids,
                                      &n_ids, &err)))
            goto done;
        if ((rc = li_train_medusa_init(&h, (int)K, d, V, &err))) goto done;
    } else if ((rc = li_train_medusa_load(&h, heads_file, d, V, vhash, &err))) {
        goto done;
    }
    /* the frozen output matrix, dequantized once (tied: the embedding) */
    if (!(E = li_train_medusa_output_f32(m))) {
        rc = li_error_set(&err, LI_ENOMEM, "train-medusa: cannot hold the output matrix in float32");
        goto done;
    }
    if ((rc = li_session_init(&s, m, &rt.be, L, LI_TYPE_F32, L, &err))) goto done;
    s_ready = true;
    const int n_thr = li_threads_or_cpus(to.threads);
    if (!(tp = li_threadpool_init(n_thr))) {
        rc = li_error_set(&err, LI_ENOMEM, "train-medusa: cannot start %d threads", n_thr);
        goto done;
    }
    if (!train) {
        printf("train-medusa: evaluating %s (%d heads) on %s\n", heads_file, h.K, eval_path);
        rc = eval_heads(&h, &s, E, eids, (int64_t)n_eids, (int)L, tp, &err);
        goto done;
    }

    /* ---- training ---- */
    {
        li_str nm = {0};
        li_error e2 = {0};
        if (!li_gguf_get_str(&m->gguf, "general.name", &nm, &e2) && nm.len) base_name = strndup(nm.ptr, nm.len);
        else {
            char *p = strdup(m->path ? m->path : "");
            base_name = strdup(basename(p));
            free(p);
        }
    }
    const int64_t n_windows = (int64_t)n_ids / L;
    order = li_xmalloc((size_t)n_windows * sizeof *order);
    for (int64_t i = 0; i < n_windows; i++) order[i] = (int32_t)i;
    uint64_t rs = (uint64_t)to.seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = n_windows - 1; i > 0; i--) { /* a seeded window order */
        const int64_t j = (int64_t)(xs(&rs) % (uint64_t)(i + 1));
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    if (li_train_grads_init(&g, &h.tm.L) || li_adamw_init(&opt, &h.tm.L)) {
        rc = li_error_set(&err, LI_ENOMEM, "train-medusa: cannot allocate gradients and optimizer state");
        goto done;
    }
    if ((rc = li_train_medusa_ws_init(&ws, &h, (int)L, &err))) goto done;
    lg = li_xmalloc((size_t)L * (size_t)V * sizeof *lg);
    H = li_xmalloc((size_t)L * (size_t)d * sizeof *H);
    printf("train-medusa: %s -> %s, %d heads (%.2fM parameters), %zu tokens of %s (%lld windows of %lld)\n",
           base_name, pos[0], h.K, (double)h.tm.L.n_params / 1e6, n_ids, to.data ? to.data : "the base's samples",
           (long long)n_windows, (long long)L);
    printf("loss = mean over heads of %.2f * KL(T = %.2f) * T^2 + %.2f * CE; AdamW lr %g (%s, warmup %d), %lld x %lld "
           "tokens per step\n",
           to.alpha, to.temperature, 1 - to.alpha, to.lr, to.sched_s, to.sched.warmup, (long long)to.batch,
           (long long)L);
    fflush(stdout);
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    li_train_medusa_meta meta = {.base_name = base_name, .vocab_hash = vhash, .alpha = (float)to.alpha,
                           .temperature = (float)to.temperature, .data = to.data ? to.data : "self-generate"};
    const li_train_loss_opts lo = {.alpha = (float)to.alpha, .temperature = (float)to.temperature,
                                   .grad_scale = 1.0f / (float)to.batch};
    li_adamw_opts ao = {.lr = (float)to.lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = (float)to.wd, .clip = (float)to.clip, .tp = tp};
    li_progress prog;
    li_progress_init(&prog, "train-medusa", "steps/s", to.steps);
    const double t0 = li_time_now();
    int64_t next = 0, step = 0, last_ckpt = 0;
    while (step < to.steps && !stop_flag) {
        double loss = 0, lk[LI_TRAIN_MEDUSA_MAX_HEADS] = {0};
        li_train_grads_zero(&g);
        for (int64_t j = 0; j < to.batch && !rc; j++) {
            const int32_t *tok = ids + (int64_t)order[next++ % n_windows] * L;
            double l = 0, lkj[LI_TRAIN_MEDUSA_MAX_HEADS];
            if ((rc = li_train_medusa_base_window(&s, tok, L, lg, H, &err))) break;
            if ((rc = li_train_medusa_forward_backward(&h, &g, E, H, lg, tok, (int)L, &lo, &ws, tp, &l, lkj, NULL, &err)))
                break;
            if (!isfinite(l))
                rc = li_error_set(&err, LI_ERANGE, "train: step %lld: the loss is %g (window %lld)",
                                  (long long)step + 1, l, (long long)j + 1);
            loss += l / (double)to.batch;
            for (int k = 0; k < h.K; k++) lk[k] += lkj[k] / (double)to.batch;
        }
        double gn = 0;
        ao.lr = (float)li_train_lr_at(&to.sched, to.lr, (int)step + 1, (int)to.steps);
        if (!rc) rc = li_adamw_step(&opt, &h.tm, &g, &ao, &gn, &err);
        if (rc) {
            if (rc == LI_ERANGE) {
                const size_t n = strlen(err.msg);
                if (last_ckpt)
                    snprintf(err.msg + n, sizeof err.msg - n, "; training stopped, %s keeps step %lld", pos[0],
                             (long long)last_ckpt);
                else snprintf(err.msg + n, sizeof err.msg - n, "; training stopped before any checkpoint");
            }
            break;
        }
        step++;
        printf("step %lld/%lld: loss %.4f  heads", (long long)step, (long long)to.steps, loss);
        for (int k = 0; k < h.K; k++) printf(" %.3f", lk[k]);
        printf("  grad-norm %.3f  lr %.4g  (%.1f s)\n", gn, (double)ao.lr, li_time_now() - t0);
        fflush(stdout);
        li_progress_update(&prog, step, NULL);
        if (to.ckpt_every > 0 && step % to.ckpt_every == 0 && step < to.steps) {
            meta.steps = step;
            meta.tokens = step * to.batch * L;
            if ((rc = li_train_medusa_save(&h, &meta, dtype, pos[0], &err))) break;
            last_ckpt = step;
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
    li_progress_finish(&prog);
    if (!rc) {
        meta.steps = step;
        meta.tokens = step * to.batch * L;
        if ((rc = li_train_medusa_save(&h, &meta, dtype, pos[0], &err))) goto done;
        if (step < to.steps) printf("interrupted after step %lld: heads written to %s\n", (long long)step, pos[0]);
        else printf("wrote %s (%d heads, %s, %lld tokens trained in %.1f s)\n", pos[0], h.K,
                    li_ckpt_dtype_label(dtype), (long long)(step * to.batch * L), li_time_now() - t0);
        fflush(stdout);
        if (eval_path && !stop_flag) rc = eval_heads(&h, &s, E, eids, (int64_t)n_eids, (int)L, tp, &err);
    }
done:
    free(lg);
    free(H);
    free(order);
    li_aligned_free(E);
    li_train_medusa_ws_free(&ws);
    li_train_grads_free(&g);
    li_adamw_free(&opt);
    li_train_medusa_free(&h);
    if (tp) li_threadpool_free(tp);
    if (s_ready) li_session_free(&s);
    free(ids);
    free(eids);
    free(base_name);
    li_runtime_close(&rt);
    if (rc) return li_runtime_fail(&err);
    return stop_flag ? 130 : 0;
}
