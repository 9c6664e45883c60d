/* cli.h — the luainfer subcommands and what they share. */
#ifndef LI_CLI_H
#define LI_CLI_H

#include "model/model.h"

typedef struct li_runtime {
    li_model *model;
    li_backend be;
    bool be_ready;
} li_runtime;

/* Loads the model (default path rules in li_model_default_path) and starts
 * the CPU backend with n_threads (<= 0: all cores) and the ISA override. */
int li_runtime_open(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa, li_error *err);
void li_runtime_close(li_runtime *rt);

/* Prints "luainfer: error: <msg>" to stderr and returns the exit status 1. */
int li_cli_fail(const li_error *err);

int li_cmd_generate(int argc, char **argv);
int li_cmd_info(int argc, char **argv);
int li_cmd_perplexity(int argc, char **argv);
int li_cmd_run(int argc, char **argv);
int li_cmd_bench(int argc, char **argv);
/* core/server/: declared here so this header stays free of libuv */
int li_cmd_serve(int argc, char **argv);
int li_cmd_repl(int argc, char **argv);

#endif
