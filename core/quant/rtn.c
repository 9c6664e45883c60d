/* rtn.c — RTN4 and W4A4, and what every 4-bit method shares: options,
 * results (allocation, dequantization, the li_weight view) and the output
 * error a method is judged by. GPTQ and its calibration statistics are in
 * gptq.c, AWQ in awq.c. */
#include "quant/quant4_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHY(...) (snprintf(why, cap, __VA_ARGS__), -1)

/* ------------------------------------------------------------------------
 * options and results
 * ---------------------------------------------------------------------- */

void li_q4_opts_default(li_q4_opts *o) {
    *o = (li_q4_opts){.group_size = 128, .damp = 0.01, .block_size = 128, .n_grid = 20, .clip = true,
                      .n_clip = 10};
}

void li_q4_result_free(li_q4_result *r) {
    if (!r) return;
    free(r->codes);
    free(r->scales);
    free(r->zeros);
    free(r->perm);
    free(r->act_scale);
    memset(r, 0, sizeof *r);
}

int li_q4_result_alloc(li_q4_result *out, int64_t n_out, int64_t n_in, int64_t group_size, bool symmetric,
                       const char *method, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    if (n_out <= 0 || n_in <= 0) return WHY("%s: bad weight shape (%lld, %lld)", method, (long long)n_out,
                                            (long long)n_in);
    if (n_in % 2) return WHY("%s: rows of %lld elements: 4-bit codes pack two per byte, rows must be even", method,
                             (long long)n_in);
    if (group_size < 0 || (group_size > 0 && n_in % group_size))
        return WHY("%s: group size %lld does not divide a row of %lld", method, (long long)group_size,
                   (long long)n_in);
    if (group_size % 2) return WHY("%s: group size %lld is odd (4-bit codes pack two per byte)", method,
                                   (long long)group_size);
    out->n_out = n_out;
    out->n_in = n_in;
    out->group_size = group_size == n_in ? 0 : group_size;
    out->n_groups = out->group_size ? n_in / out->group_size : 1;
    out->codes = malloc((size_t)(n_out * n_in));
    out->scales = malloc((size_t)(n_out * out->n_groups) * sizeof(float));
    out->zeros = symmetric ? NULL : malloc((size_t)(n_out * out->n_groups) * sizeof(float));
    if (!out->codes || !out->scales || (!symmetric && !out->zeros)) {
        li_q4_result_free(out);
        return WHY("%s: out of memory for a (%lld, %lld) result", method, (long long)n_out, (long long)n_in);
    }
    return 0;
}

void li_q4_result_dequant(const li_q4_result *r, float *w) {
    const int64_t gs = r->group_size ? r->group_size : r->n_in;
    for (int64_t i = 0; i < r->n_out; i++)
        for (int64_t j = 0; j < r->n_in; j++) {
            const int64_t g = i * r->n_groups + j / gs, c = r->perm ? r->perm[j] : j;
            const li_q4_group p = {r->scales[g], r->zeros ? r->zeros[g] : 8.0};
            double v = li_q4_value(r->codes[i * r->n_in + j], p);
            if (r->act_scale) v /= (double)r->act_scale[c];
            w[i * r->n_in + c] = (float)v;
        }
}

int li_q4_weight_view(const li_q4_result *r, li_scheme scheme, li_act_quant act, uint8_t *packed, li_weight *w,
                      char *why, size_t cap) {
    const li_scheme_traits *s = li_scheme_info(scheme);
    if (!s || s->codes != LI_TYPE_U4) return WHY("q4: scheme %s does not store 4-bit codes", li_scheme_name(scheme));
    if (!!r->zeros != s->zeros)
        return WHY("q4: scheme %s is %s, the result is %s", s->name, s->zeros ? "asymmetric" : "symmetric",
                   r->zeros ? "asymmetric" : "symmetric");
    if (r->perm && !s->perm) return WHY("q4: scheme %s has no column permutation (act-order needs gptq)", s->name);
    for (int64_t i = 0; i < r->n_out; i++) {
        const uint8_t *c = r->codes + i * r->n_in;
        uint8_t *p = packed + i * (r->n_in / 2);
        for (int64_t j = 0; j < r->n_in / 2; j++) p[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
    }
    *w = (li_weight){.type = LI_TYPE_U4, .k = r->n_in, .m = r->n_out, .row_bytes = (size_t)(r->n_in / 2),
                     .data = packed, .scheme = scheme, .act = act, .group_size = r->group_size,
                     .scales = r->scales, .zeros = r->zeros, .perm = r->perm};
    return li_weight_check(w, why, cap) ? -1 : 0;
}

/* G d for 8 rows at once, G's columns in tiles of QF_TILE so the 8 partial
 * results of a tile stay in L1 while every row of G passes by; each
 * element of t sums over a in order, whatever the tiling. */
#define QF_TILE 256

LI_HOT_CLONES void li_q4_quad_forms(const double *g, int64_t ldg, const double *d, int64_t ldd, int64_t m,
                                int64_t n, double *out) {
    double t[8][QF_TILE];
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
        const int nr = m - r0 < 8 ? (int)(m - r0) : 8;
        const double *dr[8];
        for (int i = 0; i < 8; i++) dr[i] = d + (r0 + (i < nr ? i : 0)) * ldd; /* a short group repeats row 0 */
        double acc[8] = {0};
        for (int64_t b0 = 0; b0 < n; b0 += QF_TILE) {
            const int64_t nb = n - b0 < QF_TILE ? n - b0 : QF_TILE;
            memset(t, 0, sizeof t);
            for (int64_t a = 0; a < n; a++) {
                const double *ga = g + a * ldg + b0;
                const double c0 = dr[0][a], c1 = dr[1][a], c2 = dr[2][a], c3 = dr[3][a], c4 = dr[4][a],
                             c5 = dr[5][a], c6 = dr[6][a], c7 = dr[7][a];
                for (int64_t b = 0; b < nb; b++) {
                    const double v = ga[b];
                    t[0][b] += c0 * v;
                    t[1][b] += c1 * v;
                    t[2][b] += c2 * v;
                    t[3][b] += c3 * v;
                    t[4][b] += c4 * v;
                    t[5][b] += c5 * v;
                    t[6][b] += c6 * v;
                    t[7][b] += c7 * v;
                }
            }
            for (int i = 0; i < nr; i++)
                for (int64_t b = 0; b < nb; b++) acc[i] += dr[i][b0 + b] * t[i][b];
        }
        for (int i = 0; i < nr; i++) out[r0 + i] = acc[i];
    }
}

double li_q4_output_error(const float *w, const li_q4_result *r, const li_q4_calib *c) {
    const int64_t n = r->n_in;
    float *wq = malloc((size_t)(r->n_out * n) * sizeof(float));
    double *d = malloc((size_t)(r->n_out * n) * sizeof(double)), *e = malloc((size_t)r->n_out * sizeof(double));
    if (!wq || !d || !e) abort(); /* a test / tool helper on one layer */
    li_q4_result_dequant(r, wq);
    for (int64_t i = 0; i < r->n_out * n; i++) d[i] = (double)wq[i] - (double)w[i];
    li_q4_quad_forms(c->xtx, n, d, n, r->n_out, n, e);
    double total = 0.0;
    for (int64_t i = 0; i < r->n_out; i++) total += e[i];
    free(wq);
    free(d);
    free(e);
    return total / (double)c->n_rows;
}

/* ------------------------------------------------------------------------
 * RTN4 and W4A4
 * ---------------------------------------------------------------------- */

int li_q4_rtn(const float *w, int64_t n_out, int64_t n_in, const li_q4_opts *o, li_q4_result *out, char *why,
              size_t cap) {
    if (li_q4_result_alloc(out, n_out, n_in, o->group_size, o->symmetric, "rtn4", why, cap)) return -1;
    const int64_t gs = out->group_size ? out->group_size : n_in;
    double *v = malloc((size_t)gs * sizeof(double));
    if (!v) {
        li_q4_result_free(out);
        return WHY("rtn4: out of memory");
    }
    for (int64_t i = 0; i < n_out; i++)
        for (int64_t g = 0; g < out->n_groups; g++) {
            const float *src = w + i * n_in + g * gs;
            for (int64_t j = 0; j < gs; j++) v[j] = src[j];
            const li_q4_group p = li_q4_group_params(v, gs, 1, o->symmetric);
            out->scales[i * out->n_groups + g] = p.scale;
            if (out->zeros) out->zeros[i * out->n_groups + g] = (float)p.zero;
            for (int64_t j = 0; j < gs; j++) out->codes[i * n_in + g * gs + j] = (uint8_t)li_q4_code(v[j], p);
        }
    free(v);
    return 0;
}

int li_q4_w4a4(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, double damp, li_q4_result *out,
               char *why, size_t cap) {
    li_q4_opts o;
    li_q4_opts_default(&o);
    o.group_size = 0;
    o.symmetric = true;
    o.damp = damp;
    if (c ? li_q4_gptq(w, n_out, n_in, c, &o, out, why, cap) : li_q4_rtn(w, n_out, n_in, &o, out, why, cap)) return -1;
    out->act = LI_ACT_INT4;
    return 0;
}
