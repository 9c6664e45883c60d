/* bench_kernels.c — micro benchmark of the CPU backend's matmul and
 * attention, and of one decode token's full set of matvecs for a
 * SmolLM2-135M-shaped model (30 layers, 576 hidden, 1536 FFN, 9/3 heads,
 * Q4_1 layers, 49152-vocab Q8_0 output).
 *
 * Not built by CMake. Build from the repo root, after `cmake --build build
 * --target luainfer_core` (only the kernel objects get linked in):
 *   gcc -std=c11 -O2 -Icore -Ikernels bench/bench_kernels.c build/libluainfer_core.a \
 *       -lpthread -lm -o build/bench_kernels
 * Run: build/bench_kernels [threads] [isa]     (defaults: all cores, auto) */
#include "util/common.h"
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
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

int main(int argc, char **argv) {
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
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        li_weight w = weight_new(shapes[s].t, shapes[s].k, shapes[s].m);
        const int64_t ns[] = {1, 64, 512};
        for (int i = 0; i < 3; i++) {
            const int64_t n = ns[i];
            if (n == 512 && shapes[s].m > 4096) continue;
            const int iters = (int)fmax(1, 2e8 / (double)(w.m * w.k * n));
            const double ms = time_matmul(&be, &w, x, y, n, iters);
            printf("matmul %-4s m=%-5lld k=%-4lld n=%-3lld  %8.3f ms  %7.1f GMAC/s  %6.1f GB/s weights\n",
                   li_type_name(w.type), (long long)w.m, (long long)w.k, (long long)n, ms,
                   (double)(w.m * w.k * n) / ms * 1e-6, (double)w.row_bytes * w.m / ms * 1e-6);
        }
        be.ops->weight_release(&be, &w);
        li_aligned_free((void *)w.data);
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
    for (int64_t nt = 1; nt <= 64; nt *= 64) {
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
            int32_t *tables[] = {bt};
            const int32_t pos = P - 1, seq = 0;
            li_attn_args a = {.n_tokens = 1, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .block_size = bs,
                              .q = x, .out = y, .pos = &pos, .seq = &seq, .block_tables = tables, .kv = &kv,
                              .scale = 0.125f};
            double best = 1e30;
            for (int rep = 0; rep < 20; rep++) {
                const double t0 = li_time_now();
                be.ops->attention(&be, &a);
                best = fmin(best, li_time_now() - t0);
            }
            printf("attention f16 decode, context %5d: %8.3f ms per layer\n", P, best * 1e3);
            li_aligned_free(kv.k);
            li_aligned_free(kv.v);
            free(bt);
        }
    }
    li_backend_cpu_free(&be);
    return 0;
}
