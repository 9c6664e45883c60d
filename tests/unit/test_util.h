/* test_util.h — the helpers the C unit tests share:
 *
 *   CHECK(cond, fmt, ...)   count a pass, or count a failure and print
 *                           "FAIL file:line: cond: message" to stderr
 *   report(ok, fmt, ...)    one "ok   ..." / "FAIL ..." line on stdout per
 *                           check (the kernel tests' style), counted the same
 *   t_summary(suite)        "suite: N passed, M failed"; the exit code
 *   rng_seed / rng_u32 / rng_f
 *                           a seeded xorshift64 (default seed
 *                           0x9e3779b97f4a7c15); rng_f is uniform in [-1, 1)
 *   nmse(got, want, n)      normalized mean squared error of got against
 *                           want (infinity when got has a NaN)
 *
 * Everything is static, so each test program has its own counters and
 * generator. A test that skips returns 77 from main (ctest's
 * SKIP_RETURN_CODE). */
#ifndef LI_TEST_UTIL_H
#define LI_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int t_passed, t_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            t_passed++;                                                    \
        } else {                                                           \
            t_failed++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static inline int t_summary(const char *suite) {
    printf("%s: %d passed, %d failed\n", suite, t_passed, t_failed);
    return t_failed ? 1 : 0;
}

static inline void report(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void report(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    if (ok) t_passed++;
    else t_failed++;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline void rng_seed(uint64_t seed) { rng_state = seed; }

static inline uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [-1, 1) */
static inline float rng_f(void) { return (float)rng_u32() / 2147483648.0f - 1.0f; }

/* normalized mean squared error of got against want */
static inline double nmse(const float *got, const float *want, int64_t n) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)got[i] - (double)want[i];
        err += d * d;
        ref += (double)want[i] * want[i];
    }
    if (err != err) return INFINITY; /* nan */
    return ref > 0 ? err / ref : err;
}

/* each row of x(n, dim)'s k largest, sorted by value descending then id
 * ascending (-0 == +0), by a full sort: the reference for backend.h's topk;
 * a row holding a NaN gets ids[0] = -1 */
typedef struct {
    float v;
    int32_t id;
} t_vid;

static inline int t_vid_desc(const void *a, const void *b) {
    const t_vid *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static inline void t_topk_ref(const float *x, int64_t n, int64_t dim, int k, float *vals, int32_t *ids) {
    t_vid *row = malloc((size_t)dim * sizeof *row);
    for (int64_t i = 0; i < n; i++) {
        bool nan = false;
        for (int64_t j = 0; j < dim; j++) {
            row[j] = (t_vid){x[i * dim + j], (int32_t)j};
            nan |= row[j].v != row[j].v;
        }
        if (!nan) qsort(row, (size_t)dim, sizeof *row, t_vid_desc);
        for (int j = 0; j < k; j++) {
            vals[i * k + j] = row[j].v;
            ids[i * k + j] = row[j].id;
        }
        if (nan) ids[i * k] = -1;
    }
    free(row);
}

#endif
