// marlhf dpo: direct preference optimization of a policy on chosen/rejected pairs
// (train/dpo.h), DeepSpeed-Chat's step2_dpo_finetuning.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "model/weights_io.h"
#include "train/dpo.h"

int cmd_dpo(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(1e-6, 0.1, 0.0, 2); // learning rate, warmup ratio, weight decay, data phase
    char *model_path = NULL, *output = NULL, *reference_path = NULL, *loss_name = "sigmoid";
    double beta = 0.1, label_smoothing = 0.0, simpo_gamma = 0.5, sft_weight = 0.0;
    Option options[56] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "the policy to train, usually the SFT model", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"reference-model", "ref_model", OPT_STRING, &reference_path,
         "frozen reference (default: the policy's starting weights)", false, false},
        {"beta", NULL, OPT_FLOAT, &beta, "KL strength: the implicit reward is beta log(policy / reference)", false, false},
        {"loss", "loss_type", OPT_STRING, &loss_name, "sigmoid (DPO) | ipo | hinge | simpo | orpo (these two: no reference)", false, false},
        {"label-smoothing", "label_smoothing", OPT_FLOAT, &label_smoothing,
         "sigmoid: assumed fraction of flipped labels, conservative DPO (DeepSpeed-Chat, OpenRLHF)", false, false},
        {"simpo-gamma", "simpo_gamma", OPT_FLOAT, &simpo_gamma, "simpo: the target reward margin (TRL's CPOConfig)", false,
         false},
        {"sft-weight", "rpo_alpha nll_loss_coef", OPT_FLOAT, &sft_weight,
         "plus this times the chosen response's mean negative log-likelihood (RPO)", false, false},
    };
    int count = 8 + trainer_cli_options(&c, options + 8);
    OptionSet set = {"dpo", "Direct preference optimization of a policy on chosen/rejected pairs (DPO, IPO, hinge, SimPO, ORPO).",
                     "marlhf dpo --model SFT_MODEL --data PAIRS.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    DpoLossOptions loss = {.beta = beta, .label_smoothing = label_smoothing, .simpo_gamma = simpo_gamma,
                           .sft_weight = sft_weight};
    if (!(sft_weight >= 0) || !isfinite(sft_weight)) die_user("option --sft-weight must be >= 0, got %g", sft_weight);
    if (dpo_loss_from_name(loss_name, &loss.loss) != 0)
        die_user("option --loss must be sigmoid, ipo, hinge, simpo or orpo, got '%s'", loss_name);
    if (!dpo_loss_uses_reference(loss.loss) && reference_path)
        die_user("option --reference-model: --loss %s has no reference", loss_name);
    if (!isfinite(simpo_gamma)) die_user("option --simpo-gamma must be a number, got %g", simpo_gamma);
    if (!(beta > 0) || !isfinite(beta)) die_user("option --beta must be positive, got %g", beta);
    if (!(label_smoothing >= 0 && label_smoothing < 0.5))
        die_user("option --label-smoothing must be in [0, 0.5), got %g", label_smoothing);
    if (label_smoothing > 0 && loss.loss != DPO_LOSS_SIGMOID)
        die_user("option --label-smoothing applies to --loss sigmoid only");
    trainer_cli_finish(&c, output);

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    const char **prompts = trainer_cli_prompts(&train), **eval_prompts = trainer_cli_prompts(&eval);
    const char **responses = trainer_cli_responses(&train, 2, c.data);
    const char **eval_responses = trainer_cli_responses(&eval, 2, c.eval_data ? c.eval_data : "");
    DpoTask task;
    if (dpo_task_init(&task, tokenizer, prompts, responses, train.count, eval_prompts, eval_responses, eval.count,
                      (int)c.max_seq_len, &loss) != 0)
        die_from_err();

    Model model, reference;
    const ModelLoadOptions load = {.with_lm_head = true};
    trainer_cli_load_model(&c, model_path, &load, false, &model);
    if (reference_path) trainer_cli_load_reference(&c, reference_path, &model, &reference);
    if (!c.quiet)
        fprintf(stderr, "dpo: %ld training pairs (%ld dropped, %ld cut at %ld tokens), %ld eval pairs, loss %s, beta %g\n",
                task.train_count, task.dropped, task.truncated, c.max_seq_len, task.eval_count, loss_name, beta);
    // The reference's log-probs, once, before any step (and again on --resume, from the
    // same starting weights: train_run loads the checkpoint afterwards).
    if (reference_path) {
        dpo_task_compute_reference(&task, &reference);
        model_free(&reference);
    } else if (dpo_loss_uses_reference(loss.loss)) {
        dpo_task_compute_reference(&task, &model);
    }
    model_release_activations(&model);
    if (!c.quiet && dpo_loss_uses_reference(loss.loss))
        fprintf(stderr, "dpo: reference log-probs of %ld rows computed\n", task.train.count + task.eval.count);

    TrainTask train_task = dpo_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    if (!c.quiet) fprintf(stderr, "dpo: final model in %s/final\n", output);
    model_free(&model);
    dpo_task_free(&task);
    free(prompts), free(responses), free(eval_prompts), free(eval_responses);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    return 0;
}
