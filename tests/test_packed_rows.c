// Packed rows (model.h's ModelBatch.segments, model/packed_attention.c): sequences side by
// side in rows, each attending only to itself with its own positions, give the log-probs
// and the gradients of the same sequences as rows of their own. On every fixture model
// (learned positions, RoPE with and without q/k norms, biases, soft caps, sliding windows),
// with the fused q/k/v product on and off, and with gradient checkpointing. A segment that
// saw its neighbours, or positions that ran on across a row, would change its log-probs at
// once. The forward's log-probs are the same bits (the batch-invariant matmul: no op sees a
// row's neighbours); the gradients sum over slots in another order, within 1e-5 of the
// largest.
#include <stdint.h>

#include "core/check.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "ops/cpu/ops_cpu.h"
#include "test.h"

static const char *fixture_names[] = {"gpt2",  "llama", "llama_tied", "llama3_rope",   "qwen2",         "qwen3",
                                      "gemma", "gemma2", "gemma3", "mistral_window", "gemma2_window", "gemma3_window",
                                      "qwen2_window"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

enum { SEQUENCES = 7, LONGEST = 13, PACKED_T = 20 };

typedef struct {
    int length[SEQUENCES];
    int tokens[SEQUENCES][LONGEST];
    float weight[SEQUENCES][LONGEST]; // d loss / d logp of each target
} Sequences;

typedef struct {
    double worst_logp;  // largest |packed - alone| over the targets' log-probs
    double worst_grad;  // largest |packed - alone| over the gradients, over the largest |alone|
} Difference;

// Log-probs and gradients of `s` as B rows of T slots; row b holds the sequences of
// segments with .row == b (segments NULL: one sequence a row, right-padded).
static void run(Model *model, const Sequences *s, const ModelSegment *segments, int segment_count, int B, int T,
                float *logp_out, float *grads_out) {
    const long N = (long)B * T;
    int *tokens = xmalloc((size_t)N * sizeof(int)), *targets = xmalloc((size_t)N * sizeof(int));
    int row_len[SEQUENCES];
    float *logp = xmalloc((size_t)N * sizeof(float)), *dlogp = xcalloc((size_t)N, sizeof(float));
    for (long i = 0; i < N; i++) tokens[i] = (int)(i * 5 % 7), targets[i] = -1; // padding: any ids
    for (int q = 0; q < SEQUENCES; q++) {
        const int row = segments ? segments[q].row : q, start = segments ? segments[q].start : 0;
        row_len[q] = s->length[q];
        for (int t = 0; t < s->length[q]; t++) {
            const long slot = (long)row * T + start + t;
            tokens[slot] = s->tokens[q][t];
            if (t + 1 < s->length[q]) targets[slot] = s->tokens[q][t + 1], dlogp[slot] = s->weight[q][t];
        }
    }
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens, .row_len = segments ? NULL : row_len,
                        .segments = segments, .segment_count = segment_count};
    model_forward(model, &batch);
    model_logprobs(model, targets, logp, NULL, NULL);
    model_zero_grad(model);
    model_backward(model, dlogp, NULL, NULL);
    model_settle_gradients(model);
    memcpy(grads_out, model->grads, (size_t)model->table.total * sizeof(float));
    for (int q = 0; q < SEQUENCES; q++) { // back to [sequence, t]
        const int row = segments ? segments[q].row : q, start = segments ? segments[q].start : 0;
        for (int t = 0; t + 1 < s->length[q]; t++) logp_out[q * LONGEST + t] = logp[(long)row * T + start + t];
    }
    free(tokens), free(targets), free(logp), free(dlogp);
}

static Difference compare(const char *name, bool recompute) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    Model model;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&model, dir, &ops_cpu, &options) == 0, "%s", err_msg());
    model.recompute = recompute;
    model_enable_grad(&model);
    Sequences s;
    for (int q = 0; q < SEQUENCES; q++) {
        s.length[q] = 2 + (int)(next_random() % (LONGEST - 1));
        for (int t = 0; t < LONGEST; t++) {
            s.tokens[q][t] = (int)(next_random() % (uint64_t)model.config.vocab_size);
            s.weight[q][t] = (float)((int)(next_random() % 2001) - 1000) / 4000.0f;
        }
    }
    // First fit, in order, into rows of PACKED_T slots: rows of two or three sequences, some
    // with padding after them.
    ModelSegment segments[SEQUENCES];
    int rows = 0, used[SEQUENCES] = {0};
    for (int q = 0; q < SEQUENCES; q++) {
        int row = 0;
        while (row < rows && used[row] + s.length[q] > PACKED_T) row++;
        if (row == rows) rows++;
        segments[q] = (ModelSegment){row, used[row], s.length[q]};
        used[row] += s.length[q];
    }
    // Segments go in row order: sort them by (row, start), keeping which sequence each is.
    ModelSegment ordered[SEQUENCES];
    int sequence_of[SEQUENCES], n = 0;
    for (int row = 0; row < rows; row++)
        for (int q = 0; q < SEQUENCES; q++)
            if (segments[q].row == row) ordered[n] = segments[q], sequence_of[n++] = q;
    Sequences reordered;
    for (int i = 0; i < SEQUENCES; i++) {
        reordered.length[i] = s.length[sequence_of[i]];
        memcpy(reordered.tokens[i], s.tokens[sequence_of[i]], sizeof reordered.tokens[i]);
        memcpy(reordered.weight[i], s.weight[sequence_of[i]], sizeof reordered.weight[i]);
    }

    const long P = model.table.total;
    float *grads_alone = xmalloc((size_t)P * sizeof(float)), *grads_packed = xmalloc((size_t)P * sizeof(float));
    float logp_alone[SEQUENCES * LONGEST], logp_packed[SEQUENCES * LONGEST];
    run(&model, &reordered, NULL, 0, SEQUENCES, LONGEST, logp_alone, grads_alone);
    run(&model, &reordered, ordered, SEQUENCES, rows, PACKED_T, logp_packed, grads_packed);
    Difference d = {0, 0};
    for (int q = 0; q < SEQUENCES; q++)
        for (int t = 0; t + 1 < reordered.length[q]; t++) {
            const double diff = fabs(logp_packed[q * LONGEST + t] - logp_alone[q * LONGEST + t]);
            if (!(diff <= d.worst_logp)) d.worst_logp = diff; // NaN shows as NaN
        }
    double largest = 0;
    for (long i = 0; i < P; i++)
        if (fabs(grads_alone[i]) > largest) largest = fabs(grads_alone[i]);
    for (long i = 0; i < P; i++) {
        const double diff = fabs(grads_packed[i] - grads_alone[i]) / largest;
        if (!(diff <= d.worst_grad)) d.worst_grad = diff;
    }
    // An unpacked batch after a packed one runs as before (the segments are cleared).
    float *again = xmalloc((size_t)P * sizeof(float)), logp_again[SEQUENCES * LONGEST];
    run(&model, &reordered, NULL, 0, SEQUENCES, LONGEST, logp_again, again);
    EXPECT(!memcmp(again, grads_alone, (size_t)P * sizeof(float)), "%s: an unpacked batch after a packed one differs",
           name);
    free(again), free(grads_alone), free(grads_packed);
    model_free(&model);
    return d;
}

static void check_all(bool recompute) {
    for (int fused = 0; fused < 2; fused++) {
        model_set_qkv_fusion(fused ? MODEL_QKV_FUSION_ON : MODEL_QKV_FUSION_OFF);
        for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
            const Difference d = compare(fixture_names[k], recompute);
            EXPECT(d.worst_logp == 0, "%s (fused q/k/v %d, recompute %d): packed log-probs differ by %.3g",
                   fixture_names[k], fused, recompute, d.worst_logp);
            EXPECT(d.worst_grad <= 1e-5, "%s (fused q/k/v %d, recompute %d): packed gradients differ by %.3g of the largest",
                   fixture_names[k], fused, recompute, d.worst_grad);
        }
    }
    model_set_qkv_fusion(MODEL_QKV_FUSION_UNSET);
}

static void test_packed_rows_equal_rows_of_their_own(void) { check_all(false); }
static void test_packed_rows_with_recompute(void) { check_all(true); }

int main(void) {
    setenv("MARLHF_CPU_MATMUL", "batch-invariant", 1);
    RUN(test_packed_rows_equal_rows_of_their_own);
    RUN(test_packed_rows_with_recompute);
    TEST_EXIT();
}
