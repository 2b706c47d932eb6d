#include "gen/text_model.h"

#include <string.h>

#include "core/check.h"
#include "model/weights_io.h"

// End-of-turn tokens of the chat formats marlhf knows; generation stops on any of them
// that the vocabulary has as a special token, as well as on EOS.
static const char *end_of_turn_pieces[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"};

int text_model_load(TextModel *tm, const char *path, const char *lora_adapter, const char *device,
                    const char *quantize, const char *chat_template_option, bool needs_chat) {
    memset(tm, 0, sizeof *tm);
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) return -1;
    ModelLoadOptions load = {.with_lm_head = true, .quantize = quantize};
    if (model_load_with_adapter(&tm->model, path, ops, &load, lora_adapter, 0) != 0) return -1;
    int rc = tokenizer_load(&tm->tokenizer, path);
    if (rc == 0 && tokenizer_vocab_size(tm->tokenizer) > tm->model.config.vocab_size)
        rc = err_set("tokenizer has %d tokens but the model only %d (%s)", tokenizer_vocab_size(tm->tokenizer),
                     tm->model.config.vocab_size, path);
    if (rc != 0) {
        text_model_free(tm);
        return -1;
    }
    const Tokenizer *tok = tm->tokenizer;
    const char *bos = tokenizer_bos_id(tok) >= 0 ? tokenizer_token_string(tok, tokenizer_bos_id(tok)) : NULL;
    const char *eos = tokenizer_eos_id(tok) >= 0 ? tokenizer_token_string(tok, tokenizer_eos_id(tok)) : NULL;
    rc = -1;
    if (chat_template_option) rc = chat_template_from_option(&tm->chat, chat_template_option, bos, eos);
    else if (tokenizer_chat_template(tok)) rc = chat_template_from_source(&tm->chat, tokenizer_chat_template(tok), bos, eos, path);
    else err_set("model has no chat template (%s); pass --chat-template NAME or a template file", path);
    if (rc == 0) tm->has_chat = true;
    else if (needs_chat) {
        text_model_free(tm);
        return -1;
    }
    if (tokenizer_eos_id(tok) >= 0) tm->stop_tokens[tm->num_stop_tokens++] = tokenizer_eos_id(tok);
    for (size_t i = 0; i < sizeof end_of_turn_pieces / sizeof end_of_turn_pieces[0]; i++) {
        int id = tokenizer_piece_to_id(tok, end_of_turn_pieces[i]);
        bool known = false;
        for (int j = 0; j < tm->num_stop_tokens; j++) known |= tm->stop_tokens[j] == id;
        if (id >= 0 && !known && tokenizer_is_special(tok, id) && tm->num_stop_tokens < 8)
            tm->stop_tokens[tm->num_stop_tokens++] = id;
    }
    err_clear(); // a missing template that was not needed is not an error of this call
    return 0;
}

void text_model_free(TextModel *tm) {
    if (tm->has_chat) chat_template_free(&tm->chat);
    tokenizer_free(tm->tokenizer);
    model_free(&tm->model);
    memset(tm, 0, sizeof *tm);
}

int text_model_disable_thinking(TextModel *tm) {
    if (!tm->has_chat) return err_set("the model has no chat template to switch thinking off in");
    return chat_template_disable_thinking(&tm->chat);
}

int text_model_chat_ids(TextModel *tm, const ChatMessage *messages, int count, int **ids, int *length) {
    return text_model_chat_ids_tools(tm, messages, count, NULL, ids, length);
}

int text_model_chat_ids_tools(TextModel *tm, const ChatMessage *messages, int count, const char *tools_json, int **ids,
                              int *length) {
    CHECK(tm->has_chat, "chat ids without a chat template");
    return text_model_chat_ids_with(tm, &tm->chat, messages, count, tools_json, ids, length);
}

int text_model_chat_ids_with(TextModel *tm, const ChatTemplate *chat, const ChatMessage *messages, int count,
                             const char *tools_json, int **ids, int *length) {
    char *text = NULL;
    if (chat_template_render_tools(chat, messages, count, tools_json, true, &text) != 0) return -1;
    // The template writes BOS itself where the family wants one.
    int rc = tokenizer_encode(tm->tokenizer, text, strlen(text), false, ids, length);
    free(text);
    return rc;
}

int text_model_text_ids(TextModel *tm, const char *text, int **ids, int *length) {
    return tokenizer_encode(tm->tokenizer, text, strlen(text), true, ids, length);
}
