// The gold reward of the Jane Austen task (docs/austen_task.md): a sentiment lexicon score,
// the same function as gold() in tools/build_austen_task.py, bit for bit
// (tests/test_lexicon.c checks it on tests/fixtures/lexicon/scores.jsonl).
//
// The lexicon file (data/austen/lexicon.tsv, AFINN-165 adapted) is read strictly:
//   - lines end with '\n' (a '\r' is not stripped, so a CRLF file is refused);
//   - an empty line, or one starting with '#', is skipped;
//   - any other line is PHRASE '\t' VALENCE, with nothing else on the line:
//     PHRASE  = 1 to LEXICON_MAX_PHRASE_WORDS words joined by single spaces, each word
//               [a-z0-9] or [a-z0-9][a-z0-9']*[a-z0-9] (so exactly what the tokenizer
//               below can produce: lower-case ASCII, no leading or trailing apostrophe);
//     VALENCE = -?[0-9]+(\.[0-9]+)?  (read with strtod);
//   - no phrase twice, and at least one phrase in the file.
// A file that breaks a rule is a user error naming file:line; lexicon_load returns -1.
//
// The score of a text (bytes, UTF-8 expected but any bytes are accepted):
//   1. each U+2018 or U+2019 (bytes E2 80 98 / E2 80 99) is read as an apostrophe ';
//   2. ASCII A-Z are lower-cased (other bytes are left as they are);
//   3. words are the maximal runs of [a-z0-9']; leading and trailing apostrophes are
//      removed from each run and a run left empty is not a word. Everything else --
//      spaces, punctuation, hyphens, underscores, any byte >= 0x80 -- separates words.
//      N = the number of words;
//   4. phrases are matched from the first word on: at word i the longest phrase of the
//      lexicon equal to words i..i+k-1 (joined by single spaces, k <= the longest phrase
//      of the file) adds its valence to S and the scan moves to word i+k; if none
//      matches, to word i+1. S is summed in that order, in double, from 0;
//   5. score = 0 if N == 0, else S / sqrt(N) clipped to [-LEXICON_CLIP, LEXICON_CLIP].
// There is no negation handling beyond the lexicon's own phrases ("not good" -2).
#pragma once
#include <stddef.h>

#define LEXICON_CLIP 3.0
#define LEXICON_MAX_PHRASE_WORDS 8

typedef struct Lexicon Lexicon;

// Reads a lexicon file. 0 with *out set (free with lexicon_free), or -1 (err_msg names
// file:line) with *out NULL.
int lexicon_load(Lexicon **out, const char *tsv_path);
// The gold score of a NUL-terminated text (steps 1-5 above).
double lexicon_score(const Lexicon *lex, const char *text);
// The same for len bytes (which may include NUL bytes: a NUL separates words).
double lexicon_score_n(const Lexicon *lex, const char *text, size_t len);
// Steps 1-4 only: the sum S of matched valences and the word count N.
void lexicon_parts(const Lexicon *lex, const char *text, size_t len, double *sum, long *words);
// Number of phrases in the lexicon.
long lexicon_size(const Lexicon *lex);
void lexicon_free(Lexicon *lex);
