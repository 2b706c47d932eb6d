// Tokenizers: text <-> token ids, as Hugging Face `tokenizers` does it.
//
// Two model kinds, both BPE:
//   - byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2): the text's bytes are spelled in
//     GPT-2's byte-to-unicode alphabet ("Ġ" for a space), split by the pre-tokenizer's
//     regex (PCRE2), then merged by rank;
//   - sentencepiece-style BPE (Llama-2, Gemma, Mistral): "▁" for spaces (normalizer
//     or Metaspace pre-tokenizer), merges by rank, <0xNN> byte-fallback tokens, an
//     unknown token.
// Both load from a Hugging Face folder (tokenizer.json + tokenizer_config.json) or from
// a GGUF file's metadata (see tokenizer/load_gguf.c for how llama.cpp's keys map).
//
// Text is bytes. encode() replaces every ill-formed UTF-8 sequence in its input with
// U+FFFD first (maximal subparts, as Python's bytes.decode('utf-8', 'replace') and Rust's
// String::from_utf8_lossy do), then tokenizes that string exactly as HF does: the ids of
// encode(bytes) are HF's ids of bytes.decode('utf-8', 'replace'). decode() returns valid
// UTF-8 (HF's decode output), NUL-terminated; a "\0" inside the text is kept.
//
// A Tokenizer is immutable after loading: encode/decode may run on many threads at once.
// Every function that can fail on user data returns 0, or -1 with err_set() naming the
// file and the field at fault (see core/check.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct Tokenizer Tokenizer;

// `path` is a Hugging Face folder (tokenizer.json, optional tokenizer_config.json) or a
// .gguf file (recognised by its magic bytes).
int tokenizer_load(Tokenizer **out, const char *path);
void tokenizer_free(Tokenizer *tok);

// Tokenizes `len` bytes of `text`. With add_special, the special tokens HF adds with
// add_special_tokens=True are added (the post-processor's template: in practice the BOS
// of Llama-style tokenizers; nothing for SmolLM2, whose template adds nothing). *ids is
// xmalloc'd (free() it; never NULL, even for zero tokens). Returns 0: no input makes it
// fail (the int is there so that callers can treat it like every other step).
int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool add_special, int **ids,
                     int *count);
// For a command whose prompts a chat template rendered (conversational datasets,
// data/chat_data.h): the template already wrote the special tokens it wants (Llama 3's
// BOS), and transformers' users, TRL included, tokenize such text with
// add_special_tokens=False. While `rendered` is set, tokenizer_encode ignores add_special,
// so the trainers' prompt tokenization (sft.h's tokenize_example, PPO's prompts) adds no
// second BOS. Set it before the tokenizer is shared between threads.
void tokenizer_set_chat_rendered(Tokenizer *tok, bool rendered);

// HF's tokenizer.decode(ids, skip_special_tokens=...), including transformers'
// clean_up_tokenization where the tokenizer_config asks for it and transformers applies it.
// Ids outside the vocabulary are skipped (HF skips ids it has no token for).
// Returns an xmalloc'd, NUL-terminated string (free() it).
char *tokenizer_decode(const Tokenizer *tok, const int *ids, int count, bool skip_special);
// The same, with the length (the text may hold NUL bytes when the tokens do).
char *tokenizer_decode_len(const Tokenizer *tok, const int *ids, int count, bool skip_special, size_t *len);

// Streaming decode, for generation: push ids one at a time and get the text each one
// completes. The pieces, concatenated with the flushed rest, equal tokenizer_decode() of
// all the ids pushed; a piece never ends inside a UTF-8 character (incomplete bytes are
// held back until the next id completes them, or become U+FFFD as in decode()).
typedef struct TokenizerStream TokenizerStream;
TokenizerStream *tokenizer_stream_new(const Tokenizer *tok, bool skip_special);
// *piece: the newly completed text (xmalloc'd, NUL-terminated, possibly ""; free() it).
// Returns 0 (as tokenizer_encode, it cannot fail).
int tokenizer_stream_push(TokenizerStream *stream, int id, char **piece);
// The text still held back (xmalloc'd, possibly ""); the stream then starts afresh.
int tokenizer_stream_flush(TokenizerStream *stream, char **piece);
// The same, with the piece's length (a generated "\0" is text too).
int tokenizer_stream_push_len(TokenizerStream *stream, int id, char **piece, size_t *len);
int tokenizer_stream_flush_len(TokenizerStream *stream, char **piece, size_t *len);
void tokenizer_stream_free(TokenizerStream *stream);

// --- accessors ---------------------------------------------------------------------
// Number of ids (the model's vocabulary plus added tokens): valid ids are [0, size).
int tokenizer_vocab_size(const Tokenizer *tok);
int tokenizer_bos_id(const Tokenizer *tok); // -1 if none
int tokenizer_eos_id(const Tokenizer *tok);
int tokenizer_pad_id(const Tokenizer *tok);
int tokenizer_unk_id(const Tokenizer *tok);
// The token's string as the vocabulary spells it ("Ġthe" for a byte-level " the",
// "▁the", "<0x0A>", "<|im_end|>"), or NULL for an id without one. Owned by the tokenizer.
const char *tokenizer_id_to_piece(const Tokenizer *tok, int id);
// The id of the vocabulary (or added) token spelled `piece`, or -1.
int tokenizer_piece_to_id(const Tokenizer *tok, const char *piece);
// The raw bytes a token adds to a text in the middle of it (byte-level tokens' bytes,
// "▁" as a space, <0xNN> as its byte, an added token's content; possibly not UTF-8), for
// constrained decoding (gen/token_mask.h); *len their count. NULL for special added
// tokens (they are no text) and ids without a token. xmalloc'd: free() it.
char *tokenizer_token_bytes(const Tokenizer *tok, int id, size_t *len);
// True for the added tokens marked special (skipped by decode with skip_special).
bool tokenizer_is_special(const Tokenizer *tok, int id);
// The raw chat template (Jinja) of tokenizer_config.json / tokenizer.chat_template, or NULL.
const char *tokenizer_chat_template(const Tokenizer *tok);
// The text of a token as it appears in text (for bos/eos in chat templates): the added
// token's content, or the decoded vocabulary token. NULL for an id without a token.
const char *tokenizer_token_string(const Tokenizer *tok, int id);
// -1 when a and b have the same ids spelled the same (tokenizer_id_to_piece), else the
// first id where they differ (the smaller size when one vocabulary only extends the other).
// Token ids pass between models only when this is -1 (PPO's reward model, critic and
// reference are handed the actor's ids).
int tokenizer_first_difference(const Tokenizer *a, const Tokenizer *b);
// Loads the tokenizer of the model at `path` (given by `option`, e.g. "--reward-model") and
// checks that it is `tok` (tokenizer_first_difference): 0, or -1 with err_set() naming the
// first differing id, the option and the path, then `hint` (what to do instead; may be NULL).
int tokenizer_check_same_ids(const Tokenizer *tok, const char *path, const char *option, const char *hint);
// Whether the tokenizer's config asks for a BOS at the start of each sequence
// (add_bos_token, or a post-processor that adds one).
bool tokenizer_adds_bos(const Tokenizer *tok);

// Writes tokenizer.json and tokenizer_config.json (bos/eos/pad/unk, add_bos_token,
// chat_template) into the existing folder `dir`, each atomically, such that Hugging Face
// `tokenizers`/transformers loading the folder encode and decode as this tokenizer does.
int tokenizer_write_hf(const Tokenizer *tok, const char *dir);
// Adds the tokenizer to a GGUF file being written, as llama.cpp's tokenizer.ggml.* keys
// with vocab_size tokens (rows no token uses are "[PAD<id>]"). Byte-level BPE tokenizers
// only (tokenizer/write_gguf.c); returns -1 with err_set() for others.
struct GgufWriter;
int tokenizer_write_gguf(const Tokenizer *tok, struct GgufWriter *w, int vocab_size);
