// A tokenizer from GGUF metadata (llama.cpp's keys), built the way transformers builds
// it when it loads the same file (integrations/gguf/gguf_tokenizer_mapping.py), so that
// both give the same ids:
//   tokenizer.ggml.model "gpt2"  -> byte-level BPE: tokens not spelled in GPT-2's alphabet
//       are respelled in it, merges "left right"; the pre-tokenizer by tokenizer.ggml.pre:
//         "default", "gpt-2", "gpt2"                 ByteLevel with the GPT-2 regex
//         "smollm", "starcoder", "refact"            Digits(individual) + ByteLevel, as
//             llama.cpp splits these (and their tokenizer.json do); for their vocabularies,
//             which hold no merge touching a digit, the same ids as the plain GPT-2 regex
//             transformers' GGUF converter uses, but for whitespace before a digit: "a\n\n4"
//             is "a" "\n\n" "4" here and in llama.cpp (checked, SmolLM2's file), and "a" "\n"
//             "\n" "4" in the converter, whose regex keeps the last space for the next word
//         "llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3"
//                                                    Llama-3's Split regex + ByteLevel
//             (and ignore_merges, as Llama-3's tokenizer.json and llama.cpp have it)
//         "qwen2", "deepseek-r1-qwen"                Qwen2's Split regex + ByteLevel
//       any other value is an error naming the key.
//   tokenizer.ggml.model "llama" -> sentencepiece-style BPE: Metaspace ("▁", prepended
//       at the start of the text when add_space_prefix, default true), byte fallback,
//       decoder Replace + ByteFallback + Fuse (+ Strip of the leading space). SPM files have
//       no merges but a score per token: the merges are derived from the scores as
//       transformers' generate_merges does -- every split of every token into two tokens,
//       best score first (then longer left part, longer right part) -- which makes BPE by
//       rank SentencePiece's highest-score-first merging. Gemma files rank by position
//       instead and spell runs of spaces with ' ' (respelled '▁').
// Tokens of type CONTROL (3) are special added tokens, USER_DEFINED (4) plain added
// tokens. BOS is added when tokenizer.ggml.add_bos_token says so (default true for
// "llama", false otherwise), EOS when add_eos_token does.
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

enum { TOKEN_TYPE_CONTROL = 3, TOKEN_TYPE_USER_DEFINED = 4 };

static bool spelled_in_byte_alphabet(const char *s, size_t n) {
    if (!utf8_is_valid(s, n)) return false;
    for (size_t k = 0; k < n;) {
        int len;
        if (byte_level_byte(utf8_decode(s + k, &len)) < 0) return false;
        k += (size_t)len;
    }
    return true;
}

static char *respell_bytes(const char *s, size_t n, size_t *out_len) {
    TokBuf b = {0};
    for (size_t k = 0; k < n; k++) {
        char c[4];
        tokbuf_append(&b, c, (size_t)utf8_encode(byte_level_char((uint8_t)s[k]), c));
    }
    return tokbuf_take(&b, out_len);
}

static bool all_spaces(const char *s, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (s[k] != ' ') return false;
    return true;
}

static void set_piece(BpeModel *bpe, int id, char *text, size_t len) {
    bpe->pieces[id] = text;
    bpe->piece_len[id] = (int)len;
}

static int add_pre_step(Tokenizer *tok, PreKind kind, const char *pattern, const char *file, const char *field) {
    tok->pre = xrealloc(tok->pre, (size_t)(tok->n_pre + 1) * sizeof *tok->pre);
    PreStep *step = &tok->pre[tok->n_pre];
    memset(step, 0, sizeof *step);
    step->kind = kind;
    step->behavior = SPLIT_ISOLATED;
    step->individual_digits = kind == PRE_DIGITS;
    step->use_regex = kind == PRE_BYTE_LEVEL && pattern != NULL;
    step->trim_offsets = true;
    if (tok_regex_compile(&step->regex, pattern ? pattern : TOK_GPT2_PATTERN, true, file, field) != 0) return -1;
    tok->n_pre++;
    return 0;
}

static int gpt2_pre_tokenizer(Tokenizer *tok, const char *pre, const char *file) {
    const char *field = "tokenizer.ggml.pre";
    tok->has_pre_tokenizer = true;
    static const char *const gpt2[] = {"default", "gpt-2", "gpt2"};
    static const char *const digits[] = {"smollm", "starcoder", "refact"};
    static const char *const llama3[] = {"llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3"};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen"};
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(pre, gpt2[i])) return add_pre_step(tok, PRE_BYTE_LEVEL, TOK_GPT2_PATTERN, file, field);
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(pre, digits[i]))
            return add_pre_step(tok, PRE_DIGITS, "\\p{N}", file, field) ||
                   add_pre_step(tok, PRE_BYTE_LEVEL, TOK_GPT2_PATTERN, file, field);
    for (size_t i = 0; i < 6; i++)
        if (!strcmp(pre, llama3[i])) {
            tok->bpe.ignore_merges = true;
            return add_pre_step(tok, PRE_SPLIT, TOK_LLAMA3_PATTERN, file, field) ||
                   add_pre_step(tok, PRE_BYTE_LEVEL, NULL, file, field);
        }
    for (size_t i = 0; i < 2; i++)
        if (!strcmp(pre, qwen2[i]))
            return add_pre_step(tok, PRE_SPLIT, TOK_QWEN2_PATTERN, file, field) ||
                   add_pre_step(tok, PRE_BYTE_LEVEL, NULL, file, field);
    return err_set("%s \"%s\" is not a pre-tokenizer marlhf knows (default, gpt-2, smollm, starcoder, refact, "
                   "llama-bpe, llama3, qwen2, ...) (%s)", field, pre, file);
}

// --- merges from scores (transformers' generate_merges) ----------------------------------
typedef struct {
    int left, right; // ids
    double score;
    int len_left, len_right; // in code points
    long order;
} ScoredMerge;

static int compare_merges(const void *pa, const void *pb) {
    const ScoredMerge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->len_left != b->len_left) return a->len_left > b->len_left ? -1 : 1;
    if (a->len_right != b->len_right) return a->len_right > b->len_right ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

static int compare_local(const void *pa, const void *pb) {
    const ScoredMerge *a = pa, *b = pb;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return a->right < b->right ? -1 : a->right > b->right;
}

static int count_chars(const char *s, size_t n) {
    int c = 0;
    for (size_t k = 0; k < n; k++) c += ((uint8_t)s[k] & 0xC0) != 0x80;
    return c;
}

static int derive_merges(Tokenizer *tok, const double *scores, const char *file) {
    BpeModel *bpe = &tok->bpe;
    ScoredMerge *all = NULL;
    long n = 0, cap = 0;
    for (int id = 0; id < bpe->n_ids; id++) {
        const char *s = bpe->pieces[id];
        int len = bpe->piece_len[id];
        if (strmap_get(&bpe->vocab, s, (size_t)len) != id) continue; // a repeated token: its last id counts
        long first = n;
        for (int k = 1; k < len; k++) {
            if (((uint8_t)s[k] & 0xC0) == 0x80) continue; // split between characters only
            int l = strmap_get(&bpe->vocab, s, (size_t)k), r = strmap_get(&bpe->vocab, s + k, (size_t)(len - k));
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 4096;
                all = xrealloc(all, (size_t)cap * sizeof *all);
            }
            all[n++] = (ScoredMerge){l, r, scores[id], count_chars(s, (size_t)k), count_chars(s + k, (size_t)(len - k)), 0};
        }
        if (n > first) qsort(all + first, (size_t)(n - first), sizeof *all, compare_local);
    }
    for (long i = 0; i < n; i++) all[i].order = i;
    if (n > 0) qsort(all, (size_t)n, sizeof *all, compare_merges);
    int rc = 0;
    for (long i = 0; rc == 0 && i < n; i++)
        rc = bpe_add_merge(bpe, bpe->pieces[all[i].left], (size_t)bpe->piece_len[all[i].left], bpe->pieces[all[i].right],
                           (size_t)bpe->piece_len[all[i].right], file, "tokenizer.ggml.scores");
    free(all);
    return rc;
}

static int optional_id(const GgufFile *f, const char *key, int *out) {
    if (!gguf_find(f, key)) return 0;
    uint32_t v;
    if (gguf_get_u32(f, key, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

static int optional_bool(const GgufFile *f, const char *key, bool *out) {
    return gguf_find(f, key) ? gguf_get_bool(f, key, out) : 0;
}

static int load(Tokenizer *tok, const GgufFile *f, const char *file) {
    char *model = NULL, *pre = NULL, *arch = NULL;
    const GgufValue *tokens, *types = NULL, *merges = NULL, *scores = NULL;
    if (gguf_get_string(f, "tokenizer.ggml.model", &model) != 0) return -1;
    bool byte_level = !strcmp(model, "gpt2"), spm = !strcmp(model, "llama");
    if (!byte_level && !spm) {
        int rc = err_set("tokenizer.ggml.model \"%s\" is not supported (gpt2, llama are) (%s)", model, file);
        free(model);
        return rc;
    }
    free(model);
    if (gguf_find(f, "general.architecture") && gguf_get_string(f, "general.architecture", &arch) != 0) return -1;
    bool gemma = arch && !strncmp(arch, "gemma", 5), phi3 = arch && !strcmp(arch, "phi3");
    free(arch);
    if (gguf_get_string_array(f, "tokenizer.ggml.tokens", &tokens) != 0) return -1;
    uint64_t n = gguf_array_count(tokens);
    if (n == 0 || n > (1u << 30)) return err_set("tokenizer.ggml.tokens has %llu tokens (%s)", (unsigned long long)n, file);
    if (gguf_find(f, "tokenizer.ggml.token_type")) {
        if (gguf_get_int_array(f, "tokenizer.ggml.token_type", &types) != 0) return -1;
        if (gguf_array_count(types) != n)
            return err_set("tokenizer.ggml.token_type has %llu entries for %llu tokens (%s)",
                           (unsigned long long)gguf_array_count(types), (unsigned long long)n, file);
    }
    if (gguf_find(f, "tokenizer.ggml.merges") && gguf_get_string_array(f, "tokenizer.ggml.merges", &merges) != 0) return -1;
    if (byte_level && !merges) return err_set("tokenizer.ggml.merges is missing (%s)", file);
    if (spm && !merges && !gemma) {
        if (gguf_get_float_array(f, "tokenizer.ggml.scores", &scores) != 0) return -1;
        if (gguf_array_count(scores) != n) return err_set("tokenizer.ggml.scores has %llu entries for %llu tokens (%s)",
                                                           (unsigned long long)gguf_array_count(scores), (unsigned long long)n, file);
    }

    BpeModel *bpe = &tok->bpe;
    bpe->n_ids = (int)n;
    bpe->pieces = xcalloc(n, sizeof(char *));
    bpe->piece_len = xcalloc(n, sizeof(int));
    for (uint64_t i = 0; i < n; i++) {
        GgufString s = gguf_array_string(tokens, i);
        size_t len = s.len;
        char *text;
        if (byte_level && !spelled_in_byte_alphabet(s.ptr, s.len)) {
            text = respell_bytes(s.ptr, s.len, &len);
        } else if (gemma && len >= 2 && all_spaces(s.ptr, len)) {
            TokBuf b = {0};
            for (size_t k = 0; k < len; k++) tokbuf_append(&b, "\xE2\x96\x81", 3);
            text = tokbuf_take(&b, &len);
        } else {
            text = xmalloc(len + 1);
            memcpy(text, s.ptr, len);
            text[len] = '\0';
        }
        set_piece(bpe, (int)i, text, len);
    }
    for (uint64_t i = 0; i < n; i++) strmap_put(&bpe->vocab, bpe->pieces[i], (size_t)bpe->piece_len[i], (int)i);

    int rc = 0;
    if (merges) {
        for (uint64_t i = 0; rc == 0 && i < gguf_array_count(merges); i++) {
            GgufString m = gguf_array_string(merges, i);
            const char *space = memchr(m.ptr, ' ', m.len);
            if (!space || memchr(space + 1, ' ', m.len - (size_t)(space - m.ptr) - 1))
                return err_set("tokenizer.ggml.merges[%llu] must be \"left right\" (%s)", (unsigned long long)i, file);
            rc = bpe_add_merge(bpe, m.ptr, (size_t)(space - m.ptr), space + 1, m.len - (size_t)(space - m.ptr) - 1, file,
                               "tokenizer.ggml.merges");
        }
    } else if (spm) {
        double *score = xmalloc(n * sizeof(double));
        for (uint64_t i = 0; i < n; i++) score[i] = gemma ? -(double)i : gguf_array_float(scores, i);
        rc = derive_merges(tok, score, file);
        free(score);
    }
    if (rc) return -1;

    // Added tokens, in id order.
    tok->added = xcalloc(n + 4, sizeof(AddedToken));
    for (uint64_t i = 0; types && i < n; i++) {
        int64_t type = gguf_array_int(types, i);
        bool control = type == TOKEN_TYPE_CONTROL && (!byte_level || spelled_in_byte_alphabet(bpe->pieces[i], (size_t)bpe->piece_len[i]));
        if (!control && type != TOKEN_TYPE_USER_DEFINED) continue;
        AddedToken *a = &tok->added[tok->n_added++];
        a->id = (int)i;
        a->content = xstrdup(bpe->pieces[i]);
        a->special = control;
    }

    if (optional_id(f, "tokenizer.ggml.bos_token_id", &tok->bos_id) || optional_id(f, "tokenizer.ggml.eos_token_id", &tok->eos_id) ||
        optional_id(f, "tokenizer.ggml.unknown_token_id", &tok->unk_id) ||
        optional_id(f, "tokenizer.ggml.padding_token_id", &tok->pad_id))
        return -1;
    // transformers adds the named special tokens (bos, eos, unk, pad) to the added
    // vocabulary as special tokens, whatever their type in the file.
    int named[] = {tok->bos_id, tok->eos_id, tok->unk_id, tok->pad_id};
    for (int k = 0; k < 4; k++) {
        if (named[k] < 0 || named[k] >= (int)n) continue;
        bool found = false;
        for (int i = 0; i < tok->n_added; i++)
            if (tok->added[i].id == named[k]) found = true, tok->added[i].special = true;
        if (found) continue;
        AddedToken *a = &tok->added[tok->n_added++];
        a->id = named[k];
        a->content = xstrdup(bpe->pieces[named[k]]);
        a->special = true;
    }
    tok->add_bos_token = spm;
    bool add_space_prefix = true;
    if (optional_bool(f, "tokenizer.ggml.add_bos_token", &tok->add_bos_token) ||
        optional_bool(f, "tokenizer.ggml.add_eos_token", &tok->add_eos_token) ||
        optional_bool(f, "tokenizer.ggml.add_space_prefix", &add_space_prefix))
        return -1;
    if (gguf_find(f, "tokenizer.chat_template") && gguf_get_string(f, "tokenizer.chat_template", &tok->chat_template) != 0)
        return -1;

    if (byte_level) {
        if (gguf_find(f, "tokenizer.ggml.pre")) {
            if (gguf_get_string(f, "tokenizer.ggml.pre", &pre) != 0) return -1;
        } else {
            pre = xstrdup("default");
        }
        rc = gpt2_pre_tokenizer(tok, pre, file);
        free(pre);
        if (rc) return -1;
        tok->has_decoder = true;
        tok->dec = xcalloc(1, sizeof *tok->dec);
        tok->dec[tok->n_dec++].kind = DEC_BYTE_LEVEL;
    } else {
        bpe->byte_fallback = bpe->fuse_unk = true;
        if (phi3) { // the prefix space comes from a normalizer (see transformers' phi3_tokenizer)
            tok->has_normalizer = true;
            tok->norm = xcalloc(2, sizeof *tok->norm);
            tok->norm[0] = (NormStep){.kind = NORM_PREPEND, .text = xstrdup("\xE2\x96\x81")};
            tok->norm[1] = (NormStep){.kind = NORM_REPLACE, .text = xstrdup("\xE2\x96\x81")};
            tok->n_norm = 2;
            if (tok_regex_compile(&tok->norm[1].pattern, " ", false, file, "tokenizer.ggml.model") != 0) return -1;
        } else {
            tok->has_pre_tokenizer = true;
            if (add_pre_step(tok, PRE_METASPACE, NULL, file, "tokenizer.ggml.model") != 0) return -1;
            PreStep *m = &tok->pre[0];
            tok_regex_free(&m->regex);
            m->replacement = xstrdup("\xE2\x96\x81");
            m->prepend_scheme = add_space_prefix ? PREPEND_FIRST : PREPEND_NEVER;
            m->split = false;
            if (tok_regex_compile(&m->regex, m->replacement, false, file, "tokenizer.ggml.model") != 0) return -1;
        }
        tok->has_decoder = true;
        tok->dec = xcalloc(4, sizeof *tok->dec);
        tok->dec[0] = (DecStep){.kind = DEC_REPLACE, .pattern = xstrdup("\xE2\x96\x81"), .content = xstrdup(" ")};
        tok->dec[1] = (DecStep){.kind = DEC_BYTE_FALLBACK};
        tok->dec[2] = (DecStep){.kind = DEC_FUSE};
        tok->n_dec = 3;
        if (add_space_prefix || phi3)
            tok->dec[tok->n_dec++] = (DecStep){.kind = DEC_STRIP, .strip_content = xstrdup(" "), .strip_start = 1};
    }
    // The post-processor transformers builds from add_bos_token / add_eos_token.
    tok->has_post_processor = true;
    if (tok->add_bos_token && tok->bos_id >= 0 && tok->bos_id < (int)n) {
        tok->post_prefix = xmalloc(sizeof(int));
        tok->post_prefix[tok->n_post_prefix++] = tok->bos_id;
    }
    if (tok->add_eos_token && tok->eos_id >= 0 && tok->eos_id < (int)n) {
        tok->post_suffix = xmalloc(sizeof(int));
        tok->post_suffix[tok->n_post_suffix++] = tok->eos_id;
    }
    return tokenizer_finish(tok);
}

int tokenizer_load_gguf(Tokenizer *tok, const char *path) {
    GgufFile f;
    if (gguf_open(&f, path) != 0) return -1;
    int rc = load(tok, &f, path);
    gguf_close(&f);
    return rc;
}
