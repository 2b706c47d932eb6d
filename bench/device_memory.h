// The device memory a benchmark's run held at most, for its result line beside PyTorch's
// torch.cuda.max_memory_allocated ("peak_mem_gib" in bench/torch_gpu_*.py): the backend's
// own count (src/ops/ops.h, ops_device_memory: on the GPU its tensors, bf16 copies of
// weights, scratch, cuBLASLt's workspace). Off the GPU there is none: the line says null.
// ops_device_memory_reset_peak starts the count afresh.
#pragma once
#include <stdio.h>

#include "ops/ops.h"

// What the backend holds now, in GiB as JSON (a number on the GPU, null elsewhere), for a
// run's breakdown: the weights after the model is made, what gradients and the optimizer's
// moments add, what stays held between steps. `text` holds 32 bytes.
static inline const char *device_held_gib_json(const OpsBackend *ops, char *text) {
    size_t in_use, peak;
    if (ops_device_memory(ops, &in_use, &peak)) snprintf(text, 32, "%.3f", (double)in_use / (1u << 30));
    else snprintf(text, 32, "null");
    return text;
}

// The peak in GiB as JSON: a number on the GPU, null elsewhere. `text` holds 32 bytes.
static inline const char *device_peak_gib_json(const OpsBackend *ops, char *text) {
    size_t in_use, peak;
    if (ops_device_memory(ops, &in_use, &peak)) snprintf(text, 32, "%.3f", (double)peak / (1u << 30));
    else snprintf(text, 32, "null");
    return text;
}
