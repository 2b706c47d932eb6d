// The paper's plain dataset prompts; see prompt_format.h for the exact forms.
#include "chat/prompt_format.h"

#include <string.h>

#include "chat/template_families.h"
#include "core/check.h"

int prompt_format_tldr(const char *subreddit_or_NULL, const char *post, bool is_article, char **out) {
    CHECK(post, "prompt_format_tldr without a post");
    TextBuffer text = {0};
    text_append(&text, is_article ? "ARTICLE\n" : "POST\n");
    if (subreddit_or_NULL) {
        text_append(&text, "Subreddit: r/");
        text_append(&text, subreddit_or_NULL);
        text_append(&text, "\n");
    }
    text_append(&text, post);
    text_append(&text, "\nTL;DR: ");
    *out = text.data;
    return 0;
}

int prompt_format_webgpt(const char *question, char **out) {
    CHECK(question, "prompt_format_webgpt without a question");
    TextBuffer text = {0};
    text_append(&text, " Human: ");
    text_append(&text, question);
    text_append(&text, " Assistant:");
    *out = text.data;
    return 0;
}

// One pass of re.sub(pattern, "", s) for the patterns r" [\(\[].*?[\)\]]" (with_space)
// and r"[\(\[].*?[\)\]]": scanning left to right, at each position the shortest match
// (non-greedy) is removed and the scan resumes after it; where none starts, the byte is
// kept. "." does not match "\n", so a span cannot cross a line.
static char *remove_citation_spans(const char *s, bool with_space) {
    TextBuffer text = {0};
    text_append(&text, "");
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t open = with_space ? i + 1 : i;
        if ((!with_space || s[i] == ' ') && open < n && (s[open] == '(' || s[open] == '[')) {
            size_t close = open + 1;
            while (close < n && s[close] != '\n' && s[close] != ')' && s[close] != ']') close++;
            if (close < n && s[close] != '\n') {
                i = close + 1;
                continue;
            }
        }
        text_append_bytes(&text, s + i, 1);
        i++;
    }
    return text.data;
}

int prompt_format_webgpt_response(const char *answer, char **out) {
    CHECK(answer, "prompt_format_webgpt_response without an answer");
    char *first = remove_citation_spans(answer, true);
    char *second = remove_citation_spans(first, false);
    free(first);
    TextBuffer text = {0};
    text_append(&text, " ");
    text_append(&text, second);
    free(second);
    *out = text.data;
    return 0;
}
