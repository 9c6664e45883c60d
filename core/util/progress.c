/* progress.c — the progress line (progress.h). */
#define _POSIX_C_SOURCE 200809L
#include "util/progress.h"
#include "util/common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *li_progress_fmt_secs(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return buf;
    }
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
    return buf;
}

void li_progress_init(li_progress *p, const char *label, const char *unit, int64_t total) {
    memset(p, 0, sizeof *p);
    p->out = stderr;
    p->label = label;
    p->unit = unit;
    p->total = total > 0 ? total : 1;
    p->t0 = p->last = li_time_now();
    p->interval = 5.0;
    const char *env = getenv("LUAINFER_PROGRESS");
    p->quiet = env && !strcmp(env, "0");
    p->tty = env && !strcmp(env, "1") ? true : isatty(fileno(p->out));
}

static void print_line(li_progress *p, const char *what, bool final) {
    const double el = li_time_now() - p->t0;
    const double rate = el > 0 ? (double)p->done / el : 0;
    const double left = rate > 0 ? (double)(p->total - p->done) / rate : -1;
    char eta[16], ela[16];
    li_progress_fmt_secs(final ? el : left, eta, sizeof eta);
    li_progress_fmt_secs(el, ela, sizeof ela);
    const int pct = (int)(100 * p->done / p->total);
    if (p->tty) {
        char bar[31];
        const int fill = (int)(30 * p->done / p->total);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(p->out, "\r%s [%s] %3d%% %lld/%lld %-24.24s %7.1f %s %s %s\033[K", p->label, bar, pct,
                (long long)p->done, (long long)p->total, what ? what : "", rate, p->unit, final ? "took" : "ETA",
                eta);
        if (final) fputc('\n', p->out);
    } else {
        fprintf(p->out, "%s: %lld/%lld (%d%%) %s%s%.1f %s, %s %s\n", p->label, (long long)p->done,
                (long long)p->total, pct, what ? what : "", what ? ", " : "", rate, p->unit,
                final ? "took" : "ETA", final ? ela : eta);
    }
    fflush(p->out);
}

void li_progress_update(li_progress *p, int64_t done, const char *what) {
    p->done = LI_MIN(done, p->total);
    if (p->quiet) return;
    const double now = li_time_now();
    if (p->tty ? now - p->last < 0.1 : now - p->last < p->interval) return;
    p->last = now;
    print_line(p, what, false);
}

void li_progress_finish(li_progress *p) {
    if (p->quiet) return;
    p->done = p->total;
    print_line(p, NULL, true);
}
