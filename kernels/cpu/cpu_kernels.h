/* cpu_kernels.h — what the CPU backend (cpu.c) needs from one ISA level.
 *
 * Internal to kernels/cpu: each ISA file (ops_scalar.c, ops_avx2.c,
 * ops_avx512.c) fills one li_cpu_kernels table (ops_avx512.c a second one,
 * "amx", whose quantized GEMM is ops_amx.c's); cpu.c picks one by CPUID and
 * splits the work over threads. Every entry is checked against the scalar
 * reference (ops_ref.c, kernels/types.c) by tests/unit/test_kernels.c.
 *
 * Batch invariance. A row's matmul result must not depend on how many rows
 * are in the call, where the row sits in a register block, or how the work
 * is split over threads (a sequence's logits are the same alone or batched).
 * The matmul kernels get it the simplest way: every ISA computes each output
 * with exactly the reference's float operations in the reference's order
 * (per block, in block order; integer dot products are exact), so every
 * path is bit-identical to li_backend_ref_ops(). The SIMD kernels get their
 * width from the weight rows instead: one vector lane per weight row, 16
 * rows at a time, over a repacked ("panel") layout, see below. */
#ifndef LI_CPU_KERNELS_H
#define LI_CPU_KERNELS_H

#include "backend.h"

#include <stdatomic.h>

/* ---- packed quantized activations ----
 * matmul quantizes each activation row once (to the weight's vec_dot type,
 * Q8_0 or Q8_1, bit-identical to the ggml blocks) and stores it unpacked so
 * SIMD loads need no gathers; per row, nb = k/32 blocks:
 *
 *   int8_t  qs[k]     the quants, contiguous           (offset 0, padded to 64)
 *   float   d[nb]     block scale (fp16-rounded)        li_qact_d()
 *   float   s[nb]     Q8_1: block s = d*sum(q) (fp16-rounded)   li_qact_s()
 *   int32_t sum[nb]   sum(q) of the block (Q4_0 and Q8_0 weights are
 *                     multiplied as unsigned q+8 / q+128 and corrected by
 *                     -8*sum, -128*sum: exact integers)      li_qact_sum()
 *
 * Row stride li_qact_row_bytes(k) is a multiple of 64. */
static inline size_t li_qact_qs_bytes(int64_t k) { return ((size_t)k + 63) & ~(size_t)63; }
static inline size_t li_qact_row_bytes(int64_t k) {
    return (li_qact_qs_bytes(k) + (size_t)(k / 32) * 12 + 63) & ~(size_t)63;
}
static inline float *li_qact_d(void *row, int64_t k) { return (float *)((char *)row + li_qact_qs_bytes(k)); }
static inline float *li_qact_s(void *row, int64_t k) { return li_qact_d(row, k) + k / 32; }
static inline int32_t *li_qact_sum(void *row, int64_t k) { return (int32_t *)(li_qact_s(row, k) + k / 32); }

/* ---- packed weights (repack.c) ----
 * weight_prepare copies a weight into panels of LI_PANEL = 16 rows, so one
 * 64-byte load holds the same 4 bytes of 16 rows (one per 32-bit lane) and
 * a vpdpbusd with a broadcast activation word does 4 multiply-adds per row.
 * The last panel is padded with zero rows. Panel p, quantized (nb blocks):
 *
 *   qs  [nb][QS]       Q4_0/Q4_1: QS = 256: 4 chunks of 64 bytes; chunk t,
 *                      lane l = bytes 4t..4t+3 of row l's block qs, so the
 *                      low nibbles are elements 4t.., the high ones 16+4t..
 *                      Q8_0: QS = 512: 8 chunks, chunk t lane l = elements
 *                      4t..4t+3 of row l, stored as q+128 (unsigned)
 *   d   [nb][16]       fp16 scale of each row's block
 *   m   [nb][16]       Q4_1 only: fp16 min of each row's block
 *
 * float (F32, F16, BF16): [k][16] elements, lane l = row l.
 * AVX2 reads the same panels as two halves of 8 lanes. */
#define LI_PANEL 16

/* A job's items split into contiguous runs (lanes), one per thread to start
 * with: thread ith drains lane ith front to back, then helps with the
 * others. Each thread so streams one contiguous run of weights (what the
 * hardware prefetcher follows best), and a thread that never shows up only
 * means the others drain its lane. */
#define LI_CPU_MAX_LANES 64
typedef struct li_cpu_lanes {
    int n;           /* lanes in use */
    int64_t n_items;
    struct {
        _Alignas(64) atomic_long v; /* a line each: threads claim from different lanes at once */
    } next[LI_CPU_MAX_LANES];       /* next item of each lane */
} li_cpu_lanes;

/* A prefetch into L2 that the compiler keeps (GCC may drop a loop of
 * nothing but __builtin_prefetch as a loop without effects). */
static inline void li_cpu_prefetch_l2(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* ... and into L1 */
static inline void li_cpu_prefetch_l1(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 3);
#endif
}

/* The lanes of panel p (LI_PANEL rows) that hold one of the m rows, as a
 * 16-bit mask (an AVX-512 __mmask16) */
static inline uint16_t li_cpu_panel_mask(int64_t m, int64_t p) {
    const int64_t left = m - p * LI_PANEL;
    return left >= LI_PANEL ? (uint16_t)0xffff : (uint16_t)((1u << left) - 1);
}

/* Decode streams every weight from memory once per token and the kernels
 * prefetch only a little ahead of themselves: a thread done with its own
 * lane (of L) warms into L2 the start of its lane of the next weight
 * (next_bytes at next, li_cpu_arena_next's), which would otherwise begin
 * cold. */
static inline void li_cpu_warm_lane(const uint8_t *next, size_t next_bytes, int ith, int L, size_t ahead) {
    if (!next || ith >= L) return;
    for (size_t o = 0; o < ahead; o += 64) li_cpu_prefetch_l2((const char *)next + next_bytes * (size_t)ith / (size_t)L + o);
}

static inline void li_cpu_lanes_init(li_cpu_lanes *l, int64_t n_items, int nth) {
    l->n_items = n_items;
    const int64_t n = nth < LI_CPU_MAX_LANES ? nth : LI_CPU_MAX_LANES;
    l->n = (int)(n < n_items ? n : n_items);
    for (int i = 0; i < l->n; i++) atomic_init(&l->next[i].v, n_items * i / l->n);
}

/* one past the last item of lane `lane` */
static inline int64_t li_cpu_lanes_end(const li_cpu_lanes *l, int lane) { return l->n_items * (lane + 1) / l->n; }

/* the next unclaimed item of lane `lane`, or -1 once it is drained */
static inline int64_t li_cpu_lanes_claim(li_cpu_lanes *l, int lane) {
    const int64_t t = atomic_fetch_add_explicit(&l->next[lane].v, 1, memory_order_relaxed);
    return t < li_cpu_lanes_end(l, lane) ? t : -1;
}
/* Every item of l, fn(ctx, t) each: thread ith drains its own lane first,
 * then helps with the others'. (The rows a matmul quantizes go this way
 * too: one counter shared by the threads cost a contended cache line a
 * row, most of W8A8's quantization of 512 rows.) */
static inline void li_cpu_lanes_run(li_cpu_lanes *l, int ith, void (*fn)(void *ctx, int64_t t), void *ctx) {
    const int L = l->n;
    for (int d = 0; d < L; d++)
        for (int64_t t; (t = li_cpu_lanes_claim(l, (ith + d) % L)) >= 0;) fn(ctx, t);
}

/* How far ahead (bytes of panels) the GEMV kernels prefetch their stream:
 * about DRAM latency x one core's streaming rate (4-16 KiB measured alike) */
#define LI_GEMV_PREFETCH 8192
#define LI_PACKED_MAGIC 0x4c49504b43505531ull /* "LIPKCPU1" */

typedef struct li_cpu_packed {
    uint64_t magic;
    li_type type;
    int64_t k, m;
    int64_t nb;            /* blocks per row (quantized), else 0 */
    int64_t n_panels;      /* ceil(m / 16) */
    size_t qs_bytes;       /* per block: 256 (Q4), 512 (Q8_0); float: element size */
    size_t panel_bytes;    /* multiple of 64 */
    uint8_t *data;         /* (n_panels, panel_bytes), 64-byte aligned */
    void *chunk;           /* the arena chunk holding data (repack.c) */
} li_cpu_packed;

/* The packed form of w, or NULL when w was not prepared by a CPU backend. */
static inline const li_cpu_packed *li_cpu_packed_of(const li_weight *w) {
    const li_cpu_packed *p = w->packed;
    return p && p->magic == LI_PACKED_MAGIC ? p : NULL;
}
/* true for the types repack.c packs: Q4_0, Q4_1, Q8_0, F32, F16, BF16 */
bool li_cpu_pack_supported(li_type t);
/* Builds w's panels (0, or LI_ENOMEM / LI_EUNSUP); li_cpu_pack_free undoes it. */
int li_cpu_pack(li_weight *w);
void li_cpu_pack_free(li_weight *w);
/* Panel memory from the arena the packed weights share (in the order the
 * forward pass prepares them, on huge pages: one stream per decode step):
 * zeroed, 64-byte aligned; *chunk is what li_cpu_arena_free takes back. */
void *li_cpu_arena_alloc(size_t bytes, void **chunk);
void li_cpu_arena_free(void *chunk);
/* Drops the whole pages of [data, data + bytes) from this process when they
 * lie in a read-only private file mapping (the GGUF: they come back from
 * the page cache if read again); other memory is left alone. For weights
 * whose rows a packed copy replaced. */
void li_cpu_drop_pages(const void *data, size_t bytes);
/* The panels packed right after p's (the next weight the forward pass
 * uses), as *bytes at *data; *bytes = 0 when none. Only for prefetching. */
void li_cpu_packed_next(const li_cpu_packed *p, const uint8_t **data, size_t *bytes);
/* The same for any arena allocation of `bytes` at data (li_cpu_arena_alloc's). */
void li_cpu_arena_next(const void *data, size_t bytes, const uint8_t **next, size_t *next_bytes);
/* Row `row` of a packed weight, dequantized exactly as the type's to_float. */
void li_cpu_packed_get_row(const li_cpu_packed *p, int64_t row, float *out);

typedef struct li_attn_part li_attn_part; /* below, with LI_ATTN_CHUNK */

typedef struct li_cpu_kernels {
    const char *isa;
    const char *family; /* the ISA name the kernel sets without an AMX table (kv8, kv16) are chosen by */
    /* x(k) -> one packed activation row; act_type Q8_0 or Q8_1, k % 32 == 0 */
    void (*quantize_act)(li_type act_type, const float *x, void *dst, int64_t k);
    /* Unpacked weights (the scalar ISA, or a weight never prepared):
     * y[r*ldy + i] = W_i · a_r for i < m, r < n. W rows are w_stride bytes
     * apart, of type Q4_0, Q4_1 or Q8_0; act rows act_stride bytes apart */
    void (*gemm_q)(li_type w_type, int64_t k, const void *w, size_t w_stride, int64_t m, const void *act,
                   size_t act_stride, int64_t n, float *y, int64_t ldy);
    /* the same for W of type F32, F16 or BF16 and f32 activations x(n, ldx) */
    void (*gemm_f)(li_type w_type, int64_t k, const void *w, size_t w_stride, int64_t m, const float *x,
                   int64_t ldx, int64_t n, float *y, int64_t ldy);
    /* Packed weights, panels [p0, p1) against n activation rows: writes
     * y[r*ldy + i] for the rows i < m of those panels. NULL: no packed path
     * (cpu.c then uses gemm_q / gemm_f on the original rows). */
    void (*gemm_q_packed)(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t act_stride,
                          int64_t n, float *y, int64_t ldy);
    void (*gemm_f_packed)(const li_cpu_packed *w, int64_t p0, int64_t p1, const float *x, int64_t ldx, int64_t n,
                          float *y, int64_t ldy);
    /* attention output of token i, head h; scores: scratch of pos[i]+1 floats */
    void (*attn_head)(const li_attn_args *a, int64_t i, int h, float *scores);
    /* F16/BF16/F32 KV (optional): tokens [i0, i0+nt) of one sequence
     * (nt <= LI_ATTN_TILE), query heads g0..g0+ng-1 of kv head kvh's group
     * (nt * ng <= 64), positions of chunk `chunk` (part != NULL: see
     * li_attn_part; NULL: the whole context, chunk 0). Each (token, head)
     * gets the same bits as alone, in any tile. scratch:
     * li_attn_tile_scratch() floats, 64-byte aligned */
    void (*attn_tile)(const li_attn_args *a, int64_t i0, int nt, int kvh, int g0, int ng, int chunk,
                      const li_attn_part *part, float *scratch);
    /* with attn_tile: token i, head h, its chunks' partial sums into its
     * output (li_attn_part): m = max m_c, w_c = exp(m_c - m), out = (sum
     * w_c o_c) / (sum w_c s_c), in chunk order */
    void (*attn_merge)(const li_attn_args *a, const li_attn_part *part, int64_t i, int h);
    /* g(n) = silu(g) * u */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* rmsnorm of rows x(n, dim) into y with weight w(dim), the reference's
     * bits (squares summed in double, in order). NULL: cpu.c's generic loop */
    void (*rmsnorm)(const float *x, const float *w, float *y, int64_t n, int64_t dim, float eps);
    /* rope rotation of x(n, n_heads, head_dim) by the angles cs(n, 2, half)
     * (each token's cos, then sin), pairs (j, j+half) if neox else (2j,
     * 2j+1): the reference's products and sums. NULL: cpu.c's loop */
    void (*rope_rotate)(float *x, const float *cs, int64_t n, int n_heads, int head_dim, int half, int neox);
    /* one row of the hadamard op, the reference's bits (li_ref_hadamard). NULL: the reference's */
    void (*hadamard)(float *x, const float *s, int64_t dim, int64_t block);
} li_cpu_kernels;

#define LI_ATTN_TILE 16

/* Attention by position chunks. A token of more than LI_ATTN_CHUNK positions
 * has its softmax taken over chunks of LI_ATTN_CHUNK positions, each a work
 * item of its own: per (token, head, chunk) the chunk's max score m, its sum
 * s of e_p = exp(score_p - m) and the unscaled sum of e_p v_p, merged in
 * chunk order by the kernel table's attn_merge (cpu.c calls it). A token of LI_ATTN_CHUNK
 * positions or fewer is one chunk and gets its output at once. Whether a
 * token is chunked and where its chunks fall depend on its position alone,
 * so its output does not depend on the batch; chunks let a decode step's
 * few (token, kv head) items spread over the threads (one token, 3 kv
 * heads on 2 threads: one thread did two thirds). */
#define LI_ATTN_CHUNK 128
struct li_attn_part {
    float *data;      /* (tokens, n_head, n_chunk, stride): D sums, then m and s */
    int64_t i0;       /* the first token held */
    int h0, n_head;   /* the heads held: h0 .. h0 + n_head - 1 */
    int64_t n_chunk;  /* chunks of the longest token */
    int64_t stride;   /* floats per (token, head, chunk): head_dim + 2, to 16 */
};
/* chunks of a token with npos positions */
static inline int64_t li_attn_n_chunks(int64_t npos) { return (npos + LI_ATTN_CHUNK - 1) / LI_ATTN_CHUNK; }
static inline float *li_attn_part_at(const li_attn_part *p, int64_t i, int h, int chunk) {
    return p->data + (((size_t)(i - p->i0) * (size_t)p->n_head + (size_t)(h - p->h0)) * (size_t)p->n_chunk +
                      (size_t)chunk) * (size_t)p->stride;
}
/* floats of scratch attn_tile needs for positions up to max_pos */
static inline size_t li_attn_tile_scratch(const li_attn_args *a, int64_t max_pos) {
    const size_t nq = (size_t)(a->n_head / a->n_head_kv) * LI_ATTN_TILE;
    /* the scores (nq, positions), then 16-lane sums of nq queries or 256 transposed K rows of 16 */
    return nq * (((size_t)max_pos + 16) & ~(size_t)15) + (nq > 16 ? nq : 16) * 256 + 16;
}

/* CPUID's F16C bit (what __builtin_cpu_supports("f16c") says in GCC) */
bool li_cpu_has_f16c(void);

extern const li_cpu_kernels li_cpu_kernels_scalar;
extern const li_cpu_kernels li_cpu_kernels_avx2;   /* needs AVX2, FMA, F16C */
extern const li_cpu_kernels li_cpu_kernels_avx512; /* needs AVX-512 F/BW/VL/DQ/VNNI, FMA, F16C */
extern const li_cpu_kernels li_cpu_kernels_amx;    /* AVX-512's, and li_cpu_amx_usable() */

/* AMX-TILE and AMX-INT8 present, enabled by the OS, and granted to this
 * process (ops_amx.c asks Linux once) */
bool li_cpu_amx_usable(void);
/* the AVX-512 quantized GEMM (ops_avx512.c) and the AMX one (ops_amx.c,
 * which hands single rows to the former): gemm_q_packed's contract */
void li_avx512_gemm_q_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t as, int64_t n,
                             float *y, int64_t ldy);
void li_amx_gemm_q_packed(const li_cpu_packed *w, int64_t p0, int64_t p1, const void *act, size_t as, int64_t n,
                          float *y, int64_t ldy);
/* the AVX-512 attention (attn_avx512.c), shared by the AVX-512 and AMX
 * tables: attn_head's, attn_tile's and attn_merge's contracts */
void li_avx512_attn_head(const li_attn_args *a, int64_t i, int h, float *scores);
void li_avx512_attn_tile(const li_attn_args *a, int64_t i0, int nt, int kvh, int g0, int ng, int chunk,
                         const li_attn_part *part, float *scratch);
void li_avx512_attn_merge(const li_attn_args *a, const li_attn_part *part, int64_t i, int h);

/* ---- pieces of the scalar reference shared with the scalar kernels (ops_ref.c) ---- */
void li_ref_attn_head(const li_attn_args *a, int64_t i, int h, float *scores);
void li_ref_silu_mul(float *g, const float *u, int64_t n);
/* one row of the hadamard op (backend.h): x(dim) <- (x * s) blockdiag(H_block) / sqrt(block);
 * butterflies of adds and subtracts in a fixed order, so every caller gets the same bits */
void li_ref_hadamard(float *x, const float *s, int64_t dim, int64_t block);
/* the same in AVX2 (ops_avx2.c; the AVX-512 table uses it too) */
void li_avx2_hadamard(float *x, const float *s, int64_t dim, int64_t block);
/* Element idx of an array stored as F32, F16 or BF16 (a K/V row, a weight row).
 * Callers pass only these three (kv_cache_init and weight_prepare refuse the
 * rest); where dtype is a constant the switch folds away. */
static inline float li_float_load(li_type dtype, const void *base, int64_t idx) {
    switch (dtype) {
    case LI_TYPE_F32: return ((const float *)base)[idx];
    case LI_TYPE_F16: return li_fp16_to_fp32(((const uint16_t *)base)[idx]);
    case LI_TYPE_BF16: return li_bf16_to_fp32(((const uint16_t *)base)[idx]);
    default: li_type_unreachable("cpu: float load", dtype);
    }
}
/* Bytes per element of a K/V row (or an F32/F16/BF16 weight row); the 8-bit
 * codes' scales are kept apart (li_kv_layer.k_scale / v_scale). */
static inline size_t li_kv_elem_size(li_type dtype) {
    switch (dtype) {
    case LI_TYPE_F32: return 4;
    case LI_TYPE_F16:
    case LI_TYPE_BF16: return 2;
    case LI_KV_TYPE_FP8_E4M3:
    case LI_KV_TYPE_INT8: return 1;
    default: li_type_unreachable("cpu: kv element size", dtype);
    }
}
/* One (token i, query head h) of an attention batch: its query and output
 * rows, its positions and block table, and its kv head's K and V at slot
 * 0 (a slot is `row` bytes: every kv head's elements of one position) */
typedef struct li_attn_head {
    const float *q;    /* (head_dim) */
    float *out;        /* (head_dim) */
    int64_t n_pos;     /* positions 0 .. n_pos - 1 */
    const int32_t *bt; /* the sequence's block table */
    size_t es, row;    /* bytes per element, per slot */
    const char *k, *v;
} li_attn_head;

static inline li_attn_head li_attn_head_of(const li_attn_args *a, li_type dtype, int64_t i, int h) {
    const int64_t D = a->head_dim;
    const size_t es = li_kv_elem_size(dtype), off = (size_t)(h / (a->n_head / a->n_head_kv)) * D * es;
    return (li_attn_head){.q = a->q + (i * a->n_head + h) * D, .out = a->out + (i * a->n_head + h) * D,
                          .n_pos = (int64_t)a->pos[i] + 1, .bt = li_attn_blocks(a, i), .es = es,
                          .row = (size_t)a->n_head_kv * D * es, .k = (const char *)a->kv->k + off,
                          .v = (const char *)a->kv->v + off};
}

/* Start of the K or V row for (kv head kvh) at position p of token i's sequence. */
static inline const void *li_kv_row(const li_attn_args *a, const void *base, int64_t i, int64_t p, int kvh) {
    const int32_t blk = li_attn_blocks(a, i)[p / a->block_size];
    const int64_t slot = (int64_t)blk * a->block_size + p % a->block_size;
    return (const char *)base + ((slot * a->n_head_kv + kvh) * a->head_dim) * li_kv_elem_size(a->kv->dtype);
}

/* The K or V rows of one kv head of token i's sequence, position 0, 1, ...
 * in turn: li_kv_row's addresses with the block table walked, not divided
 * into for every row. */
typedef struct li_kv_walk {
    const char *base;  /* K or V data + this kv head's offset */
    const int32_t *bt; /* the sequence's block table */
    int64_t bs;        /* block size */
    size_t slot;       /* bytes per cache slot (all kv heads) */
    int64_t blk, off;  /* the next row: position blk * bs + off */
} li_kv_walk;

static inline li_kv_walk li_kv_walk_init(const li_attn_args *a, const void *data, int64_t i, int kvh) {
    const size_t es = li_kv_elem_size(a->kv->dtype);
    return (li_kv_walk){.base = (const char *)data + (size_t)kvh * a->head_dim * es,
                        .bt = li_attn_blocks(a, i), .bs = a->block_size,
                        .slot = (size_t)a->n_head_kv * a->head_dim * es};
}

static inline const void *li_kv_walk_next(li_kv_walk *w) {
    const void *r = w->base + ((size_t)w->bt[w->blk] * (size_t)w->bs + (size_t)w->off) * w->slot;
    if (++w->off == w->bs) {
        w->off = 0;
        w->blk++;
    }
    return r;
}

#endif
