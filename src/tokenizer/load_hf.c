// A Hugging Face tokenizer folder: tokenizer.json (the `tokenizers` pipeline) and
// tokenizer_config.json (special tokens, chat template, transformers' decode options).
//
// What transformers 5 does with the two files, and so what we do:
//   - BOS/EOS are added by tokenizer.json's post_processor only: with a tokenizer.json,
//     transformers drops add_bos_token/add_eos_token from the config;
//   - the chat template comes from chat_template.jinja if present, else the config's
//     "chat_template" (a string, or a list whose "default" entry is taken);
//   - decode() applies clean_up_tokenization only when clean_up_tokenization_spaces is
//     true AND, the model being BPE, clean_up_tokenization_spaces_for_bpe_even_though_it_
//     will_corrupt_output is true too.
// Pipeline parts that marlhf does not implement (Unigram/WordPiece models, NFC and other
// Unicode normalizers, ...) are refused with an error naming the field.
#include <jansson.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "tokenizer/internal.h"

typedef struct {
    const char *file;
} Ctx;

static int wrong_type(const Ctx *c, const char *field, const char *want) {
    return err_set("%s must be %s (%s)", field, want, c->file);
}

// Optional fields: absent or null leaves *out as it is.
static int opt_bool(const Ctx *c, json_t *obj, const char *key, const char *field, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return wrong_type(c, field, "true or false");
    *out = json_is_true(v);
    return 0;
}

static int opt_string(const Ctx *c, json_t *obj, const char *key, const char *field, const char **out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return wrong_type(c, field, "a string");
    *out = json_string_value(v);
    return 0;
}

static int opt_int(const Ctx *c, json_t *obj, const char *key, const char *field, long *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return wrong_type(c, field, "an integer");
    *out = (long)json_integer_value(v);
    return 0;
}

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

// {"String": "x"} or {"Regex": "x"}.
static int parse_pattern(const Ctx *c, json_t *obj, const char *field, TokRegex *re) {
    json_t *p = json_object_get(obj, "pattern");
    json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
    json_t *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
    if (json_is_string(s)) return tok_regex_compile(re, json_string_value(s), false, c->file, field);
    if (json_is_string(r)) return tok_regex_compile(re, json_string_value(r), true, c->file, field);
    return err_set("%s.pattern must be {\"String\": ...} or {\"Regex\": ...} (%s)", field, c->file);
}

// --- model -----------------------------------------------------------------------------
static int parse_model(const Ctx *c, json_t *root, Tokenizer *tok) {
    json_t *model = json_object_get(root, "model");
    if (!model) return err_set("no \"model\" in %s", c->file);
    if (!json_is_object(model)) return wrong_type(c, "model", "an object");
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE") != 0)
        return err_set("model.type \"%s\" is not supported (BPE is) (%s)", type, c->file);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!type && !merges) return err_set("model.type is missing and the model has no merges (%s)", c->file);
    if (!json_is_object(vocab)) return wrong_type(c, "model.vocab", "an object of token -> id");
    if (merges && !json_is_array(merges)) return wrong_type(c, "model.merges", "an array");
    const char *prefix = NULL, *suffix = NULL, *unk = NULL;
    if (opt_string(c, model, "continuing_subword_prefix", "model.continuing_subword_prefix", &prefix) ||
        opt_string(c, model, "end_of_word_suffix", "model.end_of_word_suffix", &suffix) ||
        opt_string(c, model, "unk_token", "model.unk_token", &unk))
        return -1;
    if ((prefix && *prefix) || (suffix && *suffix))
        return err_set("model.continuing_subword_prefix / end_of_word_suffix are not supported (%s)", c->file);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return err_set("model.dropout is not supported (encoding would be random) (%s)", c->file);
    BpeModel *bpe = &tok->bpe;
    if (opt_bool(c, model, "byte_fallback", "model.byte_fallback", &bpe->byte_fallback) ||
        opt_bool(c, model, "fuse_unk", "model.fuse_unk", &bpe->fuse_unk) ||
        opt_bool(c, model, "ignore_merges", "model.ignore_merges", &bpe->ignore_merges))
        return -1;

    const char *key;
    json_t *value;
    int max_id = -1;
    json_object_foreach(vocab, key, value) {
        if (!json_is_integer(value) || json_integer_value(value) < 0 || json_integer_value(value) > (1 << 30))
            return err_set("model.vocab[\"%s\"] must be a non-negative integer id (%s)", key, c->file);
        if ((int)json_integer_value(value) > max_id) max_id = (int)json_integer_value(value);
    }
    bpe->n_ids = max_id + 1;
    bpe->pieces = xcalloc((size_t)bpe->n_ids + 1, sizeof(char *));
    bpe->piece_len = xcalloc((size_t)bpe->n_ids + 1, sizeof(int));
    json_object_foreach(vocab, key, value) {
        int id = (int)json_integer_value(value);
        size_t len = strlen(key);
        free(bpe->pieces[id]); // two tokens with one id: the last one spells it
        bpe->pieces[id] = xstrdup(key);
        bpe->piece_len[id] = (int)len;
    }
    // The map points into pieces[], so it is filled once every piece is final.
    json_object_foreach(vocab, key, value) {
        int id = (int)json_integer_value(value);
        if (strcmp(bpe->pieces[id], key) == 0) strmap_put(&bpe->vocab, bpe->pieces[id], strlen(key), id);
    }
    size_t index;
    json_t *merge;
    json_array_foreach(merges, index, merge) {
        const char *left, *right;
        size_t left_len, right_len;
        if (json_is_string(merge)) {
            const char *s = json_string_value(merge), *space = strchr(s, ' ');
            if (!space || strchr(space + 1, ' '))
                return err_set("model.merges[%zu] must be \"left right\" (%s)", index, c->file);
            left = s, left_len = (size_t)(space - s), right = space + 1, right_len = strlen(space + 1);
        } else if (json_is_array(merge) && json_array_size(merge) == 2 && json_is_string(json_array_get(merge, 0)) &&
                   json_is_string(json_array_get(merge, 1))) {
            left = json_string_value(json_array_get(merge, 0)), left_len = strlen(left);
            right = json_string_value(json_array_get(merge, 1)), right_len = strlen(right);
        } else {
            return err_set("model.merges[%zu] must be \"left right\" or [left, right] (%s)", index, c->file);
        }
        if (bpe_add_merge(bpe, left, left_len, right, right_len, c->file, "model.merges") != 0) return -1;
    }
    if (unk) {
        bpe->unk_id = strmap_get(&bpe->vocab, unk, strlen(unk));
        if (bpe->unk_id < 0) return err_set("model.unk_token \"%s\" is not in the vocabulary (%s)", unk, c->file);
    }
    tok->unk_id = bpe->unk_id;
    return 0;
}

// --- added tokens ----------------------------------------------------------------------
static int parse_added(const Ctx *c, json_t *root, Tokenizer *tok) {
    json_t *added = json_object_get(root, "added_tokens");
    if (!added || json_is_null(added)) return 0;
    if (!json_is_array(added)) return wrong_type(c, "added_tokens", "an array");
    tok->added = xcalloc(json_array_size(added) + 1, sizeof(AddedToken));
    size_t index;
    json_t *item;
    json_array_foreach(added, index, item) {
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", index);
        json_t *id = json_object_get(item, "id"), *content = json_object_get(item, "content");
        if (!json_is_object(item) || !json_is_integer(id) || !json_is_string(content) || json_integer_value(id) < 0 ||
            json_integer_value(id) > (1 << 30))
            return err_set("%s must have an integer \"id\" and a string \"content\" (%s)", field, c->file);
        AddedToken *a = &tok->added[tok->n_added];
        memset(a, 0, sizeof *a);
        a->id = (int)json_integer_value(id);
        a->content = xstrdup(json_string_value(content));
        tok->n_added++;
        if (opt_bool(c, item, "special", field, &a->special) || opt_bool(c, item, "lstrip", field, &a->lstrip) ||
            opt_bool(c, item, "rstrip", field, &a->rstrip) || opt_bool(c, item, "single_word", field, &a->single_word) ||
            opt_bool(c, item, "normalized", field, &a->normalized))
            return -1;
    }
    return 0;
}

// --- normalizer ------------------------------------------------------------------------
static int parse_normalizer(const Ctx *c, json_t *n, const char *field, Tokenizer *tok) {
    if (!json_is_object(n)) return wrong_type(c, field, "an object");
    const char *type = type_of(n);
    if (!type) return err_set("%s has no \"type\" (%s)", field, c->file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return wrong_type(c, "normalizer.normalizers", "an array");
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            char sub[96];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", field, i);
            if (parse_normalizer(c, item, sub, tok) != 0) return -1;
        }
        return 0;
    }
    NormStep step = {0};
    if (!strcmp(type, "Prepend")) {
        const char *prepend = NULL;
        if (opt_string(c, n, "prepend", field, &prepend)) return -1;
        if (!prepend) return err_set("%s.prepend is missing (%s)", field, c->file);
        step.kind = NORM_PREPEND;
        step.text = xstrdup(prepend);
    } else if (!strcmp(type, "Replace")) {
        const char *content = NULL;
        if (opt_string(c, n, "content", field, &content)) return -1;
        if (!content) return err_set("%s.content is missing (%s)", field, c->file);
        if (parse_pattern(c, n, field, &step.pattern) != 0) return -1;
        step.kind = NORM_REPLACE;
        step.text = xstrdup(content);
    } else if (!strcmp(type, "Strip")) {
        step.kind = NORM_STRIP;
        step.strip_left = step.strip_right = true;
        if (opt_bool(c, n, "strip_left", field, &step.strip_left) || opt_bool(c, n, "strip_right", field, &step.strip_right))
            return -1;
    } else {
        return err_set("%s.type \"%s\" is not supported (Sequence, Prepend, Replace, Strip are) (%s)", field, type, c->file);
    }
    tok->norm = xrealloc(tok->norm, (size_t)(tok->n_norm + 1) * sizeof *tok->norm);
    tok->norm[tok->n_norm++] = step;
    return 0;
}

// --- pre-tokenizer ---------------------------------------------------------------------
static int parse_prepend_scheme(const Ctx *c, json_t *obj, const char *field, PrependScheme *out) {
    const char *scheme = NULL;
    bool add_prefix_space = true;
    if (opt_string(c, obj, "prepend_scheme", field, &scheme)) return -1;
    if (!scheme) { // older files: add_prefix_space
        if (opt_bool(c, obj, "add_prefix_space", field, &add_prefix_space)) return -1;
        *out = add_prefix_space ? PREPEND_ALWAYS : PREPEND_NEVER;
        return 0;
    }
    if (!strcmp(scheme, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(scheme, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(scheme, "never")) *out = PREPEND_NEVER;
    else return err_set("%s.prepend_scheme \"%s\" is not always/first/never (%s)", field, scheme, c->file);
    return 0;
}

static int parse_pre_tokenizer(const Ctx *c, json_t *p, const char *field, Tokenizer *tok) {
    if (!json_is_object(p)) return wrong_type(c, field, "an object");
    const char *type = type_of(p);
    if (!type) return err_set("%s has no \"type\" (%s)", field, c->file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return wrong_type(c, "pre_tokenizer.pretokenizers", "an array");
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            char sub[96];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", field, i);
            if (parse_pre_tokenizer(c, item, sub, tok) != 0) return -1;
        }
        return 0;
    }
    PreStep step = {0};
    int rc = 0;
    if (!strcmp(type, "ByteLevel")) {
        step.kind = PRE_BYTE_LEVEL;
        step.add_prefix_space = true, step.trim_offsets = true, step.use_regex = true;
        rc = opt_bool(c, p, "add_prefix_space", field, &step.add_prefix_space) ||
             opt_bool(c, p, "trim_offsets", field, &step.trim_offsets) || opt_bool(c, p, "use_regex", field, &step.use_regex);
        if (!rc) rc = tok_regex_compile(&step.regex, TOK_GPT2_PATTERN, true, c->file, field);
    } else if (!strcmp(type, "Split")) {
        step.kind = PRE_SPLIT;
        const char *behavior = NULL;
        rc = opt_string(c, p, "behavior", field, &behavior) || opt_bool(c, p, "invert", field, &step.invert);
        if (rc) return -1;
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int found = -1;
        for (int k = 0; behavior && k < 5; k++)
            if (!strcmp(behavior, names[k])) found = k;
        if (found < 0) return err_set("%s.behavior must be one of Removed, Isolated, MergedWithPrevious, "
                                      "MergedWithNext, Contiguous (%s)", field, c->file);
        step.behavior = (SplitBehavior)found;
        rc = parse_pattern(c, p, field, &step.regex);
    } else if (!strcmp(type, "Digits")) {
        step.kind = PRE_DIGITS;
        rc = opt_bool(c, p, "individual_digits", field, &step.individual_digits);
        if (!rc) rc = tok_regex_compile(&step.regex, step.individual_digits ? "\\p{N}" : "\\p{N}+", true, c->file, field);
    } else if (!strcmp(type, "Metaspace")) {
        step.kind = PRE_METASPACE;
        const char *replacement = "\xE2\x96\x81";
        step.split = true;
        rc = opt_string(c, p, "replacement", field, &replacement) || opt_bool(c, p, "split", field, &step.split) ||
             parse_prepend_scheme(c, p, field, &step.prepend_scheme);
        if (!rc) {
            step.replacement = xstrdup(replacement);
            rc = tok_regex_compile(&step.regex, replacement, false, c->file, field);
        }
    } else {
        return err_set("%s.type \"%s\" is not supported (Sequence, ByteLevel, Split, Digits, Metaspace are) (%s)", field,
                       type, c->file);
    }
    if (rc) {
        tok_regex_free(&step.regex);
        free(step.replacement);
        return -1;
    }
    tok->pre = xrealloc(tok->pre, (size_t)(tok->n_pre + 1) * sizeof *tok->pre);
    tok->pre[tok->n_pre++] = step;
    return 0;
}

// --- decoder ---------------------------------------------------------------------------
static int parse_decoder(const Ctx *c, json_t *d, const char *field, Tokenizer *tok) {
    if (!json_is_object(d)) return wrong_type(c, field, "an object");
    const char *type = type_of(d);
    if (!type) return err_set("%s has no \"type\" (%s)", field, c->file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list)) return wrong_type(c, "decoder.decoders", "an array");
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            char sub[96];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", field, i);
            if (parse_decoder(c, item, sub, tok) != 0) return -1;
        }
        return 0;
    }
    DecStep step = {0};
    if (!strcmp(type, "ByteLevel")) {
        step.kind = DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        step.kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        step.kind = DEC_FUSE;
    } else if (!strcmp(type, "Metaspace")) {
        step.kind = DEC_METASPACE;
        const char *replacement = "\xE2\x96\x81";
        step.metaspace_split = true;
        if (opt_string(c, d, "replacement", field, &replacement) || opt_bool(c, d, "split", field, &step.metaspace_split) ||
            parse_prepend_scheme(c, d, field, &step.prepend_scheme))
            return -1;
        step.replacement = xstrdup(replacement);
    } else if (!strcmp(type, "Replace")) {
        step.kind = DEC_REPLACE;
        json_t *p = json_object_get(d, "pattern");
        json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
        const char *content = NULL;
        if (!json_is_string(s)) return err_set("%s.pattern must be {\"String\": ...} (%s)", field, c->file);
        if (opt_string(c, d, "content", field, &content)) return -1;
        if (!content) return err_set("%s.content is missing (%s)", field, c->file);
        step.pattern = xstrdup(json_string_value(s));
        step.content = xstrdup(content);
    } else if (!strcmp(type, "Strip")) {
        step.kind = DEC_STRIP;
        const char *content = " ";
        long start = 0, stop = 0;
        if (opt_string(c, d, "content", field, &content) || opt_int(c, d, "start", field, &start) ||
            opt_int(c, d, "stop", field, &stop))
            return -1;
        if (start < 0 || stop < 0) return err_set("%s.start/stop must not be negative (%s)", field, c->file);
        step.strip_content = xstrdup(content);
        step.strip_start = (int)start, step.strip_stop = (int)stop;
    } else {
        return err_set("%s.type \"%s\" is not supported (Sequence, ByteLevel, Metaspace, Replace, ByteFallback, "
                       "Fuse, Strip are) (%s)", field, type, c->file);
    }
    tok->dec = xrealloc(tok->dec, (size_t)(tok->n_dec + 1) * sizeof *tok->dec);
    tok->dec[tok->n_dec++] = step;
    return 0;
}

// --- post-processor --------------------------------------------------------------------
static void post_push(int **list, int *n, int id) {
    *list = xrealloc(*list, (size_t)(*n + 1) * sizeof(int));
    (*list)[(*n)++] = id;
}

static int parse_post_processor(const Ctx *c, json_t *p, const char *field, Tokenizer *tok) {
    if (!json_is_object(p)) return wrong_type(c, field, "an object");
    const char *type = type_of(p);
    if (!type) return err_set("%s has no \"type\" (%s)", field, c->file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list)) return wrong_type(c, "post_processor.processors", "an array");
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            char sub[96];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", field, i);
            if (parse_post_processor(c, item, sub, tok) != 0) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; // offsets only
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        if (!json_is_array(cls) || !json_is_integer(json_array_get(cls, 1)) || !json_is_array(sep) ||
            !json_is_integer(json_array_get(sep, 1)))
            return err_set("%s.cls and .sep must be [token, id] (%s)", field, c->file);
        post_push(&tok->post_prefix, &tok->n_post_prefix, (int)json_integer_value(json_array_get(cls, 1)));
        post_push(&tok->post_suffix, &tok->n_post_suffix, (int)json_integer_value(json_array_get(sep, 1)));
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return err_set("%s.type \"%s\" is not supported (TemplateProcessing, ByteLevel, Sequence, "
                       "RobertaProcessing, BertProcessing are) (%s)", field, type, c->file);
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single)) return wrong_type(c, "post_processor.single", "an array");
    bool seen_sequence = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        json_t *special = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            seen_sequence = true;
            continue;
        }
        json_t *name = json_object_get(special, "id");
        if (!json_is_string(name)) return err_set("%s.single[%zu] must be a Sequence or a SpecialToken (%s)", field, i, c->file);
        json_t *entry = json_object_get(specials, json_string_value(name));
        json_t *ids = json_object_get(entry, "ids");
        if (!json_is_array(ids))
            return err_set("%s.special_tokens has no ids for \"%s\" (%s)", field, json_string_value(name), c->file);
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            if (!json_is_integer(id) || json_integer_value(id) < 0)
                return wrong_type(c, "post_processor.special_tokens ids", "non-negative integers");
            if (seen_sequence) post_push(&tok->post_suffix, &tok->n_post_suffix, (int)json_integer_value(id));
            else post_push(&tok->post_prefix, &tok->n_post_prefix, (int)json_integer_value(id));
        }
    }
    return 0;
}

// --- tokenizer_config.json -------------------------------------------------------------
// A special token entry: "text", {"content": "text", ...}, or null.
static int config_token(const Ctx *c, json_t *config, const char *key, const Tokenizer *tok, int *id) {
    json_t *v = json_object_get(config, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return wrong_type(c, key, "a string or {\"content\": ...}");
    *id = tokenizer_piece_to_id(tok, json_string_value(v));
    if (*id < 0) return err_set("%s \"%s\" is not a token of the vocabulary (%s)", key, json_string_value(v), c->file);
    return 0;
}

static int load_config(const char *dir, Tokenizer *tok) {
    char *path = fs_join(dir, "tokenizer_config.json");
    Ctx c = {path};
    json_t *config = NULL;
    int rc = 0;
    if (fs_is_file(path)) {
        json_error_t error;
        // Integers as reals: transformers writes "model_max_length": 1000000000000000019884624838656
        // for a tokenizer without a limit (many published models carry it), past jansson's
        // integers; nothing read here is an integer.
        config = json_load_file(path, JSON_DECODE_INT_AS_REAL, &error);
        if (!config) rc = err_set("invalid JSON: %s (%s:%d:%d)", error.text, path, error.line, error.column);
        else if (!json_is_object(config)) rc = err_set("tokenizer_config.json must hold an object (%s)", path);
    }
    // Ids are looked up by content, which needs the added tokens and the vocabulary.
    if (rc == 0) rc = tokenizer_finish(tok);
    if (config && rc == 0) {
        bool for_bpe = false;
        rc = config_token(&c, config, "bos_token", tok, &tok->bos_id) || config_token(&c, config, "eos_token", tok, &tok->eos_id) ||
             config_token(&c, config, "pad_token", tok, &tok->pad_id) || config_token(&c, config, "unk_token", tok, &tok->unk_id) ||
             opt_bool(&c, config, "add_bos_token", "add_bos_token", &tok->add_bos_token) ||
             opt_bool(&c, config, "add_eos_token", "add_eos_token", &tok->add_eos_token) ||
             opt_bool(&c, config, "clean_up_tokenization_spaces", "clean_up_tokenization_spaces", &tok->clean_up_requested) ||
             opt_bool(&c, config, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                      "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", &for_bpe);
        tok->clean_up = tok->clean_up_requested && for_bpe;
        json_t *tmpl = json_object_get(config, "chat_template");
        if (rc == 0 && json_is_string(tmpl)) {
            tok->chat_template = xstrdup(json_string_value(tmpl));
        } else if (rc == 0 && json_is_array(tmpl)) {
            size_t i;
            json_t *item;
            json_array_foreach(tmpl, i, item) {
                json_t *name = json_object_get(item, "name"), *text = json_object_get(item, "template");
                if (json_is_string(name) && !strcmp(json_string_value(name), "default") && json_is_string(text))
                    tok->chat_template = xstrdup(json_string_value(text));
            }
        } else if (rc == 0 && tmpl && !json_is_null(tmpl)) {
            rc = wrong_type(&c, "chat_template", "a string or a list of {name, template}");
        }
    }
    char *jinja = fs_join(dir, "chat_template.jinja");
    if (rc == 0 && fs_is_file(jinja)) {
        char *text;
        size_t size;
        rc = fs_read_file(jinja, (size_t)16 << 20, &text, &size);
        if (rc == 0) {
            free(tok->chat_template);
            tok->chat_template = text;
        }
    }
    free(jinja);
    json_decref(config);
    free(path);
    return rc ? -1 : 0;
}

int tokenizer_load_hf(Tokenizer *tok, const char *dir) {
    char *path = fs_join(dir, "tokenizer.json");
    Ctx c = {path};
    int rc = 0;
    json_t *root = NULL;
    if (!fs_is_file(path)) {
        rc = err_set("no tokenizer.json in the folder (%s)", path);
    } else {
        json_error_t error;
        root = json_load_file(path, JSON_ALLOW_NUL, &error);
        if (!root) rc = err_set("invalid JSON: %s (%s:%d:%d)", error.text, path, error.line, error.column);
        else if (!json_is_object(root)) rc = err_set("tokenizer.json must hold an object (%s)", path);
    }
    if (rc == 0) rc = parse_model(&c, root, tok);
    if (rc == 0) rc = parse_added(&c, root, tok);
    json_t *part;
    if (rc == 0 && (part = json_object_get(root, "normalizer")) && !json_is_null(part)) {
        tok->has_normalizer = true;
        rc = parse_normalizer(&c, part, "normalizer", tok);
    }
    if (rc == 0 && (part = json_object_get(root, "pre_tokenizer")) && !json_is_null(part)) {
        tok->has_pre_tokenizer = true;
        rc = parse_pre_tokenizer(&c, part, "pre_tokenizer", tok);
    }
    if (rc == 0 && (part = json_object_get(root, "decoder")) && !json_is_null(part)) {
        tok->has_decoder = true;
        rc = parse_decoder(&c, part, "decoder", tok);
    }
    if (rc == 0 && (part = json_object_get(root, "post_processor")) && !json_is_null(part)) {
        tok->has_post_processor = true;
        rc = parse_post_processor(&c, part, "post_processor", tok);
    }
    json_decref(root);
    free(path);
    if (rc == 0) rc = load_config(dir, tok);
    if (rc == 0)
        for (int i = 0; i < tok->n_post_prefix + tok->n_post_suffix; i++) {
            int id = i < tok->n_post_prefix ? tok->post_prefix[i] : tok->post_suffix[i - tok->n_post_prefix];
            if (id >= tok->vocab_size)
                return err_set("post_processor adds id %d, outside the vocabulary of %d (%s/tokenizer.json)", id,
                               tok->vocab_size, dir);
        }
    return rc ? -1 : 0;
}
