/* train_opts.c — the options distill, train-medusa and train-eagle share (train_opts.h). */
#include "cli/train_opts.h"
#include "tokenizer/tokenizer.h"
#include "train/selfgen.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void li_cli_train_opts_init(li_cli_train_opts *o, const li_cli_train_spec *s, li_opt *opts) {
    *o = (li_cli_train_opts){.dtype_s = "f32", .sched_s = "constant", .steps = s->steps, .seq_len = 64, .batch = 1,
                             .seed = 1, .alpha = 0.5, .temperature = 2.0, .lr = s->lr, .clip = 1.0};
    if (s->own_defaults) {
        o->alpha = s->alpha;
        o->temperature = s->temperature;
        o->clip = s->clip;
        o->sched_s = s->sched;
        o->seq_len = s->seq_len;
        o->batch = s->batch;
    }
    if (s->warmup_cap > 0) o->warmup = INT64_MIN; /* not given: set by li_cli_train_opts_check */
    snprintf(o->steps_help, sizeof o->steps_help, "optimizer steps (default %lld)", (long long)s->steps);
    snprintf(o->lr_help, sizeof o->lr_help, "AdamW learning rate (default %g)", s->lr);
    snprintf(o->alpha_help, sizeof o->alpha_help, "weight of the KL term in [0, 1] (default %g)", o->alpha);
    snprintf(o->temp_help, sizeof o->temp_help, "softmax temperature of the KL term (default %g)", o->temperature);
    snprintf(o->clip_help, sizeof o->clip_help, "global gradient-norm clip, 0 = none (default %g)", o->clip);
    snprintf(o->sched_help, sizeof o->sched_help,
             "constant, cosine or linear: after --warmup, the rate held, or decayed to 0 at the last step "
             "(default %s)", o->sched_s);
    if (s->warmup_cap > 0)
        snprintf(o->warmup_help, sizeof o->warmup_help,
                 "steps the rate rises linearly from 0 to --lr (default %lld, or a tenth of --steps if less)",
                 (long long)s->warmup_cap);
    else snprintf(o->warmup_help, sizeof o->warmup_help, "steps the rate rises linearly from 0 to --lr (default 0)");
    const li_opt shared[LI_CLI_TRAIN_N_OPTS] = {
        {"data", LI_OPT_STR, &o->data, "training text (this or --self-generate)"},
        {"self-generate", LI_OPT_INT, &o->self_gen, s->self_generate_help},
        {"alpha", LI_OPT_FLOAT, &o->alpha, o->alpha_help},
        {"temperature", LI_OPT_FLOAT, &o->temperature, o->temp_help},
        {"steps", LI_OPT_INT, &o->steps, o->steps_help},
        {"lr", LI_OPT_FLOAT, &o->lr, o->lr_help},
        {"lr-schedule", LI_OPT_STR, &o->sched_s, o->sched_help},
        {"warmup", LI_OPT_INT, &o->warmup, o->warmup_help},
        {"weight-decay", LI_OPT_FLOAT, &o->wd, "AdamW decoupled weight decay (default 0)"},
        {"clip", LI_OPT_FLOAT, &o->clip, o->clip_help},
        {"seq-len", LI_OPT_INT, &o->seq_len, s->seq_len_help},
        {"batch", LI_OPT_INT, &o->batch, s->batch_help},
        {"dtype", LI_OPT_STR, &o->dtype_s, s->dtype_help},
        {"ckpt-every", LI_OPT_INT, &o->ckpt_every, "write OUT every N steps too (default: only at the end)"},
        {"threads", LI_OPT_INT, &o->threads, "compute threads (default: all cores)"},
        {"seed", LI_OPT_INT, &o->seed, s->seed_help},
        {"help", LI_OPT_FLAG, &o->help, "show this help"},
    };
    memcpy(opts, shared, sizeof shared);
}

int li_cli_train_opts_check(li_cli_train_opts *o, const li_cli_train_spec *s, li_error *err) {
    const char *w = s->who;
    if (o->data && o->self_gen) return li_error_set(err, LI_EINVAL, "%s: --data and --self-generate exclude each other", w);
    if (o->self_gen < 0 || o->self_gen > 10000000)
        return li_error_set(err, LI_EINVAL, "%s: --self-generate must be in 1..10000000", w);
    if (!(o->alpha >= 0 && o->alpha <= 1)) return li_error_set(err, LI_EINVAL, "%s: --alpha must be in [0, 1]", w);
    if (!(o->temperature > 0 && o->temperature <= 100))
        return li_error_set(err, LI_EINVAL, "%s: --temperature must be in (0, 100]", w);
    if (o->steps < 1 || o->steps > 10000000) return li_error_set(err, LI_EINVAL, "%s: --steps must be in 1..10000000", w);
    if (!(o->lr > 0 && o->lr < 1)) return li_error_set(err, LI_EINVAL, "%s: --lr must be in (0, 1)", w);
    if (!(o->wd >= 0 && o->wd < 1) || !(o->clip >= 0))
        return li_error_set(err, LI_EINVAL, "%s: --weight-decay must be in [0, 1), --clip >= 0", w);
    if (o->seq_len < s->min_seq_len || o->seq_len > 4096)
        return li_error_set(err, LI_EINVAL, "%s: --seq-len must be in %lld..4096", w, (long long)s->min_seq_len);
    if (o->batch < 1 || o->batch > 64) return li_error_set(err, LI_EINVAL, "%s: --batch must be in 1..64", w);
    if (o->ckpt_every < 0) return li_error_set(err, LI_EINVAL, "%s: --ckpt-every must be >= 0", w);
    if (li_lr_kind_parse(o->sched_s, &o->sched.kind))
        return li_error_set(err, LI_EINVAL, "%s: --lr-schedule must be constant, cosine or linear", w);
    if (o->warmup == INT64_MIN && s->warmup_cap > 0) o->warmup = LI_MIN(s->warmup_cap, o->steps / 10);
    if (o->warmup < 0 || o->warmup >= o->steps)
        return li_error_set(err, LI_EINVAL, "%s: --warmup must be in 0..%lld (below --steps)", w,
                            (long long)o->steps - 1);
    o->sched.warmup = (int)o->warmup;
    const unsigned ok = s->dtypes | 1u << LI_CKPT_F32 | 1u << LI_CKPT_F16;
    if (li_ckpt_dtype_parse(o->dtype_s, &o->dtype) || !(ok >> o->dtype & 1)) {
        char names[96] = "";
        int n = 0, left = __builtin_popcount(ok);
        for (int d = 0; d <= LI_CKPT_SOURCE; d++)
            if (ok >> d & 1) {
                left--;
                n += snprintf(names + n, sizeof names - (size_t)n, "%s%s", li_ckpt_dtype_name((li_ckpt_dtype)d),
                              left > 1 ? ", " : left == 1 ? " or " : "");
            }
        return li_error_set(err, LI_EINVAL, "%s: --dtype must be %s (got '%s')", w, names, o->dtype_s);
    }
    return 0;
}

int li_cli_text_tokens(const char *who, const li_tokenizer *tok, const char *path, const char *what, bool special,
                       int64_t max, int64_t min, const char *need, int32_t **ids, size_t *n, li_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = li_read_text(path, (size_t)256 << 20, what, &text, &len, err);
    if (rc) return rc;
    rc = li_tokenizer_encode(tok, text, len, false, special, ids, n, err);
    free(text);
    if (rc) return rc;
    if (max > 0 && (int64_t)*n > max) *n = (size_t)max;
    if ((int64_t)*n < min) {
        rc = li_error_set(err, LI_EINVAL, "%s: %s has %zu tokens, fewer than %s", who, path, *n, need);
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

int li_cli_train_tokens(const char *who, li_model *m, li_backend *be, const li_cli_train_opts *o, int streams,
                        bool session1, bool special, int64_t min, const char *need, int32_t **ids, size_t *n,
                        li_error *err) {
    if (o->data) return li_cli_text_tokens(who, m->tok, o->data, "training text", special, 0, min, need, ids, n, err);
    if (o->self_gen < min)
        return li_error_set(err, LI_EINVAL, "%s: --self-generate %lld tokens, fewer than %s", who,
                            (long long)o->self_gen, need);
    /* side by side the weights are read once per token of all streams */
    const int rc = streams == 1 && session1 ? li_train_self_generate(m, be, o->self_gen, (uint64_t)o->seed, ids, err)
                                : li_train_self_generate_n(m, be, o->self_gen, (uint64_t)o->seed, streams, ids, err);
    if (!rc) *n = (size_t)o->self_gen;
    return rc;
}
