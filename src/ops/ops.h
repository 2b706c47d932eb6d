// Backend-neutral kernel signatures.
//
// Every op the transformer, the sampler and the losses use is a function pointer in
// OpsBackend, so the model code (model/transformer.c) runs unchanged on the CPU
// (ops/cpu) or, later, on a GPU (ops/cuda). Pointers passed to an op live in the
// backend's memory (host memory for the CPU backend).
//
// Conventions, shared by every backend:
//  - Shapes are row-major. N is the number of token rows (B*T), C the hidden size.
//  - A linear layer's weight is [out_features, in_features] (PyTorch nn.Linear layout);
//    model IO converts other layouts (GPT-2's Conv1D) at the file boundary.
//  - Backward functions ACCUMULATE (+=) into every gradient they write, inputs and
//    parameters alike, so residual branches and gradient accumulation need no copies.
//    The caller zeroes gradient buffers when a fresh gradient is wanted.
//  - Ragged batches: row b holds its real tokens at positions
//    [row_start[b], row_start[b] + row_len[b]) of its T slots; other slots are padding.
//    A query attends to keys j with row_start[b] <= j <= t. Padding slots produce
//    finite values that never reach a real slot, and get zero gradient as long as the
//    loss weights at padding are zero.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A weight matrix [rows, cols] in blocks of Q8_BLOCK values along a row, for inference and
// for a LoRA base (model/quantize.h); memory of the backend. cols is a multiple of Q8_BLOCK.
// `type` says how a block is stored (the zero value is Q8_0, the type this struct began with):
//  - QUANT_Q8_0: GGUF's Q8_0 split into two arrays: row r's columns [32k, 32k + 32) are
//    values[r*cols + 32k ..] * scales[r*cols/32 + k].
//  - QUANT_Q4_0: GGUF's Q4_0, its nibbles and scales split likewise: block k of row r is the
//    16 bytes nibbles[(r*cols + 32k) / 2 ..], byte j holding value j in its low nibble and
//    value j + 16 in its high one, each value (nibble - 8) * scales[r*cols/32 + k]. The
//    scales are half floats held as floats (ops/q4.h).
//  - QUANT_NF4: bitsandbytes' NF4 (ops/nf4.h), blocks of NF4_BLOCK (64) values along a row
//    (cols a multiple of 64): nibbles[(r*cols + c) / 2] holds value c of row r, an even c in
//    the high nibble; each value levels[code] (nf4_levels when `levels` is NULL; fp4_levels
//    for a bitsandbytes FP4 checkpoint, model/bnb_checkpoint.h) times its block's scale, which is
//    scales[(r*cols + c) / 64], or, with double quantization (scales NULL),
//    map[scale_codes[k]] * scale_absmax[k / 256] + scale_offset for block k.
//  - QUANT_Q5_0: GGUF's Q5_0 split likewise (ops/q5.h): Q4_0's nibbles and float scales, and
//    each block's 32 fifth bits as one word, high_bits[r*cols/32 + k] (bit j: value j's);
//    value j is ((nibble | fifth bit << 4) - 16) * scale.
//  - QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_Q3_K, QUANT_Q2_K: llama.cpp's K-quants, the GGUF
//    file's own bytes: row r is cols / 256 super-blocks of 144 (Q4_K), 176 (Q5_K), 210 (Q6_K),
//    110 (Q3_K) or 84 (Q2_K) bytes at
//    blocks + r * kquant_row_bytes (ops/kquant.h, which gives the layouts); cols a multiple
//    of KQ_BLOCK (256); `scales` is NULL (the scales are inside the blocks).
//  - QUANT_Q4_1, QUANT_Q5_1: GGUF's Q4_1 and Q5_1 split as Q4_0 and Q5_0 are (ops/q5.h): the
//    nibbles, Q5_1's fifth bits in high_bits, the half-float d in scales and the half-float m
//    (the block's minimum) in mins[r*cols/32 + k], both held as floats; value j is
//    code * scale + min, the code unsigned (nibble, or nibble | fifth bit << 4).
//  - QUANT_IQ4_NL: GGUF's IQ4_NL, and IQ4_XS's sub-blocks of 32, split as Q4_0 is: the same
//    nibbles, each value gguf_iq4_levels[nibble] (io/gguf_dequant.h: 16 non-uniform levels
//    from -127 to 113) times its block's scale -- the half-float d held as a float (IQ4_NL),
//    or d times the sub-block's 6-bit scale less 32 (IQ4_XS, exact in a float). Only held
//    from a file's tensors (model/quantize_q4_k_m.c): `marlhf convert --outtype iq4_nl |
//    iq4_xs` writes such files, but --quantize has no iq4_nl.
//  - QUANT_BF16: no blocks and no scales: bf16[r*cols + c] is the weight's bfloat16 (core/bf16.h,
//    rounded to nearest even), 2 bytes a weight. Not a quantization in the sense of the others --
//    a bf16 checkpoint keeps every bit -- but held and multiplied through the same paths: a
//    frozen model (PPO's reference and reward models, a LoRA base) in half its float32
//    memory, and on a GPU in a third of what a float weight and its bf16 copy take.
#define Q8_BLOCK 32

// How matmul_backward writes a gradient: added into it, as every other backward op adds
// into its gradients, or written over it by the first writer of a fresh buffer (an input
// gradient no op has written yet; a weight gradient since model_zero_grad), which is then
// not read and needs no zero-fill.
typedef enum { WRITE_ADD, WRITE_OVERWRITE } WriteMode;

// The most buffers held at once (matmul_input_hold and hold_stored, until the release).
enum { OPS_HELD_INPUTS_MAX = 8 };

typedef enum { QUANT_Q8_0 = 0, QUANT_Q4_0, QUANT_NF4, QUANT_Q4_K, QUANT_Q6_K, QUANT_Q5_0, QUANT_Q5_K,
               QUANT_Q4_1, QUANT_Q5_1, QUANT_Q3_K, QUANT_Q2_K, QUANT_BF16, QUANT_IQ4_NL } QuantType;
typedef struct {
    int rows, cols;
    union {
        int8_t *values;    // QUANT_Q8_0: [rows * cols]
        uint8_t *nibbles;  // QUANT_Q4_0, QUANT_Q5_0, QUANT_Q4_1, QUANT_Q5_1, QUANT_NF4: [rows * cols / 2]
        uint8_t *blocks;   // the K-quants (ops/kquant.h): [rows * kquant_row_bytes(type, cols)]
        uint16_t *bf16;    // QUANT_BF16: [rows * cols]
    };
    float *scales;  // [rows * cols / Q8_BLOCK] (NF4: [rows * cols / 64], or NULL with double quantization; BF16: NULL)
    QuantType type;
    // QUANT_NF4 with double quantization only: a code per block of 64, an absmax per 256 blocks.
    uint8_t *scale_codes;
    float *scale_absmax;
    float scale_offset;
    // QUANT_NF4: the 16 values the codes stand for (static, not freed); NULL: nf4_levels.
    const float *levels;
    uint32_t *high_bits; // QUANT_Q5_0, QUANT_Q5_1: [rows * cols / Q8_BLOCK], GGUF's qh word of each block
    float *mins;         // QUANT_Q4_1, QUANT_Q5_1: [rows * cols / Q8_BLOCK], each block's m (a half float's value)
} Q8Matrix;

// The RMSNorm that makes a product's input (matmul_forward_parts, matmul_forward_glu,
// matmul_forward_glu_q8): the product's `inp` is rmsnorm_forward(inp, rstd, x, weight, N,
// IC, eps, weight_plus_one)'s output. A backend runs that norm and then the product (the
// CPU; a GPU beyond a decode step's rows), or normalises each row as the product reads it
// and leaves `inp` and `rstd` unwritten (a GPU's decode step: the norm's launch spared, the
// product's numbers the same). So only a forward without a backward, where nothing but
// the product reads the norm's output, passes one.
typedef struct {
    const float *x; // [N, IC]: the norm's input (the residual stream)
    float *rstd;    // [N]
    const float *weight;
    float eps;
    bool weight_plus_one;
} InputRmsNorm;

// What a KV cache's slots hold (--kv-cache): float32, IEEE half floats, or Q8_0 blocks.
typedef enum { KV_CACHE_F32, KV_CACHE_F16, KV_CACHE_Q8_0 } KvCacheType;

// A KV cache of Q8_0 blocks (--kv-cache q8_0) keeps each slot -- one token's n_kv_heads *
// head_dim keys, or values -- as one record of bytes: the int8 values, head after head,
// padded to a multiple of 4 bytes, then one float scale per block, head after head. Each
// head's head_dim values are blocks of Q8_BLOCK (the last one shorter when head_dim is not
// a multiple of it), so a block never spans two heads and a decode step reads one head's
// values and scales without the others'. A slot's values and scales in one record move
// together (copy_rows moves whole slots) and a key's are a few cache lines apart.
// A value is values[i] * its block's scale; the scale is max|x| / 127 over the block.
static inline int kv_q8_blocks_per_head(int head_dim) { return (head_dim + Q8_BLOCK - 1) / Q8_BLOCK; }
// Bytes from a slot's start to its scales.
static inline long kv_q8_values_bytes(int n_kv_heads, int head_dim) {
    return ((long)n_kv_heads * head_dim + 3) / 4 * 4;
}
// Bytes of one slot, a multiple of 4 (so a slot is a whole number of floats to copy_rows).
static inline long kv_q8_slot_bytes(int n_kv_heads, int head_dim) {
    return kv_q8_values_bytes(n_kv_heads, head_dim) + (long)n_kv_heads * kv_q8_blocks_per_head(head_dim) * 4;
}

// Collectives over the ranks of a data-parallel job (dist/dist.h) on the backend's own
// memory: NCCL on the CUDA backend (ops/cuda/collectives.cu). Without them
// dist/model_sync.c stages device memory through host buffers and sums with MPI.
#define OPS_COLLECTIVES_ID_BYTES 128
#define OPS_DEVICE_KEY_BYTES 64
typedef struct {
    // 0 when this process can take part (the library loads), with `device_key` naming its
    // device on this machine (the GPU's PCI address: ranks sharing one cannot form a
    // communicator), else -1 with err_set() saying why not.
    int (*available)(char device_key[OPS_DEVICE_KEY_BYTES]);
    // Rank 0 makes the communicator's identity, which every rank then passes to open.
    int (*make_id)(unsigned char id[OPS_COLLECTIVES_ID_BYTES]);
    // Joins the communicator: called by every rank at once (it blocks until all have).
    int (*open)(const unsigned char id[OPS_COLLECTIVES_ID_BYTES], int rank, int world);
    // In place, in the order of the backend's other ops: every rank gets the same bits.
    void (*sum_floats)(float *values, long n);
    // The sums on rank `root` only (in place there; the others' values unchanged).
    void (*reduce_floats)(float *values, long n, int root);
    void (*broadcast_floats)(float *values, long n, int root);
    // sum_floats and reduce_floats on the collectives' own stream, for the sums taken while
    // a backward goes on (dist/backward_sums.h): each starts once the ops issued before it
    // are done, and the call returns at once, so the ops issued after it run beside it. The
    // values must not be read or written by the backend's ops until after join.
    void (*sum_floats_beside)(float *values, long n);
    void (*reduce_floats_beside)(float *values, long n, int root);
    // The ops issued from here on wait for every collective issued "beside" before it.
    void (*join)(void);
    // The library's name and version, for the note saying which path sums the gradients.
    const char *(*describe)(void);
} OpsCollectives;

typedef struct OpsBackend {
    const char *name;
    // NULL: the backend's memory is the host's, or it has no collectives of its own.
    const OpsCollectives *collectives;
    // Whether a model computes a layer's q, k and v as one product where it can
    // (model/transformer.c, layer_fuses_qkv), by default: on the GPU, where one product of
    // their columns together runs nearer the peak than three; not on the CPU, where
    // sgemm's blocking follows the shape, so a layer would give other bits than the same
    // layer with an adapter on q (which takes the three products: a fresh adapter leaves
    // the CPU's log-probs bit for bit as they were). MARLHF_FUSED_QKV overrides it.
    bool fuses_qkv_products;
    // Whether generation samples a row that samples the whole vocabulary (no top-k, no
    // top-p) with sample_rows, where the logits are: on the GPU, where the alternative is
    // copying every step's [B, V] logits to the host; not on the CPU, whose host sampler
    // (gen/sampler.c, fp64 exponentials) is the reference and needs no copy.
    bool samples_whole_rows;
    // Whether attention_forward and attention_forward_rotary take saved NULL where no
    // backward follows (generation, frozen models: model/transformer.c allocates none): the
    // CPU, whose saved state is the [B, H, T, T] probabilities and whose forward needs one
    // row of them at a time; not the GPU, whose kernels write their state as they go.
    bool attention_forward_without_saved;

    // ---- memory ----
    void *(*alloc)(size_t bytes); // zero-filled
    void (*free)(void *ptr);
    void (*copy_to_device)(void *dst, const void *src, size_t bytes);
    void (*copy_to_host)(void *dst, const void *src, size_t bytes);
    void (*fill_zero)(float *x, long n);
    // Waits until every op queued so far has finished (a no-op on the CPU). Only timing
    // needs it: copies to the host already wait for the ops before them.
    void (*synchronize)(void);

    // ---- embeddings ----
    // out[i] = scale * tok_emb[tokens[i]] (+ pos_emb[positions[i]] if pos_emb != NULL)
    void (*embedding_forward)(float *out, const int *tokens, const int *positions,
                              const float *tok_emb, const float *pos_emb, int N, int C,
                              float scale);
    void (*embedding_backward)(float *d_tok_emb, float *d_pos_emb, const float *dout,
                               const int *tokens, const int *positions, int N, int C,
                               float scale);
    // embedding_forward with the token table quantized, Q8_0 or Q4_0 (a row dequantized per
    // token; pos_emb stays float). NULL in a backend without it.
    void (*embedding_forward_q8)(float *out, const int *tokens, const int *positions,
                                 const Q8Matrix *tok_emb, const float *pos_emb, int N, int C,
                                 float scale);

    // ---- normalisation ----
    // LayerNorm: out = (x - mean) * rstd * w + b. Saves mean and rstd per row.
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
    // RMSNorm: out = x * rstd * (w or 1 + w). Saves rstd per row.
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps, bool weight_plus_one);
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C,
                             bool weight_plus_one);

    // ---- linear layers ----
    // out[N, OC] = inp[N, IC] . weight[OC, IC]^T (+ bias[OC])
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC);
    // out[N, OC] += inp[N, IC] . weight[OC, IC]^T (a LoRA adapter's term, no temporary)
    void (*matmul_accumulate)(float *out, const float *inp, const float *weight, int N, int IC, int OC);
    // out[N, OC] = residual[N, OC] + (inp[N, IC] . weight[OC, IC]^T (+ bias[OC])), out and
    // residual distinct: a block's output added to the residual stream in one op. The CPU's
    // floats are matmul_forward's then accumulate's (the product and bias, then the
    // residual); a GPU reads the residual in the product's epilogue instead of moving the
    // stream again.
    void (*matmul_forward_residual)(float *out, const float *inp, const float *weight, const float *bias,
                                    const float *residual, int N, int IC, int OC);
    // The product of a weight whose rows are `parts` (at most 3) matrices one after the
    // other, each part's columns into a buffer of its own: outs[p][N, widths[p]] =
    // inp[N, IC] . W_p[widths[p], IC]^T (+ its bias: bias NULL, or the parts' biases side by
    // side). The same numbers as matmul_forward per part; one product where the backend can
    // (a GPU's decode step: one launch for a layer's q, k and v, one for gate and up).
    // `norm` (NULL: none) makes inp first (InputRmsNorm).
    void (*matmul_forward_parts)(float *const *outs, const int *widths, int parts, const float *inp,
                                 const float *weight, const float *bias, int N, int IC, const InputRmsNorm *norm);
    // A gated MLP's products and activation: gate[N, width] and up[N, width] the two parts
    // of inp[N, IC] . weight[2 width, IC]^T (gate's rows first, no bias), then
    // glu_forward(act, gate, up, N * width, gelu). The same numbers as matmul_forward_parts and
    // glu_forward, act written as glu_forward writes it (a held act's copy beside it); gate
    // and up are scratch the backend may leave unwritten (a GPU's decode step computes each
    // activation beside its two sums in one launch), so only a forward without a backward
    // takes it. The CPU's: those two calls (ops_matmul_forward_glu_in_calls). `norm` (NULL:
    // none) makes inp first (InputRmsNorm).
    void (*matmul_forward_glu)(float *act, float *gate, float *up, const float *inp, const float *weight, int N,
                               int IC, int width, bool gelu, const InputRmsNorm *norm);
    // out[N, OC] = inp[N, IC] . weight^T (+ bias) with a quantized weight [OC, IC] (Q8_0 or
    // Q4_0): below Q8_SGEMM_MIN_ROWS rows each row of inp is quantized to Q8_0 blocks too and
    // each block's integer dot product scaled by both blocks' scales (llama.cpp's Q8_0 x Q8_0
    // and Q4_0 x Q8_0 arithmetic); from there on, matmul_forward_dequantized. Inference.
    // The kernel is chosen by kernel_rows, N or a whole prompt's rows for a chunk of it
    // (chunked prefill), so that the chunks go through the kernel of the prompt's whole
    // prefill. NULL in a backend without it.
    void (*matmul_forward_q8)(float *out, const float *inp, const Q8Matrix *weight,
                              const float *bias, int N, int IC, int OC, int kernel_rows);
    // matmul_forward_q8 of up to 3 quantized matrices over the same input (a layer's q, k and
    // v), each part's into its own buffer: outs[p][N, weights[p]->rows] from weights[p] and
    // biases[p] (NULL: none), kernel_rows as there. The same numbers as those calls; one
    // launch where the backend can (a GPU's decode step). `norm` (NULL: none) makes inp first
    // (InputRmsNorm). NULL in a backend without it.
    void (*matmul_forward_parts_q8)(float *const *outs, const Q8Matrix *const *weights, const float *const *biases,
                                    int parts, const float *inp, int N, int IC, int kernel_rows,
                                    const InputRmsNorm *norm);
    // matmul_forward_glu over a gated MLP's two quantized matrices (gate_weight, up_weight,
    // each [width, IC], no bias): matmul_forward_q8 of each (kernel_rows as there), then
    // glu_forward. The same numbers as those three calls; gate and up the backend's scratch
    // (a GPU's decode step: one launch, gate and up never written), so only a forward
    // without a backward takes it. `norm` (NULL: none) makes inp first (InputRmsNorm). NULL
    // in a backend without it.
    void (*matmul_forward_glu_q8)(float *act, float *gate, float *up, const float *inp, const Q8Matrix *gate_weight,
                                  const Q8Matrix *up_weight, int N, int IC, int width, bool gelu, int kernel_rows,
                                  const InputRmsNorm *norm);
    // out[N, OC] = inp[N, IC] . dequantized(weight)^T (+ bias), any type of Q8Matrix: the
    // weights alone are quantized, the inputs stay float (tiles of weight rows dequantized and
    // multiplied with sgemm). What a model being trained with a quantized base (QLoRA)
    // computes, for any N, so that matmul_backward_input_q8 is its exact gradient. NULL in a
    // backend without it.
    void (*matmul_forward_dequantized)(float *out, const float *inp, const Q8Matrix *weight,
                                       const float *bias, int N, int IC, int OC);
    // dinp[N, IC] += dout[N, OC] . dequantized(weight) [OC, IC]: the input gradient through a
    // frozen quantized weight (the weight itself gets none). NULL in a backend without it.
    void (*matmul_backward_input_q8)(float *dinp, const float *dout, const Q8Matrix *weight, int N,
                                     int IC, int OC);
    // out[count, cols] = rows [first, first + count) of the weight as floats, the CPU's values
    // (quant_dequantize_rows) bit for bit on every backend: DoRA's row norms over a quantized
    // base (model/lora.c). NULL in a backend without it.
    void (*dequantize_rows)(float *out, const Q8Matrix *weight, int first, int count);
    // dinp += dout . weight (dinp_mode WRITE_ADD), or dinp = dout . weight (WRITE_OVERWRITE);
    // dweight += dout^T . inp and dbias += column sums of dout (weight_mode WRITE_ADD), or
    // both written over (WRITE_OVERWRITE: neither is read). Any of dinp, dweight, dbias may
    // be NULL (not wanted).
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                            WriteMode weight_mode);
    // A promise about the linear layers that follow, until matmul_input_release: they take
    // `inp` (n floats) as an input (matmul_forward's, matmul_accumulate's,
    // matmul_forward_dequantized's inp, or matmul_backward's inp or dout), maybe several
    // times (a layer's q/k/v projections and their adapters read the same normalised rows),
    // and nothing writes it meanwhile but, before any product reads it, the ops that produce
    // it for those products, the last of them one that may write its copy: an activation
    // (gelu/glu, forward or backward), a norm (forward, or backward into dinp),
    // attention_forward (out), rope_backward (dx) or logprob_backward (the logits' gradient). A backend that converts inputs (the GPU:
    // to bf16) converts a held input once, or has that last op write the copy beside its
    // output, instead of converting it at every product. An activation's backward
    // also writes the copy of its forward's output `act` when act is held (the down
    // projection's weight gradient reads act after it): act's values are recomputed there,
    // act itself is not written. The CPU's are no-ops (but with MARLHF_CHECK_STORED_INPUTS=1
    // they count, as the GPU does). Up to OPS_HELD_INPUTS_MAX inputs held at once; the
    // release lets go of all of them.
    void (*matmul_input_hold)(const float *inp, long n);
    // A hold of `buffer` (the same release, counted among the held) that promises more: until
    // it is next written without a store, its only readers are products (as an input: the
    // ops matmul_input_hold names but matmul_forward_dequantized, whose GPU decode kernel
    // reads floats) and the activations (gelu's inp, glu's gate and up, forward
    // and backward, and the backwards' dout), so a backend may keep its values in their readers' format in the
    // buffer's own memory instead of as floats (the GPU: bf16 in the first half of the
    // buffer; its floats are then not meaningful). `written` false: the next op to write
    // the buffer writes it so, one of a matmul_forward without a bias (out), a matmul_backward
    // writing over its dinp (WRITE_OVERWRITE), an activation
    // (gelu/glu forward's out, gelu backward's dinp, glu backward's dgate and dup) or a norm
    // forward (out). `written` true: the buffer still holds what an op wrote under an earlier
    // store (a forward's output that its backward reads again); an activation backward then
    // leaves its `act` alone. The CPU keeps floats (a no-op), or with
    // MARLHF_CHECK_STORED_INPUTS=1 moves a stored buffer's values aside for those readers and
    // fills the buffer with NaN (ops/cpu/stored_inputs.c), so that any other reader shows.
    void (*hold_stored)(const float *buffer, long n, bool written);
    // The floats a buffer needs for n values when every op that writes it writes under a
    // store (hold_stored) and only the stored values are read: n where a store keeps the
    // floats (the CPU), half where it keeps bf16 in the buffer's own memory (the GPU, rounded
    // up to 16 bytes; n under MARLHF_CUDA_STORED_INPUTS=0). model_reserve sizes so the
    // buffers of the layers whose training forwards always store.
    long (*stored_buffer_floats)(long n);
    void (*matmul_input_release)(void);

    // ---- rotary positions (Hugging Face "rotate half" convention) ----
    // x is [N, n_heads * head_dim]; pair i of each head rotated in place by the angle
    // positions[row] * inv_freq[i] (head_dim / 2 frequencies in backend memory: the model's
    // table, model/config.h rope_inverse_frequencies).
    void (*rope_forward)(float *x, const int *positions, int N, int n_heads, int head_dim,
                         const float *inv_freq);
    // The backward of a rotation is the inverse rotation, applied in place to dx.
    void (*rope_backward)(float *dx, const int *positions, int N, int n_heads, int head_dim,
                          const float *inv_freq);

    // ---- attention (causal, padding-aware, GQA) ----
    // q: [B*T, n_heads*hd]; k, v: [B*T, n_kv_heads*hd]; out: [B*T, n_heads*hd].
    // saved: what the backward needs besides q, k, v and out, attention_saved_size()
    // floats whose meaning is the backend's own: the CPU keeps the softmax probabilities
    // [B, n_heads, T, T]; the CUDA backend's fused kernels keep one log-sum-exp per row, and
    // its mma kernels bf16 copies of q, k and v as well (which their backward reads instead
    // of its q, k, v arguments: give the backward the saved state of a forward of the same
    // q, k, v). softcap: the attention ops' (below); the CUDA backend's fused kernels do not
    // take one.
    long (*attention_saved_size)(int B, int T, int n_heads, int n_kv_heads, int head_dim, float softcap,
                                 int window);
    void (*attention_forward)(float *out, float *saved, const float *q, const float *k,
                              const float *v, const int *row_start, int B, int T, int n_heads,
                              int n_kv_heads, int head_dim, float softcap, int window);
    // out is the forward's output for the same inputs. dq, dk and dv are written over, every
    // element (unlike most backward ops, which add: the layer's backward has them fresh).
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *saved, const float *q,
                               const float *k, const float *v, const int *row_start, int B,
                               int T, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
    // The same two with the rotary positions applied inside: q and k arrive as their
    // projections wrote them, unrotated, and are only read; the forward attends with them
    // rotated as rope_forward(q or k, positions, B*T, ..., inv_freq) would rotate them, and
    // the backward's dq and dk are the gradients of the unrotated q and k (rope_backward's
    // inverse rotation applied). The backward takes the forward's q, k, positions and
    // table. For a forward whose rotated q and k nothing else reads (a training or scoring
    // forward, not one that fills a KV cache). The GPU rotates Q and K as it gathers them
    // for its mma kernels: a pass over each fewer than a rope_forward before the op.
    // q_row_stride, kv_row_stride: the floats from one row of q (and dq) to the next, and of
    // k and v (dk, dv): n_heads * hd and n_kv_heads * hd for buffers of their own, or both
    // (n_heads + 2 * n_kv_heads) * hd for the columns of one [B*T, q | k | v] buffer, the
    // output of the fused q/k/v product (model/transformer.c, layer_fuses_qkv); the backward
    // then writes dq, dk and dv as the same columns of one buffer, which the fused product's
    // backward reads. Every backend takes both layouts.
    void (*attention_forward_rotary)(float *out, float *saved, const float *q, const float *k, const float *v,
                                     int q_row_stride, int kv_row_stride, const int *row_start,
                                     const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                     int n_kv_heads, int head_dim, float softcap, int window);
    void (*attention_backward_rotary)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                      const float *saved, const float *q, const float *k, const float *v,
                                      int q_row_stride, int kv_row_stride, const int *row_start,
                                      const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                      int n_kv_heads, int head_dim, float softcap, int window);

    // One decode step: each of the B rows has one new query (q: [B, n_heads*hd]) that
    // attends to cache slots [row_start[b], length) of its row. The caches are
    // [B, capacity, n_kv_heads*hd]; the new token's K/V are already at slot length-1.
    void (*attention_decode)(float *out, const float *q, const float *k_cache,
                             const float *v_cache, const int *row_start, int B, int capacity,
                             int length, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
    // Copies rows [0, T) of each of the B rows of x ([B*T, width]) into slots
    // [slot, slot+T) of a cache [B, capacity, width].
    void (*cache_write)(float *cache, const float *x, int B, int T, int capacity, int slot,
                        int width);
    // The same two for a cache of IEEE half floats (--kv-cache f16, inference only):
    // cache_write_f16 rounds to the nearest half (ties to even; beyond 65504 is infinity),
    // attention_decode_f16 widens the keys and values back to float as it reads them.
    // NULL on a backend without them (kv_cache_type_set refuses f16 there).
    void (*cache_write_f16)(uint16_t *cache, const float *x, int B, int T, int capacity, int slot,
                            int width);
    void (*attention_decode_f16)(float *out, const float *q, const uint16_t *k_cache,
                                 const uint16_t *v_cache, const int *row_start, int B, int capacity,
                                 int length, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
    // Several new slots per row against the cache (a prompt that continues a cached
    // prefix, marlhf serve's prompt cache): the B x T queries (q, out: [B*T, n_heads*hd])
    // sit at slots [first_slot, first_slot + T) of their rows, whose keys and values are
    // already written there; query t attends to slots [row_start[b], first_slot + t].
    // attention_decode is the case T = 1. NULL on a backend without it (no prompt cache).
    void (*attention_extend)(float *out, const float *q, const float *k_cache, const float *v_cache,
                             const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                             int n_kv_heads, int head_dim, float softcap, int window);
    void (*attention_extend_f16)(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                 const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                                 int n_kv_heads, int head_dim, float softcap, int window);

    // The same three for a cache of Q8_0 blocks (--kv-cache q8_0, inference only; slots laid
    // out as kv_q8_slot_bytes above, `capacity` slots per row): cache_write_q8 quantizes each
    // head's blocks of the B x T new rows of x ([B*T, n_kv_heads*head_dim]) into slots
    // [slot, slot+T); the attention ops read each key and value as its int8 values times its
    // block's scale, against float queries. NULL on a backend without them
    // (kv_cache_type_set refuses q8_0 there).
    void (*cache_write_q8)(void *cache, const float *x, int B, int T, int capacity, int slot, int n_kv_heads,
                           int head_dim);
    void (*attention_decode_q8)(float *out, const float *q, const void *k_cache, const void *v_cache,
                                const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                                int head_dim, float softcap, int window);
    void (*attention_extend_q8)(float *out, const float *q, const void *k_cache, const void *v_cache,
                                const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                                int n_kv_heads, int head_dim, float softcap, int window);
    // A KV-cache forward's new rows (a decode step, an extension) made ready in one op: the
    // heads of q ([B*T, n_heads*hd]) and k ([B*T, n_kv_heads*hd]) rotated in place as
    // rope_forward rotates them (inv_freq NULL: neither rotated), then k and v written into
    // slots [slot, slot+T) of each row of the caches as cache_write, cache_write_f16 or
    // cache_write_q8 (cache_type) writes them. The results are those calls', in that order
    // (ops_rotate_and_cache_write_in_calls); the GPU makes them one launch, where a decode
    // step at a small batch is bound by its launches.
    void (*rotate_and_cache_write)(float *q, float *k, const float *v, void *k_cache, void *v_cache,
                                   KvCacheType cache_type, const int *positions, int B, int T, int capacity,
                                   int slot, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq);

    // dst[r*dst_stride .. + width) = src[r*src_stride .. + width) for r in [0, rows).
    void (*copy_rows)(float *dst, long dst_stride, const float *src, long src_stride, int rows,
                      int width);

    // ---- activations ----
    // The activations' backward ops overwrite dinp / dgate / dup (as attention_backward and
    // matmul_backward's WRITE_OVERWRITE do; the other backward ops add): their outputs are always fresh buffers in a
    // layer's backward, and not reading them back saves a zero-fill and a read of each. An
    // output that is a held matmul input (matmul_input_hold) may get its copy written too.
    // The backwards' `act` (or NULL) is the forward's output of the same inputs, unchanged
    // since: no backend reads or writes it, but a held one gets its copy (above).
    void (*gelu_forward)(float *out, const float *inp, long n); // tanh approximation
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, const float *act, long n);
    // out = act(gate) * up, act = silu (SwiGLU) or gelu_tanh (GeGLU)
    void (*glu_forward)(float *out, const float *gate, const float *up, long n, bool gelu);
    void (*glu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, const float *act, long n, bool gelu);

    // ---- elementwise ----
    void (*add)(float *out, const float *a, const float *b, long n); // out = a + b
    void (*accumulate)(float *acc, const float *x, long n);         // acc += x
    void (*scale)(float *x, float factor, long n);                  // x *= factor
    // Inverted dropout, for training: out[i] = inp[i] / (1 - p) where element i of the mask
    // keyed by (seed, stream) is kept, else 0 (core/philox.h: a pure function of i, the same
    // on every backend, so a backward or a recomputation regenerates the forward's mask
    // instead of storing it). 0 <= p < 1.
    void (*dropout_forward)(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream);
    // Its backward through the same mask: dinp[i] += dout[i] / (1 - p) where kept.
    void (*dropout_backward)(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream);
    // x[i] += noise uniform on [-magnitude, magnitude), element i's drawn from word i % 4 of
    // the Philox block i / 4 keyed by (seed, stream) (core/philox.h philox_signed_24 times
    // magnitude * 2^-23: the same bits on every backend). NEFTune's embedding noise.
    void (*uniform_noise_add)(float *x, long n, float magnitude, uint64_t seed, uint64_t stream);

    // ---- DoRA (Liu et al. 2024, PEFT's use_dora; model/lora.h) ----
    // norm[r] = || weight[r] + scale * delta[r] ||_2 over each of `rows` rows of `cols`
    // (delta = B A, the adapter's unscaled update): the row norms of the adapted weight.
    void (*dora_weight_norm)(float *norm, const float *weight, const float *delta, float scale, int rows,
                             int cols);
    // With s[o] = magnitude[o] / norm[o] and base[t, o] the base layer's result without its
    // bias (base, or when base is NULL out - bias, bias NULL meaning none):
    // out += (s - 1) * base + s * z, then z = base + z. On entry z holds the adapter's
    // scaled result (scale * B A x); on exit base + that, what the backward needs.
    void (*dora_forward)(float *out, float *z, const float *base, const float *bias, const float *magnitude,
                         const float *norm, int N, int OC);
    // dscaled[t, o] = (s[o] + shift) * dout[t, o]; dmagnitude[o] += sum_t dout[t, o] * z[t, o]
    // / norm[o] (skipped when dmagnitude is NULL). z as dora_forward left it.
    void (*dora_backward)(float *dmagnitude, float *dscaled, const float *dout, const float *z,
                          const float *magnitude, const float *norm, float shift, int N, int OC);

    // ---- heads ----
    // For each row i: lse[i] = logsumexp(logits[i]); logp[i] = logits[i][targets[i]] - lse
    // (0 when targets[i] < 0); top1[i] = argmax (optional); entropy[i] (optional). targets
    // may be top1 itself: a row's argmax is written before its target is read, so logp is
    // then the argmax's log-prob (greedy decoding's step, model_last_greedy).
    void (*logprob_forward)(float *logp, float *lse, int *top1, float *entropy,
                            const float *logits, const int *targets, int N, int V);
    // What sampling needs of each row i of logits [N, V], so that only that comes to the host
    // (gen/generate.c, model_last_candidates): with scaled[v] = logits[i][v] * inv_temperature[i],
    // the tokens whose scaled logit is at least the top_k[i]-th largest (0 < top_k[i] < V;
    // ties all in), by the order of ops/sampling_key.h: counts[i] of them and, when
    // counts[i] <= capacity, their ids ascending and their raw logits at ids and values +
    // i * capacity; lse[i] = max + log(sum_v exp((double)(logits[i][v] - max))), the
    // sampler's log-normaliser, in fp64 (the CPU's bit for bit; the GPU's from fp32
    // exponentials, ~1e-7 from it, as its logprob_forward's); scaled_lse[i] (when scaled_lse
    // is not NULL) the scaled row's, max_s + log(sum_v exp(scaled[v] - max_s)) as sample_rows
    // sums it (fp32 exponentials in fp64 on both backends): what tells top-p whether the
    // candidates hold a row's nucleus (gen/sampler.h, sampler_candidates_hold_nucleus).
    void (*sampling_candidates)(int *counts, int *ids, float *values, double *lse, double *scaled_lse,
                                const float *logits, const float *inv_temperature, const int *top_k, int N, int V,
                                int capacity);
    // A draw from each row i of logits [N, V] scaled by inv_temperature[i], over the whole
    // vocabulary, by sampler_pick's rule (gen/sampler.c): the tokens in id order, the first
    // whose cumulative probability passes uniform[i] (the last token where rounding leaves
    // uniform[i] past the total); tokens[i], logprobs[i] its log-prob under the raw logits,
    // sampling_logprobs[i] under the scaled ones. Its own arithmetic, the same on both
    // backends up to the order of fp64 sums: fp32 exponentials summed in fp64, so not the
    // host sampler's bits (fp64 exponentials); see samples_whole_rows.
    void (*sample_rows)(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                        const float *inv_temperature, const double *uniform, int N, int V);
    // Overwrites logits with d(loss)/d(logits) where loss = sum_i dlogp[i]*logp[i]
    // + dentropy[i]*entropy[i] (either may be NULL). softcap > 0: the logits are
    // cap * tanh(raw / cap) (soft_cap_forward), and the gradient is the raw logits' one,
    // each element times 1 - (logit / cap)^2; 0 for none.
    void (*logprob_backward)(float *logits_to_dlogits, const float *dlogp,
                             const float *dentropy, const int *targets, const float *lse,
                             int N, int V, float softcap);
    // x[i] = cap * tanh(x[i] / cap), i < n (Gemma 2's final logits). NULL on a backend
    // without it (model_init refuses a soft-capped model there).
    void (*soft_cap_forward)(float *x, long n, float cap);
    // For each row i: collision[i] = -log sum_v p_v^2 with p = softmax(logits[i]), the Renyi
    // entropy of order 2 (= 2 logsumexp(z) - logsumexp(2 z)). WPO's per-pair weight
    // (train/dpo.c) divides each token's probability by sum_v p_v^2. No backward: WPO
    // detaches it.
    void (*collision_entropy_forward)(float *collision, const float *logits, int N, int V);
    // values[i] = hidden[i] . weight (value head: Linear(C, 1), no bias)
    void (*value_head_forward)(float *values, const float *hidden, const float *weight, int N,
                               int C);
    void (*value_head_backward)(float *dhidden, float *dweight, const float *dvalues,
                                const float *hidden, const float *weight, int N, int C);

    // ---- optimiser ----
    // One AdamW step over n contiguous parameters (decoupled weight decay).
    void (*adamw_update)(float *params, const float *grads, float *m, float *v, long n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float bias_correction1, float bias_correction2, float grad_scale);
    // Sum of squares of x in double precision, accumulated in a fixed order.
    double (*sum_squares)(const float *x, long n);
    // average = beta * average + (1 - beta) * x  (the EMA of the actor's weights)
    void (*moving_average)(float *average, const float *x, float beta, long n);
} OpsBackend;

extern const OpsBackend ops_cpu;
// One warp's record of a probed attention kernel (ops_cuda_attention_probe_end, below;
// declared in every build so that bench/attention_probe_summary.h is tested on the CPU).
typedef struct {
    long long start_ns, end_ns, cycles, waiting_cycles;
    int sm, steps;
} OpsAttentionProbeRecord;

#ifdef MARLHF_CUDA
// ops/cuda: present when the build found nvcc. ops_backend_by_name("cuda") opens the GPU.
extern const OpsBackend ops_cuda;
int ops_cuda_open(void);
const char *ops_cuda_device_name(void);
// True in the test build whose backend runs on CPU threads (tests/emulated_cuda,
// build/tests/gpu/test_cuda_emulated): what only a GPU can report (kernel facts, probes)
// is not there.
bool ops_cuda_is_emulated(void);
// cuBLASLt, opened by ops_cuda_open rather than linked (ops/cuda/cublaslt_library.cuh):
// 0, or -1 with err_set() naming the library. Needs no GPU (tests/test_cuda_libraries.c).
int cublaslt_library_open(void);
// NCCL, opened the first time GPU ranks sum (ops/cuda/nccl_library.cuh): 0, or -1 with
// err_set() naming the library ($MARLHF_NCCL_LIBRARY, else libnccl.so.2). Needs no GPU
// (tests/test_cuda_libraries.c).
int nccl_library_open(void);
// Which attention kernels the backend runs (src/ops/cuda/attention.cu): "mma" (fused on
// mma.sync, the default), "wmma" (fused on WMMA fragments) or "unfused" (the reference
// path). False for another name. $MARLHF_CUDA_ATTENTION sets it when the device
// opens. Choose before a model sizes its activations (model_reserve asks
// attention_saved_size).
bool ops_cuda_select_attention(const char *kernels);
const char *ops_cuda_attention_kernels(void);
// Whether hold_stored keeps stored inputs as bf16 in their own memory (true, the
// default) or holds them as matmul_input_hold does (floats written, copies in scratch
// slots): $MARLHF_CUDA_STORED_INPUTS=1|0 sets it when the device opens. For measuring the
// one against the other (bench/train_step).
void ops_cuda_enable_stored_inputs(bool enabled);
// For bench/ops_breakdown only: which of the mma attention backward's two kernels run
// (dK/dV, dQ; both unless told), to time each alone. One turned off leaves its gradients
// unwritten: the op is then wrong.
void ops_cuda_attention_backward_parts(bool key_gradients, bool query_gradients);
// For bench/ops_breakdown only: whether the mma backward's dQ kernel runs beside its dK/dV
// kernel on a second stream (the default) or after it on the main stream, to measure what
// the overlap gives. Either way the gradients are the same, bit for bit.
void ops_cuda_attention_backward_overlap(bool overlapped);
// For bench/ops_breakdown only: what the GPU says of each mma attention kernel that
// `kernels` ("mma", "mma-plain" or "mma-ds") runs at head_dim: registers a thread, local
// memory (spills: 0 in a good build), shared memory a block, and the blocks an SM holds at
// once (cudaOccupancyMaxActiveBlocksPerMultiprocessor). Fills up to `capacity` entries and
// returns how many it filled, or -1 with err_set() for another name or head_dim.
typedef struct {
    const char *kernel; // "forward", "dK/dV", "dQ", "dK/dV writing dS", "dQ from dS"
    int registers, local_bytes, shared_bytes, blocks_per_sm;
} OpsAttentionKernelFacts;
int ops_cuda_attention_kernel_facts(const char *kernels, int head_dim, OpsAttentionKernelFacts *facts, int capacity);
// For bench/ops_breakdown only: block probes. After ops_cuda_attention_probe_begin(kernel)
// ("forward", "dK/dV" or "dQ"), the next launch of that mma kernel, if TUNED ("mma") at
// head_dim 64 (else none: end then says so), runs an instantiation that records, for each
// warp: when its block started
// and ended (the GPU's global timer, ns), its SM, the steps of its loop, its cycles and
// the cycles it spent waiting (for its tiles' copies and at the loop's barriers). The
// kernels the model runs have no probes (the probed ones are other instantiations).
// ops_cuda_attention_probe_end returns the records (*records malloc'd, WARPS = 4 a block,
// blocks in grid order, x fastest; a block that returned before its loop left zeros) and
// their count, or -1 with err_set() when no probed launch ran.
int ops_cuda_attention_probe_begin(const char *kernel);
long ops_cuda_attention_probe_end(OpsAttentionProbeRecord **records, int *grid_x, int *grid_y);
// The device memory the CUDA backend holds, in bytes: its tensors, the bf16 copies of
// weights, the scratch buffers, cuBLASLt's workspace (not the CUDA context's own, nor what
// cuBLASLt allocates itself): now, and the most at once since the device opened or since
// ops_cuda_memory_reset_peak. The counterpart of PyTorch's memory_allocated and
// max_memory_allocated (bench/train_step, bench/decode).
typedef struct {
    size_t in_use_bytes, peak_bytes;
} OpsCudaMemory;
OpsCudaMemory ops_cuda_memory(void);
void ops_cuda_memory_reset_peak(void);
#endif

// The backend named `name` ("cpu", "cuda"), or NULL with err_set() if it is not built in
// or (cuda) no usable GPU is present.
const OpsBackend *ops_backend_by_name(const char *name);
// The most device memory `ops` held since the previous call (or since the device opened),
// in MiB rounded up, and from now on counted afresh (the training logs' device_memory_gib);
// -1 for the CPU backend, whose memory is the process's.
int ops_take_device_memory_peak_mib(const OpsBackend *ops);
// The device memory `ops` holds now and the most it has held (since the device opened or the
// last reset of the peak), in bytes; false for the CPU backend. Any thread may ask (serve's
// /metrics). The reset makes the peak what is held now (nothing on the CPU).
bool ops_device_memory(const OpsBackend *ops, size_t *in_use_bytes, size_t *peak_bytes);
void ops_device_memory_reset_peak(const OpsBackend *ops);

// rotate_and_cache_write as rope_forward, rope_forward and two cache writes through `ops`:
// the CPU's rotate_and_cache_write, and the GPU's where a rotated buffer is a held input.
void ops_rotate_and_cache_write_in_calls(const OpsBackend *ops, float *q, float *k, const float *v, void *k_cache,
                                         void *v_cache, KvCacheType cache_type, const int *positions, int B, int T,
                                         int capacity, int slot, int n_heads, int n_kv_heads, int head_dim,
                                         const float *inv_freq);

// The norm that makes a product's input (InputRmsNorm; nothing where `norm` is NULL) as
// `ops`' rmsnorm_forward into inp[N, IC].
void ops_input_norm_forward(const OpsBackend *ops, float *inp, const InputRmsNorm *norm, int N, int IC);

// matmul_forward_parts as its norm (where given) and one matmul_forward per part through
// `ops` (a backend's table, or a test's stand-in for one): the CPU's matmul_forward_parts.
void ops_matmul_forward_per_part(const OpsBackend *ops, float *const *outs, const int *widths, int parts,
                                 const float *inp, const float *weight, const float *bias, int N, int IC,
                                 const InputRmsNorm *norm);

// matmul_forward_glu as matmul_forward_parts (its norm included) then glu_forward through
// `ops`: the CPU's.
void ops_matmul_forward_glu_in_calls(const OpsBackend *ops, float *act, float *gate, float *up, const float *inp,
                                     const float *weight, int N, int IC, int width, bool gelu,
                                     const InputRmsNorm *norm);

// matmul_forward_parts_q8 as its norm (where given) and a matmul_forward_q8 per part through
// `ops`: the CPU's.
void ops_matmul_forward_parts_q8_in_calls(const OpsBackend *ops, float *const *outs, const Q8Matrix *const *weights,
                                          const float *const *biases, int parts, const float *inp, int N, int IC,
                                          int kernel_rows, const InputRmsNorm *norm);

// matmul_forward_glu_q8 as its norm (where given), two matmul_forward_q8 and glu_forward
// through `ops`: the CPU's.
void ops_matmul_forward_glu_q8_in_calls(const OpsBackend *ops, float *act, float *gate, float *up, const float *inp,
                                        const Q8Matrix *gate_weight, const Q8Matrix *up_weight, int N, int IC,
                                        int width, bool gelu, int kernel_rows, const InputRmsNorm *norm);

// The row-invariant forward (docs/lora.md, "One policy"): the CPU's linear layers on the
// fixed-order kernel of ops/cpu/matmul_invariant.c, so a row's log-probs are the same bits
// alone or in any batch. Chooses it for the process, before the first forward: `requested`
// 1 (on), 0 (off) or -1 (not asked: $MARLHF_CPU_MATMUL decides, unless an earlier call
// chose), `request` naming the asking in messages (e.g. "option --batch-invariant"). A
// request that $MARLHF_CPU_MATMUL contradicts, a bad $MARLHF_CPU_MATMUL, or the kernel on a
// `device` other than "cpu" (NULL: not checked) is -1 with err_set().
int ops_choose_batch_invariant(const char *device, int requested, const char *request);
// Whether `ops` runs the row-invariant forward (the CPU backend with that kernel chosen).
bool ops_batch_invariant(const OpsBackend *ops);
