/* backend.h — the compute backend vtable.
 *
 * The engine calls ops only through this table, so a CUDA backend slots in
 * without touching the engine. Every op has a scalar reference
 * (kernels/cpu/ops_ref.c); SIMD and device versions are checked against it.
 * All float buffers here are host memory for the CPU backend and device
 * memory for device backends (allocated via the backend). Shapes are written
 * beside each argument, row-major, innermost last. */
#ifndef LI_BACKEND_H
#define LI_BACKEND_H

#include "types.h"

typedef struct li_backend li_backend;
struct li_error; /* util/common.h */

/* A weight matrix of m rows of k elements: y = W·x. GGUF weights are
 * LI_SCHEME_PLAIN with every scheme field zero / NULL; a scheme weight
 * (W8A8, FP8, AWQ, GPTQ, INT4: types.h) stores codes of the scheme's type in
 * `data` and its scales (and zero points, permutation) beside them:
 *   w[r][perm ? perm[j] : j] = (code(r, j) - zero[r][j / gs]) * scales[r][j / gs]
 * with gs = group_size, or k when group_size is 0 (per channel). */
typedef struct li_weight {
    li_type type;
    int64_t k, m;       /* (m, k) */
    size_t row_bytes;   /* bytes per row of `data` */
    const void *data;   /* original GGUF rows (mmap), or a scheme's codes (m, k) */
    void *packed;       /* backend-specific repacked layout, or NULL */
    const char *name;
    /* ---- weight scheme (optional: all zero for GGUF weights) ---- */
    li_scheme scheme;       /* LI_SCHEME_PLAIN: the type's blocks say everything */
    li_act_quant act;       /* activation quantization before the product (the scheme's) */
    int64_t group_size;     /* elements along k per group; 0 = one group per row (per channel) */
    const float *scales;    /* (m, n_groups) f32, n_groups = li_weight_n_groups(): ceil(k / group_size) or 1 */
    const float *zeros;     /* (m, n_groups) f32 zero points in code units, or NULL: the scheme's implicit zero */
    const int32_t *perm;    /* (k) GPTQ act-order: stored column j multiplies input column perm[j]; or NULL */
} li_weight;

/* Groups per row: ceil(k / group_size), or 1 per channel. */
int64_t li_weight_n_groups(const li_weight *w);
/* 0 if w's scheme fields are consistent (codes type, activation kind,
 * scales present, zero points / permutation allowed, perm a permutation of
 * 0..k-1), else -1 with the reason in why (cap bytes). Loaders call it. */
int li_weight_check(const li_weight *w, char *why, size_t cap);
/* Row `row` of w as f32 values (k), in input-column order: the type's
 * dequantization, then the group scales / zero points, then the inverse
 * permutation. For plain weights exactly the type's to_float. The scalar
 * reference every scheme kernel is tested against. */
void li_weight_dequant_row_ref(const li_weight *w, int64_t row, float *out);

/* One layer's paged KV storage. Each block holds block_size token slots;
 * slot layout [block][slot][kv_head][head_dim]. */
typedef struct li_kv_layer {
    li_type dtype;        /* F16, BF16, F32 (issue 3 adds FP8/INT8 with scales) */
    void *k, *v;          /* (num_blocks, block_size, n_head_kv, head_dim) */
    float *k_scale, *v_scale; /* (num_blocks, block_size, n_head_kv) for 8-bit dtypes, else NULL */
} li_kv_layer;

typedef struct li_attn_args {
    int64_t n_tokens;
    int n_head, n_head_kv, head_dim, block_size;
    const float *q;        /* (n_tokens, n_head, head_dim) */
    float *out;            /* (n_tokens, n_head, head_dim) */
    const int32_t *pos;    /* (n_tokens) position of each token in its sequence */
    const int32_t *seq;    /* (n_tokens) which sequence: index into block_tables */
    int32_t *const *block_tables; /* per sequence: block ids, position p in block p/block_size */
    const li_kv_layer *kv;
    float scale;           /* usually 1/sqrt(head_dim) */
} li_attn_args;

typedef struct li_backend_ops {
    const char *name;
    /* true when a position's results depend on the batch around it (the
     * "ggml" backend, like llama.cpp, sums attention differently for 1 and
     * 2+ tokens): speculative verification is then not exact and is refused */
    bool batch_variant;
    /* y(n, m) = x(n, k) · W(m, k)^T */
    void (*matmul)(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n);
    /* optional (NULL: matmul per weight): y[i](n, m_i) = x(n, k) · W[i](m_i, k)^T
     * for n_w weights reading the same input (q/k/v, gate/up); results are
     * the same as matmul's, one weight at a time */
    void (*matmul_multi)(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                         int64_t n);
    /* optional (NULL: matmul, then add): y(n, m) = x · W^T, then res(n, m) += y
     * (a residual connection), the same bits as the two ops */
    void (*matmul_add)(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n);
    /* out(n, k) = rows `ids` of W, dequantized (embedding lookup) */
    void (*get_rows)(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out);
    /* y(n, dim) = x / rms(x) * w(dim) */
    void (*rmsnorm)(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim,
                    float eps);
    /* in place on x(n, n_heads, head_dim): rotate the first n_rot dims of each
     * head by pos[i]·theta^(-2j/n_rot); neox=0 pairs (2j, 2j+1), neox=1 pairs
     * (j, j+n_rot/2) */
    void (*rope)(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim,
                 int n_rot, float theta, int neox);
    /* g(n, dim) = silu(g) * u */
    void (*silu_mul)(li_backend *be, float *g, const float *u, int64_t n, int64_t dim);
    /* y += x, (n) elements */
    void (*add)(li_backend *be, float *y, const float *x, int64_t n);
    /* write k, v (n_tokens, n_head_kv, head_dim) into slots slot[i] = block*block_size + offset */
    void (*kv_store)(li_backend *be, const li_kv_layer *kv, const float *k, const float *v,
                     const int64_t *slot, int64_t n_tokens, int n_head_kv, int head_dim);
    /* causal paged attention, see li_attn_args */
    void (*attention)(li_backend *be, const li_attn_args *a);
    /* repack a weight for this backend (optional; may be NULL) */
    int (*weight_prepare)(li_backend *be, li_weight *w);
    void (*weight_release)(li_backend *be, li_weight *w);
} li_backend_ops;

struct li_backend {
    const li_backend_ops *ops;
    int n_threads;
    void *impl;   /* backend private state (thread pool, device handles) */
};

/* CPU backend: n_threads <= 0 means the cores available. isa: NULL or "auto"
 * picks the best the CPU has (CPUID); "scalar", "avx2", "avx512" force one
 * (an unavailable one is an error); "ggml" computes what llama.cpp's x86 CPU
 * backend computes, bit for bit (cpu/ggml_kernels.h). */
int li_backend_cpu_init(li_backend *be, int n_threads, const char *isa, struct li_error *err);
void li_backend_cpu_free(li_backend *be);
/* The scalar reference ops, single-threaded: what every other path is
 * tested against. */
const li_backend_ops *li_backend_ref_ops(void);
/* Name of the ISA level chosen at init ("scalar", "avx2", "avx512", "ggml"). */
const char *li_backend_cpu_isa(const li_backend *be);

#endif
