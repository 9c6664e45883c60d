/* optim_avx2.c — AdamW's update over one chunk, 8 floats at a time: the
 * update of optim_avx512.c for AVX2 machines (compiled with -mavx2 -mfma by
 * the _avx2.c rule; optim.c calls it when the training kernels run AVX2).
 * The scalar loop's sqrtf and divide cost about 6 cycles an element; as
 * vectors the update is bound by memory. The bits may differ from the
 * scalar loop's by a rounding (test_train.c holds each to the formulas in
 * double). */
#include "train/train_internal.h"

#include <immintrin.h>
#include <math.h>

void li_adamw_update_avx2(float *p, const float *g, float *m, float *v, size_t n, const li_adamw_coef *c) {
    const __m256 clip = _mm256_set1_ps(c->clip), b1 = _mm256_set1_ps(c->b1), b2 = _mm256_set1_ps(c->b2),
                 ob1 = _mm256_set1_ps(1 - c->b1), ob2 = _mm256_set1_ps(1 - c->b2),
                 lrwd = _mm256_set1_ps(c->lr * c->wd), ss = _mm256_set1_ps(c->step_size),
                 ibc2 = _mm256_set1_ps(c->inv_bc2), eps = _mm256_set1_ps(c->eps);
    size_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const __m256 gj = _mm256_mul_ps(_mm256_loadu_ps(g + e), clip);
        const __m256 mm = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + e)), _mm256_mul_ps(ob1, gj));
        const __m256 vv =
            _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + e)), _mm256_mul_ps(_mm256_mul_ps(ob2, gj), gj));
        __m256 pp = _mm256_loadu_ps(p + e);
        pp = _mm256_sub_ps(pp, _mm256_mul_ps(lrwd, pp));
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vv, ibc2)), eps);
        pp = _mm256_sub_ps(pp, _mm256_div_ps(_mm256_mul_ps(ss, mm), den));
        _mm256_storeu_ps(m + e, mm);
        _mm256_storeu_ps(v + e, vv);
        _mm256_storeu_ps(p + e, pp);
    }
    for (; e < n; e++) {
        const float gj = g[e] * c->clip;
        m[e] = c->b1 * m[e] + (1 - c->b1) * gj;
        v[e] = c->b2 * v[e] + (1 - c->b2) * gj * gj;
        p[e] -= c->lr * c->wd * p[e];
        p[e] -= c->step_size * m[e] / (sqrtf(v[e] * c->inv_bc2) + c->eps);
    }
}
