// marlhf infer: inference with rewards on validation prompts (the released
// inference_with_rewards.py, spec §9.1, without its bugs): N prompts of a dataset
// (shuffled with a seed, or in file order), a response from the policy for each, and the
// reward model's score of prompt + response, written as JSONL {prompt, response, reward}.
// With --ref-scores nothing is generated: the dataset's own chosen and rejected responses
// are scored ({prompt, response, reward, rejected_response, rejected_reward}).
// With --best-of N each prompt is answered N times (the N rows share the prompt's prefill)
// and the row is the best-scored answer, with every candidate's reward (candidate_rewards)
// and the worst answer (rejected_response, rejected_reward): best-of-N sampling, and data
// for rejection-sampling fine-tuning (`marlhf sft` reads {prompt, response}) or for DPO.
//
// Differences from the released script, on purpose: the output goes to
// results/<dataset>/temperature=<T>/<model>.jsonl (the script runs "results" and the
// dataset name together); responses are scored on the generated token ids (no decode →
// re-encode round trip); one process holds both models (no two-GPU requirement); the
// shuffle is marlhf's seeded permutation (train_epoch_order), not Hugging Face's.
//
// Under mpirun (dist/dist.h) rank r takes batches r, r + W, ... of the prompts (the same
// batches one process would form, so the same responses and scores) and rank 0 gathers
// the results and writes the file.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/sampler_options.h"
#include "model/quantize.h"
#include "gen/text_model.h"
#include "core/check.h"
#include "core/progress.h"
#include "data/chat_data.h"
#include "data/column_renames.h"
#include "data/dataset.h"
#include "dist/dist.h"
#include "eval/lexicon.h"
#include "gen/generate.h"
#include "io/fs.h"
#include "model/weights_io.h"
#include "rl/experience.h"
#include "train/loop.h"

// "runs/x/ppo/final/actor" -> "ppo"-ish names are unhelpful: the model's name is the first
// path component that is not final/actor/checkpoint-N, counting from the end.
static char *model_name(const char *path) {
    char *copy = xstrdup(path);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *name = NULL;
    for (;;) {
        char *slash = strrchr(copy, '/');
        const char *last = slash ? slash + 1 : copy;
        bool generic = !strcmp(last, "final") || !strcmp(last, "actor") || !strcmp(last, "actor_ema") ||
                       !strncmp(last, "checkpoint-", 11);
        if (!generic || !slash) {
            name = xstrdup(last);
            break;
        }
        *slash = '\0';
    }
    char *dot = strrchr(name, '.'); // models/x.gguf -> x
    if (dot && !strcmp(dot, ".gguf")) *dot = '\0';
    free(copy);
    return name;
}

static char *dataset_name(const char *path) {
    const char *slash = strrchr(path, '/');
    char *name = xstrdup(slash ? slash + 1 : path);
    char *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = '\0';
    return name;
}

// Scores prompt + response token sequences with the reward model, `micro` rows at a time.
static void score_all(Model *rm, const int *const *prompts, const int *prompt_lengths, int **responses,
                      const int *response_lengths, long count, int micro, float *scores) {
    Sample *samples = xcalloc(count, sizeof(Sample));
    Sample **pointers = xmalloc(count * sizeof(Sample *));
    for (long i = 0; i < count; i++) {
        samples[i].prompt = prompts[i];
        samples[i].prompt_length = prompt_lengths[i];
        samples[i].response = responses[i];
        samples[i].response_length = response_lengths[i];
        pointers[i] = &samples[i];
    }
    experience_scores(rm, pointers, (int)count, micro, scores);
    free(pointers), free(samples); // the token arrays belong to the caller
}

// A dataset's own response as the reward model trained on it (train/sft.h's
// tokenize_example): its tokens, then EOS, where the score is read; a generated response
// that ended ends with EOS the same way.
static void reference_response_ids(const Tokenizer *tokenizer, const char *text, int **ids, int *length) {
    tokenizer_encode(tokenizer, text, strlen(text), false, ids, length);
    const int eos = tokenizer_eos_id(tokenizer);
    if (eos < 0) return;
    *ids = xrealloc(*ids, (size_t)(*length + 1) * sizeof(int));
    (*ids)[(*length)++] = eos;
}

// Under mpirun: every rank ends with every response and score (each was made by one rank;
// the others hold NULL / 0 there). Lengths, scores and tokens are summed with zeros.
static void gather_responses(int **responses, int *lengths, float *scores, long n) {
    if (dist_world_size() <= 1) return;
    int *owned = xcalloc(n, sizeof(int));
    for (long i = 0; i < n; i++) owned[i] = responses[i] != NULL;
    dist_sum_ints(lengths, n);
    dist_sum_floats(scores, n);
    long total = 0;
    for (long i = 0; i < n; i++) total += lengths[i];
    int *tokens = xcalloc(total + 1, sizeof(int));
    long offset = 0;
    for (long i = 0; i < n; i++) {
        if (owned[i]) memcpy(tokens + offset, responses[i], (size_t)lengths[i] * sizeof(int));
        offset += lengths[i];
    }
    dist_sum_ints(tokens, total);
    offset = 0;
    for (long i = 0; i < n; i++) {
        free(responses[i]);
        responses[i] = xmalloc((size_t)(lengths[i] + 1) * sizeof(int));
        memcpy(responses[i], tokens + offset, (size_t)lengths[i] * sizeof(int));
        offset += lengths[i];
    }
    free(tokens), free(owned);
}

// A generated response as text, without its stop tokens at the end.
static char *visible_text(const TextModel *policy, const Tokenizer *tokenizer, const int *tokens, int length) {
    int visible = length;
    for (int j = 0; j < policy->num_stop_tokens && visible > 0; j++)
        if (tokens[visible - 1] == policy->stop_tokens[j]) visible--, j = -1;
    return tokenizer_decode(tokenizer, tokens, visible, true);
}

int cmd_infer(int argc, char **argv) {
    char *model_path = NULL, *reward_path = NULL, *data_path = NULL, *output = NULL, *format_name = "auto";
    char *device = "cpu", *lexicon_path = NULL;
    const char *quantize = NULL /* quantize_default */, *reward_quantize = "none", *kv_cache = "f32";
    long count = 2000, batch = 16, max_new = 512, min_new = 0, seed = 1234, max_prompt = 1024, threads = 0, best_of = 1;
    double temperature = 0.8, top_p = 1.0;
    long top_k = 50;
    bool ref_scores = false, no_shuffle = false, overwrite = false, quiet = false;
    char *lora_adapter = NULL, *chat_template = NULL, *rename_columns = NULL;
    bool batch_invariant = false;
    SamplerExtrasCli extras = SAMPLER_EXTRAS_CLI_DEFAULTS;
    Option options[] = {
        {"model", "model_name_or_path", OPT_STRING, &model_path, "the policy (folder or .gguf); not needed with --ref-scores", false, false},
        {"reward-model", "reward_model", OPT_STRING, &reward_path, "the reward model scoring prompt + response", true, false},
        {"data", "data_path dataset", OPT_STRING, &data_path, "validation prompts (any supported schema)", true, false},
        {"data-format", "data_format", OPT_STRING, &format_name, "auto, tldr, hh, webgpt, apps, sft, pairs, ranked, prompts, unpaired", false, false},
        {"rename-columns", "rename_columns", OPT_STRING, &rename_columns,
         "old=new,...: the data's fields renamed before its format is read, e.g. question=prompt", false, false},
        {"chat-template", "chat_template", OPT_STRING, &chat_template,
         "chat template (name or file) for conversational data (lists of messages); default: the model's own", false, false},
        {"count", "num_samples", OPT_INT, &count, "prompts used (the first after shuffling; 0: all)", false, false},
        {"no-shuffle", "no_shuffle", OPT_BOOL, &no_shuffle, "keep the file order (the released script does for WebGPT)", false, false},
        {"seed", NULL, OPT_INT, &seed, "seed of the shuffle and of sampling", false, false},
        {"temperature", NULL, OPT_FLOAT, &temperature, "sampling temperature (0: greedy)", false, false},
        {"top-k", "top_k", OPT_INT, &top_k, "top-k (0: off)", false, false},
        {"top-p", "top_p", OPT_FLOAT, &top_p, "top-p (1: off)", false, false},
        SAMPLER_EXTRAS_OPTIONS(&extras),
        {"max-new-tokens", "max_new_tokens", OPT_INT, &max_new, "response length limit", false, false},
        {"min-new-tokens", "min_new_tokens", OPT_INT, &min_new,
         "no stop token before this many new tokens (Hugging Face's min_new_tokens; PPO's --min-new-tokens)", false, false},
        {"max-prompt-tokens", "max_prompt_len", OPT_INT, &max_prompt, "prompts are truncated to their last N tokens", false, false},
        {"batch-size", "batch_size", OPT_INT, &batch, "prompts generated and scored together", false, false},
        {"ref-scores", "ref_scores", OPT_BOOL, &ref_scores, "score the dataset's chosen and rejected responses instead of generating", false, false},
        {"best-of", "best_of num_return_sequences", OPT_INT, &best_of,
         "answer each prompt N times and keep the best-scored answer (the worst as rejected_response)", false, false},
        {"gold-lexicon", "gold_lexicon", OPT_STRING, &lexicon_path, "also write the gold lexicon score of each response", false, false},
        {"output", NULL, OPT_STRING, &output, "JSONL file (default results/<dataset>/temperature=<T>/<model>.jsonl)", false, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace an existing output file", false, false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter applied to --model (a marlhf model folder or a PEFT adapter folder)", false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"quantize", NULL, OPT_STRING, &quantize, QUANTIZE_OPTION_HELP, false, false},
        {"kv-cache", NULL, OPT_STRING, &kv_cache,
         "f32, f16 or q8_0: the policy's KV cache in half floats (half its memory) or in 8-bit blocks (about 0.28 of it): faster decoding of long contexts", false, false},
        {"reward-quantize", "reward_quantize", OPT_STRING, &reward_quantize,
         QUANTIZE_TYPES ": the reward model's weights in 16 to 2 bits (a half to about a twelfth of the memory; scores move by the quantization's error)",
         false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
        {"quiet", NULL, OPT_BOOL, &quiet, "no progress bar", false, false},
    };
    OptionSet set = {"infer", "Responses of a policy to validation prompts, scored by a reward model.",
                     "marlhf infer --model POLICY --reward-model RM --data FILE.jsonl [options]", options,
                     sizeof options / sizeof options[0], NULL, 0, 0};
    options_parse(&set, argc, argv);
    sampler_extras_check(&extras);
    cli_set_batch_invariant(&set, device);
    quantize = quantize_default(quantize, model_path);
    if (quantize_type_check(quantize, "--quantize") != 0) die_from_err();
    if (kv_cache_type_set(NULL, kv_cache, "--kv-cache") != 0) die_from_err();
    if (quantize_type_check(reward_quantize, "--reward-quantize") != 0) die_from_err();
    cli_set_threads(threads);
    const int rank = dist_rank(), world = dist_world_size();
    quiet = quiet || rank != 0;
    if (!ref_scores && !model_path) die_user("--model is required unless --ref-scores is given");
    if (count < 0 || batch < 1 || max_new < 1 || max_prompt < 1)
        die_user("--count must be >= 0; --batch-size, --max-new-tokens and --max-prompt-tokens >= 1");
    if (min_new < 0 || min_new > max_new) die_user("--min-new-tokens must be in [0, --max-new-tokens], got %ld", min_new);
    if (temperature < 0 || top_k < 0 || top_p <= 0 || top_p > 1) die_user("bad sampling options (--temperature, --top-k, --top-p)");
    if (best_of < 1 || best_of > 1024) die_user("--best-of must be in [1, 1024], got %ld", best_of);
    if (best_of > 1 && ref_scores) die_user("--best-of generates; --ref-scores scores the dataset's own responses");
    if (best_of > 1 && temperature == 0)
        die_user("--best-of %ld with --temperature 0: greedy decoding gives the same answer every time", best_of);

    DataFormat format = DATA_FORMAT_AUTO;
    if (strcmp(format_name, "auto") && data_format_parse(format_name, "--data-format", &format) != 0) die_from_err();
    Dataset data;
    ColumnRenames renames;
    if (column_renames_parse(rename_columns, "--rename-columns", &renames) != 0) die_from_err();
    if (dataset_load_with(&data, data_path, &(DatasetLoadOptions){.format = format, .renames = &renames}) != 0)
        die_from_err();
    column_renames_free(&renames);
    if (data.count == 0) die_user("no rows in %s", data_path);
    if (dataset_require_prompts(&data, "--data") != 0) die_from_err();
    long n = count == 0 || count > data.count ? data.count : count;
    long *order = xmalloc(data.count * sizeof(long));
    if (no_shuffle)
        for (long i = 0; i < data.count; i++) order[i] = i;
    else
        train_epoch_order((uint64_t)seed, 0, data.count, order);

    char *default_output = NULL;
    if (!output) {
        char *dname = dataset_name(data_path), *mname = ref_scores ? xstrdup("reference") : model_name(model_path);
        size_t size = strlen(dname) + strlen(mname) + 64;
        default_output = xmalloc(size);
        snprintf(default_output, size, "results/%s/temperature=%g/%s.jsonl", dname, ref_scores ? 0.0 : temperature, mname);
        output = default_output;
        free(dname), free(mname);
    }
    if (fs_is_file(output) && !overwrite) die_user("%s exists; give --overwrite to replace it (--output)", output);

    // Models: the policy (when generating) and the reward model, on one device.
    TextModel policy = {0};
    Tokenizer *tokenizer = NULL;
    if (!ref_scores) {
        if (text_model_load(&policy, model_path, lora_adapter, device, quantize, NULL, false) != 0) die_from_err();
        if (kv_cache_type_set(&policy.model, kv_cache, "--kv-cache") != 0) die_from_err();
        tokenizer = policy.tokenizer;
        // The reward model scores the policy's token ids.
        if (tokenizer_check_same_ids(tokenizer, reward_path, "--reward-model",
                                     "the reward model scores the policy's token ids; use a reward model trained from "
                                     "the policy's SFT model") != 0)
            die_from_err();
    } else if (tokenizer_load(&tokenizer, reward_path) != 0) {
        die_from_err();
    }
    if (chat_template && !data.conversational)
        die_user("--chat-template renders conversational data (lists of messages), and %s holds text rows "
                 "(--chat-template)", data_path);
    // Conversational rows: rendered with the policy's template (the reward model's with
    // --ref-scores), which then also frames what the reward model scores.
    if (dataset_render_chat(&data, tokenizer, ref_scores ? reward_path : model_path, chat_template) != 0) die_from_err();
    if (ref_scores)
        for (long i = 0; i < n; i++)
            if (!data.records[order[i]].chosen || !data.records[order[i]].rejected)
                die_user("row %ld of %s has no chosen/rejected pair for --ref-scores", data.records[order[i]].line, data_path);
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) die_from_err();
    Model reward;
    ModelLoadOptions rm_options = {.with_value_head = true, .require_value_head = true, .quantize = reward_quantize};
    if (model_load(&reward, reward_path, ops, &rm_options) != 0) die_from_err();
    Lexicon *lexicon = NULL;
    if (lexicon_path && lexicon_load(&lexicon, lexicon_path) != 0) die_from_err();

    int **prompts = xcalloc(n, sizeof(int *)), *prompt_lengths = xcalloc(n, sizeof(int));
    // A generated answer needs room in the policy's context: a prompt keeps at most all but one
    // of its positions (generation stops a row at the context, gen/generate.h).
    long keep = max_prompt;
    if (!ref_scores && keep > policy.model.config.max_position_embeddings - 1)
        keep = policy.model.config.max_position_embeddings - 1;
    for (long i = 0; i < n; i++) {
        const char *text = data.records[order[i]].prompt;
        int *ids, length;
        tokenizer_encode(tokenizer, text, strlen(text), true, &ids, &length);
        if (length > keep) { // keep the end: the question and the "Assistant:" cue
            memmove(ids, ids + (length - keep), (size_t)keep * sizeof(int));
            length = (int)keep;
        }
        prompts[i] = ids, prompt_lengths[i] = length;
    }

    // Candidate k of prompt i is entry i * N + k (N = best_of; 1 without --best-of).
    const long N = best_of, entries = n * N;
    int **responses = xcalloc(entries, sizeof(int *)), *response_lengths = xcalloc(entries, sizeof(int));
    int **rejected = NULL, *rejected_lengths = NULL;
    float *scores = xcalloc(entries, sizeof(float)), *rejected_scores = NULL; // zeros: gathered by sums
    // This rank's batches: [first, first + batch) for first = (rank + k * W) * batch.
    long mine = 0;
    for (long first = rank * batch; first < n; first += world * batch) mine += first + batch <= n ? batch : n - first;
    Progress progress;
    progress_start(&progress, "infer", mine, "prompts");
    progress.quiet = quiet;
    if (ref_scores) {
        rejected = xcalloc(n, sizeof(int *)), rejected_lengths = xcalloc(n, sizeof(int));
        rejected_scores = xcalloc(n, sizeof(float));
        for (long i = 0; i < n; i++) {
            const DataRecord *r = &data.records[order[i]];
            reference_response_ids(tokenizer, r->chosen, &responses[i], &response_lengths[i]);
            reference_response_ids(tokenizer, r->rejected, &rejected[i], &rejected_lengths[i]);
        }
        for (long first = rank * batch; first < n; first += world * batch) {
            int rows = (int)(first + batch <= n ? batch : n - first);
            score_all(&reward, (const int *const *)(prompts + first), prompt_lengths + first, responses + first,
                      response_lengths + first, rows, (int)batch, scores + first);
            score_all(&reward, (const int *const *)(prompts + first), prompt_lengths + first, rejected + first,
                      rejected_lengths + first, rows, (int)batch, rejected_scores + first);
            progress_update(&progress, rows, NULL);
        }
        dist_sum_floats(scores, n); // each score is non-zero on one rank only: the sum gathers them
        dist_sum_floats(rejected_scores, n);
    } else {
        GenerateOptions gen = {
            .sampler = {.temperature = (float)temperature, .top_k = (int)top_k, .top_p = (float)top_p},
            .max_new_tokens = (int)max_new,
            .min_new_tokens = (int)min_new,
            .seed = (uint64_t)seed,
            .stop_tokens = policy.stop_tokens,
            .num_stop_tokens = policy.num_stop_tokens,
            .pad_token = tokenizer_pad_id(tokenizer) >= 0 ? tokenizer_pad_id(tokenizer) : 0,
        };
        sampler_extras_apply(&extras, &gen.sampler, policy.model.config.vocab_size);
        for (long first = rank * batch; first < n; first += world * batch) {
            const int count_here = (int)(first + batch <= n ? batch : n - first), rows = count_here * (int)N;
            GeneratedRow *out = xcalloc(rows, sizeof(GeneratedRow));
            uint64_t *row_ids = xmalloc(rows * sizeof(uint64_t));
            const int **row_prompts = xmalloc(rows * sizeof(int *));
            int *row_prompt_lengths = xmalloc(rows * sizeof(int));
            for (int b = 0; b < count_here; b++)
                for (int k = 0; k < N; k++) {
                    const int row = b * (int)N + k;
                    // A prompt's stream is its index; further candidates' streams lie above 2^40.
                    row_ids[row] = (uint64_t)(first + b) + ((uint64_t)k << 40);
                    row_prompts[row] = prompts[first + b];
                    row_prompt_lengths[row] = prompt_lengths[first + b];
                }
            generate(&policy.model, row_prompts, row_prompt_lengths, row_ids, rows, &gen, out, NULL);
            for (int row = 0; row < rows; row++) {
                responses[first * N + row] = out[row].tokens;
                response_lengths[first * N + row] = out[row].length;
                out[row].tokens = NULL;
                generated_row_free(&out[row]);
            }
            score_all(&reward, row_prompts, row_prompt_lengths, responses + first * N, response_lengths + first * N,
                      rows, rows, scores + first * N);
            free(out), free(row_ids), free(row_prompts), free(row_prompt_lengths);
            progress_update(&progress, count_here, NULL);
        }
        gather_responses(responses, response_lengths, scores, entries);
    }
    progress_finish(&progress, NULL);
    // One JSON object per prompt, written atomically (by rank 0 under mpirun).
    if (rank == 0) {
        size_t used = 0;
        char *text_out = NULL;
        FILE *lines = open_memstream(&text_out, &used);
        double reward_sum = 0, candidate_sum = 0;
        for (long i = 0; i < n; i++) {
            const DataRecord *r = &data.records[order[i]];
            // The best and the worst candidate (the first of equals).
            long best = i * N, worst = i * N;
            for (long e = i * N; e < (i + 1) * N; e++) {
                if (scores[e] > scores[best]) best = e;
                if (scores[e] < scores[worst]) worst = e;
                candidate_sum += scores[e];
            }
            char *response = ref_scores ? xstrdup(r->chosen) : visible_text(&policy, tokenizer, responses[best], response_lengths[best]);
            json_t *row = json_pack("{s:s, s:s, s:f}", "prompt", r->prompt, "response", response, "reward", (double)scores[best]);
            if (ref_scores) {
                json_object_set_new(row, "rejected_response", json_string(r->rejected));
                json_object_set_new(row, "rejected_reward", json_real(rejected_scores[i]));
            }
            if (N > 1) {
                char *worst_text = visible_text(&policy, tokenizer, responses[worst], response_lengths[worst]);
                json_object_set_new(row, "rejected_response", json_string(worst_text));
                json_object_set_new(row, "rejected_reward", json_real(scores[worst]));
                json_t *all = json_array();
                for (long e = i * N; e < (i + 1) * N; e++) json_array_append_new(all, json_real(scores[e]));
                json_object_set_new(row, "candidate_rewards", all);
                free(worst_text);
            }
            if (lexicon) json_object_set_new(row, "gold", json_real(lexicon_score(lexicon, response)));
            reward_sum += scores[best];
            char *line = json_dumps(row, JSON_COMPACT);
            fprintf(lines, "%s\n", line);
            free(line), free(response);
            json_decref(row);
        }
        fclose(lines);
        char *dir = fs_dirname(output);
        if (fs_mkdir_p(dir) != 0 || fs_write_file_atomic(output, text_out, used) != 0) die_from_err();
        if (!quiet && N > 1)
            fprintf(stderr, "infer: best of %ld for %ld prompts, mean reward %.4f (of all candidates %.4f) -> %s\n", N, n,
                    reward_sum / n, candidate_sum / entries, output);
        else if (!quiet) fprintf(stderr, "infer: %ld responses, mean reward %.4f -> %s\n", n, reward_sum / n, output);
        free(dir), free(text_out);
    }
    free(scores), free(rejected_scores);
    for (long i = 0; i < n; i++) {
        free(prompts[i]);
        if (rejected) free(rejected[i]);
    }
    for (long e = 0; e < entries; e++) free(responses[e]);
    free(prompts), free(prompt_lengths), free(responses), free(response_lengths), free(rejected), free(rejected_lengths);
    free(order), free(default_output);
    if (lexicon) lexicon_free(lexicon);
    model_free(&reward);
    if (!ref_scores) text_model_free(&policy);
    else tokenizer_free(tokenizer);
    dataset_free(&data);
    sampler_extras_free(&extras);
    return 0;
}
