/* test_kv_dtypes.c — the 8-bit KV cache dtypes (FP8 E4M3, INT8, with a f32
 * scale per token and kv head).
 *
 *   conversions  fp32 <-> E4M3 over all 256 codes, every rounding midpoint,
 *                saturation, NaN, signed zero, subnormals; nearest-code
 *                search on random values
 *   decode       every ISA decodes every code exactly (through attention
 *                over one position, where the softmax weight is exactly 1)
 *   encode       every ISA's 8-bit codes = the type table's from_float
 *   store        every ISA writes the reference's bytes and scales, odd
 *                head sizes and hostile rows (NaN, inf, zero, denormal)
 *                included; store -> load error within the documented bound
 *   attention    reference vs double precision over the dequantized cache;
 *                each ISA vs the reference: head_dim 64 / 128 (and 72 / 36
 *                for SIMD tails), GQA ratio 1 and 3, three sequences with
 *                scattered block tables, chunks crossing blocks
 *   invariance   a token's output is bit-identical alone or in any batch
 *   kv_cache     parse, names, bytes per token (scales included), scale
 *                arrays, copy-on-write copies scales; other dtypes refused
 *                by name at init
 * One line per check; the last line is the summary. */
#include "util/common.h"
#include "backend.h"
#include "cpu/kv_kernels.h"
#include "kv/kv_cache.h"
#include "test_util.h"

#include <math.h>
#include <string.h>

/* report(), rng_u32() / rng_f() (seeded in main), nmse(): test_util.h */
#define RNG_SEED 0x2545f4914f6cdd1dull

/* values with a wide spread per row, like real K: a few large channels */
static void fill_kv(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float v = rng_f() * scale;
        if (rng_u32() % 16 == 0) v *= 8.0f; /* outlier channel */
        x[i] = v;
    }
}

static const li_type kv8_types[] = {LI_KV_TYPE_FP8_E4M3, LI_KV_TYPE_INT8};
static const char *tname(li_type t) { return li_kv_dtype_name(t); }

/* ------------------------------------------------------------------------
 * FP8 E4M3 conversions
 * ---------------------------------------------------------------------- */

/* the value of code c from the E4M3 definition, in double */
static double e4m3_def(uint8_t c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static void test_fp8_conversions(void) {
    /* decode: every code against the definition */
    bool ok = true;
    int n_nan = 0;
    for (int c = 0; c < 256; c++) {
        const float f = li_fp8_e4m3_to_fp32((uint8_t)c);
        const double d = e4m3_def((uint8_t)c);
        if (d != d) {
            n_nan++;
            ok &= f != f;
        } else {
            ok &= (double)f == d && (signbit(f) != 0) == (c >> 7);
        }
    }
    report(ok && n_nan == 2, "e4m3 decode: all 256 codes match the definition (2 NaN codes, no infinities)");

    /* round trip: encode(decode(c)) == c for all 256 codes (NaNs keep their sign, -0 stays -0) */
    ok = true;
    for (int c = 0; c < 256; c++) ok &= li_fp32_to_fp8_e4m3(li_fp8_e4m3_to_fp32((uint8_t)c)) == c;
    report(ok, "e4m3 round trip: encode(decode(c)) == c for every code");

    /* fixed points */
    struct {
        float x;
        uint8_t c;
    } fixed[] = {{0.0f, 0x00},      {-0.0f, 0x80},      {1.0f, 0x38},        {-2.0f, 0xc0},      {0.5f, 0x30},
                 {448.0f, 0x7e},    {-448.0f, 0xfe},    {0x1p-9f, 0x01},     {0x1p-6f, 0x08},    {0x7p-9f, 0x07},
                 {449.0f, 0x7e},    {464.0f, 0x7e},     {480.0f, 0x7e},      {1e30f, 0x7e},      {INFINITY, 0x7e},
                 {-INFINITY, 0xfe}, {0x1p-10f, 0x00},   {-0x1p-10f, 0x80},   {0x3p-10f, 0x02},   {1e-30f, 0x00},
                 {1.0625f, 0x38},   {1.1875f, 0x3a},    {240.0f, 0x77},      {0x1.8p-10f, 0x01}, {3.4e38f, 0x7e}};
    ok = true;
    for (size_t i = 0; i < LI_ARRAY_LEN(fixed); i++) {
        const uint8_t got = li_fp32_to_fp8_e4m3(fixed[i].x);
        if (got != fixed[i].c) {
            ok = false;
            printf("     e4m3(%g) = 0x%02x, want 0x%02x\n", fixed[i].x, got, fixed[i].c);
        }
    }
    report(ok, "e4m3 encode: zeros, units, max 448, subnormals, saturation (448..inf -> 448), ties to even");
    report(li_fp32_to_fp8_e4m3(NAN) == 0x7f && li_fp32_to_fp8_e4m3(-NAN) == 0xff, "e4m3 encode: NaN -> 0x7f / 0xff");

    /* every midpoint between neighbouring finite codes: the tie goes to the
     * even code, one ulp either side to the nearer one; both signs */
    ok = true;
    for (int c = 0; c < 0x7e; c++) {
        const float lo = li_fp8_e4m3_to_fp32((uint8_t)c), hi = li_fp8_e4m3_to_fp32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2; /* exact: both have few bits */
        const int even = (c & 1) ? c + 1 : c;
        for (int s = 0; s < 2; s++) {
            const float sg = s ? -1.0f : 1.0f;
            const uint8_t sb = s ? 0x80 : 0;
            ok &= li_fp32_to_fp8_e4m3(sg * mid) == (sb | even);
            ok &= li_fp32_to_fp8_e4m3(sg * nextafterf(mid, INFINITY)) == (sb | (c + 1));
            ok &= li_fp32_to_fp8_e4m3(sg * nextafterf(mid, 0.0f)) == (sb | c);
        }
    }
    report(ok, "e4m3 encode: all 126 midpoints round to even, their neighbours to the nearer code");

    /* random values over the whole range: the code is the nearest (brute
     * force over all finite codes, ties to even), error within half a step */
    double table[256];
    for (int c = 0; c < 256; c++) table[c] = e4m3_def((uint8_t)c);
    ok = true;
    double worst_rel = 0;
    for (int it = 0; it < 200000 && ok; it++) {
        const float x = ldexpf(rng_f(), (int)(rng_u32() % 24) - 14); /* |x| in [2^-15, 2^9) */
        const uint8_t got = li_fp32_to_fp8_e4m3(x);
        /* nearest finite code of x's sign (0x7e / 0xfe when beyond 448), ties to the even code */
        const int base = signbit(x) ? 128 : 0;
        int best = -1;
        double bd = INFINITY;
        for (int c = base; c < base + 127; c++) {
            const double dd = fabs(table[c] - (double)x);
            if (dd < bd || (dd == bd && (c & 1) == 0)) bd = dd, best = c;
        }
        ok &= got == best;
        const double xa = fabs((double)x);
        if (xa >= 0x1p-6 && xa <= 448) worst_rel = fmax(worst_rel, fabs(li_fp8_e4m3_to_fp32(got) - x) / xa);
    }
    report(ok && worst_rel <= 1.0 / 16, "e4m3 encode: 200000 random values get the nearest code (worst relative "
                                        "error in the normal range %.4f <= 1/16)", worst_rel);

    /* INT8 code rounding */
    report(li_kv_int8_encode(0.5f) == 0 && li_kv_int8_encode(1.5f) == 2 && li_kv_int8_encode(-2.5f) == -2 &&
               li_kv_int8_encode(127.4f) == 127 && li_kv_int8_encode(300.0f) == 127 &&
               li_kv_int8_encode(-INFINITY) == -127 && li_kv_int8_encode(NAN) == 0,
           "int8 encode: ties to even, clamp to [-127, 127], NaN -> 0");
}

/* ------------------------------------------------------------------------
 * backends: the reference and every CPU ISA level this machine has
 * ---------------------------------------------------------------------- */

static li_backend bes[4];
static const char *be_names[4];
static int n_be;

static void backends_init(void) {
    bes[0] = (li_backend){.ops = li_backend_ref_ops(), .n_threads = 1};
    be_names[0] = "ref";
    n_be = 1;
    static const char *isas[] = {"scalar", "avx2", "avx512"};
    for (size_t i = 0; i < LI_ARRAY_LEN(isas); i++) {
        li_error err = {0};
        if (li_backend_cpu_init(&bes[n_be], 2, isas[i], &err) == 0) be_names[n_be++] = isas[i];
        else printf("skip isa %s: %s\n", isas[i], err.msg);
    }
}

typedef struct {
    li_kv_layer kv;
    size_t data_bytes, scale_count;
} kv8_buf;

static void kv8_alloc(kv8_buf *b, li_type t, int num_blocks, int block_size, int nkv, int D) {
    b->data_bytes = (size_t)num_blocks * block_size * nkv * D;
    b->scale_count = (size_t)num_blocks * block_size * nkv;
    b->kv = (li_kv_layer){.dtype = t,
                          .k = li_aligned_alloc(b->data_bytes),
                          .v = li_aligned_alloc(b->data_bytes),
                          .k_scale = li_xmalloc(b->scale_count * sizeof(float)),
                          .v_scale = li_xmalloc(b->scale_count * sizeof(float))};
    /* unwritten rows read as NaN: codes 0x7f (NaN in fp8; 127 in int8) and NaN scales */
    memset(b->kv.k, 0x7f, b->data_bytes);
    memset(b->kv.v, 0x7f, b->data_bytes);
    for (size_t i = 0; i < b->scale_count; i++) b->kv.k_scale[i] = b->kv.v_scale[i] = NAN;
}

static bool kv8_equal(const kv8_buf *a, const kv8_buf *b) {
    return !memcmp(a->kv.k, b->kv.k, a->data_bytes) && !memcmp(a->kv.v, b->kv.v, a->data_bytes) &&
           !memcmp(a->kv.k_scale, b->kv.k_scale, a->scale_count * sizeof(float)) &&
           !memcmp(a->kv.v_scale, b->kv.v_scale, a->scale_count * sizeof(float));
}

static void kv8_free(kv8_buf *b) {
    li_aligned_free(b->kv.k);
    li_aligned_free(b->kv.v);
    free(b->kv.k_scale);
    free(b->kv.v_scale);
}

static float deq(const li_kv_layer *kv, const void *codes, const float *scales, int64_t e, int D, int d) {
    return li_kv8_code_value(kv->dtype, ((const uint8_t *)codes)[e * D + d]) * scales[e];
}

/* ------------------------------------------------------------------------
 * decode through attention: one position, softmax weight exactly 1, so
 * out = v_scale * value(code) with no rounding
 * ---------------------------------------------------------------------- */

static void test_decode_all_isas(void) {
    const int D = 64, nkv = 1, nh = 1;
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kv8_types); ti++) {
        const li_type t = kv8_types[ti];
        kv8_buf b;
        kv8_alloc(&b, t, 4, 1, nkv, D);
        for (int blk = 0; blk < 4; blk++) {
            b.kv.k_scale[blk] = 0.0f;
            b.kv.v_scale[blk] = 1.0f;
            memset((uint8_t *)b.kv.k + blk * D, 0, (size_t)D);
            for (int d = 0; d < D; d++) ((uint8_t *)b.kv.v)[blk * D + d] = (uint8_t)(blk * D + d);
        }
        float q[64], out[64];
        for (int d = 0; d < D; d++) q[d] = rng_f();
        for (int be = 0; be < n_be; be++) {
            bool ok = true;
            for (int blk = 0; blk < 4; blk++) {
                int32_t table[] = {blk};
                const int32_t pos[] = {0}, seq[] = {0};
                li_attn_args a = {.n_tokens = 1, .n_head = nh, .n_head_kv = nkv, .head_dim = D, .block_size = 1,
                                  .q = q, .out = out, .pos = pos, .seq = seq, .block_table = table, .bt_stride = 1,
                                  .kv = &b.kv, .scale = 0.125f};
                bes[be].ops->attention(&bes[be], &a);
                for (int d = 0; d < D; d++) { /* -0 reads as +0: the output starts from 0 */
                    const float want = li_kv8_code_value(t, (uint8_t)(blk * D + d));
                    ok &= (out[d] != out[d] && want != want) || out[d] == want;
                }
            }
            report(ok, "decode %-4s %-6s: all 256 codes read back exactly", tname(t), be_names[be]);
        }
        kv8_free(&b);
    }
}

/* ------------------------------------------------------------------------
 * store
 * ---------------------------------------------------------------------- */

static void test_store(void) {
    const int dims[] = {64, 128, 72, 36, 20, 7};
    const int block_size = 4, num_blocks = 8, nkv = 3, n_tok = 11;
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kv8_types); ti++) {
        const li_type t = kv8_types[ti];
        for (size_t di = 0; di < LI_ARRAY_LEN(dims); di++) {
            const int D = dims[di];
            const int64_t row = (int64_t)nkv * D;
            float *k = li_xmalloc((size_t)n_tok * row * sizeof(float)), *v = li_xmalloc((size_t)n_tok * row * sizeof(float));
            fill_kv(k, n_tok * row, 3.0f);
            fill_kv(v, n_tok * row, 0.5f);
            /* hostile rows: token 1 head 0 all zero; token 2 head 1 a NaN
             * and a +inf; token 3 head 2 denormals only; token 4 head 0
             * huge; token 5 head 1 tiny normals */
            for (int d = 0; d < D; d++) {
                k[1 * row + 0 * D + d] = 0.0f;
                k[3 * row + 2 * D + d] = (d % 3 - 1) * 1e-41f;
                k[4 * row + 0 * D + d] = rng_f() * 3e38f;
                v[5 * row + 1 * D + d] = rng_f() * 1e-30f;
            }
            k[2 * row + 1 * D + 0] = NAN;
            k[2 * row + 1 * D + D - 1] = INFINITY;
            v[2 * row + 1 * D + D / 2] = -INFINITY;
            /* distinct slots scattered over the blocks (13 is coprime to the 32 slots) */
            int64_t slot[11];
            for (int i = 0; i < n_tok; i++) slot[i] = (i * 13 + 5) % (num_blocks * block_size);

            kv8_buf ref;
            kv8_alloc(&ref, t, num_blocks, block_size, nkv, D);
            bes[0].ops->kv_store(&bes[0], &ref.kv, k, v, slot, n_tok, nkv, D);
            for (int be = 1; be < n_be; be++) {
                kv8_buf got;
                kv8_alloc(&got, t, num_blocks, block_size, nkv, D);
                bes[be].ops->kv_store(&bes[be], &got.kv, k, v, slot, n_tok, nkv, D);
                report(kv8_equal(&got, &ref), "store %-4s %-6s dim %3d: the reference's bytes and scales", tname(t),
                       be_names[be], D);
                kv8_free(&got);
            }
            /* error bound on the ordinary rows (tokens 6..10): fp8 within
             * 1/16 relative in the normal range, 2^-10 scale below it; int8
             * within half a step (scale / 2) */
            double worst = 0;
            bool ok = true;
            for (int i = 6; i < n_tok; i++)
                for (int h = 0; h < nkv; h++) {
                    const int64_t e = slot[i] * nkv + h;
                    for (int w = 0; w < 2; w++) {
                        const float *x = (w ? v : k) + i * row + (int64_t)h * D;
                        const float *sc = w ? ref.kv.v_scale : ref.kv.k_scale;
                        float amax = 0;
                        for (int d = 0; d < D; d++) amax = fmaxf(amax, fabsf(x[d]));
                        ok &= fabsf(sc[e] - amax / (t == LI_KV_TYPE_INT8 ? 127.0f : 448.0f)) <= 1e-6f * amax;
                        for (int d = 0; d < D; d++) {
                            const double err = fabs((double)deq(&ref.kv, w ? ref.kv.v : ref.kv.k, sc, e, D, d) - x[d]);
                            const double bound = t == LI_KV_TYPE_INT8 ? sc[e] * 0.5 * (1 + 1e-4)
                                                                      : fmax(fabs(x[d]) / 16.0, sc[e] * 0x1p-10) * (1 + 1e-4);
                            ok &= err <= bound;
                            worst = fmax(worst, err / amax);
                        }
                    }
                }
            report(ok, "store %-4s dim %3d: scale = amax/%s, |x - x'| within bound (worst %.4f of amax)", tname(t), D,
                   t == LI_KV_TYPE_INT8 ? "127" : "448", worst);
            /* the hostile rows */
            const float *ks = ref.kv.k_scale, *vs = ref.kv.v_scale;
            const int64_t e1 = slot[1] * nkv + 0, e2 = slot[2] * nkv + 1, e3 = slot[3] * nkv + 2, e4 = slot[4] * nkv,
                          e5 = slot[5] * nkv + 1;
            bool zero_ok = ks[e1] == 0.0f, den_ok = ks[e3] == 0.0f;
            for (int d = 0; d < D; d++) {
                zero_ok &= deq(&ref.kv, ref.kv.k, ks, e1, D, d) == 0.0f;
                den_ok &= deq(&ref.kv, ref.kv.k, ks, e3, D, d) == 0.0f;
            }
            const float inf_back = deq(&ref.kv, ref.kv.k, ks, e2, D, D - 1);
            const float nan_back = deq(&ref.kv, ref.kv.k, ks, e2, D, 0);
            bool huge_ok = isfinite(ks[e4]);
            for (int d = 0; d < D; d++) huge_ok &= isfinite(deq(&ref.kv, ref.kv.k, ks, e4, D, d));
            report(zero_ok && den_ok && isfinite(ks[e2]) && inf_back > 1e37f && isfinite(vs[e2]) &&
                       (t == LI_KV_TYPE_INT8 ? nan_back == 0.0f : nan_back != nan_back) && huge_ok && vs[e5] > 0,
                   "store %-4s dim %3d: zero/denormal rows -> scale 0; inf -> largest; NaN -> %s; 3e38 rows finite",
                   tname(t), D, t == LI_KV_TYPE_INT8 ? "0" : "NaN");
            kv8_free(&ref);
            free(k);
            free(v);
        }
    }
}

/* ------------------------------------------------------------------------
 * attention
 * ---------------------------------------------------------------------- */

/* double precision over the dequantized cache */
static void attn_naive(const li_attn_args *a, float *out) {
    const int D = a->head_dim, nkv = a->n_head_kv;
    for (int64_t i = 0; i < a->n_tokens; i++)
        for (int h = 0; h < a->n_head; h++) {
            const int kvh = h / (a->n_head / nkv);
            const int64_t np = a->pos[i] + 1;
            double *s = li_xmalloc((size_t)np * sizeof(double)), mx = -INFINITY, sum = 0;
            const float *q = a->q + (i * a->n_head + h) * D;
            for (int64_t p = 0; p < np; p++) {
                const int64_t e =
                    ((int64_t)li_attn_blocks(a, i)[p / a->block_size] * a->block_size + p % a->block_size) * nkv + kvh;
                double d = 0;
                for (int x = 0; x < D; x++) d += (double)q[x] * deq(a->kv, a->kv->k, a->kv->k_scale, e, D, x);
                s[p] = d * a->scale;
                mx = fmax(mx, s[p]);
            }
            for (int64_t p = 0; p < np; p++) sum += (s[p] = exp(s[p] - mx));
            for (int x = 0; x < D; x++) {
                double o = 0;
                for (int64_t p = 0; p < np; p++) {
                    const int64_t e =
                        ((int64_t)li_attn_blocks(a, i)[p / a->block_size] * a->block_size + p % a->block_size) * nkv + kvh;
                    o += s[p] / sum * deq(a->kv, a->kv->v, a->kv->v_scale, e, D, x);
                }
                out[(i * a->n_head + h) * D + x] = (float)o;
            }
            free(s);
        }
}

static void test_attention(void) {
    const int block_size = 16, num_blocks = 40;
    enum { BT_STRIDE = 6 }; /* flat (3, BT_STRIDE) table, rows padded */
    const int32_t tables[3 * BT_STRIDE] = {7, 2, 19, 0, 0, 0, 5, 0, 0, 0, 0, 0, 30, 0, 11, 3, 25, 38};
    const int seq_len[] = {37, 16, 90};
    /* a prefill chunk of seq 0 crossing a block boundary, the last token of
     * seq 1, early and late tokens of seq 2 (first token, block edges) */
    const int32_t seq[] = {0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2};
    const int32_t pos[] = {30, 31, 32, 33, 34, 35, 36, 15, 0, 1, 15, 16, 47, 48, 89};
    const int64_t n_tokens = LI_ARRAY_LEN(seq);
    const struct {
        int n_head, n_head_kv, head_dim;
    } shapes[] = {{3, 3, 64}, {9, 3, 64}, {4, 4, 128}, {6, 2, 128}, {6, 2, 72}, {3, 1, 36}};
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kv8_types); ti++) {
        const li_type t = kv8_types[ti];
        for (size_t si = 0; si < LI_ARRAY_LEN(shapes); si++) {
            const int nh = shapes[si].n_head, nkv = shapes[si].n_head_kv, D = shapes[si].head_dim;
            kv8_buf b;
            kv8_alloc(&b, t, num_blocks, block_size, nkv, D);
            for (int s = 0; s < 3; s++) {
                const int L = seq_len[s];
                float *k = li_xmalloc((size_t)L * nkv * D * sizeof(float)), *v = li_xmalloc((size_t)L * nkv * D * sizeof(float));
                int64_t *slot = li_xmalloc((size_t)L * sizeof(int64_t));
                fill_kv(k, (int64_t)L * nkv * D, 2.0f);
                fill_kv(v, (int64_t)L * nkv * D, 1.0f);
                for (int p = 0; p < L; p++) slot[p] = (int64_t)tables[s * BT_STRIDE + p / block_size] * block_size + p % block_size;
                bes[0].ops->kv_store(&bes[0], &b.kv, k, v, slot, L, nkv, D);
                free(k);
                free(v);
                free(slot);
            }
            const int64_t len = n_tokens * nh * D;
            float *q = li_xmalloc((size_t)len * sizeof(float)), *want = li_xmalloc((size_t)len * sizeof(float));
            float *got = li_xmalloc((size_t)len * sizeof(float)), *one = li_xmalloc((size_t)nh * D * sizeof(float));
            for (int64_t j = 0; j < len; j++) q[j] = rng_f() * 1.5f;
            li_attn_args a = {.n_tokens = n_tokens, .n_head = nh, .n_head_kv = nkv, .head_dim = D,
                              .block_size = block_size, .q = q, .out = want, .pos = pos, .seq = seq,
                              .block_table = tables, .bt_stride = BT_STRIDE, .kv = &b.kv, .scale = 1.0f / sqrtf((float)D)};
            bes[0].ops->attention(&bes[0], &a);
            attn_naive(&a, got);
            report(nmse(want, got, len) < 1e-10, "attention ref %-4s heads %d/%d dim %3d: matches double precision (nmse %.1e)",
                   tname(t), nh, nkv, D, nmse(want, got, len));
            for (int be = 1; be < n_be; be++) {
                a.out = got;
                for (int64_t j = 0; j < len; j++) got[j] = NAN;
                bes[be].ops->attention(&bes[be], &a);
                const double e = nmse(got, want, len);
                report(e < 1e-9, "attention %-6s %-4s heads %d/%d dim %3d: nmse %.1e vs ref", be_names[be], tname(t),
                       nh, nkv, D, e);
                /* batch invariance: each token alone gives the same bits */
                bool inv = true;
                for (int64_t i = 0; i < n_tokens; i++) {
                    li_attn_args a1 = a;
                    a1.n_tokens = 1;
                    a1.q = q + i * nh * D;
                    a1.out = one;
                    a1.pos = pos + i;
                    a1.seq = seq + i;
                    bes[be].ops->attention(&bes[be], &a1);
                    inv &= !memcmp(one, got + i * nh * D, (size_t)nh * D * sizeof(float));
                }
                report(inv, "attention %-6s %-4s heads %d/%d dim %3d: each token alone is bit-identical to the batch",
                       be_names[be], tname(t), nh, nkv, D);
            }
            free(q);
            free(want);
            free(got);
            free(one);
            kv8_free(&b);
        }
    }
}

/* Storing a sequence token by token, in chunks, or in one call gives the
 * same bytes (the scale of a row depends on that row only). */
static void test_store_invariance(void) {
    const int D = 64, nkv = 3, L = 23, bs = 8;
    const int64_t row = (int64_t)nkv * D;
    float *k = li_xmalloc((size_t)L * row * sizeof(float)), *v = li_xmalloc((size_t)L * row * sizeof(float));
    fill_kv(k, L * row, 1.0f);
    fill_kv(v, L * row, 1.0f);
    int64_t slot[23];
    for (int p = 0; p < L; p++) slot[p] = (int64_t)((p / bs) * 2 + 1) * bs + p % bs;
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kv8_types); ti++)
        for (int be = 0; be < n_be; be++) {
            kv8_buf whole, parts;
            kv8_alloc(&whole, kv8_types[ti], 8, bs, nkv, D);
            kv8_alloc(&parts, kv8_types[ti], 8, bs, nkv, D);
            bes[be].ops->kv_store(&bes[be], &whole.kv, k, v, slot, L, nkv, D);
            for (int p0 = 0, n = 1; p0 < L; p0 += n, n = n % 5 + 1)
                bes[be].ops->kv_store(&bes[be], &parts.kv, k + p0 * row, v + p0 * row, slot + p0, LI_MIN(n, L - p0),
                                      nkv, D);
            report(kv8_equal(&whole, &parts), "store %-4s %-6s: one call, or chunks of 1..5 tokens, same bytes",
                   tname(kv8_types[ti]), be_names[be]);
            kv8_free(&whole);
            kv8_free(&parts);
        }
    free(k);
    free(v);
}

/* ------------------------------------------------------------------------
 * the paged pool
 * ---------------------------------------------------------------------- */

static void test_kv_cache(void) {
    li_error err = {0};
    li_type t;
    report(li_kv_dtype_parse("fp8", &t, &err) == 0 && t == LI_KV_TYPE_FP8_E4M3 && !strcmp(li_kv_dtype_name(t), "fp8"),
           "parse fp8");
    report(li_kv_dtype_parse("int8", &t, &err) == 0 && t == LI_KV_TYPE_INT8 && !strcmp(li_kv_dtype_name(t), "int8"),
           "parse int8");
    report(li_kv_dtype_parse("fp4", &t, &err) != 0 && strstr(err.msg, "fp8") && strstr(err.msg, "int8"),
           "unknown dtype: the message lists fp8 and int8");
    report(li_type_get(LI_KV_TYPE_FP8_E4M3) == NULL && li_type_get(LI_KV_TYPE_INT8) == NULL,
           "the KV ids are outside the GGUF type table");

    li_backend host_be = {.ops = li_backend_ref_ops()}; /* host buffers */
    li_kv_dims hp = {.n_layer = 30, .n_head_kv = 3, .head_dim = 64};
    const size_t f16 = li_kv_bytes_per_token(&hp, LI_TYPE_F16), fp8 = li_kv_bytes_per_token(&hp, LI_KV_TYPE_FP8_E4M3);
    report(fp8 == 2u * 30 * 3 * (64 + 4) && li_kv_bytes_per_token(&hp, LI_KV_TYPE_INT8) == fp8,
           "bytes per token: fp8 = int8 = 2 * layers * kv heads * (head_dim + 4) = %zu", fp8);
    report(fabs((double)fp8 / f16 - 0.53125) < 1e-9, "fp8 / f16 bytes per token = %.4f at head_dim 64", (double)fp8 / f16);
    hp.head_dim = 128;
    report(fabs((double)li_kv_bytes_per_token(&hp, LI_KV_TYPE_INT8) / li_kv_bytes_per_token(&hp, LI_TYPE_F16) - 0.515625) <
               1e-9,
           "int8 / f16 = 0.5156 at head_dim 128");
    report(li_kv_blocks_for_budget(&hp, LI_KV_TYPE_FP8_E4M3, 16, (size_t)1 << 30) >=
               2 * li_kv_blocks_for_budget(&hp, LI_TYPE_F16, 16, (size_t)1 << 30) * 96 / 100,
           "a budget holds ~1.94x the fp8 blocks of f16");

    hp = (li_kv_dims){.n_layer = 2, .n_head_kv = 3, .head_dim = 8};
    li_kv_cache kv;
    report(li_kv_cache_init(&kv, &host_be, &hp, LI_KV_TYPE_FP8_E4M3, 4, 6, &err) == 0, "init fp8 pool: %s", err.msg);
    bool ok = kv.scales != NULL && kv.bytes == li_kv_bytes_per_token(&hp, LI_KV_TYPE_FP8_E4M3) * 4 * 6;
    for (int l = 0; l < 2; l++) {
        ok &= kv.layers[l].dtype == LI_KV_TYPE_FP8_E4M3 && kv.layers[l].k_scale && kv.layers[l].v_scale;
        ok &= kv.layers[l].k_scale == kv.scales + (size_t)(2 * l) * 6 * 4 * 3;
        ok &= kv.layers[l].v_scale == kv.scales + (size_t)(2 * l + 1) * 6 * 4 * 3;
    }
    report(ok, "fp8 pool: scale arrays per layer [block][slot][kv_head], bytes = bytes/token * slots");
    /* copy-on-write copies codes and scales */
    li_kv_seq p, c;
    li_kv_seq_init(&p);
    li_kv_seq_init(&c);
    li_kv_seq_reserve(&kv, &p, 3);
    const int32_t b0 = p.blocks[0];
    uint8_t *k1 = kv.layers[1].k;
    float *vs1 = kv.layers[1].v_scale;
    k1[b0 * 4 * 3 * 8 + 5] = 0x42;
    vs1[b0 * 4 * 3 + 7] = 0.25f;
    li_kv_seq_fork(&kv, &p, &c);
    report(li_kv_seq_cow(&kv, &c, 2, 3) == 0 && c.blocks[0] != b0, "cow gives the child a fresh block");
    const int32_t b1 = c.blocks[0];
    report(k1[b1 * 4 * 3 * 8 + 5] == 0x42 && vs1[b1 * 4 * 3 + 7] == 0.25f, "cow copied the codes and the scales");
    li_kv_seq_release(&kv, &p);
    li_kv_seq_release(&kv, &c);
    li_kv_seq_free(&p);
    li_kv_seq_free(&c);
    li_kv_cache_free(&kv);
    report(li_kv_cache_init(&kv, &host_be, &hp, LI_TYPE_F16, 4, 6, &err) == 0 && kv.scales == NULL && !kv.layers[0].k_scale,
           "f16 pool: no scales");
    li_kv_cache_free(&kv);
}

/* Every ISA's head encoder (the SIMD ones encode 8 or 16 codes at a time)
 * against the type table's scalar from_float (kernels/types.c) applied to
 * x / scale: one encoding of each 8-bit type, whatever the ISA. */
static void test_encode_vs_table(void) {
    static const char *isas[] = {"scalar", "avx2", "avx512"};
    const int D = 72; /* 4 x 16 + a tail of 8: the vector loops and the scalar tail */
    float x[72];
    uint8_t got[72], want[72];
    for (size_t ti = 0; ti < LI_ARRAY_LEN(kv8_types); ti++) {
        const li_type t = kv8_types[ti];
        const li_type_traits *tt = li_type_info(t);
        for (int be = 1; be < n_be; be++) {
            const char *isa = NULL;
            for (size_t i = 0; i < LI_ARRAY_LEN(isas); i++)
                if (!strcmp(be_names[be], isas[i])) isa = isas[i];
            if (!isa) continue;
            const li_kv8_head_fn fn = li_kv8_head_for(isa);
            bool ok = tt && tt->from_float;
            for (int r = 0; r < 200 && ok; r++) {
                fill_kv(x, D, r % 2 ? 3.0f : 1e-3f);
                if (r == 7) x[5] = NAN;
                if (r == 9) x[70] = -INFINITY;
                float scale;
                fn(t, x, got, &scale, D);
                float amax = 0.0f;
                for (int d = 0; d < D; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
                float inv, y[72];
                ok &= li_kv8_scale(t, amax, &inv) == scale;
                for (int d = 0; d < D; d++) y[d] = x[d] * inv;
                tt->from_float(y, want, D);
                ok &= memcmp(got, want, (size_t)D) == 0;
            }
            report(ok, "encode %-4s %-6s: 200 rows = the type table's from_float of x / scale", tname(t), isa);
        }
    }
}

/* Types the kernels have no K/V code for are refused by li_kv_cache_init
 * (and its follower) with the type's name, before any kernel can see them;
 * the budget and bytes helpers give 0 for them. */
static void test_kv_unknown_dtypes(void) {
    li_backend host_be = {.ops = li_backend_ref_ops()};
    const li_kv_dims hp = {.n_layer = 2, .n_head_kv = 3, .head_dim = 8};
    static const li_type bad[] = {LI_TYPE_Q4_0, LI_TYPE_Q8_0, LI_TYPE_Q4_K, LI_TYPE_I8, LI_TYPE_F64, LI_TYPE_U4};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        li_kv_cache kv;
        li_error err = {0};
        const int rc = li_kv_cache_init(&kv, &host_be, &hp, bad[b], 4, 6, &err);
        report(rc == LI_EUNSUP && strstr(err.msg, li_type_name(bad[b])) && strstr(err.msg, "not supported"),
               "kv_cache_init refuses dtype %s: %s", li_type_name(bad[b]), err.msg);
        report(li_kv_bytes_per_token(&hp, bad[b]) == 0 && li_kv_blocks_for_budget(&hp, bad[b], 16, 1 << 20) == 0,
               "no bytes and no blocks for dtype %s", li_type_name(bad[b]));
    }
    /* an id outside the table: still a clear error, not a crash */
    li_kv_cache kv;
    li_error err = {0};
    report(li_kv_cache_init(&kv, &host_be, &hp, (li_type)200, 4, 6, &err) == LI_EUNSUP && strstr(err.msg, "unknown") &&
               strstr(err.msg, "200"),
           "kv_cache_init refuses type id 200: %s", err.msg);
    /* a follower takes the pool's (checked) dtype */
    li_kv_cache pool;
    err = (li_error){0};
    report(li_kv_cache_init(&pool, &host_be, &hp, LI_KV_TYPE_INT8, 4, 6, &err) == 0, "int8 pool: %s", err.msg);
    const li_kv_dims dd = {.n_layer = 1, .n_head_kv = 1, .head_dim = 8};
    report(li_kv_cache_init_follower(&kv, &pool, &host_be, &dd, &err) == 0 && kv.dtype == LI_KV_TYPE_INT8 &&
               kv.layers[0].k_scale != NULL,
           "follower of an int8 pool: int8 with scales: %s", err.msg);
    li_kv_cache_free(&kv);
    li_kv_cache_free(&pool);
}

int main(void) {
    rng_seed(RNG_SEED);
    test_fp8_conversions();
    backends_init();
    test_decode_all_isas();
    test_store();
    test_store_invariance();
    test_attention();
    test_kv_cache();
    test_kv_unknown_dtypes();
    test_encode_vs_table();
    for (int b = 1; b < n_be; b++) li_backend_cpu_free(&bes[b]);
    return t_summary("kv_dtypes");
}
