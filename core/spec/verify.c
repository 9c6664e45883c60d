/* verify.c — deciding which speculative drafts survive, so that the emitted
 * tokens are distributed exactly as sampling the target alone.
 *
 * Three rules, all pure functions of probability rows and uniforms:
 *   chain    speculative sampling (Leviathan et al. 2023; Chen et al. 2023)
 *   tree     multi-candidate ("recursive") rejection sampling (SpecInfer,
 *            Miao et al. 2023): siblings tried in turn against a residual
 *   typical  Medusa's typical acceptance (Cai et al. 2024): NOT lossless
 *
 * Residuals are kept unnormalised with their sum beside them (r, rs): the
 * normalised residual is r / rs, which saves a pass over the vocabulary per
 * rejection. Sums are taken in double. */
#include "spec/verify.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---- rows ------------------------------------------------------------------ */

/* A probability as the rules use it: NaN, negative and infinite entries count
 * as 0, so a malformed row can never be drawn from at a bad id. */
static inline float prob(float v) {
    /* without branches (a branch per id costs more than the rest of a pass):
     * the bits of a positive finite float other than +0 are 1..0x7f7fffff */
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= -(uint32_t)(b - 1u < 0x7f7fffffu);
    memcpy(&v, &b, sizeof v);
    return v;
}

static inline float prob_at(const float *row, int32_t n_vocab, int32_t id) {
    return id >= 0 && id < n_vocab ? prob(row[id]) : 0.0f;
}

/* Rows are walked in blocks of ROW_BLOCK with ROW_LANES independent double
 * sums: one running sum would chain every add to the one before it (a
 * vocabulary of 49152 is ~10x slower that way). */
#define ROW_LANES 8
#define ROW_BLOCK 64

static double block_sum(const float *row, int32_t from, int32_t to) {
    double lane[ROW_LANES] = {0};
    int32_t i = from;
    for (; i + ROW_LANES <= to; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) lane[l] += prob(row[i + l]);
    double s = 0.0;
    for (; i < to; i++) s += prob(row[i]);
    for (int l = 0; l < ROW_LANES; l++) s += lane[l];
    return s;
}

static double row_sum(const float *row, int32_t n_vocab) { return block_sum(row, 0, n_vocab); }

/* The lowest id among the row's largest entries (0 for a row without mass). */
static int32_t row_argmax(const float *row, int32_t n_vocab) {
    int32_t best = 0;
    float bv = prob(row[0]);
    for (int32_t i = 1; i < n_vocab; i++)
        if (prob(row[i]) > bv) bv = prob(row[i]), best = i;
    return best;
}

/* Inverse-CDF draw in id order from a row of total mass sum: the first id
 * whose cumulative mass exceeds u * sum (whole blocks below it are skipped
 * by their sums). Never returns an id of zero mass (rounding at the end
 * falls back to the last id with mass); a row without mass gives
 * row_argmax (0). */
static int32_t row_draw(const float *row, int32_t n_vocab, double sum, double u) {
    const double target = u * sum;
    double cum = 0.0;
    for (int32_t b = 0; b < n_vocab; b += ROW_BLOCK) {
        const int32_t e = b + ROW_BLOCK < n_vocab ? b + ROW_BLOCK : n_vocab;
        const double bs = block_sum(row, b, e);
        if (cum + bs <= target) {
            cum += bs;
            continue;
        }
        for (int32_t i = b; i < e; i++) {
            const float v = prob(row[i]);
            if (v == 0.0f) continue;
            cum += v;
            if (cum > target) return i;
        }
        /* rounding inside the block: keep walking */
    }
    for (int32_t i = n_vocab - 1; i >= 0; i--)
        if (prob(row[i]) > 0.0f) return i;
    return row_argmax(row, n_vocab);
}

/* out <- max(r - scale * q, 0) (out may be r: the scratch updated in
 * place); returns the new sum. */
static double residual_sub(float *out, const float *r, const float *q, double scale, int32_t n_vocab) {
    for (int32_t i = 0; i < n_vocab; i++) {
        /* max(v, 0) by the sign bit, not a branch: p > q is a coin flip per id */
        const float v = (float)((double)prob(r[i]) - scale * (double)prob(q[i]));
        uint32_t b;
        memcpy(&b, &v, sizeof b);
        b &= -(uint32_t)((int32_t)b > 0);
        memcpy(&out[i], &b, sizeof b);
    }
    return row_sum(out, n_vocab);
}

/* ---- chain ----------------------------------------------------------------- */

typedef struct {
    const float *p;
    int32_t n_vocab;
} dense_rows;

static const float *dense_row(void *ctx, int32_t j) {
    const dense_rows *r = ctx;
    return r->p + (size_t)j * (size_t)r->n_vocab;
}

int32_t li_spec_verify_chain(const float *p, const float *q, int32_t n_vocab, const int32_t *d, int32_t k,
                             li_spec_uniform_fn uniform, void *uctx, float *scratch, int32_t *next) {
    if (!p) {
        if (next) *next = -1;
        return -1;
    }
    dense_rows r = {p, n_vocab};
    return li_spec_verify_chain_rows(dense_row, &r, q, n_vocab, d, k, uniform, uctx, scratch, next);
}

int32_t li_spec_verify_chain_rows(li_spec_row_fn row, void *rctx, const float *q, int32_t n_vocab, const int32_t *d,
                                  int32_t k, li_spec_uniform_fn uniform, void *uctx, float *scratch, int32_t *next) {
    if (!row || n_vocab < 1 || k < 0 || (k > 0 && !d) || !uniform || !scratch || !next) {
        if (next) *next = -1;
        return -1;
    }
    for (int32_t j = 0; j < k; j++) {
        const float *pj = row(rctx, j);
        const int32_t x = d[j];
        const double px = prob_at(pj, n_vocab, x);
        const double qx = q ? prob_at(q + (size_t)j * n_vocab, n_vocab, x) : 1.0; /* point mass */
        /* u < min(1, p/q) written without the division: q = 0 (a draft the
         * proposer could not have drawn) accepts iff p > 0 */
        if (uniform(uctx) * qx < px) continue;

        /* rejected: the next token comes from norm(max(p - q, 0)) */
        double s;
        if (q) {
            s = residual_sub(scratch, pj, q + (size_t)j * n_vocab, 1.0, n_vocab);
        } else { /* a point mass: p with x removed */
            memcpy(scratch, pj, sizeof *scratch * (size_t)n_vocab);
            if (x >= 0 && x < n_vocab) scratch[x] = 0.0f;
            s = row_sum(scratch, n_vocab);
        }
        const double u = uniform(uctx);
        /* s == 0 only by rounding (p a float step short of q at x and nowhere
         * above it, or p all on x but for rounding): the rejection had a
         * rounding's probability, and p is what to draw from */
        *next = s > 0.0 ? row_draw(scratch, n_vocab, s, u) : row_draw(pj, n_vocab, row_sum(pj, n_vocab), u);
        return j;
    }
    /* every draft survived: the bonus token comes from p_k */
    const float *pk = row(rctx, k);
    *next = row_draw(pk, n_vocab, row_sum(pk, n_vocab), uniform(uctx));
    return k;
}

/* ---- tree ------------------------------------------------------------------ */

/* The next child of node c (-1: the root) after index from, or n. Parents
 * come before children, so a child of c has an index above c; a node whose
 * parent is out of range is nobody's child and never reached. */
static int32_t next_child(const int32_t *parent, int32_t n, int32_t c, int32_t from) {
    for (int32_t i = from; i < n; i++)
        if (parent[i] == c) return i;
    return n;
}

int32_t li_spec_verify_tree(const float *p, const float *q, int32_t n_vocab, const int32_t *token,
                            const int32_t *parent, int32_t n, li_spec_uniform_fn uniform, void *uctx, float *scratch,
                            int32_t *path, int32_t *next) {
    if (!p) {
        if (next) *next = -1;
        return -1;
    }
    dense_rows r = {p, n_vocab};
    return li_spec_verify_tree_rows(dense_row, &r, q, n_vocab, token, parent, n, uniform, uctx, scratch, path, next);
}

int32_t li_spec_verify_tree_rows(li_spec_row_fn row, void *rctx, const float *q, int32_t n_vocab,
                                 const int32_t *token, const int32_t *parent, int32_t n, li_spec_uniform_fn uniform,
                                 void *uctx, float *scratch, int32_t *path, int32_t *next) {
    if (!row || n_vocab < 1 || n < 0 || (n > 0 && (!token || !parent || !path)) || !uniform || !scratch || !next) {
        if (next) *next = -1;
        return -1;
    }
    int32_t len = 0;
    int32_t c = -1; /* the node whose children are tried; -1 is the root */
    for (;;) {
        const float *pc = row(rctx, c + 1);
        const float *qc = q ? q + (size_t)(c + 1) * n_vocab : NULL;
        /* the residual r / rs: starts as p (rows sum to 1), lives in scratch
         * once a sampled child is rejected */
        const float *r = pc;
        double rs = 1.0;
        int32_t reset_from = c + 1; /* deterministic: siblings rejected since r was last p */
        int32_t accepted = -1;
        for (int32_t i = next_child(parent, n, c, c + 1); i < n; i = next_child(parent, n, c, i + 1)) {
            const int32_t x = token[i];
            const double u = uniform(uctx);
            if (qc) {
                /* sampled (iid from qc): accept with min(1, r(x) / rs / q(x)),
                 * else r <- max(r / rs - q, 0), kept as max(r - rs q, 0) */
                if (u * prob_at(qc, n_vocab, x) * rs < prob_at(r, n_vocab, x)) {
                    accepted = i;
                    break;
                }
                rs = residual_sub(scratch, r, qc, rs, n_vocab);
                r = scratch;
                if (!(rs > 0.0)) r = pc, rs = 1.0; /* rounding: fall back to p */
            } else {
                /* deterministic: accept with r(x) = p(x) / rs, where r is p with
                 * the siblings rejected before removed (a duplicate has 0) */
                double px = prob_at(pc, n_vocab, x);
                for (int32_t s = next_child(parent, n, c, reset_from); s < i; s = next_child(parent, n, c, s + 1))
                    if (token[s] == x) px = 0.0;
                if (u * rs < px) {
                    accepted = i;
                    break;
                }
                rs -= px;
                if (!(rs > 0.0)) rs = 1.0, reset_from = i + 1; /* rounding: fall back to p */
            }
        }
        if (accepted >= 0) {
            path[len++] = accepted;
            c = accepted;
            continue;
        }

        /* every child rejected (or none): the next token comes from r */
        const double u = uniform(uctx);
        if (!qc && reset_from < n && next_child(parent, n, c, reset_from) < n) {
            memcpy(scratch, pc, sizeof *scratch * (size_t)n_vocab);
            for (int32_t s = next_child(parent, n, c, reset_from); s < n; s = next_child(parent, n, c, s + 1))
                if (token[s] >= 0 && token[s] < n_vocab) scratch[token[s]] = 0.0f;
            r = scratch;
            rs = row_sum(scratch, n_vocab);
            if (!(rs > 0.0)) r = pc;
        }
        if (r == pc) rs = row_sum(pc, n_vocab);
        *next = row_draw(r, n_vocab, rs, u);
        return len;
    }
}

/* ---- typical acceptance (Medusa): NOT lossless ------------------------------- */

/* min(epsilon, delta * exp(-H(row))), H in nats: H = log s - sum(v log v) / s
 * over the row's mass s (logf: a threshold needs no double logs, and a
 * vocabulary of them is most of this function's time). */
static double typical_threshold(const float *row, int32_t n_vocab, double epsilon, double delta) {
    const double s = row_sum(row, n_vocab);
    double h = 0.0;
    if (s > 0.0) {
        double vlv = 0.0;
        for (int32_t i = 0; i < n_vocab; i++) {
            const float v = prob(row[i]);
            if (v > 0.0f) vlv += (double)v * logf(v);
        }
        h = log(s) - vlv / s;
    }
    const double t = delta * exp(-h);
    return t < epsilon ? t : epsilon;
}

int32_t li_spec_verify_typical(const float *p, int32_t n_vocab, const int32_t *token, const int32_t *parent,
                               int32_t n, float epsilon, float delta, li_spec_uniform_fn uniform, void *uctx,
                               int32_t *path, int32_t *next) {
    if (!p || n_vocab < 1 || n < 0 || (n > 0 && (!token || !parent || !path)) || !next) {
        if (next) *next = -1;
        return -1;
    }
    /* path[i] holds node i's depth while the tree is scanned (0: rejected or
     * unreachable); the threshold of the last parent seen is cached, since
     * siblings usually sit side by side */
    int32_t best = -1, best_depth = 0, cached = -2;
    double thr = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t a = parent[i];
        path[i] = 0;
        if (a < -1 || a >= i || (a >= 0 && path[a] == 0)) continue;
        const float *row = p + (size_t)(a + 1) * n_vocab;
        if (a != cached) thr = typical_threshold(row, n_vocab, epsilon, delta), cached = a;
        if (!(prob_at(row, n_vocab, token[i]) > thr)) continue;
        path[i] = a >= 0 ? path[a] + 1 : 1;
        if (path[i] > best_depth) best_depth = path[i], best = i;
    }
    /* the deepest accepted node (the first in index order on ties), root out */
    for (int32_t at = best, pos = best_depth - 1; pos >= 0; pos--) {
        const int32_t up = parent[at];
        path[pos] = at;
        at = up;
    }
    const float *row = p + (size_t)(best + 1) * n_vocab;
    *next = uniform ? row_draw(row, n_vocab, row_sum(row, n_vocab), uniform(uctx)) : row_argmax(row, n_vocab);
    return best_depth;
}
