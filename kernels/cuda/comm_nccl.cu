// comm_nccl.cu — NCCL for the tensor-parallel communicator (core/dist/comm.h,
// wrapped by core/dist/comm_nccl.c). Plain C types across the boundary: the
// C side builds the li_comm and the error text. Built only with NCCL
// (LI_HAVE_NCCL); nothing here runs without a GPU.
#ifdef LI_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct li_cuda_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
};

static thread_local char g_msg[256]; // per rank thread

static int fail_cuda(const char *what, cudaError_t e) {
    snprintf(g_msg, sizeof g_msg, "%s: %s", what, cudaGetErrorString(e));
    return 1;
}

static int fail_nccl(const char *what, ncclResult_t r) {
    snprintf(g_msg, sizeof g_msg, "%s: %s", what, ncclGetErrorString(r));
    return 1;
}

extern "C" const char *li_cuda_nccl_error(void) { return g_msg; }

extern "C" int li_cuda_nccl_unique_id(void *out, size_t cap) {
    ncclUniqueId id;
    if (sizeof id > cap) {
        snprintf(g_msg, sizeof g_msg, "ncclUniqueId is %zu bytes, room for %zu", sizeof id, cap);
        return 1;
    }
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return fail_nccl("ncclGetUniqueId", r);
    memcpy(out, &id, sizeof id);
    return 0;
}

extern "C" int li_cuda_nccl_init(void **out, const void *id_bytes, int rank, int size, int device) {
    *out = nullptr;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return fail_cuda("cudaSetDevice", e);
    li_cuda_nccl *h = (li_cuda_nccl *)calloc(1, sizeof *h);
    if (!h) {
        snprintf(g_msg, sizeof g_msg, "out of memory");
        return 1;
    }
    h->device = device;
    if ((e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(h);
        return fail_cuda("cudaStreamCreate", e);
    }
    ncclUniqueId id;
    memcpy(&id, id_bytes, sizeof id);
    ncclResult_t r = ncclCommInitRank(&h->comm, size, id, rank);
    if (r != ncclSuccess) {
        cudaStreamDestroy(h->stream);
        free(h);
        return fail_nccl("ncclCommInitRank", r);
    }
    *out = h;
    return 0;
}

// Every rank of a group in this process at once, rank r on devices[r]
// (ncclCommInitAll: no thread per rank). On failure nothing is left.
extern "C" int li_cuda_nccl_init_all(void **out, int size, const int *devices) {
    ncclComm_t comms[64];
    if (size < 1 || size > 64) {
        snprintf(g_msg, sizeof g_msg, "a group of %d ranks (1 to 64)", size);
        return 1;
    }
    ncclResult_t r = ncclCommInitAll(comms, size, devices);
    if (r != ncclSuccess) return fail_nccl("ncclCommInitAll", r);
    int made = 0;
    for (; made < size; made++) {
        li_cuda_nccl *h = (li_cuda_nccl *)calloc(1, sizeof *h);
        cudaError_t e = h ? cudaSetDevice(devices[made]) : cudaErrorMemoryAllocation;
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            free(h);
            fail_cuda("a rank's stream", e);
            break;
        }
        h->comm = comms[made];
        h->device = devices[made];
        out[made] = h;
    }
    if (made == size) return 0;
    for (int i = 0; i < size; i++) {
        if (i < made) {
            li_cuda_nccl *h = (li_cuda_nccl *)out[i];
            cudaStreamDestroy(h->stream);
            free(h);
            out[i] = nullptr;
        }
        ncclCommDestroy(comms[i]);
    }
    return 1;
}

// In place on device memory, then waits: the forward's next op reads buf.
extern "C" int li_cuda_nccl_all_reduce_sum(void *handle, float *buf, int64_t n) {
    li_cuda_nccl *h = (li_cuda_nccl *)handle;
    cudaSetDevice(h->device);
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, h->comm, h->stream);
    if (r != ncclSuccess) return fail_nccl("ncclAllReduce", r);
    cudaError_t e = cudaStreamSynchronize(h->stream);
    if (e != cudaSuccess) return fail_cuda("cudaStreamSynchronize", e);
    return 0;
}

// A barrier: an all-reduce of one float in device scratch.
extern "C" int li_cuda_nccl_barrier(void *handle) {
    li_cuda_nccl *h = (li_cuda_nccl *)handle;
    cudaSetDevice(h->device);
    float *one = nullptr;
    cudaError_t e = cudaMalloc(&one, sizeof *one);
    if (e != cudaSuccess) return fail_cuda("cudaMalloc", e);
    cudaMemsetAsync(one, 0, sizeof *one, h->stream);
    int rc = li_cuda_nccl_all_reduce_sum(handle, one, 1);
    cudaFree(one);
    return rc;
}

extern "C" void li_cuda_nccl_abort(void *handle) {
    li_cuda_nccl *h = (li_cuda_nccl *)handle;
    if (h) ncclCommAbort(h->comm);
    if (h) h->comm = nullptr;
}

extern "C" void li_cuda_nccl_free(void *handle) {
    li_cuda_nccl *h = (li_cuda_nccl *)handle;
    if (!h) return;
    cudaSetDevice(h->device);
    if (h->comm) ncclCommDestroy(h->comm);
    cudaStreamDestroy(h->stream);
    free(h);
}
#endif
