/* tiny_model.h — a tiny random Llama GGUF for unit tests (header-only, for
 * the test programs that include test_util.h).
 *
 * li_test_tiny_model writes DIR/meta.gguf (the SentencePiece vocabulary of
 * tests/golden/spm_tiny.gguf with hp's hyper-parameters, and general.name
 * when `name` is not NULL) and DIR/base.gguf (that plus random weights from
 * li_train_model_init_random(seed), each non-zero weight below 0.9 in size
 * multiplied by `gain` so the logits are far from flat, saved by
 * li_train_save), and puts base.gguf's path in base. Returns 0; -1 after
 * printing a SKIP (no spm_tiny.gguf) or failing a CHECK. */
#ifndef LI_TEST_TINY_MODEL_H
#define LI_TEST_TINY_MODEL_H

#include "model/gguf_write.h"
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int li_test_tiny_model(const li_hparams *hp, const char *name, uint64_t seed, float gain, const char *dir,
                              char *base, size_t cap) {
    li_error err = {0};
    char src[1024], meta[512];
    const char *root = getenv("LUAINFER_SOURCE_DIR");
    snprintf(src, sizeof src, "%s/tests/golden/spm_tiny.gguf", root && *root ? root : ".");
    li_gguf g;
    if (li_gguf_open(&g, src, &err)) {
        printf("SKIP: %s\n", err.msg);
        return -1;
    }
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    int rc = 0;
    for (uint64_t i = 0; i < g.n_kv && !rc; i++)
        if (!(g.kv[i].key.len > 6 && !memcmp(g.kv[i].key.ptr, "llama.", 6)) &&
            !(name && li_str_eq(g.kv[i].key, "general.name")))
            rc = li_gguf_writer_add_kv(&w, &g.kv[i], &err);
    if (!rc && name) rc = li_gguf_writer_add_str(&w, "general.name", name, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.context_length", (uint32_t)hp->n_ctx_train, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.embedding_length", (uint32_t)hp->n_embd, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.block_count", (uint32_t)hp->n_layer, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.feed_forward_length", (uint32_t)hp->n_ff, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.attention.head_count", (uint32_t)hp->n_head, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.attention.head_count_kv", (uint32_t)hp->n_head_kv, &err);
    if (!rc) rc = li_gguf_writer_add_u32(&w, "llama.rope.dimension_count", (uint32_t)hp->n_rot, &err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "llama.rope.freq_base", hp->rope_theta, &err);
    if (!rc) rc = li_gguf_writer_add_f32(&w, "llama.attention.layer_norm_rms_epsilon", hp->norm_eps, &err);
    snprintf(meta, sizeof meta, "%s/meta.gguf", dir);
    if (!rc) rc = li_gguf_writer_write(&w, meta, &err);
    li_gguf_writer_free(&w);
    li_gguf_free(&g);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return -1;
    li_gguf mg;
    CHECK(li_gguf_open(&mg, meta, &err) == 0, "%s", err.msg);
    li_train_model tm;
    li_train_select all = {.what = LI_TRAIN_ALL};
    CHECK(li_train_model_init_random(&tm, hp, true, &all, seed, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < tm.L.n_params; i++)
        if (tm.params[i] != 0 && fabsf(tm.params[i]) < 0.9f) tm.params[i] *= gain;
    snprintf(base, cap, "%s/base.gguf", dir);
    rc = li_train_save(&tm, &mg, LI_CKPT_F32, base, &err);
    CHECK(rc == 0, "%s", err.msg);
    li_train_model_free(&tm);
    li_gguf_free(&mg);
    return rc ? -1 : 0;
}

#endif
