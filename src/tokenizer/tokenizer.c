// Loading dispatch, the derived tables every loader needs, and the accessors.
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "tokenizer/internal.h"

static bool has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    bool gguf = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    fclose(f);
    return gguf;
}

int tokenizer_load(Tokenizer **out, const char *path) {
    *out = NULL;
    Tokenizer *tok = xcalloc(1, sizeof *tok);
    tok->bos_id = tok->eos_id = tok->pad_id = tok->unk_id = -1;
    tok->bpe.unk_id = -1;
    tok->path = xstrdup(path);
    int rc;
    if (fs_is_dir(path)) rc = tokenizer_load_hf(tok, path);
    else if (fs_is_file(path) && has_gguf_magic(path)) rc = tokenizer_load_gguf(tok, path);
    else if (!fs_exists(path)) rc = err_set("tokenizer path does not exist (%s)", path);
    else rc = err_set("not a Hugging Face folder or a GGUF file (%s)", path);
    if (rc != 0) {
        tokenizer_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}

int tokenizer_finish(Tokenizer *tok) {
    bpe_finish(&tok->bpe);
    int size = tok->bpe.n_ids;
    for (int i = 0; i < tok->n_added; i++) {
        if (tok->added[i].id < 0) return err_set("added token \"%s\" has a negative id (%s)", tok->added[i].content, tok->path);
        if (tok->added[i].id + 1 > size) size = tok->added[i].id + 1;
    }
    tok->vocab_size = size;
    tok->special = xcalloc((size_t)size, 1);
    tok->added_index = xmalloc((size_t)size * sizeof(int));
    for (int i = 0; i < size; i++) tok->added_index[i] = -1;
    EncodeScratch scratch = {0};
    scratch.md = pcre2_match_data_create(1, NULL);
    TokBuf normalized = {0};
    for (int i = 0; i < tok->n_added; i++) {
        AddedToken *a = &tok->added[i];
        strmap_put(&tok->added_map, a->content, strlen(a->content), i);
        tok->added_index[a->id] = i;
        if (a->special) tok->special[a->id] = 1;
        // A normalized added token is matched (and decoded) in its normalized form.
        if (a->normalized && tok->n_norm > 0) {
            tokenizer_normalize(tok, &scratch, a->content, strlen(a->content), &normalized);
            if (normalized.len != strlen(a->content) || memcmp(normalized.data, a->content, normalized.len) != 0) {
                a->normalized_content = xmalloc(normalized.len + 1);
                memcpy(a->normalized_content, normalized.data, normalized.len);
                a->normalized_content[normalized.len] = '\0';
            }
        }
    }
    free(normalized.data);
    encode_scratch_free(&scratch);
    added_trie_build(&tok->raw_trie, tok->added, tok->n_added, false);
    added_trie_build(&tok->norm_trie, tok->added, tok->n_added, true);
    int *special_ids[] = {&tok->bos_id, &tok->eos_id, &tok->pad_id, &tok->unk_id};
    for (int k = 0; k < 4; k++)
        if (*special_ids[k] >= size) *special_ids[k] = -1;
    tok->token_text = xcalloc((size_t)size, sizeof(char *));
    for (int id = 0; id < size; id++) {
        if (tok->added_index[id] >= 0) tok->token_text[id] = xstrdup(tok->added[tok->added_index[id]].content);
        else if (id < tok->bpe.n_ids && tok->bpe.pieces[id]) tok->token_text[id] = tokenizer_decode(tok, &id, 1, false);
    }
    return 0;
}

void tokenizer_free(Tokenizer *tok) {
    if (!tok) return;
    bpe_free(&tok->bpe);
    for (int i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].normalized_content);
    }
    free(tok->added);
    strmap_free(&tok->added_map);
    free(tok->added_index);
    added_trie_free(&tok->raw_trie);
    added_trie_free(&tok->norm_trie);
    for (int i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].text);
        tok_regex_free(&tok->norm[i].pattern);
    }
    free(tok->norm);
    for (int i = 0; i < tok->n_pre; i++) {
        tok_regex_free(&tok->pre[i].regex);
        free(tok->pre[i].replacement);
    }
    free(tok->pre);
    for (int i = 0; i < tok->n_dec; i++) {
        free(tok->dec[i].pattern);
        free(tok->dec[i].content);
        free(tok->dec[i].replacement);
        free(tok->dec[i].strip_content);
    }
    free(tok->dec);
    free(tok->post_prefix);
    free(tok->post_suffix);
    free(tok->special);
    free(tok->chat_template);
    if (tok->token_text)
        for (int i = 0; i < tok->vocab_size; i++) free(tok->token_text[i]);
    free(tok->token_text);
    free(tok->path);
    free(tok);
}

int tokenizer_vocab_size(const Tokenizer *tok) { return tok->vocab_size; }
int tokenizer_bos_id(const Tokenizer *tok) { return tok->bos_id; }
void tokenizer_set_chat_rendered(Tokenizer *tok, bool rendered) { tok->chat_rendered = rendered; }
int tokenizer_eos_id(const Tokenizer *tok) { return tok->eos_id; }
int tokenizer_pad_id(const Tokenizer *tok) { return tok->pad_id; }
int tokenizer_unk_id(const Tokenizer *tok) { return tok->unk_id; }
const char *tokenizer_chat_template(const Tokenizer *tok) { return tok->chat_template; }

const char *tokenizer_id_to_piece(const Tokenizer *tok, int id) {
    if (id < 0 || id >= tok->vocab_size) return NULL;
    if (tok->added_index[id] >= 0) return tok->added[tok->added_index[id]].content;
    return id < tok->bpe.n_ids ? tok->bpe.pieces[id] : NULL;
}

int tokenizer_piece_to_id(const Tokenizer *tok, const char *piece) {
    size_t len = strlen(piece);
    int a = strmap_get(&tok->added_map, piece, len);
    if (a >= 0) return tok->added[a].id;
    return strmap_get(&tok->bpe.vocab, piece, len);
}

bool tokenizer_is_special(const Tokenizer *tok, int id) {
    return id >= 0 && id < tok->vocab_size && tok->special[id];
}

const char *tokenizer_token_string(const Tokenizer *tok, int id) {
    return id >= 0 && id < tok->vocab_size ? tok->token_text[id] : NULL;
}

int tokenizer_first_difference(const Tokenizer *a, const Tokenizer *b) {
    const int common = a->vocab_size < b->vocab_size ? a->vocab_size : b->vocab_size;
    for (int id = 0; id < common; id++) {
        const char *x = tokenizer_id_to_piece(a, id), *y = tokenizer_id_to_piece(b, id);
        if ((x == NULL) != (y == NULL) || (x && strcmp(x, y) != 0)) return id;
    }
    return a->vocab_size == b->vocab_size ? -1 : common;
}

int tokenizer_check_same_ids(const Tokenizer *tok, const char *path, const char *option, const char *hint) {
    Tokenizer *other;
    if (tokenizer_load(&other, path) != 0) {
        char *why = xstrdup(err_msg());
        err_set("%s (%s)", why, option);
        free(why);
        return -1;
    }
    const int id = tokenizer_first_difference(tok, other);
    int rc = 0;
    if (id >= 0) {
        const char *ours = tokenizer_id_to_piece(tok, id), *theirs = tokenizer_id_to_piece(other, id);
        rc = err_set("the tokenizer of %s is not the one the token ids come from: id %d is %s%s%s there and %s%s%s here "
                     "(%d and %d ids) (%s)%s%s",
                     path, id, theirs ? "\"" : "", theirs ? theirs : "missing", theirs ? "\"" : "", ours ? "\"" : "",
                     ours ? ours : "missing", ours ? "\"" : "", other->vocab_size, tok->vocab_size, option,
                     hint ? ": " : "", hint ? hint : "");
    }
    tokenizer_free(other);
    return rc;
}

bool tokenizer_adds_bos(const Tokenizer *tok) {
    return tok->bos_id >= 0 && tok->n_post_prefix > 0 && tok->post_prefix[0] == tok->bos_id;
}
