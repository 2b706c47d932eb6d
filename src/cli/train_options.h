// The command-line options every trainer shares (sft, rm, and the PPO optimizers), with
// the DeepSpeed-Chat / Hugging Face spellings as aliases, and loading a training dataset.
#pragma once
#include "cli/options.h"
#include "data/chat_data.h"
#include "data/dataset.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "train/loop.h"
#include "train/reference_sync.h"

// LoRA options (model/lora.h): --lora-rank, --lora-alpha, --lora-modules, or with PPO's
// "actor-" / "critic-" prefixes.
typedef struct {
    long rank;     // 0: train every weight (the default)
    double alpha;  // <= 0: equal to the rank (scale 1, DeepSpeed-Chat's lora_scaling = 1)
    char *modules; // comma-separated PEFT module names, or all-linear
    char *adapter; // start from this saved adapter (its own rank, alpha and modules)
    bool rslora;   // scale by alpha / sqrt(rank)
    bool dora;     // DoRA: a trained magnitude per output row (PEFT's use_dora)
    char *rank_pattern, *alpha_pattern; // PEFT's rank_pattern / alpha_pattern (model/lora.h), or NULL
    char *modules_regex; // PEFT's target_modules as a regex (LoraConfig.target_regex), or NULL
    char *layers;        // PEFT's layers_to_transform as "0,1,8-11", or NULL
} LoraCli;

// Adds the ten options for `prefix` ("", "actor-" or "critic-") and returns how many.
int lora_cli_options(LoraCli *cli, const char *prefix, Option *options);
// Checks the values (exit 2 naming the option) and fills `lora` (rank 0: no adapters).
void lora_cli_finish(const LoraCli *cli, const char *prefix, LoraConfig *lora);
// Exit 2 when `zero_stage` 3 meets LoRA it cannot shard: over a quantized base (`quantize`, the
// option --PREFIXquantize).
void lora_cli_check_zero_stage(const LoraConfig *lora, const char *prefix, const char *quantize, long zero_stage);
// Adds the adapters to a loaded model when lora->rank > 0, fresh or read from --lora-adapter
// (exit 2 on a bad combination), and says so on stderr unless quiet. With read_later an
// adapter's are only shaped as the file's, and read after the weights start
// (TrainOptions.start_adapter: ZeRO-3, whose sharded base's fingerprint comes then).
void lora_cli_apply(const LoraCli *cli, const LoraConfig *lora, Model *model, bool train_value_head, long seed,
                    bool quiet, bool read_later);

typedef struct {
    TrainOptions train;
    char *schedule_name;
    long micro_batch, grad_accum, epochs, max_steps, warmup_steps, eval_every, save_every, keep_last, log_every;
    long seed, max_seq_len, threads, zero_stage;
    double learning_rate, warmup_ratio, clip_norm, weight_decay, beta1, beta2, eps;
    double neftune_noise_alpha; // --neftune-noise-alpha (model.h), 0 for none
    bool resume, gradient_checkpointing, quiet, group_by_length;
    bool batch_invariant; // --batch-invariant (cli/batch_invariant.h; applied by the command after parsing)
    char *device;
    char *quantize; // --quantize: the frozen base's weights quantized under LoRA (QLoRA), or "none"
    LoraCli lora_cli;
    char *lora_dropout;           // --lora-dropout as given (NULL: the command's default)
    bool adapter_dropout_applies; // sft: by default a --lora-adapter trains with its own lora_dropout
    LoraConfig lora;
    // data
    char *data, *eval_data, *data_format, *data_split;
    char *rename_columns; // --rename-columns "old=new,..." (data/column_renames.h), or NULL
    char *chat_template; // --chat-template (NULL: the model's own, for conversational data)
    long data_phase, max_rows;
} TrainerCli;

// The defaults every trainer shares (cosine schedule, micro-batch 4, one epoch, AdamW betas
// (0.9, 0.95), clipping at 1, the two newest checkpoints kept ...) with its own learning
// rate, warmup ratio, weight decay and DeepSpeed-Chat data phase.
TrainerCli trainer_cli_defaults(double learning_rate, double warmup_ratio, double weight_decay, long data_phase);
// Fills `options` (capacity at least 43) with the shared options bound to `cli` (after
// setting the defaults given in `cli`) and returns how many it added.
int trainer_cli_options(TrainerCli *cli, Option *options);
// Checks the values and fills cli->train. Exits 2 naming the option on a bad value.
void trainer_cli_finish(TrainerCli *cli, const char *run_dir);
// Loads --data (and --eval-data), applying --data-split / --data-phase when given. Exits 2
// on error.
void trainer_cli_load_data(TrainerCli *cli, DataFormat format, Dataset *train, Dataset *eval);
// Conversational data (lists of messages, data/chat_data.h) rendered with --chat-template or
// the model's own template, and `tokenizer` set to read rendered text (no second BOS).
// Text data is left as it is; --chat-template with text data is an error. Exits 2 on error.
void trainer_cli_render_chat(const TrainerCli *cli, Tokenizer *tokenizer, const char *model_path, Dataset *train,
                             Dataset *eval);
// What the trained model's load keeps (ModelLoadOptions.keep_range): under ZeRO-3 with several
// processes each rank's shard of the layers (dist_weights_load_range: the rest never enters
// its memory), else NULL (all). A trainer that runs the model before training loads it whole
// (DPO's and KTO's reference log-probs from the policy itself).
ModelKeepRange trainer_cli_keep_range(const TrainerCli *cli);
// Cuts --max-seq-len to the context of the model at `path` (its max_position_embeddings):
// longer rows would run past the model's positions.
void trainer_cli_fit_context(TrainerCli *cli, const char *path);
// The model a trainer trains: `path` on --device with `load`'s heads, quantized as
// --quantize asks (then frozen under the adapters), the --lora-* adapters (the value head
// trained too when train_value_head) and --gradient-checkpointing. Exits 2 on error.
void trainer_cli_load_model(const TrainerCli *cli, const char *path, const ModelLoadOptions *load, bool train_value_head,
                            Model *model);
// A frozen causal-LM reference (--reference-model of dpo and kto) on --device, with the
// policy's tokenizer (`tokenizer`: the same ids spelled the same, tokenizer_check_same_ids) and
// vocabulary. Exits 2 on error.
void trainer_cli_load_reference(const TrainerCli *cli, const char *path, const Tokenizer *tokenizer, const Model *policy,
                                Model *reference);
// --sync-ref-model, --ref-model-mixup-alpha, --ref-model-sync-steps (dpo, kto; TRL's names):
// a reference that follows the policy (train/reference_sync.h).
typedef struct {
    bool enabled;
    double mixup_alpha;
    long steps;
} ReferenceSyncCli;
// TRL's defaults: alpha 0.6, every 512 steps, off.
ReferenceSyncCli reference_sync_cli_defaults(void);
// Fills options[0, 3) with the three options bound to `cli`; returns 3.
int reference_sync_cli_options(ReferenceSyncCli *cli, Option *options);
// After parsing: the values, and the refusals (alpha or steps without --sync-ref-model, a
// loss without a reference -- `loss_name` -- an adapted policy, ZeRO-3), exit 2 naming the
// option. `options`: the three entries reference_sync_cli_options filled, as parsed.
void reference_sync_cli_check(const ReferenceSyncCli *cli, const Option *options, bool loss_has_reference,
                              const char *loss_name, bool adapted, long zero_stage);
// The reference of a --sync-ref-model run, loaded and made to follow `policy` (`sync`,
// reference_sync_start): on --resume its checkpoint's REFERENCE_SYNC_FOLDER (it has moved since
// the start; a checkpoint without one is an error), else `reference_path` (--reference-model)
// or the policy's starting weights (`model_path`). Exits 2 on error.
void reference_sync_cli_load(const TrainerCli *cli, const ReferenceSyncCli *settings, const char *reference_path,
                             const char *model_path, const Tokenizer *tokenizer, const Model *policy, Model *reference,
                             ReferenceSync *sync);
// The prompts of a dataset's rows (an array of count + 1 pointers into the dataset).
const char **trainer_cli_prompts(const Dataset *d);
// The responses of each row, best first, K per row ([i*K + k]): chosen and rejected for
// K = 2, or the ranked list. A row without them exits 2 naming its line and `path`.
const char **trainer_cli_responses(const Dataset *d, int K, const char *path);
