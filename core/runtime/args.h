/* args.h — a small declarative option parser for the subcommands.
 * Every option is declared once (name, kind, destination, help); unknown
 * flags, missing values and malformed numbers are clear one-line errors. */
#ifndef LI_ARGS_H
#define LI_ARGS_H

#include "util/common.h"

typedef enum { LI_OPT_FLAG, LI_OPT_STR, LI_OPT_INT, LI_OPT_FLOAT, LI_OPT_STR_LIST } li_opt_kind;

typedef struct li_str_list {
    const char **items;
    int n;
} li_str_list;

typedef struct li_opt {
    const char *name;  /* without leading dashes, e.g. "max-tokens" */
    li_opt_kind kind;
    void *dst;         /* bool*, const char**, int64_t*, double*, li_str_list* */
    const char *help;
} li_opt;

/* Parses argv[0..argc) (after the subcommand). Non-option arguments are
 * collected into positional (up to max_pos); more is an error. */
int li_args_parse(li_opt *opts, int n_opts, int argc, char **argv, const char **positional, int max_pos,
                  int *n_pos, li_error *err);
/* A byte count: digits with an optional K/M/G (binary) suffix, "KiB"/"MB" style
 * spellings accepted; `what` names the option in the error. */
int li_parse_bytes(const char *what, const char *s, size_t *out, li_error *err);
void li_args_usage(const char *cmd, const char *synopsis, const li_opt *opts, int n_opts);

#endif
