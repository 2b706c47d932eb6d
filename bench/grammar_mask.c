// The token mask's cost per token (gen/token_mask.h: the trie walk over SmolLM2's 49,152
// tokens) under a GBNF grammar, beside the JSON Schema and regular-expression constraints
// on the same text. Each text is tokenized, and the mask is computed at every token boundary
// (the states decoding meets), --repeats times, with a fresh scratch each time as a new
// answer starts; the fastest repeat's mean is reported per constraint, with the mask cache
// (the default: a state met again in the answer is read back) and walking every state (the
// machine is shared: the load average is printed with it).
//   json:        one JSON object under a JSON Schema (gen/json_constraint.h), under a JSON
//                grammar in GBNF (tests/fixtures/constraints/json.gbnf), and under a regular
//                expression of its shape;
//   arithmetic:  an expression with nested parentheses under an arithmetic grammar
//                (tests/fixtures/constraints/arithmetic.gbnf; no regex or schema can express it);
//   tool call:   a Hermes <tool_call> block under the forced tool-call constraint
//                (tool_choice "required"), and the same block after a sentence of free text
//                under the lazy one (gen/lazy_constraint.h: tool_choice "auto").
// One JSON line per constraint.
//
// usage (from the repository root): build/bench/grammar_mask [--model PATH] [--repeats 5]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/constraint.h"
#include "gen/lazy_constraint.h"
#include "gen/token_mask.h"
#include "io/fs.h"
#include "tokenizer/tokenizer.h"

static const char *json_text =
    "{\"name\": \"Ada Lovelace\", \"age\": 36, \"city\": \"London\", \"hobbies\": [\"mathematics\", \"poetry\", \"music\"]}";

static const char *json_schema =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, \"city\": "
    "{\"type\": \"string\"}, \"hobbies\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": "
    "[\"name\", \"age\", \"city\", \"hobbies\"]}";

static const char *json_regex =
    "\\{\"name\": \"[^\"\\\\]*\", \"age\": \\d+, \"city\": \"[^\"\\\\]*\", \"hobbies\": \\[(\"[^\"\\\\]*\"(, )?)*\\]\\}";

static const char *tool_call_text =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"London\", \"unit\": \"celsius\"}}\n"
    "</tool_call>";
static const char *words_then_tool_call_text =
    "I will look up the current weather in London for you, in degrees Celsius as you asked. <tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"London\", \"unit\": \"celsius\"}}\n</tool_call>";
static const char *tools_json =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"city\"]}}}]";

static const char *arithmetic_text = "(12+3.5)*(7-(2/4))+-6*((1+2)*(30-4.25))/9";

static void measure(const char *name, Constraint *c, const char *text, const Tokenizer *tok, const TokenTrie *trie,
                    int repeats, const char *load) {
    if (!c) die_from_err();
    const int V = tokenizer_vocab_size(tok);
    int *ids, count;
    tokenizer_encode(tok, text, strlen(text), false, &ids, &count);
    const int eos = tokenizer_eos_id(tok);
    float *logits = xcalloc((size_t)V, sizeof(float)), *masked = xmalloc((size_t)V * sizeof(float));
    ConstraintState *state = xmalloc(sizeof *state);
    // Each pass over the text with a fresh scratch, as a new answer starts: with the mask
    // cache (the default), and walking every state (walk_always).
    double best[2] = {1e30, 1e30};
    long allowed = 0, hits = 0;
    for (int r = 0; r < repeats; r++) {
        for (int walk_always = 0; walk_always <= 1; walk_always++) {
            TokenMaskScratch scratch;
            token_mask_scratch_init(&scratch, trie);
            scratch.walk_always = walk_always;
            constraint_state_init(c, state);
            allowed = 0;
            const double start = now_seconds();
            for (int t = 0; t <= count; t++) {
                allowed += token_mask_apply(trie, c, state, &eos, 1, logits, masked, V, &scratch);
                if (t < count && !token_mask_advance(trie, c, state, ids[t]))
                    die_user("%s: the text is refused at token %d", name, t);
            }
            const double seconds = (now_seconds() - start) / (count + 1);
            if (seconds < best[walk_always]) best[walk_always] = seconds;
            if (!walk_always) hits = scratch.cache_hits;
            token_mask_scratch_free(&scratch);
        }
    }
    printf("{\"constraint\": \"%s\", \"states\": %d, \"mask_ms_per_token\": %.3f, \"walk_ms_per_token\": %.3f, "
           "\"states_from_cache\": %ld, \"mean_allowed_tokens\": %.0f, \"load_average\": \"%s\"}\n",
           name, count + 1, 1e3 * best[0], 1e3 * best[1], hits, (double)allowed / (count + 1), load);
    free(state), free(logits), free(masked), free(ids);
    constraint_free(c);
}

// Hermes tool calls of tools_json (the server's forced-call constraint).
static Constraint *tool_calls(void) {
    json_t *tools = json_loads(tools_json, 0, NULL);
    JsonConstraint *calls = NULL;
    if (json_constraint_tool_calls(&calls, tools, NULL, "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 0) != 0)
        die_from_err();
    json_decref(tools);
    return constraint_from_json(calls);
}

// A grammar of tests/fixtures/constraints/.
static Constraint *grammar(const char *path) {
    char *text;
    size_t length;
    if (fs_read_file(path, 1 << 20, &text, &length) != 0) die_from_err();
    GrammarConstraint *g = NULL;
    if (grammar_constraint_compile(&g, text, length, path) != 0) die_from_err();
    free(text);
    return constraint_from_grammar(g);
}

int main(int argc, char **argv) {
    const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int repeats = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_path = argv[i + 1];
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else die_user("unknown option %s", argv[i]);
    }
    if (repeats < 1) die_user("--repeats must be at least 1");
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, model_path) != 0) die_from_err();
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    char load[64] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%15s", load) != 1) strcpy(load, "?");
        fclose(f);
    }
    json_t *schema = json_loads(json_schema, 0, NULL);
    JsonConstraint *json = NULL;
    if (json_constraint_schema(&json, schema, "schema") != 0) die_from_err();
    json_decref(schema);
    measure("json_schema", constraint_from_json(json), json_text, tok, trie, repeats, load);
    RegexConstraint *regex = NULL;
    if (regex_constraint_compile(&regex, json_regex, strlen(json_regex), NULL, "regex") != 0) die_from_err();
    measure("json_regex", constraint_from_regex(regex), json_text, tok, trie, repeats, load);
    measure("json_gbnf", grammar("tests/fixtures/constraints/json.gbnf"), json_text, tok, trie, repeats, load);
    measure("arithmetic_gbnf", grammar("tests/fixtures/constraints/arithmetic.gbnf"), arithmetic_text, tok, trie, repeats,
            load);
    measure("tool_call_forced", tool_calls(), tool_call_text, tok, trie, repeats, load);
    const LazyTrigger trigger = {"<tool_call>", strlen("<tool_call>"), false};
    LazyConstraint *lazy = NULL;
    if (lazy_constraint_new(&lazy, tool_calls(), &trigger, 1, "lazy") != 0) die_from_err();
    measure("words_then_tool_call_lazy", constraint_from_lazy(lazy), words_then_tool_call_text, tok, trie, repeats, load);
    token_trie_free(trie);
    tokenizer_free(tok);
    return 0;
}
