// Regexes of tokenizer.json, compiled with PCRE2.
//
// `tokenizers` compiles its patterns with Oniguruma (Ruby syntax). PCRE2 with UTF + UCP
// reads the same patterns the same way, with two differences that matter for the patterns
// tokenizers use, both fixed here by rewriting the pattern before compiling it:
//   - \s: PCRE2's counts U+180E (MONGOLIAN VOWEL SEPARATOR) as white space, Oniguruma's
//     (Unicode White_Space) does not: \s becomes an explicit class of White_Space;
//   - ^ and $ are line anchors in Ruby syntax: compiled with PCRE2_MULTILINE.
// Literal patterns (Split's {"String": ...}) are escaped.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

const char *const TOK_GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const TOK_LLAMA3_PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const TOK_QWEN2_PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Unicode White_Space (what Oniguruma's \s matches), as members of a character class.
static const char white_space_members[] =
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

static char *rewrite_pattern(const char *src) {
    TokBuf out = {0};
    bool in_class = false;
    size_t n = strlen(src);
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            if (e == 'Q') { // \Q...\E: copy verbatim
                const char *end = strstr(src + i + 2, "\\E");
                size_t stop = end ? (size_t)(end - src) + 2 : n;
                tokbuf_append(&out, src + i, stop - i);
                i = stop - 1;
                continue;
            }
            if (e == 's' && in_class) {
                tokbuf_append(&out, white_space_members, sizeof white_space_members - 1);
            } else if (e == 's' || (e == 'S' && !in_class)) {
                tokbuf_append(&out, e == 's' ? "[" : "[^", e == 's' ? 1 : 2);
                tokbuf_append(&out, white_space_members, sizeof white_space_members - 1);
                tokbuf_putc(&out, ']');
            } else {
                tokbuf_putc(&out, c);
                tokbuf_putc(&out, e);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tokbuf_putc(&out, c);
            // A ']' right after '[' or '[^' is a literal member.
            if (i + 1 < n && src[i + 1] == '^') tokbuf_putc(&out, src[++i]);
            if (i + 1 < n && src[i + 1] == ']') tokbuf_putc(&out, src[++i]);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') { // [:alpha:]
            const char *end = strstr(src + i + 2, ":]");
            size_t stop = end ? (size_t)(end - src) + 2 : n;
            tokbuf_append(&out, src + i, stop - i);
            i = stop - 1;
            continue;
        }
        if (in_class && c == ']') in_class = false;
        tokbuf_putc(&out, c);
    }
    return tokbuf_take(&out, NULL);
}

static char *escape_literal(const char *src) {
    TokBuf out = {0};
    for (const char *p = src; *p; p++) {
        unsigned char c = (unsigned char)*p;
        bool plain = c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!plain) tokbuf_putc(&out, '\\');
        tokbuf_putc(&out, (char)c);
    }
    return tokbuf_take(&out, NULL);
}

int tok_regex_compile(TokRegex *re, const char *source, bool is_regex, const char *file, const char *field) {
    memset(re, 0, sizeof *re);
    char *pattern = is_regex ? rewrite_pattern(source) : escape_literal(source);
    int code;
    PCRE2_SIZE offset;
    re->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code, &offset, NULL);
    free(pattern);
    if (!re->code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(code, message, sizeof message);
        return err_set("invalid regex in %s: %s at offset %zu of \"%s\" (%s)", field, (char *)message,
                       (size_t)offset, source, file);
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); // the interpreter remains if JIT is absent
    re->source = xstrdup(source);
    re->is_regex = is_regex;
    return 0;
}

void tok_regex_free(TokRegex *re) {
    if (re->code) pcre2_code_free(re->code);
    free(re->source);
    memset(re, 0, sizeof *re);
}

bool tok_regex_find(const TokRegex *re, pcre2_match_data *md, const char *subject, size_t len, size_t start,
                    size_t *match_start, size_t *match_end) {
    int rc = pcre2_match(re->code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) // a long input outgrew the JIT stack: interpret
        rc = pcre2_match(re->code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    CHECK(rc >= 0, "PCRE2 match failed with error %d on pattern \"%s\"", rc, re->source);
    PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(md);
    *match_start = ovector[0];
    *match_end = ovector[1];
    return true;
}
