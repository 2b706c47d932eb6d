// The parsing-based termination condition (spec §7.3), with link-grammar as the parser.
//
// The released code parses with benepar (a neural constituency parser in Python); here the
// constituent trees come from link-grammar (Debian liblink-grammar-dev, English dictionary),
// a C library that parses a sentence in about a millisecond. Its trees use the same Penn
// labels (S, NP, VP, PP, SBAR, ...) but are built from the link structure, so they are
// flatter than benepar's in places and not identical to them.
//
// Per response:
//  1. The response text is the concatenation of the token pieces; each token covers a byte
//     span of it. Work in byte offsets, never by re-tokenizing, so the leading-space
//     subtlety of the released code (" Word" vs "Word") cannot arise.
//  2. Sentences: split at a run of spaces that follows '.', '!' or '?', and at each newline
//     (§7.3 step 1); each piece, stripped of surrounding whitespace, is one sentence.
//  3. Every token belongs to the sentence and word (parser leaf) holding its first
//     non-space byte. Tokens of whitespace only (and empty pieces: EOS, or a token that
//     ends inside a UTF-8 character) join a neighbour: newline tokens (and whitespace
//     before them) join the token before, so the newlines between two sentences end the
//     earlier sentence's last macro action — the released code's intended "count the
//     newline tokens"; its `==` typo (§7.3 step 2, boundaries drifting left after each
//     newline) is deliberately not reproduced. Other whitespace joins the token after it
//     (a space starts the next word). Such trailing tokens are not counted in the walk.
//  4. The tree walk of §7.3 step 4 over the sentence's parse, counting each node's tokens:
//     a single-word node joins the preceding macro action (Rule 2); a node of >= 2 words
//     and fewer than C tokens is one macro action (Rule 1); larger nodes are opened. Every
//     sentence start is a boundary.
//  5. A sentence that link-grammar cannot parse or that does not look like English falls
//     back to fixed 5-grams from its start (the paper's fallback; the released code raises
//     instead) and is counted: no linkage at all, more than a quarter of its words unknown
//     to the dictionary or left unlinked (gibberish, code, other languages), more than
//     MAX_SENTENCE_WORDS words (parse time grows steeply and stays bounded this way), a
//     parse that ran out of time, or a tree whose words do not match the linkage's.
#include <langinfo.h>
#include <link-grammar/link-includes.h>
#include <locale.h>
#include <pthread.h>
#include <string.h>

#include "core/check.h"
#include "rl/macro.h"

enum {
    FALLBACK_NGRAM = 5,       // the paper's fallback: fixed 5-grams
    MAX_SENTENCE_WORDS = 40,  // longer sentences are not parsed (parse time ~0.1 s at 40)
    MAX_PARSE_SECONDS = 5,    // link-grammar's own time limit, a safety net only
};

// --- the process-wide parser -----------------------------------------------------------

static pthread_mutex_t parser_lock = PTHREAD_MUTEX_INITIALIZER;
static Dictionary parser_dictionary;
static Parse_Options parser_options;
static char parser_last_error[256];

// link-grammar reports through a per-thread handler; it would print debug and info lines
// (the dictionary's locale) to stderr otherwise. Keep the last error for our message.
static void parser_error_handler(lg_errinfo *info, void *data) {
    (void)data;
    if (info->severity <= lg_Error && info->text)
        snprintf(parser_last_error, sizeof parser_last_error, "%s", info->text);
}

// Called with parser_lock held.
static int parser_ensure(void) {
    lg_error_set_handler(parser_error_handler, NULL);
    if (parser_dictionary) return 0;
    // link-grammar needs a UTF-8 LC_CTYPE (it would force one itself, with a warning).
    const char *codeset = nl_langinfo(CODESET);
    if (!codeset || (strcmp(codeset, "UTF-8") && strcmp(codeset, "utf8")))
        if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "en_US.UTF-8");
    parser_last_error[0] = '\0';
    parser_dictionary = dictionary_create_lang("en");
    if (!parser_dictionary)
        return err_set("cannot load link-grammar's English dictionary (Debian: link-grammar-dictionaries-en)%s%s",
                       parser_last_error[0] ? ": " : "", parser_last_error);
    parser_options = parse_options_create();
    parse_options_set_verbosity(parser_options, 0);
    parse_options_set_spell_guess(parser_options, 0); // deterministic and fast on unknown words
    parse_options_set_repeatable_rand(parser_options, true);
    parse_options_set_max_parse_time(parser_options, MAX_PARSE_SECONDS);
    return 0;
}

void macro_parsing_shutdown(void) {
    pthread_mutex_lock(&parser_lock);
    if (parser_options) parse_options_delete(parser_options);
    if (parser_dictionary) dictionary_delete(parser_dictionary);
    parser_options = NULL;
    parser_dictionary = NULL;
    pthread_mutex_unlock(&parser_lock);
}

// --- one sentence's parse --------------------------------------------------------------

// A node of the constituent tree: a word (leaf) or a constituent. Its words are the leaves
// [leaf_begin, leaf_end), contiguous because the tree keeps the sentence's word order.
typedef struct {
    int first_child, next_sibling; // -1: none
    int leaf_begin, leaf_end;
    bool is_leaf;
    const char *label; // constituent label inside the tree string (not NUL-terminated)
    int label_length;
} TreeNode;

typedef struct {
    TreeNode *nodes; // nodes[0] is the whole sentence (a virtual root over the top level)
    int node_count;
    int *word_start, *word_end; // byte span of each leaf in the sentence
    int word_count;
    char *tree; // link-grammar's bracketed tree (xmalloc'd)
} SentenceParse;

static void sentence_parse_free(SentenceParse *p) {
    free(p->nodes);
    free(p->word_start);
    free(p->word_end);
    free(p->tree);
    *p = (SentenceParse){0};
}

static int tree_add_node(SentenceParse *p, int parent, int *last_child) {
    int id = p->node_count++;
    p->nodes[id] = (TreeNode){.first_child = -1, .next_sibling = -1};
    if (last_child[parent] < 0)
        p->nodes[parent].first_child = id;
    else
        p->nodes[last_child[parent]].next_sibling = id;
    last_child[parent] = id;
    last_child[id] = -1;
    return id;
}

// Reads link-grammar's flat bracketed tree, "[S [NP the cat.n NP] [VP sat.v-d VP] . S]":
// "[X" opens, "X]" closes, anything else is a word (link-grammar turns brackets inside
// words into braces, so the three cases are unambiguous). Unlike its treebank-style tree,
// this form keeps every word, also those after the first top-level constituent. Returns
// false if the brackets do not nest.
static bool tree_read(SentenceParse *p, const char *tree) {
    size_t length = strlen(tree);
    p->nodes = xmalloc(sizeof(TreeNode) * (length + 1));
    int *last_child = xmalloc(sizeof(int) * (length + 1));
    int *stack = xmalloc(sizeof(int) * (length + 1));
    int root = 0;
    p->nodes[root] = (TreeNode){.first_child = -1, .next_sibling = -1};
    last_child[root] = -1;
    p->node_count = 1;
    int depth = 0, leaves = 0;
    stack[depth++] = root;
    bool ok = true;
    for (const char *s = tree; *s && ok;) {
        while (*s == ' ' || *s == '\n') s++;
        if (!*s) break;
        const char *word = s;
        while (*s && *s != ' ' && *s != '\n') s++;
        int n = (int)(s - word);
        int top = stack[depth - 1];
        if (n > 1 && word[0] == '[') {
            int id = tree_add_node(p, top, last_child);
            p->nodes[id].label = word + 1;
            p->nodes[id].label_length = n - 1;
            p->nodes[id].leaf_begin = leaves;
            stack[depth++] = id;
        } else if (n > 1 && word[n - 1] == ']') {
            TreeNode *open = &p->nodes[top];
            ok = depth > 1 && open->label_length == n - 1 && !memcmp(open->label, word, (size_t)n - 1);
            if (ok) {
                open->leaf_end = leaves;
                depth--;
            }
        } else {
            int id = tree_add_node(p, top, last_child);
            p->nodes[id].is_leaf = true;
            p->nodes[id].leaf_begin = leaves;
            p->nodes[id].leaf_end = ++leaves;
        }
    }
    p->nodes[root].leaf_begin = 0;
    p->nodes[root].leaf_end = leaves;
    free(last_child);
    free(stack);
    return ok && depth == 1 && leaves == p->word_count;
}

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF). link-grammar assumes it; token pieces from tokenizer_stream_push() always are,
// but a caller's arbitrary bytes might not be, and such a sentence falls back instead.
static bool utf8_well_formed(const unsigned char *s) {
    while (*s) {
        unsigned c = *s;
        int extra;
        unsigned min, code;
        if (c < 0x80) {
            s++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            extra = 1, min = 0x80, code = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, min = 0x800, code = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, min = 0x10000, code = c & 0x07;
        } else {
            return false;
        }
        for (int k = 1; k <= extra; k++) {
            if ((s[k] & 0xC0) != 0x80) return false; // also stops at the NUL
            code = (code << 6) | (s[k] & 0x3F);
        }
        if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
        s += extra + 1;
    }
    return true;
}

// Parses one sentence (NUL-terminated, no surrounding whitespace). Returns true with the
// words' spans and tree in *p, or false if the sentence falls back (see the top of the file).
// Called with parser_lock held.
static bool parse_sentence(const char *text, SentenceParse *p) {
    *p = (SentenceParse){0};
    if (!utf8_well_formed((const unsigned char *)text)) return false;
    Sentence sentence = sentence_create(text, parser_dictionary);
    if (!sentence) return false;
    bool ok = false;
    Linkage linkage = NULL;
    if (sentence_split(sentence, parser_options) != 0) goto done;
    int length = sentence_length(sentence); // words plus the two walls
    if (length < 3 || length > MAX_SENTENCE_WORDS + 2) goto done;
    // A complete linkage if there is one, else the fewest unlinked words (as link-parser does).
    parse_options_set_min_null_count(parser_options, 0);
    parse_options_set_max_null_count(parser_options, 0);
    parse_options_reset_resources(parser_options);
    int found = sentence_parse(sentence, parser_options);
    if (found == 0 && !parse_options_resources_exhausted(parser_options)) {
        parse_options_set_min_null_count(parser_options, 1);
        parse_options_set_max_null_count(parser_options, length);
        found = sentence_parse(sentence, parser_options);
    }
    if (found <= 0 || parse_options_resources_exhausted(parser_options)) goto done;
    linkage = linkage_create(0, sentence, parser_options);
    if (!linkage) goto done;

    int words = (int)linkage_get_num_words(linkage) - 2;
    if (words < 1 || strcmp(linkage_get_word(linkage, 0), "LEFT-WALL") ||
        strcmp(linkage_get_word(linkage, (size_t)words + 1), "RIGHT-WALL"))
        goto done;
    int unknown = 0;
    for (int w = 1; w <= words; w++)
        if (strstr(linkage_get_word(linkage, (size_t)w), "[?]")) unknown++;
    if (4 * (unknown + sentence_null_count(sentence)) > words) goto done;

    p->word_count = words;
    p->word_start = xmalloc(sizeof(int) * (size_t)words);
    p->word_end = xmalloc(sizeof(int) * (size_t)words);
    int text_length = (int)strlen(text), previous_end = 0;
    for (int w = 0; w < words; w++) {
        p->word_start[w] = (int)linkage_get_word_byte_start(linkage, (size_t)w + 1);
        p->word_end[w] = (int)linkage_get_word_byte_end(linkage, (size_t)w + 1);
        // Words must be in text order and inside the sentence for the alignment to hold.
        if (p->word_start[w] < previous_end || p->word_end[w] < p->word_start[w] || p->word_end[w] > text_length)
            goto done;
        previous_end = p->word_end[w];
    }
    char *tree = linkage_print_constituent_tree(linkage, BRACKET_TREE);
    if (!tree) goto done;
    p->tree = xstrdup(tree);
    linkage_free_constituent_tree_str(tree);
    ok = tree_read(p, p->tree);
done:
    if (linkage) linkage_delete(linkage);
    sentence_delete(sentence);
    if (!ok) sentence_parse_free(p);
    return ok;
}

char *macro_parsing_tree(const char *sentence) {
    pthread_mutex_lock(&parser_lock);
    char *tree = NULL;
    if (parser_ensure() == 0) {
        SentenceParse p;
        if (parse_sentence(sentence, &p)) {
            tree = p.tree;
            p.tree = NULL;
            size_t n = strlen(tree);
            while (n > 0 && (tree[n - 1] == ' ' || tree[n - 1] == '\n')) tree[--n] = '\0';
            sentence_parse_free(&p);
        }
    }
    pthread_mutex_unlock(&parser_lock);
    return tree;
}

// --- the response: tokens, sentences, words ---------------------------------------------

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

typedef struct {
    int start, end; // byte span of the stripped sentence in the response text
} TextSpan;

// §7.3 step 1: pieces between separators (a run of spaces after '.', '!' or '?'; a
// newline), stripped of surrounding whitespace; empty pieces are skipped.
static int split_sentences(const char *text, int length, TextSpan *out) {
    int count = 0, piece_start = 0;
    for (int i = 0; i <= length; i++) {
        int separator = 0;
        if (i == length)
            separator = 1;
        else if (text[i] == '\n')
            separator = 1;
        else if (text[i] == ' ' && i > 0 && (text[i - 1] == '.' || text[i - 1] == '!' || text[i - 1] == '?'))
            while (i + separator < length && text[i + separator] == ' ') separator++;
        if (!separator) continue;
        int start = piece_start, end = i;
        while (start < end && is_space(text[start])) start++;
        while (end > start && is_space(text[end - 1])) end--;
        if (end > start) out[count++] = (TextSpan){start, end};
        i += separator - 1;
        piece_start = i + 1;
    }
    return count;
}

// The DFS of §7.3 step 4 over one sentence. `local` holds boundary offsets (tokens from
// the sentence start); token_end[w] is the token offset just after word w's tokens.
typedef struct {
    const SentenceParse *parse;
    const int *token_end;
    int cutoff;
    int *local;
    int local_count;
    int offset;
} TreeWalk;

static int node_tokens(const TreeWalk *walk, const TreeNode *node) {
    if (node->leaf_end == node->leaf_begin) return 0;
    int before = node->leaf_begin > 0 ? walk->token_end[node->leaf_begin - 1] : 0;
    return walk->token_end[node->leaf_end - 1] - before;
}

static void walk_children(TreeWalk *walk, const TreeNode *node) {
    for (int c = node->first_child; c >= 0; c = walk->parse->nodes[c].next_sibling) {
        const TreeNode *child = &walk->parse->nodes[c];
        int words = child->leaf_end - child->leaf_begin, tokens = node_tokens(walk, child);
        if (words == 0) continue;
        if (words == 1) { // Rule 2: extend the preceding macro action
            walk->offset += tokens;
            walk->local[walk->local_count - 1] = walk->offset;
        } else if (tokens < walk->cutoff) { // Rule 1: one macro action
            walk->offset += tokens;
            walk->local[walk->local_count++] = walk->offset;
        } else {
            walk_children(walk, child);
        }
    }
}

// Marks the segment starts of one parsed sentence whose tokens are [first, first+count);
// word_of[j] is the word of token first+j.
static void mark_parsed_sentence(const SentenceParse *parse, const int *word_of, int first, int count, int cutoff,
                                 bool *is_start) {
    int *token_end = xcalloc((size_t)parse->word_count, sizeof(int));
    for (int j = 0; j < count; j++) token_end[word_of[j]] = j + 1;
    for (int w = 1; w < parse->word_count; w++) // a word without tokens ends where the previous did
        if (token_end[w] < token_end[w - 1]) token_end[w] = token_end[w - 1];
    CHECK(token_end[parse->word_count - 1] == count, "every token of a sentence belongs to a word");

    TreeWalk walk = {.parse = parse, .token_end = token_end, .cutoff = cutoff, .offset = 0};
    walk.local = xmalloc(sizeof(int) * ((size_t)parse->node_count + 2));
    walk.local[walk.local_count++] = 0;
    const TreeNode *root = &parse->nodes[0];
    int words = root->leaf_end - root->leaf_begin;
    if (words >= 2 && count >= cutoff) walk_children(&walk, root);
    // (Otherwise the whole sentence is one macro action.) Offset 0 is always a boundary.
    is_start[first] = true;
    for (int k = 0; k < walk.local_count; k++)
        if (walk.local[k] < count) is_start[first + walk.local[k]] = true;
    free(walk.local);
    free(token_end);
}

int macro_parsing_starts(int cutoff, int R, const char *const *token_text, bool *is_start, int *fallbacks) {
    CHECK(R >= 1 && cutoff >= 1, "bad parsing arguments");
    is_start[0] = true;

    // The response text and each token's byte span.
    int *token_start = xmalloc(sizeof(int) * ((size_t)R + 1));
    size_t total = 0;
    for (int j = 0; j < R; j++) {
        token_start[j] = (int)total;
        total += token_text[j] ? strlen(token_text[j]) : 0;
    }
    token_start[R] = (int)total;
    CHECK(total < (size_t)1 << 30, "response text too long");
    char *text = xmalloc(total + 1);
    for (int j = 0; j < R; j++)
        if (token_text[j]) memcpy(text + token_start[j], token_text[j], (size_t)(token_start[j + 1] - token_start[j]));
    text[total] = '\0';

    // Each token's anchor: its first non-space byte, or -1 for whitespace and empty pieces.
    int *anchor = xmalloc(sizeof(int) * (size_t)R);
    int *donor = xmalloc(sizeof(int) * (size_t)R); // the token whose sentence and word it takes
    int anchored = 0;
    for (int j = 0; j < R; j++) {
        anchor[j] = -1;
        for (int b = token_start[j]; b < token_start[j + 1]; b++)
            if (!is_space(text[b])) {
                anchor[j] = b;
                break;
            }
        if (anchor[j] >= 0) anchored++;
    }
    if (anchored == 0) goto done; // nothing to parse: one macro action (and the final token)
    // Each run of unanchored tokens between two anchored ones: up to its last newline it
    // joins the token before (newlines end the macro action before them), after it the
    // token after (a space starts the next word). Split this way, donors never decrease.
    for (int j = 0, previous = -1; j < R;) {
        if (anchor[j] >= 0) {
            donor[j] = previous = j;
            j++;
            continue;
        }
        int run_end = j, last_newline = -1;
        for (; run_end < R && anchor[run_end] < 0; run_end++)
            if (memchr(text + token_start[run_end], '\n', (size_t)(token_start[run_end + 1] - token_start[run_end])))
                last_newline = run_end;
        int next = run_end < R ? run_end : -1;
        for (int k = j; k < run_end; k++) {
            bool joins_previous = previous >= 0 && (k <= last_newline || next < 0);
            donor[k] = joins_previous ? previous : next;
        }
        j = run_end;
    }

    TextSpan *sentences = xmalloc(sizeof(TextSpan) * (total / 2 + 2));
    int sentence_count = split_sentences(text, (int)total, sentences);
    CHECK(sentence_count >= 1, "a text with non-space bytes has a sentence");

    // The sentence of each token (through its donor); anchors increase with j, so a single
    // forward scan finds them, and each sentence's tokens are contiguous.
    int *sentence_of = xmalloc(sizeof(int) * (size_t)R);
    for (int j = 0, s = 0; j < R; j++) {
        if (anchor[j] < 0) continue;
        while (s < sentence_count && anchor[j] >= sentences[s].end) s++;
        CHECK(s < sentence_count && anchor[j] >= sentences[s].start, "a non-space byte outside every sentence");
        sentence_of[j] = s;
    }
    for (int j = 0; j < R; j++) sentence_of[j] = sentence_of[donor[j]];

    int *word_of = xmalloc(sizeof(int) * (size_t)R);
    for (int first = 0; first < R;) {
        int s = sentence_of[first], count = 1;
        while (first + count < R && sentence_of[first + count] == s) count++;
        // Whitespace after the sentence's last word (newlines; at the end, EOS) is not part
        // of the sentence's text: it extends its last macro action without being counted
        // in the tree walk, as the released code's newline offset intends (and the parse
        // of a decoded response, which has no EOS).
        int walk_count = count;
        while (walk_count > 0 && anchor[first + walk_count - 1] < 0) walk_count--;
        CHECK(walk_count >= 1, "a sentence's tokens include an anchored one");
        int length = sentences[s].end - sentences[s].start;
        char *sentence = xmalloc((size_t)length + 1);
        memcpy(sentence, text + sentences[s].start, (size_t)length);
        sentence[length] = '\0';

        SentenceParse parse;
        pthread_mutex_lock(&parser_lock);
        int rc = parser_ensure();
        bool parsed = rc == 0 && parse_sentence(sentence, &parse);
        pthread_mutex_unlock(&parser_lock);
        free(sentence);
        if (rc != 0) {
            free(word_of);
            free(sentence_of);
            free(sentences);
            free(anchor);
            free(donor);
            free(text);
            free(token_start);
            return -1;
        }
        if (parsed) {
            // The word of each anchored token: the word holding its anchor, or the last word
            // starting before it (bytes link-grammar left out of every word).
            for (int j = 0, w = 0; j < walk_count; j++) {
                int t = first + j;
                if (anchor[t] < 0) continue;
                int at = anchor[t] - sentences[s].start;
                while (w + 1 < parse.word_count && parse.word_start[w + 1] <= at) w++;
                word_of[j] = w;
            }
            for (int j = 0; j < walk_count; j++) {
                int d = donor[first + j];
                if (anchor[first + j] < 0) word_of[j] = word_of[d - first];
            }
            mark_parsed_sentence(&parse, word_of, first, walk_count, cutoff, is_start);
            sentence_parse_free(&parse);
        } else {
            for (int j = 0; j < walk_count; j += FALLBACK_NGRAM) is_start[first + j] = true;
            (*fallbacks)++;
        }
        first += count;
    }
    free(word_of);
    free(sentence_of);
    free(sentences);
done:
    free(anchor);
    free(donor);
    free(text);
    free(token_start);
    return 0;
}
