// The schema of POST /v1/embeddings (OpenAI's embeddings API) as `marlhf serve` speaks it:
// the request parsed and checked, and the response's JSON. No HTTP and no model here: the
// server (serve/server.c) tokenizes the texts and runs the model (model/pooling.h).
//
//   {"input": "text" | ["text", ...] | [token ids] | [[token ids], ...],
//    "model": "<served name>",        optional
//    "encoding_format": "float" | "base64",   optional, default "float"
//    "dimensions": <hidden size>,     optional
//    "user": ...}                     optional, ignored (other unknown keys too)
//   200 {"object": "list",
//        "data": [{"object": "embedding", "index": i, "embedding": [floats] | "base64"}, ...],
//        "model": "<served name>",
//        "usage": {"prompt_tokens": N, "total_tokens": N}}
//
// One input per text or id list, at most EMBEDDINGS_MAX_INPUTS (OpenAI's 2,048); none may
// be empty. base64 is the embedding's float32 values as little-endian bytes, base64-encoded
// (what OpenAI's clients decode); the floats of "float" are printed with 9 significant
// digits, so they read back as exactly those float32 values.
//
// dimensions: OpenAI's text-embedding-3 models return a shorter vector when asked (they
// were trained so that a prefix of the vector is itself an embedding, "Matryoshka"). A
// model trained as a language model was not: the first k of its hidden size's components
// are no such embedding. So, as vLLM does for models without Matryoshka training, a
// request that asks for any other size than the model's hidden size is refused (400).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "serve/openai.h"

#define EMBEDDINGS_MAX_INPUTS 2048

// One input: a text (ids NULL, tokenized by the server) or token ids (text NULL; not
// checked against the vocabulary here: no model).
typedef struct {
    char *text;
    int *ids;
    int num_ids;
} EmbeddingInput;

typedef struct {
    EmbeddingInput *inputs;
    int count;
    bool base64;
} EmbeddingsRequest;

// Parses and checks a body. model_name: the served name (another name is 404
// model_not_found); hidden_size: the one `dimensions` the model can give. Returns 0, or
// -1 with *err (400 for bad JSON, types and values); *req is then empty.
int embeddings_request_parse(const char *body, size_t size, const char *model_name, int hidden_size,
                             EmbeddingsRequest *req, OpenAIError *err);
void embeddings_request_free(EmbeddingsRequest *req);

// POST /embeddings, llama.cpp's own embeddings route: the same fields, except that the
// texts may come as 'content' (llama.cpp's name) when 'input' is absent, and
// encoding_format "base64" is refused (400: the answer is floats).
int embeddings_native_request_parse(const char *body, size_t size, const char *model_name, int hidden_size,
                                    EmbeddingsRequest *req, OpenAIError *err);

// Its answer, as llama.cpp's server gives it: [{"index": i, "embedding": [[floats], ...]},
// ...], input i's vectors_per_input[i] vectors (one pooled vector, or with --pooling none
// one per token) of `dimensions` floats each, all inputs' vectors one after another in
// `vectors`. malloc'd.
char *embeddings_native_response_json(const float *vectors, const int *vectors_per_input, int count, int dimensions);

// The response: count vectors of `dimensions` floats each, vectors[i * dimensions ...] the
// one of input i; prompt_tokens counts the tokens of every input. malloc'd (free() it).
char *embeddings_response_json(const float *vectors, int count, int dimensions, bool base64, const char *model_name,
                               long prompt_tokens);
