// marlhf.h: the embedding API of marlhf, for programs that link the library instead of
// running the `marlhf` command (build/libmarlhf.a or build/libmarlhf.so, `make lib`).
//
// What it offers: load a Hugging Face folder or a GGUF file; tokenize; generate (with the
// model's chat template or on plain text); the log-probability of a response; a reward
// model's score; and on-device preference learning: DPO steps (on pairs) and KTO steps (on
// completions marked good or bad) that train LoRA adapters on the loaded model, with the
// model's own frozen weights (the adapters switched off) as the reference, so no second copy
// of the model is held. The trained model generates with its adapters at once and saves as
// a Hugging Face folder (adapters merged, and the PEFT adapter alone in its adapter/
// subfolder).
//
// Conventions:
//  - Functions that can fail return -1 (or NULL) and leave a one-line message for
//    marlhf_last_error(); they never exit the process. Broken invariants inside the library
//    (out of memory, a bug) still abort with the file and line, as in the command.
//  - Strings are UTF-8 and NUL-terminated; the strings the library returns are freed with
//    marlhf_free().
//  - One model is used by one thread at a time; separate models may be used from separate
//    threads. The compute itself is parallel (OpenMP; marlhf_set_threads).
//  - The same inputs, seed and thread count give the same bits, as the command does.
//  - Parameter structs are obtained from their *_default_params() function and then
//    changed field by field, so that fields added later get their defaults.
//
// docs/embedding.md describes it with an example (examples/preference_loop.c).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Grows with every change of a struct's layout (fields are only ever added at the end; the
// *_default_params() functions return structs by value): a program must link the library
// of its own header's version.
#define MARLHF_API_VERSION 3

#if defined(__GNUC__)
#define MARLHF_API __attribute__((visibility("default")))
#else
#define MARLHF_API
#endif

typedef struct marlhf_model marlhf_model;
typedef struct marlhf_trainer marlhf_trainer;

// ---- the library ------------------------------------------------------------------------

// MARLHF_API_VERSION of the library linked (compare with the header's).
MARLHF_API int marlhf_api_version(void);
// The message of the last failed call of this thread ("" if none).
MARLHF_API const char *marlhf_last_error(void);
// CPU threads for all later calls (0: one per core).
MARLHF_API void marlhf_set_threads(int threads);
// The row-invariant CPU forward for all later calls (the command's --batch-invariant;
// docs/lora.md, "One policy"): non-zero computes each output of the linear layers in one
// fixed order, so a response's log-prob is the same bits scored alone or with others in a
// batch (slower; docs/benchmarks.md); zero is the default sgemm path. Process-wide, like
// marlhf_set_threads: call it before the first model is used, not while another thread runs
// one. The environment's MARLHF_CPU_MATMUL=batch-invariant is the same; when it is set and
// says otherwise the call fails. A trainer's checkpoints record the setting and
// marlhf_trainer_resume refuses another; a policy or reward model on "cuda" is refused
// while it is on (the GPU has no such kernel). Returns 0 or -1. (No struct changes:
// MARLHF_API_VERSION stays 2.)
MARLHF_API int marlhf_set_batch_invariant(int on);
// Frees a string returned by the library (NULL is allowed).
MARLHF_API void marlhf_free(void *pointer);

// ---- models -------------------------------------------------------------------------------

typedef enum {
    MARLHF_POLICY = 0,       // a causal LM (generation, log-probs, DPO and KTO)
    MARLHF_REWARD_MODEL = 1, // a reward model: the file must hold a value head ("score.weight")
} marlhf_model_kind;

typedef struct {
    marlhf_model_kind kind;
    const char *device;        // "cpu" (NULL means cpu) or "cuda" when the library has it
    const char *lora_adapter;  // policy: a saved adapter applied on load (a marlhf model folder
                               // with adapter/, or a PEFT adapter folder); NULL for none
    const char *chat_template; // policy: a family name or template file; NULL: the model's own
    const char *quantize;      // policy: NULL or "none" (float32), "q8_0", "q4_0", "nf4" or "nf4-single": 8- or 4-bit
                               // linear layers for generation and log-probs (and every other
                               // name --quantize takes: q4_k_m, q2_k, iq4_xs..., docs/quantization.md). Such a policy may take a trainer: its
                               // LoRA adapters then train over the frozen quantized base (QLoRA,
                               // the command's --quantize; with use_dora: QDoRA), and it saves once it
                               // has them (the dequantized base with the adapters merged, and
                               // adapter/); without adapters it cannot be saved
} marlhf_model_params;

MARLHF_API marlhf_model_params marlhf_model_default_params(void);
// `path`: a Hugging Face folder (config.json, *.safetensors, tokenizer.json) or a .gguf file.
MARLHF_API marlhf_model *marlhf_model_load(const char *path, const marlhf_model_params *params);
// Frees the model (and a trainer still attached to it).
MARLHF_API void marlhf_model_free(marlhf_model *model);
// Writes the model as a Hugging Face folder at `dir` (with its tokenizer). The folder
// appears complete or not at all, and an existing folder at `dir` is an error: nothing
// saved before is overwritten.
MARLHF_API int marlhf_model_save(marlhf_model *model, const char *dir);

// The model's vocabulary: token ids are in [0, marlhf_vocab_size). It may exceed the
// tokenizer's (padded embedding rows).
MARLHF_API int marlhf_vocab_size(const marlhf_model *model);
// Token ids of `text` (with the tokenizer's special tokens, e.g. BOS, when add_special is
// non-zero). Writes at most `capacity` ids and returns how many the text has (call again
// with a larger buffer when that exceeds capacity), or -1.
MARLHF_API int marlhf_tokenize(const marlhf_model *model, const char *text, int add_special, int *ids, int capacity);
// The text of `count` ids (special tokens left out when skip_special is non-zero), or NULL.
MARLHF_API char *marlhf_detokenize(const marlhf_model *model, const int *ids, int count, int skip_special);

// ---- generation ---------------------------------------------------------------------------

typedef struct {
    int chat;             // non-zero: `prompt` is a user message, rendered by the chat template
    const char *system;   // chat: an optional system message (NULL: none)
    int max_new_tokens;   // 256
    int min_new_tokens;   // 0: no end of text before this many tokens
    float temperature;    // 0.7; 0 is greedy
    int top_k;            // 50; 0 is off
    float top_p;          // 1 (off)
    uint64_t seed;        // 1234: the output depends only on the prompt, the model and the seed
} marlhf_generate_params;

MARLHF_API marlhf_generate_params marlhf_generate_default_params(void);
// The response to `prompt` (without its stop token), or NULL. A NUL byte the model
// generates (possible with byte-level tokenizers) ends the returned C string.
MARLHF_API char *marlhf_generate(marlhf_model *policy, const char *prompt, const marlhf_generate_params *params);
// Responses to `count` prompts, generated together through the KV cache (faster than one
// call each): responses[i] (free each with marlhf_free) is what `marlhf generate` gives the
// i-th of these prompts with the same seed — row i draws from its own random stream, so it
// does not depend on the other prompts (and responses[0] equals marlhf_generate's answer to
// prompts[0]). Returns 0, or -1 with nothing allocated.
MARLHF_API int marlhf_generate_batch(marlhf_model *policy, const char *const *prompts, int count,
                                     const marlhf_generate_params *params, char **responses);

// ---- scoring ------------------------------------------------------------------------------

// The sum of the log-probabilities of `response` followed by the end-of-text token, after
// `prompt` (with the tokenizer's special tokens), as SFT and DPO score a response. `tokens`
// (may be NULL) receives the number of response tokens summed. Returns 0 or -1.
MARLHF_API int marlhf_logprob(marlhf_model *policy, const char *prompt, const char *response, double *sum,
                              int *tokens);
// A reward model's score of `response` after `prompt` (the value head at the end-of-text
// token, as `marlhf rm` trains it). Returns 0 or -1.
MARLHF_API int marlhf_reward(marlhf_model *reward_model, const char *prompt, const char *response, float *score);

// ---- on-device preference learning (LoRA adapters; DPO on pairs, KTO on thumbs up/down) ----

// A trainer puts fresh LoRA adapters on a policy and keeps an AdamW optimizer for them; the
// policy's own frozen weights (adapters off) are the reference of every step. Its steps
// learn from pairs (marlhf_dpo_step) or from single completions marked good or bad
// (marlhf_kto_step), in any mix; the policy generates with what it learned at once.
typedef struct {
    // DPO family (marlhf_dpo_step)
    const char *loss;       // "sigmoid" (DPO) | "sigmoid-norm" | "robust" | "exo" | "ipo" | "hinge" | "nca" | "bco" |
                            // "sppo-hard" | "apo-zero" | "apo-down" | "discopop" | "cpo" | "simpo" | "orpo" (these
                            // three: no reference); docs/dpo.md
    double beta;            // 0.1: the KL strength of DPO and of KTO
    double label_smoothing; // sigmoid: conservative DPO's epsilon; robust, exo (> 0), cpo, simpo: theirs (0)
    double simpo_gamma;     // simpo: target margin (0.5)
    double sft_weight;      // > 0: plus this times the chosen response's NLL (RPO) (0)
    // KTO (marlhf_kto_step)
    double desirable_weight, undesirable_weight; // 1, 1
    // the adapters and the optimizer
    int lora_rank;          // 8
    double lora_alpha;      // 0: the rank
    const char *lora_modules; // "all-linear" or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
    double learning_rate;   // 5e-5, constant
    double weight_decay;    // 0
    double max_grad_norm;   // 1 (0: no clipping)
    int max_seq_len;        // 512: longer prompt + response rows are cut
    int micro_batch;        // 4: pairs (or examples) per forward/backward (memory, not the result's maths)
    uint64_t seed;          // 1234: the adapters' initialisation (and lora_dropout's masks)
    // KTO (marlhf_kto_step), added last: "kto" (NULL: the same) | "apo-zero-unpaired" (no KL
    // baseline, so a step may take a single example: one thumbs up or down at a time)
    const char *kto_loss;
    // DPO, added last: discopop's temperature (0: TRL's 0.05); the f-divergence to the
    // reference, "reverse-kl" (NULL: the same, plain DPO) | "forward-kl" | "js" | "alpha",
    // and alpha's coefficient (0.5 in the defaults)
    double discopop_tau;
    const char *f_divergence;
    double f_alpha;
    // the adapters, added last: non-zero scales them by lora_alpha / sqrt(lora_rank) (rsLoRA,
    // PEFT's use_rslora) instead of lora_alpha / lora_rank
    int lora_rslora;
    // DPO, added last: LD-DPO's weight of the longer response's tokens past the shorter
    // one's length, in (0, 1] (0: plain DPO, as 1)
    double ld_alpha;
    // DPO, added last: loss "cpo", "cpo-hinge", "cpo-ipo" and "simpo" (TRL's CPOTrainer): plus
    // this times the mean negative log-likelihood of the step's chosen tokens, CPO's behaviour
    // cloning (TRL's cpo_alpha); negative (the defaults' -1): the loss's own default, 0 for
    // simpo and alphapo, 1 for the others
    double cpo_alpha;
    // the adapters, added last (API version 2; the command's --lora-rank-pattern,
    // --lora-alpha-pattern, --use-dora and --lora-dropout, docs/lora.md), zero for none:
    // per-module ranks and alphas, PEFT's rank_pattern / alpha_pattern: "KEY=VALUE,KEY=VALUE"
    // or a JSON object, each key a regular expression matched against the module names as
    // PEFT matches it; modules no key selects keep lora_rank and lora_alpha (NULL: none)
    const char *lora_rank_pattern;
    const char *lora_alpha_pattern;
    // non-zero: DoRA (PEFT's use_dora), a trained magnitude per output row of each adapted
    // weight; refused on a policy loaded with quantize (it needs the float32 base)
    int use_dora;
    // PEFT's lora_dropout, in [0, 1): each adapter's input is dropped with this probability in
    // the steps' training passes (0: none, as the command's dpo and kto); the masks are drawn
    // from `seed`, the trainer's step count before the step and the micro-batch's index in
    // it, as the command draws them from --seed, the epoch and the micro-batch's index in it
    double lora_dropout;
    // DPO, added last (API version 2): AlphaPO's reward shape for TRL's CPOTrainer losses
    // (cpo, cpo-hinge, cpo-ipo, simpo, alphapo; the command's --alphapo-alpha, TRL's alpha):
    // each response's reward is (1 - p^-alpha) / alpha of its probability instead of log p.
    // 0: log p; loss "alphapo" needs it non-zero
    double alphapo_alpha;
    // the adapters, added last (API version 3; the command's --lora-modules-regex and
    // --lora-layers, docs/lora.md), NULL for none: PEFT's target_modules as a regular
    // expression, matched whole against each linear module's name ("model.layers.3.self_attn.
    // q_proj"), in place of lora_modules (leave that "all-linear"); and PEFT's
    // layers_to_transform, layer indices and ranges separated by commas ("0,1,8-11"), only
    // those layers' modules adapted
    const char *lora_modules_regex;
    const char *lora_layers;
} marlhf_trainer_params;

typedef struct {
    const char *prompt, *chosen, *rejected;
} marlhf_preference;

typedef struct {
    const char *prompt, *completion;
    int desirable;          // non-zero: a thumbs up; zero: a thumbs down
} marlhf_feedback;

typedef struct {
    long step;              // optimizer steps taken so far (this one included)
    double loss;            // mean over the step's pairs
    double accuracy;        // fraction of pairs whose chosen implicit reward is the higher
    double margin;          // mean chosen minus rejected implicit reward
    double chosen_reward, rejected_reward; // means of beta log(policy / reference)
    double grad_norm;       // before clipping
    int pairs;              // pairs used (a pair whose prompt fills max_seq_len is skipped)
} marlhf_dpo_stats;

typedef struct {
    long step;              // optimizer steps taken so far (this one included)
    double loss;            // mean over the step's examples
    double kl;              // the KL baseline z0 of the step (docs/kto.md)
    double accuracy;        // fraction of examples on their side of the baseline
    double grad_norm;       // before clipping
    int examples;           // examples used
} marlhf_kto_stats;

MARLHF_API marlhf_trainer_params marlhf_trainer_default_params(void);
// Adds fresh LoRA adapters to `policy` (which must have none) and an AdamW optimizer for
// them; on a policy loaded with quantize, over its quantized base (QLoRA). NULL on error,
// the model unchanged.
MARLHF_API marlhf_trainer *marlhf_trainer_new(marlhf_model *policy, const marlhf_trainer_params *params);
// One optimizer step on `count` pairs (the mean of their losses). `stats` may be NULL.
MARLHF_API int marlhf_dpo_step(marlhf_trainer *trainer, const marlhf_preference *pairs, int count,
                               marlhf_dpo_stats *stats);
// One KTO optimizer step on `count` >= 2 labelled completions (the mean of their losses; the
// KL baseline pairs each prompt with the next example's completion), or on `count` >= 1
// with kto_loss "apo-zero-unpaired" (then stats->kl is NaN). `stats` may be NULL.
MARLHF_API int marlhf_kto_step(marlhf_trainer *trainer, const marlhf_feedback *examples, int count,
                               marlhf_kto_stats *stats);
// Frees the optimizer; the adapters stay on the model as trained.
MARLHF_API void marlhf_trainer_free(marlhf_trainer *trainer);

// Exact resume across process restarts. marlhf_trainer_save writes the trainer's state —
// adapters, AdamW moments, step — as RUN_DIR/checkpoint-<step> (written aside and renamed:
// a crash leaves the previous checkpoints whole; the two newest are kept).
// marlhf_trainer_resume restores the newest one onto `policy`, which must be loaded from
// the same base weights (and quantize) as when it was saved (checked) and carry no
// adapters; `params` as for marlhf_trainer_new, with the checkpoint's LoRA rank, alpha,
// modules, scaling, patterns, DoRA and dropout (checked). The steps
// that follow are the steps an uninterrupted trainer would have taken, bit for bit. On
// failure the model is left as it was.
MARLHF_API int marlhf_trainer_save(marlhf_trainer *trainer, const char *run_dir);
MARLHF_API marlhf_trainer *marlhf_trainer_resume(marlhf_model *policy, const marlhf_trainer_params *params,
                                                 const char *run_dir);

#ifdef __cplusplus
}
#endif
