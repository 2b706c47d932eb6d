// Rendering conversational rows with a chat template (data/chat_data.h).
#include "data/chat_data.h"

#include <string.h>

#include <jansson.h>

#include "core/check.h"

int chat_template_for_model(ChatTemplate *t, const Tokenizer *tok, const char *model_path, const char *option) {
    const char *bos = tokenizer_bos_id(tok) >= 0 ? tokenizer_token_string(tok, tokenizer_bos_id(tok)) : NULL;
    const char *eos = tokenizer_eos_id(tok) >= 0 ? tokenizer_token_string(tok, tokenizer_eos_id(tok)) : NULL;
    if (option) return chat_template_from_option(t, option, bos, eos);
    if (!tokenizer_chat_template(tok))
        return err_set("the model has no chat template (%s); pass --chat-template NAME or a template file", model_path);
    return chat_template_from_source(t, tokenizer_chat_template(tok), bos, eos, model_path);
}

// The messages of list `key` of a conversation, appended to messages[*count...]. Roles,
// contents and call names point into the JSON (checked at load); a tool-calling message
// without content gets "". Tool calls are new arrays, each call's arguments a new JSON text:
// an object's, or the text a string argument holds, which the template then renders as the
// object it holds (as `marlhf serve` and vLLM render a request's arguments; TRL would hand
// the template the string). release_messages frees them.
static void append_message_list(const json_t *list, ChatMessage *messages, int *count) {
    size_t index;
    json_t *message;
    json_array_foreach(list, index, message) {
        const json_t *content = json_object_get(message, "content"), *calls = json_object_get(message, "tool_calls");
        ChatMessage *m = &messages[(*count)++];
        *m = (ChatMessage){.role = json_string_value(json_object_get(message, "role")),
                           .content = json_is_string(content) ? json_string_value(content) : ""};
        const size_t call_count = json_array_size(calls); // 0 when absent or null
        if (call_count == 0) continue;
        ChatToolCall *parsed = xcalloc(call_count, sizeof *parsed);
        for (size_t j = 0; j < call_count; j++) {
            const json_t *function = json_object_get(json_array_get(calls, j), "function");
            const json_t *arguments = json_object_get(function, "arguments");
            parsed[j].name = json_string_value(json_object_get(function, "name"));
            parsed[j].arguments =
                json_is_string(arguments) ? xstrdup(json_string_value(arguments)) : json_dumps(arguments, JSON_COMPACT);
        }
        m->tool_calls = parsed;
        m->num_tool_calls = (int)call_count;
    }
}

static void append_messages(const json_t *conversation, const char *key, ChatMessage *messages, int *count) {
    append_message_list(json_object_get(conversation, key), messages, count);
}

// Frees what append_messages allocated for messages[0, count).
static void release_messages(ChatMessage *messages, int count) {
    for (int i = 0; i < count; i++) {
        for (int j = 0; j < messages[i].num_tool_calls; j++) free((char *)messages[i].tool_calls[j].arguments);
        free((ChatToolCall *)messages[i].tool_calls);
        messages[i].tool_calls = NULL, messages[i].num_tool_calls = 0;
    }
}

// The conversation's tools (TRL's tools column, kept at load) as JSON text for the
// template, or NULL when the row has none.
static char *conversation_tools(const json_t *conversation) {
    const json_t *tools = json_object_get(conversation, "tools");
    return tools ? json_dumps(tools, JSON_COMPACT) : NULL;
}

// err_set() of the template's own message with the row's place.
static int row_error(const Dataset *d, const DataRecord *r) {
    char *message = xstrdup(err_msg());
    err_set("%s (%s:%ld)", message, d->path, r->line);
    free(message);
    return -1;
}

// The template with the row's chat_template_kwargs (kept at load) applied: a copy that
// borrows t's strings (never freed). A variable the template does not read (Qwen3's
// enable_thinking on another template, say) is an error naming the row, as --no-thinking
// is on the commands.
static int row_template(const ChatTemplate *t, const json_t *conversation, const Dataset *d, const DataRecord *r,
                        ChatTemplate *out) {
    *out = *t;
    if (chat_template_apply_kwargs(out, json_object_get(conversation, "chat_template_kwargs")) != 0) return row_error(d, r);
    return 0;
}

// prompt + the `response` list of messages (the row's field `field`) rendered, the prompt's
// text taken off: *out (NULL when response is NULL).
static int render_response(const ChatTemplate *t, const Dataset *d, const DataRecord *r, const json_t *response,
                           const char *field, const char *tools, const char *prompt_text, ChatMessage *messages,
                           int prompt_count, char **out) {
    *out = NULL;
    if (!response) return 0;
    int count = prompt_count;
    append_message_list(response, messages, &count);
    char *full = NULL;
    int rendered = chat_template_render_tools(t, messages, count, tools, false, &full);
    release_messages(messages + prompt_count, count - prompt_count);
    if (rendered != 0) return row_error(d, r);
    size_t prefix = strlen(prompt_text);
    if (strncmp(full, prompt_text, prefix) != 0) {
        free(full);
        return err_set("the chat template %s does not extend the prompt's rendering when the \"%s\" messages are "
                       "appended, so the response cannot be cut off it (%s:%ld)",
                       chat_template_name(t), field, d->path, r->line);
    }
    *out = xstrdup(full + prefix);
    free(full);
    return 0;
}

// Python's str.isspace on the ASCII characters (strip() below; a message's other Unicode
// spaces are kept).
static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// The rendering of a prompt that ends with an assistant message for the model to continue
// (TRL renders such a prompt with continue_final_message=True): transformers' rule, the
// conversation rendered without a generation prompt and cut right after the last place the
// final message's stripped text appears — after the message with its trailing spaces where
// it has no leading ones and the rendering kept them.
static int render_continued(const ChatTemplate *t, const Dataset *d, const DataRecord *r, const ChatMessage *messages,
                            int count, const char *tools, char **out) {
    char *full = NULL;
    if (chat_template_render_tools(t, messages, count, tools, false, &full) != 0) return row_error(d, r);
    const char *final = messages[count - 1].content;
    size_t lead = 0, end = strlen(final);
    while (lead < end && is_space(final[lead])) lead++;
    while (end > lead && is_space(final[end - 1])) end--;
    char *stripped = xstrndup(final + lead, end - lead);
    const char *at = stripped[0] ? NULL : full + strlen(full); // Python finds "" at the end
    for (const char *p = stripped[0] ? strstr(full, stripped) : NULL; p; p = strstr(p + 1, stripped)) at = p;
    if (!at) {
        free(full), free(stripped);
        return err_set("the chat template %s does not write the prompt's final assistant message as it is, so it "
                       "cannot be continued (%s:%ld)",
                       chat_template_name(t), d->path, r->line);
    }
    const size_t keep = (size_t)(at - full) + (lead == 0 && strncmp(at, final, strlen(final)) == 0 ? strlen(final)
                                                                                                    : strlen(stripped));
    *out = xstrndup(full, keep);
    free(full), free(stripped);
    return 0;
}

static int render_record(const ChatTemplate *shared, const Dataset *d, DataRecord *r) {
    json_error_t error;
    json_t *conversation = json_loads(r->conversation, 0, &error);
    CHECK(conversation, "a conversation kept at load does not parse: %s", error.text);
    ChatTemplate row;
    if (row_template(shared, conversation, d, r, &row) != 0) {
        json_decref(conversation);
        return -1;
    }
    const ChatTemplate *t = &row;
    // The prompt's messages, then one response's at a time after them.
    const json_t *ranked = json_object_get(conversation, "responses"); // a ranked row's, best first
    size_t longest = json_array_size(json_object_get(conversation, "chosen"));
    if (json_array_size(json_object_get(conversation, "rejected")) > longest)
        longest = json_array_size(json_object_get(conversation, "rejected"));
    for (size_t k = 0; k < json_array_size(ranked); k++)
        if (json_array_size(json_array_get(ranked, k)) > longest) longest = json_array_size(json_array_get(ranked, k));
    const size_t total = json_array_size(json_object_get(conversation, "prompt")) + longest;
    ChatMessage *messages = xcalloc(total + 1, sizeof *messages);
    int prompt_count = 0;
    append_messages(conversation, "prompt", messages, &prompt_count);
    char *tools = conversation_tools(conversation);
    char *prompt = NULL, *chosen = NULL, *rejected = NULL;
    int rc = 0;
    // As TRL: a prompt that ends with a user or tool message gets the generation prompt,
    // one that ends with an assistant message is continued.
    const char *last_role = messages[prompt_count - 1].role;
    if (!strcmp(last_role, "assistant")) {
        rc = render_continued(t, d, r, messages, prompt_count, tools, &prompt);
    } else if (strcmp(last_role, "user") != 0 && strcmp(last_role, "tool") != 0) {
        rc = err_set("the prompt ends with a message of role \"%s\", expected \"user\", \"tool\" or \"assistant\" "
                     "(one to continue) (%s:%ld)",
                     last_role, d->path, r->line);
    } else if (chat_template_render_tools(t, messages, prompt_count, tools, true, &prompt) != 0) {
        rc = row_error(d, r);
    }
    if (rc == 0)
        rc = render_response(t, d, r, json_object_get(conversation, "chosen"), "chosen", tools, prompt, messages,
                             prompt_count, &chosen);
    if (rc == 0)
        rc = render_response(t, d, r, json_object_get(conversation, "rejected"), "rejected", tools, prompt, messages,
                             prompt_count, &rejected);
    // A ranked row's responses, each rendered after the prompt as chosen is.
    const int ranked_count = (int)json_array_size(ranked);
    CHECK(ranked_count == 0 || ranked_count == r->response_count, "a ranked row's responses changed since it was loaded");
    char **responses = ranked_count > 0 ? xcalloc((size_t)ranked_count, sizeof *responses) : NULL;
    for (int k = 0; rc == 0 && k < ranked_count; k++) {
        char field[48];
        snprintf(field, sizeof field, "responses[%d]", k);
        rc = render_response(t, d, r, json_array_get(ranked, k), field, tools, prompt, messages, prompt_count,
                             &responses[k]);
    }
    if (rc == 0) {
        free(r->prompt), free(r->chosen), free(r->rejected);
        r->prompt = prompt, r->chosen = chosen, r->rejected = rejected;
        for (int k = 0; k < ranked_count; k++) {
            free(r->responses[k]);
            r->responses[k] = responses[k];
        }
    } else {
        free(prompt), free(chosen), free(rejected);
        for (int k = 0; k < ranked_count; k++) free(responses[k]);
    }
    free(responses);
    release_messages(messages, prompt_count);
    free(messages);
    free(tools);
    json_decref(conversation);
    return rc;
}

int dataset_render_chat_with(Dataset *dataset, const ChatTemplate *t) {
    for (long i = 0; i < dataset->count; i++)
        if (dataset->records[i].conversation && render_record(t, dataset, &dataset->records[i]) != 0) return -1;
    return 0;
}

// text minus its prefix `before` (which it must start with): a new string, or NULL with
// err_set() naming the row.
static char *cut_prefix(const ChatTemplate *t, const Dataset *d, const DataRecord *r, const char *text,
                        const char *before, size_t message) {
    size_t prefix = strlen(before);
    if (strncmp(text, before, prefix) != 0) {
        err_set("the chat template %s renders the messages before \"messages[%zu]\" differently once it follows, so "
                "the conversation cannot be cut into turns (%s:%ld)",
                chat_template_name(t), message, d->path, r->line);
        return NULL;
    }
    return xstrdup(text + prefix);
}

// record->turns of a {"messages"} row: for each assistant message i after the first
// message, up to the last assistant message, the text that leads to it (rendered through
// message i - 1 with the generation prompt, less what came before) and its own text
// (rendered through message i, less the former). Messages after the last assistant
// message are left out, as the last-turn split leaves them out.
static int render_turns(const ChatTemplate *shared, const Dataset *d, DataRecord *r) {
    json_error_t error;
    json_t *conversation = json_loads(r->conversation, 0, &error);
    CHECK(conversation, "a conversation kept at load does not parse: %s", error.text);
    ChatTemplate row;
    if (row_template(shared, conversation, d, r, &row) != 0) {
        json_decref(conversation);
        return -1;
    }
    const ChatTemplate *t = &row;
    json_t *list = json_object_get(conversation, "messages");
    if (!list) { // a prompt / completion row: its two rendered parts are its turns
        json_decref(conversation);
        r->turns = xmalloc(2 * sizeof *r->turns);
        r->turns[0] = xstrdup(r->prompt), r->turns[1] = xstrdup(r->chosen);
        r->turn_count = 2;
        return 0;
    }
    const size_t count = json_array_size(list);
    ChatMessage *messages = xcalloc(count, sizeof *messages);
    int appended = 0;
    append_messages(conversation, "messages", messages, &appended);
    char *tools = conversation_tools(conversation);
    char **turns = xcalloc(2 * count, sizeof *turns);
    int turn_count = 0, rc = 0;
    char *rendered = xstrdup(""); // the conversation so far, through the last assistant message taken
    for (size_t i = 1; i < count && rc == 0; i++) {
        if (strcmp(messages[i].role, "assistant") != 0) continue;
        char *leading = NULL, *through = NULL;
        if (chat_template_render_tools(t, messages, (int)i, tools, true, &leading) != 0) rc = row_error(d, r);
        if (rc == 0 && !(turns[turn_count++] = cut_prefix(t, d, r, leading, rendered, i - 1))) rc = -1;
        if (rc == 0 && chat_template_render_tools(t, messages, (int)i + 1, tools, false, &through) != 0)
            rc = row_error(d, r);
        if (rc == 0 && !(turns[turn_count++] = cut_prefix(t, d, r, through, leading, i))) rc = -1;
        free(leading);
        if (rc == 0) {
            free(rendered);
            rendered = through;
        } else {
            free(through);
        }
    }
    free(rendered);
    release_messages(messages, appended);
    free(messages);
    free(tools);
    json_decref(conversation);
    if (rc != 0) {
        for (int k = 0; k < turn_count; k++) free(turns[k]);
        free(turns);
        return -1;
    }
    CHECK(turn_count >= 2, "a {\"messages\"} row without an assistant message after its first got through loading");
    r->turns = turns, r->turn_count = turn_count;
    return 0;
}

// A pass over a conversational dataset's rows after dataset_render_chat (turns, whole
// conversations): `render` on each row, with template t or the model's.
typedef int (*RowPass)(const ChatTemplate *t, const Dataset *d, DataRecord *r);

static int each_row_with(Dataset *dataset, const ChatTemplate *t, RowPass render) {
    for (long i = 0; i < dataset->count; i++)
        if (dataset->records[i].conversation && render(t, dataset, &dataset->records[i]) != 0) return -1;
    return 0;
}

static int each_row(Dataset *dataset, const Tokenizer *tok, const char *model_path, const char *option, RowPass render) {
    if (!dataset->conversational || dataset->count == 0) return 0;
    ChatTemplate t;
    if (chat_template_for_model(&t, tok, model_path, option) != 0) return -1;
    const int rc = each_row_with(dataset, &t, render);
    chat_template_free(&t);
    return rc;
}

int dataset_render_turns(Dataset *dataset, const Tokenizer *tok, const char *model_path, const char *option) {
    return each_row(dataset, tok, model_path, option, render_turns);
}

int dataset_render_turns_with(Dataset *dataset, const ChatTemplate *t) { return each_row_with(dataset, t, render_turns); }

// The chosen text of a {"messages"} row whose last message is not its last assistant message,
// extended through the messages after it: the whole conversation rendered (no generation
// prompt), less the prompt's text, which it must start with.
static int render_through_end(const ChatTemplate *shared, const Dataset *d, DataRecord *r) {
    json_error_t error;
    json_t *conversation = json_loads(r->conversation, 0, &error);
    CHECK(conversation, "a conversation kept at load does not parse: %s", error.text);
    const json_t *list = json_object_get(conversation, "messages");
    const size_t count = json_array_size(list);
    const char *last_role = count ? json_string_value(json_object_get(json_array_get(list, count - 1), "role")) : NULL;
    if (!last_role || strcmp(last_role, "assistant") == 0) { // nothing after the last assistant message
        json_decref(conversation);
        return 0;
    }
    ChatTemplate row;
    if (row_template(shared, conversation, d, r, &row) != 0) {
        json_decref(conversation);
        return -1;
    }
    ChatMessage *messages = xcalloc(count, sizeof *messages);
    int appended = 0;
    append_messages(conversation, "messages", messages, &appended);
    char *tools = conversation_tools(conversation);
    char *whole = NULL;
    int rc = chat_template_render_tools(&row, messages, appended, tools, false, &whole) != 0 ? row_error(d, r) : 0;
    const size_t prefix = strlen(r->prompt);
    if (rc == 0 && strncmp(whole, r->prompt, prefix) != 0)
        rc = err_set("the chat template %s renders the prompt differently once the messages after the last assistant "
                     "message follow, so they cannot be added to the response (%s:%ld)",
                     chat_template_name(&row), d->path, r->line);
    if (rc == 0) {
        free(r->chosen);
        r->chosen = xstrdup(whole + prefix);
    }
    free(whole);
    release_messages(messages, appended);
    free(messages);
    free(tools);
    json_decref(conversation);
    return rc;
}

int dataset_render_whole_conversations(Dataset *dataset, const Tokenizer *tok, const char *model_path,
                                       const char *option) {
    return each_row(dataset, tok, model_path, option, render_through_end);
}

int dataset_render_whole_conversations_with(Dataset *dataset, const ChatTemplate *t) {
    return each_row_with(dataset, t, render_through_end);
}

int dataset_render_chat(Dataset *dataset, Tokenizer *tok, const char *model_path, const char *option) {
    if (!dataset->conversational) return 0;
    ChatTemplate t;
    if (chat_template_for_model(&t, tok, model_path, option) != 0) {
        if (option) return -1; // the option's own error names it
        char *why = xstrdup(err_msg());
        err_set("the data is conversational (%s) and the model has no recognised chat template (%s): %s",
                dataset->path, model_path, why);
        free(why);
        return -1;
    }
    int rc = dataset_render_chat_with(dataset, &t);
    chat_template_free(&t);
    if (rc == 0) tokenizer_set_chat_rendered(tok, true);
    return rc;
}
