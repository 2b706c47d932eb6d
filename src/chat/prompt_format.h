// The paper's plain dataset prompts (MA-RLHF's DeepSpeed-Chat raw_datasets.py; spec
// section 3.2), byte for byte. These are not chat templates: the datasets hand the model
// raw text, and the response is appended to the prompt directly, with no separator.
//
//   TL;DR   "POST\n" ["Subreddit: r/" subreddit "\n"] post "\nTL;DR: "
//           ("ARTICLE\n" instead of "POST\n" for the CNN/DM items that have only an
//           article). The post title is not used. A NULL subreddit has no line; an empty
//           one still has "Subreddit: r/\n" (the reference tests `is not None`).
//   WebGPT  prompt " Human: " question " Assistant:"; response " " + the answer with its
//           citations removed, so that prompt + response =
//           " Human: " q " Assistant: " answer.
//   HH-RLHF the dataset's prompt field is already the transcript "\n\nHuman: ...
//           \n\nAssistant:"; to build one from turns use the chat template "hh".
//
// Each returns 0 with a new xmalloc'd string in *out (free() it).
#pragma once
#include <stdbool.h>

int prompt_format_tldr(const char *subreddit_or_NULL, const char *post, bool is_article, char **out);

int prompt_format_webgpt(const char *question, char **out);

// " " + answer with citations removed as the reference does, by two regular-expression
// passes (Python re, non-greedy, "." not matching a newline): first every
// ` [...]` / ` (...)` span with its leading space, then every `[...]` / `(...)` span.
// A span opens with "[" or "(" and ends at the first "]" or ")" on the same line, so
// "[a)" is a span and genuine parentheticals go too, as in the paper's data.
int prompt_format_webgpt_response(const char *answer, char **out);
