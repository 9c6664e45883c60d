/* info.c — `luainfer info MODEL`: what a GGUF holds and what its KV costs. */
#include "runtime/args.h"
#include "cli/cli.h"
#include "kv/kv_cache.h"
#include "spec/eagle_file.h"
#include "spec/medusa_file.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct type_stat {
    int count;
    size_t bytes;
    int64_t elems;
} type_stat;

static const char *human(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, n, "%.2f %s", b, u[i]);
    return buf;
}

/* The scheme tensor t stands for ("w8a8", ...), or its type's name: an I8
 * tensor of a scheme file is that scheme's codes (model.c). */
static const char *tensor_scheme(const li_model *m, const li_gguf_tensor *t) {
    return t->type == LI_TYPE_I8 && m->quant_scheme != LI_SCHEME_PLAIN ? li_scheme_name(m->quant_scheme)
                                                                       : li_type_name(t->type);
}

/* Bytes of NAME.scale / .zero / .perm beside tensor t (0 for plain files). */
static size_t companion_bytes(const li_model *m, const li_gguf_tensor *t) {
    if (t->type != LI_TYPE_I8 || m->quant_scheme == LI_SCHEME_PLAIN) return 0;
    static const char *suf[] = {"scale", "zero", "perm"};
    size_t b = 0;
    for (size_t i = 0; i < LI_ARRAY_LEN(suf); i++) {
        char n[160];
        snprintf(n, sizeof n, "%.*s.%s", (int)LI_MIN(t->name.len, 128), t->name.ptr, suf[i]);
        const li_gguf_tensor *c = li_gguf_find_tensor(&m->gguf, n);
        if (c) b += c->nbytes;
    }
    return b;
}

static bool is_companion(const li_model *m, const li_gguf_tensor *t) {
    if (m->quant_scheme == LI_SCHEME_PLAIN) return false;
    static const char *suf[] = {".scale", ".zero", ".perm"};
    for (size_t i = 0; i < LI_ARRAY_LEN(suf); i++) {
        const size_t n = strlen(suf[i]);
        if (t->name.len > n && !memcmp(t->name.ptr + t->name.len - n, suf[i], n)) return true;
    }
    return false;
}

/* Elements a weight tensor stands for: a scheme's code tensor holds row
 * bytes, not elements, per row (u4: two per byte). */
static int64_t tensor_elems(const li_model *m, const li_gguf_tensor *t) {
    int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type == LI_TYPE_I8 && m->quant_scheme != LI_SCHEME_PLAIN)
        ne *= li_type_info(li_scheme_info(m->quant_scheme)->codes)->blck_size;
    return ne;
}

/* tensor_types' entry of type t in ty: its count and bytes */
static cJSON *json_type(cJSON *ty, int t, const type_stat *s) {
    cJSON *e = cJSON_AddObjectToObject(ty, li_type_name((uint32_t)t));
    cJSON_AddNumberToObject(e, "count", s->count);
    cJSON_AddNumberToObject(e, "bytes", (double)s->bytes);
    return e;
}

/* --tensors' entry of t in tl: its name, type, shape and bytes */
static cJSON *json_tensor(cJSON *tl, const li_gguf_tensor *t) {
    cJSON *e = cJSON_CreateObject();
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)LI_MIN(t->name.len, 255), t->name.ptr);
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "type", li_type_name(t->type));
    cJSON *sh = cJSON_AddArrayToObject(e, "shape");
    for (uint32_t d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->ne[d]));
    cJSON_AddNumberToObject(e, "bytes", (double)t->nbytes);
    cJSON_AddItemToArray(tl, e);
    return e;
}

/* ---- drafts: an EAGLE draft or Medusa heads file (not a model) ---------------------- */

/* The scalar "<arch>.train.*" keys (how the file was trained) into j, or
 * printed as "key value" pairs on one line. */
static void draft_train(const li_gguf *g, const char *arch, cJSON *j) {
    char pre[32];
    const int np = snprintf(pre, sizeof pre, "%s.train.", arch);
    bool any = false;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const li_gguf_kv *kv = &g->kv[i];
        if (kv->key.len <= (uint64_t)np || memcmp(kv->key.ptr, pre, (size_t)np)) continue;
        char key[64], val[160];
        snprintf(key, sizeof key, "%.*s", (int)LI_MIN(kv->key.len - (uint64_t)np, 63), kv->key.ptr + np);
        switch (kv->type) {
        case LI_GGUF_UINT8: case LI_GGUF_UINT16: case LI_GGUF_UINT32: case LI_GGUF_UINT64:
            snprintf(val, sizeof val, "%llu", (unsigned long long)kv->v.u64);
            if (j) cJSON_AddNumberToObject(j, key, (double)kv->v.u64);
            break;
        case LI_GGUF_INT8: case LI_GGUF_INT16: case LI_GGUF_INT32: case LI_GGUF_INT64:
            snprintf(val, sizeof val, "%lld", (long long)kv->v.i64);
            if (j) cJSON_AddNumberToObject(j, key, (double)kv->v.i64);
            break;
        case LI_GGUF_FLOAT32: case LI_GGUF_FLOAT64: {
            /* the shortest decimal that reads back as the stored value (an
             * f32 widened to double prints 0.0005 as 0.00050000002...) */
            double x = kv->v.f64;
            for (int p = 6; p <= 17; p++) {
                snprintf(val, sizeof val, "%.*g", p, kv->v.f64);
                x = strtod(val, NULL);
                if (kv->type == LI_GGUF_FLOAT32 ? (float)x == (float)kv->v.f64 : x == kv->v.f64) break;
            }
            if (j) cJSON_AddNumberToObject(j, key, x);
            break;
        }
        case LI_GGUF_STRING:
            snprintf(val, sizeof val, "%.*s", (int)LI_MIN(kv->v.str.len, 120), kv->v.str.ptr);
            if (j) cJSON_AddStringToObject(j, key, val);
            break;
        default:
            continue; /* arrays and bools: not written by the trainers */
        }
        if (!j) printf("%s%s %s", any ? ", " : "training:     ", key, val);
        any = true;
    }
    if (!j && any) printf("\n");
}

/* `luainfer info` of a draft file: what it is, the base it was made for
 * (checked against no model here: serve and generate check it at load),
 * its shape, training and tensors. */
static int info_draft(const li_gguf *g, const char *path, const char *arch, bool json, bool tensors, li_error *err) {
    const bool eagle = !strcmp(arch, "eagle");
    li_eagle_file ef;
    li_medusa_file mf;
    const int rc = eagle ? li_eagle_file_check(g, path, NULL, &ef, err) : li_medusa_file_check(g, path, NULL, &mf, err);
    if (rc) return rc;
    const char *base_name = eagle ? ef.base_name : mf.base_name;
    const uint64_t hash = eagle ? ef.vocab_hash : mf.vocab_hash;
    type_stat st[LI_TYPE_COUNT] = {0};
    int64_t n_params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const li_gguf_tensor *t = &g->tensors[i];
        const int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (t->type < LI_TYPE_COUNT) st[t->type].count++, st[t->type].bytes += t->nbytes, st[t->type].elems += ne;
        if (t->type != LI_TYPE_I32) n_params += ne; /* eagle.vocab holds token ids */
    }
    char b1[32], hx[20];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)hash);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "path", path);
        cJSON_AddStringToObject(j, "architecture", arch);
        cJSON_AddNumberToObject(j, "n_params", (double)n_params);
        cJSON_AddNumberToObject(j, "file_bytes", (double)g->size);
        cJSON *b = cJSON_AddObjectToObject(j, "base");
        cJSON_AddStringToObject(b, "name", base_name);
        cJSON_AddStringToObject(b, "vocab_hash", hx);
        cJSON_AddNumberToObject(b, "n_embd", eagle ? ef.n_embd : mf.n_embd);
        cJSON_AddNumberToObject(b, "n_vocab", eagle ? ef.n_vocab : mf.n_vocab);
        if (eagle) {
            cJSON_AddNumberToObject(b, "n_layer", ef.base_n_layer);
            cJSON *d = cJSON_AddObjectToObject(j, "draft");
            cJSON_AddNumberToObject(d, "n_head", ef.n_head);
            cJSON_AddNumberToObject(d, "n_head_kv", ef.n_head_kv);
            cJSON_AddNumberToObject(d, "head_dim", ef.head_dim);
            cJSON_AddNumberToObject(d, "n_ff", ef.n_ff);
            cJSON_AddItemToObject(d, "feature_layers", cJSON_CreateIntArray(ef.feature_layer, ef.n_features));
            cJSON_AddNumberToObject(d, "n_draft_vocab", ef.n_draft);
        } else {
            cJSON_AddNumberToObject(j, "n_heads", mf.n_heads);
        }
        draft_train(g, arch, cJSON_AddObjectToObject(j, "train"));
        cJSON *ty = cJSON_AddObjectToObject(j, "tensor_types");
        for (int t = 0; t < LI_TYPE_COUNT; t++)
            if (st[t].count) json_type(ty, t, &st[t]);
        if (tensors) {
            cJSON *tl = cJSON_AddArrayToObject(j, "tensors");
            for (uint64_t i = 0; i < g->n_tensors; i++) json_tensor(tl, &g->tensors[i]);
        }
        char *s = cJSON_Print(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
        return 0;
    }
    printf("file:         %s\n", path);
    printf("architecture: %s (%s; use with --%s)\n", arch,
           eagle ? "an EAGLE draft: one block drafting from the base's hidden states" : "Medusa heads", arch);
    printf("parameters:   %.2f M   file: %s\n", n_params / 1e6, human((double)g->size, b1, sizeof b1));
    printf("base:         '%s', vocab hash %s, hidden %d, vocab %d", base_name, hx, eagle ? ef.n_embd : mf.n_embd,
           eagle ? ef.n_vocab : mf.n_vocab);
    if (eagle) printf(", layers %d", ef.base_n_layer);
    printf("\n");
    if (eagle) {
        printf("block:        heads %d (kv %d, dim %d), ffn %d; reads the base's blocks", ef.n_head, ef.n_head_kv,
               ef.head_dim, ef.n_ff);
        for (int32_t i = 0; i < ef.n_features; i++) printf("%s%d", i ? ", " : " ", ef.feature_layer[i]);
        printf("\ndraft vocab:  %d of %d tokens%s\n", ef.n_draft, ef.n_vocab, ef.vocab ? "" : " (the whole vocabulary)");
    } else {
        printf("heads:        %d (head k drafts the token k + 1 places past the next)\n", mf.n_heads);
    }
    draft_train(g, arch, NULL);
    printf("tensor types:\n");
    for (int t = 0; t < LI_TYPE_COUNT; t++)
        if (st[t].count)
            printf("  %-6s %4d tensors  %12lld %s  %s\n", li_type_name((uint32_t)t), st[t].count,
                   (long long)st[t].elems, t == LI_TYPE_I32 ? "ids   " : "params", human((double)st[t].bytes, b1, sizeof b1));
    if (tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const li_gguf_tensor *t = &g->tensors[i];
            printf("  %-32.*s %-5s [%lld, %lld] %s\n", (int)LI_MIN(t->name.len, 64), t->name.ptr, li_type_name(t->type),
                   (long long)t->ne[0], (long long)t->ne[1], human((double)t->nbytes, b1, sizeof b1));
        }
    return 0;
}

int li_cmd_info(int argc, char **argv) {
    const char *model = NULL;
    bool json = false, kv = false, help = false, tensors = false;
    double budget_gib = 1.0;
    int64_t block_size = 16;
    li_opt opts[] = {
        {"model", LI_OPT_STR, &model, "GGUF model or Hugging Face directory (or give it as the argument)"},
        {"kv", LI_OPT_FLAG, &kv, "print KV-cache bytes per token per dtype and tokens per budget"},
        {"kv-memory-gib", LI_OPT_FLOAT, &budget_gib, "budget for --kv (default 1 GiB)"},
        {"block-size", LI_OPT_INT, &block_size, "KV block size for --kv (default 16)"},
        {"tensors", LI_OPT_FLAG, &tensors, "list every tensor"},
        {"json", LI_OPT_FLAG, &json, "print a JSON object"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("info", "[MODEL.gguf] [options]", opts, n_opts);
        return 0;
    }
    if (n_pos == 1) model = pos[0];
    if (!(budget_gib > 0) || budget_gib > 1 << 20 || block_size <= 0 || block_size > 1024)
        return li_runtime_fail(&(li_error){LI_EINVAL, "info: --kv-memory-gib must be > 0 and --block-size in [1, 1024]"});
    /* an EAGLE draft or Medusa heads file is described, not loaded as a model */
    const char *path = li_model_default_path(model);
    li_gguf g;
    if (li_gguf_open(&g, path, NULL) == 0) {
        char arch[32] = "";
        li_gguf_copy_str(&g, "general.architecture", arch, sizeof arch);
        if (!strcmp(arch, "eagle") || !strcmp(arch, "medusa")) {
            if (kv) rc = li_error_set(&err, LI_EINVAL, "info: --kv describes a model's KV cache; %s is %s", path,
                                      strcmp(arch, "eagle") ? "a Medusa heads file" : "an EAGLE draft");
            else rc = info_draft(&g, path, arch, json, tensors, &err);
            li_gguf_free(&g);
            return rc ? li_runtime_fail(&err) : 0;
        }
        li_gguf_free(&g);
    }
    li_model *m;
    if ((rc = li_model_load(&m, path, &err))) return li_runtime_fail(&err);
    const li_hparams *hp = &m->hp;
    type_stat st[LI_TYPE_COUNT] = {0};
    int64_t n_params = 0;
    int64_t w_elems = 0; /* 2-D weights: bits per weight, their scales counted */
    size_t w_bytes = 0;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        const li_gguf_tensor *t = &m->gguf.tensors[i];
        if (is_companion(m, t)) continue; /* counted with its weight */
        const int64_t ne = tensor_elems(m, t);
        const size_t bytes = t->nbytes + companion_bytes(m, t);
        if (t->type < LI_TYPE_COUNT) {
            st[t->type].count++;
            st[t->type].bytes += bytes;
            st[t->type].elems += ne;
        }
        if (t->n_dims == 2) {
            w_elems += ne;
            w_bytes += bytes;
        }
        n_params += ne;
    }
    char qdesc[160] = "";
    li_str qm;
    if (li_gguf_get_str(&m->gguf, "luainfer.quant.method", &qm, &err) == 0) {
        const bool sch = m->quant_scheme != LI_SCHEME_PLAIN;
        const li_act_quant act = m->quant_act != LI_ACT_F32 ? m->quant_act
                                 : sch                      ? li_scheme_info(m->quant_scheme)->act
                                                            : LI_ACT_F32;
        char grp[32] = "";
        if (sch && m->quant_group > 0) snprintf(grp, sizeof grp, ", group %lld", (long long)m->quant_group);
        snprintf(qdesc, sizeof qdesc, "%.*s%s%s%s", (int)LI_MIN(qm.len, 32), qm.ptr, grp, sch ? ", activations " : "",
                 sch ? li_act_quant_name(act) : "");
    }
    const double bpw = w_elems ? 8.0 * (double)w_bytes / (double)w_elems : 0;
    static const li_type kv_types[] = {LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16, LI_KV_TYPE_FP8_E4M3, LI_KV_TYPE_INT8};
    const li_kv_dims kvd = {hp->n_layer, hp->n_head_kv, hp->head_dim};
    const size_t f16_bpt = li_kv_bytes_per_token(&kvd, LI_TYPE_F16);
    const size_t budget = (size_t)(budget_gib * 1024.0 * 1024.0 * 1024.0);
    char b1[32], b2[32], rot[160] = "";
    if (m->rot_block) {
        uint32_t seed = 0;
        li_error e2 = {0};
        li_gguf_get_u32(&m->gguf, LI_ROT_KEY_SEED, &seed, &e2);
        snprintf(rot, sizeof rot, "hadamard v%d: norms folded, residual Q, online Hadamard before down_proj in "
                 "blocks of %d (seed %u)", LI_ROT_VERSION, m->rot_block, seed);
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "path", m->path);
        cJSON_AddStringToObject(j, "architecture", hp->arch);
        cJSON_AddNumberToObject(j, "n_params", (double)n_params);
        cJSON_AddNumberToObject(j, "file_bytes", (double)m->gguf.size);
        cJSON_AddNumberToObject(j, "bits_per_weight", bpw);
        cJSON_AddStringToObject(j, "scheme", li_scheme_name(m->quant_scheme));
        if (*qdesc) cJSON_AddStringToObject(j, "quantization", qdesc);
        if (m->rot_block) {
            cJSON *r = cJSON_AddObjectToObject(j, "rotation");
            cJSON_AddStringToObject(r, "method", LI_ROT_METHOD);
            cJSON_AddNumberToObject(r, "version", LI_ROT_VERSION);
            cJSON_AddNumberToObject(r, "down_block", m->rot_block);
        }
        cJSON *h = cJSON_AddObjectToObject(j, "hparams");
        cJSON_AddNumberToObject(h, "n_vocab", hp->n_vocab);
        cJSON_AddNumberToObject(h, "n_ctx_train", hp->n_ctx_train);
        cJSON_AddNumberToObject(h, "n_embd", hp->n_embd);
        cJSON_AddNumberToObject(h, "n_layer", hp->n_layer);
        cJSON_AddNumberToObject(h, "n_head", hp->n_head);
        cJSON_AddNumberToObject(h, "n_head_kv", hp->n_head_kv);
        cJSON_AddNumberToObject(h, "head_dim", hp->head_dim);
        cJSON_AddNumberToObject(h, "n_ff", hp->n_ff);
        if (hp->n_ff_layer) cJSON_AddItemToObject(h, "n_ff_layer", cJSON_CreateIntArray(hp->n_ff_layer, hp->n_layer));
        cJSON_AddNumberToObject(h, "n_rot", hp->n_rot);
        cJSON_AddNumberToObject(h, "rope_theta", hp->rope_theta);
        cJSON_AddNumberToObject(h, "norm_eps", hp->norm_eps);
        cJSON *ty = cJSON_AddObjectToObject(j, "tensor_types");
        for (int t = 0; t < LI_TYPE_COUNT; t++)
            if (st[t].count) {
                cJSON *e = json_type(ty, t, &st[t]);
                cJSON_AddNumberToObject(e, "bits_per_weight", 8.0 * (double)st[t].bytes / (double)st[t].elems);
                if (t == LI_TYPE_I8 && m->quant_scheme != LI_SCHEME_PLAIN)
                    cJSON_AddStringToObject(e, "scheme", li_scheme_name(m->quant_scheme));
            }
        if (tensors) {
            cJSON *tl = cJSON_AddArrayToObject(j, "tensors");
            for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
                const li_gguf_tensor *t = &m->gguf.tensors[i];
                cJSON *e = json_tensor(tl, t);
                cJSON_AddStringToObject(e, "scheme", is_companion(m, t) ? "scales" : tensor_scheme(m, t));
                if (!is_companion(m, t))
                    cJSON_AddNumberToObject(e, "bits_per_weight",
                                            8.0 * (double)(t->nbytes + companion_bytes(m, t)) / (double)tensor_elems(m, t));
            }
        }
        if (kv) {
            cJSON *k = cJSON_AddObjectToObject(j, "kv");
            cJSON_AddNumberToObject(k, "budget_bytes", (double)budget);
            cJSON_AddNumberToObject(k, "block_size", (double)block_size);
            for (size_t i = 0; i < LI_ARRAY_LEN(kv_types); i++) {
                cJSON *e = cJSON_AddObjectToObject(k, li_kv_dtype_name(kv_types[i]));
                int32_t nb = li_kv_blocks_for_budget(&kvd, kv_types[i], (int)block_size, budget);
                const size_t bpt = li_kv_bytes_per_token(&kvd, kv_types[i]);
                cJSON_AddNumberToObject(e, "bytes_per_token", (double)bpt);
                cJSON_AddNumberToObject(e, "scale_bytes_per_token",
                                        li_kv_dtype_has_scales(kv_types[i]) ? 2.0 * hp->n_layer * hp->n_head_kv * 4 : 0.0);
                cJSON_AddNumberToObject(e, "vs_f16", (double)bpt / (double)f16_bpt);
                cJSON_AddNumberToObject(e, "blocks", nb);
                cJSON_AddNumberToObject(e, "tokens", (double)nb * block_size);
            }
        }
        char *s = cJSON_Print(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("model:        %s\n", m->path);
        printf("architecture: %s\n", hp->arch);
        printf("parameters:   %.1f M   file: %s   weights: %.2f bits per weight\n", n_params / 1e6,
               human((double)m->gguf.size, b1, sizeof b1), bpw);
        if (*qdesc) printf("quantization: %s (luainfer quantize)\n", qdesc);
        if (*rot) printf("rotation:     %s\n", rot);
        printf("vocab %d, context %d, hidden %d, layers %d, heads %d (kv %d, dim %d), ffn %d%s\n", hp->n_vocab,
               hp->n_ctx_train, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff,
               hp->n_ff_layer ? " at most, per block:" : "");
        for (int l = 0; hp->n_ff_layer && l < hp->n_layer; l++)
            printf("%s%d%s", l % 10 ? " " : "  ", hp->n_ff_layer[l], l % 10 == 9 || l == hp->n_layer - 1 ? "\n" : "");
        printf("rope: %d dims, theta %g; rms eps %g; output %s\n", hp->n_rot, hp->rope_theta, hp->norm_eps,
               m->output.data == m->tok_embd.data ? "tied to embeddings" : "separate");
        printf("tokenizer: %d tokens, bos %d, eos %d, add_bos %s; chat template: %s\n",
               li_tokenizer_n_vocab(m->tok), li_tokenizer_bos(m->tok), li_tokenizer_eos(m->tok),
               li_tokenizer_add_bos(m->tok) ? "yes" : "no", m->chat_template ? "yes" : "none");
        printf("tensor types:\n");
        for (int t = 0; t < LI_TYPE_COUNT; t++)
            if (st[t].count)
                printf("  %-6s %4d tensors  %12lld params  %s  %.2f bpw\n",
                       t == LI_TYPE_I8 && m->quant_scheme != LI_SCHEME_PLAIN ? li_scheme_name(m->quant_scheme)
                                                                             : li_type_name((uint32_t)t),
                       st[t].count, (long long)st[t].elems, human((double)st[t].bytes, b1, sizeof b1),
                       8.0 * (double)st[t].bytes / (double)st[t].elems);
        if (tensors)
            for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
                const li_gguf_tensor *t = &m->gguf.tensors[i];
                if (is_companion(m, t)) continue; /* shown with its weight */
                printf("  %-32.*s %-5s [%lld, %lld] %s  %.2f bpw\n", (int)LI_MIN(t->name.len, 64), t->name.ptr,
                       tensor_scheme(m, t), (long long)t->ne[0], (long long)t->ne[1],
                       human((double)(t->nbytes + companion_bytes(m, t)), b1, sizeof b1),
                       8.0 * (double)(t->nbytes + companion_bytes(m, t)) / (double)tensor_elems(m, t));
            }
        if (kv) {
            printf("KV cache (block size %lld, budget %s):\n", (long long)block_size, human((double)budget, b1, sizeof b1));
            for (size_t i = 0; i < LI_ARRAY_LEN(kv_types); i++) {
                int32_t nb = li_kv_blocks_for_budget(&kvd, kv_types[i], (int)block_size, budget);
                const size_t bpt = li_kv_bytes_per_token(&kvd, kv_types[i]);
                printf("  %-5s %s per token (%.2fx f16%s)  -> %lld tokens (%d blocks)\n", li_kv_dtype_name(kv_types[i]),
                       human((double)bpt, b2, sizeof b2), (double)bpt / (double)f16_bpt,
                       li_kv_dtype_has_scales(kv_types[i]) ? ", f32 scale per token and kv head" : "",
                       (long long)nb * block_size, nb);
            }
        }
    }
    li_model_free(m);
    return 0;
}
