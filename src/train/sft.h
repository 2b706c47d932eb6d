// Supervised fine-tuning: the causal-LM loss over response tokens (by default), as a task
// for the shared training loop (train/loop.h).
//
// An example is prompt + response + EOS, each part tokenized on its own (the prompt with
// the tokenizer's special tokens, e.g. BOS) and concatenated, so the response tokens are
// exactly those a policy would generate after the prompt; longer examples are cut at
// max_seq_len. The loss is the mean over the optimizer step's trained tokens, which
// SftLossTokens picks: the response's (EOS included; TRL's completion_only_loss), every token
// of the example (TRL's completion_only_loss=False, and its default for language-modeling and
// conversation rows), or every position of rows padded to max_seq_len, prompt and padding
// included -- the released MA-RLHF/DeepSpeed-Chat step 1 (spec §3.3, §4).
#pragma once
#include <stdbool.h>

#include "train/loop.h"
#include "train/packing.h"

typedef struct {
    int **ids;
    int *lengths;
    int *prompt_lengths;
    // NULL (rows built by hand), or per example NULL or [length] flags: token t is a trained
    // target (SFT examples made of turns); NULL: the tokens from prompt_lengths on are.
    unsigned char **trained;
    // Packed rows (SftTask.packed, bfd and bfd_split): NULL, or row i holds segment_counts[i]
    // sequences of segment_lengths[i][k] tokens side by side, each attending to itself only
    // (model.h's segments); their first tokens are never targets (trained 0).
    int *segment_counts;
    int **segment_lengths;
    long count;
} TokenizedExamples;

// One SFT example: a prompt and its response, or (turn_count > 0) turns: turns[0] and every
// even-numbered turn context, the odd-numbered ones trained (data/dataset.h's turns of a
// {"messages"} row under --assistant-only-loss).
typedef struct {
    const char *prompt, *response;
    const char *const *turns;
    int turn_count;
} SftExample;

typedef enum {
    SFT_LOSS_COMPLETION, // the response tokens and the EOS (turns: the trained turns' tokens and the EOS)
    SFT_LOSS_SEQUENCE,   // every token after the first, prompt included; padding never
    SFT_LOSS_PADDED,     // rows padded to max_seq_len (padding attended to), every position counted
} SftLossTokens;

typedef struct {
    TokenizedExamples train, eval;
    int max_seq_len;
    int pad_id;
    SftLossTokens loss_tokens;
    long dropped; // examples with no trained token within max_seq_len (a prompt that filled it)
    long truncated;
    // --packing: `train` holds rows of up to max_seq_len tokens packed from `sequences`
    // examples (train/packing.h); and with eval_packed (TRL's eval_packing, by default as
    // packing) `eval` holds such rows of `eval_sequences` examples, else one example a row.
    bool packed, eval_packed;
    PackingStrategy packing;
    long sequences, eval_sequences;
    // --loss-type dft (TRL's): Dynamic Fine-Tuning, each token's loss weighted by its own
    // probability (train/losses.h sft_dft_loss), in training and evaluation alike as TRL's.
    bool dft;
    // --padding-free (TRL's padding_free; implied by bfd packing, as in TRL): each micro-batch
    // and evaluation chunk runs as one row of its examples side by side, each attending to
    // itself only -- the loss of one example a row, without the padding. The command makes the
    // trained model packed_rows_only then (model.h).
    bool padding_free;
} SftTask;

// Tokenizes the examples. Returns 0 or -1 (err_set) if nothing is left.
int sft_task_init(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count,
                  const SftExample *eval_examples, long eval_count, int max_seq_len, SftLossTokens loss_tokens);
// The same, the training examples then packed into rows of max_seq_len tokens (TRL's
// packing=True with packing_strategy), and with pack_eval the evaluation's too (TRL's
// eval_packing): bfd cuts an example at max_seq_len as sft_task_init does, bfd_split and
// wrapped keep it whole and split it between rows.
int sft_task_init_packed(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count,
                         const SftExample *eval_examples, long eval_count, int max_seq_len, SftLossTokens loss_tokens,
                         PackingStrategy packing, bool pack_eval);
void sft_task_free(SftTask *task);
// The loop's view of the task.
TrainTask sft_train_task(SftTask *task);

// One micro-batch of rows as the model takes it: B rows of T slots (the longest row, or
// pad_to), padded with pad_id; next-token targets (-1 where the loss does not count: the LM
// head skips those slots) and the loss mask, 1 where a trained token is predicted (pad_to > 0:
// every position but the last, padding included, which is then attended to --
// SFT_LOSS_PADDED); packed rows' segments. one_row: the rows side by side in one row, each
// a segment (or its own segments), no padding (padding-free). PPO's PTX micro-steps are
// built here too.
typedef struct {
    int B, T;
    int *tokens, *targets, *row_len;
    float *mask;
    ModelSegment *segments; // NULL unless the rows are packed
    int segment_count;
} SftBatch;
void sft_batch_build(const TokenizedExamples *examples, const long *which, int count, int pad_id, int pad_to,
                     bool one_row, SftBatch *batch);
// The batch as model_forward takes it.
ModelBatch sft_batch_input(const SftBatch *batch);
void sft_batch_free(SftBatch *batch);

// Shared with the RM task: tokenizes prompt (+ special tokens) + response + EOS, cut at
// max_seq_len. *prompt_length receives the prompt's token count.
void tokenize_example(const Tokenizer *tokenizer, const char *prompt, const char *response, int max_seq_len,
                      int **ids, int *length, int *prompt_length, bool *truncated);
// An example of turns: each turn tokenized on its own (turns[0] with the special tokens,
// as tokenize_example's prompt) and concatenated, then EOS, cut at max_seq_len;
// (*trained)[t] is 1 for the tokens of odd-numbered turns and the EOS. *prompt_length: the
// tokens before the first trained one.
void tokenize_turns(const Tokenizer *tokenizer, const char *const *turns, int turn_count, int max_seq_len, int **ids,
                    unsigned char **trained, int *length, int *prompt_length, bool *truncated);
void tokenized_examples_free(TokenizedExamples *examples);
// The largest of `count` lengths (0 when there are none), and the longest row of `examples`.
int longest_length(const int *lengths, long count);
// The sum of the `k` largest of `count` lengths: the longest row of `k` of them side by side.
int longest_one_row(const int *lengths, long count, long k);
int tokenized_longest(const TokenizedExamples *examples);
// The most rows of a batch of at most `batch` of `count` items (min(batch, count)).
int batch_rows(long batch, long count);
// Room for `capacity` rows (at least one), none filled yet (count 0).
void tokenized_examples_alloc(TokenizedExamples *examples, long capacity);
// The id that fills the padding of training batches: the tokenizer's pad token, else its
// EOS, else 0 (padding is masked; the id only has to be valid).
int training_pad_id(const Tokenizer *tokenizer);
