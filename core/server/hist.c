/* hist.c — cumulative histograms with fixed buckets (Prometheus style). */
#include "server/hist.h"

#include <stdlib.h>
#include <string.h>

void li_hist_init(li_hist *h, const double *le, int n) {
    h->n = n;
    h->le = le;
    h->count = li_xcalloc((size_t)n + 1, sizeof *h->count);
    h->sum = 0;
    h->total = 0;
}

void li_hist_free(li_hist *h) {
    free(h->count);
    h->count = NULL;
}

void li_hist_add(li_hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

void li_hist_copy(li_hist *dst, const li_hist *src) {
    memcpy(dst->count, src->count, ((size_t)src->n + 1) * sizeof *src->count);
    dst->sum = src->sum;
    dst->total = src->total;
}
