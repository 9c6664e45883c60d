/* test_weight.h — an in-memory weight of any GGUF type for the kernel
 * tests: m rows of k values from a caller's row generator, quantized with
 * the type's reference from_float. */
#ifndef LI_TEST_WEIGHT_H
#define LI_TEST_WEIGHT_H

#include "util/common.h"
#include "backend.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    li_weight w;
    void *data;
} test_weight;

/* fill_row(row, k): the float values of one row before quantization */
static inline void test_weight_make(test_weight *tw, li_type t, int64_t k, int64_t m,
                                    void (*fill_row)(float *row, int64_t k)) {
    memset(tw, 0, sizeof *tw);
    tw->w.type = t;
    tw->w.k = k;
    tw->w.m = m;
    li_type_row_size(t, k, &tw->w.row_bytes);
    tw->data = li_aligned_alloc(tw->w.row_bytes * (size_t)m);
    float *row = li_xmalloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < m; i++) {
        fill_row(row, k);
        li_type_get(t)->from_float(row, (char *)tw->data + i * tw->w.row_bytes, k);
    }
    free(row);
    tw->w.data = tw->data;
}

static inline void test_weight_free(test_weight *tw) { li_aligned_free(tw->data); }

#endif
