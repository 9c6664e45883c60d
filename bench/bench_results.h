/* bench_results.h — --json FILE and --plot FILE for the C benchmark programs
 * (bench_kernels, bench_spec_verify, bench_train), as luainfer.bench gives
 * the Lua ones and bench/results.py the Python ones:
 *
 *   li_bench_results res;
 *   if (li_bench_results_init(&res, "spec_verify", &argc, argv)) return 2;
 *   cJSON *row = li_bench_results_row(&res, "name", "chain accept");
 *   cJSON_AddNumberToObject(row, "us_per_call", us);
 *   li_bench_results_chart(&res, "name", "us_per_call", "us per call", "title", false);
 *   (li_bench_results_chart_n for several bars per row)
 *   return li_bench_results_finish(&res);
 *
 * --json writes {"bench", "rows", ...} (keys as added); --plot runs
 * tools/plot_bench.py on the same results (a "chart": one bar per row). Both
 * write a temporary file and rename it. Header-only: each program is one
 * file and includes it once. */
#ifndef LI_BENCH_RESULTS_H
#define LI_BENCH_RESULTS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct li_bench_results {
    const char *json, *plot; /* file names, or NULL */
    cJSON *root, *rows;
} li_bench_results;

/* Takes --json FILE / --plot FILE out of argv (the rest keep their order);
 * 2 and a one-line message on a missing name. */
static int li_bench_results_init(li_bench_results *r, const char *bench, int *argc, char **argv) {
    memset(r, 0, sizeof *r);
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const bool j = !strcmp(argv[i], "--json"), p = !strcmp(argv[i], "--plot");
        if (!j && !p) {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc || !argv[i + 1][0]) {
            fprintf(stderr, "bench_%s: %s needs a file name\n", bench, argv[i]);
            return 2;
        }
        *(j ? &r->json : &r->plot) = argv[++i];
    }
    *argc = out;
    argv[out] = NULL;
    r->root = cJSON_CreateObject();
    cJSON_AddStringToObject(r->root, "bench", bench);
    r->rows = cJSON_AddArrayToObject(r->root, "rows");
    return 0;
}

/* A new row, named by its label field; add its numbers with cJSON. */
static cJSON *li_bench_results_row(li_bench_results *r, const char *label_key, const char *label) {
    cJSON *row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, label_key, label);
    cJSON_AddItemToArray(r->rows, row);
    return row;
}

/* The bar chart plot_bench.py draws: per row, one bar for each of the n
 * fields in values. */
static void li_bench_results_chart_n(li_bench_results *r, const char *label_key, const char *const *values, int n,
                                     const char *ylabel, const char *title, bool log) {
    cJSON *c = cJSON_AddObjectToObject(r->root, "chart");
    cJSON_AddStringToObject(c, "label", label_key);
    cJSON_AddItemToObject(c, "values", cJSON_CreateStringArray(values, n));
    cJSON_AddStringToObject(c, "ylabel", ylabel);
    cJSON_AddStringToObject(c, "title", title);
    cJSON_AddBoolToObject(c, "log", log);
}

static void li_bench_results_chart(li_bench_results *r, const char *label_key, const char *value, const char *ylabel,
                                   const char *title, bool log) {
    li_bench_results_chart_n(r, label_key, &value, 1, ylabel, title, log);
}

static int li_bench_results_write(const char *path, const char *text) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = !fclose(f) && ok;
    if (!ok || rename(tmp, path)) {
        unlink(tmp);
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* The project's venv python (LUAINFER_PYTHON wins), else python3. */
static const char *li_bench_results_python(char *buf, size_t n) {
    const char *env = getenv("LUAINFER_PYTHON");
    if (env && *env) return env;
    snprintf(buf, n, "%s/.venv/bin/python", LI_SOURCE_DIR);
    return access(buf, X_OK) ? "python3" : buf;
}

/* Writes the files asked for and frees the results: 0, or 1 after a
 * one-line message. */
static int li_bench_results_finish(li_bench_results *r) {
    int rc = 0;
    char *text = cJSON_Print(r->root);
    if (r->json) rc |= li_bench_results_write(r->json, text);
    if (r->plot && !rc) {
        /* plot_bench.py reads the results from a file: --json's, or a temporary one */
        char tmpjson[4096];
        const char *tmpdir = getenv("TMPDIR");
        snprintf(tmpjson, sizeof tmpjson, "%s/li_bench_%ld.json", tmpdir && *tmpdir ? tmpdir : "/tmp", (long)getpid());
        const char *src = r->json;
        if (!src) {
            FILE *f = fopen(tmpjson, "wbx"); /* C11 exclusive: never another's file */
            bool ok = f && fputs(text, f) >= 0;
            if (f) ok = !fclose(f) && ok;
            if (!ok) {
                fprintf(stderr, "cannot write %s for --plot\n", tmpjson);
                rc = 1;
            }
            src = tmpjson;
        }
        if (!rc) {
            char pybuf[4096], script[4096];
            const char *py = li_bench_results_python(pybuf, sizeof pybuf);
            snprintf(script, sizeof script, "%s/tools/plot_bench.py", LI_SOURCE_DIR);
            fflush(NULL);
            const pid_t pid = fork();
            if (pid == 0) {
                execlp(py, py, script, src, r->plot, (char *)NULL);
                _exit(127);
            }
            int st = 0;
            if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
                fprintf(stderr, "--plot %s: tools/plot_bench.py failed (%s)\n", r->plot, py);
                rc = 1;
            } else {
                printf("plot written to %s\n", r->plot);
            }
        }
        if (!r->json) unlink(tmpjson);
    }
    free(text);
    cJSON_Delete(r->root);
    return rc;
}

#endif
