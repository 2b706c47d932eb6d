// Attention for one new token per row against the KV cache (generation). Plain loops:
// one query row is a matrix-vector product, which sgemm would not speed up.
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int capacity, int length, int n_heads,
                          int n_kv_heads, int head_dim) {
    const int kv_width = n_kv_heads * head_dim, q_width = n_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *scores = xmalloc((size_t)length * sizeof(float));
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * n_heads; bh++) {
            int b = bh / n_heads, h = bh % n_heads, kv_head = h / group;
            int start = row_start ? row_start[b] : 0;
            const float *query = q + (long)b * q_width + h * head_dim;
            const float *keys = k_cache + (long)b * capacity * kv_width + kv_head * head_dim;
            const float *values = v_cache + (long)b * capacity * kv_width + kv_head * head_dim;
            float *o = out + (long)b * q_width + h * head_dim;
            float max_score = -INFINITY;
            for (int j = start; j < length; j++) {
                const float *key = keys + (long)j * kv_width;
                float dot = 0.0f;
                // simd: without it the sum is one serial chain of head_dim multiply-adds per
                // key (the compiler may not reorder float additions); a fixed vector order.
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < head_dim; d++) dot += query[d] * key[d];
                scores[j] = dot * scale;
                if (scores[j] > max_score) max_score = scores[j];
            }
            double sum = 0;
            for (int j = start; j < length; j++) {
                scores[j] = expf(scores[j] - max_score);
                sum += scores[j];
            }
            float inv_sum = (float)(1.0 / sum);
            memset(o, 0, (size_t)head_dim * sizeof(float));
            for (int j = start; j < length; j++) {
                const float *value = values + (long)j * kv_width;
                float p = scores[j] * inv_sum;
                for (int d = 0; d < head_dim; d++) o[d] += p * value[d];
            }
        }
        free(scores);
    }
}

void cpu_cache_write(float *cache, const float *x, int B, int T, int capacity, int slot, int width) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        memcpy(cache + ((long)b * capacity + slot) * width, x + (long)b * T * width,
               (size_t)T * width * sizeof(float));
}

void cpu_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, int rows, int width) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (long)r * dst_stride, src + (long)r * src_stride, (size_t)width * sizeof(float));
}
