/* comm_nccl.c — the NCCL communicator (comm.h) over kernels/cuda/comm_nccl.cu.
 * Without NCCL in the build (LI_HAVE_NCCL unset) every entry says so. */
#include "dist/comm.h"

#include <string.h>

#ifdef LI_HAVE_NCCL

/* kernels/cuda/comm_nccl.cu */
const char *li_cuda_nccl_error(void);
int li_cuda_nccl_unique_id(void *out, size_t cap);
int li_cuda_nccl_init(void **out, const void *id_bytes, int rank, int size, int device);
int li_cuda_nccl_init_all(void **out, int size, const int *devices);
int li_cuda_nccl_all_reduce_sum(void *handle, float *buf, int64_t n);
int li_cuda_nccl_barrier(void *handle);
void li_cuda_nccl_abort(void *handle);
void li_cuda_nccl_free(void *handle);

bool li_comm_nccl_available(void) { return true; }

int li_comm_nccl_unique_id(li_comm_nccl_id *id, li_error *err) {
    if (li_cuda_nccl_unique_id(id->bytes, sizeof id->bytes))
        return li_error_set(err, LI_EIO, "nccl: %s", li_cuda_nccl_error());
    return 0;
}

static int nccl_all_reduce(li_comm *c, float *buf, int64_t n, li_error *err) {
    if (n < 0) return li_error_set(err, LI_EINVAL, "comm: all_reduce of %lld elements", (long long)n);
    if (!c->impl) return li_error_set(err, LI_EIO, "nccl: the communicator was aborted");
    if (li_cuda_nccl_all_reduce_sum(c->impl, buf, n))
        return li_error_set(err, LI_EIO, "nccl rank %d: %s", c->rank, li_cuda_nccl_error());
    return 0;
}

static int nccl_barrier(li_comm *c, li_error *err) {
    if (!c->impl) return li_error_set(err, LI_EIO, "nccl: the communicator was aborted");
    if (li_cuda_nccl_barrier(c->impl)) return li_error_set(err, LI_EIO, "nccl rank %d: %s", c->rank, li_cuda_nccl_error());
    return 0;
}

static void nccl_abort(li_comm *c) { li_cuda_nccl_abort(c->impl); }

static void nccl_free(li_comm *c) { li_cuda_nccl_free(c->impl); }

static const li_comm_ops nccl_ops = {
    .name = "nccl", .all_reduce_sum = nccl_all_reduce, .barrier = nccl_barrier, .abort = nccl_abort, .free = nccl_free,
};

int li_comm_nccl_init(li_comm *c, const li_comm_nccl_id *id, int rank, int size, int device, li_error *err) {
    memset(c, 0, sizeof *c);
    if (size < 1 || rank < 0 || rank >= size)
        return li_error_set(err, LI_EINVAL, "nccl: rank %d of a group of %d", rank, size);
    void *h = NULL;
    if (li_cuda_nccl_init(&h, id->bytes, rank, size, device))
        return li_error_set(err, LI_EIO, "nccl rank %d on device %d: %s", rank, device, li_cuda_nccl_error());
    c->ops = &nccl_ops;
    c->rank = rank;
    c->size = size;
    c->impl = h;
    return 0;
}

int li_comm_nccl_init_all(li_comm *const *c, int size, const int *devices, li_error *err) {
    for (int r = 0; r < size; r++) memset(c[r], 0, sizeof *c[r]);
    if (size < 1 || size > LI_COMM_MAX_RANKS)
        return li_error_set(err, LI_EINVAL, "nccl: a group of %d ranks (1 to %d)", size, LI_COMM_MAX_RANKS);
    void *h[LI_COMM_MAX_RANKS] = {0};
    if (li_cuda_nccl_init_all(h, size, devices))
        return li_error_set(err, LI_EIO, "nccl: %d ranks from device %d: %s", size, devices[0], li_cuda_nccl_error());
    for (int r = 0; r < size; r++) *c[r] = (li_comm){.ops = &nccl_ops, .rank = r, .size = size, .impl = h[r]};
    return 0;
}

#else /* no NCCL in this build */

bool li_comm_nccl_available(void) { return false; }

int li_comm_nccl_unique_id(li_comm_nccl_id *id, li_error *err) {
    memset(id, 0, sizeof *id);
    return li_error_set(err, LI_EUNSUP, "nccl: this build has no NCCL (configure with LI_CUDA=ON where NCCL is installed)");
}

int li_comm_nccl_init(li_comm *c, const li_comm_nccl_id *id, int rank, int size, int device, li_error *err) {
    (void)id, (void)rank, (void)size, (void)device;
    memset(c, 0, sizeof *c);
    return li_error_set(err, LI_EUNSUP, "nccl: this build has no NCCL (configure with LI_CUDA=ON where NCCL is installed)");
}

int li_comm_nccl_init_all(li_comm *const *c, int size, const int *devices, li_error *err) {
    (void)devices;
    for (int r = 0; r < size; r++) memset(c[r], 0, sizeof *c[r]);
    return li_error_set(err, LI_EUNSUP, "nccl: this build has no NCCL (configure with LI_CUDA=ON where NCCL is installed)");
}

#endif
