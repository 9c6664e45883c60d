/* calib.h — calibration: run a model over a text and hand every linear
 * layer's input rows to a callback.
 *
 * The forward pass is not touched: a capture backend (li_calib_backend)
 * shares the real backend's state and ops table, except that matmul,
 * matmul_multi and matmul_add first pass their input x (n, k) to the
 * callback, then run the real op. So calibration costs nothing when it is
 * not running, and sees exactly the activations inference computes.
 *
 * The inputs of one layer's seven weights are four distinct activations:
 *   LI_CALIB_QKV   attention-norm output, read by q, k and v (n_embd)
 *   LI_CALIB_O     attention output, read by o_proj (n_head*head_dim)
 *   LI_CALIB_GU    FFN-norm output, read by gate and up (n_embd)
 *   LI_CALIB_DOWN  silu(gate)*up, read by down_proj (n_ff)
 * The callback gets each once per forward call (the output matmul is not
 * reported). Helpers collect per-channel max |x| (SmoothQuant). */
#ifndef LI_CALIB_H
#define LI_CALIB_H

#include "model/model.h"

typedef enum li_calib_site {
    LI_CALIB_QKV = 0,
    LI_CALIB_O,
    LI_CALIB_GU,
    LI_CALIB_DOWN,
    LI_CALIB_N_SITES
} li_calib_site;

/* x: (n, k) rows of the input of site `site` of layer `layer` */
typedef void (*li_calib_fn)(void *ctx, int layer, li_calib_site site, const float *x, int64_t n, int64_t k);

typedef struct li_calib_opts {
    const char *path;     /* calibration text (UTF-8) */
    int64_t samples;      /* windows of seq_len tokens, consecutive from the start */
    int64_t seq_len;
    /* > 0: only blocks 0..n_layers-1 multiply; a later block's matmuls
     * write zeros (GPTQ's sequential calibration needs one block's inputs
     * and pays only for the blocks below it) */
    int n_layers;
    /* the samples x seq_len tokens li_calib_windows made from path, or NULL
     * (li_calib_run reads and tokenizes path): a caller running the same
     * windows again (GPTQ's sequential calibration, once per block) reads
     * the file once */
    const int32_t *windows;
} li_calib_opts;

/* The capture backend: the real backend's impl and ops table, with matmul,
 * matmul_multi and matmul_add first handing their input to fn (when not
 * NULL). `be` comes first, so an op handed &cb->be finds the wrapper; a
 * struct that embeds an li_calib_backend first can wrap more ops of
 * cb->ops the same way after init (prune.c wraps rmsnorm). Nothing to free. */
typedef struct li_calib_backend {
    li_backend be;              /* hand this to the session; ops = &ops */
    li_backend_ops ops;
    const li_backend_ops *real; /* the real backend's ops */
    const li_model *m;
    li_calib_fn fn;
    void *ctx;
    int n_layers;               /* li_calib_opts.n_layers */
} li_calib_backend;

void li_calib_backend_init(li_calib_backend *cb, const li_backend *real, const li_model *m, li_calib_fn fn, void *ctx);

/* The calibration windows of `who` ("quantize", "prune"): tokenizes the
 * text at o->path with m's tokenizer and returns its first samples *
 * seq_len tokens as *win (malloc'd), BOS at the start of every window when
 * the model adds one. Errors name the file: missing, empty, or shorter
 * than the windows need. */
int li_calib_windows(const li_model *m, const li_calib_opts *o, const char *who, int32_t **win, li_error *err);

/* Tokenizes the text at o->path with m's tokenizer, then evaluates
 * o->samples windows of o->seq_len tokens (BOS first when the model adds
 * one), each from an empty cache, on be (m prepared on it), calling fn for
 * every linear layer's input. Errors: a missing or empty file, fewer tokens
 * than samples * seq_len (naming both), a window over the model's context. */
int li_calib_run(li_model *m, li_backend *be, const li_calib_opts *o, li_calib_fn fn, void *ctx, li_error *err);

/* Per-channel max |x| of every site of every layer (SmoothQuant's
 * statistic): amax[layer][site] has the site's k floats. */
typedef struct li_calib_amax {
    int n_layer;
    int64_t k[LI_CALIB_N_SITES];
    float *amax;          /* (n_layer, sites, k[site]) flattened; see li_calib_amax_row */
    size_t off[LI_CALIB_N_SITES];
    size_t per_layer;
    int64_t rows;         /* rows seen at LI_CALIB_QKV of layer 0 (tokens) */
} li_calib_amax;

void li_calib_amax_init(li_calib_amax *a, const li_hparams *hp);
void li_calib_amax_free(li_calib_amax *a);
float *li_calib_amax_row(li_calib_amax *a, int layer, li_calib_site site);
/* an li_calib_fn (ctx: the li_calib_amax) */
void li_calib_amax_collect(void *ctx, int layer, li_calib_site site, const float *x, int64_t n, int64_t k);

#endif
