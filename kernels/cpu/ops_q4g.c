/* ops_q4g.c — 4-bit group-quantized weights on the CPU: packing, the A8
 * reference and the threaded matmul driver (q4g_kernels.h says what A16
 * and A8 compute). */
#include "util/common.h"
#include "cpu/q4g_kernels.h"
#include "cpu/threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * packing
 * ---------------------------------------------------------------------- */

bool li_q4g_supported(const li_weight *w) {
    return (w->scheme == LI_SCHEME_AWQ || w->scheme == LI_SCHEME_GPTQ || w->scheme == LI_SCHEME_INT4) &&
           w->type == LI_TYPE_U4 && w->k > 0 && w->k % 2 == 0 && w->m > 0 && w->scales;
}

static inline int code_at(const li_weight *w, int64_t row, int64_t j) {
    const uint8_t b = ((const uint8_t *)w->data)[row * (int64_t)w->row_bytes + j / 2];
    return j % 2 ? b >> 4 : b & 0x0f;
}

void li_q4g_pack_free(li_weight *w) {
    li_q4g_packed *p = w->packed;
    if (!p || p->magic != LI_Q4G_MAGIC) return;
    p->magic = 0;
    li_aligned_free(p->codes);
    li_aligned_free(p->sz);
    if (p->a8chunk) li_cpu_arena_free(p->a8chunk);
    pthread_mutex_destroy(&p->mu);
    free(p->gidx);
    free(p);
    w->packed = NULL;
}

static inline float zero_at(const li_weight *w, int64_t row, int64_t g) {
    return w->zeros ? w->zeros[row * li_weight_n_groups(w) + g] : li_scheme_info(w->scheme)->zero;
}

int li_q4g_pack(li_weight *w) {
    const int64_t k = w->k, m = w->m, gs = w->group_size > 0 ? w->group_size : k;
    const int64_t ng = li_weight_n_groups(w), np = (m + LI_PANEL - 1) / LI_PANEL;
    if (w->zeros) /* the kernels' zero points are codes, as every 4-bit method writes them */
        for (int64_t i = 0; i < m * ng; i++)
            if (!(w->zeros[i] == nearbyintf(w->zeros[i]) && w->zeros[i] >= 0.0f && w->zeros[i] <= 15.0f))
                return LI_EUNSUP;
    li_q4g_packed *p = calloc(1, sizeof *p);
    int32_t *inv = malloc((size_t)k * sizeof(int32_t)); /* input column c is stored at inv[c] */
    if (p) p->gidx = malloc((size_t)k * sizeof(int32_t));
    if (!p || !p->gidx || !inv) {
        if (p) free(p->gidx);
        free(p);
        free(inv);
        return LI_ENOMEM;
    }
    *p = (li_q4g_packed){.magic = LI_Q4G_MAGIC, .k = k, .m = m, .gs = gs, .ng = ng, .n_panels = np,
                         .gidx = p->gidx, .a8_simd = k % 8 == 0 && gs % 8 == 0};
    pthread_mutex_init(&p->mu, NULL);
    for (int64_t j = 0; j < k; j++) inv[w->perm ? w->perm[j] : j] = (int32_t)j;
    for (int64_t c = 0; c < k; c++) p->gidx[c] = (int32_t)(inv[c] / gs);
    free(inv);
    w->packed = p;
    return 0;
}

/* A16 panels: codes in input order (the permutation undone), then per
 * group the 16 rows' scales and zeros. */
static int build_a16(const li_weight *w, li_q4g_packed *p) {
    const int64_t k = p->k, m = p->m, ng = p->ng, np = p->n_panels;
    uint8_t *codes = li_aligned_alloc((size_t)(np * (k / 2) * LI_PANEL));
    float *szs = li_aligned_alloc((size_t)(np * ng * 32) * sizeof(float));
    int32_t *inv = malloc((size_t)k * sizeof(int32_t));
    if (!codes || !szs || !inv) {
        li_aligned_free(codes);
        li_aligned_free(szs);
        free(inv);
        return LI_ENOMEM;
    }
    for (int64_t j = 0; j < k; j++) inv[w->perm ? w->perm[j] : j] = (int32_t)j;
    for (int64_t pp = 0; pp < np; pp++) {
        uint8_t *cd = codes + pp * (k / 2) * LI_PANEL;
        for (int l = 0; l < LI_PANEL; l++) {
            const int64_t r = pp * LI_PANEL + l;
            for (int64_t c = 0; c < k; c += 2) /* input columns c, c + 1 */
                cd[(c / 2) * LI_PANEL + l] =
                    r < m ? (uint8_t)(code_at(w, r, inv[c]) | code_at(w, r, inv[c + 1]) << 4) : 0;
            for (int64_t g = 0; g < ng; g++) {
                float *sz = szs + (pp * ng + g) * 32;
                sz[l] = r < m ? w->scales[r * ng + g] : 0.0f;
                sz[LI_PANEL + l] = r < m ? zero_at(w, r, g) : 0.0f;
            }
        }
    }
    free(inv);
    p->codes = codes;
    p->sz = szs;
    return 0;
}

/* A8 panels of 16 rows, stored order: per group its chunks of 8 elements
 * (lane l = row 16p + l, byte b = element 8t + b in the low nibble,
 * 8t + 4 + b in the high), then the group's integer zeros and scales. */
static int build_a8(const li_weight *w, li_q4g_packed *p) {
    const int64_t k = p->k, m = p->m, gs = p->gs, ng = p->ng, np = p->n_panels;
    const int64_t gb = (gs / 8) * 64 + 128, pb = (k / 8) * 64 + ng * 128;
    void *chunk;
    uint8_t *a8 = li_cpu_arena_alloc((size_t)(np * pb), &chunk);
    if (!a8) return LI_ENOMEM;
    for (int64_t pp = 0; pp < np; pp++)
        for (int64_t g = 0; g < ng; g++) {
            uint8_t *grp = a8 + pp * pb + g * gb;
            const int64_t t0 = g * gs / 8, t1 = LI_MIN((g + 1) * gs, k) / 8;
            for (int64_t t = t0; t < t1; t++) {
                uint8_t *dst = grp + (t - t0) * 64;
                for (int l = 0; l < LI_PANEL; l++) {
                    const int64_t r = pp * LI_PANEL + l;
                    for (int b = 0; b < 4; b++)
                        dst[l * 4 + b] =
                            r < m ? (uint8_t)(code_at(w, r, 8 * t + b) | code_at(w, r, 8 * t + 4 + b) << 4) : 0;
                }
            }
            int32_t iz[LI_PANEL];
            float sc[LI_PANEL];
            for (int l = 0; l < LI_PANEL; l++) {
                const int64_t r = pp * LI_PANEL + l;
                iz[l] = r < m ? (int32_t)zero_at(w, r, g) : 0;
                sc[l] = r < m ? w->scales[r * ng + g] : 0.0f;
            }
            uint8_t *zs = grp + (t1 - t0) * 64;
            memcpy(zs, iz, 64);
            memcpy(zs + 64, sc, 64);
        }
    p->a8_gb = gb;
    p->a8_pb = pb;
    p->a8chunk = chunk;
    p->a8codes = a8;
    return 0;
}

bool li_q4g_ready(const li_weight *w, bool a8) {
    li_q4g_packed *p = w->packed; /* the layouts are built on first use (q4g_kernels.h) */
    if (!p || p->magic != LI_Q4G_MAGIC) return false;
    atomic_bool *ready = a8 ? &p->a8_ready : &p->a16_ready;
    if (atomic_load_explicit(ready, memory_order_acquire)) return true;
    if (a8 && !p->a8_simd) return false;
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    if (!atomic_load_explicit(ready, memory_order_relaxed)) {
        rc = a8 ? build_a8(w, p) : build_a16(w, p);
        if (rc == 0) {
            atomic_store_explicit(ready, true, memory_order_release);
            /* the panels hold every code, scale and zero now: drop the GGUF's
             * pages (the reference faults them back in if it ever runs) */
            li_cpu_drop_pages(w->data, w->row_bytes * (size_t)w->m);
            li_cpu_drop_pages(w->scales, (size_t)(p->m * p->ng) * sizeof(float));
            if (w->zeros) li_cpu_drop_pages(w->zeros, (size_t)(p->m * p->ng) * sizeof(float));
        } else if (!p->warned) {
            p->warned = true;
            li_log_error("cpu: out of memory packing a %lld x %lld 4-bit weight for %s: the scalar reference runs it",
                         (long long)p->m, (long long)p->k, a8 ? "A8" : "A16");
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc == 0;
}

/* ------------------------------------------------------------------------
 * A8: activation rows and the reference
 * ---------------------------------------------------------------------- */

static inline int32_t *act_xsum(const uint8_t *act, int64_t k) { return (int32_t *)(act + ((k + 3) & ~3)); }

void li_q4g_act_quantize(const li_weight *w, const li_q4g_packed *p, const float *x, uint8_t *dst) {
    const int64_t k = w->k;
    float amax = 0.0f; /* li_act_quant_row_ref's scale and rounding, exactly */
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    int8_t *q = (int8_t *)dst;
    int32_t *xsum = act_xsum(dst, k);
    memset(xsum, 0, (size_t)p->ng * sizeof(int32_t));
    for (int64_t j = 0; j < k; j++) {
        const int v = (int)li_code_round(x[w->perm ? w->perm[j] : j] * inv, -127.0f, 127.0f);
        q[j] = (int8_t)v;
        xsum[j / p->gs] += v;
    }
    memcpy(xsum + p->ng, &s, sizeof s);
}

float li_q4g_a8_row_ref(const li_weight *w, const li_q4g_packed *p, int64_t row, const uint8_t *act) {
    const int64_t k = w->k, gs = p->gs;
    const int8_t *q = (const int8_t *)act;
    const int32_t *xsum = act_xsum(act, k);
    float acc = 0.0f, sx;
    memcpy(&sx, xsum + p->ng, sizeof sx);
    for (int64_t g = 0; g < p->ng; g++) {
        int32_t isum = 0;
        const int64_t j1 = (g + 1) * gs < k ? (g + 1) * gs : k;
        for (int64_t j = g * gs; j < j1; j++) isum += (int32_t)q[j] * code_at(w, row, j);
        isum -= (int32_t)zero_at(w, row, g) * xsum[g];
        acc = acc + w->scales[row * p->ng + g] * (float)isum;
    }
    return acc * sx;
}

static void scalar_a8(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = r0; r < r1; r++) y[i * ldy + r] = li_q4g_a8_row_ref(w, p, r, act + (size_t)i * act_stride);
}

const li_q4g_kernels li_q4g_kernels_scalar = {.isa = "scalar", .a16 = NULL, .a8 = scalar_a8};

const li_q4g_kernels *li_q4g_kernels_for(const char *isa) {
    if (!strcmp(isa, "avx2")) return &li_q4g_kernels_avx2;
    if (!strcmp(isa, "amx")) return &li_q4g_kernels_amx;
    if (!strcmp(isa, "avx512")) return &li_q4g_kernels_avx512;
    if (!strcmp(isa, "scalar")) return &li_q4g_kernels_scalar;
    return NULL;
}

/* ------------------------------------------------------------------------
 * the threaded driver
 * ---------------------------------------------------------------------- */

void li_q4g_scratch_free(li_q4g_scratch *s) {
    li_aligned_free(s->buf);
    memset(s, 0, sizeof *s);
}

/* One weight of a job: its items follow the previous weight's. */
typedef struct {
    const li_weight *w;
    const li_q4g_packed *p;
    float *y;              /* (n, w->m) */
    int64_t units, chunk, n_chunks, item0;
} q4g_part;

typedef struct {
    const li_q4g_kernels *kern;
    q4g_part part[LI_Q4G_MAX_PARTS];
    int n_parts;
    const li_weight *w;    /* part 0's: the activation rows follow its k, perm and groups */
    const li_q4g_packed *p;
    bool a8;
    const float *x;        /* (n, k) A16 input (already rounded for W4A4) */
    const float *x_raw;    /* (n, k) A8: the rows to quantize */
    uint8_t *act;          /* (n) A8 rows of act_stride bytes */
    size_t act_stride;
    float *res;            /* (n, m) with one part, or NULL */
    int64_t n, tile_n, n_items;
    li_cpu_lanes row_lanes; /* the activation rows to prepare */
    li_cpu_lanes lanes;    /* the items in contiguous runs */
    const uint8_t *next_data; /* the arena's next weight after the last part's A8 panels (decode), or NULL */
    size_t next_bytes;
} q4g_job;

static void q4g_prep_row(void *ctx, int64_t r) {
    const q4g_job *j = ctx;
    if (j->a8)
        (j->kern->act ? j->kern->act : li_q4g_act_quantize)(j->w, j->p, j->x_raw + r * j->w->k,
                                                            j->act + (size_t)r * j->act_stride);
    else li_act_quant_row_ref(j->w->act, j->x_raw + r * j->w->k, (float *)j->x + r * j->w->k, j->w->k);
}

static void q4g_prep_work(void *ctx, int ith, int nth) {
    (void)nth;
    li_cpu_lanes_run(&((q4g_job *)ctx)->row_lanes, ith, q4g_prep_row, ctx);
}

static void q4g_item(const q4g_job *j, int64_t t) {
    int pi = 0;
    while (pi + 1 < j->n_parts && t >= j->part[pi + 1].item0) pi++;
    const q4g_part *pt = &j->part[pi];
    const int64_t m = pt->w->m;
    t -= pt->item0;
    const int64_t u0 = (t % pt->n_chunks) * pt->chunk, u1 = LI_MIN(u0 + pt->chunk, pt->units);
    const int64_t i0 = (t / pt->n_chunks) * j->tile_n, ni = LI_MIN(j->tile_n, j->n - i0);
    float *y = pt->y + i0 * m;
    if (j->a8)
        j->kern->a8(pt->w, pt->p, u0 * LI_PANEL, LI_MIN(u1 * LI_PANEL, m), j->act + (size_t)i0 * j->act_stride,
                    j->act_stride, ni, y, m);
    else j->kern->a16(pt->p, u0, u1, j->x + i0 * pt->w->k, pt->w->k, ni, y, m);
    if (j->res) { /* the reference's res += y, on the tile still in cache */
        const int64_t c0 = u0 * LI_PANEL, c1 = LI_MIN(u1 * LI_PANEL, m);
        for (int64_t i = 0; i < ni; i++)
            for (int64_t c = c0; c < c1; c++) j->res[(i0 + i) * m + c] += y[i * m + c];
    }
}

/* Thread ith drains its own lane of panels first (li_cpu_lanes), then the others. */
static void q4g_work(void *ctx, int ith, int nth) {
    q4g_job *j = ctx;
    const int L = j->lanes.n;
    for (int d = 0; d < L; d++) {
        for (int64_t t; (t = li_cpu_lanes_claim(&j->lanes, (ith + d) % L)) >= 0;) q4g_item(j, t);
        /* the kernel prefetches only a few panels ahead */
        if (d == 0) li_cpu_warm_lane(j->next_data, j->next_bytes, ith, L, LI_GEMV_PREFETCH);
    }
}

static bool same_perm(const li_weight *a, const li_weight *b) {
    if (!a->perm || !b->perm) return a->perm == b->perm;
    return a->perm == b->perm || !memcmp(a->perm, b->perm, (size_t)a->k * sizeof(int32_t));
}

bool li_q4g_same_job(const li_q4g_kernels *kern, li_act_quant act, const li_weight *const *w, int n_w) {
    if (n_w < 1 || n_w > LI_Q4G_MAX_PARTS || act != LI_ACT_INT8 || !kern->a8) return false;
    const li_q4g_packed *p0 = li_q4g_packed_of(w[0]);
    if (!p0 || w[0]->act != LI_ACT_F32) return false;
    for (int i = 1; i < n_w; i++) {
        const li_q4g_packed *p = li_q4g_packed_of(w[i]);
        if (!p || w[i]->act != LI_ACT_F32 || w[i]->k != w[0]->k || p->gs != p0->gs || !same_perm(w[i], w[0]))
            return false;
    }
    return true;
}

static void q4g_run(const li_q4g_kernels *kern, li_threadpool *tp, int nth, li_q4g_scratch *s,
                    const li_weight *const *w, int n_w, li_act_quant act, const float *x, float *const *y, float *res,
                    int64_t n) {
    const li_q4g_packed *p = li_q4g_packed_of(w[0]);
    q4g_job j = {.kern = kern, .n_parts = n_w, .w = w[0], .p = p, .a8 = act == LI_ACT_INT8 && kern->a8, .x = x,
                 .x_raw = x, .res = res, .n = n};
    if (!j.a8 && !kern->a16) j.a8 = true; /* cannot happen: the scalar ISA keeps the reference */
    if (j.a8 && kern->a8 != scalar_a8) /* the SIMD kernels read the A8 panels; the reference, w itself */
        for (int i = 0; i < n_w; i++)
            if (!li_q4g_ready(w[i], true)) j.kern = kern = &li_q4g_kernels_scalar;
    const int64_t k = w[0]->k;
    int64_t work = 0;
    for (int i = 0; i < n_w; i++) work += w[i]->m * n * k;
    if (work < 65536) nth = 1; /* tiny products: not worth a wake-up */
    size_t need = 0;
    if (j.a8) {
        j.act_stride = li_q4g_act_bytes(k, p->ng);
        need = j.act_stride * (size_t)n;
    } else if (w[0]->act != LI_ACT_F32) {
        need = (size_t)(n * k) * sizeof(float);
    }
    if (need > s->cap) {
        li_aligned_free(s->buf);
        s->buf = li_aligned_alloc(need);
        s->cap = need;
    }
    if (need) {
        if (j.a8) j.act = s->buf;
        else j.x = s->buf;
        const int qth = (int)LI_MIN(n, (int64_t)(n >= 8 ? nth : 1));
        li_cpu_lanes_init(&j.row_lanes, n, qth);
        li_threadpool_run_sized(tp, q4g_prep_work, &j, qth, n * k);
    }
    /* both work in panels of 16 rows (AVX2's A8 in halves of 8); the
     * parts' items follow each other, each weight split as if alone */
    j.tile_n = n <= 64 ? n : 64;
    const int64_t n_tiles = (n + j.tile_n - 1) / j.tile_n, want = (int64_t)nth * 8;
    j.n_items = 0;
    for (int i = 0; i < n_w; i++) {
        q4g_part *pt = &j.part[i];
        *pt = (q4g_part){.w = w[i], .p = li_q4g_packed_of(w[i]), .y = y[i]};
        pt->units = (w[i]->m + LI_PANEL - 1) / LI_PANEL;
        int64_t chunk = (pt->units * n_tiles + want - 1) / want;
        if (n < 4) chunk = (chunk + 1) & ~(int64_t)1; /* AVX2 A8's multi-panel blocks: 1 panel is latency-bound */
        pt->chunk = LI_MAX(LI_MIN(chunk, pt->units), 1);
        pt->n_chunks = (pt->units + pt->chunk - 1) / pt->chunk;
        pt->item0 = j.n_items;
        j.n_items += pt->n_chunks * n_tiles;
    }
    const q4g_part *last = &j.part[n_w - 1];
    if (j.a8 && n <= 8 && last->p->a8codes) { /* memory-bound: warm up the next weight */
        li_cpu_arena_next(last->p->a8codes, (size_t)(last->p->n_panels * last->p->a8_pb), &j.next_data,
                          &j.next_bytes);
        if (!j.next_bytes) j.next_data = NULL;
    }
    li_cpu_lanes_init(&j.lanes, j.n_items, nth);
    li_threadpool_run_shaped(tp, q4g_work, &j, (int)LI_MIN((int64_t)nth, j.n_items), work,
                             li_threadpool_rows_shape(j.a8, n));
}

void li_q4g_matmul(const li_q4g_kernels *kern, li_threadpool *tp, int nth, li_q4g_scratch *s, const li_weight *w,
                   li_act_quant act, const float *x, float *y, float *res, int64_t n) {
    q4g_run(kern, tp, nth, s, &w, 1, act, x, &y, res, n);
}

void li_q4g_matmul_multi(const li_q4g_kernels *kern, li_threadpool *tp, int nth, li_q4g_scratch *s,
                         const li_weight *const *w, int n_w, const float *x, float *const *y, int64_t n) {
    q4g_run(kern, tp, nth, s, w, n_w, LI_ACT_INT8, x, y, NULL, n);
}
