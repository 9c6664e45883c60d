/* eagle_f64.c — eagle_tmpl.h in double, for the gradient checks (plain
 * loops, one thread), as train_f64.c. */
#include "train/eagle.h"
#include "train/train_internal.h"

#include <math.h>

#define real double
#define TR(name) name##_f64
#define TR_SQRT sqrt
#define TR_EXP exp

#define TR_MM_NT(tp, x, W, y, n, m, k) li_train_mm_nt_f64(x, W, y, n, m, k)
#define TR_MM_ACC(tp, A, sa_r, sa_l, B, C, R, Lk, K) li_train_mm_acc_f64(A, sa_r, sa_l, B, C, R, Lk, K)

#include "train/eagle_tmpl.h"
