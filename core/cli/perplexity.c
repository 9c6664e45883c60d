/* perplexity.c — `luainfer perplexity`: llama.cpp's perplexity scheme.
 *
 * The file is tokenized whole and cut into floor(n/ctx) chunks of ctx tokens.
 * Each chunk is evaluated from an empty cache, and only the second half is
 * scored (positions j = ctx/2 .. ctx-2 predict token j+1), so every scored
 * token sees at least ctx/2 tokens of context. Same scheme, same numbers as
 * llama.cpp's `llama-perplexity`. */
#include "runtime/args.h"
#include "cli/cli.h"
#include "engine/session.h"
#include "quant/kld.h"
#include "tokenizer/tokenizer.h"
#include "util/utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int li_cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *isa = "auto", *kv_dtype_s = "f16";
    const char *kl_out = NULL, *kl_base = NULL, *q4_act = NULL, *device = NULL;
    int64_t ctx = 512, threads = 0, batch = 512, max_chunks = 0;
    bool json = false, help = false;
    li_opt opts[] = {
        {"model", LI_OPT_STR, &model, "GGUF model (default: $LUAINFER_MODEL or the bundled SmolLM2)"},
        {"file", LI_OPT_STR, &file, "text file to score (required)"},
        {"ctx", LI_OPT_INT, &ctx, "tokens per chunk (default 512)"},
        {"chunks", LI_OPT_INT, &max_chunks, "score at most this many chunks (default: all)"},
        {"batch-size", LI_OPT_INT, &batch, "tokens per forward pass (default 512)"},
        {"threads", LI_OPT_INT, &threads, "compute threads (default: all cores)"},
        {"kv-dtype", LI_OPT_STR, &kv_dtype_s, "KV cache dtype: f16, bf16, f32, fp8 (E4M3) or int8; 8-bit ones keep an f32 scale per token and kv head (default f16)"},
        {"q4-act", LI_OPT_STR, &q4_act, "4-bit group weights (awq, gptq, rtn4): f32 activations (A16, the reference bits) or int8 (A8, quantized per row on the fly) (default f32)"},
        {"isa", LI_OPT_STR, &isa, "CPU kernels: auto, scalar, avx2, avx512, amx (AVX-512 with AMX tiles for quantized matmul), or ggml (llama.cpp's x86 arithmetic, bit for bit; slower)"},
        {"device", LI_OPT_STR, &device, "compute device: cpu, or cuda / cuda:N (the CUDA backend, docs/cuda.md) (default cpu)"},
        {"kl-base-out", LI_OPT_STR, &kl_out, "save this model's distributions at the scored positions (a baseline for --kl-base)"},
        {"kl-base", LI_OPT_STR, &kl_base, "KL divergence, 99th percentile and top-1 agreement against a saved baseline"},
        {"json", LI_OPT_FLAG, &json, "print a JSON object"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1];
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 0, &n_pos, &err))) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("perplexity", "--file TEXT [options]", opts, n_opts);
        return 0;
    }
    if (!file) return li_runtime_fail(&(li_error){LI_EINVAL, "perplexity: --file is required"});
    if (ctx < 4 || ctx > (1 << 20)) return li_runtime_fail(&(li_error){LI_EINVAL, "perplexity: --ctx must be in [4, 1048576]"});
    if (batch <= 0 || batch > 8192) return li_runtime_fail(&(li_error){LI_EINVAL, "perplexity: --batch-size must be in [1, 8192]"});
    if (max_chunks < 0) return li_runtime_fail(&(li_error){LI_EINVAL, "perplexity: --chunks must be >= 0"});
    if (kl_out && kl_base) return li_runtime_fail(&(li_error){LI_EINVAL, "perplexity: --kl-base-out and --kl-base exclude each other"});
    li_type kv_dtype;
    if ((rc = li_kv_dtype_parse(kv_dtype_s, &kv_dtype, &err))) return li_runtime_fail(&err);
    char *text = NULL;
    size_t len = 0;
    if ((rc = li_read_text(file, (size_t)1 << 30, "text file", &text, &len, &err))) return li_runtime_fail(&err);

    li_runtime rt;
    if ((rc = li_runtime_open_device(&rt, model, threads, isa, device, "--device", &err))) {
        free(text);
        return li_runtime_fail(&err);
    }
    if ((rc = li_runtime_set_q4_act(&rt, q4_act, "--q4-act", &err))) {
        free(text);
        li_runtime_close(&rt);
        return li_runtime_fail(&err);
    }
    li_model *m = rt.model;
    int status = 1;
    int32_t *toks = NULL, *chunk = NULL;
    size_t n_tok = 0;
    float *logits = NULL;
    li_session sess;
    bool sess_ok = false;
    li_kld kld = {0};
    li_kld_stats kst = {0};
    if (ctx > m->hp.n_ctx_train) {
        li_error_set(&err, LI_ERANGE, "perplexity: --ctx %lld exceeds the model's context %d", (long long)ctx,
                     m->hp.n_ctx_train);
        goto done;
    }
    if ((rc = li_tokenizer_encode(m->tok, text, len, false, false, &toks, &n_tok, &err))) goto done;
    const bool bos = li_tokenizer_add_bos(m->tok) && li_tokenizer_bos(m->tok) >= 0;
    int64_t n_chunks = (int64_t)n_tok / ctx;
    if (max_chunks > 0) n_chunks = LI_MIN(n_chunks, max_chunks);
    if (n_chunks == 0) {
        li_error_set(&err, LI_EINVAL, "perplexity: '%s' has %zu tokens, fewer than one chunk of %lld", file, n_tok,
                     (long long)ctx);
        goto done;
    }
    if ((rc = li_session_init(&sess, m, &rt.be, ctx, kv_dtype, LI_MIN(batch, ctx), &err))) goto done;
    sess_ok = true;
    if (kl_out && (rc = li_kld_create(&kld, kl_out, m->hp.n_vocab, &err))) goto done;
    if (kl_base && (rc = li_kld_open(&kld, kl_base, m->hp.n_vocab, &err))) goto done;
    const int32_t nv = m->hp.n_vocab;
    logits = li_xmalloc((size_t)ctx * nv * sizeof(float));
    chunk = li_xmalloc((size_t)ctx * sizeof(int32_t));
    double nll = 0;
    int64_t scored = 0;
    const int64_t first = ctx / 2;
    double t0 = li_time_now();
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, toks + c * ctx, (size_t)ctx * sizeof(int32_t));
        if (bos) chunk[0] = li_tokenizer_bos(m->tok); /* as llama.cpp: BOS replaces the first token */
        li_session_reset(&sess);
        if ((rc = li_session_eval(&sess, chunk, ctx, true, logits, &err))) goto done;
        for (int64_t j = first; j < ctx - 1; j++) {
            const float *lg = logits + j * nv;
            float mx = lg[0];
            for (int32_t i = 1; i < nv; i++) mx = lg[i] > mx ? lg[i] : mx;
            double sum = 0;
            for (int32_t i = 0; i < nv; i++) sum += exp((double)lg[i] - mx);
            const double t = -((double)lg[toks[c * ctx + j + 1]] - mx - log(sum));
            if (!isfinite(t)) { /* a perplexity of nan (and JSON that no parser reads) says less */
                li_error_set(&err, LI_EINVAL,
                             "perplexity: chunk %lld, position %lld: the model's logits hold NaN or Inf (its weights "
                             "or activations)", (long long)c + 1, (long long)j);
                goto done;
            }
            nll += t;
            scored++;
            if ((kl_out || kl_base) && (rc = li_kld_add(&kld, lg, toks[c * ctx + j + 1], &err))) goto done;
        }
        if (!json)
            fprintf(stderr, "[%lld/%lld] running perplexity %.4f\n", (long long)c + 1, (long long)n_chunks,
                    exp(nll / scored));
    }
    double ppl = exp(nll / scored), secs = li_time_now() - t0;
    if ((kl_out || kl_base) && (rc = li_kld_finish(&kld, &kst, &err))) goto done;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "perplexity", ppl);
        cJSON_AddNumberToObject(j, "n_chunks", (double)n_chunks);
        cJSON_AddNumberToObject(j, "n_scored", (double)scored);
        cJSON_AddNumberToObject(j, "ctx", (double)ctx);
        cJSON_AddNumberToObject(j, "n_tokens", (double)n_tok);
        cJSON_AddNumberToObject(j, "seconds", secs);
        if (kl_base) {
            cJSON_AddNumberToObject(j, "kl_mean", kst.kl_mean);
            cJSON_AddNumberToObject(j, "kl_p99", kst.kl_p99);
            cJSON_AddNumberToObject(j, "kl_max", kst.kl_max);
            cJSON_AddNumberToObject(j, "top1_agree", kst.top1_agree);
            cJSON_AddNumberToObject(j, "base_perplexity", kst.base_ppl);
        }
        char *s = cJSON_PrintUnformatted(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("perplexity: %.4f (%lld chunks of %lld tokens, %lld scored, %.1f s)\n", ppl, (long long)n_chunks,
               (long long)ctx, (long long)scored, secs);
        if (kl_base)
            printf("vs baseline (perplexity %.4f): mean KL %.6f, 99th percentile %.6f, max %.4f, top-1 agreement "
                   "%.2f%%\n", kst.base_ppl, kst.kl_mean, kst.kl_p99, kst.kl_max, 100 * kst.top1_agree);
    }
    status = 0;
done:
    if (status) li_runtime_fail(&err);
    li_kld_free(&kld);
    if (sess_ok) li_session_free(&sess);
    free(chunk);
    free(logits);
    free(toks);
    free(text);
    li_runtime_close(&rt);
    return status;
}
