// Tests of serve/tool_calls.c: tool calls taken out of generated text as vLLM's hermes and
// llama3_json parsers take them (well-formed calls, several, text around them, malformed
// JSON kept as content, an unclosed block at the end, arguments re-serialised as Python's
// json.dumps writes them), and the streaming scanner: fed the answer in every split (each
// prefix, then the end), it gives the same content and calls as the whole answer, never
// shows text of a call block, and holds a tag split across pieces.
#include <string.h>

#include "core/check.h"
#include "serve/tool_calls.h"
#include "test.h"

typedef struct {
    const char *name;
    const char *text;
    const char *content; // NULL: null (calls found, no content)
    int num_calls;
    const char *calls[3][2]; // name, arguments
} Case;

static const Case hermes_cases[] = {
    {"one call", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", NULL,
     1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"text, then two calls",
     "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n</tool_call>\n",
     "Let me check both.", 2,
     {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_weather", "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}},
    {"text after a call", "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone. ", "\nDone.", 1,
     {{"f", "{}"}}},
    {"malformed JSON stays text", "A <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> B",
     "A <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> B", 0, {{0}}},
    {"not a call object stays text", "<tool_call>[1, 2]</tool_call><tool_call>{\"arguments\": {}}</tool_call>",
     "<tool_call>[1, 2]</tool_call><tool_call>{\"arguments\": {}}</tool_call>", 0, {{0}}},
    {"a bad block beside a good one",
     "<tool_call>{oops}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"n\": 1}}</tool_call>",
     "<tool_call>{oops}</tool_call>", 1, {{"g", "{\"n\": 1}"}}},
    {"no calls: the text unchanged", "Plain answer with < and <tool and spaces \n\n", "Plain answer with < and <tool and spaces \n\n",
     0, {{0}}},
    {"empty answer", "", "", 0, {{0}}},
    {"unclosed block that parses",
     "Sure <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n", "Sure", 1, {{"f", "{\"x\": [1, 2]}"}}},
    {"unclosed block cut short", "<tool_call>\n{\"name\": \"f\", \"argum", "<tool_call>\n{\"name\": \"f\", \"argum", 0, {{0}}},
    {"arguments re-serialised as json.dumps",
     "<tool_call>{\"name\":\"f\",\"arguments\":{\"b\":1.0,\"a\":\"caf\\u00e9 \\\"q\\\" \\n\",\"e\":1e16,\"z\":0.1,"
     "\"n\":null,\"l\":[true,false,{}]}}</tool_call>",
     NULL, 1, {{"f", "{\"b\": 1.0, \"a\": \"café \\\"q\\\" \\n\", \"e\": 1e+16, \"z\": 0.1, \"n\": null, \"l\": [true, false, {}]}"}}},
    {"arguments absent, or not an object", "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"s\", \"arguments\": \"x\"}</tool_call>",
     NULL, 2, {{"now", "{}"}, {"s", "\"x\""}}},
    {"a closing tag inside a string ends the block", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>", 0, {{0}}},
    {"thinking before a call", "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>",
     "<think>\nweather\n</think>", 1, {{"w", "{}"}}},
};

static const Case llama_cases[] = {
    {"one call", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", NULL, 1,
     {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"two calls", "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": 2.5}}", NULL, 2,
     {{"a", "{}"}, {"b", "{\"k\": 2.5}"}}},
    {"python tag", "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}", NULL, 1, {{"a", "{\"q\": \"x\"}"}}},
    {"text first: content", "The call is {\"name\": \"a\", \"parameters\": {}}", "The call is {\"name\": \"a\", \"parameters\": {}}",
     0, {{0}}},
    {"no parameters: content", "{\"name\": \"a\"}", "{\"name\": \"a\"}", 0, {{0}}},
    {"one bad object: all content", "{\"name\": \"a\", \"parameters\": {}}; {broken", "{\"name\": \"a\", \"parameters\": {}}; {broken",
     0, {{0}}},
    {"plain answer", "Paris is sunny. ", "Paris is sunny. ", 0, {{0}}},
};

// Compares a result with a case; returns true when equal (printing the difference otherwise).
static bool same(const Case *c, const char *how, const char *content, const ToolCall *calls, int num_calls) {
    bool ok = num_calls == c->num_calls &&
              (c->content ? content && strcmp(content, c->content) == 0 : content == NULL);
    for (int i = 0; ok && i < num_calls; i++)
        ok = strcmp(calls[i].name, c->calls[i][0]) == 0 && strcmp(calls[i].arguments, c->calls[i][1]) == 0;
    if (!ok) {
        fprintf(stderr, "  %s (%s): content [%s] (wanted [%s]), %d calls (wanted %d)", c->name, how,
                content ? content : "(null)", c->content ? c->content : "(null)", num_calls, c->num_calls);
        for (int i = 0; i < num_calls; i++) fprintf(stderr, " %s(%s)", calls[i].name, calls[i].arguments);
        fputc('\n', stderr);
    }
    return ok;
}

// Streams c->text: the prefix of `split` bytes (not final), then the rest arriving byte by
// byte when `byte_by_byte` (else all at once), then the end. The text events' pieces are
// concatenated, the calls collected; ends must grow and reach the length. No piece may
// show text of a call's block.
static bool streamed(ChatToolSyntax syntax, const Case *c, size_t split, bool byte_by_byte) {
    size_t length = strlen(c->text);
    ToolScanner scanner;
    tool_scanner_init(&scanner, syntax);
    char content[1024] = "";
    size_t content_length = 0, last_end = 0;
    ToolCall calls[4];
    int num_calls = 0;
    bool ok = true;
    size_t upto = split;
    for (;;) {
        bool final = upto >= length;
        if (final) upto = length;
        ToolEvent event;
        while (tool_scanner_next(&scanner, c->text, upto, final, &event)) {
            ok &= event.end >= last_end && event.end <= upto;
            last_end = event.end;
            if (event.kind == TOOL_EVENT_CALL) {
                if (num_calls < 4) calls[num_calls++] = event.call;
                else tool_call_free(&event.call);
                continue;
            }
            CHECK(content_length + event.length < sizeof content, "test content too long");
            memcpy(content + content_length, event.text, event.length);
            content_length += event.length;
            content[content_length] = '\0';
        }
        if (final) break;
        upto += byte_by_byte ? 1 : length;
    }
    ok &= last_end == length || length == 0;
    char how[64];
    snprintf(how, sizeof how, "streamed, split at %zu%s", split, byte_by_byte ? ", then byte by byte" : "");
    // Streamed, "no content" is nothing shown.
    Case expected = *c;
    if (!expected.content) expected.content = "";
    ok &= same(&expected, how, content, calls, num_calls);
    if (c->num_calls > 0 && syntax == CHAT_TOOLS_HERMES) {
        // The calls' JSON never shows as text (the case texts' arguments have no "name").
        ok &= strstr(content, "\"name\"") == NULL || c->content == NULL || strstr(c->content, "\"name\"") != NULL;
    }
    for (int i = 0; i < num_calls; i++) tool_call_free(&calls[i]);
    tool_scanner_free(&scanner);
    return ok;
}

static int check_cases(ChatToolSyntax syntax, const Case *cases, int count) {
    int failures = 0;
    for (int i = 0; i < count; i++) {
        const Case *c = &cases[i];
        char *content;
        ToolCall *calls;
        int num_calls;
        tool_calls_extract(syntax, c->text, strlen(c->text), &content, &calls, &num_calls);
        failures += !same(c, "whole", content, calls, num_calls);
        for (int k = 0; k < num_calls; k++) tool_call_free(&calls[k]);
        free(calls);
        free(content);
        for (size_t split = 0; split <= strlen(c->text); split++) {
            failures += !streamed(syntax, c, split, false);
            if (split == 0) failures += !streamed(syntax, c, split, true);
        }
    }
    return failures;
}

static void test_hermes(void) {
    int failures = check_cases(CHAT_TOOLS_HERMES, hermes_cases, sizeof hermes_cases / sizeof hermes_cases[0]);
    EXPECT(failures == 0, "%d hermes results differ", failures);
}

static void test_llama3_json(void) {
    int failures = check_cases(CHAT_TOOLS_LLAMA3_JSON, llama_cases, sizeof llama_cases / sizeof llama_cases[0]);
    EXPECT(failures == 0, "%d llama3_json results differ", failures);
}

// While a block is open nothing of it is shown, and a tag split across pieces is held:
// the text before it goes out, the tag's start does not.
static void test_streaming_holds_the_block(void) {
    const char *text = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    ToolScanner scanner;
    tool_scanner_init(&scanner, CHAT_TOOLS_HERMES);
    ToolEvent event;
    // "Hi <tool_" : "Hi" goes out, " " and "<tool_" are held.
    EXPECT(tool_scanner_next(&scanner, text, 9, false, &event) && event.kind == TOOL_EVENT_TEXT &&
               event.length == 2 && memcmp(event.text, "Hi", 2) == 0 && event.end == 3,
           "first piece: %.*s end %zu", (int)event.length, event.text, event.end);
    EXPECT(!tool_scanner_next(&scanner, text, 9, false, &event), "the tag's start was handed out");
    // Up to just before the closing tag's end: still nothing.
    size_t before_close = strlen(text) - 1;
    EXPECT(!tool_scanner_next(&scanner, text, before_close, false, &event), "an open block was handed out");
    EXPECT(tool_scanner_next(&scanner, text, strlen(text), false, &event) && event.kind == TOOL_EVENT_CALL &&
               strcmp(event.call.name, "f") == 0 && event.end == strlen(text),
           "the call when the block closes");
    if (event.kind == TOOL_EVENT_CALL) tool_call_free(&event.call);
    // The end: the held space is dropped (a call was made).
    EXPECT(tool_scanner_next(&scanner, text, strlen(text), true, &event) && event.kind == TOOL_EVENT_TEXT &&
               event.length == 0,
           "end: %zu bytes", event.length);
    EXPECT(!tool_scanner_next(&scanner, text, strlen(text), true, &event), "more after the end");
    tool_scanner_free(&scanner);

    // Llama 3 JSON holds an answer starting with "{" to its end, and shows plain text at once.
    tool_scanner_init(&scanner, CHAT_TOOLS_LLAMA3_JSON);
    EXPECT(!tool_scanner_next(&scanner, "{\"name\"", 7, false, &event), "a JSON start was shown");
    tool_scanner_free(&scanner);
    tool_scanner_init(&scanner, CHAT_TOOLS_LLAMA3_JSON);
    EXPECT(tool_scanner_next(&scanner, "Sunny", 5, false, &event) && event.length == 5, "plain text held");
    tool_scanner_free(&scanner);
}

int main(void) {
    RUN(test_hermes);
    RUN(test_llama3_json);
    RUN(test_streaming_holds_the_block);
    TEST_EXIT();
}
