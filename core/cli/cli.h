/* cli.h — the luainfer subcommands and what they share. */
#ifndef LI_CLI_H
#define LI_CLI_H

#include "runtime/runtime.h"

int li_cmd_generate(int argc, char **argv);
int li_cmd_info(int argc, char **argv);
int li_cmd_perplexity(int argc, char **argv);
int li_cmd_run(int argc, char **argv);
int li_cmd_bench(int argc, char **argv);
int li_cmd_quantize(int argc, char **argv);
int li_cmd_distill(int argc, char **argv);
int li_cmd_train_medusa(int argc, char **argv);
int li_cmd_train_eagle(int argc, char **argv);
int li_cmd_prune(int argc, char **argv);
/* Fails before any work when OUT cannot be written: its folder must exist
 * and be writable, and OUT must not be a folder. `who` starts the message
 * ("quantize: cannot write 'x': ..."). */
int li_cli_check_output(const char *who, const char *out, li_error *err);

/* core/server/: declared here so this header stays free of libuv */
int li_cmd_serve(int argc, char **argv);
int li_cmd_repl(int argc, char **argv);

#endif
