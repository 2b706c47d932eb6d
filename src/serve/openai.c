#include "serve/openai.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "gen/lazy_constraint.h"

int openai_error_set(OpenAIError *err, int status, const char *type, const char *param, const char *code,
                     const char *fmt, ...) {
    err->status = status;
    err->type = type;
    err->param = param;
    err->code = code;
    va_list args;
    va_start(args, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, args);
    va_end(args);
    return -1;
}

static int bad_param(OpenAIError *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad_param(OpenAIError *err, const char *param, const char *fmt, ...) {
    err->status = 400;
    err->type = "invalid_request_error";
    err->param = param;
    err->code = "invalid_value";
    va_list args;
    va_start(args, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, args);
    va_end(args);
    return -1;
}

// null and absence mean the same in the API: the default.
static json_t *get(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static int get_number(json_t *root, const char *key, double low, double high, bool low_open, double *out,
                      OpenAIError *err) {
    json_t *v = get(root, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad_param(err, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < low || x > high || (low_open && x == low))
        return bad_param(err, key, "'%s' must be in %s%g, %g], got %g", key, low_open ? "(" : "[", low, high, x);
    *out = x;
    return 0;
}

static int get_int(json_t *root, const char *key, long long low, long long high, long long *out, OpenAIError *err) {
    json_t *v = get(root, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad_param(err, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (low == high && x != low) return bad_param(err, key, "'%s' must be %lld, got %lld", key, low, x);
    if (x < low || x > high) return bad_param(err, key, "'%s' must be in [%lld, %lld], got %lld", key, low, high, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *root, const char *key, bool *out, OpenAIError *err) {
    json_t *v = get(root, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad_param(err, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

// Parameters marlhf does not implement are refused rather than silently ignored, unless
// they hold the value that changes nothing.
// OpenAI's logit_bias: {"token id": bias, ...}, ids as decimal strings (their range is the
// server's to check: the vocabulary is the model's), biases in [-100, 100].
#define OPENAI_MAX_LOGIT_BIAS 1024
static int parse_logit_bias(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *v = get(root, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad_param(err, "logit_bias", "'logit_bias' must be an object of token ids to biases");
    if (json_object_size(v) > OPENAI_MAX_LOGIT_BIAS)
        return bad_param(err, "logit_bias", "'logit_bias' holds %zu tokens, at most %d", json_object_size(v),
                         OPENAI_MAX_LOGIT_BIAS);
    req->logit_bias = xcalloc(json_object_size(v) + 1, sizeof(SamplerLogitBias));
    const char *key;
    json_t *bias;
    json_object_foreach(v, key, bias) {
        char *end;
        const long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT_MAX)
            return bad_param(err, "logit_bias", "'logit_bias' keys must be token ids, got '%.40s'", key);
        if (!json_is_number(bias) || !(json_number_value(bias) >= -100 && json_number_value(bias) <= 100))
            return bad_param(err, "logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token %ld)", id);
        req->logit_bias[req->logit_bias_count++] = (SamplerLogitBias){(int)id, (float)json_number_value(bias)};
    }
    return 0;
}

static int check_unsupported(json_t *root, OpenAIKind kind, OpenAIError *err) {
    json_t *v = get(root, "echo");
    if (v && !json_is_false(v)) return bad_param(err, "echo", "'echo' is not supported");
    v = get(root, "best_of");
    if (v && !(json_is_integer(v) && json_integer_value(v) == 1))
        return bad_param(err, "best_of", "'best_of' must be 1");
    v = get(root, "suffix");
    if (v && !(json_is_string(v) && json_string_length(v) == 0))
        return bad_param(err, "suffix", "'suffix' is not supported");
    // The deprecated function-calling parameters; tools are chat's (parse_tools).
    static const char *legacy[] = {"functions", "function_call"};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        v = get(root, legacy[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
            return bad_param(err, legacy[i], "'%s' (the deprecated function calling) is not supported: use 'tools'",
                             legacy[i]);
    }
    v = get(root, "tools");
    if (kind == OPENAI_COMPLETION && v && !(json_is_array(v) && json_array_size(v) == 0))
        return bad_param(err, "tools", "'tools' is a chat parameter: /v1/completions has no tool calling");
    v = get(root, "chat_template_kwargs");
    if (kind == OPENAI_COMPLETION && v && !(json_is_object(v) && json_object_size(v) == 0))
        return bad_param(err, "chat_template_kwargs", "'chat_template_kwargs' is a chat parameter: /v1/completions "
                         "renders no template");
    return 0;
}

// chat_template_kwargs (vLLM's): the template variables marlhf's templates read, checked
// here by name and type (the template's own refusals come when the prompt is rendered).
// Anything else is refused rather than ignored: no Jinja runs to read it.
static int parse_template_kwargs(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *v = get(root, "chat_template_kwargs");
    if (!v || json_object_size(v) == 0) {
        if (v && !json_is_object(v))
            return bad_param(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        return 0;
    }
    if (chat_template_apply_kwargs(NULL, v) != 0) return bad_param(err, "chat_template_kwargs", "%s", err_msg());
    req->template_kwargs_json = json_dumps(v, JSON_COMPACT);
    return 0;
}

// response_format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
// "json_schema": {"name": string, "schema": object, "strict": boolean, "description": string}}
// compiled into the answer's constraint.
static int parse_response_format(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *v = get(root, "response_format");
    if (!v) return 0;
    if (!json_is_object(v)) return bad_param(err, "response_format", "'response_format' must be an object");
    json_t *type = json_object_get(v, "type");
    const char *name = json_string_value(type);
    if (name && !strcmp(name, "text")) return 0;
    if (name && !strcmp(name, "json_object")) {
        req->constraint = constraint_from_json(json_constraint_object());
        return 0;
    }
    if (!name || strcmp(name, "json_schema") != 0)
        return bad_param(err, "response_format", "'response_format.type' must be \"text\", \"json_object\" or "
                         "\"json_schema\"");
    json_t *spec = json_object_get(v, "json_schema");
    if (!json_is_object(spec))
        return bad_param(err, "response_format", "'response_format.json_schema' must be an object {\"name\", \"schema\"}");
    json_t *schema_name = json_object_get(spec, "name"), *schema = json_object_get(spec, "schema");
    json_t *strict = json_object_get(spec, "strict"), *description = json_object_get(spec, "description");
    if (!json_is_string(schema_name) || json_string_length(schema_name) == 0 || json_string_length(schema_name) > 64)
        return bad_param(err, "response_format", "'response_format.json_schema.name' must be a string of 1 to 64 "
                         "characters");
    if (strict && !json_is_boolean(strict))
        return bad_param(err, "response_format", "'response_format.json_schema.strict' must be a boolean");
    if (description && !json_is_string(description))
        return bad_param(err, "response_format", "'response_format.json_schema.description' must be a string");
    if (!schema) return bad_param(err, "response_format", "'response_format.json_schema.schema' is required");
    JsonConstraint *json = NULL;
    if (json_constraint_schema(&json, schema, "response_format.json_schema.schema") != 0)
        return bad_param(err, "response_format", "%s", err_msg());
    req->constraint = constraint_from_json(json);
    return 0;
}

// A JSON Schema given as an object or as a string holding one (vLLM's `json`).
static int compile_json_field(json_t *v, const char *param, OpenAIRequest *req, OpenAIError *err) {
    json_t *schema = v;
    if (json_is_string(v)) {
        json_error_t error;
        schema = json_loads(json_string_value(v), JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &error);
        if (!schema) return bad_param(err, param, "'%s' holds no JSON: %s", param, error.text);
    } else if (!json_is_object(v) && !json_is_boolean(v)) {
        return bad_param(err, param, "'%s' must be a JSON Schema (an object, or a string holding one)", param);
    }
    JsonConstraint *json = NULL;
    const int rc = json_constraint_schema(&json, schema, param);
    if (schema != v) json_decref(schema);
    if (rc != 0) return bad_param(err, param, "%s", err_msg());
    req->constraint = constraint_from_json(json);
    return 0;
}

static int compile_regex_field(json_t *v, const char *param, OpenAIRequest *req, OpenAIError *err) {
    if (!json_is_string(v)) return bad_param(err, param, "'%s' must be a string (a regular expression)", param);
    RegexConstraint *regex = NULL;
    if (regex_constraint_compile(&regex, json_string_value(v), json_string_length(v), NULL, param) != 0)
        return bad_param(err, param, "%s", err_msg());
    req->constraint = constraint_from_regex(regex);
    return 0;
}

static int compile_choice_field(json_t *v, const char *param, OpenAIRequest *req, OpenAIError *err) {
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 4096)
        return bad_param(err, param, "'%s' must be a list of 1 to 4096 strings", param);
    const size_t n = json_array_size(v);
    const char **texts = xmalloc(n * sizeof(char *));
    size_t *lengths = xmalloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) {
            free(texts), free(lengths);
            return bad_param(err, param, "'%s' must be a list of strings (item %zu is not one)", param, i);
        }
        texts[i] = json_string_value(s), lengths[i] = json_string_length(s);
    }
    RegexConstraint *regex = NULL;
    const int rc = regex_constraint_choice(&regex, texts, lengths, (int)n, param);
    free(texts), free(lengths);
    if (rc != 0) return bad_param(err, param, "%s", err_msg());
    req->constraint = constraint_from_regex(regex);
    return 0;
}

static int compile_grammar_field(json_t *v, const char *param, OpenAIRequest *req, OpenAIError *err) {
    if (!json_is_string(v)) return bad_param(err, param, "'%s' must be a string (a GBNF grammar)", param);
    GrammarConstraint *grammar = NULL;
    if (grammar_constraint_compile(&grammar, json_string_value(v), json_string_length(v), param) != 0)
        return bad_param(err, param, "%s", err_msg());
    req->constraint = constraint_from_grammar(grammar);
    return 0;
}

// vLLM's structured outputs: structured_outputs {"regex" | "choice" | "json" | "json_object" |
// "grammar"} (one of them), or the fields vLLM took before 0.12: guided_regex, guided_choice,
// guided_json, guided_grammar, or llama.cpp's `grammar` (a GBNF text; "" is none, as
// llama.cpp's server takes it). Never beside response_format (json_object / json_schema).
static int parse_structured_outputs(json_t *root, OpenAIRequest *req, const char **param, OpenAIError *err) {
    static const char *const guided[] = {"guided_regex", "guided_choice", "guided_json", "guided_grammar", "grammar"};
    const int num_guided = (int)(sizeof guided / sizeof guided[0]);
    json_t *so = get(root, "structured_outputs");
    const char *given = NULL;
    for (int i = 0; i < num_guided; i++) {
        json_t *v = get(root, guided[i]);
        if (!v || (!strcmp(guided[i], "grammar") && json_is_string(v) && json_string_length(v) == 0)) continue;
        if (given || so)
            return bad_param(err, guided[i], "give one of 'structured_outputs', 'guided_regex', 'guided_choice', "
                             "'guided_json', 'guided_grammar' and 'grammar'");
        given = guided[i];
    }
    static const char *const unsupported[] = {"guided_whitespace_pattern", "structural_tag"};
    for (int i = 0; i < 2; i++)
        if (get(root, unsupported[i]))
            return bad_param(err, unsupported[i], "'%s' is not supported", unsupported[i]);
    if (!so && !given) return 0;
    if (req->constraint)
        return bad_param(err, so ? "structured_outputs" : given, "'%s' beside 'response_format' %s is not supported "
                         "(the answer cannot follow both)", so ? "structured_outputs" : given, "json_object / json_schema");
    *param = so ? "structured_outputs" : given;
    if (given) {
        json_t *v = get(root, given);
        if (!strcmp(given, "guided_regex")) return compile_regex_field(v, "guided_regex", req, err);
        if (!strcmp(given, "guided_choice")) return compile_choice_field(v, "guided_choice", req, err);
        if (!strcmp(given, "guided_json")) return compile_json_field(v, "guided_json", req, err);
        return compile_grammar_field(v, given, req, err);
    }
    if (!json_is_object(so)) return bad_param(err, "structured_outputs", "'structured_outputs' must be an object");
    static const char *const kinds[] = {"regex", "choice", "json", "json_object", "grammar"};
    const char *key;
    json_t *v, *chosen = NULL;
    const char *chosen_key = NULL;
    json_object_foreach(so, key, v) {
        if (json_is_null(v)) continue;
        bool known = false;
        for (int i = 0; i < 5; i++) known |= !strcmp(key, kinds[i]);
        if (known) {
            if (chosen)
                return bad_param(err, "structured_outputs", "'structured_outputs' takes one of 'regex', 'choice', "
                                 "'json', 'json_object' and 'grammar', not both '%s' and '%s'", chosen_key, key);
            chosen = v, chosen_key = key;
        } else {
            return bad_param(err, "structured_outputs", "'structured_outputs.%.100s' is not supported (only 'regex', "
                             "'choice', 'json', 'json_object' and 'grammar')", key);
        }
    }
    if (!chosen)
        return bad_param(err, "structured_outputs", "'structured_outputs' needs one of 'regex', 'choice', 'json', "
                         "'json_object' and 'grammar'");
    if (!strcmp(chosen_key, "regex")) return compile_regex_field(chosen, "structured_outputs.regex", req, err);
    if (!strcmp(chosen_key, "choice")) return compile_choice_field(chosen, "structured_outputs.choice", req, err);
    if (!strcmp(chosen_key, "json")) return compile_json_field(chosen, "structured_outputs.json", req, err);
    if (!strcmp(chosen_key, "grammar")) return compile_grammar_field(chosen, "structured_outputs.grammar", req, err);
    if (!json_is_true(chosen))
        return bad_param(err, "structured_outputs.json_object", "'structured_outputs.json_object' must be true");
    req->constraint = constraint_from_json(json_constraint_object());
    return 0;
}

// llama.cpp's lazy grammars: "grammar_lazy": true beside `grammar` and "grammar_triggers":
// [{"type": 1, "value": WORD}, ...] (1: llama.cpp's word trigger): the answer is free text
// until one of the words, then a sentence of the grammar that starts with that word
// (gen/lazy_constraint.h). Token (0) and pattern (2, 3) triggers are refused; without
// grammar_lazy (false, the default) an absent or empty trigger list changes nothing.
static int parse_grammar_lazy(json_t *root, const char *constraint_param, OpenAIRequest *req, OpenAIError *err) {
    bool lazy = false;
    if (get_bool(root, "grammar_lazy", &lazy, err) != 0) return -1;
    json_t *triggers = get(root, "grammar_triggers");
    if (triggers && !json_is_array(triggers))
        return bad_param(err, "grammar_triggers", "'grammar_triggers' must be a list");
    const size_t n = json_array_size(triggers);
    if (!lazy) {
        if (n > 0) return bad_param(err, "grammar_triggers", "'grammar_triggers' needs \"grammar_lazy\": true");
        return 0;
    }
    if (!req->constraint || strcmp(constraint_param, "grammar") != 0)
        return bad_param(err, "grammar_lazy", "'grammar_lazy' needs a 'grammar'");
    if (n == 0) return bad_param(err, "grammar_triggers", "'grammar_lazy' needs a non-empty 'grammar_triggers'");
    if (n > LAZY_MAX_TRIGGERS)
        return bad_param(err, "grammar_triggers", "too many grammar_triggers (%zu; at most %d)", n, LAZY_MAX_TRIGGERS);
    LazyTrigger list[LAZY_MAX_TRIGGERS];
    for (size_t i = 0; i < n; i++) {
        json_t *trigger = json_array_get(triggers, i);
        json_t *type = json_object_get(trigger, "type"), *value = json_object_get(trigger, "value");
        if (!json_is_object(trigger) || !json_is_integer(type) || !json_is_string(value) || json_string_length(value) == 0)
            return bad_param(err, "grammar_triggers", "grammar_triggers[%zu] must be {\"type\": 1, \"value\": a "
                             "non-empty string}", i);
        if (json_integer_value(type) != 1)
            return bad_param(err, "grammar_triggers", "grammar_triggers[%zu].type %lld is not supported (only 1, a "
                             "word; not token or pattern triggers)", i, (long long)json_integer_value(type));
        list[i] = (LazyTrigger){json_string_value(value), json_string_length(value), false};
    }
    Constraint *grammar = req->constraint;
    req->constraint = NULL;
    LazyConstraint *lazy_grammar = NULL;
    if (lazy_constraint_new(&lazy_grammar, grammar, list, (int)n, "grammar_triggers") != 0)
        return bad_param(err, "grammar_triggers", "%s", err_msg());
    req->constraint = constraint_from_lazy(lazy_grammar);
    return 0;
}

// Chat: logprobs a boolean, top_logprobs 0..20 (more than 0 only with logprobs). Completions:
// logprobs the number of alternatives, 0..5 (false, null or absent: none); top_logprobs is
// chat's, and only its neutral 0 is let through there.
static int parse_logprobs(json_t *root, OpenAIKind kind, OpenAIRequest *req, OpenAIError *err) {
    long long top = 0;
    if (kind == OPENAI_CHAT) {
        if (get_bool(root, "logprobs", &req->logprobs, err) != 0) return -1;
        if (get_int(root, "top_logprobs", 0, OPENAI_MAX_TOP_LOGPROBS, &top, err) != 0) return -1;
        if (top > 0 && !req->logprobs)
            return bad_param(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        req->top_logprobs = (int)top;
        return 0;
    }
    json_t *v = get(root, "top_logprobs");
    if (v && !(json_is_integer(v) && json_integer_value(v) == 0))
        return bad_param(err, "top_logprobs", "'top_logprobs' is a chat parameter: /v1/completions takes 'logprobs': k");
    v = get(root, "logprobs");
    if (!v || json_is_false(v)) return 0;
    if (get_int(root, "logprobs", 0, OPENAI_MAX_LEGACY_LOGPROBS, &top, err) != 0) return -1;
    req->logprobs = true;
    req->top_logprobs = (int)top;
    return 0;
}

static const char *static_role(const char *role) {
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0) return roles[i];
    return NULL;
}

// A message content: a string, or text parts joined by newlines (as vLLM joins them).
static char *message_content(json_t *content, size_t index, OpenAIError *err) {
    if (json_is_string(content)) return xstrdup(json_string_value(content));
    if (!json_is_array(content)) {
        bad_param(err, "messages", "messages[%zu].content must be a string or a list of text parts", index);
        return NULL;
    }
    size_t total = 1;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *part = json_array_get(content, i);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            bad_param(err, "messages", "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": string}", index, i);
            return NULL;
        }
        total += json_string_length(text) + 1;
    }
    char *out = xmalloc(total), *at = out;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *text = json_object_get(json_array_get(content, i), "text");
        if (i > 0) *at++ = '\n';
        memcpy(at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    *at = '\0';
    return out;
}

// A non-empty string (names of tools and calls).
static bool is_name(json_t *v) { return json_is_string(v) && json_string_length(v) > 0; }

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": a JSON string (or the value itself)}}]. The arguments are kept as JSON text
// that parses (the template renders the parsed value, as vLLM hands it a dict).
static int parse_tool_calls(json_t *calls, size_t index, ChatMessage *message, OpenAIError *err) {
    if (!json_is_array(calls))
        return bad_param(err, "messages", "messages[%zu].tool_calls must be a list", index);
    size_t n = json_array_size(calls);
    if (n == 0) return 0;
    if (n > 1000) return bad_param(err, "messages", "messages[%zu].tool_calls: too many calls (%zu)", index, n);
    ChatToolCall *parsed = xcalloc(n, sizeof *parsed);
    message->tool_calls = parsed;
    for (size_t j = 0; j < n; j++) {
        json_t *call = json_array_get(calls, j), *function = json_object_get(call, "function");
        if (!json_is_object(call) || !json_is_object(function))
            return bad_param(err, "messages", "messages[%zu].tool_calls[%zu] must be {\"type\": \"function\", "
                             "\"function\": {\"name\", \"arguments\"}}", index, j);
        json_t *type = get(call, "type"), *id = get(call, "id");
        if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
            return bad_param(err, "messages", "messages[%zu].tool_calls[%zu].type must be \"function\"", index, j);
        if (id && !json_is_string(id))
            return bad_param(err, "messages", "messages[%zu].tool_calls[%zu].id must be a string", index, j);
        json_t *name = json_object_get(function, "name"), *arguments = json_object_get(function, "arguments");
        if (!is_name(name))
            return bad_param(err, "messages", "messages[%zu].tool_calls[%zu].function.name must be a non-empty string",
                             index, j);
        char *text = NULL;
        if (json_is_string(arguments)) {
            json_t *value = json_loads(json_string_value(arguments), JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
            if (value) text = xstrdup(json_string_value(arguments));
            json_decref(value);
        } else if (json_is_object(arguments)) {
            text = json_dumps(arguments, JSON_COMPACT);
        }
        if (!text)
            return bad_param(err, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a string "
                             "holding JSON", index, j);
        parsed[j] = (ChatToolCall){xstrdup(json_string_value(name)), text};
        message->num_tool_calls = (int)j + 1;
    }
    return 0;
}

static int parse_messages(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *messages = get(root, "messages");
    if (!messages) return bad_param(err, "messages", "'messages' is required");
    if (!json_is_array(messages)) return bad_param(err, "messages", "'messages' must be a list");
    size_t n = json_array_size(messages);
    if (n == 0) return bad_param(err, "messages", "'messages' must not be empty");
    if (n > 100000) return bad_param(err, "messages", "too many messages (%zu)", n);
    req->messages = xcalloc(n, sizeof(ChatMessage));
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        if (!json_is_object(m)) return bad_param(err, "messages", "messages[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) return bad_param(err, "messages", "messages[%zu].role must be a string", i);
        const char *known = static_role(json_string_value(role));
        if (!known)
            return bad_param(err, "messages", "messages[%zu].role '%.64s' is not one of system, user, assistant, tool",
                             i, json_string_value(role));
        ChatMessage *message = &req->messages[req->num_messages++];
        message->role = known;
        json_t *calls = get(m, "tool_calls"), *call_id = get(m, "tool_call_id");
        if (calls && strcmp(known, "assistant") != 0)
            return bad_param(err, "messages", "messages[%zu] has tool_calls but role '%s' (only assistant messages "
                             "make calls)", i, known);
        if (calls && parse_tool_calls(calls, i, message, err) != 0) return -1;
        if (call_id && !json_is_string(call_id))
            return bad_param(err, "messages", "messages[%zu].tool_call_id must be a string", i);
        // An assistant message that makes calls may have no content (null), as the API allows.
        if (message->num_tool_calls > 0 && (!content || json_is_null(content))) {
            message->content = xstrdup("");
            continue;
        }
        if (!content) return bad_param(err, "messages", "messages[%zu].content is required", i);
        char *text = message_content(content, i, err);
        if (!text) return -1;
        message->content = text;
    }
    return 0;
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}], kept as
// JSON text for the template, which renders each as the client sent it (an empty list
// too: the templates tell it from none as transformers does). tool_choice: "auto" (the
// default), "none", "required" or a named function of `tools` (the server constrains the
// answer to calls). parallel_tool_calls: a boolean (see openai.h).
static int parse_tools(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *tools = get(root, "tools");
    if (tools && !json_is_array(tools)) return bad_param(err, "tools", "'tools' must be a list");
    size_t n = tools ? json_array_size(tools) : 0;
    if (n > 1000) return bad_param(err, "tools", "too many tools (%zu)", n);
    for (size_t i = 0; i < n; i++) {
        json_t *tool = json_array_get(tools, i), *type = json_object_get(tool, "type");
        json_t *function = json_object_get(tool, "function");
        if (!json_is_object(tool)) return bad_param(err, "tools", "tools[%zu] must be an object", i);
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return bad_param(err, "tools", "tools[%zu].type must be \"function\"", i);
        if (!json_is_object(function)) return bad_param(err, "tools", "tools[%zu].function must be an object", i);
        if (!is_name(json_object_get(function, "name")))
            return bad_param(err, "tools", "tools[%zu].function.name must be a non-empty string", i);
        json_t *description = get(function, "description"), *parameters = get(function, "parameters");
        json_t *strict = get(function, "strict");
        if (description && !json_is_string(description))
            return bad_param(err, "tools", "tools[%zu].function.description must be a string", i);
        if (parameters && !json_is_object(parameters))
            return bad_param(err, "tools", "tools[%zu].function.parameters must be an object (a JSON Schema)", i);
        if (strict && !json_is_boolean(strict))
            return bad_param(err, "tools", "tools[%zu].function.strict must be a boolean", i);
    }
    // An empty list reaches the template too (Llama 3.1's tests `tools is not none`).
    if (tools) req->tools_json = json_dumps(tools, JSON_COMPACT);
    req->num_tools = (int)n;
    json_t *choice = get(root, "tool_choice");
    if (json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0) {
        req->tool_choice_none = true;
    } else if (json_is_string(choice) && strcmp(json_string_value(choice), "required") == 0) {
        if (n == 0) return bad_param(err, "tool_choice", "'tool_choice': \"required\" needs a non-empty 'tools'");
        req->tool_choice_required = true;
    } else if (json_is_object(choice)) {
        json_t *type = json_object_get(choice, "type"), *function = json_object_get(choice, "function");
        json_t *name = json_object_get(function, "name");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 || !is_name(name))
            return bad_param(err, "tool_choice", "a named 'tool_choice' must be {\"type\": \"function\", \"function\": "
                             "{\"name\": string}}");
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = json_equal(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"), name);
        if (!found)
            return bad_param(err, "tool_choice", "'tool_choice' names the function '%.100s', which is not in 'tools'",
                             json_string_value(name));
        req->tool_choice_name = xstrdup(json_string_value(name));
    } else if (choice && !(json_is_string(choice) && strcmp(json_string_value(choice), "auto") == 0)) {
        return bad_param(err, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\"}}");
    }
    req->parallel_tool_calls = true;
    return get_bool(root, "parallel_tool_calls", &req->parallel_tool_calls, err);
}

static int parse_ids(json_t *array, OpenAIRequest *req, OpenAIError *err) {
    size_t n = json_array_size(array);
    if (n == 0) return bad_param(err, "prompt", "'prompt' must not be empty");
    if (n > INT_MAX / 2) return bad_param(err, "prompt", "'prompt' is too long");
    req->prompt_ids = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        json_t *id = json_array_get(array, i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT_MAX)
            return bad_param(err, "prompt", "prompt[%zu] is not a token id", i);
        req->prompt_ids[i] = (int)json_integer_value(id);
    }
    req->num_prompt_ids = (int)n;
    return 0;
}

// One prompt per request: a string, [string], token ids or [token ids].
static int parse_prompt(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *prompt = get(root, "prompt");
    if (!prompt) return bad_param(err, "prompt", "'prompt' is required");
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        (json_is_string(json_array_get(prompt, 0)) || json_is_array(json_array_get(prompt, 0))))
        prompt = json_array_get(prompt, 0);
    if (json_is_string(prompt)) {
        req->prompt = xstrdup(json_string_value(prompt));
        return 0;
    }
    if (json_is_array(prompt)) {
        json_t *first = json_array_get(prompt, 0);
        if (json_is_string(first) || json_is_array(first))
            return bad_param(err, "prompt", "only one prompt per request is supported");
        return parse_ids(prompt, req, err);
    }
    return bad_param(err, "prompt", "'prompt' must be a string or a list of token ids");
}

static int parse_stop(json_t *root, OpenAIRequest *req, OpenAIError *err) {
    json_t *stop = get(root, "stop");
    if (!stop) return 0;
    json_t *single[1] = {stop};
    size_t n = 1;
    if (json_is_array(stop)) {
        n = json_array_size(stop);
        if (n > OPENAI_MAX_STOP) return bad_param(err, "stop", "'stop' holds at most %d strings", OPENAI_MAX_STOP);
    } else if (!json_is_string(stop)) {
        return bad_param(err, "stop", "'stop' must be a string or a list of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(stop) ? json_array_get(stop, i) : single[0];
        if (!json_is_string(s)) return bad_param(err, "stop", "'stop' must be a string or a list of strings");
        if (json_string_length(s) == 0) return bad_param(err, "stop", "stop strings must not be empty");
        if (strlen(json_string_value(s)) != json_string_length(s))
            return bad_param(err, "stop", "stop strings must not contain NUL");
        req->stop[req->num_stop++] = xstrdup(json_string_value(s));
    }
    return 0;
}

static int parse_fields(json_t *root, OpenAIKind kind, const OpenAILimits *limits, OpenAIRequest *req,
                        OpenAIError *err) {
    if (!json_is_object(root)) return bad_param(err, NULL, "the request body must be a JSON object");
    json_t *model = get(root, "model");
    if (model && !json_is_string(model)) return bad_param(err, "model", "'model' must be a string");
    if (model && strcmp(json_string_value(model), limits->model_name) != 0)
        return openai_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                                "The model '%.200s' does not exist (this server serves '%.200s')",
                                json_string_value(model), limits->model_name);
    if (check_unsupported(root, kind, err) != 0) return -1;

    long long n = 1, max_tokens = limits->default_max_tokens, top_k = 0, seed = 0;
    if (get_int(root, "n", 1, OPENAI_MAX_CHOICES, &n, err) != 0) return -1;
    req->n = (int)n;
    const char *max_key = get(root, "max_tokens") ? "max_tokens" : "max_completion_tokens";
    if (get_int(root, max_key, 1, limits->max_tokens_limit, &max_tokens, err) != 0) return -1;
    req->max_tokens = (int)max_tokens;
    req->temperature = 1.0;
    req->top_p = 1.0;
    if (get_number(root, "temperature", 0, 2, false, &req->temperature, err) != 0) return -1;
    if (get_number(root, "top_p", 0, 1, true, &req->top_p, err) != 0) return -1;
    if (get_int(root, "top_k", -1, INT_MAX, &top_k, err) != 0) return -1;
    req->top_k = top_k < 0 ? 0 : (int)top_k;
    // OpenAI's penalties, and vLLM's min_p and repetition_penalty (gen/sampler.h).
    req->repetition_penalty = 1.0;
    if (get_number(root, "presence_penalty", -2, 2, false, &req->presence_penalty, err) != 0) return -1;
    if (get_number(root, "frequency_penalty", -2, 2, false, &req->frequency_penalty, err) != 0) return -1;
    if (get_number(root, "min_p", 0, 1, false, &req->min_p, err) != 0) return -1;
    if (get_number(root, "repetition_penalty", 0, 100, true, &req->repetition_penalty, err) != 0) return -1;
    if (parse_logit_bias(root, req, err) != 0) return -1;
    if (get(root, "seed")) {
        if (get_int(root, "seed", LLONG_MIN, LLONG_MAX, &seed, err) != 0) return -1;
        req->has_seed = true;
        req->seed = (uint64_t)seed;
    }
    if (parse_stop(root, req, err) != 0) return -1;
    if (parse_logprobs(root, kind, req, err) != 0) return -1;
    if (get_bool(root, "stream", &req->stream, err) != 0) return -1;
    json_t *options = get(root, "stream_options");
    if (options) {
        if (!json_is_object(options)) return bad_param(err, "stream_options", "'stream_options' must be an object");
        if (get_bool(options, "include_usage", &req->include_usage, err) != 0) return -1;
    }
    if (parse_response_format(root, req, err) != 0) return -1;
    const char *constraint_param = "response_format"; // the field that set req->constraint
    if (parse_structured_outputs(root, req, &constraint_param, err) != 0) return -1;
    if (parse_grammar_lazy(root, constraint_param, req, err) != 0) return -1;
    if (kind == OPENAI_COMPLETION) return parse_prompt(root, req, err);
    if (parse_tools(root, req, err) != 0) return -1;
    if (parse_template_kwargs(root, req, err) != 0) return -1;
    if (req->constraint && (req->tool_choice_required || req->tool_choice_name))
        return bad_param(err, constraint_param, "'%s' beside a 'tool_choice' that forces calls is not supported (the "
                         "answer cannot be both)", constraint_param);
    return parse_messages(root, req, err);
}

json_t *openai_parse_json_body(const char *body, size_t size, OpenAIError *err) {
    json_error_t json_error;
    json_t *root = json_loadb(body, size, JSON_REJECT_DUPLICATES, &json_error);
    if (!root)
        openai_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                         "invalid JSON in the request body: %s (line %d, column %d)", json_error.text, json_error.line,
                         json_error.column);
    return root;
}

int openai_parse_request(OpenAIKind kind, const char *body, size_t size, const OpenAILimits *limits,
                         OpenAIRequest *req, OpenAIError *err) {
    memset(req, 0, sizeof *req);
    req->kind = kind;
    json_t *root = openai_parse_json_body(body, size, err);
    if (!root) return -1;
    int rc = parse_fields(root, kind, limits, req, err);
    json_decref(root);
    if (rc != 0) {
        openai_request_free(req);
        req->kind = kind;
    }
    return rc;
}

void openai_request_free(OpenAIRequest *req) {
    for (int i = 0; i < req->num_messages; i++) {
        ChatMessage *message = &req->messages[i];
        free((char *)message->content);
        for (int j = 0; j < message->num_tool_calls; j++) {
            free((char *)message->tool_calls[j].name);
            free((char *)message->tool_calls[j].arguments);
        }
        free((ChatToolCall *)message->tool_calls);
    }
    free(req->tools_json);
    free(req->template_kwargs_json);
    free(req->logit_bias);
    free(req->tool_choice_name);
    constraint_free(req->constraint);
    free(req->messages);
    free(req->prompt);
    free(req->prompt_ids);
    for (int i = 0; i < req->num_stop; i++) free(req->stop[i]);
    memset(req, 0, sizeof *req);
}

static char *dump(json_t *o) {
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    CHECK(text, "cannot serialise a response");
    return text;
}

static json_t *nullable_string(const char *s) { return s ? json_string(s) : json_null(); }

char *openai_error_json(const OpenAIError *err) {
    // The message may quote the request; bytes that are not UTF-8 would make it unencodable.
    json_t *message = json_string(err->message);
    if (!message) message = json_string("invalid request (the message could not be encoded)");
    json_t *e = json_object();
    json_object_set_new(e, "message", message);
    json_object_set_new(e, "type", json_string(err->type ? err->type : "invalid_request_error"));
    json_object_set_new(e, "param", nullable_string(err->param));
    json_object_set_new(e, "code", nullable_string(err->code));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return dump(o);
}

static json_t *model_object(const char *model_name, long created) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string("marlhf"));
    return m;
}

char *openai_model_json(const char *model_name, long created) { return dump(model_object(model_name, created)); }

char *openai_models_json(const char *model_name, long created) {
    json_t *data = json_array();
    json_array_append_new(data, model_object(model_name, created));
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    return dump(o);
}

static json_t *head_object(const OpenAIResponseHead *head, bool chunk) {
    const char *object = head->kind == OPENAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion";
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(head->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(head->created));
    json_object_set_new(o, "model", json_string(head->model));
    return o;
}

static json_t *usage_object(const OpenAIResponseHead *head, int prompt_tokens, int completion_tokens) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt_tokens));
    json_object_set_new(u, "completion_tokens", json_integer(completion_tokens));
    json_object_set_new(u, "total_tokens", json_integer(prompt_tokens + completion_tokens));
    json_t *details = json_object();
    json_object_set_new(details, "cached_tokens", json_integer(head->cached_tokens));
    json_object_set_new(u, "prompt_tokens_details", details);
    return u;
}

// Decoded text is valid UTF-8 by construction; the fallback only keeps a surprise from
// becoming a crash.
static json_t *text_value(const char *text, size_t len) {
    json_t *s = json_stringn(text, len);
    return s ? s : json_string("\xEF\xBF\xBD");
}

// JSON has no infinities; -9999.0 is what vLLM reports for them too.
static json_t *logprob_value(float logprob) { return json_real(isfinite(logprob) ? logprob : -9999.0); }

// Chat's view of a token: {"token", "logprob", "bytes"}.
static json_t *chat_token_object(const OpenAIToken *token) {
    json_t *bytes = json_array();
    for (size_t i = 0; i < token->len; i++) json_array_append_new(bytes, json_integer((unsigned char)token->text[i]));
    json_t *o = json_object();
    json_object_set_new(o, "token", text_value(token->text, token->len));
    json_object_set_new(o, "logprob", logprob_value(token->logprob));
    json_object_set_new(o, "bytes", bytes);
    return o;
}

// {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}
static json_t *chat_logprobs_object(const OpenAILogprobs *logprobs) {
    json_t *content = json_array();
    for (int i = 0; i < logprobs->count; i++) {
        const OpenAILogprobEntry *entry = &logprobs->entries[i];
        json_t *o = chat_token_object(&entry->token), *top = json_array();
        for (int j = 0; j < entry->num_top; j++) json_array_append_new(top, chat_token_object(&entry->top[j]));
        json_object_set_new(o, "top_logprobs", top);
        json_array_append_new(content, o);
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

// A key of a legacy top_logprobs object, unless the object has it already (tokens whose
// texts are equal: the first, most likely one keeps the key).
static void set_token_key(json_t *object, const OpenAIToken *token) {
    if (!json_object_getn(object, token->text, token->len))
        json_object_setn_new(object, token->text, token->len, logprob_value(token->logprob));
}

// OpenAI's legacy shape: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, one
// element per token in each list.
static json_t *completion_logprobs_object(const OpenAILogprobs *logprobs) {
    json_t *tokens = json_array(), *token_logprobs = json_array(), *top_logprobs = json_array(),
           *text_offset = json_array();
    for (int i = 0; i < logprobs->count; i++) {
        const OpenAILogprobEntry *entry = &logprobs->entries[i];
        json_array_append_new(tokens, text_value(entry->token.text, entry->token.len));
        json_array_append_new(token_logprobs, logprob_value(entry->token.logprob));
        json_array_append_new(text_offset, json_integer(entry->text_offset));
        if (entry->num_top == 0) {
            json_array_append_new(top_logprobs, json_null());
            continue;
        }
        json_t *top = json_object();
        for (int j = 0; j < entry->num_top; j++) set_token_key(top, &entry->top[j]);
        set_token_key(top, &entry->token); // the chosen token always has its log-prob there
        json_array_append_new(top_logprobs, top);
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", token_logprobs);
    json_object_set_new(o, "top_logprobs", top_logprobs);
    json_object_set_new(o, "text_offset", text_offset);
    return o;
}

static json_t *logprobs_value(OpenAIKind kind, const OpenAILogprobs *logprobs) {
    if (!logprobs) return json_null();
    return kind == OPENAI_CHAT ? chat_logprobs_object(logprobs) : completion_logprobs_object(logprobs);
}

// {"id", "type": "function", "function": {"name", "arguments"}}, with "index" first when
// index >= 0 (a stream's delta).
static json_t *tool_call_object(const OpenAIToolCall *call, int index) {
    json_t *function = json_object();
    json_object_set_new(function, "name", text_value(call->name, strlen(call->name)));
    json_object_set_new(function, "arguments", text_value(call->arguments, strlen(call->arguments)));
    json_t *o = json_object();
    if (index >= 0) json_object_set_new(o, "index", json_integer(index));
    json_object_set_new(o, "id", json_string(call->id));
    json_object_set_new(o, "type", json_string("function"));
    json_object_set_new(o, "function", function);
    return o;
}

char *openai_completion_json(const OpenAIResponseHead *head, const OpenAIChoice *choices, int num_choices,
                             int prompt_tokens, int completion_tokens) {
    json_t *array = json_array();
    for (int i = 0; i < num_choices; i++) {
        json_t *choice = json_object();
        json_object_set_new(choice, "index", json_integer(i));
        json_t *text = choices[i].text ? text_value(choices[i].text, choices[i].len) : json_null();
        if (head->kind == OPENAI_CHAT) {
            json_t *message = json_object();
            json_object_set_new(message, "role", json_string("assistant"));
            json_object_set_new(message, "content", text);
            if (choices[i].num_tool_calls > 0) {
                json_t *calls = json_array();
                for (int k = 0; k < choices[i].num_tool_calls; k++)
                    json_array_append_new(calls, tool_call_object(&choices[i].tool_calls[k], -1));
                json_object_set_new(message, "tool_calls", calls);
            }
            json_object_set_new(choice, "message", message);
        } else {
            json_object_set_new(choice, "text", text);
        }
        json_object_set_new(choice, "logprobs", logprobs_value(head->kind, choices[i].logprobs));
        json_object_set_new(choice, "finish_reason", nullable_string(choices[i].finish_reason));
        json_array_append_new(array, choice);
    }
    json_t *o = head_object(head, false);
    json_object_set_new(o, "choices", array);
    json_object_set_new(o, "usage", usage_object(head, prompt_tokens, completion_tokens));
    return dump(o);
}

char *openai_chunk_json(const OpenAIResponseHead *head, int index, bool with_role, const char *text, size_t len,
                        const OpenAILogprobs *logprobs, const char *finish_reason) {
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(index));
    if (head->kind == OPENAI_CHAT) {
        json_t *delta = json_object();
        if (with_role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", text_value(text, len));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", text ? text_value(text, len) : json_string(""));
    }
    json_object_set_new(choice, "logprobs", logprobs_value(head->kind, logprobs));
    json_object_set_new(choice, "finish_reason", nullable_string(finish_reason));
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_t *o = head_object(head, true);
    json_object_set_new(o, "choices", choices);
    return dump(o);
}

char *openai_tool_call_chunk_json(const OpenAIResponseHead *head, int index, int call_index,
                                  const OpenAIToolCall *call, const OpenAILogprobs *logprobs) {
    json_t *calls = json_array();
    json_array_append_new(calls, tool_call_object(call, call_index));
    json_t *delta = json_object();
    json_object_set_new(delta, "tool_calls", calls);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(index));
    json_object_set_new(choice, "delta", delta);
    json_object_set_new(choice, "logprobs", logprobs_value(head->kind, logprobs));
    json_object_set_new(choice, "finish_reason", json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_t *o = head_object(head, true);
    json_object_set_new(o, "choices", choices);
    return dump(o);
}

char *openai_usage_chunk_json(const OpenAIResponseHead *head, int prompt_tokens, int completion_tokens) {
    json_t *o = head_object(head, true);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_object(head, prompt_tokens, completion_tokens));
    return dump(o);
}
