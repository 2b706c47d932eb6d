// One data-parallel training step of marlhf's engine from random weights: each rank runs
// forward + backward on its own micro-batch, the gradients are summed across ranks
// (dist/model_sync.h, as `marlhf sft` does under mpirun), then every rank takes the AdamW
// step. Run it alone (one process) or under `mpirun -np W`; rank 0 prints one JSON line
// with the time split into compute, gradient sum and optimizer, and its peak resident
// memory. --zero-stage 1 shards the AdamW moments across ranks, 2 the gradients too (summed
// during the backward, dist/zero.h), 3 the layers' weights too (each gathered while it runs).
// bench/run_data_parallel.sh runs it beside PyTorch DDP (bench/torch_ddp_step.py).
//
// usage: [mpirun -np W] build/bench/data_parallel_step [--batch 2] [--seq 256] [--steps 3]
//            [--model smollm2-135m|gpt2-124m] [--threads N] [--zero-stage 0|1|2|3]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cblas.h>

#include "core/check.h"
#include "core/rng.h"
#include "dist/dist.h"
#include "dist/model_sync.h"
#include "dist/zero.h"
#include "model/model.h"
#include "train/adamw.h"
#include "bench_shapes.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (dist_init(&argc, &argv) != 0) die_from_err();
    int B = 2, T = 256, steps = 3, threads = 0, zero_stage = 0;
    const char *name = "smollm2-135m";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--zero-stage") && i + 1 < argc) zero_stage = atoi(argv[++i]);
        else die_user("unknown argument %s (see the comment at the top of bench/data_parallel_step.c)", argv[i]);
    }
    if (B < 1 || T < 2 || steps < 1) die_user("--batch, --seq and --steps must be positive");
    if (zero_stage < 0 || zero_stage > 3) die_user("--zero-stage must be 0, 1, 2 or 3");
    if (threads > 0) omp_set_num_threads(threads), openblas_set_num_threads(threads);
    const int rank = dist_rank(), world = dist_world_size();

    ModelConfig cfg = bench_shape(name);
    Model model;
    model_init(&model, &cfg, &ops_cpu, true, false);
    bench_random_weights(&model);
    model_enable_grad(&model);
    AdamW opt;
    dist_adamw_init(&opt, &model, adamw_default_config(0.1f), zero_stage);
    dist_weights_start(&model); // the same random weights on every rank; ZeRO-3 shards them
    long N = (long)B * T;
    // Each rank its own tokens (stream = rank), as each rank reads its own micro-batch.
    int *tokens = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) tokens[i] = (int)rng_below(2, (uint64_t)rank, (uint64_t)i, (uint64_t)cfg.vocab_size);
    for (long i = 0; i < N; i++) targets[i] = (i + 1) % T == 0 ? -1 : tokens[i + 1];
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xmalloc(N * sizeof(float));
    for (long i = 0; i < N; i++) dlogp[i] = targets[i] >= 0 ? -1.0f / (N * world) : 0.0f;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};

    double compute_s = 0, reduce_s = 0, optimizer_s = 0;
    for (int step = -1; step < steps; step++) { // step -1 warms up
        double t0 = now_seconds();
        model_forward(&model, &batch);
        model_logprobs(&model, targets, logp, NULL, NULL);
        dist_zero_grad(&model);
        model_backward(&model, dlogp, NULL, NULL); // ZeRO-2 sums the gradients in here
        double t1 = now_seconds();
        double norm = dist_reduce_gradients(&model, &opt);
        double t2 = now_seconds();
        dist_adamw_step(&opt, &model, 1e-4f, grad_clip_coefficient(norm, 1.0f));
        double t3 = now_seconds();
        if (step >= 0) compute_s += t1 - t0, reduce_s += t2 - t1, optimizer_s += t3 - t2;
    }
    // Rank 0's times: the sum waits for the slowest rank, so its wall time is the job's. (Under
    // ZeRO-2 the sums are taken inside the backward, so they count as compute.)
    double step_s = (compute_s + reduce_s + optimizer_s) / steps;
    double flops_per_token = bench_flops_per_token(&model, T);
    if (!dist_weights_sharded(&model)) // ZeRO-3: each layer weight has one owner
        CHECK(dist_all_equal(model_weights_fingerprint(&model)), "ranks ended with different weights");
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    if (rank == 0)
        printf("{\"impl\": \"marlhf%s\", \"model\": \"%s\", \"ranks\": %d, \"threads_per_rank\": %d, "
               "\"batch_per_rank\": %d, \"seq\": %d, \"tokens_per_s\": %.1f, \"step_s\": %.4f, \"compute_s\": %.4f, "
               "\"gradient_sum_s\": %.4f, \"optimizer_s\": %.4f, \"gflops\": %.2f, \"gradient_mb\": %.1f, "
               "\"zero_stage\": %d, \"peak_rss_mb\": %.0f}\n",
               zero_stage >= 1 && world > 1 ? (const char *[]){"", "-zero1", "-zero2", "-zero3"}[zero_stage] : "", name, world, omp_get_max_threads(), B, T, N * world / step_s,
               step_s, compute_s / steps, reduce_s / steps, optimizer_s / steps,
               flops_per_token * N * world / step_s / 1e9, model.table.total * 4.0 / 1e6, zero_stage,
               usage.ru_maxrss / 1024.0);
    free(tokens), free(targets), free(logp), free(dlogp);
    dist_adamw_free(&opt, &model);
    model_free(&model);
    dist_finalize();
    return 0;
}
