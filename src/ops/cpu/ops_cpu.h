// The CPU backend's kernels (OpenBLAS sgemm + OpenMP loops). The model never calls these
// directly: it goes through the OpsBackend table `ops_cpu` (ops/ops.h), whose comments
// document each function's contract.
//
// Determinism: every loop is partitioned so that each output element is computed by one
// thread in a fixed order; reductions over rows (bias, norm-weight and embedding
// gradients) are parallel over columns and sequential over rows. Results therefore do not
// depend on the number of threads, except through OpenBLAS's own partitioning.
#pragma once
#include <math.h>
#include <stdbool.h>

#include "ops/cpu/vector_math.h"
#include "ops/ops.h"

// Gemma 2's soft cap of attention scores (the attention ops' `softcap`): each of scores[0, n)
// becomes cap * tanh(score / cap), before the softmax; cap 0 leaves them as they are.
static inline void cpu_soft_cap(float *scores, int n, float cap) {
    if (!(cap > 0.0f)) return;
#pragma omp simd
    for (int j = 0; j < n; j++) scores[j] = cap * tanh_one(scores[j] / cap);
}

void cpu_embedding_forward(float *out, const int *tokens, const int *positions,
                           const float *tok_emb, const float *pos_emb, int N, int C, float scale);
void cpu_embedding_forward_q8(float *out, const int *tokens, const int *positions, const Q8Matrix *tok_emb,
                              const float *pos_emb, int N, int C, float scale);
void cpu_embedding_backward(float *d_tok_emb, float *d_pos_emb, const float *dout,
                            const int *tokens, const int *positions, int N, int C, float scale);

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps);
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps, bool weight_plus_one);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C,
                          bool weight_plus_one);

// The batch-invariant matmul (ops/cpu/matmul_invariant.c): out[i * out_stride + o] = (or +=)
// inp row i . weight row o, each element by one fixed sequence of operations that depends on
// IC only (not on N, the row's place, the tiling or the thread count). The portable form
// gives the same bits as the vector kernel. cpu_matmul_batch_invariant(): whether the
// linear layers use it: as cpu_set_matmul_mode (ops_choose_batch_invariant, ops/ops.h) set,
// or else as MARLHF_CPU_MATMUL=batch-invariant asks (read once at the first call; a bad
// value is a user error). cpu_set_matmul_mode: before the first forward.
bool cpu_matmul_batch_invariant(void);
void cpu_set_matmul_mode(bool batch_invariant);
void cpu_matmul_fixed_order(float *out, long out_stride, const float *inp, const float *weight, int N, int IC, int OC,
                            bool accumulate);
void cpu_matmul_fixed_order_portable(float *out, long out_stride, const float *inp, const float *weight, int N,
                                     int IC, int OC, bool accumulate);
void cpu_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC);
void cpu_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                 const float *residual, int N, int IC, int OC);
void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int N, int IC, int OC);
void cpu_matmul_forward_q8(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                           int N, int IC, int OC, int kernel_rows);
void cpu_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N,
                                    int IC, int OC);
// Decode steps (N < Q8_SGEMM_MIN_ROWS) over NF4 weights: float inputs times the dequantized weights.
void cpu_matmul_nf4(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC);
void cpu_matmul_backward_input_q8(float *dinp, const float *dout, const Q8Matrix *weight, int N, int IC, int OC);
void cpu_dequantize_rows(float *out, const Q8Matrix *weight, int first, int count);
void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                         WriteMode weight_mode);
// stored_inputs.c: hold_stored and the release (no-ops unless
// MARLHF_CHECK_STORED_INPUTS=1), and the products above and the activations below reading a
// stored input's moved values.
void cpu_hold_stored(const float *inp, long n, bool written);
long cpu_stored_buffer_floats(long n);
void cpu_matmul_input_hold(const float *inp, long n);
void cpu_matmul_input_release(void);
// What a product or an activation reads for its input x (n floats): a stored input's moved
// values, else x.
// (A table that wraps the CPU's products reads its inputs through it: tests/gpu/test_cuda.c.)
const float *cpu_stored_input(const float *x, long n);
// Whether `buffer` (n floats) is stored and its values not yet moved aside: the op writing
// it is writing a stored buffer (false unless MARLHF_CHECK_STORED_INPUTS=1). A table standing
// in for the GPU rounds such a product's output to bf16 as the GPU writes it.
bool cpu_stored_pending(const float *buffer, long n);
void cpu_stored_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                               int OC);
void cpu_stored_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC);
void cpu_stored_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                        const float *residual, int N, int IC, int OC);
void cpu_stored_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                                           int N, int IC, int OC);
void cpu_stored_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                                WriteMode weight_mode);
void cpu_stored_gelu_forward(float *out, const float *inp, long n);
void cpu_stored_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n);
void cpu_stored_glu_forward(float *out, const float *gate, const float *up, long n, bool gelu);
void cpu_stored_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                             const float *act, long n, bool gelu);

void cpu_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                      const float *inv_freq);
void cpu_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq);

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k,
                           const float *v, const int *row_start, int B, int T, int n_heads,
                           int n_kv_heads, int head_dim, float softcap, int window);
long cpu_attention_saved_size(int B, int T, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *probs, const float *q, const float *k, const float *v,
                            const int *row_start, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim, float softcap, int window);
void cpu_attention_forward_rotary(float *out, float *probs, const float *q, const float *k, const float *v,
                                  int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                  const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                  float softcap, int window);
void cpu_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *probs, const float *q, const float *k, const float *v,
                                   int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                   const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                   float softcap, int window);

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int capacity, int length, int n_heads,
                          int n_kv_heads, int head_dim, float softcap, int window);
void cpu_cache_write(float *cache, const float *x, int B, int T, int capacity, int slot, int width);
void cpu_attention_decode_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                              int head_dim, float softcap, int window);
void cpu_cache_write_f16(uint16_t *cache, const float *x, int B, int T, int capacity, int slot, int width);
void cpu_attention_extend(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int T, int capacity, int first_slot, int n_heads, int n_kv_heads,
                          int head_dim, float softcap, int window);
void cpu_attention_extend_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                              int n_kv_heads, int head_dim, float softcap, int window);
void cpu_cache_write_q8(void *cache, const float *x, int B, int T, int capacity, int slot, int n_kv_heads,
                        int head_dim);
void cpu_attention_decode_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                             int head_dim, float softcap, int window);
void cpu_attention_extend_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                             int n_kv_heads, int head_dim, float softcap, int window);
// IEEE half <-> float, round to nearest even (ops/cpu/attention_decode.c).
uint16_t cpu_float_to_half(float value);
float cpu_half_to_float(uint16_t half);

void cpu_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, int rows, int width);

void cpu_gelu_forward(float *out, const float *inp, long n);
void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n);
void cpu_glu_forward(float *out, const float *gate, const float *up, long n, bool gelu);
void cpu_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, const float *act, long n, bool gelu);

void cpu_logprob_forward(float *logp, float *lse, int *top1, float *entropy,
                         const float *logits, const int *targets, int N, int V);
void cpu_collision_entropy_forward(float *collision, const float *logits, int N, int V);
void cpu_sample_rows(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                     const float *inv_temperature, const double *uniform, int N, int V);
void cpu_sampling_candidates(int *counts, int *ids, float *values, double *lse, double *scaled_lse,
                             const float *logits, const float *inv_temperature, const int *top_k, int N, int V,
                             int capacity);
void cpu_logprob_backward(float *logits_to_dlogits, const float *dlogp, const float *dentropy,
                          const int *targets, const float *lse, int N, int V, float softcap);
void cpu_soft_cap_forward(float *x, long n, float cap);
void cpu_value_head_forward(float *values, const float *hidden, const float *weight, int N,
                            int C);
void cpu_value_head_backward(float *dhidden, float *dweight, const float *dvalues,
                             const float *hidden, const float *weight, int N, int C);

void cpu_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                      float beta1, float beta2, float eps, float weight_decay,
                      float bias_correction1, float bias_correction2, float grad_scale);
double cpu_sum_squares(const float *x, long n);

void cpu_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream);
void cpu_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream);
void cpu_uniform_noise_add(float *x, long n, float magnitude, uint64_t seed, uint64_t stream);

// dora.c
void cpu_dora_weight_norm(float *norm, const float *weight, const float *delta, float scale, int rows, int cols);
void cpu_dora_forward(float *out, float *z, const float *base, const float *bias, const float *magnitude,
                      const float *norm, int N, int OC);
void cpu_dora_backward(float *dmagnitude, float *dscaled, const float *dout, const float *z, const float *magnitude,
                       const float *norm, float shift, int N, int OC);
