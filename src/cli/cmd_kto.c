// marlhf kto: preference learning from completions labelled desirable or undesirable
// (train/kto.h), TRL's KTOTrainer (--loss kto, apo-zero-unpaired) and BCOTrainer (--loss bco).
// Reads unpaired rows ({prompt, completion, label}) or any pair format, each pair giving a
// desirable and an undesirable example.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "model/weights_io.h"
#include "train/kto.h"

// The examples of a dataset: a row's chosen completion (desirable) and its rejected one
// (undesirable), whichever it has. Arrays of count + 1 entries; *count receives how many.
typedef struct {
    const char **prompts, **completions;
    bool *desirable;
    long count;
} Examples;

static void examples_of(const Dataset *d, const char *path, Examples *out) {
    out->prompts = xmalloc((size_t)(2 * d->count + 1) * sizeof(char *));
    out->completions = xmalloc((size_t)(2 * d->count + 1) * sizeof(char *));
    out->desirable = xmalloc((size_t)(2 * d->count + 1) * sizeof(bool));
    out->count = 0;
    for (long i = 0; i < d->count; i++) {
        const DataRecord *r = &d->records[i];
        if (r->response_count > 0 || (!r->chosen && !r->rejected) || (d->format == DATA_FORMAT_SFT))
            die_user("row at line %ld has no labelled completion or chosen/rejected pair for KTO (%s)", r->line, path);
        const char *sides[2] = {r->chosen, r->rejected};
        for (int k = 0; k < 2; k++) {
            if (!sides[k]) continue;
            out->prompts[out->count] = r->prompt;
            out->completions[out->count] = sides[k];
            out->desirable[out->count++] = k == 0;
        }
    }
}

static void examples_free(Examples *e) { free(e->prompts), free(e->completions), free(e->desirable); }

int cmd_kto(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(1e-6, 0.1, 0.0, 2); // learning rate, warmup ratio, weight decay, data phase
    char *model_path = NULL, *output = NULL, *reference_path = NULL, *loss_name = "kto";
    double beta = 0.1, desirable_weight = 1.0, undesirable_weight = 1.0;
    bool padding_free = false;
    ReferenceSyncCli sync = reference_sync_cli_defaults();
    Option options[64] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "the policy to train, usually the SFT model", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"reference-model", "ref_model", OPT_STRING, &reference_path,
         "frozen reference (default: the policy's starting weights)", false, false},
        {"loss", "loss_type", OPT_STRING, &loss_name,
         "kto | apo-zero-unpaired (no KL baseline) | bco (binary classifier with a running reward mean)", false, false},
        {"beta", NULL, OPT_FLOAT, &beta, "KL strength: the implicit reward is beta log(policy / reference)", false, false},
        {"desirable-weight", "desirable_weight", OPT_FLOAT, &desirable_weight,
         "weight of the desirable examples' losses (TRL's KTOConfig)", false, false},
        {"undesirable-weight", "undesirable_weight", OPT_FLOAT, &undesirable_weight,
         "weight of the undesirable examples' losses", false, false},
        {"padding-free", "padding_free", OPT_BOOL, &padding_free,
         "run each micro-batch's rows side by side in one row, each attending to itself only (TRL's padding_free): "
         "the same sums, no padding computed", false, false},
    };
    const Option *sync_options = &options[8];
    int count = 8 + reference_sync_cli_options(&sync, options + 8);
    count += trainer_cli_options(&c, options + count);
    CHECK(count <= (int)(sizeof options / sizeof options[0]), "option table too small");
    OptionSet set = {"kto", "KTO: learn from completions labelled desirable or undesirable (or from pairs).",
                     "marlhf kto --model SFT_MODEL --data FILE.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    if (!(beta > 0) || !isfinite(beta)) die_user("option --beta must be positive, got %g", beta);
    if (!(desirable_weight > 0) || !isfinite(desirable_weight))
        die_user("option --desirable-weight must be positive, got %g", desirable_weight);
    if (!(undesirable_weight > 0) || !isfinite(undesirable_weight))
        die_user("option --undesirable-weight must be positive, got %g", undesirable_weight);
    KtoLossOptions loss = {.beta = beta, .desirable_weight = desirable_weight, .undesirable_weight = undesirable_weight};
    if (kto_loss_from_name(loss_name, &loss.loss) != 0)
        die_user("option --loss must be kto, apo-zero-unpaired or bco, got '%s'", loss_name);
    // TRL's BCOTrainer has no such weights; taking them silently would train something else.
    if (loss.loss == KTO_LOSS_BCO && (desirable_weight != 1.0 || undesirable_weight != 1.0))
        die_user("option --%s: --loss bco has no desirable/undesirable weights",
                 desirable_weight != 1.0 ? "desirable-weight" : "undesirable-weight");
    trainer_cli_finish(&c, output);
    cli_set_batch_invariant(&set, c.device);
    reference_sync_cli_check(&sync, sync_options, true, loss_name, c.lora.rank > 0, c.zero_stage);

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    trainer_cli_fit_context(&c, model_path);
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    trainer_cli_render_chat(&c, tokenizer, model_path, &train, &eval);
    Examples examples, eval_examples;
    examples_of(&train, c.data, &examples);
    examples_of(&eval, c.eval_data ? c.eval_data : "", &eval_examples);
    KtoTask task;
    if (kto_task_init(&task, tokenizer, examples.prompts, examples.completions, examples.desirable, examples.count,
                      eval_examples.prompts, eval_examples.completions, eval_examples.desirable, eval_examples.count,
                      (int)c.max_seq_len, &loss) != 0)
        die_from_err();

    Model model, reference;
    const ModelLoadOptions load = {.with_lm_head = true, .keep_range = trainer_cli_keep_range(&c)};
    trainer_cli_load_model(&c, model_path, &load, false, &model);
    model.packed_rows_only = padding_free; // its response batches run in one row (train/response_logps.c)
    // TR-DPO's reference is held through training (on --resume its checkpoint's: it has moved).
    if (sync.enabled)
        reference_sync_cli_load(&c, &sync, reference_path, model_path, tokenizer, &model, &reference, &task.sync);
    else if (reference_path) trainer_cli_load_reference(&c, reference_path, tokenizer, &model, &reference);
    if (!c.quiet) {
        const long undesirable = task.train.count - task.train_desirable_count;
        fprintf(stderr, "kto: %ld training examples (%ld desirable, %ld undesirable; %ld dropped, %ld cut at %ld tokens), "
                        "%ld eval examples, loss %s, beta %g\n",
                task.train.count, task.train_desirable_count, undesirable, task.dropped, task.truncated, c.max_seq_len,
                task.eval.count, loss_name, beta);
        // The KTO paper's advice (TRL warns likewise): weighted desirable over undesirable in [1, 4/3].
        const double ratio = undesirable > 0 ? desirable_weight * (double)task.train_desirable_count /
                                                   (undesirable_weight * (double)undesirable)
                                             : INFINITY;
        if (loss.loss != KTO_LOSS_BCO && (ratio < 1.0 || ratio > 4.0 / 3.0))
            fprintf(stderr, "kto: note: desirable_weight x desirable / (undesirable_weight x undesirable) = %.3g; the "
                            "KTO paper recommends [1, 4/3] (--desirable-weight, --undesirable-weight)\n",
                    ratio);
    }
    // The reference's log-probs of every row and mismatched row (KTO's loss only), once,
    // before any step: --reference-model's here, the policy's own in train_run
    // (TrainTask.prepare, as dpo) -- on --resume taken from the checkpoint, which keeps them.
    if (sync.enabled) {
        kto_task_reference_model(&task, &reference, &c.train);
    } else if (reference_path) {
        kto_task_reference_model(&task, &reference, &c.train);
        model_free(&reference);
    } else {
        task.reference_from_policy = true;
    }

    TrainTask train_task = kto_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    // How many mismatched rows this process ran (reference, training, evaluation): the cost of
    // KTO's baseline, and 0 for the losses without one.
    if (!c.quiet)
        fprintf(stderr, "kto: final model in %s/final (%ld mismatched rows scored for a KL baseline)\n", output,
                task.kl_rows_scored);
    if (task.sync.model) {
        if (!c.quiet) fprintf(stderr, "kto: the reference moved %ld times\n", task.sync.updates);
        model_free(&reference);
    }
    model_free(&model);
    kto_task_free(&task);
    examples_free(&examples), examples_free(&eval_examples);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    return 0;
}
