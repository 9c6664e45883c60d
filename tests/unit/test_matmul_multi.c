/* test_matmul_multi.c — the backend's matmul_multi (weights that share an
 * input, as q/k/v and gate/up do, run as one job) and matmul_add (the
 * residual add fused into the matmul) give every output bit for bit what
 * matmul (then add) gives one weight at a time, and what the scalar
 * reference gives: on every ISA level this CPU has, 1 and 2 threads, packed
 * and raw weights, at odd sizes, and when the weights disagree on type (the
 * backend then falls back to one matmul per weight). */
#include "util/common.h"
#include "backend.h"
#include "test_util.h"
#include "test_weight.h"

#include <math.h>
#include <string.h>

static uint64_t seed = 0x51ab1e5eedull;
static float rnd(void) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return (float)(uint32_t)(seed >> 16) / 2147483648.0f - 1.0f;
}

static void fill_row(float *row, int64_t k) {
    for (int64_t j = 0; j < k; j++) row[j] = rnd() * (1.0f + (float)(j % 7));
}

/* One case: n_w weights (types[i], k[i], m[i]) on backend be against the
 * reference, n input rows; the weights of a group share k, as they share x. */
static bool run_case(li_backend *be, int n_w, const li_type *types, const int64_t *ks, const int64_t *ms, int64_t n,
                     bool packed) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    test_weight w[4];
    li_weight wb[4];
    const li_weight *wp[4];
    float *want[4], *got[4];
    int64_t kmax = 0;
    for (int i = 0; i < n_w; i++) kmax = LI_MAX(kmax, ks[i]);
    float *x = li_xmalloc((size_t)(n * kmax) * sizeof(float));
    for (int64_t j = 0; j < n * kmax; j++) x[j] = rnd() * 3.0f;
    for (int i = 0; i < n_w; i++) {
        test_weight_make(&w[i], types[i], ks[i], ms[i], fill_row);
        wb[i] = w[i].w;
        if (packed && be->ops->weight_prepare) be->ops->weight_prepare(be, &wb[i]);
        wp[i] = &wb[i];
        want[i] = li_xmalloc((size_t)(n * ms[i]) * sizeof(float));
        got[i] = li_xmalloc((size_t)(n * ms[i]) * sizeof(float));
        for (int64_t j = 0; j < n * ms[i]; j++) got[i][j] = NAN;
    }
    for (int i = 0; i < n_w; i++) ref->matmul(&ref_be, &w[i].w, x, want[i], n);
    be->ops->matmul_multi(be, wp, n_w, x, got, n);
    bool ok = true;
    for (int i = 0; i < n_w; i++) {
        ok &= memcmp(got[i], want[i], (size_t)(n * ms[i]) * sizeof(float)) == 0;
        if (packed && be->ops->weight_release) be->ops->weight_release(be, &wb[i]);
        li_aligned_free(w[i].data);
        free(want[i]);
        free(got[i]);
    }
    free(x);
    return ok;
}

/* matmul_add: y = x · W^T and res += y, against the reference's matmul
 * then add, bit for bit (y and res both). */
static bool run_add_case(li_backend *be, li_type type, int64_t k, int64_t m, int64_t n, bool packed) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    test_weight w;
    test_weight_make(&w, type, k, m, fill_row);
    li_weight wb = w.w;
    if (packed && be->ops->weight_prepare) be->ops->weight_prepare(be, &wb);
    float *x = li_xmalloc((size_t)(n * k) * sizeof(float));
    float *y0 = li_xmalloc((size_t)(n * m) * sizeof(float)), *y1 = li_xmalloc((size_t)(n * m) * sizeof(float));
    float *r0 = li_xmalloc((size_t)(n * m) * sizeof(float)), *r1 = li_xmalloc((size_t)(n * m) * sizeof(float));
    for (int64_t j = 0; j < n * k; j++) x[j] = rnd() * 3.0f;
    for (int64_t j = 0; j < n * m; j++) r0[j] = r1[j] = rnd() * 50.0f, y1[j] = NAN;
    ref->matmul(&ref_be, &w.w, x, y0, n);
    ref->add(&ref_be, r0, y0, n * m);
    be->ops->matmul_add(be, &wb, x, y1, r1, n);
    const bool ok = !memcmp(y0, y1, (size_t)(n * m) * sizeof(float)) && !memcmp(r0, r1, (size_t)(n * m) * sizeof(float));
    if (packed && be->ops->weight_release) be->ops->weight_release(be, &wb);
    li_aligned_free(w.data);
    free(x);
    free(y0);
    free(y1);
    free(r0);
    free(r1);
    return ok;
}

int main(void) {
    const char *isas[] = {"scalar", "avx2", "avx512", "amx"};
    const int64_t ns[] = {1, 3, 8, 12, 17, 33, 70};
    int tried = 0;
    for (size_t ii = 0; ii < LI_ARRAY_LEN(isas); ii++)
        for (int nt = 1; nt <= 2; nt++) {
            li_backend be;
            li_error err = {0};
            if (li_backend_cpu_init(&be, nt, isas[ii], &err)) {
                printf("skip %s: %s\n", isas[ii], err.msg);
                continue;
            }
            if (!be.ops->matmul_multi) {
                printf("skip %s: no matmul_multi\n", isas[ii]);
                li_backend_cpu_free(&be);
                continue;
            }
            tried++;
            for (int packed = 0; packed < 2; packed++) {
                bool qkv = true, gu = true, f = true, mixed = true;
                for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
                    const int64_t n = ns[ni];
                    /* q/k/v-like: one k, three heights (panel tails: 17, 40) */
                    qkv &= run_case(&be, 3, (li_type[]){LI_TYPE_Q4_1, LI_TYPE_Q4_1, LI_TYPE_Q4_1},
                                    (int64_t[]){96, 96, 96}, (int64_t[]){48, 17, 40}, n, packed);
                    /* gate/up-like, Q4_0 and Q8_0 */
                    gu &= run_case(&be, 2, (li_type[]){LI_TYPE_Q4_0, LI_TYPE_Q4_0}, (int64_t[]){160, 160},
                                   (int64_t[]){70, 33}, n, packed);
                    gu &= run_case(&be, 2, (li_type[]){LI_TYPE_Q8_0, LI_TYPE_Q8_0}, (int64_t[]){64, 64},
                                   (int64_t[]){1, 65}, n, packed);
                    /* float weights */
                    f &= run_case(&be, 3, (li_type[]){LI_TYPE_F16, LI_TYPE_F16, LI_TYPE_F16}, (int64_t[]){37, 37, 37},
                                  (int64_t[]){5, 16, 19}, n, packed);
                    /* weights that cannot share a job: different types, a
                     * type the kernels do not know (Q8_1: reference) */
                    mixed &= run_case(&be, 3, (li_type[]){LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_F32},
                                      (int64_t[]){64, 64, 64}, (int64_t[]){20, 9, 31}, n, packed);
                    mixed &= run_case(&be, 2, (li_type[]){LI_TYPE_Q8_1, LI_TYPE_Q4_1}, (int64_t[]){32, 32},
                                      (int64_t[]){7, 18}, n, packed);
                }
                bool add = be.ops->matmul_add != NULL;
                for (size_t ni = 0; add && ni < LI_ARRAY_LEN(ns); ni++) {
                    add &= run_add_case(&be, LI_TYPE_Q4_1, 1536, 40, ns[ni], packed);
                    add &= run_add_case(&be, LI_TYPE_Q8_0, 96, 17, ns[ni], packed);
                    add &= run_add_case(&be, LI_TYPE_F32, 37, 23, ns[ni], packed);
                    add &= run_add_case(&be, LI_TYPE_Q8_1, 64, 9, ns[ni], packed); /* reference fallback */
                }
                const char *how = packed ? "packed" : "raw";
                CHECK(add, "%s %d thr %s: matmul_add differs from matmul then add", isas[ii], nt, how);
                CHECK(qkv, "%s %d thr %s: q/k/v-like Q4_1 group differs from the reference", isas[ii], nt, how);
                CHECK(gu, "%s %d thr %s: gate/up-like Q4_0/Q8_0 group differs", isas[ii], nt, how);
                CHECK(f, "%s %d thr %s: F16 group differs", isas[ii], nt, how);
                CHECK(mixed, "%s %d thr %s: mixed-type fallback differs", isas[ii], nt, how);
                printf("%s %d thread(s) %s: q/k/v, gate/up, f16 and mixed groups, and matmul_add, at n = 1..70 %s\n",
                       isas[ii], nt, how, qkv && gu && f && mixed && add ? "bit-identical to the reference" : "DIFFER");
            }
            li_backend_cpu_free(&be);
        }
    CHECK(tried > 0, "no CPU backend could start");
    return t_summary("matmul_multi");
}
