#include "train/response_logps.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/hash.h"
#include "dist/dist.h"
#include "dist/zero.h"

void response_batch_build(const TokenizedExamples *rows, const long *which, int count, int pad_id, ResponseBatch *batch) {
    int T = 0;
    for (int b = 0; b < count; b++)
        if (rows->lengths[which[b]] > T) T = rows->lengths[which[b]];
    long N = (long)count * T;
    batch->B = count, batch->T = T;
    batch->tokens = xmalloc((size_t)N * sizeof(int));
    batch->targets = xmalloc((size_t)N * sizeof(int));
    batch->row_len = xmalloc((size_t)count * sizeof(int));
    batch->weights = NULL;
    for (int b = 0; b < count; b++) {
        const int *ids = rows->ids[which[b]];
        int length = rows->lengths[which[b]], prompt_length = rows->prompt_lengths[which[b]];
        batch->row_len[b] = length;
        for (int t = 0; t < T; t++) {
            long i = (long)b * T + t;
            batch->tokens[i] = t < length ? ids[t] : pad_id;
            // slot t predicts token t+1: a response token when prompt_length <= t+1 < length
            batch->targets[i] = t + 1 < length && t + 1 >= prompt_length ? ids[t + 1] : -1;
        }
    }
}

void response_batch_free(ResponseBatch *batch) {
    free(batch->tokens), free(batch->targets), free(batch->row_len), free(batch->weights);
    memset(batch, 0, sizeof *batch);
}

// A padding-free model (Model.packed_rows_only) runs the batch's rows side by side in one
// row, row b from slot first[b] (the lengths of the rows before it), each a segment; the
// batch's own arrays stay [B, T]. first: [B] (xmalloc'd), or NULL when the rows run as rows.
static long *one_row_starts(const Model *model, const ResponseBatch *batch, long *slots) {
    if (!model->packed_rows_only) return NULL;
    long *first = xmalloc((size_t)batch->B * sizeof(long));
    *slots = 0;
    for (int b = 0; b < batch->B; b++) first[b] = *slots, *slots += batch->row_len[b];
    return first;
}

// Copies an [B, T] array's real slots into (to_one_row) or out of the one row of first[].
static void move_to_one_row(const ResponseBatch *batch, const long *first, void *rows, void *one_row, size_t size,
                            bool to_one_row) {
    for (int b = 0; b < batch->B; b++) {
        char *at_rows = (char *)rows + (long)b * batch->T * size, *at_one = (char *)one_row + first[b] * size;
        if (to_one_row) memcpy(at_one, at_rows, (size_t)batch->row_len[b] * size);
        else memcpy(at_rows, at_one, (size_t)batch->row_len[b] * size);
    }
}

// The forward, with the per-slot outputs the callers read ([B, T]): log-probs of the targets,
// and the collision entropy where asked.
static void forward_rows(Model *model, const ResponseBatch *batch, float *logp, float *collision) {
    long slots = 0;
    long *first = one_row_starts(model, batch, &slots);
    if (!first) {
        ModelBatch input = {.B = batch->B, .T = batch->T, .tokens = batch->tokens, .row_len = batch->row_len};
        model_forward(model, &input);
        model_logprobs(model, batch->targets, logp, NULL, NULL);
        if (collision) model_collision_entropy(model, collision);
        return;
    }
    int *tokens = xmalloc((size_t)slots * sizeof(int)), *targets = xmalloc((size_t)slots * sizeof(int));
    float *one_logp = xmalloc((size_t)slots * sizeof(float));
    ModelSegment *segments = xmalloc((size_t)batch->B * sizeof(ModelSegment));
    move_to_one_row(batch, first, batch->tokens, tokens, sizeof(int), true);
    move_to_one_row(batch, first, batch->targets, targets, sizeof(int), true);
    for (int b = 0; b < batch->B; b++) segments[b] = (ModelSegment){0, (int)first[b], batch->row_len[b]};
    const int row_length = (int)slots;
    ModelBatch input = {.B = 1, .T = row_length, .tokens = tokens, .row_len = &row_length, .segments = segments,
                        .segment_count = batch->B};
    model_forward(model, &input);
    model_logprobs(model, targets, one_logp, NULL, NULL);
    move_to_one_row(batch, first, logp, one_logp, sizeof(float), false);
    if (collision) {
        model_collision_entropy(model, one_logp);
        move_to_one_row(batch, first, collision, one_logp, sizeof(float), false);
    }
    free(tokens), free(targets), free(one_logp), free(segments), free(first);
}

void response_batch_forward_more(Model *model, const ResponseBatch *batch, double *sums,
                                 const ResponseRowExtras *extras) {
    const long N = (long)batch->B * batch->T;
    float *logp = xmalloc((size_t)N * sizeof(float)), *collision = NULL;
    if (extras && extras->wpo_log_weights) collision = xmalloc((size_t)N * sizeof(float));
    forward_rows(model, batch, logp, collision);
    for (int b = 0; b < batch->B; b++) {
        double sum = 0, plain = 0, aligned = 0;
        int tokens = 0;
        for (int t = 0; t < batch->T; t++) {
            const long i = (long)b * batch->T + t;
            if (batch->targets[i] < 0) continue;
            sum += batch->weights ? (double)batch->weights[i] * logp[i] : logp[i];
            plain += logp[i];
            // log (p(token) / sum_v p_v^2) = log p(token) + the collision entropy
            if (collision) aligned += (double)logp[i] + collision[i];
            tokens++;
        }
        sums[b] = sum;
        if (extras && extras->plain_sums) extras->plain_sums[b] = plain;
        if (collision) extras->wpo_log_weights[b] = tokens > 0 ? aligned / tokens : 0.0;
    }
    free(logp), free(collision);
}

void response_batch_forward(Model *model, const ResponseBatch *batch, double *sums) {
    response_batch_forward_more(model, batch, sums, NULL);
}

void response_batch_backward_more(Model *model, const ResponseBatch *batch, const double *d_sums,
                                  const double *d_plain_sums, double scale) {
    // d loss / d logp of a response token = d loss / d (its row's sum) times its weight, plus
    // d loss / d (its row's unweighted sum)
    const long N = (long)batch->B * batch->T;
    float *dlogp = xcalloc((size_t)N, sizeof(float));
    for (int b = 0; b < batch->B; b++)
        for (int t = 0; t < batch->T; t++) {
            const long i = (long)b * batch->T + t;
            if (batch->targets[i] < 0) continue;
            double d = scale * d_sums[b] * (batch->weights ? batch->weights[i] : 1.0);
            if (d_plain_sums) d += scale * d_plain_sums[b];
            dlogp[i] = (float)d;
        }
    long slots = 0;
    long *first = one_row_starts(model, batch, &slots);
    if (first) { // the forward ran the rows in one row (forward_rows)
        float *one_row = xcalloc((size_t)slots, sizeof(float));
        move_to_one_row(batch, first, dlogp, one_row, sizeof(float), true);
        model_backward(model, one_row, NULL, NULL);
        free(one_row), free(first);
    } else {
        model_backward(model, dlogp, NULL, NULL);
    }
    free(dlogp);
}

void response_batch_backward(Model *model, const ResponseBatch *batch, const double *d_sums, double scale) {
    response_batch_backward_more(model, batch, d_sums, NULL, scale);
}

long response_batch_tokens(const ResponseBatch *batch) {
    long tokens = 0;
    for (int b = 0; b < batch->B; b++) tokens += batch->row_len[b];
    return tokens;
}

double *response_sums_unknown(long rows) {
    double *sums = xmalloc((size_t)(rows > 0 ? rows : 1) * sizeof(double));
    for (long r = 0; r < rows; r++) sums[r] = NAN;
    return sums;
}

bool response_sums_known(const double *sums, long rows) {
    for (long r = 0; r < rows; r++)
        if (isnan(sums[r])) return false;
    return true;
}

// What a row set's sums were computed from, as 16 hex digits.
static void rows_fingerprint(const TokenizedExamples *rows, double setting, uint64_t reference, char out[17]) {
    uint64_t hash = hash_bytes(HASH_FNV1A_START, &setting, sizeof setting);
    // (0, the policy's own weights, hashes nothing: the fingerprints written before there was
    // a reference model in them stay valid.)
    if (reference) hash = hash_bytes(hash, &reference, sizeof reference);
    for (long r = 0; r < rows->count; r++) {
        hash = hash_bytes(hash, &rows->lengths[r], sizeof(int));
        hash = hash_bytes(hash, &rows->prompt_lengths[r], sizeof(int));
        hash = hash_bytes(hash, rows->ids[r], (size_t)rows->lengths[r] * sizeof(int));
    }
    snprintf(out, 17, "%016llx", (unsigned long long)hash);
}

void response_sums_save(json_t *state, const char *key, const TokenizedExamples *rows, double setting,
                        uint64_t reference, const double *sums) {
    for (long r = 0; r < rows->count; r++)
        if (!isfinite(sums[r])) return;
    char fingerprint[17];
    rows_fingerprint(rows, setting, reference, fingerprint);
    json_t *values = json_array();
    for (long r = 0; r < rows->count; r++) json_array_append_new(values, json_real(sums[r]));
    json_t *saved = json_object();
    json_object_set_new(saved, "fingerprint", json_string(fingerprint));
    json_object_set_new(saved, "sums", values);
    json_object_set_new(state, key, saved);
}

void response_sums_load(const json_t *state, const char *key, const TokenizedExamples *rows, double setting,
                        uint64_t reference, double *sums) {
    const json_t *saved = json_object_get(state, key), *values = json_object_get(saved, "sums");
    const char *fingerprint = json_string_value(json_object_get(saved, "fingerprint"));
    char expected[17];
    rows_fingerprint(rows, setting, reference, expected);
    if (!fingerprint || strcmp(fingerprint, expected) != 0 || !json_is_array(values) ||
        json_array_size(values) != (size_t)rows->count)
        return;
    for (long r = 0; r < rows->count; r++)
        if (!json_is_number(json_array_get(values, (size_t)r))) return;
    for (long r = 0; r < rows->count; r++) sums[r] = json_number_value(json_array_get(values, (size_t)r));
}

uint64_t response_reference_fingerprint(const Model *reference) {
    const long total = reference->table.stored_total, chunk = 1L << 22; // 16 MiB of floats at a time
    float *host = xmalloc((size_t)(total < chunk ? total : chunk) * sizeof(float));
    uint64_t hash = HASH_FNV1A_START;
    for (long at = 0; at < total; at += chunk) {
        const long n = total - at < chunk ? total - at : chunk;
        reference->ops->copy_to_host(host, reference->params + at, (size_t)n * sizeof(float));
        hash = hash_floats(hash, host, n);
    }
    free(host);
    return hash ? hash : 1;
}

void response_logps(Model *model, const TokenizedExamples *rows, const long *which, int count, int pad_id,
                    double *sums) {
    ResponseBatch batch;
    response_batch_build(rows, which, count, pad_id, &batch);
    response_batch_forward(model, &batch, sums);
    response_batch_free(&batch);
}

void response_logps_all_weighted(Model *model, const TokenizedExamples *rows, int pad_id,
                                 const ResponseWeighting *weighting, double *sums) {
    long which[8];
    for (long r = 0; r < rows->count; r++) sums[r] = 0.0;
    // Under mpirun each rank scores its share of the rows; the others' stay 0 for the sum.
    DistChunks chunks = dist_chunks(rows->count, 8);
    for (int n; (n = dist_chunks_next(&chunks, which)) > 0;) {
        ResponseBatch batch;
        response_batch_build(rows, which, n, pad_id, &batch);
        if (weighting) weighting->fill(weighting->context, rows, which, &batch);
        response_batch_forward(model, &batch, sums + which[0]);
        response_batch_free(&batch);
    }
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    dist_sum_doubles(sums, rows->count);
}

void response_logps_all(Model *model, const TokenizedExamples *rows, int pad_id, double *sums) {
    response_logps_all_weighted(model, rows, pad_id, NULL, sums);
}
