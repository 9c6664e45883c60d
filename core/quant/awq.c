/* awq.c — AWQ, activation-aware weight quantization (Lin et al. 2023,
 * "AWQ: Activation-aware Weight Quantization for LLM Compression and
 * Acceleration", section 3), at the level of one linear layer.
 *
 * The few input channels that carry large activations matter most. AWQ
 * scales them up before quantizing, W' = W diag(s), and divides the inputs
 * by s, so their weights lose relatively less to rounding: s = s_X^a with
 * s_X the mean |x| of each channel, a searched on a grid in [0, 1] for the
 * lowest output error. Then a clipping search shrinks each group's range
 * where that lowers the group's output error. Output errors come from
 * X^T X (the calibration statistics), so the number of rows costs nothing
 * here: ||D X^T||^2 = sum over rows r of D_r (X^T X) D_r^T. */
#include "quant/quant4_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHY(...) (snprintf(why, cap, __VA_ARGS__), -1)

int li_q4_awq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, const li_q4_opts *o,
              li_q4_result *out, char *why, size_t cap) {
    if (!c || !c->finished || c->n_in != n_in)
        return WHY("awq: calibration statistics of width %lld (%s) for a layer of %lld inputs",
                   c ? (long long)c->n_in : 0LL, c && c->finished ? "finished" : "not finished", (long long)n_in);
    if (o->n_grid < 1 || o->n_clip < 0 || o->n_clip > 20)
        return WHY("awq: grid of %d exponents and %d clip steps (need >= 1 and 0..20)", o->n_grid, o->n_clip);
    if (li_q4_result_alloc(out, n_out, n_in, o->group_size, o->symmetric, "awq", why, cap)) return -1;
    const int64_t n = n_in, gs = out->group_size ? out->group_size : n, ng = out->n_groups;
    double *s = malloc((size_t)n * sizeof(double)), *best_s = malloc((size_t)n * sizeof(double));
    const int n_clip = o->clip && o->n_clip > 0 ? o->n_clip : 1;
    /* d: the whole layer's differences (n_out, n), or a group's under every clip step (n_clip, gs) */
    const int64_t nd = n_out * n > n_clip * gs ? n_out * n : n_clip * gs;
    double *ws = malloc((size_t)n * sizeof(double)), *d = malloc((size_t)nd * sizeof(double));
    double *e = malloc((size_t)(n_out > n_clip ? n_out : n_clip) * sizeof(double));
    double *gg = malloc((size_t)(gs * gs) * sizeof(double)), *vc = malloc((size_t)(n_clip * gs) * sizeof(double));
    float *act_scale = malloc((size_t)n * sizeof(float));
    int rc = -1;
    if (!s || !best_s || !ws || !d || !e || !gg || !vc || !act_scale) {
        (void)WHY("awq: out of memory for a %lld x %lld layer", (long long)n_out, (long long)n_in);
        goto done;
    }

    /* ---- the scale search: s = max(mean|x|, 1e-4)^a, kept as the f32 that is stored ---- */
    double best = INFINITY, best_a = 0.0;
    for (int i = 0; i < o->n_grid; i++) {
        const double a = o->n_grid > 1 ? (double)i / (double)(o->n_grid - 1) : 0.0;
        for (int64_t j = 0; j < n; j++) {
            const double m = c->abs_sum[j] / (double)c->n_rows;
            s[j] = (double)(float)pow(m > 1e-4 ? m : 1e-4, a);
        }
        for (int64_t r = 0; r < n_out; r++) {
            const float *wr = w + r * n;
            double *dr = d + r * n;
            for (int64_t j = 0; j < n; j++) ws[j] = (double)wr[j] * s[j];
            for (int64_t g = 0; g < ng; g++) {
                const li_q4_group p = li_q4_group_params(ws + g * gs, gs, 1, o->symmetric);
                for (int64_t j = g * gs; j < (g + 1) * gs; j++)
                    dr[j] = li_q4_value(li_q4_code(ws[j], p), p) / s[j] - (double)wr[j];
            }
        }
        li_q4_quad_forms(c->xtx, n, d, n, n_out, n, e);
        double loss = 0.0;
        for (int64_t r = 0; r < n_out; r++) loss += e[r];
        loss /= (double)c->n_rows;
        if (loss < best) { /* strictly: ties keep the smaller exponent */
            best = loss;
            best_a = a;
            memcpy(best_s, s, (size_t)n * sizeof(double));
        }
    }
    out->alpha = best_a;
    out->loss = best;

    /* ---- the clipping search and the codes, group by group on W diag(s) ---- */
    for (int64_t g = 0; g < ng; g++) {
        const int64_t j0 = g * gs;
        for (int64_t a = 0; a < gs; a++) /* the group's X^T X for the inputs x / s */
            for (int64_t b = 0; b < gs; b++)
                gg[a * gs + b] = c->xtx[(j0 + a) * n + j0 + b] / (best_s[j0 + a] * best_s[j0 + b]);
        for (int64_t r = 0; r < n_out; r++) {
            const float *wr = w + r * n + j0;
            double amax = 0.0;
            for (int64_t j = 0; j < gs; j++) {
                ws[j] = (double)wr[j] * best_s[j0 + j];
                amax = fabs(ws[j]) > amax ? fabs(ws[j]) : amax;
            }
            for (int i = 0; i < n_clip; i++) { /* every shrink of the group, then their errors at once */
                const double m = amax * (1.0 - (double)i / 20.0);
                double *v = vc + i * gs, *di = d + i * gs;
                for (int64_t j = 0; j < gs; j++) v[j] = ws[j] < -m ? -m : ws[j] > m ? m : ws[j];
                const li_q4_group p = li_q4_group_params(v, gs, 1, o->symmetric);
                for (int64_t j = 0; j < gs; j++) di[j] = li_q4_value(li_q4_code(v[j], p), p) - ws[j];
            }
            li_q4_quad_forms(gg, gs, d, gs, n_clip, gs, e);
            int best_i = 0;
            for (int i = 1; i < n_clip; i++) best_i = e[i] < e[best_i] ? i : best_i;
            const double m = amax * (1.0 - (double)best_i / 20.0);
            for (int64_t j = 0; j < gs; j++) vc[j] = ws[j] < -m ? -m : ws[j] > m ? m : ws[j];
            const li_q4_group p = li_q4_group_params(vc, gs, 1, o->symmetric);
            out->scales[r * ng + g] = p.scale;
            if (out->zeros) out->zeros[r * ng + g] = (float)p.zero;
            for (int64_t j = 0; j < gs; j++) out->codes[r * n + j0 + j] = (uint8_t)li_q4_code(vc[j], p);
        }
    }
    for (int64_t j = 0; j < n; j++) act_scale[j] = (float)best_s[j];
    out->act_scale = act_scale;
    act_scale = NULL;
    rc = 0;
done:
    free(s);
    free(best_s);
    free(ws);
    free(d);
    free(e);
    free(gg);
    free(vc);
    free(act_scale);
    if (rc) li_q4_result_free(out);
    return rc;
}
