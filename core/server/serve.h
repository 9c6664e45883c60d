/* serve.h — `luainfer serve` (wired into core/main.c through cli/cli.h). */
#ifndef LI_SERVER_SERVE_H
#define LI_SERVER_SERVE_H

int li_cmd_serve(int argc, char **argv);

#endif
