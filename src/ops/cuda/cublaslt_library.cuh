// cuBLASLt, loaded when the CUDA backend opens (ops_cuda_open), not when the program
// starts. Linked in the usual way, the 500 MB library is mapped and relocated at every
// start of marlhf, a CPU run's included: measured, 165 MB of resident memory and 0.07-0.11 s
// before `main`, against 13 MB and 0.01 s for a build without CUDA. The CUDA runtime is
// linked statically (libcudart_static), which loads the driver only at the first CUDA call.
//
// The backend calls the ten cuBLASLt functions it uses through `cublaslt`, whose members
// have the library header's own types (so a mismatch with the header does not compile).
#pragma once
#include <cublasLt.h>

struct CublasLtLibrary {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmul) Matmul;
};

// Filled by cublaslt_library_open; all NULL before.
extern CublasLtLibrary cublaslt;

// Opens the library (MARLHF_CUBLASLT_SONAME, the name the build's CUDA toolkit gives it,
// found as the dynamic loader finds libraries: LD_LIBRARY_PATH, the binary's run path, the
// system's) and resolves the functions. 0, or -1 with err_set() naming the library or the
// missing function. Once is enough: later calls return 0.
extern "C" int cublaslt_library_open(void);
