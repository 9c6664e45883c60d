/* common.c — errors, logging, allocation and clock helpers. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

int li_error_set(li_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

static int log_level = -1;

static int log_level_get(void) {
    if (log_level < 0) {
        const char *s = getenv("LUAINFER_LOG");
        log_level = LI_LOG_WARN;
        if (s) {
            if (!strcmp(s, "error")) log_level = LI_LOG_ERROR;
            else if (!strcmp(s, "info")) log_level = LI_LOG_INFO;
            else if (!strcmp(s, "debug")) log_level = LI_LOG_DEBUG;
        }
    }
    return log_level;
}

void li_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > log_level_get()) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "luainfer: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void oom(size_t n) {
    fprintf(stderr, "luainfer: out of memory allocating %zu bytes\n", n);
    abort();
}

void *li_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *li_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *li_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

void *li_aligned_try_alloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) != 0 ? NULL : p;
}

void *li_aligned_alloc(size_t n) {
    void *p = li_aligned_try_alloc(n);
    if (!p) oom(n);
    return p;
}

void li_aligned_free(void *p) { free(p); }

double li_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int li_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *len, li_error *err) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return li_error_set(err, LI_EIO, "cannot open %s '%s': %s", what, path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = li_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > max_bytes) {
                free(buf);
                fclose(f);
                return li_error_set(err, LI_ERANGE, "%s '%s' is larger than %zu bytes", what, path, max_bytes);
            }
            cap *= 2;
            buf = li_xrealloc(buf, cap);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    const int e = errno; /* a directory opens, and its read fails: EISDIR */
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return li_error_set(err, LI_EIO, "cannot read %s '%s': %s", what, path, strerror(e));
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int li_threads_or_cpus(int64_t threads) {
    if (threads > 0) return (int)threads;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void li_run_workers(void *(*fn)(void *), void *arg, int64_t n) {
    pthread_t *th = n > 1 ? li_xmalloc((size_t)(n - 1) * sizeof *th) : NULL;
    int64_t started = 0;
    li_thread_signals_begin();
    for (; started < n - 1; started++)
        if (pthread_create(&th[started], NULL, fn, arg)) break;
    li_thread_signals_end();
    fn(arg); /* the calling thread is the last worker */
    for (int64_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
}

static _Thread_local sigset_t g_saved_mask; /* the caller's mask between begin() and end() */

void li_thread_signals_begin(void) {
    static const int async[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGWINCH};
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof async / sizeof async[0]; i++) sigaddset(&set, async[i]);
    pthread_sigmask(SIG_BLOCK, &set, &g_saved_mask);
}

void li_thread_signals_end(void) {
    pthread_sigmask(SIG_SETMASK, &g_saved_mask, NULL);
}
