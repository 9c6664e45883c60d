/* cli_util.c — what the subcommands share (cli.h). */
#define _GNU_SOURCE
#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int li_cli_check_output(const char *who, const char *out, li_error *err) {
    struct stat st;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
        return li_error_set(err, LI_EIO, "%s: output '%s' is a directory", who, out);
    char *d = strdup(out);
    if (!d) abort();
    int rc = 0;
    if (access(dirname(d), W_OK) != 0)
        rc = li_error_set(err, LI_EIO, "%s: cannot write '%s': %s", who, out, strerror(errno));
    free(d);
    return rc;
}
