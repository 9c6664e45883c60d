/* bench.c — `luainfer bench NAME [ARGS...]`: runs one of the benchmark
 * programs in bench/ (bench_NAME.lua) with the luainfer module, e.g.
 *   luainfer bench batching 200      continuous vs static batching
 *   luainfer bench prefix 12         prefix caching off vs on, lpm vs default
 *   luainfer bench policy_overhead   schedule() cost at 64 running requests
 * Each prints its ratios measured side by side in one run. */
#include "cli/cli.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *bench_dir(void) {
    const char *env = getenv("LUAINFER_BENCH_DIR");
    return env && *env ? env : LI_SOURCE_DIR "/bench";
}

static void list(FILE *f) {
    fprintf(f, "usage: luainfer bench NAME [ARGS...]\nbenchmarks in %s:\n", bench_dir());
    DIR *d = opendir(bench_dir());
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 10 && !strncmp(de->d_name, "bench_", 6) && !strcmp(de->d_name + n - 4, ".lua"))
            fprintf(f, "  %.*s\n", (int)(n - 10), de->d_name + 6);
    }
    closedir(d);
}

int li_cmd_bench(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        list(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    for (const char *c = argv[0]; *c; c++)
        if (!(*c == '_' || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9'))) {
            fprintf(stderr, "luainfer: error: bad benchmark name '%s'\n", argv[0]);
            return 2;
        }
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_%s.lua", bench_dir(), argv[0]);
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "luainfer: error: no benchmark '%s' (%s)\n", argv[0], path);
        list(stderr);
        return 2;
    }
    char **args = malloc(sizeof(char *) * (size_t)(argc + 1));
    args[0] = path;
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    args[argc] = NULL;
    int rc = li_cmd_run(argc, args);
    free(args);
    return rc;
}
