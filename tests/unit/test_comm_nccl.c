/* test_comm_nccl.c — the NCCL communicator (dist/comm.h) where it can run.
 *
 * Skips, saying why (exit 77), in a build without NCCL or on a machine
 * without a CUDA device. Otherwise one rank per device (threads, in one
 * process: ncclGetUniqueId once, ncclCommInitRank on every rank thread):
 * all_reduce_sum over device buffers at odd lengths gives every rank the
 * same bits, within 1e-6 relative of a float64 sum of the inputs (NCCL
 * chooses its own order), and barrier returns on every rank. */
#include "dist/comm.h"
#include "test_util.h"

#ifdef LI_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <string.h>

int li_cuda_device_count(void); /* kernels/cuda/probe.cu */

enum { MAX_RANKS = 8, N = 4099 };

typedef struct {
    const li_comm_nccl_id *id;
    int rank, size;
    float host[N], out[N];
    int rc;
    char msg[512];
    li_comm *pre; /* made already (li_comm_nccl_init_all), or NULL: made here */
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    li_error err = {0};
    li_comm own, *cp = a->pre ? a->pre : &own;
    if (!a->pre && (a->rc = li_comm_nccl_init(&own, a->id, a->rank, a->size, a->rank, &err))) {
        snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        return NULL;
    }
    float *d = NULL;
    cudaSetDevice(a->rank);
    if (cudaMalloc((void **)&d, sizeof a->host) != cudaSuccess) {
        a->rc = LI_ENOMEM;
        snprintf(a->msg, sizeof a->msg, "cudaMalloc failed");
    } else {
        cudaMemcpy(d, a->host, sizeof a->host, cudaMemcpyHostToDevice);
        if (!(a->rc = li_comm_all_reduce_sum(cp, d, N, &err))) a->rc = li_comm_barrier(cp, &err);
        if (a->rc) snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        cudaMemcpy(a->out, d, sizeof a->out, cudaMemcpyDeviceToHost);
        cudaFree(d);
    }
    li_comm_free(cp);
    return NULL;
}

int main(void) {
    const int n_dev = li_cuda_device_count();
    if (n_dev <= 0) {
        printf("SKIP test_comm_nccl: no CUDA device on this machine (NCCL is built in)\n");
        return 77;
    }
    const int size = n_dev > MAX_RANKS ? MAX_RANKS : n_dev;
    li_comm_nccl_id id;
    li_error err = {0};
    if (li_comm_nccl_unique_id(&id, &err)) {
        report(false, "ncclGetUniqueId: %s", err.msg);
        return t_summary("test_comm_nccl");
    }
    static rank_arg args[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        args[r].id = &id;
        args[r].rank = r;
        args[r].size = size;
        for (int i = 0; i < N; i++) args[r].host[i] = rng_f();
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    int64_t off = 0, differ = 0;
    for (int r = 0; r < size; r++) report(args[r].rc == 0, "rank %d of %d: init, all_reduce, barrier %s", r, size, args[r].msg);
    for (int i = 0; i < N; i++) {
        double s = 0, mag = 0;
        for (int r = 0; r < size; r++) s += args[r].host[i], mag += fabs(args[r].host[i]);
        off += fabs(args[0].out[i] - s) > 1e-6 * (mag + 1e-30);
        for (int r = 1; r < size; r++) differ += memcmp(&args[r].out[i], &args[0].out[i], sizeof(float)) != 0;
    }
    report(off == 0 && differ == 0, "all_reduce of %d floats on %d ranks: %lld off the float64 sum, %lld unlike rank 0",
           N, size, (long long)off, (long long)differ);

    /* the same group made at once from one thread (what tensor parallel on
     * cuda uses), each rank's all-reduce then run from its own thread */
    li_comm comms[MAX_RANKS], *cp[MAX_RANKS];
    int devs[MAX_RANKS];
    for (int r = 0; r < size; r++) cp[r] = &comms[r], devs[r] = r;
    const int rc = li_comm_nccl_init_all(cp, size, devs, &err);
    report(rc == 0, "li_comm_nccl_init_all, %d ranks: %s", size, rc ? err.msg : "made");
    if (!rc) {
        for (int r = 0; r < size; r++) {
            args[r].pre = &comms[r];
            pthread_create(&th[r], NULL, rank_main, &args[r]);
        }
        for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
        bool all = true;
        for (int r = 0; r < size; r++) all &= args[r].rc == 0;
        differ = 0;
        for (int i = 0; i < N; i++)
            for (int r = 1; r < size; r++) differ += memcmp(&args[r].out[i], &args[0].out[i], sizeof(float)) != 0;
        report(all && differ == 0, "init_all's communicators: all_reduce and barrier on %d ranks (%lld unlike rank 0)",
               size, (long long)differ);
    }
    return t_summary("test_comm_nccl");
}

#else

int main(void) {
    printf("SKIP test_comm_nccl: this build has no NCCL (LI_CUDA=OFF, a sanitizer build, or NCCL not found)\n");
    return 77;
}

#endif
