// The embedding API (include/marlhf.h) on the tiny model of tests/fixtures/models/tiny_chat:
// its answers checked against computations made here through the engine directly (log-probs
// from the logits, a reward model's score from the value head), DPO steps against the
// `marlhf dpo` command on the same pairs (with the command's adapter settings: per-module
// ranks and alphas, DoRA, LoRA dropout, rsLoRA, a quantized base: the same adapter files bit
// for bit), saving and reloading, determinism, exact resume, and an error (never an exit)
// for each bad argument.
#include "marlhf.h"

#include <jansson.h>
#include <sys/stat.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/weights_io.h"
#include "test.h"
#include "train/loop.h"
#include "tokenizer/tokenizer.h"

static const char *tiny = "tests/fixtures/models/tiny_chat";
static char tmp[512];

static const char *tmp_path(const char *name) {
    static char path[8][600];
    static int next;
    char *out = path[next++ % 8];
    snprintf(out, sizeof path[0], "%s/%s", tmp, name);
    return out;
}

static marlhf_model *load_policy(const char *path, const char *adapter) {
    marlhf_model_params params = marlhf_model_default_params();
    params.lora_adapter = adapter;
    marlhf_model *model = marlhf_model_load(path, &params);
    if (!model) fprintf(stderr, "  load %s: %s\n", path, marlhf_last_error());
    return model;
}

// ---- pairs of tests/fixtures/train --------------------------------------------------------

typedef struct {
    marlhf_preference *pairs;
    int count;
} Pairs;

static Pairs read_pairs(const char *path) {
    Pairs out = {0};
    FILE *file = fopen(path, "r");
    CHECK(file, "cannot open %s", path);
    char line[4096];
    while (fgets(line, sizeof line, file)) {
        json_t *row = json_loads(line, 0, NULL);
        CHECK(row, "bad JSON in %s", path);
        out.pairs = xrealloc(out.pairs, (size_t)(out.count + 1) * sizeof(marlhf_preference));
        out.pairs[out.count++] = (marlhf_preference){xstrdup(json_string_value(json_object_get(row, "prompt"))),
                                                     xstrdup(json_string_value(json_object_get(row, "chosen"))),
                                                     xstrdup(json_string_value(json_object_get(row, "rejected")))};
        json_decref(row);
    }
    fclose(file);
    return out;
}

static void free_pairs(Pairs *p) {
    for (int i = 0; i < p->count; i++)
        free((char *)p->pairs[i].prompt), free((char *)p->pairs[i].chosen), free((char *)p->pairs[i].rejected);
    free(p->pairs);
}

static marlhf_trainer_params tiny_dpo_params(void) {
    marlhf_trainer_params params = marlhf_trainer_default_params();
    params.lora_rank = 4;
    params.learning_rate = 1e-2;
    params.max_seq_len = 32;
    return params;
}

// ---- the library and models ---------------------------------------------------------------

// marlhf_set_batch_invariant: MARLHF_CPU_MATMUL saying otherwise is refused, naming both, and
// so is a model on "cuda" while it is on (before the device is opened: the same error with
// or without a GPU). That the setting reaches the kernels is test_adapter_settings_match_command's
// check (the same bits as the command only with it), and that a trainer's checkpoint records
// it, test_dpo_resume_errors's.
static void test_batch_invariant_setting(void) {
    setenv("MARLHF_CPU_MATMUL", "sgemm", 1);
    EXPECT(marlhf_set_batch_invariant(1) == -1 && strstr(marlhf_last_error(), "marlhf_set_batch_invariant(1)") &&
               strstr(marlhf_last_error(), "MARLHF_CPU_MATMUL=sgemm"),
           "'%s'", marlhf_last_error());
    EXPECT(marlhf_set_batch_invariant(0) == 0, "%s", marlhf_last_error());
    setenv("MARLHF_CPU_MATMUL", "bogus", 1);
    marlhf_model_params load = marlhf_model_default_params();
    EXPECT(!marlhf_model_load(tiny, &load) && strstr(marlhf_last_error(), "MARLHF_CPU_MATMUL=bogus"), "'%s'",
           marlhf_last_error());
    setenv("MARLHF_CPU_MATMUL", "batch-invariant", 1);
    EXPECT(marlhf_set_batch_invariant(1) == 0, "%s", marlhf_last_error());
    unsetenv("MARLHF_CPU_MATMUL");
    load.device = "cuda";
    EXPECT(!marlhf_model_load(tiny, &load) && strstr(marlhf_last_error(), "CPU kernel"), "'%s'", marlhf_last_error());
    load.kind = MARLHF_REWARD_MODEL;
    EXPECT(!marlhf_model_load(tiny, &load) && strstr(marlhf_last_error(), "CPU kernel"), "'%s'", marlhf_last_error());
}

static void test_load_errors(void) {
    EXPECT(marlhf_api_version() == MARLHF_API_VERSION, "version %d", marlhf_api_version());
    marlhf_model_params params = marlhf_model_default_params();
    EXPECT(!marlhf_model_load("tests/fixtures/no_such_model", &params), "loaded a missing model");
    EXPECT(strstr(marlhf_last_error(), "no_such_model"), "error '%s' names the path", marlhf_last_error());
    EXPECT(!marlhf_model_load(NULL, &params) && strstr(marlhf_last_error(), "NULL"), "NULL path: '%s'", marlhf_last_error());
    params.kind = MARLHF_REWARD_MODEL;
    EXPECT(!marlhf_model_load(tiny, &params), "a causal LM loaded as a reward model");
    EXPECT(strstr(marlhf_last_error(), "value head"), "error '%s'", marlhf_last_error());
    params.kind = (marlhf_model_kind)7;
    EXPECT(!marlhf_model_load(tiny, &params) && strstr(marlhf_last_error(), "kind"), "kind 7: '%s'", marlhf_last_error());
    params = marlhf_model_default_params();
    params.device = "tpu";
    EXPECT(!marlhf_model_load(tiny, &params) && strstr(marlhf_last_error(), "tpu"), "device: '%s'", marlhf_last_error());
    params = marlhf_model_default_params();
    params.lora_adapter = "tests/fixtures/no_such_adapter";
    EXPECT(!marlhf_model_load(tiny, &params) && strstr(marlhf_last_error(), "no_such_adapter"), "adapter: '%s'",
           marlhf_last_error());
    marlhf_model *model = load_policy(tiny, NULL);
    EXPECT(model && !*marlhf_last_error(), "a good load leaves no error ('%s')", marlhf_last_error());
    marlhf_model_free(model);
    marlhf_model_free(NULL);
}

static void test_tokenize(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    const char *text = "Tell me about the cat.";
    int n = marlhf_tokenize(model, text, 0, NULL, 0);
    EXPECT(n > 3, "count %d", n);
    int ids[64], partial[2];
    EXPECT(marlhf_tokenize(model, text, 0, ids, 64) == n, "same count with room");
    EXPECT(marlhf_tokenize(model, text, 0, partial, 2) == n && partial[0] == ids[0] && partial[1] == ids[1],
           "a short buffer gets the first ids and the full count");
    char *back = marlhf_detokenize(model, ids, n, 1);
    EXPECT(back && !strcmp(back, text), "round trip '%s'", back ? back : "(null)");
    marlhf_free(back);
    int bad = marlhf_vocab_size(model) + 5;
    EXPECT(!marlhf_detokenize(model, &bad, 1, 0) && strstr(marlhf_last_error(), "not a token id"), "'%s'",
           marlhf_last_error());
    EXPECT(marlhf_tokenize(model, text, 0, NULL, 4) == -1, "ids NULL with capacity 4 is an error");
    marlhf_model_free(model);
}

// log p(response + EOS | prompt) from the logits of the engine, with a log-softmax in double
// here: an independent check of marlhf_logprob's tokenization, slots and sum.
static double logprob_from_logits(const char *path, const char *prompt, const char *response, int *tokens) {
    Tokenizer *tok;
    CHECK(tokenizer_load(&tok, path) == 0, "%s", err_msg());
    Model model;
    ModelLoadOptions load = {.with_lm_head = true};
    CHECK(model_load(&model, path, &ops_cpu, &load) == 0, "%s", err_msg());
    int *p, np, *r, nr;
    CHECK(tokenizer_encode(tok, prompt, strlen(prompt), true, &p, &np) == 0, "encode");
    CHECK(tokenizer_encode(tok, response, strlen(response), false, &r, &nr) == 0, "encode");
    int T = np + nr + 1;
    int *row = xmalloc((size_t)T * sizeof(int));
    memcpy(row, p, (size_t)np * sizeof(int));
    memcpy(row + np, r, (size_t)nr * sizeof(int));
    row[T - 1] = tokenizer_eos_id(tok);
    ModelBatch batch = {.B = 1, .T = T, .tokens = row};
    model_forward(&model, &batch);
    const int V = model.config.vocab_size;
    float *logits = xmalloc((size_t)V * sizeof(float));
    double sum = 0;
    for (int t = np - 1; t < T - 1; t++) {
        model_logits_row(&model, t, logits);
        double max = logits[0], z = 0;
        for (int v = 1; v < V; v++) max = logits[v] > max ? logits[v] : max;
        for (int v = 0; v < V; v++) z += exp((double)logits[v] - max);
        sum += (double)logits[row[t + 1]] - max - log(z);
    }
    *tokens = nr + 1;
    free(logits), free(row), free(p), free(r);
    model_free(&model);
    tokenizer_free(tok);
    return sum;
}

static void test_logprob(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    double sum = 0;
    int tokens = 0, expected_tokens = 0;
    EXPECT(marlhf_logprob(model, "Tell me about the cat.", " The cat is good.", &sum, &tokens) == 0, "%s",
           marlhf_last_error());
    double expected = logprob_from_logits(tiny, "Tell me about the cat.", " The cat is good.", &expected_tokens);
    EXPECT(tokens == expected_tokens, "tokens %d, expected %d", tokens, expected_tokens);
    EXPECT_CLOSE(sum, expected, 1e-4, 1e-5, "log-prob sum");
    EXPECT(marlhf_logprob(model, "x", NULL, &sum, NULL) == -1 && strstr(marlhf_last_error(), "NULL"), "'%s'",
           marlhf_last_error());
    // Longer than the tiny model's context.
    char *long_text = xmalloc(20001);
    for (int i = 0; i < 20000; i++) long_text[i] = i % 2 ? ' ' : 'a';
    long_text[20000] = '\0';
    EXPECT(marlhf_logprob(model, long_text, " ok", &sum, NULL) == -1 && strstr(marlhf_last_error(), "context"), "'%s'",
           marlhf_last_error());
    free(long_text);
    marlhf_model_free(model);
}

// quantize "q8_0": log-probs close to the float32 model's; saving, training and bad names refused.
static void test_quantized_policy(void) {
    marlhf_model_params params = marlhf_model_default_params();
    params.quantize = "q8_0";
    marlhf_model *model = marlhf_model_load(tiny, &params);
    if (!model) {
        fprintf(stderr, "  load %s quantized: %s\n", tiny, marlhf_last_error());
        test_current_failures++;
        return;
    }
    double sum = 0;
    int tokens = 0, expected_tokens = 0;
    EXPECT(marlhf_logprob(model, "Tell me about the cat.", " The cat is good.", &sum, &tokens) == 0, "%s",
           marlhf_last_error());
    double expected = logprob_from_logits(tiny, "Tell me about the cat.", " The cat is good.", &expected_tokens);
    EXPECT(sum != expected && fabs(sum - expected) <= 0.02 * fabs(expected) + 0.05,
           "quantized log-prob sum %.6f, float32 %.6f", sum, expected);
    EXPECT(marlhf_model_save(model, tmp_path("quantized_save")) == -1 && strstr(marlhf_last_error(), "quantize"),
           "saving a quantized model: '%s'", marlhf_last_error());
    // QLoRA as the command allows it; QDoRA too, on a second copy (a trainer's adapters stay on
    // its model): its first DPO step is at the reference as well.
    marlhf_trainer_params trainer_params = tiny_dpo_params();
    marlhf_model *dora_model = marlhf_model_load(tiny, &params);
    trainer_params.use_dora = 1;
    marlhf_trainer *dora_trainer = dora_model ? marlhf_trainer_new(dora_model, &trainer_params) : NULL;
    EXPECT(dora_trainer, "a DoRA trainer on a quantized model: %s", marlhf_last_error());
    marlhf_preference dora_pair = {"Tell me about the cat.", " The cat is good.", " The cat is bad."};
    marlhf_dpo_stats dora_stats = {0};
    EXPECT(dora_trainer && marlhf_dpo_step(dora_trainer, &dora_pair, 1, &dora_stats) == 0, "%s", marlhf_last_error());
    EXPECT_CLOSE(dora_stats.loss, log(2.0), 1e-6, 0, "first QDoRA DPO loss");
    marlhf_trainer_free(dora_trainer);
    marlhf_model_free(dora_model);
    trainer_params.use_dora = 0;
    marlhf_trainer *trainer = marlhf_trainer_new(model, &trainer_params);
    EXPECT(trainer, "a trainer on a quantized model: %s", marlhf_last_error());
    // Its reference is the same dequantized base its adapters train over: the first step is at it.
    marlhf_preference pair = {"Tell me about the cat.", " The cat is good.", " The cat is bad."};
    marlhf_dpo_stats stats = {0};
    EXPECT(trainer && marlhf_dpo_step(trainer, &pair, 1, &stats) == 0, "%s", marlhf_last_error());
    EXPECT_CLOSE(stats.loss, log(2.0), 1e-6, 0, "first QLoRA DPO loss");
    // It generates with what it learned (the dequantized matmuls of a model with gradients).
    marlhf_generate_params gen = marlhf_generate_default_params();
    gen.max_new_tokens = 4;
    char *text = marlhf_generate(model, "Tell me about the cat.", &gen);
    EXPECT(text, "generating after a QLoRA step: %s", marlhf_last_error());
    marlhf_free(text);
    marlhf_model_free(model);
    params.quantize = "q4";
    EXPECT(!marlhf_model_load(tiny, &params) && strstr(marlhf_last_error(), "q4"), "quantize q4: '%s'",
           marlhf_last_error());
}

static void test_generate(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    marlhf_generate_params params = marlhf_generate_default_params();
    params.max_new_tokens = 10;
    params.temperature = 1.0f;
    params.seed = 7;
    char *a = marlhf_generate(model, "Tell me about the dog.", &params);
    char *b = marlhf_generate(model, "Tell me about the dog.", &params);
    EXPECT(a && b && !strcmp(a, b), "same seed, same text: '%s' '%s'", a ? a : "(null)", b ? b : "(null)");
    marlhf_free(a), marlhf_free(b);
    params.chat = 1;
    params.system = "You are brief.";
    char *c = marlhf_generate(model, "Tell me about the dog.", &params);
    EXPECT(c != NULL, "chat generation: %s", marlhf_last_error());
    marlhf_free(c);
    params = marlhf_generate_default_params();
    params.top_p = 0;
    EXPECT(!marlhf_generate(model, "x", &params) && strstr(marlhf_last_error(), "top_p"), "'%s'", marlhf_last_error());
    params = marlhf_generate_default_params();
    params.max_new_tokens = 0;
    EXPECT(!marlhf_generate(model, "x", &params) && strstr(marlhf_last_error(), "max_new_tokens"), "'%s'",
           marlhf_last_error());
    params = marlhf_generate_default_params();
    params.temperature = NAN;
    EXPECT(!marlhf_generate(model, "x", &params) && strstr(marlhf_last_error(), "temperature"), "'%s'",
           marlhf_last_error());
    // A prompt that fills the model's context (256 positions) leaves no room for an answer.
    char long_prompt[2 * 300 + 1];
    for (int i = 0; i < 300; i++) long_prompt[2 * i] = 'x', long_prompt[2 * i + 1] = ' ';
    long_prompt[600] = '\0';
    params = marlhf_generate_default_params();
    EXPECT(!marlhf_generate(model, long_prompt, &params) && strstr(marlhf_last_error(), "context of 256 tokens"), "'%s'",
           marlhf_last_error());
    marlhf_model_free(model);
}

// A batch: the i-th response is what `marlhf generate` prints for the i-th of the same
// prompts (18 of them: the API generates in chunks of 16, the command in batches of 8, and
// each row keeps its own random stream), and the first is marlhf_generate's answer.
static void test_generate_batch(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    const char *texts[3] = {"Tell me about the dog.", "Tell me about the cat.", "Tell me about the goat."};
    const char *prompts[18];
    for (int i = 0; i < 18; i++) prompts[i] = texts[i % 3];
    marlhf_generate_params params = marlhf_generate_default_params();
    params.max_new_tokens = 10;
    params.temperature = 1.0f;
    params.seed = 7;
    char *responses[18] = {NULL};
    EXPECT(marlhf_generate_batch(model, prompts, 18, &params, responses) == 0, "%s", marlhf_last_error());
    char *single = marlhf_generate(model, prompts[0], &params);
    EXPECT(single && responses[0] && !strcmp(single, responses[0]), "first row '%s' vs single '%s'",
           responses[0] ? responses[0] : "(null)", single ? single : "(null)");
    // Rows 0 and 3 share a prompt but not a random stream.
    EXPECT(responses[0] && responses[3] && strcmp(responses[0], responses[3]) != 0, "rows 0 and 3 are the same sample");
    marlhf_free(single);

    const char *bin = getenv("MARLHF_BIN") ? getenv("MARLHF_BIN") : "build/marlhf";
    const char *out = tmp_path("generate_batch.jsonl");
    char command[4096];
    int used = snprintf(command, sizeof command, "%s generate --model %s --max-new-tokens 10 --temperature 1 --seed 7 "
                        "--threads 2 --batch-invariant --output %s", bin, tiny, out);
    for (int i = 0; i < 18; i++) used += snprintf(command + used, sizeof command - used, " '%s'", prompts[i]);
    snprintf(command + used, sizeof command - used, " 2> /dev/null");
    EXPECT(system(command) == 0, "command failed: %s", command);
    FILE *file = fopen(out, "r");
    char line[8192];
    int row = 0;
    while (file && fgets(line, sizeof line, file) && row < 18) {
        // The tiny random model can generate a NUL byte: a C string ends there, on both sides.
        json_t *o = json_loads(line, JSON_ALLOW_NUL, NULL);
        const char *want = o ? json_string_value(json_object_get(o, "response")) : NULL;
        EXPECT(want && responses[row] && !strcmp(want, responses[row]), "row %d: api '%s', command '%s'", row,
               responses[row] ? responses[row] : "(null)", want ? want : "(null)");
        json_decref(o);
        row++;
    }
    EXPECT(row == 18, "%d rows from the command", row);
    if (file) fclose(file);
    for (int i = 0; i < 18; i++) marlhf_free(responses[i]);

    const char *with_null[2] = {"x", NULL};
    char *two[2] = {NULL, NULL};
    EXPECT(marlhf_generate_batch(model, with_null, 2, &params, two) == -1 && strstr(marlhf_last_error(), "prompts[1]") &&
               !two[0],
           "'%s'", marlhf_last_error());
    EXPECT(marlhf_generate_batch(model, prompts, 0, &params, two) == -1, "count 0");
    marlhf_model_free(model);
}

// A reward model made here: the tiny model with a value head drawn from a seed.
static const char *make_reward_model(void) {
    const char *dir = tmp_path("reward_model");
    if (fs_exists(dir)) return dir;
    Model model;
    ModelLoadOptions load = {.with_value_head = true, .seed = 99};
    CHECK(model_load(&model, tiny, &ops_cpu, &load) == 0, "%s", err_msg());
    CHECK(model_save_hf(&model, dir, tiny) == 0, "%s", err_msg());
    model_free(&model);
    return dir;
}

static void test_reward(void) {
    const char *dir = make_reward_model();
    marlhf_model_params params = marlhf_model_default_params();
    params.kind = MARLHF_REWARD_MODEL;
    marlhf_model *rm = marlhf_model_load(dir, &params);
    EXPECT(rm, "load: %s", marlhf_last_error());
    if (!rm) return;
    float good = 0, bad = 0;
    EXPECT(marlhf_reward(rm, "Tell me about the cat.", " The cat is good.", &good) == 0, "%s", marlhf_last_error());
    EXPECT(marlhf_reward(rm, "Tell me about the cat.", " The cat is bad.", &bad) == 0, "%s", marlhf_last_error());
    EXPECT(good != bad, "two responses, one score %g", good);

    // The value head at the EOS slot of prompt + response + EOS, computed here.
    Tokenizer *tok;
    CHECK(tokenizer_load(&tok, dir) == 0, "%s", err_msg());
    Model model;
    ModelLoadOptions load = {.with_value_head = true, .require_value_head = true};
    CHECK(model_load(&model, dir, &ops_cpu, &load) == 0, "%s", err_msg());
    int *p, np, *r, nr;
    CHECK(tokenizer_encode(tok, "Tell me about the cat.", 22, true, &p, &np) == 0, "encode");
    CHECK(tokenizer_encode(tok, " The cat is good.", 17, false, &r, &nr) == 0, "encode");
    int T = np + nr + 1, row[64];
    CHECK(T <= 64, "row");
    memcpy(row, p, (size_t)np * sizeof(int));
    memcpy(row + np, r, (size_t)nr * sizeof(int));
    row[T - 1] = tokenizer_eos_id(tok);
    ModelBatch batch = {.B = 1, .T = T, .tokens = row};
    model_forward(&model, &batch);
    float values[64];
    model_values(&model, values);
    EXPECT_CLOSE(good, values[T - 1], 1e-5, 1e-5, "score = value at EOS");
    free(p), free(r);
    model_free(&model);
    tokenizer_free(tok);

    marlhf_generate_params gen = marlhf_generate_default_params();
    EXPECT(!marlhf_generate(rm, "x", &gen) && strstr(marlhf_last_error(), "reward model"), "'%s'", marlhf_last_error());
    marlhf_model *policy = load_policy(tiny, NULL);
    EXPECT(marlhf_reward(policy, "x", "y", &good) == -1 && strstr(marlhf_last_error(), "REWARD_MODEL"), "'%s'",
           marlhf_last_error());
    marlhf_trainer_params dpo = tiny_dpo_params();
    EXPECT(!marlhf_trainer_new(rm, &dpo) && strstr(marlhf_last_error(), "reward model"), "'%s'", marlhf_last_error());
    marlhf_model_free(policy);
    marlhf_model_free(rm);
}

// ---- DPO ------------------------------------------------------------------------------------

static void test_dpo_first_step_at_reference(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    Pairs pairs = read_pairs("tests/fixtures/train/pairs.jsonl");
    marlhf_trainer_params params = tiny_dpo_params();
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    EXPECT(trainer, "%s", marlhf_last_error());
    marlhf_dpo_stats stats = {0};
    EXPECT(trainer && marlhf_dpo_step(trainer, pairs.pairs, 8, &stats) == 0, "%s", marlhf_last_error());
    // Fresh adapters (B = 0) leave the policy at the reference: h = 0, loss log 2.
    EXPECT_CLOSE(stats.loss, log(2.0), 1e-6, 0, "first loss");
    EXPECT_CLOSE(stats.margin, 0.0, 1e-6, 0, "first margin");
    EXPECT(stats.step == 1 && stats.pairs == 8 && stats.grad_norm > 0, "step %ld pairs %d norm %g", stats.step,
           stats.pairs, stats.grad_norm);
    EXPECT(marlhf_dpo_step(trainer, pairs.pairs, 8, &stats) == 0 && stats.loss < log(2.0) && stats.step == 2,
           "second step loss %g", stats.loss);
    EXPECT(!marlhf_trainer_new(model, &params) && strstr(marlhf_last_error(), "already"), "'%s'",
           marlhf_last_error());
    marlhf_trainer_free(trainer);
    // The adapters stay on the model; a second trainer on it would change the reference.
    EXPECT(!marlhf_trainer_new(model, &params) && strstr(marlhf_last_error(), "adapters"), "'%s'",
           marlhf_last_error());
    marlhf_model_free(model);
    free_pairs(&pairs);
}

// Preference accuracy on held-out pairs from log-prob differences against the base model.
static double eval_accuracy(marlhf_model *policy, marlhf_model *reference, const Pairs *eval) {
    int correct = 0;
    for (int i = 0; i < eval->count; i++) {
        double pc, pr, rc, rr;
        const marlhf_preference *p = &eval->pairs[i];
        CHECK(marlhf_logprob(policy, p->prompt, p->chosen, &pc, NULL) == 0 &&
                  marlhf_logprob(policy, p->prompt, p->rejected, &pr, NULL) == 0 &&
                  marlhf_logprob(reference, p->prompt, p->chosen, &rc, NULL) == 0 &&
                  marlhf_logprob(reference, p->prompt, p->rejected, &rr, NULL) == 0,
              "%s", marlhf_last_error());
        correct += (pc - rc) > (pr - rr);
    }
    return (double)correct / eval->count;
}

static void test_dpo_learns_saves_and_reloads(void) {
    marlhf_model *model = load_policy(tiny, NULL), *reference = load_policy(tiny, NULL);
    if (!model || !reference) return test_current_failures++, (void)0;
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl"), eval = read_pairs("tests/fixtures/train/pairs_eval.jsonl");
    marlhf_trainer_params params = tiny_dpo_params();
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    marlhf_dpo_stats stats = {0};
    for (int step = 0; step < 24 && trainer; step++)
        EXPECT(marlhf_dpo_step(trainer, train.pairs + (step % 6) * 8, 8, &stats) == 0, "%s", marlhf_last_error());
    double accuracy = eval_accuracy(model, reference, &eval);
    EXPECT(accuracy >= 0.9, "held-out accuracy %.3f after 24 steps (last train loss %.4f)", accuracy, stats.loss);
    fprintf(stderr, "  held-out accuracy %.3f, last loss %.4f\n", accuracy, stats.loss);

    // Saved: merged weights + adapter/; both load back to the same log-probs.
    const char *dir = tmp_path("dpo_saved");
    fs_remove_tree(dir);
    EXPECT(marlhf_model_save(model, dir) == 0, "%s", marlhf_last_error());
    char adapter_file[700];
    snprintf(adapter_file, sizeof adapter_file, "%s/adapter/adapter_model.safetensors", dir);
    EXPECT(fs_is_file(adapter_file), "%s", adapter_file);
    struct stat before, after;
    char weights[700];
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    stat(weights, &before);
    EXPECT(marlhf_model_save(model, dir) == -1 && strstr(marlhf_last_error(), "already exists"), "'%s'",
           marlhf_last_error());
    stat(weights, &after);
    EXPECT(before.st_mtim.tv_nsec == after.st_mtim.tv_nsec && before.st_size == after.st_size, "overwritten");
    double trained, merged, adapted;
    const marlhf_preference *p = &eval.pairs[0];
    marlhf_logprob(model, p->prompt, p->chosen, &trained, NULL);
    marlhf_model *reloaded = load_policy(dir, NULL), *base_with_adapter = load_policy(tiny, dir);
    EXPECT(reloaded && marlhf_logprob(reloaded, p->prompt, p->chosen, &merged, NULL) == 0, "%s", marlhf_last_error());
    EXPECT(base_with_adapter && marlhf_logprob(base_with_adapter, p->prompt, p->chosen, &adapted, NULL) == 0, "%s",
           marlhf_last_error());
    EXPECT_CLOSE(merged, trained, 1e-4, 1e-5, "merged model's log-prob");
    EXPECT_CLOSE(adapted, trained, 1e-5, 1e-6, "base + adapter log-prob");
    EXPECT(!marlhf_trainer_new(base_with_adapter, &params) && strstr(marlhf_last_error(), "adapters"), "'%s'",
           marlhf_last_error());
    marlhf_model_free(reloaded), marlhf_model_free(base_with_adapter);
    marlhf_model_free(model), marlhf_model_free(reference); // frees the trainer too
    free_pairs(&train), free_pairs(&eval);
}

// Thumbs up / down: KTO steps on the examples of the fixture pairs (each pair a good and a
// bad completion), then the held-out pairs ranked by log-ratio as DPO's are.
static void test_kto_steps(void) {
    marlhf_model *model = load_policy(tiny, NULL), *reference = load_policy(tiny, NULL);
    if (!model || !reference) return test_current_failures++, (void)0;
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl"), eval = read_pairs("tests/fixtures/train/pairs_eval.jsonl");
    marlhf_feedback *examples = xmalloc((size_t)2 * train.count * sizeof(marlhf_feedback));
    for (int i = 0; i < train.count; i++) {
        examples[2 * i] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].chosen, 1};
        examples[2 * i + 1] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].rejected, 0};
    }
    marlhf_trainer_params params = tiny_dpo_params();
    params.learning_rate = 3e-3;
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    marlhf_kto_stats stats = {0};
    EXPECT(marlhf_kto_step(trainer, examples, 8, &stats) == 0, "%s", marlhf_last_error());
    EXPECT_CLOSE(stats.loss, 0.5, 1e-6, 0, "first KTO loss (at the reference)");
    EXPECT_CLOSE(stats.kl, 0.0, 1e-6, 0, "first KL baseline");
    EXPECT(stats.step == 1 && stats.examples == 8, "step %ld, %d examples", stats.step, stats.examples);
    for (int step = 1; step < 48; step++)
        EXPECT(marlhf_kto_step(trainer, examples + (step % 12) * 8, 8, &stats) == 0, "%s", marlhf_last_error());
    double accuracy = eval_accuracy(model, reference, &eval);
    EXPECT(accuracy >= 0.9, "held-out accuracy %.3f after 48 KTO steps (last loss %.4f)", accuracy, stats.loss);
    fprintf(stderr, "  KTO: held-out pair accuracy %.3f, last loss %.4f, kl %.4f\n", accuracy, stats.loss, stats.kl);
    // The same trainer takes pairs too.
    marlhf_dpo_stats dpo = {0};
    EXPECT(marlhf_dpo_step(trainer, train.pairs, 4, &dpo) == 0 && dpo.step == 49, "%s", marlhf_last_error());
    EXPECT(marlhf_kto_step(trainer, examples, 1, NULL) == -1 && strstr(marlhf_last_error(), "at least two"), "'%s'",
           marlhf_last_error());
    marlhf_feedback broken[2] = {{"p", NULL, 1}, {"p", "c", 0}};
    EXPECT(marlhf_kto_step(trainer, broken, 2, NULL) == -1 && strstr(marlhf_last_error(), "examples[0]"), "'%s'",
           marlhf_last_error());
    free(examples);
    marlhf_model_free(model), marlhf_model_free(reference);
    free_pairs(&train), free_pairs(&eval);
}

// APO-zero (no KL baseline): one thumbs up or down per step is enough, and it learns;
// BCO (state the trainer's checkpoints do not carry) and unknown names are refused.
static void test_kto_apo_zero_single_examples(void) {
    marlhf_model *model = load_policy(tiny, NULL), *reference = load_policy(tiny, NULL);
    if (!model || !reference) return test_current_failures++, (void)0;
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl"), eval = read_pairs("tests/fixtures/train/pairs_eval.jsonl");
    marlhf_trainer_params params = tiny_dpo_params();
    params.learning_rate = 3e-3;
    params.kto_loss = "bco";
    EXPECT(marlhf_trainer_new(model, &params) == NULL && strstr(marlhf_last_error(), "kto_loss"), "'%s'",
           marlhf_last_error());
    params.kto_loss = "kto-ish";
    EXPECT(marlhf_trainer_new(model, &params) == NULL && strstr(marlhf_last_error(), "kto_loss"), "'%s'",
           marlhf_last_error());
    params.kto_loss = "apo-zero-unpaired";
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    EXPECT(trainer != NULL, "%s", marlhf_last_error());
    if (!trainer) return;
    marlhf_kto_stats stats = {0};
    for (int step = 0; step < 96; step++) {
        const marlhf_preference *pair = &train.pairs[(step / 2) % train.count];
        marlhf_feedback one = {pair->prompt, step % 2 ? pair->rejected : pair->chosen, step % 2 == 0};
        EXPECT(marlhf_kto_step(trainer, &one, 1, &stats) == 0, "%s", marlhf_last_error());
        if (step == 0) EXPECT_CLOSE(stats.loss, 0.5, 1e-6, 0, "first APO-zero loss (at the reference)");
    }
    EXPECT(isnan(stats.kl) && stats.examples == 1 && stats.step == 96, "kl %g, %d examples, step %ld", stats.kl,
           stats.examples, stats.step);
    double accuracy = eval_accuracy(model, reference, &eval);
    EXPECT(accuracy >= 0.8, "held-out accuracy %.3f after 96 single-example APO-zero steps", accuracy);
    fprintf(stderr, "  APO-zero, one example per step: held-out pair accuracy %.3f\n", accuracy);
    marlhf_model_free(model), marlhf_model_free(reference);
    free_pairs(&train), free_pairs(&eval);
}

// Two runs from the same start, pairs and seed end with the same bits.
static void test_dpo_deterministic(void) {
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
    double result[2];
    for (int run = 0; run < 2; run++) {
        marlhf_model *model = load_policy(tiny, NULL);
        marlhf_trainer_params params = tiny_dpo_params();
        params.loss = "ipo";
        params.sft_weight = 0.5;
        marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
        for (int step = 0; step < 3; step++) marlhf_dpo_step(trainer, train.pairs + 8 * step, 8, NULL);
        marlhf_logprob(model, train.pairs[0].prompt, train.pairs[0].chosen, &result[run], NULL);
        marlhf_model_free(model);
    }
    EXPECT(result[0] == result[1], "%.17g vs %.17g", result[0], result[1]);
    free_pairs(&train);
}

// `marlhf COMMAND` on the pairs fixture for two optimizer steps (constant learning rate
// 1e-2, no warmup, LoRA rank 4 from seed 1234) with `options`, into the folder it returns
// (run_name under the test's folder).
static const char *run_command(const char *command_name, const char *run_name, const char *options) {
    const char *bin = getenv("MARLHF_BIN") ? getenv("MARLHF_BIN") : "build/marlhf";
    const char *run = tmp_path(run_name);
    fs_remove_tree(run);
    char command[2048];
    snprintf(command, sizeof command,
             "%s %s --model %s --data tests/fixtures/train/pairs.jsonl --output %s --max-seq-len 32 %s "
             "--num-train-epochs 2 --max-steps 2 --lr-scheduler-type constant --num-warmup-steps 0 --learning-rate 1e-2 "
             "--lora-rank 4 --seed 1234 --threads 2 --batch-invariant --quiet 2> %s.log",
             bin, command_name, tiny, run, options, run);
    EXPECT(system(command) == 0, "command failed: %s (see %s.log)", command, run);
    return run;
}

// run_command, and the tiny base with the run's final adapter.
static marlhf_model *trained_by_command(const char *command_name, const char *options) {
    char name[64];
    snprintf(name, sizeof name, "%s_command", command_name);
    const char *run = run_command(command_name, name, options);
    char final_dir[700];
    snprintf(final_dir, sizeof final_dir, "%s/final", run);
    return load_policy(tiny, final_dir);
}

// The largest relative difference of two models' log-probs of the first six pairs' chosen
// (or rejected) responses; infinite when a model is missing.
static double worst_logprob_difference(marlhf_model *a, marlhf_model *b, const Pairs *pairs, bool chosen) {
    if (!a || !b) return INFINITY;
    double worst = 0;
    for (int i = 0; i < 6; i++) {
        const char *response = chosen ? pairs->pairs[i].chosen : pairs->pairs[i].rejected;
        double x, y;
        marlhf_logprob(a, pairs->pairs[i].prompt, response, &x, NULL);
        marlhf_logprob(b, pairs->pairs[i].prompt, response, &y, NULL);
        worst = fmax(worst, fabs(x - y) / (1e-3 + fabs(y)));
    }
    return worst;
}

// The same two optimizer steps through `marlhf dpo` (all 48 pairs per step: micro-batch 4,
// 12 accumulated): the adapters agree up to the order in which the command's shuffled
// micro-batches add their gradients.
static void test_dpo_matches_command(void) {
    // The default loss, one with a setting of its own (DiscoPOP's temperature), rsLoRA, and
    // CPOTrainer's IPO with AlphaPO's reward shape and its default behaviour cloning (1): a
    // mean over each micro-batch's chosen tokens, so the command's shuffled micro-batches
    // would hold other pairs than the API's; one micro-batch of all 48 pairs on both sides.
    const struct {
        const char *options, *loss;
        double discopop_tau, alphapo_alpha;
        int rslora, micro_batch;
    } settings[] = {{"", "sigmoid", 0, 0, 0, 4},
                    {" --loss discopop --discopop-tau 0.1", "discopop", 0.1, 0, 0, 4},
                    {" --lora-rslora", "sigmoid", 0, 0, 1, 4},
                    {" --loss cpo-ipo --alphapo-alpha 0.5", "cpo-ipo", 0, 0.5, 0, 48}};
    for (size_t s = 0; s < sizeof settings / sizeof settings[0]; s++) {
        char options[160];
        snprintf(options, sizeof options, "--per-device-train-batch-size %d --gradient-accumulation-steps %d%s",
                 settings[s].micro_batch, 48 / settings[s].micro_batch, settings[s].options);
        marlhf_model *from_command = trained_by_command("dpo", options);
        Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
        marlhf_model *model = load_policy(tiny, NULL);
        marlhf_trainer_params params = tiny_dpo_params();
        params.seed = 1234;
        params.loss = settings[s].loss, params.discopop_tau = settings[s].discopop_tau;
        params.alphapo_alpha = settings[s].alphapo_alpha;
        params.lora_rslora = settings[s].rslora, params.micro_batch = settings[s].micro_batch;
        marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
        for (int step = 0; step < 2; step++)
            EXPECT(marlhf_dpo_step(trainer, train.pairs, train.count, NULL) == 0, "%s", marlhf_last_error());
        const double worst = worst_logprob_difference(model, from_command, &train, false);
        EXPECT(worst < 1e-4, "%s: worst relative log-prob difference %.3g", settings[s].loss, worst);
        fprintf(stderr, "  API vs command after 2 %s%s steps: worst relative log-prob difference %.3g\n", settings[s].loss,
                settings[s].rslora ? " rsLoRA" : "", worst);
        // And the steps moved the model: the base differs.
        marlhf_model *base = load_policy(tiny, NULL);
        EXPECT(worst_logprob_difference(model, base, &train, false) > 1e-4, "the trained model is still the base");
        marlhf_model_free(base), marlhf_model_free(model), marlhf_model_free(from_command);
        free_pairs(&train);
    }
}

// Whether two files hold the same bytes (false when either is missing).
static bool same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        const int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

// The largest difference between two safetensors files' tensors, relative to each tensor's
// largest magnitude; infinite when either file is missing or their names or shapes differ.
static double worst_tensor_difference(const char *a_path, const char *b_path) {
    SafetensorsSet *a = NULL, *b = NULL;
    double worst = INFINITY;
    if (safetensors_open(a_path, &a) == 0 && safetensors_open(b_path, &b) == 0 &&
        safetensors_tensor_count(a) == safetensors_tensor_count(b)) {
        worst = 0;
        for (int i = 0; i < safetensors_tensor_count(a) && worst < INFINITY; i++) {
            const SafetensorsTensor *ta = safetensors_tensor_at(a, i), *tb = safetensors_find(b, ta->name);
            const long long n = tb && tb->ndim == ta->ndim ? ta->count : -1;
            if (n < 0 || n != tb->count) {
                worst = INFINITY;
                break;
            }
            float *va = xmalloc((size_t)n * sizeof(float)), *vb = xmalloc((size_t)n * sizeof(float));
            double largest = 0, difference = 0;
            if (safetensors_read_f32(ta, va, n) == 0 && safetensors_read_f32(tb, vb, n) == 0) {
                for (long long j = 0; j < n; j++) {
                    largest = fmax(largest, fabs(vb[j]));
                    difference = fmax(difference, fabs((double)va[j] - vb[j]));
                }
                if (difference > 0) worst = fmax(worst, difference / fmax(largest, 1e-30));
            } else {
                worst = INFINITY;
            }
            free(va), free(vb);
        }
    }
    safetensors_close(a), safetensors_close(b);
    return worst;
}

// The command's adapter settings through the API: per-module ranks and alphas (the
// command's pattern syntax, regex keys and a JSON object), rsLoRA, DoRA and LoRA dropout on
// the float32 base, and the patterns with dropout over an NF4 base (QLoRA). `marlhf dpo` on
// the first 8 fixture pairs, two epochs of one optimizer step (micro-batches of 4, 2
// accumulated), and two API steps on the pairs in each epoch's shuffled order (the command's
// train_epoch_order): the same micro-batches, so the same sums and the same dropout masks
// (the API keys them by step, the command by epoch, one step each here). The loss is DPO's
// (sigmoid), whose reference the command computes once before training and the API at each
// step with the adapters off. The same for KTO steps (`marlhf kto` on the 8 examples of 4
// pairs) with APO-zero, whose examples have no KL baseline: KTO's baseline pairs each
// example with the next one in the data's order, which the shuffle does not keep. The saved
// adapter_config.json files are the same bytes; the merged weights and the adapter weights
// (A, B and DoRA's magnitudes) are the same bytes too. That needs a forward whose rows do
// not depend on the batch (main calls marlhf_set_batch_invariant(1), run_command gives the
// command --batch-invariant): the reference's rows are batched otherwise by the command (once, before
// training) than by the API (each step). With sgemm, OpenBLAS's Haswell/Zen kernels give a
// row other last bits in another batch (measured 3.3e-5 of a tensor's largest value after
// Adam's two steps); a wrong setting moves them by far more (a shuffled order: 0.5 to 2).
static void test_adapter_settings_match_command(void) {
    const char *ranks = "q_proj=8,layers\\.1\\.mlp\\.(up|down)_proj=2", *alphas = "{\"v_proj\": 16}";
    const char *regex = ".*\\.(q_proj|v_proj|up_proj|down_proj)"; // every module the patterns name
    const struct {
        const char *command, *options, *quantize;
        int rslora, dora, rows;
        const char *modules_regex, *layers; // also given to the command in `options`
    } settings[] = {{"dpo", "--lora-alpha 8 --lora-rslora --use-dora", NULL, 1, 1, 8, NULL, NULL},
                    {"dpo", "--lora-alpha 8 --quantize nf4", "nf4", 0, 0, 8, NULL, NULL},
                    {"kto", "--loss apo-zero-unpaired --lora-alpha 8 --use-dora", NULL, 0, 1, 4, NULL, NULL},
                    {"dpo", "--lora-alpha 8 --lora-modules-regex '.*\\.(q_proj|v_proj|up_proj|down_proj)'", NULL, 0, 0, 8,
                     regex, NULL},
                    {"kto", "--loss apo-zero-unpaired --lora-alpha 8 --use-dora --lora-layers 1", NULL, 0, 1, 4, NULL, "1"}};
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
    for (size_t s = 0; s < sizeof settings / sizeof settings[0]; s++) {
        const bool kto = !strcmp(settings[s].command, "kto");
        char options[512], name[32];
        snprintf(options, sizeof options,
                 "--max-rows %d --per-device-train-batch-size 4 --gradient-accumulation-steps 2 "
                 "--lora-dropout 0.25 --lora-rank-pattern '%s' --lora-alpha-pattern '%s' %s",
                 settings[s].rows, ranks, alphas, settings[s].options);
        snprintf(name, sizeof name, "settings_command%zu", s);
        const char *run = run_command(settings[s].command, name, options);

        marlhf_model_params load = marlhf_model_default_params();
        load.quantize = settings[s].quantize;
        marlhf_model *model = marlhf_model_load(tiny, &load);
        marlhf_trainer_params params = tiny_dpo_params();
        params.lora_alpha = 8, params.lora_rslora = settings[s].rslora;
        params.use_dora = settings[s].dora, params.lora_dropout = 0.25;
        params.lora_rank_pattern = ranks, params.lora_alpha_pattern = alphas;
        params.lora_modules_regex = settings[s].modules_regex, params.lora_layers = settings[s].layers;
        if (kto) params.kto_loss = "apo-zero-unpaired";
        marlhf_trainer *trainer = model ? marlhf_trainer_new(model, &params) : NULL;
        EXPECT(trainer, "setting %zu: %s", s, marlhf_last_error());
        // kto: the command's examples of the pairs, each pair's chosen (a thumbs up) then its rejected.
        marlhf_feedback examples[8];
        for (int i = 0; i < 4; i++) {
            examples[2 * i] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].chosen, 1};
            examples[2 * i + 1] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].rejected, 0};
        }
        for (long epoch = 0; epoch < 2 && trainer; epoch++) {
            long order[8];
            marlhf_preference pairs[8];
            marlhf_feedback shuffled[8];
            train_epoch_order(1234, epoch, 8, order);
            for (int i = 0; i < 8; i++) pairs[i] = train.pairs[order[i]], shuffled[i] = examples[order[i]];
            EXPECT((kto ? marlhf_kto_step(trainer, shuffled, 8, NULL) : marlhf_dpo_step(trainer, pairs, 8, NULL)) == 0,
                   "%s", marlhf_last_error());
        }
        snprintf(name, sizeof name, "settings_api%zu", s);
        const char *saved = tmp_path(name);
        fs_remove_tree(saved);
        EXPECT(marlhf_model_save(model, saved) == 0, "setting %zu: save: %s", s, marlhf_last_error());
        const char *files[3] = {"model.safetensors", "adapter/adapter_model.safetensors", "adapter/adapter_config.json"};
        for (int f = 0; f < 3; f++) {
            char api_file[800], command_file[800];
            snprintf(api_file, sizeof api_file, "%s/%s", saved, files[f]);
            snprintf(command_file, sizeof command_file, "%s/final/%s", run, files[f]);
            EXPECT(same_bytes(api_file, command_file), "setting %zu: %s differs from the command's %s%s%.3g", s,
                   api_file, command_file, f == 2 ? "" : " by (of a tensor's largest value) ",
                   f == 2 ? 0.0 : worst_tensor_difference(api_file, command_file));
        }
        // The fields PEFT reads (and marlhf's quantized base).
        char config_path[800];
        snprintf(config_path, sizeof config_path, "%s/adapter/adapter_config.json", saved);
        json_t *config = json_load_file(config_path, 0, NULL);
        json_t *want_ranks = json_pack("{s:i, s:i}", "layers\\.1\\.mlp\\.(up|down)_proj", 2, "q_proj", 8);
        json_t *want_alphas = json_pack("{s:f}", "v_proj", 16.0);
        const char *base = json_string_value(json_object_get(config, "marlhf_base_quantize"));
        json_t *targets = json_object_get(config, "target_modules"), *layers = json_object_get(config, "layers_to_transform");
        EXPECT(settings[s].modules_regex ? json_is_string(targets) && !strcmp(json_string_value(targets), regex)
                                         : json_is_array(targets),
               "setting %zu: target_modules", s);
        EXPECT(settings[s].layers ? json_is_array(layers) && json_array_size(layers) == 1 &&
                                        json_integer_value(json_array_get(layers, 0)) == 1
                                  : !layers || json_is_null(layers),
               "setting %zu: layers_to_transform", s);
        EXPECT(config && json_integer_value(json_object_get(config, "r")) == 4 &&
                   json_number_value(json_object_get(config, "lora_alpha")) == 8 &&
                   json_equal(json_object_get(config, "rank_pattern"), want_ranks) &&
                   json_equal(json_object_get(config, "alpha_pattern"), want_alphas) &&
                   json_is_true(json_object_get(config, "use_dora")) == settings[s].dora &&
                   json_is_true(json_object_get(config, "use_rslora")) == settings[s].rslora &&
                   fabs(json_number_value(json_object_get(config, "lora_dropout")) - 0.25) < 1e-9 &&
                   (settings[s].quantize ? base && !strcmp(base, settings[s].quantize) : !base),
               "setting %zu: %s", s, config_path);
        json_decref(config), json_decref(want_ranks), json_decref(want_alphas);
        marlhf_model_free(model);
    }
    free_pairs(&train);
}

// Three steps, a checkpoint, a "restart" (a fresh process's view: a new model and trainer
// restored from the folder), two more steps: the same bits as five steps in one go. Plain
// LoRA; per-module ranks and alphas with DoRA and dropout (whose masks follow the restored
// step count); and the same over an NF4 base (QLoRA, no DoRA).
static void test_dpo_resume_exact(void) {
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
    const struct {
        const char *quantize, *rank_pattern, *alpha_pattern;
        int use_dora;
        double dropout;
    } settings[] = {{NULL, NULL, NULL, 0, 0},
                    {NULL, "q_proj=8,layers\\.1\\.mlp\\.down_proj=2", "{\"v_proj\": 16}", 1, 0.25},
                    {"nf4", "q_proj=8,layers\\.1\\.mlp\\.down_proj=2", "{\"v_proj\": 16}", 0, 0.25}};
    for (size_t s = 0; s < sizeof settings / sizeof settings[0]; s++) {
        marlhf_trainer_params params = tiny_dpo_params();
        params.lora_rank_pattern = settings[s].rank_pattern, params.lora_alpha_pattern = settings[s].alpha_pattern;
        params.use_dora = settings[s].use_dora, params.lora_dropout = settings[s].dropout;
        marlhf_model_params load = marlhf_model_default_params();
        load.quantize = settings[s].quantize;
        char name[32];
        snprintf(name, sizeof name, "resume_run%zu", s);
        const char *run = tmp_path(name);
        fs_remove_tree(run);
        double straight = 0, resumed = 1;
        marlhf_model *model = marlhf_model_load(tiny, &load);
        marlhf_trainer *trainer = model ? marlhf_trainer_new(model, &params) : NULL;
        EXPECT(trainer, "setting %zu: %s", s, marlhf_last_error());
        for (int step = 0; step < 5 && trainer; step++) {
            EXPECT(marlhf_dpo_step(trainer, train.pairs + 8 * step, 8, NULL) == 0, "%s", marlhf_last_error());
            if (step == 2) EXPECT(marlhf_trainer_save(trainer, run) == 0, "%s", marlhf_last_error());
        }
        marlhf_logprob(model, train.pairs[1].prompt, train.pairs[1].chosen, &straight, NULL);
        marlhf_model_free(model);

        model = marlhf_model_load(tiny, &load);
        trainer = model ? marlhf_trainer_resume(model, &params, run) : NULL;
        EXPECT(trainer, "setting %zu: resume: %s", s, marlhf_last_error());
        marlhf_dpo_stats stats = {0};
        for (int step = 3; step < 5 && trainer; step++)
            EXPECT(marlhf_dpo_step(trainer, train.pairs + 8 * step, 8, &stats) == 0, "%s", marlhf_last_error());
        EXPECT(stats.step == 5, "step %ld after resuming at 3 and two steps", stats.step);
        marlhf_logprob(model, train.pairs[1].prompt, train.pairs[1].chosen, &resumed, NULL);
        EXPECT(resumed == straight, "setting %zu: resumed %.17g, straight %.17g", s, resumed, straight);
        if (settings[s].dropout > 0) { // another dropout, DoRA setting or pattern is refused
            marlhf_model_free(model);
            model = marlhf_model_load(tiny, &load);
            double as_loaded = 0, after = 1;
            marlhf_logprob(model, train.pairs[1].prompt, train.pairs[1].chosen, &as_loaded, NULL);
            marlhf_trainer_params other = params;
            other.lora_dropout = 0.1;
            EXPECT(!marlhf_trainer_resume(model, &other, run) && strstr(marlhf_last_error(), "lora_dropout"), "'%s'",
                   marlhf_last_error());
            other = params, other.lora_rank_pattern = "q_proj=8";
            EXPECT(!marlhf_trainer_resume(model, &other, run) && strstr(marlhf_last_error(), "lora_rank_pattern"), "'%s'",
                   marlhf_last_error());
            other = params, other.lora_layers = "1";
            EXPECT(!marlhf_trainer_resume(model, &other, run) && strstr(marlhf_last_error(), "lora_modules_regex or lora_layers"),
                   "'%s'", marlhf_last_error());
            if (!settings[s].quantize) {
                other = params, other.use_dora = 0;
                EXPECT(!marlhf_trainer_resume(model, &other, run) && strstr(marlhf_last_error(), "use_dora"), "'%s'",
                       marlhf_last_error());
            } else { // the checkpoint's base is NF4: a Q4_0 policy is another base, found once its
                     // adapters are on, which come off again over its quantized base
                marlhf_model_params q4 = load;
                q4.quantize = "q4_0";
                marlhf_model *other_base = marlhf_model_load(tiny, &q4);
                double before_q4 = 0, after_q4 = 1;
                marlhf_logprob(other_base, train.pairs[1].prompt, train.pairs[1].chosen, &before_q4, NULL);
                EXPECT(!marlhf_trainer_resume(other_base, &params, run) && strstr(marlhf_last_error(), "nf4"), "'%s'",
                       marlhf_last_error());
                marlhf_logprob(other_base, train.pairs[1].prompt, train.pairs[1].chosen, &after_q4, NULL);
                EXPECT(after_q4 == before_q4, "Q4_0 log-prob %.17g after a refused resume, %.17g as loaded", after_q4,
                       before_q4);
                marlhf_trainer *fresh = marlhf_trainer_new(other_base, &params);
                marlhf_dpo_stats first = {0};
                EXPECT(fresh && marlhf_dpo_step(fresh, train.pairs, 8, &first) == 0, "%s", marlhf_last_error());
                EXPECT_CLOSE(first.loss, log(2.0), 1e-6, 0, "first loss on the Q4_0 base after a refused resume");
                marlhf_model_free(other_base);
            }
            // The refusals left the model as loaded: the same log-prob, and a fresh trainer's first
            // step is at the reference.
            marlhf_logprob(model, train.pairs[1].prompt, train.pairs[1].chosen, &after, NULL);
            EXPECT(after == as_loaded, "setting %zu: log-prob %.17g after refused resumes, %.17g as loaded", s, after,
                   as_loaded);
            marlhf_trainer *fresh = marlhf_trainer_new(model, &params);
            EXPECT(fresh && marlhf_dpo_step(fresh, train.pairs, 8, &stats) == 0, "%s", marlhf_last_error());
            EXPECT_CLOSE(stats.loss, log(2.0), 1e-6, 0, "first loss after refused resumes");
        }
        marlhf_model_free(model);
    }
    free_pairs(&train);
}

// A resume that cannot be done says why and leaves the model without adapters, ready for
// a fresh trainer whose first step is at the reference.
static void test_dpo_resume_errors(void) {
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
    marlhf_trainer_params params = tiny_dpo_params();
    const char *run = tmp_path("resume_errors");
    fs_remove_tree(run);
    marlhf_model *model = load_policy(tiny, NULL);
    EXPECT(!marlhf_trainer_resume(model, &params, run) && strstr(marlhf_last_error(), "no checkpoint"), "'%s'",
           marlhf_last_error());
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    marlhf_dpo_step(trainer, train.pairs, 8, NULL);
    EXPECT(marlhf_trainer_save(trainer, run) == 0, "%s", marlhf_last_error());
    marlhf_model_free(model);

    model = load_policy(tiny, NULL);
    marlhf_trainer_params other = params;
    other.lora_rank = 8;
    EXPECT(!marlhf_trainer_resume(model, &other, run) && strstr(marlhf_last_error(), "rank 4"), "'%s'",
           marlhf_last_error());
    // Saved with the row-invariant forward (main's setting): resuming with sgemm is another
    // run, refused naming the checkpoint.
    EXPECT(marlhf_set_batch_invariant(0) == 0, "%s", marlhf_last_error());
    EXPECT(!marlhf_trainer_resume(model, &params, run) && strstr(marlhf_last_error(), "row-invariant forward") &&
               strstr(marlhf_last_error(), "checkpoint-1"),
           "'%s'", marlhf_last_error());
    EXPECT(marlhf_set_batch_invariant(1) == 0, "%s", marlhf_last_error());
    // Other base weights: the DPO-trained model saved by an earlier test.
    marlhf_model *other_base = load_policy(tmp_path("dpo_saved"), NULL);
    EXPECT(other_base && !marlhf_trainer_resume(other_base, &params, run) &&
               strstr(marlhf_last_error(), "other base weights"),
           "'%s'", marlhf_last_error());
    // Both models are as they were: a new trainer starts at the reference.
    marlhf_model *models[2] = {model, other_base};
    for (int i = 0; i < 2 && other_base; i++) {
        marlhf_trainer *fresh = marlhf_trainer_new(models[i], &params);
        marlhf_dpo_stats stats = {0};
        EXPECT(fresh && marlhf_dpo_step(fresh, train.pairs, 8, &stats) == 0, "%s", marlhf_last_error());
        EXPECT_CLOSE(stats.loss, log(2.0), 1e-6, 0, "first loss after a failed resume");
    }
    // A checkpoint folder of the command is not a trainer's.
    char checkpoint[700];
    snprintf(checkpoint, sizeof checkpoint, "%s", tmp_path("dpo_command"));
    marlhf_model *third = load_policy(tiny, NULL);
    EXPECT(!marlhf_trainer_resume(third, &params, checkpoint) && strstr(marlhf_last_error(), "marlhf_trainer_save"),
           "'%s'", marlhf_last_error());
    marlhf_model_free(third), marlhf_model_free(other_base), marlhf_model_free(model);
    free_pairs(&train);
}

// Two KTO steps over all 96 examples of the pairs file (one micro-batch, so one baseline per
// step on both sides), through `marlhf kto` and through the API: the same adapters up to the
// order in which the command's shuffled examples add up.
static void test_kto_matches_command(void) {
    marlhf_model *from_command = trained_by_command("kto", "--per-device-train-batch-size 96");
    Pairs train = read_pairs("tests/fixtures/train/pairs.jsonl");
    marlhf_feedback *examples = xmalloc((size_t)2 * train.count * sizeof(marlhf_feedback));
    for (int i = 0; i < train.count; i++) {
        examples[2 * i] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].chosen, 1};
        examples[2 * i + 1] = (marlhf_feedback){train.pairs[i].prompt, train.pairs[i].rejected, 0};
    }
    marlhf_model *model = load_policy(tiny, NULL);
    marlhf_trainer_params params = tiny_dpo_params();
    params.micro_batch = 96;
    marlhf_trainer *trainer = marlhf_trainer_new(model, &params);
    for (int step = 0; step < 2; step++)
        EXPECT(marlhf_kto_step(trainer, examples, 2 * train.count, NULL) == 0, "%s", marlhf_last_error());
    const double worst = worst_logprob_difference(model, from_command, &train, true);
    EXPECT(worst < 1e-4, "worst relative log-prob difference %.3g", worst);
    fprintf(stderr, "  KTO API vs command after 2 steps: worst relative log-prob difference %.3g\n", worst);
    free(examples);
    marlhf_model_free(model), marlhf_model_free(from_command);
    free_pairs(&train);
}

static void test_dpo_bad_arguments(void) {
    marlhf_model *model = load_policy(tiny, NULL);
    if (!model) return test_current_failures++, (void)0;
    marlhf_trainer_params p;
#define BAD(change, word)                                                                                   \
    do {                                                                                                    \
        p = tiny_dpo_params();                                                                              \
        change;                                                                                             \
        EXPECT(!marlhf_trainer_new(model, &p) && strstr(marlhf_last_error(), word), "%s: '%s'", #change, \
               marlhf_last_error());                                                                        \
    } while (0)
    BAD(p.loss = "kto", "loss");
    BAD(p.loss = NULL, "loss");
    BAD(p.beta = 0, "beta");
    BAD(p.beta = NAN, "beta");
    BAD(p.label_smoothing = 0.5, "label_smoothing");
    BAD((p.loss = "ipo", p.label_smoothing = 0.1), "label_smoothing");
    BAD(p.loss = "exo", "label_smoothing");
    BAD((p.loss = "discopop", p.discopop_tau = -1), "discopop_tau");
    BAD(p.f_divergence = "chi2", "f_divergence");
    BAD(p.ld_alpha = 1.5, "ld_alpha");
    BAD((p.ld_alpha = 0.5, p.sft_weight = 0.5), "ld_alpha");
    BAD((p.loss = "nca", p.f_divergence = "js"), "f-divergence");
    BAD(p.cpo_alpha = 1, "cpo_alpha");
    BAD((p.loss = "cpo", p.sft_weight = 0.5), "sft_weight");
    BAD((p.loss = "cpo", p.cpo_alpha = NAN), "cpo_alpha");
    BAD(p.loss = "alphapo", "alphapo_alpha");                       // needs a non-zero alpha
    BAD((p.loss = "alphapo", p.alphapo_alpha = 1, p.cpo_alpha = 1), "cpo_alpha");
    BAD(p.alphapo_alpha = 1, "alphapo_alpha");                      // sigmoid is not CPOTrainer's
    BAD((p.loss = "simpo", p.alphapo_alpha = NAN), "alphapo_alpha");
    BAD((p.loss = "cpo-hinge", p.label_smoothing = 0.1), "label_smoothing");
    BAD(p.sft_weight = -1, "sft_weight");
    BAD(p.lora_rank = 0, "lora_rank");
    BAD(p.lora_modules = "q_proj,foo", "foo");
    BAD(p.learning_rate = INFINITY, "learning_rate");
    BAD(p.max_grad_norm = -1, "max_grad_norm");
    BAD(p.max_seq_len = 1, "max_seq_len");
    BAD(p.micro_batch = 0, "micro_batch");
    BAD(p.desirable_weight = 0, "desirable_weight");
    BAD(p.undesirable_weight = NAN, "undesirable_weight");
    BAD(p.lora_rank_pattern = "q_proj(=8", "lora_rank_pattern");   // not a regular expression
    BAD(p.lora_rank_pattern = "q_proj=2.5", "lora_rank_pattern");  // not a whole rank
    BAD(p.lora_rank_pattern = "{\"q_proj\": 8", "lora_rank_pattern"); // broken JSON
    BAD(p.lora_alpha_pattern = "v_proj", "lora_alpha_pattern");   // not KEY=VALUE
    BAD(p.lora_alpha_pattern = "{\"v_proj\": -1}", "lora_alpha_pattern");
    BAD(p.lora_dropout = 1, "lora_dropout");
    BAD(p.lora_dropout = NAN, "lora_dropout");
    BAD(p.lora_modules_regex = "", "lora_modules_regex");            // empty
    BAD(p.lora_modules_regex = ".*(lm_head|q_proj)", "lora_modules_regex"); // the LM head too
    BAD((p.lora_modules = "q_proj", p.lora_modules_regex = ".*q_proj"), "lora_modules_regex");
    BAD(p.lora_layers = "1-0", "lora_layers");
    BAD(p.lora_layers = "0,x", "lora_layers");
    BAD((p.lora_layers = "0", p.lora_modules_regex = ".*q_proj"), "lora_modules_regex"); // not both
#undef BAD
    // None of those touched the model: a good trainer still starts at the reference.
    marlhf_trainer_params good = tiny_dpo_params();
    good.max_seq_len = 4; // shorter than every prompt: no response token is left
    marlhf_trainer *trainer = marlhf_trainer_new(model, &good);
    EXPECT(trainer, "%s", marlhf_last_error());
    marlhf_preference pair = {"Tell me about the cat.", " The cat is good.", " The cat is bad."};
    EXPECT(marlhf_dpo_step(trainer, &pair, 1, NULL) == -1 && strstr(marlhf_last_error(), "max_seq_len"), "'%s'",
           marlhf_last_error());
    marlhf_preference broken = {"Tell me about the cat.", NULL, " The cat is bad."};
    EXPECT(marlhf_dpo_step(trainer, &broken, 1, NULL) == -1 && strstr(marlhf_last_error(), "pairs[0]"), "'%s'",
           marlhf_last_error());
    EXPECT(marlhf_dpo_step(trainer, &pair, 0, NULL) == -1, "zero pairs");
    marlhf_model_free(model);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s/api", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
    fs_remove_tree(tmp);
    CHECK(fs_mkdir_p(tmp) == 0, "%s", err_msg());
    // The row-invariant CPU forward (docs/embedding.md), before the first model; the commands
    // the tests run are given --batch-invariant. test_adapter_settings_match_command needs it.
    unsetenv("MARLHF_CPU_MATMUL");
    CHECK(marlhf_set_batch_invariant(1) == 0, "%s", marlhf_last_error());
    marlhf_set_threads(2);
    RUN(test_batch_invariant_setting);
    RUN(test_load_errors);
    RUN(test_tokenize);
    RUN(test_logprob);
    RUN(test_quantized_policy);
    RUN(test_generate);
    RUN(test_generate_batch);
    RUN(test_reward);
    RUN(test_dpo_first_step_at_reference);
    RUN(test_dpo_learns_saves_and_reloads);
    RUN(test_dpo_deterministic);
    RUN(test_kto_steps);
    RUN(test_kto_apo_zero_single_examples);
    RUN(test_dpo_matches_command);
    RUN(test_kto_matches_command);
    RUN(test_adapter_settings_match_command);
    RUN(test_dpo_resume_exact);
    RUN(test_dpo_resume_errors);
    RUN(test_dpo_bad_arguments);
    TEST_EXIT();
}
