// Model shapes the benchmarks build from random weights, and the FLOP count they share
// with the PyTorch scripts (bench/torch_train_step.py, bench/torch_gpu_train_step.py):
//   6 * (non-embedding params + vocab*hidden)  +  6 * layers * T * (heads * head_dim)
// i.e. the LM head counted even when tied, causal attention counted at half the square.
#pragma once
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/model.h"

static inline ModelConfig bench_shape(const char *name) {
    ModelConfig cfg = {0};
    if (!strcmp(name, "gpt2-124m")) {
        cfg.family = FAMILY_GPT2;
        cfg.vocab_size = 50257, cfg.hidden_size = 768, cfg.num_layers = 12, cfg.num_heads = 12;
        cfg.intermediate_size = 3072, cfg.max_position_embeddings = 1024, cfg.norm_eps = 1e-5f;
        cfg.tie_word_embeddings = true;
    } else if (!strcmp(name, "smollm2-135m")) {
        cfg.family = FAMILY_LLAMA;
        cfg.vocab_size = 49152, cfg.hidden_size = 576, cfg.num_layers = 30, cfg.num_heads = 9;
        cfg.num_kv_heads = 3, cfg.intermediate_size = 1536, cfg.max_position_embeddings = 8192;
        cfg.norm_eps = 1e-5f, cfg.rope_theta = 100000.0f, cfg.tie_word_embeddings = true;
    } else if (!strcmp(name, "gemma2-135m")) {
        // SmolLM2-135M's widths as a Gemma 2: sandwich norms, GeGLU, embeddings x sqrt(576),
        // the released models' soft caps (50 on the scores, 30 on the logits).
        cfg.family = FAMILY_GEMMA2;
        cfg.vocab_size = 49152, cfg.hidden_size = 576, cfg.num_layers = 30, cfg.num_heads = 9;
        cfg.num_kv_heads = 3, cfg.head_dim = 64, cfg.intermediate_size = 1536, cfg.max_position_embeddings = 4096;
        cfg.norm_eps = 1e-6f, cfg.rope_theta = 10000.0f, cfg.tie_word_embeddings = true;
        cfg.attn_logit_softcap = 50.0f, cfg.final_logit_softcap = 30.0f, cfg.query_pre_attn_scalar = 64.0f;
    } else if (!strcmp(name, "gemma3-135m")) {
        // SmolLM2-135M's widths as a Gemma 3: Gemma 2's layout with q/k norms, no soft caps,
        // every 6th layer a full-attention one turning by RoPE base 1e6, the others by 1e4.
        cfg.family = FAMILY_GEMMA3;
        cfg.vocab_size = 49152, cfg.hidden_size = 576, cfg.num_layers = 30, cfg.num_heads = 9;
        cfg.num_kv_heads = 3, cfg.head_dim = 64, cfg.intermediate_size = 1536, cfg.max_position_embeddings = 4096;
        cfg.norm_eps = 1e-6f, cfg.rope_theta = 1e6f, cfg.rope_local_theta = 1e4f, cfg.sliding_window_pattern = 6;
        cfg.tie_word_embeddings = true, cfg.query_pre_attn_scalar = 64.0f;
    } else if (!strcmp(name, "llama-1b")) {
        // A ~1.1B Llama (TinyLlama-like widths): 2048 hidden, 16 layers, GQA 32/8.
        cfg.family = FAMILY_LLAMA;
        cfg.vocab_size = 32000, cfg.hidden_size = 2048, cfg.num_layers = 16, cfg.num_heads = 32;
        cfg.num_kv_heads = 8, cfg.intermediate_size = 8192, cfg.max_position_embeddings = 8192;
        cfg.norm_eps = 1e-5f, cfg.rope_theta = 500000.0f, cfg.tie_word_embeddings = false;
    } else if (!strcmp(name, "tiny-llama")) {
        // Not a benchmark: the 1B shape's layout (GQA, untied head) at a size the CUDA
        // backend's CPU emulation runs in seconds, so that tests/cli/gpu_bench_emulated.sh
        // runs the benchmark programs as tests/gpu/run.sh does before a GPU ever sees them.
        cfg.family = FAMILY_LLAMA;
        cfg.vocab_size = 1024, cfg.hidden_size = 128, cfg.num_layers = 2, cfg.num_heads = 2;
        cfg.num_kv_heads = 1, cfg.intermediate_size = 256, cfg.max_position_embeddings = 2048;
        cfg.norm_eps = 1e-5f, cfg.rope_theta = 10000.0f, cfg.tie_word_embeddings = false;
    } else {
        die_user("unknown shape '%s' (gpt2-124m, smollm2-135m, gemma2-135m, gemma3-135m, llama-1b, tiny-llama)", name);
    }
    CHECK(config_finish(&cfg, name) == 0, "%s", err_msg());
    return cfg;
}

// Random weights (uniform +-0.02, norm weights 1), written on the host and copied to the
// model's backend.
static inline void bench_random_weights(Model *model) {
    long total = model->table.total;
    float *host = xmalloc((size_t)total * sizeof(float));
    for (long i = 0; i < total; i++) host[i] = 0.02f * (2.0f * rng_uniform(1, 0, (uint64_t)i) - 1.0f);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (strstr(e->name, "norm.weight"))
            for (long j = 0; j < e->numel; j++) host[e->offset + j] = 1.0f;
    }
    model->ops->copy_to_device(model->params, host, (size_t)total * sizeof(float));
    free(host);
}

static inline double bench_flops_per_token(const Model *model, int T) {
    const ModelConfig *cfg = &model->config;
    long long embedding_params = (long long)cfg->vocab_size * cfg->hidden_size +
                                 (cfg->positions == POSITIONS_LEARNED
                                      ? (long long)cfg->max_position_embeddings * cfg->hidden_size
                                      : 0);
    if (!cfg->tie_word_embeddings) embedding_params += (long long)cfg->vocab_size * cfg->hidden_size;
    long long nonembedding = model_num_params(model) - embedding_params;
    return 6.0 * (nonembedding + (double)cfg->vocab_size * cfg->hidden_size) +
           6.0 * cfg->num_layers * T * (double)(cfg->num_heads * cfg->head_dim);
}
