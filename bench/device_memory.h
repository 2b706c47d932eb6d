// The device memory a benchmark's run held at most, for its result line beside PyTorch's
// torch.cuda.max_memory_allocated ("peak_mem_gib" in bench/torch_gpu_*.py): the CUDA
// backend's own count (src/ops/ops.h, ops_cuda_memory: tensors, bf16 copies of weights,
// scratch, cuBLASLt's workspace). Off the GPU there is none: the line says null.
#pragma once
#include <stdio.h>

#include "ops/ops.h"

// Forget the peak so far: the next figure is the most held from here on.
static inline void device_peak_reset(const OpsBackend *ops) {
#ifdef MARLHF_CUDA
    if (ops == &ops_cuda) ops_cuda_memory_reset_peak();
#endif
    (void)ops;
}

// The peak in GiB as JSON: a number on the GPU, null elsewhere. `text` holds 32 bytes.
static inline const char *device_peak_gib_json(const OpsBackend *ops, char *text) {
    snprintf(text, 32, "null");
#ifdef MARLHF_CUDA
    if (ops == &ops_cuda) snprintf(text, 32, "%.3f", (double)ops_cuda_memory().peak_bytes / (1u << 30));
#endif
    return text;
}
