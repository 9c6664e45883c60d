/* common.h — error reporting, logging and small helpers shared by every
 * subsystem. Errors travel in an `li_error *` out-parameter (Neovim's
 * `Error *err` habit): a function returns 0 on success or a negative code and
 * fills the message, so callers can print one clear line. */
#ifndef LI_COMMON_H
#define LI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum {
    LI_OK = 0,
    LI_EINVAL = -1,   /* bad argument or malformed input */
    LI_EIO = -2,      /* file or socket I/O */
    LI_ENOMEM = -3,   /* allocation failed or budget exhausted */
    LI_ERANGE = -4,   /* a value out of its allowed range */
    LI_EUNSUP = -5,   /* valid input we do not implement */
    LI_EREJECTED = -6, /* a request the policy's admit hook refused */
};

typedef struct li_error {
    int code;
    char msg[512];
} li_error;

#if defined(__GNUC__)
#define LI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LI_PRINTF(a, b)
#endif

/* Sets err (if non-NULL) and returns code, so `return li_error_set(...)`. */
int li_error_set(li_error *err, int code, const char *fmt, ...) LI_PRINTF(3, 4);

/* Logging to stderr; level from LUAINFER_LOG (error, warn, info, debug). */
enum { LI_LOG_ERROR, LI_LOG_WARN, LI_LOG_INFO, LI_LOG_DEBUG };
void li_log(int level, const char *fmt, ...) LI_PRINTF(2, 3);
#define li_log_error(...) li_log(LI_LOG_ERROR, __VA_ARGS__)
#define li_log_warn(...) li_log(LI_LOG_WARN, __VA_ARGS__)
#define li_log_info(...) li_log(LI_LOG_INFO, __VA_ARGS__)
#define li_log_debug(...) li_log(LI_LOG_DEBUG, __VA_ARGS__)

/* Allocation that aborts with a message on failure: for sizes we control.
 * Sizes derived from outside input must be checked before calling. */
void *li_xmalloc(size_t n);
void *li_xcalloc(size_t n, size_t size);
void *li_xrealloc(void *p, size_t n);
/* 64-byte aligned, for SIMD buffers; release with li_aligned_free. The
 * _try form returns NULL instead of aborting (a size the caller reports). */
void *li_aligned_alloc(size_t n);
void *li_aligned_try_alloc(size_t n);
void li_aligned_free(void *p);

/* Reads a whole file into a NUL-terminated malloc'd buffer; files over
 * max_bytes are refused (LI_ERANGE). `what` names the file in messages
 * ("policy file", "text file"). */
int li_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *len, li_error *err);

/* Monotonic clock in seconds. */
double li_time_now(void);

/* fn(arg) on this thread and on up to n - 1 more started for the call
 * (fewer when a start fails), joined before it returns. The workers share
 * arg and take their tasks from it (an atomic counter), so what they
 * compute must not depend on how many run. The offline tools' (quantize,
 * prune) per-layer and per-alpha tasks; serving uses the backend's pool. */
void li_run_workers(void *(*fn)(void *), void *arg, int64_t n);
/* A --threads option's value: threads when > 0, else the CPUs online
 * (at least 1) */
int li_threads_or_cpus(int64_t threads);

/* Around the creation of any thread but the main one: begin() blocks the
 * asynchronous signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM,
 * SIGCHLD, SIGWINCH) in the calling thread, so the new thread inherits the
 * mask; end() gives the caller its mask back. A signal sent to the process
 * (Ctrl-C, kill, libedit re-raising one with kill(0, sig)) then reaches the
 * main thread, whose blocking read() or poll() it is meant to interrupt,
 * never a worker that would only set a flag nobody is waiting on. */
void li_thread_signals_begin(void);
void li_thread_signals_end(void);

/* Dense double/float loops built twice, for AVX2 and plain x86-64, the one
 * run chosen at load time by CPUID (GCC's ifunc clones). Both give the same
 * bits: ISO C mode contracts no multiply-add into an FMA, and vectorizing
 * changes no element's order of operations (the files using it are built
 * with -ftree-vectorize, CMakeLists.txt). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(LI_NO_CLONES)
#define LI_HOT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LI_HOT_CLONES
#endif

#define LI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LI_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Overflow-checked size arithmetic for values read from files. */
static inline bool li_mul_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool li_add_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}

#endif
