/* quant4_internal.h — what rtn.c, gptq.c and awq.c share: one group's
 * scale and zero point, and the rounding of one weight to a code; and the
 * vector type of quant/'s dense double loops (rotate.c's too). Private to
 * core/quant/. */
#ifndef LI_QUANT4_INTERNAL_H
#define LI_QUANT4_INTERNAL_H

#include "quant/quant4.h"
#include "util/common.h"

#include <math.h>
#include <string.h>

/* The dense loops (X^T X, the quadratic forms, GPTQ's lazy batch and its
 * factorizations) are LI_HOT_CLONES (util/common.h): AVX2 and plain
 * x86-64, the same bits. */

/* Four doubles as GCC's generic vector for those loops (gptq.c's register
 * tiles, rotate.c's Hadamard): the default clone runs it as SSE2 pairs.
 * Loaded and stored through memcpy, unaligned; macros, as a function
 * returning one would change the ABI. */
typedef double li_dv4 __attribute__((vector_size(32)));
#define LI_DV4_LD(v, p) memcpy(&(v), (p), sizeof(li_dv4))
#define LI_DV4_ST(p, v) memcpy((p), &(v), sizeof(li_dv4))

/* One group's parameters: the stored f32 scale and the zero point (an
 * integer 0..15; 8 when symmetric). */
typedef struct {
    float scale;
    double zero;
} li_q4_group;

/* Parameters of the n values v (stride apart). Asymmetric: the range
 * [min(v, 0), max(v, 0)] over 15 steps, zero = round(-lo / scale);
 * symmetric: max|v| / 7, zero 8. A range of 0 gets scale 1. */
static inline li_q4_group li_q4_group_params(const double *v, int64_t n, int64_t stride, bool symmetric) {
    double lo = 0.0, hi = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x = v[i * stride];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    li_q4_group g;
    if (symmetric) {
        const double amax = hi > -lo ? hi : -lo;
        g.scale = amax > 0.0 ? (float)(amax / 7.0) : 1.0f;
        g.zero = 8.0;
    } else {
        g.scale = hi > lo ? (float)((hi - lo) / 15.0) : 1.0f;
        if (!(g.scale > 0.0f)) g.scale = 1.0f; /* a range that underflows f32 */
        const double z = nearbyint(-lo / (double)g.scale);
        g.zero = z < 0.0 ? 0.0 : z > 15.0 ? 15.0 : z;
    }
    return g;
}

/* The code of x: round-half-even of x / scale plus the zero, clamped 0..15. */
static inline int li_q4_code(double x, li_q4_group g) {
    const double q = nearbyint(x / (double)g.scale) + g.zero;
    return q < 0.0 ? 0 : q > 15.0 ? 15 : (int)q;
}

/* What code q stands for. */
static inline double li_q4_value(int q, li_q4_group g) { return ((double)q - g.zero) * (double)g.scale; }

/* out[r] = d_r^T G d_r for the m rows d_r of d (ldd apart), G (n, n) with
 * rows ldg apart, symmetric: the output error of a weight difference d
 * through X^T X. Eight rows share each pass over G; the sums run in the
 * same order whatever m is. */
void li_q4_quad_forms(const double *g, int64_t ldg, const double *d, int64_t ldd, int64_t m, int64_t n,
                      double *out);

/* Checks the shape and grouping (n_in even, the group dividing n_in) and
 * allocates out's codes, scales and (asymmetric) zeros. 0, or -1 with why. */
int li_q4_result_alloc(li_q4_result *out, int64_t n_out, int64_t n_in, int64_t group_size, bool symmetric,
                       const char *method, char *why, size_t cap);

#endif
