/* cuda_backend.h — the CUDA backend (kernels/cuda/backend_cuda.cu; docs/cuda.md).
 *
 * The ops of kernels/backend.h on one device and one stream: buffers are
 * device memory (host = false), weight_prepare uploads each weight's rows
 * (and a scheme's scales, zero points, permutation), every op is a kernel
 * checked against the scalar reference (tests/unit/test_cuda_ops.c).
 * Without LI_HAVE_CUDA (no nvcc, ASan builds) the same symbols exist and
 * init returns LI_EUNSUP, so every entry point links everywhere. */
#ifndef LI_CUDA_BACKEND_H
#define LI_CUDA_BACKEND_H

#include "backend.h"

#include <stdio.h>

/* 0, or LI_EUNSUP "cuda: no CUDA device (...)" / "cuda: built without CUDA"
 * with nothing to free; device: the CUDA device index. */
int li_backend_cuda_init(li_backend *be, int device, struct li_error *err);
void li_backend_cuda_free(li_backend *be);
/* true when be is a CUDA backend (its ops table is this file's) */
bool li_backend_is_cuda(const li_backend *be);
/* be's CUDA device index (-1 on another backend), and how many devices
 * this machine has (0 without CUDA) */
int li_backend_cuda_device(const li_backend *be);
int li_backend_cuda_device_count(void);
/* the device's name into out (cap bytes; "" on another backend) and its
 * memory bandwidth in bytes/s as its clock and bus width imply (0 unknown) */
void li_backend_cuda_describe(const li_backend *be, char *out, size_t cap, double *bandwidth);
/* Per-kernel timing (CUDA events around each launch, and the host's time
 * issuing it): on clears the totals and turns recorded passes off while it
 * lasts (a recording has no events); print writes the table (kernel,
 * launches, GPU ms, host ms) to out under `title`. LUAINFER_CUDA_PROFILE=1
 * turns it on at init and prints it at free. No-ops on another backend. */
void li_backend_cuda_profile(li_backend *be, bool on);
void li_backend_cuda_profile_print(li_backend *be, FILE *out, const char *title);
/* q4_0 / q4_1 / q8_0 weights above 8 rows straight from their blocks on
 * the int8 tensor cores (on, the default), or dequantized to f16 for
 * cuBLASLt (off; LUAINFER_CUDA_MMQ=0 at init): the previous setting, -1 on
 * another backend. Recorded passes of the other setting are re-recorded. */
int li_backend_cuda_set_mmq(li_backend *be, bool on);
/* Programmatic dependent launch (off by default; LUAINFER_CUDA_PDL=1 at
 * init): each kernel may be placed before the one ahead of it finishes,
 * and waits for it at its first statement. The previous setting, -1 on
 * another backend; recorded passes of the other setting are re-recorded. */
int li_backend_cuda_set_pdl(li_backend *be, bool on);
/* Why the tensor-core GEMMs (cuBLASLt: W8A8 int8, FP8, BF16 and F16
 * weights above 8 rows) are off or a kind of them failed and went back to
 * the SGEMM path, or "" when none did (and on another backend). */
const char *li_backend_cuda_lt_note(li_backend *be);

#endif
