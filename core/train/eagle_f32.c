/* eagle_f32.c — eagle_tmpl.h in float: what training runs, its matmuls on
 * the thread pool (train_mm.c). */
#include "train/eagle.h"
#include "train/train_internal.h"

#include <math.h>

#define real float
#define TR(name) name##_f32
#define TR_SQRT sqrtf
#define TR_EXP expf
#define TR_MM_NT(tp, x, W, y, n, m, k) li_train_mm_nt((struct li_threadpool *)(tp), x, W, y, n, m, k)
#define TR_MM_ACC(tp, A, sa_r, sa_l, B, C, R, Lk, K) \
    li_train_mm_acc((struct li_threadpool *)(tp), A, sa_r, sa_l, B, C, R, Lk, K)

#include "train/eagle_tmpl.h"
