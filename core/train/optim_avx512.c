/* optim_avx512.c — AdamW's update over one chunk, 16 floats at a time
 * (optim_tmpl.h; compiled with -mavx512f by the _avx512.c rule; optim.c
 * calls it when the training kernels run AVX-512). */
#include <immintrin.h>

#define OPT_NAME li_adamw_update_avx512
#define OPT_W 16
#define OPT_V __m512
#define OPT_SET1 _mm512_set1_ps
#define OPT_LOAD _mm512_loadu_ps
#define OPT_STORE _mm512_storeu_ps
#define OPT_ADD _mm512_add_ps
#define OPT_SUB _mm512_sub_ps
#define OPT_MUL _mm512_mul_ps
#define OPT_DIV _mm512_div_ps
#define OPT_SQRT _mm512_sqrt_ps
#include "train/optim_tmpl.h"
