/* safetensors.h — read-only .safetensors reader over mmap.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {str: str}}, maybe padded with spaces), then the data
 * area, which the tensors must cover exactly (no holes, no overlaps, as the
 * reference implementation demands). Everything is checked before use:
 * the header length against the file, every dtype (BF16, F16, F32; I32),
 * shape (overflow-safe element counts), offset range and size (I32 too:
 * the packed codes of AWQ / GPTQ checkpoints). A bad file
 * yields LI_EINVAL (LI_EUNSUP for a valid dtype we do not load) with a
 * one-line message naming the file and the tensor. */
#ifndef LI_SAFETENSORS_H
#define LI_SAFETENSORS_H

#include "../util/common.h"

#define LI_ST_MAX_DIMS 8
/* The reference implementation's limit on the JSON header. */
#define LI_ST_MAX_HEADER (100u << 20)

typedef struct li_st_tensor {
    char *name;                     /* NUL-terminated copy of the JSON key */
    uint32_t type;                  /* li_type (kernels/types.h): F32, F16, BF16 or I32 */
    uint32_t n_dims;                /* 0 (a scalar) .. LI_ST_MAX_DIMS */
    int64_t shape[LI_ST_MAX_DIMS];  /* as written: outermost first, so a HF Linear is (out, in) */
    int64_t n_elem;
    uint64_t begin, end;            /* data_offsets, relative to the data area */
    const void *data;               /* into the mapping */
    size_t nbytes;                  /* end - begin */
} li_st_tensor;

typedef struct li_safetensors {
    void *map;                  /* mmap'd file, or NULL for in-memory */
    const uint8_t *buf;         /* file bytes */
    size_t size;
    char *path;                 /* for messages */
    size_t data_offset;         /* 8 + header length */
    int n_tensors;
    li_st_tensor *tensors;      /* (n_tensors), sorted by name */
} li_safetensors;

/* Opens, maps and validates a file; on error st is left freed. */
int li_safetensors_open(li_safetensors *st, const char *path, li_error *err);
/* Parses bytes owned by the caller (kept alive until li_safetensors_free);
 * `name` stands for the file in messages. */
int li_safetensors_init_from_memory(li_safetensors *st, const void *buf, size_t size, const char *name,
                                    li_error *err);
void li_safetensors_free(li_safetensors *st);

/* The tensor called name, or NULL. */
const li_st_tensor *li_safetensors_find(const li_safetensors *st, const char *name);

#endif
