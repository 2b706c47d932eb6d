// Conversational datasets (TRL's message formats, data/dataset.h) rendered with a model's
// chat template, as TRL's maybe_apply_chat_template renders them, in one place for every
// command that reads data (sft, rm, dpo, kto, ppo, infer):
//   prompt    = apply_chat_template(prompt, add_generation_prompt=True) when its last
//               message is a user message; when it is an assistant message, that message
//               continued (continue_final_message: the rendering cut after it by
//               transformers' rule); any other role is an error
//   chosen, rejected (SFT's response, KTO's completion)
//             = apply_chat_template(prompt + messages) with the prompt's text taken off its
//               front. TRL keeps the longest common prefix of the two texts; here the
//               prompt's text must be a prefix, and a template that does not extend it
//               (one that renders earlier turns differently once a later one follows) is
//               an error naming the row.
// The texts are then tokenized as TRL tokenizes them, with add_special_tokens=False: the
// template wrote its own BOS (tokenizer_set_chat_rendered).
#pragma once
#include "chat/chat_template.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"

// The chat template a model's data is rendered with: `option` (--chat-template, a name or a
// file; NULL for none) else the tokenizer's own, with the tokenizer's BOS/EOS texts, as
// `marlhf generate --chat` finds it. -1 with err_set() naming `model_path` when there is
// none or it is not recognised.
int chat_template_for_model(ChatTemplate *t, const Tokenizer *tok, const char *model_path, const char *option);

// Renders every record of a conversational dataset (prompt, chosen, rejected filled from
// record->conversation) and marks `tok` as reading rendered text (tokenizer_set_chat_rendered).
// Does nothing for a dataset of text rows. Errors (exit 2 material, err_set): no usable
// template ("the data is conversational (<data>) and the model has no recognised chat
// template (<model>): ..."), a template that refuses a conversation or does not extend the
// prompt's text, a prompt that ends with neither a user nor an assistant message, a final
// assistant message the template does not write as it is: each naming <data>:<line>.
int dataset_render_chat(Dataset *dataset, Tokenizer *tok, const char *model_path, const char *option);
// The same with a template already found (tests; does not touch a tokenizer).
int dataset_render_chat_with(Dataset *dataset, const ChatTemplate *t);

// SFT's --assistant-only-loss: every assistant turn of a {"messages"} row trained, not only the
// last (TRL's assistant_only_loss). After dataset_render_chat, fills each record's turns
// (data/dataset.h): the conversation rendered through each message that precedes an
// assistant message (with the generation prompt) and through each assistant message, every
// rendering cut off the one before it, which it must extend (else an error naming the
// row). Assistant messages before any other message are context; messages after the last
// assistant message are left out. A prompt / completion row's turns are its prompt and
// completion. Does nothing for text rows.
int dataset_render_turns(Dataset *dataset, const Tokenizer *tok, const char *model_path, const char *option);
// The same with a template already found (tests).
int dataset_render_turns_with(Dataset *dataset, const ChatTemplate *t);

// SFT's --completion-only-loss false on {"messages"} rows (TRL's SFTTrainer trains the whole
// conversation): after dataset_render_chat, each such row whose conversation goes on after its
// last assistant message gets those messages too, its chosen text becoming the whole
// conversation's rendering (no generation prompt) less the prompt's. A template that renders
// the prompt differently once they follow is an error naming the row. Other rows, and text
// datasets, are left as they are.
int dataset_render_whole_conversations(Dataset *dataset, const Tokenizer *tok, const char *model_path,
                                       const char *option);
// The same with a template already found (tests).
int dataset_render_whole_conversations_with(Dataset *dataset, const ChatTemplate *t);
