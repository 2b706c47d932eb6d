// One training step (forward + backward + AdamW) of marlhf's engine from random weights.
// On the CPU (default) for the GPT-2-124M and SmolLM2-135M shapes beside this machine's
// OpenBLAS sgemm rate; bench/run_train_step.sh runs it next to PyTorch doing the same step
// (bench/torch_train_step.py). With --device cuda it reports MFU against --peak-tflops
// (bf16 dense; 790 as measured on an H200); tests/gpu/run.sh runs it next to
// bench/torch_gpu_train_step.py. FLOPs per token: bench/bench_shapes.h.
//
// usage: build/bench/train_step [--batch 4] [--seq 256] [--steps 3] [--recompute]
//            [--model gpt2-124m|smollm2-135m|gemma2-135m|gemma3-135m|llama-1b|all] [--device cpu|cuda] [--peak-tflops 790]
//            (all: gpt2-124m and smollm2-135m on the CPU, smollm2-135m on a GPU)
//            [--attention mma|mma-plain|mma-ds|wmma|unfused] (cuda: which attention kernels, src/ops/cuda/attention.cu)
//            [--max-grad-norm 1.0] (the global gradient norm clipped to this, as `marlhf sft` does by
//                               default; 0: no clipping, and the norm is not computed)
//            [--lora-rank R]   (LoRA adapters of rank R on every linear layer, base frozen;
//                               bench/run_lora_step.sh runs it beside PyTorch + PEFT)
//            [--lora-dropout P] (with --lora-rank: PEFT's lora_dropout on the adapters' inputs)
//            [--use-dora]       (with --lora-rank: DoRA adapters, PEFT's use_dora)
//            [--quantize q8_0|q4_0|nf4|nf4-single] (with --lora-rank, CPU: the frozen base quantized, QLoRA; the
//                               random float32 weights are made first, then quantized and given
//                               back, as `marlhf sft --quantize` never holds them all)
// The CPU line also gives the process's peak resident memory (max_rss_mb).
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/quantize.h"
#include "train/adamw.h"
#include "bench_shapes.h"
#include "device_memory.h"

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

static double mean_loss(const float *logp, const int *targets, long N) {
    double sum = 0;
    long count = 0;
    for (long i = 0; i < N; i++)
        if (targets[i] >= 0) sum -= logp[i], count++;
    return count ? sum / count : 0.0;
}

static const char *attention_label = "";

// What the result line says of MARLHF_CUDA_STORED_INPUTS (src/ops/ops.h,
// ops_cuda_enable_stored_inputs): "false" when it turns the GPU's stored buffers off.
static const char *stored_inputs_setting(void) {
    const char *setting = getenv("MARLHF_CUDA_STORED_INPUTS");
    return setting && !strcmp(setting, "0") ? "false" : "true";
}
static int lora_rank = 0;
static double lora_dropout = 0;
static bool use_dora = false;
static const char *quantize = "none";
static double max_grad_norm = 1.0;

// --max-grad-norm's value: the whole text a number >= 0 (atof would read "abc" as 0: no clipping).
static double parse_max_grad_norm(const char *text) {
    char *end;
    const double value = strtod(text, &end);
    if (end == text || *end || !(value >= 0)) die_user("option --max-grad-norm: expected a number >= 0, got '%s'", text);
    return value;
}

static double max_rss_mb(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss / 1024.0;
}

static void run(const char *name, const OpsBackend *ops, int B, int T, int steps, bool recompute,
                double sgemm_rate, double peak_tflops) {
    ops_device_memory_reset_peak(ops); // from the model's creation on, as PyTorch's figure is from its start
    ModelConfig cfg = bench_shape(name);
    Model model;
    model_init(&model, &cfg, ops, true, false);
    model.recompute = recompute;
    bench_random_weights(&model);
    if (model_quantize(&model, quantize) != 0) die_from_err();
    if (lora_rank > 0) {
        LoraConfig lora = {.rank = lora_rank, .alpha = (float)lora_rank, .targets = (1u << LORA_TARGETS) - 1,
                           .dropout = lora_dropout, .dora = use_dora};
        CHECK(model_add_lora(&model, &lora, false, 5) == 0, "%s", err_msg());
    }
    // Where the device memory goes (GPU lines only): held after each stage, in GiB, beside
    // bench/torch_gpu_train_step.py's weights_gib and held_between_steps_gib.
    char held_weights[32], held_gradients[32], held_optimizer[32], held_between[32];
    device_held_gib_json(ops, held_weights);
    model_enable_grad(&model);
    device_held_gib_json(ops, held_gradients);
    AdamW opt;
    adamw_init(&opt, &model, adamw_default_config(0.1f));
    device_held_gib_json(ops, held_optimizer);
    long N = (long)B * T;
    int *tokens = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) tokens[i] = (int)rng_below(2, 0, (uint64_t)i, (uint64_t)cfg.vocab_size);
    for (long i = 0; i < N; i++) targets[i] = (i + 1) % T == 0 ? -1 : tokens[i + 1];
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xmalloc(N * sizeof(float));
    for (long i = 0; i < N; i++) dlogp[i] = targets[i] >= 0 ? -1.0f / N : 0.0f;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};

    double forward_s = 0, backward_s = 0, optimizer_s = 0, loss_first = 0, loss_last = 0;
    for (int step = -1; step < steps; step++) { // step -1 warms up
        double t0 = now_seconds();
        model_training_pass_begin(&model, 5, 0, (uint64_t)(step + 1)); // a training pass, as train/loop.c makes it
        model_forward(&model, &batch);
        model_logprobs(&model, targets, logp, NULL, NULL);
        double t1 = now_seconds();
        model_zero_grad(&model);
        model_backward(&model, dlogp, NULL, NULL);
        model_training_pass_end(&model);
        ops->synchronize();
        double t2 = now_seconds();
        const float clip = max_grad_norm > 0 ? grad_clip_coefficient(grad_global_norm(&model), (float)max_grad_norm) : 1.0f;
        adamw_step(&opt, &model, 1e-4f, clip);
        ops->synchronize();
        double t3 = now_seconds();
        if (step >= 0) forward_s += t1 - t0, backward_s += t2 - t1, optimizer_s += t3 - t2;
        if (step == steps - 1) loss_last = mean_loss(logp, targets, N);
        if (step == -1) loss_first = mean_loss(logp, targets, N);
    }
    device_held_gib_json(ops, held_between); // + activations, the weights' bf16 copies, scratch
    double step_s = (forward_s + backward_s + optimizer_s) / steps;
    double flops_per_token = bench_flops_per_token(&model, T);
    double gflops = flops_per_token * N / step_s / 1e9;
    if (ops != &ops_cpu) {
        char peak_text[32];
        printf("{\"impl\": \"marlhf-%s%s\", \"model\": \"%s\", \"batch\": %d, \"seq\": %d, \"tokens_per_s\": %.1f, "
               "\"step_ms\": %.3f, \"tflops\": %.2f, \"mfu\": %.4f, \"peak_tflops\": %.0f, \"forward_ms\": %.3f, "
               "\"backward_ms\": %.3f, \"optimizer_ms\": %.3f, \"loss_first\": %.4f, \"loss_last\": %.4f, "
               "\"recompute\": %s, \"flops_per_token\": %.0f, \"lora_rank\": %d, \"max_grad_norm\": %g, "
               "\"stored_inputs\": %s, \"fused_qkv\": %s, \"peak_mem_gib\": %s, \"weights_gib\": %s, "
               "\"with_gradients_gib\": %s, \"with_optimizer_gib\": %s, \"held_between_steps_gib\": %s}\n",
               ops->name, attention_label, name, B, T, N / step_s, step_s * 1e3, gflops / 1e3, gflops / 1e3 / peak_tflops,
               peak_tflops, forward_s / steps * 1e3, backward_s / steps * 1e3, optimizer_s / steps * 1e3,
               loss_first, loss_last, recompute ? "true" : "false", flops_per_token, lora_rank, max_grad_norm,
               stored_inputs_setting(), model_qkv_fusion_on(ops) ? "true" : "false", device_peak_gib_json(ops, peak_text),
               held_weights, held_gradients, held_optimizer, held_between);
        fflush(stdout);
        free(tokens), free(targets), free(logp), free(dlogp);
        adamw_free(&opt);
        model_free(&model);
        return;
    }
    // With LoRA, gflops still counts full fine-tuning's FLOPs (the frozen weights' own
    // gradients are not computed), so it is a rate of equivalent work, not of arithmetic.
    printf("{\"impl\": \"marlhf\", \"model\": \"%s\", \"tokens_per_s\": %.1f, \"step_s\": %.4f, \"gflops\": %.2f, "
           "\"sgemm_gflops\": %.2f, \"fraction_of_sgemm\": %.3f, \"forward_s\": %.4f, \"backward_s\": %.4f, "
           "\"optimizer_s\": %.4f, \"threads\": %d, \"batch\": %d, \"seq\": %d, \"recompute\": %s, "
           "\"flops_per_token\": %.0f, \"lora_rank\": %d, \"lora_dropout\": %g, \"dora\": %s, \"quantize\": \"%s\", "
           "\"trainable_params\": %ld, \"max_grad_norm\": %g, \"max_rss_mb\": %.0f}\n",
           name, N / step_s, step_s, gflops, sgemm_rate, gflops / sgemm_rate, forward_s / steps, backward_s / steps,
           optimizer_s / steps, omp_get_max_threads(), B, T, recompute ? "true" : "false", flops_per_token, lora_rank,
           lora_dropout, use_dora ? "true" : "false", quantize, model_trainable_floats(&model), max_grad_norm, max_rss_mb());
    fflush(stdout);
    free(tokens), free(targets), free(logp), free(dlogp);
    adamw_free(&opt);
    model_free(&model);
}

int main(int argc, char **argv) {
    int B = 4, T = 256, steps = 3;
    bool recompute = false;
    const char *which = "all", *device = "cpu";
    double peak_tflops = 790.0;
    const char *attention = "mma"; // cuda: the attention kernels, mma (default), wmma or unfused
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--recompute")) recompute = true;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak_tflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc) attention = argv[++i];
        else if (!strcmp(argv[i], "--lora-rank") && i + 1 < argc) lora_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lora-dropout") && i + 1 < argc) lora_dropout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--use-dora")) use_dora = true;
        else if (!strcmp(argv[i], "--quantize") && i + 1 < argc) quantize = argv[++i];
        else if (!strcmp(argv[i], "--max-grad-norm") && i + 1 < argc) max_grad_norm = parse_max_grad_norm(argv[++i]);
        else die_user("unknown argument %s (see the comment at the top of bench/train_step.c)", argv[i]);
    }
    if (B < 1 || T < 2 || steps < 1) die_user("--batch, --seq and --steps must be positive");
    if (quantize_type_check(quantize, "--quantize") != 0) die_from_err();
    if (quantize_requested(quantize) && lora_rank < 1) die_user("--quantize needs --lora-rank (a quantized base is frozen)");
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) die_from_err();
#ifdef MARLHF_CUDA
    static char label[32];
    if (ops == &ops_cuda && !ops_cuda_select_attention(attention)) die_user("--attention: mma, mma-plain, mma-ds, wmma or unfused");
    if (ops == &ops_cuda && strcmp(attention, "mma")) snprintf(label, sizeof label, "-%s", attention), attention_label = label;
#endif
    if (ops != &ops_cpu) {
        if (!strcmp(which, "all")) which = "smollm2-135m";
        for (char *save = NULL, *item = strtok_r((char *)which, ",", &save); item; item = strtok_r(NULL, ",", &save))
            run(item, ops, B, T, steps, recompute, 0.0, peak_tflops);
        return 0;
    }
    // The rate of the largest matmul shape in the step (an MLP projection at B*T rows).
    double rate = sgemm_gflops(B * T, 3072, 768);
    printf("{\"impl\": \"openblas-sgemm\", \"shape\": \"%d x 3072 x 768\", \"gflops\": %.2f, \"threads\": %d}\n", B * T,
           rate, omp_get_max_threads());
    if (!strcmp(which, "all") || !strcmp(which, "gpt2-124m")) run("gpt2-124m", ops, B, T, steps, recompute, rate, 0.0);
    if (!strcmp(which, "all") || !strcmp(which, "smollm2-135m")) run("smollm2-135m", ops, B, T, steps, recompute, rate, 0.0);
    if (!strcmp(which, "gemma2-135m")) run("gemma2-135m", ops, B, T, steps, recompute, rate, 0.0);
    if (!strcmp(which, "gemma3-135m")) run("gemma3-135m", ops, B, T, steps, recompute, rate, 0.0);
    return 0;
}
