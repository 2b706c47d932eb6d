// tokenizer_write_hf(): this tokenizer as tokenizer.json + tokenizer_config.json, in the
// form `tokenizers` reads, so that transformers loading the folder (AutoTokenizer ->
// PreTrainedTokenizerFast / TokenizersBackend) encodes and decodes as we do. `marlhf
// convert` uses it to give a GGUF's tokenizer to the Hugging Face folder it writes.
#include <jansson.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "tokenizer/internal.h"

static const char *prepend_scheme_name(PrependScheme s) {
    return s == PREPEND_ALWAYS ? "always" : s == PREPEND_FIRST ? "first" : "never";
}

static json_t *pattern_json(const TokRegex *re) {
    return json_pack("{s:s}", re->is_regex ? "Regex" : "String", re->source);
}

static json_t *sequence_or_single(const char *list_key, json_t *items) {
    if (json_array_size(items) == 1) {
        json_t *only = json_incref(json_array_get(items, 0));
        json_decref(items);
        return only;
    }
    return json_pack("{s:s, s:o}", "type", "Sequence", list_key, items);
}

static json_t *normalizer_json(const Tokenizer *tok) {
    if (!tok->has_normalizer) return json_null();
    json_t *items = json_array();
    for (int i = 0; i < tok->n_norm; i++) {
        const NormStep *s = &tok->norm[i];
        if (s->kind == NORM_PREPEND) json_array_append_new(items, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", s->text));
        else if (s->kind == NORM_REPLACE)
            json_array_append_new(items, json_pack("{s:s, s:o, s:s}", "type", "Replace", "pattern", pattern_json(&s->pattern),
                                                   "content", s->text));
        else
            json_array_append_new(items, json_pack("{s:s, s:b, s:b}", "type", "Strip", "strip_left", s->strip_left,
                                                   "strip_right", s->strip_right));
    }
    return sequence_or_single("normalizers", items);
}

static json_t *pre_tokenizer_json(const Tokenizer *tok) {
    if (!tok->has_pre_tokenizer) return json_null();
    static const char *const behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    json_t *items = json_array();
    for (int i = 0; i < tok->n_pre; i++) {
        const PreStep *s = &tok->pre[i];
        json_t *j = NULL;
        switch (s->kind) {
        case PRE_BYTE_LEVEL:
            j = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", s->add_prefix_space,
                          "trim_offsets", s->trim_offsets, "use_regex", s->use_regex);
            break;
        case PRE_SPLIT:
            j = json_pack("{s:s, s:o, s:s, s:b}", "type", "Split", "pattern", pattern_json(&s->regex), "behavior",
                          behaviors[s->behavior], "invert", s->invert);
            break;
        case PRE_DIGITS:
            j = json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", s->individual_digits);
            break;
        case PRE_METASPACE:
            j = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", s->replacement, "prepend_scheme",
                          prepend_scheme_name(s->prepend_scheme), "split", s->split);
            break;
        }
        json_array_append_new(items, j);
    }
    return sequence_or_single("pretokenizers", items);
}

static json_t *decoder_json(const Tokenizer *tok) {
    if (!tok->has_decoder) return json_null();
    json_t *items = json_array();
    for (int i = 0; i < tok->n_dec; i++) {
        const DecStep *s = &tok->dec[i];
        json_t *j = NULL;
        switch (s->kind) {
        case DEC_BYTE_LEVEL:
            j = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1);
            break;
        case DEC_METASPACE:
            j = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", s->replacement, "prepend_scheme",
                          prepend_scheme_name(s->prepend_scheme), "split", s->metaspace_split);
            break;
        case DEC_REPLACE:
            j = json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", s->pattern, "content", s->content);
            break;
        case DEC_BYTE_FALLBACK: j = json_pack("{s:s}", "type", "ByteFallback"); break;
        case DEC_FUSE: j = json_pack("{s:s}", "type", "Fuse"); break;
        case DEC_STRIP:
            j = json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", s->strip_content, "start", s->strip_start,
                          "stop", s->strip_stop);
            break;
        }
        json_array_append_new(items, j);
    }
    return sequence_or_single("decoders", items);
}

// TemplateProcessing with the prefix and suffix ids, each named by its token.
static json_t *post_processor_json(const Tokenizer *tok) {
    if (!tok->has_post_processor) return json_null();
    json_t *single = json_array(), *pair = json_array(), *specials = json_object();
    for (int part = 0; part < 3; part++) {
        if (part == 1) {
            json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
            json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
            continue;
        }
        int n = part == 0 ? tok->n_post_prefix : tok->n_post_suffix;
        const int *ids = part == 0 ? tok->post_prefix : tok->post_suffix;
        for (int i = 0; i < n; i++) {
            const char *name = tokenizer_id_to_piece(tok, ids[i]);
            json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", name, "type_id", 0));
            json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", name, "type_id", 0));
            json_object_set_new(specials, name, json_pack("{s:s, s:[i], s:[s]}", "id", name, "ids", ids[i], "tokens", name));
        }
    }
    // The pair template: the single one, then the second sequence with the same tokens around it.
    size_t n_single = json_array_size(single);
    for (size_t i = 0; i < n_single; i++) {
        json_t *item = json_deep_copy(json_array_get(single, i));
        json_t *seq = json_object_get(item, "Sequence");
        json_t *special = json_object_get(item, "SpecialToken");
        if (seq) json_object_set_new(seq, "id", json_string("B"));
        json_object_set_new(seq ? seq : special, "type_id", json_integer(1));
        json_array_append_new(pair, item);
    }
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", specials);
}

static json_t *model_json(const Tokenizer *tok) {
    const BpeModel *bpe = &tok->bpe;
    json_t *vocab = json_object(), *merges = json_array();
    for (int id = 0; id < bpe->n_ids; id++)
        if (bpe->pieces[id]) json_object_setn_new(vocab, bpe->pieces[id], (size_t)bpe->piece_len[id], json_integer(id));
    for (int i = 0; i < bpe->n_merges; i++) {
        int l = bpe->merge_pairs[2 * i], r = bpe->merge_pairs[2 * i + 1];
        json_array_append_new(merges, json_pack("[s#, s#]", bpe->pieces[l], (int)bpe->piece_len[l], bpe->pieces[r],
                                                (int)bpe->piece_len[r]));
    }
    json_t *unk = bpe->unk_id >= 0 ? json_string(bpe->pieces[bpe->unk_id]) : json_null();
    return json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token", unk,
                     "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", bpe->fuse_unk, "byte_fallback",
                     bpe->byte_fallback, "ignore_merges", bpe->ignore_merges, "vocab", vocab, "merges", merges);
}

static int write_json(json_t *root, const char *dir, const char *name) {
    if (!root) return err_set("cannot express the tokenizer as JSON (a token is not valid UTF-8?) (%s/%s)", dir, name);
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    CHECK(text, "json_dumps failed");
    char *path = fs_join(dir, name);
    int rc = fs_write_file_atomic(path, text, strlen(text));
    free(path);
    free(text);
    return rc;
}

static json_t *token_or_null(const Tokenizer *tok, int id) {
    const char *piece = id >= 0 ? tokenizer_id_to_piece(tok, id) : NULL;
    return piece ? json_string(piece) : json_null();
}

int tokenizer_write_hf(const Tokenizer *tok, const char *dir) {
    json_t *added = json_array();
    for (int i = 0; i < tok->n_added; i++) {
        const AddedToken *a = &tok->added[i];
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", a->id, "content", a->content,
                                               "single_word", a->single_word, "lstrip", a->lstrip, "rstrip", a->rstrip,
                                               "normalized", a->normalized, "special", a->special));
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                             "added_tokens", added, "normalizer", normalizer_json(tok), "pre_tokenizer",
                             pre_tokenizer_json(tok), "post_processor", post_processor_json(tok), "decoder",
                             decoder_json(tok), "model", model_json(tok));
    if (write_json(root, dir, "tokenizer.json") != 0) return -1;

    json_t *config = json_pack("{s:s, s:o, s:o, s:o, s:o, s:b, s:b, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                               "bos_token", token_or_null(tok, tok->bos_id), "eos_token", token_or_null(tok, tok->eos_id),
                               "pad_token", token_or_null(tok, tok->pad_id), "unk_token", token_or_null(tok, tok->unk_id),
                               "add_bos_token", tok->add_bos_token, "add_eos_token", tok->add_eos_token,
                               "clean_up_tokenization_spaces", tok->clean_up_requested);
    if (config && tok->clean_up)
        json_object_set_new(config, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", json_true());
    if (config && tok->chat_template) json_object_set_new(config, "chat_template", json_string(tok->chat_template));
    return write_json(config, dir, "tokenizer_config.json");
}
