/* train_opts.h — the options `luainfer distill`, `luainfer train-medusa` and
 * `luainfer train-eagle` share: one table of entries (the same names, kinds
 * and help), defaults and range checks, so the commands spell, bound and
 * refuse them alike. Each command adds its own options (distill: --teacher,
 * --student, --accum, --train; train-medusa: --model, --heads, --streams,
 * --eval...; train-eagle: --ttt, --draft-vocab, --features...). */
#ifndef LI_CLI_TRAIN_OPTS_H
#define LI_CLI_TRAIN_OPTS_H

#include "runtime/args.h"
#include "tokenizer/tokenizer.h"
#include "train/train.h"

#define LI_CLI_TRAIN_N_OPTS 17 /* entries li_cli_train_opts_init writes */

/* What differs between the commands: the name that starts messages, the
 * defaults, and the help of the options whose meaning they word apart. */
typedef struct li_cli_train_spec {
    const char *who;           /* "distill" */
    int64_t steps;             /* default --steps */
    double lr;                 /* default --lr */
    int64_t min_seq_len;       /* --seq-len's lower bound */
    const char *self_generate_help, *seq_len_help, *batch_help, *dtype_help, *seed_help;
    unsigned dtypes; /* the --dtype values accepted beyond f32 and f16: bits 1u << LI_CKPT_* */
    /* own_defaults: the command's own defaults below instead of the shared
     * ones (alpha 0.5, T 2, clip 1, constant, no warmup, seq-len 64, batch 1);
     * warmup_cap > 0: without --warmup, min(warmup_cap, steps / 10) */
    bool own_defaults;
    double alpha, temperature, clip;
    const char *sched;
    int64_t seq_len, batch, warmup_cap;
} li_cli_train_spec;

typedef struct li_cli_train_opts {
    const char *data, *dtype_s, *sched_s;
    int64_t steps, seq_len, batch, threads, ckpt_every, seed, self_gen, warmup;
    double alpha, temperature, lr, wd, clip;
    bool help;
    li_ckpt_dtype dtype;       /* --dtype, set by li_cli_train_opts_check */
    li_lr_schedule sched;      /* --lr-schedule and --warmup, set by li_cli_train_opts_check */
    char steps_help[64], lr_help[64], alpha_help[80], temp_help[80], clip_help[80], sched_help[192],
        warmup_help[112];
} li_cli_train_opts;

/* Defaults into o, and the shared entries into opts[0, LI_CLI_TRAIN_N_OPTS)
 * (pointing into o: it must outlive the parse). */
void li_cli_train_opts_init(li_cli_train_opts *o, const li_cli_train_spec *s, li_opt *opts);
/* The shared checks after parsing: --data and --self-generate exclusive,
 * every range, --dtype parsed into o->dtype, the schedule into o->sched.
 * One line starting with s->who. */
int li_cli_train_opts_check(li_cli_train_opts *o, const li_cli_train_spec *s, li_error *err);

/* The tokens of the text file path (what: "training text", "evaluation
 * text"; special: special tokens written as text become their ids), the
 * first max of them (max <= 0: all), into *ids (the caller frees) and *n.
 * Fewer than min: "WHO: PATH has N tokens, fewer than NEED" (need, e.g.
 * "--seq-len 64"). */
int li_cli_text_tokens(const char *who, const li_tokenizer *tok, const char *path, const char *what, bool special,
                       int64_t max, int64_t min, const char *need, int32_t **ids, size_t *n, li_error *err);
/* The training tokens: --data's text (li_cli_text_tokens), or the
 * --self-generate N tokens m samples, streams side by side (stream 0 is
 * what one stream samples; with session1, one stream runs the older
 * one-sequence generator instead: distill's --streams 1, its samples as
 * before streams), refused before any is sampled when N < min. */
int li_cli_train_tokens(const char *who, li_model *m, li_backend *be, const li_cli_train_opts *o, int streams,
                        bool session1, bool special, int64_t min, const char *need, int32_t **ids, size_t *n,
                        li_error *err);

#endif
