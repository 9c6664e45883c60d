/* cuda_stub.c — the CUDA backend's entry points in a build without CUDA
 * (no nvcc, or LI_SANITIZE): init says why it cannot run, so the CLI's
 * --device cuda links and refuses cleanly everywhere. With LI_HAVE_CUDA
 * the real ones come from backend_cuda.cu and this file is empty. */
#include "util/common.h"
#include "cuda/cuda_backend.h"

#ifndef LI_HAVE_CUDA
int li_backend_cuda_init(li_backend *be, int device, li_error *err) {
    be->ops = NULL;
    be->impl = NULL;
    return li_error_set(err, LI_EUNSUP, "cuda: built without CUDA (no nvcc found, or a sanitizer build)");
}

void li_backend_cuda_free(li_backend *be) { (void)be; }

bool li_backend_is_cuda(const li_backend *be) {
    (void)be;
    return false;
}

void li_backend_cuda_profile(li_backend *be, bool on) {
    (void)be;
    (void)on;
}

int li_backend_cuda_device(const li_backend *be) {
    (void)be;
    return -1;
}

int li_backend_cuda_device_count(void) { return 0; }

void li_backend_cuda_describe(const li_backend *be, char *out, size_t cap, double *bandwidth) {
    (void)be;
    if (cap) out[0] = 0;
    *bandwidth = 0;
}

int li_backend_cuda_set_mmq(li_backend *be, bool on) {
    (void)be;
    (void)on;
    return -1;
}

int li_backend_cuda_set_pdl(li_backend *be, bool on) {
    (void)be;
    (void)on;
    return -1;
}

const char *li_backend_cuda_lt_note(li_backend *be) {
    (void)be;
    return "";
}

void li_backend_cuda_profile_print(li_backend *be, FILE *out, const char *title) {
    (void)be;
    (void)out;
    (void)title;
}
#else
typedef int li_cuda_stub_unused; /* ISO C: a translation unit is not empty */
#endif
