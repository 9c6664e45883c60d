/* quantize.c — `luainfer quantize --method M IN OUT.gguf` (core/quant/). */
#define _GNU_SOURCE
#include "runtime/args.h"
#include "cli/cli.h"
#include "quant/quantize.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int li_cmd_quantize(int argc, char **argv) {
    const char *method = NULL, *calib = NULL, *smooth = NULL;
    int64_t group = -1, samples = 32, seq_len = 512, threads = 0, rot_block = 0, rot_seed = 0;
    double alpha = 0.5, damp = 0.01;
    bool help = false, act_order = false, no_clip = false, gptq = false, alpha_search = false, rotate = false;
    bool sequential = false;
    li_opt opts[] = {
        {"method", LI_OPT_STR, &method, "f16, bf16, q8_0, q4_0, q4_1, w8a8 (int8 W8A8, SmoothQuant), fp8 (e4m3 W8A8), "
                                        "rtn4, awq, gptq (W4A16) or w4a4 (required)"},
        {"group", LI_OPT_INT, &group, "rtn4/awq/gptq: elements per scale group, dividing every row; 0 = one per row "
                                      "(default 128; SmolLM2's 576-wide rows take 64 or 192)"},
        {"calib", LI_OPT_STR, &calib, "calibration text (awq, gptq: required; w8a8: required unless --alpha 0 or --smooth none)"},
        {"samples", LI_OPT_INT, &samples, "calibration windows (default 32)"},
        {"seq-len", LI_OPT_INT, &seq_len, "tokens per calibration window (default 512)"},
        {"alpha", LI_OPT_FLOAT, &alpha, "SmoothQuant migration strength in [0, 1] (default 0.5; 0 = no smoothing)"},
        {"smooth", LI_OPT_STR, &smooth, "which SmoothQuant migrations: all (norms, v->o, up->down), norm (norms only), none "
                                        "(default all; none with --rotate)"},
        {"rotate", LI_OPT_FLAG, &rotate, "w8a8, the 4-bit methods (f16, bf16): QuaRot-style rotation first (norms "
                                         "folded, a Hadamard on the residual stream, an online one before down_proj; "
                                         "docs/quant_rotation.md)"},
        {"rotate-block", LI_OPT_INT, &rot_block, "--rotate: the online Hadamard's block, a power of two dividing n_ff "
                                                 "(default 128)"},
        {"rotate-seed", LI_OPT_INT, &rot_seed, "--rotate: seed of the random signs (default 0)"},
        {"damp", LI_OPT_FLOAT, &damp, "gptq: damping added to diag(H), a fraction of its mean (default 0.01)"},
        {"alpha-search", LI_OPT_FLAG, &alpha_search, "w8a8: SmoothQuant's alpha per layer and site, the one of 0, 0.1, "
                                                     "..., 1 whose int8 matmul errs least on calibration rows (instead of --alpha)"},
        {"gptq", LI_OPT_FLAG, &gptq, "w8a8, fp8, w4a4: the weights by GPTQ onto the scheme's grid (needs --calib; "
                                     "after SmoothQuant when it runs)"},
        {"act-order", LI_OPT_FLAG, &act_order, "gptq: quantize columns by decreasing diag(H)"},
        {"sequential", LI_OPT_FLAG, &sequential, "gptq: calibrate each block on the inputs the blocks quantized below "
                                                 "it give (the paper's order; slower: a calibration pass per block)"},
        {"no-clip", LI_OPT_FLAG, &no_clip, "awq: skip the clipping search"},
        {"threads", LI_OPT_INT, &threads, "calibration threads (default: all cores)"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[2];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 2, &n_pos, &err))) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("quantize", "--method M [options] IN.gguf OUT.gguf", opts, n_opts);
        return 0;
    }
    if (!method) return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --method is required"});
    if (n_pos != 2) return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: expected IN.gguf OUT.gguf"});
    li_quant_opts o = {.in = pos[0], .out = pos[1], .group = group < 0 ? 0 : group, .group_set = group != -1,
                       .calib = calib, .samples = samples, .seq_len = seq_len, .alpha = alpha, .threads = threads,
                       .damp = damp, .act_order = act_order, .sequential = sequential, .no_clip = no_clip,
                       .gptq_grid = gptq, .alpha_search = alpha_search, .rotate = rotate, .rot_block = rot_block,
                       .rot_seed = (uint64_t)rot_seed};
    if (!smooth) smooth = rotate ? "none" : "all";
    if ((rot_block || rot_seed) && !rotate)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --rotate-block and --rotate-seed apply with --rotate"});
    if (rot_block < 0 || rot_seed < 0)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --rotate-block and --rotate-seed must not be negative"});
    if ((rc = li_qmethod_parse(method, &o.method, &err))) return li_runtime_fail(&err);
    if (!strcmp(smooth, "all")) o.smooth = LI_SMOOTH_ALL;
    else if (!strcmp(smooth, "norm")) o.smooth = LI_SMOOTH_NORM;
    else if (!strcmp(smooth, "none")) o.smooth = LI_SMOOTH_NONE;
    else return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --smooth must be all, norm or none"});
    if (o.method != LI_QMETHOD_W8A8 && o.method != LI_QMETHOD_FP8) o.smooth = LI_SMOOTH_NONE; /* nothing to smooth */
    if (o.method == LI_QMETHOD_FP8 && !calib) o.smooth = LI_SMOOTH_NONE; /* fp8: smoothing only when asked */
    if (group < -1) return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --group must be positive (or 0)"});
    if (gptq && o.method != LI_QMETHOD_W8A8 && o.method != LI_QMETHOD_FP8 && o.method != LI_QMETHOD_W4A4)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --gptq applies to --method w8a8, fp8 and w4a4 (gptq "
                                                      "is its own method for grouped 4-bit)"});
    if (alpha_search && (o.method != LI_QMETHOD_W8A8 || o.smooth == LI_SMOOTH_NONE || !(alpha > 0)))
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --alpha-search applies to --method w8a8 with smoothing "
                                                      "(not --smooth none or --alpha 0)"});
    if (act_order && o.method != LI_QMETHOD_GPTQ)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --act-order applies to --method gptq only"});
    if (sequential && o.method != LI_QMETHOD_GPTQ)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --sequential applies to --method gptq only"});
    if (damp != 0.01 && o.method != LI_QMETHOD_GPTQ && !gptq)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --damp applies to --method gptq and to --gptq only"});
    if (no_clip && o.method != LI_QMETHOD_AWQ)
        return li_runtime_fail(&(li_error){LI_EINVAL, "quantize: --no-clip applies to --method awq only"});
    if (li_qmethod_needs_calib(&o) && !calib) {
        const bool q4 = li_qmethod_is_q4(o.method);
        li_error e = {LI_EINVAL, ""};
        snprintf(e.msg, sizeof e.msg, "quantize: --method %s%s needs --calib FILE%s", method, gptq ? " --gptq" : "",
                 q4 || gptq ? "" : " (or --alpha 0)");
        return li_runtime_fail(&e);
    }
    if ((rc = li_cli_check_output("quantize", o.out, &err))) return li_runtime_fail(&err);
    if ((rc = li_quantize(&o, &err))) return li_runtime_fail(&err);
    return 0;
}
