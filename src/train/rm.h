// Reward-model training: the SFT model's body plus a value head, scored at the last real
// token of prompt + response + EOS, as a task for the shared training loop.
//
// Losses (--loss):
//   pairwise  -log sigmoid(s_chosen - s_rejected)                       (default; TRL, OpenRLHF)
//   margin    -log sigmoid(s_chosen - s_rejected - margin)             (TRL's margin column, each pair's own
//             (rm_task_init's margins), or --margin for every pair)
//   dschat    DeepSpeed-Chat's token-span loss over [first difference, max end) (spec §5; compat)
//   listwise  Plackett-Luce over K >= 2 responses ranked best first
// plus, for pairwise and margin, center_rewards * (s_chosen + s_rejected)^2 (TRL's
// center_rewards_coefficient, Eisenstein et al. 2023 eq. 2: scores pulled towards mean zero).
// Evaluation: pairwise accuracy (s_chosen > s_rejected; for listwise, best above all
// others), mean chosen and rejected scores, and the loss.
#pragma once
#include "train/sft.h"

typedef enum { RM_LOSS_PAIRWISE, RM_LOSS_MARGIN, RM_LOSS_DSCHAT, RM_LOSS_LISTWISE } RmLossKind;

typedef struct {
    // Examples of K responses each (K = 2: chosen, rejected), stored as K rows per example.
    TokenizedExamples train, eval; // row k of example i is at index i*K + k
    float *train_margins, *eval_margins; // per example (NULL: the constant margin)
    // Per example: none of its K rows was cut at max_seq_len (REWARD_STATS_FILE's examples).
    unsigned char *train_whole, *eval_whole;
    long train_count, eval_count;
    int K;
    int max_seq_len;
    int pad_id;
    RmLossKind loss;
    float margin;
    // --padding-free: each micro-batch's (and evaluation chunk's) rows run side by side in one
    // row, each attending to itself only -- the scores of one response a row without the
    // padding. The command makes the trained model packed_rows_only then (model.h).
    bool padding_free;
    // --center-rewards-coefficient (pairwise and margin losses; 0: none)
    float center_rewards;
} RmTask;

// responses[i*K + k]: response k of example i, best first (K = 2: chosen, rejected).
// margins may be NULL.
int rm_task_init(RmTask *task, const Tokenizer *tokenizer, int K, const char *const *prompts,
                 const char *const *responses, const float *margins, long count, const char *const *eval_prompts,
                 const char *const *eval_responses, const float *eval_margins, long eval_count, int max_seq_len,
                 RmLossKind loss, float margin);
void rm_task_free(RmTask *task);
TrainTask rm_train_task(RmTask *task);

// The reward model's final folder also holds REWARD_STATS_FILE: its scores (at the last
// token, as PPO reads them) of the first REWARD_STATS_EXAMPLES examples of the evaluation
// data, or of the training data when there is none, after training; only examples whose
// rows all fit --max-seq-len count (a cut row's last token is not its answer's end):
//   {"source": "eval" | "train", "examples": n, "cut_examples_left_out": m,
//    "responses_per_example": K, "indices": [n example indices, 0-based, in the data's
//    order], "chosen": [n scores], "rejected": [n * (K - 1) scores], "accuracy": ...}
// (chosen: each example's best response; rejected: the others, example by example).
// `marlhf ppo` reads it to warn when its policy's answers score above what the reward
// model saw preferred (--alarm-score-quantile, rl/hacking_signals.h).
#define REWARD_STATS_FILE "reward_stats.json"
#define REWARD_STATS_EXAMPLES 2048
// "pairwise" | "margin" | "dschat" | "listwise"
int rm_loss_from_name(const char *name, RmLossKind *kind);

// Scores (value head at each row's last real token) of rows of token ids, in chunks:
// the reward model's scalar score. scores[i] for rows[i] (lengths[i] tokens).
void rm_score_rows(Model *model, int *const *rows, const int *lengths, long count, float *scores);
