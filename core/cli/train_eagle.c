/* train_eagle.c — `luainfer train-eagle --model M.gguf (--data FILE | --self-generate N) OUT.gguf`
 * (core/train/eagle.h, docs/eagle.md).
 *
 * An EAGLE-3-style draft block on a frozen base: each step takes --batch
 * windows of --seq-len tokens of the text (or of the base's own samples),
 * runs the base in the inference engine for every row's logits and its
 * residual streams after the feature blocks, and trains the draft with
 * AdamW on J = --ttt steps of the training-time test against the base's
 * distributions over the draft vocabulary. The draft file is written to a
 * temporary and renamed; Ctrl-C writes what it has and exits 130; NaN/Inf
 * stops naming the step. --eval FILE measures, per step, the draft's top-1
 * agreement with the base and the mean KL on held-out text, after training
 * or, with --draft FILE, alone. */
#define _GNU_SOURCE
#include "cli/cli.h"
#include "cli/train_opts.h"
#include "runtime/args.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "train/eagle.h"
#include "util/progress.h"
#include "cpu/threadpool.h"

#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig) {
    (void)sig;
    stop_flag = 1;
}

/* ==== the base's side of a window ============================================= */

/* What one window of the base costs the trainer: its logits, its captured
 * features and its tokens' embeddings, filled by base_window. */
typedef struct base_bufs {
    float *logits;   /* (L, n_vocab) */
    float *feat;     /* (L, F·n_embd) */
    float *emb;      /* (L, n_embd) */
} base_bufs;

/* full: the engine's logits over the whole vocabulary (eval's greedy
 * token), else over V only when V is not everything */
static int base_window(li_session *s, const li_train_eagle *e, const float *EV, li_threadpool *tp,
                       const int32_t *tok, int L, bool full, base_bufs *b, li_train_eagle_window *w, li_error *err) {
    const bool over_v = !full && e->vocab;
    int rc = li_train_eagle_base_window(s, tok, L, e->feat, e->F, over_v ? EV : NULL, e->n_draft, tp, b->logits,
                                        b->feat, err);
    if (rc) return rc;
    li_train_eagle_embed(s->model, tok, L, b->emb);
    *w = (li_train_eagle_window){.L = L, .tok = tok, .emb = b->emb, .feat = b->feat,
                                 .base = over_v ? NULL : b->logits, .base_v = over_v ? b->logits : NULL};
    return 0;
}

/* ==== agreement on held-out text ============================================== */

/* Windows of L tokens of ids through the base and the draft (J steps of the
 * training-time test, forward only): per step, the draft's top-1 against
 * the base's over V, against the base's greedy token over its whole
 * vocabulary, and the mean KL(p_V ‖ draft) at temperature 1. */
static int eval_draft(const li_train_eagle *e, li_session *s, const float *EV, const int32_t *ids, int64_t n_ids,
                      int L, int J, base_bufs *b, li_threadpool *tp, li_error *err) {
    li_train_eagle_ws ws;
    int rc = li_train_eagle_ws_init(&ws, e, L, J, err);
    if (rc) return rc;
    const int64_t V = e->hp.n_vocab, n_win = n_ids / L, R = L - J - 1;
    li_train_eagle_stats sum = {0};
    int64_t greedy[LI_TRAIN_EAGLE_MAX_TTT] = {0}, in_v = 0, n_pos = 0;
    const li_train_eagle_opts o = {.J = J, .alpha = 1, .temperature = 1};
    li_progress prog;
    li_progress_init(&prog, "eval", "windows/s", n_win);
    for (int64_t wi = 0; wi < n_win && !rc; wi++) {
        const int32_t *tok = ids + wi * L;
        li_train_eagle_window w;
        li_train_eagle_stats st;
        if ((rc = base_window(s, e, EV, tp, tok, L, true, b, &w, err))) break;
        if ((rc = li_train_eagle_forward_backward(e, NULL, EV, &w, &o, &ws, tp, &st, err))) break;
        li_train_eagle_stats_add(&sum, &st);
        int32_t *top = li_xmalloc((size_t)L * sizeof *top); /* the base's greedy token per position */
        for (int p = 0; p < L; p++) {
            const float *r = b->logits + (int64_t)p * V;
            int32_t best = 0;
            for (int64_t i = 1; i < V; i++)
                if (r[i] > r[best]) best = (int32_t)i;
            top[p] = best;
        }
        for (int j = 0; j < J; j++)
            for (int64_t r = 0; r < R; r++) { /* row r: q = r + 1 at position q + j */
                const int32_t a = ws.argmax[j * R + r];
                greedy[j] += (e->vocab ? e->vocab[a] : a) == top[r + 1 + j];
            }
        for (int64_t r = 0; r < R; r++) in_v += e->vmap[top[r + 1]] >= 0, n_pos++;
        free(top);
        li_progress_update(&prog, wi + 1, NULL);
    }
    li_progress_finish(&prog);
    if (!rc) {
        printf("eval: %lld windows of %d tokens, %lld rows per step, J %d, |V| %d (the base's greedy token in V: "
               "%.2f%%)\n",
               (long long)n_win, L, (long long)sum.rows, J, e->n_draft,
               n_pos ? 100.0 * (double)in_v / (double)n_pos : 0.0);
        printf("  step  top-1 (V)  top-1 (greedy)  KL\n");
        const double c = sum.rows ? (double)sum.rows : 1;
        for (int j = 0; j < J; j++)
            printf("  %4d   %6.2f%%     %6.2f%%      %.4f\n", j, 100.0 * (double)sum.agree_j[j] / c,
                   100.0 * (double)greedy[j] / c, sum.kl_j[j]);
        fflush(stdout);
    }
    li_train_eagle_ws_free(&ws);
    return rc;
}

/* ==== options ================================================================= */

/* "a,b,c" into feat (1..LI_EAGLE_MAX_FEATURES ascending blocks of n_layer) */
static int parse_features(const char *s, int n_layer, int32_t *feat, int *F, li_error *err) {
    *F = 0;
    const char *p = s;
    while (*p) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ','))
            return li_error_set(err, LI_EINVAL, "train-eagle: --features '%s': expected block numbers like 2,15,29", s);
        if (*F == LI_EAGLE_MAX_FEATURES)
            return li_error_set(err, LI_EINVAL, "train-eagle: --features '%s': at most %d blocks", s,
                                LI_EAGLE_MAX_FEATURES);
        if (v < 0 || v >= n_layer)
            return li_error_set(err, LI_EINVAL, "train-eagle: --features: block %ld is not in 0..%d (the model has %d "
                                "blocks)", v, n_layer - 1, n_layer);
        if (*F && v <= feat[*F - 1])
            return li_error_set(err, LI_EINVAL, "train-eagle: --features '%s': blocks must be ascending", s);
        feat[(*F)++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return li_error_set(err, LI_EINVAL, "train-eagle: --features '%s': a trailing comma", s);
    }
    if (!*F)
        return li_error_set(err, LI_EINVAL, "train-eagle: --features: expected 1..%d block numbers",
                            LI_EAGLE_MAX_FEATURES);
    return 0;
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* ==== the command ============================================================ */

int li_cmd_train_eagle(int argc, char **argv) {
    const char *model_path = NULL, *eval_path = NULL, *draft_path = NULL, *resume_path = NULL, *features_s = NULL;
    int64_t J = 3, draft_vocab = -1, eval_tokens = 4096, streams = 16;
    static const li_cli_train_spec spec = {
        .who = "train-eagle", .steps = 100, .lr = 5e-4, .min_seq_len = 3,
        .self_generate_help = "train on N tokens the base samples (temperature 1, --seed) instead of --data",
        .seq_len_help = "tokens per window (default 256)",
        .batch_help = "windows per step (default 4)",
        .dtype_help = "draft matrices in the file: f32, f16, q8_0, q4_0 or q4_1 (default f32; q8_0 reads a quarter of "
                      "f32's bytes each draft pass, q4_1 a sixth)",
        .dtypes = 1u << LI_CKPT_Q8_0 | 1u << LI_CKPT_Q4_0 | 1u << LI_CKPT_Q4_1,
        .seed_help = "seed of the draft's start, of --self-generate and of the window order (default 1)",
        .own_defaults = true, .alpha = 1.0, .temperature = 1.0, .clip = 0.5, .sched = "cosine", .seq_len = 256,
        .batch = 4, .warmup_cap = 50};
    li_cli_train_opts to;
    li_opt opts[9 + LI_CLI_TRAIN_N_OPTS] = {
        {"model", LI_OPT_STR, &model_path, "the base model, frozen (default: LUAINFER_MODEL or the bundled one)"},
        {"ttt", LI_OPT_INT, &J, "steps of the training-time test J, 1..8 (default 3)"},
        {"draft-vocab", LI_OPT_INT, &draft_vocab,
         "the draft's vocabulary: the N most frequent ids of the training tokens; 0 = all (default 8192)"},
        {"features", LI_OPT_STR, &features_s,
         "base blocks whose residual streams the draft reads, a,b,c ascending (default 2,n_layer/2,n_layer-1)"},
        {"streams", LI_OPT_INT, &streams, "--self-generate: sequences sampled side by side, 1..256 (default 16)"},
        {"eval", LI_OPT_STR, &eval_path, "held-out text: print each step's top-1 agreement and KL with the base"},
        {"eval-tokens", LI_OPT_INT, &eval_tokens, "tokens of --eval to use (default 4096)"},
        {"draft", LI_OPT_STR, &draft_path, "evaluate this draft (with --eval) instead of training"},
        {"resume", LI_OPT_STR, &resume_path, "start from this draft (its features, and its vocabulary unless --draft-vocab; fresh AdamW)"},
    };
    li_cli_train_opts_init(&to, &spec, opts + 9);
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (to.help) {
        li_args_usage("train-eagle",
                      "--model M.gguf --data FILE | --self-generate N [options] OUT.gguf\n"
                      "       luainfer train-eagle --model M.gguf --draft D.gguf --eval FILE",
                      opts, n_opts);
        return 0;
    }
    const bool train = !draft_path;
#define FAIL(...)                                   \
    do {                                            \
        li_error_set(&err, LI_EINVAL, __VA_ARGS__); \
        return li_runtime_fail(&err);               \
    } while (0)
    if (!train) {
        if (!eval_path) FAIL("train-eagle: --draft needs --eval FILE (it evaluates, it does not train)");
        if (to.data || to.self_gen || n_pos || resume_path)
            FAIL("train-eagle: --draft evaluates only: no --data, --self-generate, --resume or OUT");
    } else {
        if (!to.data && !to.self_gen) FAIL("train-eagle: --data FILE or --self-generate N is required");
        if (n_pos != 1) FAIL("train-eagle: expected one output file OUT.gguf");
    }
    if (draft_path && (features_s || draft_vocab >= 0))
        FAIL("train-eagle: --features and --draft-vocab come from the draft file with --draft");
    if (resume_path && features_s) FAIL("train-eagle: --features come from the draft file with --resume");
    if ((rc = li_cli_train_opts_check(&to, &spec, &err))) return li_runtime_fail(&err);
    if (J < 1 || J > LI_TRAIN_EAGLE_MAX_TTT) FAIL("train-eagle: --ttt must be in 1..%d", LI_TRAIN_EAGLE_MAX_TTT);
    if (to.seq_len < J + 2)
        FAIL("train-eagle: --seq-len %lld is too short for --ttt %lld (needs >= %lld)", (long long)to.seq_len,
             (long long)J, (long long)J + 2);
    if (streams < 1 || streams > 256) FAIL("train-eagle: --streams must be in 1..256");
    if (eval_tokens < 1) FAIL("train-eagle: --eval-tokens must be >= 1");
    if (draft_vocab < -1) FAIL("train-eagle: --draft-vocab must be >= 0 (0: the whole vocabulary)");
#undef FAIL
    if (train && (rc = li_cli_check_output("train-eagle", pos[0], &err))) return li_runtime_fail(&err);

    li_runtime rt = {0};
    li_session s = {0};
    bool s_ready = false;
    li_train_eagle e = {0};
    li_train_grads g = {0};
    li_adamw opt = {0};
    li_train_eagle_ws ws = {0};
    li_threadpool *tp = NULL;
    char *base_name = NULL;
    int32_t *ids = NULL, *eids = NULL, *order = NULL, *vocab = NULL;
    size_t n_ids = 0, n_eids = 0;
    float *EV = NULL;
    base_bufs bb = {0};
    if ((rc = li_runtime_open(&rt, li_model_default_path(model_path), to.threads, NULL, &err))) goto done;
    /* the captured residual streams are in the rotated basis there */
    if ((rc = li_model_refuse_rotated(rt.model, "train-eagle", &err))) goto done;
    li_model *m = rt.model;
    const int64_t d = m->hp.n_embd, V = m->hp.n_vocab;
    const int L = (int)to.seq_len;
    const uint64_t vhash = li_tokenizer_vocab_hash(m->tok);
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
    if (draft_vocab > V) {
        rc = li_error_set(&err, LI_EINVAL, "train-eagle: --draft-vocab %lld is larger than the vocabulary (%lld)",
                          (long long)draft_vocab, (long long)V);
        goto done;
    }
    int32_t feat[LI_EAGLE_MAX_FEATURES];
    int F = 0;
    if (features_s) {
        if ((rc = parse_features(features_s, m->hp.n_layer, feat, &F, &err))) goto done;
    } else F = li_train_eagle_default_features(m->hp.n_layer, feat);
    char need[48];
    snprintf(need, sizeof need, "--seq-len %d", L);
    /* the evaluation text first: a bad path fails before any training */
    if (eval_path && (rc = li_cli_text_tokens("train-eagle", m->tok, eval_path, "evaluation text", true, eval_tokens, L,
                                              need, &eids, &n_eids, &err)))
        goto done;
    const li_eagle_base eb = {.name = base_name, .n_embd = d, .n_vocab = V, .n_layer = m->hp.n_layer,
                              .head_dim = m->hp.head_dim, .vocab_hash = vhash};
    /* special tokens as text become their ids: chat transcripts
     * (tools/gen_chat_data.lua) train the draft on the turns' real tokens */
    if (train && (rc = li_cli_train_tokens("train-eagle", m, &rt.be, &to, (int)streams, false, true, L, need, &ids,
                                           &n_ids, &err)))
        goto done;
    /* the draft vocabulary: the most frequent ids of the training tokens (8192 by default, all if fewer);
     * a resumed draft keeps its own unless --draft-vocab is given */
    const int64_t nv = draft_vocab < 0 ? LI_MIN((int64_t)8192, V) : draft_vocab;
    if (train && (!resume_path || draft_vocab >= 0) && nv > 0 && nv < V) {
        vocab = li_xmalloc((size_t)nv * sizeof *vocab);
        li_train_eagle_vocab_select(ids, (int64_t)n_ids, (int32_t)V, (int32_t)nv, vocab);
    }
    if (draft_path || resume_path) {
        if ((rc = li_train_eagle_load(&e, draft_path ? draft_path : resume_path, &m->hp, &eb, &err))) goto done;
        if (resume_path && draft_vocab >= 0 && (rc = li_train_eagle_set_vocab(&e, vocab, (int32_t)nv, &err)))
            goto done;
    } else {
        if ((rc = li_train_eagle_init(&e, &m->hp, F, feat, vocab, (int32_t)nv, m->output_norm, (uint64_t)to.seed,
                                      &err)))
            goto done;
    }
    /* the frozen head over V, dequantized once */
    if (!(EV = li_train_eagle_output_f32(m, e.vocab, e.n_draft))) {
        rc = li_error_set(&err, LI_ENOMEM, "train-eagle: cannot hold the output matrix in float32");
        goto done;
    }
    if ((rc = li_session_init(&s, m, &rt.be, L, LI_TYPE_F32, L, &err))) goto done;
    s_ready = true;
    bb.logits = li_xmalloc((size_t)L * (size_t)V * sizeof *bb.logits);
    bb.feat = li_xmalloc((size_t)L * (size_t)e.F * (size_t)d * sizeof *bb.feat);
    bb.emb = li_xmalloc((size_t)L * (size_t)d * sizeof *bb.emb);
    const int n_thr = li_threads_or_cpus(to.threads);
    if (!(tp = li_threadpool_init(n_thr))) {
        rc = li_error_set(&err, LI_ENOMEM, "train-eagle: cannot start %d threads", n_thr);
        goto done;
    }
    char feats_txt[64] = "";
    for (int i = 0; i < e.F; i++)
        snprintf(feats_txt + strlen(feats_txt), sizeof feats_txt - strlen(feats_txt), "%s%d", i ? "," : "", e.feat[i]);
    if (!train) {
        printf("train-eagle: evaluating %s (features %s, |V| %d) on %s\n", draft_path, feats_txt, e.n_draft, eval_path);
        rc = eval_draft(&e, &s, EV, eids, (int64_t)n_eids, L, (int)J, &bb, tp, &err);
        goto done;
    }

    /* ---- training ---- */
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
    if (li_train_grads_init(&g, &e.tm.L) || li_adamw_init(&opt, &e.tm.L)) {
        rc = li_error_set(&err, LI_ENOMEM, "train-eagle: cannot allocate gradients and optimizer state");
        goto done;
    }
    if ((rc = li_train_eagle_ws_init(&ws, &e, L, (int)J, &err))) goto done;
    printf("train-eagle: %s -> %s, features %s, |V| %d, J %lld (%.2fM parameters), %zu tokens of %s (%lld windows "
           "of %d)\n",
           base_name, pos[0], feats_txt, e.n_draft, (long long)J, (double)e.tm.L.n_params / 1e6, n_ids,
           to.data ? to.data : "the base's samples", (long long)n_windows, L);
    printf("loss = sum_j 0.8^j (%.2f * KL(T = %.2f) * T^2 + %.2f * CE); AdamW lr %g (%s, warmup %d), clip %g, "
           "%lld x %d tokens per step\n",
           to.alpha, to.temperature, 1 - to.alpha, to.lr, to.sched_s, to.sched.warmup, to.clip, (long long)to.batch, L);
    fflush(stdout);
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    li_train_eagle_meta meta = {.base_name = base_name, .vocab_hash = vhash, .alpha = (float)to.alpha,
                                .temperature = (float)to.temperature, .lr = (float)to.lr, .ttt = (int)J,
                                .data = to.data ? to.data : "self-generate"};
    const li_train_eagle_opts eo = {.J = (int)J, .alpha = (float)to.alpha, .temperature = (float)to.temperature,
                                    .grad_scale = 1.0f / (float)to.batch};
    li_adamw_opts ao = {.lr = (float)to.lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = (float)to.wd, .clip = (float)to.clip, .tp = tp};
    li_progress prog;
    li_progress_init(&prog, "train-eagle", "steps/s", to.steps);
    const double t0 = li_time_now();
    double t_base = 0;
    int64_t next = 0, step = 0, last_ckpt = 0;
    while (step < to.steps && !stop_flag) {
        li_train_eagle_stats sum = {0};
        li_train_grads_zero(&g);
        for (int64_t j = 0; j < to.batch && !rc; j++) {
            const int32_t *tok = ids + (int64_t)order[next++ % n_windows] * L;
            li_train_eagle_window w;
            li_train_eagle_stats st;
            const double tb = li_time_now();
            if ((rc = base_window(&s, &e, EV, tp, tok, L, false, &bb, &w, &err))) break;
            t_base += li_time_now() - tb;
            if ((rc = li_train_eagle_forward_backward(&e, &g, EV, &w, &eo, &ws, tp, &st, &err))) break;
            if (!isfinite(st.loss))
                rc = li_error_set(&err, LI_ERANGE, "train: step %lld: the loss is %g (window %lld)",
                                  (long long)step + 1, st.loss, (long long)j + 1);
            li_train_eagle_stats_add(&sum, &st);
        }
        double gn = 0;
        ao.lr = (float)li_train_lr_at(&to.sched, to.lr, (int)step + 1, (int)to.steps);
        if (!rc) rc = li_adamw_step(&opt, &e.tm, &g, &ao, &gn, &err);
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
        const double el = li_time_now() - t0;
        printf("step %lld/%lld: loss %.4f  steps", (long long)step, (long long)to.steps, sum.loss);
        for (int j = 0; j < J; j++) printf(" %.3f", sum.loss_j[j]);
        printf("  top-1");
        for (int j = 0; j < J; j++) printf(" %.1f%%", 100.0 * (double)sum.agree_j[j] / (double)LI_MAX(sum.rows, 1));
        printf("  grad-norm %.3f  lr %.4g  %.0f tok/s  (%.1f s)\n", gn, (double)ao.lr,
               (double)(step * to.batch * L) / el, el);
        fflush(stdout);
        li_progress_update(&prog, step, NULL);
        if (to.ckpt_every > 0 && step % to.ckpt_every == 0 && step < to.steps) {
            meta.steps = step;
            meta.tokens = step * to.batch * L;
            if ((rc = li_train_eagle_save(&e, &meta, to.dtype, pos[0], &err))) break;
            last_ckpt = step;
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
    li_progress_finish(&prog);
    if (!rc) {
        meta.steps = step;
        meta.tokens = step * to.batch * L;
        if ((rc = li_train_eagle_save(&e, &meta, to.dtype, pos[0], &err))) goto done;
        const double el = li_time_now() - t0;
        if (step < to.steps) printf("interrupted after step %lld: draft written to %s\n", (long long)step, pos[0]);
        else
            printf("wrote %s (%s, %lld tokens trained in %.1f s: %.0f tok/s; the base's passes %.1f s, the draft's "
                   "%.1f s)\n",
                   pos[0], li_ckpt_dtype_label(to.dtype), (long long)(step * to.batch * L), el,
                   (double)(step * to.batch * L) / el, t_base, el - t_base);
        fflush(stdout);
        if (eval_path && !stop_flag) rc = eval_draft(&e, &s, EV, eids, (int64_t)n_eids, L, (int)J, &bb, tp, &err);
    }
done:
    free(order);
    free(vocab);
    free(bb.logits);
    free(bb.feat);
    free(bb.emb);
    li_aligned_free(EV);
    li_train_eagle_ws_free(&ws);
    li_train_grads_free(&g);
    li_adamw_free(&opt);
    li_train_eagle_free(&e);
    if (tp) li_threadpool_free(tp);
    if (s_ready) li_session_free(&s);
    free(ids);
    free(eids);
    free(base_name);
    li_runtime_close(&rt);
    if (rc) return li_runtime_fail(&err);
    return stop_flag ? 130 : 0;
}
