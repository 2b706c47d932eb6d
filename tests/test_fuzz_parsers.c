// Mutation fuzzing of every reader of files a user hands marlhf: safetensors, GGUF (header,
// metadata, tensors, the model config and the tokenizer it carries), tokenizer.json,
// config.json, tokenizer_config.json chat templates, JSONL datasets, and checkpoints that
// bitsandbytes quantized (their weights and quant states, loaded as a model). Each seed file
// (a valid fixture) is mutated a few hundred times with a fixed seed: bit flips, bytes set
// to boundary values, 4- and 8-byte integers overwritten (where length and offset fields
// live), truncation, deleted and duplicated chunks, and numbers in text replaced by
// extreme ones. Every mutant must either load or be refused with an error message; a
// crash, an abort or (in the sanitizer build, `make test SANITIZE=1`) any out-of-bounds
// access, use of uninitialised memory or leak fails the test. `tests/fuzz/` has the same
// readers as libFuzzer targets for longer, coverage-guided runs (`make fuzz`).
#include <stdint.h>
#include <string.h>

#include "core/check.h"
#include "fuzz/readers.h"
#include "io/fs.h"
#include "test.h"

// ---- mutations ----------------------------------------------------------------------

static uint64_t rng_state;

static uint64_t next_random(void) { // SplitMix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(size_t n) { return n ? (size_t)(next_random() % n) : 0; }

typedef struct {
    unsigned char *bytes;
    size_t length, capacity;
} Buffer;

static void reserve(Buffer *b, size_t length) {
    if (length <= b->capacity) return;
    b->capacity = length * 2;
    b->bytes = xrealloc(b->bytes, b->capacity);
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_alnum(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Replaces the run of digits at or after `at` by an extreme number.
static void replace_number(Buffer *b, size_t at) {
    static const char *numbers[] = {"-1", "0", "99999999999999999999", "18446744073709551615", "4294967296",
                                    "1e308", "-2147483649", "3.5", "NaN"};
    size_t start = at;
    while (start < b->length && !is_digit(b->bytes[start])) start++;
    if (start >= b->length) return;
    size_t end = start;
    while (end < b->length && is_digit(b->bytes[end])) end++;
    const char *number = numbers[below(sizeof numbers / sizeof numbers[0])];
    size_t n = strlen(number);
    reserve(b, b->length - (end - start) + n);
    memmove(b->bytes + start + n, b->bytes + end, b->length - end);
    memcpy(b->bytes + start, number, n);
    b->length = b->length - (end - start) + n;
}

// Text formats: most mutations keep the syntax and change what it says (a letter of a
// name or a token, a number), so that mutants get past the JSON parser into the readers.
static void mutate_text(Buffer *b) {
    static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_";
    size_t at = below(b->length);
    while (at < b->length && !is_alnum(b->bytes[at])) at++;
    if (at >= b->length) return;
    if (is_digit(b->bytes[at])) replace_number(b, at);
    else b->bytes[at] = (unsigned char)letters[below(sizeof letters - 1)];
}

static void mutate_once(Buffer *b, bool text) {
    static const unsigned char boundary_bytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '0', '9', '"', '{', '}', '[',
                                                   ']', ',', ':', '-', '\\', 'e'};
    static const uint64_t boundary_words[] = {0, 1, 0x7f, 0xff, 0x7fffffffull, 0x80000000ull, 0xffffffffull,
                                              0x100000000ull, 1ull << 40, 0x7fffffffffffffffull, ~0ull};
    if (text && below(10) < 6) {
        mutate_text(b);
        return;
    }
    size_t at = below(b->length);
    switch (below(7)) {
    case 0: // flip a bit
        if (b->length) b->bytes[at] ^= (unsigned char)(1u << below(8));
        break;
    case 1: // a boundary byte
        if (b->length) b->bytes[at] = boundary_bytes[below(sizeof boundary_bytes)];
        break;
    case 2: { // a boundary integer, 4 or 8 bytes, little-endian
        uint64_t value = boundary_words[below(sizeof boundary_words / sizeof boundary_words[0])];
        size_t width = below(2) ? 8 : 4;
        if (b->length >= width) {
            at = below(b->length - width + 1);
            for (size_t i = 0; i < width; i++) b->bytes[at + i] = (unsigned char)(value >> (8 * i));
        }
        break;
    }
    case 3: // truncate
        b->length = below(b->length + 1);
        break;
    case 4: { // delete a chunk
        size_t n = below(64) + 1;
        if (at + n > b->length) n = b->length - at;
        memmove(b->bytes + at, b->bytes + at + n, b->length - at - n);
        b->length -= n;
        break;
    }
    case 5: { // duplicate a chunk in place
        size_t n = below(64) + 1;
        if (at + n > b->length) n = b->length - at;
        reserve(b, b->length + n);
        memmove(b->bytes + at + n, b->bytes + at, b->length - at);
        b->length += n;
        break;
    }
    default: // a number in text replaced by an extreme one
        replace_number(b, at);
        break;
    }
}

static void write_bytes(const char *path, const Buffer *b) {
    FILE *out = fopen(path, "wb");
    CHECK(out, "cannot write %s", path);
    CHECK(fwrite(b->bytes, 1, b->length, out) == b->length, "cannot write %s", path);
    fclose(out);
}

static char scratch_dir[512];

// Mutates `seed` `iterations` times (mostly syntax-keeping mutations when `text`); each
// mutant is written to a file named `name` in a scratch folder (with `companion` files
// copied beside it) and read by `reader`, which gets the file or, when `pass_folder`, the
// folder.
// `refusing`: some mutants must be refused (a reader that refuses nothing is checked by its
// own aborts instead: read_tool_answer).
static void fuzz_mutants(const char *label, const char *seed, const char *name, const char *const *companions,
                         bool pass_folder, bool text, int (*reader)(const char *), int iterations, uint64_t seed_value,
                         bool refusing) {
    size_t length;
    char *original;
    CHECK(fs_read_file(seed, 1 << 24, &original, &length) == 0, "cannot read the seed %s", seed);
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/%s", scratch_dir, label);
    CHECK(fs_mkdir_p(dir) == 0, "%s", err_msg());
    for (int i = 0; companions && companions[i]; i++) {
        size_t n;
        char *content;
        CHECK(fs_read_file(companions[i], 1 << 24, &content, &n) == 0, "cannot read %s", companions[i]);
        const char *base = strrchr(companions[i], '/');
        snprintf(path, sizeof path, "%s/%s", dir, base ? base + 1 : companions[i]);
        Buffer copy = {(unsigned char *)content, n, n};
        write_bytes(path, &copy);
        free(content);
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const char *target = pass_folder ? dir : path;
    // The seed itself must load: otherwise the mutants test nothing.
    Buffer b = {NULL, 0, 0};
    reserve(&b, length + 1);
    memcpy(b.bytes, original, length), b.length = length;
    write_bytes(path, &b);
    EXPECT(reader(target) == 0, "%s: the unmutated seed %s does not load: %s", label, seed, err_msg());
    rng_state = seed_value;
    int loaded = 0, refused = 0;
    for (int k = 0; k < iterations; k++) {
        memcpy(b.bytes, original, length), b.length = length;
        int mutations = 1 + (int)below(4);
        for (int m = 0; m < mutations; m++) mutate_once(&b, text);
        write_bytes(path, &b);
        if (reader(target) == 0) {
            loaded++;
        } else {
            refused++;
            EXPECT(err_msg()[0] != '\0', "%s: mutant %d refused without a message", label, k);
        }
    }
    printf("# %-16s %d mutants of %s: %d loaded, %d refused\n", label, iterations, seed, loaded, refused);
    if (refusing) EXPECT(refused > 0, "%s: no mutant was refused (the mutations do nothing?)", label);
    free(b.bytes), free(original);
}

static void fuzz(const char *label, const char *seed, const char *name, const char *const *companions,
                 bool pass_folder, bool text, int (*reader)(const char *), int iterations, uint64_t seed_value) {
    fuzz_mutants(label, seed, name, companions, pass_folder, text, reader, iterations, seed_value, true);
}

// Model answers: mutated as text, none refused; each streamed and taken whole must agree.
static void fuzz_answers(const char *label, const char *seed, int iterations, uint64_t seed_value) {
    fuzz_mutants(label, seed, "answer.txt", NULL, false, true, read_tool_answer, iterations, seed_value, false);
}

static void test_fuzz_safetensors(void) {
    fuzz("safetensors", "tests/fixtures/safetensors/dtypes.safetensors", "x.safetensors", NULL, false, false, read_safetensors,
         3000, 1);
}

static void test_fuzz_gguf(void) {
    fuzz("gguf", "tests/fixtures/gguf/types.gguf", "x.gguf", NULL, false, false, read_gguf, 2000, 2);
    fuzz("gguf_model", "tests/fixtures/gguf/tiny_llama.gguf", "x.gguf", NULL, false, false, read_gguf, 2000, 3);
    fuzz("gguf_tokenizer", "tests/fixtures/tokenizers/spm_small.gguf", "x.gguf", NULL, false, false, read_tokenizer, 1500, 4);
}

static void test_fuzz_tokenizer_json(void) {
    const char *const companions[] = {"tests/fixtures/tokenizers/bytelevel_small/tokenizer_config.json", NULL};
    fuzz("tokenizer_json", "tests/fixtures/tokenizers/bytelevel_small/tokenizer.json", "tokenizer.json", companions,
         true, true, read_tokenizer, 1000, 5);
}

static void test_fuzz_config_and_chat_template(void) {
    fuzz("config_json", "tests/fixtures/models/llama/config.json", "config.json", NULL, false, true, read_config, 2000, 6);
    fuzz("chat_template", "tests/fixtures/models/tiny_chat/tokenizer_config.json", "tokenizer_config.json", NULL, false,
         true, read_chat_template, 2000, 7);
}

// Checkpoints bitsandbytes quantized: the FP4 and LLM.int8 folders' weights (binary
// mutations, the header's quant-state tensors included) under their own config.json, and the
// NF4 folder's config.json (its quantization_config) read alone.
static void test_fuzz_bnb(void) {
    const char *const fp4_config[] = {"tests/fixtures/bnb/fp4/config.json", NULL};
    const char *const int8_config[] = {"tests/fixtures/bnb/int8/config.json", NULL};
    fuzz("bnb_fp4", "tests/fixtures/bnb/fp4/model.safetensors", "model.safetensors", fp4_config, true, false, read_model,
         400, 11);
    fuzz("bnb_int8", "tests/fixtures/bnb/int8/model.safetensors", "model.safetensors", int8_config, true, false,
         read_model, 200, 12);
    fuzz("bnb_config", "tests/fixtures/bnb/nf4/config.json", "config.json", NULL, false, true, read_config, 600, 13);
}

static void test_fuzz_datasets(void) {
    fuzz("pairs_jsonl", "tests/fixtures/train/pairs_eval.jsonl", "x.jsonl", NULL, false, true, read_dataset, 1500, 8);
    fuzz("ranked_jsonl", "tests/fixtures/train/ranked_eval.jsonl", "x.jsonl", NULL, false, true, read_dataset, 1500, 9);
}

// The structured-output constraints a user hands `generate` / `chat` / `serve`: a JSON
// Schema (text mutations: names, numbers, keywords), a regular expression and a GBNF
// grammar (byte mutations: any byte in any place of the text).
static void test_fuzz_constraints(void) {
    fuzz("json_schema", "tests/fixtures/constraints/person.schema.json", "x.schema.json", NULL, false, true,
         read_json_schema, 1000, 14);
    fuzz("regex", "tests/fixtures/constraints/date.regex", "x.regex", NULL, false, false, read_regex, 2000, 15);
    fuzz("gbnf", "tests/fixtures/constraints/json.gbnf", "x.gbnf", NULL, false, false, read_gbnf, 2000, 16);
}

// What `marlhf serve`, the judge and PPO read from the network (tests/fixtures/api/): request
// bodies of every route (a chat request with tools, tool messages and log-probs; one with a
// JSON schema; a completion with a regular expression; embeddings; /get_reward), a judge's
// chat-completions response, a remote reward server's answer, and model answers with tool calls in both syntaxes, each taken
// whole and streamed (the two must agree: read_tool_answer).
static void test_fuzz_network_inputs(void) {
    fuzz("chat_request", "tests/fixtures/api/chat_request.json", "x.json", NULL, false, true, read_chat_request, 1500, 17);
    fuzz("chat_schema", "tests/fixtures/api/chat_schema_request.json", "x.json", NULL, false, true, read_chat_request,
         800, 18);
    fuzz("completion", "tests/fixtures/api/completion_request.json", "x.json", NULL, false, true,
         read_completion_request, 800, 19);
    fuzz("embeddings", "tests/fixtures/api/embeddings_request.json", "x.json", NULL, false, true,
         read_embeddings_request, 500, 20);
    fuzz("reward_request", "tests/fixtures/api/reward_request.json", "x.json", NULL, false, true, read_reward_request,
         500, 21);
    fuzz("judge_response", "tests/fixtures/api/judge_response.json", "x.json", NULL, false, true, read_judge_response,
         500, 22);
    fuzz("reward_answer", "tests/fixtures/api/reward_answer.json", "x.json", NULL, false, true, read_reward_answer,
         500, 25);
    fuzz_answers("hermes_answer", "tests/fixtures/api/hermes_answer.txt", 1500, 23);
    fuzz_answers("llama3_answer", "tests/fixtures/api/llama3_answer.txt", 1500, 24);
}

int main(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP");
    snprintf(scratch_dir, sizeof scratch_dir, "%s/fuzz_parsers", tmp && *tmp ? tmp : "/tmp");
    RUN(test_fuzz_safetensors);
    RUN(test_fuzz_gguf);
    RUN(test_fuzz_tokenizer_json);
    RUN(test_fuzz_config_and_chat_template);
    RUN(test_fuzz_datasets);
    RUN(test_fuzz_bnb);
    RUN(test_fuzz_constraints);
    RUN(test_fuzz_network_inputs);
    TEST_EXIT();
}
