/* gguf.h — read-only GGUF v2/v3 reader over mmap.
 *
 * Every count, length, offset, dimension and type from the file is validated
 * (overflow-safe) before it is used; a malformed file yields LI_EINVAL with a
 * one-line message naming the problem. Strings and tensor data point into the
 * mapping (not NUL-terminated); they live until li_gguf_free. */
#ifndef LI_GGUF_H
#define LI_GGUF_H

#include "../util/common.h"

/* Value types as the GGUF spec numbers them. */
typedef enum li_gguf_vtype {
    LI_GGUF_UINT8 = 0,
    LI_GGUF_INT8 = 1,
    LI_GGUF_UINT16 = 2,
    LI_GGUF_INT16 = 3,
    LI_GGUF_UINT32 = 4,
    LI_GGUF_INT32 = 5,
    LI_GGUF_FLOAT32 = 6,
    LI_GGUF_BOOL = 7,
    LI_GGUF_STRING = 8,
    LI_GGUF_ARRAY = 9,
    LI_GGUF_UINT64 = 10,
    LI_GGUF_INT64 = 11,
    LI_GGUF_FLOAT64 = 12,
    LI_GGUF_VTYPE_COUNT
} li_gguf_vtype;

typedef struct li_str {
    const char *ptr; /* into the mapping, not NUL-terminated */
    uint64_t len;
} li_str;

typedef struct li_gguf_kv {
    li_str key;
    li_gguf_vtype type;
    union {
        uint64_t u64; /* unsigned ints and bool */
        int64_t i64;  /* signed ints */
        double f64;   /* floats */
        li_str str;
        struct {
            li_gguf_vtype type; /* element type (never ARRAY: nested arrays rejected) */
            uint64_t n;         /* element count */
            const uint8_t *data; /* raw elements (fixed-size types) */
            li_str *strs;       /* n entries when type == STRING, else NULL */
        } arr;
    } v;
} li_gguf_kv;

typedef struct li_gguf_tensor {
    li_str name;
    uint32_t n_dims;
    int64_t ne[4];     /* ne[0] is the innermost (row) length; unused dims are 1 */
    uint32_t type;     /* li_type (kernels/types.h) */
    uint64_t offset;   /* relative to the data section */
    size_t nbytes;
    const void *data;  /* into the mapping */
} li_gguf_tensor;

typedef struct li_gguf {
    void *map;          /* mmap'd file, or NULL for in-memory */
    const uint8_t *buf; /* file bytes */
    size_t size;
    uint32_t version;
    uint64_t n_kv;
    li_gguf_kv *kv;
    uint64_t n_tensors;
    li_gguf_tensor *tensors;
    size_t alignment;
    size_t data_offset;
} li_gguf;

/* Opens and validates a file; on error g is left freed and err says why. */
int li_gguf_open(li_gguf *g, const char *path, li_error *err);
/* Parses bytes owned by the caller (kept alive until li_gguf_free). */
int li_gguf_init_from_memory(li_gguf *g, const void *buf, size_t size, li_error *err);
void li_gguf_free(li_gguf *g);

const li_gguf_kv *li_gguf_find_kv(const li_gguf *g, const char *key);
const li_gguf_tensor *li_gguf_find_tensor(const li_gguf *g, const char *name);

/* Typed getters: return 0 and set *out when key exists with a compatible
 * numeric type, LI_EINVAL (with message) when the type is wrong, and 1 when
 * the key is absent (so callers can apply defaults). */
int li_gguf_get_u64(const li_gguf *g, const char *key, uint64_t *out, li_error *err);
int li_gguf_get_u32(const li_gguf *g, const char *key, uint32_t *out, li_error *err);
int li_gguf_get_f32(const li_gguf *g, const char *key, float *out, li_error *err);
int li_gguf_get_bool(const li_gguf *g, const char *key, bool *out, li_error *err);
int li_gguf_get_str(const li_gguf *g, const char *key, li_str *out, li_error *err);
/* Array getter: returns the kv when key is an array of elem_type, else NULL
 * (and sets err when present with another type). */
const li_gguf_kv *li_gguf_get_arr(const li_gguf *g, const char *key, li_gguf_vtype elem_type,
                                  li_error *err);

/* A string value as a NUL-terminated copy, truncated to cap; false when
 * the key is absent or not a string (out is then ""). */
bool li_gguf_copy_str(const li_gguf *g, const char *key, char *out, size_t cap);
/* A 64-bit hash written as a string of 16 lowercase hex digits (the
 * draft and heads files' base.vocab_hash); false when absent or malformed. */
bool li_gguf_get_hex64(const li_gguf *g, const char *key, uint64_t *out);

const char *li_gguf_vtype_name(li_gguf_vtype t);
/* bytes of one value of a fixed-size type; 0 for string, array and unknown types */
size_t li_gguf_vtype_size(li_gguf_vtype t);
bool li_str_eq(li_str s, const char *c);

#endif
