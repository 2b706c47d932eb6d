// What the text commands (generate, chat, infer, serve) and the embedding API (api/) share:
// a model with its tokenizer and chat template, prompts turned into token ids, and the stop
// tokens.
#pragma once
#include <stdbool.h>

#include "chat/chat_template.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    Model model;
    Tokenizer *tokenizer;
    ChatTemplate chat; // valid when has_chat
    bool has_chat;
    int stop_tokens[8];
    int num_stop_tokens;
} TextModel;

// Loads model + tokenizer from `path` (folder or .gguf), and the LoRA adapter saved in
// `lora_adapter` on top when not NULL (model/lora.h). quantize: NULL or "none" for float32,
// "q8_0" for 8-bit linear layers (model/quantize.h). chat_template_option: NULL to use the
// model's own template (an unrecognised one is an error only when needs_chat), or a family
// name / template file. Returns 0, or -1 with err_set() (and nothing left allocated).
int text_model_load(TextModel *tm, const char *path, const char *lora_adapter, const char *device,
                    const char *quantize, const char *chat_template_option, bool needs_chat);
void text_model_free(TextModel *tm);

// `--no-thinking`: the chat template renders as with enable_thinking=False (Qwen3's switch,
// chat_template_disable_thinking). -1 with err_set() when the model has no chat template or
// its template has no such switch.
int text_model_disable_thinking(TextModel *tm);

// The chat template applied to messages with the generation prompt, then tokenized
// (special tokens in the rendered text are recognised). Returns 0 or -1 (err_set).
int text_model_chat_ids(TextModel *tm, const ChatMessage *messages, int count, int **ids, int *length);
// The same with OpenAI-style tools (a JSON array's text, or NULL): chat_template_render_tools.
int text_model_chat_ids_tools(TextModel *tm, const ChatMessage *messages, int count, const char *tools_json, int **ids,
                              int *length);
// The same with another template than the model's own (a copy of it with a request's
// chat_template_kwargs applied, say).
int text_model_chat_ids_with(TextModel *tm, const ChatTemplate *chat, const ChatMessage *messages, int count,
                             const char *tools_json, int **ids, int *length);
// Plain text tokenized as transformers does with add_special_tokens=True (BOS where the
// tokenizer adds one).
int text_model_text_ids(TextModel *tm, const char *text, int **ids, int *length);
