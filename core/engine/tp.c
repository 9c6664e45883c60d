/* tp.c — the ranks of a tensor-parallel target (tp.h). Owns: the ranks'
 * backends, shard views, runners, communicators and threads. */
#include "engine/tp.h"
#include "cuda/cuda_backend.h"
#include "dist/comm.h"
#include "dist/shard.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct tp_rank {
    struct li_tp *tp;
    int r;
    li_backend be;
    bool be_ready, prepared, cuda; /* cuda: be is rank r's GPU, comm NCCL */
    li_model view;     /* shard r of the model */
    li_runner own;     /* ranks >= 1: the runner (rank 0's is the caller's) */
    li_runner *run;
    li_comm comm;
    pthread_t th;
    bool started;
    int rc;            /* the last run's */
    li_error err;
} tp_rank;

struct li_tp {
    int size;
    tp_rank *ranks;    /* (size) */
    li_comm_group *group;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;      /* bumped per run: the workers' signal */
    int pending;       /* workers still running this run */
    bool quit, all_logits;
    const li_batch *b;
};

/* ------------------------------------------------------------------------
 * one rank's step
 * ---------------------------------------------------------------------- */

static void rank_step(tp_rank *k, const li_batch *b) {
    li_batch mine = *b;
    if (k->r > 0 && !k->tp->all_logits) { /* rank 0's logits are everyone's */
        mine.n_logits = 0;
        mine.hidden = LI_HIDDEN_NONE;
    }
    k->err.code = 0;
    k->err.msg[0] = 0;
    k->rc = li_runner_run(k->run, &mine, &k->err);
    /* the others may wait in a collective this rank will never enter */
    if (k->rc) li_comm_abort(&k->comm);
}

static void *rank_thread(void *p) {
    tp_rank *k = p;
    li_tp *tp = k->tp;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (tp->gen == seen && !tp->quit) pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->gen;
        const li_batch *b = tp->b;
        pthread_mutex_unlock(&tp->mu);
        rank_step(k, b);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done);
        pthread_mutex_unlock(&tp->mu);
    }
}

int li_tp_run(li_tp *tp, const li_batch *b, li_error *err) {
    li_comm_group_reset(tp->group); /* no rank is inside a collective between runs */
    pthread_mutex_lock(&tp->mu);
    tp->b = b;
    tp->pending = tp->size - 1;
    tp->gen++;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    rank_step(&tp->ranks[0], b);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    /* the cause, not the aborts it set off in the other ranks */
    const tp_rank *bad = NULL;
    for (int r = 0; r < tp->size; r++) {
        const tp_rank *k = &tp->ranks[r];
        if (k->rc && (!bad || (bad->rc == LI_EIO && k->rc != LI_EIO))) bad = k;
    }
    if (bad) return li_error_set(err, bad->rc, "tensor parallel rank %d: %s", bad->r, bad->err.msg);
    return 0;
}

/* ------------------------------------------------------------------------
 * init / free
 * ---------------------------------------------------------------------- */

/* the ranks' NCCL communicators, rank r on device dev0 + r, made at once */
static int nccl_comms(li_tp *tp, int dev0, li_error *err) {
    li_comm *c[LI_COMM_MAX_RANKS];
    int dev[LI_COMM_MAX_RANKS];
    for (int r = 0; r < tp->size; r++) {
        c[r] = &tp->ranks[r].comm;
        dev[r] = dev0 + r;
    }
    return li_comm_nccl_init_all(c, tp->size, dev, err);
}

int li_tp_init(li_tp **out, li_model *m, const li_backend *like, int size, li_runner *rank0, li_type kv_dtype,
               int block_size, int32_t num_blocks, int64_t cap, li_error *err) {
    *out = NULL;
    if (size < 2 || size > LI_COMM_MAX_RANKS)
        return li_error_set(err, LI_EINVAL, "tensor parallel: %d ranks (2 to %d; 1 runs without it)", size,
                            LI_COMM_MAX_RANKS);
    /* on GPUs: rank r on device dev0 + r, NCCL between them */
    const bool cuda = li_backend_is_cuda(like);
    const int dev0 = cuda ? li_backend_cuda_device(like) : 0;
    const char *isa = cuda ? "" : li_backend_cpu_isa(like);
    if (cuda) {
        const int n_dev = li_backend_cuda_device_count();
        if (!li_comm_nccl_available())
            return li_error_set(err, LI_EUNSUP, "tensor parallel on cuda needs NCCL, which this build has not");
        if (dev0 + size > n_dev)
            return li_error_set(err, LI_EINVAL, "tensor parallel %d from cuda:%d needs devices %d to %d; this machine "
                                "has %d", size, dev0, dev0, dev0 + size - 1, n_dev);
    } else if (!strcmp(isa, "none") || strcmp(like->ops->name, "cpu") != 0) {
        return li_error_set(err, LI_EUNSUP,
                            "tensor parallel runs on luainfer's own CPU kernels (--isa auto, scalar, avx2, avx512, amx) "
                            "or on cuda, not on the %s backend yet",
                            like->ops->name);
    }
    li_shard s;
    for (int r = 0; r < size; r++) {
        int rc = li_shard_plan(m, r, size, &s, err);
        if (rc) return rc;
    }
    li_tp *tp = li_xcalloc(1, sizeof *tp);
    tp->size = size;
    tp->ranks = li_xcalloc((size_t)size, sizeof *tp->ranks);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->go, NULL);
    pthread_cond_init(&tp->done, NULL);
    int rc = li_comm_group_init(&tp->group, size, err);
    const int threads = LI_MAX(1, like->n_threads / size);
    for (int r = 0; !rc && r < size; r++) {
        tp_rank *k = &tp->ranks[r];
        k->tp = tp;
        k->r = r;
        k->run = r == 0 ? rank0 : &k->own;
        k->cuda = cuda;
        if ((rc = cuda ? li_backend_cuda_init(&k->be, dev0 + r, err) : li_backend_cpu_init(&k->be, threads, isa, err)))
            break;
        k->be_ready = true;
        if ((rc = li_shard_model_init(&k->view, m, r, size, err))) break;
        k->prepared = true;
        if ((rc = li_model_prepare(&k->view, &k->be, err))) break;
        if ((rc = li_runner_init(k->run, &k->view, &k->be, r ? &rank0->kv : NULL, kv_dtype, block_size, num_blocks,
                                 cap, err)))
            break;
        if (!cuda && (rc = li_comm_threads_init(&k->comm, tp->group, r, err))) break;
        k->run->fw.comm = &k->comm;
    }
    if (!rc && cuda) rc = nccl_comms(tp, dev0, err);
    for (int r = 1; !rc && r < size; r++) { /* the workers, once every rank can run */
        tp_rank *k = &tp->ranks[r];
        li_thread_signals_begin();
        const int bad = pthread_create(&k->th, NULL, rank_thread, k);
        li_thread_signals_end();
        if (bad) {
            rc = li_error_set(err, LI_ENOMEM, "tensor parallel: cannot start rank %d's thread", r);
            break;
        }
        k->started = true;
    }
    if (rc) {
        li_tp_free(tp);
        return rc;
    }
    *out = tp;
    return 0;
}

void li_tp_free(li_tp *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    for (int r = tp->size - 1; r >= 0; r--) { /* followers before rank 0's pool */
        tp_rank *k = &tp->ranks[r];
        if (k->started) pthread_join(k->th, NULL);
        li_comm_free(&k->comm);
        if (k->run) li_runner_free(k->run);
        if (k->prepared) {
            li_model_release(&k->view, &k->be);
            li_shard_model_free(&k->view);
        }
        if (k->be_ready && k->cuda) li_backend_cuda_free(&k->be);
        else if (k->be_ready) li_backend_cpu_free(&k->be);
    }
    li_comm_group_free(tp->group);
    pthread_cond_destroy(&tp->go);
    pthread_cond_destroy(&tp->done);
    pthread_mutex_destroy(&tp->mu);
    free(tp->ranks);
    free(tp);
}

int li_tp_size(const li_tp *tp) { return tp->size; }

size_t li_tp_kv_bytes(const li_tp *tp) {
    size_t n = 0;
    for (int r = 0; r < tp->size; r++) n += tp->ranks[r].run->kv.bytes;
    return n;
}

double li_tp_comm_time(const li_tp *tp) { return tp->ranks[0].run->fw.t_comm; }

void li_tp_set_all_logits(li_tp *tp, bool on) { tp->all_logits = on; }

const float *li_tp_rank_logits(const li_tp *tp, int r) {
    return r >= 0 && r < tp->size ? tp->ranks[r].run->logits : NULL;
}
