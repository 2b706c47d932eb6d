// A small model whose rows are whole K-quant super-blocks, as a llama.cpp Q4_K_M GGUF file (or
// another type of `convert --outtype`), for the tests of quantized weights on a backend other
// than the CPU (tests/test_quantize_backend.c, tests/gpu/test_cuda.c).
#pragma once
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/weights_io.h"

// A random Llama (hidden 256, intermediate 384, 2 layers, GQA 4/2, vocabulary 300) written by
// marlhf's converter (`convert --outtype OUT`) to `path`.
static inline void write_random_llama(const char *path, uint64_t seed, GgufOutType out) {
    ModelConfig cfg = {0};
    cfg.family = FAMILY_LLAMA;
    cfg.vocab_size = 300, cfg.hidden_size = 256, cfg.num_layers = 2, cfg.num_heads = 4, cfg.num_kv_heads = 2;
    cfg.intermediate_size = 384, cfg.max_position_embeddings = 128, cfg.norm_eps = 1e-5f, cfg.rope_theta = 10000.0f;
    CHECK(config_finish(&cfg, "random llama") == 0, "%s", err_msg());
    Model model;
    model_init(&model, &cfg, &ops_cpu, true, false);
    for (int i = 0; i < model.table.count; i++) {
        const ParamEntry *e = &model.table.entries[i];
        const bool norm = strstr(e->name, "norm") != NULL;
        const uint64_t stream = seed + (uint64_t)i;
        for (long j = 0; j < e->numel; j++) {
            const float u = 2.0f * rng_uniform(seed, stream, (uint64_t)j) - 1.0f;
            model.params[e->offset + j] = norm ? 1.0f + 0.1f * u : 0.08f * u;
        }
    }
    CHECK(model_write_gguf(&model, NULL, path, out) == 0, "%s", err_msg());
    model_free(&model);
}

// That Llama as a Q4_K_M file: by llama.cpp's per-tensor rule its matrices are Q4_K and Q6_K,
// and the down projections' rows of 384 (not whole super-blocks) fall back to Q5_0 or Q8_0.
static inline void write_q4_k_m_llama(const char *path, uint64_t seed) { write_random_llama(path, seed, GGUF_OUT_Q4_K_M); }
