// Quantized weights: Q8_0 (`--quantize q8_0`), Q4_0 (`--quantize q4_0`, llama.cpp's 4-bit
// blocks), Q4_1 / Q5_1 (`--quantize q4_1`, `q5_1`: blocks with a minimum), NF4 (`--quantize
// nf4`, `nf4-single`: bitsandbytes' 4-bit NormalFloat, ops/nf4.h), llama.cpp's mixes of K-quants
// Q4_K_M, Q5_K_M, Q3_K_M and Q2_K (`--quantize q4_k_m`, `q5_k_m`, `q3_k_m`, `q2_k`, ops/kquant.h)
// and of its non-linear 4-bit types IQ4_NL and IQ4_XS (`--quantize iq4_nl`, `iq4_xs`; ops/q4.h)
// -- under a mix a GGUF tensor of a type marlhf holds keeps the file's own bytes, any other
// matrix is quantized to the type the mix's rule gives it (what `convert --outtype` writes) --, or
// bf16 (`--quantize bf16`: 2 bytes a weight, no blocks; a bf16 checkpoint loses nothing)
// on generate, chat, serve and infer, for PPO's frozen models (--reference-quantize,
// --reward-quantize), and under LoRA training (sft, rm, dpo, kto; ppo's --actor-quantize /
// --critic-quantize).
// Every linear layer and the LM head compute from quantized copies of their weights, and the
// token embedding is looked up in a quantized table (a row dequantized per token), as
// llama.cpp runs a Q8_0 or Q4_0 model. The float32 copies of those weights are given back to
// the system once quantized (their pages read as zeros afterwards; on a GPU the buffer is made
// again without them, quantized_unstore), so a quantized model
// takes about 1.1 (Q8_0) or 0.6 (Q4_0) bytes per weight instead of 4 (norms, biases, learned
// positions and a value head stay float32): SmolLM2-135M ~150 MB (Q8_0) of weights instead of
// ~540. Loading with ModelLoadOptions.quantize quantizes each tensor as it is read, so the
// float32 model never exists in full.
//
// Training (QLoRA, Dettmers et al. 2023): the quantized base is frozen and LoRA adapters
// train on top of it (model_add_lora after the quantized load). A model with gradients
// computes each quantized layer as the float32 matmul of its dequantized weights (weights-only
// quantization, ops.h matmul_forward_dequantized) and carries the input gradient through
// them (matmul_backward_input_q8), so training over a quantized base is training over a
// float32 base holding the dequantized values. Saving writes those dequantized values with
// the adapters merged (model_dequantize_into). Without LoRA a quantized model cannot be
// trained; nor converted to GGUF.
#pragma once
#include <stdbool.h>

#include "io/gguf.h"
#include "model/model.h"
#include "model/tensor_map.h"

typedef struct {
    Q8Matrix q, k, v, o, gate, up, down; // gate: gated MLPs only
} QuantizedLayer;

// The names --quantize takes (quantize_type_check), for option help and errors.
#define QUANTIZE_TYPES "none, q8_0, q4_0, nf4, nf4-single, q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs, q4_1, q5_1 or bf16"

typedef struct ModelQuantized {
    QuantType type;         // of every linear layer's matrix (the table and head stay Q8_0 under q4_0, nf4);
                            // under a mix (gguf_mix), its main type: QUANT_Q4_K (q4_k_m), QUANT_Q5_K
                            // (q5_k_m), QUANT_Q3_K (q3_k_m), QUANT_Q2_K (q2_k), QUANT_IQ4_NL (iq4_nl, iq4_xs);
                            // QUANT_Q4_1, QUANT_Q5_1: q4_1, q5_1 (a GGUF tensor of a held type keeps
                            // its own bytes, as under q4_k_m; table and head Q8_0 from floats);
                            // QUANT_BF16: bf16, the table and head bf16 as well
    bool double_quant;      // nf4: the block scales double-quantized (bitsandbytes' compress_statistics)
    bool fp4;               // a bitsandbytes FP4 checkpoint's code book (model/bnb_checkpoint.h)
    int gguf_mix;           // a llama.cpp mix (q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs): its GgufOutType
                            // (model/weights_io.h), whose rule gives each matrix read as floats its type
                            // (model/quantize_q4_k_m.c); -1 for the other types
    QuantizedLayer *layers; // [num_layers]
    Q8Matrix embedding;     // the token table
    Q8Matrix lm_head;       // the LM head; the same arrays as `embedding` when tied
    bool head_is_embedding;
    int source_type;        // a mix: the GGUF type of the tensor being read as floats (quantized_take_gguf), or -1
} ModelQuantized;

// True when `type` asks for quantized weights (not NULL and not "none").
bool quantize_requested(const char *type);

// The --quantize of an inference command (generate, chat, serve, infer, logprobs): `asked` when
// the option was given; left out (NULL), for a GGUF file holding Q4_K, Q5_K, Q6_K, Q3_K, Q2_K,
// IQ4_NL or IQ4_XS tensors -- such a file runs with its own bits, as llama.cpp runs it, on the CPU
// and on the GPU -- the mix its general.file_type names (q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_nl,
// iq4_xs; q4_k_m for another or none: every mix holds those tensors' bytes alike, and differs
// only for a tensor of a type marlhf does not hold), and "none" otherwise (a float model, a Q8_0
// or Q4_0 file: their --quantize is asked for).
const char *quantize_default(const char *asked, const char *model_path);
// The help of those commands' --quantize.
#define QUANTIZE_OPTION_HELP                                                                                  \
    QUANTIZE_TYPES ": the model's weights in 16, 8, 5, 4, 3 or 2 bits (less memory; faster decoding on the CPU; left "  \
                   "out, a GGUF of Q2_K - Q6_K, IQ4_NL or IQ4_XS tensors runs with its own bits as its file type's mix, "     \
                   "anything else as none)"

// The names --quantize takes: "none" (float32), "q8_0", "q4_0", "nf4" (bitsandbytes' NF4 with
// double quantization, QLoRA's recipe: bnb_4bit_use_double_quant=True), "nf4-single" (NF4,
// float scales: bnb_4bit_use_double_quant=False), "q4_k_m", "q5_k_m", "q3_k_m", "q2_k" (llama.cpp's
// K-quant mixes), "iq4_nl", "iq4_xs" (its IQ4 mixes), "q4_1" or "q5_1" (GGUF's blocks of 32 with a
// scale and a minimum) or "bf16" (every
// weight rounded to bfloat16, the token table and LM head too: core/bf16.h). Returns 0, or -1
// with err_set() naming `option` (the option or field that gave the name).
int quantize_type_check(const char *type, const char *option);

// Quantizes a loaded model's linear layers and LM head to `type` and releases their
// float32 copies; "none" (or NULL) does nothing. The model must have no gradients. On the
// CPU the float32 pages are given back; on the GPU (ops/cuda) each weight is quantized from
// a host copy of the buffer, its blocks go to device memory and the buffer is made again
// without its float32 slot (quantized_unstore). Returns 0, or -1 with err_set() (the model
// unchanged).
int model_quantize(Model *model, const char *type);

// For model_load (model/weights_io.c): quantized_begin checks and sets up the quantized
// copies before any weight is read (same errors as model_quantize); quantized_take then
// quantizes table entry `entry` if it is one of the quantized tensors from its float32
// values `weight` (host memory: the loader's copy of the entry), gives those pages back,
// and puts the blocks in the model's backend memory.
int quantized_begin(Model *model, const char *type);
void quantized_take(Model *model, const ParamEntry *entry, float *weight);
// On a backend other than the CPU, once every quantized entry has its blocks: marks those
// entries stored nowhere (ParamEntry.stored = -1) and replaces model->params (or NULL: a model
// made by model_init_without_params) by a buffer of the remaining entries only
// (table.stored_total floats, zeros; the caller fills it with model_params_to_device), so a quantized weight takes no float32 memory there, as on the CPU,
// whose given-back pages keep the table's layout. Gradients and AdamW moments cover the
// trainable tail only (LoRA adapters, a value head), so they never had slots for the quantized
// base, and the CUDA backend's bf16 weight cache holds only weights that a float matmul read.
// Nothing on the CPU.
void quantized_unstore(Model *model);
// Moves a matrix whose arrays are host memory from ops_cpu.alloc into `ops`' memory (nothing
// on the CPU): for model/bnb_checkpoint.h, which reads a file's blocks on the host.
void quantized_to_backend(const OpsBackend *ops, Q8Matrix *matrix);
// A float32 [rows, cols] matrix in host memory quantized to `type` (NF4: double_quant says
// whether its scales are double-quantized) into `matrix`, its arrays in `ops`' memory.
void quantize_matrix(const OpsBackend *ops, Q8Matrix *matrix, QuantType type, bool double_quant, const float *weight,
                     long rows, long cols);
// Under a mix (q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs), q4_1 and q5_1, a GGUF tensor stored as
// Q4_K, Q5_K, Q3_K, Q2_K, Q6_K, Q5_0, Q4_0, Q8_0, Q4_1, Q5_1, IQ4_NL or IQ4_XS is taken as the
// file's own blocks (model/quantize_q4_k_m.c; its rows moved as `map` moves them: llama.cpp's q/k row
// order undone, GPT-2's fused qkv sliced), in place of reading it as floats: returns 1.
// Returns 0 when the entry is not a quantized one, the type is not one of those, or the file's
// tensor is of another type (or a transposed layout): then the caller reads floats and calls
// quantized_take. -1 with err_set() on a shape that does not match.
int quantized_take_gguf(Model *model, const ParamEntry *entry, const GgufFile *file, const TensorMap *map);

// Under a mix, quantized_take's work for a matrix read as floats (model/quantize_q4_k_m.c): the
// type a file of that mix would hold it in (gguf_mix_matrix_type; a GGUF tensor of another
// quantized type: Q8_0), quantized with the GGUF writer's block code and held as under
// quantized_take_gguf.
void k_mix_take_floats(Model *model, const ParamEntry *entry, Q8Matrix *matrix, const float *weight);
// Fills `matrix` [rows, cols] from `data`, rows of GGUF blocks of `type` (one quantized_take_gguf
// holds: Q4_K, Q5_K, Q6_K as they are; Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 split into ops/ops.h's
// layouts), its arrays then in `ops`' memory.
void quantized_hold_gguf_blocks(const OpsBackend *ops, Q8Matrix *matrix, GgmlType type, const uint8_t *data, long rows,
                                long cols);
// A tied LM head shares the embedding table's quantized arrays, once `matrix` is filled.
void quantized_share_tied_head(Model *model, const Q8Matrix *matrix);

// Where table entry `entry`'s quantized copy goes (a linear layer's weight, the token table,
// the LM head), or NULL: for model/bnb_checkpoint.h, which fills it from the file's own bits.
Q8Matrix *quantized_slot(const Model *model, const ParamEntry *entry);
// Writes every quantized entry's dequantized values into the model's float32 buffer and frees
// the quantized copies: the model is a float32 model from then on (CPU; `convert` of a
// bitsandbytes 4-bit checkpoint).
void model_dequantize(Model *model);

// The quantized copy of table entry `entry`, or NULL when it stays float32 (or the model is
// not quantized).
const Q8Matrix *quantized_matrix(const Model *model, const ParamEntry *entry);
// "q8_0", "q4_0", "nf4" or "nf4-single" (or "fp4", "fp4-single": a bitsandbytes FP4
// checkpoint): the model's quantization; "none" when it has none.
const char *model_quantize_name(const Model *model);
// Writes the dequantized values of every quantized entry into `params`, a host copy of the
// model's flat buffer (the merged weights a quantized LoRA model saves).
void model_dequantize_into(const Model *model, float *params);
// FNV-1a (core/hash.h) of params[0, n) -- the model's flat buffer on the host -- with each
// quantized entry's dequantized values in place of its released floats: what
// hash_floats(HASH_FNV1A_START, ...) gives over a float32 model holding those values. A
// LoRA adapter's base fingerprint; streamed a chunk at a time (no float32 copy of the base).
uint64_t model_base_hash(const Model *model, const float *params, long n);

// Asks for small pages over a quantized model's float32 buffer params[0, count) (CPU): it
// keeps only small tensors (norms, biases) between the given-back ones, and the CPU backend
// maps large buffers with transparent huge pages, where writing one norm would bring in 2 MB
// (SmolLM2's 61 norms: ~120 MB). quantized_begin calls it before the weights are read, and
// model_add_lora on the buffer it makes for a quantized base.
void quantized_small_pages(float *params, long count);

// Frees the quantized copies (model_free calls it).
void model_quantized_free(Model *model);
