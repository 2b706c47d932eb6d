// The SFT and reward-model tasks' largest batch (train/loop.h largest_batch), on the tiny
// chat model and its tokenizer: sized for it once (as train_run does before the first step),
// the activations are not made again by any micro-batch or evaluation chunk of the run (the
// residual stream's buffer stays where it is), and the batch is no larger than needed, so
// a micro-batch over the size asked for does make them again. (DPO's and KTO's are in
// tests/test_dpo.c and tests/test_kto.c, on their fixtures.) And --group-by-length's order
// (train_group_by_length) against Hugging Face's get_length_grouped_indices, and --packing's
// rows (pack_sequences) against TRL's pack_dataset.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/weights_io.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "train/packing.h"
#include "train/rm.h"
#include "train/sft.h"

static const char *MODEL = "tests/fixtures/models/tiny_chat";

static void load(Model *model, Tokenizer **tokenizer, bool value_head) {
    ModelLoadOptions options = {.with_lm_head = !value_head, .with_value_head = value_head, .seed = 7};
    CHECK(model_load(model, MODEL, &ops_cpu, &options) == 0, "%s", err_msg());
    CHECK(tokenizer_load(tokenizer, MODEL) == 0, "%s", err_msg());
    model_enable_grad(model);
}

// Runs `micro_step` on the examples of `which` (count of them) and says whether the
// activations stayed as reserved: the same residual buffer, `rows` x `length`.
static bool step_keeps_activations(TrainTask *train, Model *model, const long *which, int count, int rows, int length,
                                   const float *residual) {
    MicroStepResult result = {0};
    train->micro_step(train->context, model, which, count, 0.1, &result);
    return model->acts.residual == residual && model->acts.capacity_B == rows && model->acts.capacity_T == length;
}

// A padding-free task on a packed_rows_only model reserved for one row of `length` slots:
// every pair of its first `count` examples as a micro-batch (one example when both are the
// same), then its evaluation. Whether the activations stayed as reserved, and no layer kept
// attention state.
static bool one_row_runs_keep_activations(TrainTask *train, Model *model, long count, int length) {
    model_reserve(model, 1, length);
    const float *residual = model->acts.residual;
    bool kept = model->acts.layers[0].attention_saved == NULL;
    for (long a = 0; a < count; a++)
        for (long b = 0; b < count; b++) {
            const long which[2] = {a, b};
            kept &= step_keeps_activations(train, model, which, a == b ? 1 : 2, 1, length, residual);
        }
    EvalResult result;
    train->evaluate(train->context, model, &result);
    return kept && model->acts.residual == residual && model->acts.capacity_B == 1 && model->acts.capacity_T == length;
}

static void test_sft_largest_batch(void) {
    Model model;
    Tokenizer *tokenizer;
    load(&model, &tokenizer, false);
    const SftExample examples[] = {
        {.prompt = "Hi.", .response = "Hello there."},
        {.prompt = "Tell me a story.", .response = "A dragon slept."},
        {.prompt = "Two and two?", .response = "Four."},
        {.prompt = "A colour.", .response = "Blue."},
        {.prompt = "Why?", .response = "Because."},
    };
    const SftExample eval[] = {{.prompt = "A question longer than any training prompt.", .response = "Yes."},
                               {.prompt = "Short.", .response = "Ok."}};
    for (int padded = 0; padded < 2; padded++) {
        SftTask task;
        CHECK(sft_task_init(&task, tokenizer, examples, 5, eval, 2, 96, padded ? SFT_LOSS_PADDED : SFT_LOSS_COMPLETION) == 0,
              "%s", err_msg());
        TrainTask train = sft_train_task(&task);
        int rows = 0, length = 0, longest = 0;
        train.largest_batch(train.context, 2, &rows, &length);
        for (long i = 0; i < task.train.count; i++)
            if (task.train.lengths[i] > longest) longest = task.train.lengths[i];
        const int eval_longest = task.eval.lengths[0] > task.eval.lengths[1] ? task.eval.lengths[0] : task.eval.lengths[1];
        EXPECT(eval_longest > longest, "the evaluation's row (%d tokens) is the longest (%d)", eval_longest, longest);
        const int want_length = padded ? 96 : eval_longest;
        EXPECT(rows == 2 && length == want_length, "padded %d: largest batch %d rows of %d tokens, want 2 of %d", padded,
               rows, length, want_length);
        model_reserve(&model, rows, length);
        const float *residual = model.acts.residual;
        bool kept = true;
        for (long a = 0; a < 5; a++)
            for (long b = 0; b < 5; b++) {
                const long which[2] = {a, b};
                kept &= step_keeps_activations(&train, &model, which, a == b ? 1 : 2, 2, want_length, residual);
            }
        EvalResult result;
        train.evaluate(train.context, &model, &result);
        kept &= model.acts.residual == residual && model.acts.capacity_B == 2 && model.acts.capacity_T == want_length;
        EXPECT(kept, "padded %d: a micro-batch or the evaluation made the activations again (%d x %d)", padded,
               model.acts.capacity_B, model.acts.capacity_T);
        const long three[3] = {0, 1, 3};
        step_keeps_activations(&train, &model, three, 3, 2, want_length, residual);
        EXPECT(model.acts.capacity_B == 3, "padded %d: three examples ran in %d rows' activations", padded,
               model.acts.capacity_B);
        model_release_activations(&model);
        sft_task_free(&task);
    }
    // Padding-free (--padding-free): one row of up to two training examples or of the two
    // evaluation ones, each attending to itself; the model keeps no attention state a layer.
    SftTask task;
    CHECK(sft_task_init(&task, tokenizer, examples, 5, eval, 2, 96, SFT_LOSS_COMPLETION) == 0, "%s", err_msg());
    task.padding_free = true;
    model.packed_rows_only = true;
    TrainTask train = sft_train_task(&task);
    int rows = 0, length = 0, first = 0, second = 0;
    train.largest_batch(train.context, 2, &rows, &length);
    for (long i = 0; i < task.train.count; i++) { // the two longest training examples
        const int l = task.train.lengths[i];
        if (l > first) second = first, first = l;
        else if (l > second) second = l;
    }
    const int eval_both = task.eval.lengths[0] + task.eval.lengths[1];
    const int want_length = first + second > eval_both ? first + second : eval_both;
    EXPECT(rows == 1 && length == want_length, "padding-free: largest batch %d rows of %d tokens, want 1 of %d", rows,
           length, want_length);
    EXPECT(one_row_runs_keep_activations(&train, &model, 5, want_length),
           "padding-free: a micro-batch or the evaluation made the activations again (%d x %d), or a layer kept "
           "attention state", model.acts.capacity_B, model.acts.capacity_T);
    model_release_activations(&model);
    sft_task_free(&task);
    tokenizer_free(tokenizer);
    model_free(&model);
}

static void test_rm_largest_batch(void) {
    Model model;
    Tokenizer *tokenizer;
    load(&model, &tokenizer, true);
    const char *prompts[] = {"Which is better?", "Describe the weather today in the town by the sea.", "Pick one."};
    const char *responses[] = {"This one, clearly.", "That.", "Sunny.",
                               "Grey clouds over the harbour and a cold wind from the north, with rain later.", "A.",
                               "B."};
    const char *eval_prompts[] = {"Evaluate."};
    const char *eval_responses[] = {"Good.", "Bad."};
    const RmLossKind losses[] = {RM_LOSS_PAIRWISE, RM_LOSS_DSCHAT};
    for (int k = 0; k < 2; k++) {
        RmTask task;
        CHECK(rm_task_init(&task, tokenizer, 2, prompts, responses, NULL, 3, eval_prompts, eval_responses, NULL, 1, 96,
                           losses[k], 0.0f) == 0,
              "%s", err_msg());
        TrainTask train = rm_train_task(&task);
        int rows = 0, length = 0, longest = 0;
        train.largest_batch(train.context, 1, &rows, &length);
        for (long i = 0; i < task.train.count; i++)
            if (task.train.lengths[i] > longest) longest = task.train.lengths[i];
        EXPECT(longest < 96, "rows of %d tokens: none cut at max_seq_len", longest);
        const int want_length = losses[k] == RM_LOSS_DSCHAT ? 96 : longest;
        EXPECT(rows == 2 && length == want_length, "loss %d: largest batch %d rows of %d tokens, want 2 of %d", k, rows,
               length, want_length);
        model_reserve(&model, rows, length);
        const float *residual = model.acts.residual;
        bool kept = true;
        for (long e = 0; e < 3; e++) kept &= step_keeps_activations(&train, &model, &e, 1, 2, want_length, residual);
        EvalResult result;
        train.evaluate(train.context, &model, &result);
        kept &= model.acts.residual == residual && model.acts.capacity_B == 2 && model.acts.capacity_T == want_length;
        EXPECT(kept, "loss %d: a micro-batch or the evaluation made the activations again (%d x %d)", k,
               model.acts.capacity_B, model.acts.capacity_T);
        const long two[2] = {0, 2};
        step_keeps_activations(&train, &model, two, 2, 2, want_length, residual);
        EXPECT(model.acts.capacity_B == 4, "loss %d: two examples ran in %d rows' activations", k, model.acts.capacity_B);
        model_release_activations(&model);
        rm_task_free(&task);
    }
    // Padding-free (--padding-free): one row of a micro-batch's responses (up to two examples,
    // four rows) or of an evaluation chunk's; no attention state a layer.
    RmTask task;
    CHECK(rm_task_init(&task, tokenizer, 2, prompts, responses, NULL, 3, eval_prompts, eval_responses, NULL, 1, 96,
                       RM_LOSS_PAIRWISE, 0.0f) == 0,
          "%s", err_msg());
    task.padding_free = true;
    model.packed_rows_only = true;
    TrainTask train = rm_train_task(&task);
    int rows = 0, length = 0, sums[3], first = 0, second = 0;
    train.largest_batch(train.context, 2, &rows, &length);
    for (int e = 0; e < 3; e++) { // the two examples with the most tokens
        sums[e] = task.train.lengths[2 * e] + task.train.lengths[2 * e + 1];
        if (sums[e] > first) second = first, first = sums[e];
        else if (sums[e] > second) second = sums[e];
    }
    EXPECT(rows == 1 && length == first + second, "padding-free: largest batch %d rows of %d tokens, want 1 of %d", rows,
           length, first + second);
    EXPECT(one_row_runs_keep_activations(&train, &model, 3, first + second),
           "padding-free: a micro-batch or the evaluation made the activations again (%d x %d), or a layer kept "
           "attention state", model.acts.capacity_B, model.acts.capacity_T);
    model_release_activations(&model);
    rm_task_free(&task);
    tokenizer_free(tokenizer);
    model_free(&model);
}

// Each case of tests/fixtures/train/group_by_length.json (tools/make_group_by_length_fixture.py:
// transformers' get_length_grouped_indices run on the case's shuffle) regrouped by
// train_group_by_length gives transformers' order, every index.
static void test_group_by_length_matches_transformers(void) {
    json_error_t error;
    json_t *root = json_load_file("tests/fixtures/train/group_by_length.json", 0, &error);
    CHECK(root, "group_by_length.json: %s", error.text);
    json_t *cases = json_object_get(root, "cases");
    size_t index;
    json_t *c;
    json_array_foreach(cases, index, c) {
        json_t *lengths_json = json_object_get(c, "lengths"), *shuffle = json_object_get(c, "shuffle"),
               *grouped = json_object_get(c, "grouped");
        const long n = (long)json_array_size(lengths_json), batch = (long)json_integer_value(json_object_get(c, "batch"));
        CHECK(n > 0 && json_array_size(shuffle) == (size_t)n && json_array_size(grouped) == (size_t)n, "case %zu", index);
        int *lengths = xmalloc((size_t)n * sizeof(int));
        long *order = xmalloc((size_t)n * sizeof(long));
        for (long i = 0; i < n; i++) {
            lengths[i] = (int)json_integer_value(json_array_get(lengths_json, (size_t)i));
            order[i] = (long)json_integer_value(json_array_get(shuffle, (size_t)i));
        }
        train_group_by_length(order, n, lengths, batch);
        long first_difference = -1;
        for (long i = 0; i < n && first_difference < 0; i++)
            if (order[i] != (long)json_integer_value(json_array_get(grouped, (size_t)i))) first_difference = i;
        EXPECT(first_difference < 0, "case %zu (%ld examples, batch %ld): index %ld is %ld, transformers' %lld", index, n,
               batch, first_difference, first_difference < 0 ? 0 : order[first_difference],
               first_difference < 0 ? 0LL : (long long)json_integer_value(json_array_get(grouped, (size_t)first_difference)));
        free(lengths), free(order);
    }
    EXPECT(json_array_size(cases) >= 6, "%zu cases", json_array_size(cases));
    json_decref(root);
}

// Each case of tests/fixtures/train/packing.json (tools/make_packing_fixture.py: TRL's
// pack_dataset) packed by pack_sequences gives TRL's rows, piece for piece.
static void test_packing_matches_trl(void) {
    json_error_t error;
    json_t *root = json_load_file("tests/fixtures/train/packing.json", 0, &error);
    CHECK(root, "packing.json: %s", error.text);
    json_t *cases = json_object_get(root, "cases");
    size_t index;
    json_t *c;
    json_array_foreach(cases, index, c) {
        json_t *lengths_json = json_object_get(c, "lengths"), *rows_json = json_object_get(c, "rows");
        const long n = (long)json_array_size(lengths_json);
        const int row_length = (int)json_integer_value(json_object_get(c, "row_length"));
        const int strategy = packing_strategy_parse(json_string_value(json_object_get(c, "strategy")));
        CHECK(n > 0 && strategy >= 0 && json_array_size(rows_json) > 0, "case %zu", index);
        int *lengths = xmalloc((size_t)n * sizeof(int));
        for (long i = 0; i < n; i++) lengths[i] = (int)json_integer_value(json_array_get(lengths_json, (size_t)i));
        PackedRows rows;
        pack_sequences(lengths, n, row_length, (PackingStrategy)strategy, &rows);
        long first_difference = -1;
        for (long r = 0; r < (long)json_array_size(rows_json) && r < rows.rows && first_difference < 0; r++) {
            json_t *pieces = json_array_get(rows_json, (size_t)r);
            if ((long)json_array_size(pieces) != rows.row_first[r + 1] - rows.row_first[r]) first_difference = r;
            for (long k = 0; k < (long)json_array_size(pieces) && first_difference < 0; k++) {
                const PackedPiece *got = &rows.pieces[rows.row_first[r] + k];
                json_t *want = json_array_get(pieces, (size_t)k);
                if (got->sequence != json_integer_value(json_array_get(want, 0)) ||
                    got->first != json_integer_value(json_array_get(want, 1)) ||
                    got->length != json_integer_value(json_array_get(want, 2)))
                    first_difference = r;
            }
        }
        EXPECT(rows.rows == (long)json_array_size(rows_json), "case %zu (%s, rows of %d): %ld rows, TRL's %zu", index,
               packing_strategy_name((PackingStrategy)strategy), row_length, rows.rows, json_array_size(rows_json));
        EXPECT(first_difference < 0, "case %zu (%s, rows of %d): row %ld differs from TRL's", index,
               packing_strategy_name((PackingStrategy)strategy), row_length, first_difference);
        packed_rows_free(&rows);
        free(lengths);
    }
    EXPECT(json_array_size(cases) >= 12, "%zu cases", json_array_size(cases));
    json_decref(root);
}

int main(void) {
    RUN(test_group_by_length_matches_transformers);
    RUN(test_packing_matches_trl);
    RUN(test_sft_largest_batch);
    RUN(test_rm_largest_batch);
    TEST_EXIT();
}
