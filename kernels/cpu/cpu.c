/* cpu.c — the CPU compute backend.
 *
 * Owns: the thread pool, the choice of ISA level (CPUID at init, or forced),
 * and how each op is split over threads. The arithmetic lives in the ISA
 * kernel tables (ops_scalar.c, ops_avx2.c, ops_avx512.c, see
 * cpu_kernels.h); small elementwise ops reuse the reference single-threaded.
 *
 *   matmul     quantize the activations once (rows over threads), then
 *              tiles of (weight rows x activation rows)
 *   attention  (token, head) pairs
 *   silu_mul   rows, when the batch is large
 * Every split hands out work from an atomic counter: a thread slowed down
 * by another process simply takes less (see threadpool.h). */
#define _GNU_SOURCE
#include "util/common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/threadpool.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
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
} li_cpu;

static li_cpu *cpu_of(li_backend *be) { return be->impl; }

/* ------------------------------------------------------------------------
 * ISA choice
 * ---------------------------------------------------------------------- */

static bool have_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static bool have_avx512(void) {
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

static int isa_pick(const char *isa, const li_cpu_kernels **out, li_error *err) {
    __builtin_cpu_init();
    if (!isa || !*isa || !strcmp(isa, "auto")) {
        *out = have_avx512() ? &li_cpu_kernels_avx512 : have_avx2() ? &li_cpu_kernels_avx2 : &li_cpu_kernels_scalar;
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
    return li_error_set(err, LI_EINVAL, "cpu: unknown isa '%s' (expected auto, scalar, avx2 or avx512)", isa);
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
 * ---------------------------------------------------------------------- */

typedef struct {
    const li_cpu_kernels *kern;
    const li_weight *w;
    const float *x;        /* (n, k) */
    float *y;              /* (n, m) */
    int64_t n;
    li_type at;            /* activation type: Q8_0, Q8_1, or F32 for float weights */
    void *act;             /* (n) packed rows of act_stride bytes */
    size_t act_stride;
    int64_t tile_m, tile_n, n_tiles_m, n_tiles;
    atomic_long next_row;  /* next activation row to quantize */
    atomic_long next;      /* next tile to take */
} matmul_job;

static void matmul_quantize(void *p, int ith, int nth) {
    matmul_job *j = p;
    const int64_t k = j->w->k;
    for (;;) {
        const int64_t r = atomic_fetch_add_explicit(&j->next_row, 1, memory_order_relaxed);
        if (r >= j->n) break;
        j->kern->quantize_act(j->at, j->x + r * k, (char *)j->act + r * j->act_stride, k);
    }
}

static void matmul_tiles(void *p, int ith, int nth) {
    matmul_job *j = p;
    const li_weight *w = j->w;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= j->n_tiles) break;
        const int64_t i0 = (t % j->n_tiles_m) * j->tile_m, r0 = (t / j->n_tiles_m) * j->tile_n;
        const int64_t mi = LI_MIN(j->tile_m, w->m - i0), nr = LI_MIN(j->tile_n, j->n - r0);
        const char *wrows = (const char *)w->data + i0 * w->row_bytes;
        float *y = j->y + r0 * w->m + i0;
        if (j->at == LI_TYPE_F32)
            j->kern->gemm_f(w->type, w->k, wrows, w->row_bytes, mi, j->x + r0 * w->k, w->k, nr, y, w->m);
        else
            j->kern->gemm_q(w->type, w->k, wrows, w->row_bytes, mi, (const char *)j->act + r0 * j->act_stride,
                            j->act_stride, nr, y, w->m);
    }
}

/* Tile shape: a weight tile small enough to stay in L1/L2 while a block of
 * activation rows sweeps over it, and enough tiles to balance the threads. */
static void matmul_plan(matmul_job *j, int nth) {
    const int64_t m = j->w->m, n = j->n;
    const size_t row_bytes = j->w->row_bytes ? j->w->row_bytes : 1;
    j->tile_n = n <= 64 ? n : 64;
    int64_t tm = (int64_t)(32768 / row_bytes); /* ~32 KiB of weights */
    tm = LI_MAX(tm, 4);
    const int64_t n_tn = (n + j->tile_n - 1) / j->tile_n;
    /* at least ~4 tiles per thread when there are few activation blocks */
    const int64_t want = (int64_t)nth * 4;
    if (n_tn * ((m + tm - 1) / tm) < want) tm = LI_MAX((m * n_tn + want - 1) / want, 4);
    tm = (tm + 3) & ~(int64_t)3;
    j->tile_m = LI_MIN(tm, m);
    j->n_tiles_m = (m + j->tile_m - 1) / j->tile_m;
    j->n_tiles = j->n_tiles_m * n_tn;
    atomic_init(&j->next, 0);
}

static void cpu_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    li_cpu *c = cpu_of(be);
    if (n <= 0 || w->m <= 0) return;
    li_type at = li_type_vec_dot_type(w->type);
    const bool is_float = w->type == LI_TYPE_F32 || w->type == LI_TYPE_F16 || w->type == LI_TYPE_BF16;
    if (at == LI_TYPE_F32 && !is_float) {
        /* a type the kernels do not know (e.g. Q8_1 weights): dequantize */
        li_backend_ref_ops()->matmul(be, w, x, y, n);
        return;
    }
    matmul_job j = {.kern = c->kern, .w = w, .x = x, .y = y, .n = n, .at = at};
    const int64_t work = w->m * n * w->k;
    int nth = work < 65536 ? 1 : c->n_threads; /* tiny products: not worth a wake-up */
    if (at != LI_TYPE_F32) {
        j.act_stride = li_qact_row_bytes(at, w->k);
        const size_t need = j.act_stride * (size_t)n;
        if (need > c->act_cap) {
            li_aligned_free(c->act);
            c->act = li_aligned_alloc(need);
            c->act_cap = need;
        }
        j.act = c->act;
        atomic_init(&j.next_row, 0);
        li_threadpool_run(c->tp, matmul_quantize, &j, n >= 4 ? nth : 1);
    }
    matmul_plan(&j, nth);
    li_threadpool_run(c->tp, matmul_tiles, &j, (int)LI_MIN((int64_t)nth, j.n_tiles));
}

/* ------------------------------------------------------------------------
 * attention and silu
 * ---------------------------------------------------------------------- */

typedef struct {
    const li_cpu_kernels *kern;
    const li_attn_args *a;
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
        j->kern->attn_head(a, t / a->n_head, (int)(t % a->n_head), j->scores[ith]);
    }
}

static void cpu_attention(li_backend *be, const li_attn_args *a) {
    li_cpu *c = cpu_of(be);
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
    attn_job j = {.kern = c->kern, .a = a, .scores = c->scores};
    atomic_init(&j.next, 0);
    work *= (int64_t)a->n_head * a->head_dim;
    li_threadpool_run(c->tp, attn_work, &j, work < 32768 ? 1 : c->n_threads);
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
    li_threadpool_run(c->tp, silu_work, &j, n * dim >= 32768 ? (int)LI_MIN((int64_t)c->n_threads, n) : 1);
}

/* ------------------------------------------------------------------------
 * small ops: single-threaded, shared with the reference
 * ---------------------------------------------------------------------- */

static void cpu_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    li_backend_ref_ops()->get_rows(be, w, ids, n, out);
}

static void cpu_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim,
                        float eps) {
    li_backend_ref_ops()->rmsnorm(be, x, w, y, n, dim, eps);
}

static void cpu_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int n_rot,
                     float theta, int neox) {
    /* the reference's angles, computed once per token instead of per head */
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    float cs[2 * 256], *cache = half <= 256 ? cs : li_xmalloc(2 * (size_t)half * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float angle = (float)pos[i];
        for (int j = 0; j < half; j++, angle *= theta_scale) {
            cache[2 * j] = cosf(angle);
            cache[2 * j + 1] = sinf(angle);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (i * n_heads + h) * head_dim;
            for (int j = 0; j < half; j++) {
                const float c = cache[2 * j], s = cache[2 * j + 1];
                const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
                const float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * c - x1 * s;
                v[i1] = x0 * s + x1 * c;
            }
        }
    }
    if (cache != cs) free(cache);
}

static void cpu_add(li_backend *be, float *y, const float *x, int64_t n) {
    li_backend_ref_ops()->add(be, y, x, n);
}

static void cpu_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                         int64_t n_tokens, int n_head_kv, int head_dim) {
    li_backend_ref_ops()->kv_store(be, kv, k, v, slot, n_tokens, n_head_kv, head_dim);
}

static const li_backend_ops cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .weight_prepare = NULL,
    .weight_release = NULL,
};

/* ------------------------------------------------------------------------
 * init / free
 * ---------------------------------------------------------------------- */

int li_backend_cpu_init(li_backend *be, int n_threads, const char *isa, li_error *err) {
    memset(be, 0, sizeof *be);
    const li_cpu_kernels *kern;
    int rc = isa_pick(isa, &kern, err);
    if (rc) return rc;
    const int avail = cpus_online();
    if (n_threads <= 0 || n_threads > avail) n_threads = avail; /* more threads than cores only contend */
    li_cpu *c = li_xcalloc(1, sizeof *c);
    c->kern = kern;
    c->n_threads = n_threads;
    c->tp = li_threadpool_init(n_threads);
    if (!c->tp) {
        free(c);
        return li_error_set(err, LI_ENOMEM, "cpu: cannot start %d threads", n_threads);
    }
    c->scores = li_xcalloc((size_t)n_threads, sizeof *c->scores);
    be->ops = &cpu_ops;
    be->n_threads = n_threads;
    be->impl = c;
    li_log_debug("cpu backend: %d threads, isa %s", n_threads, kern->isa);
    return 0;
}

void li_backend_cpu_free(li_backend *be) {
    li_cpu *c = be->impl;
    if (!c) return;
    li_threadpool_free(c->tp);
    for (int t = 0; t < c->n_threads; t++) li_aligned_free(c->scores[t]);
    free(c->scores);
    li_aligned_free(c->act);
    free(c);
    memset(be, 0, sizeof *be);
}

const char *li_backend_cpu_isa(const li_backend *be) {
    const li_cpu *c = be->impl;
    return c ? c->kern->isa : "none";
}
