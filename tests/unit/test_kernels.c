/* test_kernels.c — the CPU backend against the scalar reference.
 *
 * Every fast path (each ISA level this CPU has, 2 threads) is run against
 * ops_ref.c at odd sizes so SIMD tails and thread splits are exercised.
 * matmul (packed panels and raw rows), get_rows, rmsnorm, rope and add are
 * bit-identical to the reference on every ISA, and so are kv_store and
 * attention over an F16 / BF16 cache; attention over F32 and silu (FMA,
 * SIMD exp) agree to NMSE < 1e-9. Batch invariance is checked bit for bit:
 * every row of an n-row matmul equals the row alone (n = 1..450, 1 and 2
 * threads, every weight type and ISA), and every token's attention is the
 * same alone, in a batch and in the batch reversed. The reference itself is
 * checked against plain double-precision formulas, and the fp16/bf16
 * conversions exhaustively. One line per check; the last line is the
 * summary. */
#include "util/common.h"
#include "backend.h"
#include "cpu/cpu_kernels.h"
#include "cpu/threadpool.h"
#include "test_util.h"
#include "test_weight.h"

#include <immintrin.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sched.h>

/* ------------------------------------------------------------------------
 * harness
 * ---------------------------------------------------------------------- */

/* report(), rng_u32() / rng_f() (default seed), nmse(): test_util.h */

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_f() * scale;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float f32_from(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The ISA levels to test: all this CPU has. */
static const char *isas[4];
static int n_isas;

static void isas_find(void) {
    __builtin_cpu_init();
    isas[n_isas++] = "scalar";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && li_cpu_has_f16c())
        isas[n_isas++] = "avx2";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni") && n_isas == 2)
        isas[n_isas++] = "avx512";
    if (n_isas == 3 && li_cpu_amx_usable()) isas[n_isas++] = "amx";
    else printf("SKIP isa amx: this CPU (or its kernel) has no usable AMX-TILE/AMX-INT8; its matmul is not tested here\n");
}

static const li_cpu_kernels *kernels_of(const char *isa) {
    if (!strcmp(isa, "amx")) return &li_cpu_kernels_amx;
    if (!strcmp(isa, "avx512")) return &li_cpu_kernels_avx512;
    if (!strcmp(isa, "avx2")) return &li_cpu_kernels_avx2;
    return &li_cpu_kernels_scalar;
}

/* ------------------------------------------------------------------------
 * the type table
 * ---------------------------------------------------------------------- */

static void test_type_table(void) {
    static const struct {
        uint32_t id;
        const char *name;
        int64_t blck;
        size_t size;
        bool supported;
    } want[] = {
        {0, "f32", 1, 4, true},         {1, "f16", 1, 2, true},          {2, "q4_0", 32, 18, true},
        {3, "q4_1", 32, 20, true},      {6, "q5_0", 32, 22, false},      {7, "q5_1", 32, 24, false},
        {8, "q8_0", 32, 34, true},      {9, "q8_1", 32, 36, true},       {10, "q2_K", 256, 84, false},
        {11, "q3_K", 256, 110, false},  {12, "q4_K", 256, 144, false},   {13, "q5_K", 256, 176, false},
        {14, "q6_K", 256, 210, false},  {15, "q8_K", 256, 292, false},   {16, "iq2_xxs", 256, 66, false},
        {17, "iq2_xs", 256, 74, false}, {18, "iq3_xxs", 256, 98, false}, {19, "iq1_s", 256, 50, false},
        {20, "iq4_nl", 32, 18, false},  {21, "iq3_s", 256, 110, false},  {22, "iq2_s", 256, 82, false},
        {23, "iq4_xs", 256, 136, false}, {24, "i8", 1, 1, false},        {25, "i16", 1, 2, false},
        {26, "i32", 1, 4, false},       {27, "i64", 1, 8, false},        {28, "f64", 1, 8, false},
        {29, "iq1_m", 256, 56, false},  {30, "bf16", 1, 2, true},
    };
    int bad = 0;
    for (size_t i = 0; i < LI_ARRAY_LEN(want); i++) {
        const li_type_traits *t = li_type_get(want[i].id);
        if (!t || strcmp(t->name, want[i].name) || t->blck_size != want[i].blck || t->type_size != want[i].size ||
            (t->to_float != NULL) != want[i].supported || strcmp(li_type_name(want[i].id), want[i].name)) {
            printf("  type %u: mismatch\n", want[i].id);
            bad++;
        }
    }
    report(bad == 0, "types: name, block size, type size and support of all 29 ids");
    report(!li_type_get(4) && !li_type_get(5) && !li_type_get(31) && !li_type_get(UINT32_MAX) &&
               !strcmp(li_type_name(4), "unknown"),
           "types: retired ids 4, 5 and ids past the table are absent");
    const uint32_t from[] = {LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0,
                             LI_TYPE_Q8_1};
    bool all_from = true;
    for (size_t i = 0; i < LI_ARRAY_LEN(from); i++) all_from &= li_type_get(from[i])->from_float != NULL;
    report(all_from, "types: from_float for f32, f16, bf16, q4_0, q4_1, q8_0, q8_1");
    size_t sz = 0;
    bool ok = li_type_row_size(LI_TYPE_Q4_0, 64, &sz) && sz == 36;
    ok = ok && li_type_row_size(LI_TYPE_F16, 3, &sz) && sz == 6;
    ok = ok && li_type_row_size(LI_TYPE_Q8_0, 4096, &sz) && sz == 128 * 34;
    ok = ok && !li_type_row_size(LI_TYPE_Q4_0, 33, &sz) && !li_type_row_size(LI_TYPE_F64, INT64_MAX, &sz) &&
         !li_type_row_size(4, 32, &sz) && !li_type_row_size(LI_TYPE_F32, -1, &sz);
    report(ok, "types: row sizes, partial blocks and overflow refused");
    report(li_type_vec_dot_type(LI_TYPE_Q4_0) == LI_TYPE_Q8_0 && li_type_vec_dot_type(LI_TYPE_Q4_1) == LI_TYPE_Q8_1 &&
               li_type_vec_dot_type(LI_TYPE_Q8_0) == LI_TYPE_Q8_0 &&
               li_type_vec_dot_type(LI_TYPE_F16) == LI_TYPE_F32 &&
               li_type_vec_dot_type(LI_TYPE_BF16) == LI_TYPE_F32 && li_type_vec_dot_type(LI_TYPE_F32) == LI_TYPE_F32,
           "types: vec_dot types");
}

/* ------------------------------------------------------------------------
 * fp16 / bf16
 * ---------------------------------------------------------------------- */

__attribute__((target("f16c"))) static float hw_h2f(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) static uint16_t hw_f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static void test_fp16(void) {
    int bad_rt = 0, bad_nan = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = li_fp16_to_fp32((uint16_t)h);
        const uint16_t back = li_fp32_to_fp16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) { /* nan: stays a (quiet) nan of the same sign */
            if (!isnan(f) || (back & 0x7e00) != 0x7e00 || (back & 0x8000) != (h & 0x8000)) bad_nan++;
        } else if (back != h) {
            bad_rt++;
        }
    }
    report(bad_rt == 0 && bad_nan == 0, "fp16: all 65536 patterns round trip (%d bad, %d bad nans)", bad_rt, bad_nan);

    /* hand-checked values: ties to even, overflow, subnormals */
    const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},          {1.0f, 0x3c00},         {-2.0f, 0xc000},
        {65504.0f, 0x7bff},      {65519.99f, 0x7bff},      {65520.0f, 0x7c00},     {1e9f, 0x7c00},
        {INFINITY, 0x7c00},      {-INFINITY, 0xfc00},      {0x1p-24f, 0x0001},     {0x1p-25f, 0x0000},
        {0x1.8p-25f, 0x0001},    {0x1.8p-24f, 0x0002},     {0x1p-14f, 0x0400},     {0x1.ff8p-15f, 0x03ff},
        {0x1.ffcp-15f, 0x0400},  {0x1.ffap-15f, 0x03ff},  {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02}, {1.0f + 0x1p-10f, 0x3c01},
        {0x1p-30f, 0x0000},      {-0x1p-24f, 0x8001},
    };
    int bad = 0;
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++) {
        if (li_fp32_to_fp16(cases[i].f) != cases[i].h) {
            printf("  fp32_to_fp16(%a) = 0x%04x, want 0x%04x\n", cases[i].f, li_fp32_to_fp16(cases[i].f), cases[i].h);
            bad++;
        }
    }
    report(bad == 0, "fp16: rounding, overflow and subnormal cases");
    report(isnan(li_fp16_to_fp32(li_fp32_to_fp16(NAN))) && li_fp16_to_fp32(0x0001) == 0x1p-24f &&
               li_fp16_to_fp32(0x7bff) == 65504.0f && isinf(li_fp16_to_fp32(0xfc00)),
           "fp16: nan, smallest subnormal, max, -inf");

    if (li_cpu_has_f16c()) {
        int bad_h2f = 0, bad_f2h = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            const float a = li_fp16_to_fp32((uint16_t)h), b = hw_h2f((uint16_t)h);
            if (isnan(a) ? !isnan(b) : f32_bits(a) != f32_bits(b)) bad_h2f++;
        }
        for (int i = 0; i < 2000000; i++) {
            /* random bit patterns, then values near the half range */
            float f = i < 1000000 ? f32_from(rng_u32() ^ (rng_u32() << 16)) : ldexpf(rng_f(), (int)(rng_u32() % 48) - 30);
            if (isnan(f)) continue;
            if (li_fp32_to_fp16(f) != hw_f2h(f)) bad_f2h++;
        }
        report(bad_h2f == 0 && bad_f2h == 0, "fp16: matches F16C hardware (%d/65536 h->f, %d/2M f->h differ)",
               bad_h2f, bad_f2h);
    }

    int bad_bf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = li_bf16_to_fp32((uint16_t)h);
        const uint16_t back = li_fp32_to_bf16(f);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
            if (!isnan(f) || !isnan(li_bf16_to_fp32(back))) bad_bf++;
        } else if (back != h) {
            bad_bf++;
        }
    }
    report(bad_bf == 0, "bf16: all 65536 patterns round trip (%d bad)", bad_bf);
    report(li_fp32_to_bf16(f32_from(0x3f808000)) == 0x3f80 && li_fp32_to_bf16(f32_from(0x3f818000)) == 0x3f82 &&
               li_fp32_to_bf16(f32_from(0x3f808001)) == 0x3f81 && li_fp32_to_bf16(f32_from(0x7f7fffff)) == 0x7f80 &&
               li_fp32_to_bf16(f32_from(0x7f800001)) == 0x7fc0 && li_fp32_to_bf16(-INFINITY) == 0xff80 &&
               li_fp32_to_bf16(f32_from(0x00008000)) == 0x0000 && li_fp32_to_bf16(f32_from(0x00018000)) == 0x0002,
           "bf16: ties to even, overflow to inf, quiet nan, subnormals");
}

/* ------------------------------------------------------------------------
 * quantization references
 * ---------------------------------------------------------------------- */

/* Blocks with hard shapes: all zero, one spike, negative-dominant, wide
 * range, plus random ones at several scales. */
static void fill_blocks(float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        float *xb = x + b * 32;
        const float scale = powf(10.0f, (float)((int)(rng_u32() % 7) - 3));
        fill(xb, 32, scale);
        switch (rng_u32() % 8) { /* 0-3: hard shapes, else random */
        case 0: memset(xb, 0, 32 * sizeof(float)); break;
        case 1: memset(xb, 0, 32 * sizeof(float)); xb[rng_u32() % 32] = -scale; break;
        case 2: xb[5] = -3 * scale; break;
        case 3: for (int j = 0; j < 32; j++) xb[j] = fabsf(xb[j]) + 2 * scale; break;
        default: break;
        }
    }
}

static void test_quantize_ref(void) {
    enum { N = 32 * 60 };
    float x[N], y[N];
    fill_blocks(x, N);
    const li_type types[] = {LI_TYPE_Q8_0, LI_TYPE_Q8_1, LI_TYPE_Q4_0, LI_TYPE_Q4_1};
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        const li_type_traits *tr = li_type_get(types[ti]);
        char q[N / 32 * 36];
        tr->from_float(x, q, N);
        tr->to_float(q, y, N);
        int bad = 0;
        double worst = 0;
        for (int b = 0; b < N / 32; b++) {
            const float *xb = x + b * 32;
            float amax = 0, mx = -INFINITY, mn = INFINITY, sgn_max = 0;
            for (int j = 0; j < 32; j++) {
                if (fabsf(xb[j]) > amax) sgn_max = xb[j];
                amax = fmaxf(amax, fabsf(xb[j]));
                mx = fmaxf(mx, xb[j]);
                mn = fminf(mn, xb[j]);
            }
            /* per-element bound: half a step from rounding (a whole step at
             * Q4_0's clamped top), plus the largest quant times what the
             * fp16 scale lost (a lot when it is an fp16 subnormal) */
            const uint16_t *hd = (const uint16_t *)(q + b * tr->type_size);
            const float d16 = li_fp16_to_fp32(hd[0]);
            double bound;
            switch (types[ti]) {
            case LI_TYPE_Q4_0: {
                const float d = sgn_max / -8;
                bound = fabsf(d) + 8 * fabsf(d - d16);
                break;
            }
            case LI_TYPE_Q4_1: {
                const float d = (mx - mn) / 15;
                bound = 0.5 * d + 15 * fabsf(d - d16) + fabsf(mn - li_fp16_to_fp32(hd[1]));
                break;
            }
            default: {
                const float d = amax / 127;
                bound = 0.5 * d + 127 * fabsf(d - d16);
                break;
            }
            }
            bound = bound * (1 + 1e-6) + 1e-30;
            for (int j = 0; j < 32; j++) {
                const double e = fabs((double)xb[j] - y[b * 32 + j]);
                if (e > bound) bad++;
                if (e / bound > worst) worst = e / bound;
            }
        }
        bool s_ok = true;
        if (types[ti] == LI_TYPE_Q8_1) {
            const li_block_q8_1 *blk = (const li_block_q8_1 *)q;
            for (int b = 0; b < N / 32; b++) {
                int sum = 0;
                for (int j = 0; j < 32; j++) sum += blk[b].qs[j];
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
                s_ok &= blk[b].s == li_fp32_to_fp16((float)sum * (amax / 127.0f));
            }
        }
        report(bad == 0 && s_ok, "quantize %s: dequantized error within bound (worst %.2f of bound)%s", tr->name,
               worst, types[ti] == LI_TYPE_Q8_1 ? ", s = d*sum(q)" : "");
    }

    /* vec_dot refs against the dequantized dot in double */
    const struct {
        li_type w, a;
        float (*dot)(int64_t, const void *, const void *);
    } dots[] = {
        {LI_TYPE_Q4_0, LI_TYPE_Q8_0, li_vec_dot_q4_0_q8_0_ref},
        {LI_TYPE_Q4_1, LI_TYPE_Q8_1, li_vec_dot_q4_1_q8_1_ref},
        {LI_TYPE_Q8_0, LI_TYPE_Q8_0, li_vec_dot_q8_0_q8_0_ref},
    };
    for (size_t di = 0; di < LI_ARRAY_LEN(dots); di++) {
        enum { K = 32 * 17 };
        float w[K], a[K], wd[K], ad[K];
        char qw[K / 32 * 36], qa[K / 32 * 36];
        double worst = 0;
        for (int trial = 0; trial < 50; trial++) {
            fill(w, K, 1.0f);
            fill(a, K, 3.0f);
            li_type_get(dots[di].w)->from_float(w, qw, K);
            li_type_get(dots[di].a)->from_float(a, qa, K);
            li_type_get(dots[di].w)->to_float(qw, wd, K);
            li_type_get(dots[di].a)->to_float(qa, ad, K);
            double exact = 0, mag = 0;
            for (int j = 0; j < K; j++) {
                exact += (double)wd[j] * ad[j];
                mag += fabs((double)wd[j] * ad[j]);
            }
            const double rel = fabs(dots[di].dot(K, qw, qa) - exact) / mag;
            if (rel > worst) worst = rel;
        }
        /* Q4_1 uses the fp16-rounded s = d*sum(q): allow its rounding */
        const double tol = dots[di].w == LI_TYPE_Q4_1 ? 1e-3 : 1e-6;
        report(worst < tol, "vec_dot %s.%s ref: matches the dequantized dot (worst rel %.2e)",
               li_type_name(dots[di].w), li_type_name(dots[di].a), worst);
    }
}

/* ------------------------------------------------------------------------
 * activation quantization per ISA: bit-identical to the reference
 * ---------------------------------------------------------------------- */

static void test_quantize_act(void) {
    const int64_t ks[] = {32, 64, 96, 4096 + 32};
    for (int ii = 0; ii < n_isas; ii++) {
        const li_cpu_kernels *kern = kernels_of(isas[ii]);
        for (int at = 0; at < 2; at++) {
            const li_type t = at ? LI_TYPE_Q8_1 : LI_TYPE_Q8_0;
            bool ok = true;
            for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++) {
                const int64_t k = ks[ki];
                float *x = li_xmalloc((size_t)k * sizeof(float));
                fill_blocks(x, k);
                /* a block of exact halves (d = 1): roundf sends them away
                 * from zero, round-to-even would not */
                for (int j = 0; j < 32; j++) x[j] = j == 0 ? 127.0f : (float)(j % 9) - 4.5f;
                const size_t rb = li_qact_row_bytes(k);
                void *want = li_aligned_alloc(rb), *got = li_aligned_alloc(rb);
                memset(want, 0, rb);
                memset(got, 0, rb);
                li_cpu_kernels_scalar.quantize_act(t, x, want, k);
                kern->quantize_act(t, x, got, k);
                ok &= memcmp(want, got, rb) == 0;
                /* and the scalar one is the ggml block, unpacked */
                if (kern == &li_cpu_kernels_scalar) {
                    char blk[(4096 + 32) / 32 * 36];
                    li_type_get(t)->from_float(x, blk, k);
                    const size_t bsz = li_type_get(t)->type_size;
                    for (int64_t b = 0; b < k / 32; b++) {
                        const uint16_t *hd = (const uint16_t *)(blk + b * bsz);
                        ok &= memcmp(blk + b * bsz + (at ? 4 : 2), (char *)want + b * 32, 32) == 0;
                        int32_t sum = 0;
                        for (int j = 0; j < 32; j++) sum += ((const int8_t *)want)[b * 32 + j];
                        ok &= li_qact_d(want, k)[b] == li_fp16_to_fp32(hd[0]);
                        ok &= li_qact_sum(want, k)[b] == sum;
                        if (at) ok &= li_qact_s(want, k)[b] == li_fp16_to_fp32(hd[1]);
                    }
                }
                li_aligned_free(want);
                li_aligned_free(got);
                free(x);
            }
            report(ok, "quantize_act %-6s %s: identical to the reference at k = 32, 64, 96, 4128", isas[ii],
                   li_type_name(t));
        }
    }
}

/* ------------------------------------------------------------------------
 * matmul and get_rows: every ISA (2 threads) against the reference
 * ---------------------------------------------------------------------- */

/* block-structured values (fill_blocks), a ragged tail uniform */
static void fill_weight_row(float *row, int64_t k) {
    fill_blocks(row, k - k % 32);
    for (int64_t j = k - k % 32; j < k; j++) row[j] = rng_f();
}

static void weight_make(test_weight *tw, li_type t, int64_t k, int64_t m) {
    test_weight_make(tw, t, k, m, fill_weight_row);
}

/* One backend's matmul of a weight it prepared itself (packed panels), or
 * of the raw rows when `prepare` is false; the weight is released after. */
static void matmul_on(li_backend *be, li_weight *w, const float *x, float *y, int64_t n, bool prepare) {
    li_weight wb = *w;
    if (prepare && be->ops->weight_prepare) be->ops->weight_prepare(be, &wb);
    be->ops->matmul(be, &wb, x, y, n);
    if (be->ops->weight_release) be->ops->weight_release(be, &wb);
}

/* Every ISA, packed and raw, is the reference bit for bit: the kernels do
 * the reference's float operations in its order (cpu_kernels.h). */
static void test_matmul(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    const li_type types[] = {LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16,
                             LI_TYPE_Q8_1};
    const int64_t ks[] = {32, 64, 96, 4096 + 32, 37}; /* 37: float weights only */
    const int64_t ms[] = {1, 3, 17, 257};
    const int64_t ns[] = {1, 2, 5, 9, 11, 33, 64 + 7}; /* 9: one pass of a verify; 11: a pass of 10 and 1 */
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        const li_type t = types[ti];
        for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++) {
            const int64_t k = ks[ki];
            if (k % li_type_get(t)->blck_size) continue;
            bool exact[4][2] = {{true, true}, {true, true}, {true, true}, {true, true}};
            for (size_t mi = 0; mi < LI_ARRAY_LEN(ms); mi++) {
                const int64_t m = ms[mi];
                test_weight tw;
                weight_make(&tw, t, k, m);
                for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
                    const int64_t n = ns[ni];
                    if (k > 4096 && m > 17 && n > 33) continue; /* keep the raw scalar path quick */
                    float *x = li_xmalloc((size_t)(n * k) * sizeof(float));
                    float *want = li_xmalloc((size_t)(n * m) * sizeof(float));
                    float *got = li_xmalloc((size_t)(n * m) * sizeof(float));
                    fill(x, n * k, 2.0f);
                    ref->matmul(&ref_be, &tw.w, x, want, n);
                    for (int b = 0; b < n_be; b++)
                        for (int packed = 0; packed < 2; packed++) {
                            for (int64_t j = 0; j < n * m; j++) got[j] = NAN;
                            matmul_on(&bes[b], &tw.w, x, got, n, packed);
                            exact[b][packed] &= memcmp(got, want, (size_t)(n * m) * sizeof(float)) == 0;
                        }
                    free(x);
                    free(want);
                    free(got);
                }
                li_aligned_free(tw.data);
            }
            for (int b = 0; b < n_be; b++)
                report(exact[b][0] && exact[b][1], "matmul %-6s %-4s k=%-4lld m=1..257 n=1..71: %s",
                       li_backend_cpu_isa(&bes[b]), li_type_name(t), (long long)k,
                       exact[b][0] && exact[b][1] ? "bit-identical to the reference (packed and raw)"
                       : exact[b][1] ? "raw rows differ" : "packed panels differ");
        }
    }

    /* get_rows: dequantized rows, exact, from raw rows and from panels */
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        test_weight tw;
        weight_make(&tw, types[ti], 96, 40);
        const int32_t ids[] = {39, 0, 7, 7, 21, 16, 15};
        float want[7 * 96], got[7 * 96];
        ref->get_rows(&ref_be, &tw.w, ids, 7, want);
        bool ok = true;
        for (int b = 0; b < n_be; b++) {
            bes[b].ops->get_rows(&bes[b], &tw.w, ids, 7, got);
            ok &= memcmp(got, want, sizeof want) == 0;
            li_weight wp = tw.w;
            bes[b].ops->weight_prepare(&bes[b], &wp);
            memset(got, 0, sizeof got);
            bes[b].ops->get_rows(&bes[b], &wp, ids, 7, got);
            ok &= memcmp(got, want, sizeof want) == 0;
            bes[b].ops->weight_release(&bes[b], &wp);
            ok &= wp.packed == NULL;
        }
        /* and the reference row is to_float of that row */
        float row[96];
        li_type_get(types[ti])->to_float((const char *)tw.data + 21 * tw.w.row_bytes, row, 96);
        ok &= memcmp(row, want + 4 * 96, sizeof row) == 0;
        report(ok, "get_rows %s: every backend equals the dequantized rows (raw and packed)", li_type_name(types[ti]));
        li_aligned_free(tw.data);
    }
}

/* ------------------------------------------------------------------------
 * batch invariance: a row's result does not depend on the batch
 * ---------------------------------------------------------------------- */

/* For each weight type, ISA and thread count, every row of an n-row matmul
 * must be bit-identical to the same row multiplied alone, for n across the
 * GEMV / register-block / tile / thread-split boundaries. */
static void test_matmul_batch_invariance(void) {
    const li_type types[] = {LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16};
    const int64_t ns[] = {1, 2, 3, 4, 5, 7, 9, 10, 11, 17, 64, 450};
    const int64_t k = 576, m = 1536 / 4 + 7; /* SmolLM2's k; m leaves a partial panel */
    enum { NMAX = 450 };
    float *x = li_xmalloc((size_t)NMAX * k * sizeof(float));
    float *alone = li_xmalloc((size_t)NMAX * m * sizeof(float));
    float *got = li_xmalloc((size_t)NMAX * m * sizeof(float));
    float *first[LI_ARRAY_LEN(types)] = {0}; /* each type's rows alone, on the first backend */
    test_weight tws[LI_ARRAY_LEN(types)];      /* one weight per type, shared by every backend */
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) weight_make(&tws[ti], types[ti], k, m);
    fill(x, NMAX * k, 2.0f);
    for (int ii = 0; ii < n_isas; ii++)
        for (int nt = 1; nt <= 2; nt++) {
            li_backend be;
            li_error err = {0};
            if (li_backend_cpu_init(&be, nt, isas[ii], &err)) {
                report(false, "cpu init %s: %s", isas[ii], err.msg);
                continue;
            }
            for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
                li_weight w = tws[ti].w;
                be.ops->weight_prepare(&be, &w);
                for (int64_t r = 0; r < NMAX; r++) be.ops->matmul(&be, &w, x + r * k, alone + r * m, 1);
                int bad_rows = 0, bad_n = 0;
                /* alone, every ISA and thread count gives the same rows too */
                if (!first[ti]) {
                    first[ti] = li_xmalloc((size_t)NMAX * m * sizeof(float));
                    memcpy(first[ti], alone, (size_t)NMAX * m * sizeof(float));
                } else {
                    for (int64_t r = 0; r < NMAX; r++)
                        bad_rows += memcmp(first[ti] + r * m, alone + r * m, (size_t)m * sizeof(float)) != 0;
                }
                for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
                    /* a window of rows that starts at an odd row */
                    const int64_t n = ns[ni], r0 = (int64_t)((ni * 37) % (NMAX - n + 1));
                    be.ops->matmul(&be, &w, x + r0 * k, got, n);
                    int bad = 0;
                    for (int64_t r = 0; r < n; r++)
                        bad += memcmp(got + r * m, alone + (r0 + r) * m, (size_t)m * sizeof(float)) != 0;
                    bad_rows += bad;
                    bad_n += bad > 0;
                }
                be.ops->weight_release(&be, &w);
                report(bad_rows == 0, "batch invariance matmul %-6s %d thread%s %-4s: every row of n = 1..450 "
                       "equals the row alone, as on scalar/1 thread (%d rows differ)", isas[ii], nt,
                       nt > 1 ? "s" : " ", li_type_name(types[ti]), bad_rows);
                (void)bad_n;
            }
            li_backend_cpu_free(&be);
        }
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        free(first[ti]);
        li_aligned_free(tws[ti].data);
    }
    free(x);
    free(alone);
    free(got);
}

/* ------------------------------------------------------------------------
 * small ops
 * ---------------------------------------------------------------------- */

static void test_small_ops(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    enum { N = 7, DIM = 576 + 3 };
    static float x[N * DIM], w[DIM], want[N * DIM], got[N * DIM], u[N * DIM];
    fill(x, N * DIM, 3.0f);
    fill(w, DIM, 1.0f);
    fill(u, N * DIM, 2.0f);

    /* rmsnorm: the reference against the formula, backends against the reference */
    ref->rmsnorm(&ref_be, x, w, want, N, DIM, 1e-5f);
    double worst = 0;
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int j = 0; j < DIM; j++) ss += (double)x[r * DIM + j] * x[r * DIM + j];
        const double s = 1.0 / sqrt(ss / DIM + 1e-5);
        for (int j = 0; j < DIM; j++)
            worst = fmax(worst, fabs(x[r * DIM + j] * s * w[j] - want[r * DIM + j]) / (fabs(x[r * DIM + j] * s) + 1e-6));
    }
    report(worst < 1e-5, "rmsnorm ref: matches the formula (worst rel %.1e)", worst);
    bool ok = true;
    for (int b = 0; b < n_be; b++) {
        bes[b].ops->rmsnorm(&bes[b], x, w, got, N, DIM, 1e-5f);
        ok &= memcmp(got, want, sizeof got) == 0;
    }
    report(ok, "rmsnorm: every backend identical to the reference");

    /* rope: both pairings, partial rotation (n_rot < head_dim) */
    for (int neox = 0; neox < 2; neox++) {
        const int n_heads = 3, head_dim = 40, n_rot = 32;
        const int32_t pos[N] = {0, 1, 2, 17, 31, 64, 99};
        float *xr = x; /* N * n_heads * head_dim = 840 < N*DIM */
        const int64_t len = (int64_t)N * n_heads * head_dim;
        memcpy(want, xr, (size_t)len * sizeof(float));
        ref->rope(&ref_be, want, pos, N, n_heads, head_dim, n_rot, 10000.0f, neox);
        double err = 0;
        for (int i = 0; i < N; i++)
            for (int h = 0; h < n_heads; h++) {
                const float *v = xr + (i * n_heads + h) * head_dim, *o = want + (i * n_heads + h) * head_dim;
                for (int j = 0; j < n_rot / 2; j++) {
                    const double th = pos[i] * pow(10000.0, -2.0 * j / n_rot);
                    const int i0 = neox ? j : 2 * j, i1 = neox ? j + n_rot / 2 : 2 * j + 1;
                    err = fmax(err, fabs(v[i0] * cos(th) - v[i1] * sin(th) - o[i0]));
                    err = fmax(err, fabs(v[i0] * sin(th) + v[i1] * cos(th) - o[i1]));
                }
                for (int j = n_rot; j < head_dim; j++) err = fmax(err, fabs(v[j] - o[j]));
            }
        report(err < 1e-4, "rope ref neox=%d: matches the formula (worst abs %.1e)", neox, err);
        ok = true;
        for (int b = 0; b < n_be; b++) {
            memcpy(got, xr, (size_t)len * sizeof(float));
            bes[b].ops->rope(&bes[b], got, pos, N, n_heads, head_dim, n_rot, 10000.0f, neox);
            ok &= memcmp(got, want, (size_t)len * sizeof(float)) == 0;
        }
        report(ok, "rope neox=%d: every backend identical to the reference", neox);
    }

    /* the CPU backend reuses the last batch's angles for the next layer's
     * call: a changed theta, position or n_rot must not hit that cache */
    {
        const int n_heads = 3, head_dim = 40;
        int32_t pos[N] = {0, 1, 2, 17, 31, 64, 99};
        const struct {
            int n_rot, bump, neox;
            float theta;
        } cases[] = {{32, 0, 0, 10000.0f},  {32, 0, 0, 10000.0f}, {32, 0, 0, 500000.0f}, {32, 1, 0, 500000.0f},
                     {16, 0, 0, 500000.0f}, {20, 0, 0, 500000.0f}, {20, 0, 1, 500000.0f}, {38, 0, 1, 500000.0f},
                     {38, 0, 0, 500000.0f}}; /* n_rot 20, 38: a partial last vector of pairs */
        const int64_t len = (int64_t)N * n_heads * head_dim;
        ok = true;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            pos[3] += cases[ci].bump;
            memcpy(want, x, (size_t)len * sizeof(float));
            ref->rope(&ref_be, want, pos, N, n_heads, head_dim, cases[ci].n_rot, cases[ci].theta, cases[ci].neox);
            for (int b = 0; b < n_be; b++) {
                memcpy(got, x, (size_t)len * sizeof(float));
                bes[b].ops->rope(&bes[b], got, pos, N, n_heads, head_dim, cases[ci].n_rot, cases[ci].theta,
                                 cases[ci].neox);
                ok &= memcmp(got, want, (size_t)len * sizeof(float)) == 0;
            }
        }
        report(ok, "rope called again with a changed theta, position, n_rot or pairing: every backend identical to "
                   "the reference");
    }

    /* silu_mul, over a size that takes the threaded path too */
    {
        enum { SN = 64, SD = 1536 + 5 };
        float *g = li_xmalloc(SN * SD * sizeof(float)), *uu = li_xmalloc(SN * SD * sizeof(float));
        float *sw = li_xmalloc(SN * SD * sizeof(float)), *sg = li_xmalloc(SN * SD * sizeof(float));
        fill(g, SN * SD, 12.0f);
        fill(uu, SN * SD, 2.0f);
        g[0] = -100.0f;
        g[1] = 100.0f;
        memcpy(sw, g, SN * SD * sizeof(float));
        ref->silu_mul(&ref_be, sw, uu, SN, SD);
        double werr = 0;
        for (int j = 0; j < SN * SD; j++) {
            const double e = fabs(g[j] / (1.0 + exp(-(double)g[j])) * uu[j] - sw[j]);
            werr = fmax(werr, e / (fabs(sw[j]) + 1e-30));
        }
        report(werr < 1e-5, "silu_mul ref: matches the formula (worst rel %.1e)", werr);
        for (int b = 0; b < n_be; b++) {
            for (int rows = 1; rows <= SN; rows += SN - 1) {
                memcpy(sg, g, SN * SD * sizeof(float));
                bes[b].ops->silu_mul(&bes[b], sg, uu, rows, SD);
                const double e = nmse(sg, sw, (int64_t)rows * SD);
                report(e < 1e-9, "silu_mul %-6s n=%d: nmse %.1e", li_backend_cpu_isa(&bes[b]), rows, e);
            }
        }
        free(g);
        free(uu);
        free(sw);
        free(sg);
    }

    /* add */
    memcpy(want, x, sizeof want);
    ref->add(&ref_be, want, u, N * DIM);
    ok = true;
    for (int j = 0; j < N * DIM; j++) ok &= want[j] == x[j] + u[j];
    for (int b = 0; b < n_be; b++) {
        memcpy(got, x, sizeof got);
        bes[b].ops->add(&bes[b], got, u, N * DIM);
        ok &= memcmp(got, want, sizeof got) == 0;
    }
    report(ok, "add: the reference is y += x, every backend identical");
}

/* The same ops at prefill sizes, where the CPU backend splits rows over its
 * threads (and rmsnorm runs rows side by side): still the reference's bits. */
static void test_small_ops_big(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    const int64_t n = 203, dim = 579; /* odd: 4-row groups and thread chunks have tails */
    float *x = li_xmalloc((size_t)(n * dim) * sizeof(float)), *w = li_xmalloc((size_t)dim * sizeof(float));
    float *want = li_xmalloc((size_t)(n * dim) * sizeof(float)), *got = li_xmalloc((size_t)(n * dim) * sizeof(float));
    int32_t *pos = li_xmalloc((size_t)n * sizeof(int32_t));
    fill(x, n * dim, 3.0f);
    fill(w, dim, 1.0f);
    for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(i * 7 % 300);
    bool ok_norm = true, ok_rope = true, ok_add = true;
    ref->rmsnorm(&ref_be, x, w, want, n, dim, 1e-5f);
    for (int b = 0; b < n_be; b++) {
        bes[b].ops->rmsnorm(&bes[b], x, w, got, n, dim, 1e-5f);
        ok_norm &= memcmp(got, want, (size_t)(n * dim) * sizeof(float)) == 0;
    }
    /* rope over (n, 9, 64): 203 tokens of 9 heads */
    const int64_t len = n * 9 * 64;
    memcpy(want, x, (size_t)len * sizeof(float));
    ref->rope(&ref_be, want, pos, n, 9, 64, 64, 10000.0f, 0);
    for (int b = 0; b < n_be; b++) {
        memcpy(got, x, (size_t)len * sizeof(float));
        bes[b].ops->rope(&bes[b], got, pos, n, 9, 64, 64, 10000.0f, 0);
        ok_rope &= memcmp(got, want, (size_t)len * sizeof(float)) == 0;
    }
    /* add: a short one, then one long enough to be split */
    const int64_t na = 300007;
    float *ya = li_xmalloc((size_t)na * sizeof(float)), *xa = li_xmalloc((size_t)na * sizeof(float));
    float *wa = li_xmalloc((size_t)na * sizeof(float));
    fill(xa, na, 2.0f);
    fill(ya, na, 2.0f);
    memcpy(wa, ya, (size_t)na * sizeof(float));
    ref->add(&ref_be, wa, w, dim);
    ref->add(&ref_be, wa, xa, na);
    for (int b = 0; b < n_be; b++) {
        float *ga = li_xmalloc((size_t)na * sizeof(float));
        memcpy(ga, ya, (size_t)na * sizeof(float));
        bes[b].ops->add(&bes[b], ga, w, dim);
        bes[b].ops->add(&bes[b], ga, xa, na);
        ok_add &= memcmp(ga, wa, (size_t)na * sizeof(float)) == 0;
        free(ga);
    }
    free(ya); free(xa); free(wa);
    report(ok_norm, "rmsnorm 203 x 579 (threaded, 8-row groups): every backend identical to the reference");
    report(ok_rope, "rope 203 tokens x 9 heads (threaded): every backend identical to the reference");
    report(ok_add, "add 300007 elements (threaded): every backend identical to the reference");
    free(x); free(w); free(want); free(got); free(pos);
}

/* ------------------------------------------------------------------------
 * paged attention
 * ---------------------------------------------------------------------- */

/* Plain double-precision attention over the same stored K/V. */
static void attn_naive(const li_attn_args *a, float *out) {
    const int D = a->head_dim;
    for (int64_t i = 0; i < a->n_tokens; i++)
        for (int h = 0; h < a->n_head; h++) {
            const int kvh = h / (a->n_head / a->n_head_kv);
            const int64_t np = a->pos[i] + 1;
            double *s = li_xmalloc((size_t)np * sizeof(double)), mx = -INFINITY, sum = 0;
            const float *q = a->q + (i * a->n_head + h) * D;
            for (int64_t p = 0; p < np; p++) {
                const int64_t slot = (int64_t)li_attn_blocks(a, i)[p / a->block_size] * a->block_size +
                                     p % a->block_size;
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (double)q[e] * li_float_load(a->kv->dtype, a->kv->k, (slot * a->n_head_kv + kvh) * D + e);
                s[p] = d * a->scale;
                mx = fmax(mx, s[p]);
            }
            for (int64_t p = 0; p < np; p++) sum += (s[p] = exp(s[p] - mx));
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int64_t p = 0; p < np; p++) {
                    const int64_t slot = (int64_t)li_attn_blocks(a, i)[p / a->block_size] * a->block_size +
                                         p % a->block_size;
                    o += s[p] / sum * li_float_load(a->kv->dtype, a->kv->v, (slot * a->n_head_kv + kvh) * D + e);
                }
                out[(i * a->n_head + h) * D + e] = (float)o;
            }
            free(s);
        }
}

static void test_attention(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    const int block_size = 16, num_blocks = 40;
    /* three sequences, block ids deliberately scattered */
    enum { BT_STRIDE = 6 }; /* flat (3, BT_STRIDE) table, rows padded */
    const int32_t tables[3 * BT_STRIDE] = {7, 2, 19, 0, 0, 0, 5, 0, 0, 0, 0, 0, 30, 0, 11, 3, 25, 38};
    const int seq_len[] = {37, 16, 90};
    /* the batch: a chunk of seq 0 crossing a block boundary, the last token
     * of seq 1, a few early and late tokens of seq 2, the very first token */
    const int32_t seq[] = {0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2};
    const int32_t pos[] = {30, 31, 32, 33, 34, 35, 36, 15, 0, 1, 47, 48, 88, 89};
    const int64_t n_tokens = LI_ARRAY_LEN(seq);
    const struct {
        int n_head, n_head_kv, head_dim;
    } shapes[] = {{6, 2, 64}, {4, 4, 36}, {8, 1, 72}, {2, 1, 264}}; /* 264: past the tile path's 256 */
    const li_type dtypes[] = {LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_F32};
    for (size_t si = 0; si < LI_ARRAY_LEN(shapes); si++) {
        const int nh = shapes[si].n_head, nkv = shapes[si].n_head_kv, D = shapes[si].head_dim;
        for (size_t di = 0; di < LI_ARRAY_LEN(dtypes); di++) {
            const li_type dt = dtypes[di];
            const size_t es = li_kv_elem_size(dt);
            const size_t kv_bytes = (size_t)num_blocks * block_size * nkv * D * es;
            li_kv_layer kv = {.dtype = dt, .k = li_aligned_alloc(kv_bytes), .v = li_aligned_alloc(kv_bytes)};
            memset(kv.k, 0xff, kv_bytes); /* unwritten slots are nan: reading one shows */
            memset(kv.v, 0xff, kv_bytes);
            /* store every position of every sequence, one sequence per call */
            bool store_ok = true;
            for (int s = 0; s < 3; s++) {
                const int L = seq_len[s];
                float *k = li_xmalloc((size_t)L * nkv * D * sizeof(float)), *v = li_xmalloc((size_t)L * nkv * D * sizeof(float));
                int64_t *slot = li_xmalloc((size_t)L * sizeof(int64_t));
                fill(k, (int64_t)L * nkv * D, 2.0f);
                fill(v, (int64_t)L * nkv * D, 1.0f);
                for (int p = 0; p < L; p++) slot[p] = (int64_t)tables[s * BT_STRIDE + p / block_size] * block_size + p % block_size;
                ref->kv_store(&ref_be, &kv, k, v, slot, L, nkv, D);
                /* the CPU backends store identical bytes */
                for (int b = 0; b < n_be; b++) {
                    li_kv_layer kv2 = {.dtype = dt, .k = li_aligned_alloc(kv_bytes), .v = li_aligned_alloc(kv_bytes)};
                    memcpy(kv2.k, kv.k, kv_bytes);
                    memcpy(kv2.v, kv.v, kv_bytes);
                    bes[b].ops->kv_store(&bes[b], &kv2, k, v, slot, L, nkv, D);
                    store_ok &= !memcmp(kv2.k, kv.k, kv_bytes) && !memcmp(kv2.v, kv.v, kv_bytes);
                    li_aligned_free(kv2.k);
                    li_aligned_free(kv2.v);
                }
                /* and the stored value is the input rounded to the dtype */
                const int64_t last = (int64_t)(L - 1) * nkv * D + nkv * D - 1;
                float rounded = v[last];
                if (dt == LI_TYPE_F16) rounded = li_fp16_to_fp32(li_fp32_to_fp16(rounded));
                if (dt == LI_TYPE_BF16) rounded = li_bf16_to_fp32(li_fp32_to_bf16(rounded));
                store_ok &= li_float_load(dt, kv.v, slot[L - 1] * nkv * D + nkv * D - 1) == rounded;
                free(k);
                free(v);
                free(slot);
            }
            report(store_ok, "kv_store %s heads %d/%d dim %d: every backend writes the reference bytes",
                   li_type_name(dt), nh, nkv, D);

            float *q = li_xmalloc((size_t)n_tokens * nh * D * sizeof(float));
            float *want = li_xmalloc((size_t)n_tokens * nh * D * sizeof(float));
            float *got = li_xmalloc((size_t)n_tokens * nh * D * sizeof(float));
            fill(q, n_tokens * nh * D, 1.5f);
            /* the usual scale, and one that spreads the scores over hundreds
             * (exp underflows to subnormals and to 0) */
            const float scales[] = {1.0f / sqrtf((float)D), 40.0f};
            for (int sc = 0; sc < 2; sc++) {
                li_attn_args a = {.n_tokens = n_tokens, .n_head = nh, .n_head_kv = nkv, .head_dim = D,
                                  .block_size = block_size, .q = q, .out = want, .pos = pos, .seq = seq,
                                  .block_table = tables, .bt_stride = BT_STRIDE, .kv = &kv, .scale = scales[sc]};
                ref->attention(&ref_be, &a);
                attn_naive(&a, got);
                const int64_t len = n_tokens * nh * D;
                report(nmse(want, got, len) < 1e-10,
                       "attention ref %s heads %d/%d dim %d scale %g: matches double precision (nmse %.1e)",
                       li_type_name(dt), nh, nkv, D, scales[sc], nmse(want, got, len));
                for (int b = 0; b < n_be; b++) {
                    a.out = got;
                    for (int64_t j = 0; j < len; j++) got[j] = NAN;
                    bes[b].ops->attention(&bes[b], &a);
                    const double e = nmse(got, want, len);
                    report(e < 1e-9, "attention %-6s %-4s heads %d/%d dim %d scale %g: nmse %.1e",
                           li_backend_cpu_isa(&bes[b]), li_type_name(dt), nh, nkv, D, scales[sc], e);
                }
            }
            free(q);
            free(want);
            free(got);
            li_aligned_free(kv.k);
            li_aligned_free(kv.v);
        }
    }
}

/* kv_store to F16 / BF16: every backend writes the reference's bytes for
 * every float (random bit patterns: NaNs with payloads, infinities,
 * subnormals, overflow and halfway cases; plus chosen edges), at odd row
 * sizes and scattered slots. */
static void test_kv_store_bits(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa0e000,
        0xff8fffff, 0x00000001, 0x807fffff, 0x00400000, 0x33000000, 0x33000001, 0x337fffff, 0x387fc000,
        0x387fe000, 0x38800000, 0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x7f7fffff, 0xff7f8000,
        0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f800fff, 0x3f801000, 0x3f803000, 0xbf801000, 0x00018000};
    const struct {
        int nkv, D;
        int64_t n_tokens;
    } shapes[] = {{3, 21, 7}, {1, 5, 3}, {2, 64, 33}, {1, 136, 2}};
    const li_type dtypes[] = {LI_TYPE_F16, LI_TYPE_BF16};
    bool ok = true;
    for (size_t si = 0; si < LI_ARRAY_LEN(shapes); si++)
        for (size_t di = 0; di < LI_ARRAY_LEN(dtypes); di++) {
            const int nkv = shapes[si].nkv, D = shapes[si].D;
            const int64_t nt = shapes[si].n_tokens, row = (int64_t)nkv * D, slots = 3 * nt + 5;
            const size_t bytes = (size_t)(slots * row) * 2;
            float *k = li_xmalloc((size_t)(nt * row) * sizeof(float)), *v = li_xmalloc((size_t)(nt * row) * sizeof(float));
            for (int64_t j = 0; j < nt * row; j++) {
                k[j] = f32_from(j < (int64_t)LI_ARRAY_LEN(edges) ? edges[j] : rng_u32());
                v[j] = f32_from(j < (int64_t)LI_ARRAY_LEN(edges) ? edges[LI_ARRAY_LEN(edges) - 1 - j] ^ 0x80000000u
                                                                 : rng_u32());
            }
            int64_t *slot = li_xmalloc((size_t)nt * sizeof(int64_t));
            for (int64_t i = 0; i < nt; i++) slot[i] = (i * 7 + 3) % slots; /* scattered, distinct */
            li_kv_layer want = {.dtype = dtypes[di], .k = li_aligned_alloc(bytes), .v = li_aligned_alloc(bytes)};
            memset(want.k, 0x5a, bytes);
            memset(want.v, 0x5a, bytes);
            ref->kv_store(&ref_be, &want, k, v, slot, nt, nkv, D);
            for (int b = 0; b < n_be; b++) {
                li_kv_layer got = {.dtype = dtypes[di], .k = li_aligned_alloc(bytes), .v = li_aligned_alloc(bytes)};
                memset(got.k, 0x5a, bytes); /* untouched slots must stay untouched */
                memset(got.v, 0x5a, bytes);
                bes[b].ops->kv_store(&bes[b], &got, k, v, slot, nt, nkv, D);
                const bool same = !memcmp(got.k, want.k, bytes) && !memcmp(got.v, want.v, bytes);
                if (!same)
                    printf("  kv_store %s %s heads %d dim %d: bytes differ from the reference\n",
                           li_backend_cpu_isa(&bes[b]), li_type_name(dtypes[di]), nkv, D);
                ok &= same;
                li_aligned_free(got.k);
                li_aligned_free(got.v);
            }
            li_aligned_free(want.k);
            li_aligned_free(want.v);
            free(k);
            free(v);
            free(slot);
        }
    report(ok, "kv_store f16/bf16, rows of 63/5/128/136 floats, every bit class: every backend writes the "
               "reference bytes");
}

/* Every slot of kv (slots of nkv x D) filled with random K and V values
 * through the reference's store */
static void kv_fill_slots(li_kv_layer *kv, int64_t slots, int nkv, int D) {
    const int64_t row = (int64_t)nkv * D;
    float *kf = li_xmalloc((size_t)(slots * row) * sizeof(float)), *vf = li_xmalloc((size_t)(slots * row) * sizeof(float));
    int64_t *slot = li_xmalloc((size_t)slots * sizeof(int64_t));
    fill(kf, slots * row, 2.0f);
    fill(vf, slots * row, 1.0f);
    for (int64_t i = 0; i < slots; i++) slot[i] = i;
    li_backend_ref_ops()->kv_store(NULL, kv, kf, vf, slot, slots, nkv, D);
    free(kf); free(vf); free(slot);
}

/* Tokens of a's batch (whose output be just wrote to a->out) whose output
 * differs, bit for bit, when run alone or in the batch reversed */
static int attn_alone_reversed_differ(li_backend *be, const li_attn_args *a) {
    const int64_t n = a->n_tokens, len = (int64_t)a->n_head * a->head_dim;
    float *one = li_xmalloc((size_t)len * sizeof(float)), *rq = li_xmalloc((size_t)(n * len) * sizeof(float));
    float *rev = li_xmalloc((size_t)(n * len) * sizeof(float));
    int32_t *rseq = li_xmalloc((size_t)n * sizeof(int32_t)), *rpos = li_xmalloc((size_t)n * sizeof(int32_t));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        li_attn_args a1 = *a;
        a1.n_tokens = 1;
        a1.q = a->q + i * len;
        a1.out = one;
        a1.pos = a->pos + i;
        a1.seq = a->seq + i;
        be->ops->attention(be, &a1);
        bad += memcmp(one, a->out + i * len, (size_t)len * sizeof(float)) != 0;
        rseq[i] = a->seq[n - 1 - i];
        rpos[i] = a->pos[n - 1 - i];
        memcpy(rq + i * len, a->q + (n - 1 - i) * len, (size_t)len * sizeof(float));
    }
    li_attn_args ar = *a;
    ar.q = rq;
    ar.out = rev;
    ar.pos = rpos;
    ar.seq = rseq;
    be->ops->attention(be, &ar);
    for (int64_t i = 0; i < n; i++) bad += memcmp(rev + i * len, a->out + (n - 1 - i) * len, (size_t)len * sizeof(float)) != 0;
    free(one); free(rq); free(rev); free(rseq); free(rpos);
    return bad;
}

/* Contexts past LI_ATTN_CHUNK positions: the tile path takes a long
 * token's softmax by chunks of positions and merges them (cpu_kernels.h).
 * Tokens on both sides of the chunk boundaries (127..129, 255..257, the
 * last of 600), in a prefill run that crosses one, and decode tokens of
 * other sequences: every ISA and thread count against the reference
 * (nmse), and each token alone, in the batch and in the batch reversed
 * bit for bit; with blocks of 16 (chunks on block boundaries) and of 48
 * (not: one pass over the whole context). Alone, a token's chunks are items
 * of their own (2 threads) or one (1 thread); in the batch one item takes a
 * tile's chunks: both ways must agree. */
static void test_attention_long_contexts(int nh, int nkv, int D, li_type dt) {
    const int L = 600;
    const int block_sizes[] = {16, 48};
    for (size_t bi = 0; bi < LI_ARRAY_LEN(block_sizes); bi++) {
        const int bs = block_sizes[bi], nblk = (L + bs - 1) / bs, stride = nblk;
        /* two sequences of L positions, blocks interleaved in reverse */
        int32_t *tables = li_xmalloc((size_t)2 * stride * sizeof(int32_t));
        for (int b = 0; b < nblk; b++) {
            tables[b] = 2 * (nblk - 1 - b);
            tables[stride + b] = 2 * b + 1;
        }
        const int64_t slots = (int64_t)2 * nblk * bs, row = (int64_t)nkv * D;
        li_kv_layer kv = {.dtype = dt};
        kv.k = li_aligned_alloc((size_t)slots * row * li_kv_elem_size(dt));
        kv.v = li_aligned_alloc((size_t)slots * row * li_kv_elem_size(dt));
        kv_fill_slots(&kv, slots, nkv, D);
        int32_t seq[40], pos[40];
        int64_t n = 0;
        for (int p = 120; p < 140; p++) { seq[n] = 0; pos[n++] = p; } /* a prefill run across 128 */
        const int dec[] = {0, 127, 128, 129, 255, 256, 257, 384, 599};
        for (size_t d = 0; d < LI_ARRAY_LEN(dec); d++) { seq[n] = 1; pos[n++] = dec[d]; }
        const int64_t len = (int64_t)nh * D;
        float *q = li_xmalloc((size_t)(n * len) * sizeof(float)), *want = li_xmalloc((size_t)(n * len) * sizeof(float));
        float *all = li_xmalloc((size_t)(n * len) * sizeof(float)), *first = li_xmalloc((size_t)(n * len) * sizeof(float));
        fill(q, n * len, 1.5f);
        li_attn_args a = {.n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = D, .block_size = bs,
                          .q = q, .out = want, .pos = pos, .seq = seq, .block_table = tables, .bt_stride = stride,
                          .kv = &kv, .scale = 0.125f};
        li_backend_ref_ops()->attention(NULL, &a);
        for (int ii = 0; ii < n_isas; ii++)
            for (int nt = 1; nt <= 2; nt++) {
                li_backend be;
                li_error err = {0};
                if (li_backend_cpu_init(&be, nt, isas[ii], &err)) continue;
                a.out = all;
                be.ops->attention(&be, &a);
                const double e = nmse(all, want, n * len);
                int bad = 0;
                if (nt == 1) memcpy(first, all, (size_t)(n * len) * sizeof(float));
                else bad += memcmp(first, all, (size_t)(n * len) * sizeof(float)) != 0;
                bad += attn_alone_reversed_differ(&be, &a);
                report(e < 1e-9 && bad == 0,
                       "attention %-6s %d thread%s %-4s heads %d/%d dim %d blocks of %d, contexts to %d: nmse %.1e "
                       "against the reference; %lld tokens alone, together and reversed agree (%d differ)", isas[ii], nt,
                       nt > 1 ? "s" : " ", li_type_name(dt), nh, nkv, D, bs, L, e, (long long)n, bad);
                li_backend_cpu_free(&be);
            }
        free(q); free(want); free(all); free(first);
        free(tables);
        li_aligned_free(kv.k);
        li_aligned_free(kv.v);
    }
}

/* A token's attention output must not depend on the other tokens of the
 * batch: the whole batch (prefill runs share tiles), each token alone, and
 * the batch reversed give the same bits, for every ISA, dtype and thread
 * count. */
static void test_attention_batch_invariance(int nh, int nkv, int D) {
    const int block_size = 16, num_blocks = 64;
    enum { BT_STRIDE = 8 }; /* flat (3, BT_STRIDE) table, rows padded */
    const int32_t tables[3 * BT_STRIDE] = {7, 2, 19, 40, 0, 0, 0, 0, 5, 33, 0, 0, 0, 0, 0, 0,
                                           30, 0, 11, 3, 25, 38, 50, 61};
    /* a prefill chunk of seq 2, decode tokens of seqs 0 and 1, interleaved */
    int32_t seq[40], pos[40];
    int64_t n = 0;
    for (int p = 60; p < 90; p++) {
        seq[n] = 2;
        pos[n++] = p;
        if (p == 70) { seq[n] = 0; pos[n++] = 50; }
        if (p == 80) { seq[n] = 1; pos[n++] = 20; }
    }
    const li_type dtypes[] = {LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_F32};
    for (size_t di = 0; di < LI_ARRAY_LEN(dtypes); di++) {
        const li_type dt = dtypes[di];
        const size_t kv_bytes = (size_t)num_blocks * block_size * nkv * D * li_kv_elem_size(dt);
        li_kv_layer kv = {.dtype = dt, .k = li_aligned_alloc(kv_bytes), .v = li_aligned_alloc(kv_bytes)};
        const int64_t slots = (int64_t)num_blocks * block_size;
        kv_fill_slots(&kv, slots, nkv, D);
        const int64_t len = (int64_t)nh * D;
        float *q = li_xmalloc((size_t)(n * len) * sizeof(float));
        float *all = li_xmalloc((size_t)(n * len) * sizeof(float));
        fill(q, n * len, 1.5f);
        float *one_thread = li_xmalloc((size_t)(n * len) * sizeof(float));
        for (int ii = 0; ii < n_isas; ii++)
            for (int nt = 1; nt <= 2; nt++) {
                li_backend be;
                li_error err = {0};
                if (li_backend_cpu_init(&be, nt, isas[ii], &err)) continue;
                li_attn_args a = {.n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = D,
                                  .block_size = block_size, .q = q, .out = all, .pos = pos, .seq = seq,
                                  .block_table = tables, .bt_stride = BT_STRIDE, .kv = &kv, .scale = 0.125f};
                be.ops->attention(&be, &a);
                int bad = 0;
                /* and the same bits whatever the thread count */
                if (nt == 1) memcpy(one_thread, all, (size_t)(n * len) * sizeof(float));
                else bad += memcmp(one_thread, all, (size_t)(n * len) * sizeof(float)) != 0;
                bad += attn_alone_reversed_differ(&be, &a);
                report(bad == 0, "batch invariance attention %-6s %d thread%s %-4s heads %d/%d dim %d: %lld tokens "
                       "alone, together and reversed agree (%d differ)", isas[ii], nt, nt > 1 ? "s" : " ",
                       li_type_name(dt), nh, nkv, D, (long long)n, bad);
                li_backend_cpu_free(&be);
            }
        free(q); free(all); free(one_thread);
        li_aligned_free(kv.k);
        li_aligned_free(kv.v);
    }
}

/* ------------------------------------------------------------------------
 * backend init and the thread pool
 * ---------------------------------------------------------------------- */

/* 64 chunks per job, claimed from a counter; each run marks its chunks */
typedef struct {
    atomic_int next;
    atomic_int hits[64];
    atomic_int by_worker; /* chunks done by threads other than the caller */
    atomic_int bad_ith;
} pool_job;

static void pool_work(void *p, int ith, int nth) {
    pool_job *j = p;
    if (ith < 0 || ith >= nth) atomic_fetch_add(&j->bad_ith, 1);
    for (;;) {
        const int c = atomic_fetch_add(&j->next, 1);
        if (c >= 64) break;
        for (volatile int spin = 0; spin < 200; spin++) {
        }
        atomic_fetch_add(&j->hits[c], 1);
        if (ith) atomic_fetch_add(&j->by_worker, 1);
    }
}

static void test_init_and_pool(void) {
    li_backend be;
    li_error err = {0};
    report(li_backend_cpu_init(&be, 2, "bogus", &err) == LI_EINVAL && strstr(err.msg, "bogus"),
           "cpu init: unknown isa refused (%s)", err.msg);
    bool ok = li_backend_cpu_init(&be, 0, NULL, &err) == 0;
    if (ok) {
        report(be.n_threads >= 1 && !strcmp(li_backend_cpu_isa(&be), isas[n_isas - 1]),
               "cpu init: auto picks %s, %d threads", li_backend_cpu_isa(&be), be.n_threads);
        const int avail = be.n_threads;
        li_backend_cpu_free(&be);
        ok = li_backend_cpu_init(&be, 1000, "auto", &err) == 0 && be.n_threads == avail;
        li_backend_cpu_free(&be);
        report(ok, "cpu init: thread count capped at the %d available CPUs", avail);
    } else {
        report(false, "cpu init: auto failed: %s", err.msg);
    }

    /* many back-to-back jobs (the spinning path), then a few after the
     * workers have parked (the wake-up path): every chunk runs exactly once */
    li_threadpool *tp = li_threadpool_init(3);
    pool_job j;
    memset(&j, 0, sizeof j);
    int runs = 0;
    for (int i = 0; i < 20005; i++, runs++) {
        if (i >= 20000) {
            const double t0 = li_time_now();
            while (li_time_now() - t0 < 2e-3) sched_yield();
        }
        atomic_store(&j.next, 0);
        li_threadpool_run(tp, pool_work, &j, i % 2 ? 3 : 2);
    }
    li_threadpool_free(tp);
    bool once = true;
    for (int c = 0; c < 64; c++) once &= atomic_load(&j.hits[c]) == runs;
    report(once && atomic_load(&j.bad_ith) == 0, "threadpool: %d jobs, every chunk ran exactly once", runs);
    report(atomic_load(&j.by_worker) > 0, "threadpool: workers took %d of %d chunks", atomic_load(&j.by_worker),
           runs * 64);
}

/* ------------------------------------------------------------------------
 * hadamard: the reference against the dense matrix in double, every backend
 * against the reference bit for bit, orthogonality, batch invariance
 * ---------------------------------------------------------------------- */

static void test_hadamard(li_backend *bes, int n_be) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    /* (rows, dim, block): odd row counts, SmolLM2's n_ff in blocks of 128 and 512, a block of 1, one block */
    static const int64_t cases[][3] = {{1, 1536, 128}, {7, 1536, 512}, {37, 1536, 128}, {3, 48, 16},
                                       {5, 12, 1},     {9, 64, 64},     {300, 384, 128}};
    for (size_t ci = 0; ci < LI_ARRAY_LEN(cases); ci++) {
        const int64_t n = cases[ci][0], dim = cases[ci][1], b = cases[ci][2], len = n * dim;
        float *x = li_xmalloc((size_t)len * sizeof(float)), *want = li_xmalloc((size_t)len * sizeof(float));
        float *got = li_xmalloc((size_t)len * sizeof(float)), *s = li_xmalloc((size_t)dim * sizeof(float));
        fill(x, len, 4.0f);
        for (int64_t j = 0; j < dim; j++) s[j] = rng_u32() & 1 ? 1.0f : -1.0f;
        memcpy(want, x, (size_t)len * sizeof(float));
        ref->hadamard(&ref_be, want, s, n, dim, b);
        /* the definition: y_i = sum_j x_j s_j H[j][i] / sqrt(b) within each block, H[j][i] = (-1)^popcount(i & j) */
        double worst = 0, nx = 0, ny = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < dim; i++) {
                const int64_t b0 = i / b * b;
                double acc = 0;
                for (int64_t j = b0; j < b0 + b; j++)
                    acc += (double)x[r * dim + j] * s[j] * (__builtin_popcountll((uint64_t)((i - b0) & (j - b0))) & 1 ? -1 : 1);
                acc /= sqrt((double)b);
                worst = fmax(worst, fabs(acc - want[r * dim + i]));
                nx += (double)x[r * dim + i] * x[r * dim + i];
                ny += (double)want[r * dim + i] * want[r * dim + i];
            }
        report(worst < 1e-5 * 4 * sqrt((double)b), "hadamard ref n=%lld dim=%lld block=%lld: the dense matrix's "
               "product (worst abs %.1e), norm kept (%.2e rel)", (long long)n, (long long)dim, (long long)b, worst,
               fabs(sqrt(ny / nx) - 1));
        report(fabs(sqrt(ny / nx) - 1) < 1e-5, "hadamard ref n=%lld dim=%lld: orthogonal (||y|| = ||x||)",
               (long long)n, (long long)dim);
        for (int be = 0; be < n_be; be++) {
            memcpy(got, x, (size_t)len * sizeof(float));
            bes[be].ops->hadamard(&bes[be], got, s, n, dim, b);
            report(!memcmp(got, want, (size_t)len * sizeof(float)), "hadamard %-6s n=%lld dim=%lld block=%lld: "
                   "identical to the reference", li_backend_cpu_isa(&bes[be]), (long long)n, (long long)dim,
                   (long long)b);
            /* batch invariance: each row alone gives the batch's bits */
            bool inv = true;
            for (int64_t r = 0; r < n; r += n > 8 ? n / 5 : 1) {
                float *row = li_xmalloc((size_t)dim * sizeof(float));
                memcpy(row, x + r * dim, (size_t)dim * sizeof(float));
                bes[be].ops->hadamard(&bes[be], row, s, 1, dim, b);
                inv &= !memcmp(row, want + r * dim, (size_t)dim * sizeof(float));
                free(row);
            }
            report(inv, "hadamard %-6s n=%lld dim=%lld: a row alone has the batch's bits", li_backend_cpu_isa(&bes[be]),
                   (long long)n, (long long)dim);
        }
        /* H_b / sqrt(b) is symmetric and its own inverse: the unsigned transform after the signed one
         * gives x * s back, to rounding */
        float *ones = li_xmalloc((size_t)dim * sizeof(float));
        for (int64_t j = 0; j < dim; j++) ones[j] = 1.0f;
        ref->hadamard(&ref_be, want, ones, n, dim, b);
        double back = 0;
        for (int64_t j = 0; j < len; j++) back = fmax(back, fabs(want[j] - x[j] * s[j % dim]));
        report(back < 1e-5 * 4 * sqrt((double)b), "hadamard n=%lld dim=%lld block=%lld: applied twice gives x * s "
               "back (worst %.1e)", (long long)n, (long long)dim, (long long)b, back);
        free(ones);
        free(x);
        free(want);
        free(got);
        free(s);
    }
}

int main(void) {
    isas_find();
    test_type_table();
    test_fp16();
    test_quantize_ref();
    test_quantize_act();
    test_init_and_pool();

    li_backend bes[4];
    int n_be = 0;
    for (int i = 0; i < n_isas; i++) {
        li_error err = {0};
        if (li_backend_cpu_init(&bes[n_be], 2, isas[i], &err) == 0) n_be++;
        else report(false, "cpu init isa %s: %s", isas[i], err.msg);
    }
    test_matmul(bes, n_be);
    test_small_ops(bes, n_be);
    test_small_ops_big(bes, n_be);
    test_attention(bes, n_be);
    test_kv_store_bits(bes, n_be);
    test_matmul_batch_invariance();
    test_attention_long_contexts(9, 3, 64, LI_TYPE_F16);  /* SmolLM2's shape */
    test_attention_long_contexts(8, 2, 128, LI_TYPE_BF16);
    test_attention_long_contexts(8, 1, 72, LI_TYPE_F32);  /* the generic head size */
    test_attention_batch_invariance(9, 3, 64); /* SmolLM2's shape */
    test_attention_batch_invariance(8, 1, 72); /* one kv head: a token alone splits its query group */
    /* head dims of whole 16-lane chunks: a tile of 6+ queries sums its scores
     * with positions in the lanes (ops_avx512.c attn_scores_v), a token alone
     * (4 / 2 queries) as 16-lane dots; both must give the same bits */
    test_attention_batch_invariance(8, 2, 128);
    test_attention_batch_invariance(4, 2, 256);
    test_hadamard(bes, n_be); /* last: its random draws leave the others' data as it was */
    for (int b = 0; b < n_be; b++) li_backend_cpu_free(&bes[b]);
    return t_summary("kernels");
}
