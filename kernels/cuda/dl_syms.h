// dl_syms.h — a CUDA library opened at run time with the entry points it
// must have (cuBLAS in backend_cuda.cu, cuBLASLt in lt_gemm.cu): linked,
// their ~0.7 GB would load into every luainfer process. Internal to
// kernels/cuda/.
#ifndef LI_DL_SYMS_H
#define LI_DL_SYMS_H

#include <dlfcn.h>
#include <cstddef>
#include <cstdio>

struct li_dl_sym {
    void **slot;      // where the address goes (a function pointer, cast)
    const char *name; // the exported symbol
};

// dlopen(lib) and every sym resolved into its slot; false with the reason
// in why (the library left open: a process opens it once)
static inline bool li_dl_open_syms(const char *lib, const li_dl_sym *syms, size_t n, char *why, size_t cap) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "%s", dlerror());
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(why, cap, "%s has no %s", lib, syms[i].name);
            return false;
        }
    return true;
}

#define LI_DL_SYM(field, sym) li_dl_sym{(void **)&(field), (sym)}

#endif
