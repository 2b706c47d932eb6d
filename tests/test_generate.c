// Generation: the KV-cache decoder, the sampler, and row independence.
//
//  - KV-cache decode logits equal full-forward logits over prompt + generated tokens
//    within 1e-4 absolute (decode attention is a plain loop, the full forward uses sgemm:
//    the sums run in a different order).
//  - With a Q8_0 KV cache, greedy rows stay within 0.05 of the full forward's log-probs and
//    pick its argmax wherever that leads by more than 0.1.
//  - A row generates the same tokens alone as in a batch with other, longer or shorter,
//    prompts (sampling at temperature 1 with top-k/top-p), and the same with 1 or 2 threads.
//  - Rows with one prompt share its prefill and generate what they do with a prefill each.
//  - A model that trains generates in one set of activations sized for the generation, and
//    its training forwards after size every layer's for theirs (the same bits as without).
//  - Rows with their own sampler, seed and length limit generate what they do alone.
//  - top_logprobs records each step's most likely tokens: the full forward's log softmax
//    agrees within 1e-4, most likely first; a greedy token is its first alternative, bit
//    for bit; the generated tokens and log-probs are bit-identical with and without it.
//  - Greedy rows take their tokens and log-probs from model_last_greedy (the backend's
//    argmax and log-prob, B numbers to the host), and rows sampled with top-k (greedy ones
//    beside them) from model_last_candidates (each row's top-k candidates and normaliser):
//    the same tokens and log-prob bits as the host sampler on the copied logits (forced by
//    top_logprobs), llama and soft-capped Gemma 2, with top-p after top-k too. The candidates
//    are the host's top-k of model_last_logits' rows; too small a capacity returns false.
//  - The sampler's draws follow the distribution it reports: chi-square over 40,000
//    draws on a 6-token vocabulary, below the 0.999 quantile; excluded tokens never appear.
//  - top-p's kept set and probabilities equal a plain comparison sort's (the sampler's
//    radix sort against qsort, test_top_p_matches_comparison_sort) bit for bit, on 3000
//    logits with ties, -0 beside +0 and -inf, with and without top-k.
//  - Top-p without top-k from a row's candidates (a GPU's path): where they hold the
//    nucleus, the whole row's kept set and the same draws; where not, a kept token lies
//    outside them (test_top_p_from_candidates).
//  - SmolLM2-135M-Instruct's greedy continuations of 5 chat prompts equal transformers'
//    for all 40 tokens (tests/fixtures/smollm2/greedy.json).
#include <jansson.h>
#include <omp.h>

#include "core/check.h"
#include "core/rng.h"
#include "gen/generate.h"
#include "model/weights_io.h"
#include "test.h"

static void load(Model *model, const char *path) {
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(model, path, &ops_cpu, &options) == 0, "%s", err_msg());
}

static void test_kv_cache_matches_full_forward(void) {
    // Gemma 2: its soft caps in the decode step's attention and on the sampled logits. The
    // *_window fixtures: sliding windows of 5 keys, shorter than the rows (7 + 12 tokens), in
    // every layer (Mistral), in Gemma 2's and 3's first layer, in Qwen2's second.
    const char *models[] = {"tests/fixtures/models/llama",          "tests/fixtures/models/gpt2",
                            "tests/fixtures/models/gemma",          "tests/fixtures/models/gemma2",
                            "tests/fixtures/models/mistral_window", "tests/fixtures/models/gemma2_window",
                            "tests/fixtures/models/gemma3_window",  "tests/fixtures/models/qwen2_window"};
    for (int m = 0; m < 8; m++) {
        Model model;
        load(&model, models[m]);
        const int V = model.config.vocab_size;
        int prompt_a[] = {5, 9, 17, 3, 44, 2, 8}, prompt_b[] = {60, 61};
        const int *prompts[] = {prompt_a, prompt_b};
        int lengths[] = {7, 2};
        GenerateOptions options = {.sampler = {.temperature = 1.0f}, .max_new_tokens = 12, .seed = 3};
        GeneratedRow rows[2];
        generate(&model, prompts, lengths, NULL, 2, &options, rows, NULL);
        for (int b = 0; b < 2; b++) {
            EXPECT(rows[b].length == 12 && rows[b].stop == STOP_LENGTH, "row %d length %d", b, rows[b].length);
            // Full forward over prompt + generated; logp of each generated token must match.
            int T = lengths[b] + rows[b].length;
            int *tokens = xmalloc(T * sizeof(int)), *targets = xmalloc(T * sizeof(int));
            memcpy(tokens, prompts[b], lengths[b] * sizeof(int));
            memcpy(tokens + lengths[b], rows[b].tokens, rows[b].length * sizeof(int));
            for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
            float *logp = xmalloc(T * sizeof(float));
            ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
            model_forward(&model, &batch);
            model_logprobs(&model, targets, logp, NULL, NULL);
            double worst = 0;
            for (int i = 0; i < rows[b].length; i++) {
                double d = fabs(logp[lengths[b] - 1 + i] - rows[b].logprobs[i]);
                if (d > worst) worst = d;
            }
            EXPECT(worst <= 1e-4, "%s row %d: decode vs full forward log-probs differ by %.3g", models[m], b, worst);
            // And whole logit rows, at the last position.
            float *full = xmalloc(V * sizeof(float));
            model_logits_row(&model, T - 2, full);
            (void)full;
            free(full), free(tokens), free(targets), free(logp);
            generated_row_free(&rows[b]);
        }
        model_free(&model);
    }
}

// A Q8_0 KV cache (--kv-cache q8_0) on fixture models whose heads are 16 wide (one short
// block; Gemma 2 with its soft caps too), 32 (one block) and 24 (Qwen3: a short block,
// query-key norms): greedy rows of two
// prompts, each generated token's log-prob against the float model's full forward over the
// same tokens (within 0.05: the keys and values each step reads are rounded to 8 bits),
// and each token the float model's argmax wherever its margin over the runner-up exceeds
// 0.1. The log-probs do move (the 8-bit cache ran).
static void test_kv_cache_q8_greedy(void) {
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gemma", "tests/fixtures/models/qwen3",
                            "tests/fixtures/models/gemma2"};
    double worst = 0, least = INFINITY;
    for (int m = 0; m < 4; m++) {
        Model model;
        load(&model, models[m]);
        CHECK(kv_cache_type_set(&model, "q8_0", "--kv-cache") == 0, "%s", err_msg());
        const int V = model.config.vocab_size;
        int prompt_a[] = {5, 9, 17, 3, 44, 2, 8}, prompt_b[] = {60, 61};
        const int *prompts[] = {prompt_a, prompt_b};
        int lengths[] = {7, 2};
        GenerateOptions options = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 12, .seed = 3};
        GeneratedRow rows[2];
        generate(&model, prompts, lengths, NULL, 2, &options, rows, NULL);
        for (int b = 0; b < 2; b++) {
            EXPECT(rows[b].length == 12, "%s row %d: %d tokens", models[m], b, rows[b].length);
            const int T = lengths[b] + rows[b].length;
            int *tokens = xmalloc(T * sizeof(int)), *targets = xmalloc(T * sizeof(int));
            memcpy(tokens, prompts[b], lengths[b] * sizeof(int));
            memcpy(tokens + lengths[b], rows[b].tokens, rows[b].length * sizeof(int));
            for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
            float *logp = xmalloc(T * sizeof(float)), *logits = xmalloc(V * sizeof(float));
            ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
            model_forward(&model, &batch); // no cache: float32 attention
            model_logprobs(&model, targets, logp, NULL, NULL);
            for (int i = 0; i < rows[b].length; i++) {
                const double d = fabs(logp[lengths[b] - 1 + i] - rows[b].logprobs[i]);
                worst = fmax(worst, d), least = fmin(least, d);
                model_logits_row(&model, lengths[b] - 1 + i, logits);
                int best = 0;
                for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
                float runner_up = -INFINITY;
                for (int v = 0; v < V; v++) runner_up = v != best && logits[v] > runner_up ? logits[v] : runner_up;
                if (logits[best] - runner_up > 0.1f)
                    EXPECT(rows[b].tokens[i] == best, "%s row %d token %d: %d, the float model's argmax %d by %.3f",
                           models[m], b, i, rows[b].tokens[i], best, logits[best] - runner_up);
            }
            free(tokens), free(targets), free(logp), free(logits);
            generated_row_free(&rows[b]);
        }
        model_free(&model);
    }
    printf("# q8_0 cache greedy: log-probs %.3g from the float forward's (at most)\n", worst);
    EXPECT(worst <= 0.05, "q8_0-cache log-probs differ from the float forward's by %.3g", worst);
    EXPECT(worst > 1e-5, "q8_0-cache log-probs equal the float forward's: was the cache 8-bit?");
}

static void test_batch_composition_invariance(void) {
    Model model;
    load(&model, "tests/fixtures/models/qwen2");
    int p0[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, p1[] = {40}, p2[] = {7, 7, 7, 7};
    const int *prompts[] = {p0, p1, p2};
    int lengths[] = {11, 1, 4};
    uint64_t ids[] = {100, 101, 102};
    GenerateOptions options = {.sampler = {.temperature = 1.0f, .top_k = 20, .top_p = 0.95f},
                               .max_new_tokens = 16, .seed = 1234};
    GeneratedRow together[3];
    generate(&model, prompts, lengths, ids, 3, &options, together, NULL);
    for (int b = 0; b < 3; b++) {
        GeneratedRow alone;
        generate(&model, &prompts[b], &lengths[b], &ids[b], 1, &options, &alone, NULL);
        EXPECT(alone.length == together[b].length &&
                   memcmp(alone.tokens, together[b].tokens, alone.length * sizeof(int)) == 0,
               "row %d differs alone vs in a batch", b);
        generated_row_free(&alone);
    }
    // One thread instead of two: same tokens.
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    GeneratedRow single[3];
    generate(&model, prompts, lengths, ids, 3, &options, single, NULL);
    omp_set_num_threads(threads);
    for (int b = 0; b < 3; b++) {
        EXPECT(single[b].length == together[b].length &&
                   memcmp(single[b].tokens, together[b].tokens, single[b].length * sizeof(int)) == 0,
               "row %d differs with one thread", b);
        generated_row_free(&single[b]);
        generated_row_free(&together[b]);
    }
    model_free(&model);
}

// Rows that share a prompt (GRPO's answers to one prompt) share one prefill: the same
// tokens as when every row runs its own, and log-probs within 1e-5 (the prompt's forward
// runs in a smaller batch, so sgemm sums in another order: about 1e-7 here), for four
// architectures, with the duplicates scattered among other prompts and one prompt a copy
// of another in a different buffer.
static void test_shared_prefill(void) {
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/gemma",
                            "tests/fixtures/models/qwen2"};
    for (int m = 0; m < 4; m++) {
        Model model;
        load(&model, models[m]);
        int p0[] = {5, 9, 17, 3, 44, 2, 8}, p1[] = {60, 61}, p0_copy[] = {5, 9, 17, 3, 44, 2, 8};
        const int *prompts[] = {p0, p1, p0, p1, p0_copy, p0, p1};
        int lengths[] = {7, 2, 7, 2, 7, 7, 2};
        uint64_t ids[] = {10, 11, 12, 13, 14, 15, 16};
        GenerateOptions options = {.sampler = {.temperature = 1.0f, .top_k = 20}, .max_new_tokens = 10, .seed = 7};
        GeneratedRow shared[7], separate[7];
        generate(&model, prompts, lengths, ids, 7, &options, shared, NULL);
        options.prefill_each_row = true;
        generate(&model, prompts, lengths, ids, 7, &options, separate, NULL);
        for (int b = 0; b < 7; b++) {
            EXPECT(shared[b].length == separate[b].length &&
                       !memcmp(shared[b].tokens, separate[b].tokens, shared[b].length * sizeof(int)),
                   "%s row %d: shared prefill gives other tokens", models[m], b);
            for (int i = 0; i < shared[b].length && i < separate[b].length; i++)
                EXPECT_CLOSE(shared[b].logprobs[i], separate[b].logprobs[i], 1e-5, 0, "shared prefill log-prob");
        }
        // The rows of one prompt still draw their own tokens.
        EXPECT(memcmp(shared[0].tokens, shared[2].tokens, 10 * sizeof(int)) != 0, "%s: rows 0 and 2 equal", models[m]);
        for (int b = 0; b < 7; b++) generated_row_free(&shared[b]), generated_row_free(&separate[b]);
        model_free(&model);
    }
}

// A model that trains (PPO's actor) generates in one set of activations sized for the
// generation's rows, without the backward's buffers, and a training forward after it sizes
// every layer's set (and those buffers) for its own
// rows only (model_reserve_cached; before, each dimension took the larger of the two, so a
// rollout of many rows grew every layer's set of the micro-batches after it). That training
// layout keeps the generation's rows, so the next generation whose slots it holds (6 x 4 in
// 2 x 12) runs in it: no activation is freed or made again. The training step's loss and
// gradients are the same bits as without the generations, and the generations the same
// tokens and log-probs as the same weights' without gradients.
static void test_generation_between_training_steps(void) {
    Model trained, frozen;
    load(&trained, "tests/fixtures/models/llama");
    load(&frozen, "tests/fixtures/models/llama");
    model_enable_grad(&trained);
    const int B = 2, T = 12, V = trained.config.vocab_size;
    int tokens[2 * 12], targets[2 * 12];
    for (int i = 0; i < B * T; i++) tokens[i] = (7 * i + 3) % V;
    for (int i = 0; i < B * T; i++) targets[i] = (i + 1) % T ? tokens[i + 1] : -1;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
    float logp[2][2 * 12];
    const long trainable = model_trainable_floats(&trained);
    float *grads[2] = {xmalloc(trainable * sizeof(float)), xmalloc(trainable * sizeof(float))};
    float dlogp[2 * 12];
    for (int i = 0; i < B * T; i++) dlogp[i] = targets[i] >= 0 ? -1.0f : 0.0f;
    int p[6][5] = {{5, 9, 17, 3, 44}, {60, 61, 2, 8, 9}, {1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}, {11, 12, 13, 14, 15}, {4, 4, 4, 4, 4}};
    const int *prompts[6] = {p[0], p[1], p[2], p[3], p[4], p[5]};
    int lengths[6] = {5, 5, 5, 5, 5, 5};
    GenerateOptions options = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 4};
    float logp_last[2 * 12];
    float *grads_last = xmalloc(trainable * sizeof(float));
    for (int pass = 0; pass < 3; pass++) {
        model_forward(&trained, &batch);
        EXPECT(trained.acts.keep_all_layers && trained.acts.backward_buffers && trained.acts.capacity_B == B &&
                   trained.acts.capacity_T == T,
               "pass %d: a training forward of %d x %d in activations for %d x %d (every layer's: %d)", pass, B, T,
               trained.acts.capacity_B, trained.acts.capacity_T, trained.acts.keep_all_layers);
        EXPECT(trained.acts.capacity_rows == (pass == 0 ? B : 6), "pass %d: per-row buffers of %d rows", pass,
               trained.acts.capacity_rows);
        EXPECT(trained.acts.residual_slices == trained.config.num_layers + 1, "pass %d: %d slices of the residual stream",
               pass, trained.acts.residual_slices);
        model_logprobs(&trained, targets, pass == 2 ? logp_last : logp[pass], NULL, NULL);
        model_zero_grad(&trained);
        model_backward(&trained, dlogp, NULL, NULL);
        model_settle_gradients(&trained);
        trained.ops->copy_to_host(pass == 2 ? grads_last : grads[pass], trained.grads, trainable * sizeof(float));
        if (pass == 2) break;
        GeneratedRow rows[6], frozen_rows[6];
        const float *training_residual = trained.acts.residual;
        for (int b = 0; b < 6; b++) lengths[b] = pass == 0 ? 5 : 4; // pass 1: 6 x 4 slots, the training layout's 24
        generate(&trained, prompts, lengths, NULL, 6, &options, rows, NULL);
        // Generation's own layout keeps two slices of the residual stream, used in turn; a
        // training layout every layer's input (the backward reads them).
        if (pass == 0)
            EXPECT(!trained.acts.keep_all_layers && !trained.acts.backward_buffers && trained.acts.capacity_B == 6 &&
                       trained.acts.capacity_T == 5 && trained.acts.residual_slices == 2,
                   "generation of 6 x 5 in activations for %d x %d (every layer's: %d, the backward's buffers: %d)",
                   trained.acts.capacity_B, trained.acts.capacity_T, trained.acts.keep_all_layers,
                   trained.acts.backward_buffers);
        else
            EXPECT(trained.acts.keep_all_layers && trained.acts.capacity_B == B && trained.acts.capacity_T == T &&
                       trained.acts.residual == training_residual,
                   "generation of 6 x 4 made new activations (%d x %d, every layer's: %d) instead of running in the "
                   "training layout's 2 x 12 slots",
                   trained.acts.capacity_B, trained.acts.capacity_T, trained.acts.keep_all_layers);
        generate(&frozen, prompts, lengths, NULL, 6, &options, frozen_rows, NULL);
        for (int b = 0; b < 6; b++) {
            EXPECT(rows[b].length == frozen_rows[b].length &&
                       !memcmp(rows[b].tokens, frozen_rows[b].tokens, rows[b].length * sizeof(int)) &&
                       !memcmp(rows[b].logprobs, frozen_rows[b].logprobs, rows[b].length * sizeof(float)),
                   "row %d: the training model generates otherwise than its weights without gradients", b);
            generated_row_free(&rows[b]), generated_row_free(&frozen_rows[b]);
        }
    }
    EXPECT(!memcmp(logp[0], logp[1], sizeof logp[0]), "the training forward after generation: other log-probs");
    EXPECT(!memcmp(grads[0], grads[1], trainable * sizeof(float)), "the training step after generation: other gradients");
    EXPECT(!memcmp(logp[0], logp_last, sizeof logp[0]),
           "the training forward after a generation in its own activations: other log-probs");
    EXPECT(!memcmp(grads[0], grads_last, trainable * sizeof(float)),
           "the training step after a generation in its own activations: other gradients");
    free(grads[0]), free(grads[1]), free(grads_last);
    model_free(&trained), model_free(&frozen);
}

// A trainable model whose activations were reserved as PPO reserves its actor's (generation's
// rows first, then a training layout of 2 x 12): prompts of 6 x 5 slots, more than the
// layout's 24, are prefilled in chunks of 4 and 2 rows inside it (model_cached_rows_fitting,
// model_prefill_rows) instead of a generation layout replacing it; the answers are those of
// the same weights without gradients, prefilled whole (the same tokens, log-probs within
// float rounding). Also with repeated prompts (8 rows,
// 6 distinct: the distinct ones prefilled in chunks, their cache rows then copied).
static void test_generation_prefill_in_chunks_of_rows(void) {
    Model trained, frozen;
    load(&trained, "tests/fixtures/models/llama");
    load(&frozen, "tests/fixtures/models/llama");
    model_enable_grad(&trained);
    int p[6][5] = {{5, 9, 17, 3, 44}, {60, 61, 2, 8, 9}, {1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}, {11, 12, 13, 14, 15}, {4, 4, 4, 4, 4}};
    const int *prompts[8] = {p[0], p[1], p[2], p[3], p[4], p[5], p[0], p[1]};
    const int lengths[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    GenerateOptions options = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 4};
    for (int rows = 6; rows <= 8; rows += 2) {
        model_release_activations(&trained);
        model_reserve_cached(&trained, rows, 5);
        model_reserve(&trained, 2, 12);
        const float *training_residual = trained.acts.residual;
        EXPECT(model_cached_rows_fitting(&trained, 5) == 4 && model_cached_rows_fitting(&trained, 1) == rows,
               "%d rows: %d rows of 5 tokens and %d of 1 fit the 2 x 12 layout, want 4 and %d", rows,
               model_cached_rows_fitting(&trained, 5), model_cached_rows_fitting(&trained, 1), rows);
        GeneratedRow chunked[8], whole[8];
        generate(&trained, prompts, lengths, NULL, rows, &options, chunked, NULL);
        EXPECT(trained.acts.keep_all_layers && trained.acts.backward_buffers && trained.acts.capacity_B == 2 &&
                   trained.acts.capacity_T == 12 && trained.acts.residual == training_residual,
               "%d rows: generation made new activations (%d x %d, every layer's: %d)", rows, trained.acts.capacity_B,
               trained.acts.capacity_T, trained.acts.keep_all_layers);
        generate(&frozen, prompts, lengths, NULL, rows, &options, whole, NULL);
        for (int b = 0; b < rows; b++) {
            // The same tokens; log-probs within float rounding: a row's products in a batch of
            // 2 or 4 rows rather than 6 may round otherwise (sgemm's blocking), ~1e-7 here.
            float worst = 0.0f;
            for (int j = 0; j < chunked[b].length && j < whole[b].length; j++)
                worst = fmaxf(worst, fabsf(chunked[b].logprobs[j] - whole[b].logprobs[j]));
            EXPECT(chunked[b].length == whole[b].length &&
                       !memcmp(chunked[b].tokens, whole[b].tokens, chunked[b].length * sizeof(int)) && worst <= 1e-5f,
                   "%d rows, row %d: prefilled in chunks, it generates otherwise than prefilled whole (log-probs %g "
                   "apart)", rows, b, worst);
            generated_row_free(&chunked[b]), generated_row_free(&whole[b]);
        }
    }
    model_free(&trained), model_free(&frozen);
}

// Per-row settings (marlhf serve's batches): each row of a batch generates what it does
// alone with its own sampler, seed and length limit.
static void test_per_row_settings(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    int p0[] = {5, 9, 17, 3}, p1[] = {60, 61}, p2[] = {7, 8, 9};
    const int *prompts[] = {p0, p1, p2};
    int lengths[] = {4, 2, 3}, max_new[] = {12, 5, 9};
    SamplerConfig samplers[] = {{.temperature = 1.0f}, {.temperature = 0.0f}, {.temperature = 1.5f, .top_k = 10, .top_p = 0.9f}};
    uint64_t seeds[] = {101, 202, 303}, ids[] = {0, 0, 0};
    GenerateOptions together = {.max_new_tokens = 12, .row_samplers = samplers, .row_seeds = seeds,
                                .row_max_new_tokens = max_new};
    GeneratedRow rows[3];
    generate(&model, prompts, lengths, ids, 3, &together, rows, NULL);
    for (int b = 0; b < 3; b++) {
        GenerateOptions alone = {.sampler = samplers[b], .max_new_tokens = max_new[b], .seed = seeds[b]};
        GeneratedRow row;
        generate(&model, &prompts[b], &lengths[b], &ids[b], 1, &alone, &row, NULL);
        EXPECT(rows[b].length == max_new[b] && rows[b].stop == STOP_LENGTH, "row %d: %d tokens", b, rows[b].length);
        EXPECT(row.length == rows[b].length && !memcmp(row.tokens, rows[b].tokens, row.length * sizeof(int)),
               "row %d differs from its request alone", b);
        generated_row_free(&row);
        generated_row_free(&rows[b]);
    }
    model_free(&model);
}

// For each step, the recorded k alternatives against a full forward over prompt + generated
// tokens: their log-probs are the k largest of log softmax(logits) (in double) and their
// own, within 1e-4, in descending order with ties by the lower id. Sampled rows (one with
// min_new_tokens, which must not mask the alternatives) and a greedy row, in one batch;
// the same batch without the option generates the same bits.
static void test_top_logprobs(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    const int V = model.config.vocab_size, k = 4;
    int p0[] = {5, 9, 17, 3, 44, 2, 8}, p1[] = {60, 61}, p2[] = {7, 8, 9};
    const int *prompts[] = {p0, p1, p2};
    int lengths[] = {7, 2, 3};
    SamplerConfig samplers[] = {{.temperature = 1.0f}, {.temperature = 0.8f, .top_k = 10, .top_p = 0.9f}, {.temperature = 0.0f}};
    uint64_t seeds[] = {5, 6, 7};
    int stop_token = 3;
    GenerateOptions options = {.max_new_tokens = 10, .row_samplers = samplers, .row_seeds = seeds,
                               .stop_tokens = &stop_token, .num_stop_tokens = 1, .min_new_tokens = 4,
                               .prefill_each_row = true};
    GeneratedRow plain[3], recorded[3];
    generate(&model, prompts, lengths, NULL, 3, &options, plain, NULL);
    options.top_logprobs = k;
    generate(&model, prompts, lengths, NULL, 3, &options, recorded, NULL);
    float *logits = xmalloc(V * sizeof(float));
    double *logp = xmalloc(V * sizeof(double));
    bool *taken = xmalloc(V * sizeof(bool));
    for (int b = 0; b < 3; b++) {
        const GeneratedRow *row = &recorded[b];
        EXPECT(plain[b].top_tokens == NULL && plain[b].top_logprobs == NULL && plain[b].top_count == 0,
               "row %d: alternatives recorded without the option", b);
        EXPECT(row->top_count == k, "row %d: %d alternatives", b, row->top_count);
        EXPECT(row->length == plain[b].length && row->stop == plain[b].stop &&
                   !memcmp(row->tokens, plain[b].tokens, row->length * sizeof(int)) &&
                   !memcmp(row->logprobs, plain[b].logprobs, row->length * sizeof(float)) &&
                   !memcmp(row->sampling_logprobs, plain[b].sampling_logprobs, row->length * sizeof(float)),
               "row %d: other output with top_logprobs", b);
        int T = lengths[b] + row->length;
        int *tokens = xmalloc(T * sizeof(int));
        memcpy(tokens, prompts[b], lengths[b] * sizeof(int));
        memcpy(tokens + lengths[b], row->tokens, row->length * sizeof(int));
        ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
        model_forward(&model, &batch);
        for (int t = 0; t < row->length; t++) {
            model_logits_row(&model, lengths[b] - 1 + t, logits);
            double max_logit = logits[0], sum = 0;
            for (int v = 1; v < V; v++) max_logit = logits[v] > max_logit ? logits[v] : max_logit;
            for (int v = 0; v < V; v++) sum += exp((double)logits[v] - max_logit);
            for (int v = 0; v < V; v++) logp[v] = (double)logits[v] - max_logit - log(sum);
            const int *top = row->top_tokens + t * k;
            const float *top_logp = row->top_logprobs + t * k;
            // The k largest log-probs, by selection: the j-th is the largest not yet taken.
            memset(taken, 0, V * sizeof(bool));
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int v = 0; v < V; v++)
                    if (!taken[v] && (best < 0 || logp[v] > logp[best])) best = v;
                taken[best] = true;
                EXPECT_CLOSE(top_logp[j], logp[best], 1e-4, 0, "the j-th largest log-prob");
                EXPECT_CLOSE(top_logp[j], logp[top[j]], 1e-4, 0, "an alternative's own log-prob");
                if (j > 0)
                    EXPECT(top_logp[j - 1] > top_logp[j] || (top_logp[j - 1] == top_logp[j] && top[j - 1] < top[j]),
                           "row %d step %d: alternatives %d and %d out of order", b, t, j - 1, j);
            }
            // (Below min_new_tokens the greedy token is the best one but the stop token.)
            if (samplers[b].temperature == 0.0f && t >= options.min_new_tokens)
                EXPECT(row->tokens[t] == top[0] && row->logprobs[t] == top_logp[0],
                       "row %d step %d: the greedy token %d (%.9g) is not the first alternative %d (%.9g)", b, t,
                       row->tokens[t], row->logprobs[t], top[0], top_logp[0]);
        }
        free(tokens);
        generated_row_free(&plain[b]);
        generated_row_free(&recorded[b]);
    }
    free(logits), free(logp), free(taken);
    model_free(&model);
}

static int compare_floats_descending(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_logits_left_on_device_match_host_sampler(void) {
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gemma2"};
    // all greedy (model_last_greedy); greedy beside top-k rows, one with top-p after it
    // (model_last_candidates)
    const SamplerConfig all_greedy[3] = {{.temperature = 0.0f}, {.temperature = 0.0f}, {.temperature = 0.0f}};
    const SamplerConfig top_k[3] = {{.temperature = 0.8f, .top_k = 5},
                                    {.temperature = 0.0f},
                                    {.temperature = 1.3f, .top_k = 12, .top_p = 0.8f}};
    const SamplerConfig *configs[2] = {all_greedy, top_k};
    for (int m = 0; m < 2; m++)
        for (int c = 0; c < 2; c++) {
            Model model;
            load(&model, models[m]);
            int p0[] = {5, 9, 17, 3, 44, 2, 8}, p1[] = {60, 61}, p2[] = {7, 8, 9};
            const int *prompts[] = {p0, p1, p2};
            int lengths[] = {7, 2, 3}, stop_token = 3;
            uint64_t seeds[] = {11, 12, 13};
            // min_new_tokens: its first 3 steps mask the stop token on the host, the rest not
            GenerateOptions options = {.row_samplers = configs[c], .row_seeds = seeds, .max_new_tokens = 12,
                                       .stop_tokens = &stop_token, .num_stop_tokens = 1, .min_new_tokens = 3};
            GeneratedRow device[3], host[3];
            generate(&model, prompts, lengths, NULL, 3, &options, device, NULL);
            options.top_logprobs = 1; // the host reads every step's logits
            generate(&model, prompts, lengths, NULL, 3, &options, host, NULL);
            for (int b = 0; b < 3; b++) {
                EXPECT(device[b].length > 3, "%s config %d row %d: %d tokens (the test wants steps past the host's)",
                       models[m], c, b, device[b].length);
                EXPECT(device[b].length == host[b].length && device[b].stop == host[b].stop &&
                           !memcmp(device[b].tokens, host[b].tokens, device[b].length * sizeof(int)) &&
                           !memcmp(device[b].logprobs, host[b].logprobs, device[b].length * sizeof(float)) &&
                           !memcmp(device[b].sampling_logprobs, host[b].sampling_logprobs,
                                   device[b].length * sizeof(float)),
                       "%s config %d row %d: tokens or log-probs differ from the host sampler's", models[m], c, b);
                for (int t = 0; t < device[b].length; t++)
                    EXPECT(device[b].logprobs[t] < 0.0f && (configs[c][b].temperature > 0.0f) ==
                                                             (device[b].sampling_logprobs[t] != 0.0f),
                           "%s config %d row %d step %d", models[m], c, b, t);
                generated_row_free(&device[b]), generated_row_free(&host[b]);
            }
            // The candidates themselves, after a forward of the three prompts: each row's
            // tokens at or above its k-th largest scaled logit, from the copied logits.
            const int V = model.config.vocab_size, capacity = 40;
            int tokens[3 * 7] = {0}, row_start[3];
            for (int b = 0; b < 3; b++) {
                row_start[b] = 7 - lengths[b];
                memcpy(tokens + b * 7 + row_start[b], prompts[b], lengths[b] * sizeof(int));
            }
            KvCache cache;
            kv_cache_init(&cache, &model, 3, 8);
            ModelBatch batch = {.B = 3, .T = 7, .tokens = tokens, .row_start = row_start};
            model_forward_cached(&model, &batch, &cache);
            const float inverse[3] = {1.0f / 0.8f, 1.0f, 1.0f / 1.3f};
            const int ks[3] = {5, 1, 12};
            int counts[3], ids[3 * 40];
            float values[3 * 40], *logits = xmalloc((size_t)3 * V * sizeof(float));
            double lse[3], scaled_lse[3];
            EXPECT(model_last_candidates(&model, inverse, ks, capacity, counts, ids, values, lse, scaled_lse),
                   "%s: candidates fit", models[m]);
            model_last_logits(&model, logits);
            for (int b = 0; b < 3; b++) {
                const float *row = logits + (long)b * V;
                int at = 0;
                float *sorted = xmalloc(V * sizeof(float));
                for (int v = 0; v < V; v++) sorted[v] = row[v] * inverse[b];
                qsort(sorted, V, sizeof(float), compare_floats_descending);
                for (int v = 0; v < V; v++)
                    if (row[v] * inverse[b] >= sorted[ks[b] - 1]) {
                        EXPECT(at < counts[b] && ids[b * capacity + at] == v && values[b * capacity + at] == row[v],
                               "%s row %d: candidate %d", models[m], b, v);
                        at++;
                    }
                EXPECT(at == counts[b] && counts[b] >= ks[b], "%s row %d: %d candidates, %d expected", models[m], b,
                       counts[b], at);
                double max = row[0], sum = 0;
                for (int v = 1; v < V; v++) max = row[v] > max ? row[v] : max;
                for (int v = 0; v < V; v++) sum += exp((double)(row[v] - (float)max));
                EXPECT(lse[b] == (float)max + log(sum), "%s row %d: log-normaliser %.17g", models[m], b, lse[b]);
                // The scaled row's: fp32 exponentials summed in fp64 (ops.h, as sample_rows).
                float max_scaled = -INFINITY;
                for (int v = 0; v < V; v++) max_scaled = fmaxf(max_scaled, row[v] * inverse[b]);
                double sum_scaled = 0;
                for (int v = 0; v < V; v++) sum_scaled += (double)expf(row[v] * inverse[b] - max_scaled);
                EXPECT(scaled_lse[b] == max_scaled + log(sum_scaled), "%s row %d: scaled log-normaliser %.17g",
                       models[m], b, scaled_lse[b]);
                free(sorted);
            }
            EXPECT(!model_last_candidates(&model, inverse, ks, 4, counts, ids, values, lse, NULL),
                   "%s: 12 candidates in room for 4", models[m]);
            free(logits);
            kv_cache_free(&cache, &model);
            model_free(&model);
        }
}

static void test_stop_tokens_and_lengths(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    int prompt[] = {3, 1, 4, 1, 5};
    const int *prompts[] = {prompt};
    int length = 5;
    // Greedy first, then stop on the 3rd greedy token: the row must end there, stop kept.
    GenerateOptions options = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 10};
    GeneratedRow greedy;
    generate(&model, prompts, &length, NULL, 1, &options, &greedy, NULL);
    int stop_token = greedy.tokens[2];
    int first = 0;
    while (greedy.tokens[first] != stop_token) first++;
    options.stop_tokens = &stop_token;
    options.num_stop_tokens = 1;
    GeneratedRow stopped;
    generate(&model, prompts, &length, NULL, 1, &options, &stopped, NULL);
    EXPECT(stopped.stop == STOP_TOKEN && stopped.length == first + 1, "stopped after %d tokens (%s)", stopped.length,
           stop_reason_name(stopped.stop));
    EXPECT(memcmp(stopped.tokens, greedy.tokens, stopped.length * sizeof(int)) == 0, "same prefix");
    for (int i = 0; i < greedy.length; i++) EXPECT(greedy.sampling_logprobs[i] == 0.0f, "greedy has probability 1");
    generated_row_free(&greedy), generated_row_free(&stopped);
    model_free(&model);
}

// min_new_tokens: a stop token that greedy decoding would pick first cannot come before
// the minimum; the log-probs reported are still the unmasked model's.
static void test_min_new_tokens(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    int prompt[] = {3, 1, 4, 1, 5};
    const int *prompts[] = {prompt};
    int length = 5;
    GenerateOptions options = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 8};
    GeneratedRow greedy;
    generate(&model, prompts, &length, NULL, 1, &options, &greedy, NULL);
    int stop_token = greedy.tokens[0];
    options.stop_tokens = &stop_token;
    options.num_stop_tokens = 1;
    options.min_new_tokens = 3;
    GeneratedRow row;
    generate(&model, prompts, &length, NULL, 1, &options, &row, NULL);
    EXPECT(row.length >= 4, "stopped after %d tokens despite min_new_tokens 3", row.length);
    for (int i = 0; i < 3 && i < row.length; i++) EXPECT(row.tokens[i] != stop_token, "stop token at %d", i);
    // Reported log-probs against a full forward over prompt + generated tokens.
    int T = length + row.length;
    int *tokens = xmalloc(T * sizeof(int)), *targets = xmalloc(T * sizeof(int));
    memcpy(tokens, prompt, length * sizeof(int));
    memcpy(tokens + length, row.tokens, row.length * sizeof(int));
    for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
    float *logp = xmalloc(T * sizeof(float));
    ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
    model_forward(&model, &batch);
    model_logprobs(&model, targets, logp, NULL, NULL);
    for (int j = 0; j < row.length; j++)
        EXPECT_CLOSE(row.logprobs[j], logp[length - 1 + j], 1e-4, 0, "log-prob under the unmasked model");
    options.min_new_tokens = 0;
    GeneratedRow unconstrained;
    generate(&model, prompts, &length, NULL, 1, &options, &unconstrained, NULL);
    EXPECT(unconstrained.length == 1 && unconstrained.stop == STOP_TOKEN, "without a minimum the row stops at once");
    free(tokens), free(targets), free(logp);
    generated_row_free(&greedy), generated_row_free(&row), generated_row_free(&unconstrained);
    model_free(&model);
}

static void test_sampler_distribution(void) {
    const int V = 6;
    float logits[6] = {2.0f, 1.5f, 0.3f, -1.0f, 1.5f, 0.9f};
    SamplerConfig configs[] = {
        {.temperature = 1.0f},
        {.temperature = 0.7f, .top_k = 3},
        {.temperature = 1.3f, .top_p = 0.8f},
        {.temperature = 1.0f, .top_k = 5, .top_p = 0.9f},
        {.temperature = 0.9f, .min_p = 0.3f},
    };
    SamplerScratch scratch;
    sampler_scratch_init(&scratch, V);
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        float probs[6];
        sampler_distribution(logits, V, &configs[c], probs, &scratch);
        double total = 0;
        for (int v = 0; v < V; v++) total += probs[v];
        EXPECT_CLOSE(total, 1.0, 1e-6, 0, "distribution sums to one");
        const int draws = 40000;
        int counts[6] = {0};
        for (int i = 0; i < draws; i++) {
            double u = rng_uniform_double(99, rng_stream("chi-square", c, 0), (uint64_t)i);
            SampledToken t = sampler_pick(logits, V, &configs[c], u, &scratch);
            counts[t.token]++;
            EXPECT_CLOSE(t.sampling_logprob, log(probs[t.token]), 1e-5, 0, "sampling log-prob");
        }
        double chi_square = 0;
        int kept = 0;
        for (int v = 0; v < V; v++) {
            if (probs[v] == 0.0f) {
                EXPECT(counts[v] == 0, "config %zu: excluded token %d drawn %d times", c, v, counts[v]);
                continue;
            }
            double expected = probs[v] * draws;
            chi_square += (counts[v] - expected) * (counts[v] - expected) / expected;
            kept++;
        }
        // 0.999 quantiles of chi-square with 1..5 degrees of freedom.
        const double critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};
        EXPECT(chi_square < critical[kept - 1], "config %zu: chi-square %.2f with %d dof", c, chi_square, kept - 1);
    }
    // top-k 3 keeps exactly {0, 1, 4}; ties at the threshold are all kept (k = 2 keeps 3).
    float probs[6];
    SamplerConfig top2 = {.temperature = 1.0f, .top_k = 2};
    sampler_distribution(logits, V, &top2, probs, &scratch);
    EXPECT(probs[0] > 0 && probs[1] > 0 && probs[4] > 0 && probs[2] == 0, "top-k keeps ties");
    sampler_scratch_free(&scratch);
}

// The penalties and min-p against transformers' logits processors (RepetitionPenalty, then
// OpenAI's presence / frequency penalties as vLLM applies them, Temperature, TopK, TopP, MinP;
// tools/make_sampler_fixtures.py): the same distribution; and a row that repeats nothing,
// or penalties of 1 and 0, left as it was.
static void test_sampler_penalties_against_transformers(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/sampler/logits_processors.json", 0, &error);
    CHECK(cases, "logits_processors.json: %s", error.text);
    size_t index;
    json_t *c;
    SamplerScratch scratch;
    sampler_scratch_init(&scratch, 64);
    int filtering_cases = 0; // where top-k, top-p or min-p keep some tokens but not all
    json_array_foreach(cases, index, c) {
        float logits[64], probs[64];
        int prompt[16], generated[16];
        json_t *array = json_object_get(c, "logits");
        const int V = (int)json_array_size(array);
        for (int v = 0; v < V; v++) logits[v] = (float)json_number_value(json_array_get(array, v));
        array = json_object_get(c, "prompt");
        const int prompt_length = (int)json_array_size(array);
        for (int i = 0; i < prompt_length; i++) prompt[i] = (int)json_integer_value(json_array_get(array, i));
        array = json_object_get(c, "generated");
        const int generated_length = (int)json_array_size(array);
        for (int i = 0; i < generated_length; i++) generated[i] = (int)json_integer_value(json_array_get(array, i));
        SamplerConfig config = {
            .temperature = (float)json_number_value(json_object_get(c, "temperature")),
            .top_k = (int)json_integer_value(json_object_get(c, "top_k")),
            .top_p = (float)json_number_value(json_object_get(c, "top_p")),
            .min_p = (float)json_number_value(json_object_get(c, "min_p")),
            .repetition_penalty = (float)json_number_value(json_object_get(c, "repetition_penalty")),
            .presence_penalty = (float)json_number_value(json_object_get(c, "presence_penalty")),
            .frequency_penalty = (float)json_number_value(json_object_get(c, "frequency_penalty")),
        };
        sampler_adjust_logits(&config, logits, V, prompt, prompt_length, generated, generated_length, &scratch);
        sampler_distribution(logits, V, &config, probs, &scratch);
        int kept = 0;
        for (int v = 0; v < V; v++) {
            const double want = json_number_value(json_array_get(json_object_get(c, "probs"), v));
            EXPECT_CLOSE(probs[v], want, 2e-6, 1e-5, "probability against transformers");
            EXPECT((probs[v] == 0) == (want == 0), "case %zu token %d kept by one and not the other", index, v);
            kept += want > 0;
        }
        filtering_cases += kept > 1 && kept < V;
        for (int v = 0; v < 64; v++) EXPECT(scratch.seen[v] == 0, "case %zu left token %d marked", index, v);
    }
    EXPECT(filtering_cases >= 2, "%d cases keep some tokens but not all", filtering_cases);
    json_decref(cases);
    // Off: a repetition penalty of 0 or 1 and no presence or frequency penalty change nothing.
    float logits[4] = {1.5f, -0.5f, 0.25f, 2.0f}, same[4];
    memcpy(same, logits, sizeof same);
    const int seen[3] = {0, 1, 1};
    SamplerConfig off = {.temperature = 1.0f, .repetition_penalty = 1.0f};
    EXPECT(!sampler_adjusts_logits(&off) && !sampler_adjusts_logits(&(SamplerConfig){.temperature = 1.0f}), "penalties off");
    sampler_adjust_logits(&off, logits, 4, seen, 3, seen, 3, &scratch);
    EXPECT(!memcmp(logits, same, sizeof same), "no penalty, no change");
    // A masked token stays masked.
    float masked[4] = {-INFINITY, 1.0f, 0.5f, 0.0f};
    SamplerConfig all = {.temperature = 1.0f, .repetition_penalty = 1.5f, .presence_penalty = 1.0f, .frequency_penalty = 1.0f};
    sampler_adjust_logits(&all, masked, 4, seen, 3, seen, 3, &scratch);
    EXPECT(masked[0] == -INFINITY && masked[2] == 0.5f, "masked token stays masked, unseen token unchanged");
    // Logit biases add to their tokens' logits, after the penalties, and count as adjusting them.
    const SamplerLogitBias biases[2] = {{2, -100.0f}, {3, 1.5f}};
    SamplerConfig biased = {.temperature = 1.0f, .logit_bias = biases, .logit_bias_count = 2};
    float row[4] = {1.5f, -0.5f, 0.25f, 2.0f};
    EXPECT(sampler_adjusts_logits(&biased), "a logit bias adjusts the logits");
    sampler_adjust_logits(&biased, row, 4, seen, 3, seen, 3, &scratch);
    EXPECT(row[0] == 1.5f && row[1] == -0.5f && row[2] == 0.25f - 100.0f && row[3] == 3.5f, "biases added: %g %g %g %g",
           row[0], row[1], row[2], row[3]);
    sampler_scratch_free(&scratch);
}

// The sampler's top-p before its radix sort, kept here as the reference: sort the top-k
// candidates by qsort (largest first, ties by ascending id), drop the least likely tail of
// mass <= 1 - top_p, normalise what is left. probs[v]: what sampler_distribution reports.
static const float *reference_values;
static int reference_descending(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (reference_values[i] > reference_values[j]) return -1;
    if (reference_values[i] < reference_values[j]) return 1;
    return (i > j) - (i < j);
}
static int compare_ids(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
static void reference_top_p(const float *logits, int V, const SamplerConfig *config, float *probs) {
    float *scaled = xmalloc((size_t)V * sizeof(float));
    int *ids = xmalloc((size_t)V * sizeof(int)), count = 0;
    for (int v = 0; v < V; v++) scaled[v] = logits[v] * (1.0f / config->temperature);
    float threshold = -INFINITY;
    if (config->top_k > 0) {
        for (int i = 0; i < V; i++) ids[i] = i;
        reference_values = scaled;
        qsort(ids, (size_t)V, sizeof(int), reference_descending);
        threshold = scaled[ids[config->top_k - 1]];
    }
    for (int v = 0; v < V; v++)
        if (scaled[v] >= threshold) ids[count++] = v;
    reference_values = scaled;
    qsort(ids, (size_t)count, sizeof(int), reference_descending);
    double max_value = scaled[ids[0]], total = 0, tail = 0;
    for (int i = 0; i < count; i++) total += exp(scaled[ids[i]] - max_value);
    int keep = count;
    for (int i = count - 1; i > 0; i--) {
        tail += exp(scaled[ids[i]] - max_value) / total;
        if (tail <= 1.0 - config->top_p) keep = i;
        else break;
    }
    // ascending ids, as the sampler sums them
    qsort(ids, (size_t)keep, sizeof(int), compare_ids);
    double sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(scaled[ids[i]] - max_value);
    const double log_normaliser = max_value + log(sum);
    memset(probs, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < keep; i++) probs[ids[i]] = (float)exp(scaled[ids[i]] - log_normaliser);
    free(scaled), free(ids);
}

static void test_top_p_matches_comparison_sort(void) {
    const int V = 3000;
    float *logits = xmalloc(V * sizeof(float)), *probs = xmalloc(V * sizeof(float));
    float *expected = xmalloc(V * sizeof(float));
    SamplerScratch scratch;
    sampler_scratch_init(&scratch, V);
    SamplerConfig configs[] = {{.temperature = 1.0f, .top_p = 0.9f},
                               {.temperature = 0.7f, .top_p = 0.5f},
                               {.temperature = 1.0f, .top_p = 0.999f},
                               {.temperature = 1.2f, .top_k = 200, .top_p = 0.8f}};
    int cuts_with_several = 0;
    for (int trial = 0; trial < 6; trial++)
        for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
            // Peaked (a few large logits) or flat, values on a coarse grid so that ties are
            // common, some -0, +0 and -inf.
            for (int v = 0; v < V; v++) {
                const double u = rng_uniform_double(17, rng_stream("top-p", (uint64_t)trial, 0), (uint64_t)v);
                float x = (float)((int)(u * 64) - 40) / 4.0f;
                if (trial % 2 == 0 && v % 97 == 0) x += 12.0f;
                if (v % 211 == 0) x = -0.0f;
                if (v % 307 == 0) x = 0.0f;
                if (v % 401 == 0) x = -INFINITY;
                logits[v] = x;
            }
            reference_top_p(logits, V, &configs[c], expected);
            sampler_distribution(logits, V, &configs[c], probs, &scratch);
            int differ = 0, kept = 0;
            for (int v = 0; v < V; v++) differ += memcmp(&probs[v], &expected[v], sizeof(float)) != 0, kept += probs[v] > 0;
            EXPECT(differ == 0, "trial %d config %zu: %d of %d probabilities differ from the comparison sort's", trial, c,
                   differ, V);
            EXPECT(kept < V, "trial %d config %zu: top-p kept all %d (the test should cut)", trial, c, V);
            cuts_with_several += kept > 1;
            for (int i = 0; i < 20; i++) {
                const double u = rng_uniform_double(23, rng_stream("top-p draw", (uint64_t)trial, c), (uint64_t)i);
                const SampledToken t = sampler_pick(logits, V, &configs[c], u, &scratch);
                EXPECT(expected[t.token] > 0, "trial %d config %zu: drew token %d outside the kept set", trial, c, t.token);
            }
        }
    EXPECT(cuts_with_several >= 20, "only %d of 24 cases kept more than one token", cuts_with_several);
    // A cut inside a tie of -0 and +0: the first two zeros by id stay (as -0 == +0).
    const float zeros[5] = {2.0f, -0.0f, 0.0f, -0.0f, 0.0f};
    const SamplerConfig cut = {.temperature = 1.0f, .top_p = 0.8f};
    reference_top_p(zeros, 5, &cut, expected);
    sampler_distribution(zeros, 5, &cut, probs, &scratch);
    EXPECT(expected[1] > 0 && expected[2] > 0 && expected[3] == 0 && expected[4] == 0, "the reference keeps ids 0, 1, 2");
    EXPECT(!memcmp(probs, expected, 5 * sizeof(float)), "a cut inside a tie of -0 and +0: %g %g %g %g %g", probs[0],
           probs[1], probs[2], probs[3], probs[4]);
    sampler_scratch_free(&scratch);
    free(logits), free(probs), free(expected);
}

// Top-p without top-k from a row's candidates (what a GPU hands the host: sampler_candidates_
// hold_nucleus, sampler_pick_nucleus_candidates), with the CPU's sampling_candidates: where
// the candidates hold the nucleus, the same kept set as sampler_distribution on the whole row
// and, for 20 draws each, the same token as sampler_pick with log-probs within 1e-9; where they
// do not, the whole row's kept set has a token outside them (or its cut lies within 1e-9
// of 1 - top_p). Peaked and flat rows of 3000 logits with ties, at 32, 256 and 1024
// candidates: both answers occur.
static void test_top_p_from_candidates(void) {
    const int V = 3000, capacities = 2 * 1024 + 16;
    float *logits = xmalloc(V * sizeof(float)), *probs = xmalloc(V * sizeof(float));
    float *values = xmalloc(capacities * sizeof(float));
    int *ids = xmalloc(capacities * sizeof(int));
    SamplerScratch scratch;
    sampler_scratch_init(&scratch, V);
    const SamplerConfig configs[] = {{.temperature = 1.0f, .top_p = 0.9f},
                                     {.temperature = 0.7f, .top_p = 0.5f},
                                     {.temperature = 1.3f, .top_p = 0.95f},
                                     {.temperature = 1.0f, .top_p = 0.999f}};
    const int ks[] = {32, 256, 1024};
    int held = 0, short_of = 0;
    for (int trial = 0; trial < 4; trial++)
        for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++)
            for (size_t kk = 0; kk < sizeof ks / sizeof ks[0]; kk++) {
                for (int v = 0; v < V; v++) {
                    const double u = rng_uniform_double(29, rng_stream("nucleus", (uint64_t)trial, 0), (uint64_t)v);
                    float x = (float)((int)(u * 64) - 40) / (trial % 2 ? 16.0f : 4.0f); // flat, or peaked
                    if (trial % 2 == 0 && v % 97 == 0) x += 12.0f;
                    if (v % 401 == 0) x = -INFINITY;
                    logits[v] = x;
                }
                const float inverse = 1.0f / configs[c].temperature;
                int count;
                double lse, scaled_lse;
                ops_cpu.sampling_candidates(&count, ids, values, &lse, &scaled_lse, logits, &inverse, &ks[kk], 1, V,
                                            capacities);
                if (count > capacities) continue;
                sampler_distribution(logits, V, &configs[c], probs, &scratch);
                int kept = 0, kept_outside = 0;
                for (int v = 0; v < V; v++) kept += probs[v] > 0;
                for (int v = 0, i = 0; v < V; v++) {
                    const bool candidate = i < count && ids[i] == v;
                    i += candidate;
                    kept_outside += probs[v] > 0 && !candidate;
                }
                if (!sampler_candidates_hold_nucleus(values, count, scaled_lse, &configs[c])) {
                    short_of++;
                    double inside = 0; // how close the cut is
                    for (int i = 0; i < count; i++) inside += exp((double)(values[i] * inverse) - scaled_lse);
                    EXPECT(kept_outside > 0 || fabs((1.0 - inside) - (1.0 - configs[c].top_p)) < 1e-9,
                           "trial %d config %zu k %d: candidates refused, yet the nucleus is among them", trial, c,
                           ks[kk]);
                    continue;
                }
                held++;
                EXPECT(kept_outside == 0, "trial %d config %zu k %d: %d kept tokens outside the candidates", trial, c,
                       ks[kk], kept_outside);
                for (int i = 0; i < 20; i++) {
                    const double u = rng_uniform_double(31, rng_stream("nucleus draw", (uint64_t)trial, c), (uint64_t)i);
                    const SampledToken want = sampler_pick(logits, V, &configs[c], u, &scratch);
                    const SampledToken got = sampler_pick_nucleus_candidates(values, ids, count, lse, scaled_lse,
                                                                            &configs[c], u, &scratch);
                    EXPECT(got.token == want.token && fabs(got.logprob - want.logprob) <= 1e-9 &&
                               fabs(got.sampling_logprob - want.sampling_logprob) <= 1e-9,
                           "trial %d config %zu k %d draw %d: token %d (%g, %g), whole row %d (%g, %g)", trial, c,
                           ks[kk], i, got.token, got.logprob, got.sampling_logprob, want.token, want.logprob,
                           want.sampling_logprob);
                }
            }
    printf("# top-p from candidates: %d rows held their nucleus, %d fell short\n", held, short_of);
    EXPECT(held >= 10 && short_of >= 5, "%d rows held, %d fell short (the test should see both)", held, short_of);
    sampler_scratch_free(&scratch);
    free(logits), free(probs), free(values), free(ids);
}

static void test_smollm2_greedy_matches_transformers(void) {
    Model model;
    ModelLoadOptions options = {.with_lm_head = true};
    if (model_load(&model, "models/SmolLM2-135M-Instruct.Q4_1.gguf", &ops_cpu, &options) != 0) {
        fprintf(stderr, "  %s (run scripts/fetch-model)\n", err_msg());
        test_current_failures++;
        return;
    }
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/smollm2/greedy.json", 0, &error);
    CHECK(cases, "greedy.json: %s", error.text);
    size_t n = json_array_size(cases);
    const int **prompts = xmalloc(n * sizeof(int *));
    int *lengths = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        json_t *ids = json_object_get(json_array_get(cases, i), "prompt_ids");
        lengths[i] = (int)json_array_size(ids);
        int *p = xmalloc(lengths[i] * sizeof(int));
        for (int t = 0; t < lengths[i]; t++) p[t] = (int)json_integer_value(json_array_get(ids, t));
        prompts[i] = p;
    }
    GenerateOptions gen = {.sampler = {.temperature = 0.0f}, .max_new_tokens = 40, .pad_token = 2};
    GeneratedRow *rows = xmalloc(n * sizeof(GeneratedRow));
    generate(&model, prompts, lengths, NULL, (int)n, &gen, rows, NULL); // all five in one batch
    for (size_t i = 0; i < n; i++) {
        json_t *expected = json_object_get(json_array_get(cases, i), "greedy_ids");
        int same = 0;
        while (same < rows[i].length && same < (int)json_array_size(expected) &&
               rows[i].tokens[same] == (int)json_integer_value(json_array_get(expected, same)))
            same++;
        EXPECT(same == 40, "prompt %zu: first %d of 40 greedy tokens agree", i, same);
        generated_row_free(&rows[i]);
        free((int *)prompts[i]);
    }
    free(rows), free(prompts), free(lengths);
    json_decref(cases);
    model_free(&model);
}

int main(void) {
    RUN(test_kv_cache_matches_full_forward);
    RUN(test_kv_cache_q8_greedy);
    RUN(test_batch_composition_invariance);
    RUN(test_shared_prefill);
    RUN(test_generation_between_training_steps);
    RUN(test_generation_prefill_in_chunks_of_rows);
    RUN(test_per_row_settings);
    RUN(test_top_logprobs);
    RUN(test_logits_left_on_device_match_host_sampler);
    RUN(test_stop_tokens_and_lengths);
    RUN(test_min_new_tokens);
    RUN(test_sampler_distribution);
    RUN(test_sampler_penalties_against_transformers);
    RUN(test_top_p_matches_comparison_sort);
    RUN(test_top_p_from_candidates);
    RUN(test_smollm2_greedy_matches_transformers);
    TEST_EXIT();
}
