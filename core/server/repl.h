/* repl.h — `luainfer repl` (wired into core/main.c through cli/cli.h). */
#ifndef LI_SERVER_REPL_H
#define LI_SERVER_REPL_H

int li_cmd_repl(int argc, char **argv);

#endif
