/* test_cuda_math.c — the CUDA kernels' per-element math (kernels/cuda/
 * cuda_math.h), run on the CPU against the scalar references, on every
 * build (no GPU needed: the header is plain C that nvcc also compiles as
 * __host__ __device__ code for backend_cuda.cu).
 *
 *   conversions   f16 / bf16 / fp8 e4m3 both ways: the bits of kernels/types.c
 *                 (every f16, bf16 and fp8 code; 2^20 random f32 patterns)
 *   weight rows   li_cu_elem of every type the CUDA backend takes, against
 *                 li_weight_dequant_row_ref, exactly, GGUF and scheme weights
 *                 (scales, zero points, permutation, a partial last group)
 *   activations   the per-row quantization the matmul kernel applies
 *                 (int8, fp8, int4) against li_act_quant_row_ref, exactly
 *   8-bit KV      codes and scale of one head against li_kv8_head_ref
 *   rope          the kernel's per-pair angle and rotation against the
 *                 reference op, exactly (the same libm on the host)
 *   attention     k_attention's walk re-enacted on the host (warps striding
 *                 over positions through the block table, an online softmax
 *                 each, the merge) against the reference op, NMSE < 1e-10,
 *                 for 1, 3 and 4 warps, F16 and INT8 KV
 *   tiled         k_attn_tile's phases (attn_tile.h, the code the kernel
 *                 runs) for every block, each phase for every thread in
 *                 turn, shared memory poisoned first: a mixed batch (two
 *                 prefill chunks, decode tokens between, a block table with
 *                 holes) against the reference op for every KV type and
 *                 three head shapes, and each token alone: the same bits
 *   topk          k_topk's phases (topk_row.h) for a row, each phase for
 *                 every thread in turn, against a full sort: random rows,
 *                 ties across the boundary, -0 beside +0, a NaN row, rows
 *                 shorter than the threads, k 1, 41 and 64
 *   block GEMV    gemv_blk's walk (k_gemv and k_gemv_norm: q4_0 / q4_1 /
 *                 q8_0 rows, the input rounded to q8 blocks by the warp,
 *                 rmsnorm and swiglu inside) for the 32 lanes of a warp,
 *                 from cuda_math.h's lane functions, against the
 *                 reference's dot products in double with the input
 *                 rounded by li_quantize_row_q8_0_ref, for 1, 3 and 8
 *                 activation rows and k of 1 to 37 blocks
 *   GEMV          li_cu_gemv8_lane (k_gemv's rows of f32 / f16 / bf16 and
 *                 the schemes' codes) for the 32 lanes of a warp against
 *                 the reference's dot products in double
 *   q8 blocks     li_cu_q8_value (the fused producers' q8 rounding) and
 *                 li_cu_q8_code / li_cu_q8_dh (k_act_q8c's codes) against
 *                 li_quantize_row_q8_0_ref's blocks, exactly
 *   block GEMM    k_mmq (q4_0 / q4_1 / q8_0 on the int8 tensor cores)
 *                 re-enacted: its warps' words, scales and terms from
 *                 cuda_math.h, each mma emulated from the PTX ISA's
 *                 fragment tables, the warps' sums added in order; against
 *                 the reference dequantization's dot products with the q8
 *                 activations, for partial row groups and activation tiles */
#include "cuda/cuda_math.h"
#include "cuda/attn_tile.h"
#include "cuda/topk_row.h"
#include "cpu/kv_kernels.h"
#include "test_util.h"
#include "test_weight.h"

#include <string.h>

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void fill_rand(float *row, int64_t k) {
    for (int64_t j = 0; j < k; j++) row[j] = rng_f() * 2.0f;
}

static void test_conversions(void) {
    int bad16 = 0, badb = 0, bad8 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        bad16 += f2u(li_cu_fp16_to_f32((uint16_t)h)) != f2u(li_fp16_to_fp32((uint16_t)h));
        badb += f2u(li_cu_bf16_to_f32((uint16_t)h)) != f2u(li_bf16_to_fp32((uint16_t)h));
    }
    for (uint32_t c = 0; c < 256; c++) bad8 += f2u(li_cu_fp8_to_f32((uint8_t)c)) != f2u(li_fp8_e4m3_to_fp32((uint8_t)c));
    report(!bad16 && !badb && !bad8, "decode: every f16 / bf16 / fp8 code (%d, %d, %d differ)", bad16, badb, bad8);
    int e16 = 0, eb = 0, e8 = 0;
    for (int i = 0; i < (1 << 20); i++) {
        /* random patterns, half of them in the ranges that round interestingly */
        uint32_t u = rng_u32() << 16 ^ rng_u32();
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + rng_u32() % 60) << 23);
        const float f = u2f(u);
        e16 += li_cu_f32_to_fp16(f) != li_fp32_to_fp16(f);
        eb += li_cu_f32_to_bf16(f) != li_fp32_to_bf16(f);
        e8 += li_cu_f32_to_fp8(f) != li_fp32_to_fp8_e4m3(f);
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 65504.0f, 65520.0f, 0x1p-24f,
                             0x1p-25f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f, 0x1p-6f};
    for (size_t i = 0; i < LI_ARRAY_LEN(special); i++) {
        e16 += li_cu_f32_to_fp16(special[i]) != li_fp32_to_fp16(special[i]);
        eb += li_cu_f32_to_bf16(special[i]) != li_fp32_to_bf16(special[i]);
        e8 += li_cu_f32_to_fp8(special[i]) != li_fp32_to_fp8_e4m3(special[i]);
    }
    report(!e16 && !eb && !e8, "encode: 2^20 random f32 + specials to f16 / bf16 / fp8 (%d, %d, %d differ)", e16, eb, e8);
}

/* what k_dequant computes for row r (backend_cuda.cu), on the host */
static void cu_row(const li_weight *w, int64_t r, float *out) {
    const int64_t ng = li_weight_n_groups(w), gs = w->group_size > 0 ? w->group_size : w->k;
    const float zero = li_scheme_info(w->scheme)->zero;
    const uint8_t *row = (const uint8_t *)w->data + r * w->row_bytes;
    for (int64_t j = 0; j < w->k; j++) {
        float c = li_cu_elem(w->type, row, j);
        if (w->scheme != LI_SCHEME_PLAIN)
            c = li_cu_scheme_value(c, w->scales + r * ng, w->zeros ? w->zeros + r * ng : NULL, zero, j, gs);
        out[w->perm ? w->perm[j] : j] = c;
    }
}

static int rows_differ(const li_weight *w) {
    float *a = li_xmalloc((size_t)w->k * sizeof(float)), *b = li_xmalloc((size_t)w->k * sizeof(float));
    int bad = 0;
    for (int64_t r = 0; r < w->m; r++) {
        cu_row(w, r, a);
        li_weight_dequant_row_ref(w, r, b);
        for (int64_t j = 0; j < w->k; j++) bad += f2u(a[j]) != f2u(b[j]);
    }
    free(a);
    free(b);
    return bad;
}

static void test_weight_rows(void) {
    const struct { li_type t; int64_t k; } plain[] = {
        {LI_TYPE_F32, 67}, {LI_TYPE_F16, 67}, {LI_TYPE_BF16, 67},
        {LI_TYPE_Q8_0, 160}, {LI_TYPE_Q4_0, 160}, {LI_TYPE_Q4_1, 160},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(plain); i++) {
        test_weight tw;
        test_weight_make(&tw, plain[i].t, plain[i].k, 13, fill_rand);
        const int bad = rows_differ(&tw.w);
        report(!bad, "li_cu_elem %-5s k=%lld: the reference's dequantization (%d elements differ)",
               li_type_name(plain[i].t), (long long)plain[i].k, bad);
        test_weight_free(&tw);
    }
    const struct { li_scheme s; int64_t k, gs; bool zeros, perm; } sch[] = {
        {LI_SCHEME_W8A8, 67, 0, false, false}, {LI_SCHEME_FP8, 67, 0, false, false},
        {LI_SCHEME_W8A8, 67, 32, false, false}, {LI_SCHEME_AWQ, 68, 32, true, false},
        {LI_SCHEME_GPTQ, 68, 32, true, true},   {LI_SCHEME_INT4, 68, 0, false, false},
        {LI_SCHEME_INT4, 68, 16, false, false},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(sch); i++) {
        test_weight tw;
        test_weight_scheme(&tw, sch[i].s, sch[i].k, 11, sch[i].gs, sch[i].zeros, sch[i].perm, rng_u32);
        const int bad = rows_differ(&tw.w);
        report(!bad, "li_cu_elem scheme %-4s k=%lld group %lld%s%s: li_weight_dequant_row_ref (%d differ)",
               li_scheme_name(sch[i].s), (long long)sch[i].k, (long long)sch[i].gs, sch[i].zeros ? " zeros" : "",
               sch[i].perm ? " perm" : "", bad);
        test_weight_free(&tw);
    }
    const li_type refused[] = {LI_TYPE_Q5_0, LI_TYPE_Q6_K, LI_TYPE_Q4_K, LI_TYPE_F64, LI_TYPE_Q8_1};
    int ok = 0;
    for (size_t i = 0; i < LI_ARRAY_LEN(refused); i++) ok += !li_cu_type_ok(refused[i]);
    report(ok == (int)LI_ARRAY_LEN(refused), "types without a CUDA kernel are refused (li_cu_type_ok)");
}

/* q8 blocks: li_cu_q8_value (q8_round_warp's arithmetic, given the warp's
 * amax) against li_quantize_row_q8_0_ref's block, dequantized */
static void test_q8_blocks(void) {
    enum { NB = 4000 };
    int bad = 0, bad_code = 0;
    for (int b = 0; b < NB; b++) {
        float x[32];
        const float scale = b % 3 == 0 ? 1e-3f : b % 3 == 1 ? 1.0f : 300.0f;
        for (int j = 0; j < 32; j++) x[j] = b == 0 ? 0.0f : rng_f() * scale;
        if (b % 7 == 1) x[5] = -x[5] * 4.0f; /* a negative amax */
        uint8_t blk[34];
        li_quantize_row_q8_0_ref(x, blk, 32);
        const float d = li_cu_fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        for (int j = 0; j < 32; j++) bad += f2u(li_cu_q8_value(x[j], amax)) != f2u((float)(int8_t)blk[2 + j] * d);
        for (int j = 0; j < 32; j++) bad_code += li_cu_q8_code(x[j], amax) != (int8_t)blk[2 + j];
        bad_code += f2u(li_cu_q8_dh(amax)) != f2u(d);
    }
    report(!bad, "q8 blocks: li_cu_q8_value is li_quantize_row_q8_0_ref's block dequantized, %d blocks (%d values "
           "differ)", NB, bad);
    report(!bad_code, "q8 blocks: li_cu_q8_code and li_cu_q8_dh are li_quantize_row_q8_0_ref's codes and d, %d "
           "blocks (%d differ)", NB, bad_code);
}

/* mma.m16n8k32 (s8 x s8 -> s32) with the PTX ISA's fragment tables, written
 * from them apart from cuda_math.h: lane l (g = l / 4, s = l % 4); A (16 x
 * 32, row) element a_i (byte i % 4 of register i / 4) at row g + 8 when
 * 4 <= i < 8 or i >= 12 (else g), column 4 s + i % 4, + 16 when i >= 8;
 * B (32 x 8, col) b_i at row 4 s + i % 4, + 16 when i >= 4, column g; C c_i
 * at row g, + 8 when i >= 2, column 2 s + i % 2. c += A . B */
static void mma_emulated(const uint32_t a[32][4], const uint32_t b[32][2], int32_t c[32][4]) {
    int8_t A[16][32], B[32][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, s = l & 3;
        for (int i = 0; i < 16; i++) {
            const int row = g + ((i >= 4 && i < 8) || i >= 12 ? 8 : 0), col = 4 * s + i % 4 + (i >= 8 ? 16 : 0);
            A[row][col] = (int8_t)(a[l][i / 4] >> (8 * (i % 4)));
        }
        for (int i = 0; i < 8; i++) B[4 * s + i % 4 + (i >= 4 ? 16 : 0)][g] = (int8_t)(b[l][i / 4] >> (8 * (i % 4)));
    }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            const int row = (l >> 2) + (i >= 2 ? 8 : 0), col = 2 * (l & 3) + i % 2;
            int32_t sum = 0;
            for (int kk = 0; kk < 32; kk++) sum += A[row][kk] * B[kk][col];
            c[l][i] += sum;
        }
}

static uint32_t word_at(const int8_t *p) {
    return (uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8 | (uint32_t)(uint8_t)p[2] << 16 |
           (uint32_t)(uint8_t)p[3] << 24;
}

enum { MMQ_WARPS_T = 8, MMQ_N_T = 64 }; /* k_mmq's MMQ_WARPS and MMQ_N */

/* k_mmq's thread block (r0, b0) for every warp and lane, as the kernel
 * runs it, the mma emulated; y(n, m) */
static void mmq_block(int t, const uint8_t *wd, int64_t row_bytes, int64_t m, int64_t k, const int8_t *xq,
                      const float *xds, int64_t n, int64_t r0, int64_t b0, float *y) {
    const int64_t nblk = k / 32, rem = n - b0;
    const int tiles = rem >= MMQ_N_T ? MMQ_N_T / 8 : (int)((rem + 7) / 8), bb = li_cu_blk_bytes(t);
    static float red[MMQ_WARPS_T][MMQ_N_T / 8 * 4][32];
    for (int warp = 0; warp < MMQ_WARPS_T; warp++) {
        float acc[32][MMQ_N_T / 8][4] = {{{0}}};
        for (int64_t blk = warp; blk < nblk; blk += MMQ_WARPS_T)
            for (int ti = 0; ti < tiles; ti++) {
                uint32_t a[32][4], b[32][2];
                int32_t c[32][4] = {{0}};
                float da[32], ma[32], db[32], mb[32];
                for (int l = 0; l < 32; l++) {
                    const int g = l >> 2, s = l & 3;
                    const uint8_t *pa = wd + (r0 + g < m ? r0 + g : m - 1) * row_bytes + blk * bb;
                    const uint8_t *pb = wd + (r0 + g + 8 < m ? r0 + g + 8 : m - 1) * row_bytes + blk * bb;
                    a[l][0] = li_cu_mmq_word(t, pa, s, 0), a[l][1] = li_cu_mmq_word(t, pb, s, 0);
                    a[l][2] = li_cu_mmq_word(t, pa, s, 1), a[l][3] = li_cu_mmq_word(t, pb, s, 1);
                    li_cu_mmq_scale(t, pa, &da[l], &ma[l]);
                    li_cu_mmq_scale(t, pb, &db[l], &mb[l]);
                    const int64_t cb = b0 + 8 * ti;
                    const int8_t *xb = xq + (cb + g < n ? cb + g : n - 1) * k + blk * 32;
                    b[l][0] = word_at(xb + 4 * s), b[l][1] = word_at(xb + 16 + 4 * s);
                }
                mma_emulated(a, b, c);
                for (int l = 0; l < 32; l++) {
                    const int64_t c0 = b0 + 8 * ti + 2 * (l & 3);
                    const float *x0 = xds + 2 * ((c0 < n ? c0 : n - 1) * nblk + blk);
                    const float *x1 = xds + 2 * ((c0 + 1 < n ? c0 + 1 : n - 1) * nblk + blk);
                    acc[l][ti][0] += li_cu_mmq_term(da[l], ma[l], x0[0], x0[1], c[l][0]);
                    acc[l][ti][1] += li_cu_mmq_term(da[l], ma[l], x1[0], x1[1], c[l][1]);
                    acc[l][ti][2] += li_cu_mmq_term(db[l], mb[l], x0[0], x0[1], c[l][2]);
                    acc[l][ti][3] += li_cu_mmq_term(db[l], mb[l], x1[0], x1[1], c[l][3]);
                }
            }
        for (int l = 0; l < 32; l++)
            for (int ti = 0; ti < MMQ_N_T / 8; ti++)
                for (int i = 0; i < 4; i++) red[warp][ti * 4 + i][l] = acc[l][ti][i];
    }
    for (int v = 0; v < MMQ_N_T / 8 * 4 * 32; v++) {
        const int ti = v / 32, l = v % 32, tt = ti / 4, i = ti % 4;
        const int64_t row = r0 + (l >> 2) + 8 * (i >> 1), col = b0 + 8 * tt + 2 * (l & 3) + (i & 1);
        if (row >= m || col >= n) continue;
        float sum = 0.0f;
        for (int wi = 0; wi < MMQ_WARPS_T; wi++) sum += red[wi][ti][l];
        y[col * m + row] = sum;
    }
}

static void test_mmq(void) {
    const li_type types[] = {LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0};
    const int64_t ks[] = {32, 96, 576, 37 * 32};
    const int64_t ns[] = {1, 9, 64, 70};
    enum { M = 37 };
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        double worst = 0;
        int unset = 0;
        for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++)
            for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
                const int64_t k = ks[ki], n = ns[ni], nblk = k / 32;
                test_weight tw;
                test_weight_make(&tw, types[ti], k, M, fill_rand);
                float *x = li_xmalloc((size_t)(n * k) * sizeof(float)), *xd = li_xmalloc((size_t)(n * k) * 4);
                float *xds = li_xmalloc((size_t)(n * nblk) * 2 * sizeof(float)), *wr = li_xmalloc((size_t)k * 4);
                float *y = li_xmalloc((size_t)(n * M) * sizeof(float));
                int8_t *xq = li_xmalloc((size_t)(n * k));
                for (int64_t j = 0; j < n * k; j++) x[j] = rng_f() * (j % 97 == 0 ? 40.0f : 2.0f);
                for (int64_t b = 0; b < n * nblk; b++) { /* k_act_q8c's block b; the reference's */
                    float amax = 0.0f;
                    int sum = 0;
                    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
                    for (int j = 0; j < 32; j++) sum += xq[b * 32 + j] = (int8_t)li_cu_q8_code(x[b * 32 + j], amax);
                    xds[2 * b] = li_cu_q8_dh(amax), xds[2 * b + 1] = xds[2 * b] * (float)sum;
                    uint8_t blk[34];
                    li_quantize_row_q8_0_ref(x + b * 32, blk, 32);
                    const float d = li_cu_fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                    for (int j = 0; j < 32; j++) xd[b * 32 + j] = (float)(int8_t)blk[2 + j] * d;
                }
                for (int64_t i = 0; i < n * M; i++) y[i] = NAN;
                for (int64_t r0 = 0; r0 < M; r0 += 16)
                    for (int64_t b0 = 0; b0 < n; b0 += MMQ_N_T)
                        mmq_block((int)types[ti], (const uint8_t *)tw.w.data, tw.w.row_bytes, M, k, xq, xds, n, r0,
                                  b0, y);
                double err = 0, ref2 = 0;
                for (int64_t r = 0; r < M; r++) {
                    li_weight_dequant_row_ref(&tw.w, r, wr);
                    for (int64_t b = 0; b < n; b++) {
                        double want = 0;
                        for (int64_t j = 0; j < k; j++) want += (double)wr[j] * xd[b * k + j];
                        unset += isnan(y[b * M + r]);
                        err += (y[b * M + r] - want) * (y[b * M + r] - want);
                        ref2 += want * want;
                    }
                }
                const double e = err / (ref2 > 0 ? ref2 : 1);
                worst = e > worst || e != e ? e : worst;
                free(x), free(xd), free(xds), free(wr), free(y), free(xq);
                test_weight_free(&tw);
            }
        report(worst < 1e-10 && !unset, "block GEMM %s (k_mmq, mma emulated), m %d, k of 1 to 37 blocks, 1/9/64/70 "
               "rows: against the reference's dot products with q8 activations, worst nmse %.2e < 1e-10, %d outputs "
               "unwritten", li_type_name(types[ti]), M, worst, unset);
    }
}

static void test_act_quant(void) {
    const li_act_quant acts[] = {LI_ACT_INT8, LI_ACT_FP8, LI_ACT_INT4};
    enum { K = 131 };
    float x[K], want[K], got[K];
    for (size_t a = 0; a < LI_ARRAY_LEN(acts); a++) {
        int bad = 0;
        for (int rep = 0; rep < 20; rep++) {
            for (int j = 0; j < K; j++) x[j] = rng_f() * (rep + 1);
            if (rep == 0) memset(x, 0, sizeof x); /* amax 0: inv 0 */
            li_act_quant_row_ref(acts[a], x, want, K);
            float amax = 0.0f;
            for (int j = 0; j < K; j++) amax = fmaxf(amax, fabsf(x[j]));
            const float s = amax / li_cu_act_divisor(acts[a]), inv = s > 0.0f ? 1.0f / s : 0.0f;
            for (int j = 0; j < K; j++) got[j] = li_cu_act_value(acts[a], x[j], s, inv);
            for (int j = 0; j < K; j++) bad += f2u(got[j]) != f2u(want[j]);
        }
        report(!bad, "activation quantization %s: li_act_quant_row_ref's bits (%d differ)", li_act_quant_name(acts[a]),
               bad);
    }
}

static void test_kv8(void) {
    enum { D = 64 };
    const li_type ts[] = {LI_KV_TYPE_FP8_E4M3, LI_KV_TYPE_INT8};
    for (size_t t = 0; t < LI_ARRAY_LEN(ts); t++) {
        int bad = 0;
        for (int rep = 0; rep < 50; rep++) {
            float x[D];
            for (int d = 0; d < D; d++) x[d] = rng_f() * (float)(rep * rep + 1) * 0.01f;
            if (rep == 0) memset(x, 0, sizeof x);
            uint8_t want[D], got[D];
            float ws, gs, inv;
            li_kv8_head_ref(ts[t], x, want, &ws, D);
            float amax = 0.0f;
            for (int d = 0; d < D; d++) amax = fmaxf(amax, fabsf(x[d]));
            gs = li_cu_kv8_scale(ts[t], amax, &inv);
            for (int d = 0; d < D; d++) got[d] = li_cu_kv8_encode(ts[t], x[d] * inv);
            bad += memcmp(got, want, D) != 0 || f2u(gs) != f2u(ws);
            for (int d = 0; d < D; d++) bad += f2u(li_cu_kv8_value(ts[t], got[d])) != f2u(li_kv8_code_value(ts[t], got[d]));
        }
        report(!bad, "8-bit KV %s: codes, scale and values of li_kv8_head_ref (%d heads differ)", li_type_name(ts[t]),
               bad);
    }
}

static void test_rope(void) {
    enum { N = 5, H = 3, D = 64 };
    for (int neox = 0; neox < 2; neox++) {
        for (int n_rot = 32; n_rot <= 64; n_rot += 32) {
            float x[N * H * D], want[N * H * D];
            int32_t pos[N] = {0, 1, 17, 300, 8191};
            for (int i = 0; i < N * H * D; i++) x[i] = want[i] = rng_f();
            li_backend ref = {.ops = li_backend_ref_ops(), .n_threads = 1};
            ref.ops->rope(&ref, want, pos, N, H, D, n_rot, 10000.0f, neox);
            /* k_rope's body per (token, head, pair) */
            const float ts = powf(10000.0f, -2.0f / (float)n_rot);
            const int half = n_rot / 2;
            for (int ih = 0; ih < N * H; ih++)
                for (int j = 0; j < half; j++) {
                    float *v = x + ih * D;
                    const float angle = li_cu_rope_angle((float)pos[ih / H], ts, j);
                    const float co = cosf(angle), si = sinf(angle);
                    const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
                    const float x0 = v[i0], x1 = v[i1];
                    v[i0] = x0 * co - x1 * si;
                    v[i1] = x0 * si + x1 * co;
                }
            int bad = 0;
            for (int i = 0; i < N * H * D; i++) bad += f2u(x[i]) != f2u(want[i]);
            report(!bad, "rope %s n_rot %d: the reference's bits (%d differ)", neox ? "neox" : "adjacent", n_rot, bad);
        }
    }
}

/* a random paged KV layer of n elements (head_dim D) of type dt: codes
 * across the 8-bit ranges with per-(slot, kv head) scales from scale0 up,
 * or values in [-2, 2) */
static li_kv_layer kv_random(li_type dt, size_t n, int D, float scale0) {
    const bool b8 = dt == LI_KV_TYPE_INT8 || dt == LI_KV_TYPE_FP8_E4M3;
    const size_t es = dt == LI_TYPE_F32 ? 4 : b8 ? 1 : 2;
    li_kv_layer kv = {.dtype = dt, .k = li_xmalloc(n * es), .v = li_xmalloc(n * es)};
    if (b8) {
        kv.k_scale = li_xmalloc(n / D * sizeof(float));
        kv.v_scale = li_xmalloc(n / D * sizeof(float));
        for (size_t e = 0; e < n / D; e++) {
            kv.k_scale[e] = scale0 * (1.0f + (float)(rng_u32() % 100) / 10.0f);
            kv.v_scale[e] = scale0 * (1.0f + (float)(rng_u32() % 100) / 10.0f);
        }
    }
    for (size_t e = 0; e < n; e++) {
        const float kx = rng_f() * 2.0f, vx = rng_f() * 2.0f;
        if (dt == LI_KV_TYPE_INT8) {
            ((uint8_t *)kv.k)[e] = (uint8_t)(int8_t)(rng_u32() % 255 - 127);
            ((uint8_t *)kv.v)[e] = (uint8_t)(int8_t)(rng_u32() % 255 - 127);
        } else if (dt == LI_KV_TYPE_FP8_E4M3) {
            ((uint8_t *)kv.k)[e] = li_cu_f32_to_fp8(kx * 100.0f);
            ((uint8_t *)kv.v)[e] = li_cu_f32_to_fp8(vx * 100.0f);
        } else if (dt == LI_TYPE_F32) {
            ((float *)kv.k)[e] = kx;
            ((float *)kv.v)[e] = vx;
        } else if (dt == LI_TYPE_BF16) {
            ((uint16_t *)kv.k)[e] = (uint16_t)(f2u(kx) >> 16);
            ((uint16_t *)kv.v)[e] = (uint16_t)(f2u(vx) >> 16);
        } else {
            ((uint16_t *)kv.k)[e] = li_fp32_to_fp16(kx);
            ((uint16_t *)kv.v)[e] = li_fp32_to_fp16(vx);
        }
    }
    return kv;
}

static void kv_free(li_kv_layer *kv) {
    free(kv->k);
    free(kv->v);
    free(kv->k_scale);
    free(kv->v_scale);
}

/* k_attention for token i, head h, with nw warps, on the host (lanes become
 * a loop over d; the shuffles' sums become plain sums) */
static void attn_emulated(const li_attn_args *a, int64_t i, int h, int nw, float *out) {
    const int D = a->head_dim, kvh = h / (a->n_head / a->n_head_kv);
    const li_type dt = a->kv->dtype;
    const bool b8 = dt == LI_KV_TYPE_INT8 || dt == LI_KV_TYPE_FP8_E4M3;
    const float *q = a->q + (i * a->n_head + h) * D;
    const int32_t *bt = a->block_table + (int64_t)a->seq[i] * a->bt_stride;
    const int64_t n_pos = (int64_t)a->pos[i] + 1;
    float m[8], l[8], acc[8][256];
    for (int w = 0; w < nw; w++) {
        m[w] = -INFINITY;
        l[w] = 0.0f;
        for (int d = 0; d < D; d++) acc[w][d] = 0.0f;
        for (int64_t p = w; p < n_pos; p += nw) {
            const int64_t e = ((int64_t)bt[p / a->block_size] * a->block_size + p % a->block_size) * a->n_head_kv + kvh;
            float s = 0.0f;
            for (int d = 0; d < D; d++) {
                const float kd = b8 ? li_cu_kv8_value(dt, ((const uint8_t *)a->kv->k)[e * D + d])
                                    : li_cu_fp16_to_f32(((const uint16_t *)a->kv->k)[e * D + d]);
                s += q[d] * kd;
            }
            s = b8 ? s * a->kv->k_scale[e] * a->scale : s * a->scale;
            float corr, wt;
            li_cu_softmax_step(&m[w], &l[w], s, &corr, &wt);
            const float wv = b8 ? wt * a->kv->v_scale[e] : wt;
            for (int d = 0; d < D; d++) {
                const float vd = b8 ? li_cu_kv8_value(dt, ((const uint8_t *)a->kv->v)[e * D + d])
                                    : li_cu_fp16_to_f32(((const uint16_t *)a->kv->v)[e * D + d]);
                acc[w][d] = acc[w][d] * corr + wv * vd;
            }
        }
    }
    float M = -INFINITY, L = 0.0f, f[8];
    for (int w = 0; w < nw; w++) M = fmaxf(M, m[w]);
    for (int w = 0; w < nw; w++) {
        f[w] = li_cu_merge_weight(m[w], l[w], M);
        L += l[w] * f[w];
    }
    for (int d = 0; d < D; d++) {
        float o = 0.0f;
        for (int w = 0; w < nw; w++) o += f[w] * acc[w][d];
        out[d] = o / L;
    }
}

static void test_attention(void) {
    enum { BS = 16, NBLK = 8, NKV = 3, NH = 9, D = 64, STRIDE = 3, N = 4 };
    const li_type dts[] = {LI_TYPE_F16, LI_KV_TYPE_INT8};
    const int32_t table[2 * STRIDE] = {5, 1, 7, 2, 6, 0}; /* holes: blocks 0, 3, 4 unused */
    const int32_t pos[N] = {0, 2, 40, 20}, seq[N] = {0, 1, 0, 1};
    for (size_t t = 0; t < LI_ARRAY_LEN(dts); t++) {
        const li_type dt = dts[t];
        const size_t n = (size_t)NBLK * BS * NKV * D;
        li_kv_layer kv = kv_random(dt, n, D, 0.01f);
        float *q = li_xmalloc((size_t)N * NH * D * sizeof(float)), *want = li_xmalloc((size_t)N * NH * D * sizeof(float));
        float got[N * NH * D];
        for (int j = 0; j < N * NH * D; j++) q[j] = rng_f();
        li_attn_args a = {.n_tokens = N, .n_head = NH, .n_head_kv = NKV, .head_dim = D, .block_size = BS, .q = q,
                          .out = want, .pos = pos, .seq = seq, .block_table = table, .bt_stride = STRIDE, .kv = &kv,
                          .scale = 0.125f};
        li_backend ref = {.ops = li_backend_ref_ops(), .n_threads = 1};
        ref.ops->attention(&ref, &a);
        const int warps[] = {1, 3, 4};
        for (size_t wi = 0; wi < LI_ARRAY_LEN(warps); wi++) {
            for (int64_t i = 0; i < N; i++)
                for (int h = 0; h < NH; h++) attn_emulated(&a, i, h, warps[wi], got + (i * NH + h) * D);
            const double e = nmse(got, want, N * NH * D);
            report(e < 1e-10, "attention walk, %d warps, %s KV, block table with holes: nmse %.2e < 1e-10", warps[wi],
                   li_type_name(dt), e);
        }
        kv_free(&kv);
        free(q);
        free(want);
    }
}

/* k_attn_tile on the host: the phases of attn_tile.h for every block (a
 * tile of tokens x a kv head), each phase for every thread in turn, as the
 * barriers between them allow; shared memory poisoned (NaN) first */
static void attn_tile_emulated(const li_at_args *a) {
    static li_at_shared sh;
    static float o[AT_THREADS][AT_ACC];
    const int g = a->n_head / a->n_head_kv, qt = li_at_tile_tokens(a->n_head, a->n_head_kv);
    for (int64_t t0 = 0; t0 < a->n_tokens; t0 += qt)
        for (int kvh = 0; kvh < a->n_head_kv; kvh++) {
            const int64_t t1 = t0 + qt < a->n_tokens ? t0 + qt : a->n_tokens;
            for (int64_t cur = t0; cur < t1;) {
                memset(&sh, 0xff, sizeof sh);
                li_at_segment(a, &sh, cur, t1);
                for (int t = 0; t < AT_THREADS; t++) li_at_load_q(a, &sh, t, kvh, o[t]);
                for (int32_t p0 = 0; p0 <= sh.maxpos; p0 += AT_KEYS) {
                    for (int t = 0; t < AT_THREADS; t++) li_at_load_kv(a, &sh, t, kvh, p0);
                    for (int t = 0; t < AT_THREADS; t++) li_at_scores(a, &sh, t, p0);
                    for (int t = 0; t < AT_THREADS; t++) li_at_softmax(a, &sh, t);
                    for (int t = 0; t < AT_THREADS; t++) li_at_pv(&sh, t, o[t]);
                }
                for (int t = 0; t < AT_THREADS; t++) li_at_finish(&sh, t, o[t]);
                for (int t = 0; t < AT_THREADS; t++) li_at_put(a, &sh, t, kvh);
                cur += sh.nrow / g;
            }
        }
}

static void test_attention_tiled(void) {
    enum { BS = 16, NBLK = 16, STRIDE = 8, N = 150, MAXH = 9, MAXD = 64 };
    /* three sequences' tables (holes: some blocks unused) */
    const int32_t table[3 * STRIDE] = {5, 1, 7, 2, 9, 11, 3, 0, 6, 0, 8, 4, 12, 15, 10, 13, 14, 3, 0, 0, 0, 0, 0, 0};
    int32_t pos[N], seq[N];
    /* seq 0: a chunk at positions 20..119; seqs 2 and 1: a decode token
     * each; seq 1: a chunk at 0..46 */
    for (int i = 0; i < 100; i++) seq[i] = 0, pos[i] = 20 + i;
    seq[100] = 2, pos[100] = 37;
    seq[101] = 1, pos[101] = 90;
    seq[102] = 2, pos[102] = 38;
    for (int i = 103; i < N; i++) seq[i] = 1, pos[i] = i - 103;
    const struct { int nh, nkv, d; } shapes[] = {{9, 3, 64}, {4, 1, 40}, {2, 2, 17}};
    const li_type dts[] = {LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_F32, LI_KV_TYPE_INT8, LI_KV_TYPE_FP8_E4M3};
    for (size_t si = 0; si < LI_ARRAY_LEN(shapes); si++)
        for (size_t ti = 0; ti < LI_ARRAY_LEN(dts); ti++) {
            const int NH = shapes[si].nh, NKV = shapes[si].nkv, D = shapes[si].d;
            const li_type dt = dts[ti];
            const bool b8 = dt == LI_KV_TYPE_INT8 || dt == LI_KV_TYPE_FP8_E4M3;
            li_kv_layer kv = kv_random(dt, (size_t)NBLK * BS * NKV * D, D, 0.002f);
            const size_t nq = (size_t)N * NH * D;
            float *q = li_xmalloc(nq * sizeof(float)), *want = li_xmalloc(nq * sizeof(float));
            float *got = li_xmalloc(nq * sizeof(float)), one[MAXH * MAXD];
            for (size_t j = 0; j < nq; j++) q[j] = rng_f();
            li_attn_args a = {.n_tokens = N, .n_head = NH, .n_head_kv = NKV, .head_dim = D, .block_size = BS,
                              .q = q, .out = want, .pos = pos, .seq = seq, .block_table = table,
                              .bt_stride = STRIDE, .kv = &kv, .scale = 1.0f / sqrtf((float)D)};
            li_backend ref = {.ops = li_backend_ref_ops(), .n_threads = 1};
            ref.ops->attention(&ref, &a);
            li_at_args t = {.q = q, .out = got, .pos = pos, .seq = seq, .bt = table, .bt_stride = STRIDE,
                            .n_tokens = N, .k = kv.k, .v = kv.v, .k_scale = b8 ? kv.k_scale : NULL,
                            .v_scale = b8 ? kv.v_scale : NULL, .n_head = NH, .n_head_kv = NKV, .D = D, .bs = BS,
                            .dt = (int)dt, .scale = a.scale};
            for (size_t j = 0; j < nq; j++) got[j] = NAN;
            attn_tile_emulated(&t);
            const double e = nmse(got, want, (int64_t)nq);
            /* each token alone (a tile of one): the bits it got in the batch */
            int alone_bad = 0;
            for (int i = 0; i < N; i += 7) {
                li_at_args t1 = t;
                t1.q = q + (size_t)i * NH * D, t1.out = one, t1.pos = pos + i, t1.seq = seq + i, t1.n_tokens = 1;
                attn_tile_emulated(&t1);
                alone_bad += memcmp(one, got + (size_t)i * NH * D, (size_t)NH * D * sizeof(float)) != 0;
            }
            report(e < 1e-10 && !alone_bad, "tiled attention, %d heads over %d, head_dim %d, %s KV, 150 tokens of "
                   "three sequences: nmse %.2e < 1e-10; tokens alone: %d of 22 differ", NH, NKV, D, li_type_name(dt),
                   e, alone_bad);
            kv_free(&kv);
            free(q);
            free(want);
            free(got);
        }
}

/* k_topk on the host: topk_row.h's phases for one row, each for every
 * thread in turn (nt threads), shared memory poisoned first */
static void topk_emulated(const float *row, int64_t dim, int k, int nt, float *vals, int32_t *ids) {
    static li_tk_shared sh;
    memset(&sh, 0xff, sizeof sh);
    li_tk_init(&sh, k);
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int t = 0; t < nt; t++) li_tk_clear(&sh, t, nt);
        for (int t = 0; t < nt; t++) li_tk_count(&sh, row, dim, shift, t, nt);
        li_tk_pick(&sh, shift);
    }
    for (int t = 0; t < nt; t++) li_tk_tally(&sh, row, dim, t, nt);
    li_tk_scan(&sh, nt);
    for (int t = 0; t < nt; t++) li_tk_gather(&sh, row, dim, k, t, nt);
    li_tk_sort(&sh, k);
    for (int t = 0; t < nt; t++) li_tk_store(&sh, k, vals, ids, t, nt);
}

static void test_topk(void) {
    const int64_t dims[] = {49157, 300, 70};
    const int ks[] = {1, 41, 64};
    enum { N = 5 };
    for (size_t di = 0; di < LI_ARRAY_LEN(dims); di++)
        for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++) {
            const int64_t dim = dims[di];
            const int k = ks[ki];
            float *x = li_xmalloc((size_t)(N * dim) * sizeof(float));
            for (int64_t j = 0; j < N * dim; j++) x[j] = rng_f() * 4.0f;
            for (int64_t j = 0; j < dim; j++) {
                x[1 * dim + j] = (float)((j * 7919) % 13) * 0.5f; /* ties everywhere */
                x[3 * dim + j] = j % 3 ? 0.0f : -0.0f;            /* all zero, signs mixed */
            }
            x[2 * dim + dim / 3] = NAN;
            float wv[N * 64], gv[64];
            int32_t wi[N * 64], gi[64];
            t_topk_ref(x, N, dim, k, wv, wi);
            int bad = 0;
            for (int r = 0; r < N; r++) {
                topk_emulated(x + r * dim, dim, k, TK_THREADS, gv, gi);
                if (r == 2) bad += gi[0] != -1; /* the NaN row: flagged */
                else bad += memcmp(gi, wi + r * k, (size_t)k * 4) || memcmp(gv, wv + r * k, (size_t)k * 4);
            }
            report(!bad, "topk k=%d of %lld (ties, -0/+0, a NaN row), %d threads: the full sort's ids and values "
                   "(%d rows differ)", k, (long long)dim, TK_THREADS, bad);
            free(x);
        }
}

/* gemv_blk (backend_cuda.cu) for the 32 lanes of a warp, in its order:
 * every lane's trip, the two shuffles as each group of four lanes' max;
 * acc[lane][b] (acc2 with row2) */
static void gemv_warp(int t, const uint8_t *row, const uint8_t *row2, int64_t k, const float *xb, int nb,
                      const float *nw, const float *inv, float acc[32][LI_CU_GEMV_NB],
                      float acc2[32][LI_CU_GEMV_NB]) {
    const int64_t nblk = k / 32, trips = (nblk + 7) / 8;
    for (int64_t it = 0; it < trips; it++) {
        float xv[32][LI_CU_GEMV_NB][8], am[32][LI_CU_GEMV_NB], wv[32][8], wv2[32][8];
        int in[32];
        for (int l = 0; l < 32; l++) {
            const int64_t blk = it * 8 + (l >> 2);
            in[l] = blk < nblk;
            const int64_t bq = in[l] ? blk : nblk - 1;
            int64_t o0, o1;
            li_cu_gemv_offs(t, bq, l & 3, &o0, &o1);
            li_cu_gemv_wv(t, row, bq, l & 3, wv[l]);
            if (row2) li_cu_gemv_wv(t, row2, bq, l & 3, wv2[l]);
            for (int b = 0; b < nb; b++) am[l][b] = li_cu_gemv_xv(xb + b * k, o0, o1, nw, nw ? inv[b] : 1.0f, xv[l][b]);
        }
        for (int l = 0; l < 32; l++)
            for (int b = 0; b < nb; b++) {
                const int g0 = l & ~3;
                const float amax = fmaxf(fmaxf(am[g0][b], am[g0 + 1][b]), fmaxf(am[g0 + 2][b], am[g0 + 3][b]));
                li_cu_gemv_round(xv[l][b], amax);
                if (in[l]) {
                    acc[l][b] += li_cu_gemv_dot8(wv[l], xv[l][b]);
                    if (row2) acc2[l][b] += li_cu_gemv_dot8(wv2[l], xv[l][b]);
                }
            }
    }
}

/* the block GEMV as k_gemv (x as it is), k_gemv_norm (rmsnorm on the way)
 * and k_gemv_norm under swiglu (silu(gate) * up), the warp's sums against
 * the reference: the rows dequantized, x (normalized by the kernel's
 * expression) rounded by li_quantize_row_q8_0_ref, dot products in double */
static void test_gemv_blk(void) {
    const li_type types[] = {LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0};
    const int64_t ks[] = {32, 160, 576, 37 * 32};
    const int nbs[] = {1, 3, 8};
    const char *modes[] = {"x as it is", "rmsnorm inside", "rmsnorm and swiglu inside"};
    enum { M = 9 };
    const float eps = 1e-5f;
    for (int mode = 0; mode < 3; mode++)
        for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
            double worst = 0;
            for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++)
                for (size_t ni = 0; ni < LI_ARRAY_LEN(nbs); ni++) {
                    const int64_t k = ks[ki];
                    const int nb = nbs[ni];
                    test_weight tw, tu;
                    test_weight_make(&tw, types[ti], k, M, fill_rand);
                    test_weight_make(&tu, types[ti], k, M, fill_rand);
                    float *x = li_xmalloc((size_t)(nb * k) * sizeof(float)), *xq = li_xmalloc((size_t)(nb * k) * 4);
                    float *nw = li_xmalloc((size_t)k * sizeof(float)), *wr = li_xmalloc((size_t)k * sizeof(float));
                    float *ur = li_xmalloc((size_t)k * sizeof(float)), inv[LI_CU_GEMV_NB] = {0};
                    for (int64_t j = 0; j < nb * k; j++) x[j] = rng_f() * (j % 53 == 0 ? 30.0f : 2.0f);
                    for (int64_t j = 0; j < k; j++) nw[j] = 0.5f + rng_f();
                    for (int b = 0; b < nb; b++) { /* the kernel's 1 / rms, its values, the reference's q8 */
                        double sum = 0;
                        for (int64_t j = 0; j < k; j++) sum += (double)(x[b * k + j] * x[b * k + j]);
                        inv[b] = 1.0f / sqrtf((float)(sum / (double)k) + eps);
                        for (int64_t j = 0; j < k; j++)
                            xq[b * k + j] = mode ? (x[b * k + j] * inv[b]) * nw[j] : x[b * k + j];
                        for (int64_t q = 0; q < k / 32; q++) {
                            uint8_t blk[34];
                            li_quantize_row_q8_0_ref(xq + b * k + q * 32, blk, 32);
                            const float d = li_cu_fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                            for (int j = 0; j < 32; j++) xq[b * k + q * 32 + j] = (float)(int8_t)blk[2 + j] * d;
                        }
                    }
                    double err = 0, ref2 = 0;
                    for (int64_t r = 0; r < M; r++) {
                        float acc[32][LI_CU_GEMV_NB] = {{0}}, acc2[32][LI_CU_GEMV_NB] = {{0}};
                        gemv_warp((int)types[ti], (const uint8_t *)tw.w.data + r * tw.w.row_bytes,
                                  mode == 2 ? (const uint8_t *)tu.w.data + r * tu.w.row_bytes : NULL, k, x, nb,
                                  mode ? nw : NULL, inv, acc, acc2);
                        li_weight_dequant_row_ref(&tw.w, r, wr);
                        li_weight_dequant_row_ref(&tu.w, r, ur);
                        for (int b = 0; b < nb; b++) {
                            float s = 0, s2 = 0;
                            for (int l = 0; l < 32; l++) s += acc[l][b], s2 += acc2[l][b];
                            double g = 0, u = 0;
                            for (int64_t j = 0; j < k; j++) {
                                g += (double)wr[j] * xq[b * k + j];
                                u += (double)ur[j] * xq[b * k + j];
                            }
                            const double want = mode == 2 ? g / (1.0 + exp(-g)) * u : g;
                            const double got = mode == 2 ? (double)li_cu_silu_mul(s, s2) : (double)s;
                            err += (got - want) * (got - want);
                            ref2 += want * want;
                        }
                    }
                    const double e = err / (ref2 > 0 ? ref2 : 1);
                    worst = e > worst || e != e ? e : worst;
                    free(x), free(xq), free(nw), free(wr), free(ur);
                    test_weight_free(&tw);
                    test_weight_free(&tu);
                }
            report(worst < 1e-10, "block GEMV %s, %s, k of 1 to 37 blocks, 1/3/8 rows: the warp's sums against the "
                   "reference's dot products with q8 inputs, worst nmse %.2e < 1e-10", li_type_name(types[ti]),
                   modes[mode], worst);
        }
}

/* li_cu_gemv8_lane (k_gemv's rows of the other types, no permutation) for
 * the 32 lanes of a warp, added up, against the reference dequantization's
 * dot products in double: plain f32 / f16 / bf16 and the schemes' codes
 * (W8A8, FP8, AWQ with zero points, INT4), k with and without a tail past
 * a multiple of 8, 1, 3 and 8 activation rows */
static void test_gemv8(void) {
    const struct { li_type t; li_scheme s; int64_t gs; bool zeros; } kinds[] = {
        {LI_TYPE_F32, LI_SCHEME_PLAIN, 0, false},  {LI_TYPE_F16, LI_SCHEME_PLAIN, 0, false},
        {LI_TYPE_BF16, LI_SCHEME_PLAIN, 0, false}, {LI_TYPE_F32, LI_SCHEME_W8A8, 0, false},
        {LI_TYPE_F32, LI_SCHEME_FP8, 0, false},    {LI_TYPE_F32, LI_SCHEME_AWQ, 32, true},
        {LI_TYPE_F32, LI_SCHEME_INT4, 0, false},
    };
    const int64_t ks[] = {67, 160, 576, 1000};
    const int nbs[] = {1, 3, 8};
    enum { M = 5 };
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kinds); ti++) {
        double worst = 0;
        const char *name = "";
        for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++)
            for (size_t ni = 0; ni < LI_ARRAY_LEN(nbs); ni++) {
                const bool u4 = kinds[ti].s == LI_SCHEME_AWQ || kinds[ti].s == LI_SCHEME_INT4;
                const int64_t k = ks[ki] + (u4 && ks[ki] % 2 ? 1 : 0); /* u4 rows: an even k */
                const int nb = nbs[ni];
                test_weight tw;
                if (kinds[ti].s == LI_SCHEME_PLAIN) test_weight_make(&tw, kinds[ti].t, k, M, fill_rand);
                else test_weight_scheme(&tw, kinds[ti].s, k, M, kinds[ti].gs, kinds[ti].zeros, false, rng_u32);
                const li_weight *w = &tw.w;
                name = w->scheme == LI_SCHEME_PLAIN ? li_type_name(w->type) : li_scheme_name(w->scheme);
                const int64_t ng = li_weight_n_groups(w), gs = w->group_size > 0 ? w->group_size : w->k;
                const float zero = w->scheme != LI_SCHEME_PLAIN ? li_scheme_info(w->scheme)->zero : 0.0f;
                float *x = li_xmalloc((size_t)(nb * k) * sizeof(float)), *wr = li_xmalloc((size_t)k * sizeof(float));
                for (int64_t j = 0; j < nb * k; j++) x[j] = rng_f() * 2.0f;
                double err = 0, ref2 = 0;
                for (int64_t r = 0; r < M; r++) {
                    float sum[LI_CU_GEMV_NB] = {0};
                    for (int lane = 0; lane < 32; lane++) {
                        float acc[LI_CU_GEMV_NB] = {0};
                        li_cu_gemv8_lane((int)w->type, (const uint8_t *)w->data + r * w->row_bytes, k,
                                         w->scheme != LI_SCHEME_PLAIN ? w->scales + r * ng : NULL,
                                         w->zeros ? w->zeros + r * ng : NULL, zero, gs, x, nb, lane, acc);
                        for (int b = 0; b < nb; b++) sum[b] += acc[b];
                    }
                    li_weight_dequant_row_ref(w, r, wr);
                    for (int b = 0; b < nb; b++) {
                        double want = 0;
                        for (int64_t j = 0; j < k; j++) want += (double)wr[j] * x[b * k + j];
                        err += (sum[b] - want) * (sum[b] - want);
                        ref2 += want * want;
                    }
                }
                const double e = err / (ref2 > 0 ? ref2 : 1);
                worst = e > worst || e != e ? e : worst;
                free(x);
                free(wr);
                test_weight_free(&tw);
            }
        report(worst < 1e-10, "GEMV of %s, 8 elements a lane, k of 67 to 1000, 1/3/8 rows: the warp's sums against "
               "the reference's dot products, worst nmse %.2e < 1e-10", name, worst);
    }
}

int main(void) {
    test_conversions();
    test_weight_rows();
    test_act_quant();
    test_kv8();
    test_rope();
    test_attention();
    test_attention_tiled();
    test_topk();
    test_gemv_blk();
    test_gemv8();
    test_q8_blocks();
    test_mmq();
    return t_summary("test_cuda_math");
}
