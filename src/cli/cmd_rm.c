// marlhf rm: reward-model training on chosen/rejected pairs or ranked responses (step 2).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "model/weights_io.h"
#include "train/rm.h"

// The data's per-pair margins (TRL's "margin" column) as floats, or NULL when its rows have
// none; every row or none must have one.
static float *data_margins(const Dataset *data) {
    if (data->count == 0 || !data->records[0].has_margin) {
        for (long i = 0; i < data->count; i++)
            if (data->records[i].has_margin)
                die_user("%s:%ld has a \"margin\" and %s:%ld none: give every pair one or none", data->path,
                         data->records[i].line, data->path, data->records[0].line);
        return NULL;
    }
    float *margins = xmalloc((size_t)data->count * sizeof(float));
    for (long i = 0; i < data->count; i++) {
        if (!data->records[i].has_margin)
            die_user("%s:%ld has no \"margin\" and %s:%ld one: give every pair one or none", data->path,
                     data->records[i].line, data->path, data->records[0].line);
        margins[i] = (float)data->records[i].margin;
    }
    return margins;
}

int cmd_rm(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(1e-5, 0.05, 0.1, 2); // learning rate, warmup ratio, weight decay, data phase
    char *model_path = NULL, *output = NULL, *loss_name = "pairwise";
    double margin = 0.0, center_rewards = 0.0;
    bool padding_free = false;
    Option options[64] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "the SFT model (its body gets a value head)", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"loss", NULL, OPT_STRING, &loss_name, "pairwise|margin|dschat|listwise", false, false},
        {"margin", NULL, OPT_FLOAT, &margin, "margin for --loss margin", false, false},
        {"padding-free", "padding_free", OPT_BOOL, &padding_free,
         "run each micro-batch's responses side by side in one row, each attending to itself only (TRL's "
         "padding_free): the same scores, no padding computed", false, false},
        {"center-rewards-coefficient", "center_rewards_coefficient", OPT_FLOAT, &center_rewards,
         "add this times the mean of (chosen + rejected score)^2 to the pairwise or margin loss (TRL's "
         "center_rewards_coefficient: scores near mean zero; 0.01 recommended there); 0: none", false, false},
    };
    const Option *margin_option = &options[3];
    int count = 6 + trainer_cli_options(&c, options + 6);
    CHECK(count <= (int)(sizeof options / sizeof options[0]), "option table too small");
    OptionSet set = {"rm", "Train a reward model: the model's body plus a value head scored at the last token.",
                     "marlhf rm --model SFT_MODEL --data PAIRS.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    RmLossKind loss;
    if (rm_loss_from_name(loss_name, &loss) != 0)
        die_user("option --loss must be pairwise, margin, dschat or listwise, got '%s'", loss_name);
    if (!(center_rewards >= 0) || !isfinite(center_rewards))
        die_user("option --center-rewards-coefficient must be >= 0, got %g", center_rewards);
    if (center_rewards > 0 && loss != RM_LOSS_PAIRWISE && loss != RM_LOSS_MARGIN)
        die_user("option --center-rewards-coefficient applies to --loss pairwise and margin (TRL's reward loss), not "
                 "%s", loss_name);
    if (padding_free && loss == RM_LOSS_DSCHAT)
        die_user("--padding-free leaves the padding out and --loss dschat reads its span on rows padded to "
                 "--max-seq-len: give one (--padding-free)");
    trainer_cli_finish(&c, output);
    cli_set_batch_invariant(&set, c.device);

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    trainer_cli_fit_context(&c, model_path);
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    trainer_cli_render_chat(&c, tokenizer, model_path, &train, &eval);
    int K = train.records[0].response_count > 0 ? train.records[0].response_count : 2;
    if (loss != RM_LOSS_LISTWISE && K != 2)
        die_user("%s has %d ranked responses per row; use --loss listwise", c.data, K);
    const char **responses = trainer_cli_responses(&train, K, c.data);
    const char **eval_responses = trainer_cli_responses(&eval, K, c.eval_data ? c.eval_data : "");
    const char **prompts = trainer_cli_prompts(&train), **eval_prompts = trainer_cli_prompts(&eval);
    // As TRL's reward trainer: pairs with a "margin" column train with each pair's margin.
    float *margins = data_margins(&train), *eval_margins = data_margins(&eval);
    if (margins || eval_margins) {
        if (loss != RM_LOSS_PAIRWISE && loss != RM_LOSS_MARGIN)
            die_user("%s has a \"margin\" column, which --loss %s does not read: use --loss pairwise or margin "
                     "(--loss)", margins ? c.data : c.eval_data, loss_name);
        if (margin_option->seen)
            die_user("--margin gives every pair one margin and %s has a \"margin\" column: give one (--margin)",
                     margins ? c.data : c.eval_data);
        loss = RM_LOSS_MARGIN;
    }
    RmTask task;
    if (rm_task_init(&task, tokenizer, K, prompts, responses, margins, train.count, eval_prompts, eval_responses,
                     eval_margins, eval.count, (int)c.max_seq_len, loss, (float)margin) != 0)
        die_from_err();
    free(margins), free(eval_margins);
    task.padding_free = padding_free;
    task.center_rewards = (float)center_rewards;
    if (!c.quiet)
        fprintf(stderr, "rm: %ld training examples of %d responses, %ld eval examples, loss %s\n", task.train_count, K,
                task.eval_count, task.train_margins ? "margin (the data's per-pair margins)" : loss_name);

    Model model;
    const ModelLoadOptions load = {.with_lm_head = false, .with_value_head = true, .seed = (uint64_t)c.seed,
                                   .keep_range = trainer_cli_keep_range(&c)};
    trainer_cli_load_model(&c, model_path, &load, true, &model);
    model.packed_rows_only = padding_free; // its batches run in one row (train/rm.c)
    TrainTask train_task = rm_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    if (!c.quiet) fprintf(stderr, "rm: final reward model in %s/final\n", output);
    model_free(&model);
    rm_task_free(&task);
    free(prompts), free(responses), free(eval_prompts), free(eval_responses);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    return 0;
}
