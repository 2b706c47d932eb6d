#include "cli/train_options.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "core/check.h"
#include "data/column_renames.h"
#include "data/split.h"
#include "dist/dist.h"
#include "dist/zero.h"
#include "io/fs.h"
#include "model/lora.h"
#include "model/bnb_checkpoint.h"
#include "model/quantize.h"
#include "train/checkpoint.h"
#include "train/reference_sync.h"

// The six LoRA options of each prefix: name, aliases, help. Names are literals because an
// Option holds pointers, not copies.
static const struct {
    const char *prefix;
    const char *text[10][3];
} lora_option_texts[] = {
    {"", {{"lora-rank", "lora_dim lora_r", "LoRA rank: train low-rank adapters on a frozen model (0: train every weight)"},
          {"lora-alpha", "lora_alpha", "adapters' alpha; their output is scaled by alpha / rank (0: the rank)"},
          {"lora-modules", "lora_target_modules",
           "modules with adapters: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear"},
          {"lora-adapter", "lora_path",
           "start from this saved adapter (a marlhf model folder or a PEFT adapter folder), its rank, alpha and modules"},
          {"lora-rslora", "use_rslora", "rank-stabilised LoRA: scale the adapters by alpha / sqrt(rank) (PEFT's use_rslora)"},
          {"use-dora", "use_dora lora-dora",
           "DoRA (PEFT's use_dora): each output row of an adapted weight W + scale B A is rescaled to a trained "
           "magnitude m (needs --lora-rank)"},
          {"lora-rank-pattern", "rank_pattern lora_rank_pattern",
           "per-module ranks, PEFT's rank_pattern: KEY=RANK,... or a JSON object; a module takes the first key (in "
           "sorted order) whose regex matches the end of its name after a dot, e.g. 'q_proj=16,layers\\.0\\..*=4' "
           "(needs --lora-rank, the default)"},
          {"lora-alpha-pattern", "alpha_pattern lora_alpha_pattern",
           "per-module alphas, PEFT's alpha_pattern: KEY=ALPHA,... or a JSON object, matched as --lora-rank-pattern"},
          {"lora-modules-regex", "lora_target_modules_regex",
           "modules with adapters by a regex on their whole names (PEFT's target_modules as a string, re.fullmatch), "
           "e.g. 'model\\.layers\\.[0-3]\\..*_proj' (instead of --lora-modules)"},
          {"lora-layers", "layers_to_transform lora_layers_to_transform",
           "only these layers' --lora-modules have adapters (PEFT's layers_to_transform), e.g. 0,1,8-11"}}},
    {"actor-", {{"actor-lora-rank", "actor_lora_dim",
                 "LoRA rank of the actor's adapters (0: train every weight); with adapters the reference model is the "
                 "actor's frozen base, not a second copy"},
                {"actor-lora-alpha", "actor_lora_alpha", "actor adapters' alpha (0: the rank)"},
                {"actor-lora-modules", "actor_lora_modules",
                 "actor modules with adapters: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear"},
                {"actor-lora-adapter", "actor_lora_path",
                 "start the actor's adapters from this saved adapter (a marlhf model folder or a PEFT adapter folder); "
                 "the reference is then the base with this adapter"},
                {"actor-lora-rslora", "actor_use_rslora", "actor adapters scaled by alpha / sqrt(rank) (rsLoRA)"},
                {"actor-use-dora", "actor_use_dora actor-lora-dora", "DoRA adapters on the actor (as --use-dora)"},
                {"actor-lora-rank-pattern", "actor_rank_pattern", "per-module ranks of the actor (as --lora-rank-pattern)"},
                {"actor-lora-alpha-pattern", "actor_alpha_pattern",
                 "per-module alphas of the actor (as --lora-alpha-pattern)"},
                {"actor-lora-modules-regex", "actor_lora_target_modules_regex",
                 "actor modules with adapters by a regex on their whole names (as --lora-modules-regex)"},
                {"actor-lora-layers", "actor_layers_to_transform", "only these layers of the actor have adapters (as --lora-layers)"}}},
    {"critic-", {{"critic-lora-rank", "critic_lora_dim",
                  "LoRA rank of the critic's adapters (0: train every weight; its value head trains either way)"},
                 {"critic-lora-alpha", "critic_lora_alpha", "critic adapters' alpha (0: the rank)"},
                 {"critic-lora-modules", "critic_lora_modules", "critic modules with adapters (as --actor-lora-modules)"},
                 {"critic-lora-adapter", "critic_lora_path", "start the critic's adapters from this saved adapter"},
                 {"critic-lora-rslora", "critic_use_rslora", "critic adapters scaled by alpha / sqrt(rank) (rsLoRA)"},
                 {"critic-use-dora", "critic_use_dora critic-lora-dora", "DoRA adapters on the critic (as --use-dora)"},
                 {"critic-lora-rank-pattern", "critic_rank_pattern",
                  "per-module ranks of the critic (as --lora-rank-pattern)"},
                 {"critic-lora-alpha-pattern", "critic_alpha_pattern",
                  "per-module alphas of the critic (as --lora-alpha-pattern)"},
                 {"critic-lora-modules-regex", "critic_lora_target_modules_regex",
                  "critic modules with adapters by a regex on their whole names (as --lora-modules-regex)"},
                 {"critic-lora-layers", "critic_layers_to_transform", "only these layers of the critic have adapters (as --lora-layers)"}}},
};

int lora_cli_options(LoraCli *c, const char *prefix, Option *o) {
    if (!c->modules) c->modules = "all-linear";
    const OptionType types[10] = {OPT_INT,  OPT_FLOAT,  OPT_STRING, OPT_STRING, OPT_BOOL,
                                  OPT_BOOL, OPT_STRING, OPT_STRING, OPT_STRING, OPT_STRING};
    void *targets[10] = {&c->rank,         &c->alpha,         &c->modules,       &c->adapter, &c->rslora,
                         &c->dora,         &c->rank_pattern,  &c->alpha_pattern, &c->modules_regex, &c->layers};
    for (size_t p = 0; p < sizeof lora_option_texts / sizeof lora_option_texts[0]; p++) {
        if (strcmp(prefix, lora_option_texts[p].prefix)) continue;
        for (int i = 0; i < 10; i++) {
            const char *const *text = lora_option_texts[p].text[i];
            o[i] = (Option){text[0], text[1], types[i], targets[i], text[2], false, false};
        }
        return 10;
    }
    CHECK(0, "no LoRA options for prefix '%s'", prefix);
    return 0;
}

// --lora-modules-regex and --lora-layers into lora->target_regex and lora->layers.
static void lora_cli_selection(const LoraCli *c, const char *prefix, LoraConfig *lora) {
    if (c->modules_regex) {
        if (strcmp(c->modules, "all-linear"))
            die_user("option --%slora-modules-regex chooses the modules itself: drop --%slora-modules", prefix, prefix);
        if (lora_set_target_regex(lora, c->modules_regex) != 0)
            die_user("option --%slora-modules-regex %s", prefix, err_msg());
    }
    if (c->layers && lora_parse_layers(lora, c->layers) != 0) die_user("option --%slora-layers %s", prefix, err_msg());
    if (lora_check_selection(lora) != 0)
        die_user("option --%slora-%s: %s", prefix, c->modules_regex ? "modules-regex" : "layers", err_msg());
}

void lora_cli_finish(const LoraCli *c, const char *prefix, LoraConfig *lora) {
    memset(lora, 0, sizeof *lora);
    if (c->adapter) {
        if (c->rank != 0 || c->alpha != 0 || strcmp(c->modules, "all-linear") || c->rslora || c->dora ||
            c->rank_pattern || c->alpha_pattern || c->modules_regex || c->layers)
            die_user("option --%slora-adapter takes the adapter's own rank, alpha, modules, scaling, DoRA and "
                     "patterns: drop --%slora-rank, --%slora-alpha, --%slora-modules, --%slora-modules-regex, "
                     "--%slora-layers, --%slora-rslora, --%suse-dora, --%slora-rank-pattern and --%slora-alpha-pattern",
                     prefix, prefix, prefix, prefix, prefix, prefix, prefix, prefix, prefix, prefix);
        if (lora_read_adapter_config(c->adapter, lora) != 0) die_user("option --%slora-adapter: %s", prefix, err_msg());
        return;
    }
    if (c->rank < 0 || c->rank > 4096) die_user("option --%slora-rank must be in [0, 4096], got %ld", prefix, c->rank);
    if (c->alpha < 0) die_user("option --%slora-alpha must be >= 0, got %g", prefix, c->alpha);
    if (lora_parse_targets(c->modules, &lora->targets) != 0) die_user("option --%slora-modules: %s", prefix, err_msg());
    lora_cli_selection(c, prefix, lora);
    lora->rank = (int)c->rank;
    lora->alpha = c->alpha > 0 ? (float)c->alpha : (float)c->rank;
    lora->rslora = c->rslora;
    lora->dora = c->dora;
    if (lora->rank == 0 && c->rslora) die_user("option --%slora-rslora needs --%slora-rank", prefix, prefix);
    if (lora->rank == 0 && c->dora) die_user("option --%suse-dora needs --%slora-rank", prefix, prefix);
    if (lora->rank == 0 && (c->modules_regex || c->layers))
        die_user("option --%slora-%s needs --%slora-rank", prefix, c->modules_regex ? "modules-regex" : "layers", prefix);
    const char *pattern_text[2] = {c->rank_pattern, c->alpha_pattern};
    for (int k = 0; k < 2; k++) {
        if (!pattern_text[k]) continue;
        char option[64];
        snprintf(option, sizeof option, "option --%slora-%s-pattern", prefix, k == 0 ? "rank" : "alpha");
        if (lora->rank == 0) die_user("%s needs --%slora-rank (the rank of the modules no key selects)", option, prefix);
        if (lora_parse_patterns(pattern_text[k], option, k == 0 ? lora->rank_pattern : lora->alpha_pattern,
                                k == 0 ? &lora->rank_patterns : &lora->alpha_patterns) != 0)
            die_user("%s", err_msg());
    }
    if (lora_check_patterns(lora) != 0) die_user("option --%slora-rank-pattern / --%slora-alpha-pattern: %s", prefix,
                                                 prefix, err_msg());
    if (lora->rank == 0) memset(lora, 0, sizeof *lora);
}

void lora_cli_check_zero_stage(const LoraConfig *lora, const char *prefix, const char *quantize, long zero_stage) {
    // ZeRO-3 with LoRA shards the float32 base (a frozen model's way) and trains the adapters
    // as stage 2 does; a quantized base's blocks are not cut into shards.
    if (zero_stage == 3 && lora->rank > 0 && quantize_requested(quantize))
        die_user("option --zero-stage 3 with LoRA takes a float32 base: not with --%squantize %s (use --zero-stage 2)",
                 prefix, quantize);
}

void lora_cli_apply(const LoraCli *cli, const LoraConfig *lora, Model *model, bool train_value_head, long seed,
                    bool quiet, bool read_later) {
    if (lora->rank == 0) return;
    int rc = !cli->adapter ? model_add_lora(model, lora, train_value_head, (uint64_t)seed)
             : read_later  ? model_add_lora_of_adapter(model, cli->adapter, train_value_head, (uint64_t)seed)
                           : model_load_lora_adapter(model, cli->adapter, train_value_head, (uint64_t)seed);
    if (rc != 0) die_user("%s", err_msg());
    // An adapter read from a folder comes with its file's lora_dropout; the run's choice
    // (lora_cli_finish's caller) decides. Set before the first forward sizes the buffers.
    model->lora.dropout = lora->dropout;
    if (!quiet) {
        char line[256];
        lora_describe(model, line, sizeof line);
        fprintf(stderr, "lora: %s\n", line);
    }
}

TrainerCli trainer_cli_defaults(double learning_rate, double warmup_ratio, double weight_decay, long data_phase) {
    return (TrainerCli){.schedule_name = "cosine", .micro_batch = 4, .grad_accum = 1, .epochs = 1, .warmup_steps = -1,
                        .keep_last = 2, .log_every = 1, .seed = 1234, .max_seq_len = 512, .learning_rate = learning_rate,
                        .warmup_ratio = warmup_ratio, .clip_norm = 1.0, .weight_decay = weight_decay, .beta1 = 0.9,
                        .beta2 = 0.95, .eps = 1e-8, .device = "cpu", .quantize = "none", .data_format = "auto", .data_phase = data_phase};
}

int trainer_cli_options(TrainerCli *c, Option *o) {
    int n = 0;
#define ADD(name, aliases, type, target, help) o[n++] = (Option){name, aliases, type, target, help, false, false}
    ADD("data", "data_path", OPT_STRING, &c->data, "training data (JSONL/JSON in a supported schema)");
    ADD("eval-data", "eval_data", OPT_STRING, &c->eval_data, "held-out data for evaluation");
    ADD("data-format", "data_format", OPT_STRING, &c->data_format, "auto|tldr|hh|webgpt|apps|sft|pairs|ranked|prompts|unpaired");
    ADD("rename-columns", "rename_columns", OPT_STRING, &c->rename_columns,
        "old=new,...: the data's fields renamed before its format is read, e.g. question=prompt,answer=response");
    ADD("chat-template", "chat_template", OPT_STRING, &c->chat_template,
        "chat template (name or file) for conversational data (lists of messages); default: the model's own");
    ADD("data-split", "data_split", OPT_STRING, &c->data_split, "DeepSpeed-Chat split weights, e.g. 2,4,4 (empty: use all rows)");
    ADD("data-phase", "data_phase", OPT_INT, &c->data_phase, "which part of --data-split this step uses (1 SFT, 2 RM, 3 PPO)");
    ADD("max-rows", "max_rows", OPT_INT, &c->max_rows, "use at most this many training rows (0: all)");
    ADD("max-seq-len", "max_seq_len", OPT_INT, &c->max_seq_len, "tokens per example at most (longer ones are cut)");
    ADD("learning-rate", "learning_rate lr", OPT_FLOAT, &c->learning_rate, "peak learning rate");
    ADD("lr-scheduler-type", "lr_scheduler_type", OPT_STRING, &c->schedule_name, "constant|linear|cosine");
    ADD("warmup-ratio", "warmup_ratio", OPT_FLOAT, &c->warmup_ratio, "warmup as a fraction of the optimizer steps");
    ADD("num-warmup-steps", "num_warmup_steps warmup_steps", OPT_INT, &c->warmup_steps, "warmup steps (overrides the ratio when >= 0)");
    ADD("num-train-epochs", "num_train_epochs epochs", OPT_INT, &c->epochs, "passes over the training data");
    ADD("max-steps", "max_steps", OPT_INT, &c->max_steps, "stop after this many optimizer steps (0: no limit)");
    ADD("per-device-train-batch-size", "per_device_train_batch_size micro-batch-size micro_batch_size", OPT_INT,
        &c->micro_batch, "examples per forward/backward pass");
    ADD("gradient-accumulation-steps", "gradient_accumulation_steps", OPT_INT, &c->grad_accum, "micro-batches per optimizer step");
    ADD("max-grad-norm", "max_grad_norm gradient_clipping", OPT_FLOAT, &c->clip_norm, "clip the global gradient norm (0: off)");
    ADD("weight-decay", "weight_decay", OPT_FLOAT, &c->weight_decay, "AdamW decoupled weight decay (not on biases, norms, embeddings)");
    ADD("adam-beta1", "adam_beta1", OPT_FLOAT, &c->beta1, "AdamW beta1");
    ADD("adam-beta2", "adam_beta2", OPT_FLOAT, &c->beta2, "AdamW beta2");
    ADD("adam-epsilon", "adam_epsilon adam_eps", OPT_FLOAT, &c->eps, "AdamW epsilon");
    ADD("eval-every", "eval_interval eval_steps", OPT_INT, &c->eval_every, "optimizer steps between evaluations (0: per epoch)");
    ADD("save-every", "save_steps save_interval", OPT_INT, &c->save_every, "optimizer steps between checkpoints (0: at the end)");
    ADD("keep-last", "keep_last save_total_limit", OPT_INT, &c->keep_last, "checkpoints to keep (0: all)");
    ADD("log-every", "log_every logging_steps", OPT_INT, &c->log_every, "optimizer steps between metric lines");
    ADD("seed", NULL, OPT_INT, &c->seed, "seed of the data order (and of a new value head)");
    ADD("group-by-length", "group_by_length", OPT_BOOL, &c->group_by_length,
        "put examples of like lengths in the same micro-batches (Hugging Face's group_by_length: less padding; "
        "each epoch's order still shuffled from --seed)");
    ADD("resume", NULL, OPT_BOOL, &c->resume, "continue from the newest checkpoint in the output folder");
    ADD("zero-stage", "zero_stage", OPT_INT, &c->zero_stage,
        "under mpirun: 1 shards the AdamW moments across processes (ZeRO-1), 2 (--device cpu) the gradients "
        "too (ZeRO-2), 3 (--device cpu) the layers' weights too (ZeRO-3), 0 keeps all whole");
    ADD("gradient-checkpointing", "gradient_checkpointing", OPT_BOOL, &c->gradient_checkpointing,
        "recompute each layer in backward instead of keeping its activations");
    ADD("neftune-noise-alpha", "neftune_noise_alpha", OPT_FLOAT, &c->neftune_noise_alpha,
        "NEFTune (Hugging Face's neftune_noise_alpha): uniform noise of alpha / sqrt(slots x hidden size) on the "
        "token embeddings of training passes (not evaluations); 0: none");
    ADD("quiet", NULL, OPT_BOOL, &c->quiet, "no progress bar");
    ADD("device", NULL, OPT_STRING, &c->device, "cpu (cuda when built with it)");
    ADD("threads", NULL, OPT_INT, &c->threads, "CPU threads (0 = all cores)");
    o[n++] = cli_batch_invariant_option(&c->batch_invariant);
    ADD("quantize", NULL, OPT_STRING, &c->quantize,
        QUANTIZE_TYPES ": the frozen base in 16 to 2 bits under LoRA adapters (QLoRA; needs --lora-rank or "
        "--lora-adapter); nf4 is bitsandbytes' NF4 with double quantization (bnb_4bit_use_double_quant), "
        "nf4-single without");
#undef ADD
    n += lora_cli_options(&c->lora_cli, "", o + n);
    // TRL's trainers: SFTTrainer keeps PEFT's lora_dropout, the reward, DPO and KTO trainers
    // turn dropout off (disable_dropout=True) unless told otherwise.
    o[n++] = (Option){"lora-dropout", "lora_dropout", OPT_STRING, &c->lora_dropout,
                      c->adapter_dropout_applies
                          ? "drop each adapter's input with this probability while training (PEFT's lora_dropout; "
                            "default 0, or the --lora-adapter's own)"
                          : "drop each adapter's input with this probability while training (PEFT's lora_dropout; "
                            "default 0, as TRL's disable_dropout)",
                      false, false};
    return n;
}

void trainer_cli_finish(TrainerCli *c, const char *run_dir) {
    TrainOptions *t = &c->train;
    if (!c->data) die_user("missing required option --data");
    if (lr_schedule_kind_from_name(c->schedule_name, &t->schedule) != 0)
        die_user("option --lr-scheduler-type must be constant, linear or cosine, got '%s'", c->schedule_name);
    if (!(c->learning_rate > 0)) die_user("option --learning-rate must be positive, got %g", c->learning_rate);
    if (c->micro_batch < 1 || c->micro_batch > 4096) die_user("option --per-device-train-batch-size must be in [1, 4096], got %ld", c->micro_batch);
    if (c->grad_accum < 1) die_user("option --gradient-accumulation-steps must be >= 1, got %ld", c->grad_accum);
    if (c->epochs < 1) die_user("option --num-train-epochs must be >= 1, got %ld", c->epochs);
    if (c->max_steps < 0) die_user("option --max-steps must be >= 0, got %ld", c->max_steps);
    if (c->warmup_ratio < 0 || c->warmup_ratio > 1) die_user("option --warmup-ratio must be in [0, 1], got %g", c->warmup_ratio);
    if (c->max_seq_len < 2 || c->max_seq_len > 1 << 20) die_user("option --max-seq-len must be in [2, 1048576], got %ld", c->max_seq_len);
    if (c->clip_norm < 0) die_user("option --max-grad-norm must be >= 0, got %g", c->clip_norm);
    if (c->weight_decay < 0) die_user("option --weight-decay must be >= 0, got %g", c->weight_decay);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) die_user("option --adam-beta1 must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) die_user("option --adam-beta2 must be in [0, 1), got %g", c->beta2);
    if (!(c->eps > 0)) die_user("option --adam-epsilon must be positive, got %g", c->eps);
    if (c->eval_every < 0 || c->save_every < 0 || c->keep_last < 0 || c->log_every < 0)
        die_user("options --eval-every, --save-every, --keep-last and --log-every must be >= 0");
    if (c->seed < 0) die_user("option --seed must be >= 0, got %ld", c->seed);
    if (!(c->neftune_noise_alpha >= 0) || !isfinite(c->neftune_noise_alpha))
        die_user("option --neftune-noise-alpha must be >= 0, got %g", c->neftune_noise_alpha);
    if (c->zero_stage < 0 || c->zero_stage > 3)
        die_user("option --zero-stage must be 0, 1, 2 or 3 (ZeRO-1 shards the optimizer state, ZeRO-2 the gradients "
                 "too, ZeRO-3 the weights too), got %ld", c->zero_stage);
    if (c->zero_stage >= 2 && c->device && strcmp(c->device, "cpu"))
        die_user("option --zero-stage %ld runs on --device cpu only (ZeRO-1 runs on cuda too; got --device %s)",
                 c->zero_stage, c->device);
    lora_cli_finish(&c->lora_cli, "", &c->lora);
    if (quantize_type_check(c->quantize, "--quantize") != 0) die_from_err();
    lora_cli_check_zero_stage(&c->lora, "", c->quantize, c->zero_stage);
    if (quantize_requested(c->quantize) && c->lora.rank == 0)
        die_user("option --quantize %s needs --lora-rank or --lora-adapter: a quantized base is frozen, it cannot be "
                 "trained in full", c->quantize);
    if (c->lora_dropout) {
        char *end;
        double p = strtod(c->lora_dropout, &end);
        if (end == c->lora_dropout || *end || !(p >= 0 && p < 1))
            die_user("option --lora-dropout must be a number in [0, 1), got '%s'", c->lora_dropout);
        if (c->lora.rank == 0 && p > 0) die_user("option --lora-dropout needs --lora-rank or --lora-adapter");
        c->lora.dropout = p;
    } else if (!c->adapter_dropout_applies) {
        c->lora.dropout = 0;
    }
    t->learning_rate = c->learning_rate;
    t->warmup_ratio = c->warmup_ratio;
    t->warmup_steps = c->warmup_steps;
    t->epochs = c->epochs;
    t->max_steps = c->max_steps;
    t->micro_batch = c->micro_batch;
    t->grad_accum = c->grad_accum;
    t->clip_norm = c->clip_norm;
    t->weight_decay = c->weight_decay;
    t->beta1 = c->beta1;
    t->beta2 = c->beta2;
    t->eps = c->eps;
    t->eval_every = c->eval_every;
    t->save_every = c->save_every;
    t->keep_last = c->keep_last;
    t->log_every = c->log_every;
    t->seed = (uint64_t)c->seed;
    t->group_by_length = c->group_by_length;
    t->run_dir = run_dir;
    t->resume = c->resume;
    t->zero_stage = (int)c->zero_stage;
    // Under ZeRO-3 a saved adapter is read once every rank holds its shard of the base.
    t->start_adapter = c->lora.rank > 0 && trainer_cli_keep_range(c) ? c->lora_cli.adapter : NULL;
    // Under mpirun only rank 0 speaks (dist/dist.h); the others would repeat every line.
    c->quiet = c->quiet || !dist_is_main();
    t->quiet = c->quiet;
    cli_set_threads(c->threads);
}

// webgpt_part: WebGPT has a train split only; DeepSpeed-Chat first splits it 95/5 into
// train (part 1) and eval (part 2), then applies --data-split inside each.
static void load_one(TrainerCli *c, const char *path, DataFormat format, const ColumnRenames *renames, int webgpt_part,
                     Dataset *out) {
    if (dataset_load_with(out, path, &(DatasetLoadOptions){.format = format, .renames = renames}) != 0) die_from_err();
    if (c->data_split && *c->data_split) {
        long *indices, count;
        int rc = out->format == DATA_FORMAT_WEBGPT
                     ? data_split_indices_nested(out->count, DATA_WEBGPT_TRAIN_EVAL_SPLIT, webgpt_part, c->data_split,
                                                 (int)c->data_phase, (uint64_t)c->seed, &indices, &count)
                     : data_split_indices(out->count, c->data_split, (int)c->data_phase, (uint64_t)c->seed, &indices,
                                          &count);
        if (rc != 0) die_from_err();
        Dataset part;
        dataset_take(out, indices, count, &part);
        free(indices);
        dataset_free(out);
        *out = part;
    }
}

void trainer_cli_load_data(TrainerCli *c, DataFormat format, Dataset *train, Dataset *eval) {
    if (c->data_format && strcmp(c->data_format, "auto") != 0 &&
        data_format_parse(c->data_format, "--data-format", &format) != 0)
        die_from_err();
    ColumnRenames renames;
    if (column_renames_parse(c->rename_columns, "--rename-columns", &renames) != 0) die_from_err();
    load_one(c, c->data, format, &renames, 1, train);
    if (c->max_rows > 0 && train->count > c->max_rows) {
        long *first = xmalloc(c->max_rows * sizeof(long));
        for (long i = 0; i < c->max_rows; i++) first[i] = i;
        Dataset part;
        dataset_take(train, first, c->max_rows, &part);
        free(first);
        dataset_free(train);
        *train = part;
    }
    if (train->count == 0) die_user("no training rows in %s", c->data);
    memset(eval, 0, sizeof *eval);
    if (c->eval_data) load_one(c, c->eval_data, format, &renames, 2, eval);
    else if (train->format == DATA_FORMAT_WEBGPT && c->data_split && *c->data_split)
        load_one(c, c->data, format, &renames, 2, eval); // WebGPT's own 5% eval part
    column_renames_free(&renames);
}

void trainer_cli_render_chat(const TrainerCli *c, Tokenizer *tokenizer, const char *model_path, Dataset *train,
                             Dataset *eval) {
    if (c->chat_template && !train->conversational)
        die_user("--chat-template renders conversational data (lists of messages), and %s holds text rows "
                 "(--chat-template)", c->data);
    if (dataset_render_chat(train, tokenizer, model_path, c->chat_template) != 0) die_from_err();
    if (eval->count > 0 && eval->conversational != train->conversational)
        die_user("%s holds %s but %s does not: render both alike (--eval-data)", c->eval_data,
                 eval->conversational ? "lists of messages" : "text rows", c->data);
    if (dataset_render_chat(eval, tokenizer, model_path, c->chat_template) != 0) die_from_err();
}

void trainer_cli_fit_context(TrainerCli *cli, const char *path) {
    ModelConfig cfg;
    if (model_read_config(&cfg, path) != 0) die_from_err();
    // Each command's summary line names the length its rows were cut at.
    if (cli->max_seq_len > cfg.max_position_embeddings) cli->max_seq_len = cfg.max_position_embeddings;
}

ModelKeepRange trainer_cli_keep_range(const TrainerCli *cli) {
    return cli->zero_stage == 3 && dist_world_size() > 1 ? dist_weights_load_range : NULL;
}

void trainer_cli_load_model(const TrainerCli *cli, const char *path, const ModelLoadOptions *load, bool train_value_head,
                            Model *model) {
    // A bitsandbytes 4-bit checkpoint (model/bnb_checkpoint.h) is a quantized base as --quantize
    // makes one: frozen under adapters.
    ModelConfig cfg;
    const char *bnb = model_read_config(&cfg, path) == 0 ? bnb_quantize_name(&cfg) : NULL;
    if (bnb && cli->lora.rank == 0)
        die_user("%s is a bitsandbytes %s checkpoint: its 4-bit base is frozen, it trains LoRA adapters only "
                 "(--lora-rank or --lora-adapter: QLoRA)", path, bnb);
    const OpsBackend *ops = ops_backend_by_name(cli->device);
    if (!ops) die_from_err();
    ModelLoadOptions options = *load;
    options.quantize = cli->quantize; // quantized as each tensor is read, before the adapters
    if (model_load(model, path, ops, &options) != 0) die_from_err();
    if (cli->zero_stage == 3 && model->quantized)
        die_user("option --zero-stage 3 with LoRA takes a float32 base, and %s is quantized (use --zero-stage 2)", path);
    lora_cli_apply(&cli->lora_cli, &cli->lora, model, train_value_head, cli->seed, cli->quiet,
                   cli->train.start_adapter != NULL);
    model->recompute = cli->gradient_checkpointing;
    model->neftune_noise_alpha = cli->neftune_noise_alpha;
}

void trainer_cli_load_reference(const TrainerCli *cli, const char *path, const Tokenizer *tokenizer, const Model *policy,
                                Model *reference) {
    const OpsBackend *ops = ops_backend_by_name(cli->device);
    if (!ops) die_from_err();
    if (tokenizer_check_same_ids(tokenizer, path, "--reference-model",
                                 "the reference's log-probs are of the policy's token ids") != 0)
        die_from_err();
    ModelLoadOptions load = {.with_lm_head = true};
    if (model_load(reference, path, ops, &load) != 0) die_from_err();
    if (reference->config.vocab_size != policy->config.vocab_size)
        die_user("the reference model's vocabulary (%d) is not the policy's (%d) (--reference-model)",
                 reference->config.vocab_size, policy->config.vocab_size);
}

ReferenceSyncCli reference_sync_cli_defaults(void) { return (ReferenceSyncCli){.mixup_alpha = 0.6, .steps = 512}; }

int reference_sync_cli_options(ReferenceSyncCli *cli, Option *o) {
    o[0] = (Option){"sync-ref-model", "sync_ref_model", OPT_BOOL, &cli->enabled,
                    "TR-DPO: every --ref-model-sync-steps optimizer steps the reference becomes "
                    "--ref-model-mixup-alpha x policy + (1 - it) x reference (TRL's sync_ref_model; the reference "
                    "held in memory, saved in checkpoints)",
                    false, false};
    o[1] = (Option){"ref-model-mixup-alpha", "ref_model_mixup_alpha", OPT_FLOAT, &cli->mixup_alpha,
                    "--sync-ref-model: the policy's share of the new reference, in (0, 1]", false, false};
    o[2] = (Option){"ref-model-sync-steps", "ref_model_sync_steps", OPT_INT, &cli->steps,
                    "--sync-ref-model: optimizer steps between reference updates", false, false};
    return 3;
}

void reference_sync_cli_check(const ReferenceSyncCli *cli, const Option *o, bool loss_has_reference,
                              const char *loss_name, bool adapted, long zero_stage) {
    if (!cli->enabled && (o[1].seen || o[2].seen))
        die_user("option --%s applies with --sync-ref-model", o[1].seen ? o[1].name : o[2].name);
    if (!cli->enabled) return;
    if (!loss_has_reference) die_user("option --sync-ref-model: --loss %s has no reference", loss_name);
    if (!(cli->mixup_alpha > 0 && cli->mixup_alpha <= 1))
        die_user("option --ref-model-mixup-alpha must be in (0, 1], got %g", cli->mixup_alpha);
    if (cli->steps < 1) die_user("option --ref-model-sync-steps must be at least 1, got %ld", cli->steps);
    // The mix is of whole weights; a LoRA policy's reference is its own base (TRL refuses PEFT
    // here too), and under ZeRO-3 no rank holds the policy whole.
    if (adapted) die_user("option --sync-ref-model mixes whole weights: not with LoRA adapters");
    if (zero_stage == 3)
        die_user("option --sync-ref-model needs the policy's weights whole: not with --zero-stage 3");
}

void reference_sync_cli_load(const TrainerCli *cli, const ReferenceSyncCli *settings, const char *reference_path,
                             const char *model_path, const Tokenizer *tokenizer, const Model *policy, Model *reference,
                             ReferenceSync *sync) {
    char *checkpoint = cli->train.resume ? checkpoint_latest(cli->train.run_dir) : NULL;
    char *dir = checkpoint ? checkpoint_model_dir(checkpoint, REFERENCE_SYNC_FOLDER) : NULL;
    if (dir && !fs_is_dir(dir))
        die_user("%s was made without --sync-ref-model (it holds no %s/): resume it without the option", checkpoint,
                 REFERENCE_SYNC_FOLDER);
    const char *from = dir ? dir : reference_path ? reference_path : model_path;
    if (dir) { // written by this run's own checkpoint, with the policy's tokenizer
        const ModelLoadOptions load = {.with_lm_head = true};
        if (model_load(reference, dir, policy->ops, &load) != 0) die_from_err();
    } else {
        trainer_cli_load_reference(cli, from, tokenizer, policy, reference);
    }
    if (reference_sync_start(sync, reference, policy, settings->mixup_alpha, settings->steps, from, model_path) != 0)
        die_from_err();
    free(dir), free(checkpoint);
}

const char **trainer_cli_prompts(const Dataset *d) {
    const char **prompts = xmalloc((d->count + 1) * sizeof(char *));
    for (long i = 0; i < d->count; i++) prompts[i] = d->records[i].prompt;
    return prompts;
}

const char **trainer_cli_responses(const Dataset *d, int K, const char *path) {
    const char **responses = xmalloc((d->count * K + 1) * sizeof(char *));
    for (long i = 0; i < d->count; i++) {
        const DataRecord *r = &d->records[i];
        if (K == 2 && r->response_count == 0) {
            if (!r->chosen || !r->rejected) die_user("row at line %ld has no chosen/rejected pair (%s)", r->line, path);
            responses[i * 2] = r->chosen;
            responses[i * 2 + 1] = r->rejected;
        } else {
            if (r->response_count != K)
                die_user("row at line %ld has %d ranked responses, expected %d (%s)", r->line, r->response_count, K,
                         path);
            for (int k = 0; k < K; k++) responses[i * K + k] = r->responses[k];
        }
    }
    return responses;
}
