/* w8.c — W8A8 / FP8 scheme matmul (w8_kernels.h): the scalar kernels and
 * the threaded driver every ISA shares. */
#include "util/common.h"
#include "cpu/w8_kernels.h"
#include "cpu/cpu_kernels.h" /* LI_PANEL, li_cpu_drop_pages */

#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
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

/* the e4m3 value of code c as bf16 bits (exact: 4-bit significand) */
static inline uint16_t fp8_bf16(uint8_t c) {
    const float f = li_w8_fp8_widen(c);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static inline float bf16_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void quantize_fp8_scalar(const float *x, int64_t k, uint16_t *qa, float *s) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float sc = amax / 448.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    int64_t j = 0;
    for (; j < k; j++) qa[j] = fp8_bf16(li_fp32_to_fp8_e4m3(x[j] * inv));
    for (; j < LI_W8_FP8_LDA(k); j++) qa[j] = 0;
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

/* The fp8 dot's one order (w8_kernels.h): blocks of 32, pair (2i, 2i+1)
 * into lane i, odd product first; then the lanes folded 8, 4, 2, 1. The
 * products are exact, so acc + w * a rounds once, as an FMA does. */
static float dot_fp8_scalar(const uint8_t *w, const uint16_t *a, int64_t k) {
    float acc[16] = {0};
    for (int64_t b = 0; b < k; b += 32)
        for (int i = 0; i < 16; i++) {
            const int64_t j = b + 2 * i;
            const float w1 = j + 1 < k ? li_w8_fp8_widen(w[j + 1]) : 0.0f, w0 = j < k ? li_w8_fp8_widen(w[j]) : 0.0f;
            acc[i] += w1 * bf16_f32(a[j + 1]);
            acc[i] += w0 * bf16_f32(a[j]);
        }
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) acc[i] += acc[i + h];
    return acc[0];
}

static void gemm_fp8_scalar(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const uint16_t *a,
                            const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    const int64_t lda = LI_W8_FP8_LDA(k);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            y[r * ldy + c] = dot_fp8_scalar(w + c * k, a + r * lda, k) * (as[r] * ws[c]);
}

const li_w8_kernels li_w8_kernels_scalar = {
    .isa = "scalar",
    .quantize_int8 = quantize_int8_scalar,
    .quantize_fp8 = quantize_fp8_scalar,
    .gemm_int8 = gemm_int8_scalar,
    .gemm_fp8 = gemm_fp8_scalar,
};

const li_w8_kernels *li_w8_kernels_for(const char *isa) {
    if (isa && !strcmp(isa, "amx")) return &li_w8_kernels_amx;
    if (isa && !strcmp(isa, "avx512")) return &li_w8_kernels_avx512;
    if (isa && !strcmp(isa, "avx2")) return &li_w8_kernels_avx2;
    return &li_w8_kernels_scalar;
}

/* ------------------------------------------------------------------------
 * int8 panels (w8_kernels.h)
 * ---------------------------------------------------------------------- */

int li_w8_pack(const li_w8_kernels *kern, li_weight *w) {
    if (!kern->gemm_int8_packed || !li_w8_supported(w) || w->scheme != LI_SCHEME_W8A8 || w->k % 4 || w->packed)
        return LI_EUNSUP;
    const int64_t k = w->k, m = w->m, np = (m + LI_PANEL - 1) / LI_PANEL;
    li_w8_packed *p = calloc(1, sizeof *p);
    void *chunk = NULL;
    uint8_t *codes = p ? li_cpu_arena_alloc((size_t)(np * k * LI_PANEL), &chunk) : NULL;
    if (!codes) {
        free(p);
        return LI_ENOMEM;
    }
    *p = (li_w8_packed){.magic = LI_W8_MAGIC, .k = k, .m = m, .n_panels = np, .codes = codes, .chunk = chunk};
    for (int64_t pp = 0; pp < np; pp++)
        for (int l = 0; l < LI_PANEL; l++) {
            const int64_t r = pp * LI_PANEL + l;
            const int8_t *row = (const int8_t *)w->data + r * (int64_t)w->row_bytes;
            uint8_t *dst = codes + pp * k * LI_PANEL + 4 * l;
            for (int64_t j = 0; j < k; j++) dst[(j / 4) * 64 + j % 4] = (uint8_t)((r < m ? row[j] : 0) + 128);
        }
    li_cpu_drop_pages(w->data, w->row_bytes * (size_t)m); /* the kernels read only the panels now */
    w->packed = p;
    return 0;
}

void li_w8_pack_free(li_weight *w) {
    li_w8_packed *p = w->packed;
    if (!p || p->magic != LI_W8_MAGIC) return;
    p->magic = 0;
    li_cpu_arena_free(p->chunk);
    free(p);
    w->packed = NULL;
}

bool li_w8_supported(const li_weight *w) {
    /* k <= 2^16 keeps the int8 sums inside int32 (w8_kernels.h) */
    return w->group_size == 0 && w->k <= 65536 && !w->zeros && !w->perm && w->scales &&
           ((w->scheme == LI_SCHEME_W8A8 && w->type == LI_KV_TYPE_INT8 && w->act == LI_ACT_INT8) ||
            (w->scheme == LI_SCHEME_FP8 && w->type == LI_KV_TYPE_FP8_E4M3 && w->act == LI_ACT_FP8));
}

/* ------------------------------------------------------------------------
 * the driver: quantize the activation rows (over threads), then items of
 * (a run of W8_CHUNK weight rows, a tile of up to 64 activation rows)
 * ---------------------------------------------------------------------- */

#define W8_CHUNK 32
#define W8_CHUNK_PACKED 64 /* 4 int8 panels: the AVX-512 tile's width */
#define W8_TILE 64
#define W8_MAX_PARTS 4

/* One weight of a job; several weights reading the same input (q/k/v,
 * gate/up) share one activation quantization and one thread hand-off. */
typedef struct {
    const li_weight *w;
    const li_w8_packed *pw; /* its int8 panels, or NULL */
    float *y, *res;       /* (n, w->m); res += y when res */
    int64_t chunk, n_chunks, item0; /* chunk: weight rows an item */
} w8_part;

typedef struct {
    const li_w8_kernels *kern;
    w8_part part[W8_MAX_PARTS];
    int n_parts;
    const float *x;
    int64_t n, k;
    bool fp8;
    void *qa;             /* (n, k) int8 codes or (n, LI_W8_FP8_LDA(k)) bf16 e4m3 values */
    float *sa;            /* (n) activation scales */
    int32_t *asum;        /* (n) each row's code sum, when a part is packed; else NULL */
    int64_t n_tiles, n_items;
    li_cpu_lanes row_lanes; /* the rows to quantize, and the items (li_cpu_lanes_run) */
    li_cpu_lanes lanes;
} w8_job;

/* the sum of k int8 codes: psadbw adds 8 unsigned bytes at a time, so the
 * codes go in as c + 128 and the sum comes out less 128 k (exact) */
static int32_t sum_codes(const int8_t *q, int64_t k) {
    int64_t j = 0, s = 0;
#ifdef __SSE2__
    const __m128i bias = _mm_set1_epi8((char)0x80), zero = _mm_setzero_si128();
    __m128i acc = zero;
    for (; j + 16 <= k; j += 16)
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(q + j)), bias), zero));
    s = _mm_cvtsi128_si64(acc) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)) - 128 * j;
#endif
    for (; j < k; j++) s += q[j];
    return (int32_t)s;
}

static void w8_quantize_row(void *ctx, int64_t r) {
    w8_job *j = ctx;
    if (j->fp8) {
        j->kern->quantize_fp8(j->x + r * j->k, j->k, (uint16_t *)j->qa + r * LI_W8_FP8_LDA(j->k), &j->sa[r]);
        return;
    }
    int8_t *q = (int8_t *)j->qa + r * j->k;
    j->kern->quantize_int8(j->x + r * j->k, j->k, q, &j->sa[r]);
    if (j->asum) j->asum[r] = sum_codes(q, j->k);
}

static void w8_quantize(void *p, int ith, int nth) {
    (void)nth;
    li_cpu_lanes_run(&((w8_job *)p)->row_lanes, ith, w8_quantize_row, p);
}

static void w8_item(void *ctx, int64_t t) {
    w8_job *j = ctx;
    int pi = 0;
    while (pi + 1 < j->n_parts && t >= j->part[pi + 1].item0) pi++;
    const w8_part *pt = &j->part[pi];
    const li_weight *w = pt->w;
    t -= pt->item0;
    /* tile-major: consecutive items share an activation tile */
    const int64_t m = w->m, c0 = (t % pt->n_chunks) * pt->chunk, c1 = LI_MIN(c0 + pt->chunk, m);
    const int64_t r0 = (t / pt->n_chunks) * W8_TILE, r1 = LI_MIN(r0 + W8_TILE, j->n);
    if (pt->pw)
        j->kern->gemm_int8_packed(pt->pw, w->scales, c0 / LI_PANEL, (c1 + LI_PANEL - 1) / LI_PANEL, j->qa, j->asum,
                                  j->sa, r0, r1, pt->y, m);
    else if (j->fp8) j->kern->gemm_fp8(w->data, w->scales, j->k, c0, c1, j->qa, j->sa, r0, r1, pt->y, m);
    else j->kern->gemm_int8(w->data, w->scales, j->k, c0, c1, j->qa, j->sa, r0, r1, pt->y, m);
    if (pt->res)
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) pt->res[r * m + c] += pt->y[r * m + c];
}

static void w8_work(void *p, int ith, int nth) {
    (void)nth;
    li_cpu_lanes_run(&((w8_job *)p)->lanes, ith, w8_item, p);
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
    bool any_packed = false;
    for (int i = 0; i < n_w; i++) {
        w8_part *pt = &j.part[i];
        pt->w = w[i];
        pt->pw = kern->gemm_int8_packed ? li_w8_packed_of(w[i]) : NULL;
        any_packed |= pt->pw != NULL;
        pt->y = y[i];
        pt->res = n_w == 1 ? res : NULL;
        /* few rows: memory-bound, and twice the items balance 2 threads better */
        pt->chunk = pt->pw && n >= 16 ? W8_CHUNK_PACKED : W8_CHUNK;
        pt->n_chunks = (w[i]->m + pt->chunk - 1) / pt->chunk;
        pt->item0 = j.n_items;
        j.n_items += pt->n_chunks * j.n_tiles;
        work += w[i]->m * n * j.k;
    }
    const size_t row = j.fp8 ? (size_t)LI_W8_FP8_LDA(j.k) * sizeof(uint16_t) : (size_t)j.k;
    /* the calling thread's scratch, kept between calls: a fresh buffer of a
     * prefill's size is fresh pages, and their faults cost ~10% of it */
    static _Thread_local void *scratch;
    static _Thread_local size_t scratch_cap;
    const size_t need = (size_t)n * row + 64 + (size_t)n * 2 * sizeof(float) + 64;
    if (need > scratch_cap) {
        li_aligned_free(scratch);
        scratch_cap = need + need / 2;
        scratch = li_aligned_alloc(scratch_cap);
    }
    j.qa = scratch;
    j.sa = (float *)((char *)scratch + ((size_t)n * row + 64 + 63) / 64 * 64);
    j.asum = any_packed ? (int32_t *)(j.sa + n) : NULL;
    const int nth = work < 65536 ? 1 : n_threads; /* tiny products: not worth a wake-up */
    const int qth = (int)LI_MIN(n, (int64_t)(n >= 8 ? nth : 1));
    li_cpu_lanes_init(&j.row_lanes, n, qth);
    li_cpu_lanes_init(&j.lanes, j.n_items, (int)LI_MIN((int64_t)nth, j.n_items));
    li_threadpool_run_sized(tp, w8_quantize, &j, qth, n * j.k);
    li_threadpool_run_shaped(tp, w8_work, &j, (int)LI_MIN((int64_t)nth, j.n_items), work,
                             li_threadpool_rows_shape((int)w[0]->type, n));
}

void li_w8_matmul(const li_w8_kernels *kern, li_threadpool *tp, int n_threads, const li_weight *w, const float *x,
                  float *y, float *res, int64_t n) {
    li_w8_matmul_multi(kern, tp, n_threads, &w, 1, x, &y, res, n);
}

void li_w8_matmul_ref(const li_weight *w, const float *x, float *y, int64_t n) {
    const int64_t k = w->k, m = w->m;
    const bool fp8 = w->scheme == LI_SCHEME_FP8;
    const size_t row = fp8 ? (size_t)LI_W8_FP8_LDA(k) * sizeof(uint16_t) : (size_t)k;
    void *qa = li_xmalloc((size_t)n * row + 1);
    float *sa = li_xmalloc((size_t)n * sizeof(float) + 1);
    for (int64_t r = 0; r < n; r++) {
        if (fp8) quantize_fp8_scalar(x + r * k, k, (uint16_t *)qa + r * LI_W8_FP8_LDA(k), &sa[r]);
        else quantize_int8_scalar(x + r * k, k, (int8_t *)qa + r * k, &sa[r]);
    }
    if (fp8) gemm_fp8_scalar(w->data, w->scales, k, 0, m, qa, sa, 0, n, y, m);
    else gemm_int8_scalar(w->data, w->scales, k, 0, m, qa, sa, 0, n, y, m);
    free(qa);
    free(sa);
}
