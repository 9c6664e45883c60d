// lt_gemm.cu — tensor-core GEMMs through cuBLASLt (lt_gemm.h).
#include "cuda/lt_gemm.h"
#include "cuda/dl_syms.h"

#include <cublasLt.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// ---- cuBLASLt's entry points, opened once ----
static struct {
    bool tried, ok;
    char why[160];
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
} L;

static bool lt_open(void) {
    if (L.tried) return L.ok;
    L.tried = true;
    char name[40];
    snprintf(name, sizeof name, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    const li_dl_sym syms[] = {
        LI_DL_SYM(L.create, "cublasLtCreate"),
        LI_DL_SYM(L.destroy, "cublasLtDestroy"),
        LI_DL_SYM(L.desc_create, "cublasLtMatmulDescCreate"),
        LI_DL_SYM(L.desc_destroy, "cublasLtMatmulDescDestroy"),
        LI_DL_SYM(L.desc_set, "cublasLtMatmulDescSetAttribute"),
        LI_DL_SYM(L.layout_create, "cublasLtMatrixLayoutCreate"),
        LI_DL_SYM(L.layout_destroy, "cublasLtMatrixLayoutDestroy"),
        LI_DL_SYM(L.pref_create, "cublasLtMatmulPreferenceCreate"),
        LI_DL_SYM(L.pref_destroy, "cublasLtMatmulPreferenceDestroy"),
        LI_DL_SYM(L.pref_set, "cublasLtMatmulPreferenceSetAttribute"),
        LI_DL_SYM(L.heuristic, "cublasLtMatmulAlgoGetHeuristic"),
        LI_DL_SYM(L.matmul, "cublasLtMatmul"),
    };
    L.ok = li_dl_open_syms(name, syms, sizeof syms / sizeof *syms, L.why, sizeof L.why);
    return L.ok;
}

// One shape's descriptors and algorithm; failed: the heuristic had none
// (kept, so the shape is not asked again).
struct lt_plan {
    li_lt_kind kind;
    int64_t m, n, k;
    size_t ws_bytes;
    bool failed;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

struct li_lt {
    cublasLtHandle_t h;
    lt_plan *plans;
    int n_plans, cap_plans;
};

li_lt *li_lt_create(char *why, size_t why_len) {
    if (!lt_open()) {
        snprintf(why, why_len, "cannot open cuBLASLt: %s", L.why);
        return nullptr;
    }
    li_lt *lt = (li_lt *)calloc(1, sizeof *lt);
    if (!lt) {
        snprintf(why, why_len, "out of memory");
        return nullptr;
    }
    const cublasStatus_t s = L.create(&lt->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "cublasLtCreate: status %d", (int)s);
        free(lt);
        return nullptr;
    }
    return lt;
}

static void plan_free(lt_plan *p) {
    if (p->op) L.desc_destroy(p->op);
    if (p->a) L.layout_destroy(p->a);
    if (p->b) L.layout_destroy(p->b);
    if (p->d) L.layout_destroy(p->d);
}

void li_lt_destroy(li_lt *lt) {
    if (!lt) return;
    for (int i = 0; i < lt->n_plans; i++) plan_free(&lt->plans[i]);
    free(lt->plans);
    L.destroy(lt->h);
    free(lt);
}

static size_t elem_bytes(li_lt_kind kind) { return kind == LI_LT_INT8 || kind == LI_LT_FP8 ? 1 : 2; }

bool li_lt_shape_ok(li_lt_kind kind, int64_t m, int64_t k) {
    return k > 0 && m > 0 && (k * (int64_t)elem_bytes(kind)) % 16 == 0 && m % 16 == 0;
}

// the operand, output and compute types of a kind
static void kind_types(li_lt_kind kind, cudaDataType_t *ab, cudaDataType_t *d, cublasComputeType_t *ct,
                       cudaDataType_t *scale) {
    switch (kind) {
    case LI_LT_INT8: *ab = CUDA_R_8I, *d = CUDA_R_32I, *ct = CUBLAS_COMPUTE_32I, *scale = CUDA_R_32I; break;
    case LI_LT_FP8: *ab = CUDA_R_8F_E4M3, *d = CUDA_R_32F, *ct = CUBLAS_COMPUTE_32F, *scale = CUDA_R_32F; break;
    case LI_LT_BF16: *ab = CUDA_R_16BF, *d = CUDA_R_32F, *ct = CUBLAS_COMPUTE_32F, *scale = CUDA_R_32F; break;
    default: *ab = CUDA_R_16F, *d = CUDA_R_32F, *ct = CUBLAS_COMPUTE_32F, *scale = CUDA_R_32F; break;
    }
}

// Builds p's descriptors and asks the heuristic for an algorithm: column-major
// D(m, n) = A^T(m, k) . B(k, n), A the (k, m) view of the row-major weights,
// B the (k, n) view of the row-major activations, D (m, n) = row-major (n, m).
static cublasStatus_t plan_make(li_lt *lt, lt_plan *p) {
    cudaDataType_t ab, dt, sc;
    cublasComputeType_t ct;
    kind_types(p->kind, &ab, &dt, &ct, &sc);
    cublasStatus_t s = L.desc_create(&p->op, ct, sc);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (!s) s = L.desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (!s) s = L.desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (!s) s = L.layout_create(&p->a, ab, (uint64_t)p->k, (uint64_t)p->m, p->k);
    if (!s) s = L.layout_create(&p->b, ab, (uint64_t)p->k, (uint64_t)p->n, p->k);
    if (!s) s = L.layout_create(&p->d, dt, (uint64_t)p->m, (uint64_t)p->n, p->m);
    if (s) return s;
    cublasLtMatmulPreference_t pref = nullptr;
    s = L.pref_create(&pref);
    if (!s) s = L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p->ws_bytes, sizeof p->ws_bytes);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    int found = 0;
    if (!s) s = L.heuristic(lt->h, p->op, p->a, p->b, p->d, p->d, pref, 1, &r, &found);
    if (pref) L.pref_destroy(pref);
    if (s) return s;
    if (!found || r.state != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->algo = r.algo;
    return CUBLAS_STATUS_SUCCESS;
}

static const char *kind_name(li_lt_kind kind) {
    static const char *const n[] = {"int8", "fp8 e4m3", "bf16", "f16"};
    return kind < LI_LT_N ? n[kind] : "?";
}

int li_lt_matmul(li_lt *lt, cudaStream_t st, li_lt_kind kind, int64_t m, int64_t n, int64_t k, const void *a,
                 const void *b, void *d, void *ws, size_t ws_bytes, char *why, size_t why_len) {
    if (!li_lt_shape_ok(kind, m, k)) {
        snprintf(why, why_len, "cuBLASLt %s: %lld x %lld: rows of k not in 16-byte multiples, or m not a multiple "
                 "of 16", kind_name(kind), (long long)m, (long long)k);
        return -1;
    }
    lt_plan *p = nullptr;
    for (int i = 0; i < lt->n_plans && !p; i++) {
        lt_plan *q = &lt->plans[i];
        if (q->kind == kind && q->m == m && q->n == n && q->k == k && q->ws_bytes == ws_bytes) p = q;
    }
    if (!p) {
        if (lt->n_plans == lt->cap_plans) {
            const int cap = lt->cap_plans ? 2 * lt->cap_plans : 32;
            lt_plan *np = (lt_plan *)realloc(lt->plans, (size_t)cap * sizeof *np);
            if (!np) {
                snprintf(why, why_len, "out of memory");
                return -1;
            }
            lt->plans = np;
            lt->cap_plans = cap;
        }
        p = &lt->plans[lt->n_plans++];
        memset(p, 0, sizeof *p);
        p->kind = kind;
        p->m = m;
        p->n = n;
        p->k = k;
        p->ws_bytes = ws_bytes;
        const cublasStatus_t s = plan_make(lt, p);
        if (s) {
            p->failed = true;
            snprintf(why, why_len, "cuBLASLt %s %lld x %lld x %lld: no algorithm (status %d)", kind_name(kind),
                     (long long)m, (long long)n, (long long)k, (int)s);
            return -1;
        }
    }
    if (p->failed) {
        snprintf(why, why_len, "cuBLASLt %s %lld x %lld x %lld: no algorithm", kind_name(kind), (long long)m,
                 (long long)n, (long long)k);
        return -1;
    }
    const int32_t i1 = 1, i0 = 0;
    const float f1 = 1.0f, f0 = 0.0f;
    const void *alpha = kind == LI_LT_INT8 ? (const void *)&i1 : (const void *)&f1;
    const void *beta = kind == LI_LT_INT8 ? (const void *)&i0 : (const void *)&f0;
    const cublasStatus_t s =
        L.matmul(lt->h, p->op, alpha, a, p->a, b, p->b, beta, d, p->d, d, p->d, &p->algo, ws, ws_bytes, st);
    if (s) {
        snprintf(why, why_len, "cublasLtMatmul %s: status %d", kind_name(kind), (int)s);
        return -1;
    }
    return 0;
}
