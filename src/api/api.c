// The embedding API (include/marlhf.h) over the library's own modules: gen/text_model.h
// for loading and generation, train/dpo.h and train/kto.h for the preference losses and
// their backward, train/adamw.h for the update, model/lora.h for the adapters,
// train/checkpoint.h for a trainer's exact resume. It adds no numerics of its own, so what
// a program computes through it is what the command computes; its job is the boundary:
// validate every argument, turn errors into return codes, own and free what it hands out.
#include "marlhf.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/check.h"
#include "gen/generate.h"
#include "gen/text_model.h"
#include "io/fs.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/dpo.h"
#include "train/kto.h"
#include "train/response_logps.h"
#include "train/rm.h"
#include "train/sft.h"

struct marlhf_model {
    marlhf_model_kind kind;
    TextModel text;          // a reward model fills only text.model and text.tokenizer
    marlhf_trainer *trainer; // the trainer attached, if any
};

struct marlhf_trainer {
    marlhf_model *owner;
    DpoLossOptions dpo;
    KtoLossOptions kto;
    AdamW optimizer;
    double learning_rate, max_grad_norm;
    int max_seq_len, micro_batch;
    uint64_t seed; // LoRA dropout's masks
    long step;
};

// ---- the library --------------------------------------------------------------------------

int marlhf_api_version(void) { return MARLHF_API_VERSION; }

const char *marlhf_last_error(void) { return err_msg(); }

void marlhf_set_threads(int threads) {
    if (threads <= 0) threads = omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int marlhf_set_batch_invariant(int on) {
    err_clear();
    return ops_choose_batch_invariant(NULL, on != 0, on ? "marlhf_set_batch_invariant(1)" : "marlhf_set_batch_invariant(0)");
}

void marlhf_free(void *pointer) { free(pointer); }

// ---- models -------------------------------------------------------------------------------

marlhf_model_params marlhf_model_default_params(void) {
    return (marlhf_model_params){.kind = MARLHF_POLICY, .device = "cpu"};
}

static int load_reward_model(TextModel *text, const char *path, const char *device) {
    memset(text, 0, sizeof *text);
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) return -1;
    ModelLoadOptions load = {.with_value_head = true, .require_value_head = true};
    if (model_load(&text->model, path, ops, &load) != 0) return -1;
    int rc = tokenizer_load(&text->tokenizer, path);
    if (rc == 0 && tokenizer_vocab_size(text->tokenizer) > text->model.config.vocab_size)
        rc = err_set("tokenizer has %d tokens but the model only %d (%s)", tokenizer_vocab_size(text->tokenizer),
                     text->model.config.vocab_size, path);
    if (rc != 0) text_model_free(text);
    return rc;
}

marlhf_model *marlhf_model_load(const char *path, const marlhf_model_params *params) {
    err_clear();
    if (!path || !params) {
        err_set("marlhf_model_load: path and params must not be NULL");
        return NULL;
    }
    if (params->kind != MARLHF_POLICY && params->kind != MARLHF_REWARD_MODEL) {
        err_set("marlhf_model_load: unknown model kind %d (%s)", (int)params->kind, path);
        return NULL;
    }
    const char *device = params->device ? params->device : "cpu";
    // The row-invariant forward (marlhf_set_batch_invariant, or MARLHF_CPU_MATMUL) is a CPU
    // kernel; settled here, before the first forward, so a bad MARLHF_CPU_MATMUL is this
    // call's error rather than an exit at the first matmul.
    if (ops_choose_batch_invariant(device, -1, "marlhf_set_batch_invariant(1)") != 0) return NULL;
    marlhf_model *model = xcalloc(1, sizeof *model);
    model->kind = params->kind;
    int rc;
    if (params->kind == MARLHF_REWARD_MODEL) {
        if (params->lora_adapter || params->chat_template || params->quantize) {
            err_set("marlhf_model_load: lora_adapter, chat_template and quantize are for a policy, not a reward "
                    "model (%s)", path);
            free(model);
            return NULL;
        }
        rc = load_reward_model(&model->text, path, device);
    } else {
        rc = params->quantize ? quantize_type_check(params->quantize, "marlhf_model_load: quantize") : 0;
        if (rc == 0)
            rc = text_model_load(&model->text, path, params->lora_adapter, device, params->quantize,
                                 params->chat_template, false);
    }
    if (rc != 0) {
        free(model);
        return NULL;
    }
    return model;
}

void marlhf_model_free(marlhf_model *model) {
    if (!model) return;
    marlhf_trainer_free(model->trainer);
    text_model_free(&model->text);
    free(model);
}

int marlhf_model_save(marlhf_model *model, const char *dir) {
    err_clear();
    if (!model || !dir || !*dir) return err_set("marlhf_model_save: model and dir must be given");
    if (fs_exists(dir)) return err_set("marlhf_model_save: %s already exists (nothing was written)", dir);
    // A quantized base under LoRA (QLoRA) is saved as its dequantized values with the adapters merged.
    if (model->text.model.quantized && model->text.model.lora.rank == 0)
        return err_set("marlhf_model_save: the model was loaded with quantize and has no adapters: its float32 weights "
                       "are gone");
    FsAtomicDir out;
    if (fs_atomic_dir_begin(&out, dir) != 0) return -1;
    int rc = model_write_hf_files(&model->text.model, out.tmp_path);
    if (rc == 0) rc = tokenizer_write_hf(model->text.tokenizer, out.tmp_path);
    if (rc == 0) return fs_atomic_dir_commit(&out);
    fs_atomic_dir_abort(&out);
    return -1;
}

int marlhf_vocab_size(const marlhf_model *model) { return model ? model->text.model.config.vocab_size : -1; }

int marlhf_tokenize(const marlhf_model *model, const char *text, int add_special, int *ids, int capacity) {
    err_clear();
    if (!model || !text) return err_set("marlhf_tokenize: model and text must not be NULL");
    if (capacity < 0 || (capacity > 0 && !ids)) return err_set("marlhf_tokenize: ids must hold capacity (%d) ids", capacity);
    int *all = NULL, count = 0;
    if (tokenizer_encode(model->text.tokenizer, text, strlen(text), add_special != 0, &all, &count) != 0) return -1;
    if (capacity > 0) memcpy(ids, all, (size_t)(count < capacity ? count : capacity) * sizeof(int));
    free(all);
    return count;
}

char *marlhf_detokenize(const marlhf_model *model, const int *ids, int count, int skip_special) {
    err_clear();
    if (!model || count < 0 || (count > 0 && !ids)) {
        err_set("marlhf_detokenize: model and count ids must be given");
        return NULL;
    }
    const int vocab = model->text.model.config.vocab_size;
    for (int i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            err_set("marlhf_detokenize: ids[%d] = %d is not a token id (vocabulary %d)", i, ids[i], vocab);
            return NULL;
        }
    return tokenizer_decode(model->text.tokenizer, ids, count, skip_special != 0);
}

// ---- generation ---------------------------------------------------------------------------

marlhf_generate_params marlhf_generate_default_params(void) {
    return (marlhf_generate_params){
        .max_new_tokens = 256, .temperature = 0.7f, .top_k = 50, .top_p = 1.0f, .seed = 1234};
}

static int require_policy(const marlhf_model *model, const char *function) {
    if (!model) return err_set("%s: model must not be NULL", function);
    if (model->kind != MARLHF_POLICY) return err_set("%s: needs a policy (a causal LM), not a reward model", function);
    return 0;
}

static int check_generate_params(const marlhf_generate_params *p) {
    const char *f = "marlhf_generate";
    if (p->max_new_tokens < 1 || p->max_new_tokens > 1 << 20)
        return err_set("%s: max_new_tokens must be in [1, 1048576], got %d", f, p->max_new_tokens);
    if (p->min_new_tokens < 0 || p->min_new_tokens > p->max_new_tokens)
        return err_set("%s: min_new_tokens must be in [0, max_new_tokens], got %d", f, p->min_new_tokens);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return err_set("%s: temperature must be >= 0, got %g", f, p->temperature);
    if (p->top_k < 0) return err_set("%s: top_k must be >= 0, got %d", f, p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return err_set("%s: top_p must be in (0, 1], got %g", f, p->top_p);
    return 0;
}

// The token ids of one prompt, as `marlhf generate` makes them (chat template or plain text).
static int prompt_ids(TextModel *tm, const char *prompt, const marlhf_generate_params *p, int **ids, int *length) {
    if (p->chat) {
        if (!tm->has_chat)
            return err_set("marlhf_generate: chat needs a chat template; the model has none (set chat_template when loading)");
        ChatMessage messages[2];
        int n = 0;
        if (p->system) messages[n++] = (ChatMessage){.role = "system", .content = p->system};
        messages[n++] = (ChatMessage){.role = "user", .content = prompt};
        if (text_model_chat_ids(tm, messages, n, ids, length) != 0) return -1;
    } else if (text_model_text_ids(tm, prompt, ids, length) != 0) {
        return -1;
    }
    if (*length == 0) {
        free(*ids);
        *ids = NULL;
        return err_set("marlhf_generate: the prompt is empty after tokenization");
    }
    // An answer needs room in the model's context (generation stops a row there).
    const int context = tm->model.config.max_position_embeddings;
    if (*length >= context) {
        free(*ids);
        *ids = NULL;
        return err_set("marlhf_generate: the prompt of %d tokens does not fit the model's context of %d tokens with an "
                       "answer", *length, context);
    }
    return 0;
}

int marlhf_generate_batch(marlhf_model *policy, const char *const *prompts, int count,
                          const marlhf_generate_params *params, char **responses) {
    err_clear();
    if (require_policy(policy, "marlhf_generate") != 0) return -1;
    if (!prompts || !params || !responses || count < 1)
        return err_set("marlhf_generate: prompts, params, responses and a count of at least 1 are needed");
    for (int i = 0; i < count; i++)
        if (!prompts[i]) return err_set("marlhf_generate: prompts[%d] is NULL", i);
    if (check_generate_params(params) != 0) return -1;
    TextModel *tm = &policy->text;
    int **ids = xcalloc((size_t)count, sizeof(int *)), *lengths = xcalloc((size_t)count, sizeof(int));
    for (int i = 0; i < count; i++)
        if (prompt_ids(tm, prompts[i], params, &ids[i], &lengths[i]) != 0) {
            const int failed = i;
            for (int j = 0; j < failed; j++) free(ids[j]);
            free(ids), free(lengths);
            return err_set("%s (prompts[%d])", err_msg(), failed);
        }
    GenerateOptions options = {
        .sampler = {.temperature = params->temperature, .top_k = params->top_k, .top_p = params->top_p},
        .max_new_tokens = params->max_new_tokens,
        .min_new_tokens = params->min_new_tokens,
        .seed = params->seed,
        .stop_tokens = tm->stop_tokens,
        .num_stop_tokens = tm->num_stop_tokens,
        .pad_token = tokenizer_pad_id(tm->tokenizer) >= 0 ? tokenizer_pad_id(tm->tokenizer) : 0,
    };
    // Rows in chunks of 16 (memory), each keyed by its index: the same stream as the i-th
    // prompt of `marlhf generate --seed S`, whatever the chunking.
    enum { CHUNK = 16 };
    uint64_t row_ids[CHUNK];
    GeneratedRow rows[CHUNK];
    for (int first = 0; first < count; first += CHUNK) {
        const int B = count - first < CHUNK ? count - first : CHUNK;
        for (int b = 0; b < B; b++) row_ids[b] = (uint64_t)(first + b);
        generate(&tm->model, (const int *const *)(ids + first), lengths + first, row_ids, B, &options, rows, NULL);
        for (int b = 0; b < B; b++) {
            const GeneratedRow *row = &rows[b];
            const int kept = row->stop == STOP_TOKEN && row->length > 0 ? row->length - 1 : row->length;
            responses[first + b] = tokenizer_decode(tm->tokenizer, row->tokens, kept, true);
            generated_row_free(&rows[b]);
        }
    }
    for (int i = 0; i < count; i++) free(ids[i]);
    free(ids), free(lengths);
    return 0;
}

char *marlhf_generate(marlhf_model *policy, const char *prompt, const marlhf_generate_params *params) {
    char *response = NULL;
    const char *prompts[1] = {prompt};
    if (!prompt) {
        err_set("marlhf_generate: prompt must not be NULL");
        return NULL;
    }
    return marlhf_generate_batch(policy, prompts, 1, params, &response) == 0 ? response : NULL;
}

// ---- scoring ------------------------------------------------------------------------------

// prompt + response + EOS as the training commands tokenize an example; an error when it
// does not fit the model's context.
static int tokenize_scored(const TextModel *tm, const char *function, const char *prompt, const char *response,
                           TokenizedExamples *rows) {
    if (!prompt || !response) return err_set("%s: prompt and response must not be NULL", function);
    const int context = tm->model.config.max_position_embeddings > 0 ? tm->model.config.max_position_embeddings : INT_MAX;
    memset(rows, 0, sizeof *rows);
    tokenized_examples_alloc(rows, 1);
    rows->count = 1;
    bool truncated = false;
    tokenize_example(tm->tokenizer, prompt, response, context, &rows->ids[0], &rows->lengths[0], &rows->prompt_lengths[0],
                     &truncated);
    if (truncated) {
        tokenized_examples_free(rows);
        return err_set("%s: prompt + response are longer than the model's context of %d tokens", function, context);
    }
    if (rows->lengths[0] - rows->prompt_lengths[0] < 1 || rows->lengths[0] < 2) {
        tokenized_examples_free(rows);
        return err_set("%s: nothing to score (the prompt tokenizes to no token)", function);
    }
    return 0;
}

int marlhf_logprob(marlhf_model *policy, const char *prompt, const char *response, double *sum, int *tokens) {
    err_clear();
    if (require_policy(policy, "marlhf_logprob") != 0) return -1;
    if (!sum) return err_set("marlhf_logprob: sum must not be NULL");
    TokenizedExamples rows;
    if (tokenize_scored(&policy->text, "marlhf_logprob", prompt, response, &rows) != 0) return -1;
    const long which = 0;
    response_logps(&policy->text.model, &rows, &which, 1, training_pad_id(policy->text.tokenizer), sum);
    if (tokens) *tokens = rows.lengths[0] - rows.prompt_lengths[0];
    tokenized_examples_free(&rows);
    return 0;
}

int marlhf_reward(marlhf_model *reward_model, const char *prompt, const char *response, float *score) {
    err_clear();
    if (!reward_model || reward_model->kind != MARLHF_REWARD_MODEL)
        return err_set("marlhf_reward: needs a model loaded as MARLHF_REWARD_MODEL");
    if (!score) return err_set("marlhf_reward: score must not be NULL");
    TokenizedExamples rows;
    if (tokenize_scored(&reward_model->text, "marlhf_reward", prompt, response, &rows) != 0) return -1;
    rm_score_rows(&reward_model->text.model, rows.ids, rows.lengths, 1, score);
    tokenized_examples_free(&rows);
    return 0;
}

// ---- on-device preference learning ---------------------------------------------------------

marlhf_trainer_params marlhf_trainer_default_params(void) {
    return (marlhf_trainer_params){.loss = "sigmoid", .beta = 0.1, .simpo_gamma = 0.5, .desirable_weight = 1.0,
                                   .undesirable_weight = 1.0, .lora_rank = 8, .lora_modules = "all-linear",
                                   .learning_rate = 5e-5, .max_grad_norm = 1.0, .max_seq_len = 512, .micro_batch = 4,
                                   .seed = 1234, .f_alpha = 0.5, .cpo_alpha = -1};
}

// The losses' and the adapters' settings from checked params.
typedef struct {
    DpoLossOptions dpo;
    KtoLossOptions kto;
    LoraConfig lora;
} TrainerSettings;

static int check_trainer_params(const marlhf_trainer_params *p, const char *f, TrainerSettings *out) {
    memset(out, 0, sizeof *out);
    DpoLossOptions *loss = &out->dpo;
    LoraConfig *lora = &out->lora;
    if (!p->loss || dpo_loss_from_name(p->loss, &loss->loss) != 0)
        return err_set("%s: loss must be one of " DPO_LOSS_NAMES ", got '%s'", f, p->loss ? p->loss : "(null)");
    if (!(p->beta > 0) || !isfinite(p->beta)) return err_set("%s: beta must be positive, got %g", f, p->beta);
    if (!(p->label_smoothing >= 0 && p->label_smoothing < 0.5))
        return err_set("%s: label_smoothing must be in [0, 0.5), got %g", f, p->label_smoothing);
    if (p->label_smoothing > 0 && !dpo_loss_uses_label_smoothing(loss->loss))
        return err_set("%s: label_smoothing applies to loss sigmoid, robust, exo, aot, aot-unpaired, cpo, simpo and "
                       "alphapo only",
                       f);
    if (loss->loss == DPO_LOSS_EXO && !(p->label_smoothing > 0))
        return err_set("%s: loss exo needs label_smoothing above 0", f);
    if (!(p->ld_alpha >= 0 && p->ld_alpha <= 1)) return err_set("%s: ld_alpha must be in [0, 1], got %g", f, p->ld_alpha);
    if (p->ld_alpha > 0 && p->ld_alpha < 1 && p->sft_weight > 0)
        return err_set("%s: ld_alpha with sft_weight is not supported", f);
    if (p->f_divergence && f_divergence_from_name(p->f_divergence, &loss->f_divergence) != 0)
        return err_set("%s: f_divergence must be reverse-kl, forward-kl, js or alpha, got '%s'", f, p->f_divergence);
    if (loss->f_divergence != F_DIVERGENCE_REVERSE_KL && !dpo_loss_takes_f_divergence(loss->loss))
        return err_set("%s: loss %s has no f-divergence form", f, p->loss);
    if (!isfinite(p->f_alpha)) return err_set("%s: f_alpha must be finite, got %g", f, p->f_alpha);
    if (!(p->discopop_tau >= 0) || !isfinite(p->discopop_tau))
        return err_set("%s: discopop_tau must be >= 0 (0: 0.05), got %g", f, p->discopop_tau);
    if (!isfinite(p->simpo_gamma)) return err_set("%s: simpo_gamma must be finite, got %g", f, p->simpo_gamma);
    if (!(p->sft_weight >= 0) || !isfinite(p->sft_weight)) return err_set("%s: sft_weight must be >= 0, got %g", f, p->sft_weight);
    if (!(p->desirable_weight > 0) || !isfinite(p->desirable_weight))
        return err_set("%s: desirable_weight must be positive, got %g", f, p->desirable_weight);
    if (!(p->undesirable_weight > 0) || !isfinite(p->undesirable_weight))
        return err_set("%s: undesirable_weight must be positive, got %g", f, p->undesirable_weight);
    if (p->lora_rank < 1) return err_set("%s: lora_rank must be at least 1, got %d", f, p->lora_rank);
    if (!(p->lora_alpha >= 0) || !isfinite(p->lora_alpha)) return err_set("%s: lora_alpha must be >= 0, got %g", f, p->lora_alpha);
    if (!(p->learning_rate > 0) || !isfinite(p->learning_rate))
        return err_set("%s: learning_rate must be positive, got %g", f, p->learning_rate);
    if (!(p->weight_decay >= 0) || !isfinite(p->weight_decay)) return err_set("%s: weight_decay must be >= 0, got %g", f, p->weight_decay);
    if (!(p->max_grad_norm >= 0) || !isfinite(p->max_grad_norm))
        return err_set("%s: max_grad_norm must be >= 0, got %g", f, p->max_grad_norm);
    if (p->max_seq_len < 2) return err_set("%s: max_seq_len must be at least 2, got %d", f, p->max_seq_len);
    if (p->micro_batch < 1) return err_set("%s: micro_batch must be at least 1, got %d", f, p->micro_batch);
    loss->beta = p->beta;
    loss->label_smoothing = p->label_smoothing;
    loss->simpo_gamma = p->simpo_gamma;
    loss->discopop_tau = p->discopop_tau > 0 ? p->discopop_tau : 0.05;
    loss->f_alpha = p->f_alpha;
    loss->ld_alpha = p->ld_alpha;
    loss->sft_weight = p->sft_weight;
    if (!isfinite(p->cpo_alpha)) return err_set("%s: cpo_alpha must be finite, got %g", f, p->cpo_alpha);
    if (p->cpo_alpha > 0 && !dpo_loss_is_cpo_trainer(loss->loss))
        return err_set("%s: cpo_alpha applies to loss cpo, cpo-hinge, cpo-ipo and simpo only", f);
    // TRL's loss_type "alphapo" is "simpo" with cpo_alpha set to 0 whatever was given.
    if (loss->loss == DPO_LOSS_ALPHAPO && p->cpo_alpha > 0)
        return err_set("%s: cpo_alpha: loss alphapo is SimPO with cpo_alpha 0 (for AlphaPO with behaviour cloning: loss "
                       "simpo, alphapo_alpha and cpo_alpha)",
                       f);
    if (dpo_loss_is_cpo_trainer(loss->loss)) {
        if (p->sft_weight > 0) return err_set("%s: loss %s takes cpo_alpha, not sft_weight", f, p->loss);
        // TRL's cpo_alpha: the sft term, the mean -log-prob over the step's chosen tokens.
        const bool simpo_like = loss->loss == DPO_LOSS_SIMPO || loss->loss == DPO_LOSS_ALPHAPO;
        const double weight = p->cpo_alpha >= 0 ? p->cpo_alpha : (simpo_like ? 0.0 : 1.0);
        if (weight > 0) loss->sft_term = true, loss->sft_term_weight = weight;
    }
    if (!isfinite(p->alphapo_alpha)) return err_set("%s: alphapo_alpha must be finite, got %g", f, p->alphapo_alpha);
    if (p->alphapo_alpha != 0 && !dpo_loss_is_cpo_trainer(loss->loss))
        return err_set("%s: alphapo_alpha applies to loss alphapo, cpo, cpo-hinge, cpo-ipo and simpo only", f);
    if (loss->loss == DPO_LOSS_ALPHAPO && p->alphapo_alpha == 0)
        return err_set("%s: loss alphapo needs alphapo_alpha non-zero (with 0 it is loss simpo)", f);
    loss->alphapo_alpha = p->alphapo_alpha;
    out->kto = (KtoLossOptions){.beta = p->beta, .desirable_weight = p->desirable_weight,
                                .undesirable_weight = p->undesirable_weight};
    // BCO's running reward mean would be trainer state the checkpoints do not carry.
    if (p->kto_loss && (kto_loss_from_name(p->kto_loss, &out->kto.loss) != 0 || out->kto.loss == KTO_LOSS_BCO))
        return err_set("%s: kto_loss must be kto or apo-zero-unpaired, got '%s'", f, p->kto_loss);
    lora->rank = p->lora_rank;
    lora->alpha = p->lora_alpha > 0 ? (float)p->lora_alpha : (float)p->lora_rank;
    lora->rslora = p->lora_rslora != 0;
    lora->dora = p->use_dora != 0;
    if (lora_parse_targets(p->lora_modules ? p->lora_modules : "all-linear", &lora->targets) != 0)
        return err_set("%s: lora_modules: %s", f, err_msg());
    // The command's selection (lora_cli_selection): a target_modules regex, layers_to_transform.
    if (p->lora_modules_regex) {
        if (p->lora_modules && strcmp(p->lora_modules, "all-linear"))
            return err_set("%s: lora_modules_regex chooses the modules itself: leave lora_modules \"all-linear\"", f);
        if (lora_set_target_regex(lora, p->lora_modules_regex) != 0)
            return err_set("%s: lora_modules_regex %s", f, err_msg());
    }
    if (p->lora_layers && lora_parse_layers(lora, p->lora_layers) != 0)
        return err_set("%s: lora_layers %s", f, err_msg());
    if (lora_check_selection(lora) != 0)
        return err_set("%s: lora_%s: %s", f, p->lora_modules_regex ? "modules_regex" : "layers", err_msg());
    // The command's parsing and checks (lora_cli_finish): "KEY=VALUE,..." or a JSON object.
    const char *pattern_text[2] = {p->lora_rank_pattern, p->lora_alpha_pattern};
    for (int k = 0; k < 2; k++) {
        if (!pattern_text[k]) continue;
        char what[96];
        snprintf(what, sizeof what, "%s: lora_%s_pattern", f, k == 0 ? "rank" : "alpha");
        if (lora_parse_patterns(pattern_text[k], what, k == 0 ? lora->rank_pattern : lora->alpha_pattern,
                                k == 0 ? &lora->rank_patterns : &lora->alpha_patterns) != 0)
            return -1;
    }
    // Its messages begin "rank_pattern: " or "alpha_pattern: ".
    if (lora_check_patterns(lora) != 0) return err_set("%s: lora_%s", f, err_msg());
    if (!(p->lora_dropout >= 0 && p->lora_dropout < 1))
        return err_set("%s: lora_dropout must be in [0, 1), got %g", f, p->lora_dropout);
    lora->dropout = p->lora_dropout;
    return 0;
}

// The checks before a trainer may be attached to `policy`.
static int check_trainer_target(const marlhf_model *policy, const marlhf_trainer_params *params, const char *function) {
    if (require_policy(policy, function) != 0) return -1;
    if (!params) return err_set("%s: params must not be NULL", function);
    if (policy->trainer) return err_set("%s: the model already has a trainer (free it first)", function);
    if (policy->text.model.lora.rank > 0)
        return err_set("%s: the model already has LoRA adapters; load its base without lora_adapter (its frozen "
                       "weights are the DPO reference)", function);
    return 0;
}

static marlhf_trainer *attach_trainer(marlhf_model *policy, const marlhf_trainer_params *params,
                                      const TrainerSettings *settings) {
    Model *model = &policy->text.model;
    model_enable_grad(model);
    marlhf_trainer *trainer = xcalloc(1, sizeof *trainer);
    trainer->owner = policy;
    trainer->dpo = settings->dpo;
    trainer->kto = settings->kto;
    trainer->learning_rate = params->learning_rate;
    trainer->max_grad_norm = params->max_grad_norm;
    trainer->max_seq_len = params->max_seq_len;
    trainer->micro_batch = params->micro_batch;
    trainer->seed = params->seed;
    adamw_init(&trainer->optimizer, model, adamw_default_config((float)params->weight_decay));
    policy->trainer = trainer;
    return trainer;
}

marlhf_trainer *marlhf_trainer_new(marlhf_model *policy, const marlhf_trainer_params *params) {
    err_clear();
    if (check_trainer_target(policy, params, "marlhf_trainer_new") != 0) return NULL;
    TrainerSettings settings;
    if (check_trainer_params(params, "marlhf_trainer_new", &settings) != 0) return NULL;
    Model *model = &policy->text.model;
    // The activations were sized for a model without adapters and gradients.
    model_release_activations(model);
    if (model_add_lora(model, &settings.lora, false, params->seed) != 0) return NULL;
    return attach_trainer(policy, params, &settings);
}

int marlhf_trainer_save(marlhf_trainer *trainer, const char *run_dir) {
    err_clear();
    if (!trainer || !run_dir || !*run_dir) return err_set("marlhf_trainer_save: a trainer and run_dir must be given");
    const TextModel *tm = &trainer->owner->text;
    json_t *state = json_object();
    json_object_set_new(state, "task", json_string("api-trainer"));
    json_object_set_new(state, "step", json_integer(trainer->step));
    json_object_set_new(state, "lora_rank", json_integer(tm->model.lora.rank));
    checkpoint_record_batch_invariant(state, tm->model.ops);
    CheckpointModel entry = {"", &tm->model, &trainer->optimizer};
    int rc = checkpoint_save(run_dir, trainer->step, &entry, 1, tm->tokenizer, state, 2);
    json_decref(state);
    return rc;
}

marlhf_trainer *marlhf_trainer_resume(marlhf_model *policy, const marlhf_trainer_params *params, const char *run_dir) {
    err_clear();
    const char *f = "marlhf_trainer_resume";
    if (check_trainer_target(policy, params, f) != 0) return NULL;
    if (!run_dir) {
        err_set("%s: run_dir must not be NULL", f);
        return NULL;
    }
    TrainerSettings settings;
    if (check_trainer_params(params, f, &settings) != 0) return NULL;
    const LoraConfig lora = settings.lora;
    LoraConfig saved;
    char *checkpoint = checkpoint_latest(run_dir);
    if (!checkpoint) {
        err_set("%s: no checkpoint in %s", f, run_dir);
        return NULL;
    }
    json_t *state = NULL;
    int rc = checkpoint_load_state(checkpoint, &state);
    const char *task = rc == 0 ? json_string_value(json_object_get(state, "task")) : NULL;
    if (rc == 0 && (!task || strcmp(task, "api-trainer") != 0))
        rc = err_set("%s: %s was not written by marlhf_trainer_save", f, checkpoint);
    const long step = rc == 0 ? (long)json_integer_value(json_object_get(state, "step")) : 0;
    if (rc == 0 && checkpoint_check_batch_invariant(state, policy->text.model.ops, checkpoint) != 0)
        rc = err_set("%s: %s", f, err_msg());
    json_decref(state);
    if (rc == 0) rc = lora_read_adapter_config(checkpoint, &saved);
    // The first field of params whose adapters differ from the checkpoint's, if any.
    const char *differs = rc != 0                                     ? NULL
                          : saved.rank != lora.rank                   ? "lora_rank"
                          : saved.alpha != lora.alpha                 ? "lora_alpha"
                          : saved.targets != lora.targets             ? "lora_modules"
                          : saved.rslora != lora.rslora               ? "lora_rslora"
                          : saved.dora != lora.dora                   ? "use_dora"
                          : !lora_patterns_equal(&saved, &lora)       ? "lora_rank_pattern or lora_alpha_pattern"
                          : !lora_selection_equal(&saved, &lora)      ? "lora_modules_regex or lora_layers"
                          : fabs(saved.dropout - lora.dropout) > 1e-9 ? "lora_dropout"
                                                                      : NULL;
    if (differs)
        rc = err_set("%s: the checkpoint's adapters (rank %d, alpha %g%s%s, dropout %g) differ from params' %s (%s)", f,
                     saved.rank, saved.alpha, saved.rslora ? ", rsLoRA" : "", saved.dora ? ", DoRA" : "", saved.dropout,
                     differs, checkpoint);
    if (rc != 0) {
        free(checkpoint);
        return NULL;
    }
    // From here the model changes; a failure takes the adapters off again.
    Model *model = &policy->text.model;
    model_release_activations(model);
    rc = model_add_lora(model, &lora, false, params->seed);
    if (rc == 0) rc = lora_read_adapter(model, checkpoint);
    marlhf_trainer *trainer = NULL;
    if (rc == 0) {
        trainer = attach_trainer(policy, params, &settings);
        rc = checkpoint_load_optimizer(checkpoint, "", model, &trainer->optimizer);
        if (rc == 0 && trainer->optimizer.step != step)
            rc = err_set("%s: optimizer state at step %ld, trainer state at %ld (%s)", f, trainer->optimizer.step, step,
                         checkpoint);
        trainer->step = step;
    }
    if (rc != 0) { // the message stays: freeing sets none
        marlhf_trainer_free(trainer);
        model_remove_lora(model);
        free(checkpoint);
        return NULL;
    }
    free(checkpoint);
    return trainer;
}

// One optimizer step of `train` over its n examples (micro-batches of trainer->micro_batch,
// the mean loss): gradients, clipping, AdamW. *loss, metrics[4] (sums) and *norm report it.
// A non-finite loss or gradient changes nothing.
static int optimizer_step(marlhf_trainer *trainer, const TrainTask *train, long n, const char *function, double *loss,
                          double metrics[4], double *norm) {
    Model *model = &trainer->owner->text.model;
    model_zero_grad(model);
    *loss = 0.0;
    for (int k = 0; k < 4; k++) metrics[k] = 0.0;
    long *which = xmalloc((size_t)trainer->micro_batch * sizeof(long));
    for (long first = 0; first < n; first += trainer->micro_batch) {
        int micro = (int)(n - first < trainer->micro_batch ? n - first : trainer->micro_batch);
        for (int i = 0; i < micro; i++) which[i] = first + i;
        MicroStepResult result = {0};
        // LoRA dropout's masks: the trainer's steps are the command's epochs (train/loop.c).
        model_training_pass_begin(model, trainer->seed, (uint64_t)trainer->step, (uint64_t)(first / trainer->micro_batch));
        train->micro_step(train->context, model, which, micro, 1.0 / (double)n, &result);
        model_training_pass_end(model);
        *loss += result.loss_sum;
        for (int k = 0; k < 4; k++) metrics[k] += result.metric_sums[k];
    }
    free(which);
    *norm = grad_global_norm(model);
    if (!isfinite(*loss) || !isfinite(*norm)) {
        model_zero_grad(model);
        return err_set("%s: the loss (%g) or gradient norm (%g) is not finite; the adapters were not changed", function,
                       *loss / (double)n, *norm);
    }
    adamw_step(&trainer->optimizer, model, (float)trainer->learning_rate,
               grad_clip_coefficient(*norm, (float)trainer->max_grad_norm));
    trainer->step++;
    return 0;
}

int marlhf_dpo_step(marlhf_trainer *trainer, const marlhf_preference *pairs, int count, marlhf_dpo_stats *stats) {
    err_clear();
    if (!trainer || !pairs || count < 1) return err_set("marlhf_dpo_step: a trainer and at least one pair are needed");
    const char **prompts = xmalloc((size_t)count * sizeof(char *));
    const char **responses = xmalloc((size_t)2 * count * sizeof(char *));
    for (int i = 0; i < count; i++) {
        if (!pairs[i].prompt || !pairs[i].chosen || !pairs[i].rejected) {
            free(prompts), free(responses);
            return err_set("marlhf_dpo_step: pairs[%d] has a NULL prompt, chosen or rejected", i);
        }
        prompts[i] = pairs[i].prompt;
        responses[2 * i] = pairs[i].chosen, responses[2 * i + 1] = pairs[i].rejected;
    }
    TextModel *tm = &trainer->owner->text;
    Model *model = &tm->model;
    DpoTask task;
    int rc = dpo_task_init(&task, tm->tokenizer, prompts, responses, count, NULL, NULL, 0, trainer->max_seq_len,
                           &trainer->dpo);
    free(prompts), free(responses);
    if (rc != 0) {
        dpo_task_free(&task);
        return err_set("marlhf_dpo_step: no pair has a response token within max_seq_len %d", trainer->max_seq_len);
    }
    // The reference: the same frozen weights with the adapters switched off.
    if (dpo_loss_uses_reference(trainer->dpo.loss)) {
        model->lora_enabled = false;
        dpo_task_compute_reference(&task, model);
        model->lora_enabled = true;
    }
    TrainTask train = dpo_train_task(&task);
    const long n = task.train_count;
    double loss, metrics[4], norm;
    rc = optimizer_step(trainer, &train, n, "marlhf_dpo_step", &loss, metrics, &norm);
    dpo_task_free(&task);
    if (rc != 0) return -1;
    if (stats) {
        *stats = (marlhf_dpo_stats){.step = trainer->step,
                                    .loss = loss / (double)n,
                                    .accuracy = metrics[0] / (double)n,
                                    .margin = metrics[1] / (double)n,
                                    .chosen_reward = metrics[2] / (double)n,
                                    .rejected_reward = metrics[3] / (double)n,
                                    .grad_norm = norm,
                                    .pairs = (int)n};
    }
    return 0;
}

int marlhf_kto_step(marlhf_trainer *trainer, const marlhf_feedback *examples, int count, marlhf_kto_stats *stats) {
    err_clear();
    const bool baseline = !trainer || trainer->kto.loss == KTO_LOSS_KTO; // apo-zero-unpaired has none
    if (!trainer || !examples || count < (baseline ? 2 : 1))
        return err_set(baseline ? "marlhf_kto_step: a trainer and at least two examples are needed (the KL baseline "
                                  "pairs each prompt with another example's completion)"
                                : "marlhf_kto_step: a trainer and at least one example are needed");
    const char **prompts = xmalloc((size_t)count * sizeof(char *)), **completions = xmalloc((size_t)count * sizeof(char *));
    bool *desirable = xmalloc((size_t)count * sizeof(bool));
    for (int i = 0; i < count; i++) {
        if (!examples[i].prompt || !examples[i].completion) {
            free(prompts), free(completions), free(desirable);
            return err_set("marlhf_kto_step: examples[%d] has a NULL prompt or completion", i);
        }
        prompts[i] = examples[i].prompt, completions[i] = examples[i].completion;
        desirable[i] = examples[i].desirable != 0;
    }
    TextModel *tm = &trainer->owner->text;
    Model *model = &tm->model;
    KtoTask task;
    int rc = kto_task_init(&task, tm->tokenizer, prompts, completions, desirable, count, NULL, NULL, NULL, 0,
                           trainer->max_seq_len, &trainer->kto);
    free(prompts), free(completions), free(desirable);
    if (rc != 0) {
        kto_task_free(&task);
        return err_set("marlhf_kto_step: too few examples have a completion token within max_seq_len %d",
                       trainer->max_seq_len);
    }
    model->lora_enabled = false; // the reference: the frozen weights alone
    kto_task_compute_reference(&task, model);
    model->lora_enabled = true;
    TrainTask train = kto_train_task(&task);
    const long n = task.train.count;
    double loss, metrics[4], norm;
    rc = optimizer_step(trainer, &train, n, "marlhf_kto_step", &loss, metrics, &norm);
    kto_task_free(&task);
    if (rc != 0) return -1;
    if (stats) {
        *stats = (marlhf_kto_stats){.step = trainer->step,
                                    .loss = loss / (double)n,
                                    .kl = baseline ? metrics[0] / (double)n : NAN,
                                    .accuracy = metrics[baseline ? 1 : 0] / (double)n,
                                    .grad_norm = norm,
                                    .examples = (int)n};
    }
    return 0;
}

void marlhf_trainer_free(marlhf_trainer *trainer) {
    if (!trainer) return;
    adamw_free(&trainer->optimizer);
    trainer->owner->trainer = NULL;
    free(trainer);
}
