// probe.cu — the CUDA backend's entry: device discovery. Later CUDA ops
// (GEMMs via cuBLAS/cuBLASLt, paged attention) live beside it.
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cstdio>

extern "C" int li_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" const char *li_cuda_blas_version(void) {
    static char buf[32];
    int v = 0;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return "unavailable";
    cublasGetVersion(h, &v);
    cublasDestroy(h);
    snprintf(buf, sizeof buf, "%d", v);
    return buf;
}
