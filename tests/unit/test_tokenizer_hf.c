/* test_tokenizer_hf.c — the tokenizer read from a Hugging Face directory's
 * tokenizer.json against HF `tokenizers` and against the GGUF's tokenizer.
 *
 *   LUAINFER_HF_DIR=DIR test_tokenizer_hf
 *
 * DIR is what tools/gguf_to_hf.py made from the default GGUF (tokenizer.json
 * written by the `tokenizers` package); tests/integration/test_hf.py makes
 * one and runs this. Checks: every string of the 10,000-string golden set
 * (tests/golden/tokenizer_smollm2.jsonl.gz, HF tokenizers' ids) encodes to
 * the golden ids and decodes back; and the two loaders built the same
 * tokenizer: vocabulary texts, token types, pieces, bos/eos/unk, add_bos,
 * end-of-generation ids. Without LUAINFER_HF_DIR or the model it prints
 * SKIP and exits 77. */
#define _POSIX_C_SOURCE 200809L
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GOLDEN "tests/golden/tokenizer_smollm2.jsonl.gz"

static void test_golden(const li_tokenizer *t) {
    char path[1024], cmd[1100];
    const char *root = getenv("LUAINFER_SOURCE_DIR");
    snprintf(path, sizeof path, "%s%s%s", root && *root ? root : "", root && *root ? "/" : "", GOLDEN);
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run %s", cmd);
    if (!f) return;
    size_t n = 0, same = 0, rt_n = 0, rt_ok = 0, shown = 0;
    char *line = NULL, dec[1 << 16];
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "text");
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "ids");
        if (!cJSON_IsString(jt) || !cJSON_IsArray(ji)) {
            CHECK(0, "line %zu lacks text/ids", n + 1);
            cJSON_Delete(j);
            continue;
        }
        const char *text = jt->valuestring;
        size_t len = strlen(text), n_ids;
        int n_ref = cJSON_GetArraySize(ji);
        int32_t *ref = malloc(((size_t)n_ref + 1) * sizeof *ref), *ids;
        int i = 0;
        for (const cJSON *x = ji->child; x; x = x->next) ref[i++] = (int32_t)x->valuedouble;
        li_error err = {0};
        int rc = li_tokenizer_encode(t, text, len, false, true, &ids, &n_ids, &err);
        CHECK(rc == 0, "encode: %s", err.msg);
        n++;
        if (n_ids == (size_t)n_ref && (n_ids == 0 || !memcmp(ids, ref, n_ids * sizeof *ids))) same++;
        else if (shown++ < 10) fprintf(stderr, "MISMATCH text=\"%.80s\"\n", text);
        if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "rt"))) {
            rt_n++;
            long dn = li_tokenizer_decode(t, ids, n_ids, true, dec, sizeof dec);
            if (dn == (long)len && !memcmp(dec, text, len)) rt_ok++;
        }
        free(ids);
        free(ref);
        cJSON_Delete(j);
    }
    free(line);
    CHECK(pclose(f) == 0 && n > 0, "reading %s failed", path);
    printf("tokenizer.json: %zu/%zu identical to HF tokenizers, %zu/%zu round-trip\n", same, n, rt_ok, rt_n);
    CHECK(same == n, "%zu of %zu strings differ from HF", n - same, n);
    CHECK(rt_ok == rt_n, "%zu of %zu strings do not round-trip", rt_n - rt_ok, rt_n);
    CHECK(n >= 10000, "golden corpus has only %zu strings", n);
}

/* The tokenizer.json loader and the GGUF loader must agree on everything. */
static void test_same(const li_tokenizer *h, const li_tokenizer *g) {
    CHECK(li_tokenizer_n_vocab(h) == li_tokenizer_n_vocab(g), "n_vocab %d vs %d", li_tokenizer_n_vocab(h),
          li_tokenizer_n_vocab(g));
    CHECK(li_tokenizer_bos(h) == li_tokenizer_bos(g), "bos %d vs %d", li_tokenizer_bos(h), li_tokenizer_bos(g));
    CHECK(li_tokenizer_eos(h) == li_tokenizer_eos(g), "eos %d vs %d", li_tokenizer_eos(h), li_tokenizer_eos(g));
    CHECK(li_tokenizer_add_bos(h) == li_tokenizer_add_bos(g), "add_bos");
    CHECK(li_tokenizer_vocab_hash(h) == li_tokenizer_vocab_hash(g), "vocab hash %016llx vs %016llx",
          (unsigned long long)li_tokenizer_vocab_hash(h), (unsigned long long)li_tokenizer_vocab_hash(g));
    int bad_text = 0, bad_type = 0, bad_piece = 0, bad_eog = 0;
    int32_t n = LI_MIN(li_tokenizer_n_vocab(h), li_tokenizer_n_vocab(g));
    for (int32_t id = 0; id < n; id++) {
        size_t a, b;
        const char *ta = li_tokenizer_token_text(h, id, &a), *tb = li_tokenizer_token_text(g, id, &b);
        bad_text += a != b || memcmp(ta, tb, a);
        bad_type += li_tokenizer_token_type(h, id) != li_tokenizer_token_type(g, id);
        char pa[256], pb[256];
        int na = li_tokenizer_token_to_piece(h, id, true, pa, sizeof pa);
        int nb = li_tokenizer_token_to_piece(g, id, true, pb, sizeof pb);
        bad_piece += na != nb || (na > 0 && memcmp(pa, pb, (size_t)LI_MIN(na, 256)));
        bad_eog += li_tokenizer_is_eog(h, id) != li_tokenizer_is_eog(g, id);
    }
    CHECK(!bad_text, "%d token texts differ", bad_text);
    CHECK(!bad_type, "%d token types differ", bad_type);
    CHECK(!bad_piece, "%d token pieces differ", bad_piece);
    CHECK(!bad_eog, "%d end-of-generation flags differ", bad_eog);
}

int main(void) {
    const char *dir = getenv("LUAINFER_HF_DIR");
    if (!dir || !*dir) {
        printf("SKIP: LUAINFER_HF_DIR is not set (tests/integration/test_hf.py makes a directory and runs this)\n");
        return 77;
    }
    const char *gpath = li_model_default_path(NULL);
    struct stat sb;
    if (stat(gpath, &sb) != 0) {
        printf("SKIP: no model at %s\n", gpath);
        return 77;
    }
    li_error err = {0};
    li_model *hm, *gm;
    if (li_model_load(&hm, dir, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    if (li_model_load(&gm, gpath, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    CHECK(hm->hf != NULL && gm->hf == NULL, "the directory loaded as a Hugging Face model");
    CHECK(hm->chat_template && gm->chat_template && !strcmp(hm->chat_template, gm->chat_template),
          "chat template differs");
    test_same(hm->tok, gm->tok);
    test_golden(hm->tok);
    li_model_free(hm);
    li_model_free(gm);
    return t_summary("tokenizer_hf");
}
