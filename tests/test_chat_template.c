// Tests of src/chat/: chat templates rendered exactly as transformers'
// apply_chat_template renders them (tests/fixtures/chat_templates/cases.json, from
// tools/make_chat_template_fixtures.py: every published template string of each family on
// a set of conversations, with and without the generation prompt, Qwen3's with
// enable_thinking undefined, true and false, expected errors included), recognition
// (exact, by markers, and refusal), forcing a family by name, template files, bad
// conversations, the thinking switch, and the paper's plain prompt formats. Tool calling:
// the fixture's tool cases (OpenAI-style tools, assistant tool calls, tool turns) for the
// Qwen2.5, Qwen3 and Llama 3.1 templates, refused when a template is recognised only by
// its markers and by every template without tool calling.
#include <jansson.h>
#include <stdint.h>
#include <time.h>

#include "chat/chat_template.h"
#include "chat/prompt_format.h"
#include "core/check.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "test.h"

#define CASES "tests/fixtures/chat_templates/cases.json"

static json_t *fixture;

static json_t *fixture_get(const char *key) {
    json_t *value = json_object_get(fixture, key);
    CHECK(value, "%s has no \"%s\"", CASES, key);
    return value;
}

static const char *string_or_null(json_t *value) { return json_is_string(value) ? json_string_value(value) : NULL; }

static json_t *template_by_id(const char *id) {
    size_t index;
    json_t *entry;
    json_array_foreach(fixture_get("templates"), index, entry) {
        if (strcmp(json_string_value(json_object_get(entry, "id")), id) == 0) return entry;
    }
    CHECK(false, "no template %s in %s", id, CASES);
    return NULL;
}

// The name marlhf gives a fixture template: its "variant" where two published sources are
// one variant (Qwen3's first and revised templates), else its id.
static const char *variant_of(json_t *entry) {
    json_t *variant = json_object_get(entry, "variant");
    return json_is_string(variant) ? json_string_value(variant) : json_string_value(json_object_get(entry, "id"));
}

// A conversation of the fixture as ChatMessages pointing into the JSON (free() the array).
static ChatMessage *conversation(size_t index, int *count) {
    json_t *turns = json_array_get(fixture_get("conversations"), index);
    CHECK(json_is_array(turns), "conversation %zu", index);
    *count = (int)json_array_size(turns);
    ChatMessage *messages = xcalloc(*count ? *count : 1, sizeof *messages);
    for (int i = 0; i < *count; i++) {
        json_t *turn = json_array_get(turns, i);
        messages[i].role = json_string_value(json_object_get(turn, "role"));
        messages[i].content = json_string_value(json_object_get(turn, "content"));
    }
    return messages;
}

// A tool conversation of the fixture ({"tools", "messages"}): ChatMessages pointing into the
// JSON, their tool calls' arguments and the tools as JSON text (*tools_json NULL when the
// case passes none). Free with free_tool_conversation.
typedef struct {
    ChatMessage *messages;
    ChatToolCall *calls;
    char **arguments;
    int num_calls;
    char *tools_json;
} ToolConversation;

static ToolConversation tool_conversation(size_t index, int *count) {
    json_t *item = json_array_get(fixture_get("tool_conversations"), index);
    json_t *turns = json_object_get(item, "messages"), *tools = json_object_get(item, "tools");
    CHECK(json_is_array(turns), "tool conversation %zu", index);
    ToolConversation c = {0};
    *count = (int)json_array_size(turns);
    c.messages = xcalloc(*count, sizeof *c.messages);
    int total = 0;
    for (int i = 0; i < *count; i++) total += (int)json_array_size(json_object_get(json_array_get(turns, i), "tool_calls"));
    c.calls = xcalloc(total ? total : 1, sizeof *c.calls);
    c.arguments = xcalloc(total ? total : 1, sizeof *c.arguments);
    for (int i = 0; i < *count; i++) {
        json_t *turn = json_array_get(turns, i), *calls = json_object_get(turn, "tool_calls");
        c.messages[i].role = json_string_value(json_object_get(turn, "role"));
        c.messages[i].content = json_string_value(json_object_get(turn, "content"));
        c.messages[i].tool_calls = c.calls + c.num_calls;
        c.messages[i].num_tool_calls = (int)json_array_size(calls);
        for (size_t j = 0; j < json_array_size(calls); j++) {
            json_t *function = json_object_get(json_array_get(calls, j), "function");
            c.arguments[c.num_calls] = json_dumps(json_object_get(function, "arguments"), JSON_ENCODE_ANY);
            c.calls[c.num_calls] = (ChatToolCall){json_string_value(json_object_get(function, "name")),
                                                  c.arguments[c.num_calls]};
            c.num_calls++;
        }
    }
    c.tools_json = json_is_array(tools) ? json_dumps(tools, 0) : NULL;
    return c;
}

static void free_tool_conversation(ToolConversation *c) {
    for (int i = 0; i < c->num_calls; i++) free(c->arguments[i]);
    free(c->arguments);
    free(c->calls);
    free(c->messages);
    free(c->tools_json);
}

// Where two texts first differ, shown with C escapes, so a failure says what is wrong.
static void print_difference(const char *got, const char *expected) {
    size_t at = 0;
    while (got[at] && got[at] == expected[at]) at++;
    size_t from = at > 20 ? at - 20 : 0;
    const char *labels[2] = {"got     ", "expected"};
    const char *texts[2] = {got, expected};
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "    %s (byte %zu): \"", labels[k], at);
        for (size_t i = from; texts[k][i] && i < at + 40; i++) {
            unsigned char c = (unsigned char)texts[k][i];
            if (c == '\n') fputs("\\n", stderr);
            else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
            else fputc(c, stderr);
        }
        fputs("\"\n", stderr);
    }
}

// Renders every case of template `id` with `t` and compares; returns the failures. A case
// with "enable_thinking" renders with the template's switch set so (as the Jinja variable
// passed to apply_chat_template); one without, with the default.
static int check_cases_of(const ChatTemplate *t, const char *id, int *checked) {
    int failures = 0;
    size_t index;
    json_t *item;
    json_array_foreach(fixture_get("cases"), index, item) {
        if (strcmp(json_string_value(json_object_get(item, "template")), id) != 0) continue;
        int count;
        // A tool case: its tools and messages with tool calls and tool turns. A template
        // recognised by its markers refuses them all.
        json_t *tool_index = json_object_get(item, "tool_conversation");
        size_t conversation_index = (size_t)json_integer_value(
            tool_index ? tool_index : json_object_get(item, "conversation"));
        ToolConversation tools = {0};
        ChatMessage *messages = tool_index ? (tools = tool_conversation(conversation_index, &count)).messages
                                           : conversation(conversation_index, &count);
        bool generation = json_is_true(json_object_get(item, "add_generation_prompt"));
        const char *expected = string_or_null(json_object_get(item, "expected"));
        const char *error = string_or_null(json_object_get(item, "error"));
        if (tool_index && !t->exact) {
            expected = NULL;
            error = "was recognised by its markers, not as the published template";
        }
        json_t *thinking = json_object_get(item, "enable_thinking");
        ChatTemplate rendering = *t;
        rendering.enable_thinking = thinking ? json_is_true(thinking) : true;
        // Llama 3.2's date is today's unless the caller passes one, as the fixture does.
        json_t *date = json_object_get(item, "date_string");
        if (json_is_string(date))
            snprintf(rendering.date_string, sizeof rendering.date_string, "%s", json_string_value(date));
        char *got = NULL;
        err_clear();
        int rc = chat_template_render_tools(&rendering, messages, count, tools.tools_json, generation, &got);
        bool ok = expected ? rc == 0 && strcmp(got, expected) == 0
                           : rc == -1 && got == NULL && error && strstr(err_msg(), error) != NULL;
        if (!ok) {
            if (failures < 3) {
                fprintf(stderr, "  %s (as %s): %sconversation %zu, add_generation_prompt %d%s: ", id,
                        chat_template_name(t), tool_index ? "tool " : "", conversation_index, generation,
                        !thinking ? "" : json_is_true(thinking) ? ", enable_thinking true" : ", enable_thinking false");
                if (expected && rc == 0) {
                    fputs("wrong text\n", stderr);
                    print_difference(got, expected);
                } else if (expected) {
                    fprintf(stderr, "unexpected error: %s\n", err_msg());
                } else {
                    fprintf(stderr, "expected error '%s', got %s '%s'\n", error, rc == 0 ? "text" : "error",
                            rc == 0 ? got : err_msg());
                }
            }
            failures++;
        }
        (*checked)++;
        free(got);
        if (tool_index) free_tool_conversation(&tools);
        else free(messages);
    }
    return failures;
}

static int from_fixture_source(ChatTemplate *t, json_t *entry, const char *source) {
    return chat_template_from_source(t, source, string_or_null(json_object_get(entry, "bos_token")),
                                     string_or_null(json_object_get(entry, "eos_token")), "cases.json");
}

// --- rendering against transformers ---------------------------------------------------------

static void test_every_case_matches_transformers(void) {
    int checked = 0, failures = 0;
    size_t index;
    json_t *entry;
    json_array_foreach(fixture_get("templates"), index, entry) {
        const char *id = json_string_value(json_object_get(entry, "id"));
        ChatTemplate t;
        if (from_fixture_source(&t, entry, json_string_value(json_object_get(entry, "source"))) != 0) {
            EXPECT(false, "template %s not recognised: %s", id, err_msg());
            continue;
        }
        failures += check_cases_of(&t, id, &checked);
        chat_template_free(&t);
    }
    size_t total = json_array_size(fixture_get("cases"));
    EXPECT(failures == 0, "%d of %d cases differ from transformers", failures, checked);
    EXPECT((size_t)checked == total, "checked %d of %zu cases", checked, total);
    printf("  %d cases checked byte for byte\n", checked);
}

// --- recognition ---------------------------------------------------------------------------------

static void test_published_templates_recognised_exactly(void) {
    size_t index;
    json_t *entry;
    json_array_foreach(fixture_get("templates"), index, entry) {
        const char *id = json_string_value(json_object_get(entry, "id"));
        const char *source = json_string_value(json_object_get(entry, "source"));
        char hash[17];
        snprintf(hash, sizeof hash, "%016llx", chat_template_source_hash(source));
        const char *python_hash = json_string_value(json_object_get(entry, "normalized_fnv1a64"));
        EXPECT(strcmp(hash, python_hash) == 0, "%s: C normalises to %s, the fixture script to %s", id, hash,
               python_hash);
        ChatTemplate t;
        EXPECT(from_fixture_source(&t, entry, source) == 0, "%s: %s", id, err_msg());
        EXPECT(t.exact, "%s recognised only by markers", id);
        EXPECT(strcmp(chat_template_name(&t), variant_of(entry)) == 0, "%s recognised as %s", id,
               chat_template_name(&t));
        EXPECT(strcmp(chat_family_name(t.family), json_string_value(json_object_get(entry, "family"))) == 0,
               "%s: family %s", id, chat_family_name(t.family));
        chat_template_free(&t);
    }
}

// Whitespace that cannot reach the output does not matter; whitespace that can does.
static void test_whitespace_normalisation(void) {
    const char *smollm2 = json_string_value(json_object_get(template_by_id("smollm2"), "source"));
    unsigned long long reference = chat_template_source_hash(smollm2);
    // Inside tags: extra spaces, newlines, none at all next to the delimiters.
    const char *respaced =
        "\n  {%for message in messages%}{%  if loop.first and messages[0]['role']   != 'system' %}"
        "{{'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n'}}"
        "{%\nendif\n%}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\n\n";
    EXPECT(chat_template_source_hash(respaced) == reference, "re-spaced SmolLM2 template hashes differently");
    // Inside a string literal, and in text between tags, whitespace is output: it counts.
    char *changed = xstrdup(smollm2);
    char *at = strstr(changed, "named SmolLM");
    at[5] = '\t';
    EXPECT(chat_template_source_hash(changed) != reference, "a tab inside a string literal was ignored");
    free(changed);
    EXPECT(chat_template_source_hash("{{ 'a  b' }}") != chat_template_source_hash("{{ 'a b' }}"), "literal spaces");
    EXPECT(chat_template_source_hash("x\n{{ a }}") != chat_template_source_hash("x {{ a }}"), "text whitespace");
    EXPECT(chat_template_source_hash("{{ 'a\\nb' }}") == chat_template_source_hash("{{ 'a\nb' }}"), "\\n escape");
    EXPECT(chat_template_source_hash("{{- a -}}") == chat_template_source_hash("{{-  a\n-}}"), "strip markers");
    EXPECT(chat_template_source_hash("{{'x'}}") == chat_template_source_hash("{{ 'x' }}"), "delimiter spaces");
    EXPECT(chat_template_source_hash("{# it's #}{{ a }}") == chat_template_source_hash("{#  it's #}{{a}}"), "comment");
    // The HH and WebGPT templates differ only inside string literals.
    EXPECT(chat_template_source_hash(json_string_value(json_object_get(template_by_id("hh"), "source"))) !=
               chat_template_source_hash(json_string_value(json_object_get(template_by_id("webgpt"), "source"))),
           "hh and webgpt collide");
}

// An edited published template (here: a comment added) is no longer an exact match; the
// markers must still find the family and variant, and render every case the same.
static void test_marker_fallback_renders_the_same(void) {
    size_t index;
    json_t *entry;
    json_array_foreach(fixture_get("templates"), index, entry) {
        const char *id = json_string_value(json_object_get(entry, "id"));
        const char *source = json_string_value(json_object_get(entry, "source"));
        size_t length = strlen(source);
        char *edited = xmalloc(length + 64);
        snprintf(edited, length + 64, "%s{#- edited by a user -#}", source);
        ChatTemplate t;
        int rc = from_fixture_source(&t, entry, edited);
        if (strcmp(id, "hh") == 0 || strcmp(id, "webgpt") == 0) {
            // marlhf's own plain formats have no markers: only the exact text is known.
            EXPECT(rc == -1 && strstr(err_msg(), "unrecognised chat template in cases.json"), "%s: %s", id,
                   rc == 0 ? chat_template_name(&t) : err_msg());
            if (rc == 0) chat_template_free(&t);
            free(edited);
            continue;
        }
        EXPECT(rc == 0, "%s: %s", id, err_msg());
        if (rc == 0) {
            EXPECT(!t.exact, "%s: edited template still an exact match", id);
            EXPECT(strcmp(chat_template_name(&t), variant_of(entry)) == 0, "%s recognised by markers as %s", id,
                   chat_template_name(&t));
            int checked = 0;
            EXPECT(check_cases_of(&t, id, &checked) == 0, "%s: cases differ when recognised by markers", id);
            chat_template_free(&t);
        }
        free(edited);
    }
}

static void test_marker_details(void) {
    ChatTemplate t;
    // A ChatML template with a default system turn of its own.
    const char *custom =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a custom bot.<|im_end|>\\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}";
    EXPECT(chat_template_from_source(&t, custom, NULL, NULL, "custom.jinja") == 0, "%s", err_msg());
    EXPECT(t.default_system && strcmp(t.default_system, "You are a custom bot.") == 0, "default system %s",
           t.default_system ? t.default_system : "(none)");
    EXPECT(strcmp(chat_template_name(&t), "chatml") == 0 && !t.exact, "name %s", chat_template_name(&t));
    chat_template_free(&t);
    // A Llama 3.1-style template with another default date.
    const char *dated = "{%- set date_string = \"01 Jan 2025\" %}<|start_header_id|><|eot_id|>Cutting Knowledge Date";
    EXPECT(chat_template_from_source(&t, dated, "<B>", NULL, "dated.jinja") == 0, "%s", err_msg());
    EXPECT(strcmp(t.date_string, "01 Jan 2025") == 0, "date %s", t.date_string);
    ChatMessage hello = {.role = "user", .content = " hi "};
    char *text = NULL;
    EXPECT(chat_template_render(&t, &hello, 1, false, &text) == 0, "%s", err_msg());
    EXPECT(text && strcmp(text, "<B><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
                                "2023\nToday Date: 01 Jan 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_"
                                "id|>\n\nhi<|eot_id|>") == 0,
           "%s", text ? text : "(null)");
    free(text);
    chat_template_free(&t);
    // Llama 3.2-style: transformers' strftime_now gives today's date ("%d %b %Y").
    const char *today = "{%- set date_string = strftime_now(\"%d %b %Y\") %}<|start_header_id|><|eot_id|>Cutting "
                        "Knowledge Date";
    EXPECT(chat_template_from_source(&t, today, NULL, NULL, NULL) == 0, "%s", err_msg());
    EXPECT(strlen(t.date_string) == 11 && t.date_string[2] == ' ' && t.date_string[6] == ' ', "today %s",
           t.date_string);
    EXPECT(strcmp(chat_template_name(&t), "llama3.2") == 0, "strftime template named %s", chat_template_name(&t));
    chat_template_free(&t);
    // The published Llama 3.2 template (by name here) has today's date too.
    char today_date[32];
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(today_date, sizeof today_date, "%d %b %Y", &local);
    EXPECT(chat_template_from_name(&t, "llama3.2", NULL, NULL) == 0, "%s", err_msg());
    EXPECT(strcmp(t.date_string, today_date) == 0, "llama3.2 date %s, today %s", t.date_string, today_date);
    chat_template_free(&t);
    // Reasoning ChatML that is not Qwen3's: a bare think block, QwQ's / Qwen3-*-Thinking-2507's
    // (the generation prompt always opens "<think>\n", no enable_thinking), one that trims
    // the reasoning instead of stripping newlines; then Mistral's [INST] without <<SYS>>,
    // Phi-3's <|end|>.
    const char *refused[] = {
        "<|im_start|>{{ message.content }}<|im_end|>{{ '<think>\\n\\n</think>' }}",
        "<|im_start|>{{ '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}<|im_end|>"
        "{{ '<|im_start|>assistant\\n<think>\\n' }}",
        "<|im_start|>{%- set reasoning_content = reasoning_content|trim %}<think><|im_end|>"
        "{%- if enable_thinking is defined and enable_thinking is false %}",
        "{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}",
        "{% for message in messages %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% endfor %}<|assistant|>",
        "Hello {{ name }}",
        "",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = chat_template_from_source(&t, refused[i], "<s>", "</s>", "models/x/tokenizer_config.json");
        EXPECT(rc == -1, "refused[%zu] recognised as %s", i, rc == 0 ? chat_template_name(&t) : "");
        EXPECT(strcmp(err_msg(), "unrecognised chat template in models/x/tokenizer_config.json (pass "
                                 "--chat-template NAME or a template file)") == 0,
               "message: %s", err_msg());
        if (rc == 0) chat_template_free(&t);
    }
}

// The switch behind --no-thinking: Qwen3's only, off by default as in transformers, and
// refused by templates without it.
static void test_thinking_switch(void) {
    ChatTemplate t;
    ChatMessage question = {.role = "user", .content = "Why?"};
    char *text = NULL;
    CHECK(chat_template_from_source(&t, json_string_value(json_object_get(template_by_id("qwen3"), "source")), NULL,
                                    "<|im_end|>", "tokenizer_config.json") == 0,
          "%s", err_msg());
    EXPECT(t.enable_thinking, "qwen3 starts with thinking switched off");
    EXPECT(chat_template_render(&t, &question, 1, true, &text) == 0, "%s", err_msg());
    EXPECT(text && strcmp(text, "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n") == 0, "%s",
           text ? text : "(null)");
    free(text);
    EXPECT(chat_template_disable_thinking(&t) == 0, "%s", err_msg());
    EXPECT(chat_template_render(&t, &question, 1, true, &text) == 0, "%s", err_msg());
    EXPECT(text && strcmp(text, "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
                                "<think>\n\n</think>\n\n") == 0,
           "%s", text ? text : "(null)");
    free(text);
    // Without the generation prompt the switch changes nothing.
    EXPECT(chat_template_render(&t, &question, 1, false, &text) == 0, "%s", err_msg());
    EXPECT(text && strcmp(text, "<|im_start|>user\nWhy?<|im_end|>\n") == 0, "%s", text ? text : "(null)");
    free(text);
    chat_template_free(&t);
    const char *without_switch[] = {"chatml", "qwen2.5", "llama3.1", "gemma3", "hh"};
    for (size_t i = 0; i < sizeof without_switch / sizeof without_switch[0]; i++) {
        CHECK(chat_template_from_name(&t, without_switch[i], NULL, NULL) == 0, "%s", err_msg());
        EXPECT(chat_template_disable_thinking(&t) == -1, "%s accepted --no-thinking", without_switch[i]);
        EXPECT(strstr(err_msg(), "has no thinking switch") && strstr(err_msg(), without_switch[i]), "%s", err_msg());
        chat_template_free(&t);
    }
    CHECK(chat_template_from_option(&t, "qwen3", NULL, NULL) == 0, "%s", err_msg());
    EXPECT(t.family == CHAT_FAMILY_QWEN3 && t.enable_thinking && t.default_system == NULL, "qwen3 by name");
    chat_template_free(&t);
}

// SmolLM2's template as the real GGUF stores it (the model of `make test`).
static void test_smollm2_gguf_template(void) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    GgufFile gguf;
    if (gguf_open(&gguf, path) != 0) {
        fprintf(stderr, "  cannot open %s: %s (run scripts/fetch-model)\n", path, err_msg());
        test_current_failures++;
        return;
    }
    char *source = NULL;
    EXPECT(gguf_get_string(&gguf, "tokenizer.chat_template", &source) == 0, "%s", err_msg());
    ChatTemplate t;
    if (source && chat_template_from_source(&t, source, "<|im_start|>", "<|im_end|>", path) == 0) {
        EXPECT(t.exact && strcmp(chat_template_name(&t), "smollm2") == 0, "recognised as %s (exact %d)",
               chat_template_name(&t), t.exact);
        chat_template_free(&t);
    } else {
        EXPECT(false, "GGUF template not recognised: %s", err_msg());
    }
    free(source);
    gguf_close(&gguf);
}

// --- names, files, bad conversations ------------------------------------------------------------

static void test_forced_by_name(void) {
    // By name, with the tokenizer's tokens, every case renders as from the published source.
    size_t index;
    json_t *entry;
    json_array_foreach(fixture_get("templates"), index, entry) {
        const char *id = json_string_value(json_object_get(entry, "id"));
        ChatTemplate t;
        EXPECT(chat_template_from_name(&t, variant_of(entry), string_or_null(json_object_get(entry, "bos_token")),
                                       string_or_null(json_object_get(entry, "eos_token"))) == 0,
               "%s: %s", id, err_msg());
        int checked = 0;
        EXPECT(check_cases_of(&t, id, &checked) == 0, "%s by name differs", id);
        EXPECT(t.source_path == NULL, "%s: source path set", id);
        chat_template_free(&t);
    }
    ChatTemplate t;
    EXPECT(chat_template_from_name(&t, "mistral", NULL, NULL) == -1, "mistral accepted");
    EXPECT(strstr(err_msg(), "unknown chat template 'mistral'") && strstr(err_msg(), "llama3.1"), "%s", err_msg());
    EXPECT(chat_template_from_option(&t, "gemma3", NULL, NULL) == 0 && t.fold_system_into_user, "%s", err_msg());
    chat_template_free(&t);
    EXPECT(chat_template_from_option(&t, "no/such/template.jinja", NULL, NULL) == -1, "missing file accepted");
    EXPECT(strstr(err_msg(), "no/such/template.jinja") && strstr(err_msg(), "--chat-template"), "%s", err_msg());
}

static const char *tmp_file(const char *name) {
    static char path[1024];
    const char *dir = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    snprintf(path, sizeof path, "%s/test_chat_template", dir);
    CHECK(fs_mkdir_p(path) == 0, "%s", err_msg());
    snprintf(path, sizeof path, "%s/test_chat_template/%s", dir, name);
    return path;
}

static void write_text(const char *path, const char *text) {
    CHECK(fs_write_file_atomic(path, text, strlen(text)) == 0, "%s", err_msg());
}

static void test_template_files(void) {
    ChatTemplate t;
    ChatMessage messages[2] = {{.role = "system", .content = "sys"}, {.role = "user", .content = "hi"}};
    char *text = NULL;
    // tokenizer_config.json: template and AddedToken-style tokens.
    json_t *config = json_object();
    json_object_set_new(config, "chat_template",
                        json_string(json_string_value(json_object_get(template_by_id("llama2"), "source"))));
    json_object_set_new(config, "bos_token", json_pack("{s:s, s:b}", "content", "<s>", "lstrip", 0));
    json_object_set_new(config, "eos_token", json_string("</s>"));
    const char *config_path = tmp_file("tokenizer_config.json");
    CHECK(json_dump_file(config, config_path, 0) == 0, "cannot write %s", config_path);
    EXPECT(chat_template_from_file(&t, config_path, NULL, NULL) == 0, "%s", err_msg());
    EXPECT(t.exact && strcmp(chat_template_name(&t), "llama2") == 0, "as %s", chat_template_name(&t));
    EXPECT(chat_template_render(&t, messages, 2, true, &text) == 0, "%s", err_msg());
    EXPECT(text && strcmp(text, "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nhi [/INST]") == 0, "%s", text ? text : "");
    free(text);
    chat_template_free(&t);
    // transformers' "no limit" model_max_length, past 64-bit integers, in the same file.
    FILE *file = fopen(config_path, "w");
    CHECK(file, "cannot write %s", config_path);
    fprintf(file, "{\"model_max_length\": 1000000000000000019884624838656, \"eos_token\": \"</s>\", "
                  "\"bos_token\": \"<s>\", \"chat_template\": ");
    char *source = json_dumps(json_object_get(template_by_id("llama2"), "source"), JSON_ENCODE_ANY);
    fprintf(file, "%s}", source);
    free(source);
    fclose(file);
    EXPECT(chat_template_from_file(&t, config_path, NULL, NULL) == 0, "huge model_max_length: %s", err_msg());
    EXPECT(t.exact && strcmp(chat_template_name(&t), "llama2") == 0, "as %s", chat_template_name(&t));
    chat_template_free(&t);
    // A list of named templates: the "default" one.
    json_t *list = json_pack("[{s:s, s:s}, {s:s, s:s}]", "name", "tool_use", "template", "Hello {{ x }}", "name",
                             "default", "template",
                             json_string_value(json_object_get(template_by_id("zephyr"), "source")));
    json_object_set_new(config, "chat_template", list);
    CHECK(json_dump_file(config, config_path, 0) == 0, "cannot write %s", config_path);
    EXPECT(chat_template_from_option(&t, config_path, NULL, "<E>") == 0, "%s", err_msg());
    EXPECT(strcmp(chat_template_name(&t), "zephyr") == 0 && strcmp(t.eos_token, "<E>") == 0, "%s %s",
           chat_template_name(&t), t.eos_token);
    chat_template_free(&t);
    // No chat_template at all.
    json_object_del(config, "chat_template");
    CHECK(json_dump_file(config, config_path, 0) == 0, "cannot write %s", config_path);
    EXPECT(chat_template_from_file(&t, config_path, NULL, NULL) == -1, "config without template accepted");
    EXPECT(strstr(err_msg(), "no chat_template") && strstr(err_msg(), config_path), "%s", err_msg());
    json_decref(config);
    // A .jinja file with the source itself.
    const char *jinja_path = tmp_file("gemma.jinja");
    write_text(jinja_path, json_string_value(json_object_get(template_by_id("gemma"), "source")));
    EXPECT(chat_template_from_file(&t, jinja_path, "<bos>", "<eos>") == 0, "%s", err_msg());
    EXPECT(chat_template_render(&t, messages, 2, false, &text) == -1 && text == NULL, "system accepted by gemma");
    EXPECT(strstr(err_msg(), "System role not supported (chat template gemma from ") && strstr(err_msg(), jinja_path),
           "%s", err_msg());
    chat_template_free(&t);
    // An unrecognised file names the file.
    const char *unknown_path = tmp_file("unknown.jinja");
    write_text(unknown_path, "{% for m in messages %}{{ m.content }}{% endfor %}");
    EXPECT(chat_template_from_file(&t, unknown_path, NULL, NULL) == -1, "unknown template accepted");
    EXPECT(strstr(err_msg(), "unrecognised chat template in ") && strstr(err_msg(), unknown_path) &&
               strstr(err_msg(), "(pass --chat-template NAME or a template file)"),
           "%s", err_msg());
    EXPECT(chat_template_from_file(&t, tmp_file("absent.jinja"), NULL, NULL) == -1, "absent file accepted");
}

static void test_bad_conversations(void) {
    ChatTemplate t;
    CHECK(chat_template_from_name(&t, "llama2", "<s>", "</s>") == 0, "%s", err_msg());
    char *text = (char *)"untouched";
    EXPECT(chat_template_render(&t, NULL, 0, true, &text) == -1 && text == NULL, "empty conversation accepted");
    EXPECT(strstr(err_msg(), "empty conversation"), "%s", err_msg());
    ChatMessage tool[2] = {{.role = "user", .content = "q"}, {.role = "tool", .content = "r"}};
    EXPECT(chat_template_render(&t, tool, 2, false, &text) == -1, "tool role accepted");
    EXPECT(strstr(err_msg(), "message 1 has role 'tool'"), "%s", err_msg());
    ChatMessage no_content = {.role = "user", .content = NULL};
    EXPECT(chat_template_render(&t, &no_content, 1, false, &text) == -1, "NULL content accepted");
    EXPECT(strstr(err_msg(), "message 0 has no content"), "%s", err_msg());
    ChatMessage assistant_first[2] = {{.role = "assistant", .content = "a"}, {.role = "user", .content = "q"}};
    EXPECT(chat_template_render(&t, assistant_first, 2, false, &text) == -1, "assistant first accepted");
    EXPECT(strcmp(err_msg(), "Conversation roles must alternate user/assistant/user/assistant/... (chat template "
                             "llama2)") == 0,
           "%s", err_msg());
    chat_template_free(&t);
}

// Templates without tool calling refuse tools, tool calls and tool messages with a message
// saying so (rather than rendering a prompt without them); the tool-calling ones by name
// say which syntax their model writes.
static void test_tools_refused_without_tool_calling(void) {
    const char *names[] = {"chatml", "smollm2", "qwen2", "llama3", "llama2", "gemma3", "zephyr", "hh"};
    ChatToolCall call = {"get_time", "{}"};
    ChatMessage hello = {.role = "user", .content = "hi"};
    ChatMessage calls[2] = {{.role = "user", .content = "q"},
                            {.role = "assistant", .content = "", .tool_calls = &call, .num_tool_calls = 1}};
    ChatMessage tool_turn[2] = {{.role = "user", .content = "q"}, {.role = "tool", .content = "12:00"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        ChatTemplate t;
        CHECK(chat_template_from_name(&t, names[i], "<s>", "</s>") == 0, "%s", err_msg());
        EXPECT(chat_template_tool_syntax(&t) == CHAT_TOOLS_NONE, "%s has a tool syntax", names[i]);
        char *text = (char *)"untouched";
        EXPECT(chat_template_render_tools(&t, &hello, 1, "[]", true, &text) == -1 && text == NULL, "%s: tools", names[i]);
        EXPECT(strstr(err_msg(), "does not render tools (tool calling: the qwen2.5, qwen3, llama3.1 and llama3.2 templates)"),
               "%s: %s", names[i], err_msg());
        EXPECT(chat_template_render_tools(&t, calls, 2, NULL, true, &text) == -1, "%s: tool calls", names[i]);
        EXPECT(strstr(err_msg(), "message 1: chat template") && strstr(err_msg(), "does not render tool calls"),
               "%s: %s", names[i], err_msg());
        EXPECT(chat_template_render_tools(&t, tool_turn, 2, NULL, true, &text) == -1, "%s: tool turn", names[i]);
        EXPECT(strstr(err_msg(), "message 1 has role 'tool': chat template"), "%s: %s", names[i], err_msg());
        chat_template_free(&t);
    }
    const struct {
        const char *name;
        ChatToolSyntax syntax;
    } tool_templates[] = {{"qwen2.5", CHAT_TOOLS_HERMES},
                          {"qwen3", CHAT_TOOLS_HERMES},
                          {"llama3.1", CHAT_TOOLS_LLAMA3_JSON},
                          {"llama3.2", CHAT_TOOLS_LLAMA3_JSON}};
    for (size_t i = 0; i < sizeof tool_templates / sizeof tool_templates[0]; i++) {
        ChatTemplate t;
        CHECK(chat_template_from_name(&t, tool_templates[i].name, "<s>", "</s>") == 0, "%s", err_msg());
        EXPECT(chat_template_tool_syntax(&t) == tool_templates[i].syntax, "%s", tool_templates[i].name);
        char *text = NULL;
        // Arguments that are not JSON, a call on a user message, tools that are not a list.
        ChatToolCall bad = {"f", "{not json"};
        ChatMessage bad_call[2] = {{.role = "user", .content = "q"},
                                   {.role = "assistant", .content = "", .tool_calls = &bad, .num_tool_calls = 1}};
        EXPECT(chat_template_render_tools(&t, bad_call, 2, NULL, true, &text) == -1 &&
                   strstr(err_msg(), "message 1, tool call 0: the arguments are not JSON"),
               "%s: %s", tool_templates[i].name, err_msg());
        ChatMessage user_call = {.role = "user", .content = "q", .tool_calls = &call, .num_tool_calls = 1};
        EXPECT(chat_template_render_tools(&t, &user_call, 1, NULL, true, &text) == -1 &&
                   strstr(err_msg(), "message 0 has tool calls but role 'user'"),
               "%s: %s", tool_templates[i].name, err_msg());
        EXPECT(chat_template_render_tools(&t, &hello, 1, "{}", true, &text) == -1 &&
                   strstr(err_msg(), "the tools are not a JSON array"),
               "%s: %s", tool_templates[i].name, err_msg());
        chat_template_free(&t);
    }
}

// --- the paper's plain formats ---------------------------------------------------------------------

static void test_prompt_formats(void) {
    json_t *formats = fixture_get("prompt_formats");
    size_t index;
    json_t *item;
    char *text;
    json_array_foreach(json_object_get(formats, "tldr"), index, item) {
        const char *expected = json_string_value(json_object_get(item, "expected"));
        EXPECT(prompt_format_tldr(string_or_null(json_object_get(item, "subreddit")),
                                  json_string_value(json_object_get(item, "post")),
                                  json_is_true(json_object_get(item, "is_article")), &text) == 0,
               "tldr %zu", index);
        EXPECT(strcmp(text, expected) == 0, "tldr %zu: '%s' vs '%s'", index, text, expected);
        free(text);
    }
    json_array_foreach(json_object_get(formats, "webgpt_prompt"), index, item) {
        const char *expected = json_string_value(json_object_get(item, "expected"));
        EXPECT(prompt_format_webgpt(json_string_value(json_object_get(item, "question")), &text) == 0, "webgpt");
        EXPECT(strcmp(text, expected) == 0, "webgpt %zu: '%s' vs '%s'", index, text, expected);
        free(text);
    }
    json_array_foreach(json_object_get(formats, "webgpt_response"), index, item) {
        const char *expected = json_string_value(json_object_get(item, "expected"));
        EXPECT(prompt_format_webgpt_response(json_string_value(json_object_get(item, "answer")), &text) == 0, "resp");
        EXPECT(strcmp(text, expected) == 0, "webgpt response %zu: '%s' vs '%s'", index, text, expected);
        free(text);
    }
    // The spec's forms, written out.
    prompt_format_tldr("relationships", "Body", false, &text);
    EXPECT(strcmp(text, "POST\nSubreddit: r/relationships\nBody\nTL;DR: ") == 0, "%s", text);
    free(text);
    prompt_format_tldr(NULL, "Body", true, &text);
    EXPECT(strcmp(text, "ARTICLE\nBody\nTL;DR: ") == 0, "%s", text);
    free(text);
    prompt_format_webgpt("Why?", &text);
    EXPECT(strcmp(text, " Human: Why? Assistant:") == 0, "%s", text);
    free(text);
    prompt_format_webgpt_response("Because [1].", &text);
    EXPECT(strcmp(text, " Because.") == 0, "%s", text);
    free(text);
}

// The HH template gives the Dahoas/full-hh-rlhf layout: prompt + chosen (" " + text).
static void test_hh_transcript(void) {
    ChatTemplate t;
    CHECK(chat_template_from_name(&t, "hh", NULL, NULL) == 0, "%s", err_msg());
    ChatMessage turns[4] = {{.role = "user", .content = "What are some cuss words in english?"},
                            {.role = "assistant", .content = "Here's an incomplete list."},
                            {.role = "user", .content = "What's your favorite one?"},
                            {.role = "assistant", .content = "I haven't even thought about it."}};
    char *prompt, *full;
    EXPECT(chat_template_render(&t, turns, 3, true, &prompt) == 0, "%s", err_msg());
    EXPECT(strcmp(prompt, "\n\nHuman: What are some cuss words in english?\n\nAssistant: Here's an incomplete list."
                          "\n\nHuman: What's your favorite one?\n\nAssistant:") == 0,
           "%s", prompt);
    EXPECT(chat_template_render(&t, turns, 4, false, &full) == 0, "%s", err_msg());
    size_t n = strlen(prompt);
    EXPECT(strncmp(full, prompt, n) == 0 && strcmp(full + n, " I haven't even thought about it.") == 0, "%s", full);
    free(prompt);
    free(full);
    chat_template_free(&t);
}

int main(void) {
    json_error_t error;
    fixture = json_load_file(CASES, 0, &error);
    CHECK(fixture, "%s:%d: %s", CASES, error.line, error.text);
    RUN(test_every_case_matches_transformers);
    RUN(test_published_templates_recognised_exactly);
    RUN(test_whitespace_normalisation);
    RUN(test_marker_fallback_renders_the_same);
    RUN(test_marker_details);
    RUN(test_thinking_switch);
    RUN(test_smollm2_gguf_template);
    RUN(test_forced_by_name);
    RUN(test_template_files);
    RUN(test_bad_conversations);
    RUN(test_tools_refused_without_tool_calling);
    RUN(test_prompt_formats);
    RUN(test_hh_transcript);
    json_decref(fixture);
    TEST_EXIT();
}
