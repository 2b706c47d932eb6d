// The widest vector path of a kernel that a build compiled, for the kernels that name each
// path so that the tests can hold every one to the portable loop (ops/cpu/matmul_kquant.c,
// matmul_q5.c): AVX-512 (BW + VNNI), else AVX2, else the portable loop. Only the chosen
// argument is expanded, so the others need not exist in this build.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SIMD_HAS_AVX512 1
#define SIMD_BEST(avx512, avx2, portable) avx512
#define SIMD_BEST_NAME "avx512"
#elif defined(__AVX2__)
#define SIMD_HAS_AVX512 0
#define SIMD_BEST(avx512, avx2, portable) avx2
#define SIMD_BEST_NAME "avx2"
#else
#define SIMD_HAS_AVX512 0
#define SIMD_BEST(avx512, avx2, portable) portable
#define SIMD_BEST_NAME "portable"
#endif
