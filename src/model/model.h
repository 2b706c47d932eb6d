// A transformer model: config, parameters (weights, optional gradients), activations,
// and the forward / backward passes every training and inference command uses.
//
// The engine serves all four PPO roles with one code path:
//   model_forward()   body + final norm over ragged rows
//   model_logprobs()  per-token log-probs of given next tokens (LM head)
//   model_values()    per-position values (value head, "score.weight")
//   model_backward()  from dlogp[b,t] (+ dentropy) and/or dvalue[b,t] into the gradients
// Losses live elsewhere (train/, rl/): they turn their objective into these per-token
// weights, so SFT, reward modelling and PPO share one backward.
#pragma once
#include <stdbool.h>

#include "model/config.h"
#include "model/params.h"
#include "ops/ops.h"

// One sequence of a packed row (ModelBatch.segments): slots [start, start + length) of row
// `row`.
typedef struct {
    int row, start, length;
} ModelSegment;

// One batch of B rows of T slots. Row b's real tokens sit at slots
// [row_start[b], row_start[b] + row_len[b]); the rest is padding (any token id in range).
// Positions count from the row's first real token, so a row gives the same result
// whatever padding surrounds it.
//
// Packed rows (SFT's --packing): with segments, a row holds several sequences side by side,
// and each one is computed as if it were a row of its own -- it attends only to its own
// slots, its positions count from its first slot (model/packed_attention.h). The segments
// lie inside their rows, in order and without overlap; slots outside every segment are
// padding. row_start and row_len are then ignored; no KV cache takes packed rows.
typedef struct {
    int B, T;
    const int *tokens;    // [B*T], host memory
    const int *row_start; // [B]; NULL means every row starts at 0 (right padding)
    const int *row_len;   // [B]; NULL means every row runs to T
    // 0: B * T. Else the linear layers pick their kernels (Q8_0 weights: ops.h's
    // matmul_forward_q8) as for this many rows: a chunk of a prompt (chunked prefill) gives
    // the rows of the prompt's whole prefill, so that it runs the same kernels.
    int kernel_rows;
    const ModelSegment *segments; // NULL: not packed
    int segment_count;
} ModelBatch;

typedef struct {
    float *attn_norm_out, *attn_norm_mean, *attn_norm_rstd;
    // q, k, v: one buffer `qkv` of N * (q_dim + 2 kv_dim) floats. Laid out as three buffers
    // (q, k and v point at them) after the rotary embedding, or, in a forward that fused the
    // three products (qkv_fused), as rows [N, q | k | v] of the fused product's output,
    // unrotated (the attention op rotates q and k as it reads them).
    float *qkv, *q, *k, *v;
    bool qkv_fused;
    float *q_raw, *k_raw, *q_norm_rstd, *k_norm_rstd; // qk_norm: projections before the norm, its 1/rms per head
    // The attention backward's saved state (ops.h), and its size (a KV-cache prefill asks
    // whether it fits); NULL and 0 where no backward follows and the backend's forward needs
    // none (OpsBackend.attention_forward_without_saved).
    float *attention_saved;
    long attention_saved_floats;
    float *att_out;   // attention output before o_proj
    float *x_mid;     // residual stream after the attention block
    float *mlp_norm_out, *mlp_norm_mean, *mlp_norm_rstd;
    float *gate, *up, *act; // MLP pre-activations and activation output
    // Gemma 2's sandwich norms: the o_proj and down_proj outputs (the norms' inputs), the
    // norms' 1/rms.
    float *attn_proj, *post_attn_norm_rstd, *mlp_proj, *post_mlp_norm_rstd;
    float *lora_hidden[LORA_TARGETS]; // LoRA: scale * A x per adapter, [N, rank]
    float *dora_z[LORA_TARGETS];      // DoRA: the base result (no bias) + scale * B A x, [N, out]
    // The last forward stored attn_norm_out, mlp_norm_out, gate, up and act (ops.h's
    // hold_stored): products and the activation are their only readers, and on a GPU they
    // hold bf16 copies instead of floats, which the backward reads again.
    bool inputs_stored;
    // Those buffers are sized for their stored values only (ops.h, stored_buffer_floats):
    // only a forward that stores may write them (model_reserve, layer_always_stores).
    bool stored_only;
} LayerActivations;

typedef struct {
    int capacity_B, capacity_T; // sizes the buffers were allocated for
    // Rows of the per-row buffers (row_start, last_*, sample_*, candidate_*): at least
    // capacity_B, and the most rows asked for since the activations were first made, in
    // any layout, so that a training layout of fewer rows serves generation's batches
    // (model_reserve_cached).
    int capacity_rows;
    int B, T;                   // sizes of the last forward
    long kernel_rows;           // its ModelBatch.kernel_rows (B * T when 0)
    bool has_forward;           // a forward ran since the last backward
    bool backward_ready;        // ... and it was not a KV-cache forward
    bool keep_all_layers;       // saved per layer (else one scratch set + recompute)
    bool backward_buffers;      // the backward's buffers (a training forward's layout, not generation's)
    int *tokens, *positions, *row_start, *targets; // device copies
    // [residual_slices][N, C]: each layer's input, then the final norm's, layer l's in slice
    // l % residual_slices (model/transformer.c, residual_slice). num_layers + 1 slices where a
    // backward may follow (it reads every layer's input); two in turn otherwise (generation,
    // frozen models: a layer reads only its own input).
    float *residual;
    int residual_slices;
    LayerActivations *layers;   // num_layers entries if keep_all_layers, else 1
    float *final_out, *final_mean, *final_rstd;
    float *logits, *lse;        // [N, V], [N]; allocated on first use of the LM head
    bool logits_valid;          // logits hold the last forward's logits (not gradients)
    // The LM head on the rows that have a target only (model_logprobs): head_runs runs of
    // consecutive slots [head_run_start[r], + head_run_len[r]), head_rows rows in all,
    // gathered into head_hidden. When head_compact, logits, lse and targets hold those rows.
    bool head_compact;
    bool logprobs_ready;        // lse and targets match the logits (model_logprobs ran on them)
    int head_runs;
    long head_rows;
    long *head_run_start, *head_run_len; // host, [N]
    float *head_hidden;                  // [N, C]; allocated on first use
    float *last_hidden;         // [capacity_rows, C]: each row's last slot, for model_last_logits
    float *last_logits;         // [capacity_rows, V]: their logits (with an LM head)
    float *last_lse;            // [capacity_rows]: their log-sum-exps (model_last_greedy)
    float *sample_inverse;      // [capacity_rows]: model_last_sampled's inverse temperatures
    double *sample_uniform;     // [capacity_rows]: ... and uniform numbers
    // model_last_candidates' inputs and outputs in the backend's memory, allocated on first
    // use for candidate_capacity candidates a row: [capacity_rows] (ids and values:
    // [capacity_rows, candidate_capacity])
    int candidate_capacity;
    float *candidate_inverse, *candidate_values;
    int *candidate_top_k, *candidate_counts, *candidate_ids;
    double *candidate_lse, *candidate_scaled_lse;
    float *logp_device, *entropy_device, *values_device; // [N] staging for head outputs
    int *top1_device;
    // Packed rows (model/packed_attention.h): the last forward's segments (count 0: none) and
    // the attention's layout of one sequence a row, [count, T], T the longest segment. Device
    // buffers of slots_capacity slots (saved: saved_capacity floats), grown as asked.
    struct {
        int count, T, capacity; // capacity: room in `segments`
        ModelSegment *segments; // host
        long slots_capacity, saved_capacity;
        int *positions, *row_start;                // [slots], [count]
        float *qkv, *dqkv, *out, *dout, *saved;     // q | k | v as the layer lays them out; [slots, q_dim]
    } packed;
    // backward scratch
    float *d_resid, *d_norm_out, *d_hidden;
    // dq, dk, dv: one buffer dqkv, laid out as the layer's qkv is (three buffers, or rows
    // [N, dq | dk | dv] that the fused product's backward reads).
    float *dqkv, *dq, *dk, *dv, *d_att_out, *d_act, *d_gate, *d_up, *d_head; // d_head: [N] staging
    float *dq_raw, *dk_raw; // qk_norm: gradients of the projections before the q/k norms
    float *d_branch;        // sandwich norms: the gradient of o_proj's or down_proj's output
    float *d_lora_hidden; // LoRA: the gradient of an adapter's scale * A x, [N, rank]
    // LoRA dropout: an adapter's dropped input, and its gradient, [N, widest adapted input]
    float *lora_dropped, *d_lora_dropped;
    // DoRA: m / ||W + s B A|| times an adapted layer's output gradient (and, with dropout, the
    // forward's base result on the dropped input), [N, widest adapted output]; B A of one
    // adapter for its weight norms, [widest out * in]; over a quantized base (QDoRA) the
    // dequantized weight of one adapted layer for the same norms, [widest out * in].
    float *dora_scratch, *dora_delta, *dora_base;
} Activations;

// Per-module ranks or alphas (PEFT's rank_pattern / alpha_pattern): a module takes the value of
// the first key k for which the regex (.*\.)?(k)$ matches its whole name
// ("model.layers.L.self_attn.q_proj"), as PEFT's get_pattern_key does.
#define LORA_MAX_PATTERNS 16
#define LORA_MAX_LAYERS 256 // the layers LoraConfig.layers can name
typedef struct {
    char key[128];
    float value; // a rank (a whole number) or an alpha
} LoraPattern;

// LoRA adapters on a model's linear layers (model/lora.h).
typedef struct {
    int rank;          // 0: no adapters; with rank_pattern the default rank (PEFT's r)
    float alpha;       // the adapter's output is scaled by alpha / rank
    bool rslora;       // rank-stabilised LoRA (Kalajdzievski 2023, PEFT's use_rslora): by alpha / sqrt(rank)
    unsigned targets;  // bit (1 << t) for each LoraTarget t that has an adapter
    double dropout;    // PEFT's lora_dropout: an adapter's input is dropped with this probability
                       // in training passes (model_training_pass_begin), never at inference
    bool dora;         // DoRA (Liu et al. 2024, PEFT's use_dora): a trained magnitude per output row
    // Which of the `targets` modules have adapters, in PEFT's two narrower forms (both empty:
    // every layer's). target_regex is target_modules given as one string: a module has
    // adapters when the regex matches its whole name ("model.layers.L.self_attn.q_proj",
    // re.fullmatch); `targets` is then all seven. layers is layers_to_transform: only these
    // layers' modules have adapters (bit l % 64 of layers[l / 64]). PEFT takes one or the other.
    char target_regex[128];
    bool layer_subset;
    unsigned long long layers[LORA_MAX_LAYERS / 64];
    int rank_patterns, alpha_patterns; // how many entries of the two lists below are used
    LoraPattern rank_pattern[LORA_MAX_PATTERNS], alpha_pattern[LORA_MAX_PATTERNS];
} LoraConfig;

// The kinds of pass Model.weight_hook is told of (0 is no pass).
enum { MODEL_PASS_FORWARD = 1, MODEL_PASS_BACKWARD = 2 };

typedef struct Model {
    ModelConfig config;
    const OpsBackend *ops;
    bool has_lm_head;
    bool has_value_head;
    bool recompute; // gradient checkpointing: keep only each layer's input, recompute in backward
    // Every forward of this model runs packed rows (ModelBatch.segments), padding-free: SFT's
    // --padding-free and bfd packing build such batches; DPO's and KTO's --padding-free set it
    // and their response batches (train/response_logps.c) run their rows side by side in one
    // row. The layers keep no attention state of their own, which for one row of a whole
    // micro-batch would be [heads, T, T] a layer on the CPU; model/packed_attention.c keeps one
    // for all layers. Set before the activations are made.
    bool packed_rows_only;
    // Quantized weights (model/quantize.h) multiplied as float32 values at any row count, as
    // a model with gradients does, instead of the inference kernels (which quantize the
    // activations below Q8_SGEMM_MIN_ROWS rows): a frozen copy that must compute exactly what
    // the trained model computes (PPO's reference made from a quantized actor's start).
    bool dequantized_matmuls;
    // LoRA (model/lora.h): the adapters are the table's last entries. lora_enabled false
    // runs the base model alone (PPO's reference model shares the actor's weights this way).
    LoraConfig lora;
    int lora_first_entry; // table entries from here on are adapters: A, B (DoRA: A, B, m) per module
                          // (table.count without LoRA)
    // DoRA: ||W + s B A|| of each adapted weight's output rows, layer after layer, module after
    // module (model/lora.c dora_norm_offset); device memory. Recomputed by every forward
    // that does not continue a KV cache (lora_dora_norms).
    float *dora_norms;
    // Each adapted module's rank and scale (alpha / rank, rsLoRA alpha / sqrt(rank)), at
    // [layer * LORA_TARGETS + target] (host memory; rank 0 where no adapter), and the largest
    // rank (the activations' adapter buffers are that wide).
    int *lora_ranks;
    float *lora_scales;
    int lora_max_rank;
    bool lora_enabled;
    unsigned long long lora_base_fingerprint; // FNV-1a of the frozen weights the adapters sit on
    // A training pass in progress (model_training_pass_begin): the key of one micro-batch's
    // random numbers, LoRA dropout's masks and NEFTune's noise.
    struct {
        bool active;
        uint64_t seed, micro_batch; // the run's seed; the micro-batch's key
        uint64_t passes;            // forward passes since the pass began (each draws its own)
    } training_pass;
    // NEFTune (Jain et al. 2023, Hugging Face's neftune_noise_alpha): in training passes the
    // token embeddings get noise uniform on [-a, a), a = alpha / sqrt(T * hidden_size) for a
    // batch of rows of T slots, as transformers' hook adds it to the embedding layer's output
    // (after Gemma's scale, which its embedding module applies). 0: none.
    double neftune_noise_alpha;
    // Weights before this offset are frozen: gradients and optimizer state cover only
    // params[trainable_offset, table.total) (0 unless LoRA froze the base).
    long trainable_offset;
    // Inference: the element type of the KV caches made for this model (kv_cache_type_set).
    KvCacheType kv_cache_type;

    ParamTable table;
    // Backend memory: table.stored_total floats, each entry at its `stored` offset -- the table's
    // own layout, except that a quantized weight on a backend other than the CPU has no float32
    // slot (model/quantize.h quantized_unstore). Host code reads and writes it in the table's
    // layout through model_params_to_host / model_params_to_device.
    float *params;
    float *rope_inv_freq; // RoPE models: head_dim / 2 frequencies (config.h), backend memory
    float *rope_inv_freq_local; // Gemma 3: its sliding layers' (config_layer_uses_local_rope), or NULL
    ModelTensors weights;
    float *grads;  // NULL for a frozen model; else model_trainable_floats() floats
    ModelTensors gradients;
    // Which gradient tensors no op has written since model_zero_grad, by table entry (NULL
    // without gradients): zero by meaning, not in memory (model/gradient_writes.c).
    bool *gradient_unwritten;
    // Called by model_backward as each part of the gradients is complete for that backward:
    // point num_layers once the LM head, value head and final norm are done, point l after
    // layer l, point -1 after the embeddings (model_gradient_point says which tensor is final
    // at which point). ZeRO stage 2 (dist/zero.h) sums and frees each part there, so the
    // whole gradient never has to be in memory at once. NULL: nothing is called.
    struct {
        void (*ready)(struct Model *model, int point, void *context);
        void *context;
    } gradient_hook;
    // Called as the weights are used, for ZeRO stage 3 (dist/zero.h), whose ranks hold a
    // shard of each layer's weights and gather a layer only while it runs: `pass` at the start
    // of every forward (MODEL_PASS_FORWARD, the KV-cache ones too) and backward
    // (MODEL_PASS_BACKWARD); `layer` with needed = true before layer l runs (its recomputation
    // in a backward included) and with false once it is done -- in a backward after the
    // gradient hook's point l. The order is fixed: a forward is pass, then need/done of layers
    // 0 .. L-1; a backward is pass, gradient point L, then for l = L-1 .. 0 need l, point l,
    // done l, then point -1 (dist/zero.c plays the same order on a rank with nothing to run).
    // The global tensors (embeddings, final norm, heads) are not asked for: `pass` is where a
    // sharded model gathers them (dist/zero.c stage3_use). NULL: nothing.
    // `read`, where set, copies the table's floats [first, first + count) wherever they are
    // (ZeRO-3's rank 0 reads the other ranks' shards of the layers while it writes a
    // checkpoint, model_write_hf_files); NULL: they are all in Model.params.
    struct {
        void (*pass)(struct Model *model, int kind, void *context);
        void (*layer)(struct Model *model, int layer, bool needed, void *context);
        void (*read)(const struct Model *model, long first, long count, float *out, void *context);
        void *context;
    } weight_hook;

    Activations acts;
    // Q8_0 copies of the linear weights for inference (model/quantize.h); NULL without.
    struct ModelQuantized *quantized;
} Model;

// Allocates a model with zero weights. Fill them with model_load (model/weights_io.h) or
// by writing model->params directly.
void model_init(Model *model, const ModelConfig *cfg, const OpsBackend *ops, bool with_lm_head,
                bool with_value_head);
// model_init without the weight buffer (model->params NULL, the weight views NULL): for a model
// whose buffer is made once its layout is known (model_load of a quantized model off the CPU,
// model/quantize.h quantized_unstore).
void model_init_without_params(Model *model, const ModelConfig *cfg, const OpsBackend *ops, bool with_lm_head,
                               bool with_value_head);
void model_free(Model *model);
// Makes the model trainable: allocates gradients (zeroed).
void model_enable_grad(Model *model);

// Gradient writes (model/gradient_writes.c). model_zero_grad writes nothing: it marks every
// gradient tensor unwritten, the first op to produce one writes over it (a weight gradient
// product with beta 0: no zero-fill of the buffer, no read of it) and the later ones add.
// model_backward zero-fills what it did not produce (a head without a gradient, a weight no
// path reached) as each gradient point completes, before Model.gradient_hook sees it; a
// reader of model->grads that may run with no backward since the last model_zero_grad calls
// model_settle_gradients first. With MARLHF_CHECK_GRADIENT_WRITES=1 in the environment
// (tests/run.sh sets it) model_zero_grad fills the gradients with NaN instead, so a reader
// that skipped the settling or an op that added into an unwritten tensor shows as NaN (0 or
// unset: off; any other value is a one-line user error).
void model_zero_grad(Model *model);
// How an op that produces `weight_grad` and `bias_grad` (either may be NULL) writes them:
// WRITE_OVERWRITE when every one given is unwritten (they are then marked written), else
// WRITE_ADD, any unwritten one zero-filled first.
WriteMode model_gradient_write_mode(const Model *model, float *weight_grad, float *bias_grad);
// The same for an op that produces `count` gradient tensors at once (NULLs skipped): the
// fused q/k/v product's backward writes three weights' (and biases') gradients.
WriteMode model_gradients_write_mode(const Model *model, float *const *grads, int count);
// For an op that can only add into `grad` (NULL: nothing): zero-filled first if unwritten.
float *model_gradient_to_add(const Model *model, float *grad);
// Zero-fills the unwritten gradients of backward point `point` (model_gradient_point).
void model_settle_gradient_point(const Model *model, int point);
// Zero-fills every unwritten gradient: model->grads then holds every value it stands for.
void model_settle_gradients(const Model *model);
// The backward point after which the gradient of table entry `entry` is final (see
// Model.gradient_hook): its layer, -1 for the token and position embeddings (the tied LM
// head's gradient also lands in the token table), num_layers for every other global tensor.
int model_gradient_point(const Model *model, const ParamEntry *entry);
// Sizes activation memory for up to B rows of T slots (done once; grows if asked) for the
// forwards that a backward may follow: with gradients (and no recompute) every layer keeps
// its activations.
void model_reserve(Model *model, int B, int T);
// The attention's saved state of a B x T forward for layers [first, last] (ops.h,
// attention_saved_size): the most any of them needs (a sliding window can make a layer's
// larger; CUDA: no fused kernel).
long model_attention_saved_floats(const Model *model, int B, int T, int first, int last);
// The same for KV-cache forwards (generation), which use one layer's set for all layers and
// no backward's buffers: activations of any layout serve that have the rows, the slots (B x
// T: a KV-cache forward's buffers are flat [slots, width]) and the attention's saved state
// of a B x T forward (a training layout of 8 x 95 serves a 16 x 47 prefill and its decode
// steps); else one set for B x T without those buffers, the training layout's capacity not
// carried over (a rollout of many rows would otherwise size every layer's set of the
// training micro-batches after it, and the backward's buffers, for them).
//
// A model that alternates (PPO's actor: generation, then training) makes its activations
// once when it asks for generation's batch first and training's second: the training
// layout keeps generation's rows (Activations.capacity_rows), and if it has the slots, each
// later generation runs in it instead of freeing it (rl/ppo.c, reserve_activations).
void model_reserve_cached(Model *model, int B, int T);
// The most rows of T tokens a KV-cache forward runs in the activations as they are, without
// making them again (0: none made yet, or not one row fits). generate() prefills a
// trainable model's prompts in chunks of that many rows (model_prefill_rows) where all of
// them do not fit: PPO's actor keeps its training layout.
int model_cached_rows_fitting(const Model *model, int T);
// Frees the activations and makes them again at the same capacity (rows too), for a model
// whose buffers changed (gradients or adapters added: the old layout lacks theirs).
void model_rebuild_activations(Model *model);
// Whether a layer computes q, k and v as one product where it can (no adapter on them, the
// attention op rotating them, the weights side by side: model/transformer.c,
// layer_fuses_qkv). UNSET: read MARLHF_FUSED_QKV at the next forward (1 on, 0 off, unset or
// empty: BACKEND, the backend's choice, OpsBackend.fuses_qkv_products). For every model of
// the process from the next forward on; tests and benchmarks set it.
typedef enum {
    MODEL_QKV_FUSION_UNSET,
    MODEL_QKV_FUSION_BACKEND,
    MODEL_QKV_FUSION_ON,
    MODEL_QKV_FUSION_OFF
} ModelQkvFusion;
void model_set_qkv_fusion(ModelQkvFusion fusion);
// Whether layers on `ops` fuse them where they can, as the setting stands.
bool model_qkv_fusion_on(const OpsBackend *ops);
// Whether a forward that no backward follows gives a layer's RMSNorms to the products that
// read them (ops.h's InputRmsNorm; model/transformer.c, layer_folds_norm): true unless
// MARLHF_UNFOLDED_NORMS=1 (read once; a value other than 0 or 1 is a user error).
bool model_norms_folded(void);
// Frees the activation memory (the next forward allocates it again).
void model_release_activations(Model *model);
// A linear layer's product with its weight, float32 or quantized (`quantized` NULL or without
// values: the float32 `weight`), and its backward (transformer.c; model/lora.c uses them for a
// DoRA adapter's base product on a dropped input).
void model_linear_forward(const Model *model, float *out, const float *inp, const float *weight,
                          const Q8Matrix *quantized, const float *bias, long N, int IC, int OC, long kernel_rows);
void model_linear_backward(const Model *model, float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const Q8Matrix *quantized, long N, int IC, int OC,
                           WriteMode dinp_mode);

// Forward through the body and the final norm. Saves what backward needs when the model
// has gradients enabled.
void model_forward(Model *model, const ModelBatch *batch);
// The training passes of one micro-batch: between these two calls every model_forward (and
// the backward after it) draws LoRA dropout's masks (model->lora.dropout) and NEFTune's
// noise (model->neftune_noise_alpha) from `seed` and the micro-batch's place in the run, so
// micro-batch `micro_batch` of epoch `epoch` draws the same numbers on any rank and after a
// resume; each forward of the pass its own. Nothing happens on a model without gradients or
// with neither.
void model_training_pass_begin(Model *model, uint64_t seed, uint64_t epoch, uint64_t micro_batch);
void model_training_pass_end(Model *model);
// After model_forward: logp[b*T+t] = log p(targets[b*T+t] | tokens up to t), or 0 where
// targets[...] < 0. top1 (argmax next token) and entropy are optional (NULL). Without top1,
// the LM head runs on the slots with a target only (entropy is 0 at the others): prompt and
// padding slots cost nothing.
void model_logprobs(Model *model, const int *targets, float *logp, int *top1, float *entropy);
// After model_logprobs on the same forward: collision[b*T+t] = -log sum_v p_v^2, the Renyi
// entropy of order 2 of the next-token distribution at slot t (WPO's weights, train/dpo.c),
// at every slot model_logprobs ran the head on (those with a target, or all) and 0 at the
// others. Not differentiable (no backward).
void model_collision_entropy(Model *model, float *collision);
// After model_forward: the raw logits of row i (i = b*T + t), host copy into out[V].
void model_logits_row(Model *model, int i, float *out);
// After model_forward: values[b*T+t] = value head at slot t.
void model_values(Model *model, float *values);
// After model_forward: the final hidden states (the final norm's output, the heads' input)
// of row b's slots [first, first + count), host copy into out[count * hidden_size]
// (sentence embeddings, model/pooling.h).
void model_hidden_slots(Model *model, int b, int first, int count, float *out);
// Backward of loss = sum dlogp*logp + sum dentropy*entropy + sum dvalue*value, into the
// gradients (accumulated). dlogp/dentropy need a model_logprobs call first (same targets);
// dvalue needs model_values. Any of the three may be NULL.
void model_backward(Model *model, const float *dlogp, const float *dentropy,
                    const float *dvalue);

// ---- generation: the KV cache (model/kv_cache.c) ----

// Keys and values of every layer for rows being generated. Prompts are left-padded, so
// every row's next token goes to the same slot `length`; row b's real tokens start at
// slot row_start[b].
typedef struct {
    int capacity_B, capacity_T;
    int B;          // rows in use (set by the prefill)
    int length;     // slots filled
    KvCacheType type; // the model's kv_cache_type when made
    // [num_layers], each [capacity_B, capacity_T] slots of n_kv_heads * head_dim floats or
    // halves, or of one Q8_0 record (ops/ops.h kv_q8_slot_bytes)
    void **k, **v;
    int *row_start; // [capacity_B], host
} KvCache;

// A cache of the model's kv_cache_type.
void kv_cache_init(KvCache *cache, const Model *model, int B, int T);
// --kv-cache: "f32" (or NULL), "f16" or "q8_0" (inference: the caches made from then on
// hold half floats, or Q8_0 blocks of each head's keys and values -- half, or a little over
// a quarter, of the memory and of the bytes each decode step reads; the prompt's own
// attention stays float32). Refused (-1, err_set naming `option`) on a backend without the
// type's ops, or for another value. model NULL: the value is checked, nothing set.
int kv_cache_type_set(Model *model, const char *type, const char *option);
// The name --kv-cache gives a type ("f32", "f16", "q8_0").
const char *kv_cache_type_name(KvCacheType type);
// Bytes of one slot (one token's keys, or its values, in one layer) of a cache of `type`.
long kv_cache_slot_bytes(const Model *model, KvCacheType type);
// Whether the model's backend can attend from several new slots per row to a cache of the
// model's type (model_extend_rows: the prompt cache).
bool kv_cache_can_extend(const Model *model);
void kv_cache_free(KvCache *cache, const Model *model);
// Forgets the cached tokens (the memory stays).
void kv_cache_reset(KvCache *cache);
// After a prefill of U rows: row b of B (B <= capacity_B) becomes a copy of row source[b]
// (its slots and its left padding). source[b] <= b for every b, so the copy can run in
// place, last row first. For rows that share a prompt (several answers to one prompt).
void kv_cache_expand_rows(KvCache *cache, const Model *model, const int *source, int B);
// Row `to` becomes a copy of row `from` (its filled slots [row_start, length), and its
// row_start); other rows stay as they are.
void kv_cache_copy_row(KvCache *cache, const Model *model, int to, int from);
// Copies `count` slots from slot from_slot of row from_row of one cache to slot to_slot of
// row to_row of another (or the same: then the rows must differ) of the same element type.
void kv_cache_copy_slots(KvCache *to, int to_row, int to_slot, const KvCache *from, int from_row, int from_slot,
                         int count, const Model *model);
// Moves the filled slots of rows [0, cache->B) by `shift` slots (negative: towards slot 0)
// into new buffers of capacity_B rows of capacity_T slots (the same sizes or others):
// row_start and length move with them. Every row's slots must land inside the new sizes.
void kv_cache_relayout(KvCache *cache, const Model *model, int capacity_B, int capacity_T, int shift);

// Runs the batch's tokens at cache slots [cache->length, cache->length + T) and stores
// their keys and values: a prefill (empty cache; batch->row_start gives the left padding)
// or a decode step (T == 1; the rows keep the row_start of their prefill).
void model_forward_cached(Model *model, const ModelBatch *batch, KvCache *cache);
// Continuous batching (gen/continuous.h): prefills the batch's B rows (left-padded by
// batch->row_start) into rows [first_row, first_row + B) of a cache whose other rows are
// being decoded, at the slots [cache->length - T, cache->length) that end where the others'
// next token goes; each row's row_start is set there. cache->length and cache->B stay as
// they are (the caller adds the rows to the decoded ones). model_last_logits gives the
// B rows' next-token logits.
void model_prefill_rows(Model *model, const ModelBatch *batch, KvCache *cache, int first_row);
// The same for rows that already hold a cached prefix (marlhf serve's prompt cache): the
// batch's T tokens per row (no padding) go to slots [cache->length - T, cache->length) of
// rows [first_row, first_row + B), whose row_start and earlier slots the caller has set;
// they attend to those slots and to each other. model_last_logits gives each row's
// next-token logits.
void model_extend_rows(Model *model, const ModelBatch *batch, KvCache *cache, int first_row);
// After a forward: the logits of each row's last slot (T-1), into logits[B * V] (host).
void model_last_logits(Model *model, float *logits);
// After a forward: each row's most likely next token (the first of its largest last-slot
// logits) and that token's log-prob, found where the logits are (the backend's
// logprob_forward), so that B tokens and B floats come to the host instead of the [B, V]
// logits: greedy decoding's step. On the CPU the same token and float as sampler_pick at
// temperature 0 on model_last_logits' row; on the GPU the log-prob's sum runs in another
// order (ops/cuda/logprob_rows.cuh).
void model_last_greedy(Model *model, int *tokens, float *logprobs);
// After a forward: what a sampler with top-k needs of each row's last-slot logits, found
// where the logits are (the backend's sampling_candidates) so that only that comes to the
// host: the tokens whose logit scaled by inv_temperature[b] is at least the top_k[b]-th
// largest (0 < top_k[b] < V; ties all in; top_k 1 and inv_temperature 1 for a greedy row),
// ascending id, counts[b] of them at ids and values + b * capacity (their raw logits), and
// lse[b], the whole row's log-normaliser (sampler_pick_candidates takes all three), and
// when scaled_lse is not NULL scaled_lse[b], the scaled row's (top-p from the candidates:
// sampler_candidates_hold_nucleus). Returns false, with nothing defined, when a row has
// more than `capacity` candidates (ties): the caller then takes model_last_logits.
bool model_last_candidates(Model *model, const float *inv_temperature, const int *top_k, int capacity, int *counts,
                           int *ids, float *values, double *lse, double *scaled_lse);
// After a forward, on a backend that samples whole rows (OpsBackend.samples_whole_rows: the
// GPU): each row's draw over the whole vocabulary at inv_temperature[b] and uniform[b]
// (ops.h sample_rows: sampler_pick's rule in the backend's arithmetic), its token and its
// log-probs under the model and under the sampled distribution, so that the logits stay
// where they are. Returns false, doing nothing, on a backend that does not (the CPU: the host
// sampler on model_last_logits is its reference).
bool model_last_sampled(Model *model, const float *inv_temperature, const double *uniform, int *tokens,
                        float *logprobs, float *sampling_logprobs);

// Number of parameters (the whole table).
long model_num_params(const Model *model);

// The trainable part of the flat buffer: grads[i] is the gradient of
// params[trainable_offset + i]; optimizers and gradient sums cover this many floats.
static inline long model_trainable_floats(const Model *model) {
    return model->table.total - model->trainable_offset;
}
// Where params[trainable_offset] of the table's layout lives in the backend buffer. Only entries
// of the frozen base are ever unstored, so the trainable tail is laid out in model->params as in
// the table, shifted by what was left out before it (table.total - table.stored_total).
static inline long model_trainable_stored(const Model *model) {
    return model->trainable_offset ? model->trainable_offset - (model->table.total - model->table.stored_total) : 0;
}
static inline float *model_trainable_params(const Model *model) { return model->params + model_trainable_stored(model); }
// Copies the floats [0, count) of the table's layout between the backend buffer and `host` (a host
// buffer in the table's layout; count an entry's offset or table.total): entry by entry where
// entries are unstored (their floats in `host` read as zeros, and are not written), in one copy
// where none is. model_params_to_device also binds model->weights to the buffer.
void model_params_to_host(const Model *model, float *host, long count);
void model_params_to_device(Model *model, const float *host, long count);
// Entries [0, model_base_entries) of the table are the model's own tensors, the rest LoRA adapters.
static inline int model_base_entries(const Model *model) {
    return model->lora.rank > 0 ? model->lora_first_entry : model->table.count;
}
