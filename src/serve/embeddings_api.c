#include "serve/embeddings_api.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// A 400 naming the body's field, as the other OpenAI routes answer one (serve/openai.h).
#define bad_value(err, param, ...) openai_error_set(err, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)

static const char input_forms[] =
    "'input' must be a string, a list of strings, a list of token ids or a list of lists of token ids";

void embeddings_request_free(EmbeddingsRequest *req) {
    for (int i = 0; i < req->count; i++) free(req->inputs[i].text), free(req->inputs[i].ids);
    free(req->inputs);
    memset(req, 0, sizeof *req);
}

// A list of token ids into `input` (where: how the error names the list, e.g. "input[2]").
static int parse_ids(json_t *list, const char *where, EmbeddingInput *input, OpenAIError *err) {
    const size_t n = json_array_size(list);
    if (n == 0) return bad_value(err, "input", "%s must not be empty: an embedding needs at least one token", where);
    input->ids = xmalloc(n * sizeof(int));
    input->num_ids = (int)n;
    for (size_t t = 0; t < n; t++) {
        json_t *id = json_array_get(list, t);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT_MAX)
            return bad_value(err, "input", "%s[%zu] is not a token id (a non-negative integer)", where, t);
        input->ids[t] = (int)json_integer_value(id);
    }
    return 0;
}

static int parse_text(json_t *text, const char *where, EmbeddingInput *input, OpenAIError *err) {
    if (json_string_length(text) == 0) return bad_value(err, "input", "%s must not be an empty string", where);
    if (strlen(json_string_value(text)) != json_string_length(text))
        return bad_value(err, "input", "%s must not contain NUL", where);
    input->text = xstrdup(json_string_value(text));
    return 0;
}

// The four forms of 'input'; a list's first element says which of them it is, and every
// element must then be of that kind.
static int parse_input(json_t *input, EmbeddingsRequest *req, OpenAIError *err) {
    if (!input || json_is_null(input)) return bad_value(err, "input", "'input' is required");
    if (json_is_string(input)) {
        req->inputs = xcalloc(1, sizeof(EmbeddingInput));
        req->count = 1;
        return parse_text(input, "'input'", &req->inputs[0], err);
    }
    if (!json_is_array(input)) return bad_value(err, "input", "%s", input_forms);
    const size_t n = json_array_size(input);
    if (n == 0) return bad_value(err, "input", "'input' must not be an empty list");
    json_t *first = json_array_get(input, 0);
    if (json_is_integer(first)) { // one text as token ids
        req->inputs = xcalloc(1, sizeof(EmbeddingInput));
        req->count = 1;
        return parse_ids(input, "'input'", &req->inputs[0], err);
    }
    if (!json_is_string(first) && !json_is_array(first)) return bad_value(err, "input", "%s", input_forms);
    if (n > EMBEDDINGS_MAX_INPUTS)
        return bad_value(err, "input", "'input' holds at most %d texts, got %zu", EMBEDDINGS_MAX_INPUTS, n);
    const bool texts = json_is_string(first);
    req->inputs = xcalloc(n, sizeof(EmbeddingInput));
    req->count = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(input, i);
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        if (texts ? !json_is_string(item) : !json_is_array(item))
            return bad_value(err, "input", "%s must be %s, as input[0] is (one kind of input per request)", where,
                             texts ? "a string" : "a list of token ids");
        if ((texts ? parse_text(item, where, &req->inputs[i], err) : parse_ids(item, where, &req->inputs[i], err)) != 0)
            return -1;
    }
    return 0;
}

static int parse_fields(json_t *root, const char *model_name, int hidden_size, bool native, EmbeddingsRequest *req,
                        OpenAIError *err) {
    if (!json_is_object(root)) return bad_value(err, NULL, "the request body must be a JSON object");
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return bad_value(err, "model", "'model' must be a string");
        if (strcmp(json_string_value(model), model_name) != 0)
            return openai_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                                    "The model '%.200s' does not exist (this server serves '%.200s')",
                                    json_string_value(model), model_name);
    }
    json_t *format = json_object_get(root, "encoding_format");
    if (format && !json_is_null(format)) {
        if (!json_is_string(format) ||
            (strcmp(json_string_value(format), "float") != 0 && strcmp(json_string_value(format), "base64") != 0))
            return bad_value(err, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        req->base64 = strcmp(json_string_value(format), "base64") == 0;
    }
    json_t *dimensions = json_object_get(root, "dimensions");
    if (dimensions && !json_is_null(dimensions)) {
        if (!json_is_integer(dimensions)) return bad_value(err, "dimensions", "'dimensions' must be an integer");
        if (json_integer_value(dimensions) != hidden_size)
            return bad_value(err, "dimensions",
                             "this model's embeddings have %d dimensions; it was not trained to give shorter ones, so "
                             "'dimensions' must be %d or absent, got %lld",
                             hidden_size, hidden_size, (long long)json_integer_value(dimensions));
    }
    if (native && req->base64)
        return bad_value(err, "encoding_format",
                         "'encoding_format' \"base64\" is for /v1/embeddings; /embeddings answers floats");
    json_t *input = json_object_get(root, "input");
    if (native && (!input || json_is_null(input))) input = json_object_get(root, "content");
    return parse_input(input, req, err);
}

int embeddings_request_parse(const char *body, size_t size, const char *model_name, int hidden_size,
                             EmbeddingsRequest *req, OpenAIError *err) {
    memset(req, 0, sizeof *req);
    json_t *root = openai_parse_json_body(body, size, err);
    if (!root) return -1;
    int rc = parse_fields(root, model_name, hidden_size, false, req, err);
    json_decref(root);
    if (rc != 0) embeddings_request_free(req);
    return rc;
}

int embeddings_native_request_parse(const char *body, size_t size, const char *model_name, int hidden_size,
                                    EmbeddingsRequest *req, OpenAIError *err) {
    memset(req, 0, sizeof *req);
    json_t *root = openai_parse_json_body(body, size, err);
    if (!root) return -1;
    int rc = parse_fields(root, model_name, hidden_size, true, req, err);
    json_decref(root);
    if (rc != 0) embeddings_request_free(req);
    return rc;
}

// --- the response ----------------------------------------------------------------------

typedef struct {
    char *text;
    size_t length, capacity;
} Text;

static void text_reserve(Text *t, size_t more) {
    if (t->length + more + 1 <= t->capacity) return;
    t->capacity = 2 * (t->length + more + 1);
    t->text = xrealloc(t->text, t->capacity);
}

static void text_append(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_append(Text *t, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    text_reserve(t, (size_t)n);
    va_start(args, fmt);
    vsnprintf(t->text + t->length, (size_t)n + 1, fmt, args);
    va_end(args);
    t->length += (size_t)n;
}

// The vector's float32 values as little-endian bytes, base64-encoded (RFC 4648, with
// padding), between double quotes.
static void append_base64(Text *t, const float *vector, int count) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t bytes = (size_t)count * 4;
    unsigned char *raw = xmalloc(bytes);
    for (int i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &vector[i], 4);
        for (int k = 0; k < 4; k++) raw[(size_t)i * 4 + k] = (unsigned char)(bits >> (8 * k));
    }
    text_reserve(t, (bytes + 2) / 3 * 4 + 2);
    char *out = t->text + t->length;
    *out++ = '"';
    for (size_t i = 0; i < bytes; i += 3) {
        const uint32_t group = (uint32_t)raw[i] << 16 | (i + 1 < bytes ? (uint32_t)raw[i + 1] << 8 : 0) |
                               (i + 2 < bytes ? raw[i + 2] : 0);
        *out++ = alphabet[group >> 18 & 63];
        *out++ = alphabet[group >> 12 & 63];
        *out++ = i + 1 < bytes ? alphabet[group >> 6 & 63] : '=';
        *out++ = i + 2 < bytes ? alphabet[group & 63] : '=';
    }
    *out++ = '"';
    *out = '\0';
    t->length = (size_t)(out - t->text);
    free(raw);
}

// A vector's floats as a JSON list: 9 significant digits read back as the same float32
// (the server answers 500 instead of a vector that is not finite, which JSON cannot hold).
static void append_floats(Text *t, const float *vector, int dimensions) {
    text_append(t, "[");
    for (int c = 0; c < dimensions; c++) {
        text_reserve(t, 24); // ",-1.23456789e-38" and the like
        t->length += (size_t)snprintf(t->text + t->length, 24, "%s%.9g", c > 0 ? "," : "", (double)vector[c]);
    }
    text_append(t, "]");
}

char *embeddings_native_response_json(const float *vectors, const int *vectors_per_input, int count, int dimensions) {
    Text t = {0};
    text_append(&t, "[");
    const float *vector = vectors;
    for (int i = 0; i < count; i++) {
        text_append(&t, "%s{\"index\":%d,\"embedding\":[", i > 0 ? "," : "", i);
        for (int k = 0; k < vectors_per_input[i]; k++, vector += dimensions) {
            if (k > 0) text_append(&t, ",");
            append_floats(&t, vector, dimensions);
        }
        text_append(&t, "]}");
    }
    text_append(&t, "]");
    return t.text;
}

char *embeddings_response_json(const float *vectors, int count, int dimensions, bool base64, const char *model_name,
                               long prompt_tokens) {
    Text t = {0};
    text_append(&t, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < count; i++) {
        const float *vector = vectors + (size_t)i * dimensions;
        text_append(&t, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i > 0 ? "," : "", i);
        if (base64) {
            append_base64(&t, vector, dimensions);
        } else {
            append_floats(&t, vector, dimensions);
        }
        text_append(&t, "}");
    }
    // The model name is the server's own (--model-name): JSON-escaped by jansson.
    json_t *name = json_string(model_name);
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    CHECK(quoted, "the served model name is not UTF-8");
    text_append(&t, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}", quoted, prompt_tokens,
                prompt_tokens);
    free(quoted);
    return t.text;
}
