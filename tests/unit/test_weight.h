/* test_weight.h — an in-memory weight of any GGUF type for the kernel
 * tests: m rows of k values from a caller's row generator, quantized with
 * the type's reference from_float; or a scheme weight (W8A8, FP8, AWQ,
 * GPTQ, INT4: types.h) with random codes, scales, zero points and
 * permutation. */
#ifndef LI_TEST_WEIGHT_H
#define LI_TEST_WEIGHT_H

#include "util/common.h"
#include "backend.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    li_weight w;
    void *data;
    float *scales, *zeros; /* scheme weights: (m, n_groups), or NULL */
    int32_t *perm;         /* scheme weights: (k), or NULL */
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

/* A scheme weight of m rows of k: every code drawn by rand_u32() % 16 (u4)
 * or over the whole code range, scales in [0.5, 1.5) / 64 (uniform(): a
 * caller's [0, 1) generator), zero points in [0, 15) when zeros, and a
 * random permutation of 0..k-1 when perm. group_size 0 = per channel. */
static inline void test_weight_scheme(test_weight *tw, li_scheme scheme, int64_t k, int64_t m, int64_t group_size,
                                      bool zeros, bool perm, uint32_t (*rand_u32)(void)) {
    const li_scheme_traits *st = li_scheme_info(scheme);
    memset(tw, 0, sizeof *tw);
    tw->w.type = st->codes;
    tw->w.k = k;
    tw->w.m = m;
    tw->w.scheme = scheme;
    tw->w.act = st->act;
    tw->w.group_size = group_size;
    li_type_row_size(st->codes, k, &tw->w.row_bytes);
    const size_t bytes = tw->w.row_bytes * (size_t)m;
    tw->data = li_aligned_alloc(bytes);
    uint8_t *d = tw->data;
    for (size_t i = 0; i < bytes; i++) {
        uint8_t c = (uint8_t)rand_u32();
        if (st->codes == LI_KV_TYPE_FP8_E4M3 && (c & 0x7f) == 0x7f) c ^= 1; /* no NaN codes */
        if (st->codes == LI_KV_TYPE_INT8 && c == 0x80) c = 0x81;         /* int8 codes are -127..127 */
        d[i] = c;
    }
    const int64_t ng = li_weight_n_groups(&tw->w);
    tw->scales = li_xmalloc((size_t)(m * ng) * sizeof(float));
    for (int64_t i = 0; i < m * ng; i++) tw->scales[i] = (0.5f + (float)(rand_u32() % 1024) / 1024.0f) / 64.0f;
    if (zeros) {
        tw->zeros = li_xmalloc((size_t)(m * ng) * sizeof(float));
        for (int64_t i = 0; i < m * ng; i++) tw->zeros[i] = (float)(rand_u32() % 1500) / 100.0f;
    }
    if (perm) { /* Fisher-Yates */
        tw->perm = li_xmalloc((size_t)k * sizeof(int32_t));
        for (int64_t j = 0; j < k; j++) tw->perm[j] = (int32_t)j;
        for (int64_t j = k - 1; j > 0; j--) {
            const int64_t r = (int64_t)(rand_u32() % (uint32_t)(j + 1));
            const int32_t t = tw->perm[j];
            tw->perm[j] = tw->perm[r];
            tw->perm[r] = t;
        }
    }
    tw->w.data = tw->data;
    tw->w.scales = tw->scales;
    tw->w.zeros = tw->zeros;
    tw->w.perm = tw->perm;
}

static inline void test_weight_free(test_weight *tw) {
    li_aligned_free(tw->data);
    free(tw->scales);
    free(tw->zeros);
    free(tw->perm);
}

#endif
