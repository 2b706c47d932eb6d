// cuBLASLt's product on the CPU for the emulated CUDA backend (tests/emulated_cuda/include/cublasLt.h),
// and the backend's function table filled with it in place of src/ops/cuda/cublaslt_library.cu's
// dlopen of the real library.
//
// D = alpha op(A) op(B) + beta C, column-major as cuBLASLt's layouts are, strided batches;
// A and B bf16, C and D fp32 or both bf16, sums in fp32 in k order (the GPU's order
// differs: tests/gpu/test_cuda.c's tolerances are for that). As in cuBLASLt, C is not
// read when beta is 0 (an unwritten C, NaN under the emulation, must not leak into D).
// The alignments the plan was chosen for (the preference's minimums) are checked against
// the pointers of every call: a plan reused for a less aligned pointer is what makes the
// real library fault or return garbage.
#include <cublasLt.h>

#include <vector>

#include "ops/cuda/cublaslt_library.cuh"

extern "C" {
#include "core/check.h"
}

struct EmulatedLtHandle {
    int unused;
};
struct EmulatedLtLayout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct EmulatedLtDesc {
    cublasOperation_t trans_a, trans_b;
};
struct EmulatedLtPreference {
    uint32_t alignment[4]; // A, B, C, D
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    *handle = new EmulatedLtHandle{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)rows || ld < 1) return CUBLAS_STATUS_INVALID_VALUE; // column-major: ld >= rows
    *layout = new EmulatedLtLayout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute,
                                                const void *value, size_t bytes) {
    if (attribute == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && bytes == sizeof(int32_t))
        memcpy(&layout->batch, value, bytes);
    else if (attribute == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && bytes == sizeof(int64_t))
        memcpy(&layout->stride, value, bytes);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = new EmulatedLtDesc{CUBLAS_OP_N, CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void *value, size_t bytes) {
    if (bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    if (attribute == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&desc->trans_a, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&desc->trans_b, value, bytes);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference) {
    *preference = new EmulatedLtPreference{{256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, const void *value,
                                                    size_t bytes) {
    int which;
    switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return bytes == sizeof(uint64_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: which = 0; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: which = 1; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: which = 2; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: which = 3; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&preference->alignment[which], value, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
    delete preference;
    return CUBLAS_STATUS_SUCCESS;
}

// The shapes of op(A) (m x k), op(B) (k x n) and C/D (m x n) must agree.
static bool shapes_agree(const EmulatedLtDesc *desc, const EmulatedLtLayout *a, const EmulatedLtLayout *b,
                         const EmulatedLtLayout *d) {
    const uint64_t m = d->rows, n = d->cols;
    const uint64_t a_rows = desc->trans_a == CUBLAS_OP_T ? a->cols : a->rows, k = desc->trans_a == CUBLAS_OP_T ? a->rows : a->cols;
    const uint64_t b_rows = desc->trans_b == CUBLAS_OP_T ? b->cols : b->rows, b_cols = desc->trans_b == CUBLAS_OP_T ? b->rows : b->cols;
    return a_rows == m && b_rows == k && b_cols == n && a->batch == d->batch && b->batch == d->batch &&
           a->type == CUDA_R_16BF && b->type == CUDA_R_16BF;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t preference,
                                              int requested, cublasLtMatmulHeuristicResult_t results[], int *returned) {
    *returned = 0;
    if (requested < 1 || !shapes_agree(desc, a, b, d) || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = preference->alignment[i];
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float element(const void *base, cudaDataType type, int64_t index) {
    if (type == CUDA_R_16BF) return bf16_to_float(((const bf16 *)base)[index]);
    return ((const float *)base)[index];
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha_pointer, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta_pointer,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t) {
    emulation::launch_counts.products++;
    if (!shapes_agree(desc, a, b, d) || c->type != d->type || c->rows != d->rows || c->cols != d->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (emulation::skip_work()) return CUBLAS_STATUS_SUCCESS;
    emulation::DeviceAccess access;
    const void *pointers[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        CHECK((uintptr_t)pointers[i] % algo->data[i] == 0,
              "emulated cuBLASLt: operand %c at %p is less aligned than the %llu bytes its plan was chosen for",
              "ABCD"[i], pointers[i], (unsigned long long)algo->data[i]);
    float alpha, beta;
    memcpy(&alpha, alpha_pointer, sizeof alpha);
    memcpy(&beta, beta_pointer, sizeof beta);
    const int64_t m = (int64_t)d->rows, n = (int64_t)d->cols;
    const int64_t k = desc->trans_a == CUBLAS_OP_T ? (int64_t)a->rows : (int64_t)a->cols;
    const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
    // op(A) widened once into [k][m] floats, so that column j's m sums run side by side,
    // each still adding its k products one after another (the bits of a plain loop over p;
    // the compiler vectorises across i, and -ffp-contract=off keeps product and sum apart).
    std::vector<float> a_rows((size_t)(k * m)), sums((size_t)m);
    for (int32_t batch = 0; batch < d->batch; batch++) {
        const bf16 *Ab = (const bf16 *)A + batch * a->stride, *Bb = (const bf16 *)B + batch * b->stride;
        const int64_t c_offset = batch * c->stride, d_offset = batch * d->stride;
        for (int64_t p = 0; p < k; p++)
            for (int64_t i = 0; i < m; i++)
                a_rows[(size_t)(p * m + i)] = bf16_to_float(ta ? Ab[p + i * a->ld] : Ab[i + p * a->ld]);
        for (int64_t j = 0; j < n; j++) {
            float *sum = sums.data();
            for (int64_t i = 0; i < m; i++) sum[i] = 0.0f;
            for (int64_t p = 0; p < k; p++) {
                const float y = bf16_to_float(tb ? Bb[j + p * b->ld] : Bb[p + j * b->ld]);
                const float *x = a_rows.data() + p * m;
                for (int64_t i = 0; i < m; i++) sum[i] += x[i] * y;
            }
            for (int64_t i = 0; i < m; i++) {
                float result = alpha * sum[i];
                if (beta != 0.0f) result += beta * element(C, c->type, c_offset + i + j * c->ld);
                const int64_t at = d_offset + i + j * d->ld;
                if (d->type == CUDA_R_16BF)
                    ((bf16 *)D)[at] = float_to_bf16(result);
                else
                    ((float *)D)[at] = result;
            }
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

CublasLtLibrary cublaslt;

extern "C" int cublaslt_library_open(void) {
    cublaslt = CublasLtLibrary{cublasLtCreate,
                               cublasLtMatrixLayoutCreate,
                               cublasLtMatrixLayoutSetAttribute,
                               cublasLtMatmulDescCreate,
                               cublasLtMatmulDescSetAttribute,
                               cublasLtMatmulPreferenceCreate,
                               cublasLtMatmulPreferenceSetAttribute,
                               cublasLtMatmulPreferenceDestroy,
                               cublasLtMatmulAlgoGetHeuristic,
                               cublasLtMatmul};
    return 0;
}
