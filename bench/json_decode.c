// Constrained (structured outputs) against unconstrained decoding at batch 1, greedy, with
// SmolLM2-135M-Instruct: the decode steps' time per token without a constraint, with a JSON
// Schema constraint masking the vocabulary at every step, and with the same constraint
// where each step first checks the raw argmax (token_mask_pick_greedy, the default: the
// mask only when that token is refused). The runs alternate, --repeats times each; the
// two constrained runs must give the same tokens. Then the masking's own cost per token
// (gen/token_mask.h: the trie walk over the vocabulary) at every state of the constrained
// answer. One JSON line per run, then a summary line. --regex PATTERN or --grammar-file
// PATH: the constraint is that regular expression (gen/regex_constraint.h) or GBNF grammar
// (gen/grammar_constraint.h) instead of the schema, and --question the user's message.
//
// usage: build/bench/json_decode [--model PATH] [--tokens 48] [--repeats 3] [--threads N]
//                                [--regex PATTERN | --grammar-file PATH] [--question TEXT]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/generate.h"
#include "gen/grammar_constraint.h"
#include "gen/json_constraint.h"
#include "gen/text_model.h"
#include "gen/token_mask.h"
#include "io/fs.h"

int main(int argc, char **argv) {
    const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int tokens = 48, repeats = 3, threads = 0;
    const char *regex = NULL, *grammar_file = NULL, *question_text = "Describe a person as JSON.";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--regex")) regex = argv[i + 1];
        else if (!strcmp(argv[i], "--grammar-file")) grammar_file = argv[i + 1];
        else if (!strcmp(argv[i], "--question")) question_text = argv[i + 1];
        else die_user("unknown option %s", argv[i]);
    }
    if (threads > 0) omp_set_num_threads(threads);
    TextModel tm;
    if (text_model_load(&tm, model_path, NULL, "cpu", NULL, NULL, false) != 0) die_from_err();
    const int V = tm.model.config.vocab_size;
    double start = now_seconds();
    TokenTrie *trie = token_trie_new(tm.tokenizer, V);
    const double trie_seconds = now_seconds() - start;
    json_t *schema = json_loads("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": "
                                "{\"type\": \"integer\"}, \"city\": {\"type\": \"string\"}, \"hobbies\": {\"type\": "
                                "\"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"name\", \"age\", "
                                "\"city\", \"hobbies\"]}", 0, NULL);
    Constraint *constraint = NULL;
    if (grammar_file) {
        size_t size;
        char *text = NULL;
        if (fs_read_file(grammar_file, 1 << 20, &text, &size) != 0) die_from_err();
        GrammarConstraint *compiled = NULL;
        if (grammar_constraint_compile(&compiled, text, size, grammar_file) != 0) die_from_err();
        free(text);
        constraint = constraint_from_grammar(compiled);
    } else if (regex) {
        RegexConstraint *compiled = NULL;
        start = now_seconds();
        if (regex_constraint_compile(&compiled, regex, strlen(regex), NULL, "--regex") != 0) die_from_err();
        printf("{\"regex_compile_ms\": %.2f, \"dfa_states\": %d}\n", 1e3 * (now_seconds() - start),
               regex_constraint_num_states(compiled));
        constraint = constraint_from_regex(compiled);
    } else {
        JsonConstraint *json = NULL;
        if (json_constraint_schema(&json, schema, "schema") != 0) die_from_err();
        constraint = constraint_from_json(json);
    }
    char question[2048];
    snprintf(question, sizeof question, "<|im_start|>user\n%.1900s<|im_end|>\n<|im_start|>assistant\n", question_text);
    int *prompt, length;
    tokenizer_encode(tm.tokenizer, question, strlen(question), false, &prompt, &length);
    const int *prompts[1] = {prompt};
    // Modes: 0 unconstrained, 1 constrained masking every step, 2 constrained with the
    // greedy short cut.
    static const char *mode_names[3] = {"none", "mask_every_token", "greedy_short_cut"};
    double per_token[3] = {0, 0, 0};
    GeneratedRow kept = {0};
    for (int r = 0; r < repeats; r++) {
        for (int mode = 0; mode < 3; mode++) {
            GenerateOptions options = {.max_new_tokens = tokens,
                                       .stop_tokens = tm.stop_tokens,
                                       .num_stop_tokens = tm.num_stop_tokens,
                                       .constraint = mode > 0 ? constraint : NULL,
                                       .token_trie = trie,
                                       .mask_every_token = mode == 1};
            GeneratedRow out;
            GenerateStats stats;
            generate(&tm.model, prompts, &length, NULL, 1, &options, &out, &stats);
            // decode_seconds covers every step's sampling (and masking) and the decode forwards.
            const double seconds = stats.decode_seconds / (out.length > 0 ? out.length : 1);
            per_token[mode] += seconds / repeats;
            printf("{\"constraint\": \"%s\", \"tokens\": %d, \"decode_ms_per_token\": %.2f}\n", mode_names[mode], out.length,
                   1e3 * seconds);
            if (mode == 2 && (out.length != kept.length || memcmp(out.tokens, kept.tokens, (size_t)out.length * sizeof(int))))
                die_user("the greedy short cut's tokens differ from masking every step's");
            if (mode == 1 && r == 0) kept = out;
            else generated_row_free(&out);
        }
    }
    // The mask alone at every state of the constrained answer.
    ConstraintState *state = xmalloc(sizeof *state);
    constraint_state_init(constraint, state);
    TokenMaskScratch scratch;
    token_mask_scratch_init(&scratch, trie);
    float *logits = xcalloc((size_t)V, sizeof(float)), *masked = xmalloc((size_t)V * sizeof(float));
    double mask_seconds = 0;
    int allowed_total = 0;
    for (int t = 0; t < kept.length; t++) {
        start = now_seconds();
        allowed_total += token_mask_apply(trie, constraint, state, tm.stop_tokens, tm.num_stop_tokens, logits, masked, V, &scratch);
        mask_seconds += now_seconds() - start;
        token_mask_advance(trie, constraint, state, kept.tokens[t]);
    }
    printf("{\"summary\": true, \"vocabulary\": %d, \"trie_build_ms\": %.1f, \"unconstrained_ms_per_token\": %.2f, "
           "\"constrained_ms_per_token\": %.2f, \"short_cut_ms_per_token\": %.2f, \"mask_ms_per_token\": %.3f, "
           "\"mean_allowed_tokens\": %.0f}\n",
           V, 1e3 * trie_seconds, 1e3 * per_token[0], 1e3 * per_token[1], 1e3 * per_token[2], 1e3 * mask_seconds / kept.length,
           (double)allowed_total / kept.length);
    token_mask_scratch_free(&scratch);
    free(state), free(logits), free(masked), free(prompt);
    generated_row_free(&kept);
    constraint_free(constraint);
    json_decref(schema);
    token_trie_free(trie);
    text_model_free(&tm);
    return 0;
}
