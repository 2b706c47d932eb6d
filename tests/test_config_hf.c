// Tests of model/config_hf: the config.json files transformers writes for each family
// (fixtures from tools/make_safetensors_fixtures.py), 4.x-style files written by
// hand, the writer (round trip through the reader), and bad input, which must be a
// clean error naming the file and the field.
//
// It also leaves tiny complete model folders (config.json + model.safetensors) under
// $MARLHF_TEST_TMP/test_config_hf/hf_tiny_* for tools/check_safetensors_roundtrip.py,
// which loads them with transformers.
#include <jansson.h>
#include <math.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/config_hf.h"
#include "test.h"

#define CONFIGS "tests/fixtures/safetensors/configs"

static char scratch[1024];

static const char *tmp_path(const char *name) {
    static char paths[8][2048];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", scratch, name);
    return p;
}

#define EXPECT_ERROR(rc, ...)                                                            \
    do {                                                                                 \
        int expect_rc_ = (rc);                                                           \
        EXPECT(expect_rc_ == -1, "rc %d", expect_rc_);                                   \
        const char *expect_pieces_[] = {__VA_ARGS__};                                    \
        for (size_t k_ = 0; k_ < sizeof expect_pieces_ / sizeof expect_pieces_[0]; k_++) \
            EXPECT(strstr(err_msg(), expect_pieces_[k_]), "message '%s' lacks '%s'",     \
                   err_msg(), expect_pieces_[k_]);                                       \
    } while (0)

// Every field of two configs; `what` names the case in failure messages.
static void expect_same_config(const ModelConfig *a, const ModelConfig *b, const char *what) {
#define SAME(field) EXPECT(a->field == b->field, "%s: " #field " %g vs %g", what, (double)a->field, (double)b->field)
    SAME(family);
    SAME(vocab_size);
    SAME(hidden_size);
    SAME(num_layers);
    SAME(num_heads);
    SAME(num_kv_heads);
    SAME(head_dim);
    SAME(intermediate_size);
    SAME(max_position_embeddings);
    SAME(sliding_window);
    SAME(sliding_window_first_layer);
    SAME(norm);
    SAME(norm_eps);
    SAME(norm_weight_plus_one);
    SAME(positions);
    SAME(mlp);
    SAME(qkv_bias);
    SAME(o_bias);
    SAME(mlp_bias);
    SAME(norm_bias);
    SAME(qk_norm);
    SAME(sandwich_norms);
    SAME(attn_logit_softcap);
    SAME(final_logit_softcap);
    SAME(query_pre_attn_scalar);
    SAME(rope_local_theta);
    SAME(sliding_window_pattern);
    SAME(tie_word_embeddings);
    SAME(embedding_multiplier);
    SAME(bos_token_id);
    SAME(eos_token_id);
    SAME(pad_token_id);
    if (a->positions == POSITIONS_ROPE) SAME(rope_theta);
    SAME(rope_scaling);
    SAME(rope_factor);
    SAME(rope_low_freq_factor);
    SAME(rope_high_freq_factor);
    SAME(rope_original_max_positions);
#undef SAME
    EXPECT(strcmp(a->model_type, b->model_type) == 0, "%s: model_type %s vs %s", what, a->model_type, b->model_type);
}

// Expected configs of the fixtures (the sizes given in make_safetensors_fixtures.py).
static ModelConfig expected_config(const char *name) {
    ModelConfig c = {0};
    c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;
    c.rope_theta = 10000.0f;
    if (strncmp(name, "gpt2", 4) == 0) {
        c.family = FAMILY_GPT2;
        c.vocab_size = 96, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 4;
        c.head_dim = 8, c.intermediate_size = 128, c.max_position_embeddings = 64, c.norm_eps = 1e-5f;
        c.tie_word_embeddings = true, c.bos_token_id = 0, c.eos_token_id = 1;
        if (strcmp(name, "gpt2_untied") == 0) {
            c.intermediate_size = 80, c.norm_eps = 1e-6f, c.tie_word_embeddings = false;
            c.bos_token_id = 5, c.eos_token_id = 6, c.pad_token_id = 7;
        }
    } else if (strncmp(name, "llama", 5) == 0) {
        c.family = FAMILY_LLAMA;
        c.vocab_size = 128, c.hidden_size = 64, c.intermediate_size = 160, c.num_layers = 3, c.num_heads = 8;
        c.num_kv_heads = 2, c.head_dim = 8, c.max_position_embeddings = 256, c.norm_eps = 1e-5f;
        c.rope_theta = 50000.0f, c.tie_word_embeddings = true, c.bos_token_id = 1, c.eos_token_id = 2;
        c.pad_token_id = 0;
        if (strcmp(name, "llama_bias") == 0) {
            c.norm_eps = 1e-6f, c.rope_theta = 10000.0f, c.tie_word_embeddings = false, c.pad_token_id = -1;
        }
    } else if (strncmp(name, "mistral", 7) == 0) {
        c.family = FAMILY_MISTRAL;
        c.vocab_size = 128, c.hidden_size = 64, c.intermediate_size = 128, c.num_layers = 2, c.num_heads = 4;
        c.num_kv_heads = 1, c.head_dim = 32, c.max_position_embeddings = 512, c.norm_eps = 1e-6f;
        c.bos_token_id = 1, c.eos_token_id = 2;
        if (strcmp(name, "mistral_window") == 0) c.head_dim = 16, c.sliding_window = 128;
    } else if (strcmp(name, "qwen2") == 0) {
        c.family = FAMILY_QWEN2;
        c.vocab_size = 160, c.hidden_size = 64, c.intermediate_size = 96, c.num_layers = 2, c.num_heads = 4;
        c.num_kv_heads = 2, c.head_dim = 16, c.max_position_embeddings = 1024, c.norm_eps = 1e-6f;
        c.rope_theta = 1e6f, c.tie_word_embeddings = true, c.eos_token_id = 151;
    } else {
        CHECK(strcmp(name, "gemma") == 0, "unknown fixture %s", name);
        c.family = FAMILY_GEMMA;
        c.vocab_size = 128, c.hidden_size = 48, c.intermediate_size = 96, c.num_layers = 2, c.num_heads = 4;
        c.num_kv_heads = 1, c.head_dim = 16, c.max_position_embeddings = 128, c.norm_eps = 1e-6f;
        c.tie_word_embeddings = true, c.bos_token_id = 2, c.eos_token_id = 1, c.pad_token_id = 0;
    }
    CHECK(config_finish(&c, name) == 0, "%s", err_msg());
    if (strcmp(name, "llama_bias") == 0) c.qkv_bias = c.o_bias = true;
    return c;
}

static const char *const good_fixtures[] = {"gpt2",  "gpt2_untied", "llama", "llama_bias",
                                            "mistral", "mistral_window", "qwen2", "gemma"};
enum { GOOD_FIXTURES = sizeof good_fixtures / sizeof good_fixtures[0] };

static void test_transformers_configs(void) {
    for (int i = 0; i < GOOD_FIXTURES; i++) {
        char path[256];
        snprintf(path, sizeof path, CONFIGS "/%s/config.json", good_fixtures[i]);
        ModelConfig cfg, expected = expected_config(good_fixtures[i]);
        EXPECT(config_from_hf_json(&cfg, path) == 0, "%s", err_msg());
        expect_same_config(&cfg, &expected, good_fixtures[i]);
    }
    ModelConfig cfg;
    EXPECT(config_from_hf_json(&cfg, CONFIGS "/gemma") == 0, "a folder: %s", err_msg());
    EXPECT(cfg.mlp == MLP_GEGLU && cfg.norm_weight_plus_one && cfg.embedding_multiplier == sqrtf(48.0f), "gemma");
    EXPECT(config_from_hf_json(&cfg, CONFIGS "/qwen2") == 0 && cfg.qkv_bias && !cfg.o_bias, "qwen2 biases");
    // Llama 3.1's RoPE scaling, as transformers 5 writes it.
    EXPECT(config_from_hf_json(&cfg, CONFIGS "/llama_rope_scaling") == 0, "%s", err_msg());
    EXPECT(cfg.rope_scaling == ROPE_SCALING_LLAMA3 && cfg.rope_factor == 8.0f && cfg.rope_low_freq_factor == 1.0f &&
               cfg.rope_high_freq_factor == 4.0f && cfg.rope_original_max_positions == 128 &&
               cfg.rope_theta == 500000.0f,
           "llama3 scaling read as %d, %g, %g, %g, %d", (int)cfg.rope_scaling, (double)cfg.rope_factor,
           (double)cfg.rope_low_freq_factor, (double)cfg.rope_high_freq_factor, cfg.rope_original_max_positions);
    EXPECT_ERROR(config_from_hf_json(&cfg, CONFIGS "/gpt2_erf_gelu"), "'activation_function'", "'gelu'",
                 CONFIGS "/gpt2_erf_gelu/config.json");
}

static const char *write_text(const char *name, const char *text) {
    const char *path = tmp_path(name);
    CHECK(fs_write_file_atomic(path, text, strlen(text)) == 0, "%s", err_msg());
    return path;
}

// Shapes of config.json written by transformers 4.x and of real hub checkpoints.
static void test_hand_written_configs(void) {
    ModelConfig cfg;
    const char *tinyllama =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
        " \"hidden_act\": \"silu\", \"hidden_size\": 64, \"initializer_range\": 0.02, \"intermediate_size\": 176,"
        " \"max_position_embeddings\": 2048, \"model_type\": \"llama\", \"num_attention_heads\": 4,"
        " \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
        " \"rope_scaling\": null, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
        " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.35.0\", \"use_cache\": true,"
        " \"vocab_size\": 100}";
    EXPECT(config_from_hf_json(&cfg, write_text("tinyllama.json", tinyllama)) == 0, "%s", err_msg());
    EXPECT(cfg.rope_theta == 500000.0f && cfg.head_dim == 16 && cfg.num_kv_heads == 1 && cfg.eos_token_id == 2 &&
               cfg.pad_token_id == -1 && !cfg.tie_word_embeddings && cfg.intermediate_size == 176,
           "tinyllama-style");

    // Gemma as first released: hidden_act "gelu" meaning the tanh form.
    const char *gemma = "{\"model_type\": \"gemma\", \"hidden_act\": \"gelu\", \"hidden_activation\": null,"
                        " \"hidden_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                        " \"head_dim\": 8, \"intermediate_size\": 64, \"max_position_embeddings\": 64,"
                        " \"vocab_size\": 50, \"rope_scaling\": {\"rope_type\": \"default\"}}";
    EXPECT(config_from_hf_json(&cfg, write_text("gemma_legacy.json", gemma)) == 0, "%s", err_msg());
    EXPECT(cfg.tie_word_embeddings && cfg.mlp == MLP_GEGLU && cfg.head_dim == 8 && cfg.norm_eps == 1e-6f, "gemma");
    const char *gemma_erf = "{\"model_type\": \"gemma\", \"hidden_activation\": \"gelu\", \"hidden_size\": 32,"
                            " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"intermediate_size\": 64,"
                            " \"max_position_embeddings\": 64, \"vocab_size\": 50}";
    EXPECT_ERROR(config_from_hf_json(&cfg, write_text("gemma_erf.json", gemma_erf)), "'hidden_activation'",
                 "gemma_erf.json");

    const char *qwen_window = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"num_hidden_layers\": 1,"
                              " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                              " \"max_position_embeddings\": 4096, \"use_sliding_window\": true,"
                              " \"sliding_window\": 1024, \"eos_token_id\": [7, 8]}";
    EXPECT(config_from_hf_json(&cfg, write_text("qwen_window.json", qwen_window)) == 0, "%s", err_msg());
    // transformers' max_window_layers defaults to 28: a 1-layer model has no sliding layer.
    EXPECT(cfg.max_position_embeddings == 4096 && cfg.sliding_window == 1024 && cfg.sliding_window_first_layer == 28 &&
               config_layer_window(&cfg, 0) == 0 && cfg.eos_token_id == 7 && cfg.bos_token_id == -1,
           "qwen window");
    const char *qwen_unused = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"num_hidden_layers\": 1,"
                              " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                              " \"max_position_embeddings\": 4096, \"use_sliding_window\": false,"
                              " \"sliding_window\": 1024}";
    EXPECT(config_from_hf_json(&cfg, write_text("qwen_unused.json", qwen_unused)) == 0, "%s", err_msg());
    EXPECT(cfg.max_position_embeddings == 4096 && cfg.sliding_window == 0, "unused window: %d",
           cfg.sliding_window);
    const char *mistral_default = "{\"model_type\": \"mistral\", \"hidden_size\": 32, \"num_hidden_layers\": 1,"
                                  " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                                  " \"max_position_embeddings\": 32768}";
    EXPECT(config_from_hf_json(&cfg, write_text("mistral_default.json", mistral_default)) == 0, "%s", err_msg());
    EXPECT(cfg.max_position_embeddings == 32768 && cfg.sliding_window == 4096 && config_layer_window(&cfg, 0) == 4096,
           "mistral default window: %d", cfg.sliding_window);
    // transformers 5's layer_types spell out each family's sliding layers: Gemma 2's even ones.
    const char *gemma2_types = "{\"model_type\": \"gemma2\", \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                               " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                               " \"max_position_embeddings\": 64, \"sliding_window\": 8,"
                               " \"layer_types\": [\"sliding_attention\", \"full_attention\"]}";
    EXPECT(config_from_hf_json(&cfg, write_text("gemma2_types.json", gemma2_types)) == 0, "%s", err_msg());
    EXPECT(config_layer_window(&cfg, 0) == 8 && config_layer_window(&cfg, 1) == 0, "gemma2 layer windows");
    const char *gemma2_swapped = "{\"model_type\": \"gemma2\", \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                                 " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                                 " \"max_position_embeddings\": 64, \"sliding_window\": 8,"
                                 " \"layer_types\": [\"full_attention\", \"sliding_attention\"]}";
    EXPECT_ERROR(config_from_hf_json(&cfg, write_text("gemma2_swapped.json", gemma2_swapped)),
                 "'layer_types' entry 0 is \"full_attention\"", "sliding_attention", "gemma2_swapped.json");
    const char *negative_window = "{\"model_type\": \"mistral\", \"hidden_size\": 32, \"num_hidden_layers\": 1,"
                                  " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50,"
                                  " \"max_position_embeddings\": 64, \"sliding_window\": -3}";
    EXPECT_ERROR(config_from_hf_json(&cfg, write_text("negative_window.json", negative_window)), "'sliding_window'",
                 "negative_window.json");
}

// One field changed from a valid llama config: `field_json` replaces "hidden_size": 64.
static const char *llama_with(const char *name, const char *field_json) {
    static char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"llama\", %s, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"intermediate_size\": 128, \"max_position_embeddings\": 64, \"vocab_size\": 100}",
             field_json);
    return write_text(name, text);
}

static void test_bad_configs(void) {
    ModelConfig cfg;
    const char *path = llama_with("ok.json", "\"hidden_size\": 64");
    EXPECT(config_from_hf_json(&cfg, path) == 0, "%s", err_msg());

    path = llama_with("missing.json", "\"hidden\": 64");
    char want[2048];
    snprintf(want, sizeof want, "config.json has no field 'hidden_size' (%s)", path);
    EXPECT_ERROR(config_from_hf_json(&cfg, path), want);
    const struct {
        const char *name, *field_json, *pieces[2];
    } cases[] = {
        {"null.json", "\"hidden_size\": null", {"'hidden_size'", "null"}},
        {"string.json", "\"hidden_size\": \"64\"", {"'hidden_size'", "integer"}},
        {"real.json", "\"hidden_size\": 64.5", {"'hidden_size'", "integer"}},
        {"huge.json", "\"hidden_size\": 99999999999", {"'hidden_size'", "range"}},
        {"zero.json", "\"hidden_size\": 0", {"hidden_size", "positive"}},
        {"kv.json", "\"hidden_size\": 64, \"num_key_value_heads\": 3", {"num_key_value_heads", "3"}},
        {"eps.json", "\"hidden_size\": 64, \"rms_norm_eps\": \"small\"", {"'rms_norm_eps'", "number"}},
        {"tie.json", "\"hidden_size\": 64, \"tie_word_embeddings\": 1", {"'tie_word_embeddings'", "true or false"}},
        {"eos.json", "\"hidden_size\": 64, \"eos_token_id\": \"</s>\"", {"'eos_token_id'", "integer"}},
        {"eos_list.json", "\"hidden_size\": 64, \"eos_token_id\": [\"x\"]", {"'eos_token_id'", "integer"}},
        {"act.json", "\"hidden_size\": 64, \"hidden_act\": \"relu\"", {"'hidden_act'", "'relu'"}},
        {"act_type.json", "\"hidden_size\": 64, \"hidden_act\": 3", {"'hidden_act'", "string"}},
        {"mlp_bias.json", "\"hidden_size\": 64, \"mlp_bias\": true", {"'mlp_bias'", "not implemented"}},
        {"rope.json", "\"hidden_size\": 64, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}",
         {"unsupported rope_scaling", "'yarn'"}},
        {"rope_linear.json", "\"hidden_size\": 64, \"rope_scaling\": {\"type\": \"linear\"}",
         {"'rope_scaling.factor'", "no field"}},
        {"rope_llama3.json",
         "\"hidden_size\": 64, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 8192}",
         {"'rope_scaling.low_freq_factor'", "no field"}},
        {"rope_factor.json", "\"hidden_size\": 64, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 0.5}",
         {"RoPE scaling factor", "at least 1"}},
        {"rope_type.json", "\"hidden_size\": 64, \"rope_scaling\": 2", {"'rope_scaling'", "object"}},
        {"rope_theta.json", "\"hidden_size\": 64, \"rope_parameters\": {\"rope_theta\": \"big\"}",
         {"'rope_parameters.rope_theta'", "number"}},
        {"partial.json", "\"hidden_size\": 64, \"partial_rotary_factor\": 0.5", {"unsupported rope_scaling", ""}},
        {"duplicate.json", "\"hidden_size\": 64, \"model_type\": \"bert\"", {"duplicate", "bad JSON"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        path = llama_with(cases[i].name, cases[i].field_json);
        EXPECT_ERROR(config_from_hf_json(&cfg, path), cases[i].pieces[0], cases[i].pieces[1], path);
    }
    const struct {
        const char *name, *text, *pieces[2];
    } files[] = {
        {"bert.json", "{\"model_type\": \"bert\", \"hidden_size\": 64}", {"'model_type'", "'bert'"}},
        {"no_type.json", "{\"hidden_size\": 64}", {"config.json has no field 'model_type'", ""}},
        {"type_type.json", "{\"model_type\": 3}", {"'model_type'", "string"}},
        {"bad.json", "{\"model_type\": \"llama\",\n \"hidden_size\": 64,,}", {"bad JSON in config.json at line 2", ""}},
        {"list.json", "[1, 2]", {"not a JSON object", ""}},
        {"empty.json", "", {"bad JSON", ""}},
        {"gpt2_scale.json",
         "{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 16,"
         " \"vocab_size\": 10, \"scale_attn_by_inverse_layer_idx\": true}",
         {"'scale_attn_by_inverse_layer_idx'", ""}},
        {"gpt2_heads.json",
         "{\"model_type\": \"gpt2\", \"n_embd\": 30, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 16,"
         " \"vocab_size\": 10}",
         {"hidden_size 30", ""}},
        {"gpt2_missing.json", "{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4}",
         {"no field 'n_positions'", ""}},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        path = write_text(files[i].name, files[i].text);
        EXPECT_ERROR(config_from_hf_json(&cfg, path), files[i].pieces[0], files[i].pieces[1], path);
    }
    EXPECT_ERROR(config_from_hf_json(&cfg, tmp_path("absent.json")), "absent.json");
    EXPECT_ERROR(config_from_hf_json(&cfg, scratch), "config.json");
}

static json_t *load_json(const char *path) {
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    EXPECT(root, "%s: %s", path, error.text);
    return root;
}

static void test_write_roundtrip(void) {
    for (int i = 0; i < GOOD_FIXTURES; i++) {
        ModelConfig cfg = expected_config(good_fixtures[i]), back;
        char name[128];
        snprintf(name, sizeof name, "written_%s.json", good_fixtures[i]);
        const char *path = tmp_path(name);
        const char *arch = config_hf_causal_lm_architecture(cfg.family);
        EXPECT(config_write_hf_json(&cfg, path, arch) == 0, "%s", err_msg());
        EXPECT(config_from_hf_json(&back, path) == 0, "%s", err_msg());
        expect_same_config(&back, &cfg, name);
        json_t *root = load_json(path);
        if (!root) continue;
        EXPECT(strcmp(json_string_value(json_array_get(json_object_get(root, "architectures"), 0)), arch) == 0,
               "architectures");
        EXPECT(strcmp(json_string_value(json_object_get(root, "dtype")), "float32") == 0, "dtype");
        EXPECT(json_object_get(root, "num_labels") == NULL, "no num_labels for a causal LM");
        json_decref(root);
    }
    // Qwen3 (q/k norms, no biases; with attention_bias, biases on q/k/v and o): the file
    // transformers wrote for the tiny model, and round trips.
    ModelConfig qwen3;
    EXPECT(config_from_hf_json(&qwen3, "tests/fixtures/models/qwen3") == 0, "%s", err_msg());
    EXPECT(qwen3.family == FAMILY_QWEN3 && qwen3.qk_norm && !qwen3.qkv_bias && !qwen3.o_bias && qwen3.head_dim == 24,
           "qwen3 read as family %d qk_norm %d head_dim %d", (int)qwen3.family, qwen3.qk_norm, qwen3.head_dim);
    for (int biased = 0; biased < 2; biased++) {
        ModelConfig back;
        qwen3.qkv_bias = qwen3.o_bias = biased;
        const char *qwen3_path = tmp_path(biased ? "written_qwen3_bias.json" : "written_qwen3.json");
        EXPECT(config_write_hf_json(&qwen3, qwen3_path, "Qwen3ForCausalLM") == 0, "%s", err_msg());
        EXPECT(config_from_hf_json(&back, qwen3_path) == 0, "%s", err_msg());
        expect_same_config(&back, &qwen3, qwen3_path);
    }
    // Gemma 2: the tiny model's file (soft caps 1.5 / 3, query_pre_attn_scalar 24), written
    // and read back with and without caps (null: none); Gemma2Config's defaults for what a
    // file leaves out (caps 50 / 30, scalar 256, head_dim 256, a window of 4096 lowering the
    // context of 8192); the bad values refused.
    ModelConfig gemma2;
    EXPECT(config_from_hf_json(&gemma2, "tests/fixtures/models/gemma2") == 0, "%s", err_msg());
    EXPECT(gemma2.family == FAMILY_GEMMA2 && gemma2.sandwich_norms && gemma2.norm_weight_plus_one &&
               gemma2.mlp == MLP_GEGLU && gemma2.tie_word_embeddings && gemma2.attn_logit_softcap == 1.5f &&
               gemma2.final_logit_softcap == 3.0f && gemma2.query_pre_attn_scalar == 24.0f && gemma2.head_dim == 16 &&
               gemma2.max_position_embeddings == 64 && gemma2.embedding_multiplier == 8.0f,
           "gemma2 read as family %d caps %g/%g scalar %g", (int)gemma2.family, (double)gemma2.attn_logit_softcap,
           (double)gemma2.final_logit_softcap, (double)gemma2.query_pre_attn_scalar);
    EXPECT(config_num_params(&gemma2) == 82496, "gemma2 parameters: %lld", config_num_params(&gemma2));
    for (int capped = 0; capped < 2; capped++) {
        ModelConfig written = gemma2, back;
        if (!capped) written.attn_logit_softcap = written.final_logit_softcap = 0.0f;
        const char *gemma2_path = tmp_path(capped ? "written_gemma2.json" : "written_gemma2_uncapped.json");
        EXPECT(config_write_hf_json(&written, gemma2_path, "Gemma2ForCausalLM") == 0, "%s", err_msg());
        EXPECT(config_from_hf_json(&back, gemma2_path) == 0, "%s", err_msg());
        expect_same_config(&back, &written, gemma2_path);
    }
    const char *gemma2_minimal =
        "{\"model_type\": \"gemma2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"intermediate_size\": 128, \"max_position_embeddings\": 8192, \"vocab_size\": 100}";
    ModelConfig defaults;
    EXPECT(config_from_hf_json(&defaults, write_text("gemma2_defaults.json", gemma2_minimal)) == 0, "%s", err_msg());
    EXPECT(defaults.attn_logit_softcap == 50.0f && defaults.final_logit_softcap == 30.0f &&
               defaults.query_pre_attn_scalar == 256.0f && defaults.head_dim == 256 &&
               defaults.max_position_embeddings == 8192 && defaults.sliding_window == 4096 && defaults.tie_word_embeddings,
           "gemma2 defaults: caps %g/%g scalar %g head_dim %d context %d window %d", (double)defaults.attn_logit_softcap,
           (double)defaults.final_logit_softcap, (double)defaults.query_pre_attn_scalar, defaults.head_dim,
           defaults.max_position_embeddings, defaults.sliding_window);
    const struct {
        const char *name, *field, *pieces[2];
    } gemma2_bad[] = {
        {"gemma2_cap.json", "\"attn_logit_softcapping\": -1", {"'attn_logit_softcapping'", "positive or null"}},
        {"gemma2_cap_type.json", "\"final_logit_softcapping\": \"30\"", {"'final_logit_softcapping'", "number"}},
        {"gemma2_scalar.json", "\"query_pre_attn_scalar\": 0", {"'query_pre_attn_scalar'", "positive"}},
        {"gemma2_bidirectional.json", "\"use_bidirectional_attention\": true",
         {"'use_bidirectional_attention'", "not implemented"}},
    };
    for (size_t i = 0; i < sizeof gemma2_bad / sizeof gemma2_bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "{\"model_type\": \"gemma2\", %s, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"max_position_embeddings\": 64, "
                 "\"vocab_size\": 100}", gemma2_bad[i].field);
        const char *bad_path = write_text(gemma2_bad[i].name, text);
        EXPECT_ERROR(config_from_hf_json(&defaults, bad_path), gemma2_bad[i].pieces[0], gemma2_bad[i].pieces[1],
                     bad_path);
    }
    // Gemma 3 (text): the tiny model's file as transformers 5 writes it (per-layer-type RoPE,
    // layer_types; linear scaling 8 on the full layers), 4.x's fields (rope_theta,
    // rope_scaling, rope_local_base_freq, sliding_window_pattern) for the same model, the
    // round trip, Gemma3TextConfig's defaults, and the refusals.
    ModelConfig gemma3;
    EXPECT(config_from_hf_json(&gemma3, "tests/fixtures/models/gemma3") == 0, "%s", err_msg());
    EXPECT(gemma3.family == FAMILY_GEMMA3 && gemma3.sandwich_norms && gemma3.qk_norm && gemma3.norm_weight_plus_one &&
               gemma3.attn_logit_softcap == 0.0f && gemma3.final_logit_softcap == 0.0f &&
               gemma3.query_pre_attn_scalar == 24.0f && gemma3.rope_theta == 1e6f &&
               gemma3.rope_scaling == ROPE_SCALING_LINEAR && gemma3.rope_factor == 8.0f &&
               gemma3.rope_local_theta == 1e4f && gemma3.sliding_window_pattern == 2 &&
               config_layer_uses_local_rope(&gemma3, 0) && !config_layer_uses_local_rope(&gemma3, 1),
           "gemma3 read as family %d theta %g/%g pattern %d", (int)gemma3.family, (double)gemma3.rope_theta,
           (double)gemma3.rope_local_theta, gemma3.sliding_window_pattern);
    {
        ModelConfig back;
        const char *gemma3_path = tmp_path("written_gemma3.json");
        EXPECT(config_write_hf_json(&gemma3, gemma3_path, "Gemma3ForCausalLM") == 0, "%s", err_msg());
        EXPECT(config_from_hf_json(&back, gemma3_path) == 0, "%s", err_msg());
        expect_same_config(&back, &gemma3, gemma3_path);
        EXPECT(config_write_hf_json(&gemma3, tmp_path("written_gemma3_rm.json"), "Gemma3TextForSequenceClassification") == 0,
               "%s", err_msg());
        const char *fields_4x =
            "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
            "\"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128, \"max_position_embeddings\": 64, "
            "\"sliding_window\": 64, \"vocab_size\": 128, \"query_pre_attn_scalar\": 24, \"rms_norm_eps\": 1e-6, "
            "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}, "
            "\"rope_local_base_freq\": 20000.0, \"sliding_window_pattern\": 2, \"bos_token_id\": 1, \"eos_token_id\": 2, "
            "\"pad_token_id\": null}";
        ModelConfig want = gemma3; // none of the three values transformers' default
        want.rope_theta = 5e5f, want.rope_local_theta = 2e4f;
        EXPECT(config_from_hf_json(&back, write_text("gemma3_4x.json", fields_4x)) == 0, "%s", err_msg());
        expect_same_config(&back, &want, "gemma3 in 4.x's fields");
        const char *minimal =
            "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 26, \"num_attention_heads\": 4, "
            "\"intermediate_size\": 128, \"max_position_embeddings\": 32768, \"vocab_size\": 100}";
        EXPECT(config_from_hf_json(&back, write_text("gemma3_defaults.json", minimal)) == 0, "%s", err_msg());
        EXPECT(back.attn_logit_softcap == 0.0f && back.final_logit_softcap == 0.0f && back.query_pre_attn_scalar == 256.0f &&
                   back.head_dim == 256 && back.max_position_embeddings == 32768 && back.sliding_window == 4096 &&
                   back.rope_theta == 1e6f &&
                   back.rope_local_theta == 1e4f && back.sliding_window_pattern == 6 && back.tie_word_embeddings &&
                   config_layer_uses_local_rope(&back, 4) && !config_layer_uses_local_rope(&back, 5),
               "gemma3 defaults: caps %g/%g scalar %g head_dim %d context %d theta %g/%g pattern %d",
               (double)back.attn_logit_softcap, (double)back.final_logit_softcap, (double)back.query_pre_attn_scalar,
               back.head_dim, back.max_position_embeddings, (double)back.rope_theta, (double)back.rope_local_theta,
               back.sliding_window_pattern);
    }
    const struct {
        const char *name, *field, *pieces[2];
    } gemma3_bad[] = {
        {"gemma3_types.json", "\"layer_types\": [\"full_attention\", \"sliding_attention\"]", {"'layer_types'", "one pattern"}},
        {"gemma3_types_name.json", "\"layer_types\": [\"sliding_attention\", \"chunked_attention\"]", {"'layer_types'", "entry 1"}},
        {"gemma3_types_count.json", "\"layer_types\": [\"sliding_attention\"]", {"'layer_types'", "num_hidden_layers"}},
        {"gemma3_pattern.json", "\"sliding_window_pattern\": 0", {"'sliding_window_pattern'", "positive"}},
        {"gemma3_scaled_local.json",
         "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}, "
         "\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 1e4}}",
         {"'rope_parameters.sliding_attention'", "scales the sliding layers"}},
        {"gemma3_vision.json", "\"text_config\": {}", {"'gemma3'", "gemma3_text"}},
    };
    for (size_t i = 0; i < sizeof gemma3_bad / sizeof gemma3_bad[0]; i++) {
        char text[1024];
        const bool vision = strstr(gemma3_bad[i].name, "vision") != NULL;
        snprintf(text, sizeof text, "{\"model_type\": \"%s\", %s, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"max_position_embeddings\": 64, "
                 "\"vocab_size\": 100}", vision ? "gemma3" : "gemma3_text", gemma3_bad[i].field);
        ModelConfig bad;
        const char *bad_path = write_text(gemma3_bad[i].name, text);
        EXPECT_ERROR(config_from_hf_json(&bad, bad_path), gemma3_bad[i].pieces[0], gemma3_bad[i].pieces[1], bad_path);
    }
    // RoPE scaling, linear and Llama 3's, survives the round trip.
    for (int kind = 0; kind < 2; kind++) {
        ModelConfig scaled = expected_config("llama"), back;
        scaled.rope_scaling = kind == 0 ? ROPE_SCALING_LINEAR : ROPE_SCALING_LLAMA3;
        scaled.rope_factor = kind == 0 ? 2.0f : 32.0f;
        if (kind == 1)
            scaled.rope_low_freq_factor = 1.0f, scaled.rope_high_freq_factor = 4.0f, scaled.rope_original_max_positions = 8192;
        const char *scaled_path = tmp_path(kind == 0 ? "written_linear.json" : "written_llama3.json");
        EXPECT(config_write_hf_json(&scaled, scaled_path, "LlamaForCausalLM") == 0, "%s", err_msg());
        EXPECT(config_from_hf_json(&back, scaled_path) == 0, "%s", err_msg());
        expect_same_config(&back, &scaled, scaled_path);
    }
    // Floats are written as their shortest decimal.
    ModelConfig cfg = expected_config("qwen2");
    cfg.norm_eps = 1e-6f;
    const char *path = tmp_path("written_reward.json");
    const char *arch = config_hf_sequence_classification_architecture(FAMILY_QWEN2);
    EXPECT(strcmp(arch, "Qwen2ForSequenceClassification") == 0, "%s", arch);
    EXPECT(config_write_hf_json(&cfg, path, arch) == 0, "%s", err_msg());
    char *text;
    size_t size;
    EXPECT(fs_read_file(path, 1 << 16, &text, &size) == 0, "%s", err_msg());
    if (text) {
        EXPECT(strstr(text, "\"rms_norm_eps\": 1e-6") && strstr(text, "\"rope_theta\": 1000000.0"), "%s", text);
        EXPECT(strstr(text, "\"num_labels\": 1") && text[size - 1] == '\n', "%s", text);
        free(text);
    }

    EXPECT(strcmp(config_hf_causal_lm_architecture(FAMILY_GPT2), "GPT2LMHeadModel") == 0, "gpt2 arch");
    EXPECT(strcmp(config_hf_causal_lm_architecture(FAMILY_GEMMA), "GemmaForCausalLM") == 0, "gemma arch");
}

static void test_write_rejects(void) {
    ModelConfig cfg = expected_config("llama");
    const char *path = tmp_path("rejected.json");
    EXPECT_ERROR(config_write_hf_json(&cfg, path, "GemmaForCausalLM"), "'GemmaForCausalLM'", path);
    EXPECT_ERROR(config_write_hf_json(&cfg, path, NULL), "architecture", path);
    ModelConfig gemma = expected_config("gemma");
    EXPECT_ERROR(config_write_hf_json(&gemma, path, "Gemma2ForCausalLM"), "'Gemma2ForCausalLM'", path);
    cfg.qkv_bias = true;
    EXPECT_ERROR(config_write_hf_json(&cfg, path, "LlamaForCausalLM"), "q/k/v", path);
    ModelConfig qwen = expected_config("qwen2");
    qwen.qkv_bias = false;
    EXPECT_ERROR(config_write_hf_json(&qwen, path, "Qwen2ForCausalLM"), "biases", path);
    cfg = expected_config("llama");
    cfg.num_layers = 0;
    EXPECT_ERROR(config_write_hf_json(&cfg, path, "LlamaForCausalLM"), "num_hidden_layers", path);
    EXPECT(!fs_exists(path), "nothing written");
}

// --- tiny complete models for the Python check --------------------------------------

typedef struct {
    SafetensorsWriteTensor tensors[256];
    float *buffers[256];
    int count;
} TensorList;

static void add_tensor(TensorList *list, const char *name, long long rows, long long cols) {
    CHECK(list->count < 256, "too many tensors");
    SafetensorsWriteTensor *t = &list->tensors[list->count];
    t->name = xstrdup(name);
    t->dtype = SAFETENSORS_F32;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    long long n = rows * (cols > 0 ? cols : 1);
    float *data = xmalloc((size_t)n * sizeof *data);
    // Small distinct values; norms near 1 so that a forward pass stays finite.
    for (long long i = 0; i < n; i++)
        data[i] = (float)((i * 7 + list->count * 13) % 29 - 14) / 256.0f + (cols > 0 ? 0.0f : 1.0f);
    t->data = data;
    list->buffers[list->count++] = data;
}

static void add_layer_tensor(TensorList *list, const char *prefix, int layer, const char *name, long long rows,
                             long long cols) {
    char full[256];
    snprintf(full, sizeof full, "%s.%d.%s", prefix, layer, name);
    add_tensor(list, full, rows, cols);
}

static void tiny_tensors(const ModelConfig *c, bool reward, TensorList *list) {
    long long C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    long long q = (long long)c->num_heads * c->head_dim, kv = (long long)c->num_kv_heads * c->head_dim;
    list->count = 0;
    if (c->family == FAMILY_GPT2) {
        add_tensor(list, "transformer.wte.weight", V, C);
        add_tensor(list, "transformer.wpe.weight", c->max_position_embeddings, C);
        for (int l = 0; l < c->num_layers; l++) {
            const char *p = "transformer.h";
            add_layer_tensor(list, p, l, "ln_1.weight", C, 0);
            add_layer_tensor(list, p, l, "ln_1.bias", C, 0);
            add_layer_tensor(list, p, l, "attn.c_attn.weight", C, 3 * C); // Conv1D: [in, out]
            add_layer_tensor(list, p, l, "attn.c_attn.bias", 3 * C, 0);
            add_layer_tensor(list, p, l, "attn.c_proj.weight", C, C);
            add_layer_tensor(list, p, l, "attn.c_proj.bias", C, 0);
            add_layer_tensor(list, p, l, "ln_2.weight", C, 0);
            add_layer_tensor(list, p, l, "ln_2.bias", C, 0);
            add_layer_tensor(list, p, l, "mlp.c_fc.weight", C, I);
            add_layer_tensor(list, p, l, "mlp.c_fc.bias", I, 0);
            add_layer_tensor(list, p, l, "mlp.c_proj.weight", I, C);
            add_layer_tensor(list, p, l, "mlp.c_proj.bias", C, 0);
        }
        add_tensor(list, "transformer.ln_f.weight", C, 0);
        add_tensor(list, "transformer.ln_f.bias", C, 0);
    } else {
        add_tensor(list, "model.embed_tokens.weight", V, C);
        for (int l = 0; l < c->num_layers; l++) {
            const char *p = "model.layers";
            add_layer_tensor(list, p, l, "input_layernorm.weight", C, 0);
            add_layer_tensor(list, p, l, "self_attn.q_proj.weight", q, C);
            add_layer_tensor(list, p, l, "self_attn.k_proj.weight", kv, C);
            add_layer_tensor(list, p, l, "self_attn.v_proj.weight", kv, C);
            add_layer_tensor(list, p, l, "self_attn.o_proj.weight", C, q);
            if (c->qkv_bias) {
                add_layer_tensor(list, p, l, "self_attn.q_proj.bias", q, 0);
                add_layer_tensor(list, p, l, "self_attn.k_proj.bias", kv, 0);
                add_layer_tensor(list, p, l, "self_attn.v_proj.bias", kv, 0);
            }
            if (c->o_bias) add_layer_tensor(list, p, l, "self_attn.o_proj.bias", C, 0);
            add_layer_tensor(list, p, l, "post_attention_layernorm.weight", C, 0);
            add_layer_tensor(list, p, l, "mlp.gate_proj.weight", I, C);
            add_layer_tensor(list, p, l, "mlp.up_proj.weight", I, C);
            add_layer_tensor(list, p, l, "mlp.down_proj.weight", C, I);
        }
        add_tensor(list, "model.norm.weight", C, 0);
    }
    if (reward)
        add_tensor(list, "score.weight", 1, C);
    else if (!c->tie_word_embeddings)
        add_tensor(list, "lm_head.weight", V, C);
}

static void write_tiny_model(const char *fixture, bool reward) {
    ModelConfig cfg;
    char path[256];
    snprintf(path, sizeof path, CONFIGS "/%s", fixture);
    if (config_from_hf_json(&cfg, path) != 0) {
        EXPECT(0, "%s", err_msg());
        return;
    }
    char name[128];
    snprintf(name, sizeof name, "hf_tiny_%s%s", fixture, reward ? "_reward" : "");
    FsAtomicDir dir;
    if (fs_atomic_dir_begin(&dir, tmp_path(name)) != 0) {
        EXPECT(0, "%s", err_msg());
        return;
    }
    char *config_path = fs_join(dir.tmp_path, "config.json");
    char *weights_path = fs_join(dir.tmp_path, "model.safetensors");
    const char *arch = reward ? config_hf_sequence_classification_architecture(cfg.family)
                              : config_hf_causal_lm_architecture(cfg.family);
    static TensorList list;
    tiny_tensors(&cfg, reward, &list);
    int rc = config_write_hf_json(&cfg, config_path, arch);
    if (rc == 0) rc = safetensors_write(weights_path, list.tensors, list.count, NULL);
    EXPECT(rc == 0, "%s", err_msg());
    EXPECT(rc == 0 && fs_atomic_dir_commit(&dir) == 0, "%s", err_msg());
    if (rc != 0) fs_atomic_dir_abort(&dir);
    // Reading back what was written gives the same config and tensors.
    ModelConfig back;
    SafetensorsSet *set = NULL;
    EXPECT(config_from_hf_json(&back, tmp_path(name)) == 0, "%s", err_msg());
    expect_same_config(&back, &cfg, name);
    EXPECT(safetensors_open(tmp_path(name), &set) == 0, "%s", err_msg());
    EXPECT(set && safetensors_tensor_count(set) == list.count, "tensor count");
    for (int i = 0; set && i < list.count; i++) {
        const SafetensorsTensor *t = safetensors_find(set, list.tensors[i].name);
        EXPECT(t && memcmp(t->data, list.buffers[i], t->nbytes) == 0, "%s", list.tensors[i].name);
    }
    safetensors_close(set);
    for (int i = 0; i < list.count; i++) {
        free((char *)list.tensors[i].name);
        free(list.buffers[i]);
    }
    free(config_path);
    free(weights_path);
}

static void test_tiny_models(void) {
    const char *families[] = {"gpt2", "gpt2_untied", "llama", "llama_bias", "mistral", "qwen2", "gemma"};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) write_tiny_model(families[i], false);
    write_tiny_model("llama", true);
    write_tiny_model("gpt2", true);
}

int main(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP");
    snprintf(scratch, sizeof scratch, "%s/test_config_hf", tmp && tmp[0] ? tmp : "/tmp");
    CHECK(fs_remove_tree(scratch) == 0 && fs_mkdir_p(scratch) == 0, "%s", err_msg());
    RUN(test_transformers_configs);
    RUN(test_hand_written_configs);
    RUN(test_bad_configs);
    RUN(test_write_roundtrip);
    RUN(test_write_rejects);
    RUN(test_tiny_models);
    TEST_EXIT();
}
