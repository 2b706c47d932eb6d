// The supervised training loop shared by SFT and reward-model training: epochs over a
// shuffled dataset, micro-batches with gradient accumulation, the LR schedule, gradient
// clipping, AdamW, periodic evaluation, metrics, checkpoints and exact resume.
//
// A task (train/sft.c, train/rm.c) supplies what differs: how a micro-batch of examples
// becomes a forward/backward pass and a loss, how much each example weighs in the
// optimizer step's mean (tokens for SFT, pairs for RM), and how to evaluate.
//
// Exact resume: the data order of epoch e is a pure function of (seed, e); the state
// saved with each checkpoint (optimizer step, epoch, micro-batch cursor, AdamW moments,
// weights, and the task's own state if it has any: TrainTask.save_state) is all the loop
// carries from one step to the next. A run killed at any moment and resumed from its
// newest checkpoint ends with weights bit-identical to a run that was never interrupted
// (same thread count).
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/lr_schedule.h"

typedef struct {
    double learning_rate;
    LrScheduleKind schedule;
    double warmup_ratio; // used when warmup_steps < 0
    long warmup_steps;
    long epochs;
    long max_steps;      // > 0: stop after this many optimizer steps
    long micro_batch;    // examples per forward/backward
    long grad_accum;     // micro-batches per optimizer step
    double clip_norm;    // <= 0: no clipping
    double weight_decay;
    double beta1, beta2, eps;
    long eval_every;     // optimizer steps between evaluations (0: only per epoch)
    long save_every;     // optimizer steps between checkpoints (0: only at the end)
    long keep_last;      // checkpoints kept (0: all)
    long log_every;      // optimizer steps between metric lines
    uint64_t seed;
    // Each epoch's shuffled order regrouped so that examples of like lengths share micro-batches
    // (Hugging Face's group_by_length: less padding); needs TrainTask.example_length.
    bool group_by_length;
    const char *run_dir;
    bool resume;         // continue from the newest checkpoint of run_dir
    bool quiet;          // no progress bar
    // Under mpirun: 1 shards the AdamW moments across ranks, 2 the gradients too, 3 the layers'
    // weights too (dist/zero.h).
    int zero_stage;
    // A saved LoRA adapter read into the model's adapters (added, shaped as the file's) after
    // the weights are started: under ZeRO-3 its base fingerprint is known only then
    // (model_add_lora_of_adapter). NULL: the adapters are the model's as given.
    const char *start_adapter;
} TrainOptions;

typedef struct {
    double loss_sum;    // summed over the micro-batch (divided by the step's weight later)
    double weight;      // the micro-batch's share of the step's mean (tokens, pairs)
    double tokens;      // tokens processed (for throughput)
    double metric_sums[4]; // task-specific sums (e.g. correct pairs), reported per step
} MicroStepResult;

typedef struct {
    const char *names[8];
    double values[8];
    int count;
} EvalResult;

typedef struct {
    const char *name; // "sft", "rm"
    long num_examples;
    const char *metric_names[4]; // names of metric_sums (NULL-terminated, may be empty)
    // The weight of a micro-batch, known before its forward pass, so that gradients can be
    // scaled by 1 / (weight of the whole optimizer step) as they are accumulated.
    double (*weight)(void *context, const long *examples, int count);
    // Forward + backward over the examples with loss gradients scaled by `scale`.
    void (*micro_step)(void *context, Model *model, const long *examples, int count, double scale,
                       MicroStepResult *result);
    // Evaluation on held-out data (no gradients); may be NULL.
    void (*evaluate)(void *context, Model *model, EvalResult *result);
    // Optional (NULL when the task has none): called before the micro-steps of every
    // optimizer step with all the step's examples, on every rank: micro-batch m is
    // examples[m * micro_batch, ...) (the last one may be shorter) and rank m mod W runs it.
    // For a task whose micro-batches depend on each other (BCO's running reward mean,
    // train/kto.c), which under mpirun must see the other ranks' micro-batches of the step.
    void (*begin_step)(void *context, Model *model, const long *examples, long count, long micro_batch);
    // Optional: run once on every rank with the starting weights, before a resume's weights
    // are read (after its trainer state: load_state, which may have given back what prepare
    // would compute) and before the first step: DPO's and KTO's reference log-probs from the
    // policy itself. The model is as it trains (under ZeRO-3 already sharded, so its
    // passes are collectives and it drains them, as train/response_logps.c does).
    void (*prepare)(void *context, Model *model);
    // Optional: state the task carries from one step to the next (BCO's running reward
    // mean), written into every checkpoint's trainer state and read back by --resume, so a
    // resumed run is the same run. load_state returns 0, or -1 with err_set() naming
    // `checkpoint` (the folder the state was read from).
    void (*save_state)(void *context, json_t *state);
    int (*load_state)(void *context, const json_t *state, const char *checkpoint);
    // Optional: the task's own files beside the final model (the reward model's score
    // statistics, train/rm.h), written by rank 0 into the folder being made before it is
    // committed, so RUN_DIR/final appears whole or not at all. Returns 0 or -1 (err_set).
    int (*write_final)(void *context, Model *model, const char *dir);
    // Optional: the largest batch the task's forwards on the trained model will run in the
    // steps -- micro-steps of at most `micro_batch` examples, and its evaluation -- as rows
    // and the longest row in tokens (`prepare` runs before and releases what it used;
    // write_final's forwards come after the last step). train_run sizes the model's
    // activations for it before the first step (model_reserve): the memory's peak is reached
    // before the run starts, where an out-of-memory costs nothing, and no batch with a longer
    // row makes them again mid-run (on a GPU each remake frees and allocates device memory,
    // and cudaFree waits for the device).
    void (*largest_batch)(void *context, long micro_batch, int *rows, int *length);
    // Optional: training example i's length in tokens (its longest row), for
    // TrainOptions.group_by_length; NULL: the task cannot be grouped by length.
    int (*example_length)(void *context, long example);
    // Optional: run on every rank after each optimizer step (`step`: the steps taken so far,
    // this one included), before that step's evaluation and checkpoint: TR-DPO's reference
    // update (train/dpo.c).
    void (*after_step)(void *context, Model *model, long step);
    // Optional (NULL: none): a second model written whole into every checkpoint, in the
    // subfolder checkpoint_model_name, for the task's command to read back on --resume
    // (TR-DPO's moving reference). Rank 0's copy is written: every rank must hold the same.
    const char *checkpoint_model_name;
    const Model *checkpoint_model;
    void *context;
} TrainTask;

// The trainer state of the checkpoint a run with these options resumes from (the newest in
// run_dir), or NULL when it does not resume or that state cannot be read: for what a caller
// takes from it before train_run (DPO's and KTO's --reference-model sums, so the reference
// model is freed before the trained model's gradients and moments are made). json_decref it.
json_t *train_resume_state(const TrainOptions *options);

// Runs the loop on `model` (gradients are enabled here). The final model is written to
// RUN_DIR/final (with the tokenizer). Returns 0, or -1 with err_set().
int train_run(const TrainTask *task, Model *model, const Tokenizer *tokenizer, const TrainOptions *options);

// The order of the examples in epoch `epoch`: a Fisher–Yates shuffle driven by the
// counter-based RNG, so it depends on (seed, epoch, n) only.
void train_epoch_order(uint64_t seed, long epoch, long n, long *order);
// Hugging Face's LengthGroupedSampler on a shuffled `order` of n examples: cut into
// megabatches of batch * min(n / (4 batch), 50) examples (at least one batch), each sorted
// longest first (a stable sort: ties keep their shuffled order), then the longest example of
// all swapped to the front (the first megabatch's first place), so the first micro-batch is
// the largest and an out-of-memory shows at once. lengths[i]: example i's length.
void train_group_by_length(long *order, long n, const int *lengths, long batch);

// Defaults: lr 5e-5 cosine, warmup ratio 0.1, 1 epoch, micro-batch 4, no accumulation,
// clip 1.0, weight decay 0.01, betas (0.9, 0.95), eps 1e-8, keep 2 checkpoints.
TrainOptions train_default_options(void);
