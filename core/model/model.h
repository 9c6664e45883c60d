/* model.h — a loaded Llama-family model: hyper-parameters from GGUF metadata
 * and weight views into the mapped file. The model owns the GGUF mapping and
 * its tokenizer; weights are read-only and shared by every sequence. */
#ifndef LI_MODEL_H
#define LI_MODEL_H

#include "util/common.h"
#include "model/gguf.h"
#include "backend.h"

struct li_tokenizer;

typedef struct li_hparams {
    char arch[32];       /* general.architecture, e.g. "llama" */
    int32_t n_vocab;
    int32_t n_ctx_train; /* context length the model was trained for */
    int32_t n_embd;      /* hidden size */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;    /* n_embd / n_head unless the file says otherwise */
    int32_t n_ff;        /* FFN inner size (the largest, when layers differ) */
    /* (n_layer) each block's FFN width when they differ (feed_forward_length
     * as an array, as llama.cpp reads it: a non-uniformly pruned model), or
     * NULL: every block n_ff. Owned by the model; li_hp_n_ff reads it. */
    const int32_t *n_ff_layer;
    int32_t n_rot;       /* rotary dims per head */
    float rope_theta;
    float norm_eps;
    int rope_neox;       /* 0: adjacent pairs (llama), 1: halves (neox) */
} li_hparams;

/* block l's FFN width */
static inline int32_t li_hp_n_ff(const li_hparams *hp, int l) { return hp->n_ff_layer ? hp->n_ff_layer[l] : hp->n_ff; }

typedef struct li_layer {
    const float *attn_norm;              /* (n_embd) */
    li_weight wq;                        /* (n_head*head_dim, n_embd) */
    li_weight wk, wv;                    /* (n_head_kv*head_dim, n_embd) */
    li_weight wo;                        /* (n_embd, n_head*head_dim) */
    const float *ffn_norm;               /* (n_embd) */
    li_weight w_gate, w_up;              /* (n_ff, n_embd) */
    li_weight w_down;                    /* (n_embd, n_ff) */
    const float *down_had;               /* (n_ff) signs of the online Hadamard before w_down, or NULL: not rotated */
} li_layer;

/* A block that reads another model's hidden states (an EAGLE draft,
 * spec/eagle.h): each row's hidden input hid is W_fc times the batch's
 * in_hidden row (in_width wide), or that row itself when it is n_embd wide
 * (a chain step feeding back the block's own output); the residual stream
 * starts at hid, and block 0's q/k/v read
 * z = [rmsnorm(E[token]; norm_e), rmsnorm(hid; norm_h)] (2 * n_embd). */
typedef struct li_model_inproj {
    li_weight fc;              /* (n_embd, in_width) */
    int32_t in_width;          /* the captured features' width: n_features * n_embd */
    const float *norm_e;       /* (n_embd) */
    const float *norm_h;       /* (n_embd) */
} li_model_inproj;

typedef struct li_model {
    li_gguf gguf;
    li_hparams hp;
    li_weight tok_embd;        /* (n_vocab, n_embd) */
    const float *output_norm;  /* (n_embd) */
    li_weight output;          /* (n_vocab, n_embd); the embedding when tied */
    li_layer *layers;          /* (n_layer) */
    struct li_tokenizer *tok;
    char *chat_template;       /* tokenizer.chat_template, NUL-terminated, or NULL */
    char *path;
    float **owned;             /* f32 copies of non-F32 norm weights, freed with the model */
    int32_t *n_ff_own;         /* hp.n_ff_layer's storage, or NULL */
    int n_owned;
    size_t weight_bytes;       /* bytes of all weight tensors */
    /* a file written by `luainfer quantize` with a weight scheme
     * (luainfer.quant.scheme): its I8 weight tensors are that scheme's codes,
     * with NAME.scale (and .zero, .perm) beside them (docs/quantization.md) */
    li_scheme quant_scheme;    /* LI_SCHEME_PLAIN for every other GGUF */
    int64_t quant_group;       /* luainfer.quant.group_size: 0 = per channel */
    /* A Hugging Face directory (hf.c): its mapped safetensors shards, or
     * NULL for a GGUF. Then `gguf` holds no metadata, only a tensor table
     * of the shards' tensors (GGUF dimension order) and their byte total
     * as its size, so what reads tensors (info) works unchanged. */
    struct li_hf *hf;
    /* a tensor-parallel shard view (dist/shard.h): the copied columns of its
     * row-parallel weights, which it owns (li_shard_model_free); else NULL */
    void **shard_copies;       /* (n_shard_copies) */
    int n_shard_copies;
    /* luainfer.quant.activations when it names another activation
     * quantization the scheme allows (W4A4: int4 on the INT4 scheme);
     * LI_ACT_F32: the scheme's own (li_scheme_traits.act) */
    li_act_quant quant_act;
    /* a rotated model (luainfer quantize --rotate): the residual stream lives
     * in a rotated basis (so do the hidden states handed out), and down_proj
     * reads silu(g)*u through the hadamard op in blocks of rot_block, with
     * each layer's signs (li_layer.down_had); 0: not rotated */
    int32_t rot_block;
    /* an EAGLE draft block's input projection, or NULL (every loaded model) */
    const li_model_inproj *inproj;
} li_model;

/* The rotation's metadata keys and tensors (docs/quant_rotation.md). */
#define LI_ROT_KEY_METHOD "luainfer.rotation.method"   /* "hadamard" */
#define LI_ROT_KEY_VERSION "luainfer.rotation.version" /* LI_ROT_VERSION */
#define LI_ROT_KEY_BLOCK "luainfer.rotation.down_block" /* the online Hadamard's block */
#define LI_ROT_KEY_SEED "luainfer.rotation.seed"       /* of the signs (what wrote them; the loader needs no RNG) */
#define LI_ROT_METHOD "hadamard"
#define LI_ROT_VERSION 1
#define LI_ROT_SIGNS_FMT "blk.%d.ffn_down_had"          /* F32 (n_ff) */

/* A clear one-line LI_EUNSUP when m is rotated: `what` (e.g. "prune") reads
 * or writes the residual stream's channels, which rotation mixes. */
int li_model_refuse_rotated(const li_model *m, const char *what, li_error *err);

/* path: a GGUF file, or a Hugging Face Llama directory (config.json,
 * *.safetensors, tokenizer.json; see hf.c). */
int li_model_load(li_model **out, const char *path, li_error *err);
void li_model_free(li_model *m);
/* Let the backend repack weights for its kernels (optional). */
int li_model_prepare(li_model *m, li_backend *be, li_error *err);
void li_model_release(li_model *m, li_backend *be);
/* The backend's weight_warm on every weight, in forward order (after the
 * options that decide how weights run are set: li_runtime_set_q4_act). */
void li_model_warm(li_model *m, li_backend *be);

/* hf.c: fills m (path set, all else zero) from a Hugging Face directory, and
 * frees what that added; li_model_load / li_model_free call them. */
int li_model_load_hf(li_model *m, const char *dir, li_error *err);
void li_model_free_hf(li_model *m);

/* The model path to use: explicit path, else $LUAINFER_MODEL, else the
 * default model under the source tree's models/. */
const char *li_model_default_path(const char *explicit_path);

#endif
