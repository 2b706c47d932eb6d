#include "tokenizer/utf8.h"

#include <string.h>

// The allowed range of the second byte after each lead byte (Unicode table 3-7); the
// remaining continuation bytes are always 80..BF.
static bool second_byte_ok(uint8_t lead, uint8_t b) {
    if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
    if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
    return b >= 0x80 && b <= 0xBF;
}

static int expected_len(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

// How many bytes of s form a prefix of a well-formed character (0 for a bad lead byte).
static size_t valid_prefix(const uint8_t *s, size_t n) {
    int need = expected_len(s[0]);
    if (need == 0) return 0;
    size_t k = 1;
    while (k < (size_t)need && k < n) {
        bool ok = k == 1 ? second_byte_ok(s[0], s[1]) : (s[k] >= 0x80 && s[k] <= 0xBF);
        if (!ok) break;
        k++;
    }
    return k;
}

int utf8_char_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    int need = expected_len(s[0]);
    if (need == 0 || (size_t)need > n) return 0;
    return valid_prefix(s, n) == (size_t)need ? need : 0;
}

size_t utf8_maximal_subpart(const uint8_t *s, size_t n) {
    size_t k = valid_prefix(s, n);
    return k ? k : 1;
}

bool utf8_is_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_char_len(p + i, n - i);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

void utf8_append_lossy(TokBuf *out, const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, run = 0; // run: start of the current stretch of good bytes
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_char_len(p + i, n - i);
        if (k) {
            i += (size_t)k;
            continue;
        }
        tokbuf_append(out, s + run, i - run);
        tokbuf_append(out, "\xEF\xBF\xBD", 3);
        i += utf8_maximal_subpart(p + i, n - i);
        run = i;
    }
    tokbuf_append(out, s + run, n - run);
}

bool utf8_incomplete_tail(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    // A character is at most 4 bytes: look for its lead byte among the last 3.
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = p[n - back];
        if (b >= 0x80 && b <= 0xBF) continue; // continuation byte: keep looking
        int need = expected_len(b);
        return need > (int)back && valid_prefix(p + n - back, back) == back;
    }
    return false;
}

int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t utf8_decode(const char *s, int *len) {
    const uint8_t *p = (const uint8_t *)s;
    if (p[0] < 0x80) {
        *len = 1;
        return p[0];
    }
    if (p[0] < 0xE0) {
        *len = 2;
        return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    }
    if (p[0] < 0xF0) {
        *len = 3;
        return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 |
           (p[3] & 0x3F);
}

// GPT-2's alphabet: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') spell themselves;
// the other 68 bytes, in order (00..20, 7F..A0, AD), get U+0100, U+0101, ...
uint32_t byte_level_char(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33 + (b - 0x7Fu);
    if (b == 0xAD) return 256u + 67;
    return b;
}

int byte_level_byte(uint32_t cp) {
    if (cp < 256) return (cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) ? -1 : (int)cp;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}
