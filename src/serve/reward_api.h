// The reward route of `marlhf serve --reward-model`: OpenRLHF's remote reward-model
// protocol (its `openrlhf.cli.serve_rm` server, which its trainers reach with
// `--remote_rm_url`), so a reward model trained here scores another machine's PPO run —
// marlhf's own (`marlhf ppo --reward remote`) or OpenRLHF's — and `marlhf ppo` can use any
// server of that protocol (a verifier, another framework's reward model).
//
//   POST /get_reward  {"query": ["<prompt + response>", ...],
//                      "prompts": ["<prompt>", ...],      optional
//                      "labels": [...]}                   optional, ignored here
//   200               {"rewards": [r, ...], "scores": [r, ...]}
//
// A sequence is tokenized as the reward model trained on it (train/sft.h's
// tokenize_example): the prompt with the tokenizer's BOS, the response, and the EOS token,
// which is where the score is read. When prompts[i] is given and query[i] starts with it,
// the two halves are tokenized apart, exactly as in training (and as `marlhf ppo` scores
// with a local reward model); otherwise query[i] is tokenized whole. As OpenRLHF's server
// does, padding and end-of-sequence tokens written at the end of a query (a client that
// decoded with special tokens) are taken off before the EOS token is added, so a query
// scores the same with or without them. Sequences longer than the model's context keep
// their start (the score is then read at the last token kept).
#pragma once
#include <stddef.h>

#include "model/model.h"
#include "serve/openai.h"
#include "tokenizer/tokenizer.h"

#define REWARD_API_MAX_SEQUENCES 4096 // the most queries one request may carry

typedef struct {
    char **queries;
    char **prompts; // NULL entries where no prompt was given
    int count;
} RewardRequest;

// Parses and checks a /get_reward body. Returns 0, or -1 with *err (400); *req is then empty.
int reward_request_parse(const char *body, size_t size, RewardRequest *req, OpenAIError *err);
void reward_request_free(RewardRequest *req);

// The token ids of one sequence as the reward model scores it (see above): xmalloc'd
// *ids of *length tokens, *prompt_length of them the prompt's. max_length bounds the whole.
void reward_sequence_ids(const Tokenizer *tokenizer, const char *query, const char *prompt, int max_length,
                         int **ids, int *length, int *prompt_length);

// Scores every sequence of `count` requests together (requests that waited for the model
// at the same time: serve --reward-batch) with `model` (a reward model: value head), in
// forwards of batch_size rows: the sequences of all of them sorted by length (ties in
// arrival order), so that a forward pads its rows to about their own length. scores[r][i]
// is request r's i-th score; tokens[r] counts request r's tokens scored. A sequence's score
// is the one it gets scored alone up to float rounding (its row's matmuls run with other
// row counts). stop (may be NULL) is asked before each forward: when it returns true the
// scoring ends there and -1 is returned (the scores are then incomplete). Returns the
// number of forwards. The caller serialises calls: the model's activation memory is not
// shared between threads.
int reward_requests_score(Model *model, const Tokenizer *tokenizer, const RewardRequest *const *reqs, int count,
                          int batch_size, float *const *scores, long *tokens, bool (*stop)(void *), void *context);

// {"rewards": [...], "scores": [...]} (the same numbers under both of OpenRLHF's keys).
char *reward_response_json(const float *scores, int count);
