/* medusa_f32.c — medusa_tmpl.h in float: what training runs, the two big
 * products (Z·E^T and dlogits·E) and the loss's rows on the thread pool. */
#include "train/medusa.h"
#include "train/train_internal.h"

#include <math.h>

double li_train_medusa_loss_par(struct li_threadpool *tp, const float *logits, const int32_t *lab, const float *teacher,
                          float *dlogits, int64_t N, int64_t V, float alpha, float temp, float gscale, double *kl);

#define real float
#define TR(name) name##_f32
#define TR_EXP expf
#define TR_MM_NT(tp, x, W, y, n, m, k) li_train_mm_nt((struct li_threadpool *)(tp), x, W, y, n, m, k)
#define TR_MM_ACC(tp, A, sa_r, sa_l, B, C, R, Lk, K) \
    li_train_mm_acc((struct li_threadpool *)(tp), A, sa_r, sa_l, B, C, R, Lk, K)
#define TR_LOSS(tp, s, lab, t, ds, N, V, a, T, gs, kl) \
    li_train_medusa_loss_par((struct li_threadpool *)(tp), s, lab, t, ds, N, V, a, T, gs, kl)

#include "train/medusa_tmpl.h"
