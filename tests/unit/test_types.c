/* test_types.c — the type table, weight schemes and type refusals.
 *
 *   table      every row (GGUF types and the non-GGUF code types 64..66):
 *              names, sizes, kinds, GGUF flag, activation pairing; the code
 *              types' to_float / from_float against independent decoders
 *   schemes    li_weight_dequant_row_ref and the reference matmul /
 *              get_rows of GPTQ (groups + zero points + permutation, k not
 *              a multiple of 32), AWQ, INT4, W8A8 and FP8 (per channel and
 *              per group) against plain double-precision transcriptions of
 *              the formulas in types.h; li_weight_check's refusals
 *   plain      a GGUF weight with the scheme fields empty computes exactly
 *              what its type's blocks say (bits)
 *   refusals   every CPU ISA and the ggml backend refuse in weight_prepare
 *              what they have no kernel for, with the ISA and type names;
 *              GGUF files with a non-GGUF type id or an unsupported weight
 *              type are refused naming the type; model prepare says which
 *              scheme a backend lacks (on the real model, if present)
 * One line per check; the last line is the summary. */
#define _GNU_SOURCE /* mkstemp, pread */
#include "util/common.h"
#include "backend.h"
#include "model/gguf.h"
#include "model/model.h"
#include "test_util.h"
#include "test_weight.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * harness
 * ---------------------------------------------------------------------- */

static uint32_t rand_u32(void) { return rng_u32(); }

/* stderr captured into a temporary file, to read what a backend logged */
static int cap_fd = -1, cap_saved = -1;
static char cap_path[64];

static void capture_begin(void) {
    fflush(stderr);
    strcpy(cap_path, "/tmp/li_test_types_XXXXXX");
    cap_fd = mkstemp(cap_path);
    cap_saved = dup(2);
    dup2(cap_fd, 2);
}

/* the text logged since capture_begin (static buffer) */
static const char *capture_end(void) {
    static char buf[4096];
    fflush(stderr);
    dup2(cap_saved, 2);
    close(cap_saved);
    const ssize_t n = pread(cap_fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(cap_fd);
    unlink(cap_path);
    return buf;
}

/* ------------------------------------------------------------------------
 * independent decoders (double precision, straight from the definitions)
 * ---------------------------------------------------------------------- */

/* E4M3 "FN": bias 7, S.1111.111 NaN, subnormals m/8 * 2^-6 */
static double fp8_value(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return c & 0x80 ? -v : v;
}

/* nearest finite E4M3 value, ties to the even code, saturating at 448 */
static double fp8_round(double x) {
    double best = 0.0, bd = INFINITY;
    int bc = 0;
    for (int c = 0; c < 0x7f; c++) {
        const double v = fp8_value((uint8_t)c), d = fabs(fabs(x) - v);
        if (d < bd || (d == bd && !(c & 1))) {
            bd = d;
            best = v;
            bc = c;
        }
    }
    (void)bc;
    return x < 0 ? -best : best;
}

static double code_value(li_type t, const uint8_t *row, int64_t j) {
    switch (t) {
    case LI_TYPE_U4: return (row[j / 2] >> (4 * (j % 2))) & 15;
    case LI_KV_TYPE_INT8: return (int8_t)row[j];
    case LI_KV_TYPE_FP8_E4M3: return fp8_value(row[j]);
    default: return NAN;
    }
}

/* row r of a scheme weight, in input-column order: types.h's formula */
static void dequant_row_d(const test_weight *tw, int64_t r, double *out) {
    const li_weight *w = &tw->w;
    const int64_t gs = w->group_size ? w->group_size : w->k;
    const int64_t ng = (w->k + gs - 1) / gs;
    const double zero0 = w->scheme == LI_SCHEME_INT4 ? 8.0 : 0.0;
    const uint8_t *row = (const uint8_t *)w->data + r * w->row_bytes;
    for (int64_t j = 0; j < w->k; j++) {
        const int64_t g = j / gs;
        const double z = w->zeros ? w->zeros[r * ng + g] : zero0;
        out[w->perm ? w->perm[j] : j] = (code_value(w->type, row, j) - z) * w->scales[r * ng + g];
    }
}

/* x as the activation quantization leaves it: s = amax / 127 (448), then
 * round-to-even(x / s) * s, or the nearest e4m3 of x / s, times s */
static void act_quant_d(li_act_quant act, const float *x, double *out, int64_t n) {
    double amax = 0.0;
    for (int64_t j = 0; j < n; j++) amax = fmax(amax, fabs(x[j]));
    for (int64_t j = 0; j < n; j++) {
        if (act == LI_ACT_F32) {
            out[j] = x[j];
            continue;
        }
        const double s = amax / (act == LI_ACT_INT8 ? 127.0 : 448.0);
        const double y = s > 0 ? x[j] / s : 0.0;
        out[j] = (act == LI_ACT_INT8 ? nearbyint(fmin(127.0, fmax(-127.0, y))) : fp8_round(y)) * s;
    }
}

/* ------------------------------------------------------------------------
 * the table
 * ---------------------------------------------------------------------- */

static void test_table(void) {
    int rows = 0, bad = 0;
    for (uint32_t id = 0; id < LI_TYPE_TABLE_SIZE; id++) {
        const li_type_traits *t = li_type_info(id);
        const bool assigned = (id < LI_TYPE_COUNT && id != 4 && id != 5) || (id >= 64 && id <= 66);
        if (!t) {
            bad += assigned;
            continue;
        }
        rows++;
        const bool ours = id >= 64;
        bad += !assigned || t->blck_size <= 0 || t->type_size == 0 || t->kind == LI_KIND_NONE ||
               t->gguf == ours || t->scaled != ours || (li_type_get(id) != NULL) != !ours ||
               strcmp(li_type_name(id), t->name);
        for (uint32_t o = 0; o < id; o++) /* names are unique */
            bad += li_type_info(o) && !strcmp(li_type_info(o)->name, t->name);
        /* the integer dots pair Q4_0 and Q8_0 with Q8_0, Q4_1 with Q8_1; all else is dequantized to f32 */
        const li_type want = id == LI_TYPE_Q4_0 || id == LI_TYPE_Q8_0 ? LI_TYPE_Q8_0
                             : id == LI_TYPE_Q4_1                     ? LI_TYPE_Q8_1
                                                                      : LI_TYPE_F32;
        bad += t->vec_dot_type != want || li_type_vec_dot_type((li_type)id) != want;
    }
    report(bad == 0 && rows == 29 + 3, "table: %d rows (29 GGUF ids, fp8_e4m3 / int8 / u4), consistent, unique names",
           rows);
    report(!li_type_info(4) && !li_type_info(31) && !li_type_info(63) && !li_type_info(LI_TYPE_TABLE_SIZE) &&
               !li_type_info(UINT32_MAX) && !strcmp(li_type_name(63), "unknown"),
           "table: retired and unassigned ids have no row");
    const li_type_traits *f8 = li_type_info(LI_KV_TYPE_FP8_E4M3), *i8 = li_type_info(LI_KV_TYPE_INT8),
                         *u4 = li_type_info(LI_TYPE_U4);
    report(f8 && f8->kind == LI_KIND_FP8 && i8 && i8->kind == LI_KIND_INT && u4 && u4->kind == LI_KIND_INT &&
               u4->blck_size == 2 && u4->type_size == 1 && li_type_info(LI_TYPE_Q4_0)->kind == LI_KIND_BLOCK &&
               li_type_info(LI_TYPE_BF16)->kind == LI_KIND_FLOAT && li_type_info(LI_TYPE_I8)->kind == LI_KIND_INT,
           "table: element kinds");
    size_t sz = 0;
    report(li_type_row_size(LI_TYPE_U4, 50, &sz) && sz == 25 && !li_type_row_size(LI_TYPE_U4, 51, &sz) &&
               li_type_row_size(LI_KV_TYPE_FP8_E4M3, 45, &sz) && sz == 45,
           "table: u4 rows take k/2 bytes, odd k refused; fp8 one byte each");

    /* code types against the independent decoders: every code */
    uint8_t codes[256], back[256];
    float vals[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    bad = 0;
    f8->to_float(codes, vals, 256);
    f8->from_float(vals, back, 256);
    for (int c = 0; c < 256; c++) {
        const bool nan = (c & 0x7f) == 0x7f;
        bad += nan ? !isnan(vals[c]) : (double)vals[c] != fp8_value((uint8_t)c) || (back[c] != c);
    }
    report(bad == 0, "fp8_e4m3: to_float of all 256 codes = the definition, from_float gives the codes back");
    bad = 0;
    i8->to_float(codes, vals, 256);
    i8->from_float(vals, back, 256);
    for (int c = 0; c < 256; c++) bad += vals[c] != (float)(int8_t)c || (c != 0x80 && back[c] != c) || (c == 0x80 && (int8_t)back[c] != -127);
    const float odd[] = {2.5f, -3.5f, 1000.0f, NAN};
    int8_t oc[4];
    i8->from_float(odd, oc, 4);
    report(bad == 0 && oc[0] == 2 && oc[1] == -4 && oc[2] == 127 && oc[3] == 0,
           "int8: codes round-trip, from_float rounds half to even, clamps to 127, NaN -> 0");
    bad = 0;
    u4->to_float(codes, vals, 256); /* 128 bytes' worth of nibbles: 256 elements from 128 codes */
    for (int j = 0; j < 256; j++) bad += vals[j] != (float)((codes[j / 2] >> (4 * (j % 2))) & 15);
    u4->from_float(vals, back, 256);
    bad += memcmp(back, codes, 128) != 0;
    const float u4odd[] = {-3.0f, 20.0f, 2.5f, 3.5f};
    uint8_t uc[2];
    u4->from_float(u4odd, uc, 4);
    report(bad == 0 && uc[0] == 0xf0 && uc[1] == 0x42,
           "u4: element 2j low nibble, 2j+1 high; round-trip; clamps to 0..15, ties to even");

    /* the scheme table */
    bad = 0;
    for (uint32_t s = 0; s < LI_SCHEME_COUNT; s++) bad += !li_scheme_info(s) || !li_scheme_info(s)->name;
    report(bad == 0 && !li_scheme_info(LI_SCHEME_COUNT) && !strcmp(li_scheme_name(LI_SCHEME_GPTQ), "gptq") &&
               !strcmp(li_scheme_name(99), "unknown") && li_scheme_info(LI_SCHEME_W8A8)->codes == LI_KV_TYPE_INT8 &&
               li_scheme_info(LI_SCHEME_FP8)->codes == LI_KV_TYPE_FP8_E4M3 &&
               li_scheme_info(LI_SCHEME_AWQ)->codes == LI_TYPE_U4 && li_scheme_info(LI_SCHEME_INT4)->zero == 8.0f &&
               !strcmp(li_act_quant_name(LI_ACT_INT8), "int8"),
           "schemes: names, code types, implicit zeros");
}

/* ------------------------------------------------------------------------
 * schemes against double-precision transcriptions
 * ---------------------------------------------------------------------- */

typedef struct {
    li_scheme scheme;
    int64_t k, m, group_size;
    bool zeros, perm;
} scheme_case;

static const scheme_case cases[] = {
    {LI_SCHEME_GPTQ, 50, 7, 16, true, true},   /* 3 groups of 16 and one of 2, act-order */
    {LI_SCHEME_GPTQ, 34, 5, 0, true, true},    /* per channel, permuted */
    {LI_SCHEME_AWQ, 96, 9, 32, true, false},
    {LI_SCHEME_INT4, 34, 6, 0, false, false},  /* per channel, implicit zero 8 */
    {LI_SCHEME_INT4, 70, 3, 20, false, false}, /* groups of 20, the last 10 */
    {LI_SCHEME_W8A8, 45, 11, 0, false, false}, /* per channel, int8 activations */
    {LI_SCHEME_W8A8, 45, 4, 15, false, false},
    {LI_SCHEME_FP8, 45, 6, 20, false, false},  /* groups of 20, the last 5; fp8 activations */
    {LI_SCHEME_FP8, 33, 5, 0, false, false},
};

static void test_schemes(void) {
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    li_backend scalar;
    li_error err = {0};
    const bool have_scalar = li_backend_cpu_init(&scalar, 2, "scalar", &err) == 0;
    if (!have_scalar) report(false, "cpu init scalar: %s", err.msg);
    for (size_t ci = 0; ci < LI_ARRAY_LEN(cases); ci++) {
        const scheme_case *c = &cases[ci];
        test_weight tw;
        test_weight_scheme(&tw, c->scheme, c->k, c->m, c->group_size, c->zeros, c->perm, rand_u32);
        char why[160] = "";
        const bool valid = li_weight_check(&tw.w, why, sizeof why) == 0;
        const int64_t k = c->k, m = c->m, n = 3;
        double *wd = li_xmalloc((size_t)(m * k) * sizeof(double));
        float *row = li_xmalloc((size_t)k * sizeof(float));
        double worst = 0.0;
        for (int64_t r = 0; r < m; r++) {
            dequant_row_d(&tw, r, wd + r * k);
            li_weight_dequant_row_ref(&tw.w, r, row);
            for (int64_t j = 0; j < k; j++) {
                const double e = fabs(row[j] - wd[r * k + j]) / (fabs(wd[r * k + j]) + 16.0 * tw.scales[0]);
                worst = fmax(worst, e);
            }
        }
        char what[96];
        snprintf(what, sizeof what, "%s k=%lld m=%lld group %lld%s%s", li_scheme_name(c->scheme), (long long)k,
                 (long long)m, (long long)c->group_size, c->zeros ? " zeros" : "", c->perm ? " perm" : "");
        report(valid && worst < 1e-6, "%s: dequant rows = the formula (worst rel. error %.2g)%s%s", what, worst,
               valid ? "" : "; check: ", why);

        /* matmul: y(n, m) = x'(n, k) · W(m, k)^T with x' the quantized activations */
        float *x = li_xmalloc((size_t)(n * k) * sizeof(float)), *y = li_xmalloc((size_t)(n * m) * sizeof(float));
        double *xd = li_xmalloc((size_t)k * sizeof(double));
        for (int64_t i = 0; i < n * k; i++) x[i] = rng_f() * (i % 7 == 0 ? 4.0f : 1.0f);
        ref->matmul(&ref_be, &tw.w, x, y, n);
        worst = 0.0;
        for (int64_t r = 0; r < n; r++) {
            act_quant_d(tw.w.act, x + r * k, xd, k);
            for (int64_t i = 0; i < m; i++) {
                double sum = 0.0, mag = 0.0;
                for (int64_t j = 0; j < k; j++) {
                    sum += xd[j] * wd[i * k + j];
                    mag += fabs(xd[j] * wd[i * k + j]);
                }
                worst = fmax(worst, fabs(y[r * m + i] - sum) / (mag + 1e-30));
            }
        }
        report(worst < 1e-5, "%s: reference matmul (activations %s) = the double-precision product (worst %.2g)",
               what, li_act_quant_name(tw.w.act), worst);

        /* get_rows: the dequantized rows */
        const int32_t ids[] = {(int32_t)(m - 1), 0, (int32_t)(m / 2)};
        float *got = li_xmalloc((size_t)(3 * k) * sizeof(float));
        ref->get_rows(&ref_be, &tw.w, ids, 3, got);
        bool ok = true;
        for (int i = 0; i < 3; i++) {
            li_weight_dequant_row_ref(&tw.w, ids[i], row);
            ok &= memcmp(row, got + i * k, (size_t)k * sizeof(float)) == 0;
        }
        report(ok, "%s: reference get_rows = li_weight_dequant_row_ref", what);

        /* the CPU backend's scalar ISA keeps them and runs the reference */
        if (have_scalar) {
            li_weight w = tw.w;
            float *y2 = li_xmalloc((size_t)(n * m) * sizeof(float));
            const int rc = scalar.ops->weight_prepare(&scalar, &w);
            scalar.ops->matmul(&scalar, &w, x, y2, n);
            report(rc == 0 && !memcmp(y, y2, (size_t)(n * m) * sizeof(float)),
                   "%s: cpu scalar prepares it and matches the reference bit for bit", what);
            scalar.ops->weight_release(&scalar, &w);
            free(y2);
        }
        free(got);
        free(xd);
        free(x);
        free(y);
        free(row);
        free(wd);
        test_weight_free(&tw);
    }
    if (have_scalar) li_backend_cpu_free(&scalar);
}

/* li_weight_requant_row_ref: a dequantized row gives its codes back, and
 * any row's codes are the nearest values the weight's own grid has (a
 * brute-force search over every code; clamped at the ends) */
static void test_requant(void) {
    for (size_t ci = 0; ci < LI_ARRAY_LEN(cases); ci++) {
        const scheme_case *c = &cases[ci];
        test_weight tw;
        test_weight_scheme(&tw, c->scheme, c->k, c->m, c->group_size, c->zeros, c->perm, rand_u32);
        const li_weight *w = &tw.w;
        const int64_t k = w->k, gs = w->group_size ? w->group_size : k, ng = (k + gs - 1) / gs;
        float *row = li_xmalloc((size_t)k * sizeof(float)), *out = li_xmalloc((size_t)k * sizeof(float)),
              *back = li_xmalloc((size_t)k * sizeof(float));
        uint8_t *codes = li_xmalloc(w->row_bytes);
        double *grid = li_xmalloc((size_t)k * sizeof(double));
        float *scratch = li_xmalloc((size_t)k * sizeof(float));
        bool same = true, nearest = true, values = true;
        int rc = 0;
        for (int64_t r = 0; r < w->m; r++) {
            li_weight_dequant_row_ref(w, r, row);
            rc |= li_weight_requant_row_ref(w, r, row, codes, out, scratch);
            same &= !memcmp(codes, (const uint8_t *)w->data + r * w->row_bytes, w->row_bytes) &&
                    !memcmp(out, row, (size_t)k * sizeof(float));
            /* moved off the grid by up to a few steps; some far past its ends */
            for (int64_t i = 0; i < k; i++) row[i] += (float)(rng_f() * (i % 11 == 0 ? 40.0 : 1.5) * tw.scales[r * ng]);
            rc |= li_weight_requant_row_ref(w, r, row, codes, out, scratch);
            test_weight view = tw;
            view.w.data = codes;
            view.w.m = 1;
            view.w.scales = w->scales + r * ng;
            view.w.zeros = w->zeros ? w->zeros + r * ng : NULL;
            dequant_row_d(&view, 0, grid);
            li_weight_dequant_row_ref(&view.w, 0, back);
            values &= !memcmp(back, out, (size_t)k * sizeof(float));
            for (int64_t j = 0; j < k && nearest; j++) { /* stored column j, input column i */
                const int64_t i = w->perm ? w->perm[j] : j, g = j / gs;
                const double sc = w->scales[r * ng + g];
                const double z = w->zeros ? w->zeros[r * ng + g] : w->scheme == LI_SCHEME_INT4 ? 8.0 : 0.0;
                double best = INFINITY;
                const int lo = w->type == LI_TYPE_U4 ? 0 : w->type == LI_KV_TYPE_INT8 ? -127 : 0;
                const int hi = w->type == LI_TYPE_U4 ? 15 : w->type == LI_KV_TYPE_INT8 ? 127 : 255;
                for (int cc = lo; cc <= hi; cc++) {
                    if (w->type == LI_KV_TYPE_FP8_E4M3 && (cc & 0x7f) == 0x7f) continue; /* NaN */
                    const double v = w->type == LI_KV_TYPE_FP8_E4M3 ? fp8_value((uint8_t)cc) : cc;
                    best = fmin(best, fabs((v - z) * sc - row[i]));
                }
                nearest &= fabs(grid[i] - row[i]) <= best + 1e-6 * fabs(sc) * (1.0 + fabs(row[i] / sc));
            }
        }
        report(rc == 0 && same && nearest && values,
               "%s k=%lld group %lld%s%s: requant gives a dequantized row its codes back; moved rows round to the "
               "grid's nearest value",
               li_scheme_name(c->scheme), (long long)k, (long long)c->group_size, c->zeros ? " zeros" : "",
               c->perm ? " perm" : "");
        free(grid);
        free(scratch);
        free(codes);
        free(back);
        free(out);
        free(row);
        test_weight_free(&tw);
    }
    li_weight plain = {.type = LI_TYPE_F32, .k = 4, .m = 1, .row_bytes = 16};
    float x[4] = {0}, o[4];
    uint8_t b[16];
    report(li_weight_requant_row_ref(&plain, 0, x, b, o, x) == -1, "requant refuses a plain weight");
}

static void test_weight_checks(void) {
    test_weight tw;
    char why[160];
    test_weight_scheme(&tw, LI_SCHEME_GPTQ, 50, 3, 16, true, true, rand_u32);
    li_weight w = tw.w;
    report(li_weight_check(&w, why, sizeof why) == 0, "check: a GPTQ weight with groups, zeros, perm is valid");
#define REFUSED(mutate, needle, label)                                                                  \
    do {                                                                                               \
        w = tw.w;                                                                                      \
        mutate;                                                                                        \
        why[0] = 0;                                                                                    \
        const int rc_ = li_weight_check(&w, why, sizeof why);                                          \
        report(rc_ != 0 && strstr(why, needle), "check refuses %s: \"%s\"", label, why);               \
    } while (0)
    REFUSED(w.scales = NULL, "need scales", "missing scales");
    REFUSED(w.type = LI_KV_TYPE_INT8, "u4 codes", "the wrong code type");
    REFUSED(w.act = LI_ACT_INT8, "activations", "another activation kind");
    REFUSED(w.group_size = 15, "group size", "an odd group size for u4");
    REFUSED(w.scheme = LI_SCHEME_AWQ, "permutation", "a permutation on AWQ");
    REFUSED(w.scheme = LI_SCHEME_INT4, "zero points", "zero points on INT4");
    REFUSED(w.scheme = (li_scheme)42, "unknown weight scheme", "an unknown scheme");
    int32_t dup[50];
    memcpy(dup, tw.perm, sizeof dup);
    dup[7] = dup[8];
    REFUSED(w.perm = dup, "not a permutation", "a permutation with a repeat");
    dup[7] = 50;
    REFUSED(w.perm = dup, "not a permutation", "a permutation out of range");
    REFUSED((w.scheme = LI_SCHEME_PLAIN, w.act = LI_ACT_F32), "plain", "plain u4 codes with scales");
    test_weight_free(&tw);
    test_weight plain;
    memset(&plain, 0, sizeof plain);
    plain.w = (li_weight){.type = LI_TYPE_Q8_0, .k = 64, .m = 2, .row_bytes = 68};
    report(li_weight_check(&plain.w, why, sizeof why) == 0, "check: a plain q8_0 weight is valid");
    plain.w.k = 48;
    report(li_weight_check(&plain.w, why, sizeof why) != 0 && strstr(why, "shape"),
           "check refuses a plain q8_0 row of 48: \"%s\"", why);
#undef REFUSED
}

/* ------------------------------------------------------------------------
 * plain (GGUF) weights are unchanged
 * ---------------------------------------------------------------------- */

static void fill_row(float *row, int64_t k) {
    for (int64_t j = 0; j < k; j++) row[j] = rng_f();
}

static void test_plain(void) {
    const li_type types[] = {LI_TYPE_Q4_0, LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_Q8_1, LI_TYPE_F32, LI_TYPE_F16,
                             LI_TYPE_BF16};
    const int64_t k = 96, m = 5, n = 2;
    const li_backend_ops *ref = li_backend_ref_ops();
    li_backend ref_be = {.ops = ref, .n_threads = 1};
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        const li_type t = types[ti];
        const li_type_traits *tr = li_type_info(t);
        test_weight tw;
        test_weight_make(&tw, t, k, m, fill_row);
        float x[2 * 96], y[2 * 5], want[2 * 5], row[96], wf[96];
        fill_row(x, n * k);
        bool ok = true;
        for (int64_t i = 0; i < m; i++) { /* the row: exactly the type's to_float */
            li_weight_dequant_row_ref(&tw.w, i, row);
            tr->to_float((const char *)tw.data + i * tw.w.row_bytes, wf, k);
            ok &= memcmp(row, wf, sizeof row) == 0;
        }
        /* the product: the type's own arithmetic (integer dots for the
         * quantized pairings, else an f32 dot of dequantized rows, in order) */
        const li_type at = tr->vec_dot_type;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < m; i++) {
                const char *wr = (const char *)tw.data + i * tw.w.row_bytes;
                if (at != LI_TYPE_F32) {
                    uint8_t qa[3 * 36];
                    li_type_info(at)->from_float(x + r * k, qa, k);
                    want[r * m + i] = t == LI_TYPE_Q4_0   ? li_vec_dot_q4_0_q8_0_ref(k, wr, qa)
                                      : t == LI_TYPE_Q4_1 ? li_vec_dot_q4_1_q8_1_ref(k, wr, qa)
                                                          : li_vec_dot_q8_0_q8_0_ref(k, wr, qa);
                } else {
                    tr->to_float(wr, wf, k);
                    float s = 0.0f;
                    for (int64_t j = 0; j < k; j++) s += x[r * k + j] * wf[j];
                    want[r * m + i] = s;
                }
            }
        ref->matmul(&ref_be, &tw.w, x, y, n);
        ok &= memcmp(y, want, sizeof y) == 0;
        report(ok && tw.w.scheme == LI_SCHEME_PLAIN && !tw.w.scales,
               "plain %s: rows and reference matmul are the type's own arithmetic, bit for bit", tr->name);
        test_weight_free(&tw);
    }
}

/* ------------------------------------------------------------------------
 * refusals: backends, GGUF files, the model
 * ---------------------------------------------------------------------- */

static void test_backend_refusals(void) {
    const char *isas[] = {"scalar", "avx2", "avx512", "ggml"};
    test_weight sw;
    test_weight_scheme(&sw, LI_SCHEME_AWQ, 64, 16, 32, true, false, rand_u32);
    for (size_t b = 0; b < LI_ARRAY_LEN(isas); b++) {
        li_backend be;
        li_error err = {0};
        if (li_backend_cpu_init(&be, 1, isas[b], &err)) {
            printf("skip %s: %s\n", isas[b], err.msg);
            continue;
        }
        const char *isa = li_backend_cpu_isa(&be);
        char want[96];
        /* a GGUF type with no kernel here (no matmul path at all) */
        li_weight w = {.type = LI_TYPE_Q5_K, .k = 256, .m = 4, .row_bytes = 176};
        capture_begin();
        int rc = be.ops->weight_prepare(&be, &w);
        const char *log = capture_end();
        snprintf(want, sizeof want, "cpu %s: no matmul kernel for q5_K weights", isa);
        report(rc == LI_EUNSUP && strstr(log, want), "%s refuses q5_K weights in weight_prepare: \"%s\"", isa, want);
        /* a non-GGUF code type without a scheme */
        w = (li_weight){.type = LI_KV_TYPE_FP8_E4M3, .k = 64, .m = 4, .row_bytes = 64};
        capture_begin();
        rc = be.ops->weight_prepare(&be, &w);
        log = capture_end();
        snprintf(want, sizeof want, "no matmul kernel for fp8_e4m3 weights");
        report(rc == LI_EUNSUP && strstr(log, want), "%s refuses plain fp8_e4m3 weights: \"%s\"", isa, want);
        /* a scheme weight: only the scalar ISA keeps it (for the reference) */
        w = sw.w;
        capture_begin();
        rc = be.ops->weight_prepare(&be, &w);
        log = capture_end();
        const bool scalar = !strcmp(isa, "scalar");
        snprintf(want, sizeof want, "cpu %s: no matmul kernel for awq weights (u4 codes)", isa);
        report(scalar ? rc == 0 : rc == LI_EUNSUP && strstr(log, want) != NULL, "%s %s awq weights%s%s%s", isa,
               scalar ? "keeps" : "refuses", scalar ? "" : ": \"", scalar ? "" : want, scalar ? "" : "\"");
        if (!rc && be.ops->weight_release) be.ops->weight_release(&be, &w);
        /* an inconsistent scheme weight is refused by every ISA */
        w = sw.w;
        w.scales = NULL;
        capture_begin();
        rc = be.ops->weight_prepare(&be, &w);
        log = capture_end();
        report(rc != 0 && strstr(log, "awq"), "%s refuses an awq weight without scales", isa);
        li_backend_cpu_free(&be);
    }
    test_weight_free(&sw);
}

/* A tiny GGUF v3 writer: u32/string metadata and tensors with given types
 * and byte sizes (zero data), enough for li_gguf_open and li_model_load's
 * checks before the tokenizer. */
typedef struct {
    uint8_t buf[8192];
    size_t len;
} gbuf;

static void put(gbuf *g, const void *p, size_t n) {
    memcpy(g->buf + g->len, p, n);
    g->len += n;
}
static void put_u32(gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(gbuf *g, uint64_t v) { put(g, &v, 8); }
static void put_str(gbuf *g, const char *s) {
    put_u64(g, strlen(s));
    put(g, s, strlen(s));
}

typedef struct {
    const char *name;
    uint64_t ne0, ne1;
    uint32_t type;
    uint64_t bytes;
} gtensor;

/* writes the file; returns its path (static) */
static const char *gguf_write(const char *const *u32_keys, const uint32_t *u32_vals, int n_u32, const gtensor *t,
                              int n_t) {
    static char path[64];
    static gbuf g;
    g.len = 0;
    put(&g, "GGUF", 4);
    put_u32(&g, 3);
    put_u64(&g, (uint64_t)n_t);
    put_u64(&g, (uint64_t)n_u32 + 1);
    put_str(&g, "general.architecture");
    put_u32(&g, 8); /* string */
    put_str(&g, "llama");
    for (int i = 0; i < n_u32; i++) {
        put_str(&g, u32_keys[i]);
        put_u32(&g, 4); /* uint32 */
        put_u32(&g, u32_vals[i]);
    }
    uint64_t off = 0;
    for (int i = 0; i < n_t; i++) {
        put_str(&g, t[i].name);
        put_u32(&g, 2);
        put_u64(&g, t[i].ne0);
        put_u64(&g, t[i].ne1);
        put_u32(&g, t[i].type);
        put_u64(&g, off);
        off += (t[i].bytes + 31) & ~(uint64_t)31;
    }
    while (g.len % 32) g.buf[g.len++] = 0;
    strcpy(path, "/tmp/li_test_types_XXXXXX");
    const int fd = mkstemp(path);
    if (write(fd, g.buf, g.len) != (ssize_t)g.len) perror("write");
    for (uint64_t i = 0; i < off; i++) {
        const uint8_t z = 0;
        if (write(fd, &z, 1) != 1) perror("write");
    }
    close(fd);
    return path;
}

static void test_gguf_refusals(void) {
    static const char *keys[] = {"llama.embedding_length", "llama.block_count", "llama.attention.head_count",
                                 "llama.feed_forward_length"};
    static const uint32_t vals[] = {256, 1, 4, 256};
    li_error err = {0};
    li_gguf g;

    /* the scaled code ids are table rows but no GGUF type */
    const uint32_t ours[] = {LI_KV_TYPE_FP8_E4M3, LI_KV_TYPE_INT8, LI_TYPE_U4};
    for (size_t i = 0; i < LI_ARRAY_LEN(ours); i++) {
        const gtensor t = {"a", 64, 1, ours[i], 64};
        const char *path = gguf_write(keys, vals, 4, &t, 1);
        memset(&err, 0, sizeof err);
        const int rc = li_gguf_open(&g, path, &err);
        if (!rc) li_gguf_free(&g);
        report(rc != 0 && strstr(err.msg, li_type_name(ours[i])) && strstr(err.msg, "not a GGUF type"),
               "gguf refuses a tensor of type id %u: \"%s\"", ours[i], err.msg);
        unlink(path);
    }

    /* a weight of a type with no reference: the model refuses it by name */
    const gtensor t[] = {{"token_embd.weight", 256, 8, LI_TYPE_Q5_K, 8 * 176}};
    const char *path = gguf_write(keys, vals, 4, t, 1);
    li_model *m = NULL;
    memset(&err, 0, sizeof err);
    const int rc = li_model_load(&m, path, &err);
    if (!rc) li_model_free(m);
    report(rc == LI_EUNSUP && strstr(err.msg, "q5_K") && strstr(err.msg, "token_embd.weight"),
           "model load refuses q5_K weights by name: \"%s\"", err.msg);
    unlink(path);
}

/* On the real model: one weight turned into a scheme weight is refused by
 * the SIMD ISAs at prepare, by the scheme's name, and kept by scalar. */
static void test_model_prepare(void) {
    const char *path = li_model_default_path(NULL);
    if (access(path, R_OK)) {
        printf("skip model prepare: %s not found\n", path);
        return;
    }
    li_model *m = NULL;
    li_error err = {0};
    if (li_model_load(&m, path, &err)) {
        report(false, "model load: %s", err.msg);
        return;
    }
    li_weight *wq = &m->layers[0].wq;
    const li_weight saved = *wq;
    test_weight sw;
    test_weight_scheme(&sw, LI_SCHEME_W8A8, wq->k, wq->m, 0, false, false, rand_u32);
    *wq = sw.w;
    const char *isas[] = {"avx512", "avx2", "scalar"};
    for (size_t i = 0; i < LI_ARRAY_LEN(isas); i++) {
        li_backend be;
        if (li_backend_cpu_init(&be, 1, isas[i], &err)) {
            printf("skip model prepare %s: %s\n", isas[i], err.msg);
            continue;
        }
        memset(&err, 0, sizeof err);
        capture_begin();
        const int rc = li_model_prepare(m, &be, &err);
        capture_end();
        /* per-channel w8a8 has kernels on every ISA now (kernels/cpu/w8.c) */
        report(rc == 0, "model prepare on cpu %s keeps a w8a8 weight%s%s", isas[i], rc ? ": " : "", err.msg);
        li_model_release(m, &be);
        /* per-group w8a8 has none: the SIMD ISAs refuse it by name */
        test_weight gw;
        test_weight_scheme(&gw, LI_SCHEME_W8A8, wq->k, wq->m, 64, false, false, rand_u32);
        *wq = gw.w;
        memset(&err, 0, sizeof err);
        capture_begin();
        const int grc = li_model_prepare(m, &be, &err);
        capture_end();
        if (!strcmp(isas[i], "scalar"))
            report(grc == 0, "model prepare on cpu scalar keeps a per-group w8a8 weight%s%s", grc ? ": " : "", err.msg);
        else
            report(grc == LI_EUNSUP && strstr(err.msg, "w8a8") && strstr(err.msg, "int8"),
                   "model prepare on cpu %s refuses a per-group w8a8 weight: \"%s\"", isas[i], err.msg);
        li_model_release(m, &be);
        test_weight_free(&gw);
        *wq = sw.w;
        li_backend_cpu_free(&be);
    }
    *wq = saved;
    test_weight_free(&sw);
    li_model_free(m);
}

int main(void) {
    test_table();
    test_schemes();
    test_requant();
    test_weight_checks();
    test_plain();
    test_backend_refusals();
    test_gguf_refusals();
    test_model_prepare();
    return t_summary("test_types");
}
