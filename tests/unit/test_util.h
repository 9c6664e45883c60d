/* test_util.h — a tiny assertion harness for the C unit tests: CHECK
 * records a failure and goes on; the summary line is what runners read. */
#ifndef LI_TEST_UTIL_H
#define LI_TEST_UTIL_H

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

#endif
