/* generate.c — `luainfer generate`: one prompt, one stream of text.
 *
 * Tokenize (optionally through the model's chat template) and run one
 * request through the engine — the same step loop the server uses — and
 * stream the text deltas it emits (stop strings are held back by the
 * engine until they can no longer match). */
#include "runtime/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "lua/lua_env.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gen_opts {
    const char *model, *draft, *prompt, *system, *isa, *kv_dtype, *spec_method, *medusa, *medusa_tree, *eagle;
    int64_t spec_k, spec_layers;
    int64_t tensor_parallel;
    bool chat, json, help;
    int64_t max_tokens, top_k, seed, threads, ctx_size, batch_size, top_logits, logprobs;
    double temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int64_t penalty_last_n;
    li_str_list stop, logit_bias;
    const char *q4_act;
    const char *device; /* --device: cpu or cuda */
} gen_opts;

typedef struct gen_state {
    bool json;
    int64_t top_logits;
    cJSON *jtop, *jlp;
    li_token_logprob *top;
} gen_state;

/* Engine callback: stream text, or collect what --json reports. */
static void on_event(void *ud, const li_event *ev) {
    gen_state *g = ud;
    if (ev->kind != LI_EVENT_TOKEN) return;
    if (!g->json && ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
    }
    if (ev->token < 0) return; /* a text flush, not a token */
    if (g->jtop && ev->logits) {
        li_logits_top(ev->logits, ev->n_vocab, (int32_t)g->top_logits, g->top, false);
        cJSON *row = cJSON_CreateArray();
        for (int64_t i = 0; i < g->top_logits && i < ev->n_vocab; i++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(g->top[i].id));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(g->top[i].logprob));
            cJSON_AddItemToArray(row, pair);
        }
        cJSON_AddItemToArray(g->jtop, row);
    }
    if (g->jlp) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", ev->token);
        cJSON_AddNumberToObject(e, "logprob", ev->logprob);
        cJSON *alts = cJSON_AddArrayToObject(e, "top");
        for (int32_t i = 0; i < ev->n_top; i++) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", ev->top[i].id);
            cJSON_AddNumberToObject(a, "logprob", ev->top[i].logprob);
            cJSON_AddItemToArray(alts, a);
        }
        cJSON_AddItemToArray(g->jlp, e);
    }
}

/* --logit-bias values as llama.cpp writes them: "15043+1", "15043-1", and
 * "15043=-1". */
static int parse_logit_bias(const li_str_list *l, li_logit_bias *out, li_error *err) {
    for (int i = 0; i < l->n; i++) {
        const char *s = l->items[i];
        char *end;
        if (*s < '0' || *s > '9') goto bad;
        errno = 0;
        long id = strtol(s, &end, 10);
        if (errno || id > INT32_MAX || (*end != '+' && *end != '-' && *end != '=')) goto bad;
        const char *b = *end == '=' ? end + 1 : end;
        double bias = strtod(b, &end);
        if (end == b || *end) goto bad;
        out[i] = (li_logit_bias){(int32_t)id, (float)bias};
        continue;
    bad:
        return li_error_set(err, LI_EINVAL, "generate: --logit-bias '%s' is not ID+BIAS, ID-BIAS or ID=BIAS", s);
    }
    return 0;
}

int li_cmd_generate(int argc, char **argv) {
    gen_opts o = {
        .kv_dtype = "f16", .isa = "auto", .max_tokens = 128, .top_k = 40, .seed = -1, .threads = 0,
        .ctx_size = 0, .batch_size = 512, .temperature = 0.8, .top_p = 0.95, .min_p = 0.05,
        .repeat_penalty = 1.0, .penalty_last_n = 64, .tensor_parallel = 1,
    };
    li_opt opts[] = {
        {"model", LI_OPT_STR, &o.model, "GGUF model (default: $LUAINFER_MODEL or the bundled SmolLM2)"},
        {"draft-model", LI_OPT_STR, &o.draft, "draft GGUF with the model's vocabulary, run next to it over the same KV blocks; drafts with --spec-k (default: none)"},
        {"draft", LI_OPT_STR, &o.draft, "the same as --draft-model"},
        {"medusa", LI_OPT_STR, &o.medusa, "Medusa heads made for the model (luainfer train-medusa): drafts a tree of their top-k, verified in one pass (default: none)"},
        {"medusa-tree", LI_OPT_STR, &o.medusa_tree, "the Medusa tree: paths of candidate ranks, e.g. '0;1;0,0;1,0;0,0,0' (default: a sparse 15-node tree)"},
        {"eagle", LI_OPT_STR, &o.eagle, "an EAGLE draft made for the model (luainfer train-eagle): drafts a chain from the model's own hidden states (default: none)"},
        {"spec-method", LI_OPT_STR, &o.spec_method, "speculation proposer: ngram, draft, layerskip, medusa or eagle (default: layerskip with --spec-layers, medusa with heads, eagle with an EAGLE draft, draft with a draft model, else ngram)"},
        {"spec-k", LI_OPT_INT, &o.spec_k, "speculation: draft tokens per decode step, 0..16 (default 0 = off)"},
        {"spec-layers", LI_OPT_INT, &o.spec_layers, "layerskip: draft with the model's first N blocks and its head (default 0 = no layerskip)"},
        {"prompt", LI_OPT_STR, &o.prompt, "prompt text (required)"},
        {"chat", LI_OPT_FLAG, &o.chat, "format the prompt as a user message with the model's chat template"},
        {"system", LI_OPT_STR, &o.system, "system message for --chat"},
        {"max-tokens", LI_OPT_INT, &o.max_tokens, "tokens to generate (default 128)"},
        {"temperature", LI_OPT_FLOAT, &o.temperature, "0 = greedy (default 0.8)"},
        {"top-k", LI_OPT_INT, &o.top_k, "top-k, 0 = off (default 40)"},
        {"top-p", LI_OPT_FLOAT, &o.top_p, "nucleus sampling, 1 = off (default 0.95)"},
        {"min-p", LI_OPT_FLOAT, &o.min_p, "min-p, 0 = off (default 0.05)"},
        {"repeat-penalty", LI_OPT_FLOAT, &o.repeat_penalty, "repetition penalty, 1 = off (default 1)"},
        {"presence-penalty", LI_OPT_FLOAT, &o.presence_penalty, "presence penalty (default 0)"},
        {"frequency-penalty", LI_OPT_FLOAT, &o.frequency_penalty, "frequency penalty (default 0)"},
        {"penalty-last-n", LI_OPT_INT, &o.penalty_last_n, "tokens the penalties look back, -1 = all (default 64)"},
        {"seed", LI_OPT_INT, &o.seed, "sampling seed (default: random)"},
        {"stop", LI_OPT_STR_LIST, &o.stop, "stop string (repeatable)"},
        {"logit-bias", LI_OPT_STR_LIST, &o.logit_bias, "ID+BIAS, ID-BIAS or ID=BIAS: add BIAS (-100..100) to token ID's logit (repeatable; -100 bans it)"},
        {"json", LI_OPT_FLAG, &o.json, "print one JSON object instead of streaming text"},
        {"top-logits", LI_OPT_INT, &o.top_logits, "with --json: raw logits of the K best tokens per step"},
        {"logprobs", LI_OPT_INT, &o.logprobs, "with --json: top-N logprobs per generated token (0..20)"},
        {"threads", LI_OPT_INT, &o.threads, "compute threads (default: all cores)"},
        {"tensor-parallel", LI_OPT_INT, &o.tensor_parallel, "split the model over N ranks (threads; docs/parallel.md), at most its KV heads (default 1)"},
        {"ctx-size", LI_OPT_INT, &o.ctx_size, "context length (default: the model's, at most 8192)"},
        {"batch-size", LI_OPT_INT, &o.batch_size, "prompt tokens per forward pass (default 512)"},
        {"kv-dtype", LI_OPT_STR, &o.kv_dtype, "KV cache dtype: f16, bf16, f32, fp8 (E4M3) or int8; 8-bit ones keep an f32 scale per token and kv head (default f16)"},
        {"q4-act", LI_OPT_STR, &o.q4_act, "4-bit group weights (awq, gptq, rtn4): f32 activations (A16, the reference bits) or int8 (A8, quantized per row on the fly) (default f32)"},
        {"isa", LI_OPT_STR, &o.isa, "CPU kernels: auto, scalar, avx2, avx512, amx (AVX-512 with AMX tiles for quantized matmul), or ggml (llama.cpp's x86 arithmetic, bit for bit; slower) (default auto)"},
        {"device", LI_OPT_STR, &o.device, "compute device: cpu, or cuda / cuda:N (the CUDA backend, docs/cuda.md) (default cpu)"},
        {"help", LI_OPT_FLAG, &o.help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 0, &n_pos, &err))) return li_runtime_fail(&err);
    if (o.help) {
        li_args_usage("generate", "--prompt TEXT [options]", opts, n_opts);
        return 0;
    }
    if (!o.prompt) return li_runtime_fail(&(li_error){LI_EINVAL, "generate: --prompt is required"});
    if (!*o.prompt) return li_runtime_fail(&(li_error){LI_EINVAL, "generate: the prompt is empty"});
    if (o.max_tokens < 0 || o.max_tokens > 1 << 20)
        return li_runtime_fail(&(li_error){LI_EINVAL, "generate: --max-tokens must be in [0, 1048576]"});
    if (o.top_logits < 0 || o.top_logits > 1000)
        return li_runtime_fail(&(li_error){LI_EINVAL, "generate: --top-logits must be in [0, 1000]"});
    if (o.batch_size <= 0 || o.batch_size > 8192)
        return li_runtime_fail(&(li_error){LI_EINVAL, "generate: --batch-size must be in [1, 8192]"});
    for (int i = 0; i < o.stop.n; i++)
        if (!*o.stop.items[i]) return li_runtime_fail(&(li_error){LI_EINVAL, "generate: --stop strings must not be empty"});
    li_sampling_params sp = {
        .temperature = (float)o.temperature, .top_k = (int32_t)LI_MIN(LI_MAX(o.top_k, -1), INT32_MAX),
        .top_p = (float)o.top_p, .min_p = (float)o.min_p, .repeat_penalty = (float)o.repeat_penalty,
        .presence_penalty = (float)o.presence_penalty, .frequency_penalty = (float)o.frequency_penalty,
        .penalty_last_n = (int32_t)LI_MAX(LI_MIN(o.penalty_last_n, INT32_MAX), -2),
        .seed = o.seed >= 0 ? (uint64_t)o.seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32),
        .n_logprobs = (int32_t)LI_MAX(LI_MIN(o.logprobs, 1000), -1),
    };
    li_logit_bias bias[LI_LOGIT_BIAS_MAX];
    if (o.logit_bias.n > LI_LOGIT_BIAS_MAX)
        return li_runtime_fail(&(li_error){LI_EINVAL, "generate: at most 1024 --logit-bias entries"});
    if ((rc = parse_logit_bias(&o.logit_bias, bias, &err))) return li_runtime_fail(&err);
    sp.logit_bias = bias;
    sp.n_logit_bias = o.logit_bias.n;
    if ((rc = li_sampling_params_validate(&sp, &err))) return li_runtime_fail(&err);
    li_type kv_dtype;
    if ((rc = li_kv_dtype_parse(o.kv_dtype, &kv_dtype, &err))) return li_runtime_fail(&err);

    if (o.tensor_parallel < 1 || o.tensor_parallel > 64)
        return li_runtime_fail(&(li_error){LI_EINVAL, "--tensor-parallel must be in [1, 64]"});
    li_runtime rt;
    if ((rc = li_runtime_open_device(&rt, o.model, o.threads, o.isa, o.device, "--device", &err))) return li_runtime_fail(&err);
    if ((o.draft && (rc = li_runtime_open_draft(&rt, o.draft, &err))) ||
        (o.medusa && (rc = li_runtime_open_medusa(&rt, o.medusa, o.medusa_tree, &err))) ||
        (o.eagle && (rc = li_runtime_open_eagle(&rt, o.eagle, &err))) ||
        (!o.medusa && o.medusa_tree && (rc = li_error_set(&err, LI_EINVAL, "--medusa-tree needs --medusa FILE"))) ||
        (rc = li_runtime_set_q4_act(&rt, o.q4_act, "--q4-act", &err))) {
        li_runtime_close(&rt);
        return li_runtime_fail(&err);
    }
    li_model *m = rt.model;
    const li_tokenizer *tok = m->tok;
    int status = 1;
    char *chat_text = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    li_token_logprob *top = NULL;
    cJSON *jtop = NULL, *jlp = NULL;
    li_engine *eng = NULL;

    const char *input = o.prompt;
    if (o.chat) {
        lua_State *L = li_lua_new(&err);
        if (!L) goto done;
        li_chat_msg msgs[2];
        int nm = 0;
        if (o.system) msgs[nm++] = (li_chat_msg){"system", o.system};
        msgs[nm++] = (li_chat_msg){"user", o.prompt};
        rc = li_chat_format(L, m->chat_template, msgs, nm, true, &chat_text, &err);
        lua_close(L);
        if (rc) goto done;
        input = chat_text;
    }
    if ((rc = li_tokenizer_encode(tok, input, strlen(input), true, true, &prompt, &n_prompt, &err))) goto done;
    if (n_prompt == 0) {
        li_error_set(&err, LI_EINVAL, "generate: the prompt has no tokens");
        goto done;
    }
    int64_t n_ctx = o.ctx_size > 0 ? o.ctx_size : LI_MIN(m->hp.n_ctx_train, 8192);
    if (o.ctx_size < 0 || n_ctx > (1 << 20)) {
        li_error_set(&err, LI_EINVAL, "generate: --ctx-size must be in [1, 1048576]");
        goto done;
    }
    if ((int64_t)n_prompt >= n_ctx) {
        li_error_set(&err, LI_ERANGE, "generate: the prompt has %zu tokens, the context holds %lld", n_prompt,
                     (long long)n_ctx);
        goto done;
    }
    li_engine_config ec;
    li_engine_config_default(&ec);
    if ((rc = li_runtime_spec_config(&ec, &rt, o.spec_method, o.spec_k, o.spec_layers, "--spec-", &err)))
        goto done;
    ec.kv_dtype = kv_dtype;
    ec.max_num_seqs = 1;
    ec.tensor_parallel = (int32_t)o.tensor_parallel;
    ec.max_batched_tokens = (int32_t)o.batch_size;
    ec.max_model_len = n_ctx;
    ec.device_sampling = o.top_logits <= 0; /* --top-logits reads every step's logits */
    /* one request's context; a draft's storage needs its share of the budget too */
    size_t bpt = li_kv_bytes_per_token(&(li_kv_dims){m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim}, kv_dtype);
    if (rt.draft)
        bpt += li_kv_bytes_per_token(&(li_kv_dims){rt.draft->hp.n_layer, rt.draft->hp.n_head_kv, rt.draft->hp.head_dim},
                                     kv_dtype);
    ec.kv_memory = bpt * (size_t)(n_ctx + ec.block_size);
    if ((rc = li_engine_init_runners(&eng, m, rt.draft, &rt.be, &ec, &err))) goto done;
    gen_state g = {.json = o.json, .top_logits = o.top_logits};
    g.top = li_xmalloc((size_t)LI_MAX(o.top_logits, 1) * sizeof *g.top);
    if (o.json && o.top_logits > 0) g.jtop = cJSON_CreateArray();
    if (o.json && sp.n_logprobs > 0) g.jlp = cJSON_CreateArray();
    jtop = g.jtop;
    jlp = g.jlp;
    top = g.top;
    li_request_params rp = {
        .prompt = prompt, .n_prompt = (int64_t)n_prompt, .sampling = sp, .max_tokens = o.max_tokens,
        .stop = o.stop.items, .n_stop = o.stop.n, .on_event = on_event, .ud = &g,
    };
    int64_t id;
    if ((rc = li_engine_add(eng, &rp, &id, &err))) goto done;
    while (li_engine_has_work(eng))
        if ((rc = li_engine_step(eng, &err))) goto done;
    const li_request_result *res = li_engine_result(eng, id);
    /* the first token's time splits prefill from decode */
    double t_first = res->t_first_token >= 0 ? res->t_first_token : res->t_finish;
    double prefill_ms = (t_first - res->t_arrival) * 1e3;
    double decode_ms = (res->t_finish - t_first) * 1e3;
    int64_t n_gen = res->n_tokens;
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "text", res->text);
        cJSON *jt = cJSON_AddArrayToObject(j, "tokens");
        for (int64_t i = 0; i < n_gen; i++) cJSON_AddItemToArray(jt, cJSON_CreateNumber(res->tokens[i]));
        cJSON *jp = cJSON_AddArrayToObject(j, "prompt_tokens");
        for (size_t i = 0; i < n_prompt; i++) cJSON_AddItemToArray(jp, cJSON_CreateNumber(prompt[i]));
        cJSON_AddStringToObject(j, "finish_reason", res->finish_reason);
        cJSON *tm = cJSON_AddObjectToObject(j, "timings");
        cJSON_AddNumberToObject(tm, "prefill_ms", prefill_ms);
        cJSON_AddNumberToObject(tm, "decode_ms", decode_ms);
        cJSON_AddNumberToObject(tm, "prefill_tokens_per_s", prefill_ms > 0 ? n_prompt / (prefill_ms / 1e3) : 0);
        /* the first token comes with the prefill: decode rate counts the rest */
        cJSON_AddNumberToObject(tm, "decode_tokens_per_s", decode_ms > 0 && n_gen > 1 ? (n_gen - 1) / (decode_ms / 1e3) : 0);
        if (jtop) { cJSON_AddItemToObject(j, "top_logits", jtop); jtop = NULL; }
        if (jlp) { cJSON_AddItemToObject(j, "logprobs", jlp); jlp = NULL; }
        if (ec.spec_tokens) {
            li_engine_stats st;
            li_engine_stats_get(eng, &st);
            cJSON *js = cJSON_AddObjectToObject(j, "speculation");
            cJSON_AddStringToObject(js, "method", li_spec_method_name(ec.spec_method));
            cJSON_AddNumberToObject(js, "drafted", (double)st.spec_drafted);
            cJSON_AddNumberToObject(js, "accepted", (double)st.spec_accepted);
        }
        char *s = cJSON_PrintUnformatted(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("\n");
        fprintf(stderr, "luainfer: prompt %zu tokens in %.0f ms (%.1f tok/s), generated %lld tokens in %.0f ms (%.1f tok/s), finish: %s\n",
                n_prompt, prefill_ms, prefill_ms > 0 ? n_prompt / (prefill_ms / 1e3) : 0, (long long)n_gen,
                decode_ms, decode_ms > 0 && n_gen > 1 ? (n_gen - 1) / (decode_ms / 1e3) : 0, res->finish_reason);
    }
    /* the engine logged why (logits without a finite value: NaN or Inf in the model) */
    if (!strcmp(res->finish_reason, "error")) {
        li_error_set(&err, LI_EINVAL, "generate: the request ended with an error (the log above says why)");
        goto done;
    }
    status = 0;
done:
    if (status) li_runtime_fail(&err);
    cJSON_Delete(jtop);
    cJSON_Delete(jlp);
    li_engine_free(eng);
    free(top);
    free(prompt);
    free(chat_text);
    free((void *)o.stop.items);
    free((void *)o.logit_bias.items);
    li_runtime_close(&rt);
    return status;
}
