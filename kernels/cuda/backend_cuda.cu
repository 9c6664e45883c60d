// backend_cuda.cu — the CUDA backend: the ops of kernels/backend.h on one
// device and one stream (docs/cuda.md).
//
// Written to be obviously correct first: every op is a straightforward
// kernel with the semantics of the scalar reference (kernels/cpu/ops_ref.c),
// its per-element math shared with the host through cuda/cuda_math.h (and
// tested there on every build, tests/unit/test_cuda_math.c); the device
// results are checked op by op by tests/unit/test_cuda_ops.c.
//
//   memory     cudaMalloc'd buffers (host = false); set / copy / clear are
//              asynchronous on the backend's stream, get waits for its bytes
//   weights    weight_prepare uploads the rows as they are (GGUF blocks or a
//              scheme's codes) plus scales / zero points / permutation;
//              types without a kernel are refused there (LI_EUNSUP)
//   matmul     n <= 8: a dequantizing GEMV (a warp per output row, the
//              weight row read once for up to 8 activation rows, f32 sums);
//              n > 8: q4_0 / q4_1 / q8_0 on the int8 tensor cores straight
//              from their blocks (k_mmq, the activations as q8 codes);
//              W8A8, FP8, BF16, F16 and the other weights (dequantized to
//              f16) through cuBLASLt; else an f32 copy and cuBLAS SGEMM
//              (plain FP32, no TF32). Scheme activations (int8, fp8, int4
//              per row) are quantized first as the reference does.
//   attention  one thread block per (token, head), online softmax over the
//              token's positions through the flat block table; F32, F16,
//              BF16 and 8-bit (FP8 / INT8 with per-(token, head) scales) KV
//
//   graphs     graph_begin / graph_end capture the ops issued between them
//              on the stream (cudaStreamBeginCapture) into an instantiated
//              graph, replayed by graph_launch (the forward's recorded
//              passes); anything that would synchronize while capturing
//              (a scratch buffer growing, a host norm weight changed) ends
//              the capture first, and graph_end then reports the failure
//   profile    LUAINFER_CUDA_PROFILE=1 or li_backend_cuda_profile: CUDA
//              events around each launch, behind a short spin kernel so the
//              GPU is busy while the host issues it (the events then time
//              the kernel, not the host's gap); printed per kernel
//
// Errors: a CUDA failure inside an op (which returns void) prints the call
// and the CUDA error, then aborts -- a device fault leaves nothing to
// continue with. Everything an op cannot do is refused earlier, at init or
// weight_prepare. Index arithmetic that can pass 2^31 is int64_t.
#define _Noreturn [[noreturn]]      // types.h is C11; nvcc compiles C++
#define _Static_assert static_assert
extern "C" {
#include "util/common.h"
#include "backend.h"
#include "cuda/cuda_backend.h"
}
#include "cuda/cuda_math.h"
#include "cuda/attn_tile.h"
#include "cuda/topk_row.h"
#include "cuda/dl_syms.h"
#include "cuda/lt_gemm.h"

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// ------------------------------------------------------------------------
// state and error handling
// ------------------------------------------------------------------------

enum { GEMV_NB = 8, GEMV_WARPS = 4, ATTN_WARPS = 4, ATTN_MAXD = 256, ROW_THREADS = 256 };
// attention split by positions: chunks of ATTN_CHUNK, for batches of up to ATTN_SPLIT_TOKENS tokens
enum { ATTN_CHUNK = 64, ATTN_SPLIT_TOKENS = 64 };

// A prepared weight: its bytes in device memory (w->packed points here).
struct cu_weight {
    uint8_t *data;          // (m, row_bytes)
    float *scales, *zeros;  // (m, ng) or NULL
    int32_t *perm;          // (k) or NULL
    uint16_t *f16;          // (m, k) the values in f16 for the tensor cores, kept while the budget allows, or NULL
};

// A host array of floats an op received (the model's norm weights live in
// host memory, model.c bind_norm) and its device copy; the host values are
// kept so a changed or reused address is noticed (and re-uploaded).
struct cu_hostcopy {
    const float *host;
    float *keep;  // (n) the values uploaded
    float *dev;   // (n)
    int64_t n;
};

// the kernels the profile tells apart
enum {
    PK_ACT_QUANT, PK_ACT_Q8, PK_GEMV, PK_GEMV_MULTI, PK_DEQUANT, PK_SGEMM, PK_LT_CODES, PK_LT_GEMM, PK_LT_EPI,
    PK_ACT_Q8C, PK_MMQ, PK_GEMV_NORM, PK_ROPE_STORE, PK_ADD, PK_GET_ROWS, PK_RMSNORM, PK_ROPE, PK_SILU_MUL,
    PK_HADAMARD, PK_KV_STORE, PK_ATTENTION, PK_ARGMAX, PK_TOPK, PK_SET, PK_GET, PK_COPY, PK_N
};
static const char *const pk_name[PK_N] = {
    "act_quant", "act_q8", "gemv", "gemv_multi", "dequant", "sgemm", "lt_codes", "lt_gemm", "lt_epilogue",
    "act_q8c", "mmq", "gemv_norm", "rope_store", "add", "get_rows", "rmsnorm", "rope", "silu_mul", "hadamard",
    "kv_store", "attention", "argmax", "topk",
    "buffer_set", "buffer_get", "buffer_copy"};

struct cu_prof_pending {
    cudaEvent_t a, b;
    int k;
};

struct cu_profile {
    bool on;
    long calls[PK_N];
    double gpu_ms[PK_N], host_ms[PK_N];
    cu_prof_pending *pend;
    int n_pend, cap_pend;
    cudaEvent_t *pool; // events free for reuse
    int n_pool, cap_pool;
    bool print_at_free;
};

struct li_cuda {
    int device;
    cudaStream_t st;
    cublasHandle_t blas;
    void *blas_ws;  // cuBLAS's workspace: set once, so a captured SGEMM allocates nothing
    float *wbuf;  // dequantized weight for the cuBLAS path
    size_t wcap;  // floats
    float *xbuf;  // quantized activations of a scheme weight
    size_t xcap;
    // tensor-core GEMMs (lt_gemm.h): the handle (NULL: cuBLASLt did not open),
    // kinds that failed once (then their weights take the SGEMM path), and
    // the activations' codes (n, k) with their row scales, and D (n, m)
    li_lt *lt;
    // the weights' f16 copies kept for the tensor cores (cu_weight.f16):
    // bytes allowed (LUAINFER_CUDA_F16_CACHE_MB, default a quarter of the
    // device's free memory at init) and used
    size_t f16_budget, f16_used;
    bool lt_off[LI_LT_N];
    char lt_why[200];
    float *lt_codes, *lt_rows, *lt_d, *lt_w16; // bytes in float units; lt_w16: a weight dequantized to f16
    size_t lt_codes_cap, lt_rows_cap, lt_d_cap, lt_w16_cap;
    cu_hostcopy *copies;
    int n_copies, cap_copies;
    // graphs: gen counts the times scratch moved (a recording of an older
    // gen reads freed memory); capturing: a stream capture under way
    uint64_t gen;
    bool capturing;
    cu_profile prof;
    // batch-invariant (LUAINFER_CUDA_INVARIANT=1): every matmul is the GEMV,
    // any row count in chunks of GEMV_NB, so a row's bits never depend on
    // the rows beside it and speculation's verification is exact
    bool invariant;
    // fusions (LUAINFER_CUDA_FUSE=0: none): norm_matmul's norm inside the
    // GEMV, or into k_mmq's codes; silu_mul leaving k_mmq's codes of g
    // (mmq_src); rope_store in one launch; and, for the f16 copies, the q8
    // blocks of an op's output written beside it by rmsnorm, silu_mul and
    // attention (q8_src), so the next matmul over that output skips its
    // k_act_q8. Notes are valid for the next op only (q8_forget).
    bool fuse;
    // attention split by positions (LUAINFER_CUDA_ATTN_SPLIT=0: one block per (token, head))
    bool attn_split;
    // prefills' attention in tiles of tokens sharing keys through shared
    // memory (attn_tile.h; LUAINFER_CUDA_ATTN_TILE=0: one block per (token, head))
    bool attn_tile;
    float *attn_part; // (rows, chunks, head_dim + 2) the chunks' max, sum, accumulator
    size_t attn_part_cap;
    float *attn_ticket; // (rows) unsigned: chunks of the row done, 0 between launches
    size_t attn_ticket_cap;
    const float *q8_src;
    int64_t q8_rows, q8_k;
    // the GGUF block types above GEMV_NB rows on the int8 tensor cores
    // (k_mmq; LUAINFER_CUDA_MMQ=0: the f16 copy through cuBLASLt), their
    // input's q8 codes (n, k) and each block's (d, d * sum) (n, k / 32),
    // made once for the weights of one op that read the same x (mmq_src)
    bool mmq;
    float *mmq_x, *mmq_s; // bytes in float units
    size_t mmq_x_cap, mmq_s_cap;
    const float *mmq_src;
    int64_t mmq_rows, mmq_k;
    // programmatic dependent launch (launch, pdl_enter)
    bool pdl;
};

static inline void q8_forget(li_cuda *c) { c->q8_src = nullptr, c->mmq_src = nullptr; }

// ---- launches: programmatic dependent launch (sm_90) ----
//
// With pdl on (LUAINFER_CUDA_PDL=1, li_backend_cuda_set_pdl), every kernel
// is launched allowed to start before the kernel ahead of it on the stream
// has finished: its thread blocks are placed, and wait at their first
// statement (griddepcontrol.wait: until the grid ahead has completed and
// its writes are visible), so the launch's latency hides behind the
// previous kernel's tail. Each kernel lets the next one launch as soon as
// it has passed its own wait. A kernel that reads or writes before
// pdl_enter anything a kernel may write would race: every kernel here calls
// it first, but for the GEMVs' prefetch of their weight rows (prefetch_row:
// weights never change during a pass). Without pdl the wait returns at
// once. In a recorded pass the launches become programmatic edges.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kern<<<grid, block, smem, c->st>>>(args...), with pdl when it is on
template <typename... K, typename... A>
static void launch(li_cuda *c, dim3 grid, dim3 block, size_t smem, void (*kern)(K...), A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kern, static_cast<A &&>(args)...); // a failure is the last error: CK_LAUNCH
}

// whether an op's output of n rows is worth its q8 blocks beside it: only
// the f16 copies read them (k_mmq and the GEMV round their input themselves)
static inline bool fuse_rows(const li_cuda *c, int64_t n) {
    return c->fuse && n > GEMV_NB && !c->invariant && !c->mmq;
}

struct cu_graph {
    cudaGraphExec_t exec;
    uint64_t gen;
};

[[noreturn]] static void cu_die(const char *what, const char *why, const char *file, int line) {
    fprintf(stderr, "luainfer: cuda: %s failed: %s (%s:%d)\n", what, why, file, line);
    abort();
}

/* ---- cuBLAS, opened when a CUDA backend starts ----
 * Linked, libcublas and libcublasLt (~0.7 GB) would load into every
 * luainfer process and add ~0.3 s to each start (CLI commands, policy hosts),
 * GPU or not; so they are dlopen'ed by the first li_backend_cuda_init. The
 * v2 API's names are macros for the *_v2 symbols. */
static struct {
    bool tried, ok;
    char why[160];
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(&cublasGetStatusString) status_string;
    decltype(&cublasSetWorkspace_v2) set_workspace;
} blas;

static bool blas_open(void) {
    if (blas.tried) return blas.ok;
    blas.tried = true;
    char name[32];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    const li_dl_sym syms[] = {
        LI_DL_SYM(blas.create, "cublasCreate_v2"),         LI_DL_SYM(blas.destroy, "cublasDestroy_v2"),
        LI_DL_SYM(blas.set_stream, "cublasSetStream_v2"),  LI_DL_SYM(blas.set_math_mode, "cublasSetMathMode"),
        LI_DL_SYM(blas.sgemm, "cublasSgemm_v2"),           LI_DL_SYM(blas.status_string, "cublasGetStatusString"),
        LI_DL_SYM(blas.set_workspace, "cublasSetWorkspace_v2"),
    };
    blas.ok = li_dl_open_syms(name, syms, sizeof syms / sizeof *syms, blas.why, sizeof blas.why);
    return blas.ok;
}

#define CK(call)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) cu_die(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define CK_LAUNCH(name) CK(cudaPeekAtLastError())
#define CK_BLAS(call)                                                                \
    do {                                                                             \
        cublasStatus_t s_ = (call);                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) cu_die(#call, blas.status_string(s_), __FILE__, __LINE__); \
    } while (0)

// Every op starts here: the calling thread's current device becomes the
// backend's (tensor-parallel ranks each drive their own from their own
// thread; a launch must go to the current device's stream).
static li_cuda *cu(li_backend *be) {
    li_cuda *c = (li_cuda *)be->impl;
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != c->device) CK(cudaSetDevice(c->device));
    return c;
}

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535LL * 32) b = 65535LL * 32; // grid-stride loops cover the rest
    return (unsigned)(b > 0 ? b : 1);
}

// Ends a capture under way so the caller may synchronize or allocate: the
// ops captured so far are dropped (graph_end then returns NULL and the
// forward issues the whole pass again).
static void capture_break(li_cuda *c) {
    if (!c->capturing) return;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(c->st, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    c->capturing = false;
}

// *p holds at least n floats (contents dropped); waits for the stream
// before freeing what kernels may still read. Moving it makes every
// recording stale (gen).
static float *reserve(li_cuda *c, float **p, size_t *cap, size_t n) {
    if (n <= *cap) return *p;
    const size_t want = n > 2 * *cap ? n : 2 * *cap;
    capture_break(c);
    CK(cudaStreamSynchronize(c->st));
    if (*p) CK(cudaFree(*p));
    CK(cudaMalloc((void **)p, want * sizeof(float)));
    *cap = want;
    c->gen++;
    return *p;
}

// ---- the profile ----

// spins one thread for `ns` nanoseconds of the GPU's global timer
__global__ void k_spin(uint64_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static cudaEvent_t prof_event(cu_profile *p) {
    if (p->n_pool) return p->pool[--p->n_pool];
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    return e;
}

// adds the finished pairs' times (the stream has been synchronized)
static void prof_drain(li_cuda *c) {
    cu_profile *p = &c->prof;
    for (int i = 0; i < p->n_pend; i++) {
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, p->pend[i].a, p->pend[i].b));
        p->gpu_ms[p->pend[i].k] += ms;
        if (p->n_pool + 2 > p->cap_pool) {
            p->cap_pool = p->cap_pool ? 2 * p->cap_pool : 256;
            p->pool = (cudaEvent_t *)li_xrealloc(p->pool, (size_t)p->cap_pool * sizeof *p->pool);
        }
        p->pool[p->n_pool++] = p->pend[i].a;
        p->pool[p->n_pool++] = p->pend[i].b;
    }
    p->n_pend = 0;
}

struct prof_mark {
    cudaEvent_t a;
    double t0;
};

// 20 us of spin keeps the GPU busy while the host issues the launch
static prof_mark prof_begin(li_cuda *c) {
    cu_profile *p = &c->prof;
    if (p->n_pend >= 4096) {
        CK(cudaStreamSynchronize(c->st));
        prof_drain(c);
    }
    k_spin<<<1, 1, 0, c->st>>>(20000);
    prof_mark m;
    m.a = prof_event(p);
    CK(cudaEventRecord(m.a, c->st));
    m.t0 = li_time_now();
    return m;
}

static void prof_end(li_cuda *c, int k, const prof_mark &m) {
    cu_profile *p = &c->prof;
    cudaEvent_t b = prof_event(p);
    CK(cudaEventRecord(b, c->st));
    p->host_ms[k] += (li_time_now() - m.t0) * 1e3;
    p->calls[k]++;
    if (p->n_pend == p->cap_pend) {
        p->cap_pend = p->cap_pend ? 2 * p->cap_pend : 256;
        p->pend = (cu_prof_pending *)li_xrealloc(p->pend, (size_t)p->cap_pend * sizeof *p->pend);
    }
    p->pend[p->n_pend++] = {m.a, b, k};
}

// the statements (a launch and its check), timed as kernel k when profiling
#define PROF(c, k, ...)                                                                                          \
    do {                                                                                                         \
        if (!(c)->prof.on) {                                                                                     \
            __VA_ARGS__;                                                                                         \
        } else {                                                                                                 \
            const prof_mark pm_ = prof_begin(c);                                                                 \
            __VA_ARGS__;                                                                                         \
            prof_end(c, k, pm_);                                                                                 \
        }                                                                                                        \
    } while (0)

// ------------------------------------------------------------------------
// memory
// ------------------------------------------------------------------------

static int cu_buffer_alloc(li_backend *be, size_t size, li_buffer *out, li_error *err) {
    memset(out, 0, sizeof *out);
    void *p = nullptr;
    if (size) {
        cudaError_t e = cudaMalloc(&p, size);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return li_error_set(err, LI_ENOMEM, "cuda: cudaMalloc of %zu bytes: %s", size, cudaGetErrorString(e));
        }
        CK(cudaMemsetAsync(p, 0, size, cu(be)->st));
    }
    out->data = p;
    out->size = size;
    out->host = false;
    return 0;
}

static void cu_buffer_free(li_backend *be, li_buffer *b) {
    if (b->data && !b->wrapped) {
        CK(cudaStreamSynchronize(cu(be)->st)); // kernels may still read it
        CK(cudaFree(b->data));
    }
}

static void cu_synchronize(li_backend *be) {
    li_cuda *c = cu(be);
    capture_break(c);
    CK(cudaStreamSynchronize(c->st));
    if (c->prof.n_pend) prof_drain(c);
}

static void cu_buffer_set(li_backend *be, li_buffer *b, size_t off, const void *src, size_t n) {
    // from pageable memory the call returns once src is staged: the caller may reuse it
    li_cuda *c = cu(be);
    q8_forget(c);
    capture_break(c); // a host source cannot be captured
    if (n) PROF(c, PK_SET, CK(cudaMemcpyAsync((char *)b->data + off, src, n, cudaMemcpyHostToDevice, c->st)));
}

static void cu_buffer_get(li_backend *be, const li_buffer *b, size_t off, void *dst, size_t n) {
    if (!n) return;
    li_cuda *c = cu(be);
    q8_forget(c);
    capture_break(c);
    PROF(c, PK_GET, CK(cudaMemcpyAsync(dst, (const char *)b->data + off, n, cudaMemcpyDeviceToHost, c->st)));
    cu_synchronize(be);
}

static void cu_buffer_copy(li_backend *be, li_buffer *dst, const li_buffer *src, const size_t *dst_off,
                           const size_t *src_off, int n_runs, size_t n) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (!n) return;
    for (int i = 0; i < n_runs; i++)
        PROF(c, PK_COPY,
             CK(cudaMemcpyAsync((char *)dst->data + dst_off[i], (const char *)src->data + src_off[i], n,
                                cudaMemcpyDeviceToDevice, c->st)));
}

static void cu_buffer_clear(li_backend *be, li_buffer *b, uint8_t value) {
    q8_forget(cu(be));
    if (b->size) CK(cudaMemsetAsync(b->data, value, b->size, cu(be)->st));
}

// A float array an op received: device memory as it is, host memory
// through its device copy (uploaded once, checked against the kept values).
// The copies are looked up first: the model's norm weights are all host
// arrays, and a pointer query per op costs the host more than the kernel.
static const float *dev_floats(li_cuda *c, const float *p, int64_t n) {
    const size_t bytes = (size_t)n * sizeof(float);
    for (int i = 0; i < c->n_copies; i++) {
        cu_hostcopy *h = &c->copies[i];
        if (h->host != p || h->n != n) continue;
        if (!memcmp(h->keep, p, bytes)) return h->dev;
        capture_break(c);
        CK(cudaStreamSynchronize(c->st)); // kernels may still read the old values
        memcpy(h->keep, p, bytes);
        CK(cudaMemcpyAsync(h->dev, h->keep, bytes, cudaMemcpyHostToDevice, c->st));
        return h->dev;
    }
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) == cudaSuccess &&
        (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged))
        return p;
    cudaGetLastError(); // an unregistered host pointer is not an error to keep
    capture_break(c);   // an upload follows
    if (c->n_copies == c->cap_copies) {
        c->cap_copies = c->cap_copies ? 2 * c->cap_copies : 64;
        c->copies = (cu_hostcopy *)li_xrealloc(c->copies, (size_t)c->cap_copies * sizeof *c->copies);
    }
    cu_hostcopy *h = &c->copies[c->n_copies++];
    h->host = p;
    h->n = n;
    h->keep = (float *)li_xmalloc(bytes ? bytes : 1);
    memcpy(h->keep, p, bytes);
    CK(cudaMalloc((void **)&h->dev, bytes ? bytes : 4));
    CK(cudaMemcpyAsync(h->dev, h->keep, bytes, cudaMemcpyHostToDevice, c->st));
    return h->dev;
}

// ------------------------------------------------------------------------
// weights
// ------------------------------------------------------------------------

// What a kernel needs of a prepared weight, by value.
struct cu_wview {
    const uint8_t *data;
    size_t row_bytes;
    int64_t k, m;
    const float *scales, *zeros; // (m, ng), NULL for plain weights / no zero points
    const int32_t *perm;         // (k) or NULL
    int64_t ng, gs;
    float zero;                  // the scheme's implicit zero point
};

static cu_wview wview(const li_weight *w) {
    const cu_weight *p = (const cu_weight *)w->packed;
    if (!p) {
        fprintf(stderr, "luainfer: cuda: weight %s used before weight_prepare uploaded it\n",
                w->name ? w->name : "(unnamed)");
        abort();
    }
    cu_wview v;
    v.data = p->data;
    v.row_bytes = w->row_bytes;
    v.k = w->k;
    v.m = w->m;
    v.scales = w->scheme == LI_SCHEME_PLAIN ? nullptr : p->scales;
    v.zeros = p->zeros;
    v.perm = p->perm;
    v.ng = li_weight_n_groups(w);
    v.gs = w->group_size > 0 ? w->group_size : w->k;
    const li_scheme_traits *s = li_scheme_info(w->scheme);
    v.zero = s ? s->zero : 0.0f;
    return v;
}

static int cu_weight_prepare(li_backend *be, li_weight *w) {
    if (!li_cu_type_ok(w->type)) {
        fprintf(stderr, "luainfer: cuda: no kernel for %s weights (%s)\n", li_type_name(w->type),
                w->name ? w->name : "a weight");
        return LI_EUNSUP;
    }
    if (w->scheme != LI_SCHEME_PLAIN && !w->scales) {
        fprintf(stderr, "luainfer: cuda: scheme %s weight without scales\n", li_scheme_name(w->scheme));
        return LI_EINVAL;
    }
    if (w->scheme == LI_SCHEME_PLAIN && li_type_info(w->type)->scaled) {
        fprintf(stderr, "luainfer: cuda: %s codes need a scheme's scales\n", li_type_name(w->type));
        return LI_EUNSUP;
    }
    li_cuda *c = cu(be);
    cu_weight *p = (cu_weight *)li_xcalloc(1, sizeof *p);
    const size_t bytes = (size_t)w->m * w->row_bytes;
    const size_t ng = (size_t)li_weight_n_groups(w);
    cudaError_t e = cudaMalloc((void **)&p->data, bytes ? bytes : 1);
    if (e == cudaSuccess && w->scheme != LI_SCHEME_PLAIN) {
        e = cudaMalloc((void **)&p->scales, (size_t)w->m * ng * sizeof(float));
        if (e == cudaSuccess && w->zeros) e = cudaMalloc((void **)&p->zeros, (size_t)w->m * ng * sizeof(float));
        if (e == cudaSuccess && w->perm) e = cudaMalloc((void **)&p->perm, (size_t)w->k * sizeof(int32_t));
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "luainfer: cuda: cudaMalloc for a %lld x %lld weight: %s\n", (long long)w->m,
                (long long)w->k, cudaGetErrorString(e));
        cudaFree(p->data);
        cudaFree(p->scales);
        cudaFree(p->zeros);
        cudaFree(p->perm);
        free(p);
        return LI_ENOMEM;
    }
    // synchronous copies: the sources are the caller's (mmap'd rows, scale arrays)
    CK(cudaMemcpy(p->data, w->data, bytes, cudaMemcpyHostToDevice));
    if (p->scales) CK(cudaMemcpy(p->scales, w->scales, (size_t)w->m * ng * sizeof(float), cudaMemcpyHostToDevice));
    if (p->zeros) CK(cudaMemcpy(p->zeros, w->zeros, (size_t)w->m * ng * sizeof(float), cudaMemcpyHostToDevice));
    if (p->perm) CK(cudaMemcpy(p->perm, w->perm, (size_t)w->k * sizeof(int32_t), cudaMemcpyHostToDevice));
    (void)c;
    w->packed = p;
    return 0;
}

static void cu_weight_release(li_backend *be, li_weight *w) {
    cu_weight *p = (cu_weight *)w->packed;
    if (!p) return;
    li_cuda *c = cu(be);
    CK(cudaStreamSynchronize(c->st));
    if (p->f16) {
        cudaFree(p->f16);
        c->f16_used -= (size_t)w->m * (size_t)w->k * 2;
    }
    cudaFree(p->data);
    cudaFree(p->scales);
    cudaFree(p->zeros);
    cudaFree(p->perm);
    free(p);
    w->packed = nullptr;
}

// ------------------------------------------------------------------------
// weight kernels: dequantize, GEMV, activation quantization
// ------------------------------------------------------------------------

// Stored element j of row r, with the scheme's scales and zero points.
template <int T> __device__ __forceinline__ float wval(const cu_wview &w, const uint8_t *row, int64_t r, int64_t j) {
    float c = li_cu_elem(T, row, j);
    if (w.scales)
        c = li_cu_scheme_value(c, w.scales + r * w.ng, w.zeros ? w.zeros + r * w.ng : nullptr, w.zero, j, w.gs);
    return c;
}

__device__ __forceinline__ void put_elem(float *o, int64_t i, float v) { o[i] = v; }
__device__ __forceinline__ void put_elem(uint16_t *o, int64_t i, float v) { o[i] = li_cu_f32_to_fp16(v); }

// out(n, k) = rows ids[i] (or i when ids is NULL) of W as f32 (or f16,
// rounded to nearest even: the tensor cores' operand), in input-column order
template <int T, typename O> __global__ void k_dequant(cu_wview w, const int32_t *ids, int64_t n, O *out) {
    pdl_enter();
    const int64_t total = n * w.k;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / w.k, j = idx % w.k;
        const int64_t r = ids ? (int64_t)ids[i] : i;
        const float v = wval<T>(w, w.data + r * w.row_bytes, r, j);
        put_elem(out, i * w.k + (w.perm ? (int64_t)w.perm[j] : j), v);
    }
}

// The warp's sums of a row (each lane's share in acc) reduced and stored
// (with res, res += y too: the same float k_add would add)
__device__ __forceinline__ void gemv_store(const float *acc, int nb, int lane, float *y, float *res, int64_t b0,
                                           int64_t m, int64_t r) {
#pragma unroll
    for (int b = 0; b < GEMV_NB; b++) {
        float s = acc[b];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0 && b < nb) {
            y[(b0 + b) * m + r] = s;
            if (res) res[(b0 + b) * m + r] += s;
        }
    }
}

// A weight row's sums for the activation rows xb[0, nb) of a chunk (see
// gemv_any), element by element: one warp, lanes stride along k, one weight
// element read for all the chunk's rows, through the permutation when
// there is one (act-order); f32 sums, reduced across the warp by gemv_store.
template <int T>
__device__ __forceinline__ void gemv_elem(const cu_wview &w, int64_t r, const float *xb, int nb, int lane, float *acc) {
    const uint8_t *row = w.data + r * w.row_bytes;
    for (int64_t j = lane; j < w.k; j += 32) {
        const float v = wval<T>(w, row, r, j);
        const int64_t xj = w.perm ? (int64_t)w.perm[j] : j;
#pragma unroll
        for (int b = 0; b < GEMV_NB; b++)
            if (b < nb) acc[b] += v * xb[b * w.k + xj];
    }
}

// The same for the GGUF block types (q4_0, q4_1, q8_0; plain, so no scales
// or permutation), by cuda_math.h's lane functions (four lanes a 32-element
// block, eight blocks a warp at a time, so a row of k = 576 takes 3 trips,
// not 18: a decode step's GEMVs are bound by the latency of those trips).
// x comes as it is, or normalized on the way (nw: each row's inv[b] and the
// norm's weights); each block is rounded to the CPU's q8 block here, its
// largest |v| shared by the block's four lanes. With w2 (swiglu: the up
// row beside the gate row), acc2 gets that row's sums. Every lane runs
// every trip (a block past the row reads the last one, its sums dropped),
// so the shuffles see the whole warp. test_cuda_math re-enacts this walk.
static_assert((int)GEMV_NB == (int)LI_CU_GEMV_NB, "the block GEMV's rows a pass");
template <int T>
__device__ __forceinline__ void gemv_blk(const uint8_t *row, const uint8_t *row2, int64_t k, const float *xb, int nb,
                                         const float *nw, const float *inv, int lane, float *acc, float *acc2) {
    const int sub = lane & 3;
    const int64_t nblk = k / 32, trips = (nblk + 7) / 8;
#pragma unroll 2
    for (int64_t it = 0; it < trips; it++) {
        const int64_t blk = it * 8 + (lane >> 2);
        const bool in = blk < nblk;
        const int64_t bq = in ? blk : nblk - 1;
        int64_t o0, o1;
        li_cu_gemv_offs(T, bq, sub, &o0, &o1);
        float wv[8], wv2[8];
        li_cu_gemv_wv(T, row, bq, sub, wv);
        if (row2) li_cu_gemv_wv(T, row2, bq, sub, wv2);
#pragma unroll
        for (int b = 0; b < GEMV_NB; b++)
            if (b < nb) { // the same for the whole warp
                float xv[8];
                float amax = li_cu_gemv_xv(xb + b * k, o0, o1, nw, nw ? inv[b] : 1.0f, xv);
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                li_cu_gemv_round(xv, amax);
                if (in) {
                    acc[b] += li_cu_gemv_dot8(wv, xv);
                    if (row2) acc2[b] += li_cu_gemv_dot8(wv2, xv);
                }
            }
    }
}

// Row r of y(n, m) = x(n, k) . W^T for the activation rows [b0, b0 + 8) of
// the chunk, by one warp; with res, res += y too (the residual add: the same
// float added as k_add adds it). The GGUF block types by blocks (gemv_blk),
// the others 8 consecutive elements a lane (cuda_math.h li_cu_gemv8_lane,
// which test_cuda_math runs on the host), element by element under a
// permutation (gemv_elem).
template <int T>
__device__ __forceinline__ void gemv_any(const cu_wview &w, int64_t r, const float *x, float *y, float *res,
                                         int64_t n, int64_t b0, int lane) {
    const int nb = (int)(n - b0 < GEMV_NB ? n - b0 : GEMV_NB);
    const float *xb = x + b0 * w.k;
    float acc[GEMV_NB];
#pragma unroll
    for (int b = 0; b < GEMV_NB; b++) acc[b] = 0.0f;
    if constexpr (T == LI_TYPE_Q4_0 || T == LI_TYPE_Q4_1 || T == LI_TYPE_Q8_0)
        gemv_blk<T>(w.data + r * w.row_bytes, nullptr, w.k, xb, nb, nullptr, nullptr, lane, acc, nullptr);
    else if (!w.perm)
        li_cu_gemv8_lane(T, w.data + r * w.row_bytes, w.k, w.scales ? w.scales + r * w.ng : nullptr,
                         w.zeros ? w.zeros + r * w.ng : nullptr, w.zero, w.gs, xb, nb, lane, acc);
    else
        gemv_elem<T>(w, r, xb, nb, lane, acc);
    gemv_store(acc, nb, lane, y, res, b0, w.m, r);
}

// A warp's weight row into L2 before pdl_enter: the weights never change
// while a pass runs, so under programmatic dependent launch the row's read
// overlaps the kernel ahead (a decode step's GEMVs wait on such trips)
__device__ __forceinline__ void prefetch_row(const cu_wview &w, int64_t r, int lane) {
    if (r >= w.m) return;
    const uint8_t *row = w.data + r * w.row_bytes;
    for (int64_t o = (int64_t)lane * 128; o < w.row_bytes; o += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + o));
}

// y(n, m) = x(n, k) . W^T (and res += y): a warp per output row, a chunk of
// GEMV_NB activation rows per blockIdx.y
template <int T> __global__ void k_gemv(cu_wview w, const float *x, float *y, float *res, int64_t n) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    prefetch_row(w, r, lane);
    pdl_enter();
    if (r >= w.m) return;
    gemv_any<T>(w, r, x, y, res, n, (int64_t)blockIdx.y * GEMV_NB, lane);
}

// up to four weights of one type reading the same x (q/k/v, gate/up) in one
// launch: their rows laid end to end, a warp per row of whichever it is
enum { MULTI_MAX = 4 };
struct cu_multi {
    cu_wview w[MULTI_MAX];
    float *y[MULTI_MAX];
    int64_t end[MULTI_MAX]; // rows of weights 0..i, summed
    int n_w;
};

// the weight of mw that row r (rows end to end) falls in, r made its own
// row there; mw.n_w when past the last
__device__ __forceinline__ int multi_row(const cu_multi &mw, int64_t *r) {
    int i = 0;
    while (i < mw.n_w && *r >= mw.end[i]) i++;
    if (i && i < mw.n_w) *r -= mw.end[i - 1];
    return i;
}

template <int T> __global__ void k_gemv_multi(cu_multi mw, const float *x, int64_t n) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    const int i = multi_row(mw, &r);
    if (i < mw.n_w) prefetch_row(mw.w[i], r, lane);
    pdl_enter();
    if (i == mw.n_w) return;
    gemv_any<T>(mw.w[i], r, x, mw.y[i], nullptr, n, (int64_t)blockIdx.y * GEMV_NB, lane);
}

// rms_scale's 1 / rms of xr by one warp, in rms_scale's order to the bit:
// lane l plays its threads l + 32 v (v < ROW_THREADS / 32), each summing
// its squares in double, then the same tree (the strides of 128, 64, 32
// inside the lane, 16 to 1 across lanes); every lane gets lane 0's
__device__ __forceinline__ float rms_scale_warp(const float *xr, int64_t dim, float eps, int lane) {
    enum { V = ROW_THREADS / 32 };
    double p[V];
#pragma unroll
    for (int v = 0; v < V; v++) {
        p[v] = 0.0;
        for (int64_t j = lane + 32 * v; j < dim; j += ROW_THREADS) {
            const float sq = xr[j] * xr[j];
            p[v] += (double)sq;
        }
    }
#pragma unroll
    for (int s = V / 2; s > 0; s >>= 1)
#pragma unroll
        for (int v = 0; v < s; v++) p[v] += p[v + s];
    double t = p[0];
    for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
    t = __shfl_sync(0xffffffffu, t, 0);
    return 1.0f / sqrtf((float)(t / (double)dim) + eps);
}

// rmsnorm inside the GEMV (norm_matmul; GGUF block types): y_i = rmsnorm(x)
// . W_i^T for the weights of mw, a warp per output row end to end as in
// k_gemv_multi; with swiglu (two weights of one m) a warp per row j of
// both, y_0[j] = silu(gate) * up. Each warp first takes its activation
// rows' 1 / rms (rms_scale_warp: k_rmsnorm's bits), then normalizes and
// rounds x block by block on the way: the same values, products and sums
// as rmsnorm, the GEMVs and silu_mul apart (test_cuda_ops' unfused model
// compares them bit for bit).
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_norm(cu_multi mw, const float *x, const float *nw, float eps, int64_t n, int swiglu) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    const int i = !swiglu ? multi_row(mw, &r) : r < mw.w[0].m ? 0 : mw.n_w;
    if (i < mw.n_w) {
        prefetch_row(mw.w[i], r, lane);
        if (swiglu) prefetch_row(mw.w[1], r, lane);
    }
    pdl_enter();
    if (i == mw.n_w) return;
    const cu_wview w = i == 0 ? mw.w[0] : i == 1 ? mw.w[1] : i == 2 ? mw.w[2] : mw.w[3];
    float *const yi = i == 0 ? mw.y[0] : i == 1 ? mw.y[1] : i == 2 ? mw.y[2] : mw.y[3];
    const int64_t k = w.k, b0 = (int64_t)blockIdx.y * GEMV_NB;
    const int nb = (int)(n - b0 < GEMV_NB ? n - b0 : GEMV_NB);
    const float *xb = x + b0 * k;
    float inv[GEMV_NB], acc[GEMV_NB], acc2[GEMV_NB];
#pragma unroll
    for (int b = 0; b < GEMV_NB; b++) {
        acc[b] = acc2[b] = inv[b] = 0.0f;
        if (b < nb) inv[b] = rms_scale_warp(xb + b * k, k, eps, lane);
    }
    gemv_blk<T>(w.data + r * w.row_bytes, swiglu ? mw.w[1].data + r * mw.w[1].row_bytes : nullptr, k, xb, nb, nw,
                inv, lane, acc, acc2);
#pragma unroll
    for (int b = 0; b < GEMV_NB; b++) {
        float s = acc[b], s2 = acc2[b];
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_down_sync(0xffffffffu, s, o);
            s2 += __shfl_down_sync(0xffffffffu, s2, o);
        }
        if (lane == 0 && b < nb) yi[(b0 + b) * w.m + r] = swiglu ? li_cu_silu_mul(s, s2) : s;
    }
}

// out(n, k) = x as the activation quantization leaves it (li_act_quant_row_ref):
// the largest |x| of a row of k (fmaxf: NaNs skipped), the block's tree
__device__ float row_amax(const float *xr, int64_t k) {
    __shared__ float red[ROW_THREADS];
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) amax = fmaxf(amax, fabsf(xr[j]));
    red[threadIdx.x] = amax;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    return red[0];
}

// a block per row, amax by fmaxf (NaNs skipped), then every element
__global__ void k_act_quant(int act, const float *x, float *out, int64_t k) {
    pdl_enter();
    const float *xr = x + (int64_t)blockIdx.x * k;
    float *o = out + (int64_t)blockIdx.x * k;
    const float sc = row_amax(xr, k) / li_cu_act_divisor(act);
    const float inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) o[j] = li_cu_act_value(act, xr[j], sc, inv);
}

// x as the CPU's integer dot reads it (li_quantize_row_q8_0_ref, _q8_1_ref):
// per block of 32, d = amax / 127 stored as fp16, q = round(x / d), so
// out = q * fp16(d). One warp a block. The weights whose CPU dot takes q8
// activations (types.c's vec_dot_type: q4_0, q4_1, q8_0) then compute the
// same model on both backends: with float activations, 1.4e-5 of NMSE a
// matmul added up over 30 layers to 5.7e-3 on the logits (H100, session 27).
// v, one lane's element of a 32-element block the warp holds, as that q8
// block stores it (every lane of the warp must call it)
__device__ __forceinline__ float q8_round_warp(float v) {
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    return li_cu_q8_value(v, amax);
}

__global__ void k_act_q8(const float *x, float *out, int64_t n_blocks) {
    pdl_enter();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= n_blocks) return; // a whole warp: its lanes share the block
    const int lane = threadIdx.x & 31;
    out[b * 32 + lane] = q8_round_warp(x[b * 32 + lane]);
}

// ---- the GGUF block types above GEMV_NB rows: k_mmq (cuda_math.h) ----

// x(n, k) as k_mmq's B: per 32-element block (a warp, as k_act_q8) the q8
// codes into xq and (d, d * sum(codes)) into xds
// v, one lane's element of block b (32 elements, the whole warp's), into
// k_mmq's input: the code at xq[b * 32 + lane], (d, d * sum) at xds[b]
__device__ __forceinline__ void q8c_warp(float v, int8_t *xq, float2 *xds, int64_t b, int lane) {
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int q = li_cu_q8_code(v, amax);
    int sum = q;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    xq[b * 32 + lane] = (int8_t)q;
    if (lane == 0) {
        const float dh = li_cu_q8_dh(amax);
        xds[b] = make_float2(dh, dh * (float)sum);
    }
}

__global__ void k_act_q8c(const float *x, int8_t *xq, float2 *xds, int64_t n_blocks) {
    pdl_enter();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= n_blocks) return; // a whole warp
    const int lane = threadIdx.x & 31;
    q8c_warp(x[b * 32 + lane], xq, xds, b, lane);
}

// c += A(16 x 32, s8, row) . B(32 x 8, s8, col) in int32: the fragment
// layouts cuda_math.h describes above li_cu_mmq_word (sm_80 and later)
__device__ __forceinline__ void mma_s8(int32_t *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// y(n, m) = x(n, k) . W^T (res += y) for q4_0 / q4_1 / q8_0 blocks. A
// thread block takes 16 weight rows (blockIdx.x) and MMQ_N activation rows
// (blockIdx.y); its MMQ_WARPS warps split k by 32-element blocks (a decode
// step's matmuls are small: k = 576 is 18 blocks, so a warp takes 2 or 3
// and the step waits on few trips). A warp reads its 16 rows' words and
// scales of a block once, runs one mma for each 8 activation rows, and adds
// the int32 sums, scaled, into f32 sums; the warps' sums are then added in
// shared memory, in warp order. Weight rows past m read row m - 1 and
// activation rows past n row n - 1; neither is stored. Up to MULTI_MAX
// weights of one type and k reading the same input (q/k/v, gate/up) go in
// one launch, their 16-row tiles end to end (tile_end: the tiles of weights
// 0..i); res with one weight only.
enum { MMQ_WARPS = 8, MMQ_N = 64, MMQ_T = MMQ_N / 8 };
struct cu_mmq_set {
    cu_wview w[MULTI_MAX];
    float *y[MULTI_MAX];
    int64_t tile_end[MULTI_MAX];
    int n_w;
};

template <int T>
__global__ void __launch_bounds__(MMQ_WARPS * 32)
    k_mmq(cu_mmq_set set, const int8_t *xq, const float2 *xds, float *res, int64_t n) {
    pdl_enter();
    __shared__ float red[MMQ_WARPS][MMQ_T * 4][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, s = lane & 3;
    int iw = 0; // the weight this block's tile is of
    while (iw < set.n_w - 1 && (int64_t)blockIdx.x >= set.tile_end[iw]) iw++;
    const cu_wview w = iw == 0 ? set.w[0] : iw == 1 ? set.w[1] : iw == 2 ? set.w[2] : set.w[3];
    float *const y = iw == 0 ? set.y[0] : iw == 1 ? set.y[1] : iw == 2 ? set.y[2] : set.y[3];
    const int64_t r0 = ((int64_t)blockIdx.x - (iw ? set.tile_end[iw - 1] : 0)) * 16;
    const int64_t b0 = (int64_t)blockIdx.y * MMQ_N, nblk = w.k / 32, rem = n - b0;
    const int tiles = rem >= MMQ_N ? MMQ_T : (int)((rem + 7) / 8);
    const int bb = li_cu_blk_bytes(T);
    const uint8_t *wa = w.data + (r0 + g < w.m ? r0 + g : w.m - 1) * w.row_bytes;
    const uint8_t *wb = w.data + (r0 + g + 8 < w.m ? r0 + g + 8 : w.m - 1) * w.row_bytes;
    float acc[MMQ_T][4];
#pragma unroll
    for (int t = 0; t < MMQ_T; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int64_t blk = warp; blk < nblk; blk += MMQ_WARPS) {
        const uint8_t *pa = wa + blk * bb, *pb = wb + blk * bb;
        const uint32_t a0 = li_cu_mmq_word(T, pa, s, 0), a1 = li_cu_mmq_word(T, pb, s, 0);
        const uint32_t a2 = li_cu_mmq_word(T, pa, s, 1), a3 = li_cu_mmq_word(T, pb, s, 1);
        float da, ma, db, mb;
        li_cu_mmq_scale(T, pa, &da, &ma);
        li_cu_mmq_scale(T, pb, &db, &mb);
#pragma unroll
        for (int t = 0; t < MMQ_T; t++) {
            if (t >= tiles) break; // the same for the whole warp
            const int64_t cb = b0 + 8 * t, c0 = cb + 2 * s;
            const int8_t *xb = xq + (cb + g < n ? cb + g : n - 1) * w.k + blk * 32;
            int32_t c[4] = {0, 0, 0, 0};
            mma_s8(c, a0, a1, a2, a3, *(const uint32_t *)(xb + 4 * s), *(const uint32_t *)(xb + 16 + 4 * s));
            const float2 x0 = xds[(c0 < n ? c0 : n - 1) * nblk + blk];
            const float2 x1 = xds[(c0 + 1 < n ? c0 + 1 : n - 1) * nblk + blk];
            acc[t][0] += li_cu_mmq_term(da, ma, x0.x, x0.y, c[0]);
            acc[t][1] += li_cu_mmq_term(da, ma, x1.x, x1.y, c[1]);
            acc[t][2] += li_cu_mmq_term(db, mb, x0.x, x0.y, c[2]);
            acc[t][3] += li_cu_mmq_term(db, mb, x1.x, x1.y, c[3]);
        }
    }
#pragma unroll
    for (int t = 0; t < MMQ_T; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][t * 4 + i][lane] = acc[t][i];
    __syncthreads();
    // thread v adds up value (t * 4 + i, lane) of the warps: C's element i
    // of tile t in that lane
    for (int v = threadIdx.x; v < MMQ_T * 4 * 32; v += MMQ_WARPS * 32) {
        const int ti = v / 32, l = v % 32, t = ti / 4, i = ti % 4;
        const int64_t row = r0 + (l >> 2) + 8 * (i >> 1), col = b0 + 8 * t + 2 * (l & 3) + (i & 1);
        if (row >= w.m || col >= n) continue;
        float sum = 0.0f;
        for (int wi = 0; wi < MMQ_WARPS; wi++) sum += red[wi][ti][l];
        y[col * w.m + row] = sum;
        if (res) res[col * w.m + row] += sum;
    }
}

// a switch over the weight types with a kernel (li_cu_type_ok), launching KERNEL<T>
#define CU_TYPE_SWITCH(type, LAUNCH)                                          \
    switch (type) {                                                           \
    case LI_TYPE_F32: LAUNCH(LI_TYPE_F32); break;                             \
    case LI_TYPE_F16: LAUNCH(LI_TYPE_F16); break;                             \
    case LI_TYPE_BF16: LAUNCH(LI_TYPE_BF16); break;                           \
    case LI_TYPE_Q8_0: LAUNCH(LI_TYPE_Q8_0); break;                           \
    case LI_TYPE_Q4_0: LAUNCH(LI_TYPE_Q4_0); break;                           \
    case LI_TYPE_Q4_1: LAUNCH(LI_TYPE_Q4_1); break;                           \
    case LI_KV_TYPE_INT8: LAUNCH(LI_KV_TYPE_INT8); break;                     \
    case LI_KV_TYPE_FP8_E4M3: LAUNCH(LI_KV_TYPE_FP8_E4M3); break;             \
    case LI_TYPE_U4: LAUNCH(LI_TYPE_U4); break;                               \
    default: li_type_unreachable("cuda: weight kernel", (uint32_t)(type));    \
    }

__global__ void k_add(float *y, const float *x, int64_t n) {
    pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

// How w's kernels read their input: 0 as it is, 1 + act for a scheme's
// per-row quantization, ACT_Q8 for the CPU's q8 blocks (q4_0, q4_1, q8_0:
// the weights whose CPU dot takes q8 activations)
enum { ACT_Q8 = 1000 };
static int act_kind(const li_weight *w) {
    if (w->scheme != LI_SCHEME_PLAIN && w->act != LI_ACT_F32) return 1 + (int)w->act;
    if (w->scheme == LI_SCHEME_PLAIN && w->k % 32 == 0) {
        const li_type at = li_type_vec_dot_type(w->type);
        if (at == LI_TYPE_Q8_0 || at == LI_TYPE_Q8_1) return ACT_Q8;
    }
    return 0;
}

// x(n, k) as w's kernels read it (act_kind): quantized into xbuf, or x
static const float *act_for(li_cuda *c, const li_weight *w, const float *x, int64_t n) {
    const int kind = act_kind(w);
    const bool made = c->q8_src == x && c->q8_rows >= n && c->q8_k == w->k;
    q8_forget(c);
    if (!kind) return x;
    if (kind == ACT_Q8 && made) return c->xbuf; // the producer wrote them
    float *xq = reserve(c, &c->xbuf, &c->xcap, (size_t)n * (size_t)w->k);
    if (kind == ACT_Q8) {
        const int64_t nb = n * w->k / 32;
        PROF(c, PK_ACT_Q8, launch(c, (unsigned)((nb + 7) / 8), 256, 0, k_act_q8, x, xq, nb); CK_LAUNCH("act_q8"));
    } else {
        PROF(c, PK_ACT_QUANT,
             launch(c, (unsigned)n, ROW_THREADS, 0, k_act_quant, (int)w->act, x, xq, w->k);
             CK_LAUNCH("act_quant"));
    }
    return xq;
}

// y = xa . W^T (xa already as act_for leaves it), and res += y when res
static void matmul_one(li_cuda *c, const li_weight *w, const float *xa, float *y, float *res, int64_t n) {
    const cu_wview v = wview(w);
    if (n <= GEMV_NB || c->invariant) {
        const dim3 grid((unsigned)((w->m + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)((n + GEMV_NB - 1) / GEMV_NB));
#define L_GEMV(T) launch(c, grid, GEMV_WARPS * 32, 0, k_gemv<T>, v, xa, y, res, n)
        PROF(c, PK_GEMV, CU_TYPE_SWITCH(w->type, L_GEMV); CK_LAUNCH("gemv"));
#undef L_GEMV
        return;
    }
    // n > 8: the whole weight dequantized to f32, then one SGEMM. Column-major
    // view: y^T(m, n) = W'(k, m)^T . x^T(k, n), W' the row-major (m, k) copy.
    float *wf = reserve(c, &c->wbuf, &c->wcap, (size_t)w->m * (size_t)w->k);
#define L_DEQ(T) launch(c, blocks_for(w->m * w->k, 256), 256, 0, k_dequant<T, float>, v, nullptr, w->m, wf)
    PROF(c, PK_DEQUANT, CU_TYPE_SWITCH(w->type, L_DEQ); CK_LAUNCH("dequant"));
#undef L_DEQ
    const float one = 1.0f, zero = 0.0f;
    PROF(c, PK_SGEMM,
         CK_BLAS(blas.sgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->m, (int)n, (int)w->k, &one, wf, (int)w->k,
                            xa, (int)w->k, &zero, y, (int)w->m)));
    if (res) {
        const int64_t t = n * w->m;
        PROF(c, PK_ADD, launch(c, blocks_for(t, 256), 256, 0, k_add, res, y, t); CK_LAUNCH("add"));
    }
}

// ---- tensor-core GEMMs above GEMV_NB rows (lt_gemm.h) ----

// The activation rows as the tensor cores take them: W8A8 / FP8, each row's
// codes and scale exactly as the CPU's w8 kernels quantize it (w8.c:
// s = amax / 127 or 448, the int8 code rounded to even and clamped, the
// e4m3 code of x / s); bf16 / f16, each element rounded to nearest even.
__global__ void k_lt_codes(int kind, const float *x, void *codes, float *rs, int64_t k) {
    pdl_enter();
    const float *xr = x + (int64_t)blockIdx.x * k;
    if (kind == LI_LT_BF16 || kind == LI_LT_F16) {
        uint16_t *o = (uint16_t *)codes + (int64_t)blockIdx.x * k;
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
            o[j] = kind == LI_LT_BF16 ? li_cu_f32_to_bf16(xr[j]) : li_cu_f32_to_fp16(xr[j]);
        return;
    }
    const float sc = row_amax(xr, k) / (kind == LI_LT_INT8 ? 127.0f : 448.0f);
    const float inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    uint8_t *o = (uint8_t *)codes + (int64_t)blockIdx.x * k;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
        o[j] = kind == LI_LT_INT8 ? (uint8_t)(int8_t)li_cu_code_round(xr[j] * inv, -127.0f, 127.0f)
                                  : li_cu_f32_to_fp8(xr[j] * inv);
    if (threadIdx.x == 0) rs[blockIdx.x] = sc;
}

// y(n, m) from D: W8A8 (float)sum * (s_row * s_col), the CPU's expression
// (w8.c gemm_int8_scalar), so the same bits; FP8 the same with the f32 sums;
// bf16 / f16 D as it is. res += y when res.
__global__ void k_lt_epilogue(int kind, const void *d, const float *rs, const float *ws, float *y, float *res,
                              int64_t n, int64_t m) {
    pdl_enter();
    const int64_t total = n * m;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / m, col = i % m;
        float v;
        if (kind == LI_LT_INT8) v = (float)((const int32_t *)d)[i] * (rs[r] * ws[col]);
        else if (kind == LI_LT_FP8) v = ((const float *)d)[i] * (rs[r] * ws[col]);
        else v = ((const float *)d)[i];
        y[i] = v;
        if (res) res[i] += v;
    }
}

// the tensor-core kind w takes above GEMV_NB rows, or -1 (the SGEMM path);
// *deq: the weight is dequantized to f16 first (the GGUF block types and
// the 4-bit schemes: their values in f16, their inputs as act_for leaves
// them, in f16), as vLLM's GGUF path dequantizes above its batch threshold
static int lt_kind(const li_cuda *c, const li_weight *w, bool *deq) {
    *deq = false;
    if (!c->lt) return -1;
    const bool per_channel = li_weight_n_groups(w) == 1 && !w->zeros && !w->perm && w->k <= 65536;
    int kind = -1;
    if (w->scheme == LI_SCHEME_W8A8 && w->type == LI_KV_TYPE_INT8 && w->act == LI_ACT_INT8 && per_channel)
        kind = LI_LT_INT8;
    else if (w->scheme == LI_SCHEME_FP8 && w->type == LI_KV_TYPE_FP8_E4M3 && w->act == LI_ACT_FP8 && per_channel)
        kind = LI_LT_FP8;
    else if (w->scheme == LI_SCHEME_PLAIN && w->type == LI_TYPE_BF16) kind = LI_LT_BF16;
    else if (w->scheme == LI_SCHEME_PLAIN && w->type == LI_TYPE_F16) kind = LI_LT_F16;
    else if (w->type != LI_TYPE_F32 && !(w->scheme == LI_SCHEME_W8A8 || w->scheme == LI_SCHEME_FP8)) {
        kind = LI_LT_F16;
        *deq = true;
    }
    if (kind < 0 || c->lt_off[kind] || !li_lt_shape_ok((li_lt_kind)kind, w->m, w->k)) return -1;
    return kind;
}

// y = x . W^T (res += y) on the tensor cores; false (nothing issued but
// what ran before a failure, whose outputs the caller rewrites) when w
// cannot go this way, or its kind just failed (said once, then off)
static bool lt_matmul(li_cuda *c, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    bool deq;
    const int kind = lt_kind(c, w, &deq);
    if (kind < 0 || n <= GEMV_NB || c->invariant) return false;
    const int64_t k = w->k, m = w->m;
    const size_t cb = kind == LI_LT_INT8 || kind == LI_LT_FP8 ? 1 : 2;
    const void *a = ((const cu_weight *)w->packed)->data;
    if (deq) { // the weight in f16 (kept, or made now), the input as its own kernels read it
        cu_weight *p = (cu_weight *)w->packed;
        const size_t hb = (size_t)m * (size_t)k * 2;
        bool fresh = false;
        if (!p->f16 && !c->capturing && c->f16_used + hb <= c->f16_budget) {
            if (cudaMalloc((void **)&p->f16, hb) == cudaSuccess) c->f16_used += hb, fresh = true;
            else cudaGetLastError(), p->f16 = nullptr;
        }
        uint16_t *wh = p->f16 ? p->f16 : (uint16_t *)reserve(c, &c->lt_w16, &c->lt_w16_cap, (hb + 3) / 4);
        if (!p->f16 || fresh) {
            const cu_wview v = wview(w);
#define L_DEQH(T) launch(c, blocks_for(m * k, 256), 256, 0, k_dequant<T, uint16_t>, v, nullptr, m, wh)
            PROF(c, PK_DEQUANT, CU_TYPE_SWITCH(w->type, L_DEQH); CK_LAUNCH("dequant f16"));
#undef L_DEQH
        }
        x = act_for(c, w, x, n);
        a = wh;
    }
    float *codes = reserve(c, &c->lt_codes, &c->lt_codes_cap, ((size_t)n * (size_t)k * cb + 3) / 4);
    float *rs = reserve(c, &c->lt_rows, &c->lt_rows_cap, (size_t)n);
    float *d = reserve(c, &c->lt_d, &c->lt_d_cap, (size_t)n * (size_t)m);
    PROF(c, PK_LT_CODES,
         launch(c, (unsigned)n, ROW_THREADS, 0, k_lt_codes, kind, x, codes, rs, k); CK_LAUNCH("lt_codes"));
    char why[160];
    int rc = 0;
    PROF(c, PK_LT_GEMM,
         rc = li_lt_matmul(c->lt, c->st, (li_lt_kind)kind, m, n, k, a, codes, d, c->blas_ws,
                           c->blas_ws ? (size_t)32 << 20 : 0, why, sizeof why));
    if (rc) {
        c->lt_off[kind] = true;
        snprintf(c->lt_why, sizeof c->lt_why, "%s", why);
        fprintf(stderr, "luainfer: cuda: %s; those weights take the SGEMM path\n", why);
        return false;
    }
    const float *wsc = kind == LI_LT_INT8 || kind == LI_LT_FP8 ? ((const cu_weight *)w->packed)->scales : nullptr;
    PROF(c, PK_LT_EPI,
         launch(c, blocks_for(n * m, 256), 256, 0, k_lt_epilogue, kind, d, rs, wsc, y, res, n, m);
         CK_LAUNCH("lt_epilogue"));
    return true;
}

// whether k_mmq takes w at n rows: the GGUF block types above GEMV_NB rows
static bool mmq_ok(const li_cuda *c, const li_weight *w, int64_t n) {
    return c->mmq && n > GEMV_NB && !c->invariant && w->scheme == LI_SCHEME_PLAIN && w->k % 32 == 0 &&
           (w->type == LI_TYPE_Q4_0 || w->type == LI_TYPE_Q4_1 || w->type == LI_TYPE_Q8_0);
}

// k_mmq's input buffers for n rows of k: the codes (n, k) and (d, d * sum) (n, k / 32)
static void mmq_buffers(li_cuda *c, int64_t n, int64_t k, int8_t **xq, float2 **xds) {
    const int64_t nb = n * k / 32;
    *xq = (int8_t *)reserve(c, &c->mmq_x, &c->mmq_x_cap, (size_t)nb * 8);
    *xds = (float2 *)reserve(c, &c->mmq_s, &c->mmq_s_cap, (size_t)nb * 2);
}

// x's codes for k_mmq: made by k_act_q8c unless the op before left them
// (mmq_src: a producer's note, or a weight before in this op)
static void mmq_codes(li_cuda *c, const float *x, int64_t n, int64_t k, int8_t **xq, float2 **xds) {
    mmq_buffers(c, n, k, xq, xds);
    if (c->mmq_src == x && c->mmq_rows == n && c->mmq_k == k) return;
    const int64_t nb = n * k / 32;
    PROF(c, PK_ACT_Q8C, launch(c, (unsigned)((nb + 7) / 8), 256, 0, k_act_q8c, x, *xq, *xds, nb);
         CK_LAUNCH("act_q8c"));
    c->mmq_src = x, c->mmq_rows = n, c->mmq_k = k;
}

// y_i = codes . W_i^T for n_w (<= MULTI_MAX) weights of one type and k in
// one k_mmq launch (res += y_0 too, with one weight)
static void mmq_launch(li_cuda *c, const li_weight *const *w, int n_w, const int8_t *xq, const float2 *xds,
                       float *const *y, float *res, int64_t n) {
    cu_mmq_set set;
    memset(&set, 0, sizeof set);
    set.n_w = n_w;
    int64_t tiles = 0;
    for (int i = 0; i < n_w; i++) {
        set.w[i] = wview(w[i]);
        set.y[i] = y[i];
        tiles += (w[i]->m + 15) / 16;
        set.tile_end[i] = tiles;
    }
    const dim3 grid((unsigned)tiles, (unsigned)((n + MMQ_N - 1) / MMQ_N));
#define L_MMQ(T) launch(c, grid, MMQ_WARPS * 32, 0, k_mmq<T>, set, xq, xds, n_w == 1 ? res : nullptr, n)
    switch (w[0]->type) {
    case LI_TYPE_Q4_0: PROF(c, PK_MMQ, L_MMQ(LI_TYPE_Q4_0); CK_LAUNCH("mmq")); break;
    case LI_TYPE_Q4_1: PROF(c, PK_MMQ, L_MMQ(LI_TYPE_Q4_1); CK_LAUNCH("mmq")); break;
    default: PROF(c, PK_MMQ, L_MMQ(LI_TYPE_Q8_0); CK_LAUNCH("mmq")); break;
    }
#undef L_MMQ
}

// whether k_mmq takes all n_w weights in one launch: one type and k, each its own
static bool mmq_all(const li_cuda *c, const li_weight *const *w, int n_w, int64_t n) {
    if (n_w < 1 || n_w > MULTI_MAX) return false;
    for (int i = 0; i < n_w; i++)
        if (!mmq_ok(c, w[i], n) || w[i]->type != w[0]->type || w[i]->k != w[0]->k) return false;
    return true;
}

// y = x . W^T (res += y) by k_mmq; false when w does not go this way
static bool mmq_matmul(li_cuda *c, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (!mmq_ok(c, w, n)) return false;
    int8_t *xq;
    float2 *xds;
    mmq_codes(c, x, n, w->k, &xq, &xds);
    mmq_launch(c, &w, 1, xq, xds, &y, res, n);
    return true;
}

// x as the GEMV over w reads it: the q8-dot weights round it themselves
// (gemv_blk), the schemes' activations are quantized first (act_for)
static const float *gemv_input(li_cuda *c, const li_weight *w, const float *x, int64_t n) {
    return act_kind(w) == ACT_Q8 ? x : act_for(c, w, x, n);
}

// y = x . W^T (res += y): k_mmq or the tensor cores where w can go, else
// the GEMV or SGEMM over x as w's kernels read it
static void matmul_any(li_cuda *c, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (mmq_matmul(c, w, x, y, res, n) || lt_matmul(c, w, x, y, res, n)) return;
    const bool gemv = n <= GEMV_NB || c->invariant;
    matmul_one(c, w, gemv ? gemv_input(c, w, x, n) : act_for(c, w, x, n), y, res, n);
}

static void cu_matmul(li_backend *be, const li_weight *w, const float *x, float *y, int64_t n) {
    li_cuda *c = cu(be);
    if (n > 0) matmul_any(c, w, x, y, nullptr, n);
    q8_forget(c);
}

static void cu_add(li_backend *be, float *y, const float *x, int64_t n) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    PROF(c, PK_ADD, launch(c, blocks_for(n, 256), 256, 0, k_add, y, x, n); CK_LAUNCH("add"));
}

// the GEMV adds y into res as it writes it (the same float k_add would add)
static void cu_matmul_add(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    li_cuda *c = cu(be);
    if (n > 0) matmul_any(c, w, x, y, res, n);
    q8_forget(c);
}

// weights reading one input: the input quantized once when they read it
// alike, and one GEMV launch for all when they are also of one type
static void multi(li_cuda *c, const li_weight *const *w, int n_w, const float *x, float *const *y, int64_t n);

static void cu_matmul_multi(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                            int64_t n) {
    li_cuda *c = cu(be);
    if (n > 0 && n_w > 0) multi(c, w, n_w, x, y, n);
    q8_forget(c);
}

// the views of n_w (<= MULTI_MAX) weights and their outputs, rows end to
// end; their rows in all
static int64_t multi_views(const li_weight *const *w, int n_w, float *const *y, cu_multi *mw) {
    memset(mw, 0, sizeof *mw);
    mw->n_w = n_w;
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) {
        mw->w[i] = wview(w[i]);
        mw->y[i] = y[i];
        rows += w[i]->m;
        mw->end[i] = rows;
    }
    return rows;
}

static void multi(li_cuda *c, const li_weight *const *w, int n_w, const float *x, float *const *y, int64_t n) {
    bool alike = true, one_type = n_w <= MULTI_MAX;
    for (int i = 1; i < n_w; i++) {
        alike &= act_kind(w[i]) == act_kind(w[0]) && w[i]->k == w[0]->k;
        one_type &= w[i]->type == w[0]->type;
    }
    if (mmq_all(c, w, n_w, n)) { // the input's codes once, one k_mmq launch for all
        int8_t *xq;
        float2 *xds;
        mmq_codes(c, x, n, w[0]->k, &xq, &xds);
        mmq_launch(c, w, n_w, xq, xds, y, nullptr, n);
        return;
    }
    if (!alike || (n > GEMV_NB && !c->invariant)) { // each weight its own product (GEMMs: the tensor cores')
        for (int i = 0; i < n_w; i++) matmul_any(c, w[i], x, y[i], nullptr, n);
        return;
    }
    const float *xa = gemv_input(c, w[0], x, n);
    if (!one_type) {
        for (int i = 0; i < n_w; i++) matmul_one(c, w[i], xa, y[i], nullptr, n);
        return;
    }
    cu_multi mw;
    const int64_t rows = multi_views(w, n_w, y, &mw);
    const dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)((n + GEMV_NB - 1) / GEMV_NB));
#define L_MULTI(T) launch(c, grid, GEMV_WARPS * 32, 0, k_gemv_multi<T>, mw, xa, n)
    PROF(c, PK_GEMV_MULTI, CU_TYPE_SWITCH(w[0]->type, L_MULTI); CK_LAUNCH("gemv_multi"));
#undef L_MULTI
}

static void cu_get_rows(li_backend *be, const li_weight *w, const int32_t *ids, int64_t n, float *out) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    const cu_wview v = wview(w);
#define L_ROWS(T) launch(c, blocks_for(n * w->k, 256), 256, 0, k_dequant<T, float>, v, ids, n, out)
    PROF(c, PK_GET_ROWS, CU_TYPE_SWITCH(w->type, L_ROWS); CK_LAUNCH("get_rows"));
#undef L_ROWS
}

// ------------------------------------------------------------------------
// per-row and elementwise ops
// ------------------------------------------------------------------------

// 1 / rms(xr) with eps, xr a row of dim: the block's squares summed in
// double, as the reference (ggml) does
__device__ float rms_scale(const float *xr, int64_t dim, float eps) {
    __shared__ double red[ROW_THREADS];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const float sq = xr[j] * xr[j];
        sum += (double)sq;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    return 1.0f / sqrtf((float)(red[0] / (double)dim) + eps);
}

// a block per row
__global__ void k_rmsnorm(const float *x, const float *w, float *y, int64_t dim, float eps) {
    pdl_enter();
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    const float scale = rms_scale(xr, dim, eps);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = (xr[j] * scale) * w[j];
}

// the same, also writing the output's q8 blocks (dim % 32 == 0): a warp a block
__global__ void k_rmsnorm_q8(const float *x, const float *w, float *y, float *q8, int64_t dim, float eps) {
    pdl_enter();
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim, *qr = q8 + (int64_t)blockIdx.x * dim;
    const float scale = rms_scale(xr, dim, eps);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t b = warp; b < dim / 32; b += blockDim.x / 32) {
        const int64_t j = b * 32 + lane;
        const float v = (xr[j] * scale) * w[j];
        yr[j] = v;
        qr[j] = q8_round_warp(v);
    }
}

static void cu_rmsnorm(li_backend *be, const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    const float *wd = dev_floats(c, w, dim);
    if (fuse_rows(c, n) && dim % 32 == 0) {
        float *q8 = reserve(c, &c->xbuf, &c->xcap, (size_t)n * (size_t)dim);
        PROF(c, PK_RMSNORM,
             launch(c, (unsigned)n, ROW_THREADS, 0, k_rmsnorm_q8, x, wd, y, q8, dim, eps); CK_LAUNCH("rmsnorm_q8"));
        c->q8_src = y, c->q8_rows = n, c->q8_k = dim;
        return;
    }
    PROF(c, PK_RMSNORM, launch(c, (unsigned)n, ROW_THREADS, 0, k_rmsnorm, x, wd, y, dim, eps); CK_LAUNCH("rmsnorm"));
}

// Thread idx's pair (q's heads' pairs first, nq of them, then k's), rotated
// in place: its token, head row (token * heads + head), dims and values
struct rope_pair {
    int64_t tok, ih;
    int i0, i1;
    float y0, y1;
};
__device__ __forceinline__ void rope_pair_at(float *q, float *k, const int32_t *pos, int64_t idx, int64_t nq, int hq,
                                             int hk, int head_dim, int half, float ts, int neox, rope_pair *r) {
    const bool isq = idx < nq;
    const int64_t t = isq ? idx : idx - nq;
    const int heads = isq ? hq : hk;
    const int j = (int)(t % half);
    r->ih = t / half;
    r->tok = r->ih / heads;
    float *v = (isq ? q : k) + r->ih * head_dim;
    const float angle = li_cu_rope_angle((float)pos[r->tok], ts, j);
    const float co = cosf(angle), si = sinf(angle);
    r->i0 = neox ? j : 2 * j, r->i1 = neox ? j + half : 2 * j + 1;
    const float x0 = v[r->i0], x1 = v[r->i1];
    r->y0 = x0 * co - x1 * si, r->y1 = x0 * si + x1 * co;
    v[r->i0] = r->y0;
    v[r->i1] = r->y1;
}

// a thread per (token, head, pair): q's heads, then k's (hk = 0: q alone)
__global__ void k_rope_qk(float *q, float *k, const int32_t *pos, int64_t n, int hq, int hk, int head_dim, int n_rot,
                          float ts, int neox) {
    pdl_enter();
    const int half = n_rot / 2;
    const int64_t nq = n * hq * half, total = nq + n * hk * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        rope_pair r;
        rope_pair_at(q, k, pos, idx, nq, hq, hk, head_dim, half, ts, neox, &r);
    }
}

static void cu_rope(li_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim, int n_rot,
                    float theta, int neox) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0 || n_rot < 2) return;
    const float ts = powf(theta, -2.0f / (float)n_rot); // on the host: the reference's bits
    PROF(c, PK_ROPE,
         launch(c, blocks_for(n * n_heads * (n_rot / 2), 256), 256, 0, k_rope_qk, x, nullptr, pos, n, n_heads, 0,
                head_dim, n_rot, ts, neox);
         CK_LAUNCH("rope"));
}

static void cu_rope_qk(li_backend *be, float *q, float *k, const int32_t *pos, int64_t n, int hq, int hk,
                       int head_dim, int n_rot, float theta, int neox) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0 || n_rot < 2) return;
    const float ts = powf(theta, -2.0f / (float)n_rot); // on the host: the reference's bits
    const int64_t total = n * (hq + hk) * (n_rot / 2);
    PROF(c, PK_ROPE,
         launch(c, blocks_for(total, 256), 256, 0, k_rope_qk, q, k, pos, n, hq, hk, head_dim, n_rot, ts, neox);
         CK_LAUNCH("rope_qk"));
}

__global__ void k_silu_mul(float *g, const float *u, int64_t n) {
    pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        g[i] = li_cu_silu_mul(g[i], u[i]);
}

// the same, also writing g's q8 blocks: a warp a block of 32 (dim % 32 == 0)
__global__ void k_silu_mul_q8(float *g, const float *u, float *q8, int64_t n_blocks) {
    pdl_enter();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= n_blocks) return; // a whole warp
    const int64_t i = b * 32 + threadIdx.x % 32;
    const float v = li_cu_silu_mul(g[i], u[i]);
    g[i] = v;
    q8[i] = q8_round_warp(v);
}

// k_mmq's inputs made by their producers (above GEMV_NB rows, fusion on):
// rmsnorm into codes (a block per row: rms_scale's bits, then a warp a
// block of 32), and silu_mul writing g and its codes (a warp a block)
__global__ void k_act_q8c_norm(const float *x, const float *nw, float eps, int8_t *xq, float2 *xds, int64_t k) {
    pdl_enter();
    const float *xr = x + (int64_t)blockIdx.x * k;
    const float scale = rms_scale(xr, k, eps);
    const int lane = threadIdx.x & 31;
    const int64_t nblk = k / 32, b0 = (int64_t)blockIdx.x * nblk;
    for (int64_t b = threadIdx.x / 32; b < nblk; b += blockDim.x / 32)
        q8c_warp((xr[b * 32 + lane] * scale) * nw[b * 32 + lane], xq, xds, b0 + b, lane);
}

__global__ void k_silu_q8c(float *g, const float *u, int8_t *xq, float2 *xds, int64_t n_blocks) {
    pdl_enter();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= n_blocks) return; // a whole warp
    const int lane = threadIdx.x & 31;
    const int64_t i = b * 32 + lane;
    const float v = li_cu_silu_mul(g[i], u[i]);
    g[i] = v;
    q8c_warp(v, xq, xds, b, lane);
}

// g = silu(g) * u with g's codes beside it; the next op, a k_mmq over g,
// takes them (the note lives for one op)
static void silu_codes(li_cuda *c, float *g, const float *u, int64_t n, int64_t dim) {
    int8_t *xq;
    float2 *xds;
    mmq_buffers(c, n, dim, &xq, &xds);
    const int64_t nb = n * dim / 32;
    PROF(c, PK_SILU_MUL, launch(c, (unsigned)((nb + 7) / 8), 256, 0, k_silu_q8c, g, u, xq, xds, nb);
         CK_LAUNCH("silu_q8c"));
    c->mmq_src = g, c->mmq_rows = n, c->mmq_k = dim;
}

static void cu_silu_mul(li_backend *be, float *g, const float *u, int64_t n, int64_t dim) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n * dim <= 0) return;
    if (c->fuse && c->mmq && n > GEMV_NB && !c->invariant && dim % 32 == 0) {
        silu_codes(c, g, u, n, dim);
        return;
    }
    if (fuse_rows(c, n) && dim % 32 == 0) {
        float *q8 = reserve(c, &c->xbuf, &c->xcap, (size_t)n * (size_t)dim);
        const int64_t nb = n * dim / 32;
        PROF(c, PK_SILU_MUL,
             launch(c, (unsigned)((nb + 7) / 8), 256, 0, k_silu_mul_q8, g, u, q8, nb); CK_LAUNCH("silu_mul_q8"));
        c->q8_src = g, c->q8_rows = n, c->q8_k = dim;
        return;
    }
    PROF(c, PK_SILU_MUL, launch(c, blocks_for(n * dim, 256), 256, 0, k_silu_mul, g, u, n * dim); CK_LAUNCH("silu_mul"));
}

// h = rmsnorm(x), y_i = h . W_i^T (swiglu: y_0 = silu(y_0) * y_1), for
// q4_0 / q4_1 / q8_0 weights of one type and k with fusion on (neither h
// nor, under swiglu, y_1 is written): up to GEMV_NB rows (or on the
// invariant backend) one k_gemv_norm launch; above, the norm straight into
// k_mmq's codes, one k_mmq launch for all weights, and silu leaving the
// down projection's codes beside g. Else the ops apart.
static void cu_norm_matmul(li_backend *be, const float *x, const float *nw, float eps, float *h,
                           const li_weight *const *w, int n_w, float *const *y, int64_t n, bool swiglu) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0 || n_w <= 0) return;
    const int64_t dim = w[0]->k;
    const li_type t = w[0]->type;
    bool fused = c->fuse && (n <= GEMV_NB || c->invariant) && n_w <= MULTI_MAX && w[0]->scheme == LI_SCHEME_PLAIN &&
                 (t == LI_TYPE_Q4_0 || t == LI_TYPE_Q4_1 || t == LI_TYPE_Q8_0) && dim % 32 == 0 &&
                 (!swiglu || (n_w == 2 && w[1]->m == w[0]->m));
    for (int i = 1; i < n_w && fused; i++) fused = w[i]->type == t && w[i]->scheme == LI_SCHEME_PLAIN && w[i]->k == dim;
    if (c->fuse && mmq_all(c, w, n_w, n) && (!swiglu || (n_w == 2 && w[1]->m == w[0]->m))) {
        // above GEMV_NB rows: the norm into k_mmq's codes, one k_mmq launch,
        // silu writing the down projection's codes beside g
        int8_t *xq;
        float2 *xds;
        mmq_buffers(c, n, dim, &xq, &xds);
        const float *nwd = dev_floats(c, nw, dim);
        PROF(c, PK_RMSNORM, launch(c, (unsigned)n, ROW_THREADS, 0, k_act_q8c_norm, x, nwd, eps, xq, xds, dim);
             CK_LAUNCH("act_q8c_norm"));
        mmq_launch(c, w, n_w, xq, xds, y, nullptr, n);
        if (swiglu) silu_codes(c, y[0], y[1], n, w[0]->m);
        return;
    }
    const float *nwd = fused ? dev_floats(c, nw, dim) : nullptr;
    if (!fused || (uintptr_t)nwd % 16) { // the ops apart (the lanes read the norm's weights as float4s)
        cu_rmsnorm(be, x, nw, h, n, dim, eps);
        multi(c, w, n_w, h, y, n);
        q8_forget(c);
        if (swiglu) cu_silu_mul(be, y[0], y[1], n, w[0]->m);
        return;
    }
    cu_multi mw;
    int64_t rows = multi_views(w, n_w, y, &mw);
    if (swiglu) rows = w[0]->m;
    const dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)((n + GEMV_NB - 1) / GEMV_NB));
#define L_NORM(T) launch(c, grid, GEMV_WARPS * 32, 0, k_gemv_norm<T>, mw, x, nwd, eps, n, (int)swiglu)
    switch (t) {
    case LI_TYPE_Q4_0: PROF(c, PK_GEMV_NORM, L_NORM(LI_TYPE_Q4_0); CK_LAUNCH("gemv_norm")); break;
    case LI_TYPE_Q4_1: PROF(c, PK_GEMV_NORM, L_NORM(LI_TYPE_Q4_1); CK_LAUNCH("gemv_norm")); break;
    default: PROF(c, PK_GEMV_NORM, L_NORM(LI_TYPE_Q8_0); CK_LAUNCH("gemv_norm")); break;
    }
#undef L_NORM
}

// a CUDA block per row, the row in shared memory: the reference's butterflies
// (ops_ref.c li_ref_hadamard), the same adds in the same pairs, so the same bits
__global__ void k_hadamard(float *x, const float *s, int64_t dim, int64_t block, float scale) {
    pdl_enter();
    extern __shared__ float v[];
    float *xr = x + (int64_t)blockIdx.x * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) v[j] = xr[j] * s[j];
    __syncthreads();
    const int64_t half = block / 2;
    for (int64_t h = 1; h < block; h *= 2) {
        for (int64_t t = threadIdx.x; t < dim / 2; t += blockDim.x) {
            const int64_t p = t % half, i = (t / half) * block + (p / h) * 2 * h + p % h;
            const float a = v[i], c = v[i + h];
            v[i] = a + c;
            v[i + h] = a - c;
        }
        __syncthreads();
    }
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) xr[j] = v[j] * scale;
}

static void cu_hadamard(li_backend *be, float *x, const float *s, int64_t n, int64_t dim, int64_t block) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    const float *sd = dev_floats(c, s, dim);
    PROF(c, PK_HADAMARD,
         launch(c, (unsigned)n, ROW_THREADS, (size_t)dim * sizeof(float), k_hadamard, x, sd, dim, block,
                1.0f / sqrtf((float)block));
         CK_LAUNCH("hadamard"));
}

// ------------------------------------------------------------------------
// paged KV: store and attention
// ------------------------------------------------------------------------

// 16/32-bit KV: a thread per element of K and of V
template <int DT> __device__ __forceinline__ void kv_put(void *base, int64_t idx, float f) {
    if (DT == LI_TYPE_F32) ((float *)base)[idx] = f;
    else if (DT == LI_TYPE_F16) ((uint16_t *)base)[idx] = li_cu_f32_to_fp16(f);
    else ((uint16_t *)base)[idx] = li_cu_f32_to_bf16(f);
}

template <int DT>
__global__ void k_kv_store(void *kd, void *vd, const float *k, const float *v, const int64_t *slot, int64_t n_tokens,
                           int64_t row) {
    pdl_enter();
    const int64_t total = n_tokens * row;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / row, e = idx % row;
        if (slot[i] < 0) continue; // a padding row (backend.h)
        const int64_t dst = slot[i] * row + e;
        kv_put<DT>(kd, dst, k[idx]);
        kv_put<DT>(vd, dst, v[idx]);
    }
}

// 8-bit KV: a warp per (token, kv head, K or V): amax, scale, codes
__global__ void k_kv8_store(int t, uint8_t *kd, uint8_t *vd, float *ks, float *vs, const float *k, const float *v,
                            const int64_t *slot, int64_t n_tokens, int n_head_kv, int D) {
    pdl_enter();
    const int lane = threadIdx.x % 32;
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (wid >= n_tokens * n_head_kv * 2) return;
    const int which = (int)(wid % 2);
    const int64_t ih = wid / 2, i = ih / n_head_kv;
    if (slot[i] < 0) return; // a padding row (backend.h): the whole warp
    const int h = (int)(ih % n_head_kv);
    const float *x = (which ? v : k) + ih * D;
    const int64_t e = slot[i] * n_head_kv + h; // (slot, head)
    uint8_t *dst = (which ? vd : kd) + e * D;
    float amax = 0.0f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(x[d]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float inv;
    const float scale = li_cu_kv8_scale(t, amax, &inv);
    for (int d = lane; d < D; d += 32) dst[d] = li_cu_kv8_encode(t, x[d] * inv);
    if (lane == 0) (which ? vs : ks)[e] = scale;
}

static void kv_store_launch(li_cuda *c, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                            int64_t n_tokens, int n_head_kv, int head_dim, int64_t row, unsigned nb) {
    switch (kv->dtype) {
    case LI_TYPE_F32: launch(c, nb, 256, 0, k_kv_store<LI_TYPE_F32>, kv->k, kv->v, k, v, slot, n_tokens, row); break;
    case LI_TYPE_F16: launch(c, nb, 256, 0, k_kv_store<LI_TYPE_F16>, kv->k, kv->v, k, v, slot, n_tokens, row); break;
    case LI_TYPE_BF16: launch(c, nb, 256, 0, k_kv_store<LI_TYPE_BF16>, kv->k, kv->v, k, v, slot, n_tokens, row); break;
    case LI_KV_TYPE_FP8_E4M3:
    case LI_KV_TYPE_INT8: {
        const int64_t warps = n_tokens * n_head_kv * 2;
        launch(c, (unsigned)((warps * 32 + 255) / 256), 256, 0, k_kv8_store, (int)kv->dtype, (uint8_t *)kv->k,
               (uint8_t *)kv->v, kv->k_scale, kv->v_scale, k, v, slot, n_tokens, n_head_kv, head_dim);
        break;
    }
    default: li_type_unreachable("cuda: kv_store", kv->dtype);
    }
    CK_LAUNCH("kv_store");
}

// rope_qk and kv_store in one launch (F32 / F16 / BF16 KV): threads for
// q's pairs, k's pairs (roped in k as rope_qk does, and stored), k's dims
// past n_rot, and v's elements; each value is the two ops' (the same
// expressions), so the same bits. Padding rows (slot < 0) store nothing.
template <int DT>
__global__ void k_rope_store(float *q, float *k, const float *v, const int32_t *pos, int64_t n, int hq, int hk,
                             int head_dim, int n_rot, float ts, int neox, void *kd, void *vd, const int64_t *slot) {
    pdl_enter();
    const int half = n_rot / 2, rot = 2 * half, tail = head_dim - rot; // an odd n_rot's last dim is not rotated
    const int64_t row = (int64_t)hk * head_dim, nq = n * hq * half, nk = n * hk * half, nt = n * hk * tail;
    const int64_t total = nq + nk + nt + n * row;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        if (idx < nq + nk) {
            rope_pair r;
            rope_pair_at(q, k, pos, idx, nq, hq, hk, head_dim, half, ts, neox, &r);
            if (idx >= nq && slot[r.tok] >= 0) {
                const int64_t dst = slot[r.tok] * row + (r.ih % hk) * head_dim;
                kv_put<DT>(kd, dst + r.i0, r.y0);
                kv_put<DT>(kd, dst + r.i1, r.y1);
            }
        } else if (idx < nq + nk + nt) { // k's dims past the pairs: stored as they are
            const int64_t t = idx - nq - nk, ih = t / tail, i = ih / hk;
            const int e = rot + (int)(t % tail);
            if (slot[i] >= 0) kv_put<DT>(kd, slot[i] * row + (ih % hk) * head_dim + e, k[ih * head_dim + e]);
        } else {
            const int64_t t = idx - nq - nk - nt, i = t / row;
            if (slot[i] >= 0) kv_put<DT>(vd, slot[i] * row + t % row, v[t]);
        }
    }
}

static void cu_rope_qk(li_backend *be, float *q, float *k, const int32_t *pos, int64_t n, int hq, int hk,
                       int head_dim, int n_rot, float theta, int neox);
static void cu_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                        int64_t n_tokens, int n_head_kv, int head_dim);

static void cu_rope_store(li_backend *be, float *q, float *k, const float *v, const int32_t *pos, int64_t n, int hq,
                          int hk, int head_dim, int n_rot, float theta, int neox, const li_kv_layer *kv,
                          const int64_t *slot) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    const bool wide = kv->dtype == LI_TYPE_F32 || kv->dtype == LI_TYPE_F16 || kv->dtype == LI_TYPE_BF16;
    if (!c->fuse || !wide || n_rot < 2 || n_rot > head_dim) { // the two ops apart
        cu_rope_qk(be, q, k, pos, n, hq, hk, head_dim, n_rot, theta, neox);
        cu_kv_store(be, kv, k, v, slot, n, hk, head_dim);
        return;
    }
    const float ts = powf(theta, -2.0f / (float)n_rot); // on the host: the reference's bits
    const int64_t total = n * ((int64_t)(hq + hk) * (n_rot / 2) + (int64_t)hk * (head_dim - n_rot / 2 * 2) +
                               (int64_t)hk * head_dim);
    const unsigned nb = blocks_for(total, 256);
#define L_RS(DT) launch(c, nb, 256, 0, k_rope_store<DT>, q, k, v, pos, n, hq, hk, head_dim, n_rot, ts, neox, kv->k, \
                        kv->v, slot)
    switch (kv->dtype) {
    case LI_TYPE_F32: PROF(c, PK_ROPE_STORE, L_RS(LI_TYPE_F32); CK_LAUNCH("rope_store")); break;
    case LI_TYPE_F16: PROF(c, PK_ROPE_STORE, L_RS(LI_TYPE_F16); CK_LAUNCH("rope_store")); break;
    default: PROF(c, PK_ROPE_STORE, L_RS(LI_TYPE_BF16); CK_LAUNCH("rope_store")); break;
    }
#undef L_RS
}

static void cu_kv_store(li_backend *be, const li_kv_layer *kv, const float *k, const float *v, const int64_t *slot,
                        int64_t n_tokens, int n_head_kv, int head_dim) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n_tokens <= 0) return;
    const int64_t row = (int64_t)n_head_kv * head_dim;
    const unsigned nb = blocks_for(n_tokens * row, 256);
    PROF(c, PK_KV_STORE, kv_store_launch(c, kv, k, v, slot, n_tokens, n_head_kv, head_dim, row, nb));
}

template <int DT> __device__ __forceinline__ float kv_get(const void *base, int64_t idx) {
    if (DT == LI_TYPE_F32) return ((const float *)base)[idx];
    if (DT == LI_TYPE_F16) return li_cu_fp16_to_f32(((const uint16_t *)base)[idx]);
    if (DT == LI_TYPE_BF16) return li_cu_bf16_to_f32(((const uint16_t *)base)[idx]);
    return li_cu_kv8_value(DT, ((const uint8_t *)base)[idx]);
}

struct cu_attn {
    const float *q;
    float *out;
    const int32_t *pos, *seq, *bt;
    int64_t bt_stride;
    const void *k, *v;
    const float *k_scale, *v_scale; // 8-bit KV only
    float *q8;                      // or NULL: out's q8 blocks too (D % 32 == 0)
    int8_t *xq;                     // or NULL: out's codes for k_mmq too (D % 32 == 0)
    float2 *xds;
    int n_head, n_head_kv, D, bs;
    float scale;
};

// One block per (token, head); each warp walks every ATTN_WARPS-th position
// with its own online softmax (running max m, sum l, accumulator over d in
// the lanes' registers), and the warps' partial results are merged at the end.
// Token i, head h over positions [p0, p1): each warp walks every
// ATTN_WARPS-th position with its own online softmax (running max m, sum l,
// accumulator over d in the lanes' registers); the warps' results are
// merged: *M the max, *L the sum, f[w] each warp's weight, and s_acc[w][d]
// its accumulator, read by the caller as sum_w f[w] * s_acc[w][d].
template <int DT>
__device__ __forceinline__ void attn_walk(const cu_attn &a, int64_t i, int h, int64_t p0, int64_t p1, float *M,
                                          float *L, float *f, float (*s_acc)[ATTN_MAXD]) {
    constexpr int R = ATTN_MAXD / 32;
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int D = a.D, kvh = h / (a.n_head / a.n_head_kv);
    const float *q = a.q + ((int64_t)i * a.n_head + h) * D;
    float qr[R], acc[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        const int d = lane + 32 * t;
        qr[t] = d < D ? q[d] : 0.0f;
        acc[t] = 0.0f;
    }
    const int32_t *bt = a.bt + (int64_t)a.seq[i] * a.bt_stride;
    float m = -INFINITY, l = 0.0f;
    for (int64_t p = p0 + warp; p < p1; p += ATTN_WARPS) {
        const int64_t e = ((int64_t)bt[p / a.bs] * a.bs + p % a.bs) * a.n_head_kv + kvh; // (slot, kv head)
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < R; t++) {
            const int d = lane + 32 * t;
            if (d < D) s += qr[t] * kv_get<DT>(a.k, e * D + d);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s = a.k_scale ? s * a.k_scale[e] * a.scale : s * a.scale; // the reference's order
        float corr, w;
        li_cu_softmax_step(&m, &l, s, &corr, &w);
        const float wv = a.v_scale ? w * a.v_scale[e] : w;
#pragma unroll
        for (int t = 0; t < R; t++) {
            const int d = lane + 32 * t;
            if (d < D) acc[t] = acc[t] * corr + wv * kv_get<DT>(a.v, e * D + d);
        }
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < R; t++) {
        const int d = lane + 32 * t;
        if (d < D) s_acc[warp][d] = acc[t];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) {
        f[w] = li_cu_merge_weight(s_m[w], s_l[w], mx); // a warp with no positions adds nothing
        sum += s_l[w] * f[w];
    }
    *M = mx;
    *L = sum;
}

// out's row for (token, head) = o / L, and its q8 blocks when asked (with
// q8, D % 32 == 0: whole warps reach the shuffles)
// out's element (row, d), and beside it its q8 block or k_mmq's codes: a
// warp holds whole blocks of 32 there (D % 32 == 0, every lane calling)
__device__ __forceinline__ void attn_put(const cu_attn &a, int64_t row, int d, float v) {
    a.out[row * a.D + d] = v;
    if (a.q8) a.q8[row * a.D + d] = q8_round_warp(v);
    if (a.xq) q8c_warp(v, a.xq, a.xds, (row * a.D + d) / 32, (int)(threadIdx.x & 31));
}

// One block per (token, head), all of its positions.
template <int DT> __global__ void __launch_bounds__(ATTN_WARPS * 32) k_attention(cu_attn a) {
    pdl_enter();
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAXD];
    const int64_t i = blockIdx.x / a.n_head;
    const int h = (int)(blockIdx.x % a.n_head);
    float M, L, f[ATTN_WARPS];
    attn_walk<DT>(a, i, h, 0, (int64_t)a.pos[i] + 1, &M, &L, f, s_acc);
    for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) o += f[w] * s_acc[w][d];
        attn_put(a, (int64_t)i * a.n_head + h, d, o / L);
    }
}

// Split by positions (flash-decoding): block (token, head) x chunk c walks
// positions [c * ATTN_CHUNK, (c + 1) * ATTN_CHUNK) of its token, leaving its
// max, sum and unnormalized accumulator in part (a chunk past the token's
// positions leaves max -inf, sum 0); the row's last chunk to finish merges
// its chunks in chunk order. A decode step's few (token, head) blocks then
// spread over the GPU, each warp a few positions deep.

// Row `row`'s chunks in part merged into out: the max of their maxes, each
// chunk's weight exp(m_c - M) (0 for a chunk that saw no position), the
// sum, then each d. The chunks were written by other blocks of the grid:
// read through L2 (ld.cg), never from this SM's L1.
__device__ __forceinline__ void attn_merge_row(const cu_attn &a, int64_t row, int n_chunks, const float *part) {
    const float *pr = part + row * n_chunks * (a.D + 2);
    float M = -INFINITY;
    for (int c = 0; c < n_chunks; c++) M = fmaxf(M, __ldcg(pr + c * (a.D + 2)));
    float L = 0.0f;
    for (int c = 0; c < n_chunks; c++) {
        const float *q = pr + c * (a.D + 2);
        const float m = __ldcg(q), l = __ldcg(q + 1);
        L += l * li_cu_merge_weight(m, l, M);
    }
    for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
        float o = 0.0f;
        for (int c = 0; c < n_chunks; c++) {
            const float *q = pr + c * (a.D + 2);
            o += li_cu_merge_weight(__ldcg(q), __ldcg(q + 1), M) * __ldcg(q + 2 + d);
        }
        attn_put(a, row, d, o / L);
    }
}

// The split walk's chunk; the last of a row's chunks to finish (a ticket
// per row, taken after the chunk's writes are fenced) merges the row and
// puts its ticket back to 0, so no merge launch follows.
template <int DT>
__global__ void __launch_bounds__(ATTN_WARPS * 32) k_attn_part(cu_attn a, int n_chunks, float *part,
                                                               unsigned *ticket) {
    pdl_enter();
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAXD];
    __shared__ bool last;
    const int64_t i = blockIdx.x / a.n_head;
    const int h = (int)(blockIdx.x % a.n_head);
    const int64_t n_pos = (int64_t)a.pos[i] + 1, p0 = (int64_t)blockIdx.y * ATTN_CHUNK;
    const int64_t p1 = p0 + ATTN_CHUNK < n_pos ? p0 + ATTN_CHUNK : n_pos;
    float M, L, f[ATTN_WARPS];
    attn_walk<DT>(a, i, h, p0, p1, &M, &L, f, s_acc);
    float *pr = part + ((int64_t)blockIdx.x * n_chunks + blockIdx.y) * (a.D + 2);
    if (threadIdx.x == 0) {
        pr[0] = M;
        pr[1] = L;
    }
    for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) o += f[w] * s_acc[w][d];
        pr[2 + d] = o;
    }
    __syncthreads(); // every thread's writes of the chunk issued
    if (threadIdx.x == 0) {
        __threadfence(); // ... and visible to the grid before the ticket
        last = atomicAdd(ticket + blockIdx.x, 1u) == (unsigned)n_chunks - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    attn_merge_row(a, blockIdx.x, n_chunks, part);
    if (threadIdx.x == 0) ticket[blockIdx.x] = 0;
}

// A prefill's attention by tiles (attn_tile.h): block (tile of tokens, kv
// head), the phases with a barrier between them. With q8 (head_dim % 32 ==
// 0) each warp writes whole rows, so the q8 blocks' shuffles see 32 lanes.
template <int DT> __global__ void __launch_bounds__(AT_THREADS) k_attn_tile(li_at_args a, float *q8) {
    pdl_enter();
    __shared__ li_at_shared sh;
    const int t = threadIdx.x, kvh = blockIdx.y;
    const int g = a.n_head / a.n_head_kv, qt = AT_ROWS / g;
    const int64_t t0 = (int64_t)blockIdx.x * qt, t1 = t0 + qt < a.n_tokens ? t0 + qt : a.n_tokens;
    a.dt = DT;
    float o[AT_ACC];
    for (int64_t cur = t0; cur < t1;) {
        if (t == 0) li_at_segment(&a, &sh, cur, t1);
        __syncthreads();
        li_at_load_q(&a, &sh, t, kvh, o);
        __syncthreads();
        for (int32_t p0 = 0; p0 <= sh.maxpos; p0 += AT_KEYS) {
            li_at_load_kv(&a, &sh, t, kvh, p0);
            __syncthreads();
            li_at_scores(&a, &sh, t, p0);
            __syncthreads();
            li_at_softmax(&a, &sh, t);
            __syncthreads();
            li_at_pv(&sh, t, o);
            __syncthreads();
        }
        li_at_finish(&sh, t, o);
        __syncthreads();
        if (q8) {
            const int warp = t / 32, lane = t % 32;
            for (int r = warp; r < sh.nrow; r += AT_THREADS / 32)
                for (int d = lane; d < a.D; d += 32) {
                    const int64_t at = li_at_out_index(&a, &sh, kvh, r, d);
                    a.out[at] = sh.q[r][d];
                    q8[at] = q8_round_warp(sh.q[r][d]);
                }
        } else {
            li_at_put(&a, &sh, t, kvh);
        }
        const int32_t nrow = sh.nrow;
        __syncthreads();
        cur += nrow / g;
    }
}

static void attention_tile_launch(li_cuda *c, li_type dtype, const li_at_args &t, float *q8) {
    const int qt = li_at_tile_tokens(t.n_head, t.n_head_kv);
    const dim3 grid((unsigned)((t.n_tokens + qt - 1) / qt), (unsigned)t.n_head_kv);
    switch (dtype) {
    case LI_TYPE_F32: launch(c, grid, AT_THREADS, 0, k_attn_tile<LI_TYPE_F32>, t, q8); break;
    case LI_TYPE_F16: launch(c, grid, AT_THREADS, 0, k_attn_tile<LI_TYPE_F16>, t, q8); break;
    case LI_TYPE_BF16: launch(c, grid, AT_THREADS, 0, k_attn_tile<LI_TYPE_BF16>, t, q8); break;
    case LI_KV_TYPE_FP8_E4M3: launch(c, grid, AT_THREADS, 0, k_attn_tile<LI_KV_TYPE_FP8_E4M3>, t, q8); break;
    case LI_KV_TYPE_INT8: launch(c, grid, AT_THREADS, 0, k_attn_tile<LI_KV_TYPE_INT8>, t, q8); break;
    default: li_type_unreachable("cuda: attention", dtype);
    }
    CK_LAUNCH("attention (tiled)");
}

// n_chunks 0: one block per (token, head); else k_attn_part over that many
// chunks into part, the last chunk of each row merging it (ticket: a zeroed
// counter per row)
static void attention_launch(li_cuda *c, li_type dtype, const cu_attn &p, unsigned rows, int n_chunks, float *part,
                             unsigned *ticket) {
    const dim3 grid(rows, n_chunks ? (unsigned)n_chunks : 1u);
#define L_ATT(DT)                                                                                                   \
    if (n_chunks) launch(c, grid, ATTN_WARPS * 32, 0, k_attn_part<DT>, p, n_chunks, part, ticket);                    \
    else launch(c, grid, ATTN_WARPS * 32, 0, k_attention<DT>, p)
    switch (dtype) {
    case LI_TYPE_F32: L_ATT(LI_TYPE_F32); break;
    case LI_TYPE_F16: L_ATT(LI_TYPE_F16); break;
    case LI_TYPE_BF16: L_ATT(LI_TYPE_BF16); break;
    case LI_KV_TYPE_FP8_E4M3: L_ATT(LI_KV_TYPE_FP8_E4M3); break;
    case LI_KV_TYPE_INT8: L_ATT(LI_KV_TYPE_INT8); break;
    default: li_type_unreachable("cuda: attention", dtype);
    }
#undef L_ATT
    CK_LAUNCH("attention");
}

static void cu_attention(li_backend *be, const li_attn_args *a) {
    q8_forget(cu(be));
    if (a->n_tokens <= 0) return;
    if (a->head_dim > ATTN_MAXD || a->n_head_kv <= 0 || a->n_head % a->n_head_kv) {
        fprintf(stderr, "luainfer: cuda: attention of head_dim %d (at most %d), %d heads over %d kv heads\n",
                a->head_dim, ATTN_MAXD, a->n_head, a->n_head_kv);
        abort();
    }
    const li_kv_layer *kv = a->kv;
    cu_attn p;
    p.q = a->q;
    p.out = a->out;
    p.pos = a->pos;
    p.seq = a->seq;
    p.bt = a->block_table;
    p.bt_stride = a->bt_stride;
    p.k = kv->k;
    p.v = kv->v;
    const bool b8 = kv->dtype == LI_KV_TYPE_FP8_E4M3 || kv->dtype == LI_KV_TYPE_INT8;
    p.k_scale = b8 ? kv->k_scale : nullptr;
    p.v_scale = b8 ? kv->v_scale : nullptr;
    p.n_head = a->n_head;
    p.n_head_kv = a->n_head_kv;
    p.D = a->head_dim;
    p.bs = a->block_size;
    p.scale = a->scale;
    li_cuda *c = cu(be);
    const bool fuse = fuse_rows(c, a->n_tokens) && a->head_dim % 32 == 0;
    const int64_t row = (int64_t)a->n_head * a->head_dim;
    p.q8 = fuse ? reserve(c, &c->xbuf, &c->xcap, (size_t)a->n_tokens * (size_t)row) : nullptr;
    // above GEMV_NB rows the o projection's k_mmq codes, written beside the
    // output (not by the tiled kernel: its tiles write rows apart)
    const bool tiled = c->attn_tile && !c->invariant && a->n_tokens > ATTN_SPLIT_TOKENS &&
                       li_at_fits(a->n_head, a->n_head_kv, a->head_dim);
    const bool codes = c->fuse && c->mmq && !c->invariant && a->n_tokens > GEMV_NB && !tiled && a->head_dim % 32 == 0;
    p.xq = nullptr;
    p.xds = nullptr;
    if (codes) mmq_buffers(c, a->n_tokens, row, &p.xq, &p.xds);
    // split by positions for a few tokens (decode) when not batch-invariant:
    // the chunk count comes from the table's width, so it changes with the
    // batch (the invariant backend keeps one block per (token, head))
    const int64_t cap = a->bt_stride * a->block_size;
    const int n_chunks = c->attn_split && !c->invariant && a->n_tokens <= ATTN_SPLIT_TOKENS && cap > ATTN_CHUNK
                             ? (int)((cap + ATTN_CHUNK - 1) / ATTN_CHUNK)
                             : 0;
    const unsigned rows = (unsigned)(a->n_tokens * a->n_head);
    // a prefill's tokens by tiles sharing their keys (not batch-invariant
    // by the batch's size: the invariant backend keeps one kernel)
    if (tiled) {
        li_at_args t = {};
        t.q = a->q, t.out = a->out, t.pos = a->pos, t.seq = a->seq, t.bt = a->block_table;
        t.bt_stride = a->bt_stride, t.n_tokens = a->n_tokens, t.k = kv->k, t.v = kv->v;
        t.k_scale = p.k_scale, t.v_scale = p.v_scale, t.n_head = a->n_head, t.n_head_kv = a->n_head_kv;
        t.D = a->head_dim, t.bs = a->block_size, t.dt = (int)kv->dtype, t.scale = a->scale;
        PROF(c, PK_ATTENTION, attention_tile_launch(c, kv->dtype, t, p.q8));
        if (fuse) c->q8_src = a->out, c->q8_rows = a->n_tokens, c->q8_k = row;
        return;
    }
    float *part = nullptr;
    unsigned *ticket = nullptr;
    if (n_chunks) {
        const size_t part_floats = (size_t)rows * (size_t)n_chunks * (size_t)(a->head_dim + 2);
        part = reserve(c, &c->attn_part, &c->attn_part_cap, part_floats);
        const size_t had = c->attn_ticket_cap;
        ticket = (unsigned *)reserve(c, &c->attn_ticket, &c->attn_ticket_cap, rows);
        if (c->attn_ticket_cap != had) // fresh memory (outside any capture: reserve ended it)
            CK(cudaMemsetAsync(ticket, 0, c->attn_ticket_cap * sizeof(float), c->st));
    }
    PROF(c, PK_ATTENTION, attention_launch(c, kv->dtype, p, rows, n_chunks, part, ticket));
    if (fuse) c->q8_src = a->out, c->q8_rows = a->n_tokens, c->q8_k = row;
    if (codes) c->mmq_src = a->out, c->mmq_rows = a->n_tokens, c->mmq_k = row; // the o projection takes them
}

// ------------------------------------------------------------------------
// greedy sampling where the logits are
// ------------------------------------------------------------------------

// a beats b: a number beats a NaN, a larger value beats a smaller, and of
// equal values the lower index (sampler.c's argmax_of)
__device__ __forceinline__ bool am_better(float av, int ai, float bv, int bi) {
    if (isnan(av)) return false;
    if (isnan(bv)) return true;
    return av > bv || (av == bv && ai < bi);
}

// a block per row: each thread its stride of the row, then a tree
__global__ void k_argmax(const float *x, int64_t dim, int32_t *out) {
    pdl_enter();
    __shared__ float sv[ROW_THREADS];
    __shared__ int si[ROW_THREADS];
    const float *row = x + (int64_t)blockIdx.x * dim;
    float bv = NAN;
    int bi = INT_MAX;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
        if (am_better(row[j], (int)j, bv, bi)) {
            bv = row[j];
            bi = (int)j;
        }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        const int t = threadIdx.x;
        if (t < s && am_better(sv[t + s], si[t + s], sv[t], si[t])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == INT_MAX ? 0 : si[0]; // no number in the row: 0
}

static void cu_argmax(li_backend *be, const float *x, int64_t n, int64_t dim, int32_t *out) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    PROF(c, PK_ARGMAX, launch(c, (unsigned)n, ROW_THREADS, 0, k_argmax, x, dim, out); CK_LAUNCH("argmax"));
}

// a row's k largest (backend.h topk): topk_row.h's phases, a barrier
// between them; a block per row
static_assert((int)ROW_THREADS <= (int)TK_THREADS && LI_TOPK_MAX <= (int)TK_MAX, "topk_row.h's shared arrays");
__global__ void k_topk(const float *x, int64_t dim, int k, float *vals, int32_t *ids) {
    pdl_enter();
    __shared__ li_tk_shared sh;
    const float *row = x + (int64_t)blockIdx.x * dim;
    const int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) li_tk_init(&sh, k);
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        li_tk_clear(&sh, t, nt);
        __syncthreads();
        li_tk_count(&sh, row, dim, shift, t, nt);
        __syncthreads();
        if (t == 0) li_tk_pick(&sh, shift);
        __syncthreads();
    }
    li_tk_tally(&sh, row, dim, t, nt);
    __syncthreads();
    if (t == 0) li_tk_scan(&sh, nt);
    __syncthreads();
    li_tk_gather(&sh, row, dim, k, t, nt);
    __syncthreads();
    if (t == 0) li_tk_sort(&sh, k);
    __syncthreads();
    li_tk_store(&sh, k, vals + (int64_t)blockIdx.x * k, ids + (int64_t)blockIdx.x * k, t, nt);
}

// each row's log-sum-exp (backend.h lse): the max (a NaN never wins), then
// the exps in double, summed by a tree: the host's formula, in its own order
__global__ void k_lse(const float *x, int64_t dim, const float *scale, float *out) {
    pdl_enter();
    __shared__ float smx[ROW_THREADS];
    __shared__ double ssum[ROW_THREADS];
    const float *row = x + (int64_t)blockIdx.x * dim;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
    smx[threadIdx.x] = mx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s && smx[threadIdx.x + s] > smx[threadIdx.x]) smx[threadIdx.x] = smx[threadIdx.x + s];
        __syncthreads();
    }
    mx = smx[0];
    const double s = scale ? (double)scale[blockIdx.x] : 1.0;
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum += exp(((double)row[j] - mx) * s);
    ssum[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) ssum[threadIdx.x] += ssum[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = mx + (float)log(ssum[0]);
}

static void cu_lse(li_backend *be, const float *x, int64_t n, int64_t dim, const float *scale, float *out) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    PROF(c, PK_TOPK, launch(c, (unsigned)n, ROW_THREADS, 0, k_lse, x, dim, scale, out); CK_LAUNCH("lse"));
}

// the raw logits of the ids a sampler edits (backend.h gather)
__global__ void k_gather(const float *x, const int64_t *idx, int64_t n, float *out) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[idx[i]];
}

static void cu_gather(li_backend *be, const float *x, const int64_t *idx, int64_t n, float *out) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0) return;
    PROF(c, PK_TOPK, launch(c, (unsigned)((n + 255) / 256), 256, 0, k_gather, x, idx, n, out); CK_LAUNCH("gather"));
}

static void cu_topk(li_backend *be, const float *x, int64_t n, int64_t dim, int k, float *vals, int32_t *ids) {
    li_cuda *c = cu(be);
    q8_forget(c);
    if (n <= 0 || k <= 0) return;
    if (k > LI_TOPK_MAX || k > dim) {
        fprintf(stderr, "luainfer: cuda: top-%d of %lld values (at most %d)\n", k, (long long)dim, LI_TOPK_MAX);
        abort();
    }
    PROF(c, PK_TOPK, launch(c, (unsigned)n, ROW_THREADS, 0, k_topk, x, dim, k, vals, ids); CK_LAUNCH("topk"));
}

// ------------------------------------------------------------------------
// recorded passes: the stream captured into a graph
// ------------------------------------------------------------------------

static int cu_graph_begin(li_backend *be) {
    li_cuda *c = cu(be);
    if (c->prof.on || c->capturing) return -1; // a profile times each launch
    // thread-local: CUDA calls of other threads (another engine) do not end it
    if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    c->capturing = true;
    return 0;
}

static void *cu_graph_end(li_backend *be) {
    li_cuda *c = cu(be);
    if (!c->capturing) return nullptr; // capture_break ended it: the ops were dropped
    c->capturing = false;
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(c->st, &g) != cudaSuccess || !g) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return nullptr;
    }
    cudaGraphExec_t ex = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    cu_graph *h = (cu_graph *)li_xmalloc(sizeof *h);
    h->exec = ex;
    h->gen = c->gen;
    return h;
}

static void cu_graph_launch(li_backend *be, void *g) {
    q8_forget(cu(be));
    CK(cudaGraphLaunch(((cu_graph *)g)->exec, cu(be)->st));
}

static bool cu_graph_valid(li_backend *be, const void *g) { return ((const cu_graph *)g)->gen == cu(be)->gen; }

static void cu_graph_free(li_backend *be, void *g) {
    cu_graph *h = (cu_graph *)g;
    CK(cudaStreamSynchronize(cu(be)->st)); // a launch of it may still run
    CK(cudaGraphExecDestroy(h->exec));
    free(h);
}

// ------------------------------------------------------------------------
// the table, init and free
// ------------------------------------------------------------------------

static li_backend_ops make_ops(void) {
    li_backend_ops o;
    memset(&o, 0, sizeof o);
    o.api_version = LI_BACKEND_API_VERSION;
    o.name = "cuda";
    o.alignment = 256;
    o.buffer_alloc = cu_buffer_alloc;
    o.buffer_free = cu_buffer_free;
    o.buffer_wrap = nullptr; // device memory only
    o.buffer_set = cu_buffer_set;
    o.buffer_get = cu_buffer_get;
    o.buffer_copy = cu_buffer_copy;
    o.buffer_clear = cu_buffer_clear;
    o.synchronize = cu_synchronize;
    // the GEMV (n <= 8) and cuBLAS (n > 8) paths sum a row's products in
    // different orders, and cuBLAS picks its kernels by shape
    o.batch_variant = true;
    o.matmul = cu_matmul;
    o.matmul_multi = cu_matmul_multi;
    o.matmul_add = cu_matmul_add;
    o.get_rows = cu_get_rows;
    o.rmsnorm = cu_rmsnorm;
    o.rope = cu_rope;
    o.rope_qk = cu_rope_qk;
    o.silu_mul = cu_silu_mul;
    o.norm_matmul = cu_norm_matmul;
    o.rope_store = cu_rope_store;
    o.add = cu_add;
    o.hadamard = cu_hadamard;
    o.kv_store = cu_kv_store;
    o.attention = cu_attention;
    o.argmax = cu_argmax;
    o.topk = cu_topk;
    o.lse = cu_lse;
    o.gather = cu_gather;
    o.weight_prepare = cu_weight_prepare;
    o.weight_release = cu_weight_release;
    o.graph_begin = cu_graph_begin;
    o.graph_end = cu_graph_end;
    o.graph_launch = cu_graph_launch;
    o.graph_valid = cu_graph_valid;
    o.graph_free = cu_graph_free;
    return o;
}

static const li_backend_ops cuda_ops = make_ops();

// the batch-invariant table: the same ops, every matmul the GEMV
static li_backend_ops make_invariant_ops(void) {
    li_backend_ops o = make_ops();
    o.name = "cuda-invariant";
    o.batch_variant = false;
    return o;
}

static const li_backend_ops cuda_invariant_ops = make_invariant_ops();

extern "C" bool li_backend_is_cuda(const li_backend *be) {
    return be && (be->ops == &cuda_ops || be->ops == &cuda_invariant_ops);
}

extern "C" int li_backend_cuda_init(li_backend *be, int device, li_error *err) {
    be->ops = nullptr;
    be->impl = nullptr;
    be->n_threads = 1;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
        cudaGetLastError();
        return li_error_set(err, LI_EUNSUP, "cuda: no CUDA device (cudaGetDeviceCount: %s)", why);
    }
    if (device < 0 || device >= n)
        return li_error_set(err, LI_EINVAL, "cuda: device %d out of range (%d devices)", device, n);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return li_error_set(err, LI_EUNSUP, "cuda: cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    if (!blas_open()) return li_error_set(err, LI_EUNSUP, "cuda: cannot open cuBLAS: %s", blas.why);
    li_cuda *c = (li_cuda *)li_xcalloc(1, sizeof *c);
    c->device = device;
    if ((e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        return li_error_set(err, LI_EUNSUP, "cuda: cudaStreamCreate: %s", cudaGetErrorString(e));
    }
    cublasStatus_t s = blas.create(&c->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(c->st);
        free(c);
        return li_error_set(err, LI_EUNSUP, "cuda: cublasCreate: %s", blas.status_string(s));
    }
    blas.set_stream(c->blas, c->st);
    blas.set_math_mode(c->blas, CUBLAS_PEDANTIC_MATH); // FP32 as written: no TF32 in SGEMM
    // a workspace of its own, so SGEMMs captured into a graph allocate nothing
    // (32 MiB: what cuBLAS asks for on Hopper)
    const size_t ws = (size_t)32 << 20;
    if (cudaMalloc(&c->blas_ws, ws) == cudaSuccess) blas.set_workspace(c->blas, c->blas_ws, ws);
    else cudaGetLastError();
    // the tensor-core GEMMs: without cuBLASLt every weight takes the SGEMM path
    char why[160];
    const char *lt_env = getenv("LUAINFER_CUDA_LT");
    if (lt_env && !strcmp(lt_env, "0")) snprintf(c->lt_why, sizeof c->lt_why, "off (LUAINFER_CUDA_LT=0)");
    else if (!(c->lt = li_lt_create(why, sizeof why))) snprintf(c->lt_why, sizeof c->lt_why, "%s", why);
    const char *prof = getenv("LUAINFER_CUDA_PROFILE");
    if (prof && strcmp(prof, "0") && *prof) c->prof.on = c->prof.print_at_free = true;
    const char *fmb = getenv("LUAINFER_CUDA_F16_CACHE_MB");
    size_t dev_free = 0, dev_total = 0;
    if (cudaMemGetInfo(&dev_free, &dev_total) != cudaSuccess) cudaGetLastError();
    c->f16_budget = fmb && *fmb ? (size_t)strtoull(fmb, nullptr, 10) << 20 : dev_free / 4;
    const char *asp = getenv("LUAINFER_CUDA_ATTN_SPLIT");
    c->attn_split = !(asp && !strcmp(asp, "0"));
    const char *atl = getenv("LUAINFER_CUDA_ATTN_TILE");
    c->attn_tile = !(atl && !strcmp(atl, "0"));
    const char *fz = getenv("LUAINFER_CUDA_FUSE");
    c->fuse = !(fz && !strcmp(fz, "0"));
    const char *pd = getenv("LUAINFER_CUDA_PDL");
    c->pdl = pd && *pd && strcmp(pd, "0");
    const char *mq = getenv("LUAINFER_CUDA_MMQ");
    c->mmq = !(mq && !strcmp(mq, "0"));
    const char *inv = getenv("LUAINFER_CUDA_INVARIANT");
    c->invariant = inv && *inv && strcmp(inv, "0");
    be->ops = c->invariant ? &cuda_invariant_ops : &cuda_ops;
    be->impl = c;
    return 0;
}

extern "C" int li_backend_cuda_device(const li_backend *be) {
    return li_backend_is_cuda(be) ? ((const li_cuda *)be->impl)->device : -1;
}

extern "C" void li_backend_cuda_describe(const li_backend *be, char *out, size_t cap, double *bandwidth) {
    if (cap) out[0] = 0;
    *bandwidth = 0;
    if (!li_backend_is_cuda(be)) return;
    const int dev = ((const li_cuda *)be->impl)->device;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    snprintf(out, cap, "%s", p.name);
    int khz = 0, bits = 0; // double data rate: 2 transfers a clock
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
        *bandwidth = 2.0 * (double)khz * 1e3 * (double)bits / 8.0;
    cudaGetLastError();
}

extern "C" int li_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

// a setting the recorded passes depend on: changed, they are stale; the
// previous value, -1 on another backend
static int set_setting(li_backend *be, bool li_cuda::*flag, bool on) {
    if (!li_backend_is_cuda(be)) return -1;
    li_cuda *c = cu(be);
    const bool was = c->*flag;
    if (was != on) c->*flag = on, c->gen++;
    return was;
}

extern "C" int li_backend_cuda_set_mmq(li_backend *be, bool on) { return set_setting(be, &li_cuda::mmq, on); }

extern "C" int li_backend_cuda_set_pdl(li_backend *be, bool on) { return set_setting(be, &li_cuda::pdl, on); }

extern "C" const char *li_backend_cuda_lt_note(li_backend *be) {
    return li_backend_is_cuda(be) ? cu(be)->lt_why : "";
}

extern "C" void li_backend_cuda_profile(li_backend *be, bool on) {
    if (!li_backend_is_cuda(be)) return;
    li_cuda *c = cu(be);
    cu_synchronize(be);
    cu_profile *p = &c->prof;
    memset(p->calls, 0, sizeof p->calls);
    memset(p->gpu_ms, 0, sizeof p->gpu_ms);
    memset(p->host_ms, 0, sizeof p->host_ms);
    p->on = on;
}

extern "C" void li_backend_cuda_profile_print(li_backend *be, FILE *out, const char *title) {
    if (!li_backend_is_cuda(be)) return;
    li_cuda *c = cu(be);
    cu_synchronize(be);
    const cu_profile *p = &c->prof;
    double gpu = 0, host = 0;
    long calls = 0;
    fprintf(out, "%s\n  %-12s %9s %10s %10s %10s %10s\n", title, "kernel", "launches", "gpu ms", "host ms",
            "gpu us/1", "host us/1");
    for (int k = 0; k < PK_N; k++) {
        if (!p->calls[k]) continue;
        fprintf(out, "  %-12s %9ld %10.3f %10.3f %10.2f %10.2f\n", pk_name[k], p->calls[k], p->gpu_ms[k],
                p->host_ms[k], 1e3 * p->gpu_ms[k] / (double)p->calls[k], 1e3 * p->host_ms[k] / (double)p->calls[k]);
        gpu += p->gpu_ms[k];
        host += p->host_ms[k];
        calls += p->calls[k];
    }
    fprintf(out, "  %-12s %9ld %10.3f %10.3f\n", "total", calls, gpu, host);
}

extern "C" void li_backend_cuda_free(li_backend *be) {
    li_cuda *c = (li_cuda *)be->impl;
    if (!c) return;
    if (c->prof.print_at_free)
        li_backend_cuda_profile_print(be, stderr, "luainfer: cuda profile (LUAINFER_CUDA_PROFILE)");
    cudaStreamSynchronize(c->st);
    prof_drain(c);
    for (int i = 0; i < c->prof.n_pool; i++) cudaEventDestroy(c->prof.pool[i]);
    free(c->prof.pool);
    free(c->prof.pend);
    li_lt_destroy(c->lt);
    cudaFree(c->lt_codes);
    cudaFree(c->lt_rows);
    cudaFree(c->lt_d);
    cudaFree(c->lt_w16);
    cudaFree(c->attn_part);
    cudaFree(c->attn_ticket);
    cudaFree(c->blas_ws);
    cudaFree(c->wbuf);
    cudaFree(c->xbuf);
    cudaFree(c->mmq_x);
    cudaFree(c->mmq_s);
    for (int i = 0; i < c->n_copies; i++) {
        cudaFree(c->copies[i].dev);
        free(c->copies[i].keep);
    }
    free(c->copies);
    blas.destroy(c->blas);
    cudaStreamDestroy(c->st);
    free(c);
    be->impl = nullptr;
    be->ops = nullptr;
}
