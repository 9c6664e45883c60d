/* optim_avx512.c — AdamW's update over one chunk, 16 floats at a time
 * (compiled with -mavx512f by the _avx512.c rule; optim.c calls it when
 * the training kernels run AVX-512). The update is memory-bound only once
 * its sqrt and divide are vectors; the scalar loop spent ~6 cycles an
 * element on them. The products may fuse into FMAs here, so the bits can
 * differ from the scalar loop's by a rounding (test_train.c holds both to
 * the formulas in double). */
#include "train/train_internal.h"

#include <immintrin.h>
#include <math.h>

void li_adamw_update_avx512(float *p, const float *g, float *m, float *v, size_t n, const li_adamw_coef *c) {
    const __m512 clip = _mm512_set1_ps(c->clip), b1 = _mm512_set1_ps(c->b1), b2 = _mm512_set1_ps(c->b2),
                 ob1 = _mm512_set1_ps(1 - c->b1), ob2 = _mm512_set1_ps(1 - c->b2),
                 lrwd = _mm512_set1_ps(c->lr * c->wd), ss = _mm512_set1_ps(c->step_size),
                 ibc2 = _mm512_set1_ps(c->inv_bc2), eps = _mm512_set1_ps(c->eps);
    size_t e = 0;
    for (; e + 16 <= n; e += 16) {
        const __m512 gj = _mm512_mul_ps(_mm512_loadu_ps(g + e), clip);
        const __m512 mm = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + e)), _mm512_mul_ps(ob1, gj));
        const __m512 vv =
            _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + e)), _mm512_mul_ps(_mm512_mul_ps(ob2, gj), gj));
        __m512 pp = _mm512_loadu_ps(p + e);
        pp = _mm512_sub_ps(pp, _mm512_mul_ps(lrwd, pp));
        const __m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vv, ibc2)), eps);
        pp = _mm512_sub_ps(pp, _mm512_div_ps(_mm512_mul_ps(ss, mm), den));
        _mm512_storeu_ps(m + e, mm);
        _mm512_storeu_ps(v + e, vv);
        _mm512_storeu_ps(p + e, pp);
    }
    for (; e < n; e++) {
        const float gj = g[e] * c->clip;
        m[e] = c->b1 * m[e] + (1 - c->b1) * gj;
        v[e] = c->b2 * v[e] + (1 - c->b2) * gj * gj;
        p[e] -= c->lr * c->wd * p[e];
        p[e] -= c->step_size * m[e] / (sqrtf(v[e] * c->inv_bc2) + c->eps);
    }
}
