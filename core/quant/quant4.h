/* quant4.h — the 4-bit weight quantizers: RTN4, GPTQ, AWQ and W4A4.
 *
 * Pure functions on f32 matrices: no model, no engine, no backend. The
 * `luainfer quantize` tool (core/quant/, the other half of issue 14) feeds
 * them one layer at a time and writes what they return into a GGUF file;
 * li_q4_weight_view turns a result into the li_weight the CPU backend runs.
 *
 * Shapes. A weight W is (n_out, n_in) row-major f32: y = W x. Calibration
 * rows X are (n_rows, n_in): the layer's inputs, one token per row.
 *
 * What a result means (the li_weight scheme convention, kernels/types.h):
 * stored column j of row r holds code q(r, j) in 0..15 for input column
 * perm ? perm[j] : j, in group g = j / group_size (stored order), and
 *
 *   Wq[r][perm ? perm[j] : j] = (q(r, j) - zero[r][g]) * scale[r][g] / s[c]
 *
 * with zero[r][g] = 8 for a symmetric result (zeros NULL) and s the AWQ
 * per-input-channel scale (act_scale; 1 when NULL). AWQ quantizes
 * W diag(s); running it means multiplying by x / s, so whoever writes the
 * model folds 1/s into what produces x (an RMSNorm weight, or the rows of
 * the linear layer before: v_proj for o_proj, up_proj for down_proj).
 *
 * Rounding: everything is computed in double; codes are round-half-even of
 * w / scale with the f32 scale that is stored (so dequantizing the stored
 * values reproduces what the error feedback saw), clamped to 0..15.
 *
 * Errors: every function that can fail returns 0, or -1 with a one-line
 * reason in why (cap bytes): a group that does not divide n_in, an odd n_in,
 * a shape that does not match, a Hessian that is not positive definite
 * after damping, out of memory. */
#ifndef LI_QUANT4_H
#define LI_QUANT4_H

#include "backend.h" /* li_weight, li_scheme, li_act_quant */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* y[0..n) += c0 x0 + c1 x1 + c2 x2 + c3 x3, each element's four terms
 * added in that order (so a blocked loop keeps its plain loop's bits; no
 * multiply-add fused in ISO C mode); inlined into the caller's ISA clone.
 * gptq.c's Gram and prune_alloc.c's curve product take four rows a time. */
static inline __attribute__((always_inline)) void li_axpy4_f64(double *y, int64_t n, const double *x0, const double *x1,
                                                               const double *x2, const double *x3, double c0,
                                                               double c1, double c2, double c3) {
    for (int64_t r = 0; r < n; r++) {
        double s = y[r];
        s += c0 * x0[r];
        s += c1 * x1[r];
        s += c2 * x2[r];
        s += c3 * x3[r];
        y[r] = s;
    }
}

/* ------------------------------------------------------------------------
 * options
 * ---------------------------------------------------------------------- */

typedef struct li_q4_opts {
    int64_t group_size;  /* elements along n_in per group (128), dividing n_in (SmolLM2's rows of 576
                          * take 64, not 128); 0 = one group per row (per channel) */
    bool symmetric;      /* zero fixed at 8, scale = max|w| / 7; else asymmetric with zero points */
    /* ---- GPTQ ---- */
    double damp;         /* added to diag(H): damp * mean(diag(H)) (0.01) */
    int64_t block_size;  /* lazy-batch width in columns (128), rounded to whole groups: the same
                          * values in exact arithmetic (only f64 rounding can differ) */
    bool act_order;      /* columns by decreasing diag(H); groups follow the permuted order */
    /* ---- AWQ ---- */
    int n_grid;          /* exponent grid: a = i / (n_grid - 1), i = 0 .. n_grid-1 (20) */
    bool clip;           /* per-(row, group) clipping search after the scale search (true) */
    int n_clip;          /* clip grid: max|w| * (1 - i / 20), i = 0 .. n_clip-1 (10: down to 0.55) */
} li_q4_opts;

/* RTN4/GPTQ/AWQ defaults: group 128, asymmetric, damp 0.01, block 128, no
 * act-order, grid 20, clipping on with 10 steps. */
void li_q4_opts_default(li_q4_opts *o);

/* ------------------------------------------------------------------------
 * results
 * ---------------------------------------------------------------------- */

typedef struct li_q4_result {
    int64_t n_out, n_in;
    int64_t group_size;  /* as stored: 0 = per channel */
    int64_t n_groups;    /* n_in / group_size, or 1 */
    uint8_t *codes;      /* (n_out, n_in) codes 0..15 in stored column order, one per byte */
    float *scales;       /* (n_out, n_groups) */
    float *zeros;        /* (n_out, n_groups) integer-valued zero points 0..15, or NULL: symmetric, zero 8 */
    int32_t *perm;       /* (n_in) stored column j is input column perm[j] (GPTQ act-order), or NULL */
    float *act_scale;    /* (n_in) AWQ per-input-channel s (codes quantize W diag(s)), or NULL */
    li_act_quant act;    /* activation quantization the method assumes: F32, or INT4 for W4A4 */
    /* diagnostics (not needed to run the weight) */
    double alpha;        /* AWQ: the chosen exponent; else 0 */
    double loss;         /* AWQ: its output error; GPTQ: sum of the per-column losses; else 0 */
} li_q4_result;

void li_q4_result_free(li_q4_result *r); /* frees the arrays and zeroes r; a zeroed r is a no-op */

/* The matrix r stands for, in input-column order, f32 (n_out, n_in): the
 * formula above, 1/s included. What the error of a method is measured on. */
void li_q4_result_dequant(const li_q4_result *r, float *w);

/* Packs r's codes two per byte (LI_TYPE_U4: element 2j in the low nibble)
 * into packed (n_out, n_in / 2) and fills w to run them: type U4, the
 * scheme (AWQ, GPTQ: asymmetric; INT4: symmetric), act (LI_ACT_F32 = W4A16;
 * LI_ACT_INT4 = W4A4, INT4 scheme only), scales / zeros / perm pointing
 * into r. The A8 way of running 4-bit weights (int8 activations per token)
 * is the CPU backend's choice, not the weight's (docs/quant4.md).
 * r's act_scale is NOT in w (fold it upstream first, see the top).
 * 0, or -1 with why: the scheme cannot hold r (zeros vs symmetric, a perm
 * on a scheme without one, an activation kind it does not take). */
int li_q4_weight_view(const li_q4_result *r, li_scheme scheme, li_act_quant act, uint8_t *packed, li_weight *w,
                      char *why, size_t cap);

/* ------------------------------------------------------------------------
 * calibration statistics (GPTQ's Hessian, AWQ's activation statistics)
 * ---------------------------------------------------------------------- */

/* Accumulated from a layer's input rows, streamed in chunks: the sum of
 * x x^T and of |x| per channel. Every weight reading the same input (q/k/v,
 * gate/up) shares one. */
typedef struct li_q4_calib {
    int64_t n_in;
    int64_t n_rows;      /* rows accumulated */
    double *xtx;         /* (n_in, n_in) sum over rows of x x^T (both triangles after finish) */
    double *abs_sum;     /* (n_in) sum over rows of |x| */
    bool finished;
    struct li_threadpool *tp; /* accumulate's threads (NULL: the caller's alone); the sums do not depend on it */
} li_q4_calib;

/* n_in (n_in, n_in) doubles: 18 MiB at 1536. 0, or -1 with why. */
int li_q4_calib_init(li_q4_calib *c, int64_t n_in, char *why, size_t cap);
void li_q4_calib_free(li_q4_calib *c);
/* Adds rows x (n_rows, n_in). Rows may come in any chunks: the sums are
 * the same as in one call up to double rounding (bit for bit when every
 * chunk but the last is a multiple of 8 rows). */
void li_q4_calib_accumulate(li_q4_calib *c, const float *x, int64_t n_rows);
/* Completes the sums (mirrors the triangle); accumulate must not be called
 * after it. 0, or -1 when no rows were added. */
int li_q4_calib_finish(li_q4_calib *c, char *why, size_t cap);
/* GPTQ's Hessian of the layer's squared output error, H = 2 X^T X / n_rows
 * (the mean, so damping and scale do not depend on the sample count), into
 * h (n_in, n_in). c must be finished. */
void li_q4_calib_hessian(const li_q4_calib *c, double *h);

/* a (n x n, symmetric positive definite, row-major) -> its lower Cholesky
 * factor L (a = L L^T; the upper triangle zeroed) in place. 0, or -1 when
 * a is not positive definite. */
int li_q4_cholesky(double *a, int64_t n);

/* a (n x n, symmetric positive definite, row-major) -> a^-1 in place.
 * 0, or -1 when a is not positive definite (a is then garbage). */
int li_q4_spd_inverse(double *a, int64_t n);

/* ------------------------------------------------------------------------
 * methods
 * ---------------------------------------------------------------------- */

/* RTN4: round to nearest per group, W (n_out, n_in). Asymmetric: over each
 * group lo = min(w, 0), hi = max(w, 0), scale = (hi - lo) / 15, zero =
 * round(-lo / scale); symmetric: scale = max|w| / 7, zero 8. A group of
 * zeros gets scale 1. Uses o->group_size and o->symmetric only. */
int li_q4_rtn(const float *w, int64_t n_out, int64_t n_in, const li_q4_opts *o, li_q4_result *out, char *why,
              size_t cap);

/* GPTQ (Frantar et al. 2022, Algorithm 1): H from c (finished), damped by
 * o->damp * mean(diag H); dead columns (diag 0) get H = 1 and weight 0;
 * the upper Cholesky factor U of H^-1 (H^-1 = U^T U); columns quantized in
 * order, each one's error (w - q) / U[j][j] fed back into the columns
 * after it through row j of U, in lazy blocks of o->block_size. A group's
 * scale and zero come from the error-updated weights of its columns when
 * its first column is reached (the unblocked algorithm's values: the
 * lazy blocks are rounded to whole groups and change no result beyond
 * double rounding). act_order: columns sorted by decreasing
 * diag(H) (stable), groups over the permuted order (no static groups), so
 * r->perm is set. Grouping as in li_q4_rtn. */
int li_q4_gptq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, const li_q4_opts *o,
               li_q4_result *out, char *why, size_t cap);

/* GPTQ onto a W8A8 or FP8 weight (per output channel, as the scheme
 * stores it): row r's scale from its values before any feedback
 * (scales[r] = max|w| / 127, or / 448 for fp8), then the columns in order,
 * each rounded (int8: round-half-even, clamped to +-127; fp8: e4m3) and its
 * error fed back as in li_q4_gptq. in_scale (n_in) or NULL: W is already
 * W diag(s) for SmoothQuant's s, and its input X diag(s)^-1, so c's X^T X
 * (of X) is rescaled. codes (n_out, n_in): int8 bytes or e4m3 codes.
 * 0, or -1 with why (as li_q4_gptq). */
int li_q8_gptq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, double damp, bool fp8,
               const double *in_scale, uint8_t *codes, float *scales, char *why, size_t cap);

/* AWQ (Lin et al. 2023), layer level: s = max(mean|x|, 1e-4)^a per input
 * channel for the o->n_grid exponents a in [0, 1]; each a scores the output
 * error ||(Q(W diag(s)) diag(s)^-1 - W) X^T||^2 / n_rows (through X^T X,
 * so any number of rows costs the same); the lowest wins (ties: the
 * smaller a). Then, if o->clip, per (row, group) of W diag(s): max|w|
 * shrunk by (1 - i / 20), i < o->n_clip, weights clamped to +-that before
 * quantizing, the shrink with the lowest output error of that group kept.
 * Asymmetric unless o->symmetric; r->act_scale = s, r->alpha = a. The
 * block-level variant (searching s on a whole decoder block's output) is
 * not done: the search is per layer. */
int li_q4_awq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, const li_q4_opts *o,
              li_q4_result *out, char *why, size_t cap);

/* W4A4 (the seed's "don't"): per-output-channel symmetric int4 weights
 * (group 0, symmetric), r->act = LI_ACT_INT4: activations quantized per
 * token to int4 (s = amax / 7) at run time, no smoothing. c NULL: the
 * weights rounded to nearest (li_q4_rtn); else by GPTQ on c with damping
 * damp (li_q4_gptq, no act-order; `quantize --method w4a4 --gptq`). */
int li_q4_w4a4(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, double damp, li_q4_result *out,
               char *why, size_t cap);

/* The output error of a result on calibration c: ||(Wq - W) X^T||^2 /
 * n_rows, Wq = li_q4_result_dequant(r). What tests and the tool compare. */
double li_q4_output_error(const float *w, const li_q4_result *r, const li_q4_calib *c);

#endif
