// Encode speed of the tokenizer: the corpus of tests/fixtures/tokenizers/corpus.jsonl
// (2,200 strings of every kind), encoded repeatedly on one thread, in tokens per second.
//
//   make bench && build/bench/tokenize [MODEL] [REPEATS]
//
// MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf. bench/tokenize_hf.py times
// Hugging Face tokenizers (one thread) on the same strings with the same tokenizer.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int repeats = argc > 2 ? atoi(argv[2]) : 5;
    FILE *f = fopen("tests/fixtures/tokenizers/corpus.jsonl", "r");
    CHECK(f, "run from the repository root");
    char **texts = NULL, *line = NULL;
    size_t *lens = NULL, cap = 0, bytes = 0;
    int count = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, NULL);
        CHECK(row, "bad corpus line");
        const char *hex = json_string_value(json_object_get(row, "hex"));
        size_t n = strlen(hex) / 2;
        texts = xrealloc(texts, (size_t)(count + 1) * sizeof *texts);
        lens = xrealloc(lens, (size_t)(count + 1) * sizeof *lens);
        texts[count] = xmalloc(n + 1);
        for (size_t i = 0; i < n; i++) {
            unsigned v;
            sscanf(hex + 2 * i, "%2x", &v);
            texts[count][i] = (char)v;
        }
        lens[count++] = n;
        bytes += n;
        json_decref(row);
    }
    free(line);
    fclose(f);
    Tokenizer *tok;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (tokenizer_load(&tok, model) != 0) die_from_err();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double load_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    long tokens = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < repeats; r++)
        for (int i = 0; i < count; i++) {
            int *ids, n;
            tokenizer_encode(tok, texts[i], lens[i], false, &ids, &n);
            tokens += n;
            free(ids);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%s: loaded in %.3f s; encoded %d strings x %d (%.2f MB, %ld tokens) in %.3f s: %.0f tokens/s, %.1f MB/s "
           "(one thread)\n", model, load_s, count, repeats, (double)bytes * repeats / 1e6, tokens, s, (double)tokens / s,
           (double)bytes * repeats / 1e6 / s);
    tokenizer_free(tok);
    for (int i = 0; i < count; i++) free(texts[i]);
    free(texts), free(lens);
    return 0;
}
