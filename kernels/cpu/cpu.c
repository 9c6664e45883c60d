/* cpu.c — the CPU compute backend.
 *
 * Owns: the thread pool, the choice of ISA level (CPUID at init, or forced),
 * weight repacking (weight_prepare: panels, repack.c) and how each op is
 * split over threads. The arithmetic lives in the ISA kernel tables
 * (ops_scalar.c, ops_avx2.c, ops_avx512.c, see cpu_kernels.h).
 *
 *   matmul     quantize the activations once (rows over threads), then
 *              (weight panels x activation rows) items, each thread
 *              streaming its own contiguous run of panels first
 *   attention  (tile of a sequence's tokens, kv head) items
 *   small ops  rows over threads when the batch is large
 * Every split hands out work from atomic counters: a thread slowed down by
 * another process simply takes less (see threadpool.h). No split changes a
 * result: each output is computed whole, the same way, by one thread
 * (batch invariance, cpu_kernels.h). */
#define _GNU_SOURCE
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/ggml_kernels.h"
#include "cpu/kv_kernels.h"
#include "cpu/q4g_kernels.h"
#include "cpu/threadpool.h"
#include "cpu/w8_kernels.h"

#include <cpuid.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct li_cpu {
    li_threadpool *tp;
    int n_threads;
    const li_cpu_kernels *kern;
    void *act;             /* packed quantized activations, act_cap bytes */
    size_t act_cap;
    float **scores;        /* (n_threads) attention scratch, scores_cap floats each */
    size_t scores_cap;
    int64_t *tiles;        /* attention tiles: first token of each, tiles_cap entries */
    int64_t *tile_npos;    /* and the positions of each one's longest token */
    int64_t tiles_cap;
    float *attn_part;      /* chunks' partial sums (li_attn_part), attn_part_cap floats */
    size_t attn_part_cap;
    atomic_int *attn_done; /* (2 n_threads) chunks finished per (tile, kv head, head run), where chunks are items */
    /* rope angles of the last batch: every layer's q and k rotate by the
     * same (pos, pair) angles, so they are computed once per forward pass */
    float *rope_cs;        /* (rope_n, 2, rope_half): each token's cos, then sin */
    int32_t *rope_pos;     /* (rope_n) the positions they are for */
    size_t rope_cs_cap;    /* floats */
    int64_t rope_n, rope_pos_cap;
    int rope_half;
    float rope_scale;
    /* 4-bit group-quantized weights (AWQ, GPTQ, INT4: q4g_kernels.h) */
    const li_q4g_kernels *q4g;
    li_act_quant q4_act;   /* LI_ACT_F32: A16 (the weights' own semantics); LI_ACT_INT8: A8 */
    li_q4g_scratch q4g_scratch;
} li_cpu;

static li_cpu *cpu_of(li_backend *be) { return be->impl; }

/* ------------------------------------------------------------------------
 * ISA choice
 * ---------------------------------------------------------------------- */

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c", and the fuzz builds use clang */
bool li_cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static bool have_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && li_cpu_has_f16c();
}

static bool have_avx512(void) {
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

static int isa_pick(const char *isa, const li_cpu_kernels **out, li_error *err) {
    __builtin_cpu_init();
    if (!isa || !*isa || !strcmp(isa, "auto")) {
        *out = have_avx512() ? (li_cpu_amx_usable() ? &li_cpu_kernels_amx : &li_cpu_kernels_avx512)
               : have_avx2() ? &li_cpu_kernels_avx2
                             : &li_cpu_kernels_scalar;
        return 0;
    }
    if (!strcmp(isa, "scalar")) {
        *out = &li_cpu_kernels_scalar;
        return 0;
    }
    if (!strcmp(isa, "avx2")) {
        if (!have_avx2()) return li_error_set(err, LI_EUNSUP, "cpu: isa 'avx2' needs AVX2, FMA and F16C, which this CPU lacks");
        *out = &li_cpu_kernels_avx2;
        return 0;
    }
    if (!strcmp(isa, "avx512")) {
        if (!have_avx512())
            return li_error_set(err, LI_EUNSUP,
                                "cpu: isa 'avx512' needs AVX-512 F/BW/VL/DQ/VNNI, which this CPU lacks");
        *out = &li_cpu_kernels_avx512;
        return 0;
    }
    if (!strcmp(isa, "amx")) {
        if (!have_avx512() || !li_cpu_amx_usable())
            return li_error_set(err, LI_EUNSUP,
                                "cpu: isa 'amx' needs AVX-512 F/BW/VL/DQ/VNNI and AMX-TILE/AMX-INT8 enabled by the OS, "
                                "which this CPU or kernel lacks");
        *out = &li_cpu_kernels_amx;
        return 0;
    }
    return li_error_set(err, LI_EINVAL, "cpu: unknown isa '%s' (expected auto, scalar, avx2, avx512, amx or ggml)",
                        isa);
}

static int cpus_online(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * matmul
 *
 * Work items are (a run of weight panels, a tile of activation rows); every
 * output is computed whole by one kernel call, with the same arithmetic
 * whatever the tile, so neither n nor the thread split changes a bit of it.
 * ---------------------------------------------------------------------- */


#define LI_CPU_MAX_PARTS 4

/* One weight of a matmul job. Several weights that read the same input
 * (q/k/v, gate/up) run as one job: the activations are quantized once and
 * the threads meet once, instead of once per weight. */
typedef struct {
    const li_weight *w;
    const li_cpu_packed *pw; /* panels, or NULL: the scalar kernels on w->data */
    float *y;              /* (n, w->m) */
    float *res;            /* (n, w->m) residual: res += y, tile by tile while hot (or NULL) */
    int64_t units;         /* panels (packed) or weight rows */
    int64_t chunk, n_chunks;
    int64_t item0;         /* the job's first item that belongs to this weight */
} matmul_part;

typedef struct {
    const li_cpu_kernels *kern;
    matmul_part part[LI_CPU_MAX_PARTS];
    int n_parts;
    const float *x;        /* (n, k), k shared by every part */
    int64_t k, n;
    li_type at;            /* activation type: Q8_0, Q8_1, or F32 for float weights */
    void *act;             /* (n) packed rows of act_stride bytes */
    size_t act_stride;
    int64_t tile_n, n_items;
    const uint8_t *next_data; /* the next weight's panels, to warm up (or NULL) */
    size_t next_bytes;
    li_cpu_lanes row_lanes; /* the activation rows to quantize */
    li_cpu_lanes lanes;    /* the items in contiguous runs */
} matmul_job;

/* y += x element by element (the same adds in any order). Blocks of a
 * fixed 16 let -O2 vectorize them without a runtime alias check: the
 * residual adds ran scalar, 3% of a verify step. */
static void add_f32(float *restrict y, const float *restrict x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) y[i + l] += x[i + l];
    for (; i < n; i++) y[i] += x[i];
}

static void matmul_quantize_row(void *p, int64_t r) {
    const matmul_job *j = p;
    j->kern->quantize_act(j->at, j->x + r * j->k, (char *)j->act + r * j->act_stride, j->k);
}

static void matmul_quantize(void *p, int ith, int nth) {
    (void)nth;
    li_cpu_lanes_run(&((matmul_job *)p)->row_lanes, ith, matmul_quantize_row, p);
}

static void matmul_item(const matmul_job *j, int64_t t) {
    int pi = 0;
    while (pi + 1 < j->n_parts && t >= j->part[pi + 1].item0) pi++;
    const matmul_part *pt = &j->part[pi];
    const li_weight *w = pt->w;
    t -= pt->item0;
    const int64_t u0 = (t % pt->n_chunks) * pt->chunk, r0 = (t / pt->n_chunks) * j->tile_n;
    const int64_t u1 = LI_MIN(u0 + pt->chunk, pt->units), nr = LI_MIN(j->tile_n, j->n - r0);
    float *y = pt->y + r0 * w->m;
    const char *act = (const char *)j->act + r0 * j->act_stride;
    int64_t c0 = u0, c1 = u1; /* the output columns of this item */
    if (pt->pw) {
        if (j->at == LI_TYPE_F32) j->kern->gemm_f_packed(pt->pw, u0, u1, j->x + r0 * w->k, w->k, nr, y, w->m);
        else j->kern->gemm_q_packed(pt->pw, u0, u1, act, j->act_stride, nr, y, w->m);
        c0 = u0 * LI_PANEL;
        c1 = LI_MIN(u1 * LI_PANEL, w->m);
    } else {
        const char *wrows = (const char *)w->data + u0 * w->row_bytes;
        if (j->at == LI_TYPE_F32)
            li_cpu_kernels_scalar.gemm_f(w->type, w->k, wrows, w->row_bytes, u1 - u0, j->x + r0 * w->k, w->k, nr,
                                         y + u0, w->m);
        else
            li_cpu_kernels_scalar.gemm_q(w->type, w->k, wrows, w->row_bytes, u1 - u0, act, j->act_stride, nr,
                                         y + u0, w->m);
    }
    if (pt->res) /* the residual add of the reference (res += y), on the tile still in L1 */
        for (int64_t r = 0; r < nr; r++) add_f32(pt->res + (r0 + r) * w->m + c0, y + r * w->m + c0, c1 - c0);
}

/* Thread ith drains its own lane first (li_cpu_lanes), then the others. */
static void matmul_work(void *p, int ith, int nth) {
    matmul_job *j = p;
    const int L = j->lanes.n;
    for (int d = 0; d < L; d++) {
        const int lane = (ith + d) % L;
        for (int64_t t; (t = li_cpu_lanes_claim(&j->lanes, lane)) >= 0;) matmul_item(j, t);
        /* the GEMV kernel prefetches only LI_GEMV_PREFETCH bytes ahead */
        if (d == 0) li_cpu_warm_lane(j->next_data, j->next_bytes, ith, L, LI_GEMV_PREFETCH);
    }
}

/* Item shape: activation tiles of up to 64 rows (they stay in L2 while the
 * weight panels stream past), and enough items per weight for every thread
 * to take several, so one slowed down by another process just takes fewer.
 * The parts' items follow each other in weight order: packed weights lie
 * back to back in forward order, so a lane is still one contiguous run. */
static void matmul_plan(matmul_job *j, int nth) {
    const int64_t n = j->n;
    j->tile_n = n <= 64 ? n : 64;
    const int64_t n_tn = (n + j->tile_n - 1) / j->tile_n;
    const int64_t want = (int64_t)nth * 8;
    j->n_items = 0;
    for (int pi = 0; pi < j->n_parts; pi++) {
        matmul_part *pt = &j->part[pi];
        int64_t chunk = (pt->units * n_tn + want - 1) / want;
        if (!pt->pw) chunk = (chunk + 3) & ~(int64_t)3;
        pt->chunk = LI_MAX(LI_MIN(chunk, pt->units), 1);
        pt->n_chunks = (pt->units + pt->chunk - 1) / pt->chunk;
        pt->item0 = j->n_items;
        j->n_items += pt->n_chunks * n_tn;
    }
    li_cpu_lanes_init(&j->lanes, j->n_items, nth);
}

/* How this backend multiplies a weight: with its kernels (the table's
 * activation type: Q8_0 / Q8_1 integer dots, f32 for float weights), with
 * the scalar reference, or not at all (weight_prepare refuses it). */
typedef enum { MM_NONE = 0, MM_KERNEL, MM_REF } mm_path;

static mm_path matmul_path(const li_weight *w) {
    if (w->scheme != LI_SCHEME_PLAIN) return MM_REF; /* weight_prepare keeps them for the scalar ISA only */
    switch (w->type) {
    case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1:
    case LI_TYPE_Q8_0:
    case LI_TYPE_F32:
    case LI_TYPE_F16:
    case LI_TYPE_BF16: return MM_KERNEL;
    case LI_TYPE_Q8_1: return MM_REF; /* an activation type: as a weight the reference dequantizes it */
    default: return MM_NONE;          /* no kernel: never a guess */
    }
}

/* The activation type of the kernels, or LI_TYPE_COUNT when the reference
 * runs the weight. */
static li_type matmul_act_type(const li_weight *w) {
    return matmul_path(w) == MM_KERNEL ? li_type_vec_dot_type(w->type) : LI_TYPE_COUNT;
}

/* A weight no path takes reached matmul without weight_prepare: a bug */
static void matmul_unknown(const li_cpu *c, const li_weight *w) {
    char where[64];
    snprintf(where, sizeof where, "cpu %s: matmul", c->kern->isa);
    li_type_unreachable(where, w->type);
}

/* y[i](n, m_i) = x(n, k) · W[i](m_i, k)^T for the n_w weights of one job;
 * the caller checked they share k and the activation type. */
static void matmul_run(li_cpu *c, const li_weight *const *w, int n_w, const float *x, float *const *y, float *res,
                       int64_t n) {
    matmul_job j = {.kern = c->kern, .x = x, .k = w[0]->k, .n = n, .at = matmul_act_type(w[0]), .n_parts = n_w};
    int64_t work = 0;
    for (int i = 0; i < n_w; i++) {
        matmul_part *pt = &j.part[i];
        pt->w = w[i];
        pt->y = y[i];
        pt->res = n_w == 1 ? res : NULL;
        pt->pw = c->kern->gemm_q_packed ? li_cpu_packed_of(w[i]) : NULL;
        pt->units = pt->pw ? pt->pw->n_panels : w[i]->m;
        work += w[i]->m * n * w[i]->k;
    }
    const matmul_part *last = &j.part[n_w - 1];
    if (last->pw && n <= 8) { /* memory-bound: warm up the next weight */
        li_cpu_packed_next(last->pw, &j.next_data, &j.next_bytes);
        if (!j.next_bytes) j.next_data = NULL;
    }
    int nth = work < 65536 ? 1 : c->n_threads; /* tiny products: not worth a wake-up */
    if (j.at != LI_TYPE_F32) {
        j.act_stride = li_qact_row_bytes(j.k);
        const size_t need = j.act_stride * (size_t)n;
        if (need > c->act_cap) {
            li_aligned_free(c->act);
            c->act = li_aligned_alloc(need);
            c->act_cap = need;
        }
        j.act = c->act;
        const int qth = (int)LI_MIN(n, (int64_t)(n >= 8 ? nth : 1));
        li_cpu_lanes_init(&j.row_lanes, n, qth);
        li_threadpool_run_sized(c->tp, matmul_quantize, &j, qth, n * j.k);
    }
    matmul_plan(&j, nth);
    li_threadpool_run_shaped(c->tp, matmul_work, &j, (int)LI_MIN((int64_t)nth, j.n_items), work,
                             li_threadpool_rows_shape((int)w[0]->type, n));
}

/* 4-bit group weights this backend packed: A8 when asked for (and the
 * zero points allow it), else A16 with this ISA's kernel, else (scalar)
 * the reference. false: not such a weight. */
static bool q4g_matmul(li_cpu *c, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (!li_q4g_packed_of(w)) return false;
    const bool a8 = c->q4_act == LI_ACT_INT8 && w->act == LI_ACT_F32;
    if (!a8 && (!c->q4g->a16 || !li_q4g_ready(w, false))) return false; /* the reference runs it */
    li_q4g_matmul(c->q4g, c->tp, c->n_threads, &c->q4g_scratch, w, a8 ? LI_ACT_INT8 : LI_ACT_F32, x, y, res, n);
    return true;
}

/* W8A8 / FP8 scheme weights: their own kernels (w8.c), every ISA */
static bool w8_run(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (w->scheme == LI_SCHEME_PLAIN || !li_w8_supported(w)) return false;
    li_cpu *c = cpu_of(be);
    li_w8_matmul(li_w8_kernels_for(c->kern->isa), c->tp, c->n_threads, w, x, y, res, n);
    return true;
}

static void cpu_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    if (n <= 0 || w->m <= 0) return;
    if (q4g_matmul(cpu_of(be), w, x, y, NULL, n)) return;
    if (w8_run(be, w, x, y, NULL, n)) return;
    if (matmul_act_type(w) == LI_TYPE_COUNT) {
        if (matmul_path(w) == MM_NONE) matmul_unknown(cpu_of(be), w);
        li_backend_ref_ops()->matmul(be, w, x, y, n);
        return;
    }
    matmul_run(cpu_of(be), &w, 1, x, &y, NULL, n);
}

static void cpu_matmul_add(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (n <= 0 || w->m <= 0) return;
    if (q4g_matmul(cpu_of(be), w, x, y, res, n)) return;
    if (w8_run(be, w, x, y, res, n)) return;
    if (matmul_act_type(w) == LI_TYPE_COUNT) {
        if (matmul_path(w) == MM_NONE) matmul_unknown(cpu_of(be), w);
        li_backend_ref_ops()->matmul(be, w, x, y, n);
        add_f32(res, y, n * w->m);
        return;
    }
    matmul_run(cpu_of(be), &w, 1, x, &y, res, n);
}

/* Weights that share an input run as one job when they agree on k and on
 * the activation type; otherwise one by one. Every output is the same
 * either way (each is computed whole by the same kernel). */
static void cpu_matmul_multi(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                             int64_t n) {
    if (w[0]->scheme != LI_SCHEME_PLAIN && li_w8_same_job(w, n_w)) { /* one activation quantization */
        const li_cpu *c = cpu_of(be);
        li_w8_matmul_multi(li_w8_kernels_for(c->kern->isa), c->tp, c->n_threads, w, n_w, x, y, NULL, n);
        return;
    }
    li_cpu *c = cpu_of(be);
    if (n > 0 && li_q4g_same_job(c->q4g, c->q4_act, w, n_w)) { /* A8: one activation quantization, one dispatch */
        li_q4g_matmul_multi(c->q4g, c->tp, c->n_threads, &c->q4g_scratch, w, n_w, x, y, n);
        return;
    }
    bool same = n_w <= LI_CPU_MAX_PARTS && n > 0;
    for (int i = 0; same && i < n_w; i++)
        same = w[i]->m > 0 && w[i]->k == w[0]->k && matmul_act_type(w[i]) == matmul_act_type(w[0]) &&
               matmul_act_type(w[i]) != LI_TYPE_COUNT;
    if (!same) {
        for (int i = 0; i < n_w; i++) cpu_matmul(be, w[i], x, y[i], n);
        return;
    }
    matmul_run(cpu_of(be), w, n_w, x, y, NULL, n);
}

/* Refuses what no path here runs, with the ISA and the type's name; the
 * per-call matmul switches then never meet an unknown type. */
static int cpu_weight_prepare(li_backend *be, li_weight *w) {
    const li_cpu *c = cpu_of(be);
    if (matmul_path(w) == MM_NONE) {
        li_log_error("cpu %s: no matmul kernel for %s weights", c->kern->isa, li_type_name(w->type));
        return LI_EUNSUP;
    }
    if (w->scheme != LI_SCHEME_PLAIN) {
        char why[160];
        if (li_weight_check(w, why, sizeof why)) {
            li_log_error("cpu %s: %s", c->kern->isa, why);
            return LI_EINVAL;
        }
        const char *q4g_why = "yet";
        if (li_q4g_supported(w) && !w->packed) { /* every ISA packs them (the scalar one for A8) */
            const int rc = li_q4g_pack(w);
            if (rc == LI_ENOMEM)
                li_log_error("cpu %s: out of memory packing %s weights", c->kern->isa, li_scheme_name(w->scheme));
            if (rc != LI_EUNSUP) return rc;
            q4g_why = "with zero points that are not integers 0..15";
        }
        if (c->kern != &li_cpu_kernels_scalar && !li_w8_supported(w)) {
            li_log_error("cpu %s: no matmul kernel for %s weights (%s codes) %s; isa scalar runs them with the "
                         "reference", c->kern->isa, li_scheme_name(w->scheme), li_type_name(w->type), q4g_why);
            return LI_EUNSUP;
        }
        if (li_w8_pack(li_w8_kernels_for(c->kern->isa), w) == LI_ENOMEM) { /* int8 panels where the ISA has them */
            li_log_error("cpu %s: out of memory packing %s weights", c->kern->isa, li_scheme_name(w->scheme));
            return LI_ENOMEM;
        }
        return 0; /* the W8A8 / FP8 kernels (or the reference) read them */
    }
    if (!c->kern->gemm_q_packed || !li_cpu_pack_supported(w->type) || li_cpu_packed_of(w)) return 0;
    if (w->packed) return 0; /* another backend's layout: leave it */
    const int rc = li_cpu_pack(w);
    return rc == LI_EUNSUP ? 0 : rc; /* odd shapes keep the row path */
}

/* 4-bit group weights keep one panel layout, the mode's (q4g_kernels.h) */
static void cpu_weight_warm(li_backend *be, const li_weight *w) {
    const li_cpu *c = cpu_of(be);
    if (!li_q4g_packed_of(w) || c->q4g == &li_q4g_kernels_scalar) return; /* the reference reads w itself */
    (void)li_q4g_ready(w, c->q4_act == LI_ACT_INT8 && w->act == LI_ACT_F32);
}

static void cpu_weight_release(li_backend *be, li_weight *w) {
    li_cpu_pack_free(w);
    li_q4g_pack_free(w);
    li_w8_pack_free(w);
}

/* ------------------------------------------------------------------------
 * attention and silu
 * ---------------------------------------------------------------------- */

typedef struct {
    const li_cpu_kernels *kern;
    const li_attn_args *a;
    li_kv8_attn_head_fn attn_head; /* kern->attn_head, or the 8-bit KV one (kv_kernels.h) */
    float **scores;
    atomic_long next;      /* next (token, head) pair */
} attn_job;

static void attn_work(void *p, int ith, int nth) {
    attn_job *j = p;
    const li_attn_args *a = j->a;
    const int64_t total = a->n_tokens * a->n_head;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= total) break;
        j->attn_head(a, t / a->n_head, (int)(t % a->n_head), j->scores[ith]);
    }
}

/* The tile path (F16/BF16/F32 KV, an ISA with attn_tile): runs of up to
 * LI_ATTN_TILE consecutive batch tokens of one sequence (a prefill chunk;
 * a decode token is a run of one) x kv heads, so K/V rows are read once for
 * all the query heads and tokens that share them; and where some token has
 * more than LI_ATTN_CHUNK positions, x chunks of positions (li_attn_part),
 * the last of a group's chunks to finish merging them. */
typedef struct {
    const li_cpu_kernels *kern;
    const li_attn_args *a;
    float **scratch;
    const int64_t *tile0;  /* (n_tiles + 1) first token of each tile */
    const int64_t *npos;   /* (n_tiles) positions of each tile's longest token */
    int64_t n_tiles;
    int split;             /* query heads of a group per item: G, or 1 when items are few */
    int64_t total;
    const li_attn_part *part; /* NULL: no token is chunked (or chunks do not fit the blocks); else the batch's */
    int per_item;          /* chunks per item: 1, or all of them where items are many anyway */
    float *local;          /* per_item > 1: each thread's partial sums of its item, local_floats each */
    size_t local_floats;
    atomic_int *done;      /* (n_tiles * kv heads * runs) chunks finished per group */
    li_cpu_lanes lanes;    /* items (tile, kv head, head run, chunk) in contiguous runs */
} attn_tile_job;

#define ATT_ITEM_PF 256 /* positions of the next item's K and V rows fetched */

/* chunks of tile `tile`: those of its longest token */
static int attn_tile_chunks(const attn_tile_job *j, int64_t tile) {
    return j->part ? (int)li_attn_n_chunks(j->npos[tile]) : 1;
}

typedef struct {
    int64_t tile, group; /* group: (tile, kv head, run) */
    int kvh, g0, chunk;
} attn_item;

static attn_item attn_item_of(const attn_tile_job *j, int64_t t) {
    const li_attn_args *a = j->a;
    const int runs = a->n_head / a->n_head_kv / j->split;
    const int64_t n_chunk = j->part ? j->part->n_chunk : 1, per = (n_chunk + j->per_item - 1) / j->per_item;
    const int64_t g = t / per, tile = g / (a->n_head_kv * runs), r = g % (a->n_head_kv * runs);
    return (attn_item){.tile = tile, .group = g, .kvh = (int)(r / runs), .g0 = (int)(r % runs) * j->split,
                       .chunk = (int)(t % per) * j->per_item};
}

/* The first K and V rows item t reads, into L2. In decode every item's
 * cache rows come cold from memory (a whole model's weights streamed through
 * since the last step) and an item alone cannot keep enough misses in
 * flight, so a thread fetches its next item's rows while it computes the
 * current one. */
static void attn_item_prefetch(const attn_tile_job *j, int64_t t) {
    const li_attn_args *a = j->a;
    const attn_item it = attn_item_of(j, t);
    if (it.chunk >= attn_tile_chunks(j, it.tile)) return;
    const int64_t i0 = j->tile0[it.tile];
    /* an item of one chunk reads that chunk's positions; one of a whole tile, its first ATT_ITEM_PF */
    const int64_t lo = (int64_t)it.chunk * LI_ATTN_CHUNK;
    const int64_t hi = LI_MIN(j->npos[it.tile], lo + (j->per_item == 1 && j->part ? LI_ATTN_CHUNK : ATT_ITEM_PF));
    const size_t es = li_kv_elem_size(a->kv->dtype), bytes = (size_t)a->head_dim * es;
    const size_t slot = (size_t)a->n_head_kv * bytes, off = (size_t)it.kvh * bytes;
    const int32_t *bt = li_attn_blocks(a, i0);
    const int64_t bs = a->block_size;
    for (int64_t p = lo, blk = lo / bs, o0 = lo % bs; p < hi; p++) { /* position blk * bs + o0 */
        const size_t at = ((size_t)bt[blk] * (size_t)bs + (size_t)o0) * slot + off;
        for (size_t o = 0; o < bytes; o += 64) {
            li_cpu_prefetch_l2((const char *)a->kv->k + at + o);
            li_cpu_prefetch_l2((const char *)a->kv->v + at + o);
        }
        if (++o0 == bs) {
            o0 = 0;
            blk++;
        }
    }
}

static void attn_tile_item(attn_tile_job *j, int64_t t, int ith) {
    const li_attn_args *a = j->a;
    const attn_item it = attn_item_of(j, t);
    const int nch = attn_tile_chunks(j, it.tile);
    if (it.chunk >= nch) return; /* past this tile's longest token */
    const int64_t i0 = j->tile0[it.tile], i1 = j->tile0[it.tile + 1];
    const int nt = (int)(i1 - i0), G = a->n_head / a->n_head_kv, h0 = it.kvh * G + it.g0;
    float *scratch = j->scratch[ith];
    if (nch == 1) { /* no token of this tile is chunked */
        j->kern->attn_tile(a, i0, nt, it.kvh, it.g0, j->split, 0, j->part, scratch);
        return;
    }
    li_attn_part local;
    const li_attn_part *part = j->part;
    if (j->per_item > 1) { /* all the tile's chunks here: their sums in this thread's own buffer */
        local = *j->part;
        local.data = j->local + (size_t)ith * j->local_floats;
        local.i0 = i0;
        local.h0 = h0;
        local.n_head = j->split;
        part = &local;
    }
    const int c1 = LI_MIN(nch, it.chunk + j->per_item);
    for (int c = it.chunk; c < c1; c++) j->kern->attn_tile(a, i0, nt, it.kvh, it.g0, j->split, c, part, scratch);
    /* the group's last chunk: its chunked tokens' outputs (acq_rel: the
     * other chunks' partial sums are visible here) */
    if (j->per_item == 1 && atomic_fetch_add_explicit(&j->done[it.group], 1, memory_order_acq_rel) != nch - 1) return;
    for (int64_t i = i0; i < i1; i++)
        if ((int64_t)a->pos[i] + 1 > LI_ATTN_CHUNK)
            for (int h = h0; h < h0 + j->split; h++) j->kern->attn_merge(a, part, i, h);
}

/* As matmul_work: lane ith first, front to back, then the others. */
static void attn_tile_work(void *p, int ith, int nth) {
    attn_tile_job *j = p;
    const int L = j->lanes.n;
    for (int d = 0; d < L; d++) {
        const int lane = (ith + d) % L;
        const int64_t end = li_cpu_lanes_end(&j->lanes, lane);
        for (int64_t t; (t = li_cpu_lanes_claim(&j->lanes, lane)) >= 0;) {
            if (t + 1 < end) attn_item_prefetch(j, t + 1);
            attn_tile_item(j, t, ith);
        }
    }
}

static bool cpu_attention_tiles(li_cpu *c, const li_attn_args *a) {
    const int G = a->n_head / a->n_head_kv;
    if (!c->kern->attn_tile || li_kv_is_8bit(a->kv->dtype) || G > 64 || a->head_dim > 256) return false;
    if (a->n_tokens + 1 > c->tiles_cap) {
        c->tiles_cap = 2 * (a->n_tokens + 1);
        free(c->tiles);
        free(c->tile_npos);
        c->tiles = li_xmalloc((size_t)c->tiles_cap * sizeof *c->tiles);
        c->tile_npos = li_xmalloc((size_t)c->tiles_cap * sizeof *c->tile_npos);
    }
    int64_t max_pos = 0, work = 0;
    for (int64_t i = 0; i < a->n_tokens; i++) {
        max_pos = LI_MAX(max_pos, (int64_t)a->pos[i]);
        work += (int64_t)a->pos[i] + 1;
    }
    /* chunks where a token is longer than one and chunks start on block
     * boundaries (the kernel walks the block table from a chunk's block) */
    const bool chunked = max_pos + 1 > LI_ATTN_CHUNK && LI_ATTN_CHUNK % a->block_size == 0;
    const int64_t n_chunk = chunked ? li_attn_n_chunks(max_pos + 1) : 1;
    /* tiles of up to LI_ATTN_TILE tokens, or of half that where the big ones
     * would leave the threads fewer than 2 (tile, kv head, chunk) items each
     * (a verify of 8 drafts at a short context: 8 + 1 tokens, 6 items, not
     * one tile and 3); any tiling gives the same bits */
    int64_t n_tiles = 0, items = 0;
    for (int max_nt = LI_MIN(LI_ATTN_TILE, 64 / G);; max_nt = LI_MAX(1, max_nt / 2)) {
        n_tiles = 0;
        for (int64_t i = 0; i < a->n_tokens; i++)
            if (i == 0 || a->seq[i] != a->seq[i - 1] || i - c->tiles[n_tiles - 1] >= max_nt) c->tiles[n_tiles++] = i;
        c->tiles[n_tiles] = a->n_tokens;
        items = 0;
        for (int64_t t = 0; t < n_tiles; t++) {
            int64_t n_max = 0;
            for (int64_t i = c->tiles[t]; i < c->tiles[t + 1]; i++) n_max = LI_MAX(n_max, (int64_t)a->pos[i] + 1);
            c->tile_npos[t] = n_max;
            items += chunked ? li_attn_n_chunks(n_max) : 1;
        }
        if (items * a->n_head_kv >= 2 * c->n_threads || max_nt <= LI_ATTN_TILE / 2) break;
    }
    const size_t need = li_attn_tile_scratch(a, chunked ? LI_ATTN_CHUNK : max_pos);
    if (need > c->scores_cap) {
        const size_t cap = LI_MAX(need, 2 * c->scores_cap);
        for (int t = 0; t < c->n_threads; t++) {
            li_aligned_free(c->scores[t]);
            c->scores[t] = li_aligned_alloc(cap * sizeof(float));
        }
        c->scores_cap = cap;
    }
    /* fewer (tile, kv head, chunk) items than threads: split the query
     * groups so every thread gets a share (the results do not change). Not
     * more eagerly: a whole group shares each K/V row's load and conversion. */
    const int split = items * a->n_head_kv < c->n_threads ? 1 : G;
    const int64_t groups = n_tiles * a->n_head_kv * (G / split);
    /* each chunk an item of its own only where (tile, kv head) items are
     * too few to keep the threads busy and the batch is one tile's worth (a
     * decode step's): the batch's partial sums then sit in one buffer, the
     * last chunk of a group merging them; otherwise an item takes all its
     * tile's chunks, their sums in its thread's buffer. Either way the
     * buffers hold at most one tile of tokens, whatever the batch. */
    const int per_item = groups < 2 * c->n_threads && a->n_tokens <= LI_ATTN_TILE ? 1 : (int)n_chunk;
    li_attn_part part = {.n_head = a->n_head, .n_chunk = n_chunk, .stride = (a->head_dim + 2 + 15) & ~15};
    const size_t local_floats = (size_t)LI_ATTN_TILE * (size_t)G * (size_t)n_chunk * (size_t)part.stride;
    if (chunked) {
        const size_t pf = per_item == 1 ? (size_t)a->n_tokens * (size_t)a->n_head * (size_t)n_chunk * (size_t)part.stride
                                        : (size_t)c->n_threads * local_floats;
        if (pf > c->attn_part_cap) {
            c->attn_part_cap = LI_MAX(pf, 2 * c->attn_part_cap);
            li_aligned_free(c->attn_part);
            c->attn_part = li_aligned_alloc(c->attn_part_cap * sizeof(float));
        }
        if (per_item == 1) /* groups < 2 n_threads: c->attn_done holds them */
            for (int64_t g = 0; g < groups; g++) atomic_init(&c->attn_done[g], 0);
        part.data = c->attn_part;
    }
    attn_tile_job j = {.kern = c->kern, .a = a, .scratch = c->scores, .tile0 = c->tiles, .npos = c->tile_npos,
                       .n_tiles = n_tiles, .split = split, .total = groups * ((n_chunk + per_item - 1) / per_item),
                       .part = chunked ? &part : NULL, .per_item = per_item, .local = c->attn_part,
                       .local_floats = local_floats, .done = c->attn_done};
    work *= (int64_t)a->n_head * a->head_dim;
    const int nth = work < 32768 ? 1 : c->n_threads;
    li_cpu_lanes_init(&j.lanes, j.total, nth);
    li_threadpool_run_shaped(c->tp, attn_tile_work, &j, nth, work,
                             li_threadpool_rows_shape(a->kv->dtype, a->n_tokens));
    return true;
}

static void cpu_attention(li_backend *be, const li_attn_args *a) {
    li_cpu *c = cpu_of(be);
    if (cpu_attention_tiles(c, a)) return;
    int64_t max_pos = 0, work = 0;
    for (int64_t i = 0; i < a->n_tokens; i++) {
        max_pos = LI_MAX(max_pos, (int64_t)a->pos[i]);
        work += (int64_t)a->pos[i] + 1;
    }
    if ((size_t)max_pos + 1 > c->scores_cap) {
        size_t cap = LI_MAX((size_t)max_pos + 1, 2 * c->scores_cap);
        for (int t = 0; t < c->n_threads; t++) {
            li_aligned_free(c->scores[t]);
            c->scores[t] = li_aligned_alloc(cap * sizeof(float));
        }
        c->scores_cap = cap;
    }
    attn_job j = {.kern = c->kern, .a = a, .scores = c->scores,
                  .attn_head = li_kv_is_8bit(a->kv->dtype) ? li_kv8_attn_head_for(c->kern->family) : c->kern->attn_head};
    atomic_init(&j.next, 0);
    work *= (int64_t)a->n_head * a->head_dim;
    li_threadpool_run_shaped(c->tp, attn_work, &j, work < 32768 ? 1 : c->n_threads, work,
                             li_threadpool_rows_shape(a->kv->dtype, a->n_tokens));
}

typedef struct {
    const li_cpu_kernels *kern;
    float *g;
    const float *u;
    int64_t n, dim;
    atomic_long next;      /* next row */
} silu_job;

static void silu_work(void *p, int ith, int nth) {
    silu_job *j = p;
    for (;;) {
        const int64_t r = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (r >= j->n) break;
        j->kern->silu_mul(j->g + r * j->dim, j->u + r * j->dim, j->dim);
    }
}

static void cpu_silu_mul(li_backend *be, float *g, const float *u, int64_t n, int64_t dim) {
    li_cpu *c = cpu_of(be);
    silu_job j = {.kern = c->kern, .g = g, .u = u, .n = n, .dim = dim};
    atomic_init(&j.next, 0);
    li_threadpool_run_sized(c->tp, silu_work, &j, n * dim >= 32768 ? (int)LI_MIN((int64_t)c->n_threads, n) : 1, n * dim);
}

/* ------------------------------------------------------------------------
 * small ops
 * ---------------------------------------------------------------------- */

static void cpu_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    const li_cpu_packed *pw = li_cpu_packed_of(w);
    if (!pw) {
        li_backend_ref_ops()->get_rows(be, w, ids, n, out);
        return;
    }
    /* the original rows' pages were let go after packing: read the panels */
    for (int64_t r = 0; r < n; r++) li_cpu_packed_get_row(pw, ids[r], out + r * w->k);
}

/* The small per-row ops keep the reference's arithmetic exactly (so every
 * ISA matches ops_ref.c bit for bit); what changes is that big batches
 * (prefill) split rows over the threads, and rmsnorm works on several rows
 * at a time (8 in the AVX-512 kernel, 4 here) so their double-precision sums
 * (a chain of dependent adds each) run side by side. */

typedef struct {
    void (*rows)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
    int64_t n, chunk;
    atomic_long next;      /* next chunk */
} rows_job;

static void rows_work(void *p, int ith, int nth) {
    rows_job *j = p;
    for (;;) {
        const int64_t r0 = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * j->chunk;
        if (r0 >= j->n) break;
        j->rows(j->ctx, r0, LI_MIN(r0 + j->chunk, j->n));
    }
}

/* rows(ctx, r0, r1) over [0, n), on the threads when the work is worth a
 * hand-off: `cycles`, a rough cost estimate, of 32768 or more (~10 us).
 * Chunks are whole multiples of `align` rows (a kernel's row group). */
static void rows_run(li_cpu *c, void (*rows)(void *, int64_t, int64_t), void *ctx, int64_t n, int64_t cycles,
                     int64_t align) {
    const int nth = cycles >= 32768 && n > 1 ? (int)LI_MIN((int64_t)c->n_threads, n) : 1;
    if (nth == 1) {
        rows(ctx, 0, n);
        return;
    }
    const int64_t chunk = LI_MAX((n + 4 * nth - 1) / (4 * nth), 1);
    rows_job j = {.rows = rows, .ctx = ctx, .n = n, .chunk = (chunk + align - 1) / align * align};
    atomic_init(&j.next, 0);
    /* one job fn for every row op: each op its own class */
    li_threadpool_run_shaped(c->tp, rows_work, &j, nth, cycles, li_threadpool_fn_shape((uintptr_t)rows, 0));
}

typedef struct {
    const li_cpu_kernels *kern;
    const float *x, *w;
    float *y;
    int64_t dim;
    float eps;
} rmsnorm_ctx;

static void rmsnorm_rows(void *p, int64_t r0, int64_t r1) {
    const rmsnorm_ctx *c = p;
    const int64_t dim = c->dim;
    if (c->kern->rmsnorm) {
        c->kern->rmsnorm(c->x + r0 * dim, c->w, c->y + r0 * dim, r1 - r0, dim, c->eps);
        return;
    }
    for (int64_t r = r0; r < r1; r += 4) {
        const int nr = (int)LI_MIN((int64_t)4, r1 - r);
        double sum[4] = {0, 0, 0, 0}; /* as the reference: squares summed in double, in order */
        if (nr == 4) {
            const float *x0 = c->x + r * dim, *x1 = x0 + dim, *x2 = x1 + dim, *x3 = x2 + dim;
            for (int64_t j = 0; j < dim; j++) {
                sum[0] += (double)(x0[j] * x0[j]);
                sum[1] += (double)(x1[j] * x1[j]);
                sum[2] += (double)(x2[j] * x2[j]);
                sum[3] += (double)(x3[j] * x3[j]);
            }
        } else {
            for (int i = 0; i < nr; i++) {
                const float *xr = c->x + (r + i) * dim;
                double s = 0.0; /* a register, not sum[i]: the chain would wait on memory */
                for (int64_t j = 0; j < dim; j++) s += (double)(xr[j] * xr[j]);
                sum[i] = s;
            }
        }
        for (int i = 0; i < nr; i++) {
            const float *xr = c->x + (r + i) * dim;
            float *yr = c->y + (r + i) * dim;
            const float scale = 1.0f / sqrtf((float)(sum[i] / (double)dim) + c->eps);
            for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] * scale) * c->w[j];
        }
    }
}

static void cpu_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim,
                        float eps) {
    li_cpu *c = cpu_of(be);
    rmsnorm_ctx ctx = {.kern = c->kern, .x = x, .w = w, .y = y, .dim = dim, .eps = eps};
    rows_run(c, rmsnorm_rows, &ctx, n, n * dim * 2, 8); /* a dependent double add per element; 8-row groups */
}

typedef struct {
    const li_cpu_kernels *kern;
    float *x;
    const int32_t *pos;
    float *cs;             /* (n, 2, half) */
    int n_heads, head_dim, half, neox;
    float theta_scale;
} rope_ctx;

/* the reference's angles (ops_ref.c): one multiply per pair, then cosf/sinf */
static void rope_angle_rows(void *p, int64_t i0, int64_t i1) {
    const rope_ctx *c = p;
    for (int64_t i = i0; i < i1; i++) {
        float *cs = c->cs + i * 2 * c->half, angle = (float)c->pos[i];
        for (int j = 0; j < c->half; j++, angle *= c->theta_scale) {
            cs[j] = cosf(angle);
            cs[c->half + j] = sinf(angle);
        }
    }
}

static void rope_rotate_generic(float *x, const float *cs, int64_t n, int n_heads, int head_dim, int half,
                                int neox) {
    for (int64_t i = 0; i < n; i++, cs += 2 * half)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (i * n_heads + h) * head_dim;
            for (int j = 0; j < half; j++) {
                const int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[j] - x1 * cs[half + j];
                v[b] = x0 * cs[half + j] + x1 * cs[j];
            }
        }
}

static void rope_rows(void *p, int64_t i0, int64_t i1) {
    const rope_ctx *c = p;
    void (*rotate)(float *, const float *, int64_t, int, int, int, int) =
        c->kern->rope_rotate ? c->kern->rope_rotate : rope_rotate_generic;
    rotate(c->x + i0 * c->n_heads * c->head_dim, c->cs + i0 * 2 * c->half, i1 - i0, c->n_heads, c->head_dim,
           c->half, c->neox);
}

static void cpu_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int n_rot,
                     float theta, int neox) {
    li_cpu *c = cpu_of(be);
    const int half = n_rot / 2;
    rope_ctx ctx = {.kern = c->kern, .x = x, .pos = pos, .n_heads = n_heads, .head_dim = head_dim, .half = half, .neox = neox,
                    .theta_scale = powf(theta, -2.0f / (float)n_rot)};
    const bool same = n == c->rope_n && half == c->rope_half && ctx.theta_scale == c->rope_scale &&
                      !memcmp(pos, c->rope_pos, (size_t)n * sizeof *pos);
    if (!same) {
        const size_t need = (size_t)n * (size_t)half * 2;
        if (need > c->rope_cs_cap) {
            c->rope_cs_cap = LI_MAX(need, 2 * c->rope_cs_cap);
            free(c->rope_cs);
            c->rope_cs = li_xmalloc(c->rope_cs_cap * sizeof(float));
        }
        if (n > c->rope_pos_cap) {
            c->rope_pos_cap = LI_MAX(n, 2 * c->rope_pos_cap);
            free(c->rope_pos);
            c->rope_pos = li_xmalloc((size_t)c->rope_pos_cap * sizeof(int32_t));
        }
        ctx.cs = c->rope_cs;
        c->rope_n = -1; /* invalid while it is rewritten */
        rows_run(c, rope_angle_rows, &ctx, n, n * n_rot * 20, 1); /* cosf + sinf per pair */
        memcpy(c->rope_pos, pos, (size_t)n * sizeof *pos);
        c->rope_n = n;
        c->rope_half = half;
        c->rope_scale = ctx.theta_scale;
    }
    ctx.cs = c->rope_cs;
    rows_run(c, rope_rows, &ctx, n, n * n_heads * n_rot, 1);
}

typedef struct {
    float *y;
    const float *x;
} add_ctx;

static void add_rows(void *p, int64_t j0, int64_t j1) {
    const add_ctx *c = p;
    add_f32(c->y + j0, c->x + j0, j1 - j0);
}

static void cpu_add(li_backend *be, float *y, const float *x, int64_t n) {
    add_ctx ctx = {.y = y, .x = x};
    rows_run(cpu_of(be), add_rows, &ctx, n, n / 2, 1); /* memory-bound: only big ones */
}

typedef struct {
    void (*row)(float *x, const float *s, int64_t dim, int64_t block);
    float *x;
    const float *s;
    int64_t dim, block;
} hadamard_ctx;

static void hadamard_rows(void *p, int64_t r0, int64_t r1) {
    const hadamard_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) c->row(c->x + r * c->dim, c->s, c->dim, c->block);
}

/* the ISA's row (the reference's bits), rows over the threads for big batches: ~dim * log2(block) adds a row */
static void cpu_hadamard(li_backend *be, float *x, const float *s, int64_t n, int64_t dim, int64_t block) {
    const li_cpu_kernels *k = cpu_of(be)->kern;
    hadamard_ctx ctx = {.row = k->hadamard ? k->hadamard : li_ref_hadamard, .x = x, .s = s, .dim = dim, .block = block};
    int64_t lg = 0;
    while (((int64_t)1 << lg) < block) lg++;
    rows_run(cpu_of(be), hadamard_rows, &ctx, n, n * dim * (lg + 2), 1);
}

static void cpu_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                         int64_t n_tokens, int n_head_kv, int head_dim) {
    if (li_kv_is_8bit(kv->dtype)) { /* FP8 / INT8: quantize with this ISA (same bytes as the reference) */
        li_kv8_store(kv, k, v, slot, n_tokens, n_head_kv, head_dim, li_kv8_head_for(cpu_of(be)->kern->family));
        return;
    }
    const li_kv16_row_fn row16 = li_kv16_row_for(cpu_of(be)->kern->family); /* same bytes as the reference */
    if (row16 && (kv->dtype == LI_TYPE_F16 || kv->dtype == LI_TYPE_BF16)) {
        li_kv16_store_rows(kv, k, v, slot, n_tokens, (int64_t)n_head_kv * head_dim, row16);
        return;
    }
    li_backend_ref_ops()->kv_store(be, kv, k, v, slot, n_tokens, n_head_kv, head_dim);
}

static const li_backend_ops cpu_ops = {
    .name = "cpu",
    LI_HOST_BUFFER_OPS,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .matmul_add = cpu_matmul_add,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .hadamard = cpu_hadamard,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .weight_prepare = cpu_weight_prepare,
    .weight_release = cpu_weight_release,
    .weight_warm = cpu_weight_warm,
};

/* ------------------------------------------------------------------------
 * init / free
 * ---------------------------------------------------------------------- */

int li_backend_cpu_init(li_backend *be, int n_threads, const char *isa, li_error *err) {
    memset(be, 0, sizeof *be);
    const int avail = cpus_online();
    if (n_threads <= 0 || n_threads > avail) n_threads = avail; /* more threads than cores only contend */
    if (isa && !strcmp(isa, "ggml")) { /* llama.cpp's arithmetic */
        __builtin_cpu_init();
        return li_backend_ggml_init(be, n_threads, have_avx2(), err);
    }
    const li_cpu_kernels *kern = NULL;
    int rc = isa_pick(isa, &kern, err);
    if (rc) return rc;
    li_cpu *c = li_xcalloc(1, sizeof *c);
    c->kern = kern;
    c->n_threads = n_threads;
    c->tp = li_threadpool_init(n_threads);
    if (!c->tp) {
        free(c);
        return li_error_set(err, LI_ENOMEM, "cpu: cannot start %d threads", n_threads);
    }
    c->scores = li_xcalloc((size_t)n_threads, sizeof *c->scores);
    c->attn_done = li_xmalloc((size_t)(2 * n_threads) * sizeof *c->attn_done);
    c->q4g = li_q4g_kernels_for(kern->isa);
    be->ops = &cpu_ops;
    be->n_threads = n_threads;
    be->impl = c;
    li_log_debug("cpu backend: %d threads, isa %s", n_threads, kern->isa);
    return 0;
}

void li_backend_cpu_free(li_backend *be) {
    if (be->impl && li_backend_is_ggml(be)) {
        li_backend_ggml_free(be);
        return;
    }
    li_cpu *c = be->impl;
    if (!c) return;
    li_threadpool_free(c->tp);
    for (int t = 0; t < c->n_threads; t++) li_aligned_free(c->scores[t]);
    free(c->scores);
    free(c->tiles);
    free(c->tile_npos);
    li_aligned_free(c->attn_part);
    free(c->attn_done);
    free(c->rope_cs);
    free(c->rope_pos);
    li_aligned_free(c->act);
    li_q4g_scratch_free(&c->q4g_scratch);
    free(c);
    memset(be, 0, sizeof *be);
}

int li_backend_cpu_set_q4_act(li_backend *be, li_act_quant act, li_error *err) {
    if (!be->impl || li_backend_is_ggml(be))
        return li_error_set(err, LI_EUNSUP, "cpu: only the cpu backend (not isa ggml) runs 4-bit group weights");
    if (act != LI_ACT_F32 && act != LI_ACT_INT8)
        return li_error_set(err, LI_EINVAL, "cpu: 4-bit weights run with f32 (A16) or int8 (A8) activations, not %s",
                            li_act_quant_name(act));
    cpu_of(be)->q4_act = act;
    return 0;
}

const char *li_backend_cpu_isa(const li_backend *be) {
    if (be->impl && li_backend_is_ggml(be)) return "ggml";
    if (!be->ops || strcmp(be->ops->name, "cpu")) return "none"; /* another backend's impl (cuda) */
    const li_cpu *c = be->impl;
    return c ? c->kern->isa : "none";
}
