// Rows of prompt + response tokens scored by the sum of their response tokens' log-probs
// (EOS included), and the backward of a loss on those sums: what the preference trainers
// compare (DPO and its variants, train/dpo.c; KTO, train/kto.c) and what the embedding
// API's marlhf_logprob returns.
//
// A batch is right-padded to its longest row, with next-token targets on the response
// tokens only, so the LM head runs on those slots alone.
#pragma once
#include <stdint.h>

#include "model/model.h"
#include "train/sft.h"

typedef struct {
    int B, T;
    int *tokens, *targets, *row_len;
    float *weights; // [B*T] per response slot, or NULL: every response token counts 1
} ResponseBatch;

// Per-token weights for a built batch (the rows which[0..B) of `rows`): fills
// batch->weights (xmalloc'd; response_batch_free frees it). LD-DPO's tail weighting
// (train/dpo.c) is one.
typedef struct {
    void (*fill)(const void *context, const TokenizedExamples *rows, const long *which, ResponseBatch *batch);
    const void *context;
} ResponseWeighting;

// The rows which[0..count) of `rows` (padded with pad_id).
void response_batch_build(const TokenizedExamples *rows, const long *which, int count, int pad_id, ResponseBatch *batch);
void response_batch_free(ResponseBatch *batch);
// Forward over the batch; sums[b] = row b's response log-prob sum (weighted by
// batch->weights when set).
void response_batch_forward(Model *model, const ResponseBatch *batch, double *sums);
// Per-row results besides the sums, for response_batch_forward_more (each NULL when not wanted):
//   plain_sums       the response log-prob sum without batch->weights (TRL's "sft" loss term
//                    reads the tokens unweighted under LD-DPO)
//   wpo_log_weights  the mean over the response tokens of log p(token) - log sum_v p_v^2:
//                    the log of a row's WPO weight (Zhou et al. 2024, Eq. 2; train/dpo.c),
//                    from the unweighted log-probs. A value only: it carries no gradient.
typedef struct {
    double *plain_sums;
    double *wpo_log_weights;
} ResponseRowExtras;
void response_batch_forward_more(Model *model, const ResponseBatch *batch, double *sums,
                                 const ResponseRowExtras *extras);
// After response_batch_forward on the same batch: accumulates into the model's gradients the
// backward of scale * (a loss whose derivative in sums[b] is d_sums[b]).
void response_batch_backward(Model *model, const ResponseBatch *batch, const double *d_sums, double scale);
// The same for a loss of both the weighted sums and the plain ones (d_plain_sums[b]: its
// derivative in row b's unweighted sum; NULL: none).
void response_batch_backward_more(Model *model, const ResponseBatch *batch, const double *d_sums,
                                  const double *d_plain_sums, double scale);
// Real tokens in the batch (for throughput).
long response_batch_tokens(const ResponseBatch *batch);

// An array of `rows` sums set to NaN: "not computed yet" (the reference's, before
// dpo_task_compute_reference / kto_task_compute_reference; using one is an internal error).
double *response_sums_unknown(long rows);
// Whether every one of the `rows` sums is known (none NaN).
bool response_sums_known(const double *sums, long rows);

// The reference's sums in a checkpoint's trainer state (TrainTask.save_state / load_state), so
// that a resumed run takes them instead of scoring every row again with the starting weights:
// under `key`, the sums (JSON_REAL_PRECISION(17): exactly) and a fingerprint of what they
// were computed from -- every row's token ids and prompt length, `setting` (an option that
// changes the sums, LD-DPO's alpha) and `reference`, the reference model's fingerprint
// (response_reference_fingerprint; 0 for the policy's own starting weights) -- so another data
// file, setting or reference model leaves them unknown. Nothing is saved when a sum is not
// finite (JSON has no NaN); load leaves `sums` as they were when the key is missing or its
// fingerprint or count is not this run's.
void response_sums_save(json_t *state, const char *key, const TokenizedExamples *rows, double setting,
                        uint64_t reference, const double *sums);
void response_sums_load(const json_t *state, const char *key, const TokenizedExamples *rows, double setting,
                        uint64_t reference, double *sums);
// A reference model's fingerprint for the above: FNV-1a over its weights as the backend holds
// them (copied to the host a chunk at a time), never 0.
uint64_t response_reference_fingerprint(const Model *reference);

// sums[i] = the response log-prob sum of row which[i] of `rows`, one forward over the
// `count` rows.
void response_logps(Model *model, const TokenizedExamples *rows, const long *which, int count, int pad_id,
                    double *sums);
// sums[r] for every row of `rows`, eight rows per forward; under mpirun each rank scores a
// share and the sums are gathered, so every rank ends with all of them.
void response_logps_all(Model *model, const TokenizedExamples *rows, int pad_id, double *sums);
// The same with each batch weighted by `weighting` (NULL: unweighted).
void response_logps_all_weighted(Model *model, const TokenizedExamples *rows, int pad_id,
                                 const ResponseWeighting *weighting, double *sums);
