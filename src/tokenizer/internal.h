// The inside of a Tokenizer, shared by the files of src/tokenizer/ only.
//
// The pipeline mirrors Hugging Face `tokenizers` step by step, because matching its ids
// exactly is the point:
//   1. added tokens are cut out of the raw text (longest match first, lstrip/rstrip/
//      single_word honoured) -- those with normalized=false;
//   2. every other piece is normalized (Prepend, Replace, Strip), and added tokens with
//      normalized=true are cut out of the normalized pieces;
//   3. the pre-tokenizer steps (flattened from a Sequence) split pieces into words and
//      rewrite them (ByteLevel's byte alphabet, Metaspace's "▁");
//   4. BPE turns each word into ids (merges by rank, byte fallback, unknown token);
//   5. the post-processor's template adds special tokens (BOS) when asked.
// Decoding runs the decoder steps over the token strings, then transformers' clean-up.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/strmap.h"
#include "tokenizer/tokenizer.h"

// --- small containers ------------------------------------------------------------------
typedef struct {
    char *data;
    size_t len, cap;
} TokBuf;
void tokbuf_reserve(TokBuf *b, size_t extra);
void tokbuf_append(TokBuf *b, const void *data, size_t n);
void tokbuf_putc(TokBuf *b, char c);
// NUL-terminates (not counted in len) and hands the bytes over; b is empty afterwards.
char *tokbuf_take(TokBuf *b, size_t *len);

typedef struct {
    int *data;
    int len, cap;
} IdVec;
void idvec_push(IdVec *v, int id);

// --- regexes ---------------------------------------------------------------------------
// A pattern of tokenizer.json (Oniguruma syntax, as `tokenizers` compiles it) or of a
// known pre-tokenizer, compiled with PCRE2 (UTF + UCP, JIT where available). `source`
// keeps the text as given, so tokenizer_write_hf() can write it back.
typedef struct {
    pcre2_code *code;
    char *source;
    bool is_regex; // false: a literal string (Split's {"String": ...})
} TokRegex;
// Returns 0, or -1 with err_set() naming `file` and `field`.
int tok_regex_compile(TokRegex *re, const char *source, bool is_regex, const char *file, const char *field);
void tok_regex_free(TokRegex *re);
// Next match of `re` in subject[start, len) (Rust's find_iter rules: an empty match right
// after the previous match is skipped). Returns false when there is none.
bool tok_regex_find(const TokRegex *re, pcre2_match_data *md, const char *subject, size_t len, size_t start,
                    size_t *match_start, size_t *match_end);

// The GPT-2 pre-tokenizer regex of ByteLevel(use_regex=true).
extern const char *const TOK_GPT2_PATTERN;
extern const char *const TOK_LLAMA3_PATTERN;
extern const char *const TOK_QWEN2_PATTERN;

// --- normalizer ------------------------------------------------------------------------
typedef enum { NORM_PREPEND, NORM_REPLACE, NORM_STRIP } NormKind;
typedef struct {
    NormKind kind;
    char *text;       // Prepend: the prefix; Replace: the content
    TokRegex pattern; // Replace
    bool strip_left, strip_right;
} NormStep;

// --- pre-tokenizer ---------------------------------------------------------------------
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS,
} SplitBehavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } PrependScheme;
typedef enum { PRE_BYTE_LEVEL, PRE_SPLIT, PRE_DIGITS, PRE_METASPACE } PreKind;
typedef struct {
    PreKind kind;
    TokRegex regex; // Split's pattern; ByteLevel's GPT-2 regex (use_regex); Digits' \p{N}
    SplitBehavior behavior;
    bool invert;
    bool add_prefix_space, use_regex, trim_offsets; // ByteLevel
    bool individual_digits;                          // Digits
    char *replacement;                               // Metaspace ("▁")
    PrependScheme prepend_scheme;                    // Metaspace
    bool split;                                      // Metaspace
} PreStep;

// --- decoder ---------------------------------------------------------------------------
typedef enum { DEC_BYTE_LEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP } DecKind;
typedef struct {
    DecKind kind;
    char *pattern, *content;      // Replace (a literal pattern)
    char *replacement;            // Metaspace
    PrependScheme prepend_scheme; // Metaspace
    bool metaspace_split;         // Metaspace (only kept for writing back)
    char *strip_content;          // Strip: one character
    int strip_start, strip_stop;  // Strip
} DecStep;

// --- added tokens ----------------------------------------------------------------------
typedef struct {
    char *content;
    int id;
    bool special, single_word, lstrip, rstrip, normalized;
    char *normalized_content; // the content after the normalizer, when normalized and it differs
} AddedToken;

// A byte trie over the added tokens' contents, for leftmost-longest matching.
typedef struct {
    int *first_child, *next_sibling, *token; // token: index into added[], or -1
    uint8_t *byte;
    int count, cap;
    bool first_byte[256];
} AddedTrie;
void added_trie_build(AddedTrie *trie, const AddedToken *added, int n_added, bool normalized);
void added_trie_free(AddedTrie *trie);
// The added token (index into added[]) of the longest content starting at text[pos], or -1;
// *end gets the end of the match.
int added_trie_longest(const AddedTrie *trie, const char *text, size_t len, size_t pos, size_t *end);

// --- BPE model -------------------------------------------------------------------------
typedef struct {
    int n_ids;          // 1 + the largest id of the vocabulary
    char **pieces;      // [n_ids] token strings (NULL for ids the vocabulary skips)
    int *piece_len;     // [n_ids]
    StrMap vocab;       // piece -> id
    PairMap merges;     // (left id, right id) -> (rank, merged id)
    int n_merges;
    int *merge_pairs;   // [2 * n_merges]: left, right ids in rank order (for writing back)
    int unk_id;         // -1: no unknown token (unknown characters are dropped, as HF does)
    bool byte_fallback, fuse_unk, ignore_merges;
    int byte_ids[256];  // id of "<0xNN>", or -1
    int *char_ids;      // [TOK_CHAR_IDS] id of the token spelled by one code point, -1 none
} BpeModel;
#define TOK_CHAR_IDS 0x800

// Builds vocab-dependent tables (byte_ids, char_ids); call after pieces/vocab are filled.
void bpe_finish(BpeModel *bpe);
void bpe_free(BpeModel *bpe);
// Adds the merge (left, right) at the next rank. Returns -1 (err_set naming file, field)
// if either side or their concatenation is not in the vocabulary.
int bpe_add_merge(BpeModel *bpe, const char *left, size_t left_len, const char *right, size_t right_len,
                  const char *file, const char *field);

// Scratch memory of one encode() call, so that a Tokenizer can be shared by threads.
typedef struct {
    pcre2_match_data *md;
    TokBuf arena;   // text of pieces made by normalizers and pre-tokenizers
    struct Piece *pieces, *next_pieces;
    int n_pieces, cap_pieces, n_next, cap_next;
    struct BpeSymbol *symbols;
    int cap_symbols;
    struct BpeMerge *heap;
    int cap_heap;
} EncodeScratch;
// Appends the ids of one pre-tokenized word.
void bpe_encode_word(const BpeModel *bpe, EncodeScratch *scratch, const char *word, size_t len, IdVec *out);

// --- the tokenizer ---------------------------------------------------------------------
struct Tokenizer {
    char *path; // for messages
    BpeModel bpe;
    AddedToken *added;
    int n_added;
    StrMap added_map; // content -> index into added[]
    int *added_index; // [vocab_size] index into added[] of each id, or -1
    AddedTrie raw_trie, norm_trie;
    bool has_normalizer;
    NormStep *norm;
    int n_norm;
    bool has_pre_tokenizer;
    PreStep *pre;
    int n_pre;
    bool has_decoder;
    DecStep *dec;
    int n_dec;
    // Post-processor (single-sequence template): ids before and after the text.
    bool has_post_processor;
    int *post_prefix, *post_suffix;
    int n_post_prefix, n_post_suffix;

    int vocab_size;
    uint8_t *special;     // [vocab_size] 1 for special added tokens
    int bos_id, eos_id, pad_id, unk_id;
    bool add_bos_token;   // tokenizer_config / GGUF flag (also in the template when set)
    bool add_eos_token;
    bool clean_up;        // transformers' clean_up_tokenization applies to decode()
    bool clean_up_requested; // clean_up_tokenization_spaces as the config says (written back)
    char *chat_template;
    bool chat_rendered;   // tokenizer_set_chat_rendered: add_special is ignored
    char **token_text;    // [vocab_size] tokenizer_token_string()
};

// Fills what loading leaves derived: added tries, special flags, vocab size, token texts.
// Returns -1 with err_set() for inconsistent ids.
int tokenizer_finish(Tokenizer *tok);
// Runs the normalizer steps on one piece (into `out`).
void tokenizer_normalize(const Tokenizer *tok, EncodeScratch *scratch, const char *text, size_t len, TokBuf *out);
// Runs the pre-tokenizer on one normalized piece and BPE on each word it yields.
// `at_origin`: the piece starts at offset 0 of the original text (Metaspace "first").
void tokenizer_pre_tokenize_and_encode(const Tokenizer *tok, EncodeScratch *scratch, const char *text,
                                       size_t len, bool at_origin, IdVec *out);
void encode_scratch_free(EncodeScratch *scratch);

// Decodes token strings with the decoder steps. *incomplete_tail: the text ends in bytes
// that may still become a character (for the stream decoder).
char *tokenizer_decode_pieces(const Tokenizer *tok, const int *ids, int count, bool skip_special,
                              size_t *len, bool *incomplete_tail, bool *ends_in_byte_token);

// Loaders (load_hf.c, load_gguf.c). They fill `tok` and call tokenizer_finish().
int tokenizer_load_hf(Tokenizer *tok, const char *dir);
int tokenizer_load_gguf(Tokenizer *tok, const char *path);

// GPT-2's byte-to-unicode alphabet: the code point that spells each byte, and back.
uint32_t byte_level_char(uint8_t byte);
int byte_level_byte(uint32_t cp); // -1 if cp is not in the alphabet
