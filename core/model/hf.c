/* hf.c — loading a Llama-family Hugging Face directory. Owns: reading
 * config.json, mapping the safetensors shards (model.safetensors, or the
 * files model.safetensors.index.json names), binding HF tensor names onto
 * li_layer, and building the tokenizer from tokenizer.json with
 * tokenizer_config.json's special tokens and chat template.
 *
 * Weights stay in the mapping (BF16, F16 and F32 are li_weight types),
 * except the Q and K projections: Hugging Face orders each head's rows as
 * two halves (rotate_half), the kernels' rope rotates adjacent pairs, as
 * llama.cpp's GGUF converter arranges. Their rows are permuted into owned
 * copies (2 of 7 matrices per layer) so the forward is bit for bit the one
 * a GGUF of the same weights runs. AutoAWQ (GEMM) and GPTQ 4-bit
 * checkpoints are unpacked onto the AWQ / GPTQ weight schemes (codes,
 * scales, zero points, act-order permutation; the scalar reference runs
 * them). Everything the directory does not say
 * the way we compute (rope scaling, biases, sliding windows, other
 * activations, quantized checkpoints) is refused with a one-line error. */
#define _GNU_SOURCE
#include "model/model.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define HF_MAX_JSON (256u << 20) /* tokenizer.json of a 256k vocabulary is ~20 MiB */
#define HF_MAX_SHARDS 4096

typedef struct li_hf li_hf;

struct li_hf {
    li_safetensors *shards; /* (n_shards) */
    int n_shards;
    int32_t *eog;           /* config.json's eos_token_id(s) */
    int n_eog;
};

enum { HF_PLAIN, HF_AWQ, HF_GPTQ };

typedef struct hf_ctx {
    li_model *m;
    const char *dir;
    li_error *err;
    int quant;              /* HF_*: the decoder Linears' checkpoint layout */
    int64_t group;          /* quantization group along k; 0: per channel */
    int zero_offset;        /* GPTQ v1 stores zero points minus one */
    char path[4096];        /* scratch: dir/name */
} hf_ctx;

/* ==== files ===================================================================== */

static const char *join(hf_ctx *c, const char *name) {
    int n = snprintf(c->path, sizeof c->path, "%s/%s", c->dir, name);
    if (n < 0 || (size_t)n >= sizeof c->path) snprintf(c->path, sizeof c->path, "(path too long)/%s", name);
    return c->path;
}

static bool exists(hf_ctx *c, const char *name) { return access(join(c, name), F_OK) == 0; }

/* Parses dir/name; returns 1 when optional and absent. */
static int read_json(hf_ctx *c, const char *name, bool required, cJSON **out) {
    *out = NULL;
    if (!exists(c, name)) {
        if (!required) return 1;
        return li_error_set(c->err, LI_EINVAL, "hf: %s: missing (a Hugging Face model directory needs it)", c->path);
    }
    char *buf;
    size_t len;
    int rc = li_read_file(c->path, HF_MAX_JSON, "JSON file", &buf, &len, c->err);
    if (rc) return rc;
    *out = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return li_error_set(c->err, LI_EINVAL, "hf: %s: not a valid JSON object", c->path);
    }
    return 0;
}

/* ==== config.json ================================================================= */

static const cJSON *item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* A positive integer <= 2^24; `def` < 0 means required. */
static int cfg_int(hf_ctx *c, const cJSON *cfg, const char *key, int32_t def, int32_t *out) {
    const cJSON *v = item(cfg, key);
    if (!v) {
        if (def < 0) return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: '%s' is missing", c->dir, key);
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 1 && d <= (1 << 24)) || (double)(int32_t)d != d)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: '%s' is not a positive integer up to 2^24", c->dir, key);
    *out = (int32_t)d;
    return 0;
}

static int cfg_pos(hf_ctx *c, const cJSON *v, const char *key, float *out) {
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !(v->valuedouble < 1e30))
        return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: '%s' is not a positive number", c->dir, key);
    *out = (float)v->valuedouble;
    return 0;
}

/* A rope_scaling / rope_parameters object is fine only as plain rope. */
static int check_rope(hf_ctx *c, const cJSON *r, const char *key) {
    if (!r) return 0;
    if (!cJSON_IsObject(r)) return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: '%s' is not an object", c->dir, key);
    const cJSON *t = item(r, "rope_type");
    if (!t) t = item(r, "type");
    if (t && (!cJSON_IsString(t) || strcmp(t->valuestring, "default") != 0))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: rope scaling '%.32s' is not supported yet", c->dir,
                            cJSON_IsString(t) ? t->valuestring : "?");
    const cJSON *f = item(r, "factor");
    if (f && !(cJSON_IsNumber(f) && f->valuedouble == 1.0))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: rope scaling factor is not supported yet", c->dir);
    return 0;
}

/* quantization_config: AutoAWQ "gemm" or GPTQ, 4 bits; anything else is refused. */
static int read_quant(hf_ctx *c, const cJSON *q) {
    if (!q) return 0;
    const cJSON *meth = item(q, "quant_method"), *bits = item(q, "bits"), *gs = item(q, "group_size");
    if (!bits) bits = item(q, "w_bit"); /* AutoAWQ's own quant_config.json spelling */
    if (!gs) gs = item(q, "q_group_size");
    const char *mname = cJSON_IsString(meth) ? meth->valuestring : "?";
    if (strcmp(mname, "awq") && strcmp(mname, "gptq"))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: quantized checkpoints (quant_method '%.32s') are not supported (awq, gptq)",
                            c->dir, mname);
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 4)
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: %s with %g bits is not supported (4 bits)", c->dir, mname,
                            cJSON_IsNumber(bits) ? bits->valuedouble : 0.0);
    if (!cJSON_IsNumber(gs) || (gs->valuedouble != -1 && !(gs->valuedouble >= 8 && gs->valuedouble <= (1 << 20))) ||
        (double)(int64_t)gs->valuedouble != gs->valuedouble)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: quantization group_size is not -1 or a size >= 8", c->dir);
    c->group = gs->valuedouble == -1 ? 0 : (int64_t)gs->valuedouble;
    if (!strcmp(mname, "awq")) {
        const cJSON *ver = item(q, "version");
        if (ver && !(cJSON_IsString(ver) && !strcasecmp(ver->valuestring, "gemm")))
            return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: AWQ version '%.16s' is not supported (gemm)", c->dir,
                                cJSON_IsString(ver) ? ver->valuestring : "?");
        if (cJSON_IsFalse(item(q, "zero_point")))
            return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: AWQ without zero points is not supported", c->dir);
        c->quant = HF_AWQ;
    } else {
        const cJSON *fmt = item(q, "checkpoint_format");
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "gptq";
        if (strcmp(f, "gptq") && strcmp(f, "gptq_v2"))
            return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: GPTQ checkpoint_format '%.16s' is not supported", c->dir, f);
        c->quant = HF_GPTQ;
        c->zero_offset = !strcmp(f, "gptq"); /* v1 stores zero - 1 */
    }
    return 0;
}

static int read_config(hf_ctx *c, const cJSON *cfg) {
    li_hparams *hp = &c->m->hp;
    /* Llama-family: the same tensors and math as our GGUF llama */
    static const char *const archs[] = {"LlamaForCausalLM", "MistralForCausalLM"};
    const cJSON *a = item(cfg, "architectures");
    const char *arch = NULL;
    if (a) {
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 1 || !cJSON_IsString(a->child))
            return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: 'architectures' is not a one-name list", c->dir);
        arch = a->child->valuestring;
    } else {
        const cJSON *mt = item(cfg, "model_type");
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "llama")) arch = archs[0];
        else if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "mistral")) arch = archs[1];
        else return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: no 'architectures' or known 'model_type'", c->dir);
    }
    if (strcmp(arch, archs[0]) && strcmp(arch, archs[1]))
        return li_error_set(c->err, LI_EUNSUP,
                            "hf: %s/config.json: architecture '%.64s' is not supported (LlamaForCausalLM, MistralForCausalLM)",
                            c->dir, arch);
    snprintf(hp->arch, sizeof hp->arch, "%s", strcmp(arch, archs[0]) ? "mistral" : "llama");
    int rc;
    if ((rc = read_quant(c, item(cfg, "quantization_config")))) return rc;
    int32_t vocab;
    if ((rc = cfg_int(c, cfg, "hidden_size", -1, &hp->n_embd)) ||
        (rc = cfg_int(c, cfg, "num_hidden_layers", -1, &hp->n_layer)) ||
        (rc = cfg_int(c, cfg, "num_attention_heads", -1, &hp->n_head)) ||
        (rc = cfg_int(c, cfg, "intermediate_size", -1, &hp->n_ff)) ||
        (rc = cfg_int(c, cfg, "vocab_size", -1, &vocab)) ||
        (rc = cfg_int(c, cfg, "num_key_value_heads", hp->n_head, &hp->n_head_kv)) ||
        (rc = cfg_int(c, cfg, "max_position_embeddings", 2048, &hp->n_ctx_train)))
        return rc;
    hp->n_vocab = vocab;
    if (hp->n_embd % hp->n_head != 0)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: hidden_size %d is not a multiple of num_attention_heads %d",
                            c->dir, hp->n_embd, hp->n_head);
    if ((rc = cfg_int(c, cfg, "head_dim", hp->n_embd / hp->n_head, &hp->head_dim))) return rc;
    if (hp->n_head % hp->n_head_kv != 0 || hp->head_dim % 2)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/config.json: %d heads, %d kv heads, head_dim %d do not fit", c->dir,
                            hp->n_head, hp->n_head_kv, hp->head_dim);
    hp->n_rot = hp->head_dim;
    hp->rope_neox = 0; /* q/k rows are permuted for adjacent pairs on load */
    hp->rope_theta = 10000.0f;
    hp->norm_eps = 1e-6f; /* LlamaConfig's default */
    const cJSON *rp = item(cfg, "rope_parameters"); /* transformers >= 5 */
    if ((rc = check_rope(c, item(cfg, "rope_scaling"), "rope_scaling")) || (rc = check_rope(c, rp, "rope_parameters")) ||
        (rc = cfg_pos(c, item(cfg, "rope_theta"), "rope_theta", &hp->rope_theta)) ||
        (rc = cfg_pos(c, item(rp, "rope_theta"), "rope_parameters.rope_theta", &hp->rope_theta)) ||
        (rc = cfg_pos(c, item(cfg, "rms_norm_eps"), "rms_norm_eps", &hp->norm_eps)))
        return rc;
    const cJSON *prf = item(cfg, "partial_rotary_factor");
    if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: partial rotary embeddings are not supported", c->dir);
    const cJSON *act = item(cfg, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: hidden_act '%.32s' is not supported (silu)", c->dir,
                            cJSON_IsString(act) ? act->valuestring : "?");
    if (cJSON_IsTrue(item(cfg, "attention_bias")) || cJSON_IsTrue(item(cfg, "mlp_bias")))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: attention or MLP biases are not supported", c->dir);
    if (item(cfg, "sliding_window"))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s/config.json: sliding-window attention is not supported", c->dir);
    /* eos_token_id: an id or a list of them, extra end-of-generation ids */
    const cJSON *eos = item(cfg, "eos_token_id");
    li_hf *hf = c->m->hf;
    for (const cJSON *e = cJSON_IsArray(eos) ? eos->child : eos; e; e = cJSON_IsArray(eos) ? e->next : NULL) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= vocab) continue;
        hf->eog = li_xrealloc(hf->eog, (size_t)(hf->n_eog + 1) * sizeof *hf->eog);
        hf->eog[hf->n_eog++] = (int32_t)e->valuedouble;
    }
    return 0;
}

/* ==== shards ======================================================================== */

/* A shard name from the index: a plain file name in the directory. */
static bool shard_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 12 && s[0] != '.' && !strchr(s, '/') && !strcmp(s + n - 12, ".safetensors");
}

static int open_shard(hf_ctx *c, const char *name) {
    li_hf *hf = c->m->hf;
    if (hf->n_shards >= HF_MAX_SHARDS)
        return li_error_set(c->err, LI_EINVAL, "hf: %s: more than %d shards", c->dir, HF_MAX_SHARDS);
    hf->shards = li_xrealloc(hf->shards, (size_t)(hf->n_shards + 1) * sizeof *hf->shards);
    int rc = li_safetensors_open(&hf->shards[hf->n_shards], join(c, name), c->err);
    if (rc) return rc;
    hf->n_shards++;
    return 0;
}

static int find_shard(const li_hf *hf, const char *path) {
    for (int i = 0; i < hf->n_shards; i++)
        if (!strcmp(hf->shards[i].path, path)) return i;
    return -1;
}

/* model.safetensors.index.json: every file it names is opened, and the
 * weight map must agree with the files (each named tensor where it says,
 * no tensor the map leaves out). */
static int open_index(hf_ctx *c, const cJSON *idx) {
    const char *iname = "model.safetensors.index.json";
    const cJSON *wm = item(idx, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/%s: no 'weight_map' object", c->dir, iname);
    int rc, n_map = 0;
    for (const cJSON *e = wm->child; e; e = e->next, n_map++) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring))
            return li_error_set(c->err, LI_EINVAL, "hf: %s/%s: weight_map['%.80s'] is not a .safetensors file name in the directory",
                                c->dir, iname, e->string);
        if (find_shard(c->m->hf, join(c, e->valuestring)) < 0 && (rc = open_shard(c, e->valuestring))) return rc;
    }
    int n_tensors = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        int s = find_shard(c->m->hf, join(c, e->valuestring));
        if (!li_safetensors_find(&c->m->hf->shards[s], e->string))
            return li_error_set(c->err, LI_EINVAL, "hf: %s/%s: tensor '%.80s' is not in %s, where weight_map puts it", c->dir,
                                iname, e->string, e->valuestring);
    }
    for (int s = 0; s < c->m->hf->n_shards; s++) n_tensors += c->m->hf->shards[s].n_tensors;
    if (n_tensors != n_map)
        return li_error_set(c->err, LI_EINVAL, "hf: %s/%s: the shards hold %d tensors but weight_map lists %d", c->dir, iname,
                            n_tensors, n_map);
    return 0;
}

static int open_weights(hf_ctx *c) {
    cJSON *idx;
    int rc = read_json(c, "model.safetensors.index.json", false, &idx);
    if (rc == 0) {
        rc = open_index(c, idx);
        cJSON_Delete(idx);
        return rc;
    }
    if (rc < 0) return rc;
    if (exists(c, "model.safetensors")) return open_shard(c, "model.safetensors");
    if (exists(c, "pytorch_model.bin") || exists(c, "pytorch_model.bin.index.json"))
        return li_error_set(c->err, LI_EUNSUP, "hf: %s: PyTorch .bin weights are not supported (safetensors only)", c->dir);
    return li_error_set(c->err, LI_EINVAL, "hf: %s: no model.safetensors or model.safetensors.index.json", c->dir);
}

static const li_st_tensor *find(hf_ctx *c, const char *name) {
    for (int i = 0; i < c->m->hf->n_shards; i++) {
        const li_st_tensor *t = li_safetensors_find(&c->m->hf->shards[i], name);
        if (t) return t;
    }
    return NULL;
}

/* ==== binding ========================================================================= */

static void own(li_model *m, void *p) {
    m->owned = li_xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = p; /* freed with free(), whatever it holds */
}

/* Binds a (rows, k) Linear weight. heads > 0: a Q or K projection whose
 * rows are re-permuted per head from halves (HF) to adjacent pairs. */
static int bind(hf_ctx *c, li_weight *w, const char *name, int64_t k, int64_t rows, int heads) {
    const li_st_tensor *t = find(c, name);
    if (!t) return li_error_set(c->err, LI_EINVAL, "hf: %s: missing tensor '%s'", c->dir, name);
    if (t->type != LI_TYPE_F32 && t->type != LI_TYPE_F16 && t->type != LI_TYPE_BF16)
        return li_error_set(c->err, LI_EINVAL, "hf: %s: tensor '%s' is %s, not a float weight", c->dir, name,
                            li_type_name(t->type));
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != k)
        return li_error_set(c->err, LI_EINVAL, "hf: %s: tensor '%s' has shape (%lld, %lld), expected (%lld, %lld)", c->dir,
                            name, (long long)(t->n_dims > 0 ? t->shape[0] : 0), (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)rows, (long long)k);
    memset(w, 0, sizeof *w);
    w->type = (li_type)t->type;
    w->k = k;
    w->m = rows;
    li_type_row_size(t->type, k, &w->row_bytes);
    w->data = t->data;
    w->scheme = LI_SCHEME_PLAIN;
    w->act = LI_ACT_F32;
    size_t esz = w->row_bytes / (size_t)k;
    if (heads > 0 || (uintptr_t)t->data % esz) {
        uint8_t *dst = li_xmalloc(t->nbytes ? t->nbytes : 1);
        const uint8_t *src = t->data;
        if (heads > 0) {
            /* GGUF row h*hd + 2i + j is HF row h*hd + j*hd/2 + i */
            const int64_t hd = rows / heads, half = hd / 2;
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < half; i++)
                    for (int64_t j = 0; j < 2; j++)
                        memcpy(dst + (size_t)(h * hd + 2 * i + j) * w->row_bytes,
                               src + (size_t)(h * hd + j * half + i) * w->row_bytes, w->row_bytes);
        } else {
            memcpy(dst, src, t->nbytes); /* misaligned in the file: an aligned copy */
        }
        own(c->m, dst);
        w->data = dst;
    }
    c->m->weight_bytes += t->nbytes;
    return 0;
}

/* ==== AWQ / GPTQ Linears ================================================================ */

/* A packed tensor `base.suffix` of dtype want and shape (d0, d1). */
static const li_st_tensor *qtensor(hf_ctx *c, const char *base, const char *suffix, uint32_t want, int64_t d0,
                                   int64_t d1, int *rc) {
    char name[200];
    snprintf(name, sizeof name, "%.150s.%.20s", base, suffix);
    const li_st_tensor *t = find(c, name);
    if (!t) *rc = li_error_set(c->err, LI_EINVAL, "hf: %s: missing tensor '%s'", c->dir, name);
    else if (t->n_dims != (d1 ? 2u : 1u) || t->shape[0] != d0 || (d1 && t->shape[1] != d1))
        *rc = li_error_set(c->err, LI_EINVAL, "hf: %s: tensor '%s' has the wrong shape (expected (%lld%s%lld))", c->dir, name,
                           (long long)d0, d1 ? ", " : "", (long long)d1);
    else if (want != UINT32_MAX ? t->type != want : t->type == LI_TYPE_I32)
        *rc = li_error_set(c->err, LI_EINVAL, "hf: %s: tensor '%s' has dtype %s", c->dir, name, li_type_name(t->type));
    else return t;
    return NULL;
}

static uint32_t nib(const li_st_tensor *t, int64_t idx, int shift) {
    int32_t v;
    memcpy(&v, (const uint8_t *)t->data + 4 * idx, 4);
    return ((uint32_t)v >> shift) & 15u;
}

/* A 4-bit Linear (rows = out, k = in) from AutoAWQ GEMM or GPTQ tensors,
 * onto the AWQ / GPTQ weight schemes: u4 codes (rows, k), f32 scales and
 * zero points (rows, groups), GPTQ's act-order as the column permutation.
 * heads > 0 permutes rows as bind() does.
 *   AWQ:  qweight (k, rows/8) I32, element o of a word at nibble
 *         AWQ_REVERSE[o % 8]; qzeros (groups, rows/8) likewise; scales (groups, rows)
 *   GPTQ: qweight (k/8, rows) I32, input i at nibble i % 8; qzeros
 *         (groups, rows/8), rows at nibble o % 8, minus one in format v1;
 *         scales (groups, rows); g_idx (k), each input column's group */
static int bind_quant(hf_ctx *c, li_weight *w, const char *base, int64_t k, int64_t rows, int heads) {
    static const int AWQ_REVERSE[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    const bool awq = c->quant == HF_AWQ;
    const int64_t gs = c->group ? c->group : k, ng = k / gs;
    if (k % gs || k % 8 || rows % 8)
        return li_error_set(c->err, LI_EINVAL, "hf: %s: '%s' (%lld x %lld) does not split into groups of %lld and words of 8",
                            c->dir, base, (long long)rows, (long long)k, (long long)gs);
    int rc = 0;
    const li_st_tensor *qw = awq ? qtensor(c, base, "qweight", LI_TYPE_I32, k, rows / 8, &rc)
                                 : qtensor(c, base, "qweight", LI_TYPE_I32, k / 8, rows, &rc);
    const li_st_tensor *qz = qw ? qtensor(c, base, "qzeros", LI_TYPE_I32, ng, rows / 8, &rc) : NULL;
    const li_st_tensor *sc = qz ? qtensor(c, base, "scales", UINT32_MAX, ng, rows, &rc) : NULL;
    const li_st_tensor *gi = NULL;
    if (!sc) return rc;
    char gname[200];
    snprintf(gname, sizeof gname, "%.150s.g_idx", base);
    if (!awq && find(c, gname) && !(gi = qtensor(c, base, "g_idx", LI_TYPE_I32, k, 0, &rc))) return rc;
    /* act-order: stored column j is input column perm[j], the input columns
     * sorted by group (stable), each group exactly gs columns */
    int32_t *perm = NULL;
    if (gi) {
        int64_t *count = li_xcalloc((size_t)ng + 1, sizeof *count);
        bool ident = true;
        for (int64_t i = 0; i < k && !rc; i++) {
            int32_t g;
            memcpy(&g, (const uint8_t *)gi->data + 4 * i, 4);
            if (g < 0 || g >= ng) rc = li_error_set(c->err, LI_EINVAL, "hf: %s: %s[%lld] = %d is not a group", c->dir, gname, (long long)i, g);
            else count[g + 1]++, ident &= g == i / gs;
        }
        for (int64_t g = 0; g < ng && !rc; g++)
            if (count[g + 1] != gs)
                rc = li_error_set(c->err, LI_EINVAL, "hf: %s: %s gives group %lld %lld columns, not %lld", c->dir, gname,
                                  (long long)g, (long long)count[g + 1], (long long)gs);
        if (!rc && !ident) {
            for (int64_t g = 0; g < ng; g++) count[g + 1] += count[g];
            perm = li_xmalloc((size_t)k * sizeof *perm);
            for (int64_t i = 0; i < k; i++) {
                int32_t g;
                memcpy(&g, (const uint8_t *)gi->data + 4 * i, 4);
                perm[count[g]++] = (int32_t)i;
            }
        }
        free(count);
        if (rc) return rc;
    }
    uint8_t *codes = li_xcalloc((size_t)(rows * k / 2), 1);
    float *scales = li_xmalloc((size_t)(rows * ng) * sizeof *scales), *zeros = li_xmalloc((size_t)(rows * ng) * sizeof *zeros);
    float *srow = li_xmalloc((size_t)rows * sizeof *srow);
    const li_type_traits *st = li_type_get(sc->type);
    const int64_t hd = heads > 0 ? rows / heads : 0;
    for (int64_t r = 0; r < rows; r++) {
        /* r: our row; o: the checkpoint's output column (halves -> pairs for q/k) */
        int64_t o = r;
        if (heads > 0) {
            const int64_t h = r / hd, i = (r % hd) / 2, j = r % 2;
            o = h * hd + j * (hd / 2) + i;
        }
        uint8_t *dst = codes + r * (k / 2);
        for (int64_t jj = 0; jj < k; jj++) {
            const int64_t i = perm ? perm[jj] : jj; /* input column of stored column jj */
            const uint32_t q = awq ? nib(qw, i * (rows / 8) + o / 8, 4 * AWQ_REVERSE[o % 8]) : nib(qw, (i / 8) * rows + o, 4 * (int)(i % 8));
            dst[jj / 2] |= (uint8_t)(jj % 2 ? q << 4 : q);
        }
        for (int64_t g = 0; g < ng; g++) {
            const uint32_t z = awq ? nib(qz, g * (rows / 8) + o / 8, 4 * AWQ_REVERSE[o % 8])
                                   : nib(qz, g * (rows / 8) + o / 8, 4 * (int)(o % 8));
            zeros[r * ng + g] = (float)z + (float)(!awq && c->zero_offset);
        }
    }
    for (int64_t g = 0; g < ng; g++) {
        st->to_float((const uint8_t *)sc->data + (size_t)(g * rows) * (sc->nbytes / (size_t)(ng * rows)), srow, rows);
        for (int64_t r = 0; r < rows; r++) {
            int64_t o = r;
            if (heads > 0) o = (r / hd) * hd + (r % 2) * (hd / 2) + (r % hd) / 2;
            scales[r * ng + g] = srow[o];
        }
    }
    free(srow);
    own(c->m, codes);
    own(c->m, scales);
    own(c->m, zeros);
    if (perm) own(c->m, perm);
    memset(w, 0, sizeof *w);
    w->type = LI_TYPE_U4;
    w->k = k;
    w->m = rows;
    w->row_bytes = (size_t)(k / 2);
    w->data = codes;
    w->scheme = awq ? LI_SCHEME_AWQ : LI_SCHEME_GPTQ;
    w->act = LI_ACT_F32;
    w->group_size = c->group;
    w->scales = scales;
    w->zeros = zeros;
    w->perm = perm;
    char why[160];
    if (li_weight_check(w, why, sizeof why)) return li_error_set(c->err, LI_EINVAL, "hf: %s: '%s': %s", c->dir, base, why);
    c->m->weight_bytes += qw->nbytes + qz->nbytes + sc->nbytes + (gi ? gi->nbytes : 0);
    return 0;
}

/* A decoder Linear: plain, or the checkpoint's 4-bit layout. */
static int bind_linear(hf_ctx *c, li_weight *w, const char *name, int64_t k, int64_t rows, int heads) {
    if (c->quant == HF_PLAIN) return bind(c, w, name, k, rows, heads);
    char base[160];
    size_t n = strlen(name) - strlen(".weight"); /* name ends in ".weight" */
    snprintf(base, sizeof base, "%.*s", (int)n, name);
    return bind_quant(c, w, base, k, rows, heads);
}

static int bind_norm(hf_ctx *c, const float **out, const char *name, int64_t n) {
    const li_st_tensor *t = find(c, name);
    if (!t) return li_error_set(c->err, LI_EINVAL, "hf: %s: missing tensor '%s'", c->dir, name);
    if (t->n_dims != 1 || t->shape[0] != n)
        return li_error_set(c->err, LI_EINVAL, "hf: %s: tensor '%s' is not a vector of %lld", c->dir, name, (long long)n);
    c->m->weight_bytes += t->nbytes;
    if (t->type == LI_TYPE_F32 && (uintptr_t)t->data % 4 == 0) {
        *out = t->data;
        return 0;
    }
    float *f = li_xmalloc((size_t)n * sizeof *f);
    if (t->type == LI_TYPE_F32) memcpy(f, t->data, (size_t)n * sizeof *f);
    else li_type_get(t->type)->to_float(t->data, f, n);
    own(c->m, f);
    *out = f;
    return 0;
}

static int bind_weights(hf_ctx *c, bool tied) {
    li_model *m = c->m;
    const li_hparams *hp = &m->hp;
    int rc;
    if ((rc = bind(c, &m->tok_embd, "model.embed_tokens.weight", hp->n_embd, hp->n_vocab, 0)) ||
        (rc = bind_norm(c, &m->output_norm, "model.norm.weight", hp->n_embd)))
        return rc;
    if (tied) m->output = m->tok_embd;
    else if ((rc = bind(c, &m->output, "lm_head.weight", hp->n_embd, hp->n_vocab, 0))) return rc;
    m->layers = li_xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[128];
#define NAME(part) (snprintf(name, sizeof name, "model.layers.%d." part ".weight", l), name)
    for (int l = 0; l < hp->n_layer; l++) {
        li_layer *L = &m->layers[l];
        if ((rc = bind_norm(c, &L->attn_norm, NAME("input_layernorm"), hp->n_embd)) ||
            (rc = bind_linear(c, &L->wq, NAME("self_attn.q_proj"), hp->n_embd, q_dim, hp->n_head)) ||
            (rc = bind_linear(c, &L->wk, NAME("self_attn.k_proj"), hp->n_embd, kv_dim, hp->n_head_kv)) ||
            (rc = bind_linear(c, &L->wv, NAME("self_attn.v_proj"), hp->n_embd, kv_dim, 0)) ||
            (rc = bind_linear(c, &L->wo, NAME("self_attn.o_proj"), q_dim, hp->n_embd, 0)) ||
            (rc = bind_norm(c, &L->ffn_norm, NAME("post_attention_layernorm"), hp->n_embd)) ||
            (rc = bind_linear(c, &L->w_gate, NAME("mlp.gate_proj"), hp->n_embd, hp->n_ff, 0)) ||
            (rc = bind_linear(c, &L->w_up, NAME("mlp.up_proj"), hp->n_embd, hp->n_ff, 0)) ||
            (rc = bind_linear(c, &L->w_down, NAME("mlp.down_proj"), hp->n_ff, hp->n_embd, 0)))
            return rc;
    }
#undef NAME
    return 0;
}

/* The shards' tensors as a GGUF-style table (innermost dimension first),
 * for what lists a model's tensors (info). */
static int fill_table(hf_ctx *c) {
    li_model *m = c->m;
    size_t n = 0;
    for (int s = 0; s < m->hf->n_shards; s++) n += (size_t)m->hf->shards[s].n_tensors;
    m->gguf.tensors = li_xcalloc(n + 1, sizeof *m->gguf.tensors);
    for (int s = 0; s < m->hf->n_shards; s++) {
        const li_safetensors *st = &m->hf->shards[s];
        m->gguf.size += st->size;
        for (int i = 0; i < st->n_tensors; i++) {
            const li_st_tensor *t = &st->tensors[i];
            if (t->n_dims > 4)
                return li_error_set(c->err, LI_EUNSUP, "hf: %s: tensor '%.80s' has %u dimensions (at most 4)", st->path,
                                    t->name, t->n_dims);
            li_gguf_tensor *g = &m->gguf.tensors[m->gguf.n_tensors++];
            g->name = (li_str){t->name, strlen(t->name)};
            g->n_dims = t->n_dims ? t->n_dims : 1;
            for (int d = 0; d < 4; d++) g->ne[d] = d < (int)t->n_dims ? t->shape[t->n_dims - 1 - d] : 1;
            g->type = t->type;
            g->offset = t->begin;
            g->nbytes = t->nbytes;
            g->data = t->data;
        }
    }
    return 0;
}

/* ==== tokenizer ============================================================================ */

/* tokenizer_config.json's "bos_token": a string or {"content": ...}. */
static const char *tok_text(const cJSON *tc, const char *key) {
    const cJSON *v = item(tc, key);
    if (cJSON_IsObject(v)) v = item(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int load_chat_template(hf_ctx *c, const cJSON *tc) {
    li_model *m = c->m;
    if (exists(c, "chat_template.jinja")) { /* transformers >= 4.52 writes it here */
        size_t len;
        return li_read_file(c->path, HF_MAX_JSON, "chat template", &m->chat_template, &len, c->err);
    }
    const cJSON *t = item(tc, "chat_template");
    if (cJSON_IsArray(t)) { /* named templates: the "default" one, else the first */
        const cJSON *pick = NULL;
        for (const cJSON *e = t->child; e; e = e->next) {
            const cJSON *nm = item(e, "name");
            if (!pick || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))) pick = e;
        }
        t = item(pick, "template");
    }
    if (t && !cJSON_IsString(t))
        return li_error_set(c->err, LI_EINVAL, "hf: %s/tokenizer_config.json: 'chat_template' is not a string", c->dir);
    if (t) m->chat_template = strdup(t->valuestring);
    return 0;
}

static int load_tokenizer(hf_ctx *c) {
    li_model *m = c->m;
    cJSON *tc = NULL;
    int rc = read_json(c, "tokenizer_config.json", false, &tc);
    if (rc < 0) return rc;
    li_tokenizer_hf_opts o = {
        .bos_token = tok_text(tc, "bos_token"),
        .eos_token = tok_text(tc, "eos_token"),
        .unk_token = tok_text(tc, "unk_token"),
        .add_bos = cJSON_IsBool(item(tc, "add_bos_token")) ? cJSON_IsTrue(item(tc, "add_bos_token")) : -1,
        .n_vocab_min = m->hp.n_vocab,
        .eog_ids = m->hf->eog,
        .n_eog_ids = m->hf->n_eog,
    };
    if ((rc = load_chat_template(c, tc))) goto done;
    if (!exists(c, "tokenizer.json")) {
        rc = li_error_set(c->err, LI_EUNSUP, "hf: %s: no tokenizer.json (slow tokenizers are not supported)", c->dir);
        goto done;
    }
    char *buf;
    size_t len;
    if ((rc = li_read_file(c->path, HF_MAX_JSON, "tokenizer file", &buf, &len, c->err))) goto done;
    rc = li_tokenizer_init_hf(&m->tok, buf, len, c->path, &o, c->err);
    free(buf);
    if (!rc && li_tokenizer_n_vocab(m->tok) != m->hp.n_vocab)
        rc = li_error_set(c->err, LI_EINVAL, "hf: %s: tokenizer.json has %d tokens but vocab_size is %d", c->dir,
                          li_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
done:
    cJSON_Delete(tc);
    return rc;
}

/* ==== entry points ============================================================================ */

int li_model_load_hf(li_model *m, const char *dir, li_error *err) {
    hf_ctx c = {.m = m, .dir = dir, .err = err};
    m->hf = li_xcalloc(1, sizeof *m->hf);
    cJSON *cfg;
    int rc = read_json(&c, "config.json", true, &cfg);
    if (rc) return rc;
    rc = read_config(&c, cfg);
    const cJSON *tie = item(cfg, "tie_word_embeddings");
    bool tied = tie ? cJSON_IsTrue(tie) : false; /* LlamaConfig's default */
    cJSON_Delete(cfg);
    if (rc || (rc = open_weights(&c)) || (rc = bind_weights(&c, tied)) || (rc = fill_table(&c)) ||
        (rc = load_tokenizer(&c)))
        return rc;
    return 0;
}

void li_model_free_hf(li_model *m) {
    if (!m->hf) return;
    for (int i = 0; i < m->hf->n_shards; i++) li_safetensors_free(&m->hf->shards[i]);
    free(m->hf->shards);
    free(m->hf->eog);
    free(m->hf);
    m->hf = NULL;
}
