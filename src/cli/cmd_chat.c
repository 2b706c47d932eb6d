// marlhf chat: an interactive conversation with a model through its chat template, the
// reply streamed token by token as it is generated. Type /reset to start over, /quit or
// end of input (Ctrl-D) to leave.
//
// Each turn's prompt is the whole conversation. The replies run through a continuous batch
// (gen/continuous.h) with a one-entry prompt cache, so a turn computes only the tokens
// after the previous reply (the new message and the template's markers) instead of the
// whole conversation again; --prompt-cache 0 recomputes it. A session replays to the same
// bits from the same input and seed either way; the two differ by float rounding.
//
// --json, --json-schema, --regex and --choice constrain every reply as they constrain
// `generate`'s answers (cli/constraint_options.h, docs/serving.md).
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/constraint_options.h"
#include "cli/options.h"
#include "cli/sampler_options.h"
#include "model/quantize.h"
#include "gen/text_model.h"
#include "core/check.h"
#include "gen/continuous.h"
#include "gen/token_mask.h"

typedef struct {
    TokenizerStream *stream;
    const int *stop_tokens;
    int num_stop_tokens;
    GeneratedRow reply;
    bool finished;
} ChatTurn;

static void print_token(void *context, void *owner, const GeneratedRow *row) {
    ChatTurn *turn = owner;
    const int token = row->tokens[row->length - 1];
    for (int i = 0; i < turn->num_stop_tokens; i++)
        if (turn->stop_tokens[i] == token) return; // the end-of-turn token is not part of the reply
    char *piece = NULL;
    tokenizer_stream_push(turn->stream, token, &piece);
    fputs(piece, stdout);
    fflush(stdout);
    free(piece);
}

static void reply_finished(void *context, void *owner, GeneratedRow *row) {
    ChatTurn *turn = owner;
    turn->reply = *row;
    turn->finished = true;
}

int cmd_chat(int argc, char **argv) {
    const char *quantize = NULL; // quantize_default
    const char *kv_cache = "f32";
    char *model_path = NULL, *device = "cpu", *chat_template = NULL, *system = NULL;
    long max_new_tokens = 512, top_k = 50, seed = 1234, threads = 0, prompt_cache = 1;
    double temperature = 0.8, top_p = 1.0;
    char *lora_adapter = NULL, *json_schema = NULL, *regex = NULL, *choice = NULL, *grammar = NULL,
         *grammar_file = NULL;
    bool no_thinking = false, json_object = false;
    bool batch_invariant = false;
    SamplerExtrasCli extras = SAMPLER_EXTRAS_CLI_DEFAULTS;
    Option options[] = {
        {"model", NULL, OPT_STRING, &model_path, "Hugging Face folder or .gguf file", true, false},
        {"system", NULL, OPT_STRING, &system, "system message", false, false},
        {"max-new-tokens", "max_new_tokens", OPT_INT, &max_new_tokens, "tokens per reply at most", false, false},
        {"temperature", NULL, OPT_FLOAT, &temperature, "sampling temperature (0 = greedy)", false, false},
        {"top-k", "top_k", OPT_INT, &top_k, "keep the k most likely tokens (0 = all)", false, false},
        {"top-p", "top_p", OPT_FLOAT, &top_p, "nucleus sampling mass (1 = off)", false, false},
        SAMPLER_EXTRAS_OPTIONS(&extras),
        {"seed", NULL, OPT_INT, &seed, "random seed", false, false},
        {"chat-template", "chat_template", OPT_STRING, &chat_template, "chat template name or file (default: the model's own)", false, false},
        {"no-thinking", NULL, OPT_BOOL, &no_thinking, "render chat prompts with enable_thinking=False (Qwen3: the answer starts after an empty think block)", false, false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter applied to --model (a marlhf model folder or a PEFT adapter folder)", false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"quantize", NULL, OPT_STRING, &quantize, QUANTIZE_OPTION_HELP, false, false},
        {"kv-cache", NULL, OPT_STRING, &kv_cache, "f32, f16 or q8_0: the KV cache in half floats (half its memory) or in 8-bit blocks (about 0.28 of it): faster decoding of long contexts; the prompt itself is attended in f32", false, false},
        {"prompt-cache", "cache_prompt", OPT_INT, &prompt_cache,
         "1: a turn computes only what follows the previous reply; 0: the whole conversation again", false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
        {"json", NULL, OPT_BOOL, &json_object, CONSTRAINT_HELP_JSON, false, false},
        {"json-schema", "json_schema", OPT_STRING, &json_schema, CONSTRAINT_HELP_JSON_SCHEMA, false, false},
        {"regex", NULL, OPT_STRING, &regex, CONSTRAINT_HELP_REGEX, false, false},
        {"choice", NULL, OPT_STRING, &choice, CONSTRAINT_HELP_CHOICE, false, false},
        {"grammar", NULL, OPT_STRING, &grammar, CONSTRAINT_HELP_GRAMMAR, false, false},
        {"grammar-file", "grammar_file", OPT_STRING, &grammar_file, CONSTRAINT_HELP_GRAMMAR_FILE, false, false},
    };
    OptionSet set = {"chat", "Chat with a model interactively; replies stream as they are generated.",
                     "marlhf chat --model PATH [--system TEXT]", options, sizeof options / sizeof options[0], NULL, 0, 0};
    options_parse(&set, argc, argv);
    sampler_extras_check(&extras);
    cli_set_batch_invariant(&set, device);
    if (max_new_tokens < 1) die_user("--max-new-tokens must be positive, got %ld", max_new_tokens);
    if (prompt_cache != 0 && prompt_cache != 1) die_user("--prompt-cache must be 0 or 1, got %ld", prompt_cache);
    if (temperature < 0) die_user("--temperature must be >= 0, got %g", temperature);
    if (!(top_p > 0 && top_p <= 1)) die_user("--top-p must be in (0, 1], got %g", top_p);
    quantize = quantize_default(quantize, model_path);
    if (quantize_type_check(quantize, "--quantize") != 0) die_from_err();
    if (kv_cache_type_set(NULL, kv_cache, "--kv-cache") != 0) die_from_err();
    // Every reply of the conversation is constrained alike (generate's options).
    Constraint *constraint = cli_constraint_from_options(json_object, json_schema, regex, choice, grammar, grammar_file);
    cli_set_threads(threads);
    TextModel tm;
    if (text_model_load(&tm, model_path, lora_adapter, device, quantize, chat_template, true) != 0) die_from_err();
    if (no_thinking && text_model_disable_thinking(&tm) != 0) die_user("--no-thinking: %s", err_msg());
    if (kv_cache_type_set(&tm.model, kv_cache, "--kv-cache") != 0) die_from_err();
    fprintf(stderr, "marlhf chat: %s (%s template%s). /reset starts over, /quit or Ctrl-D leaves.\n", model_path,
            chat_template_name(&tm.chat), no_thinking ? ", thinking off" : "");

    ContinuousOptions batch_options = {.stop_tokens = tm.stop_tokens,
                                       .num_stop_tokens = tm.num_stop_tokens,
                                       .on_token = print_token,
                                       .on_finish = reply_finished,
                                       .prompt_cache_rows = (int)prompt_cache,
                                       .token_trie = constraint ? token_trie_new(tm.tokenizer, tm.model.config.vocab_size)
                                                                : NULL};
    ContinuousBatch *batch = continuous_batch_new(&tm.model, 1, &batch_options);
    ChatMessage *history = NULL;
    char **owned = NULL;
    int count = 0, capacity = 0, turn = 0;
    char *line = NULL;
    size_t line_capacity = 0;
    for (;;) {
        fputs("> ", stdout);
        fflush(stdout);
        ssize_t got = getline(&line, &line_capacity, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (strcmp(line, "/quit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            for (int i = 0; i < count; i++) free(owned[i]);
            count = 0;
            continue;
        }
        if (got == 0) continue;
        // history: [system], user, assistant, user, ...
        if (count + 3 > capacity) {
            capacity = capacity ? 2 * capacity : 16;
            history = xrealloc(history, capacity * sizeof(ChatMessage));
            owned = xrealloc(owned, capacity * sizeof(char *));
        }
        if (count == 0 && system) {
            owned[count] = xstrdup(system);
            history[count] = (ChatMessage){.role = "system", .content = owned[count]};
            count++;
        }
        owned[count] = xstrdup(line);
        history[count] = (ChatMessage){.role = "user", .content = owned[count]};
        count++;
        int *ids = NULL, length = 0;
        if (text_model_chat_ids(&tm, history, count, &ids, &length) != 0) {
            fprintf(stderr, "marlhf: error: %s\n", err_msg());
            free(owned[--count]);
            continue;
        }
        // The reply has the room the model's context leaves (as serve's max_tokens); a
        // conversation that fills it takes no more turns until /reset.
        const int context = tm.model.config.max_position_embeddings;
        if (length >= context) {
            fprintf(stderr, "marlhf chat: the conversation (%d tokens) fills the model's context of %d tokens; /reset "
                            "starts over\n", length, context);
            free(ids);
            free(owned[--count]);
            continue;
        }
        // The turn's reply samples from stream `turn` of the seed, as generate() row `turn`.
        ChatTurn chat_turn = {tokenizer_stream_new(tm.tokenizer, true), tm.stop_tokens, tm.num_stop_tokens, {0}, false};
        SequenceOptions sequence = {
            .sampler = {.temperature = (float)temperature, .top_k = (int)top_k, .top_p = (float)top_p},
            .seed = (uint64_t)seed,
            .row_id = (uint64_t)turn++,
            .max_new_tokens = max_new_tokens < context - length ? (int)max_new_tokens : context - length,
            .owner = &chat_turn,
            .constraint = constraint,
        };
        sampler_extras_apply(&extras, &sequence.sampler, tm.model.config.vocab_size);
        SequenceRequest request = {ids, length, &sequence, 1, 0};
        continuous_batch_add(batch, &request, 1);
        while (!chat_turn.finished) continuous_batch_step(batch);
        char *rest = NULL;
        tokenizer_stream_flush(chat_turn.stream, &rest);
        fputs(rest, stdout);
        fputs("\n", stdout);
        free(rest);
        tokenizer_stream_free(chat_turn.stream);
        const GeneratedRow *reply = &chat_turn.reply;
        int reply_length = reply->length - (reply->stop == STOP_TOKEN ? 1 : 0);
        owned[count] = tokenizer_decode(tm.tokenizer, reply->tokens, reply_length, true);
        history[count] = (ChatMessage){.role = "assistant", .content = owned[count]};
        count++;
        generated_row_free(&chat_turn.reply);
        free(ids);
    }
    for (int i = 0; i < count; i++) free(owned[i]);
    free(owned), free(history), free(line);
    continuous_batch_free(batch);
    token_trie_free((TokenTrie *)batch_options.token_trie);
    constraint_free(constraint);
    text_model_free(&tm);
    sampler_extras_free(&extras);
    return 0;
}
