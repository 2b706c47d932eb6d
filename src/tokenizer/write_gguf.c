// A tokenizer as llama.cpp's GGUF metadata (tokenizer.ggml.*): the inverse of load_gguf.c
// for byte-level BPE tokenizers, the kind GPT-2, SmolLM2, Llama-3 and Qwen2 use. The
// pre-tokenizer is named by what its steps are, as load_gguf.c builds them back:
//   ByteLevel with the GPT-2 regex                         "gpt-2"
//   Digits(individual) + ByteLevel with the GPT-2 regex     "smollm"
//   Split(Llama-3's regex) + ByteLevel without a regex      "llama-bpe"
//   Split(Qwen2's regex) + ByteLevel without a regex        "qwen2"
// Sentencepiece-style tokenizers (byte fallback, "▁" for spaces by a Prepend + Replace
// normalizer or a Metaspace pre-tokenizer: Llama-2, TinyLlama, Mistral) become llama.cpp's
// "llama" model. llama.cpp merges by per-token score, which a tokenizer.json does not
// carry: a token's score is minus its id, which ranks merges as the file's merge list does
// when the token each merge makes has a larger id than the one the merge before made (true
// of vocabularies sentencepiece trained; checked, else refused). The merges are written
// too, so marlhf and transformers read the exact list back. Other normalizers are refused.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf_write.h"
#include "tokenizer/internal.h"

enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER_DEFINED = 4, TYPE_UNUSED = 5, TYPE_BYTE = 6 };

#define SPACE_MARK "\xE2\x96\x81" // "▁"

static bool is_byte_level(const PreStep *step, bool with_gpt2_regex) {
    if (step->kind != PRE_BYTE_LEVEL || step->add_prefix_space) return false;
    if (!with_gpt2_regex) return !step->use_regex;
    return step->use_regex && !strcmp(step->regex.source, TOK_GPT2_PATTERN);
}

static bool is_split(const PreStep *step, const char *pattern) {
    return step->kind == PRE_SPLIT && step->regex.is_regex && !strcmp(step->regex.source, pattern) &&
           step->behavior == SPLIT_ISOLATED && !step->invert;
}

// llama.cpp's name for the pre-tokenizer, or NULL.
static const char *pre_tokenizer_name(const Tokenizer *tok) {
    const PreStep *s = tok->pre;
    if (tok->n_pre == 1 && is_byte_level(&s[0], true)) return "gpt-2";
    if (tok->n_pre == 2 && s[0].kind == PRE_DIGITS && s[0].individual_digits && is_byte_level(&s[1], true))
        return "smollm";
    if (tok->n_pre == 2 && is_split(&s[0], TOK_LLAMA3_PATTERN) && is_byte_level(&s[1], false)) return "llama-bpe";
    if (tok->n_pre == 2 && is_split(&s[0], TOK_QWEN2_PATTERN) && is_byte_level(&s[1], false)) return "qwen2";
    return NULL;
}

// Sentencepiece style: 1 with a space mark prepended to the text, 0 without, -1 not this style.
static int sentencepiece_prefix(const Tokenizer *tok) {
    if (!tok->bpe.byte_fallback) return -1;
    const NormStep *n = tok->norm;
    const bool replace_spaces = tok->n_norm >= 1 && n[tok->n_norm - 1].kind == NORM_REPLACE &&
                                !n[tok->n_norm - 1].pattern.is_regex && !strcmp(n[tok->n_norm - 1].pattern.source, " ") &&
                                !strcmp(n[tok->n_norm - 1].text, SPACE_MARK);
    if (tok->n_pre == 0 && tok->n_norm == 2 && n[0].kind == NORM_PREPEND && !strcmp(n[0].text, SPACE_MARK) && replace_spaces)
        return 1; // Llama-2's tokenizer.json
    if (tok->n_pre == 0 && tok->n_norm == 1 && replace_spaces) return 0;
    if (tok->n_norm == 0 && tok->n_pre == 1 && tok->pre[0].kind == PRE_METASPACE && !tok->pre[0].split &&
        !strcmp(tok->pre[0].replacement, SPACE_MARK) && tok->pre[0].prepend_scheme != PREPEND_ALWAYS)
        return tok->pre[0].prepend_scheme == PREPEND_FIRST;
    return -1;
}

static bool is_byte_token(const char *piece, int len) {
    return len == 6 && !strncmp(piece, "<0x", 3) && piece[5] == '>';
}

int tokenizer_write_gguf(const Tokenizer *tok, GgufWriter *w, int vocab_size) {
    const char *pre = tok->n_norm == 0 ? pre_tokenizer_name(tok) : NULL;
    const int space_prefix = pre ? -1 : sentencepiece_prefix(tok);
    if (!pre && space_prefix < 0)
        return err_set("the tokenizer of %s is not one marlhf can write as GGUF: byte-level BPE (GPT-2, SmolLM2, "
                       "Llama-3, Qwen2 pre-tokenizers) and sentencepiece-style BPE with byte fallback are supported",
                       tok->path ? tok->path : "the model");
    const bool spm = space_prefix >= 0;
    if (tok->vocab_size > vocab_size)
        return err_set("the tokenizer has %d tokens but the model only %d (%s)", tok->vocab_size, vocab_size, tok->path);
    const BpeModel *bpe = &tok->bpe;
    // Scores are minus the id: llama.cpp's sentencepiece merging then follows the merge
    // list when each merge makes a token of larger id than the merge before it did.
    for (int m = 0, last = -1; spm && m < bpe->n_merges; m++) {
        int rank, made = -1;
        pairmap_get(&bpe->merges, bpe->merge_pairs[2 * m], bpe->merge_pairs[2 * m + 1], &rank, &made);
        if (made <= last)
            return err_set("the merges of %s are not in the order of the ids of the tokens they make (merge %d makes "
                           "id %d after id %d): llama.cpp's sentencepiece tokenizer would split text differently",
                           tok->path ? tok->path : "the tokenizer", m, made, last);
        last = made;
    }
    const char **tokens = xmalloc((size_t)vocab_size * sizeof *tokens);
    size_t *lengths = xmalloc((size_t)vocab_size * sizeof *lengths);
    int32_t *types = xmalloc((size_t)vocab_size * sizeof *types);
    char **padding = xcalloc((size_t)vocab_size, sizeof *padding);
    for (int id = 0; id < vocab_size; id++) {
        const AddedToken *added = id < tok->vocab_size && tok->added_index[id] >= 0 ? &tok->added[tok->added_index[id]] : NULL;
        types[id] = added ? (added->special ? TYPE_CONTROL : TYPE_USER_DEFINED) : TYPE_NORMAL;
        if (spm && !added && id < bpe->n_ids && bpe->pieces[id] && is_byte_token(bpe->pieces[id], bpe->piece_len[id]))
            types[id] = TYPE_BYTE;
        if (spm && id == bpe->unk_id) types[id] = TYPE_UNKNOWN;
        if (id < bpe->n_ids && bpe->pieces[id]) {
            tokens[id] = bpe->pieces[id];
            lengths[id] = (size_t)bpe->piece_len[id];
        } else if (added) {
            tokens[id] = added->content;
            lengths[id] = strlen(added->content);
        } else { // rows of the embedding no token uses (as llama.cpp's converter names them)
            padding[id] = xmalloc(32);
            snprintf(padding[id], 32, "[PAD%d]", id);
            tokens[id] = padding[id];
            lengths[id] = strlen(padding[id]);
            types[id] = TYPE_UNUSED;
        }
    }
    char **merges = xmalloc((size_t)(bpe->n_merges + 1) * sizeof *merges);
    for (int m = 0; m < bpe->n_merges; m++) {
        int left = bpe->merge_pairs[2 * m], right = bpe->merge_pairs[2 * m + 1];
        size_t n = (size_t)bpe->piece_len[left] + 1 + (size_t)bpe->piece_len[right];
        merges[m] = xmalloc(n + 1);
        memcpy(merges[m], bpe->pieces[left], (size_t)bpe->piece_len[left]);
        merges[m][bpe->piece_len[left]] = ' ';
        memcpy(merges[m] + bpe->piece_len[left] + 1, bpe->pieces[right], (size_t)bpe->piece_len[right]);
        merges[m][n] = 0;
    }
    float *scores = NULL;
    if (spm) {
        scores = xmalloc((size_t)vocab_size * sizeof(float));
        for (int id = 0; id < vocab_size; id++) scores[id] = types[id] == TYPE_NORMAL ? -(float)id : 0.0f;
    }
    gguf_writer_add_string(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm) gguf_writer_add_string(w, "tokenizer.ggml.pre", pre);
    gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", tokens, lengths, (uint64_t)vocab_size);
    if (spm) {
        gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", scores, (uint64_t)vocab_size);
        gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix == 1);
    }
    gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types, (uint64_t)vocab_size);
    gguf_writer_add_string_array(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL, (uint64_t)bpe->n_merges);
    const struct {
        const char *key;
        int id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", tok->bos_id},
               {"tokenizer.ggml.eos_token_id", tok->eos_id},
               {"tokenizer.ggml.padding_token_id", tok->pad_id},
               {"tokenizer.ggml.unknown_token_id", bpe->unk_id}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id >= 0) gguf_writer_add_u32(w, ids[i].key, (uint32_t)ids[i].id);
    gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", tokenizer_adds_bos(tok));
    gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", tok->n_post_suffix > 0 && tok->post_suffix[0] == tok->eos_id);
    if (tok->chat_template) gguf_writer_add_string(w, "tokenizer.chat_template", tok->chat_template);
    for (int m = 0; m < bpe->n_merges; m++) free(merges[m]);
    for (int id = 0; id < vocab_size; id++) free(padding[id]);
    free(merges), free(padding), free(tokens), free(lengths), free(types), free(scores);
    return 0;
}
