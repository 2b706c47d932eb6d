// Tests of gen/json_constraint.c and gen/token_mask.c (structured outputs):
//  - the recogniser on many texts per keyword, accepted or refused, and every prefix of an
//    accepted text alive (so a sampler that follows it is never stuck);
//  - every refusal of a schema names its keyword;
//  - the token mask over SmolLM2's real vocabulary (49,152 tokens) equals the brute force
//    (each token's bytes fed to a copy of the state) at many states, and its cost per step;
//  - generation with SmolLM2-135M-Instruct under several schemas, greedy and sampled with
//    top-k / top-p, several seeds: every answer parses with jansson and validates against
//    its schema by a small validator written here on the parsed value (independent of the
//    recogniser), and the constrained answers' log-probs are the model's own.
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/continuous.h"
#include "gen/generate.h"
#include "gen/grammar_constraint.h"
#include "gen/json_constraint.h"
#include "gen/regex_constraint.h"
#include "gen/token_mask.h"
#include "gen/text_model.h"
#include "test.h"

#include "constraint_check.h"
#include "json_check.h"

static const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

static const JsonCase cases[] = {
    {"{\"type\": \"string\"}",
     {"\"\"", "\"abc\"", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", "\"a\\\"b\\\\c\\/\\n\\t\\u00e9\\uFFFF\"", "\"<tool_call>\""},
     {"", "abc", "\"abc", "\"a\"b\"", "\"\\x\"", "\"\\u12G4\"", "\"\\u0000\"", "\"\\ud83d\\ude00\"", "\"a\nb\"",
      "\"\xc3\"", "\"\xe0\x80\x80\"", "\"\xed\xa0\x80\"", "\"\xf5\x80\x80\x80\"", " \"a\""}},
    {"{\"type\": \"string\", \"pattern\": \"^[A-Z]{2}\\\\d{3}$\"}",
     {"\"AB123\""}, {"\"AB1234\"", "\"ab123\"", "\"AB12\"", "\"xAB123\"", "\"AB\\u0031\"", "AB123"}},
    {"{\"pattern\": \"ab\"}", {"\"ab\"", "\"xxaby\"", "\"\xc3\xa9" "ab\\n\""}, {"\"a\"", "\"ba\"", "1", "\"a\\u0062\""}},
    {"{\"type\": \"string\", \"pattern\": \"^a\\\"b\\\\\\\\c\\\\n/$\"}",
     {"\"a\\\"b\\\\c\\n/\"", "\"a\\\"b\\\\c\\n\\/\""},
     {"\"a\\u0022b\\\\c\\n/\"", "\"a\\\"b\\\\c\\t/\"", "\"a\"b\\\\c\\n/\"", "\"a\\\"b\\\\c\n/\""}},
    {"{\"type\": \"string\", \"pattern\": \"^[a-z\xc3\xa9]*$\", \"minLength\": 2, \"maxLength\": 3}",
     {"\"ab\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\""}, {"\"a\"", "\"abcd\"", "\"aB\"", "\"\""}},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}",
     {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", "\"\\n\\u0041x\""},
     {"\"a\"", "\"abcd\"", "\"\"", "\"\\n\\n\\n\\n\""}},
    {"{\"type\": \"integer\"}",
     {"0", "-0", "7", "-123", "1234567890"},
     {"01", "1.5", "1e3", "-", "+1", "--1", "1 ", "\"1\"", "1234567890123456789", "-1234567890123456789"}},
    {"{\"type\": \"number\"}",
     {"0", "-1.5", "3.25e10", "1E-7", "2e+3", "0.0", "-12345678901234567.5e-99"},
     {"1.", ".5", "1e", "1e+", "00", "-.1", "NaN", "Infinity", "1.5.2", "1e100", "1.00000000000000000000001"}},
    {"{\"type\": \"boolean\"}", {"true", "false"}, {"True", "tru", "truee", "null", "0"}},
    {"{\"type\": \"null\"}", {"null"}, {"nul", "none", "\"null\""}},
    {"{\"type\": [\"string\", \"null\"]}", {"\"x\"", "null"}, {"1", "true", "nulll"}},
    {"{\"enum\": [\"red\", \"green\", 1, 12, null, {\"a\": [1, 2]}]}",
     {"\"red\"", "\"green\"", "1", "12", "null", "{\"a\":[1,2]}"},
     {"\"blue\"", "\"re\"", "2", "123", "\"red \"", "{\"a\": [1, 2]}"}},
    {"{\"type\": \"string\", \"enum\": [\"a\", 1, \"b\"]}", {"\"a\"", "\"b\""}, {"1"}},
    {"{\"const\": \"fixed\"}", {"\"fixed\""}, {"\"fixe\"", "\"fixed2\""}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}",
     {"[1]", "[1,2]", "[1, 2, 3]", "[-5,0]"},
     {"[]", "[1,2,3,4]", "[1,]", "[ 1]", "[1 ,2]", "[1,  2]", "[\"1\"]", "[1.5]"}},
    {"{\"type\": \"array\"}", {"[]", "[1, \"a\", null, [true], {\"k\": {}}]"}, {"[", "[1,]", "{}"}},
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, "
     "\"required\": [\"name\", \"age\"], \"additionalProperties\": false}",
     {"{\"name\": \"Ann\", \"age\": 31}", "{\"age\":31,\"name\":\"Ann\"}"},
     {"{}", "{\"name\": \"Ann\"}", "{\"name\": \"Ann\", \"age\": 31, \"x\": 1}", "{\"name\": \"Ann\", \"name\": \"B\", \"age\": 1}",
      "{\"name\": 1, \"age\": 31}", "{\"nam\": \"Ann\", \"age\": 31}", "{ \"name\": \"Ann\", \"age\": 31}",
      "{\"name\" : \"Ann\", \"age\": 31}", "{\"name\": \"Ann\", \"age\": 31 }", "{\"name\":  \"Ann\", \"age\": 31}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"ab\": {\"type\": \"boolean\"}}}",
     {"{}", "{\"a\": 1}", "{\"ab\": true}", "{\"ab\": false, \"a\": 2}"},
     {"{\"abc\": 1}", "{\"a\": true}", "{\"ab\": 1}", "{\"a\": 1,}", "{\"b\": 1}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"], "
     "\"additionalProperties\": true}",
     {"{\"a\": 1}", "{\"a\": 1, \"zz\": [1, {\"q\": null}]}", "{\"ab\": \"x\", \"a\": 2}", "{\"\\u0061b\": 0, \"a\": 1}"},
     {"{\"zz\": 1}", "{\"a\": 1, \"a\": 2}", "{\"a\": \"1\"}"}},
    {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}}",
     {"{}", "{\"x\": 1.5, \"y\": 2}"}, {"{\"x\": \"1\"}"}},
    {"{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"a\"}, \"x\": {\"type\": \"integer\"}}, "
     "\"required\": [\"kind\", \"x\"]}, {\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"b\"}, "
     "\"y\": {\"type\": \"string\"}}, \"required\": [\"kind\", \"y\"]}]}",
     {"{\"kind\": \"a\", \"x\": 1}", "{\"kind\": \"b\", \"y\": \"s\"}", "{\"x\": 1, \"kind\": \"a\"}"},
     {"{\"kind\": \"a\", \"y\": \"s\"}", "{\"kind\": \"b\", \"x\": 1}", "{\"kind\": \"c\"}"}},
    {"{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}]}", {"5", "\"x\""}, {"\"xy\"", "1.5"}},
    {"{\"$defs\": {\"point\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}}, "
     "\"type\": \"object\", \"properties\": {\"p\": {\"$ref\": \"#/$defs/point\"}, \"q\": {\"$ref\": \"#/definitions/flag\"}}, "
     "\"definitions\": {\"flag\": {\"type\": \"boolean\"}}, \"required\": [\"p\"]}",
     {"{\"p\": {\"x\": 1}}", "{\"q\": true, \"p\": {\"x\": -2.5}}"}, {"{\"p\": {}}", "{\"p\": {\"x\": 1}, \"q\": 1}"}},
    {"{}", {"1", "\"s\"", "{\"a\": [1, {\"b\": null}]}", "[]", "true"}, {"", "tru", "{\"a\" 1}", "[1 2]", "{'a': 1}"}},
    {"{\"type\": \"object\", \"properties\": {\"k\\\"q\": {\"type\": \"integer\"}, \"caf\xc3\xa9\": {\"type\": \"integer\"}}}",
     {"{\"k\\\"q\": 1}", "{\"caf\xc3\xa9\": 2}"}, {"{\"k\\u0022q\": 1}", "{\"caf\\u00e9\": 2}"}},
};

static void test_accept_and_reject(void) { check_json_cases(cases, sizeof cases / sizeof cases[0]); }

static void test_json_object_mode(void) {
    JsonConstraint *c = json_constraint_object();
    const char *good[] = {"{}", "{\"a\": 1}", "{\"a\": {\"b\": [1, 2.5, \"x\", true, false, null]}, \"c\": \"\"}"};
    const char *bad[] = {"[]", "1", "\"s\"", "{\"a\"}", "{\"a\": }", "{} ", "{\"a\": 1}}", "{a: 1}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        EXPECT(json_constraint_matches(c, good[i], strlen(good[i])), "json_object accepts %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        EXPECT(!json_constraint_matches(c, bad[i], strlen(bad[i])), "json_object refuses %s", bad[i]);
    // Nesting is bounded: JSON_MAX_DEPTH open arrays inside the object, not one more.
    char deep[200];
    size_t n = 0;
    deep[n++] = '{', deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"', deep[n++] = ':';
    for (int i = 0; i < JSON_MAX_DEPTH; i++) deep[n++] = '[';
    JsonState *state = xmalloc(sizeof *state);
    json_state_init(c, state);
    EXPECT(json_state_feed_bytes(c, state, deep, n - 1), "nesting below the limit is allowed");
    EXPECT(!json_state_feed_bytes(c, state, "[", 1), "nesting past JSON_MAX_DEPTH is refused");
    free(state);
    json_constraint_free(c);
}

static void test_tool_call_syntax(void) {
    json_error_t error;
    json_t *tools = json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}},"
        " {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]", 0, &error);
    JsonConstraint *hermes = NULL, *one = NULL, *llama = NULL;
    EXPECT(json_constraint_tool_calls(&hermes, tools, NULL, "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 0) == 0, "hermes");
    EXPECT(json_constraint_tool_calls(&one, tools, "get_weather", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 1) == 0, "named");
    EXPECT(json_constraint_tool_calls(&llama, tools, NULL, "", "", "; ", "parameters", 0) == 0, "llama");
    const char *call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"arguments\": {\"x\": [1]}, \"name\": \"now\"}\n</tool_call>";
    EXPECT(json_constraint_matches(hermes, call, strlen(call)), "one hermes call");
    EXPECT(json_constraint_matches(hermes, two, strlen(two)), "two hermes calls");
    EXPECT(json_constraint_matches(one, call, strlen(call)), "the named call");
    EXPECT(!json_constraint_matches(one, two, strlen(two)), "parallel_tool_calls false: one call only");
    const char *wrong[] = {"<tool_call>\n{\"name\": \"get_weathe\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
                           "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "Sure. " "<tool_call>", ""};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
        EXPECT(!json_constraint_matches(hermes, wrong[i], strlen(wrong[i])), "hermes refuses %s", wrong[i]);
    const char *now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    EXPECT(!json_constraint_matches(one, now, strlen(now)), "a named tool_choice refuses the other tool");
    const char *l2 = "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}";
    EXPECT(json_constraint_matches(llama, l2, strlen(l2)), "llama 3 calls separated by '; '");
    json_constraint_free(hermes), json_constraint_free(one), json_constraint_free(llama);
    json_decref(tools);
}

static void test_refusals(void) {
    static const JsonRefusal refused[] = {
        {"{\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"string\", \"pattern\": \"(?=a)\"}}}",
         "'pattern' (at properties.c): lookahead and lookbehind are not supported (at position 0)"},
        {"{\"type\": \"string\", \"pattern\": \"^\\\\x01$\"}", "'pattern' (at the schema's root): the pattern matches nothing that a JSON string can hold"},
        {"{\"type\": \"string\", \"pattern\": 3}", "'pattern' must be a string"},
        {"{\"type\": \"string\", \"pattern\": \"^a$\", \"minLength\": 2}", "matches nothing"},
        {"{\"type\": \"string\", \"format\": \"email\"}", "'format' 'email'"},
        {"{\"type\": \"number\", \"minimum\": 1e-30}", "'minimum' 1.0000000000000001e-30 has more digits"},
        {"{\"type\": \"integer\", \"minimum\": 5, \"exclusiveMaximum\": 5}", "'exclusiveMaximum': 5) leave no integer"},
        {"{\"type\": \"number\", \"multipleOf\": 2}", "'multipleOf' on a number must be 1, 0.1, 0.01, 0.001 or 0.0001"},
        {"{\"allOf\": [{\"type\": \"string\"}, {\"type\": \"object\"}]}", "'type' in an 'allOf' of several"},
        {"{\"not\": {}}", "'not'"},
        {"{\"type\": \"array\", \"uniqueItems\": true}", "'uniqueItems'"},
        {"{\"type\": \"array\", \"prefixItems\": 1}", "'prefixItems'"},
        {"{\"type\": \"object\", \"patternProperties\": {}}", "'patternProperties'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"format\": \"email\"}}}", "properties.a"},
        {"{\"type\": \"strin\"}", "'type'"},
        {"{\"type\": []}", "'type'"},
        {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "'minItems'"},
        {"{\"type\": \"string\", \"minLength\": 3, \"maxLength\": 2}", "'minLength'"},
        {"{\"type\": \"string\", \"maxLength\": -1}", "'maxLength'"},
        {"{\"type\": \"integer\", \"enum\": [\"a\"]}", "'enum'"},
        {"{\"enum\": []}", "'enum'"},
        {"{\"type\": \"string\", \"enum\": [\"a\"], \"maxLength\": 3}", "'maxLength'"},
        {"{\"type\": \"object\", \"properties\": {}, \"required\": [\"x\"]}", "'required'"},
        {"{\"$ref\": \"#/$defs/missing\"}", "'$ref'"},
        {"{\"$ref\": \"http://example.com/s.json\"}", "'$ref'"},
        {"{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"next\": {\"$ref\": \"#/$defs/n\"}}, \"required\": [\"next\"]}}, \"$ref\": \"#/$defs/n\"}",
         "'$ref' '#/$defs/n' has no finite value"},
        {"{\"anyOf\": []}", "'anyOf'"},
        {"{\"type\": \"string\", \"anyOf\": [{}]}", "'anyOf'"},
        {"{\"type\": \"array\", \"items\": [{}]}", "'items'"},
        {"false", "false"},
        {"3", "schema must be"},
    };
    check_json_refusals(refused, sizeof refused / sizeof refused[0]);
}

// --- the vocabulary ---------------------------------------------------------------------

// The trie's mask equals the brute force (each token's bytes through a copy of the state)
// at every state of a text through strings with escapes and multi-byte characters, numbers,
// enums and arrays (constraint_check.h: also the cache and the one-token check).
static void test_mask_equals_brute_force(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    Constraint *c = constraint_from_json(compile_text(
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 12}, \"n\": {\"type\": "
        "\"number\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"x\", \"yz\"]}}, \"code\": {\"pattern\": "
        "\"^[A-Z]\\\\d{1,3}(\\\\n|\xc3\xa9)?$\"}}, \"required\": [\"name\"]}"));
    double ms = 0;
    int steps = 0;
    if (c) check_mask(trie, tok, c, "{\"name\": \"Caf\xc3\xa9 \\\"o\\u00e9\", \"n\": -12.5e3, \"tags\": [\"yz\", \"x\"], \"code\": \"X42\\n\"}", "json schema", &ms, &steps);
    printf("token mask over %d tokens (under load): trie %.2f ms per step, %d states\n", tokenizer_vocab_size(tok),
           steps ? ms / steps : 0.0, steps);
    constraint_free(c);
    token_trie_free(trie);
    tokenizer_free(tok);
}

// --- generation with the real model -------------------------------------------------------

// SmolLM2 for the tests that generate; false (a failure counted) when it is missing.
static bool load_real_model(TextModel *tm) {
    if (text_model_load(tm, model_path, NULL, "cpu", NULL, NULL, false) == 0) return true;
    fprintf(stderr, "  cannot load %s: %s (run scripts/fetch-model)\n", model_path, err_msg());
    test_current_failures++;
    return false;
}


// A JSON Schema validator of the subset, on parsed values (independent of the recogniser).
static bool validate(const json_t *v, const json_t *schema, const json_t *root);

static bool type_matches(const json_t *v, const char *type) {
    if (!strcmp(type, "object")) return json_is_object(v);
    if (!strcmp(type, "array")) return json_is_array(v);
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "integer")) return json_is_integer(v);
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "null")) return json_is_null(v);
    return false;
}

static long utf8_length(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static bool validate(const json_t *v, const json_t *schema, const json_t *root) {
    json_t *ref = json_object_get(schema, "$ref");
    if (ref) return validate(v, json_object_get(json_object_get(root, "$defs"), json_string_value(ref) + 8), root);
    json_t *any = json_object_get(schema, "anyOf");
    if (any) {
        for (size_t i = 0; i < json_array_size(any); i++)
            if (validate(v, json_array_get(any, i), root)) return true;
        return false;
    }
    json_t *type = json_object_get(schema, "type");
    if (json_is_string(type) && !type_matches(v, json_string_value(type))) return false;
    if (json_is_array(type)) {
        bool ok = false;
        for (size_t i = 0; i < json_array_size(type); i++) ok |= type_matches(v, json_string_value(json_array_get(type, i)));
        if (!ok) return false;
    }
    json_t *values = json_object_get(schema, "enum");
    if (values) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(values); i++) found |= json_equal(v, json_array_get(values, i));
        if (!found) return false;
    }
    if (json_is_string(v)) {
        json_t *min = json_object_get(schema, "minLength"), *max = json_object_get(schema, "maxLength");
        if (min && utf8_length(json_string_value(v)) < json_integer_value(min)) return false;
        if (max && utf8_length(json_string_value(v)) > json_integer_value(max)) return false;
    }
    if (json_is_array(v)) {
        json_t *min = json_object_get(schema, "minItems"), *max = json_object_get(schema, "maxItems");
        if (min && (json_int_t)json_array_size(v) < json_integer_value(min)) return false;
        if (max && (json_int_t)json_array_size(v) > json_integer_value(max)) return false;
        json_t *items = json_object_get(schema, "items");
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!validate(json_array_get(v, i), items, root)) return false;
    }
    if (json_is_object(v)) {
        json_t *properties = json_object_get(schema, "properties"), *required = json_object_get(schema, "required");
        json_t *additional = json_object_get(schema, "additionalProperties");
        for (size_t i = 0; i < json_array_size(required); i++)
            if (!json_object_get(v, json_string_value(json_array_get(required, i)))) return false;
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)v, key, value) {
            json_t *property = json_object_get(properties, key);
            if (property) {
                if (!validate(value, property, root)) return false;
            } else if (!json_is_true(additional)) {
                return false; // absent or false: no other keys (as the constraint documents)
            }
        }
    }
    return true;
}

static const char *const generation_schemas[] = {
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 20}, \"age\": {\"type\": "
    "\"integer\"}, \"city\": {\"type\": \"string\"}}, \"required\": [\"name\", \"age\", \"city\"], \"additionalProperties\": false}",
    "{\"type\": \"object\", \"properties\": {\"colors\": {\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"green\", "
    "\"blue\"]}, \"minItems\": 1, \"maxItems\": 3}, \"ok\": {\"type\": \"boolean\"}}, \"required\": [\"colors\", \"ok\"]}",
    "{\"$defs\": {\"step\": {\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"number\"}, \"note\": {\"type\": "
    "[\"string\", \"null\"]}}, \"required\": [\"n\", \"note\"]}}, \"type\": \"array\", \"items\": {\"$ref\": "
    "\"#/$defs/step\"}, \"minItems\": 2, \"maxItems\": 2}",
    "{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"object\", \"properties\": {\"answer\": {\"type\": \"string\", "
    "\"minLength\": 1, \"maxLength\": 8}}, \"required\": [\"answer\"]}]}",
};

static void test_generation_validates(void) {
    TextModel tm;
    if (!load_real_model(&tm)) return;
    const int V = tm.model.config.vocab_size;
    TokenTrie *trie = token_trie_new(tm.tokenizer, V);
    const char *question = "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n";
    int *prompt, length;
    tokenizer_encode(tm.tokenizer, question, strlen(question), false, &prompt, &length);
    enum { ROWS = 4, MAX_NEW = 48 };
    const int *prompts[ROWS];
    int lengths[ROWS];
    uint64_t row_ids[ROWS];
    for (int b = 0; b < ROWS; b++) prompts[b] = prompt, lengths[b] = length, row_ids[b] = (uint64_t)b << 40;
    // Row 0 greedy; the others sample (temperature 0.7; 1 with top-k 40 and top-p 0.95; 1).
    SamplerConfig samplers[ROWS] = {{.temperature = 0},
                                    {.temperature = 0.7f},
                                    {.temperature = 1.0f, .top_k = 40, .top_p = 0.95f},
                                    {.temperature = 1.0f}};
    // The sanitizer build decodes the first two rows (one greedy, one sampling), each the
    // tokens it gets in the batch of four (a row's sampling is its own, by row id).
    const int rows = TEST_SANITIZED ? 2 : ROWS;
    int complete = 0, valid = 0, total = 0;
    double constrained_seconds = 0;
    long constrained_tokens = 0;
    for (size_t s = 0; s < sizeof generation_schemas / sizeof generation_schemas[0]; s++) {
        json_t *schema = json_loads(generation_schemas[s], 0, NULL);
        JsonConstraint *c = NULL;
        EXPECT(json_constraint_schema(&c, schema, "schema") == 0, "generation schema %zu: %s", s, err_msg());
        Constraint *wrapped = constraint_from_json(c);
        for (uint64_t seed = 1 + s; c && seed <= 1 + s; seed++) {
            GenerateOptions options = {.max_new_tokens = MAX_NEW,
                                       .seed = seed,
                                       .stop_tokens = tm.stop_tokens,
                                       .num_stop_tokens = tm.num_stop_tokens,
                                       .pad_token = 0,
                                       .row_samplers = samplers,
                                       .constraint = wrapped,
                                       .token_trie = trie};
            GeneratedRow out[ROWS];
            GenerateStats stats;
            generate(&tm.model, prompts, lengths, row_ids, rows, &options, out, &stats);
            constrained_seconds += stats.decode_seconds;
            constrained_tokens += stats.generated_tokens;
            for (int b = 0; b < rows; b++) {
                total++;
                size_t n;
                int count = out[b].length - (out[b].stop == STOP_TOKEN);
                char *text = tokenizer_decode_len(tm.tokenizer, out[b].tokens, count, true, &n);
                if (out[b].stop == STOP_TOKEN) {
                    complete++;
                    json_error_t error;
                    json_t *value = json_loadb(text, n, JSON_DECODE_ANY, &error);
                    bool ok = value && validate(value, schema, schema);
                    valid += ok;
                    EXPECT(ok, "schema %zu seed %llu row %d: %s does not validate (%s)", s, (unsigned long long)seed, b,
                           text, value ? "schema" : error.text);
                    json_decref(value);
                } else {
                    // Cut by max_new_tokens: still a prefix the constraint keeps alive.
                    EXPECT(prefixes_alive(c, text, strlen(text)), "schema %zu row %d: the unfinished %s is a live prefix", s, b, text);
                }
                // The log-probs are the model's own: never +inf/NaN, and <= 0.
                for (int t = 0; t < out[b].length; t++)
                    EXPECT(out[b].logprobs[t] <= 0 && out[b].logprobs[t] > -INFINITY, "a finite log-prob");
                if (b < 2) printf("schema %zu row %d: %s\n", s, b, text);
                free(text);
                generated_row_free(&out[b]);
            }
        }
        constraint_free(wrapped);
        json_decref(schema);
    }
    printf("constrained generation: %d of %d answers complete, %d valid; decode %.1f tokens/s (%d rows, under load)\n",
           complete, total, valid, constrained_tokens / constrained_seconds, rows);
    EXPECT(complete >= total / 2, "most answers end within %d tokens (%d of %d)", MAX_NEW, complete, total);
    EXPECT(valid == complete, "every complete answer validates");
    free(prompt);
    token_trie_free(trie);
    text_model_free(&tm);
}

// token_mask_pick_greedy on chosen logits under a regular expression: an allowed argmax is
// taken, a refused one (or a tie whose first token is refused) sends the step to the mask,
// a stop token only where the text is complete and stops are allowed, never a sampling row;
// whenever it picks, its token is the masked logits' argmax.
static int single_token(const Tokenizer *tok, const char *text) {
    int *ids, n;
    tokenizer_encode(tok, text, strlen(text), false, &ids, &n);
    const int id = n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}

static void test_pick_greedy_cases(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    const int V = tokenizer_vocab_size(tok), eos = tokenizer_eos_id(tok);
    const int yes = single_token(tok, "Yes"), no = single_token(tok, "No"), comma = single_token(tok, ",");
    EXPECT(yes >= 0 && no >= 0 && comma >= 0, "Yes, No and , are single tokens");
    TokenTrie *trie = token_trie_new(tok, V);
    RegexConstraint *regex = NULL;
    const char *pattern = "(Yes|No)(, [a-z]+)?";
    EXPECT(regex_constraint_compile(&regex, pattern, strlen(pattern), NULL, "regex") == 0, "regex: %s", err_msg());
    Constraint *c = constraint_from_regex(regex);
    ConstraintState start, after_yes;
    constraint_state_init(c, &start);
    constraint_state_copy(c, &after_yes, &start);
    EXPECT(constraint_state_feed_bytes(c, &after_yes, "Yes", 3), "Yes is a prefix");
    float *logits = xcalloc((size_t)V, sizeof(float)), *masked = xmalloc((size_t)V * sizeof(float));
    TokenMaskScratch mask;
    token_mask_scratch_init(&mask, trie);
    SamplerScratch sampler_scratch;
    sampler_scratch_init(&sampler_scratch, V);
    const SamplerConfig greedy = {.temperature = 0}, sampling = {.temperature = 0.7f};
    struct {
        const ConstraintState *state;
        int high[2]; // tokens given the highest logit (-1: none)
        bool stops_allowed;
        const SamplerConfig *sampler;
        int want; // the token picked, or -1: the mask is needed
    } picks[] = {
        {&start, {yes, -1}, true, &greedy, yes},
        {&start, {comma, -1}, true, &greedy, -1},                        // refused
        {&start, {yes, -1}, true, &sampling, -1},                        // not greedy
        {&start, {comma, no}, true, &greedy, comma < no ? -1 : no},      // a tie: the first maximum decides
        {&after_yes, {eos, -1}, true, &greedy, eos},                     // complete: the stop token
        {&after_yes, {eos, -1}, false, &greedy, -1},                     // min_new_tokens holds it back
        {&after_yes, {comma, -1}, false, &greedy, comma},
        {&start, {eos, -1}, true, &greedy, -1},                          // not complete yet
    };
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        memset(logits, 0, (size_t)V * sizeof(float));
        for (int h = 0; h < 2; h++)
            if (picks[i].high[h] >= 0) logits[picks[i].high[h]] = 5.0f;
        SampledToken picked = {.token = -7};
        const bool took = token_mask_pick_greedy(trie, c, picks[i].state, &eos, 1, picks[i].stops_allowed, logits, V,
                                                 picks[i].sampler, &mask, &picked);
        EXPECT(took == (picks[i].want >= 0) && (!took || picked.token == picks[i].want),
               "case %zu: %s token %d, want %d", i, took ? "picked" : "no", picked.token, picks[i].want);
        if (took) { // the masked argmax, stops held back as the caller would
            token_mask_apply(trie, c, picks[i].state, &eos, picks[i].stops_allowed ? 1 : 0, logits, masked, V, &mask);
            const SampledToken best = sampler_pick(masked, V, &greedy, 0.0, &sampler_scratch);
            EXPECT(best.token == picked.token, "case %zu: picked %d, the masked argmax is %d", i, picked.token, best.token);
        }
    }
    sampler_scratch_free(&sampler_scratch);
    token_mask_scratch_free(&mask);
    free(logits), free(masked);
    constraint_free(c);
    token_trie_free(trie);
    tokenizer_free(tok);
}

// Greedy rows check their raw argmax against the constraint before masking the vocabulary
// (token_mask_pick_greedy): their tokens, log-probs and top alternatives must be those of
// masking every step, under a JSON Schema, a regular expression and a GBNF grammar, with
// min_new_tokens (the stop tokens held back) and a sampling row in the same batch.
static bool rows_equal(const GeneratedRow *a, const GeneratedRow *b) {
    const size_t n = (size_t)a->length, top = (size_t)a->length * (size_t)a->top_count;
    return a->length == b->length && a->stop == b->stop && a->top_count == b->top_count &&
           !memcmp(a->tokens, b->tokens, n * sizeof(int)) && !memcmp(a->logprobs, b->logprobs, n * sizeof(float)) &&
           !memcmp(a->sampling_logprobs, b->sampling_logprobs, n * sizeof(float)) &&
           !memcmp(a->top_tokens, b->top_tokens, top * sizeof(int)) &&
           !memcmp(a->top_logprobs, b->top_logprobs, top * sizeof(float));
}

static void test_greedy_short_cut_is_the_masked_argmax(void) {
    TextModel tm;
    if (!load_real_model(&tm)) return;
    const int V = tm.model.config.vocab_size;
    TokenTrie *trie = token_trie_new(tm.tokenizer, V);
    const char *question = "<|im_start|>user\nDescribe a person in one line.<|im_end|>\n<|im_start|>assistant\n";
    int *prompt, length;
    tokenizer_encode(tm.tokenizer, question, strlen(question), false, &prompt, &length);
    RegexConstraint *regex = NULL;
    const char *pattern = "[A-Z][a-z]+ is [0-9]{1,2} years old(, and [a-z ]+)?\\.";
    EXPECT(regex_constraint_compile(&regex, pattern, strlen(pattern), NULL, "regex") == 0, "regex: %s", err_msg());
    GrammarConstraint *grammar = NULL;
    const char *gbnf = "root ::= \"Name: \" [A-Z] [a-z]+ \"\\nTraits:\" (\" \" [a-z]+ \",\")+ \" done.\"\n";
    EXPECT(grammar_constraint_compile(&grammar, gbnf, strlen(gbnf), "grammar") == 0, "grammar: %s", err_msg());
    Constraint *constraints[3] = {
        constraint_from_json(compile_text("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                                          "\"age\": {\"type\": \"integer\"}}, \"required\": [\"name\", \"age\"]}")),
        constraint_from_regex(regex), constraint_from_grammar(grammar)};
    const char *names[3] = {"schema", "regex", "grammar"};
    // In the sanitizer build half the tokens, and only min_new_tokens 6 (not also 0): every
    // path (the short cut, masking, the stops held back) still runs there; the plain build
    // checks the length and prints the answers.
    enum { ROWS = 3, MAX_NEW = TEST_SANITIZED ? 12 : 24, MIN_NEW = TEST_SANITIZED ? 6 : 12 };
    const int *prompts[ROWS] = {prompt, prompt, prompt};
    int lengths[ROWS] = {length, length, length};
    // Rows 0 and 2 greedy, row 1 sampling.
    SamplerConfig samplers[ROWS] = {{.temperature = 0}, {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f}, {.temperature = 0}};
    for (int c = 0; c < 3; c++) {
        for (int min_new = TEST_SANITIZED ? MIN_NEW : 0; min_new <= MIN_NEW && constraints[c]; min_new += MIN_NEW) {
            GeneratedRow short_cut[ROWS], masked[ROWS];
            for (int mask_every_token = 0; mask_every_token <= 1; mask_every_token++) {
                GenerateOptions options = {.max_new_tokens = MAX_NEW,
                                           .min_new_tokens = min_new,
                                           .seed = 5,
                                           .stop_tokens = tm.stop_tokens,
                                           .num_stop_tokens = tm.num_stop_tokens,
                                           .row_samplers = samplers,
                                           .top_logprobs = 3,
                                           .constraint = constraints[c],
                                           .token_trie = trie,
                                           .mask_every_token = mask_every_token};
                generate(&tm.model, prompts, lengths, NULL, ROWS, &options, mask_every_token ? masked : short_cut, NULL);
            }
            for (int b = 0; b < ROWS; b++) {
                EXPECT(rows_equal(&short_cut[b], &masked[b]),
                       "%s, min_new_tokens %d, row %d: the short cut's %d tokens differ from masking every step's %d",
                       names[c], min_new, b, short_cut[b].length, masked[b].length);
                if (b == 0 && min_new == 0) {
                    size_t n;
                    char *text = tokenizer_decode_len(tm.tokenizer, short_cut[b].tokens, short_cut[b].length, true, &n);
                    printf("greedy under the %s: %s\n", names[c], text);
                    free(text);
                }
                generated_row_free(&short_cut[b]), generated_row_free(&masked[b]);
            }
        }
        constraint_free(constraints[c]);
    }
    free(prompt);
    token_trie_free(trie);
    text_model_free(&tm);
}

// Continuous batching with a different constraint per sequence (json_object, a schema,
// none), the constrained ones beside an unconstrained one and two choices of one request:
// each sequence's tokens are those generate() gives it alone with its constraint.
typedef struct {
    GeneratedRow row;
    bool finished;
} Finished;

static void batch_finish(void *context, void *owner, GeneratedRow *row) {
    Finished *f = owner;
    f->row = *row;
    f->finished = true;
}

static void test_continuous_batch_per_sequence_constraints(void) {
    TextModel tm;
    if (!load_real_model(&tm)) return;
    const int V = tm.model.config.vocab_size;
    TokenTrie *trie = token_trie_new(tm.tokenizer, V);
    JsonConstraint *object = json_constraint_object();
    JsonConstraint *schema = compile_text("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", "
                                          "\"maxLength\": 12}, \"age\": {\"type\": \"integer\"}}, \"required\": [\"name\", \"age\"]}");
    const char *question = "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n";
    int *prompt, length;
    tokenizer_encode(tm.tokenizer, question, strlen(question), false, &prompt, &length);
    enum { MAX_NEW = 20, N = 4 };
    Finished finished[N] = {0};
    const JsonConstraint *constraints[N] = {object, NULL, schema, schema};
    Constraint *object_wrapped = constraint_from_json(object), *schema_wrapped = constraint_from_json(schema);
    const Constraint *wrapped[N] = {object_wrapped, NULL, schema_wrapped, schema_wrapped};
    SequenceOptions sequences[N];
    // Sequence 3 is greedy: its steps take the short cut (token_mask_pick_greedy), which
    // generate() below, masking every step, must agree with.
    for (int j = 0; j < N; j++)
        sequences[j] = (SequenceOptions){.sampler = {j == 3 ? 0.0f : 0.8f, 40, 0.95f},
                                         .seed = 11,
                                         .row_id = (uint64_t)j << 40,
                                         .max_new_tokens = MAX_NEW,
                                         .owner = &finished[j],
                                         .constraint = wrapped[j]};
    ContinuousOptions options = {.stop_tokens = tm.stop_tokens,
                                 .num_stop_tokens = tm.num_stop_tokens,
                                 .on_finish = batch_finish,
                                 .token_trie = trie};
    ContinuousBatch *batch = continuous_batch_new(&tm.model, N, &options);
    // Request 0 (sequences 0, 1) joins first; request 1 (sequences 2, 3: two choices) a step later.
    SequenceRequest first = {.prompt = prompt, .prompt_length = length, .sequences = sequences, .num_sequences = 2};
    continuous_batch_add(batch, &first, 1);
    continuous_batch_step(batch);
    SequenceRequest second = {.prompt = prompt, .prompt_length = length, .sequences = sequences + 2, .num_sequences = 2};
    continuous_batch_add(batch, &second, 1);
    while (continuous_batch_rows(batch) > 0) continuous_batch_step(batch);
    continuous_batch_free(batch);
    for (int j = 0; j < N; j++) {
        EXPECT(finished[j].finished, "sequence %d finished", j);
        GenerateOptions alone = {.sampler = sequences[j].sampler,
                                 .max_new_tokens = MAX_NEW,
                                 .seed = sequences[j].seed,
                                 .stop_tokens = tm.stop_tokens,
                                 .num_stop_tokens = tm.num_stop_tokens,
                                 .constraint = wrapped[j],
                                 .token_trie = trie,
                                 .mask_every_token = true};
        const int *prompts[1] = {prompt};
        GeneratedRow want;
        generate(&tm.model, prompts, &length, &sequences[j].row_id, 1, &alone, &want, NULL);
        const GeneratedRow *got = &finished[j].row;
        EXPECT(got->length == want.length && !memcmp(got->tokens, want.tokens, (size_t)want.length * sizeof(int)),
               "sequence %d: the batch's %d tokens are generate()'s %d alone", j, got->length, want.length);
        size_t n;
        char *text = tokenizer_decode_len(tm.tokenizer, got->tokens, got->length - (got->stop == STOP_TOKEN), true, &n);
        if (constraints[j]) EXPECT(prefixes_alive(constraints[j], text, strlen(text)), "sequence %d: %s is a live prefix", j, text);
        if (constraints[j] && got->stop == STOP_TOKEN)
            EXPECT(json_constraint_matches(constraints[j], text, n), "sequence %d: %s is complete", j, text);
        printf("continuous sequence %d (%s): %s\n", j, constraints[j] == object ? "json_object" : constraints[j] ? "schema" : "none", text);
        free(text);
        generated_row_free(&want);
        generated_row_free(&finished[j].row);
    }
    free(prompt);
    constraint_free(object_wrapped), constraint_free(schema_wrapped);
    token_trie_free(trie);
    text_model_free(&tm);
}

int main(void) {
    RUN(test_accept_and_reject);
    RUN(test_json_object_mode);
    RUN(test_tool_call_syntax);
    RUN(test_refusals);
    RUN(test_mask_equals_brute_force);
    RUN(test_pick_greedy_cases);
    RUN(test_greedy_short_cut_is_the_masked_argmax);
    RUN(test_continuous_batch_per_sequence_constraints);
    RUN(test_generation_validates);
    TEST_EXIT();
}
