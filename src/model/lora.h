// LoRA: low-rank adapters on a model's linear layers (Hu et al. 2021), trained the way
// PEFT and DeepSpeed-Chat train them.
//
// An adapted layer computes  W x + b + (alpha / rank) * B (A x)  (rsLoRA: alpha / sqrt(rank)),
// each module with its own rank and alpha under PEFT's rank_pattern / alpha_pattern
// (LoraConfig.rank_pattern: regex keys resolved as PEFT resolves them, Model.lora_ranks),
// with the base weight W frozen, A [rank, in] initialised uniform in +-1/sqrt(in)
// (PyTorch's kaiming_uniform with a = sqrt(5), as PEFT does) and B [out, rank] zero, so a
// fresh adapter leaves the model's output unchanged.
//
// LoRA dropout (PEFT's lora_dropout, LoraConfig.dropout): in a training pass each adapter's
// input is dropped, B (A dropout(x)), the base layer seeing x whole. The masks are never
// stored: each is a pure function of (the run's seed, the micro-batch's epoch and index,
// the pass, the layer, the module) drawn by the dropout op (ops.h), so a gradient-
// checkpointing recomputation, a resumed run and another number of ranks or threads draw
// the same masks. Inference and evaluation passes have no dropout.
//
// DoRA (Liu et al. 2024, PEFT's use_dora, LoraConfig.dora): each adapted layer also has a
// magnitude m [out] and computes (m / n) (W + scale B A) x + b, n = ||W + scale B A|| per
// output row, detached from the gradient as PEFT detaches it; m starts at ||W||. With
// dropout the base term is recomputed on the dropped input, as PEFT does. Merged as PEFT
// merges: each row of W + scale B A times m / n. Its entries ("...q_proj.lora_magnitude_vector",
// PEFT's name) follow each module's A and B.
//
// The adapters are ordinary entries at the end of the parameter table (names
// "model.layers.L.self_attn.q_proj.lora_A.weight" ...), so the optimizer, gradient sums,
// ZeRO-1 shards, the EMA and checkpoints handle them like any weight. Everything before
// them is frozen (Model.trainable_offset): no gradient or AdamW memory is spent on the
// base. A reward model or critic also trains its value head ("score.weight", just before
// the adapters), as PEFT's modules_to_save = ["score"] does.
//
// Saved models (model_write_hf_files) hold the weights with the adapters merged in, so
// every later stage and transformers load them as a plain model, and in the subfolder
// adapter/ the adapters alone, adapter_model.safetensors + adapter_config.json in PEFT's
// format (PeftModel.from_pretrained(base, "RUN/final/adapter"); Llama, Qwen2 and Gemma
// module names; GPT-2's adapters keep marlhf's names). Not beside the merged weights:
// transformers reads a folder holding adapter_config.json as an adapter. A resume reads the adapters back
// onto the base weights given with --model, after checking that those are the weights
// the adapters were trained on (a fingerprint in adapter_config.json).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char *lora_target_name(LoraTarget target);
// Which module a LoRA table entry (A, B or a DoRA magnitude) adapts.
LoraTarget lora_entry_target(const ParamEntry *entry);
// Parses a comma-separated list of those names, or "all-linear" (all seven), into a bit
// mask. Returns -1 with err_set() naming the unknown module.
int lora_parse_targets(const char *list, unsigned *targets);

// Checks a LoraConfig's rank_pattern and alpha_pattern: at most LORA_MAX_PATTERNS keys each,
// distinct, regular expressions (PCRE2, which reads Python's re syntax for these), whole ranks
// in [1, 4096], positive alphas. Returns -1 with err_set() naming the key otherwise.
int lora_check_patterns(const LoraConfig *lora);
// Parses a --lora-rank-pattern / --lora-alpha-pattern value, "KEY=VALUE,KEY=VALUE" (split at
// commas outside brackets, each item at its last '=') or a JSON object (PEFT's form), into
// `patterns` sorted by key, the order PEFT saves them in. `what` names the option in errors.
// lora_check_patterns checks the values. Returns -1 with err_set() on a malformed value.
int lora_parse_patterns(const char *text, const char *what, LoraPattern *patterns, int *count);
// Whether two configurations have the same patterns, in the same order.
bool lora_patterns_equal(const LoraConfig *a, const LoraConfig *b);
// Checks LoraConfig.target_regex and .layers: a regex PCRE2 compiles that matches none of
// lm_head, score and model.embed_tokens (PEFT would adapt them; marlhf cannot), not both
// forms at once, at least one layer. lora_check_patterns checks this too. Returns -1 with
// err_set() otherwise.
int lora_check_selection(const LoraConfig *lora);
// Adds `layer` to lora->layers (PEFT's layers_to_transform) and sets lora->layer_subset.
void lora_select_layer(LoraConfig *lora, int layer);
// The two ways of choosing modules from text, as --lora-modules-regex and --lora-layers (and
// the embedding API's lora_modules_regex / lora_layers) give them: PEFT's target_modules
// regex (every module kind a candidate, the regex decides), and layer indices and ranges
// separated by commas ("0,1,8-11"). Return -1 with err_set() saying what is wrong ("must
// be ..."), for the caller to prefix with the option's name; lora_check_selection follows.
int lora_set_target_regex(LoraConfig *lora, const char *regex);
int lora_parse_layers(LoraConfig *lora, const char *text);
// Whether two configurations choose the same modules by regex and layers (LoraConfig.target_regex, .layers).
bool lora_selection_equal(const LoraConfig *a, const LoraConfig *b);

// in_features and out_features of a target's linear layer in a model of this shape.
long lora_in_features(const ModelConfig *cfg, LoraTarget target);
long lora_out_features(const ModelConfig *cfg, LoraTarget target);

// Adds adapters to the model's layers (after its weights are loaded, before
// model_enable_grad) and freezes every weight before them; with train_value_head the value
// head stays trainable too. A is drawn from the counter-based RNG keyed by seed. Returns -1
// with err_set() on a bad rank, alpha or target list (e.g. gate_proj on GPT-2).
int model_add_lora(Model *model, const LoraConfig *lora, bool train_value_head, uint64_t seed);

// Undoes model_add_lora: drops the adapters (and every gradient), so the model is its base
// weights alone and trainable in full again (a quantized base: frozen, its float32 entries
// kept as model_add_lora keeps them, the given-back pages untouched). How the embedding API leaves a model as it was
// when restoring a trainer onto it fails half-way (api/api.c).
void model_remove_lora(Model *model);

// One line for the log: "rank 8, alpha 8, q_proj,...: 2442240 of 136957248 parameters
// trained (1.78%)".
void lora_describe(const Model *model, char *out, size_t size);

// An adapted linear layer's extra term, called by the transformer after the base matmul:
// out[N, out] += scale * B (A inp); `hidden` [N, rank] keeps scale * A inp for the backward.
// With DoRA out becomes s * (W x + scale B A x) + b, s = m / ||W + scale B A|| per output row
// (lora_dora_norms), and `z` [N, out] keeps W x + scale B A x for the backward (unused
// without DoRA). Nothing happens when the layer has no adapter or model->lora_enabled is false
// (lora_adapts false).
bool lora_adapts(const Model *model, int layer, LoraTarget target);
void lora_forward(Model *model, int layer, LoraTarget target, float *out, const float *inp,
                  float *hidden, float *z, long N);
// DoRA's weight norms ||W + scale B A|| of every adapted row of layer `layer` into
// model->dora_norms; each forward pass that does not continue a KV cache calls it for each
// layer before running it, when the layer's weights are in place (under ZeRO-3 gathered), and
// a KV-cache continuation keeps the norms the cache was filled with. Nothing without DoRA.
void lora_dora_norms(Model *model, int layer);
// DoRA's initial magnitudes of layer `layer`, the row norms of its base weights (PEFT's
// initialisation, as model_add_lora sets them): a ZeRO-3 run's start sets them again with
// each layer gathered, as the rank that added the adapters held only its shard of the base.
void lora_dora_init_magnitudes(Model *model, int layer);
// DoRA's backward, called before the base layer's: accumulates the magnitude's gradient
// (sum over tokens of dout * z / norm) and returns the gradient the base layer's backward
// takes, s * dout (dout itself without DoRA, or with dropout, whose base term
// lora_backward adds). lora_backward for the same module must follow (it uses the scratch
// buffer this fills).
const float *lora_dora_dout(Model *model, int layer, LoraTarget target, const float *dout, const float *z, long N);
// Its backward: gradients of A and B (accumulated), and dinp += the adapter's share.
void lora_backward(Model *model, int layer, LoraTarget target, float *dinp, const float *dout,
                   const float *inp, const float *hidden, long N);

// Adds scale * B A into every adapted weight of `params`, a host copy of the model's flat
// buffer, so that the plain model computes what the adapted one does (up to rounding); with
// DoRA each row of W + scale B A is then scaled by m / its norm (PEFT's merge; biases stay).
void lora_merge(const Model *model, float *params);

// lora_merge for floats [first, first + count) of one base weight, `out` holding them: what a
// checkpoint of a model whose base is sharded (ZeRO-3) adds to each piece as it is written.
// Nothing for a weight without an adapter; float32 on the CPU. With DoRA the piece must be
// whole rows (lora_merge_row_length), each then scaled by m / its norm as lora_merge does.
// The sum over the rank runs in another order than lora_merge's matmul, so the two can
// differ in the last bit.
void lora_merge_piece(const Model *model, const ParamEntry *entry, long first, long count, float *out);
// The length of the rows lora_merge_piece needs whole for `entry`: its input width when DoRA
// adapts it (each merged row is scaled by its own norm), else 0 (any piece will do).
long lora_merge_row_length(const Model *model, const ParamEntry *entry);

// The subfolder of a saved model that holds its adapters.
#define LORA_ADAPTER_DIR "adapter"

// Writes MODEL_DIR/adapter/adapter_model.safetensors and adapter_config.json from `params`,
// a host copy of the model's flat buffer.
int lora_write_adapter(const Model *model, const float *params, const char *model_dir);
// Reads the adapters (and a trained value head) saved in MODEL_DIR/adapter, or in MODEL_DIR
// itself when it is a PEFT adapter folder, into the model, after checking that the
// adapter's rank, alpha and modules match the model's and that it was trained on these
// base weights. Returns -1 with err_set() naming the file otherwise.
int lora_read_adapter(Model *model, const char *model_dir);
// The rank, alpha and modules of the adapter saved in MODEL_DIR/adapter (or in MODEL_DIR,
// a PEFT adapter folder). Returns -1 with err_set() naming the file when it is missing,
// malformed, or uses what marlhf does not (module patterns in target_modules or modules
// other than the seven). rank_pattern and alpha_pattern are read in the file's order.
int lora_read_adapter_config(const char *model_dir, LoraConfig *lora);
// The quantization of the base an adapter saved in MODEL_DIR was trained on: "none", or
// one of QUANTIZE_TYPES (a QLoRA run's "marlhf_base_quantize"). Same errors as above.
int lora_read_adapter_base_quantize(const char *model_dir, char quantize[16]);
// model_add_lora with the adapter's own configuration, then lora_read_adapter: the saved
// adapter on a loaded base model (--lora-adapter).
int model_load_lora_adapter(Model *model, const char *model_dir, bool train_value_head, uint64_t seed);
// Its first half: adapters shaped as the saved ones, not yet read. A ZeRO-3 run reads them
// (lora_read_adapter) after dist_weights_start, which takes the fingerprint of the sharded
// base that the file's is checked against.
int model_add_lora_of_adapter(Model *model, const char *model_dir, bool train_value_head, uint64_t seed);
