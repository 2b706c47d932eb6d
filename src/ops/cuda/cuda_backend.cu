// The CUDA backend's function table, device set-up, memory and scratch buffers.
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <unordered_map>

#include "ops/cuda/cuda_common.cuh"

static bool device_open = false;
static cublasLtHandle_t blaslt_handle;
static void *blaslt_workspace;
static cudaStream_t side_stream;
static cudaEvent_t main_reached, side_reached; // the fork's and the join's points
static const size_t blaslt_workspace_bytes = 64u << 20;
static void *scratch_buffers[SCRATCH_SLOTS];
static size_t scratch_bytes[SCRATCH_SLOTS];
// Size of every live device allocation (tensors, weight copies, scratch, the workspace): what
// ops_cuda_memory counts, and what freeing a tensor drops of the cached weights inside it.
static std::unordered_map<void *, size_t> allocation_bytes;
// Atomic: serve's /metrics reads them from its HTTP threads while the model's thread allocates.
static std::atomic<size_t> bytes_in_use, bytes_peak;

void *cuda_device_alloc(size_t bytes, const char *what) {
    void *ptr = NULL;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); // not sticky: the context is still usable
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        const double mib = 1048576.0;
        die_user("out of GPU memory: %.1f MiB asked for %s, %.1f MiB free of %.1f MiB, %.1f MiB held by marlhf "
                 "(--device cuda; a smaller batch, --gradient-checkpointing or LoRA needs less)",
                 bytes / mib, what, free_bytes / mib, total_bytes / mib, bytes_in_use.load() / mib);
    }
    CUDA_CHECK(status);
    allocation_bytes[ptr] = bytes;
    const size_t held = bytes_in_use += bytes;
    if (held > bytes_peak.load()) bytes_peak = held;
    return ptr;
}

void cuda_device_free(void *ptr) {
    if (!ptr) return;
    auto found = allocation_bytes.find(ptr);
    CHECK(found != allocation_bytes.end(), "freeing %p, which the CUDA backend did not allocate", ptr);
    bytes_in_use -= found->second;
    allocation_bytes.erase(found);
    CUDA_CHECK(cudaFree(ptr));
}

size_t cuda_allocation_size(const void *ptr) {
    auto found = allocation_bytes.find(const_cast<void *>(ptr));
    return found == allocation_bytes.end() ? 0 : found->second;
}

extern "C" OpsCudaMemory ops_cuda_memory(void) { return OpsCudaMemory{bytes_in_use.load(), bytes_peak.load()}; }

extern "C" void ops_cuda_memory_reset_peak(void) { bytes_peak = bytes_in_use.load(); }

cublasLtHandle_t cuda_blaslt(void) { return blaslt_handle; }

void *cuda_blaslt_workspace(size_t *bytes) {
    *bytes = blaslt_workspace_bytes;
    return blaslt_workspace;
}

cudaStream_t cuda_side_stream(void) { return side_stream; }

void cuda_side_stream_fork(void) {
    CUDA_CHECK(cudaEventRecord(main_reached, 0));
    CUDA_CHECK(cudaStreamWaitEvent(side_stream, main_reached, 0));
}

void cuda_side_stream_join(void) {
    CUDA_CHECK(cudaEventRecord(side_reached, side_stream));
    CUDA_CHECK(cudaStreamWaitEvent(0, side_reached, 0));
}

void *cuda_scratch(int slot, size_t bytes) {
    if (scratch_bytes[slot] < bytes) {
        // cudaFree waits for the device, so no running kernel still reads the old buffer.
        cuda_device_free(scratch_buffers[slot]);
        size_t grown = bytes + bytes / 4;
        scratch_buffers[slot] = cuda_device_alloc(grown, "a scratch buffer");
        scratch_bytes[slot] = grown;
    }
    return scratch_buffers[slot];
}

void cuda_weights_written(const void *ptr, size_t bytes) { cuda_weight_cache_mark_stale(ptr, bytes); }

static void *cuda_alloc(size_t bytes) {
    if (bytes == 0) bytes = 256;
    void *ptr = cuda_device_alloc(bytes, "a tensor");
    CUDA_CHECK(cudaMemset(ptr, 0, bytes));
    return ptr;
}

static void cuda_free(void *ptr) {
    if (!ptr) return;
    auto found = allocation_bytes.find(ptr);
    CHECK(found != allocation_bytes.end(), "freeing %p, which the CUDA backend did not allocate", ptr);
    cuda_weight_cache_release(ptr, found->second);
    cuda_device_free(ptr);
}

static void cuda_copy_to_device(void *dst, const void *src, size_t bytes) {
    cuda_weights_written(dst, bytes);
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void cuda_copy_to_host(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void cuda_fill_zero(float *x, long n) {
    cuda_weights_written(x, (size_t)n * sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), 0));
}

static void cuda_synchronize(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

// ---- elementwise ----

// Four elements a thread (device_primitives.cuh's Four): the residual adds are twice a layer.
__global__ static void add_kernel(float *out, const float *a, const float *b, long n, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four x = load_four(a, first, n, vector), y = load_four(b, first, n, vector), sum;
    for (int k = 0; k < 4; k++) sum.x[k] = x.x[k] + y.x[k];
    store_four(out, first, n, vector, sum);
}

__global__ static void accumulate_kernel(float *acc, const float *x, long n, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four total = load_four(acc, first, n, vector), more = load_four(x, first, n, vector);
    for (int k = 0; k < 4; k++) total.x[k] += more.x[k];
    store_four(acc, first, n, vector, total);
}

__global__ static void scale_kernel(float *x, float factor, long n, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four values = load_four(x, first, n, vector);
    for (int k = 0; k < 4; k++) values.x[k] *= factor;
    store_four(x, first, n, vector, values);
}

static void cuda_add(float *out, const float *a, const float *b, long n) {
    if (n == 0) return;
    add_kernel<<<grid_for_fours(n, 256), 256>>>(out, a, b, n, all_aligned16(out, a, b));
    CUDA_CHECK_LAUNCH();
}

static void cuda_scale(float *x, float factor, long n) {
    if (n == 0) return;
    scale_kernel<<<grid_for_fours(n, 256), 256>>>(x, factor, n, all_aligned16(x, NULL));
    CUDA_CHECK_LAUNCH();
}

static void cuda_accumulate(float *acc, const float *x, long n) {
    if (n == 0) return;
    accumulate_kernel<<<grid_for_fours(n, 256), 256>>>(acc, x, n, all_aligned16(acc, x));
    CUDA_CHECK_LAUNCH();
}

// ---- copies between row layouts ----

static void cuda_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, int rows,
                           int width) {
    cuda_weights_written(dst, (size_t)((rows - 1) * dst_stride + width) * sizeof(float));
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src,
                                 (size_t)src_stride * sizeof(float), (size_t)width * sizeof(float),
                                 (size_t)rows, cudaMemcpyDeviceToDevice, 0));
}

static void cuda_cache_write(float *cache, const float *x, int B, int T, int capacity, int slot,
                             int width) {
    // Row b's T slots are contiguous in both: one 2-D copy with B rows of T*width floats.
    CUDA_CHECK(cudaMemcpy2DAsync(cache + (long)slot * width, (size_t)capacity * width * sizeof(float),
                                 x, (size_t)T * width * sizeof(float),
                                 (size_t)T * width * sizeof(float), (size_t)B,
                                 cudaMemcpyDeviceToDevice, 0));
}

extern "C" const OpsCollectives cuda_collectives; // collectives.cu

extern "C" const OpsBackend ops_cuda = {
    .name = "cuda",
    .collectives = &cuda_collectives,
    .fuses_qkv_products = true,
    .samples_whole_rows = true,
    .attention_forward_without_saved = false, // (its kernels write their saved state as they go)
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .fill_zero = cuda_fill_zero,
    .synchronize = cuda_synchronize,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .embedding_forward_q8 = cuda_embedding_forward_q8,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_accumulate = cuda_matmul_accumulate,
    .matmul_forward_residual = cuda_matmul_forward_residual,
    .matmul_forward_parts = cuda_matmul_forward_parts,
    .matmul_forward_glu = cuda_matmul_forward_glu,
    // Quantized weights (matmul_quantized.cu): dequantized tile by tile into bf16, then
    // cuBLASLt; forward_q8 has no integer decode kernel and computes what forward_dequantized does.
    .matmul_forward_q8 = cuda_matmul_forward_q8,
    .matmul_forward_parts_q8 = cuda_matmul_forward_parts_q8,
    .matmul_forward_glu_q8 = cuda_matmul_forward_glu_q8,
    .matmul_forward_dequantized = cuda_matmul_forward_dequantized,
    .matmul_backward_input_q8 = cuda_matmul_backward_input_q8,
    .dequantize_rows = cuda_dequantize_rows,
    .matmul_backward = cuda_matmul_backward,
    .matmul_input_hold = cuda_matmul_input_hold,
    .hold_stored = cuda_hold_stored,
    .stored_buffer_floats = cuda_stored_buffer_floats,
    .matmul_input_release = cuda_matmul_input_release,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_saved_size = cuda_attention_saved_size,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_forward_rotary = cuda_attention_forward_rotary,
    .attention_backward_rotary = cuda_attention_backward_rotary,
    .attention_decode = cuda_attention_decode,
    .cache_write = cuda_cache_write,
    .cache_write_f16 = cuda_cache_write_f16,
    .attention_decode_f16 = cuda_attention_decode_f16,
    .attention_extend = cuda_attention_extend,
    .attention_extend_f16 = cuda_attention_extend_f16,
    .cache_write_q8 = cuda_cache_write_q8,
    .attention_decode_q8 = cuda_attention_decode_q8,
    .attention_extend_q8 = cuda_attention_extend_q8,
    .rotate_and_cache_write = cuda_rotate_and_cache_write,
    .copy_rows = cuda_copy_rows,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .glu_forward = cuda_glu_forward,
    .glu_backward = cuda_glu_backward,
    .add = cuda_add,
    .accumulate = cuda_accumulate,
    .scale = cuda_scale,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .uniform_noise_add = cuda_uniform_noise_add,
    .dora_weight_norm = cuda_dora_weight_norm,
    .dora_forward = cuda_dora_forward,
    .dora_backward = cuda_dora_backward,
    .logprob_forward = cuda_logprob_forward,
    .sampling_candidates = cuda_sampling_candidates,
    .sample_rows = cuda_sample_rows,
    .logprob_backward = cuda_logprob_backward,
    .soft_cap_forward = cuda_soft_cap_forward,
    .collision_entropy_forward = cuda_collision_entropy_forward,
    .value_head_forward = cuda_value_head_forward,
    .value_head_backward = cuda_value_head_backward,
    .adamw_update = cuda_adamw_update,
    .sum_squares = cuda_sum_squares,
    .moving_average = cuda_moving_average,
};

static int device_index = 0;
static size_t shared_memory_per_block = 0;

size_t cuda_shared_memory_per_block(void) { return shared_memory_per_block; }

// This process's rank among the processes of an MPI job on this machine (0 when not
// launched by one): data-parallel ranks (dist/dist.h) take one GPU each.
static int local_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (const char *name : names) {
        const char *value = getenv(name);
        if (value && atoi(value) >= 0) return atoi(value);
    }
    return 0;
}

// Opens a device once: device 0 (of $CUDA_VISIBLE_DEVICES), or under mpirun the local
// rank's, round robin over the visible GPUs. Returns -1 with err_set() when no usable GPU
// is present, so `--device cuda` on a machine without one is a user error.
extern "C" int ops_cuda_open(void) {
    if (device_open) return 0;
    const char *attention = getenv("MARLHF_CUDA_ATTENTION");
    if (attention && !ops_cuda_select_attention(attention))
        return err_set("MARLHF_CUDA_ATTENTION is '%s'; expected mma, mma-plain, mma-ds, wmma or unfused (environment)", attention);
    const char *stored_inputs = getenv("MARLHF_CUDA_STORED_INPUTS");
    if (stored_inputs && *stored_inputs) { // unset or empty: on
        const int stores = env_switch("MARLHF_CUDA_STORED_INPUTS");
        if (stores < 0) return -1;
        ops_cuda_enable_stored_inputs(stores == 1);
    }
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
        return err_set("no CUDA device is available (--device cuda): %s",
                       status != cudaSuccess ? cudaGetErrorString(status) : "no GPU found");
    device_index = local_rank() % count;
    CUDA_CHECK(cudaSetDevice(device_index));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
    if (prop.major < 8)
        return err_set("GPU '%s' has compute capability %d.%d; the CUDA backend needs bf16 "
                       "tensor cores (8.0 or newer) (--device cuda)",
                       prop.name, prop.major, prop.minor);
    shared_memory_per_block = prop.sharedMemPerBlockOptin;
    if (cublaslt_library_open() != 0) return -1;
    CUBLAS_CHECK(cublaslt.Create(&blaslt_handle));
    blaslt_workspace = cuda_device_alloc(blaslt_workspace_bytes, "cuBLASLt's workspace");
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&main_reached, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&side_reached, cudaEventDisableTiming));
    device_open = true;
    return 0;
}

extern "C" bool ops_cuda_is_emulated(void) {
#ifdef MARLHF_CUDA_EMULATED
    return true;
#else
    return false;
#endif
}

extern "C" const char *ops_cuda_device_name(void) {
    static cudaDeviceProp prop;
    static bool known = false;
    if (!known && device_open) {
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
        known = true;
    }
    return known ? prop.name : "none";
}
