// The CPU backend's function table, memory helpers and elementwise ops.
#include <string.h>
#include <sys/mman.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/ops.h"

// Large buffers (activations, logits, weights) come straight from the kernel: its pages
// are already zero and are only backed by memory once touched, so a buffer sized for the
// largest batch costs nothing where a smaller batch leaves it unused (the LM head's logits
// rows of slots without a target, say), and no pass of memset writes it first. A 64-byte
// header in front records how the block was obtained. The sanitizer build keeps malloc,
// which AddressSanitizer can check.
#if defined(__SANITIZE_ADDRESS__)
#define CPU_MAP_THRESHOLD ((size_t)-1)
#else
#define CPU_MAP_THRESHOLD ((size_t)1 << 20)
#endif
#define CPU_HEADER 64

typedef struct {
    size_t mapped_bytes; // 0: from aligned_alloc
} CpuBlockHeader;

static void *cpu_alloc(size_t bytes) {
    size_t total = (bytes + CPU_HEADER + 63) / 64 * 64;
    char *base;
    if (bytes >= CPU_MAP_THRESHOLD) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(base != MAP_FAILED, "out of memory mapping %zu bytes", bytes);
        // Transparent huge pages where the kernel offers them on request: a 2 MB page
        // faults once instead of 512 times and takes one TLB entry.
        madvise(base, total, MADV_HUGEPAGE);
        ((CpuBlockHeader *)base)->mapped_bytes = total;
    } else {
        base = xaligned_alloc(total); // zero-filled
        ((CpuBlockHeader *)base)->mapped_bytes = 0;
    }
    return base + CPU_HEADER;
}

static void cpu_free(void *ptr) {
    if (!ptr) return;
    char *base = (char *)ptr - CPU_HEADER;
    size_t mapped = ((CpuBlockHeader *)base)->mapped_bytes;
    if (mapped) munmap(base, mapped);
    else free(base);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static void cpu_fill_zero(float *x, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) x[i] = 0.0f;
}

static void cpu_synchronize(void) {}

static void cpu_moving_average(float *average, const float *x, float beta, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) average[i] = beta * average[i] + (1.0f - beta) * x[i];
}

static void cpu_add(float *out, const float *a, const float *b, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_accumulate(float *acc, const float *x, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) acc[i] += x[i];
}

static void cpu_scale(float *x, float factor, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) x[i] *= factor;
}

void ops_input_norm_forward(const OpsBackend *ops, float *inp, const InputRmsNorm *norm, int N, int IC) {
    if (norm) ops->rmsnorm_forward(inp, norm->rstd, norm->x, norm->weight, N, IC, norm->eps, norm->weight_plus_one);
}

// (A product's `inp` is const to the product; with a norm it is the norm's output buffer,
// which the caller gave for it: InputRmsNorm.)
void ops_matmul_forward_per_part(const OpsBackend *ops, float *const *outs, const int *widths, int parts,
                                 const float *inp, const float *weight, const float *bias, int N, int IC,
                                 const InputRmsNorm *norm) {
    ops_input_norm_forward(ops, (float *)inp, norm, N, IC);
    long first = 0;
    for (int p = 0; p < parts; p++) {
        ops->matmul_forward(outs[p], inp, weight + first * IC, bias ? bias + first : NULL, N, IC, widths[p]);
        first += widths[p];
    }
}

// The table's matmul_forward per part (its stored-input checks included): the same calls,
// and bits, as three (two) matmul_forward calls.
static void cpu_matmul_forward_parts(float *const *outs, const int *widths, int parts, const float *inp,
                                     const float *weight, const float *bias, int N, int IC,
                                     const InputRmsNorm *norm) {
    ops_matmul_forward_per_part(&ops_cpu, outs, widths, parts, inp, weight, bias, N, IC, norm);
}

void ops_matmul_forward_glu_in_calls(const OpsBackend *ops, float *act, float *gate, float *up, const float *inp,
                                     const float *weight, int N, int IC, int width, bool gelu,
                                     const InputRmsNorm *norm) {
    float *outs[2] = {gate, up};
    const int widths[2] = {width, width};
    ops->matmul_forward_parts(outs, widths, 2, inp, weight, NULL, N, IC, norm);
    ops->glu_forward(act, gate, up, (long)N * width, gelu);
}

static void cpu_matmul_forward_glu(float *act, float *gate, float *up, const float *inp, const float *weight, int N,
                                   int IC, int width, bool gelu, const InputRmsNorm *norm) {
    ops_matmul_forward_glu_in_calls(&ops_cpu, act, gate, up, inp, weight, N, IC, width, gelu, norm);
}

void ops_matmul_forward_parts_q8_in_calls(const OpsBackend *ops, float *const *outs, const Q8Matrix *const *weights,
                                          const float *const *biases, int parts, const float *inp, int N, int IC,
                                          int kernel_rows, const InputRmsNorm *norm) {
    ops_input_norm_forward(ops, (float *)inp, norm, N, IC);
    for (int p = 0; p < parts; p++)
        ops->matmul_forward_q8(outs[p], inp, weights[p], biases[p], N, IC, weights[p]->rows, kernel_rows);
}

static void cpu_matmul_forward_parts_q8(float *const *outs, const Q8Matrix *const *weights,
                                        const float *const *biases, int parts, const float *inp, int N, int IC,
                                        int kernel_rows, const InputRmsNorm *norm) {
    ops_matmul_forward_parts_q8_in_calls(&ops_cpu, outs, weights, biases, parts, inp, N, IC, kernel_rows, norm);
}

void ops_matmul_forward_glu_q8_in_calls(const OpsBackend *ops, float *act, float *gate, float *up, const float *inp,
                                        const Q8Matrix *gate_weight, const Q8Matrix *up_weight, int N, int IC,
                                        int width, bool gelu, int kernel_rows, const InputRmsNorm *norm) {
    ops_input_norm_forward(ops, (float *)inp, norm, N, IC);
    ops->matmul_forward_q8(gate, inp, gate_weight, NULL, N, IC, width, kernel_rows);
    ops->matmul_forward_q8(up, inp, up_weight, NULL, N, IC, width, kernel_rows);
    ops->glu_forward(act, gate, up, (long)N * width, gelu);
}

static void cpu_matmul_forward_glu_q8(float *act, float *gate, float *up, const float *inp,
                                      const Q8Matrix *gate_weight, const Q8Matrix *up_weight, int N, int IC, int width,
                                      bool gelu, int kernel_rows, const InputRmsNorm *norm) {
    ops_matmul_forward_glu_q8_in_calls(&ops_cpu, act, gate, up, inp, gate_weight, up_weight, N, IC, width, gelu,
                                       kernel_rows, norm);
}

void ops_rotate_and_cache_write_in_calls(const OpsBackend *ops, float *q, float *k, const float *v, void *k_cache,
                                         void *v_cache, KvCacheType cache_type, const int *positions, int B, int T,
                                         int capacity, int slot, int n_heads, int n_kv_heads, int head_dim,
                                         const float *inv_freq) {
    const int N = B * T, kv_dim = n_kv_heads * head_dim;
    if (inv_freq) {
        ops->rope_forward(q, positions, N, n_heads, head_dim, inv_freq);
        ops->rope_forward(k, positions, N, n_kv_heads, head_dim, inv_freq);
    }
    switch (cache_type) {
    case KV_CACHE_F32:
        ops->cache_write((float *)k_cache, k, B, T, capacity, slot, kv_dim);
        ops->cache_write((float *)v_cache, v, B, T, capacity, slot, kv_dim);
        break;
    case KV_CACHE_F16:
        ops->cache_write_f16((uint16_t *)k_cache, k, B, T, capacity, slot, kv_dim);
        ops->cache_write_f16((uint16_t *)v_cache, v, B, T, capacity, slot, kv_dim);
        break;
    case KV_CACHE_Q8_0:
        ops->cache_write_q8(k_cache, k, B, T, capacity, slot, n_kv_heads, head_dim);
        ops->cache_write_q8(v_cache, v, B, T, capacity, slot, n_kv_heads, head_dim);
        break;
    }
}

static void cpu_rotate_and_cache_write(float *q, float *k, const float *v, void *k_cache, void *v_cache,
                                       KvCacheType cache_type, const int *positions, int B, int T, int capacity,
                                       int slot, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq) {
    ops_rotate_and_cache_write_in_calls(&ops_cpu, q, k, v, k_cache, v_cache, cache_type, positions, B, T, capacity,
                                        slot, n_heads, n_kv_heads, head_dim, inv_freq);
}

const OpsBackend ops_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .fill_zero = cpu_fill_zero,
    .synchronize = cpu_synchronize,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .embedding_forward_q8 = cpu_embedding_forward_q8,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .matmul_forward = cpu_stored_matmul_forward,
    .matmul_accumulate = cpu_stored_matmul_accumulate,
    .matmul_forward_residual = cpu_stored_matmul_forward_residual,
    .matmul_forward_parts = cpu_matmul_forward_parts,
    .matmul_forward_glu = cpu_matmul_forward_glu,
    .matmul_forward_parts_q8 = cpu_matmul_forward_parts_q8,
    .matmul_forward_glu_q8 = cpu_matmul_forward_glu_q8,
    .matmul_forward_q8 = cpu_matmul_forward_q8,
    .matmul_forward_dequantized = cpu_stored_matmul_forward_dequantized,
    .matmul_backward_input_q8 = cpu_matmul_backward_input_q8,
    .dequantize_rows = cpu_dequantize_rows,
    .matmul_backward = cpu_stored_matmul_backward,
    .matmul_input_hold = cpu_matmul_input_hold,
    .hold_stored = cpu_hold_stored,
    .stored_buffer_floats = cpu_stored_buffer_floats,
    .matmul_input_release = cpu_matmul_input_release,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_saved_size = cpu_attention_saved_size,
    .attention_forward_without_saved = true,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_forward_rotary = cpu_attention_forward_rotary,
    .attention_backward_rotary = cpu_attention_backward_rotary,
    .attention_decode = cpu_attention_decode,
    .cache_write = cpu_cache_write,
    .cache_write_f16 = cpu_cache_write_f16,
    .attention_decode_f16 = cpu_attention_decode_f16,
    .attention_extend = cpu_attention_extend,
    .attention_extend_f16 = cpu_attention_extend_f16,
    .cache_write_q8 = cpu_cache_write_q8,
    .attention_decode_q8 = cpu_attention_decode_q8,
    .attention_extend_q8 = cpu_attention_extend_q8,
    .rotate_and_cache_write = cpu_rotate_and_cache_write,
    .copy_rows = cpu_copy_rows,
    .gelu_forward = cpu_stored_gelu_forward,
    .gelu_backward = cpu_stored_gelu_backward,
    .glu_forward = cpu_stored_glu_forward,
    .glu_backward = cpu_stored_glu_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .scale = cpu_scale,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .uniform_noise_add = cpu_uniform_noise_add,
    .dora_weight_norm = cpu_dora_weight_norm,
    .dora_forward = cpu_dora_forward,
    .dora_backward = cpu_dora_backward,
    .logprob_forward = cpu_logprob_forward,
    .sampling_candidates = cpu_sampling_candidates,
    .sample_rows = cpu_sample_rows,
    .logprob_backward = cpu_logprob_backward,
    .soft_cap_forward = cpu_soft_cap_forward,
    .collision_entropy_forward = cpu_collision_entropy_forward,
    .value_head_forward = cpu_value_head_forward,
    .value_head_backward = cpu_value_head_backward,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
    .moving_average = cpu_moving_average,
};

const OpsBackend *ops_backend_by_name(const char *name) {
    if (strcmp(name, "cpu") == 0) return &ops_cpu;
#ifdef MARLHF_CUDA
    if (strcmp(name, "cuda") == 0) return ops_cuda_open() == 0 ? &ops_cuda : NULL;
    err_set("unknown device '%s' (--device): cpu or cuda", name);
#else
    if (strcmp(name, "cuda") == 0)
        err_set("this marlhf was built without CUDA (no nvcc at build time) (--device cuda)");
    else
        err_set("unknown device '%s' (--device): cpu (cuda needs a build with nvcc)", name);
#endif
    return NULL;
}

bool ops_device_memory(const OpsBackend *ops, size_t *in_use_bytes, size_t *peak_bytes) {
#ifdef MARLHF_CUDA
    if (ops == &ops_cuda) {
        const OpsCudaMemory memory = ops_cuda_memory();
        *in_use_bytes = memory.in_use_bytes, *peak_bytes = memory.peak_bytes;
        return true;
    }
#endif
    (void)ops, (void)in_use_bytes, (void)peak_bytes;
    return false;
}

void ops_device_memory_reset_peak(const OpsBackend *ops) {
#ifdef MARLHF_CUDA
    if (ops == &ops_cuda) ops_cuda_memory_reset_peak();
#endif
    (void)ops;
}

int ops_take_device_memory_peak_mib(const OpsBackend *ops) {
    size_t in_use, peak;
    if (!ops_device_memory(ops, &in_use, &peak)) return -1;
    ops_device_memory_reset_peak(ops);
    const size_t mib = 1u << 20;
    return (int)((peak + mib - 1) / mib);
}
