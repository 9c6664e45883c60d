/* w8.c — W8A8 / FP8 scheme matmul (w8_kernels.h): the scalar kernels and
 * the threaded driver every ISA shares. */
#include "util/common.h"
#include "cpu/w8_kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * scalar kernels: the definitions the SIMD ones must match bit for bit
 * ---------------------------------------------------------------------- */

static void quantize_int8_scalar(const float *x, int64_t k, int8_t *q, float *s) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float sc = amax / 127.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    for (int64_t j = 0; j < k; j++) q[j] = (int8_t)li_code_round(x[j] * inv, -127.0f, 127.0f);
    *s = sc;
}

static void quantize_fp8_scalar(const float *x, int64_t k, float *xf, float *s) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float sc = amax / 448.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    for (int64_t j = 0; j < k; j++) xf[j] = li_w8_fp8_widen(li_fp32_to_fp8_e4m3(x[j] * inv));
    *s = sc;
}

static void gemm_int8_scalar(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                             const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const int8_t *wr = w + c * k, *ar = a + r * k;
            int32_t sum = 0;
            for (int64_t j = 0; j < k; j++) sum += (int32_t)wr[j] * ar[j];
            y[r * ldy + c] = (float)sum * (as[r] * ws[c]);
        }
}

static void gemm_fp8_scalar(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const float *a,
                            const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const uint8_t *wr = w + c * k;
            const float *ar = a + r * k;
            double sum = 0.0; /* exact: see w8_kernels.h */
            for (int64_t j = 0; j < k; j++) sum += (double)(li_w8_fp8_widen(wr[j]) * ar[j]);
            y[r * ldy + c] = (float)sum * (as[r] * ws[c]);
        }
}

const li_w8_kernels li_w8_kernels_scalar = {
    .isa = "scalar",
    .quantize_int8 = quantize_int8_scalar,
    .quantize_fp8 = quantize_fp8_scalar,
    .gemm_int8 = gemm_int8_scalar,
    .gemm_fp8 = gemm_fp8_scalar,
};

const li_w8_kernels *li_w8_kernels_for(const char *isa) {
    if (isa && !strcmp(isa, "avx512")) return &li_w8_kernels_avx512;
    if (isa && !strcmp(isa, "avx2")) return &li_w8_kernels_avx2;
    return &li_w8_kernels_scalar;
}

bool li_w8_supported(const li_weight *w) {
    /* k <= 2^16 keeps the fp8 sums exact in f64 (w8_kernels.h) */
    return w->group_size == 0 && w->k <= 65536 && !w->zeros && !w->perm && w->scales &&
           ((w->scheme == LI_SCHEME_W8A8 && w->type == LI_KV_TYPE_INT8 && w->act == LI_ACT_INT8) ||
            (w->scheme == LI_SCHEME_FP8 && w->type == LI_KV_TYPE_FP8_E4M3 && w->act == LI_ACT_FP8));
}

/* ------------------------------------------------------------------------
 * the driver: quantize the activation rows (over threads), then items of
 * (a run of W8_CHUNK weight rows, a tile of up to 64 activation rows)
 * ---------------------------------------------------------------------- */

#define W8_CHUNK 32
#define W8_TILE 64
#define W8_MAX_PARTS 4

/* One weight of a job; several weights reading the same input (q/k/v,
 * gate/up) share one activation quantization and one thread hand-off. */
typedef struct {
    const li_weight *w;
    float *y, *res;       /* (n, w->m); res += y when res */
    int64_t n_chunks, item0;
} w8_part;

typedef struct {
    const li_w8_kernels *kern;
    w8_part part[W8_MAX_PARTS];
    int n_parts;
    const float *x;
    int64_t n, k;
    bool fp8;
    void *qa;             /* (n, k) int8 codes or f32 widened e4m3 */
    float *sa;            /* (n) activation scales */
    int64_t n_tiles, n_items;
    atomic_long next_row, next_item;
} w8_job;

static void w8_quantize(void *p, int ith, int nth) {
    w8_job *j = p;
    (void)ith, (void)nth;
    for (;;) {
        const int64_t r = atomic_fetch_add_explicit(&j->next_row, 1, memory_order_relaxed);
        if (r >= j->n) break;
        if (j->fp8) (j->kern->quantize_fp8 ? j->kern->quantize_fp8 : quantize_fp8_scalar)(j->x + r * j->k, j->k, (float *)j->qa + r * j->k, &j->sa[r]);
        else j->kern->quantize_int8(j->x + r * j->k, j->k, (int8_t *)j->qa + r * j->k, &j->sa[r]);
    }
}

static void w8_work(void *p, int ith, int nth) {
    w8_job *j = p;
    (void)ith, (void)nth;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next_item, 1, memory_order_relaxed);
        if (t >= j->n_items) break;
        int pi = 0;
        while (pi + 1 < j->n_parts && t >= j->part[pi + 1].item0) pi++;
        const w8_part *pt = &j->part[pi];
        const li_weight *w = pt->w;
        t -= pt->item0;
        /* tile-major: consecutive items share an activation tile */
        const int64_t m = w->m, c0 = (t % pt->n_chunks) * W8_CHUNK, c1 = LI_MIN(c0 + W8_CHUNK, m);
        const int64_t r0 = (t / pt->n_chunks) * W8_TILE, r1 = LI_MIN(r0 + W8_TILE, j->n);
        if (j->fp8) j->kern->gemm_fp8(w->data, w->scales, j->k, c0, c1, j->qa, j->sa, r0, r1, pt->y, m);
        else j->kern->gemm_int8(w->data, w->scales, j->k, c0, c1, j->qa, j->sa, r0, r1, pt->y, m);
        if (pt->res)
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) pt->res[r * m + c] += pt->y[r * m + c];
    }
}

bool li_w8_same_job(const li_weight *const *w, int n_w) {
    if (n_w < 1 || n_w > W8_MAX_PARTS) return false;
    for (int i = 0; i < n_w; i++)
        if (!li_w8_supported(w[i]) || w[i]->k != w[0]->k || w[i]->scheme != w[0]->scheme || w[i]->m <= 0)
            return false;
    return true;
}

void li_w8_matmul_multi(const li_w8_kernels *kern, li_threadpool *tp, int n_threads, const li_weight *const *w,
                        int n_w, const float *x, float *const *y, float *res, int64_t n) {
    if (n <= 0) return;
    w8_job j = {.kern = kern, .x = x, .n = n, .k = w[0]->k, .fp8 = w[0]->scheme == LI_SCHEME_FP8, .n_parts = n_w};
    j.n_tiles = (n + W8_TILE - 1) / W8_TILE;
    int64_t work = 0;
    for (int i = 0; i < n_w; i++) {
        w8_part *pt = &j.part[i];
        pt->w = w[i];
        pt->y = y[i];
        pt->res = n_w == 1 ? res : NULL;
        pt->n_chunks = (w[i]->m + W8_CHUNK - 1) / W8_CHUNK;
        pt->item0 = j.n_items;
        j.n_items += pt->n_chunks * j.n_tiles;
        work += w[i]->m * n * j.k;
    }
    const size_t elem = j.fp8 ? sizeof(float) : 1;
    j.qa = li_aligned_alloc((size_t)n * (size_t)j.k * elem + 64);
    j.sa = li_xmalloc((size_t)n * sizeof(float));
    atomic_init(&j.next_row, 0);
    atomic_init(&j.next_item, 0);
    const int nth = work < 65536 ? 1 : n_threads; /* tiny products: not worth a wake-up */
    li_threadpool_run_sized(tp, w8_quantize, &j, n >= 8 ? nth : 1, n * j.k);
    li_threadpool_run_sized(tp, w8_work, &j, (int)LI_MIN((int64_t)nth, j.n_items), work);
    li_aligned_free(j.qa);
    free(j.sa);
}

void li_w8_matmul(const li_w8_kernels *kern, li_threadpool *tp, int n_threads, const li_weight *w, const float *x,
                  float *y, float *res, int64_t n) {
    li_w8_matmul_multi(kern, tp, n_threads, &w, 1, x, &y, res, n);
}
