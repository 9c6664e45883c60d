/* bench_kernels.c — micro benchmark of the CPU backend's matmul and
 * attention, and of one decode token's full set of matvecs for a
 * SmolLM2-135M-shaped model (30 layers, 576 hidden, 1536 FFN, 9/3 heads,
 * Q4_1 layers, 49152-vocab Q8_0 output); the machine's limits; and where a
 * real decode step's time goes, op by op.
 *
 * Built by CMake as build/bench_kernels (x86-64).
 * Run: build/bench_kernels [threads] [isa]     kernels (defaults: all cores, auto)
 *      build/bench_kernels --peak [threads] [auto|avx2|avx512]
 *                                             machine limits (bench_llama_cpp.py)
 *      build/bench_kernels --verify R CTX STEPS  one sequence at context CTX
 *                                             running R rows a step (a verify)
 *      build/bench_kernels --forward S STEPS  the default model (LUAINFER_MODEL; LI_BENCH_ISA:
 *                                             the kernels, default auto) decoding S
 *                                             sequences in lockstep (2 threads,
 *                                             F16 KV): time per op per step
 *      build/bench_kernels --q4 [threads] [rounds] [isa]
 *      build/bench_kernels --q4-stream [threads] [rounds] [isa]
 *                                             4-bit group weights (AWQ layout,
 *                                             group 64) run A16 and A8 against
 *                                             Q4_1, side by side, alternating
 * Each takes --json FILE and --plot FILE (bench_results.h): its numbers as
 * rows, and a bar chart of them. */
#include "util/common.h"
#include "backend.h"
#include "model/forward.h"
#include "quant/quant4.h"
#include "bench/bench_results.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static li_bench_results res; /* --json / --plot: every mode's numbers */

/* a row of the results: name and one number */
static cJSON *rec(const char *name, const char *key, double v) {
    cJSON *row = li_bench_results_row(&res, "name", name);
    cJSON_AddNumberToObject(row, key, v);
    return row;
}
static float rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static li_backend be;

/* A random weight, prepared (repacked) for the backend as the model's are. */
static li_weight weight_new(li_type t, int64_t k, int64_t m) {
    li_weight w = {.type = t, .k = k, .m = m};
    li_type_row_size(t, k, &w.row_bytes);
    void *data = li_aligned_alloc(w.row_bytes * (size_t)m);
    float *row = li_xmalloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < k; j++) row[j] = rnd();
        li_type_get(t)->from_float(row, (char *)data + i * w.row_bytes, k);
    }
    free(row);
    w.data = data;
    if (be.ops->weight_prepare) be.ops->weight_prepare(&be, &w);
    return w;
}

/* A W8A8 weight (types.h: int8 codes, one f32 scale per row), random codes */
static li_weight weight_new_w8a8(int64_t k, int64_t m) {
    li_weight w = {.type = LI_KV_TYPE_INT8, .k = k, .m = m, .scheme = LI_SCHEME_W8A8, .act = LI_ACT_INT8};
    li_type_row_size(w.type, k, &w.row_bytes);
    int8_t *codes = li_aligned_alloc(w.row_bytes * (size_t)m);
    for (int64_t i = 0; i < m * k; i++) codes[i] = (int8_t)((int)(rnd() * 127.0f));
    float *scales = li_xmalloc((size_t)m * sizeof(float));
    for (int64_t i = 0; i < m; i++) scales[i] = 0.01f + 0.001f * (float)(i % 7);
    w.data = codes;
    w.scales = scales;
    if (be.ops->weight_prepare) be.ops->weight_prepare(&be, &w);
    return w;
}

/* Median-ish: the best of `reps` timings of `iters` calls, in ms per call. */
static double time_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n, int iters) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = li_time_now();
        for (int i = 0; i < iters; i++) be->ops->matmul(be, w, x, y, n);
        best = fmin(best, (li_time_now() - t0) / iters);
    }
    return best * 1e3;
}

/* ------------------------------------------------------------------------
 * --peak: what this machine can do at most, for bench_llama_cpp.py
 *   bw_gbs      DRAM read bandwidth: n threads streaming 512 MiB
 *   int8_gmacs  int8 multiply-adds/s on n threads: vpdpbusd zmm with
 *               AVX-512 VNNI (int8_vnni 1), else vpmaddubsw ymm, the AVX2
 *               kernels' product (int8_vnni 0)
 *   fma_gflops  f32 FLOP/s of vfmadd on n threads (zmm, or ymm on AVX2)
 * ---------------------------------------------------------------------- */

typedef struct {
    const char *buf;
    size_t bytes;
    int kind; /* 0 read, 1 vnni, 2 fma */
    double result;
} peak_arg;

/* Each peak loop: PEAK_REPS independent chains (more than latency x
 * throughput) of one instruction, named one by one so they live in
 * registers, each step reading its chain's last result (so nothing is
 * loop-invariant; the values do not matter), pinned by an empty asm. */
#define PEAK_REPS 12
#define PEAK_X12(X, ...)                                                                                       \
    X(0, __VA_ARGS__) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__) X(5, __VA_ARGS__) \
    X(6, __VA_ARGS__) X(7, __VA_ARGS__) X(8, __VA_ARGS__) X(9, __VA_ARGS__) X(10, __VA_ARGS__) X(11, __VA_ARGS__)
#define PK_DECL(i, VT, INIT) VT a##i = INIT(i);
#define PK_STEP(i, STEP) a##i = STEP(a##i);
#define PK_KEEP(i, CON) __asm__ volatile("" : CON(a##i));
#define PK_SUM(i, LANE) s += LANE(a##i);

/* NAME(iters): the chains of VT set by INIT(i), stepped by STEP (after
 * CONSTS), kept with constraint CON, their LANE summed into an ST */
#define PEAK_KERNEL(NAME, TARGET, VT, ST, CONSTS, INIT, STEP, CON, LANE)  \
    __attribute__((target(TARGET))) static double NAME(long iters) {      \
        CONSTS                                                            \
        PEAK_X12(PK_DECL, VT, INIT)                                       \
        for (long n = 0; n < iters; n++) {                                \
            PEAK_X12(PK_STEP, STEP)                                       \
            PEAK_X12(PK_KEEP, CON)                                        \
        }                                                                 \
        ST s = 0;                                                         \
        PEAK_X12(PK_SUM, LANE)                                            \
        return (double)s;                                                 \
    }

/* NAME(b, bytes): streams bytes (4 vectors of W bytes a step) into 4 xors */
#define PEAK_READ(NAME, TARGET, VT, W, ZERO, LOAD, XOR, LANE)                                           \
    __attribute__((target(TARGET))) static double NAME(const char *b, size_t bytes) {                   \
        VT acc0 = ZERO(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                        \
        for (size_t i = 0; i + 4 * (W) <= bytes; i += 4 * (W)) {                                        \
            acc0 = XOR(acc0, LOAD(b + i));                                                              \
            acc1 = XOR(acc1, LOAD(b + i + (W)));                                                        \
            acc2 = XOR(acc2, LOAD(b + i + 2 * (W)));                                                    \
            acc3 = XOR(acc3, LOAD(b + i + 3 * (W)));                                                    \
        }                                                                                               \
        return (double)LANE(XOR(XOR(acc0, acc1), XOR(acc2, acc3)));                                     \
    }

/* AVX-512: vpdpbusd zmm (64 u8 x s8 products into 16 int32), vfmadd zmm */
#define VNNI_STEP(a) _mm512_dpbusd_epi32(a, w, x)
#define FMA512_STEP(a) _mm512_fmadd_ps(a, m, c)
#define LOAD512(p) _mm512_load_si512(p)
PEAK_KERNEL(peak_vnni, "avx512f,avx512vnni", __m512i, int,
            const __m512i w = _mm512_set1_epi8(3); const __m512i x = _mm512_set1_epi8(5);, _mm512_set1_epi32,
            VNNI_STEP, "+v", _mm512_reduce_add_epi32)
PEAK_KERNEL(peak_fma, "avx512f,fma", __m512, float,
            const __m512 m = _mm512_set1_ps(1.0000001f); const __m512 c = _mm512_set1_ps(1e-7f);, _mm512_set1_ps,
            FMA512_STEP, "+v", _mm512_reduce_add_ps)
PEAK_READ(peak_read, "avx512f", __m512i, 64, _mm512_setzero_si512, LOAD512, _mm512_xor_si512, _mm512_reduce_add_epi32)

/* AVX2: vpmaddubsw ymm (32 u8 x s8 products, added in pairs: the AVX2
 * kernels' product; saturating), vfmadd ymm */
#define MADDUBS_STEP(a) _mm256_maddubs_epi16(a, x)
#define FMA256_STEP(a) _mm256_fmadd_ps(a, m, c)
#define LANE0_EPI16(a) _mm256_extract_epi16(a, 0)
#define LANE0_EPI32(a) _mm256_extract_epi32(a, 0)
#define LOAD256(p) _mm256_load_si256((const __m256i *)(p))
PEAK_KERNEL(peak_maddubs, "avx2", __m256i, int, const __m256i x = _mm256_set1_epi8(5);, _mm256_set1_epi16,
            MADDUBS_STEP, "+x", LANE0_EPI16)
PEAK_KERNEL(peak_fma256, "avx2,fma", __m256, float,
            const __m256 m = _mm256_set1_ps(1.0000001f); const __m256 c = _mm256_set1_ps(1e-7f);, _mm256_set1_ps,
            FMA256_STEP, "+x", _mm256_cvtss_f32)
PEAK_READ(peak_read256, "avx2", __m256i, 32, _mm256_setzero_si256, LOAD256, _mm256_xor_si256, LANE0_EPI32)

enum { PEAK_ITERS = 20000000 };

/* one ISA's loops and what one instruction of each does */
typedef struct peak_isa {
    double (*read)(const char *, size_t);
    double (*int8)(long);
    double (*fma)(long);
    double macs, flops; /* per int8 / fma instruction */
    int vnni;
} peak_isa;
static const peak_isa peak_avx512 = {peak_read, peak_vnni, peak_fma, 64, 32, 1},
                      peak_avx2 = {peak_read256, peak_maddubs, peak_fma256, 32, 16, 0};
static const peak_isa *peak_on; /* set once by peak_main */

static void *peak_thread(void *p) {
    peak_arg *a = p;
    a->result = a->kind == 0 ? peak_on->read(a->buf, a->bytes) : a->kind == 1 ? peak_on->int8(PEAK_ITERS)
                                                                                : peak_on->fma(PEAK_ITERS);
    return NULL;
}

/* best of 5: seconds for n threads to each run `kind` (reading its share of buf) */
static double peak_time(int nt, int kind, const char *buf, size_t bytes) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        peak_arg args[64];
        const double t0 = li_time_now();
        for (int i = 0; i < nt; i++) {
            args[i] = (peak_arg){buf + bytes / nt * i, bytes / nt, kind, 0};
            pthread_create(&th[i], NULL, peak_thread, &args[i]);
        }
        double sink = 0;
        for (int i = 0; i < nt; i++) {
            pthread_join(th[i], NULL);
            sink += args[i].result;
        }
        const double t = li_time_now() - t0;
        if (t < best) best = t;
        if (sink == 12345.678) puts(""); /* keep the results alive */
    }
    return best;
}

static int peak_main(int nt, const char *isa) {
    __builtin_cpu_init();
    const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
    const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(isa, "auto") && strcmp(isa, "avx2") && strcmp(isa, "avx512")) {
        fprintf(stderr, "--peak: isa must be auto, avx2 or avx512 (got '%s')\n", isa);
        return 1;
    }
    peak_on = !strcmp(isa, "avx2") ? (has2 ? &peak_avx2 : NULL)
              : !strcmp(isa, "avx512") ? (has512 ? &peak_avx512 : NULL)
              : has512 ? &peak_avx512 : has2 ? &peak_avx2 : NULL;
    if (!peak_on) {
        fprintf(stderr, "--peak: this CPU lacks %s\n",
                !strcmp(isa, "auto") ? "both AVX-512 VNNI and AVX2 with FMA" : !strcmp(isa, "avx2") ? "AVX2 with FMA"
                                                                                   : "AVX-512 VNNI");
        return 1;
    }
    nt = nt > 0 && nt <= 64 ? nt : 2;
    const size_t bytes = (size_t)512 << 20;
    char *buf = li_aligned_alloc(bytes);
    memset(buf, 1, bytes);
    const double tr = peak_time(nt, 0, buf, bytes);
    printf("RESULT bw_gbs %.2f\n", (double)bytes / tr * 1e-9);
    rec("bw_gbs", "value", (double)bytes / tr * 1e-9);
    li_aligned_free(buf);
    const double tv = peak_time(nt, 1, NULL, 0), tf = peak_time(nt, 2, NULL, 0);
    const double int8 = (double)nt * PEAK_ITERS * PEAK_REPS * peak_on->macs / tv * 1e-9;
    const double fma = (double)nt * PEAK_ITERS * PEAK_REPS * peak_on->flops / tf * 1e-9;
    printf("RESULT int8_gmacs %.1f\n", int8);
    printf("RESULT int8_vnni %d\n", peak_on->vnni);
    printf("RESULT fma_gflops %.1f\n", fma);
    rec("int8_gmacs", "value", int8);
    rec("fma_gflops", "value", fma);
    return 0;
}

/* ------------------------------------------------------------------------
 * --forward: a timing wrapper around the backend's ops, driving the real
 * forward pass (model/forward.c) through batched decode steps
 * ---------------------------------------------------------------------- */

enum { OP_MATMUL, OP_GET_ROWS, OP_RMSNORM, OP_ROPE, OP_SILU, OP_ADD, OP_KV_STORE, OP_ATTENTION, OP_COUNT };
static const char *op_names[OP_COUNT] = {"matmul", "get_rows", "rmsnorm", "rope", "silu_mul", "add", "kv_store",
                                         "attention"};
static const li_backend_ops *op_real;
static double op_time[OP_COUNT];
static long op_calls[OP_COUNT];

#define OP_TIMED(idx, call)                                                                                    \
    do {                                                                                                       \
        const double t0_ = li_time_now();                                                                      \
        call;                                                                                                  \
        op_time[idx] += li_time_now() - t0_;                                                                   \
        op_calls[idx]++;                                                                                       \
    } while (0)

static void t_matmul(li_backend *b, const li_weight *w, const float *x, float *y, int64_t n) {
    OP_TIMED(OP_MATMUL, op_real->matmul(b, w, x, y, n));
}
static void t_matmul_multi(li_backend *b, const li_weight *const *w, int n_w, const float *x, float *const *y,
                           int64_t n) {
    OP_TIMED(OP_MATMUL, op_real->matmul_multi(b, w, n_w, x, y, n));
}
static void t_matmul_add(li_backend *b, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    OP_TIMED(OP_MATMUL, op_real->matmul_add(b, w, x, y, res, n));
}
static void t_get_rows(li_backend *b, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    OP_TIMED(OP_GET_ROWS, op_real->get_rows(b, w, ids, n, out));
}
static void t_rmsnorm(li_backend *b, const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps) {
    OP_TIMED(OP_RMSNORM, op_real->rmsnorm(b, x, w, y, n, dim, eps));
}
static void t_rope(li_backend *b, float *x, const int32_t *pos, int64_t n, int nh, int hd, int nr, float th, int neox) {
    OP_TIMED(OP_ROPE, op_real->rope(b, x, pos, n, nh, hd, nr, th, neox));
}
static void t_silu(li_backend *b, float *g, const float *u, int64_t n, int64_t dim) {
    OP_TIMED(OP_SILU, op_real->silu_mul(b, g, u, n, dim));
}
static void t_add(li_backend *b, float *y, const float *x, int64_t n) { OP_TIMED(OP_ADD, op_real->add(b, y, x, n)); }
static void t_kv_store(li_backend *b, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                       int64_t n, int nkv, int hd) {
    OP_TIMED(OP_KV_STORE, op_real->kv_store(b, kv, k, v, slot, n, nkv, hd));
}
static void t_attention(li_backend *b, const li_attn_args *a) { OP_TIMED(OP_ATTENTION, op_real->attention(b, a)); }

/* S sequences with 16-token prompts decode a token each per step; or, with
 * R > 0 (--verify), one sequence with a P0-token prompt runs R rows at
 * positions P0..P0+R-1 every step, as a verify of R-1 drafts that are all
 * rejected (the same slots written again): attention reads P0 positions. */
static int forward_main(int S, int steps, int P0, int R) {
    li_error err = {0};
    li_model *m;
    if (R > 0 ? (R > 64 || P0 < 1 || P0 > 4096) : (S < 1 || S > 512 / P0)) {
        fprintf(stderr, R > 0 ? "--verify R CTX STEPS: 1 <= R <= 64, 1 <= CTX <= 4096\n"
                              : "--forward S STEPS: 1 <= S <= 32, STEPS >= 1\n");
        return 1;
    }
    if (steps < 1) {
        fprintf(stderr, "STEPS >= 1\n");
        return 1;
    }
    const char *isa = getenv("LI_BENCH_ISA"); /* the kernels (default auto), e.g. avx512 against amx */
    if (li_model_load(&m, li_model_default_path(NULL), &err) || li_backend_cpu_init(&be, 2, isa ? isa : "auto", &err) ||
        li_model_prepare(m, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    op_real = be.ops;
    static li_backend_ops timed;
    timed = *op_real;
    timed.matmul = t_matmul;
    /* LI_BENCH_SEPARATE=1: q/k/v and gate/up as separate matmuls, and the
     * residual adds as separate ops (A/B of the fused forms) */
    const char *sep = getenv("LI_BENCH_SEPARATE");
    timed.matmul_multi = op_real->matmul_multi && !(sep && *sep == '1') ? t_matmul_multi : NULL;
    timed.matmul_add = op_real->matmul_add && !(sep && *sep == '1') ? t_matmul_add : NULL;
    timed.get_rows = t_get_rows;
    timed.rmsnorm = t_rmsnorm;
    timed.rope = t_rope;
    timed.silu_mul = t_silu;
    timed.add = t_add;
    timed.kv_store = t_kv_store;
    timed.attention = t_attention;
    be.ops = &timed;

    li_kv_cache kv;
    li_forward fw;
    const int span = R > 0 ? P0 + R : P0 + steps; /* positions each sequence holds */
    const int32_t blocks = (int32_t)(S * ((span + 16) / 16 + 1));
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    if (li_kv_cache_init(&kv, &be, &dims, LI_TYPE_F16, 16, blocks, &err) || li_forward_init(&fw, m, &be, 512, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    li_kv_seq *seqs = li_xcalloc((size_t)S, sizeof *seqs);
    const int64_t stride = (span + 1 + 15) / 16;
    int32_t *tables = li_xcalloc((size_t)(S * stride), sizeof *tables); /* (S, stride) */
    for (int s = 0; s < S; s++) {
        li_kv_seq_init(&seqs[s]);
        li_kv_seq_reserve(&kv, &seqs[s], span + 1);
        memcpy(tables + s * stride, seqs[s].blocks, (size_t)stride * sizeof *tables);
    }
    int32_t tok[512], pos[512], sq[512], rows[512];
    int64_t slot[512];
    const int64_t nv = m->hp.n_vocab;
    const float *logits = NULL;
    for (int c0 = 0; c0 < P0; c0 += 512 / S) { /* the prompts, in batches of up to 512 tokens */
        const int c1 = LI_MIN(P0, c0 + 512 / S);
        int64_t n = 0;
        for (int s = 0; s < S; s++)
            for (int i = c0; i < c1; i++, n++) {
                tok[n] = 100 + (i * 7919 + s * 104729) % 40000;
                pos[n] = i;
                sq[n] = s;
                slot[n] = li_kv_seq_slot(&kv, &seqs[s], i);
                if (i == c1 - 1) rows[s] = (int32_t)n;
            }
        li_batch b = {.n = n, .tokens = tok, .pos = pos, .seq = sq, .slot = slot, .block_table = tables,
                      .n_seqs = S, .bt_stride = stride,
                      .logit_rows = rows, .n_logits = S};
        if (li_forward_run(&fw, m, &be, &kv, &b, NULL, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    logits = li_forward_logits(&fw, m);
    memset(op_time, 0, sizeof op_time);
    memset(op_calls, 0, sizeof op_calls);
    double t_fwd = 0;
    for (int st = 0; st < steps; st++) {
        const int nr = R > 0 ? R : S; /* rows of this step */
        for (int s = 0; s < nr; s++) { /* greedy, outside the timed forward pass */
            const float *l = logits + (R > 0 ? 0 : s) * nv;
            int32_t best = 0;
            for (int32_t j = 1; j < nv; j++)
                if (l[j] > l[best]) best = j;
            tok[s] = R > 0 && s > 0 ? 100 + (s * 7919 + st) % 40000 : best; /* the drafts */
            const int p = R > 0 ? P0 + s : P0 + st;
            sq[s] = R > 0 ? 0 : s;
            pos[s] = p;
            slot[s] = li_kv_seq_slot(&kv, &seqs[sq[s]], p);
            rows[s] = s;
        }
        li_batch d = {.n = nr, .tokens = tok, .pos = pos, .seq = sq, .slot = slot, .block_table = tables,
                      .n_seqs = R > 0 ? 1 : S, .bt_stride = stride,
                      .logit_rows = rows, .n_logits = nr};
        const double t0 = li_time_now();
        li_forward_run(&fw, m, &be, &kv, &d, NULL, &err);
        t_fwd += li_time_now() - t0;
        logits = li_forward_logits(&fw, m);
    }
    if (R > 0)
        printf("verify, %d rows at context %d x %d steps: forward %.3f ms per step\n", R, P0, steps,
               t_fwd / steps * 1e3);
    else
        printf("decode, %d sequence%s x %d steps (contexts %d..%d): forward %.3f ms per step = %.1f tok/s\n", S,
               S > 1 ? "s" : "", steps, P0, P0 + steps, t_fwd / steps * 1e3, S * steps / t_fwd);
    double sum = 0;
    for (int i = 0; i < OP_COUNT; i++) {
        printf("  %-10s %8.3f ms per step (%3ld calls, %8.2f us each)\n", op_names[i], op_time[i] / steps * 1e3,
               op_calls[i] / steps, op_calls[i] ? op_time[i] / op_calls[i] * 1e6 : 0.0);
        cJSON_AddNumberToObject(rec(op_names[i], "ms_per_step", op_time[i] / steps * 1e3), "calls_per_step",
                                (double)op_calls[i] / steps);
        sum += op_time[i];
    }
    printf("  %-10s %8.3f ms per step\n", "the rest", (t_fwd - sum) / steps * 1e3);
    rec("the rest", "ms_per_step", (t_fwd - sum) / steps * 1e3);
    cJSON_AddNumberToObject(res.root, "tok_per_s", (R > 0 ? R : S) * steps / t_fwd);
    for (int s = 0; s < S; s++) {
        li_kv_seq_release(&kv, &seqs[s]);
        li_kv_seq_free(&seqs[s]);
    }
    free(seqs);
    free(tables);
    li_forward_free(&fw);
    li_kv_cache_free(&kv);
    be.ops = op_real;
    li_model_release(m, &be);
    li_model_free(m);
    li_backend_cpu_free(&be);
    return 0;
}

/* ------------------------------------------------------------------------
 * --q4: 4-bit group weights, A16 and A8, against Q4_1 at the model's shapes
 * ---------------------------------------------------------------------- */

typedef struct {
    li_weight w;
    li_q4_result r;
    uint8_t *packed;
} q4_weight;

/* RTN4 of random values, group 64 (576 and 1536 are multiples of 64, not
 * of 128), as an AWQ weight prepared for the backend */

static void q4_weight_new(q4_weight *q, int64_t k, int64_t m) {
    float *v = li_xmalloc((size_t)(k * m) * sizeof(float));
    for (int64_t i = 0; i < k * m; i++) v[i] = rnd();
    li_q4_opts o;
    li_q4_opts_default(&o);
    o.group_size = 64;
    char why[256];
    if (li_q4_rtn(v, m, k, &o, &q->r, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        exit(1);
    }
    q->packed = li_aligned_alloc((size_t)(m * k / 2));
    if (li_q4_weight_view(&q->r, LI_SCHEME_AWQ, LI_ACT_F32, q->packed, &q->w, why, sizeof why) ||
        be.ops->weight_prepare(&be, &q->w)) {
        fprintf(stderr, "q4 weight: %s\n", why);
        exit(1);
    }
    free(v);
}

/* weight_new, built without AVX-512 */
static li_weight q41_weight_new(int64_t k, int64_t m) {
    li_weight w;
    memset(&w, 0, sizeof w);
    w.type = LI_TYPE_Q4_1;
    w.k = k;
    w.m = m;
    li_type_row_size(w.type, k, &w.row_bytes);
    void *data = li_aligned_alloc(w.row_bytes * (size_t)m);
    float *row = li_xmalloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < k; j++) row[j] = rnd();
        li_quantize_row_q4_1_ref(row, (char *)data + i * w.row_bytes, k);
    }
    free(row);
    w.data = data;
    be.ops->weight_prepare(&be, &w);
    return w;
}

static int q4_main(int n_threads, int rounds, const char *isa) {
    li_error err = {0};
    if (li_backend_cpu_init(&be, n_threads, isa, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("cpu backend: isa %s, %d threads; best of %d alternating rounds\n", li_backend_cpu_isa(&be), be.n_threads,
           rounds);
    float *x = li_aligned_alloc(64 * 1536 * sizeof(float)), *y = li_aligned_alloc(64 * 1536 * sizeof(float));
    for (int i = 0; i < 64 * 1536; i++) x[i] = rnd();
    const int64_t shapes[][2] = {{1536, 576}, {576, 1536}, {576, 576}}; /* (m, k): gate/up, down, q/o */
    for (size_t s = 0; s < LI_ARRAY_LEN(shapes); s++) {
        const int64_t m = shapes[s][0], k = shapes[s][1];
        li_weight q41 = q41_weight_new(k, m);
        q4_weight q;
        q4_weight_new(&q, k, m);
        const int64_t ns[] = {1, 8, 16, 64};
        for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
            const int64_t n = ns[ni];
            const int iters = (int)fmax(1, 5e7 / (double)(m * k * n));
            double t[3] = {1e30, 1e30, 1e30}; /* Q4_1, A16, A8 */
            for (int r = 0; r < rounds; r++) {
                t[0] = fmin(t[0], time_matmul(&be, &q41, x, y, n, iters));
                li_backend_cpu_set_q4_act(&be, LI_ACT_F32, &err);
                t[1] = fmin(t[1], time_matmul(&be, &q.w, x, y, n, iters));
                li_backend_cpu_set_q4_act(&be, LI_ACT_INT8, &err);
                t[2] = fmin(t[2], time_matmul(&be, &q.w, x, y, n, iters));
            }
            printf("q4 m=%-5lld k=%-4lld n=%-3lld  q4_1 %8.3f ms  a16 %8.3f ms (%.2fx q4_1)  a8 %8.3f ms (%.2fx q4_1)\n",
                   (long long)m, (long long)k, (long long)n, t[0], t[1], t[0] / t[1], t[2], t[0] / t[2]);
            char name[64];
            snprintf(name, sizeof name, "m%lld k%lld n%lld", (long long)m, (long long)k, (long long)n);
            cJSON *row = rec(name, "q4_1_ms", t[0]);
            cJSON_AddNumberToObject(row, "a16_ms", t[1]);
            cJSON_AddNumberToObject(row, "a8_ms", t[2]);
        }
        be.ops->weight_release(&be, &q41);
        li_aligned_free((void *)q41.data);
        be.ops->weight_release(&be, &q.w);
        li_aligned_free(q.packed);
        li_q4_result_free(&q.r);
    }
    li_aligned_free(x);
    li_aligned_free(y);
    li_backend_cpu_free(&be);
    return 0;
}

/* --q4-stream: decode (n = 1) as the model meets it, the weights streamed
 * from memory: a ring of distinct weights of one shape, over 96 MiB of
 * 4-bit codes in all (three times this machine's L3 and more), one matmul
 * after the other in the order they were prepared (the arena's, as a
 * model's layers are). Q4_1 and A8 alternate, a whole pass each. */
#define Q4_STREAM_BYTES ((size_t)96 << 20)

static int q4_stream_main(int n_threads, int rounds, const char *isa) {
    li_error err = {0};
    if (li_backend_cpu_init(&be, n_threads, isa, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("cpu backend: isa %s, %d threads; streamed weights, best of %d alternating passes\n",
           li_backend_cpu_isa(&be), be.n_threads, rounds);
    float *x = li_aligned_alloc(8 * 1536 * sizeof(float)), *y = li_aligned_alloc(8 * 1536 * sizeof(float));
    for (int i = 0; i < 8 * 1536; i++) x[i] = rnd();
    const int64_t shapes[][2] = {{1536, 576}, {576, 1536}, {576, 576}}; /* (m, k): gate/up, down, q/o */
    for (size_t s = 0; s < LI_ARRAY_LEN(shapes); s++) {
        const int64_t m = shapes[s][0], k = shapes[s][1];
        const int nw = (int)(Q4_STREAM_BYTES / (size_t)(m * k / 2)) + 1;
        li_weight *q41 = li_xmalloc((size_t)nw * sizeof *q41);
        q4_weight *q = li_xmalloc((size_t)nw * sizeof *q);
        for (int i = 0; i < nw; i++) q41[i] = q41_weight_new(k, m);
        for (int i = 0; i < nw; i++) q4_weight_new(&q[i], k, m);
        li_backend_cpu_set_q4_act(&be, LI_ACT_INT8, &err);
        const int64_t ns[] = {1, 2, 3, 8};
        for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
            const int64_t n = ns[ni];
            double t[2] = {1e30, 1e30}; /* Q4_1, A8: ms per matmul */
            for (int r = 0; r < rounds; r++) {
                double t0 = li_time_now();
                for (int i = 0; i < nw; i++) be.ops->matmul(&be, &q41[i], x, y, n);
                t[0] = fmin(t[0], (li_time_now() - t0) / nw * 1e3);
                t0 = li_time_now();
                for (int i = 0; i < nw; i++) be.ops->matmul(&be, &q[i].w, x, y, n);
                t[1] = fmin(t[1], (li_time_now() - t0) / nw * 1e3);
            }
            /* bytes per weight: Q4_1 20 per 32, A8 4-bit codes plus a zero and a scale (8 bytes) per group of 64 */
            const double b41 = (double)(m * k) * 20 / 32, b8 = (double)(m * k) / 2 + (double)(m * k / 64) * 8;
            printf("q4 stream m=%-5lld k=%-4lld n=%-2lld x%-4d q4_1 %7.4f ms (%5.1f GB/s)  a8 %7.4f ms (%5.1f GB/s, "
                   "%.2fx q4_1)\n",
                   (long long)m, (long long)k, (long long)n, nw, t[0], b41 / t[0] * 1e-6, t[1], b8 / t[1] * 1e-6,
                   t[0] / t[1]);
            char name[64];
            snprintf(name, sizeof name, "stream m%lld k%lld n%lld", (long long)m, (long long)k, (long long)n);
            cJSON *row = rec(name, "q4_1_ms", t[0]);
            cJSON_AddNumberToObject(row, "a8_ms", t[1]);
        }
        for (int i = 0; i < nw; i++) {
            be.ops->weight_release(&be, &q41[i]);
            li_aligned_free((void *)q41[i].data);
            be.ops->weight_release(&be, &q[i].w);
            li_aligned_free(q[i].packed);
            li_q4_result_free(&q[i].r);
        }
        free(q41);
        free(q);
    }
    li_aligned_free(x);
    li_aligned_free(y);
    li_backend_cpu_free(&be);
    return 0;
}

static int kernels_main(int argc, char **argv);

int main(int argc, char **argv) {
    if (li_bench_results_init(&res, "kernels", &argc, argv)) return 2;
    int rc;
    if (argc > 1 && !strcmp(argv[1], "--peak")) {
        rc = peak_main(argc > 2 ? atoi(argv[2]) : 2, argc > 3 ? argv[3] : "auto");
        li_bench_results_chart(&res, "name", "value", "GB/s, GMAC/s, GFLOP/s", "machine limits", true);
    } else if (argc > 1 && !strcmp(argv[1], "--q4")) {
        rc = q4_main(argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 5, argc > 4 ? argv[4] : "auto");
        static const char *const v[] = {"q4_1_ms", "a16_ms", "a8_ms"};
        li_bench_results_chart_n(&res, "name", v, 3, "ms per matmul", "4-bit group weights against Q4_1", true);
    } else if (argc > 1 && !strcmp(argv[1], "--q4-stream")) {
        rc = q4_stream_main(argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 5, argc > 4 ? argv[4] : "auto");
        static const char *const v[] = {"q4_1_ms", "a8_ms"};
        li_bench_results_chart_n(&res, "name", v, 2, "ms per matmul", "4-bit decode from memory against Q4_1", true);
    } else if (argc > 1 && !strcmp(argv[1], "--forward")) {
        rc = forward_main(argc > 2 ? atoi(argv[2]) : 1, argc > 3 ? atoi(argv[3]) : 128, 16, 0);
        li_bench_results_chart(&res, "name", "ms_per_step", "ms per step", "a decode step, op by op", false);
    } else if (argc > 1 && !strcmp(argv[1], "--verify")) {
        const int R = argc > 2 ? atoi(argv[2]) : 9;
        if (R < 1) {
            fprintf(stderr, "--verify R CTX STEPS: 1 <= R <= 64, 1 <= CTX <= 4096\n");
            return 1;
        }
        rc = forward_main(1, argc > 4 ? atoi(argv[4]) : 50, argc > 3 ? atoi(argv[3]) : 256, R);
        li_bench_results_chart(&res, "name", "ms_per_step", "ms per step", "a verify step, op by op", false);
    } else {
        rc = kernels_main(argc, argv);
        li_bench_results_chart(&res, "name", "ms", "ms", "CPU kernels", true);
    }
    if (rc) return rc;
    return li_bench_results_finish(&res);
}

static int kernels_main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 0;
    const char *isa = argc > 2 ? argv[2] : "auto";
    li_error err = {0};
    if (li_backend_cpu_init(&be, n_threads, isa, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("cpu backend: isa %s, %d threads\n", li_backend_cpu_isa(&be), be.n_threads);

    float *x = li_aligned_alloc(512 * 1536 * sizeof(float));
    float *y = li_aligned_alloc((size_t)64 * 49152 * sizeof(float));
    for (int i = 0; i < 512 * 1536; i++) x[i] = rnd();

    /* single matmuls */
    const struct {
        li_type t;
        int64_t m, k;
    } shapes[] = {
        {LI_TYPE_Q4_1, 1536, 576}, {LI_TYPE_Q8_0, 1536, 576}, {LI_TYPE_Q4_0, 1536, 576},
        {LI_TYPE_Q8_0, 49152, 576}, {LI_TYPE_F16, 1536, 576}, {LI_TYPE_Q4_1, 576, 1536},
        {LI_KV_TYPE_INT8, 1536, 576}, /* W8A8 (luainfer quantize --method w8a8) */
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        li_weight w = shapes[s].t == LI_KV_TYPE_INT8 ? weight_new_w8a8(shapes[s].k, shapes[s].m)
                                                     : weight_new(shapes[s].t, shapes[s].k, shapes[s].m);
        const int64_t ns[] = {1, 8, 9, 10, 11, 12, 16, 32, 64, 512}; /* 9: a verify of 8 drafts */
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int64_t n = ns[i];
            if (n == 512 && shapes[s].m > 4096) continue;
            const int iters = (int)fmax(1, 2e8 / (double)(w.m * w.k * n));
            const double ms = time_matmul(&be, &w, x, y, n, iters);
            printf("matmul %-4s m=%-5lld k=%-4lld n=%-3lld  %8.3f ms  %7.1f GMAC/s  %6.1f GB/s weights\n",
                   li_type_name(w.type), (long long)w.m, (long long)w.k, (long long)n, ms,
                   (double)(w.m * w.k * n) / ms * 1e-6, (double)w.row_bytes * w.m / ms * 1e-6);
            char name[64];
            snprintf(name, sizeof name, "matmul %s m%lld k%lld n%lld", li_type_name(w.type), (long long)w.m,
                     (long long)w.k, (long long)n);
            cJSON_AddNumberToObject(rec(name, "ms", ms), "gmacs", (double)(w.m * w.k * n) / ms * 1e-6);
        }
        be.ops->weight_release(&be, &w);
        li_aligned_free((void *)w.data);
        free((void *)w.scales);
    }

    /* one decode token: every matvec of a 30-layer SmolLM2-135M */
    enum { L = 30, D = 576, F = 1536, KV = 192, V = 49152 };
    li_weight layers[L][7];
    for (int l = 0; l < L; l++) {
        layers[l][0] = weight_new(LI_TYPE_Q4_1, D, D);  /* q */
        layers[l][1] = weight_new(LI_TYPE_Q4_1, D, KV); /* k */
        layers[l][2] = weight_new(LI_TYPE_Q4_1, D, KV); /* v */
        layers[l][3] = weight_new(LI_TYPE_Q4_1, D, D);  /* o */
        layers[l][4] = weight_new(LI_TYPE_Q4_1, D, F);  /* gate */
        layers[l][5] = weight_new(LI_TYPE_Q4_1, D, F);  /* up */
        layers[l][6] = weight_new(LI_TYPE_Q4_1, F, D);  /* down */
    }
    li_weight out = weight_new(LI_TYPE_Q8_0, D, V);
    static const int64_t nts[] = {1, 9, 64}; /* decode, a verify of 8 drafts, a batch */
    for (size_t ti = 0; ti < sizeof nts / sizeof nts[0]; ti++) {
        const int64_t nt = nts[ti];
        double best = 1e30, best_layers = 1e30;
        for (int rep = 0; rep < 10; rep++) {
            const double t0 = li_time_now();
            for (int l = 0; l < L; l++)
                for (int j = 0; j < 7; j++) be.ops->matmul(&be, &layers[l][j], x, y, nt);
            const double t1 = li_time_now();
            be.ops->matmul(&be, &out, x, y, nt);
            const double t2 = li_time_now();
            best = fmin(best, t2 - t0);
            best_layers = fmin(best_layers, t1 - t0);
        }
        printf("all matvecs, %lld token%s: %.2f ms (layers %.2f ms, output %.2f ms)\n", (long long)nt,
               nt > 1 ? "s" : "", best * 1e3, best_layers * 1e3, (best - best_layers) * 1e3);
        char name[64];
        snprintf(name, sizeof name, "all matvecs n%lld", (long long)nt);
        rec(name, "ms", best * 1e3);
    }

    /* attention: 9 heads / 3 kv heads, dim 64, F16 KV, one token at position P */
    {
        const int bs = 16, nh = 9, nkv = 3, hd = 64;
        for (int P = 128; P <= 2048; P *= 4) {
            const int nblk = P / bs + 1;
            li_kv_layer kv = {.dtype = LI_TYPE_F16};
            const size_t bytes = (size_t)nblk * bs * nkv * hd * 2;
            kv.k = li_aligned_alloc(bytes);
            kv.v = li_aligned_alloc(bytes);
            for (size_t i = 0; i < bytes / 2; i++) {
                ((uint16_t *)kv.k)[i] = li_fp32_to_fp16(rnd());
                ((uint16_t *)kv.v)[i] = li_fp32_to_fp16(rnd());
            }
            int32_t *bt = li_xmalloc((size_t)nblk * sizeof(int32_t));
            for (int i = 0; i < nblk; i++) bt[i] = nblk - 1 - i;
            /* one decode token at P - 1, then a verify of 8 drafts: 9 tokens, the last at P - 1 */
            int32_t pos[9], seq[9] = {0};
            for (int i = 0; i < 9; i++) pos[i] = P - 9 + i;
            for (int nt = 1; nt <= 9; nt += 8) {
                li_attn_args a = {.n_tokens = nt, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .block_size = bs,
                                  .q = x, .out = y, .pos = pos + 9 - nt, .seq = seq, .block_table = bt,
                                  .bt_stride = nblk, .kv = &kv, .scale = 0.125f};
                double best = 1e30;
                for (int rep = 0; rep < 20; rep++) {
                    const double t0 = li_time_now();
                    be.ops->attention(&be, &a);
                    best = fmin(best, li_time_now() - t0);
                }
                char name[64];
                if (nt == 1) {
                    printf("attention f16 decode, context %5d: %8.3f ms per layer\n", P, best * 1e3);
                    snprintf(name, sizeof name, "attention f16 ctx %d", P);
                } else {
                    printf("attention f16 verify %d tokens, context %5d: %8.3f ms per layer\n", nt, P, best * 1e3);
                    snprintf(name, sizeof name, "attention f16 verify%d ctx %d", nt, P);
                }
                rec(name, "ms", best * 1e3);
            }
            li_aligned_free(kv.k);
            li_aligned_free(kv.v);
            free(bt);
        }
    }
    li_backend_cpu_free(&be);
    return 0;
}
