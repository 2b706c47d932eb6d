// The tokenizers against Hugging Face `tokenizers` (via transformers), on the corpus of
// tests/fixtures/tokenizers/ (tools/make_tokenizer_fixtures.py): identical ids, identical
// decode (with and without special tokens), BOS handling, streaming decode, added tokens,
// tokenizer_write_hf round trips, and damaged tokenizer files.
//
// Four tokenizers: SmolLM2-135M-Instruct's, loaded from the real GGUF (scripts/fetch-model),
// a small byte-level BPE (Llama-3 style) and a small sentencepiece-style BPE (Llama-2
// style) trained with `tokenizers`, and the latter's vocabulary as a llama.cpp GGUF (SPM,
// merges derived from scores).
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "io/fs.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "test.h"

#define FIXTURES "tests/fixtures/tokenizers"
static const char *smollm2_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

typedef struct {
    char *bytes; // raw corpus string
    size_t len;
    char *text;  // bytes with ill-formed UTF-8 replaced (what HF was given)
    size_t text_len;
} CorpusString;

static CorpusString *corpus;
static int corpus_count;

static int hex_value(char c) { return c >= '0' && c <= '9' ? c - '0' : c - 'a' + 10; }

static void load_corpus(void) {
    json_error_t error;
    FILE *f = fopen(FIXTURES "/corpus.jsonl", "r");
    CHECK(f, "cannot open the corpus");
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, &error);
        CHECK(row, "corpus: %s", error.text);
        const char *hex = json_string_value(json_object_get(row, "hex"));
        corpus = xrealloc(corpus, (size_t)(corpus_count + 1) * sizeof *corpus);
        CorpusString *s = &corpus[corpus_count++];
        s->len = strlen(hex) / 2;
        s->bytes = xmalloc(s->len + 1);
        for (size_t i = 0; i < s->len; i++) s->bytes[i] = (char)(hex_value(hex[2 * i]) << 4 | hex_value(hex[2 * i + 1]));
        TokBuf b = {0};
        utf8_append_lossy(&b, s->bytes, s->len);
        s->text = tokbuf_take(&b, &s->text_len);
        json_decref(row);
    }
    free(line);
    fclose(f);
}

typedef struct {
    int *ids, n;
    int *ids_special, n_special; // n_special < 0: not given
    char *text, *text_skip;      // NULL: equal to the input text / to text
    size_t text_len, text_skip_len;
} Expected;

static int int_array(json_t *a, int **out) {
    int n = (int)json_array_size(a);
    *out = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) (*out)[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

static char *string_copy(json_t *s, size_t *len) {
    if (!s) return NULL;
    *len = json_string_length(s);
    char *out = xmalloc(*len + 1);
    memcpy(out, json_string_value(s), *len + 1);
    return out;
}

static Expected *load_expected(const char *path) {
    FILE *f = fopen(path, "r");
    CHECK(f, "cannot open %s", path);
    Expected *rows = xcalloc((size_t)corpus_count, sizeof *rows);
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < corpus_count; i++) {
        CHECK(getline(&line, &cap, f) > 0, "%s: too few lines", path);
        json_error_t error;
        json_t *row = json_loads(line, JSON_ALLOW_NUL, &error);
        CHECK(row, "%s:%d: %s", path, i + 1, error.text);
        Expected *e = &rows[i];
        e->n = int_array(json_object_get(row, "ids"), &e->ids);
        json_t *special = json_object_get(row, "ids_special");
        e->n_special = special ? int_array(special, &e->ids_special) : -1;
        e->text = string_copy(json_object_get(row, "text"), &e->text_len);
        e->text_skip = string_copy(json_object_get(row, "text_skip"), &e->text_skip_len);
        json_decref(row);
    }
    free(line);
    fclose(f);
    return rows;
}

static void free_expected(Expected *rows) {
    for (int i = 0; i < corpus_count; i++) {
        free(rows[i].ids), free(rows[i].ids_special), free(rows[i].text), free(rows[i].text_skip);
    }
    free(rows);
}

static void print_ids(const char *what, const int *ids, int n) {
    fprintf(stderr, "    %s:", what);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static bool same_ids(const int *a, int na, const int *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int)) == 0);
}

// Every corpus string: ids, ids with special tokens, decode and decode skipping specials.
static void check_against_hf(const Tokenizer *tok, const char *expected_path, const char *name) {
    Expected *rows = load_expected(expected_path);
    int id_mismatches = 0, decode_mismatches = 0, shown = 0;
    long total_tokens = 0;
    for (int i = 0; i < corpus_count; i++) {
        const CorpusString *s = &corpus[i];
        const Expected *e = &rows[i];
        int *ids, n;
        tokenizer_encode(tok, s->bytes, s->len, false, &ids, &n);
        total_tokens += n;
        if (!same_ids(ids, n, e->ids, e->n)) {
            id_mismatches++;
            if (shown++ < 5) {
                fprintf(stderr, "  %s: string %d (\"%.60s\") encodes differently\n", name, i, s->text);
                print_ids("ours", ids, n);
                print_ids("HF  ", e->ids, e->n);
            }
        }
        if (e->n_special >= 0) {
            int *ids_special, n_special;
            tokenizer_encode(tok, s->bytes, s->len, true, &ids_special, &n_special);
            if (!same_ids(ids_special, n_special, e->ids_special, e->n_special)) {
                id_mismatches++;
                if (shown++ < 5) fprintf(stderr, "  %s: string %d with special tokens differs\n", name, i);
            }
            free(ids_special);
        }
        // Decode HF's ids, so a decode difference is not an encode difference.
        for (int skip = 0; skip < 2; skip++) {
            size_t len;
            char *text = tokenizer_decode_len(tok, e->ids, e->n, skip, &len);
            const char *want = e->text ? e->text : s->text;
            size_t want_len = e->text ? e->text_len : s->text_len;
            if (skip && e->text_skip) want = e->text_skip, want_len = e->text_skip_len;
            if (len != want_len || memcmp(text, want, len) != 0) {
                decode_mismatches++;
                if (shown++ < 5)
                    fprintf(stderr, "  %s: string %d decodes (skip_special=%d) to \"%.60s\", HF \"%.60s\"\n", name, i,
                            skip, text, want);
            }
            free(text);
        }
        free(ids);
    }
    printf("%s: %d strings, %ld tokens: %d id mismatches, %d decode mismatches vs HF\n", name, corpus_count,
           total_tokens, id_mismatches, decode_mismatches);
    EXPECT(id_mismatches == 0, "%s: %d strings encode differently from HF", name, id_mismatches);
    EXPECT(decode_mismatches == 0, "%s: %d decodes differ from HF", name, decode_mismatches);
    free_expected(rows);
}

static Tokenizer *load_or_fail(const char *path) {
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, path) != 0) {
        fprintf(stderr, "  cannot load %s: %s\n", path, err_msg());
        test_current_failures++;
        return NULL;
    }
    return tok;
}

static void test_smollm2_gguf_matches_hf(void) {
    Tokenizer *tok = load_or_fail(smollm2_path);
    if (!tok) return;
    check_against_hf(tok, FIXTURES "/smollm2_expected.jsonl", "smollm2 (gguf)");
    tokenizer_free(tok);
}

static void test_bytelevel_small_matches_hf(void) {
    Tokenizer *tok = load_or_fail(FIXTURES "/bytelevel_small");
    if (!tok) return;
    check_against_hf(tok, FIXTURES "/bytelevel_small/expected.jsonl", "bytelevel_small");
    tokenizer_free(tok);
}

static void test_spm_small_matches_hf(void) {
    Tokenizer *tok = load_or_fail(FIXTURES "/spm_small");
    if (!tok) return;
    check_against_hf(tok, FIXTURES "/spm_small/expected.jsonl", "spm_small");
    tokenizer_free(tok);
}

static void test_spm_gguf_matches_hf(void) {
    Tokenizer *tok = load_or_fail(FIXTURES "/spm_small.gguf");
    if (!tok) return;
    check_against_hf(tok, FIXTURES "/spm_gguf_expected.jsonl", "spm_small (gguf, merges from scores)");
    tokenizer_free(tok);
}


// --- streaming decode --------------------------------------------------------------------
// Pushes ids one at a time: every piece must be valid UTF-8 (no character split between
// pieces) and the pieces plus the flush must equal the full decode.
static int check_stream(const Tokenizer *tok, const int *ids, int n, bool skip) {
    size_t want_len;
    char *want = tokenizer_decode_len(tok, ids, n, skip, &want_len);
    TokenizerStream *stream = tokenizer_stream_new(tok, skip);
    TokBuf got = {0};
    int bad_pieces = 0;
    for (int i = 0; i <= n; i++) {
        char *piece;
        size_t len;
        if (i < n) tokenizer_stream_push_len(stream, ids[i], &piece, &len);
        else tokenizer_stream_flush_len(stream, &piece, &len);
        bad_pieces += !utf8_is_valid(piece, len);
        tokbuf_append(&got, piece, len);
        free(piece);
    }
    tokenizer_stream_free(stream);
    int rc = bad_pieces || got.len != want_len || memcmp(got.data, want, want_len) != 0;
    if (rc && getenv("TOKENIZER_TEST_DEBUG")) {
        fprintf(stderr, "    stream differs (skip=%d, bad pieces %d):", skip, bad_pieces);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n      got  [%.*s]\n      want [%s]\n", (int)got.len, got.data, want);
    }
    free(got.data);
    free(want);
    return rc;
}

static void stream_corpus(const char *path, const char *name, int random_seed) {
    Tokenizer *tok = load_or_fail(path);
    if (!tok) return;
    int failures = 0, checked = 0;
    for (int i = 0; i < corpus_count; i++) {
        int *ids, n;
        tokenizer_encode(tok, corpus[i].bytes, corpus[i].len, true, &ids, &n);
        failures += check_stream(tok, ids, n, false) + check_stream(tok, ids, n, true);
        checked += 2;
        free(ids);
    }
    // Random id sequences: byte tokens that do not form characters, specials, anything.
    uint64_t state = (uint64_t)random_seed;
    for (int r = 0; r < 500; r++) {
        int ids[24];
        for (int k = 0; k < 24; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            ids[k] = (int)((state >> 33) % (uint64_t)tokenizer_vocab_size(tok));
        }
        failures += check_stream(tok, ids, 24, r & 1);
        checked++;
    }
    printf("%s: streaming decode checked on %d sequences, %d differ from decode\n", name, checked, failures);
    EXPECT(failures == 0, "%s: %d streamed decodes differ or split a character", name, failures);
    tokenizer_free(tok);
}

static void test_stream_decode_equals_decode(void) {
    stream_corpus(smollm2_path, "smollm2", 1);
    stream_corpus(FIXTURES "/bytelevel_small", "bytelevel_small", 2);
    stream_corpus(FIXTURES "/spm_small", "spm_small", 3);
    stream_corpus(FIXTURES "/spm_small.gguf", "spm_small.gguf", 4);
}

// A multi-byte character split over byte tokens comes out whole, once complete.
static void test_stream_holds_incomplete_characters(void) {
    Tokenizer *tok = load_or_fail(FIXTURES "/spm_small");
    if (!tok) return;
    const char *pieces[] = {"<0xE2>", "<0x82>", "<0xAC>", "▁x"}; // "€ x"
    TokenizerStream *stream = tokenizer_stream_new(tok, false);
    char *out[4];
    for (int i = 0; i < 4; i++) tokenizer_stream_push(stream, tokenizer_piece_to_id(tok, pieces[i]), &out[i]);
    char *rest;
    tokenizer_stream_flush(stream, &rest);
    EXPECT(!strcmp(out[0], "") && !strcmp(out[1], "") && !strcmp(out[2], ""), "bytes of € emitted early: '%s' '%s' '%s'",
           out[0], out[1], out[2]);
    EXPECT(!strcmp(out[3], "€ x") && !strcmp(rest, ""), "got '%s' then '%s'", out[3], rest);
    for (int i = 0; i < 4; i++) free(out[i]);
    free(rest);
    tokenizer_stream_free(stream);
    tokenizer_free(tok);

    tok = load_or_fail(smollm2_path);
    if (!tok) return;
    int *ids, n;
    tokenizer_encode(tok, "日本", strlen("日本"), false, &ids, &n);
    stream = tokenizer_stream_new(tok, false);
    TokBuf all = {0};
    for (int i = 0; i < n; i++) {
        char *piece;
        tokenizer_stream_push(stream, ids[i], &piece);
        EXPECT(utf8_is_valid(piece, strlen(piece)), "piece %d splits a character", i);
        tokbuf_append(&all, piece, strlen(piece));
        free(piece);
    }
    tokenizer_stream_flush(stream, &rest);
    tokbuf_append(&all, rest, strlen(rest));
    free(rest);
    EXPECT(all.len == strlen("日本") && !memcmp(all.data, "日本", all.len), "streamed '%.*s'", (int)all.len, all.data);
    free(all.data);
    free(ids);
    tokenizer_stream_free(stream);
    tokenizer_free(tok);
}

// --- added tokens, BOS, accessors -------------------------------------------------------
static void expect_encoding(const Tokenizer *tok, const char *text, bool add_special, const int *want, int n_want) {
    int *ids, n;
    tokenizer_encode(tok, text, strlen(text), add_special, &ids, &n);
    EXPECT(same_ids(ids, n, want, n_want), "\"%s\" encodes differently", text);
    if (!same_ids(ids, n, want, n_want)) print_ids("ours", ids, n), print_ids("want", want, n_want);
    free(ids);
}

static void test_added_tokens_and_bos(void) {
    Tokenizer *smol = load_or_fail(smollm2_path);
    if (!smol) return;
    // "<|im_start|>user\nHi<|im_end|>\n" -- checked against transformers by hand.
    expect_encoding(smol, "<|im_start|>user\nHi<|im_end|>\n", false, (int[]){1, 4093, 198, 26843, 2, 198}, 6);
    expect_encoding(smol, "<|im_start|>user\nHi<|im_end|>\n", true, (int[]){1, 4093, 198, 26843, 2, 198}, 6);
    EXPECT(tokenizer_bos_id(smol) == 1 && tokenizer_eos_id(smol) == 2 && tokenizer_pad_id(smol) == 2 &&
               tokenizer_unk_id(smol) == 0, "special ids %d %d %d %d", tokenizer_bos_id(smol), tokenizer_eos_id(smol),
           tokenizer_pad_id(smol), tokenizer_unk_id(smol));
    EXPECT(!tokenizer_adds_bos(smol), "SmolLM2 adds no BOS");
    EXPECT(tokenizer_vocab_size(smol) == 49152, "vocab size %d", tokenizer_vocab_size(smol));
    EXPECT(tokenizer_is_special(smol, 2) && !tokenizer_is_special(smol, 4093), "special flags");
    EXPECT(!strcmp(tokenizer_token_string(smol, 2), "<|im_end|>"), "eos string");
    EXPECT(!strcmp(tokenizer_id_to_piece(smol, 216), "Ġ") && tokenizer_piece_to_id(smol, "Ġ") == 216, "piece of 216");
    EXPECT(!strcmp(tokenizer_token_string(smol, 216), " "), "text of 216");
    EXPECT(tokenizer_id_to_piece(smol, 49152) == NULL && tokenizer_piece_to_id(smol, "no such piece") == -1, "bounds");
    EXPECT(tokenizer_chat_template(smol) && strstr(tokenizer_chat_template(smol), "<|im_start|>"), "chat template");
    char *text = tokenizer_decode(smol, (int[]){1, 4093, 198, 26843, 2}, 5, true);
    EXPECT(!strcmp(text, "user\nHi"), "skip_special decode gave '%s'", text);
    free(text);
    tokenizer_free(smol);

    Tokenizer *bl = load_or_fail(FIXTURES "/bytelevel_small");
    if (!bl) return;
    int bos = tokenizer_piece_to_id(bl, "<|begin_of_text|>"), tool = tokenizer_piece_to_id(bl, "<tool>");
    EXPECT(tokenizer_bos_id(bl) == bos && tokenizer_adds_bos(bl), "bytelevel_small BOS %d", tokenizer_bos_id(bl));
    int *ids, n, *with, n_with;
    tokenizer_encode(bl, "hi", 2, false, &ids, &n);
    tokenizer_encode(bl, "hi", 2, true, &with, &n_with);
    EXPECT(n_with == n + 1 && with[0] == bos && same_ids(with + 1, n_with - 1, ids, n), "BOS added in front");
    free(ids), free(with);
    // <tool> takes the spaces around it (lstrip/rstrip) and is not special.
    tokenizer_encode(bl, "a  <tool>  b", strlen("a  <tool>  b"), false, &ids, &n);
    EXPECT(n == 3 && ids[1] == tool, "lstrip/rstrip: %d tokens", n);
    EXPECT(!tokenizer_is_special(bl, tool), "<tool> is not special");
    free(ids);
    tokenizer_free(bl);

    Tokenizer *spm = load_or_fail(FIXTURES "/spm_small");
    if (!spm) return;
    EXPECT(tokenizer_adds_bos(spm) && tokenizer_bos_id(spm) == tokenizer_piece_to_id(spm, "<s>"), "spm BOS");
    tokenizer_encode(spm, "", 0, true, &ids, &n);
    EXPECT(n == 1 && ids[0] == tokenizer_bos_id(spm), "empty text with BOS: %d tokens", n);
    free(ids);
    tokenizer_free(spm);
}

// --- tokenizer_write_hf round trip --------------------------------------------------------
static void round_trip(const char *path, const char *name) {
    Tokenizer *tok = load_or_fail(path);
    if (!tok) return;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tokenizer_%s", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp", name);
    fs_remove_tree(dir);
    EXPECT(fs_mkdir_p(dir) == 0, "mkdir %s", dir);
    EXPECT(tokenizer_write_hf(tok, dir) == 0, "write_hf: %s", err_msg());
    Tokenizer *back = load_or_fail(dir);
    if (back) {
        int differ = 0;
        for (int i = 0; i < corpus_count; i++) {
            for (int special = 0; special < 2; special++) {
                int *a, na, *b, nb;
                tokenizer_encode(tok, corpus[i].bytes, corpus[i].len, special, &a, &na);
                tokenizer_encode(back, corpus[i].bytes, corpus[i].len, special, &b, &nb);
                bool same = same_ids(a, na, b, nb);
                if (same) {
                    size_t la, lb;
                    char *ta = tokenizer_decode_len(tok, a, na, special, &la), *tb = tokenizer_decode_len(back, a, na, special, &lb);
                    same = la == lb && !memcmp(ta, tb, la);
                    free(ta), free(tb);
                }
                differ += !same;
                free(a), free(b);
            }
        }
        // A model saved by marlhf (an SFT model from a GGUF, a reward model from it) hands its
        // token ids to the others in PPO: the same ids, spelled the same.
        EXPECT(tokenizer_first_difference(tok, back) == -1, "%s: written tokenizer differs at id %d", name,
               tokenizer_first_difference(tok, back));
        printf("%s: written and reloaded, %d of %d encodings/decodes differ\n", name, differ, 2 * corpus_count);
        EXPECT(differ == 0, "%s: %d differ after tokenizer_write_hf", name, differ);
        EXPECT(tokenizer_bos_id(back) == tokenizer_bos_id(tok) && tokenizer_eos_id(back) == tokenizer_eos_id(tok) &&
                   tokenizer_pad_id(back) == tokenizer_pad_id(tok) && tokenizer_adds_bos(back) == tokenizer_adds_bos(tok),
               "%s: special ids differ", name);
        const char *t1 = tokenizer_chat_template(tok), *t2 = tokenizer_chat_template(back);
        EXPECT((!t1 && !t2) || (t1 && t2 && !strcmp(t1, t2)), "%s: chat template differs", name);
        tokenizer_free(back);
    }
    tokenizer_free(tok);
}

static void test_write_hf_round_trip(void) {
    round_trip(smollm2_path, "smollm2");
    round_trip(FIXTURES "/spm_small.gguf", "spm_gguf");
    round_trip(FIXTURES "/bytelevel_small", "bytelevel_small");
    round_trip(FIXTURES "/spm_small", "spm_small");
}

// tokenizer_first_difference / tokenizer_check_same_ids: PPO's and infer's guard against a
// reward model (critic, reference) of another tokenizer.
static void test_first_difference(void) {
    Tokenizer *smollm2 = load_or_fail(smollm2_path), *spm = load_or_fail(FIXTURES "/spm_small");
    if (!smollm2 || !spm) return;
    EXPECT(tokenizer_first_difference(smollm2, smollm2) == -1, "a tokenizer differs from itself");
    EXPECT(tokenizer_first_difference(smollm2, spm) == 0, "id 0 differs, got %d", tokenizer_first_difference(smollm2, spm));
    EXPECT(tokenizer_check_same_ids(smollm2, smollm2_path, "--reward-model", NULL) == 0, "%s", err_msg());
    EXPECT(tokenizer_check_same_ids(smollm2, FIXTURES "/spm_small", "--reward-model", "a hint") == -1 &&
               strstr(err_msg(), "(--reward-model): a hint") && strstr(err_msg(), FIXTURES "/spm_small"),
           "message '%s'", err_msg());
    tokenizer_free(smollm2), tokenizer_free(spm);
}

// --- damaged files -----------------------------------------------------------------------
// Writes `json` as tokenizer.json of a fresh folder and expects loading to fail with a
// message holding `want`.
static void expect_bad_tokenizer_json(const char *json, const char *want) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/bad_tokenizer", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
    fs_remove_tree(dir);
    fs_mkdir_p(dir);
    char *path = fs_join(dir, "tokenizer.json");
    fs_write_file_atomic(path, json, strlen(json));
    Tokenizer *tok = NULL;
    int rc = tokenizer_load(&tok, dir);
    EXPECT(rc == -1 && !tok, "loading %s should fail", json);
    EXPECT(strstr(err_msg(), want) && strstr(err_msg(), path), "message '%s' should name '%s' and the file", err_msg(), want);
    free(path);
}

static void test_bad_tokenizer_files(void) {
    const char *vocab = "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}";
    char json[1024];
    expect_bad_tokenizer_json("{\"model\": ", "invalid JSON");
    expect_bad_tokenizer_json("{\"version\": \"1.0\"}", "no \"model\"");
    expect_bad_tokenizer_json("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "model.type \"Unigram\"");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": [\"a c\"]}}", vocab);
    expect_bad_tokenizer_json(json, "model.merges[0] merges \"c\"");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": [\"b a\"]}}", vocab);
    expect_bad_tokenizer_json(json, "makes \"ba\"");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": [3]}}", vocab);
    expect_bad_tokenizer_json(json, "model.merges[0]");
    expect_bad_tokenizer_json("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "model.vocab[\"a\"]");
    expect_bad_tokenizer_json("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", "model.vocab");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": [], \"byte_fallback\": 1}}", vocab);
    expect_bad_tokenizer_json(json, "model.byte_fallback");
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
             "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}}", vocab);
    expect_bad_tokenizer_json(json, "pre_tokenizer");
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Whatever\"}}", vocab);
    expect_bad_tokenizer_json(json, "pre_tokenizer.type \"Whatever\"");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": []}, \"normalizer\": {\"type\": \"NFC\"}}", vocab);
    expect_bad_tokenizer_json(json, "normalizer.type \"NFC\"");
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s, \"merges\": []}, \"added_tokens\": [{\"id\": 5}]}", vocab);
    expect_bad_tokenizer_json(json, "added_tokens[0]");

    Tokenizer *tok = NULL;
    EXPECT(tokenizer_load(&tok, "tests/fixtures/gguf/tiny_llama_model.gguf") == -1, "a GGUF without tokenizer");
    EXPECT(strstr(err_msg(), "tokenizer.ggml.model") && strstr(err_msg(), "tiny_llama_model.gguf"), "message: %s", err_msg());
    EXPECT(tokenizer_load(&tok, "tests/fixtures/no_such_thing") == -1 && strstr(err_msg(), "does not exist"), "%s", err_msg());
}

// --- speed -------------------------------------------------------------------------------
static void test_encode_speed(void) {
    Tokenizer *tok = load_or_fail(smollm2_path);
    if (!tok) return;
    struct timespec t0, t1;
    long tokens = 0;
    size_t bytes = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int rep = 0; rep < 5; rep++)
        for (int i = 0; i < corpus_count; i++) {
            int *ids, n;
            tokenizer_encode(tok, corpus[i].bytes, corpus[i].len, false, &ids, &n);
            tokens += n;
            bytes += corpus[i].len;
            free(ids);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("smollm2 encode: %ld tokens (%.1f MB) in %.3f s = %.0f tokens/s (one thread)\n", tokens, (double)bytes / 1e6, s,
           (double)tokens / s);
    tokenizer_free(tok);
}

int main(void) {
    load_corpus();
    RUN(test_smollm2_gguf_matches_hf);
    RUN(test_bytelevel_small_matches_hf);
    RUN(test_spm_small_matches_hf);
    RUN(test_spm_gguf_matches_hf);
    RUN(test_stream_decode_equals_decode);
    RUN(test_stream_holds_incomplete_characters);
    RUN(test_added_tokens_and_bos);
    RUN(test_write_hf_round_trip);
    RUN(test_first_difference);
    RUN(test_bad_tokenizer_files);
    RUN(test_encode_speed);
    for (int i = 0; i < corpus_count; i++) free(corpus[i].bytes), free(corpus[i].text);
    free(corpus);
    TEST_EXIT();
}
