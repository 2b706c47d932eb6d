// Rotary position embedding, Hugging Face "rotate half" layout (see ops/cpu/rope.c): one
// block per row (token). The row's cos and sin of position * inv_freq[pair] (the model's
// table, device memory) are computed once into shared memory, then every head's pairs are
// rotated with them: sincosf once a row and frequency instead of once for each head too,
// and no 64-bit index divisions. Per element the same float operations as before, so the
// same results. The backward's output (the q and k projections' output gradient) gets its
// bf16 copy written too when it is a held matmul input (matmul_input_hold).
#include "ops/cuda/cuda_common.cuh"

enum { ROPE_THREADS = 256 };

__global__ static void rope_kernel(float *x, __nv_bfloat16 *x_copy, const int *positions, int n_heads, int head_dim,
                                   const float *inv_freq, float direction) {
    extern __shared__ float cos_sin[]; // cos of each pair, then sin (times direction)
    const int half = head_dim / 2;
    const long row = blockIdx.x;
    for (int pair = threadIdx.x; pair < half; pair += blockDim.x) {
        float angle = (float)positions[row] * inv_freq[pair];
        float s, c;
        sincosf(angle, &s, &c);
        cos_sin[pair] = c;
        cos_sin[half + pair] = s * direction;
    }
    __syncthreads();
    float *heads = x + row * n_heads * head_dim;
    for (int i = threadIdx.x; i < n_heads * half; i += blockDim.x) {
        const int pair = i % half;
        float *head = heads + (i / half) * head_dim;
        const float c = cos_sin[pair], s = cos_sin[half + pair];
        const float x1 = head[pair], x2 = head[pair + half];
        head[pair] = x1 * c - x2 * s;
        head[pair + half] = x2 * c + x1 * s;
        if (x_copy) {
            __nv_bfloat16 *copy = x_copy + (head - x);
            copy[pair] = __float2bfloat16(head[pair]);
            copy[pair + half] = __float2bfloat16(head[pair + half]);
        }
    }
}

static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    if ((long)N * n_heads * (head_dim / 2) == 0) return;
    rope_kernel<<<N, ROPE_THREADS, (size_t)head_dim * sizeof(float)>>>(
        x, cuda_held_copy_to_write(x, (long)N * n_heads * head_dim), positions, n_heads, head_dim, inv_freq, direction);
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq) {
    rope_rotate(x, positions, N, n_heads, head_dim, inv_freq, 1.0f);
}

void cuda_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq) {
    rope_rotate(dx, positions, N, n_heads, head_dim, inv_freq, -1.0f);
}
