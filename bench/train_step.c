// One training step (forward + backward + AdamW) of marlhf's engine, for the GPT-2-124M
// and SmolLM2-135M shapes from random weights, beside this machine's OpenBLAS sgemm rate.
// bench/run_train_step.sh runs it next to PyTorch doing the same step (bench/torch_train_step.py).
//
// FLOPs per token use the same formula as the PyTorch script:
//   6 * (non-embedding params + vocab*hidden)  +  6 * layers * T * (heads * head_dim)
// (the LM head counted even when tied; causal attention counted at half the square).
//
// usage: build/bench/train_step [--batch 4] [--seq 256] [--steps 3] [--model gpt2-124m|smollm2-135m|all]
//                               [--recompute]
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/adamw.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double sgemm_gflops(int M, int N, int K) {
    float *a = xaligned_alloc((size_t)M * K * 4), *b = xaligned_alloc((size_t)K * N * 4);
    float *c = xaligned_alloc((size_t)M * N * 4);
    for (long i = 0; i < (long)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < (long)K * N; i++) b[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    int reps = 10;
    double t0 = now_seconds();
    for (int r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    double seconds = now_seconds() - t0;
    free(a), free(b), free(c);
    return 2.0 * M * N * K * reps / seconds / 1e9;
}

static ModelConfig shape(const char *name) {
    ModelConfig cfg = {0};
    if (!strcmp(name, "gpt2-124m")) {
        cfg.family = FAMILY_GPT2;
        cfg.vocab_size = 50257, cfg.hidden_size = 768, cfg.num_layers = 12, cfg.num_heads = 12;
        cfg.intermediate_size = 3072, cfg.max_position_embeddings = 1024, cfg.norm_eps = 1e-5f;
        cfg.tie_word_embeddings = true;
    } else {
        cfg.family = FAMILY_LLAMA;
        cfg.vocab_size = 49152, cfg.hidden_size = 576, cfg.num_layers = 30, cfg.num_heads = 9;
        cfg.num_kv_heads = 3, cfg.intermediate_size = 1536, cfg.max_position_embeddings = 8192;
        cfg.norm_eps = 1e-5f, cfg.rope_theta = 100000.0f, cfg.tie_word_embeddings = true;
    }
    CHECK(config_finish(&cfg, name) == 0, "%s", err_msg());
    return cfg;
}

static void run(const char *name, int B, int T, int steps, bool recompute, double sgemm_rate) {
    ModelConfig cfg = shape(name);
    Model model;
    model_init(&model, &cfg, &ops_cpu, true, false);
    model.recompute = recompute;
    for (long i = 0; i < model.table.total; i++)
        model.params[i] = 0.02f * (2.0f * rng_uniform(1, 0, (uint64_t)i) - 1.0f);
    for (int i = 0; i < model.table.count; i++) // norm weights to 1
        if (strstr(model.table.entries[i].name, "norm.weight"))
            for (long j = 0; j < model.table.entries[i].numel; j++) model.params[model.table.entries[i].offset + j] = 1.0f;
    model_enable_grad(&model);
    AdamW opt;
    adamw_init(&opt, &model, adamw_default_config(0.1f));
    long N = (long)B * T;
    int *tokens = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) tokens[i] = (int)rng_below(2, 0, (uint64_t)i, (uint64_t)cfg.vocab_size);
    for (long i = 0; i < N; i++) targets[i] = (i + 1) % T == 0 ? -1 : tokens[i + 1];
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xmalloc(N * sizeof(float));
    for (long i = 0; i < N; i++) dlogp[i] = targets[i] >= 0 ? -1.0f / N : 0.0f;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};

    double forward_s = 0, backward_s = 0, optimizer_s = 0;
    for (int step = -1; step < steps; step++) { // step -1 warms up
        double t0 = now_seconds();
        model_forward(&model, &batch);
        model_logprobs(&model, targets, logp, NULL, NULL);
        double t1 = now_seconds();
        model_zero_grad(&model);
        model_backward(&model, dlogp, NULL, NULL);
        double t2 = now_seconds();
        double norm = grad_global_norm(&model);
        adamw_step(&opt, &model, 1e-4f, grad_clip_coefficient(norm, 1.0f));
        double t3 = now_seconds();
        if (step >= 0) forward_s += t1 - t0, backward_s += t2 - t1, optimizer_s += t3 - t2;
    }
    double step_s = (forward_s + backward_s + optimizer_s) / steps;
    long long embedding_params = (long long)cfg.vocab_size * cfg.hidden_size +
                                 (cfg.positions == POSITIONS_LEARNED ? (long long)cfg.max_position_embeddings * cfg.hidden_size : 0);
    long long nonembedding = model_num_params(&model) - embedding_params;
    double flops_per_token = 6.0 * (nonembedding + (double)cfg.vocab_size * cfg.hidden_size) +
                             6.0 * cfg.num_layers * T * (double)(cfg.num_heads * cfg.head_dim);
    double gflops = flops_per_token * N / step_s / 1e9;
    printf("{\"impl\": \"marlhf\", \"model\": \"%s\", \"tokens_per_s\": %.1f, \"step_s\": %.4f, \"gflops\": %.2f, "
           "\"sgemm_gflops\": %.2f, \"fraction_of_sgemm\": %.3f, \"forward_s\": %.4f, \"backward_s\": %.4f, "
           "\"optimizer_s\": %.4f, \"threads\": %d, \"batch\": %d, \"seq\": %d, \"recompute\": %s, "
           "\"flops_per_token\": %.0f}\n",
           name, N / step_s, step_s, gflops, sgemm_rate, gflops / sgemm_rate, forward_s / steps, backward_s / steps,
           optimizer_s / steps, omp_get_max_threads(), B, T, recompute ? "true" : "false", flops_per_token);
    fflush(stdout);
    free(tokens), free(targets), free(logp), free(dlogp);
    adamw_free(&opt);
    model_free(&model);
}

int main(int argc, char **argv) {
    int B = 4, T = 256, steps = 3;
    bool recompute = false;
    const char *which = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--recompute")) recompute = true;
        else die_user("unknown argument %s (see the comment at the top of bench/train_step.c)", argv[i]);
    }
    if (B < 1 || T < 2 || steps < 1) die_user("--batch, --seq and --steps must be positive");
    // The rate of the largest matmul shape in the step (an MLP projection at B*T rows).
    double rate = sgemm_gflops(B * T, 3072, 768);
    printf("{\"impl\": \"openblas-sgemm\", \"shape\": \"%d x 3072 x 768\", \"gflops\": %.2f, \"threads\": %d}\n", B * T,
           rate, omp_get_max_threads());
    if (!strcmp(which, "all") || !strcmp(which, "gpt2-124m")) run("gpt2-124m", B, T, steps, recompute, rate);
    if (!strcmp(which, "all") || !strcmp(which, "smollm2-135m")) run("smollm2-135m", B, T, steps, recompute, rate);
    return 0;
}
