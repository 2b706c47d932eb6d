// The readers of user files that the fuzzers drive (tests/test_fuzz_parsers.c, the
// deterministic mutation test in `make test`, and tests/fuzz/fuzz_reader.c, the libFuzzer
// target of `make fuzz`). Each takes a path and returns 0 when the file loaded, -1 (with
// err_set()) when it was refused; anything else (a crash, an abort, a sanitizer report)
// is a bug in marlhf.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_template.h"
#include "core/check.h"
#include "data/dataset.h"
#include "eval/judge.h"
#include "gen/constraint.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/safetensors.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"
#include "model/weights_io.h"
#include "rl/remote_reward.h"
#include "serve/embeddings_api.h"
#include "serve/openai.h"
#include "serve/reward_api.h"
#include "serve/tool_calls.h"
#include "tokenizer/tokenizer.h"

static inline int read_safetensors(const char *path) {
    SafetensorsSet *set;
    if (safetensors_open(path, &set) != 0) return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < safetensors_tensor_count(set); i++) {
        const SafetensorsTensor *t = safetensors_tensor_at(set, i);
        if (t->count > (1 << 22)) continue; // larger than the file could hold: the open checked it
        if (t->dtype == SAFETENSORS_F8_E4M3 || t->dtype == SAFETENSORS_F8_E5M2) continue; // opens, never converts
        bool is_float = t->dtype == SAFETENSORS_F32 || t->dtype == SAFETENSORS_F16 || t->dtype == SAFETENSORS_BF16 ||
                        t->dtype == SAFETENSORS_F64;
        if (!is_float) {
            int64_t *values = xmalloc((size_t)(t->count > 0 ? t->count : 1) * sizeof(int64_t));
            if (safetensors_read_i64(t, values, t->count) != 0) rc = -1;
            free(values);
        } else {
            float *values = xmalloc((size_t)(t->count > 0 ? t->count : 1) * sizeof(float));
            if (safetensors_read_f32(t, values, t->count) != 0) rc = -1;
            free(values);
        }
    }
    safetensors_close(set);
    return rc;
}

static inline int read_gguf(const char *path) {
    GgufFile f;
    if (gguf_open(&f, path) != 0) return -1;
    // The model config is read too; a file that is not a model (no known architecture) is
    // still a GGUF file whose tensors must dequantize.
    ModelConfig cfg;
    config_from_gguf(&cfg, &f, path);
    int rc = 0;
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const GgufTensor *t = &f.tensors[i];
        if (t->n_elements > (1 << 22)) continue;
        float *values = xmalloc((size_t)(t->n_elements > 0 ? t->n_elements : 1) * sizeof(float));
        if (gguf_tensor_to_f32(&f, t, values) != 0) rc = -1;
        free(values);
    }
    gguf_close(&f);
    return rc;
}

// A tokenizer (from a folder's tokenizer.json, or a GGUF file), then a round trip.
static inline int read_tokenizer(const char *path) {
    Tokenizer *tok;
    if (tokenizer_load(&tok, path) != 0) return -1;
    const char *text = "Hello, world! Ünïcödé 123 <|im_end|>\n\tend";
    int *ids, count;
    tokenizer_encode(tok, text, strlen(text), true, &ids, &count);
    char *back = tokenizer_decode(tok, ids, count, false);
    free(back), free(ids);
    tokenizer_free(tok);
    return 0;
}

static inline int read_config(const char *path) {
    ModelConfig cfg;
    return config_from_hf_json(&cfg, path);
}

// A model folder (config.json + model.safetensors) loaded on the CPU: for a bitsandbytes
// checkpoint (model/bnb_checkpoint.h) its quant states, code books, absmax and SCB tensors.
static inline int read_model(const char *path) {
    Model model;
    ModelLoadOptions options = {.with_lm_head = true};
    if (model_load(&model, path, &ops_cpu, &options) != 0) return -1;
    model_free(&model);
    return 0;
}

static inline int read_chat_template(const char *path) {
    ChatTemplate t;
    if (chat_template_from_file(&t, path, NULL, NULL) != 0) return -1;
    ChatMessage messages[3] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"}, {.role = "assistant", .content = "Hello."}};
    char *out = NULL;
    int rc = chat_template_render(&t, messages, 3, true, &out);
    free(out);
    chat_template_free(&t);
    return rc;
}

static inline int read_dataset(const char *path) {
    Dataset d;
    if (dataset_load(&d, path, DATA_FORMAT_AUTO, 0) != 0) return -1;
    dataset_free(&d);
    return 0;
}

// A JSON Schema file (`generate --json-schema FILE`): compiled to the constraint of
// gen/json_constraint.h, then run over a short text.
static inline int read_json_schema(const char *path) {
    json_error_t error;
    json_t *schema = json_load_file(path, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &error);
    if (!schema) return err_set("%s: not JSON: %s", path, error.text);
    JsonConstraint *compiled = NULL;
    const int rc = json_constraint_schema(&compiled, schema, path);
    json_decref(schema);
    if (rc != 0) return -1;
    Constraint *constraint = constraint_from_json(compiled);
    (void)constraint_matches(constraint, "{\"name\": \"Ada\"}", 15);
    constraint_free(constraint);
    return 0;
}

// A GBNF grammar (`generate --grammar-file`): compiled by gen/grammar_constraint.h, then
// run over two short texts (one the seed's grammar accepts).
static inline int read_gbnf(const char *path) {
    char *text;
    size_t length;
    if (fs_read_file(path, 1 << 16, &text, &length) != 0) return -1;
    GrammarConstraint *compiled = NULL;
    const int rc = grammar_constraint_compile(&compiled, text, length, path);
    free(text);
    if (rc != 0) return -1;
    Constraint *constraint = constraint_from_grammar(compiled);
    const char *accepted = "{\"name\": \"Ad\xc3\xa1\", \"tags\": [1, -2.5e3, true]}", *other = "(a)\xc3\xa9[\xff";
    (void)constraint_matches(constraint, accepted, strlen(accepted));
    (void)constraint_matches(constraint, other, strlen(other));
    constraint_free(constraint);
    return 0;
}

// A regular expression (`generate --regex`, a file holding the pattern's bytes): compiled
// by gen/regex_constraint.h, then run over a short text.
static inline int read_regex(const char *path) {
    char *pattern;
    size_t length;
    if (fs_read_file(path, 1 << 16, &pattern, &length) != 0) return -1;
    RegexConstraint *compiled = NULL;
    const int rc = regex_constraint_compile(&compiled, pattern, length, NULL, path);
    free(pattern);
    if (rc != 0) return -1;
    Constraint *constraint = constraint_from_regex(compiled);
    (void)constraint_matches(constraint, "2024-05-17 Paris, ok", 20);
    constraint_free(constraint);
    return 0;
}

// ---- what arrives over the network -------------------------------------------------
// `marlhf serve`'s request bodies, the judge's API responses and a model's answers with tool
// calls are not files, but they come from outside as files do: the readers below take a
// file holding one.

// A body of `kind`'s route, parsed and checked as the server does (its constraint compiled);
// the constraint then run over a short text. The served model is "tiny", 64 wide.
static inline int read_openai_body(const char *path, OpenAIKind kind) {
    char *body;
    size_t length;
    if (fs_read_file(path, 1 << 20, &body, &length) != 0) return -1;
    const OpenAILimits limits = {.model_name = "tiny", .max_tokens_limit = 256, .default_max_tokens = 16};
    OpenAIRequest request;
    OpenAIError error;
    const int rc = openai_parse_request(kind, body, length, &limits, &request, &error);
    free(body);
    if (rc != 0) return err_set("%s: %d %s", path, error.status, error.message);
    if (request.constraint) (void)constraint_matches(request.constraint, "{\"city\": \"Paris\", \"celsius\": 18}", 33);
    openai_request_free(&request);
    return 0;
}
static inline int read_chat_request(const char *path) { return read_openai_body(path, OPENAI_CHAT); }
static inline int read_completion_request(const char *path) { return read_openai_body(path, OPENAI_COMPLETION); }

// An embeddings body, as /v1/embeddings and as llama.cpp's /embeddings read it: loaded when
// either takes it.
static inline int read_embeddings_request(const char *path) {
    char *body;
    size_t length;
    if (fs_read_file(path, 1 << 20, &body, &length) != 0) return -1;
    EmbeddingsRequest request;
    OpenAIError error;
    int loaded = 0;
    if (embeddings_request_parse(body, length, "tiny", 64, &request, &error) == 0)
        loaded++, embeddings_request_free(&request);
    if (embeddings_native_request_parse(body, length, "tiny", 64, &request, &error) == 0)
        loaded++, embeddings_request_free(&request);
    free(body);
    return loaded ? 0 : err_set("%s: %d %s", path, error.status, error.message);
}

// A /get_reward body (serve/reward_api.h).
static inline int read_reward_request(const char *path) {
    char *body;
    size_t length;
    if (fs_read_file(path, 1 << 20, &body, &length) != 0) return -1;
    RewardRequest request;
    OpenAIError error;
    const int rc = reward_request_parse(body, length, &request, &error);
    free(body);
    if (rc != 0) return err_set("%s: %d %s", path, error.status, error.message);
    reward_request_free(&request);
    return 0;
}

// A chat-completions response as the judge reads its verdict from it (eval/judge.h): the
// reply, then the verdict in it (any reply has one, "invalid" included).
static inline int read_judge_response(const char *path) {
    char *body;
    size_t length;
    if (fs_read_file(path, 1 << 20, &body, &length) != 0) return -1;
    char *reply = judge_reply_from_response(body);
    free(body);
    if (!reply) return -1;
    (void)judge_parse_verdict(reply);
    free(reply);
    return 0;
}

// A reward server's answer to three queries, as `ppo --reward remote` reads it
// (rl/remote_reward.h): accepted only with three finite rewards; an accepted answer
// without them aborts (a bug, as a crash is).
static inline int read_reward_answer(const char *path) {
    char *body;
    size_t length;
    if (fs_read_file(path, 1 << 20, &body, &length) != 0) return -1;
    double scores[3] = {NAN, NAN, NAN};
    const int rc = remote_reward_parse_answer(body, 3, scores);
    free(body);
    if (rc == 0)
        for (int i = 0; i < 3; i++)
            if (!isfinite(scores[i])) abort();
    return rc;
}

// The answer's content and calls (serve/tool_calls.h) as the server's scanner hands them
// out: the answer whole, and again streamed -- handed to the scanner as it grows, a few
// bytes at a time (the sizes follow the text's bytes, so each answer is cut its own way).
// The two must agree -- the same content, byte for byte (a NUL included: the server keeps
// lengths), the same calls in the same order -- for the Hermes and the Llama 3 JSON syntax;
// a difference aborts (a bug, as a crash is). Every answer is some content and calls: this
// reader refuses nothing.
typedef struct {
    char *content; // `length` bytes (at most the answer's)
    size_t length;
    ToolCall *calls;
    int num_calls;
} ScannedAnswer;

static inline ScannedAnswer scan_answer(ChatToolSyntax syntax, const char *text, size_t length, bool streamed) {
    ScannedAnswer answer = {xmalloc(length + 1), 0, NULL, 0};
    int capacity = 0;
    ToolScanner scanner;
    tool_scanner_init(&scanner, syntax);
    size_t seen = streamed ? 0 : length;
    for (;;) {
        const bool final = seen == length;
        ToolEvent event;
        while (tool_scanner_next(&scanner, text, seen, final, &event)) {
            if (event.kind == TOOL_EVENT_CALL) {
                if (answer.num_calls == capacity) {
                    capacity = capacity ? 2 * capacity : 4;
                    answer.calls = xrealloc(answer.calls, (size_t)capacity * sizeof *answer.calls);
                }
                answer.calls[answer.num_calls++] = event.call;
            } else if (answer.length + event.length > length) {
                fprintf(stderr, "tool calls (syntax %d): more content than the answer's %zu bytes\n", (int)syntax, length);
                abort();
            } else {
                memcpy(answer.content + answer.length, event.text, event.length);
                answer.length += event.length;
            }
        }
        if (final) break;
        seen += 1 + (unsigned char)text[seen] % 5;
        if (seen > length) seen = length;
    }
    tool_scanner_free(&scanner);
    return answer;
}

static inline void scanned_answer_free(ScannedAnswer *answer) {
    for (int i = 0; i < answer->num_calls; i++) tool_call_free(&answer->calls[i]);
    free(answer->calls), free(answer->content);
}

static inline void check_streamed_answer(ChatToolSyntax syntax, const char *text, size_t length) {
    ScannedAnswer whole = scan_answer(syntax, text, length, false), streamed = scan_answer(syntax, text, length, true);
    bool same = whole.num_calls == streamed.num_calls && whole.length == streamed.length &&
                memcmp(whole.content, streamed.content, whole.length) == 0;
    for (int i = 0; same && i < whole.num_calls; i++)
        same = !strcmp(whole.calls[i].name, streamed.calls[i].name) &&
               !strcmp(whole.calls[i].arguments, streamed.calls[i].arguments);
    if (!same) {
        fprintf(stderr, "tool calls (syntax %d): streamed %d calls and %zu bytes of content, whole %d calls and %zu bytes\n",
                (int)syntax, streamed.num_calls, streamed.length, whole.num_calls, whole.length);
        abort();
    }
    scanned_answer_free(&whole), scanned_answer_free(&streamed);
}

static inline int read_tool_answer(const char *path) {
    char *text;
    size_t length;
    if (fs_read_file(path, 1 << 20, &text, &length) != 0) return -1;
    check_streamed_answer(CHAT_TOOLS_HERMES, text, length);
    check_streamed_answer(CHAT_TOOLS_LLAMA3_JSON, text, length);
    free(text);
    return 0;
}
