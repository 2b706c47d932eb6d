// Direct preference optimization (DPO; Rafailov et al. 2023), and its IPO and hinge
// variants, as a task for the shared training loop (train/loop.h): the policy learns from
// chosen/rejected pairs directly, against a frozen reference, with no reward model and no
// sampling. DeepSpeed-Chat's step2_dpo_finetuning, TRL's DPOTrainer, OpenRLHF's train_dpo.
//
// A pair is two rows, prompt + chosen + EOS and prompt + rejected + EOS, tokenized as SFT
// examples (train/sft.h). Each row's score is the sum of its response tokens' log-probs
// (EOS included), under the policy (trained) and the reference (frozen); the loss of a pair
// is train/losses.h's dpo_pair_loss, and a step's loss is the mean over its pairs.
//
// --sft-weight w adds w times the chosen response's mean negative log-likelihood to each
// pair's loss (RPO, Pang et al. 2024; TRL's loss_type ["sigmoid", "sft"] with weights
// [1, w], which averages over the batch's chosen tokens instead of per pair; OpenRLHF's
// --nll_loss_coef).
//
// Several losses combine (TRL's loss_type list and loss_weights, e.g. the MPO recipe
// sigmoid 0.8 + bco_pair 0.2 + sft 1): each pair's loss is the weighted sum, and TRL's "sft"
// term is the mean -log-prob over all the micro-batch's chosen response tokens, which TRL
// gives every pair. --use-weighting (WPO, Zhou et al. 2024; TRL's use_weighting) multiplies
// each pair's loss, the sft term's share too, by w_c w_r, a row's w the exp of the mean over
// its response tokens of log p(token) - log sum_v p_v^2 under the policy, detached.
//
// AOT (--loss aot, aot-unpaired; TRL 1.12) sorts the log-ratios across the pairs of one
// forward: the micro-batch in training (the same pairs whatever the rank count, since ranks
// take whole micro-batches), chunks of 4 pairs in evaluation (dpo_batch_loss_from_sums).
//
// SimPO (--loss simpo) has no reference at all: it compares the per-token mean log-probs of
// chosen and rejected with a margin gamma, and nothing is computed before training. ORPO
// (--loss orpo) neither: the chosen response's mean NLL plus beta times an odds-ratio term
// (train/losses.h; TRL averages its NLL over the batch's chosen tokens, here per pair).
//
// The reference never runs during training: its log-prob sums of every row, train and
// eval, are computed once before the first step (dpo_task_compute_reference), by the
// policy's starting weights (the usual reference: the SFT model) or by --reference-model
// (with --sync-ref-model, TR-DPO, again after each of the reference's updates: DpoTask.sync).
// That is TRL's precompute_ref_log_probs, here the only way: one forward over the data
// instead of one per step, and no second model in memory while training. They ride in every
// checkpoint, so --resume takes them from it (where they were made from the same rows,
// settings and reference) instead of scoring the data again.
//
// Reported (TRL's names without the "rewards/"): the implicit rewards
// beta (policy - reference) of chosen and rejected responses, their margin, and the
// accuracy (chosen reward above rejected).
#pragma once
#include "train/losses.h"
#include "train/reference_sync.h"
#include "train/sft.h"

typedef struct {
    // Two rows per pair: row 2i is pair i's chosen response, row 2i+1 its rejected one.
    TokenizedExamples train, eval;
    long train_count, eval_count; // pairs
    // Per row: the reference's sum of response-token log-probs (NaN until computed).
    double *train_reference, *eval_reference;
    int pad_id;
    DpoLossOptions options;
    long dropped;   // pairs with a row whose prompt filled max_seq_len (no response token)
    long truncated; // pairs with a row cut at max_seq_len
    // The reference is the policy's starting weights: dpo_train_task's TrainTask.prepare
    // computes the reference sums in train_run, on the model as it trains (sharded under
    // ZeRO-3). False: the caller computes them before (dpo_task_compute_reference).
    bool reference_from_policy;
    // --reference-model: the fingerprint of its weights (response_reference_fingerprint; 0
    // without one), which keys its sums in checkpoints (dpo_task_reference_model).
    uint64_t reference_fingerprint;
    // Rows the reference scored (0 when a resumed run's checkpoint held every sum:
    // dpo_train_task's save_state keeps them).
    long reference_rows_scored;
    // --sync-ref-model (TR-DPO, train/reference_sync.h): the reference held beside the policy
    // and moved towards it every sync.steps steps, after which it scores every row again.
    // sync.model NULL: a fixed reference.
    ReferenceSync sync;
} DpoTask;

// DPO_LOSS_NAMES (train/losses.h); TRL's names of the same losses (nca_pair, apo_zero...) too
int dpo_loss_from_name(const char *name, DpoLossKind *kind);
// "reverse-kl" | "forward-kl" | "js" | "alpha" (TRL's reverse_kl, forward_kl, js_divergence,
// alpha_divergence too)
int f_divergence_from_name(const char *name, FDivergence *kind);

// Tokenizes the pairs: responses[2i] (chosen) and responses[2i + 1] (rejected) after
// prompts[i], as rm_task_init takes them. Returns 0, or -1 with err_set() when no training
// pair is left.
int dpo_task_init(DpoTask *task, const Tokenizer *tokenizer, const char *const *prompts, const char *const *responses,
                  long count, const char *const *eval_prompts, const char *const *eval_responses, long eval_count,
                  int max_seq_len, const DpoLossOptions *options);
// The same from rows already tokenized (two per pair, as in DpoTask); takes them over.
int dpo_task_from_rows(DpoTask *task, TokenizedExamples *train, TokenizedExamples *eval, int pad_id,
                       const DpoLossOptions *options);
void dpo_task_free(DpoTask *task);

// Fills train_reference and eval_reference with `reference`'s sums (under mpirun each
// rank scores a share of the rows and the sums are gathered).
void dpo_task_compute_reference(DpoTask *task, Model *reference);
// --reference-model's sums: from the checkpoint a resume (`options`) starts from where it kept
// them for this model's weights, else scored now. The caller frees the model after, before
// train_run makes the policy's gradients and moments.
void dpo_task_reference_model(DpoTask *task, Model *reference, const TrainOptions *options);

// TRL's implicit rewards of a pair (logged as chosen_reward, rejected_reward; accuracy and
// margin compare them): beta (policy - reference) over the sums; with no reference, beta x
// the log-prob TRL's loss reads (CPO, cpo-hinge: the sum; SimPO, cpo-ipo, AlphaPO, ORPO: the
// per-token mean), through AlphaPO's reward shape where options->alphapo_alpha is set.
void dpo_pair_rewards(const DpoLossOptions *options, double policy_chosen, double policy_rejected, double ref_chosen,
                      double ref_rejected, int chosen_tokens, int rejected_tokens, double *chosen_reward,
                      double *rejected_reward);

TrainTask dpo_train_task(DpoTask *task);
