/* bench_train.c — training throughput of core/train/ on a real model:
 * tokens/s of forward + backward (+ the AdamW step), the matmul FLOPs
 * they do, and the fraction of this machine's FMA peak that is
 * (docs/benchmarks.md, "Training throughput").
 *
 *   bench_train [--model P] [--seq T] [--batch B] [--steps N] [--train all|norms|layers:A-B|lora:R]
 *               [--threads N] [--ghz G] [--isa 0|1|2] [--json FILE] [--plot FILE]
 *               (--isa: the matmul kernels, scalar, AVX2 or AVX-512; default the best)
 *   bench_train --kernels     the three matmul shapes alone, one thread, at the model's sizes
 * --json and --plot (bench_results.h) hold the tokens/s, or --kernels' GFLOP/s.
 *
 * Peak = threads × 2 FMA/cycle × lanes × 2 flops × GHz, lanes 16 when the
 * matmuls run the AVX-512 kernel, else 8 (AVX2), the clock read from
 * /proc/cpuinfo ("cpu MHz", the first core) unless --ghz says it. FLOPs count the matmuls (forward 2·m·k per token and weight,
 * backward 2·m·k for dX where it is needed and 2·m·k for each trained dW,
 * LoRA's small products left out) and attention's products (causal: about
 * half the T×T scores), so the ratio is what the kernels reach on the work
 * that must be done. The first step is a warm-up and is not timed. After
 * the steps it measures the FMA peak too (fma_measured: the kernels' width,
 * every thread at once, and one alone) and gives the fraction of that. */
#define _POSIX_C_SOURCE 200809L
#include "train/train.h"
#include "cpu/threadpool.h"
#include "bench/bench_results.h"

#include <immintrin.h>
#include <pthread.h>
#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CPU seconds of the process (every thread): on a loaded machine wall time
 * measures the others' work too, CPU time only this program's */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_ghz(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    double mhz = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "cpu MHz", 7) && sscanf(strchr(line, ':') + 1, "%lf", &mhz) == 1) break;
    if (f) fclose(f);
    return mhz / 1000.0;
}

/* matmul + attention flops of one forward + backward over B x T tokens */
static double step_flops(const li_train_layout *L, int B, int T) {
    const li_hparams *hp = &L->hp;
    const double N = (double)B * T;
    double f = 0;
    for (int i = 0; i < LI_TT_N_GLOBAL + LI_TL_N * hp->n_layer; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->rows == 1 || i == LI_TT_TOK_EMBD) continue; /* norms; the embedding is a gather */
        const double mk = 2.0 * N * (double)t->rows * (double)t->cols;
        f += mk;                                        /* forward */
        if (t->layer < 0 || t->layer >= L->bwd_stop) {
            /* the bottom trained block's q/k/v need no dX unless something below trains */
            const bool qkv = t->kind == LI_TL_WQ || t->kind == LI_TL_WK || t->kind == LI_TL_WV;
            const bool need_dx = !(t->layer == L->bwd_stop && qkv && L->t[LI_TT_TOK_EMBD].goff < 0 &&
                                   L->t[li_train_tensor_index(t->layer, LI_TL_ATTN_NORM)].goff < 0);
            if (need_dx) f += mk;                       /* dX */
            if (t->goff >= 0) f += mk;                  /* dW */
        }
    }
    /* attention: QK^T and PV forward, four products backward, causal half */
    const double att = 2.0 * B * (double)T * T / 2 * hp->head_dim * hp->n_head;
    f += hp->n_layer * att * 2;
    f += (hp->n_layer - L->bwd_stop) * att * 4;
    return f;
}

/* GFLOP/s of y = x·W^T, dX = dY·W, dW = dY^T·X at (n, m, k), best of 3, one thread */
static void bench_kernels(li_bench_results *res) {
    const int64_t shapes[][3] = {{64, 1536, 576}, {64, 576, 1536}, {64, 49152, 576}};
    for (size_t s = 0; s < LI_ARRAY_LEN(shapes); s++) {
        const int64_t n = shapes[s][0], m = shapes[s][1], k = shapes[s][2];
        float *x = calloc((size_t)(n * k), 4), *W = calloc((size_t)(m * k), 4), *y = calloc((size_t)(n * m), 4);
        float *dx = calloc((size_t)(n * k), 4), *dw = calloc((size_t)(m * k), 4);
        for (int64_t i = 0; i < m * k; i++) W[i] = 1e-3f * (float)(i % 5);
        for (int64_t i = 0; i < n * k; i++) x[i] = 1e-3f * (float)(i % 7);
        for (int64_t i = 0; i < n * m; i++) y[i] = 1e-3f * (float)(i % 3);
        double best[3] = {1e9, 1e9, 1e9};
        for (int r = 0; r < 3; r++)
            for (int w = 0; w < 3; w++) { /* interleaved, so load hits all three alike */
                const double t0 = cpu_now();
                if (w == 0) li_train_mm_nt(NULL, x, W, y, n, m, k);
                else if (w == 1) li_train_mm_acc(NULL, y, m, 1, W, dx, n, m, k);
                else li_train_mm_acc(NULL, y, 1, m, x, dw, m, n, k);
                best[w] = LI_MIN(best[w], cpu_now() - t0);
            }
        const double f = 2.0 * (double)n * (double)m * (double)k / 1e9;
        printf("n %lld, m %lld, k %lld: x·W^T %.1f, dY·W %.1f, dY^T·X %.1f GFLOP per CPU second\n", (long long)n, (long long)m,
               (long long)k, f / best[0], f / best[1], f / best[2]);
        static const char *const prod[3] = {"x.W^T", "dY.W", "dY^T.X"};
        for (int w = 0; w < 3; w++) {
            char name[96];
            snprintf(name, sizeof name, "%s n%lld m%lld k%lld", prod[w], (long long)n, (long long)m, (long long)k);
            cJSON_AddNumberToObject(li_bench_results_row(res, "name", name), "gflops_per_cpu_s", f / best[w]);
        }
        free(x), free(W), free(y), free(dx), free(dw);
    }
}

/* ---- the FMA peak as measured: 12 independent FMA chains per thread (more
 * than latency x ports on any x86 here), every thread at once. The
 * nominal peak above assumes 2 FMA ports at the "cpu MHz" clock; a core
 * with one 512-bit FMA unit, a turbo clock or a busy sibling hyperthread
 * does something else, and this says what. */
#define FMA_ITERS 20000000L

/* 12 chains in 12 named registers (an array indexed in the loop stays in
 * memory: a load and a store around every FMA) */
#define FMA12(T, SET1, M)                                                                                      \
    T f0 = SET1(0.f), f1 = SET1(1.f), f2 = SET1(2.f), f3 = SET1(3.f), f4 = SET1(4.f), f5 = SET1(5.f);          \
    T f6 = SET1(6.f), f7 = SET1(7.f), f8 = SET1(8.f), f9 = SET1(9.f), f10 = SET1(10.f), f11 = SET1(11.f);      \
    const double t0 = li_time_now();                                                                           \
    for (long i = 0; i < FMA_ITERS; i++)                                                                       \
        __asm__ volatile("vfmadd231ps %12, %12, %0\n\tvfmadd231ps %12, %12, %1\n\tvfmadd231ps %12, %12, %2\n\t" \
                         "vfmadd231ps %12, %12, %3\n\tvfmadd231ps %12, %12, %4\n\tvfmadd231ps %12, %12, %5\n\t"   \
                         "vfmadd231ps %12, %12, %6\n\tvfmadd231ps %12, %12, %7\n\tvfmadd231ps %12, %12, %8\n\t"   \
                         "vfmadd231ps %12, %12, %9\n\tvfmadd231ps %12, %12, %10\n\tvfmadd231ps %12, %12, %11"      \
                         : "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3), "+v"(f4), "+v"(f5), "+v"(f6), "+v"(f7),     \
                           "+v"(f8), "+v"(f9), "+v"(f10), "+v"(f11)                                            \
                         : "v"(M));                                                                            \
    const double t = li_time_now() - t0;                                                                       \
    T all = f0 + f1 + f2 + f3 + f4 + f5 + f6 + f7 + f8 + f9 + f10 + f11;                                       \
    volatile float sink = all[0];                                                                              \
    (void)sink

__attribute__((target("avx512f"))) static double fma_loop_512(void) {
    const __m512 m = _mm512_set1_ps(0.999999f);
    FMA12(__m512, _mm512_set1_ps, m);
    return 12.0 * FMA_ITERS * 32 / t; /* 16 lanes x 2 flops */
}

__attribute__((target("avx2,fma"))) static double fma_loop_256(void) {
    const __m256 m = _mm256_set1_ps(0.999999f);
    FMA12(__m256, _mm256_set1_ps, m);
    return 12.0 * FMA_ITERS * 16 / t; /* 8 lanes x 2 flops */
}

typedef struct {
    int lanes;
    double flops;
} fma_arg;

static void *fma_thread(void *p) {
    fma_arg *a = p;
    a->flops = a->lanes == 16 ? fma_loop_512() : fma_loop_256();
    return NULL;
}

/* the FLOP/s of `threads` threads running the FMA loop at once */
static double fma_measured(int threads, int lanes) {
    pthread_t th[256];
    fma_arg arg[256];
    double sum = 0;
    for (int i = 0; i < threads; i++) {
        arg[i].lanes = lanes;
        if (pthread_create(&th[i], NULL, fma_thread, &arg[i])) return 0;
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        sum += arg[i].flops;
    }
    return sum;
}

int main(int argc, char **argv) {
    li_bench_results res;
    if (li_bench_results_init(&res, "train", &argc, argv)) return 2;
    if (argc == 2 && !strcmp(argv[1], "--kernels")) {
        bench_kernels(&res);
        li_bench_results_chart(&res, "name", "gflops_per_cpu_s", "GFLOP per CPU second",
                               "training matmuls, one thread", false);
        return li_bench_results_finish(&res);
    }
    const char *model = NULL, *what = "all";
    int T = 64, B = 1, steps = 3, threads = 2;
    double ghz = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--seq")) T = atoi(v);
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--train")) what = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--ghz")) ghz = atof(v);
        else if (!strcmp(a, "--isa")) li_train_mm_set_isa(atoi(v));
        else goto usage;
        i++;
    }
    if (T < 2 || T > 4096 || B < 1 || B > 64 || steps < 1 || threads < 1 || threads > 256) goto usage;
    li_error err = {0};
    li_train_select sel;
    if (li_train_select_parse(what, &sel, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 2;
    }
    li_model *m;
    const char *path = li_model_default_path(model);
    if (li_model_load(&m, path, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    li_train_model tm;
    double t0 = li_time_now();
    if (li_train_model_init(&tm, m, &sel, 1, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    const double t_init = li_time_now() - t0;
    li_threadpool *tp = li_threadpool_init(threads);
    li_train_grads g;
    li_adamw opt;
    li_train_ws ws;
    if (!tp || li_train_grads_init(&g, &tm.L) || li_adamw_init(&opt, &tm.L) ||
        li_train_ws_init(&ws, &tm.L, B, T, &err)) {
        fprintf(stderr, "bench_train: out of memory (%s)\n", err.msg);
        return 1;
    }
    const int64_t N = (int64_t)B * T, V = tm.L.hp.n_vocab;
    int32_t *tok = malloc(sizeof *tok * (size_t)(N + 1)), *lab = malloc(sizeof *lab * (size_t)N);
    uint64_t rs = 42;
    for (int64_t i = 0; i <= N; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        tok[i] = (int32_t)(rs % (uint64_t)V);
    }
    for (int64_t i = 0; i < N; i++) lab[i] = tok[i + 1];
    li_train_batch b = {.B = B, .T = T, .tokens = tok, .labels = lab};
    li_adamw_opts ao = {.lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f, .tp = tp};
    double fb_time = 0, opt_time = 0, fb_cpu = 0, opt_cpu = 0, loss = 0;
    for (int s = 0; s <= steps; s++) {
        li_train_grads_zero(&g);
        t0 = li_time_now();
        const double c0 = cpu_now();
        if (li_train_forward_backward(&tm, &g, &b, NULL, &ws, tp, &loss, NULL, &err)) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        const double t1 = li_time_now(), c1 = cpu_now();
        if (li_adamw_step(&opt, &tm, &g, &ao, NULL, &err)) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        const double t2 = li_time_now(), c2 = cpu_now();
        if (s > 0) fb_time += t1 - t0, opt_time += t2 - t1, fb_cpu += c1 - c0, opt_cpu += c2 - c1;
        fprintf(stderr, "step %d: loss %.4f, forward+backward %.2f s, adamw %.3f s\n", s, loss, t1 - t0, t2 - t1);
    }
    if (ghz <= 0) ghz = cpu_ghz();
    const double flops = step_flops(&tm.L, B, T) * steps;
    const int isa = li_train_mm_set_isa(99);
    li_train_mm_set_isa(isa);
    const int lanes = isa == 2 ? 16 : 8;
    const double peak = threads * 2.0 * lanes * 2 * ghz * 1e9;
    printf("model %s, train %s: %.1fM parameters, %.1fM trainable; master copies made in %.2f s\n", path, what,
           (double)tm.L.n_params / 1e6, (double)tm.L.n_grads / 1e6, t_init);
    printf("batch %d x %d, %d timed steps, %d threads\n", B, T, steps, threads);
    printf("forward+backward: %.1f tokens/s (%.2f s/step), with adamw %.1f tokens/s\n", N * steps / fb_time,
           fb_time / steps, N * steps / (fb_time + opt_time));
    printf("matmul+attention: %.1f GFLOP/step, %.1f GFLOP/s = %.1f%% of the FMA peak %.1f GFLOP/s"
           " (%d cores x 2 FMA x %d lanes x 2 x %.2f GHz)\n",
           flops / steps / 1e9, flops / fb_time / 1e9, 100 * flops / fb_time / peak, peak / 1e9, threads, lanes, ghz);
    /* what one core reaches while it runs: independent of how much of the
     * machine others take (threads spinning between jobs count as work) */
    printf("per CPU second: %.1f GFLOP = %.1f%% of one core's peak %.1f GFLOP/s (%.2f CPU s per step)\n",
           flops / fb_cpu / 1e9, 100 * flops / fb_cpu / (peak / threads), peak / threads / 1e9, fb_cpu / steps);
    printf("adamw: %.3f CPU s per step\n", opt_cpu / steps);
    if (isa > 0) { /* the peak as measured, after the steps (their clock state) */
        const double m1 = fma_measured(1, lanes), mt = fma_measured(threads, lanes);
        printf("measured FMA peak (%d lanes): %.1f GFLOP/s on %d thread%s, %.1f on one: matmul+attention = %.1f%% of "
               "it, %.1f%% per CPU second of one thread's\n",
               lanes, mt / 1e9, threads, threads > 1 ? "s" : "", m1 / 1e9, 100 * flops / fb_time / mt,
               100 * flops / fb_cpu / m1);
        cJSON_AddNumberToObject(res.root, "fma_peak_measured_gflops", mt / 1e9);
        cJSON_AddNumberToObject(res.root, "fma_peak_measured_one_gflops", m1 / 1e9);
    }
    cJSON_AddNumberToObject(res.root, "batch", B);
    cJSON_AddNumberToObject(res.root, "seq", T);
    cJSON_AddNumberToObject(res.root, "steps", steps);
    cJSON_AddNumberToObject(res.root, "threads", threads);
    cJSON_AddStringToObject(res.root, "train", what);
    cJSON *row = li_bench_results_row(&res, "name", "forward+backward");
    cJSON_AddNumberToObject(row, "tokens_per_s", N * steps / fb_time);
    cJSON_AddNumberToObject(row, "gflop_per_s", flops / fb_time / 1e9);
    row = li_bench_results_row(&res, "name", "with adamw");
    cJSON_AddNumberToObject(row, "tokens_per_s", N * steps / (fb_time + opt_time));
    char title[128];
    snprintf(title, sizeof title, "training, batch %d x %d, train %s, %d threads", B, T, what, threads);
    li_bench_results_chart(&res, "name", "tokens_per_s", "tokens/s", title, false);
    free(tok);
    free(lab);
    li_train_ws_free(&ws);
    li_adamw_free(&opt);
    li_train_grads_free(&g);
    li_threadpool_free(tp);
    li_train_model_free(&tm);
    li_model_free(m);
    return li_bench_results_finish(&res);
usage:
    fprintf(stderr, "usage: bench_train [--model P] [--seq 2..4096] [--batch 1..64] [--steps N] "
                    "[--train all|norms|layers:A-B|lora:R] [--threads N] [--ghz G] [--isa 0|1|2] [--json FILE] [--plot FILE]\n");
    return 2;
}
