/* gguf_write.h — writing GGUF v3 files (the output side of gguf.h).
 *
 * Metadata is serialized as it is added, in that order; tensors are laid out
 * in the order added, each at an offset aligned to the file's alignment
 * (general.alignment, default 32), padding zero-filled. The same calls give
 * the same bytes: nothing depends on time, paths or memory addresses.
 * li_gguf_writer_write writes a temporary file next to the output and
 * renames it over the output, so a failure never leaves a partial file. */
#ifndef LI_GGUF_WRITE_H
#define LI_GGUF_WRITE_H

#include "model/gguf.h"

typedef struct li_gguf_wtensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[4];       /* ne[0] innermost, unused dims 1 */
    uint32_t type;       /* li_type, a GGUF type */
    void *data;          /* owned (malloc'd), nbytes */
    size_t nbytes;
} li_gguf_wtensor;

typedef struct li_gguf_writer {
    uint8_t *kv;         /* the serialized metadata section */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    li_gguf_wtensor *tensors;
    uint64_t n_tensors, tensors_cap;
    size_t alignment;
    bool scratch;        /* an intermediate its own process reads and removes: renamed, not fsynced */
} li_gguf_writer;

void li_gguf_writer_init(li_gguf_writer *w);
void li_gguf_writer_free(li_gguf_writer *w);

/* Metadata. A key added twice is a caller bug (the second is refused with
 * LI_EINVAL). general.alignment (u32, a power of two) also sets the layout. */
int li_gguf_writer_add_kv(li_gguf_writer *w, const li_gguf_kv *kv, li_error *err); /* a reader's kv, copied */
int li_gguf_writer_add_str(li_gguf_writer *w, const char *key, const char *val, li_error *err);
int li_gguf_writer_add_u32(li_gguf_writer *w, const char *key, uint32_t val, li_error *err);
int li_gguf_writer_add_f32(li_gguf_writer *w, const char *key, float val, li_error *err);
int li_gguf_writer_add_bool(li_gguf_writer *w, const char *key, bool val, li_error *err);
bool li_gguf_writer_has_kv(const li_gguf_writer *w, const char *key);

/* A tensor of type `type` (a GGUF type) and shape ne[0..n_dims); takes
 * ownership of data (malloc'd, exactly the type's size for that shape,
 * checked), also on error. */
int li_gguf_writer_add_tensor(li_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const int64_t *ne, void *data, size_t nbytes, li_error *err);

/* Bytes the file will have. */
size_t li_gguf_writer_size(const li_gguf_writer *w);
/* Writes PATH.tmp.PID, then renames it to path; LI_EIO naming the path on
 * any failure (the temporary file removed). */
int li_gguf_writer_write(const li_gguf_writer *w, const char *path, li_error *err);

#endif
