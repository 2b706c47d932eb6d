// UTF-8 for the tokenizer: well-formedness as Unicode defines it (no overlong forms, no
// surrogates, nothing above U+10FFFF), and lossy conversion that replaces each maximal
// ill-formed subpart with U+FFFD -- the rule of Python's decode(errors='replace') and
// Rust's String::from_utf8_lossy, so our text equals what HF's tokenizers see.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/internal.h"

// Length (1-4) of the well-formed character at s[0..n), or 0 if ill-formed or cut short.
int utf8_char_len(const uint8_t *s, size_t n);
// For ill-formed input at s: how many bytes one U+FFFD replaces (the maximal subpart, >= 1).
size_t utf8_maximal_subpart(const uint8_t *s, size_t n);
bool utf8_is_valid(const char *s, size_t n);
// Appends s[0..n) to out with every maximal ill-formed subpart replaced by U+FFFD.
void utf8_append_lossy(TokBuf *out, const char *s, size_t n);
// True if s ends with a proper prefix of a well-formed character (more bytes could
// complete it).
bool utf8_incomplete_tail(const char *s, size_t n);
// Encodes cp (<= U+10FFFF) into out (4 bytes of room); returns the length.
int utf8_encode(uint32_t cp, char *out);
// Decodes the character at s (well-formed input); *len gets its length.
uint32_t utf8_decode(const char *s, int *len);
