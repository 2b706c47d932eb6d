#include "serve/reward_api.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "train/sft.h"

// A 400 naming the body's field, as the OpenAI routes answer one (serve/openai.h).
#define bad_value(err, param, ...) openai_error_set(err, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)

void reward_request_free(RewardRequest *req) {
    for (int i = 0; i < req->count; i++) {
        free(req->queries ? req->queries[i] : NULL);
        free(req->prompts ? req->prompts[i] : NULL);
    }
    free(req->queries), free(req->prompts);
    memset(req, 0, sizeof *req);
}

int reward_request_parse(const char *body, size_t size, RewardRequest *req, OpenAIError *err) {
    memset(req, 0, sizeof *req);
    json_error_t json_error;
    json_t *root = json_loadb(body, size, 0, &json_error);
    if (!root)
        return openai_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                                "the body is not valid JSON: %s (line %d, column %d)", json_error.text, json_error.line,
                                json_error.column);
    int rc = -1;
    json_t *queries = json_object_get(root, "query"), *prompts = json_object_get(root, "prompts");
    if (json_is_null(prompts)) prompts = NULL;
    if (!json_is_object(root)) {
        bad_value(err, NULL, "the body must be a JSON object {\"query\": [...]}");
    } else if (!json_is_array(queries)) {
        bad_value(err, "query", "'query' must be a list of texts (prompt + response), got %s",
                  queries ? "another type" : "none");
    } else if (json_array_size(queries) == 0 || json_array_size(queries) > REWARD_API_MAX_SEQUENCES) {
        bad_value(err, "query", "'query' must hold 1 to %d texts, got %zu", REWARD_API_MAX_SEQUENCES,
                  json_array_size(queries));
    } else if (prompts && (!json_is_array(prompts) || json_array_size(prompts) != json_array_size(queries))) {
        bad_value(err, "prompts", "'prompts' must be a list as long as 'query' (%zu texts)", json_array_size(queries));
    } else {
        const int count = (int)json_array_size(queries);
        req->queries = xcalloc(count, sizeof(char *));
        req->prompts = xcalloc(count, sizeof(char *));
        req->count = count;
        rc = 0;
        for (int i = 0; i < count && rc == 0; i++) {
            json_t *query = json_array_get(queries, i), *prompt = prompts ? json_array_get(prompts, i) : NULL;
            if (!json_is_string(query)) {
                rc = bad_value(err, "query", "query[%d] must be a text", i);
            } else if (prompt && !json_is_null(prompt) && !json_is_string(prompt)) {
                rc = bad_value(err, "prompts", "prompts[%d] must be a text or null", i);
            } else {
                req->queries[i] = xstrdup(json_string_value(query));
                if (json_is_string(prompt)) req->prompts[i] = xstrdup(json_string_value(prompt));
            }
        }
        if (rc != 0) reward_request_free(req);
    }
    json_decref(root);
    return rc;
}

// The text of token `id` as a decoded sequence shows it ("<|im_end|>", "</s>"), or NULL.
static const char *special_text(const Tokenizer *tokenizer, int id) {
    const char *text = id >= 0 ? tokenizer_token_string(tokenizer, id) : NULL;
    return text && *text ? text : NULL;
}

static bool ends_with(const char *text, size_t length, const char *suffix) {
    size_t n = strlen(suffix);
    return n <= length && memcmp(text + length - n, suffix, n) == 0;
}

void reward_sequence_ids(const Tokenizer *tokenizer, const char *query, const char *prompt, int max_length,
                         int **ids, int *length, int *prompt_length) {
    const char *eos = special_text(tokenizer, tokenizer_eos_id(tokenizer));
    const char *pad = special_text(tokenizer, tokenizer_pad_id(tokenizer));
    // Left padding first (a batch decoded with special tokens), then the trailing padding
    // and end-of-sequence tokens, in any order and number.
    size_t start = 0, end = strlen(query);
    while (pad && strncmp(query + start, pad, strlen(pad)) == 0) start += strlen(pad);
    for (bool cut = true; cut && end > start;) {
        cut = false;
        if (eos && ends_with(query + start, end - start, eos)) end -= strlen(eos), cut = true;
        if (pad && ends_with(query + start, end - start, pad)) end -= strlen(pad), cut = true;
    }
    char *text = xmalloc(end - start + 1);
    memcpy(text, query + start, end - start);
    text[end - start] = '\0';
    bool truncated;
    size_t prompt_bytes = prompt ? strlen(prompt) : 0;
    if (prompt && prompt_bytes <= strlen(text) && memcmp(text, prompt, prompt_bytes) == 0) {
        tokenize_example(tokenizer, prompt, text + prompt_bytes, max_length, ids, length, prompt_length, &truncated);
    } else {
        tokenize_example(tokenizer, text, "", max_length, ids, length, prompt_length, &truncated);
    }
    free(text);
}

typedef struct {
    int length, request, index; // index: in its request
} ScoreOrder;

// Shortest first; equal lengths in arrival order (request, then text), so the forwards are
// the same every time.
static int by_length(const void *a, const void *b) {
    const ScoreOrder *x = a, *y = b;
    if (x->length != y->length) return x->length < y->length ? -1 : 1;
    if (x->request != y->request) return x->request < y->request ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int reward_requests_score(Model *model, const Tokenizer *tokenizer, const RewardRequest *const *reqs, int count,
                          int batch_size, float *const *scores, long *tokens, bool (*stop)(void *), void *context) {
    const int max_length = model->config.max_position_embeddings;
    int total = 0;
    for (int r = 0; r < count; r++) total += reqs[r]->count;
    // Every sequence of every request, in arrival order: ids[first[r] + i] is request r's i-th.
    int **ids = xcalloc((size_t)total, sizeof(int *)), *first = xmalloc((size_t)count * sizeof(int));
    ScoreOrder *order = xmalloc((size_t)total * sizeof(ScoreOrder));
    for (int r = 0, at = 0; r < count; r++) {
        first[r] = at;
        tokens[r] = 0;
        for (int i = 0; i < reqs[r]->count; i++, at++) {
            int length, prompt_length;
            reward_sequence_ids(tokenizer, reqs[r]->queries[i], reqs[r]->prompts[i], max_length, &ids[at], &length,
                                &prompt_length);
            if (length == 0) { // an empty text without BOS or EOS: score one pad token
                ids[at][0] = tokenizer_pad_id(tokenizer) >= 0 ? tokenizer_pad_id(tokenizer) : 0;
                length = 1;
            }
            tokens[r] += length;
            order[at] = (ScoreOrder){length, r, i};
        }
    }
    if (batch_size < 1) batch_size = 1;
    // Batches of sequences of about the same length, whichever request they come from:
    // every row computes the batch's longest length, so sorting spends less on padding (a
    // row's score does not depend on its batch-mates beyond float rounding).
    qsort(order, (size_t)total, sizeof(ScoreOrder), by_length);
    int *batch_lengths = xmalloc((size_t)batch_size * sizeof(int)), forwards = 0;
    for (int start = 0; start < total; start += batch_size, forwards++) {
        if (stop && stop(context)) {
            forwards = -1;
            break;
        }
        const int B = total - start < batch_size ? total - start : batch_size;
        int T = 0;
        for (int b = 0; b < B; b++) {
            batch_lengths[b] = order[start + b].length;
            T = batch_lengths[b] > T ? batch_lengths[b] : T;
        }
        // Right-padded rows: the causal mask keeps the padding out of every score.
        int *batch_tokens = xcalloc((size_t)B * T, sizeof(int));
        for (int b = 0; b < B; b++) {
            const ScoreOrder *o = &order[start + b];
            memcpy(batch_tokens + (size_t)b * T, ids[first[o->request] + o->index], batch_lengths[b] * sizeof(int));
        }
        ModelBatch batch = {.B = B, .T = T, .tokens = batch_tokens, .row_len = batch_lengths};
        model_forward(model, &batch);
        float *values = xmalloc((size_t)B * T * sizeof(float));
        model_values(model, values);
        for (int b = 0; b < B; b++)
            scores[order[start + b].request][order[start + b].index] = values[(size_t)b * T + batch_lengths[b] - 1];
        free(values), free(batch_tokens);
    }
    for (int i = 0; i < total; i++) free(ids[i]);
    free(ids), free(first), free(batch_lengths), free(order);
    return forwards;
}

char *reward_response_json(const float *scores, int count) {
    json_t *rewards = json_array(), *copy = json_array();
    for (int i = 0; i < count; i++) {
        json_array_append_new(rewards, json_real(scores[i]));
        json_array_append_new(copy, json_real(scores[i]));
    }
    json_t *root = json_pack("{s:o, s:o}", "rewards", rewards, "scores", copy);
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(root);
    return text;
}
