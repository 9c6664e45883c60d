/* optim_tmpl.h — AdamW's update of one chunk, written once over a vector
 * type: optim_avx512.c and optim_avx2.c define the macros below and
 * include this, and optim.c's scalar path is li_adamw_update_scalar. The
 * update is memory-bound only once its sqrt and divide are vectors; the
 * scalar loop spends ~6 cycles an element on them. Vector products may
 * fuse into FMAs, so their bits can differ from the scalar loop's by a
 * rounding (test_train.c holds each to the formulas in double).
 *
 *   OPT_NAME  the function;  OPT_W  lanes;  OPT_V  the vector type;
 *   OPT_SET1 OPT_LOAD OPT_STORE OPT_ADD OPT_SUB OPT_MUL OPT_DIV OPT_SQRT */
#ifndef LI_OPTIM_TMPL_SCALAR
#define LI_OPTIM_TMPL_SCALAR
#include "train/train_internal.h"

#include <math.h>

static inline void li_adamw_update_scalar(float *p, const float *g, float *m, float *v, size_t n,
                                          const li_adamw_coef *c) {
    for (size_t e = 0; e < n; e++) {
        const float gj = g[e] * c->clip;
        m[e] = c->b1 * m[e] + (1 - c->b1) * gj;
        v[e] = c->b2 * v[e] + (1 - c->b2) * gj * gj;
        p[e] -= c->lr * c->wd * p[e];
        p[e] -= c->step_size * m[e] / (sqrtf(v[e] * c->inv_bc2) + c->eps);
    }
}
#endif

#ifdef OPT_NAME
void OPT_NAME(float *p, const float *g, float *m, float *v, size_t n, const li_adamw_coef *c) {
    const OPT_V clip = OPT_SET1(c->clip), b1 = OPT_SET1(c->b1), b2 = OPT_SET1(c->b2), ob1 = OPT_SET1(1 - c->b1),
                ob2 = OPT_SET1(1 - c->b2), lrwd = OPT_SET1(c->lr * c->wd), ss = OPT_SET1(c->step_size),
                ibc2 = OPT_SET1(c->inv_bc2), eps = OPT_SET1(c->eps);
    size_t e = 0;
    for (; e + OPT_W <= n; e += OPT_W) {
        const OPT_V gj = OPT_MUL(OPT_LOAD(g + e), clip);
        const OPT_V mm = OPT_ADD(OPT_MUL(b1, OPT_LOAD(m + e)), OPT_MUL(ob1, gj));
        const OPT_V vv = OPT_ADD(OPT_MUL(b2, OPT_LOAD(v + e)), OPT_MUL(OPT_MUL(ob2, gj), gj));
        OPT_V pp = OPT_LOAD(p + e);
        pp = OPT_SUB(pp, OPT_MUL(lrwd, pp));
        const OPT_V den = OPT_ADD(OPT_SQRT(OPT_MUL(vv, ibc2)), eps);
        pp = OPT_SUB(pp, OPT_DIV(OPT_MUL(ss, mm), den));
        OPT_STORE(m + e, mm);
        OPT_STORE(v + e, vv);
        OPT_STORE(p + e, pp);
    }
    li_adamw_update_scalar(p + e, g + e, m + e, v + e, n - e, c);
}
#endif
