#include "ops/cuda/cublaslt_library.cuh"

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "ops/cuda/library_symbols.cuh"

#ifndef MARLHF_CUBLASLT_SONAME
#define MARLHF_CUBLASLT_SONAME "libcublasLt.so"
#endif

CublasLtLibrary cublaslt;

// Resolves `name` into *function: false (with err_set) when the library lacks it.
template <typename Function> static bool resolve(void *library, const char *name, Function *function) {
    char expected[128];
    snprintf(expected, sizeof expected, "--device cuda needs the cuBLASLt of CUDA %d.%d or a newer one of that major version",
             CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    return resolve_function(library, MARLHF_CUBLASLT_SONAME, name, function, expected);
}

extern "C" int cublaslt_library_open(void) {
    if (cublaslt.Matmul) return 0;
    void *library = dlopen(MARLHF_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!library)
        return err_set("--device cuda: cannot load cuBLASLt (%s); is the CUDA toolkit's lib64 folder on "
                       "LD_LIBRARY_PATH?",
                       dlerror());
    CublasLtLibrary found;
    const bool all = resolve(library, "cublasLtCreate", &found.Create) &&
                     resolve(library, "cublasLtMatrixLayoutCreate", &found.MatrixLayoutCreate) &&
                     resolve(library, "cublasLtMatrixLayoutSetAttribute", &found.MatrixLayoutSetAttribute) &&
                     resolve(library, "cublasLtMatmulDescCreate", &found.MatmulDescCreate) &&
                     resolve(library, "cublasLtMatmulDescSetAttribute", &found.MatmulDescSetAttribute) &&
                     resolve(library, "cublasLtMatmulPreferenceCreate", &found.MatmulPreferenceCreate) &&
                     resolve(library, "cublasLtMatmulPreferenceSetAttribute", &found.MatmulPreferenceSetAttribute) &&
                     resolve(library, "cublasLtMatmulPreferenceDestroy", &found.MatmulPreferenceDestroy) &&
                     resolve(library, "cublasLtMatmulAlgoGetHeuristic", &found.MatmulAlgoGetHeuristic) &&
                     resolve(library, "cublasLtMatmul", &found.Matmul);
    if (!all) {
        dlclose(library);
        return -1;
    }
    cublaslt = found; // the library stays open for the process's life
    return 0;
}
