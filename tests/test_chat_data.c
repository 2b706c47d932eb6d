// Conversational datasets (TRL's message formats) rendered with a chat template
// (data/chat_data.h), against tests/fixtures/chat_data/cases.json, made by
// tools/make_chat_data_fixtures.py with transformers' apply_chat_template under TRL's
// rules: the rendered prompt / chosen / rejected texts, and the token ids a trainer
// builds from them (tokenize_example: prompt, response, EOS), which must match TRL's
// tokenization with add_special_tokens=False (no second BOS from a tokenizer that adds one).
// Then the bad rows: each an error naming the file and line.
#include <jansson.h>
#include <string.h>

#include "core/check.h"
#include "data/chat_data.h"
#include "data/dataset.h"
#include "io/fs.h"
#include "tokenizer/tokenizer.h"
#include "train/sft.h"
#include "test.h"

#define FIXTURE "tests/fixtures/chat_data/cases.json"
static const char *smollm2_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
static const char *tiny_chat_path = "tests/fixtures/models/tiny_chat";
static const char *no_template_path = "tests/fixtures/tokenizers/spm_small";

static char tmp_dir[512];

static const char *write_row(const char *name, const char *text) {
    static char path[4][600];
    static int slot;
    char *out = path[slot++ % 4];
    snprintf(out, 600, "%s/%s", tmp_dir, name);
    FILE *file = fopen(out, "wb");
    CHECK(file, "cannot write %s", out);
    CHECK(fwrite(text, 1, strlen(text), file) == strlen(text), "short write %s", out);
    fclose(file);
    return out;
}

static bool same_text(const char *got, const json_t *expected) {
    if (json_is_null(expected)) return got == NULL;
    return got && strcmp(got, json_string_value(expected)) == 0;
}

// tokenize_example's ids of prompt + response against the fixture's prompt ids and
// response ids (the response's end with EOS).
static bool same_ids(const Tokenizer *tok, const char *prompt, const char *response, const json_t *prompt_ids,
                     const json_t *response_ids) {
    int *ids, length, prompt_length;
    bool truncated;
    tokenize_example(tok, prompt, response, 1 << 20, &ids, &length, &prompt_length, &truncated);
    bool same = (size_t)prompt_length == json_array_size(prompt_ids) &&
                (size_t)(length - prompt_length) == json_array_size(response_ids);
    for (int i = 0; same && i < length; i++) {
        const json_t *want = i < prompt_length ? json_array_get(prompt_ids, (size_t)i)
                                               : json_array_get(response_ids, (size_t)(i - prompt_length));
        same = ids[i] == json_integer_value(want);
    }
    free(ids);
    return same;
}

// SFT's --assistant-only-loss: a {"messages"} row's turns (dataset_render_turns) against
// the fixture's texts, and tokenize_turns' ids and trained flags against its ids (the
// whole conversation, EOS last) and trained tokens (from the tokenizer's offsets).
static bool same_turns(const Tokenizer *tok, const DataRecord *r, const json_t *turns) {
    const json_t *texts = json_object_get(turns, "texts"), *want_ids = json_object_get(turns, "ids");
    const json_t *want_trained = json_object_get(turns, "trained");
    bool same = (size_t)r->turn_count == json_array_size(texts);
    for (int k = 0; same && k < r->turn_count; k++) same = same_text(r->turns[k], json_array_get(texts, (size_t)k));
    if (!same) return false;
    int *ids, length, prompt_length;
    unsigned char *trained;
    bool truncated;
    tokenize_turns(tok, (const char *const *)r->turns, r->turn_count, 1 << 20, &ids, &trained, &length, &prompt_length,
                   &truncated);
    same = (size_t)length == json_array_size(want_ids) && !truncated;
    for (int i = 0; same && i < length; i++)
        same = ids[i] == json_integer_value(json_array_get(want_ids, (size_t)i)) &&
               trained[i] == json_integer_value(json_array_get(want_trained, (size_t)i)) &&
               (i >= prompt_length || !trained[i]);
    same = same && prompt_length < length && trained[prompt_length]; // prompt_length: the first trained token
    free(ids), free(trained);
    return same;
}

// SFT's --completion-only-loss false: the prompt and the response extended through the end of
// the conversation (dataset_render_whole_conversations) against TRL's rendering of the whole
// conversation, and tokenize_example's ids of the two against the fixture's.
static bool same_whole(const Tokenizer *tok, const DataRecord *r, const json_t *whole) {
    const char *text = json_string_value(json_object_get(whole, "text"));
    const json_t *want_ids = json_object_get(whole, "ids");
    const size_t prompt_length = strlen(r->prompt);
    if (strncmp(text, r->prompt, prompt_length) != 0 || strcmp(text + prompt_length, r->chosen) != 0) return false;
    int *ids, length, prompt_tokens;
    bool truncated;
    tokenize_example(tok, r->prompt, r->chosen, 1 << 20, &ids, &length, &prompt_tokens, &truncated);
    bool same = (size_t)length == json_array_size(want_ids);
    for (int i = 0; same && i < length; i++) same = ids[i] == json_integer_value(json_array_get(want_ids, (size_t)i));
    free(ids);
    return same;
}

static void test_cases_match_transformers(void) {
    json_error_t error;
    json_t *root = json_load_file(FIXTURE, 0, &error);
    CHECK(root, "%s: %s", FIXTURE, error.text);
    size_t index;
    json_t *entry;
    int checked = 0, turn_cases = 0, whole_cases = 0, extended_cases = 0;
    json_array_foreach(json_object_get(root, "cases"), index, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        const char *template = json_string_value(json_object_get(entry, "template"));
        const bool smollm2 = strcmp(json_string_value(json_object_get(entry, "tokenizer")), "smollm2") == 0;
        if (smollm2 && !fs_is_file(smollm2_path)) {
            fprintf(stderr, "  %s: %s missing (scripts/fetch-model)\n", name, smollm2_path);
            test_current_failures++;
            continue;
        }
        // Template "smollm2": SmolLM2's own, found in the GGUF; any other as --chat-template NAME
        // (llama3 and llama3.1 on the tiny tokenizer, qwen2.5 on SmolLM2's for the tool rows).
        const char *model = smollm2 ? smollm2_path : tiny_chat_path;
        const char *option = strcmp(template, "smollm2") == 0 ? NULL : template;
        Tokenizer *tok;
        CHECK(tokenizer_load(&tok, model) == 0, "%s", err_msg());
        Dataset d;
        const char *path = write_row("case.jsonl", json_string_value(json_object_get(entry, "row")));
        if (dataset_load(&d, path, DATA_FORMAT_AUTO, 0) != 0) {
            EXPECT(false, "%s: %s", name, err_msg());
            tokenizer_free(tok);
            continue;
        }
        EXPECT(d.conversational, "%s: not read as conversational", name);
        if (dataset_render_chat(&d, tok, model, option) != 0) {
            EXPECT(false, "%s: %s", name, err_msg());
        } else {
            const json_t *expected = json_object_get(entry, "expected"), *ids = json_object_get(entry, "ids");
            const DataRecord *r = &d.records[0];
            EXPECT(same_text(r->prompt, json_object_get(expected, "prompt")), "%s: prompt \"%s\"", name, r->prompt);
            EXPECT(same_text(r->chosen, json_object_get(expected, "chosen")), "%s: chosen \"%s\"", name,
                   r->chosen ? r->chosen : "(null)");
            EXPECT(same_text(r->rejected, json_object_get(expected, "rejected")), "%s: rejected \"%s\"", name,
                   r->rejected ? r->rejected : "(null)");
            const char *responses[2] = {r->chosen, r->rejected}, *keys[2] = {"chosen", "rejected"};
            for (int k = 0; k < 2; k++)
                if (responses[k])
                    EXPECT(same_ids(tok, r->prompt, responses[k], json_object_get(ids, "prompt"),
                                    json_object_get(ids, keys[k])),
                           "%s: %s token ids differ from TRL's", name, keys[k]);
            if (!r->chosen && !r->rejected) { // prompt only: the ids PPO generates from
                json_t *eos = json_pack("[i]", tokenizer_eos_id(tok));
                EXPECT(same_ids(tok, r->prompt, "", json_object_get(ids, "prompt"), eos), "%s: prompt token ids differ",
                       name);
                json_decref(eos);
            }
            const json_t *turns = json_object_get(entry, "turns");
            if (turns) {
                EXPECT(dataset_render_turns(&d, tok, model, option) == 0, "%s: %s", name, err_msg());
                EXPECT(same_turns(tok, r, turns), "%s: --assistant-only-loss turns differ", name);
                turn_cases++;
            }
            const json_t *whole = json_object_get(entry, "whole");
            if (whole) {
                char *last_turn = xstrdup(r->chosen);
                EXPECT(dataset_render_whole_conversations(&d, tok, model, option) == 0, "%s: %s", name, err_msg());
                EXPECT(same_whole(tok, r, whole), "%s: the whole conversation differs from TRL's: \"%s\"", name,
                       r->chosen);
                extended_cases += strcmp(last_turn, r->chosen) != 0;
                free(last_turn);
                whole_cases++;
            }
            checked++;
        }
        dataset_free(&d);
        tokenizer_free(tok);
    }
    EXPECT(checked == (int)json_array_size(json_object_get(root, "cases")), "checked %d cases", checked);
    EXPECT(turn_cases == 7, "%d cases of turns (2 rows x 2 templates, a tool row x 2 templates, Qwen3 without "
           "thinking)", turn_cases);
    EXPECT(whole_cases == 7 && extended_cases == 2,
           "%d cases of whole conversations, %d of them with messages after the last assistant one (7 and 2 expected)",
           whole_cases, extended_cases);
    json_decref(root);
}

// The tokenizer that adds BOS adds none to rendered text: with the switch off, the
// llama3 prompt would start with two BOS ids.
static void test_rendered_text_gets_one_bos(void) {
    Tokenizer *tok;
    CHECK(tokenizer_load(&tok, tiny_chat_path) == 0, "%s", err_msg());
    Dataset d;
    const char *path = write_row("bos.jsonl", "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n");
    CHECK(dataset_load(&d, path, DATA_FORMAT_AUTO, 0) == 0, "%s", err_msg());
    const int bos = tokenizer_bos_id(tok);
    int *ids, n;
    tokenizer_encode(tok, "x", 1, true, &ids, &n);
    EXPECT(n >= 2 && ids[0] == bos, "the tiny tokenizer adds BOS (got %d ids)", n);
    free(ids);
    CHECK(dataset_render_chat(&d, tok, tiny_chat_path, "llama3") == 0, "%s", err_msg());
    tokenizer_encode(tok, d.records[0].prompt, strlen(d.records[0].prompt), true, &ids, &n);
    EXPECT(n >= 2 && ids[0] == bos && ids[1] != bos, "one BOS: %d %d", ids[0], n > 1 ? ids[1] : -1);
    free(ids);
    dataset_free(&d);
    tokenizer_free(tok);
}

// A conversational ranked row ({prompt: [msgs], responses: [[msgs], ...]}, best first; no TRL
// counterpart, as TRL has no listwise reward): each response is rendered as a pair's chosen
// of the same messages is (which test_cases_match_transformers holds to transformers), on
// a tool-calling row with a second template too, and the ranking survives a split's copy.
static void test_ranked_rows_render_as_pairs(void) {
    const char *prompt = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Name a colour.\"}]";
    const char *responses[3] = {
        "[{\"role\": \"assistant\", \"content\": \"Blue.\"}]",
        "[{\"role\": \"assistant\", \"content\": \"Green, I think.\"}, {\"role\": \"user\", \"content\": \"Sure?\"}, "
        "{\"role\": \"assistant\", \"content\": \"Yes.\"}]",
        "[{\"role\": \"assistant\", \"content\": \"A colour is a property of light.\"}]"};
    const char *templates[2] = {"llama3", "qwen2.5"};
    for (int t = 0; t < 2; t++) {
        Tokenizer *tok;
        CHECK(tokenizer_load(&tok, tiny_chat_path) == 0, "%s", err_msg());
        char row[2048];
        snprintf(row, sizeof row, "{\"prompt\": %s, \"responses\": [%s, %s, %s]}\n", prompt, responses[0], responses[1],
                 responses[2]);
        Dataset ranked;
        CHECK(dataset_load(&ranked, write_row("ranked.jsonl", row), DATA_FORMAT_AUTO, 0) == 0, "%s", err_msg());
        EXPECT(ranked.format == DATA_FORMAT_RANKED && ranked.conversational && ranked.records[0].response_count == 3,
               "read as a conversational ranking of 3");
        Dataset copy = ranked; // as a split copies rows before they are rendered
        copy.records = xmalloc(sizeof *copy.records);
        copy.path = xstrdup(ranked.path);
        data_record_copy(&ranked.records[0], &copy.records[0]);
        CHECK(dataset_render_chat(&copy, tok, tiny_chat_path, templates[t]) == 0, "%s", err_msg());
        for (int k = 0; k < 3; k++) {
            snprintf(row, sizeof row, "{\"prompt\": %s, \"chosen\": %s, \"rejected\": %s}\n", prompt, responses[k],
                     responses[(k + 1) % 3]);
            Dataset pair;
            CHECK(dataset_load(&pair, write_row("pair.jsonl", row), DATA_FORMAT_AUTO, 0) == 0, "%s", err_msg());
            CHECK(dataset_render_chat(&pair, tok, tiny_chat_path, templates[t]) == 0, "%s", err_msg());
            const DataRecord *r = &copy.records[0], *p = &pair.records[0];
            EXPECT(strcmp(r->prompt, p->prompt) == 0, "%s: the ranked row's prompt \"%s\"", templates[t], r->prompt);
            EXPECT(r->responses[k] && strcmp(r->responses[k], p->chosen) == 0, "%s: response %d \"%s\" against \"%s\"",
                   templates[t], k, r->responses[k] ? r->responses[k] : "(null)", p->chosen);
            dataset_free(&pair);
        }
        EXPECT(strstr(copy.records[0].responses[1], "Yes.") != NULL, "the multi-turn response keeps its turns");
        dataset_free(&copy);
        dataset_free(&ranked);
        tokenizer_free(tok);
    }
}

// Each bad row fails with its file:line in the message and the given text.
static void expect_bad(const char *rows, const char *model, const char *option, const char *message, long line) {
    const char *path = write_row("bad.jsonl", rows);
    char place[700];
    snprintf(place, sizeof place, "(%s:%ld)", path, line);
    Dataset d;
    int rc = dataset_load(&d, path, DATA_FORMAT_AUTO, 0);
    if (rc == 0) {
        Tokenizer *tok;
        CHECK(tokenizer_load(&tok, model) == 0, "%s", err_msg());
        rc = dataset_render_chat(&d, tok, model, option);
        tokenizer_free(tok);
        dataset_free(&d);
    }
    EXPECT(rc == -1, "accepted: %s", rows);
    EXPECT(strstr(err_msg(), message) != NULL, "message \"%s\" lacks \"%s\"", err_msg(), message);
    if (line > 0) EXPECT(strstr(err_msg(), place) != NULL, "message \"%s\" lacks %s", err_msg(), place);
}

static void test_bad_rows(void) {
    const char *good = "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n";
    char rows[1024];
    expect_bad("{\"messages\": [{\"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n", tiny_chat_path,
               "llama3", "missing field \"messages[0].role\"", 1);
    snprintf(rows, sizeof rows, "%s{\"prompt\": [{\"role\": \"user\", \"content\": 3}], \"completion\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n", good);
    expect_bad(rows, tiny_chat_path, "llama3", "field \"prompt[0].content\" is an integer, expected a string", 2);
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n", tiny_chat_path, "llama3",
               "no assistant message", 1);
    // A completion that opens with a user turn: the template does not extend the prompt's
    // text (which ends with the assistant's generation prompt).
    expect_bad("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"role\": \"user\", \"content\": \"a\"}]}\n",
               tiny_chat_path, "llama3", "does not extend the prompt's rendering", 1);
    expect_bad(good, no_template_path, NULL, "the data is conversational", 0);
    EXPECT(strstr(err_msg(), no_template_path) != NULL, "names the model: %s", err_msg());
    snprintf(rows, sizeof rows, "%s{\"prompt\": \"q\", \"completion\": \"a\"}\n", good);
    expect_bad(rows, tiny_chat_path, "llama3", "every row must be alike", 2);
    expect_bad("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"system\", \"content\": \"s\"}]}\n",
               tiny_chat_path, "llama3", "expected \"user\", \"tool\" or \"assistant\"", 1);
    expect_bad("{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"r\"}]}\n",
               tiny_chat_path, "llama3", "share no leading message", 1);
    // Conversational rankings: every response a list of messages, at least two of them.
    expect_bad("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"responses\": [[{\"role\": \"assistant\", "
               "\"content\": \"a\"}], \"b\"]}\n",
               tiny_chat_path, "llama3", "field \"responses[1]\" is a string, expected a list of messages", 1);
    expect_bad("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"responses\": [[{\"role\": \"assistant\", "
               "\"content\": \"a\"}]]}\n",
               tiny_chat_path, "llama3", "field \"responses\" has 1 entry, expected at least 2", 1);
    expect_bad("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"responses\": [[{\"role\": \"assistant\", "
               "\"content\": \"a\"}], [{\"role\": \"user\", \"content\": \"b\"}]]}\n",
               tiny_chat_path, "llama3", "when the \"responses[1]\" messages are appended", 1);

    // Tool-calling rows: the tools column and the calls checked at load, naming the field;
    // tools, calls or tool messages on a template that renders no tools refused at rendering.
    const char *user_q = "{\"role\": \"user\", \"content\": \"q\"}";
    const char *answer = "\"completion\": [{\"role\": \"assistant\", \"content\": \"a\"}]";
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"tools\": {\"type\": \"function\"}}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field \"tools\" is an object, expected a list of tool objects", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"tools\": \"[{\\\"type\\\": \"}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field \"tools\" is a string that does not hold JSON", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"tools\": [\"get_weather\"]}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field \"tools[0]\" is a string, expected a tool object", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], \"completion\": [{\"role\": \"assistant\", \"tool_calls\": "
             "[{\"function\": {\"name\": \"f\", \"arguments\": \"[1, 2]\"}}]}]}\n", user_q);
    expect_bad(rows, tiny_chat_path, "llama3.1",
               "field \"completion[0].tool_calls[0].function.arguments\" is a string that does not hold a JSON object", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], \"completion\": [{\"role\": \"assistant\", \"tool_calls\": "
             "[{\"function\": {\"name\": \"f\", \"arguments\": 3}}]}]}\n", user_q);
    expect_bad(rows, tiny_chat_path, "llama3.1", "\"completion[0].tool_calls[0].function.arguments\" is an integer", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], \"completion\": [{\"role\": \"assistant\", \"tool_calls\": "
             "[{\"type\": \"function\", \"name\": \"f\"}]}]}\n", user_q);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field \"completion[0].tool_calls[0]\" is not {\"type\": \"function\"", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], \"completion\": [{\"role\": \"assistant\", \"tool_calls\": "
             "[{\"function\": {\"name\": \"\", \"arguments\": {}}}]}]}\n", user_q);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field \"completion[0].tool_calls[0].function.name\" is empty", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\", \"tool_calls\": []}], %s}\n",
             answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "only an assistant message makes tool calls", 1);
    // A call's content may be left out; any other message's may not.
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], \"completion\": [{\"role\": \"assistant\", \"tool_calls\": []}]}\n",
             user_q);
    expect_bad(rows, tiny_chat_path, "llama3.1", "missing field \"completion[0].content\"", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"tools\": [{\"type\": \"function\", \"function\": "
             "{\"name\": \"f\"}}]}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3", "tools", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": "
             "{\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": \"r\"}], %s}\n",
             user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3", "tool", 1);

    // chat_template_kwargs: only the variables the templates read, of their types, on the
    // templates that read them.
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"chat_template_kwargs\": {\"add_date\": true}}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "field chat_template_kwargs.add_date is not a variable", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}\n",
             user_q, answer);
    expect_bad(rows, tiny_chat_path, "qwen3", "field chat_template_kwargs.enable_thinking must be true or false", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"chat_template_kwargs\": [1]}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "qwen3", "field \"chat_template_kwargs\" is an array", 1);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"chat_template_kwargs\": {\"date_string\": "
             "\"the third day of December in the year 2026\"}}\n", user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3.1", "is longer than 31 bytes", 1);
    snprintf(rows, sizeof rows, "%s{\"prompt\": [%s], %s, \"chat_template_kwargs\": {\"enable_thinking\": false}}\n", good,
             user_q, answer);
    expect_bad(rows, tiny_chat_path, "llama3", "enable_thinking: chat template llama3 has no thinking switch", 2);
    snprintf(rows, sizeof rows, "{\"prompt\": [%s], %s, \"chat_template_kwargs\": {\"date_string\": \"1 Jan\"}}\n",
             user_q, answer);
    expect_bad(rows, tiny_chat_path, "qwen3", "date_string: chat template qwen3 does not read it", 1);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "%s/test_chat_data", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
    CHECK(fs_mkdir_p(tmp_dir) == 0, "%s", err_msg());
    RUN(test_cases_match_transformers);
    RUN(test_rendered_text_gets_one_bos);
    RUN(test_ranked_rows_render_as_pairs);
    RUN(test_bad_rows);
    TEST_EXIT();
}
