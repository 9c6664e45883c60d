/* bench.c — `luainfer bench NAME [ARGS...]`: runs one of the benchmark
 * programs in bench/ (bench_NAME.lua) with the luainfer module, e.g.
 *   luainfer bench batching 200      continuous vs static batching
 *   luainfer bench prefix 12         prefix caching off vs on, lpm vs default
 *   luainfer bench policy_overhead   schedule() cost at 64 running requests
 * Each prints its ratios measured side by side in one run. */
#include "cli/cli.h"
#include "util/common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *bench_dir(void) {
    const char *env = getenv("LUAINFER_BENCH_DIR");
    return env && *env ? env : LI_SOURCE_DIR "/bench";
}

/* A header line without its comment marks (Lua's dashes, a C comment's
 * opening, star and closing, a docstring's quotes), trimmed. */
static char *strip_comment(char *t) {
    while (*t == ' ' || *t == '\t') t++;
    static const char *const open[] = {"--", "/*", "*", "\"\"\""};
    for (size_t i = 0; i < LI_ARRAY_LEN(open); i++)
        if (!strncmp(t, open[i], strlen(open[i]))) {
            t += strlen(open[i]);
            break;
        }
    t[strcspn(t, "\r\n")] = 0;
    char *end = strstr(t, "*/");
    if (!end) end = strstr(t, "\"\"\"");
    if (end) *end = 0;
    while (*t == ' ') t++;
    size_t n = strlen(t);
    while (n && t[n - 1] == ' ') t[--n] = 0;
    return t;
}

/* The benchmark's one-line summary: its header comment (Lua "--", C's
 * block comment or Python's docstring) after the dash, up to the first
 * sentence end (joined over at most 6 lines), cut to about 78 characters. */
static void summary(const char *path, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512], text[1024] = "";
    for (int i = 0; i < 7 && fgets(line, sizeof line, f); i++) {
        if (i == 0 && !strncmp(line, "#!", 2)) continue; /* a script's interpreter line */
        char *t = strip_comment(line);
        if (!*t) break;
        if (*text) strncat(text, " ", sizeof text - strlen(text) - 1);
        strncat(text, t, sizeof text - strlen(text) - 1);
    }
    fclose(f);
    const char *dash = strstr(text, "\xe2\x80\x94 "); /* the em dash after the file name */
    const char *s = dash ? dash + 4 : text;
    size_t n = 0;
    while (s[n] && !(s[n] == '.' && (s[n + 1] == ' ' || !s[n + 1])) && !(s[n] == ':' && s[n + 1] == ' ')) n++;
    /* a long sentence is cut at a word, so a listing line stays near 100 columns */
    const size_t width = cap - 4 < 78 ? cap - 4 : 78;
    bool cut = n > width;
    if (cut) {
        n = width;
        while (n > 0 && s[n] != ' ') n--;
    }
    memcpy(out, s, n);
    strcpy(out + n, cut ? " ..." : "");
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The bench_*SUFFIX files of the bench directory, sorted, one line each:
 * the name and what it measures. The name: without "bench_" and SUFFIX
 * (what `luainfer bench` takes), the file name (keep = 2), or without
 * SUFFIX (keep = 1: a C program's binary). */
static void list_kind(FILE *f, const char *suffix, int keep) {
    DIR *d = opendir(bench_dir());
    if (!d) return;
    char *names[256];
    int n = 0;
    const size_t sl = strlen(suffix);
    struct dirent *de;
    while ((de = readdir(d)) && n < 256) {
        size_t len = strlen(de->d_name);
        if (len > 6 + sl && !strncmp(de->d_name, "bench_", 6) && !strcmp(de->d_name + len - sl, suffix)) {
            names[n] = li_xmalloc(len + 1);
            memcpy(names[n++], de->d_name, len + 1);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char path[4096], what[200];
        snprintf(path, sizeof path, "%s/%s", bench_dir(), names[i]);
        summary(path, what, sizeof what);
        const size_t len = strlen(names[i]);
        if (keep == 2) fprintf(f, "  %-21s %s\n", names[i], what);
        else if (keep == 1) fprintf(f, "  %-21.*s %s\n", (int)(len - sl), names[i], what);
        else fprintf(f, "  %-18.*s %s\n", (int)(len - 6 - sl), names[i] + 6, what);
        free(names[i]);
    }
}

/* One line per benchmark program: the Lua ones this command runs, then the
 * Python and C ones with how to run them. */
static void list(FILE *f) {
    fprintf(f, "usage: luainfer bench NAME [ARGS...]\nbenchmarks in %s:\n", bench_dir());
    list_kind(f, ".lua", 0);
    fprintf(f, "Python programs (run as .venv/bin/python bench/NAME.py from the repository; --help for their options):\n");
    list_kind(f, ".py", 2);
    fprintf(f, "C programs (built beside luainfer, e.g. build/bench_kernels; --json/--plot as the others):\n");
    list_kind(f, ".c", 1);
}

int li_cmd_bench(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        list(stdout);
        return 0;
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
