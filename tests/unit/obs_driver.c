/* obs_driver.c — runs li_prune_obs (core/prune/prune_obs.c) on a layer read
 * from a file, for tests/integration/test_prune_obs.py (the NumPy reference).
 *
 *   obs_driver IN OUT
 *
 * IN: int64 d_out, n, n_rows, width, k, choose; f64 damp; W f32 (d_out, n);
 * X f32 (n_rows, n); drop u8 (n / width: the units to remove when choose
 * is 0), little-endian. X^T X is accumulated as prune does
 * (li_q4_calib_accumulate), in uneven chunks of 7 rows.
 * OUT: W f64 (d_out, n) after the refit; drop u8 (units); score f64
 * (units). Exit 1 with a one-line error.
 *
 *   obs_driver curve IN OUT   (li_prune_ffn_curve, prune_alloc.c)
 *
 * IN: int64 d, n, n_rows; f64 damp; W f32 (d, n); X f32 (n_rows, n); score
 * f64 (n). OUT: the curve, f64 (n + 1).
 *
 *   obs_driver allocate IN OUT   (li_prune_ffn_allocate)
 *
 * IN: int64 n_layer, n, unit, floor, remove; sig f64 (n_layer); curves f64
 * (n_layer, n + 1). OUT: keep int64 (n_layer). */
#include "prune/prune.h"
#include "quant/quant4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *msg) {
    fprintf(stderr, "obs_driver: %s\n", msg);
    return 1;
}

/* W f32 (d, n) then X f32 (rows, n) from f: W widened to *w (malloc'd), X's
 * X^T X accumulated as prune does (li_q4_calib_accumulate, in uneven chunks
 * of 7 rows) into c. NULL on success, else the message. */
static const char *read_layer(FILE *f, int64_t d, int64_t n, int64_t rows, double **w, li_q4_calib *c) {
    static char why[160];
    float *wf = malloc((size_t)(d * n) * sizeof(float)), *x = malloc((size_t)(rows * n + 1) * sizeof(float));
    *w = malloc((size_t)(d * n) * sizeof(double));
    if (!wf || !x || !*w) return "out of memory";
    if (fread(wf, sizeof(float), (size_t)(d * n), f) != (size_t)(d * n) ||
        fread(x, sizeof(float), (size_t)(rows * n), f) != (size_t)(rows * n))
        return "short input";
    for (int64_t i = 0; i < d * n; i++) (*w)[i] = wf[i];
    const char *bad = NULL;
    if (li_q4_calib_init(c, n, why, sizeof why)) bad = why;
    for (int64_t r = 0; r < rows && !bad; r += 7) li_q4_calib_accumulate(c, x + r * n, rows - r < 7 ? rows - r : 7);
    if (!bad && li_q4_calib_finish(c, why, sizeof why)) bad = why;
    free(wf), free(x);
    return bad;
}

static int curve_main(const char *in, const char *out) {
    FILE *f = fopen(in, "rb");
    if (!f) return fail("cannot open the input");
    int64_t h[3];
    double damp;
    if (fread(h, sizeof h, 1, f) != 1 || fread(&damp, sizeof damp, 1, f) != 1) return fail("short header");
    const int64_t d = h[0], n = h[1], rows = h[2];
    if (d <= 0 || n <= 0 || rows < 0 || d > 1 << 14 || n > 1 << 14 || rows > 1 << 20) return fail("bad header");
    double *w, *score = malloc((size_t)n * sizeof(double)), *curve = malloc((size_t)(n + 1) * sizeof(double));
    li_q4_calib c;
    const char *bad = read_layer(f, d, n, rows, &w, &c);
    if (bad) return fail(bad);
    if (!score || !curve) return fail("out of memory");
    if (fread(score, sizeof(double), (size_t)n, f) != (size_t)n) return fail("short input");
    fclose(f);
    li_error err = {0};
    if (li_prune_ffn_curve(c.xtx, w, d, n, score, damp, curve, &err)) return fail(err.msg);
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(curve, sizeof(double), (size_t)(n + 1), o) != (size_t)(n + 1) || fclose(o))
        return fail("cannot write the output");
    li_q4_calib_free(&c);
    free(w), free(score), free(curve);
    return 0;
}

static int allocate_main(const char *in, const char *out) {
    FILE *f = fopen(in, "rb");
    if (!f) return fail("cannot open the input");
    int64_t h[5];
    if (fread(h, sizeof h, 1, f) != 1) return fail("short header");
    const int64_t nl = h[0], n = h[1];
    if (nl <= 0 || nl > 1024 || n <= 0 || n > 1 << 16) return fail("bad header");
    double *sig = malloc((size_t)nl * sizeof(double)), *all = malloc((size_t)(nl * (n + 1)) * sizeof(double));
    double **curve = malloc((size_t)nl * sizeof *curve);
    int64_t *keep = malloc((size_t)nl * sizeof *keep);
    if (!sig || !all || !curve || !keep) return fail("out of memory");
    if (fread(sig, sizeof(double), (size_t)nl, f) != (size_t)nl ||
        fread(all, sizeof(double), (size_t)(nl * (n + 1)), f) != (size_t)(nl * (n + 1)))
        return fail("short input");
    fclose(f);
    for (int64_t l = 0; l < nl; l++) curve[l] = all + l * (n + 1);
    li_error err = {0};
    if (li_prune_ffn_allocate((const double *const *)curve, sig, (int)nl, n, h[2], h[3], h[4], keep, &err))
        return fail(err.msg);
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(keep, sizeof(int64_t), (size_t)nl, o) != (size_t)nl || fclose(o))
        return fail("cannot write the output");
    free(sig), free(all), free(curve), free(keep);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "curve")) return curve_main(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "allocate")) return allocate_main(argv[2], argv[3]);
    if (argc != 3) return fail("usage: obs_driver [curve|allocate] IN OUT");
    FILE *f = fopen(argv[1], "rb");
    if (!f) return fail("cannot open the input");
    int64_t h[6];
    double damp;
    if (fread(h, sizeof h, 1, f) != 1 || fread(&damp, sizeof damp, 1, f) != 1) return fail("short header");
    const int64_t d = h[0], n = h[1], rows = h[2], width = h[3], k = h[4];
    if (d <= 0 || n <= 0 || rows < 0 || width <= 0 || d > 1 << 14 || n > 1 << 14 || rows > 1 << 20)
        return fail("bad header");
    const int64_t units = n / width > 0 ? n / width : 1; /* li_prune_obs refuses a partial unit */
    uint8_t *drop = malloc((size_t)units);
    double *w, *score = malloc((size_t)units * sizeof(double));
    li_q4_calib c;
    const char *bad = read_layer(f, d, n, rows, &w, &c);
    if (bad) return fail(bad);
    if (!drop || !score) return fail("out of memory");
    if (fread(drop, 1, (size_t)units, f) != (size_t)units) return fail("short input");
    fclose(f);
    li_error err = {0};
    if (li_prune_obs(w, d, n, c.xtx, width, k, damp, h[5] != 0, drop, score, &err)) return fail(err.msg);
    FILE *o = fopen(argv[2], "wb");
    if (!o || fwrite(w, sizeof(double), (size_t)(d * n), o) != (size_t)(d * n) ||
        fwrite(drop, 1, (size_t)units, o) != (size_t)units ||
        fwrite(score, sizeof(double), (size_t)units, o) != (size_t)units || fclose(o))
        return fail("cannot write the output");
    li_q4_calib_free(&c);
    free(drop), free(w), free(score);
    return 0;
}
