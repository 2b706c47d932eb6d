// KTO (Ethayarajh et al. 2024): preference learning from single completions labelled
// desirable or undesirable (a thumbs up or down), with no pairs — as a task for the shared
// training loop (train/loop.h). TRL's KTOTrainer (loss_type "kto"); OpenRLHF had train_kto.
//
// An example is prompt + completion + EOS, tokenized as in SFT, and scored, like a DPO row,
// by the sum of its completion tokens' log-probs under the policy and the frozen reference
// (train/response_logps.h); r = policy - reference. Its loss (train/losses.h) compares r
// with a baseline z0, an estimate of the KL divergence of the policy from the reference:
// the mean of policy - reference over mismatched rows — each example's prompt with another
// example's completion — clamped at 0 and carrying no gradient. Pairs give one desirable
// and one undesirable example each (TRL's unpair_preference_dataset).
//
// The mismatched rows are fixed when the data is read: example i's prompt with example
// (i + 1) mod n's completion, in file order (TRL rotates the other way, i with i - 1,
// within each chunk of per_device_train_batch_size rows before shuffling; either way every
// completion appears once among the mismatched rows). So their reference log-probs, like
// the examples', are computed once before the first step (kto_task_compute_reference), and
// a resumed run is the same run. During training, z0 is estimated per micro-batch from its
// examples' mismatched rows (one extra forward, no backward), as TRL does per batch; under
// mpirun it is not gathered across ranks, so W processes remain one process with W times
// the accumulation. Evaluation estimates z0 once over all held-out examples.
//
// Two more losses on the same examples (train/losses.h, KtoLossKind), TRL's:
// - apo-zero-unpaired (KTOTrainer loss_type "apo_zero_unpaired"): KTO's loss with the
//   baseline held at 0. It needs no mismatched rows, so none are built, scored by the
//   reference or run during training (TRL sets calculate_kl=False), and one example is enough.
// - bco (the experimental BCOTrainer, Jung et al. 2024): a logistic classifier of desirable
//   vs undesirable on the implicit reward beta r, shifted by delta, the running mean of all
//   the rewards beta r seen in training (TRL's RunningMoments). As in TRL, each micro-batch
//   first adds its own rewards to the running mean, then computes its loss against the new
//   mean; evaluation uses the mean as it stands. The mean is trainer state: checkpoints
//   hold it, --resume restores it. Under mpirun a step's micro-batches are spread over the
//   ranks, so before the step every rank scores its micro-batches (one forward without
//   backward each) and the reward sums are gathered: each micro-batch then gets the delta
//   one process with W times the accumulation would give it. TRL's optional density-ratio
//   classifier (an embedding model and sklearn) is not here.
//
// Reported: the baseline (kl: z0; delta for bco; nothing for apo-zero-unpaired, which has
// none) and accuracy (the fraction of examples on their side of it: r > z0 when desirable,
// r < z0 when not; beta r against delta for bco; r against 0 for apo-zero-unpaired);
// evaluation adds the mean implicit rewards beta r of desirable (chosen_reward) and
// undesirable (rejected_reward) examples.
#pragma once
#include <stdbool.h>

#include "train/losses.h"
#include "train/reference_sync.h"
#include "train/sft.h"

typedef struct {
    TokenizedExamples train, eval;       // one row per example: prompt + completion + EOS
    TokenizedExamples train_kl, eval_kl; // row i: example i's prompt + example (i + 1) mod n's completion
    bool *train_desirable, *eval_desirable;
    long train_desirable_count, eval_desirable_count;
    // Reference log-prob sums of the rows and of the mismatched rows (NaN until computed).
    double *train_reference, *eval_reference, *train_kl_reference, *eval_kl_reference;
    int pad_id;
    KtoLossOptions options;
    long dropped;   // examples whose prompt filled max_seq_len (no completion token)
    long truncated; // examples cut at max_seq_len
    // Mismatched rows run through a model so far (reference, training, evaluation): the
    // cost of KTO's baseline, 0 for the other losses. A diagnostic; under mpirun each rank
    // counts the reference's and evaluations' rows in full though it scores a share.
    long kl_rows_scored;
    // bco: TRL's RunningMoments of the training rewards beta r, the part the loss reads —
    // their mean (delta) and how many there were. Carried across --resume.
    double bco_mean, bco_count;
    // bco under mpirun: each training example's delta in the step in progress, set before
    // the step from every rank's micro-batches (NULL on one process, where each micro-step
    // updates the mean itself).
    double *step_delta;
    // The reference is the policy's starting weights, as DpoTask.reference_from_policy; else
    // --reference-model's fingerprint, as DpoTask.reference_fingerprint (0 without one).
    bool reference_from_policy;
    uint64_t reference_fingerprint;
    // --sync-ref-model (train/reference_sync.h), as DpoTask.sync: after each update the
    // reference scores every row and mismatched row again. sync.model NULL: a fixed reference.
    ReferenceSync sync;
} KtoTask;

// "kto" | "apo-zero-unpaired" | "bco"; -1 for another name.
int kto_loss_from_name(const char *name, KtoLossKind *kind);
const char *kto_loss_name(KtoLossKind kind);

// Tokenizes the examples (completions[i] after prompts[i], desirable[i] its label) and, for
// the KTO loss, builds the mismatched rows. Returns 0, or -1 with err_set() when no training
// example is left, or for KTO fewer than two (or exactly one evaluation example): its
// baseline needs another example's completion.
int kto_task_init(KtoTask *task, const Tokenizer *tokenizer, const char *const *prompts, const char *const *completions,
                  const bool *desirable, long count, const char *const *eval_prompts,
                  const char *const *eval_completions, const bool *eval_desirable, long eval_count, int max_seq_len,
                  const KtoLossOptions *options);
// The same from rows already tokenized (one per example; prompt_lengths mark the
// completion) and their labels, which it takes over.
int kto_task_from_rows(KtoTask *task, TokenizedExamples *train, bool *train_desirable, TokenizedExamples *eval,
                       bool *eval_desirable, int pad_id, int max_seq_len, const KtoLossOptions *options);
void kto_task_free(KtoTask *task);

// Fills the reference arrays with `reference`'s sums (under mpirun each rank scores a share
// of the rows and the sums are gathered); without mismatched rows only the examples'.
void kto_task_compute_reference(KtoTask *task, Model *reference);
// --reference-model's sums: from the checkpoint a resume (`options`) starts from where it kept
// them for this model's weights, else scored now (as dpo_task_reference_model).
void kto_task_reference_model(KtoTask *task, Model *reference, const TrainOptions *options);

TrainTask kto_train_task(KtoTask *task);
