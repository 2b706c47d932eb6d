// marlhf sft: supervised fine-tuning on prompt/response data (step 1 of RLHF).
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "data/chat_data.h"
#include "model/weights_io.h"
#include "train/sft.h"

int cmd_sft(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(5e-5, 0.1, 0.01, 1); // learning rate, warmup ratio, weight decay, data phase
    c.adapter_dropout_applies = true; // as TRL's SFTTrainer, which keeps PEFT's lora_dropout
    char *model_path = NULL, *output = NULL;
    bool train_on_prompt = false, assistant_only_loss = false, completion_only_loss = true, packing = false;
    bool padding_free = false, eval_packing = false;
    char *packing_strategy = "bfd", *loss_type = "nll", *text_field = "text";
    Option options[64] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "base model: Hugging Face folder or .gguf", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"train-on-prompt", "train_on_prompt", OPT_BOOL, &train_on_prompt,
         "released MA-RLHF behaviour: pad to --max-seq-len and count prompt and padding in the loss", false, false},
        {"assistant-only-loss", "assistant_only_loss", OPT_BOOL, &assistant_only_loss,
         "{\"messages\"} rows: train every assistant turn (TRL's assistant_only_loss), not only the last", false, false},
        {"completion-only-loss", "completion_only_loss", OPT_BOOL, &completion_only_loss,
         "train the response only (TRL's completion_only_loss); false: every token of the example, prompt included "
         "(not the padding; {\"text\"} rows are all response either way)", false, false},
        {"packing", "packing", OPT_BOOL, &packing,
         "pack the training examples into rows of --max-seq-len tokens (TRL's packing): fuller micro-batches, "
         "no padding between examples", false, false},
        {"packing-strategy", "packing_strategy", OPT_STRING, &packing_strategy,
         "with --packing: bfd (whole examples, best fit, each attending to itself only; cut at --max-seq-len), "
         "bfd_split (the same, long examples split between rows instead of cut), wrapped (one stream cut into rows, "
         "attending across examples)", false, false},
        {"padding-free", "padding_free", OPT_BOOL, &padding_free,
         "run each micro-batch as one row of its examples side by side, each attending to itself only (TRL's "
         "padding_free): the same loss, no padding computed; implied by --packing bfd and bfd_split", false, false},
        {"eval-packing", "eval_packing", OPT_BOOL, &eval_packing,
         "pack the evaluation examples as --packing packs the training ones (TRL's eval_packing); default: as "
         "--packing", false, false},
        {"loss-type", "loss_type", OPT_STRING, &loss_type,
         "nll (the negative log-likelihood) | dft (Dynamic Fine-Tuning: each token's loss weighted by its own "
         "probability, TRL's loss_type dft), in training and evaluation", false, false},
        {"dataset-text-field", "dataset_text_field", OPT_STRING, &text_field,
         "the field of language-modeling rows that holds their text (TRL's dataset_text_field; the same as "
         "--rename-columns FIELD=text)", false, false},
    };
    enum { SFT_OPTIONS = 11 };
    Option *eval_packing_option = &options[SFT_OPTIONS - 3];
    int count = SFT_OPTIONS + trainer_cli_options(&c, options + SFT_OPTIONS);
    CHECK(count <= (int)(sizeof options / sizeof options[0]), "option table too small");
    OptionSet set = {"sft", "Supervised fine-tuning on prompt/response data (loss on response tokens by default).",
                     "marlhf sft --model PATH --data FILE.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    trainer_cli_finish(&c, output);
    cli_set_batch_invariant(&set, c.device);
    if (!completion_only_loss && train_on_prompt)
        die_user("--completion-only-loss false trains the prompt without the padding and --train-on-prompt with it: "
                 "give one (--completion-only-loss)");
    if (strcmp(loss_type, "nll") != 0 && strcmp(loss_type, "dft") != 0)
        die_user("--loss-type %s: give nll or dft (--loss-type)", loss_type);
    const int strategy = packing_strategy_parse(packing_strategy);
    if (strategy < 0)
        die_user("--packing-strategy %s: give bfd, bfd_split or wrapped (--packing-strategy)", packing_strategy);
    if (padding_free && train_on_prompt)
        die_user("--padding-free leaves the padding out and --train-on-prompt trains on it: give one (--padding-free)");
    if (packing && train_on_prompt)
        die_user("--packing fills rows with examples and --train-on-prompt pads every example to --max-seq-len: give "
                 "one (--packing)");
    if (!eval_packing_option->seen) eval_packing = packing; // TRL's eval_packing=None
    if (eval_packing && !packing)
        die_user("--eval-packing packs the evaluation examples as --packing packs the training ones: give --packing "
                 "(--eval-packing)");
    if (!completion_only_loss && assistant_only_loss)
        die_user("--completion-only-loss false trains every token and --assistant-only-loss the assistant turns only: "
                 "give one (--completion-only-loss)");

    if (!*text_field) die_user("--dataset-text-field must name a field, got ''");
    char *renames = NULL; // --dataset-text-field F is one more rename, F=text
    if (strcmp(text_field, "text") != 0) {
        const char *before = c.rename_columns && *c.rename_columns ? c.rename_columns : NULL;
        size_t size = strlen(text_field) + sizeof "=text" + (before ? strlen(before) + 1 : 0);
        renames = xmalloc(size);
        snprintf(renames, size, "%s%s%s=text", before ? before : "", before ? "," : "", text_field);
        c.rename_columns = renames;
    }

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    trainer_cli_fit_context(&c, model_path);
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    trainer_cli_render_chat(&c, tokenizer, model_path, &train, &eval);
    if (assistant_only_loss) {
        if (!train.conversational)
            die_user("--assistant-only-loss trains the assistant turns of conversational rows, and %s holds text rows "
                     "(--assistant-only-loss)", c.data);
        if (dataset_render_turns(&train, tokenizer, model_path, c.chat_template) != 0 ||
            dataset_render_turns(&eval, tokenizer, model_path, c.chat_template) != 0)
            die_from_err();
    }
    // Language-modeling {"text"} rows have no prompt: every token is trained (the same as their
    // completion one a row; packed into one stream, each text's first token too, as TRL labels
    // a wrapped row's every token).
    const bool all_text = dataset_text_rows_only(&train);
    const SftLossTokens loss_tokens = train_on_prompt                     ? SFT_LOSS_PADDED
                                      : completion_only_loss && !all_text ? SFT_LOSS_COMPLETION
                                                                         : SFT_LOSS_SEQUENCE;
    // Every token trained: a conversation's messages after its last assistant message too, as
    // TRL trains the whole conversation.
    if (loss_tokens == SFT_LOSS_SEQUENCE &&
        (dataset_render_whole_conversations(&train, tokenizer, model_path, c.chat_template) != 0 ||
         dataset_render_whole_conversations(&eval, tokenizer, model_path, c.chat_template) != 0))
        die_from_err();
    SftExample *examples = xcalloc(train.count + 1, sizeof *examples);
    for (long i = 0; i < train.count; i++) {
        const DataRecord *r = &train.records[i];
        if (!r->chosen) die_user("row %ld of %s has no response for SFT", r->line, c.data);
        examples[i] = (SftExample){r->prompt, r->chosen, (const char *const *)r->turns, r->turn_count};
    }
    SftExample *eval_examples = xcalloc(eval.count + 1, sizeof *eval_examples);
    for (long i = 0; i < eval.count; i++) {
        const DataRecord *r = &eval.records[i];
        eval_examples[i] = (SftExample){r->prompt, r->chosen ? r->chosen : "", (const char *const *)r->turns, r->turn_count};
    }
    SftTask task;
    const int rc = packing ? sft_task_init_packed(&task, tokenizer, examples, train.count, eval_examples, eval.count,
                                                  (int)c.max_seq_len, loss_tokens, (PackingStrategy)strategy,
                                                  eval_packing)
                           : sft_task_init(&task, tokenizer, examples, train.count, eval_examples, eval.count,
                                           (int)c.max_seq_len, loss_tokens);
    if (rc != 0) die_from_err();
    task.dft = strcmp(loss_type, "dft") == 0;
    // As TRL: best-fit packing runs padding-free (its rows' examples attend to themselves only).
    task.padding_free = padding_free || (packing && strategy != PACKING_WRAPPED);
    long tokens = 0;
    for (long i = 0; i < task.train.count; i++) tokens += task.train.lengths[i];
    if (!c.quiet && packing) {
        const bool eval_rows = task.eval_packed && task.eval.count > 0;
        char eval_packed[48] = "";
        if (eval_rows) snprintf(eval_packed, sizeof eval_packed, " packed into %ld rows", task.eval.count);
        fprintf(stderr, "sft: %ld training examples (%ld dropped, %ld cut at %ld tokens) packed (%s) into %ld rows, "
                "%ld tokens; %ld eval examples%s\n", task.sequences, task.dropped, task.truncated, c.max_seq_len,
                packing_strategy, task.train.count, tokens, eval_rows ? task.eval_sequences : task.eval.count,
                eval_packed);
    }
    else if (!c.quiet)
        fprintf(stderr, "sft: %ld training examples (%ld dropped, %ld cut at %ld tokens), %ld tokens; %ld eval examples\n",
                task.train.count, task.dropped, task.truncated, c.max_seq_len, tokens, task.eval.count);

    Model model;
    const ModelLoadOptions load = {.with_lm_head = true, .keep_range = trainer_cli_keep_range(&c)};
    trainer_cli_load_model(&c, model_path, &load, false, &model);
    model.packed_rows_only = task.padding_free; // no attention state a layer for rows of whole micro-batches
    TrainTask train_task = sft_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    if (!c.quiet) fprintf(stderr, "sft: final model in %s/final\n", output);
    model_free(&model);
    sft_task_free(&task);
    free(examples), free(eval_examples);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    free(renames);
    return 0;
}
