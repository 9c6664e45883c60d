/* quant4_driver.c — runs one 4-bit quantizer on a layer read from a file,
 * for tests/integration/test_quant4_ref.py (the NumPy references).
 *
 *   quant4_driver rtn|gptq|awq|w4a4|gptq-int8|gptq-fp8 IN OUT [--group G] [--sym]
 *                 [--act-order] [--no-clip] [--damp D] [--block B] [--chunk R] [--in-scale]
 *
 * gptq-int8 / gptq-fp8 run li_q8_gptq (one scale per row: n_groups 1, no
 * zeros); with --in-scale, IN carries SmoothQuant's s f32 (n_in) after X.
 * IN: int64 n_out, n_in, n_rows, then W f32 (n_out, n_in), X f32 (n_rows,
 * n_in), little-endian. The rows are accumulated --chunk rows at a time
 * (default 7: streaming in uneven chunks is part of what is tested).
 * OUT: int64 n_groups, has_zeros, has_perm, has_act_scale; codes u8
 * (n_out, n_in); scales f32 (n_out, n_groups); zeros f32 (same) if any;
 * perm i32 (n_in) if any; act_scale f32 (n_in) if any; f64 alpha, loss,
 * output error of the result, output error of RTN4 with the same grouping
 * (both li_q4_output_error). Exit 1 with a one-line error. */
#include "quant/quant4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *msg) {
    fprintf(stderr, "quant4_driver: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) return fail("usage: quant4_driver rtn|gptq|awq|w4a4|w4a4-gptq IN OUT [options]");
    li_q4_opts o;
    li_q4_opts_default(&o);
    int64_t chunk = 7;
    bool in_scale = false;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--group") && i + 1 < argc) o.group_size = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--sym")) o.symmetric = true;
        else if (!strcmp(argv[i], "--act-order")) o.act_order = true;
        else if (!strcmp(argv[i], "--no-clip")) o.clip = false;
        else if (!strcmp(argv[i], "--damp") && i + 1 < argc) o.damp = atof(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) o.block_size = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--in-scale")) in_scale = true;
        else return fail("unknown option");
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) return fail("cannot open the input");
    int64_t hdr[3];
    if (fread(hdr, sizeof hdr, 1, f) != 1 || hdr[0] <= 0 || hdr[1] <= 0 || hdr[2] < 0 || hdr[0] > 1 << 16 ||
        hdr[1] > 1 << 16 || hdr[2] > 1 << 24)
        return fail("bad input header");
    const int64_t n_out = hdr[0], n_in = hdr[1], n_rows = hdr[2];
    float *w = malloc((size_t)(n_out * n_in) * sizeof(float));
    float *x = malloc((size_t)(n_rows * n_in + 1) * sizeof(float));
    if (!w || !x || fread(w, sizeof(float), (size_t)(n_out * n_in), f) != (size_t)(n_out * n_in) ||
        fread(x, sizeof(float), (size_t)(n_rows * n_in), f) != (size_t)(n_rows * n_in))
        return fail("short input");
    double *s = NULL;
    if (in_scale) {
        float *sf = malloc((size_t)n_in * sizeof(float));
        s = malloc((size_t)n_in * sizeof(double));
        if (!sf || !s || fread(sf, sizeof(float), (size_t)n_in, f) != (size_t)n_in) return fail("short input");
        for (int64_t j = 0; j < n_in; j++) s[j] = sf[j];
        free(sf);
    }
    fclose(f);
    char why[256];
    li_q4_calib c;
    if (li_q4_calib_init(&c, n_in, why, sizeof why)) return fail(why);
    for (int64_t r = 0; r < n_rows; r += chunk) li_q4_calib_accumulate(&c, x + r * n_in, (chunk < n_rows - r ? chunk : n_rows - r));
    if (li_q4_calib_finish(&c, why, sizeof why)) return fail(why);
    li_q4_result res, rtn;
    int rc;
    if (!strncmp(argv[1], "gptq-", 5)) { /* the 8-bit grids: the same output layout, one group per row */
        const bool fp8 = !strcmp(argv[1], "gptq-fp8");
        if (!fp8 && strcmp(argv[1], "gptq-int8")) return fail("unknown method");
        uint8_t *codes = malloc((size_t)(n_out * n_in));
        float *scales = malloc((size_t)n_out * sizeof(float));
        if (!codes || !scales) return fail("out of memory");
        if (li_q8_gptq(w, n_out, n_in, &c, o.damp, fp8, s, codes, scales, why, sizeof why)) return fail(why);
        f = fopen(argv[3], "wb");
        if (!f) return fail("cannot write the output");
        const int64_t flags[4] = {1, 0, 0, 0};
        const double stats[4] = {0};
        fwrite(flags, sizeof flags, 1, f);
        fwrite(codes, 1, (size_t)(n_out * n_in), f);
        fwrite(scales, sizeof(float), (size_t)n_out, f);
        fwrite(stats, sizeof stats, 1, f);
        if (fclose(f)) return fail("cannot write the output");
        free(codes);
        free(scales);
        free(s);
        free(w);
        free(x);
        li_q4_calib_free(&c);
        return 0;
    }
    if (!strcmp(argv[1], "rtn")) rc = li_q4_rtn(w, n_out, n_in, &o, &res, why, sizeof why);
    else if (!strcmp(argv[1], "gptq")) rc = li_q4_gptq(w, n_out, n_in, &c, &o, &res, why, sizeof why);
    else if (!strcmp(argv[1], "awq")) rc = li_q4_awq(w, n_out, n_in, &c, &o, &res, why, sizeof why);
    else if (!strcmp(argv[1], "w4a4")) rc = li_q4_w4a4(w, n_out, n_in, NULL, 0, &res, why, sizeof why);
    else if (!strcmp(argv[1], "w4a4-gptq")) rc = li_q4_w4a4(w, n_out, n_in, &c, o.damp, &res, why, sizeof why);
    else return fail("unknown method");
    if (rc) return fail(why);
    if (li_q4_rtn(w, n_out, n_in, &o, &rtn, why, sizeof why)) return fail(why);
    const double stats[4] = {res.alpha, res.loss, li_q4_output_error(w, &res, &c), li_q4_output_error(w, &rtn, &c)};
    f = fopen(argv[3], "wb");
    if (!f) return fail("cannot write the output");
    const int64_t flags[4] = {res.n_groups, !!res.zeros, !!res.perm, !!res.act_scale};
    fwrite(flags, sizeof flags, 1, f);
    fwrite(res.codes, 1, (size_t)(n_out * n_in), f);
    fwrite(res.scales, sizeof(float), (size_t)(n_out * res.n_groups), f);
    if (res.zeros) fwrite(res.zeros, sizeof(float), (size_t)(n_out * res.n_groups), f);
    if (res.perm) fwrite(res.perm, sizeof(int32_t), (size_t)n_in, f);
    if (res.act_scale) fwrite(res.act_scale, sizeof(float), (size_t)n_in, f);
    fwrite(stats, sizeof stats, 1, f);
    if (fclose(f)) return fail("cannot write the output");
    li_q4_result_free(&res);
    li_q4_result_free(&rtn);
    li_q4_calib_free(&c);
    free(s);
    free(w);
    free(x);
    return 0;
}
