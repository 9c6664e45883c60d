/* hist.h — latency histograms for the server's metrics and the engine
 * thread's step times. */
#ifndef LI_SERVER_HIST_H
#define LI_SERVER_HIST_H

#include "util/common.h"

typedef struct li_hist {
    int n;                  /* buckets */
    const double *le;       /* (n) upper bounds, seconds */
    uint64_t *count;        /* (n + 1): the last is +Inf */
    double sum;
    uint64_t total;
} li_hist;

void li_hist_init(li_hist *h, const double *le, int n);
void li_hist_free(li_hist *h);
void li_hist_add(li_hist *h, double v);
void li_hist_copy(li_hist *dst, const li_hist *src); /* dst initialised with the same buckets */

#endif
