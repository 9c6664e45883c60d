/* test_tokenizer_pretok.c — the pre-tokenizer scanners against HF's splits.
 *
 * tests/golden/tokenizer_pretok.jsonl.gz (tools/gen_tokenizer_golden.py)
 * has, per string, the byte lengths of the words HF's pre-tokenizers cut it
 * into for the GPT-2, SmolLM (digits first) and Llama 3 rules. This checks
 * the scanners alone, so the Llama 3 one is covered without a Llama 3 vocab. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tok_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct words {
    size_t lens[4096];
    size_t n;
    size_t next; /* where the next word must start */
    bool gap;    /* words must tile the text */
} words;

static void on_word(void *ctx, size_t start, size_t end) {
    words *w = ctx;
    if (start != w->next) w->gap = true;
    w->next = end;
    if (w->n < LI_ARRAY_LEN(w->lens)) w->lens[w->n++] = end - start;
}

int main(void) {
    static const struct { const char *name; int pre; } modes[] = {
        {"gpt2", LI_TOK_PRE_GPT2}, {"smollm", LI_TOK_PRE_SMOLLM}, {"llama3", LI_TOK_PRE_LLAMA3}};
    char path[1024], cmd[1100];
    const char *root = getenv("LUAINFER_SOURCE_DIR");
    snprintf(path, sizeof path, "%s%stests/golden/tokenizer_pretok.jsonl.gz", root && *root ? root : "",
             root && *root ? "/" : "");
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "FAIL: cannot run %s\n", cmd);
        return 1;
    }
    size_t n = 0, ok[3] = {0}, shown = 0;
    char *line = NULL;
    size_t line_cap = 0;
    static words w;
    while (getline(&line, &line_cap, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!cJSON_IsString(jt)) {
            fprintf(stderr, "FAIL: bad line %zu\n", n + 1);
            cJSON_Delete(j);
            continue;
        }
        const char *text = jt->valuestring;
        size_t len = strlen(text);
        n++;
        for (size_t m = 0; m < LI_ARRAY_LEN(modes); m++) {
            const cJSON *ref = cJSON_GetObjectItemCaseSensitive(j, modes[m].name);
            memset(&w, 0, sizeof w);
            li_tok_pretokenize(modes[m].pre, text, len, on_word, &w);
            bool same = !w.gap && w.next == len && (int)w.n == cJSON_GetArraySize(ref);
            for (size_t i = 0; same && i < w.n; i++)
                same = w.lens[i] == (size_t)cJSON_GetArrayItem(ref, (int)i)->valuedouble;
            if (same) {
                ok[m]++;
            } else if (shown++ < 10) {
                fprintf(stderr, "MISMATCH %s text=\"%.60s\"\n    got:", modes[m].name, text);
                for (size_t i = 0; i < w.n && i < 30; i++) fprintf(stderr, " %zu", w.lens[i]);
                fprintf(stderr, "\n    hf: ");
                for (int i = 0; i < cJSON_GetArraySize(ref) && i < 30; i++)
                    fprintf(stderr, " %d", (int)cJSON_GetArrayItem(ref, i)->valuedouble);
                fprintf(stderr, "\n");
            }
        }
        cJSON_Delete(j);
    }
    free(line);
    int st = pclose(f);
    printf("pretok: gpt2 %zu/%zu, smollm %zu/%zu, llama3 %zu/%zu identical to HF\n", ok[0], n, ok[1], n, ok[2], n);
    if (st != 0 || n == 0 || ok[0] != n || ok[1] != n || ok[2] != n) {
        fprintf(stderr, "test_tokenizer_pretok: FAILED\n");
        return 1;
    }
    printf("test_tokenizer_pretok: OK\n");
    return 0;
}
