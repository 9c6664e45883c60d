#define _DEFAULT_SOURCE /* posix_memalign, MAP_ANONYMOUS */
/* cpu_buffer.c — backend memory for the host backends (CPU, ggml, the
 * reference): aligned host allocations, moved by memcpy. Also the checked
 * helpers every caller of the buffer interface goes through (backend.h). */
#include "util/common.h"
#include "backend.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------------
 * checked helpers
 * ---------------------------------------------------------------------- */

int li_backend_check(const li_backend *be, li_error *err) {
    const li_backend_ops *op = be->ops;
    if (!op) return li_error_set(err, LI_EINVAL, "backend: not initialized");
    if (op->api_version != LI_BACKEND_API_VERSION)
        return li_error_set(err, LI_EUNSUP, "backend %s: API version %d, this build needs %d", op->name,
                            op->api_version, LI_BACKEND_API_VERSION);
    if (!op->buffer_alloc || !op->buffer_free || !op->buffer_set || !op->buffer_get || !op->buffer_copy ||
        !op->buffer_clear || !op->synchronize)
        return li_error_set(err, LI_EUNSUP, "backend %s: no buffer interface", op->name);
    const int n_graph = !!op->graph_begin + !!op->graph_end + !!op->graph_launch + !!op->graph_valid +
                        !!op->graph_free;
    if (n_graph != 0 && n_graph != 5)
        return li_error_set(err, LI_EUNSUP, "backend %s: %d of the 5 graph ops", op->name, n_graph);
    return 0;
}

int li_buffer_alloc(li_backend *be, size_t size, li_buffer *out, li_error *err) {
    memset(out, 0, sizeof *out);
    int rc = li_backend_check(be, err);
    if (rc) return rc;
    if ((rc = be->ops->buffer_alloc(be, size, out, err))) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    return 0;
}

void li_buffer_free(li_backend *be, li_buffer *b) {
    if (b->data && be && be->ops && be->ops->buffer_free) be->ops->buffer_free(be, b);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------------
 * host buffers
 * ---------------------------------------------------------------------- */

int li_host_buffer_alloc(li_backend *be, size_t size, li_buffer *out, li_error *err) {
    /* rounded up to whole 64-byte lines: SIMD loads may read a line's tail */
    const size_t n = (size + LI_HOST_BUFFER_ALIGN - 1) & ~(size_t)(LI_HOST_BUFFER_ALIGN - 1);
    if (n < size) return li_error_set(err, LI_ENOMEM, "backend: %zu bytes cannot be allocated", size);
    /* Large buffers (a KV cache sized for the whole context) come from the
     * kernel's zero pages, touched only where written: a short request no
     * longer faults in and clears a cache sized for 8192 tokens (188 MB for
     * the default model, most of `generate`'s start-up). Not under ASan,
     * whose redzones guard only what malloc hands out. */
#if defined(__SANITIZE_ADDRESS__)
    const bool map = false;
#else
    const bool map = n >= LI_HOST_BUFFER_MAP_MIN;
#endif
    if (map) {
        void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return li_error_set(err, LI_ENOMEM, "backend: out of memory allocating %zu bytes", size);
        *out = (li_buffer){.data = m, .size = size, .host = true, .mapped = true};
        return 0;
    }
    void *p = NULL;
    if (posix_memalign(&p, LI_HOST_BUFFER_ALIGN, n ? n : LI_HOST_BUFFER_ALIGN) != 0)
        return li_error_set(err, LI_ENOMEM, "backend: out of memory allocating %zu bytes", size);
    memset(p, 0, n);
    *out = (li_buffer){.data = p, .size = size, .host = true};
    return 0;
}

void li_host_buffer_free(li_backend *be, li_buffer *b) {
    if (b->mapped) munmap(b->data, (b->size + LI_HOST_BUFFER_ALIGN - 1) & ~(size_t)(LI_HOST_BUFFER_ALIGN - 1));
    else if (!b->wrapped) free(b->data);
    memset(b, 0, sizeof *b);
}

int li_host_buffer_wrap(li_backend *be, void *host, size_t size, li_buffer *out, li_error *err) {
    if (!host && size) return li_error_set(err, LI_EINVAL, "backend: wrapping a NULL pointer");
    *out = (li_buffer){.data = host, .size = size, .host = true, .wrapped = true};
    return 0;
}

void li_host_buffer_set(li_backend *be, li_buffer *b, size_t off, const void *src, size_t n) {
    if (n) memcpy((char *)b->data + off, src, n);
}

void li_host_buffer_get(li_backend *be, const li_buffer *b, size_t off, void *dst, size_t n) {
    if (n) memcpy(dst, (const char *)b->data + off, n);
}

void li_host_buffer_copy(li_backend *be, li_buffer *dst, const li_buffer *src, const size_t *dst_off,
                         const size_t *src_off, int n_runs, size_t n) {
    for (int i = 0; i < n_runs; i++)
        memcpy((char *)dst->data + dst_off[i], (const char *)src->data + src_off[i], n);
}

void li_host_buffer_clear(li_backend *be, li_buffer *b, uint8_t value) {
    if (b->size) memset(b->data, value, b->size);
}

void li_host_synchronize(li_backend *be) {} /* host copies are done when they return */
