// Functions of a library the CUDA backend opens with dlopen rather than links (cuBLASLt:
// cublaslt_library.cu; NCCL: nccl_library.cu).
#pragma once
#include <dlfcn.h>

extern "C" {
#include "core/check.h"
}

// Looks `name` up in `library` into *function: false, with err_set() naming the library,
// the function and `expected` (which version would have it), when the library lacks it.
template <typename Function>
static inline bool resolve_function(void *library, const char *library_name, const char *name, Function *function,
                                    const char *expected) {
    *function = reinterpret_cast<Function>(dlsym(library, name));
    if (*function) return true;
    err_set("%s has no function %s (%s)", library_name, name, expected);
    return false;
}
