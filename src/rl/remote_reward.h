// A reward from a server: `marlhf ppo --reward remote --reward-url URL`, OpenRLHF's
// `--remote_rm_url`. The server speaks OpenRLHF's remote reward-model protocol, as
// `marlhf serve --reward-model` does (serve/reward_api.h): a reward model on another
// machine (it then needs no memory here), a verifier, another framework's server.
//
// One POST per chunk of at most REMOTE_REWARD_CHUNK responses:
//     {"query": ["<prompt><response>", ...], "prompts": ["<prompt>", ...], "labels": [<label>, ...]}
// answered by {"rewards": [r, ...]} (one finite number per query; other keys are ignored).
// The response text is decoded without its end-of-sequence token (a reward-model server
// adds its own); a label is the prompt row's field named by --reward-label-key, as the
// row has it (any JSON value), or null. Timeouts and 429/5xx answers are retried with
// backoff (eval/http_client.h); an answer of the wrong shape is retried too, then an error.
#pragma once

#define REMOTE_REWARD_CHUNK 64

typedef struct RemoteReward RemoteReward;

// Returns 0, or -1 with err_set() (a URL that is not http:// or https://).
int remote_reward_open(RemoteReward **out, const char *url, double timeout_seconds, int retries);
// The rewards of `count` responses. labels_json[i] is a JSON text or NULL (null). Returns 0,
// or -1 with err_set() naming the URL.
int remote_reward_score(RemoteReward *reward, int count, const char *const *prompts, const char *const *responses,
                        const char *const *labels_json, double *scores);
void remote_reward_close(RemoteReward *reward);

// A server's answer to `count` queries, {"rewards": [count finite numbers], ...}, read into
// scores[0..count). Returns 0, or -1 with err_set() saying what is wrong with it (scores
// may then be partly written). The fuzzers drive it (tests/fuzz/readers.h).
int remote_reward_parse_answer(const char *body, int count, double *scores);

// The value of `key` in the JSON object text `row`, as compact JSON (xmalloc'd), or NULL
// when the row has no such key (or is not an object).
char *remote_reward_label(const char *row, const char *key);
