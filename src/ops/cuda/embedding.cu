// Token (and learned position) embeddings. The backward adds each row of dout into the
// table row of its token. Rows sharing a token would race under atomics and make the sum
// order (so the bits) vary run to run; instead the rows are grouped by token on the host
// (the ids are small) and one thread per (group, column) adds its rows in order.
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/cuda_common.cuh"

__global__ static void embedding_forward_kernel(float *out, const int *tokens, const int *positions,
                                                const float *tok_emb, const float *pos_emb, int N,
                                                int C, float scale) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * C) return;
    long row = i / C, c = i % C;
    float value = scale * tok_emb[(long)tokens[row] * C + c];
    if (pos_emb) value += pos_emb[(long)positions[row] * C + c];
    out[i] = value;
}

void cuda_embedding_forward(float *out, const int *tokens, const int *positions,
                            const float *tok_emb, const float *pos_emb, int N, int C, float scale) {
    embedding_forward_kernel<<<grid_for((long)N * C, 256), 256>>>(out, tokens, positions, tok_emb,
                                                                 pos_emb, N, C, scale);
    CUDA_CHECK_LAUNCH();
}

// groups: [n_groups + 1] offsets into order; order: row indices sorted by key (stable).
__global__ static void grouped_rows_kernel(float *table, const float *dout, const int *keys,
                                           const int *order, const int *groups, int C,
                                           float scale) {
    int group = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int first = groups[group], last = groups[group + 1];
    float sum = 0.0f;
    for (int k = first; k < last; k++) sum += dout[(long)order[k] * C + c];
    table[(long)keys[order[first]] * C + c] += scale * sum;
}

// table[keys[i]] += scale * dout[i] for every row i, deterministically.
static void add_rows_by_key(float *table, const float *dout, const int *keys_device, int N, int C,
                            float scale) {
    int *keys = (int *)xmalloc((size_t)N * sizeof(int));
    CUDA_CHECK(cudaMemcpy(keys, keys_device, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost));
    int max_key = 0;
    for (int i = 0; i < N; i++) max_key = keys[i] > max_key ? keys[i] : max_key;
    // Counting sort: stable, so rows of one key stay in order.
    int *count = (int *)xcalloc((size_t)max_key + 2, sizeof(int));
    for (int i = 0; i < N; i++) count[keys[i] + 1]++;
    for (int k = 0; k <= max_key; k++) count[k + 1] += count[k];
    int *host = (int *)xmalloc((size_t)(2 * N + 1) * sizeof(int)); // order, then group offsets
    int *order = host, *groups = host + N;
    int *next = (int *)xmalloc((size_t)(max_key + 1) * sizeof(int));
    memcpy(next, count, (size_t)(max_key + 1) * sizeof(int));
    for (int i = 0; i < N; i++) order[next[keys[i]]++] = i;
    int n_groups = 0;
    for (int k = 0; k <= max_key; k++)
        if (count[k + 1] > count[k]) groups[n_groups++] = count[k];
    groups[n_groups] = N;
    int *device = (int *)cuda_scratch(SCRATCH_INDEX, (size_t)(2 * N + 1) * sizeof(int));
    CUDA_CHECK(cudaMemcpy(device, host, (size_t)(N + n_groups + 1) * sizeof(int),
                          cudaMemcpyHostToDevice));
    dim3 grid(grid_for(C, 256), n_groups);
    grouped_rows_kernel<<<grid, 256>>>(table, dout, keys_device, device, device + N, C, scale);
    CUDA_CHECK_LAUNCH();
    // The scratch is reused by the next call: wait before the host buffers go.
    CUDA_CHECK(cudaDeviceSynchronize());
    free(keys), free(count), free(host), free(next);
}

void cuda_embedding_backward(float *d_tok_emb, float *d_pos_emb, const float *dout,
                             const int *tokens, const int *positions, int N, int C, float scale) {
    if (N == 0) return;
    if (d_tok_emb) add_rows_by_key(d_tok_emb, dout, tokens, N, C, scale);
    if (d_pos_emb) add_rows_by_key(d_pos_emb, dout, positions, N, C, 1.0f);
}
