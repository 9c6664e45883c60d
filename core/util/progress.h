/* progress.h — progress of a long command on stderr.
 *
 * On a terminal, one line redrawn in place: a bar, "what i/n", items per
 * second and the time left. Otherwise (a pipe, a log file) a plain line at
 * most every `interval` seconds and at the end, so logs stay short. Pure
 * presentation: callers report how far they are, nothing else depends on
 * it. LUAINFER_PROGRESS=0 silences it, =1 forces the terminal form. */
#ifndef LI_PROGRESS_H
#define LI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct li_progress {
    FILE *out;
    const char *label;     /* "quantize", ... */
    const char *unit;      /* what the rate counts: "tensors/s", "tokens/s" */
    int64_t total;
    int64_t done;
    double t0, last;       /* start, last line printed */
    double interval;       /* seconds between plain lines */
    bool tty, quiet;
} li_progress;

void li_progress_init(li_progress *p, const char *label, const char *unit, int64_t total);
/* done items of total so far; `what` names the current one (may be NULL) */
void li_progress_update(li_progress *p, int64_t done, const char *what);
/* the final line (and a newline on a terminal) */
void li_progress_finish(li_progress *p);
/* "1m05s" style, into buf */
const char *li_progress_fmt_secs(double s, char *buf, size_t n);

#endif
