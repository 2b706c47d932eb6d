// One parser per dataset schema; the rules are documented in data/dataset.h.
#include "data/adapters.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "chat/chat_template.h"
#include "chat/prompt_format.h"
#include "core/check.h"
#include "io/jsonl.h"

// --- field access with messages that name the field --------------------------------

static int missing_field(const DataRowPlace *at, const char *field) {
    return err_set("missing field \"%s\" (%s:%ld)", field, at->path, at->line);
}

static int wrong_type(const DataRowPlace *at, const char *field, const json_t *value, const char *expected) {
    return err_set("field \"%s\" is %s, expected %s (%s:%ld)", field, json_kind(value), expected, at->path,
                   at->line);
}

// jansson keeps a "\u0000" escape only under JSON_ALLOW_NUL (never set here), so every
// string is a proper C string; json_string_length() is checked anyway for the inner JSON
// texts of APPS, decoded separately.
static int get_string(const json_t *object, const char *key, const char *field, const DataRowPlace *at,
                      const char **out) {
    json_t *value = json_object_get(object, key);
    if (!value) return missing_field(at, field);
    if (!json_is_string(value)) return wrong_type(at, field, value, "a string");
    *out = json_string_value(value);
    return 0;
}

// A string, or NULL for null or an absent field.
static int get_optional_string(const json_t *object, const char *key, const char *field, const DataRowPlace *at,
                               const char **out) {
    json_t *value = json_object_get(object, key);
    *out = NULL;
    if (!value || json_is_null(value)) return 0;
    if (!json_is_string(value)) return wrong_type(at, field, value, "a string or null");
    *out = json_string_value(value);
    return 0;
}

static int get_object(const json_t *object, const char *key, const char *field, const DataRowPlace *at,
                      json_t **out) {
    json_t *value = json_object_get(object, key);
    if (!value) return missing_field(at, field);
    if (!json_is_object(value)) return wrong_type(at, field, value, "an object");
    *out = value;
    return 0;
}

static int get_array(const json_t *object, const char *key, const char *field, const DataRowPlace *at,
                     json_t **out) {
    json_t *value = json_object_get(object, key);
    if (!value) return missing_field(at, field);
    if (!json_is_array(value)) return wrong_type(at, field, value, "an array");
    *out = value;
    return 0;
}

static int get_number(const json_t *object, const char *key, const char *field, const DataRowPlace *at,
                      double *out) {
    json_t *value = json_object_get(object, key);
    if (!value) return missing_field(at, field);
    if (!json_is_number(value)) return wrong_type(at, field, value, "a number");
    *out = json_number_value(value);
    return 0;
}

static char *copy_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

// The concatenation of the NULL-terminated list of strings, xmalloc'd.
static char *concat(const char *first, ...) {
    size_t total = 0;
    va_list args;
    va_start(args, first);
    for (const char *s = first; s; s = va_arg(args, const char *)) total += strlen(s);
    va_end(args);
    char *out = xmalloc(total + 1), *end = out;
    va_start(args, first);
    for (const char *s = first; s; s = va_arg(args, const char *)) {
        size_t length = strlen(s);
        memcpy(end, s, length);
        end += length;
    }
    va_end(args);
    *end = '\0';
    return out;
}

// --- TL;DR: openai/summarize_from_feedback, comparisons --------------------------

static int parse_tldr(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    json_t *info = NULL, *summaries = NULL, *choice;
    const char *post = NULL, *article = NULL, *subreddit = NULL, *id = NULL, *texts[2] = {NULL, NULL};
    if (get_object(row, "info", "info", at, &info) != 0) return -1;
    if (get_optional_string(info, "post", "info.post", at, &post) != 0) return -1;
    if (get_optional_string(info, "article", "info.article", at, &article) != 0) return -1;
    if (!post && !article) return err_set("missing field \"info.post\" (or \"info.article\") (%s:%ld)", at->path, at->line);
    if (get_optional_string(info, "subreddit", "info.subreddit", at, &subreddit) != 0) return -1;
    if (get_optional_string(info, "id", "info.id", at, &id) != 0) return -1;
    if (get_array(row, "summaries", "summaries", at, &summaries) != 0) return -1;
    if (json_array_size(summaries) != 2)
        return err_set("field \"summaries\" has %zu entries, expected 2 (%s:%ld)", json_array_size(summaries),
                       at->path, at->line);
    for (size_t k = 0; k < 2; k++) {
        char field[32];
        snprintf(field, sizeof field, "summaries[%zu]", k);
        json_t *summary = json_array_get(summaries, k);
        if (!json_is_object(summary)) return wrong_type(at, field, summary, "an object");
        snprintf(field, sizeof field, "summaries[%zu].text", k);
        if (get_string(summary, "text", field, at, &texts[k]) != 0) return -1;
    }
    choice = json_object_get(row, "choice");
    if (!choice) return missing_field(at, "choice");
    if (!json_is_integer(choice)) return wrong_type(at, "choice", choice, "0 or 1");
    json_int_t chosen = json_integer_value(choice);
    if (chosen != 0 && chosen != 1)
        return err_set("field \"choice\" is %lld, expected 0 or 1 (%s:%ld)", (long long)chosen, at->path, at->line);

    record->is_article = post == NULL; // the reference tests the post first
    CHECK(prompt_format_tldr(subreddit, post ? post : article, record->is_article, &record->prompt) == 0,
          "prompt_format_tldr failed");
    record->chosen = xstrdup(texts[chosen]);
    record->rejected = xstrdup(texts[1 - chosen]);
    record->subreddit = copy_or_null(subreddit);
    record->id = copy_or_null(id);
    return 0;
}

// --- HH-RLHF (Dahoas/full-hh-rlhf, Dahoas/rm-static) and local pairs --------------

// Bytes in the UTF-8 character that starts with `lead` (jansson's strings are valid UTF-8).
static size_t utf8_lead_width(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// TRL's extract_prompt on text (trl/data_utils.py), in bytes: the prompt is the longest
// common prefix of the two strings, compared character by character (Unicode code points,
// as Python indexes a str, so a prefix never ends inside a character). When they differ
// right after a space, the space goes to the responses. When one string is a prefix of the
// other, or they are equal, Python's loop ends on its last index, so the last shared
// character goes to the responses too. Returns 0 when there is no prompt: the strings
// differ at their first character (where TRL would index chosen[-1]), or one is empty
// (where TRL's loop never binds its index and raises).
static size_t text_prompt_length(const char *chosen, const char *rejected) {
    size_t chosen_length = strlen(chosen), rejected_length = strlen(rejected);
    size_t at = 0, previous = 0; // byte offsets of this character and of the one before
    while (at < chosen_length && at < rejected_length) {
        size_t width = utf8_lead_width((unsigned char)chosen[at]);
        if (at + width > rejected_length || memcmp(chosen + at, rejected + at, width) != 0)
            return at > 0 && chosen[previous] == ' ' ? previous : at;
        previous = at;
        at += width;
    }
    return previous;
}

// Text pairs: {prompt, chosen, rejected} strings; or the implicit-prompt {chosen,
// rejected}, whose prompt is their shared start (text_prompt_length). As TRL's
// maybe_extract_prompt, a "prompt" that is a list beside text responses is not the
// prompt of this pair: the prompt is extracted then too. HH-RLHF's rows (Dahoas's schema)
// always carry their prompt: `prompt_required` says it is read, never extracted.
static int parse_pairs(const json_t *row, const DataRowPlace *at, bool prompt_required, DataRecord *record) {
    const char *prompt = NULL, *chosen = NULL, *rejected = NULL;
    const json_t *given = json_object_get(row, "prompt");
    if (prompt_required && get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
    if (get_string(row, "chosen", "chosen", at, &chosen) != 0) return -1;
    if (get_string(row, "rejected", "rejected", at, &rejected) != 0) return -1;
    if (given && !json_is_array(given)) {
        if (get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
        record->prompt = xstrdup(prompt);
        record->chosen = xstrdup(chosen);
        record->rejected = xstrdup(rejected);
        return 0;
    }
    size_t split = text_prompt_length(chosen, rejected);
    if (split == 0)
        return err_set("fields \"chosen\" and \"rejected\" share no leading text to use as the prompt (%s:%ld)",
                       at->path, at->line);
    record->prompt = xstrndup(chosen, split);
    record->chosen = xstrdup(chosen + split);
    record->rejected = xstrdup(rejected + split);
    return 0;
}

// --- WebGPT: openai/webgpt_comparisons ---------------------------------------------

static int parse_webgpt(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    json_t *question = NULL;
    const char *full_text = NULL, *id = NULL, *answers[2] = {NULL, NULL};
    double scores[2] = {0, 0};
    if (get_object(row, "question", "question", at, &question) != 0) return -1;
    if (get_string(question, "full_text", "question.full_text", at, &full_text) != 0) return -1;
    if (get_optional_string(question, "id", "question.id", at, &id) != 0) return -1;
    if (get_string(row, "answer_0", "answer_0", at, &answers[0]) != 0) return -1;
    if (get_string(row, "answer_1", "answer_1", at, &answers[1]) != 0) return -1;
    if (get_number(row, "score_0", "score_0", at, &scores[0]) != 0) return -1;
    if (get_number(row, "score_1", "score_1", at, &scores[1]) != 0) return -1;
    int better = scores[0] >= scores[1] ? 0 : 1; // a tie goes to answer_0
    CHECK(prompt_format_webgpt(full_text, &record->prompt) == 0, "prompt_format_webgpt failed");
    CHECK(prompt_format_webgpt_response(answers[better], &record->chosen) == 0, "webgpt response failed");
    CHECK(prompt_format_webgpt_response(answers[1 - better], &record->rejected) == 0, "webgpt response failed");
    record->id = copy_or_null(id);
    return 0;
}

// --- APPS: codeparrot/apps -------------------------------------------------------------

// Decodes the JSON text held in string field `field`; NULL text ("") is fine.
static int decode_inner_json(const char *text, const char *field, const DataRowPlace *at, json_t **out) {
    json_error_t error;
    *out = json_loads(text, 0, &error);
    if (!*out)
        return err_set("field \"%s\" does not hold valid JSON: %s at its character %d (%s:%ld)", field, error.text,
                       error.position, at->path, at->line);
    return 0;
}

// solutions: "" or a JSON list of strings. *first: a copy of the first one, or NULL.
static int check_solutions(const char *text, const DataRowPlace *at, char **first) {
    *first = NULL;
    if (!*text) return 0;
    json_t *list = NULL;
    if (decode_inner_json(text, "solutions", at, &list) != 0) return -1;
    int rc = 0;
    if (!json_is_array(list)) {
        rc = err_set("field \"solutions\" holds %s, expected a JSON list of strings (%s:%ld)", json_kind(list),
                     at->path, at->line);
    } else {
        size_t index;
        json_t *solution;
        json_array_foreach(list, index, solution) {
            if (!json_is_string(solution)) {
                rc = err_set("field \"solutions\" entry %zu is %s, expected a string (%s:%ld)", index,
                             json_kind(solution), at->path, at->line);
                break;
            }
        }
        if (rc == 0 && json_array_size(list) > 0) *first = xstrdup(json_string_value(json_array_get(list, 0)));
    }
    json_decref(list);
    return rc;
}

// input_output: "" or {"inputs": [...], "outputs": [...], "fn_name"?: string}.
static int check_input_output(const char *text, const DataRowPlace *at, bool *call_based) {
    *call_based = false;
    if (!*text) return 0;
    json_t *tests = NULL;
    if (decode_inner_json(text, "input_output", at, &tests) != 0) return -1;
    int rc = 0;
    if (!json_is_object(tests)) {
        rc = err_set("field \"input_output\" holds %s, expected a JSON object (%s:%ld)", json_kind(tests), at->path,
                     at->line);
    } else {
        const char *keys[2] = {"inputs", "outputs"};
        for (int k = 0; k < 2 && rc == 0; k++) {
            json_t *list = json_object_get(tests, keys[k]);
            if (!json_is_array(list))
                rc = err_set("field \"input_output\" has %s \"%s\", expected a JSON list (%s:%ld)",
                             list ? json_kind(list) : "no", keys[k], at->path, at->line);
        }
        json_t *fn_name = json_object_get(tests, "fn_name");
        if (rc == 0 && fn_name && !json_is_null(fn_name) && !json_is_string(fn_name))
            rc = err_set("field \"input_output\" has %s \"fn_name\", expected a string (%s:%ld)", json_kind(fn_name),
                         at->path, at->line);
        // The APPS code asks `if not data.get("fn_name")`: an empty name means stdin.
        if (rc == 0 && json_is_string(fn_name) && json_string_length(fn_name) > 0) *call_based = true;
    }
    json_decref(tests);
    return rc;
}

static int parse_apps(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const char *question = NULL, *solutions = NULL, *input_output = NULL, *difficulty = NULL, *url = NULL,
               *starter_code = NULL;
    if (get_string(row, "question", "question", at, &question) != 0) return -1;
    if (get_string(row, "solutions", "solutions", at, &solutions) != 0) return -1;
    if (get_string(row, "input_output", "input_output", at, &input_output) != 0) return -1;
    if (get_optional_string(row, "difficulty", "difficulty", at, &difficulty) != 0) return -1;
    if (get_optional_string(row, "url", "url", at, &url) != 0) return -1;
    if (get_optional_string(row, "starter_code", "starter_code", at, &starter_code) != 0) return -1;
    json_t *problem_id = json_object_get(row, "problem_id");
    if (problem_id && !json_is_integer(problem_id)) return wrong_type(at, "problem_id", problem_id, "an integer");
    char *first_solution = NULL;
    bool call_based = false;
    if (check_solutions(solutions, at, &first_solution) != 0) return -1;
    if (check_input_output(input_output, at, &call_based) != 0) {
        free(first_solution);
        return -1;
    }
    if (!starter_code) starter_code = "";
    const char *format_line = call_based ? "\nUse Call-Based format" : "\nUse Standard Input format";
    record->prompt = concat("\nQUESTION:\n", question, *starter_code ? "\n" : "", starter_code, format_line,
                            "\nANSWER:\n", (char *)NULL);
    record->chosen = first_solution;
    record->question = xstrdup(question);
    record->solutions = xstrdup(solutions);
    record->input_output = xstrdup(input_output);
    record->difficulty = copy_or_null(difficulty);
    record->url = copy_or_null(url);
    record->starter_code = xstrdup(starter_code);
    record->call_based = call_based;
    if (problem_id) {
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)json_integer_value(problem_id));
        record->id = xstrdup(id);
    }
    return 0;
}

// --- local formats -------------------------------------------------------------------

static int parse_sft(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const char *prompt = NULL, *response = NULL;
    // TRL's language-modeling rows, {"text"}: the whole text is the response to an empty
    // prompt, so every token of it is trained (after the tokenizer's BOS, if it adds one).
    if (!json_object_get(row, "prompt") && json_object_get(row, "text")) {
        if (get_string(row, "text", "text", at, &response) != 0) return -1;
        record->prompt = xstrdup("");
        record->chosen = xstrdup(response);
        record->text_only = true;
        return 0;
    }
    if (get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
    // TRL's prompt-completion rows name the response "completion".
    const char *key = json_object_get(row, "response") || !json_object_get(row, "completion") ? "response" : "completion";
    if (get_string(row, key, key, at, &response) != 0) return -1;
    record->prompt = xstrdup(prompt);
    record->chosen = xstrdup(response);
    return 0;
}

// A ranking's size: at least 2 responses, and not over a million (a ranking, not a corpus:
// keeps response_count an int).
static int check_ranking_size(size_t count, const DataRowPlace *at) {
    if (count < 2)
        return err_set("field \"responses\" has %zu entr%s, expected at least 2 (%s:%ld)", count,
                       count == 1 ? "y" : "ies", at->path, at->line);
    if (count > 1000000)
        return err_set("field \"responses\" has %zu entries, over 1000000 (%s:%ld)", count, at->path, at->line);
    return 0;
}

static int parse_ranked(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const char *prompt = NULL;
    json_t *responses = NULL;
    if (get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
    if (get_array(row, "responses", "responses", at, &responses) != 0) return -1;
    size_t count = json_array_size(responses);
    if (check_ranking_size(count, at) != 0) return -1;
    for (size_t k = 0; k < count; k++) {
        json_t *response = json_array_get(responses, k);
        if (!json_is_string(response)) {
            char field[48];
            snprintf(field, sizeof field, "responses[%zu]", k);
            return wrong_type(at, field, response, "a string");
        }
    }
    record->prompt = xstrdup(prompt);
    record->responses = xmalloc(count * sizeof *record->responses);
    for (size_t k = 0; k < count; k++) record->responses[k] = xstrdup(json_string_value(json_array_get(responses, k)));
    record->response_count = (int)count;
    return 0;
}

static int parse_unpaired(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const char *prompt = NULL, *completion = NULL;
    if (get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
    if (get_string(row, "completion", "completion", at, &completion) != 0) return -1;
    json_t *label = json_object_get(row, "label");
    if (!label) return missing_field(at, "label");
    if (!json_is_boolean(label)) return wrong_type(at, "label", label, "true or false");
    record->prompt = xstrdup(prompt);
    if (json_is_true(label)) record->chosen = xstrdup(completion);
    else record->rejected = xstrdup(completion);
    return 0;
}

static int parse_prompt_only(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const char *prompt = NULL;
    if (get_string(row, "prompt", "prompt", at, &prompt) != 0) return -1;
    record->prompt = xstrdup(prompt);
    return 0;
}

// --- conversational rows (TRL's message formats) ----------------------------------------

// An assistant message's tool calls, in OpenAI's form (TRL's tool-calling rows, OpenAI's
// fine-tuning files): [{"type": "function", "function": {"name", "arguments"}}, ...], "id"
// and "type" optional; the arguments an object, or a string holding one (chat_data.c says
// how each is rendered). `field` is the message's name, "messages[2]".
static int check_tool_calls(const json_t *calls, const char *field, const DataRowPlace *at) {
    char name[160];
    snprintf(name, sizeof name, "%s.tool_calls", field);
    if (!json_is_array(calls)) return wrong_type(at, name, calls, "a list of tool calls");
    size_t index;
    json_t *call;
    json_array_foreach(calls, index, call) {
        snprintf(name, sizeof name, "%s.tool_calls[%zu]", field, index);
        json_t *function = json_is_object(call) ? json_object_get(call, "function") : NULL;
        if (!json_is_object(function))
            return err_set("field \"%s\" is not {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}} (%s:%ld)",
                           name, at->path, at->line);
        json_t *type = json_object_get(call, "type");
        if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
            return err_set("field \"%s.type\" is not \"function\" (%s:%ld)", name, at->path, at->line);
        const char *text = NULL;
        snprintf(name, sizeof name, "%s.tool_calls[%zu].function.name", field, index);
        if (get_string(function, "name", name, at, &text) != 0) return -1;
        if (!text[0]) return err_set("field \"%s\" is empty (%s:%ld)", name, at->path, at->line);
        snprintf(name, sizeof name, "%s.tool_calls[%zu].function.arguments", field, index);
        json_t *arguments = json_object_get(function, "arguments");
        if (!arguments) return missing_field(at, name);
        if (json_is_string(arguments)) {
            json_t *value = json_loads(json_string_value(arguments), JSON_REJECT_DUPLICATES, NULL);
            bool object = json_is_object(value);
            json_decref(value);
            if (!object) return err_set("field \"%s\" is a string that does not hold a JSON object (%s:%ld)", name,
                                        at->path, at->line);
        } else if (!json_is_object(arguments)) {
            return wrong_type(at, name, arguments, "an object (or a string holding one)");
        }
    }
    return 0;
}

// A list of messages, each an object with string "role" and "content", and an assistant
// message's "tool_calls" (other keys are ignored, as the templates marlhf renders read only
// those: a tool message's "name" too).
static int check_messages(const json_t *list, const char *field, const DataRowPlace *at) {
    if (!json_is_array(list)) return wrong_type(at, field, list, "a list of messages");
    if (json_array_size(list) == 0) return err_set("field \"%s\" is an empty list of messages (%s:%ld)", field, at->path, at->line);
    size_t index;
    json_t *message;
    json_array_foreach(list, index, message) {
        char name[96], place[96];
        snprintf(place, sizeof place, "%s[%zu]", field, index);
        if (!json_is_object(message)) return wrong_type(at, place, message, "an object {\"role\", \"content\"}");
        const char *role = NULL, *text = NULL;
        snprintf(name, sizeof name, "%s[%zu].role", field, index);
        if (get_string(message, "role", name, at, &role) != 0) return -1;
        // An assistant message that makes tool calls may go without content (absent or
        // null), as in OpenAI's form; it is rendered as "".
        json_t *calls = json_object_get(message, "tool_calls");
        bool calling = calls && !json_is_null(calls);
        if (calling && strcmp(role, "assistant") != 0)
            return err_set("field \"%s.tool_calls\" is on a message of role \"%s\": only an assistant message makes "
                           "tool calls (%s:%ld)", place, role, at->path, at->line);
        if (calling && check_tool_calls(calls, place, at) != 0) return -1;
        snprintf(name, sizeof name, "%s[%zu].content", field, index);
        json_t *content = json_object_get(message, "content");
        if (calling && json_array_size(calls) > 0 && (!content || json_is_null(content))) continue;
        if (get_string(message, "content", name, at, &text) != 0) return -1;
    }
    return 0;
}

// A row's "tools" (TRL's tools column: a list of tool objects, or a string holding one,
// which TRL decodes with json.loads), kept in the conversation for the chat template. An
// empty list is no tools, as TRL passes `tools or None`; null or an absent field too.
static int take_tools(const json_t *row, const DataRowPlace *at, json_t *conversation) {
    json_t *tools = json_object_get(row, "tools"), *decoded = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (json_is_string(tools)) {
        json_error_t error;
        decoded = json_loads(json_string_value(tools), JSON_REJECT_DUPLICATES, &error);
        if (!decoded)
            return err_set("field \"tools\" is a string that does not hold JSON: %s at its character %d (%s:%ld)",
                           error.text, error.position, at->path, at->line);
        tools = decoded;
    }
    int rc = 0;
    if (!json_is_array(tools)) {
        rc = err_set("field \"tools\" %s %s, expected a list of tool objects (%s:%ld)", decoded ? "holds" : "is",
                     json_kind(tools), at->path, at->line);
    } else {
        size_t index;
        json_t *tool;
        json_array_foreach(tools, index, tool) {
            if (json_is_object(tool)) continue;
            rc = err_set("field \"tools[%zu]\" is %s, expected a tool object {\"type\": \"function\", \"function\": "
                         "{...}} (%s:%ld)", index, json_kind(tool), at->path, at->line);
            break;
        }
    }
    if (rc == 0 && json_array_size(tools) > 0) json_object_set(conversation, "tools", tools);
    json_decref(decoded);
    return rc;
}

// A row's "chat_template_kwargs" (TRL passes them to apply_chat_template), checked for the
// variables marlhf's templates read (chat_template_apply_kwargs) and kept in the
// conversation. Null or an absent field is none.
static int take_template_kwargs(const json_t *row, const DataRowPlace *at, json_t *conversation) {
    json_t *kwargs = json_object_get(row, "chat_template_kwargs");
    if (!kwargs || json_is_null(kwargs)) return 0;
    if (!json_is_object(kwargs)) return wrong_type(at, "chat_template_kwargs", kwargs, "an object");
    if (chat_template_apply_kwargs(NULL, kwargs) != 0) {
        char *why = xstrdup(err_msg());
        err_set("field %s (%s:%ld)", why, at->path, at->line);
        free(why);
        return -1;
    }
    if (json_object_size(kwargs) > 0) json_object_set(conversation, "chat_template_kwargs", kwargs);
    return 0;
}

// The checked list `key` of the row.
static int get_messages(const json_t *row, const char *key, const DataRowPlace *at, json_t **out) {
    json_t *value = json_object_get(row, key);
    if (!value) return missing_field(at, key);
    if (check_messages(value, key, at) != 0) return -1;
    *out = value;
    return 0;
}

// messages[from, to) as a new list (references taken).
static json_t *message_slice(const json_t *messages, size_t from, size_t to) {
    json_t *slice = json_array();
    for (size_t i = from; i < to; i++) json_array_append(slice, json_array_get(messages, i));
    return slice;
}

// {"messages": [...]}: the prompt is what comes before the last assistant message.
static int split_messages(const json_t *row, const DataRowPlace *at, json_t *conversation) {
    json_t *messages = NULL;
    if (get_messages(row, "messages", at, &messages) != 0) return -1;
    size_t count = json_array_size(messages), last = count;
    for (size_t i = count; i-- > 0;) {
        if (strcmp(json_string_value(json_object_get(json_array_get(messages, i), "role")), "assistant") == 0) {
            last = i;
            break;
        }
    }
    if (last == count)
        return err_set("field \"messages\" has no assistant message to train on (%s:%ld)", at->path, at->line);
    if (last == 0)
        return err_set("field \"messages\" has nothing before its assistant message to prompt with (%s:%ld)", at->path,
                       at->line);
    json_object_set_new(conversation, "prompt", message_slice(messages, 0, last));
    json_object_set_new(conversation, "chosen", message_slice(messages, last, last + 1));
    json_object_set(conversation, "messages", messages); // every turn, for --assistant-only-loss
    return 0;
}

// {"chosen": [conversation], "rejected": [conversation]}: TRL's extract_prompt. The prompt
// is the messages both lists start with; when one list runs out first (no message differs),
// extract_prompt's loop ends on the shorter list's last index, so that message goes with
// the responses.
static int extract_prompt(const json_t *row, const DataRowPlace *at, json_t *conversation) {
    json_t *chosen = NULL, *rejected = NULL;
    if (get_messages(row, "chosen", at, &chosen) != 0) return -1;
    if (get_messages(row, "rejected", at, &rejected) != 0) return -1;
    size_t shorter = json_array_size(chosen) < json_array_size(rejected) ? json_array_size(chosen) : json_array_size(rejected);
    size_t split = shorter - 1;
    for (size_t i = 0; i < shorter; i++) {
        if (!json_equal(json_array_get(chosen, i), json_array_get(rejected, i))) {
            split = i;
            break;
        }
    }
    if (split == 0)
        return err_set("fields \"chosen\" and \"rejected\" share no leading message to use as the prompt (%s:%ld)",
                       at->path, at->line);
    json_object_set_new(conversation, "prompt", message_slice(chosen, 0, split));
    json_object_set_new(conversation, "chosen", message_slice(chosen, split, json_array_size(chosen)));
    json_object_set_new(conversation, "rejected", message_slice(rejected, split, json_array_size(rejected)));
    return 0;
}

// Copies the checked list `key` of the row into the conversation under `as`.
static int take_messages(const json_t *row, const char *key, const char *as, const DataRowPlace *at,
                         json_t *conversation) {
    json_t *messages = NULL;
    if (get_messages(row, key, at, &messages) != 0) return -1;
    json_object_set(conversation, as, messages);
    return 0;
}

// A ranked row's "responses" as lists of messages (best first), copied into the conversation;
// the record gets their count and empty slots, which the chat template fills
// (dataset_render_chat).
static int take_ranked_messages(const json_t *row, const DataRowPlace *at, json_t *conversation, DataRecord *record) {
    json_t *responses = NULL;
    if (get_array(row, "responses", "responses", at, &responses) != 0) return -1;
    const size_t count = json_array_size(responses);
    if (check_ranking_size(count, at) != 0) return -1;
    for (size_t k = 0; k < count; k++) {
        char field[48];
        snprintf(field, sizeof field, "responses[%zu]", k);
        if (check_messages(json_array_get(responses, k), field, at) != 0) return -1;
    }
    json_object_set(conversation, "responses", responses);
    record->responses = xcalloc(count, sizeof *record->responses);
    record->response_count = (int)count;
    return 0;
}

// A preference row is read by its responses' kind, as TRL's maybe_extract_prompt does
// (its prompt is extracted when the "prompt" field is of the other kind); every other row
// by its prompt.
bool data_row_is_conversational(const json_t *row) {
    if (json_object_get(row, "messages")) return true;
    const json_t *chosen = json_object_get(row, "chosen"), *rejected = json_object_get(row, "rejected");
    if (chosen && rejected) return json_is_array(chosen) || json_is_array(rejected);
    const json_t *prompt = json_object_get(row, "prompt");
    if (prompt) return json_is_array(prompt);
    return json_is_array(chosen) || json_is_array(rejected);
}

static int parse_conversation(DataFormat format, const json_t *row, const DataRowPlace *at, DataRecord *record) {
    json_t *conversation = json_object();
    int rc = -1;
    switch (format) {
    case DATA_FORMAT_SFT:
        if (json_object_get(row, "messages") && !json_object_get(row, "prompt")) rc = split_messages(row, at, conversation);
        else if ((rc = take_messages(row, "prompt", "prompt", at, conversation)) == 0)
            rc = take_messages(row, json_object_get(row, "completion") ? "completion" : "response", "chosen", at, conversation);
        break;
    case DATA_FORMAT_PAIRS:
        // As TRL's maybe_extract_prompt: a text "prompt" beside message lists is not this
        // pair's prompt (some datasets carry both), so the lists' shared start is taken.
        if (!json_is_array(json_object_get(row, "prompt"))) rc = extract_prompt(row, at, conversation);
        else if ((rc = take_messages(row, "prompt", "prompt", at, conversation)) == 0 &&
                 (rc = take_messages(row, "chosen", "chosen", at, conversation)) == 0)
            rc = take_messages(row, "rejected", "rejected", at, conversation);
        break;
    case DATA_FORMAT_UNPAIRED: {
        json_t *label = json_object_get(row, "label");
        if (!label) rc = missing_field(at, "label");
        else if (!json_is_boolean(label)) rc = wrong_type(at, "label", label, "true or false");
        else if ((rc = take_messages(row, "prompt", "prompt", at, conversation)) == 0)
            rc = take_messages(row, "completion", json_is_true(label) ? "chosen" : "rejected", at, conversation);
        break;
    }
    case DATA_FORMAT_PROMPTS: rc = take_messages(row, "prompt", "prompt", at, conversation); break;
    case DATA_FORMAT_RANKED:
        if ((rc = take_messages(row, "prompt", "prompt", at, conversation)) == 0)
            rc = take_ranked_messages(row, at, conversation, record);
        break;
    default:
        rc = err_set("the %s format has no conversational form (lists of messages are read for the sft, pairs, "
                     "ranked, unpaired and prompts formats) (%s:%ld)",
                     data_format_name(format), at->path, at->line);
    }
    if (rc == 0) rc = take_tools(row, at, conversation);
    if (rc == 0) rc = take_template_kwargs(row, at, conversation);
    if (rc == 0) record->conversation = json_dumps(conversation, JSON_COMPACT);
    json_decref(conversation);
    return rc;
}

// --- detection and dispatch -----------------------------------------------------------

int data_detect_format(const json_t *row, const DataRowPlace *at, DataFormat *format) {
#define HAS(key) (json_object_get(row, key) != NULL)
    if (HAS("messages") && !HAS("prompt")) *format = DATA_FORMAT_SFT; // conversational language modeling
    else if (HAS("info") && HAS("summaries")) *format = DATA_FORMAT_TLDR;
    else if (HAS("question") && HAS("answer_0") && HAS("answer_1")) *format = DATA_FORMAT_WEBGPT;
    else if (HAS("problem_id") || (HAS("question") && HAS("input_output"))) *format = DATA_FORMAT_APPS;
    else if (HAS("prompt") && HAS("responses")) *format = DATA_FORMAT_RANKED;
    else if (HAS("prompt") && HAS("completion") && HAS("label")) *format = DATA_FORMAT_UNPAIRED;
    else if (HAS("prompt") && HAS("chosen") && HAS("rejected")) *format = HAS("response") ? DATA_FORMAT_HH : DATA_FORMAT_PAIRS;
    else if (HAS("prompt") && (HAS("chosen") || HAS("rejected")))
        return err_set("missing field \"%s\": a preference pair needs both \"chosen\" and \"rejected\" (%s:%ld)",
                       HAS("chosen") ? "rejected" : "chosen", at->path, at->line);
    else if (HAS("prompt")) *format = HAS("response") || HAS("completion") ? DATA_FORMAT_SFT : DATA_FORMAT_PROMPTS;
    else if (HAS("chosen") && HAS("rejected")) *format = DATA_FORMAT_PAIRS; // implicit prompt (text or messages)
    else if (HAS("text")) *format = DATA_FORMAT_SFT; // TRL's language modeling: the text is the response
    else {
        // Name the fields seen, so the user can tell which schema the file is close to.
        char seen[200] = "";
        size_t used = 0;
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)row, key, value) {
            int n = snprintf(seen + used, sizeof seen - used, "%s\"%.40s\"", used ? ", " : "", key);
            if (n < 0 || (size_t)n >= sizeof seen - used) break;
            used += (size_t)n;
        }
        return err_set("cannot tell the dataset format from the fields of the first row (%s); expected "
                       "\"info\"+\"summaries\" (TL;DR), \"question\"+\"answer_0\" (WebGPT), \"problem_id\" (APPS), "
                       "\"prompt\" (HH-RLHF and local formats), \"chosen\"+\"rejected\" (pairs with their prompt "
                       "inside) or \"text\" (language modeling) (%s:%ld)",
                       used ? seen : "none", at->path, at->line);
    }
    return 0;
#undef HAS
}

// A preference pair's optional "margin" (TRL's reward trainer subtracts it from the score
// difference): a finite number.
static int take_margin(const json_t *row, const DataRowPlace *at, DataRecord *record) {
    const json_t *margin = json_object_get(row, "margin");
    if (!margin) return 0;
    if (!json_is_number(margin) || !isfinite(json_number_value(margin)))
        return wrong_type(at, "margin", margin, "a finite number");
    record->has_margin = true;
    record->margin = json_number_value(margin);
    return 0;
}

int data_parse_row(DataFormat format, const json_t *row, const DataRowPlace *at, DataRecord *record) {
    memset(record, 0, sizeof *record);
    int rc = -1;
    if (data_row_is_conversational(row) && format != DATA_FORMAT_HH) { // HH's fields are strings only
        rc = parse_conversation(format, row, at, record);
        if (rc == 0 && format == DATA_FORMAT_PAIRS) rc = take_margin(row, at, record);
        if (rc != 0) data_record_free(record);
        return rc;
    }
    switch (format) {
    case DATA_FORMAT_TLDR: rc = parse_tldr(row, at, record); break;
    case DATA_FORMAT_HH: rc = parse_pairs(row, at, true, record); break;
    case DATA_FORMAT_PAIRS:
        rc = parse_pairs(row, at, false, record);
        if (rc == 0) rc = take_margin(row, at, record);
        break;
    case DATA_FORMAT_WEBGPT: rc = parse_webgpt(row, at, record); break;
    case DATA_FORMAT_APPS: rc = parse_apps(row, at, record); break;
    case DATA_FORMAT_SFT: rc = parse_sft(row, at, record); break;
    case DATA_FORMAT_RANKED: rc = parse_ranked(row, at, record); break;
    case DATA_FORMAT_PROMPTS: rc = parse_prompt_only(row, at, record); break;
    case DATA_FORMAT_UNPAIRED: rc = parse_unpaired(row, at, record); break;
    case DATA_FORMAT_AUTO: CHECK(false, "data_parse_row without a format");
    }
    if (rc != 0) data_record_free(record);
    return rc;
}
