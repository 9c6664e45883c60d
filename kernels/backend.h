/* backend.h — the compute backend vtable.
 *
 * The engine calls ops only through this table, so a CUDA backend slots in
 * without touching the engine. Every op has a scalar reference
 * (kernels/cpu/ops_ref.c); SIMD and device versions are checked against it.
 * Every pointer an op receives (activations, KV, block tables, batch
 * arrays) lies in memory the backend handed out through its buffer
 * interface below: host memory for the CPU backend, device memory for
 * device backends. Shapes are written beside each argument, row-major,
 * innermost last. */
#ifndef LI_BACKEND_H
#define LI_BACKEND_H

#include "types.h"

typedef struct li_backend li_backend;
struct li_error; /* util/common.h */

/* Bumped whenever li_backend_ops changes shape: a backend built for another
 * version is refused (li_backend_check, run by every li_buffer_alloc). */
#define LI_BACKEND_API_VERSION 6
#define LI_TOPK_MAX 64 /* the most values a backend's topk returns a row */

/* A block of backend memory. `data` is the backend's address of byte 0:
 * what ops receive (a device pointer on a device backend). Only where
 * `host` is true may the caller read and write it directly; otherwise it
 * moves bytes with buffer_set / buffer_get. */
typedef struct li_buffer {
    void *data;
    size_t size;    /* bytes */
    bool host;      /* data is ordinary host memory */
    bool wrapped;   /* wraps memory the backend does not own (buffer_free leaves it) */
    bool mapped;    /* host memory from mmap (freed with munmap) */
} li_buffer;

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
/* The same with the caller's scratch (k floats; a permuted scheme weight
 * decodes its codes there first), for loops over every row of a training
 * step (core/train/scales.c) that should not allocate per row. */
void li_weight_dequant_row(const li_weight *w, int64_t row, float *out, float *scratch);
/* The inverse on w's own grid: row `row` of x (k values, input-column
 * order) rounded to the nearest codes of w's type under that row's scales,
 * zero points and permutation, written in w's storage layout to codes
 * (row_bytes), and their values to out (k, input order; NULL: not wanted).
 * scratch: k floats of the caller's (a training step rounds every row).
 * What quantization-aware training of a scheme file rounds through: the
 * grid stays the file's, so requantizing a dequantized row gives its codes
 * back. -1 (nothing written) for a plain weight or a code type without a
 * quantizer. */
int li_weight_requant_row_ref(const li_weight *w, int64_t row, const float *x, void *codes, float *out,
                              float *scratch);

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
    const int32_t *seq;    /* (n_tokens) which sequence: row of block_table */
    /* (n_seqs, bt_stride) flat: row s = sequence s's block ids, position p
     * in block row[p / block_size]; rows may be padded past their end */
    const int32_t *block_table;
    int64_t bt_stride;
    const li_kv_layer *kv;
    float scale;           /* usually 1/sqrt(head_dim) */
} li_attn_args;

/* Token i's row of the flat block table. */
static inline const int32_t *li_attn_blocks(const li_attn_args *a, int64_t i) {
    return a->block_table + (size_t)a->seq[i] * (size_t)a->bt_stride;
}

typedef struct li_backend_ops {
    int api_version;       /* LI_BACKEND_API_VERSION */
    const char *name;

    /* ---- memory ----
     * buffer_alloc: `size` bytes (0 allowed), aligned to at least
     * `alignment`, zero-filled; LI_ENOMEM on failure. buffer_wrap (optional,
     * host backends): a buffer over existing host memory, e.g. mmap'd weights.
     * Copies take byte offsets. set, copy and clear may run asynchronously
     * on a device backend (ops issued later see their results), get returns
     * with the bytes in dst, and synchronize waits for everything issued. */
    size_t alignment;
    int (*buffer_alloc)(li_backend *be, size_t size, li_buffer *out, struct li_error *err);
    void (*buffer_free)(li_backend *be, li_buffer *b);
    int (*buffer_wrap)(li_backend *be, void *host, size_t size, li_buffer *out, struct li_error *err);
    /* host -> backend: b[off, off+n) = src[0, n) */
    void (*buffer_set)(li_backend *be, li_buffer *b, size_t off, const void *src, size_t n);
    /* backend -> host: dst[0, n) = b[off, off+n) */
    void (*buffer_get)(li_backend *be, const li_buffer *b, size_t off, void *dst, size_t n);
    /* inside the backend: n_runs runs of `n` bytes, dst[dst_off[i]..] = src[src_off[i]..]
     * (a KV block for copy-on-write: a run per layer for K and for V, one
     * copy; its scales another); runs must not overlap */
    void (*buffer_copy)(li_backend *be, li_buffer *dst, const li_buffer *src, const size_t *dst_off,
                        const size_t *src_off, int n_runs, size_t n);
    /* b[0, size) = value */
    void (*buffer_clear)(li_backend *be, li_buffer *b, uint8_t value);
    void (*synchronize)(li_backend *be);

    /* ---- ops ---- */
    /* true when a position's results depend on the batch around it (the
     * "ggml" backend, like llama.cpp, sums attention differently for 1 and
     * 2+ tokens): speculative verification is then not exact and is refused */
    bool batch_variant;
/* what a refusal on a batch-variant backend tells the user to do */
#define LI_BATCH_INVARIANT_HINT "use another --isa, or LUAINFER_CUDA_INVARIANT=1 on cuda"
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
    /* optional (NULL: rope on q, then on k): both in one call, the same bits
     * as the two; q (n, n_heads, head_dim), k (n, n_heads_kv, head_dim) */
    void (*rope_qk)(li_backend *be, float *q, float *k, const int32_t *pos, int64_t n, int n_heads, int n_heads_kv,
                    int head_dim, int n_rot, float theta, int neox);
    /* optional (NULL: the forward issues rmsnorm, matmul_multi and, with
     * swiglu, silu_mul): h = rmsnorm(x) over the n_w weights' k with norm
     * weights nw (host memory, as rmsnorm's), then y[i] = h · W[i]^T
     * (matmul_multi's rule); with swiglu (n_w == 2, one m) then y[0] =
     * silu(y[0]) * y[1]. Afterwards h, and y[1] under swiglu, hold no
     * defined values: a backend may fuse the norm into the products and
     * write neither (the CUDA GEMV does, a decode step's launches 10 -> 7 a
     * layer). Results within matmul's bounds of the three ops apart. */
    void (*norm_matmul)(li_backend *be, const float *x, const float *nw, float eps, float *h,
                        const li_weight *const *w, int n_w, float *const *y, int64_t n, bool swiglu);
    /* optional (NULL: rope_qk, or rope twice, then kv_store): q and k roped
     * as rope_qk ropes them, then k (roped) and v stored as kv_store
     * stores them; the same bits as those ops (one launch on a device) */
    void (*rope_store)(li_backend *be, float *q, float *k, const float *v, const int32_t *pos, int64_t n,
                       int n_heads, int n_heads_kv, int head_dim, int n_rot, float theta, int neox,
                       const li_kv_layer *kv, const int64_t *slot);
    /* g(n, dim) = silu(g) * u */
    void (*silu_mul)(li_backend *be, float *g, const float *u, int64_t n, int64_t dim);
    /* y += x, (n) elements */
    void (*add)(li_backend *be, float *y, const float *x, int64_t n);
    /* optional (NULL: the backend cannot run rotated models): in place on
     * each row of x(n, dim), x <- (x * s) blockdiag(H_b, ..., H_b) / sqrt(b)
     * with s(dim) the signs, H_b Sylvester's Hadamard matrix of order
     * b = block (a power of two dividing dim): a fast Walsh-Hadamard
     * transform per block. Rows are independent (batch-invariant); an
     * orthogonal map, so applying it twice with s = 1 gives x back. The
     * online Hadamard before down_proj of a rotated model (model.h) */
    void (*hadamard)(li_backend *be, float *x, const float *s, int64_t n, int64_t dim, int64_t block);
    /* write k, v (n_tokens, n_head_kv, head_dim) into slots slot[i] = block*block_size + offset;
     * a backend with graph ops skips rows with slot[i] < 0 (the rows that
     * pad a recorded pass's batch to its size) */
    void (*kv_store)(li_backend *be, const li_kv_layer *kv, const float *k, const float *v,
                     const int64_t *slot, int64_t n_tokens, int n_head_kv, int head_dim);
    /* causal paged attention, see li_attn_args */
    void (*attention)(li_backend *be, const li_attn_args *a);
    /* optional (NULL: the host reads the logits): out(n) = the lowest index
     * of each row of x(n, dim)'s largest value, a NaN never winning (and
     * row index 0 when no value is a number): sampler.h's greedy rule, for
     * sampling where the logits live */
    void (*argmax)(li_backend *be, const float *x, int64_t n, int64_t dim, int32_t *out);
    /* optional (NULL: the host reads the logits): each row of x(n, dim)'s
     * k largest values (k <= LI_TOPK_MAX, k <= dim), sorted by value
     * descending then id ascending (-0 counts as +0), into vals(n, k) and
     * ids(n, k); a row holding a NaN gets ids[0] = -1. What the sampler
     * draws from without the logits (sampler.h li_sampler_sample_cand) */
    void (*topk)(li_backend *be, const float *x, int64_t n, int64_t dim, int k, float *vals, int32_t *ids);
    /* optional (with topk: a step asking logprobs then reads the logits):
     * out(n) = each row's mx + (float)log(sum_j exp(((double)x_j - mx) *
     * s)), mx the row's largest, s = scale[i] (backend memory, (n)) or 1
     * when scale is NULL (sampler.h li_sampler_lse_scaled; the sum's order
     * is the backend's own). At s = 1/T: the mass at temperature T */
    void (*lse)(li_backend *be, const float *x, int64_t n, int64_t dim, const float *scale, float *out);
    /* optional (with topk: a row whose sampler edits logits, by bias, a ban
     * or penalties, then reads its logits): out[i] = x[idx[i]] for i < n,
     * idx flat indices into x, all three backend memory. The raw logits
     * of the edited ids (sampler.h li_sampler_edit_ids) */
    void (*gather)(li_backend *be, const float *x, const int64_t *idx, int64_t n, float *out);
    /* the backend takes a weight into its memory (optional; NULL: it reads
     * the host rows as they are): the CPU backends repack into panels or
     * keep the mmap'd rows (host memory they may wrap, buffer_wrap); a
     * device backend would upload it. weight_release gives it back. */
    int (*weight_prepare)(li_backend *be, li_weight *w);
    void (*weight_release)(li_backend *be, li_weight *w);
    /* builds now what w's next matmul would otherwise build on first use
     * (optional: the CPU backend's 4-bit panels for its current mode), so
     * no request pays for it */
    void (*weight_warm)(li_backend *be, const li_weight *w);

    /* ---- recorded passes (optional, all or none; NULL: every pass issues
     * its ops) ----
     * Where issuing an op costs more than a small batch's work (a kernel
     * launch), the forward records a pass once and replays it
     * (forward.c, "recorded passes"). graph_begin: the ops issued next are
     * recorded, not run; nonzero when recording cannot start.
     * graph_end: stops, returns the recording, or NULL when it failed (the
     * ops did not run: the caller issues them again). A recording keeps
     * every argument as it was, pointers and sizes included: the caller
     * replays it only for the same shapes and buffers, after uploading
     * new contents into the same device memory. graph_valid: false once
     * the backend has moved memory a recording reads (its own scratch
     * grew). */
    int (*graph_begin)(li_backend *be);
    void *(*graph_end)(li_backend *be);
    void (*graph_launch)(li_backend *be, void *g);
    bool (*graph_valid)(li_backend *be, const void *g);
    void (*graph_free)(li_backend *be, void *g);
} li_backend_ops;

struct li_backend {
    const li_backend_ops *ops;
    int n_threads;
    void *impl;   /* backend private state (thread pool, device handles) */
};

/* ---- memory helpers: the ops above, with the checks every caller needs ---- */

/* 0, or LI_EUNSUP naming the backend when its ops table is of another API
 * version or lacks a buffer op. */
int li_backend_check(const li_backend *be, struct li_error *err);
int li_buffer_alloc(li_backend *be, size_t size, li_buffer *out, struct li_error *err);
/* Frees b (if any) and zeroes it; a zeroed buffer is a valid no-op. */
void li_buffer_free(li_backend *be, li_buffer *b);
/* The byte offset of p in b (p must lie in b). */
static inline size_t li_buffer_offset(const li_buffer *b, const void *p) {
    return (size_t)((const char *)p - (const char *)b->data);
}

/* Host-memory buffers (aligned allocation, memcpy): what the CPU, ggml and
 * reference backends use (kernels/cpu/cpu_buffer.c). */
int li_host_buffer_alloc(li_backend *be, size_t size, li_buffer *out, struct li_error *err);
void li_host_buffer_free(li_backend *be, li_buffer *b);
int li_host_buffer_wrap(li_backend *be, void *host, size_t size, li_buffer *out, struct li_error *err);
void li_host_buffer_set(li_backend *be, li_buffer *b, size_t off, const void *src, size_t n);
void li_host_buffer_get(li_backend *be, const li_buffer *b, size_t off, void *dst, size_t n);
void li_host_buffer_copy(li_backend *be, li_buffer *dst, const li_buffer *src, const size_t *dst_off,
                         const size_t *src_off, int n_runs, size_t n);
void li_host_buffer_clear(li_backend *be, li_buffer *b, uint8_t value);
void li_host_synchronize(li_backend *be);
#define LI_HOST_BUFFER_ALIGN 64
#define LI_HOST_BUFFER_MAP_MIN ((size_t)1 << 20) /* host buffers this large are mmap'd (zero pages, touched lazily) */
/* The memory entries of an ops table initializer for host backends. */
#define LI_HOST_BUFFER_OPS                                                                                  \
    .api_version = LI_BACKEND_API_VERSION, .alignment = LI_HOST_BUFFER_ALIGN,                              \
    .buffer_alloc = li_host_buffer_alloc, .buffer_free = li_host_buffer_free,                             \
    .buffer_wrap = li_host_buffer_wrap, .buffer_set = li_host_buffer_set, .buffer_get = li_host_buffer_get, \
    .buffer_copy = li_host_buffer_copy, .buffer_clear = li_host_buffer_clear, .synchronize = li_host_synchronize

/* CPU backend: n_threads <= 0 means the cores available. isa: NULL or "auto"
 * picks the best the CPU has (CPUID); "scalar", "avx2", "avx512", "amx"
 * (AVX-512 with the quantized matmul on AMX tiles, the same bits) force one
 * (an unavailable one is an error); "ggml" computes what llama.cpp's x86 CPU
 * backend computes, bit for bit (cpu/ggml_kernels.h). */
int li_backend_cpu_init(li_backend *be, int n_threads, const char *isa, struct li_error *err);
void li_backend_cpu_free(li_backend *be);
/* The scalar reference ops, single-threaded: what every other path is
 * tested against. */
const li_backend_ops *li_backend_ref_ops(void);
/* Name of the ISA level chosen at init ("scalar", "avx2", "avx512", "amx", "ggml"). */
const char *li_backend_cpu_isa(const li_backend *be);
/* How the CPU backend runs 4-bit group weights (AWQ, GPTQ, INT4 with f32
 * activations): LI_ACT_F32 (A16, the default: exactly the weights'
 * semantics, the reference's bits) or LI_ACT_INT8 (A8: activations
 * quantized to int8 per row on the fly, integer dot products; defined in
 * kernels/cpu/q4g_kernels.h). LI_EINVAL for another kind, LI_EUNSUP on the
 * ggml backend. Takes effect from the next matmul. */
int li_backend_cpu_set_q4_act(li_backend *be, li_act_quant act, struct li_error *err);

#endif
