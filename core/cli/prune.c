/* prune.c — `luainfer prune --what W (--ratio R | --keep N) --rank K --calib FILE IN OUT.gguf` (core/prune/). */
#define _GNU_SOURCE
#include "runtime/args.h"
#include "cli/cli.h"
#include "prune/prune.h"

#include <errno.h>
#include <math.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int li_cmd_prune(int argc, char **argv) {
    const char *what = NULL, *rank = NULL, *calib = NULL, *refit_dtype = NULL, *ffn_alloc = "uniform";
    double ratio = 0, damp = 0.01, ffn_floor = NAN; /* NAN: not given (0.75 with --ffn-alloc error) */
    int64_t keep = 0, samples = 4, seq_len = 128, threads = 0, seed = 1;
    bool dry_run = false, json = false, help = false, refit = false, self_gen = false;
    li_opt opts[] = {
        {"what", LI_OPT_STR, &what, "layers, heads (whole KV groups) or ffn (intermediate channels) (required)"},
        {"ratio", LI_OPT_FLOAT, &ratio, "fraction of the model's parameters to remove, in (0, 1)"},
        {"keep", LI_OPT_INT, &keep, "layers kept, or KV groups / FFN channels kept per layer"},
        {"rank", LI_OPT_STR, &rank, "bi (block influence, layers), kld (layers, heads), act (heads, ffn) or obs (heads, "
                                    "ffn: Optimal Brain Surgeon with a least-squares refit) (default bi / act)"},
        {"refit", LI_OPT_FLAG, &refit, "heads, ffn: refit o_proj / down_proj's kept columns by least squares (obs does)"},
        {"refit-dtype", LI_OPT_STR, &refit_dtype, "refit and obs: the refit tensor's type, f16, bf16, q8_0, q4_0 or "
                                                  "q4_1 (default f16)"},
        {"ffn-alloc", LI_OPT_STR, &ffn_alloc, "ffn: uniform (the same channel count in every block), error (each "
                                              "block's count from its refit error curve) or kl (from each block's "
                                              "KL, measured cut alone at 4 widths); error and kl need --refit "
                                              "(default uniform)"},
        {"ffn-floor", LI_OPT_FLOAT, &ffn_floor, "--ffn-alloc error: the fewest channels a block keeps, a fraction of "
                                                "the uniform count in (0, 1] (default 0.75)"},
        {"damp", LI_OPT_FLOAT, &damp, "refit and obs: diagonal damping, a fraction of the mean (default 0.01)"},
        {"calib", LI_OPT_STR, &calib, "calibration text (this or --self-generate)"},
        {"self-generate", LI_OPT_FLAG, &self_gen, "calibrate on the model's own samples (--samples x --seq-len tokens, "
                                                  "temperature 1, --seed) instead of --calib"},
        {"seed", LI_OPT_INT, &seed, "--self-generate: the sampling seed (default 1)"},
        {"samples", LI_OPT_INT, &samples, "calibration windows (default 4)"},
        {"seq-len", LI_OPT_INT, &seq_len, "tokens per calibration window (default 128)"},
        {"threads", LI_OPT_INT, &threads, "compute threads (default: all cores)"},
        {"dry-run", LI_OPT_FLAG, &dry_run, "rank and predict the quality; write nothing"},
        {"json", LI_OPT_FLAG, &json, "print the scores, what was removed and the prediction as one JSON object"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[2];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 2, &n_pos, &err))) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("prune", "--what W (--ratio R | --keep N) [--rank K] (--calib FILE | --self-generate) IN.gguf OUT.gguf", opts, n_opts);
        return 0;
    }
    if (!what) return li_runtime_fail(&(li_error){LI_EINVAL, "prune: --what is required (layers, heads or ffn)"});
    if (n_pos != 2) return li_runtime_fail(&(li_error){LI_EINVAL, "prune: expected IN.gguf OUT.gguf"});
    li_prune_opts o = {.in = pos[0], .out = pos[1], .ratio = ratio, .keep = keep, .calib = calib,
                       .samples = samples, .seq_len = seq_len, .threads = threads, .dry_run = dry_run, .json = json,
                       .refit = refit, .damp = damp, .self_generate = self_gen, .seed = (uint64_t)seed};
    if ((rc = li_prune_what_parse(what, &o.what, &err))) return li_runtime_fail(&err);
    if (!strcmp(ffn_alloc, "error")) o.ffn_alloc = LI_PRUNE_ALLOC_ERROR;
    else if (!strcmp(ffn_alloc, "kl")) o.ffn_alloc = LI_PRUNE_ALLOC_KL;
    else if (strcmp(ffn_alloc, "uniform")) {
        li_error_set(&err, LI_EINVAL, "prune: --ffn-alloc must be uniform, error or kl (got '%s')", ffn_alloc);
        return li_runtime_fail(&err);
    }
    if (!isnan(ffn_floor) && o.ffn_alloc != LI_PRUNE_ALLOC_ERROR)
        return li_runtime_fail(&(li_error){LI_EINVAL, "prune: --ffn-floor bounds --ffn-alloc error's allocation; "
                                                      "give --ffn-alloc error"});
    o.ffn_floor = isnan(ffn_floor) ? 0.75 : ffn_floor;
    if (refit_dtype && (rc = li_prune_refit_type_parse(refit_dtype, &o.refit_type, &err))) return li_runtime_fail(&err);
    if (!rank) o.rank = o.what == LI_PRUNE_LAYERS ? LI_PRUNE_RANK_BI : LI_PRUNE_RANK_ACT;
    else if ((rc = li_prune_rank_parse(rank, &o.rank, &err))) return li_runtime_fail(&err);
    if (ratio != 0 && !(ratio > 0 && ratio < 1))
        return li_runtime_fail(&(li_error){LI_ERANGE, "prune: --ratio must be in (0, 1)"});
    if (keep < 0) return li_runtime_fail(&(li_error){LI_ERANGE, "prune: --keep must be positive"});
    if ((rc = li_cli_check_output("prune", o.out, &err))) return li_runtime_fail(&err);
    if ((rc = li_prune(&o, &err))) return li_runtime_fail(&err);
    return 0;
}
