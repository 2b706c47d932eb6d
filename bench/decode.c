// Decode speed of SmolLM2-135M-Instruct (f32 after dequantization) with the KV cache, at
// batch 1, 8 and 32: greedy, a 32-token prompt per row, 64 new tokens per row (no early
// stop). Decode tokens/s counts the tokens produced by the decode steps over their time
// (prefill reported apart). bench/run_decode.sh runs it beside transformers' generate and
// llama.cpp (llama-cpp-python) on the same machine.
//
// --shape NAME builds the model from random weights instead (bench/bench_shapes.h), and
// --device cuda runs it on the GPU (tests/gpu/run.sh, beside bench/torch_gpu_decode.py).
//
// usage: build/bench/decode [--model models/SmolLM2-135M-Instruct.Q4_1.gguf | --shape NAME]
//                           [--new 64] [--prompt 32] [--batches 1,8,32] [--device cpu|cuda]
//                           [--quantize none|q8_0|q4_0|nf4|nf4-single|q4_k_m|q5_k_m|q4_1|q5_1] [--kv-cache f32|f16|q8_0]
//                           [--temperature 0] [--top-k 0] [--top-p 1] [--min-p 0]
//                           [--repetition-penalty 1] [--presence-penalty 0] [--frequency-penalty 0]
// --temperature T samples (seed 1) instead of taking the most likely token, with --top-k and
// --top-p as `marlhf generate` takes them: the sampler's own time is then part of each step.
// --min-p and the penalties (gen/sampler.h) too: a row with a penalty is picked on the host from
// copied logits after the penalties have been applied over its answer so far
// (bench/run_decode.sh with PENALTIES=1, beside transformers' repetition_penalty and min_p).
// Each line says how many tokens were picked from the backend's results instead of copied
// logits (backend_picked_tokens) and how many steps a top-p row's candidates fell short of
// its nucleus (nucleus_misses; gen/generate.h, generate_nucleus_candidates).
// --quantize q8_0 (q4_0, nf4) decodes with Q8_0 (Q4_0, NF4) copies of the linear weights (model/quantize.h);
// --kv-cache f16 keeps the KV cache in half floats, q8_0 in 8-bit blocks. Each line
// reports the cache's bytes per token (keys and values of every layer). A long --prompt
// (bench/run_decode.sh with LONG_PROMPT=2048) is where the cache type matters. Each line also
// gives the decode milliseconds per step and the process's peak resident memory so far
// (bench/run_kquant_decode.sh: a Q4_K_M file with its own bits against Q8_0 and llama.cpp).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "gen/generate.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/q4.h"
#include "bench_shapes.h"
#include "device_memory.h"

// The process's peak resident memory (VmHWM), in MB; 0 where /proc is not there.
static double peak_rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb / 1024.0;
}

// The bytes the quantized matrices hold (0 for a float model), in MB.
static double quantized_mb(const Model *model) {
    long bytes = 0;
    for (int i = 0; i < model->table.count; i++) {
        const Q8Matrix *matrix = quantized_matrix(model, &model->table.entries[i]);
        if (matrix) bytes += quant_matrix_bytes(matrix);
    }
    return bytes / 1e6;
}

int main(int argc, char **argv) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int new_tokens = 64, prompt_length = 32;
    char batches[64] = "1,8,32";
    const char *device = "cpu", *shape = NULL, *quantize = "none", *kv_cache = "f32";
    SamplerConfig sampler = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) new_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt_length = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "--quantize") && i + 1 < argc) quantize = argv[++i];
        else if (!strcmp(argv[i], "--kv-cache") && i + 1 < argc) kv_cache = argv[++i];
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc) sampler.temperature = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--top-k") && i + 1 < argc) sampler.top_k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--top-p") && i + 1 < argc) sampler.top_p = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--min-p") && i + 1 < argc) sampler.min_p = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--repetition-penalty") && i + 1 < argc)
            sampler.repetition_penalty = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--presence-penalty") && i + 1 < argc) sampler.presence_penalty = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--frequency-penalty") && i + 1 < argc)
            sampler.frequency_penalty = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) snprintf(batches, sizeof batches, "%s", argv[++i]);
        else die_user("unknown argument %s (see the comment at the top of bench/decode.c)", argv[i]);
    }
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) die_from_err();
    Model model;
    if (shape) {
        ModelConfig cfg = bench_shape(shape);
        model_init(&model, &cfg, ops, true, false);
        bench_random_weights(&model);
        if (model_quantize(&model, quantize) != 0) die_from_err();
    } else {
        // Quantized as it is read, as the commands load it: the float32 model never exists in
        // full (peak_rss_mb), and a K-quant file's tensors keep their own bytes (q4_k_m).
        ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
        if (model_load(&model, path, ops, &options) != 0) die_from_err();
    }
    if (kv_cache_type_set(&model, kv_cache, "--kv-cache") != 0) die_from_err();
    // Warm up (page in the weights, start the thread pool) before timing anything.
    {
        int warm[4] = {100, 200, 300, 400}, length = 4;
        const int *prompts[] = {warm};
        GenerateOptions gen = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 4};
        GeneratedRow row;
        generate(&model, prompts, &length, NULL, 1, &gen, &row, NULL);
        generated_row_free(&row);
    }
    // Prompt tokens from 100 up, in the first 20,000 ids or what the vocabulary has of them.
    const int prompt_token_span = model.config.vocab_size - 100 < 20000 ? model.config.vocab_size - 100 : 20000;
    CHECK(prompt_token_span > 300, "a vocabulary of %d tokens is too small for the warm-up prompt", model.config.vocab_size);
    for (char *save = NULL, *item = strtok_r(batches, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int B = atoi(item);
        int **prompts = xmalloc(B * sizeof(int *)), *lengths = xmalloc(B * sizeof(int));
        for (int b = 0; b < B; b++) {
            prompts[b] = xmalloc(prompt_length * sizeof(int));
            lengths[b] = prompt_length;
            for (int t = 0; t < prompt_length; t++)
                prompts[b][t] = 100 + (int)rng_below(5, (uint64_t)b, (uint64_t)t, prompt_token_span);
        }
        GenerateOptions gen = {.sampler = sampler, .max_new_tokens = new_tokens, .seed = 1};
        GeneratedRow *rows = xmalloc(B * sizeof(GeneratedRow));
        char peak_text[32];
        GenerateStats stats;
        ops_device_memory_reset_peak(ops); // the weights, this batch's KV cache and the step's buffers
        generate(&model, (const int *const *)prompts, lengths, NULL, B, &gen, rows, &stats);
        double decode_tokens = (double)B * stats.decode_steps;
        const long kv_bytes_per_token = 2L * model.config.num_layers * kv_cache_slot_bytes(&model, model.kv_cache_type);
        printf("{\"impl\": \"marlhf-%s\", \"quantize\": \"%s\", \"kv_cache\": \"%s\", \"model\": \"%s\", \"batch\": %d, "
               "\"temperature\": %g, \"top_k\": %d, \"top_p\": %g, \"min_p\": %g, \"repetition_penalty\": %g, "
               "\"presence_penalty\": %g, \"frequency_penalty\": %g, \"decode_tokens_per_s\": %.1f, \"prefill_s\": %.3f, "
               "\"decode_s\": %.3f, \"ms_per_step\": %.2f, \"new_tokens\": %d, \"prompt\": %d, \"kv_bytes_per_token\": %ld, "
               "\"threads\": %d, \"peak_rss_mb\": %.1f, \"quantized_mb\": %.1f, \"float_params_mb\": %.1f, "
               "\"peak_mem_gib\": %s, \"backend_picked_tokens\": %ld, \"nucleus_misses\": %d, \"folded_norms\": %s}\n",
               ops->name, quantize, kv_cache, shape ? shape : path, B, sampler.temperature, sampler.top_k, sampler.top_p,
               sampler.min_p, sampler.repetition_penalty > 0 ? sampler.repetition_penalty : 1.0f, sampler.presence_penalty,
               sampler.frequency_penalty, decode_tokens / stats.decode_seconds, stats.prefill_seconds, stats.decode_seconds,
               1000.0 * stats.decode_seconds / stats.decode_steps, new_tokens, prompt_length, kv_bytes_per_token,
               omp_get_max_threads(), peak_rss_mb(), quantized_mb(&model),
               // the float32 buffer in the backend's memory: without the quantized weights' slots off the CPU
               (double)model.table.stored_total * sizeof(float) / 1e6, device_peak_gib_json(ops, peak_text),
               stats.backend_picked_tokens, stats.nucleus_misses, model_norms_folded() ? "true" : "false");
        fflush(stdout);
        for (int b = 0; b < B; b++) generated_row_free(&rows[b]), free(prompts[b]);
        free(rows), free(prompts), free(lengths);
    }
    model_free(&model);
    return 0;
}
