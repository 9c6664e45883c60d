// probe.cu — device discovery (the NCCL test asks how many GPUs there are).
// cuBLAS is not touched here: backend_cuda.cu opens it when a backend starts.
#include <cuda_runtime.h>

extern "C" int li_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}
