/* fuzz_safetensors.c — the safetensors reader on arbitrary bytes.
 *
 * Whatever the input, li_safetensors_init_from_memory must either fail with
 * LI_EINVAL / LI_EUNSUP and a one-line "safetensors: ..." message, or
 * succeed with every tensor inside the data area, sizes matching shapes,
 * names sorted and unique, and the tensors tiling the data area exactly; we
 * touch the first and last byte of each range so the sanitizers catch any
 * that is not. Invariant breaks abort() so the fuzzer records them. */
#include "model/safetensors.h"
#include "types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint8_t sink;

static void fail(const char *what) {
    fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* our own copy: the parser keeps pointers into it until free */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    li_safetensors st;
    li_error err = {0};
    int rc = li_safetensors_init_from_memory(&st, buf, size, "fuzz", &err);
    if (rc != 0) {
        if (rc != LI_EINVAL && rc != LI_EUNSUP) fail("error code");
        if (strncmp(err.msg, "safetensors: fuzz: ", 19) != 0) fail("error message missing");
        if (strchr(err.msg, '\n')) fail("error message has a newline");
        free(buf);
        return 0;
    }
    if (st.data_offset < 10 || st.data_offset > size) fail("data offset");
    uint64_t covered = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const li_st_tensor *t = &st.tensors[i];
        if (!t->name) fail("name");
        if (i && strcmp(st.tensors[i - 1].name, t->name) >= 0) fail("names not sorted and unique");
        if (li_safetensors_find(&st, t->name) != t) fail("find");
        if (t->type != LI_TYPE_F32 && t->type != LI_TYPE_F16 && t->type != LI_TYPE_BF16 && t->type != LI_TYPE_I32)
            fail("type");
        if (t->n_dims > LI_ST_MAX_DIMS) fail("n_dims");
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (t->shape[d] < 0) fail("negative dimension");
            n *= t->shape[d];
        }
        if (n != t->n_elem) fail("element count");
        size_t es = t->type == LI_TYPE_F32 || t->type == LI_TYPE_I32 ? 4 : 2;
        if (t->nbytes != (size_t)t->n_elem * es || t->end - t->begin != t->nbytes) fail("size");
        const uint8_t *p = t->data;
        if (p != buf + st.data_offset + t->begin) fail("data pointer");
        if (t->end > size - st.data_offset) fail("range");
        if (t->nbytes) {
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        covered += t->nbytes;
    }
    if (covered != size - st.data_offset) fail("tensors do not tile the data area");
    li_safetensors_free(&st);
    free(buf);
    return 0;
}
