// marlhf sft: supervised fine-tuning on prompt/response data (step 1 of RLHF).
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "model/weights_io.h"
#include "train/sft.h"

int cmd_sft(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(5e-5, 0.1, 0.01, 1); // learning rate, warmup ratio, weight decay, data phase
    c.adapter_dropout_applies = true; // as TRL's SFTTrainer, which keeps PEFT's lora_dropout
    char *model_path = NULL, *output = NULL;
    bool train_on_prompt = false;
    Option options[56] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "base model: Hugging Face folder or .gguf", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"train-on-prompt", "train_on_prompt", OPT_BOOL, &train_on_prompt,
         "released MA-RLHF behaviour: pad to --max-seq-len and count prompt and padding in the loss", false, false},
    };
    int count = 3 + trainer_cli_options(&c, options + 3);
    OptionSet set = {"sft", "Supervised fine-tuning on prompt/response data (loss on response tokens by default).",
                     "marlhf sft --model PATH --data FILE.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    trainer_cli_finish(&c, output);
    cli_set_batch_invariant(&set, c.device);

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    trainer_cli_render_chat(&c, tokenizer, model_path, &train, &eval);
    const char **prompts = xmalloc(train.count * sizeof(char *)), **responses = xmalloc(train.count * sizeof(char *));
    for (long i = 0; i < train.count; i++) {
        prompts[i] = train.records[i].prompt;
        responses[i] = train.records[i].chosen;
        if (!responses[i]) die_user("row %ld of %s has no response for SFT", train.records[i].line, c.data);
    }
    const char **eval_prompts = xmalloc((eval.count + 1) * sizeof(char *));
    const char **eval_responses = xmalloc((eval.count + 1) * sizeof(char *));
    for (long i = 0; i < eval.count; i++) {
        eval_prompts[i] = eval.records[i].prompt;
        eval_responses[i] = eval.records[i].chosen ? eval.records[i].chosen : "";
    }
    SftTask task;
    if (sft_task_init(&task, tokenizer, prompts, responses, train.count, eval_prompts, eval_responses, eval.count,
                      (int)c.max_seq_len, train_on_prompt) != 0)
        die_from_err();
    if (!c.quiet)
        fprintf(stderr, "sft: %ld training examples (%ld dropped, %ld cut at %ld tokens), %ld eval examples\n",
                task.train.count, task.dropped, task.truncated, c.max_seq_len, task.eval.count);

    Model model;
    const ModelLoadOptions load = {.with_lm_head = true};
    trainer_cli_load_model(&c, model_path, &load, false, &model);
    TrainTask train_task = sft_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    if (!c.quiet) fprintf(stderr, "sft: final model in %s/final\n", output);
    model_free(&model);
    sft_task_free(&task);
    free(prompts), free(responses), free(eval_prompts), free(eval_responses);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    return 0;
}
