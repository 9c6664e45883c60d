/* runtime.h — what every entry point shares, below core/cli, core/lua and
 * core/server: a model (and optionally a draft model) opened with a
 * backend, and the exit path for an error. (Option parsing for the
 * subcommands: runtime/args.h.) */
#ifndef LI_RUNTIME_H
#define LI_RUNTIME_H

#include "model/model.h"

typedef struct li_runtime {
    li_model *model;
    li_model *draft;   /* NULL, or a draft model prepared on be (li_runtime_open_draft) */
    li_backend be;
    bool be_ready;
    struct li_medusa *medusa; /* NULL, or Medusa heads checked against model (li_runtime_open_medusa) */
    char *medusa_tree;        /* their tree (li_medusa_tree_parse), NULL = the default */
    struct li_eagle *eagle;   /* NULL, or an EAGLE draft checked against model (li_runtime_open_eagle) */
    bool cuda;                /* be is the CUDA backend (li_runtime_open_device "cuda") */
} li_runtime;

/* Loads the model (default path rules in li_model_default_path) and starts
 * the CPU backend with n_threads (<= 0: all cores) and the ISA override. */
int li_runtime_open(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa, li_error *err);
/* The same on a chosen device: NULL or "cpu" is li_runtime_open; "cuda" or
 * "cuda:N" the CUDA backend on device N (kernels/cuda/cuda_backend.h; isa
 * and n_threads unused), refused with the reason where there is none.
 * `flag` spells the option in messages ("--device" or "device"). */
int li_runtime_open_device(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa,
                           const char *device, const char *flag, li_error *err);
/* The backend's kernel name for reports: the CPU ISA, or "cuda". */
const char *li_runtime_isa(const li_runtime *rt);
/* Loads a draft model (engine/runner.h: it runs every step's batch next to
 * the target) from path and prepares it on the runtime's backend. Its
 * vocabulary must be the target's (LI_EINVAL, naming both sizes). The
 * runtime is left as it was on error; li_runtime_close frees the draft. */
int li_runtime_open_draft(li_runtime *rt, const char *path, li_error *err);
/* Loads Medusa heads (spec/medusa.h) made for the model, and checks the
 * tree spec (NULL: the default) against them; one-line errors. Not on a
 * batch-variant backend (--isa ggml). li_runtime_close frees them. */
int li_runtime_open_medusa(li_runtime *rt, const char *path, const char *tree, li_error *err);
/* Loads an EAGLE draft (spec/eagle.h) made for the model and prepares it on
 * the runtime's backend; one-line errors. Not on a batch-variant backend
 * (--isa ggml), nor with Medusa heads open. li_runtime_close frees it. */
int li_runtime_open_eagle(li_runtime *rt, const char *path, li_error *err);
/* Frees the draft (if any), the model and the backend. */
void li_runtime_close(li_runtime *rt);

/* Speculation settings from a command line or a Lua table into cfg, checked
 * against the open runtime (so serve refuses them before it listens):
 * method NULL picks layerskip when layers > 0, else medusa with heads, else
 * eagle with an EAGLE draft, else draft with a draft model, else ngram; k in [0, 16] (spec_tokens; 0 with
 * medusa chosen: 16, the tree's own size then bounds it); layers in [1, n_layer)
 * or 0 (spec_layers); speculation needs batch-invariant kernels. `flag`
 * says how the options are spelled in messages ("--spec-" or "spec_"). */
struct li_engine_config;
int li_runtime_spec_config(struct li_engine_config *cfg, const li_runtime *rt, const char *method, int64_t k,
                           int64_t layers, const char *flag, li_error *err);

/* How 4-bit group weights (awq, gptq, rtn4) multiply their activations:
 * NULL or "f32" (A16, the weights' own semantics and the reference's
 * bits), or "int8" (A8: int8 per row on the fly, li_backend_cpu_set_q4_act).
 * `flag` spells the option in messages ("--q4-act" or "q4_act"). int8 on
 * --isa ggml is refused (ggml's kernels do not run these weights). Then
 * the backend builds the mode's weight panels (li_model_warm; the model's
 * and an open draft's): call it after li_runtime_open_draft. */
int li_runtime_set_q4_act(li_runtime *rt, const char *q4_act, const char *flag, li_error *err);

/* Prints "luainfer: error: <msg>" to stderr and returns the exit status 1. */
int li_runtime_fail(const li_error *err);

#endif
