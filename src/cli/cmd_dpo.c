// marlhf dpo: direct preference optimization of a policy on chosen/rejected pairs
// (train/dpo.h), DeepSpeed-Chat's step2_dpo_finetuning.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "core/check.h"
#include "model/weights_io.h"
#include "train/dpo.h"

// The next comma-separated item of *cursor (cut out in place, spaces around it trimmed), or
// NULL at the end; an empty item is "".
static char *next_item(char **cursor) {
    if (!*cursor) return NULL;
    char *item = *cursor, *comma = strchr(item, ',');
    if (comma) *comma = '\0';
    *cursor = comma ? comma + 1 : NULL;
    while (*item == ' ') item++;
    for (char *end = item + strlen(item); end > item && end[-1] == ' ';) *--end = '\0';
    return item;
}

// One entry of --loss: a pair loss, or TRL's "sft" term (a batch mean, not a pair loss).
typedef struct {
    bool sft;
    DpoLossKind kind;
    char name[32];
} LossEntry;

// Splits a comma-separated list ("sigmoid,bco,sft") into entries; exits 2 on a name it does
// not know. Returns the count.
static int parse_loss_list(const char *list, LossEntry *entries) {
    char *copy = xstrdup(list), *cursor = copy;
    int count = 0;
    for (char *name; (name = next_item(&cursor));) {
        if (count == DPO_MAX_LOSS_TERMS)
            die_user("option --loss: at most %d losses combine, got '%s'", DPO_MAX_LOSS_TERMS, list);
        LossEntry *entry = &entries[count++];
        snprintf(entry->name, sizeof entry->name, "%s", name);
        entry->sft = !strcmp(name, "sft");
        if (!entry->sft && dpo_loss_from_name(name, &entry->kind) != 0)
            die_user("option --loss must be one of " DPO_LOSS_NAMES
                     ", or several of them and sft with commas, got '%s'",
                     name);
    }
    free(copy);
    return count;
}

// --loss-weights: as many numbers >= 0 as --loss has entries, with commas (all 1 when not given).
static void parse_loss_weights(const char *list, int count, double *weights) {
    for (int k = 0; k < count; k++) weights[k] = 1.0;
    if (!list) return;
    char *copy = xstrdup(list), *cursor = copy;
    int given = 0;
    for (char *item; (item = next_item(&cursor)); given++) {
        char *end;
        const double weight = strtod(item, &end);
        if (end == item || *end != '\0' || !(weight >= 0) || !isfinite(weight))
            die_user("option --loss-weights must be numbers >= 0 separated by commas, got '%s'", item);
        if (given < count) weights[given] = weight;
    }
    free(copy);
    if (given != count) die_user("option --loss-weights: %d weights for %d losses in --loss", given, count);
}

int cmd_dpo(int argc, char **argv) {
    TrainerCli c = trainer_cli_defaults(1e-6, 0.1, 0.0, 2); // learning rate, warmup ratio, weight decay, data phase
    char *model_path = NULL, *output = NULL, *reference_path = NULL, *loss_name = "sigmoid";
    char *divergence_name = "reverse-kl", *loss_weights = NULL;
    bool use_weighting = false, padding_free = false;
    ReferenceSyncCli sync = reference_sync_cli_defaults();
    double beta = 0.1, label_smoothing = 0.0, simpo_gamma = 0.5, discopop_tau = 0.05, sft_weight = 0.0, f_alpha = 0.5;
    double ld_alpha = 1.0, cpo_alpha = NAN; // NAN: --cpo-alpha not given (0 for simpo and alphapo, else 1)
    double alphapo_alpha = NAN;             // NAN: --alphapo-alpha not given (0: the log-probs themselves)
    Option options[72] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "the policy to train, usually the SFT model", true, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder (metrics, checkpoints, final model in final/)", true, false},
        {"reference-model", "ref_model", OPT_STRING, &reference_path,
         "frozen reference (default: the policy's starting weights)", false, false},
        {"beta", NULL, OPT_FLOAT, &beta, "KL strength: the implicit reward is beta log(policy / reference)", false, false},
        {"loss", "loss_type", OPT_STRING, &loss_name,
         "sigmoid (DPO) | sigmoid-norm | robust | exo | ipo | hinge | nca | bco | sppo-hard | apo-zero | apo-down | "
         "discopop | aot | aot-unpaired (these two sort the micro-batch's log-ratios) | cpo | cpo-hinge | cpo-ipo | "
         "simpo | alphapo | orpo (these six: no reference); or several with commas, sft among them "
         "(e.g. sigmoid,bco,sft), their losses added; see docs/dpo.md",
         false, false},
        {"loss-weights", "loss_weights", OPT_STRING, &loss_weights,
         "with several --loss: each one's weight, with commas (default: all 1)", false, false},
        {"use-weighting", "use_weighting", OPT_BOOL, &use_weighting,
         "WPO: weight each pair's loss by the policy's own probability of its two responses (Zhou et al. 2024)", false,
         false},
        {"label-smoothing", "label_smoothing", OPT_FLOAT, &label_smoothing,
         "sigmoid, robust, exo, aot, aot-unpaired, cpo, simpo, alphapo: assumed fraction of flipped labels "
         "(sigmoid: conservative DPO, DeepSpeed-Chat, OpenRLHF; exo needs it > 0)",
         false, false},
        {"simpo-gamma", "simpo_gamma", OPT_FLOAT, &simpo_gamma, "simpo, alphapo: the target reward margin (TRL's CPOConfig)",
         false, false},
        {"discopop-tau", "discopop_tau", OPT_FLOAT, &discopop_tau, "discopop: the temperature of its blend (TRL's)",
         false, false},
        {"f-divergence", "f_divergence_type", OPT_STRING, &divergence_name,
         "the divergence to the reference: reverse-kl (DPO) | forward-kl | js | alpha (f-DPO)", false, false},
        {"f-alpha", "f_alpha_divergence_coef", OPT_FLOAT, &f_alpha, "--f-divergence alpha: its alpha", false, false},
        {"ld-alpha", "ld_alpha", OPT_FLOAT, &ld_alpha,
         "LD-DPO: the weight of the longer response's tokens past the shorter one's length, in (0, 1] (1: plain DPO)",
         false, false},
        {"sft-weight", "rpo_alpha nll_loss_coef", OPT_FLOAT, &sft_weight,
         "plus this times the chosen response's mean negative log-likelihood (RPO)", false, false},
        {"cpo-alpha", "cpo_alpha", OPT_FLOAT, &cpo_alpha,
         "cpo, cpo-hinge, cpo-ipo, simpo: plus this times the mean negative log-likelihood of the batch's chosen "
         "tokens, CPO's behaviour cloning (TRL's CPOConfig; default 1, 0 for simpo)",
         false, false},
        {"alphapo-alpha", "alpha", OPT_FLOAT, &alphapo_alpha,
         "alphapo (needs it non-zero), cpo, cpo-hinge, cpo-ipo, simpo: AlphaPO's reward shape, (1 - p^-alpha) / alpha "
         "of each response's probability (TRL's CPOConfig alpha; 0: log p)",
         false, false},
        {"padding-free", "padding_free", OPT_BOOL, &padding_free,
         "run each micro-batch's rows side by side in one row, each attending to itself only (TRL's padding_free): "
         "the same sums, no padding computed", false, false},
    };
    const Option *sync_options = &options[17];
    int count = 17 + reference_sync_cli_options(&sync, options + 17);
    count += trainer_cli_options(&c, options + count);
    CHECK(count <= (int)(sizeof options / sizeof options[0]), "option table too small");
    OptionSet set = {"dpo", "Direct preference optimization of a policy on chosen/rejected pairs (DPO and its variants, IPO, AOT, CPO, SimPO, AlphaPO, ORPO...).",
                     "marlhf dpo --model SFT_MODEL --data PAIRS.jsonl --output RUN_DIR [options]", options, count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    DpoLossOptions loss = {.beta = beta, .label_smoothing = label_smoothing, .simpo_gamma = simpo_gamma,
                           .discopop_tau = discopop_tau, .f_alpha = f_alpha, .ld_alpha = ld_alpha,
                           .sft_weight = sft_weight, .use_weighting = use_weighting};
    if (!(sft_weight >= 0) || !isfinite(sft_weight)) die_user("option --sft-weight must be >= 0, got %g", sft_weight);
    LossEntry entries[DPO_MAX_LOSS_TERMS];
    double weights[DPO_MAX_LOSS_TERMS];
    const int entry_count = parse_loss_list(loss_name, entries);
    parse_loss_weights(loss_weights, entry_count, weights);
    bool any_smoothing = false;
    for (int k = 0; k < entry_count; k++) {
        const LossEntry *entry = &entries[k];
        if (entry->sft) {
            if (loss.sft_term) die_user("option --loss: sft appears twice in '%s'", loss_name);
            loss.sft_term = true, loss.sft_term_weight = weights[k];
            continue;
        }
        // CPO, SimPO and ORPO are TRL's CPOTrainer and ORPOTrainer, which take one loss.
        if (!dpo_loss_uses_reference(entry->kind) && entry_count > 1)
            die_user("option --loss: %s combines with no other loss (TRL's %s)", entry->name,
                     dpo_loss_is_cpo_trainer(entry->kind) ? "CPOTrainer" : "ORPOTrainer");
        loss.terms[loss.term_count] = entry->kind, loss.term_weights[loss.term_count++] = weights[k];
        any_smoothing |= dpo_loss_uses_label_smoothing(entry->kind);
    }
    if (loss.term_count == 0) die_user("option --loss: sft alone has no preference term (that is marlhf sft)");
    loss.loss = loss.terms[0];
    // One loss of weight 1 is the plain loss (the same arithmetic as before losses combined).
    if (entry_count == 1 && weights[0] == 1.0) loss.term_count = 0;
    if (loss.sft_term && sft_weight > 0)
        die_user("option --sft-weight: --loss has an sft term already (--sft-weight is per pair, sft the "
                 "batch's mean)");
    if (use_weighting && !dpo_loss_uses_reference(loss.loss))
        die_user("option --use-weighting: --loss %s has no WPO weighting (TRL's %s has none)", loss_name,
                 dpo_loss_is_cpo_trainer(loss.loss) ? "CPOTrainer" : "ORPOTrainer");
    // CPO's behaviour cloning (TRL's cpo_alpha) is TRL's sft term: the mean -log-prob over the
    // micro-batch's chosen response tokens, the cross-entropy CPOTrainer adds.
    if (!isnan(cpo_alpha) && !dpo_loss_is_cpo_trainer(loss.loss))
        die_user("option --cpo-alpha applies to --loss cpo, cpo-hinge, cpo-ipo and simpo only (TRL's CPOTrainer; "
                 "DPO's is --sft-weight or the sft term of --loss)");
    if (!isnan(cpo_alpha) && !(cpo_alpha >= 0 && isfinite(cpo_alpha)))
        die_user("option --cpo-alpha must be >= 0, got %g", cpo_alpha);
    // TRL's loss_type "alphapo" is "simpo" with cpo_alpha set to 0 whatever was given.
    if (loss.loss == DPO_LOSS_ALPHAPO && !isnan(cpo_alpha) && cpo_alpha != 0)
        die_user("option --cpo-alpha: --loss alphapo is SimPO with cpo_alpha 0 (TRL sets it so); for AlphaPO with "
                 "behaviour cloning use --loss simpo --alphapo-alpha A --cpo-alpha %g",
                 cpo_alpha);
    if (dpo_loss_is_cpo_trainer(loss.loss)) {
        if (sft_weight > 0)
            die_user("option --sft-weight: --loss %s is TRL's CPOTrainer, whose chosen NLL is --cpo-alpha", loss_name);
        const bool simpo_like = loss.loss == DPO_LOSS_SIMPO || loss.loss == DPO_LOSS_ALPHAPO;
        const double weight = isnan(cpo_alpha) ? (simpo_like ? 0.0 : 1.0) : cpo_alpha;
        if (weight > 0) loss.sft_term = true, loss.sft_term_weight = weight;
    }
    // AlphaPO's reward shape (TRL's CPOConfig alpha, "works with all loss types" of CPOTrainer).
    if (!isnan(alphapo_alpha) && !dpo_loss_is_cpo_trainer(loss.loss))
        die_user("option --alphapo-alpha applies to --loss alphapo, cpo, cpo-hinge, cpo-ipo and simpo only (TRL's "
                 "CPOTrainer)");
    if (!isnan(alphapo_alpha) && !isfinite(alphapo_alpha))
        die_user("option --alphapo-alpha must be a number, got %g", alphapo_alpha);
    if (loss.loss == DPO_LOSS_ALPHAPO && (isnan(alphapo_alpha) || alphapo_alpha == 0))
        die_user("option --alphapo-alpha: --loss alphapo needs it non-zero (with alpha 0 it is --loss simpo)");
    loss.alphapo_alpha = isnan(alphapo_alpha) ? 0.0 : alphapo_alpha;
    // AOT (TRL 1.12): a pair's loss sorts the log-ratios of its micro-batch; WPO's per-pair
    // weights would fall on the wrong pairs, and TRL refuses them.
    if (use_weighting && dpo_options_sort_batch(&loss))
        die_user("option --use-weighting: --loss aot and aot-unpaired sort the pairs, so WPO's per-pair weights do not "
                 "apply (TRL refuses it too)");
    if (!dpo_loss_uses_reference(loss.loss) && reference_path)
        die_user("option --reference-model: --loss %s has no reference", loss_name);
    if (!isfinite(simpo_gamma)) die_user("option --simpo-gamma must be a number, got %g", simpo_gamma);
    if (!(beta > 0) || !isfinite(beta)) die_user("option --beta must be positive, got %g", beta);
    if (!(label_smoothing >= 0 && label_smoothing < 0.5))
        die_user("option --label-smoothing must be in [0, 0.5), got %g", label_smoothing);
    // With several losses, the smoothing goes to those that take it.
    if (label_smoothing > 0 && !any_smoothing)
        die_user("option --label-smoothing applies to --loss sigmoid, robust, exo, aot, aot-unpaired, cpo, simpo and "
                 "alphapo only");
    if (f_divergence_from_name(divergence_name, &loss.f_divergence) != 0)
        die_user("option --f-divergence must be reverse-kl, forward-kl, js or alpha, got '%s'", divergence_name);
    for (int k = 0; k < entry_count; k++) {
        const LossEntry *entry = &entries[k];
        if (entry->sft) continue; // TRL's sft term reads the log-probs themselves, whatever the divergence
        if (entry->kind == DPO_LOSS_EXO && !(label_smoothing > 0))
            die_user("option --label-smoothing: --loss exo needs it above 0 (the EXO paper uses 1e-3)");
        if (loss.f_divergence != F_DIVERGENCE_REVERSE_KL && !dpo_loss_takes_f_divergence(entry->kind))
            die_user("option --f-divergence: --loss %s has no f-divergence form (only sigmoid, sigmoid-norm, hinge, "
                     "ipo, exo, robust and discopop)",
                     entry->name);
    }
    if (!isfinite(f_alpha)) die_user("option --f-alpha must be a number, got %g", f_alpha);
    if (!(ld_alpha > 0 && ld_alpha <= 1)) die_user("option --ld-alpha must be in (0, 1], got %g", ld_alpha);
    if (ld_alpha != 1 && sft_weight > 0)
        die_user("option --ld-alpha: with --sft-weight the SFT term would see the weighted sums (not supported)");
    if (!(discopop_tau > 0) || !isfinite(discopop_tau))
        die_user("option --discopop-tau must be positive, got %g", discopop_tau);
    trainer_cli_finish(&c, output);
    cli_set_batch_invariant(&set, c.device);
    reference_sync_cli_check(&sync, sync_options, dpo_loss_uses_reference(loss.loss), loss_name, c.lora.rank > 0,
                             c.zero_stage);
    if (dpo_options_sort_batch(&loss) && c.micro_batch == 1 && !c.quiet)
        fprintf(stderr, "dpo: warning: --loss %s with --per-device-train-batch-size 1 has nothing to sort: each pair's "
                        "loss is sigmoid's (with --label-smoothing)\n", loss_name);

    Tokenizer *tokenizer;
    if (tokenizer_load(&tokenizer, model_path) != 0) die_from_err();
    trainer_cli_fit_context(&c, model_path);
    Dataset train, eval;
    trainer_cli_load_data(&c, DATA_FORMAT_AUTO, &train, &eval);
    trainer_cli_render_chat(&c, tokenizer, model_path, &train, &eval);
    const char **prompts = trainer_cli_prompts(&train), **eval_prompts = trainer_cli_prompts(&eval);
    const char **responses = trainer_cli_responses(&train, 2, c.data);
    const char **eval_responses = trainer_cli_responses(&eval, 2, c.eval_data ? c.eval_data : "");
    DpoTask task;
    if (dpo_task_init(&task, tokenizer, prompts, responses, train.count, eval_prompts, eval_responses, eval.count,
                      (int)c.max_seq_len, &loss) != 0)
        die_from_err();

    Model model, reference;
    const ModelLoadOptions load = {.with_lm_head = true, .keep_range = trainer_cli_keep_range(&c)};
    trainer_cli_load_model(&c, model_path, &load, false, &model);
    model.packed_rows_only = padding_free; // its response batches run in one row (train/response_logps.c)
    // TR-DPO holds its reference through training (on --resume its checkpoint's: it has moved).
    if (sync.enabled)
        reference_sync_cli_load(&c, &sync, reference_path, model_path, tokenizer, &model, &reference, &task.sync);
    else if (reference_path) trainer_cli_load_reference(&c, reference_path, tokenizer, &model, &reference);
    if (!c.quiet)
        fprintf(stderr, "dpo: %ld training pairs (%ld dropped, %ld cut at %ld tokens), %ld eval pairs, loss %s, beta %g\n",
                task.train_count, task.dropped, task.truncated, c.max_seq_len, task.eval_count, loss_name, beta);
    // The reference's log-probs, once, before any step: --reference-model's here, the
    // policy's own in train_run (TrainTask.prepare), on the model as it trains (under ZeRO-3
    // sharded, so no rank ever holds the whole policy) -- on --resume taken from the
    // checkpoint, which keeps them.
    if (sync.enabled) {
        dpo_task_reference_model(&task, &reference, &c.train);
        if (!c.quiet)
            fprintf(stderr, "dpo: the reference (%s) scored %ld rows (the rest from the checkpoint); it moves towards "
                            "the policy every %ld steps\n",
                    reference_path ? reference_path : "the policy's starting weights", task.reference_rows_scored,
                    sync.steps);
    } else if (reference_path) {
        dpo_task_reference_model(&task, &reference, &c.train);
        model_free(&reference);
        if (!c.quiet)
            fprintf(stderr, "dpo: the reference model scored %ld rows (the rest from the checkpoint)\n",
                    task.reference_rows_scored);
    } else if (dpo_loss_uses_reference(loss.loss)) {
        task.reference_from_policy = true;
        if (!c.quiet)
            fprintf(stderr, "dpo: reference log-probs of %ld rows from the policy's starting weights, before the first step "
                            "(on --resume from the checkpoint)\n",
                    task.train.count + task.eval.count);
    }

    TrainTask train_task = dpo_train_task(&task);
    if (train_run(&train_task, &model, tokenizer, &c.train) != 0) die_from_err();
    if (!c.quiet && task.reference_from_policy)
        fprintf(stderr, "dpo: the starting weights scored %ld rows for the reference (the rest from the checkpoint)\n",
                task.reference_rows_scored);
    if (task.sync.model) {
        if (!c.quiet)
            fprintf(stderr, "dpo: the reference moved %ld times, scoring %ld rows in all\n", task.sync.updates,
                    task.reference_rows_scored);
        model_free(&reference);
    }
    if (!c.quiet) fprintf(stderr, "dpo: final model in %s/final\n", output);
    model_free(&model);
    dpo_task_free(&task);
    free(prompts), free(responses), free(eval_prompts), free(eval_responses);
    dataset_free(&train);
    dataset_free(&eval);
    tokenizer_free(tokenizer);
    return 0;
}
