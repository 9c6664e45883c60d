/* optim_avx2.c — AdamW's update over one chunk, 8 floats at a time
 * (optim_tmpl.h; compiled with -mavx2 -mfma by the _avx2.c rule; optim.c
 * calls it when the training kernels run AVX2). */
#include <immintrin.h>

#define OPT_NAME li_adamw_update_avx2
#define OPT_W 8
#define OPT_V __m256
#define OPT_SET1 _mm256_set1_ps
#define OPT_LOAD _mm256_loadu_ps
#define OPT_STORE _mm256_storeu_ps
#define OPT_ADD _mm256_add_ps
#define OPT_SUB _mm256_sub_ps
#define OPT_MUL _mm256_mul_ps
#define OPT_DIV _mm256_div_ps
#define OPT_SQRT _mm256_sqrt_ps
#include "train/optim_tmpl.h"
