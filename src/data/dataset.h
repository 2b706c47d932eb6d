// Datasets: the MA-RLHF paper's datasets in their Hugging Face schemas, and simple local
// formats, read into one common record with the prompt already formatted.
//
// Files. JSON Lines (one object per line; what `datasets`' Dataset.to_json() writes), or
// one JSON array of objects (a file whose first non-blank byte is "["). A UTF-8 byte
// order mark at the start is skipped. Every row is checked before it is parsed: at most
// max_row_bytes bytes, no NUL byte, valid UTF-8 (checked here, so that the message
// names the line and the field rather than jansson's column).
//
// Formats (DataFormat; names for data_format_parse() in brackets) and what they fill.
// The exact prompt rules are those of MA-RLHF's DeepSpeed-Chat raw_datasets.py (spec
// section 3.2); the response is appended to the prompt directly, with no separator.
//
//   TL;DR ["tldr", "summarize", "openai/summarize_from_feedback"], config `comparisons`:
//     {info: {id, post, title, subreddit, site?, article?}, summaries: [{text, policy,
//     note}, {...}], choice, worker, batch, split, extra}.
//     prompt   = prompt_format_tldr(info.subreddit, info.post): "POST\n" ["Subreddit:
//                r/" subreddit "\n"] post "\nTL;DR: "; when info.post is null or absent,
//                info.article with "ARTICLE\n" (CNN/DM items); info.title is not used
//     chosen   = summaries[choice].text, rejected = summaries[1 - choice].text
//     subreddit (NULL for a null subreddit), is_article, id = info.id
//   HH-RLHF ["hh", "Dahoas/full-hh-rlhf", "Dahoas/rm-static"]: {prompt, response, chosen,
//     rejected}. prompt = the prompt field as is ("\n\nHuman: ... \n\nAssistant:"),
//     chosen / rejected = the fields as is (they start with their own space).
//   WebGPT ["webgpt", "openai/webgpt_comparisons"]: {question: {full_text, dataset, id},
//     quotes_0, answer_0, tokens_0, score_0, quotes_1, answer_1, tokens_1, score_1}.
//     prompt   = " Human: " question.full_text " Assistant:"
//     chosen   = " " + the answer with the higher score, citations removed
//                (prompt_format_webgpt_response); a tie (score_0 >= score_1) -> answer_0
//     rejected = " " + the other answer, citations removed. id = question.id
//   APPS ["apps", "codeparrot/apps"]: {problem_id, question, solutions, input_output,
//     difficulty, url, starter_code}; solutions and input_output are JSON texts (a list
//     of strings; {"inputs": [...], "outputs": [...], "fn_name"?}), either may be "".
//     The paper's APPS prompt is not released (spec 7.4, 10.3, 15). This is our own
//     choice, the prompt of the APPS paper's generation script (Hendrycks et al. 2021,
//     generate_gpt_codes.py):
//       "\nQUESTION:\n" question ["\n" starter_code, if not empty]
//       ("\nUse Call-Based format" if input_output has a non-empty fn_name, else
//        "\nUse Standard Input format") "\nANSWER:\n"
//     chosen = the first solution (for SFT), or NULL when there is none. Metadata:
//     question, solutions, input_output (the JSON texts as stored), difficulty, url,
//     starter_code, call_based, id = problem_id in decimal.
//   Local formats, each prompt taken as is (apply a chat template before writing them):
//     SFT ["sft"]           {prompt, response}              chosen = response
//                           (or TRL's {prompt, completion}: chosen = completion; or TRL's
//                           language modeling {text}: prompt = "", chosen = text, so every
//                           token of it is trained, as TRL's SFT and DeepSpeed-Chat's PTX data)
//     pairs ["pairs"]       {prompt, chosen, rejected}; or TRL's implicit prompt
//                           {chosen, rejected} (also the raw Anthropic/hh-rlhf files,
//                           "\n\nHuman: ...\n\nAssistant: ..."): the prompt is their longest
//                           common prefix in characters, a space just before the first
//                           difference going to the responses, and when one is a prefix of
//                           the other (or they are equal) its last character going to the
//                           responses too (TRL's extract_prompt, Python's loop index); no
//                           common prefix, or one empty, is an error
//     ranked ["ranked"]     {prompt, responses: [best, ..., worst]}, K >= 2
//                           responses[], response_count; conversational: {prompt: [msgs],
//                           responses: [[msgs], ...]}, the responses' slots NULL until
//                           rendered
//     unpaired ["unpaired"] {prompt, completion, label}: TRL's unpaired preference (KTO),
//                           label true or false; the completion goes to chosen when the
//                           label is true, to rejected when it is false (the other stays
//                           NULL), so a pair reads as two unpaired examples
//     prompts ["prompts"]   {prompt} (PPO prompts)
//   Other fields of a row are ignored.
//
// Conversational rows (TRL's "Dataset formats and types"): where a local format expects a
// string, a list of messages [{"role": ..., "content": "..."}, ...] (role and content
// strings; an assistant message's "tool_calls" in OpenAI's form, its content then optional;
// other keys ignored). The lists are kept (record->conversation), with the row's "tools"
// (a list, or a string holding one) and "chat_template_kwargs" (enable_thinking,
// date_string), which TRL's trainers pass to the template, and rendered later with the
// model's chat template (data/chat_data.h), since this layer has no model:
//     SFT       {messages: [...]}: the prompt is every message before the last assistant
//               message, the response that message (messages after it are used only by
//               SFT's --completion-only-loss false, data/chat_data.h; a list without an
//               assistant message, or with nothing before it, is an error);
//               or {prompt: [msgs], completion: [msgs]}
//     pairs     {prompt: [msgs], chosen: [msgs], rejected: [msgs]}; or the implicit-prompt
//               {chosen: [conversation], rejected: [conversation]}: the prompt is their
//               longest common run of leading messages (TRL's extract_prompt: when one list
//               is a prefix of the other, all but the shorter one's last message)
//     unpaired  {prompt: [msgs], completion: [msgs], label}
//     prompts   {prompt: [msgs]}
//   A row is conversational when its "messages" is present, or (a preference row) its
//   "chosen" or "rejected" is a list, or (any other row) its "prompt" is a list; every row
//   of a file must be like the first. As TRL's maybe_extract_prompt, a preference row's
//   "prompt" of the other kind than its responses (a string beside lists, a list beside
//   strings) is not used: the prompt is extracted as for a row without one. Messages,
//   tools and template variables are checked here (a missing role, a content that is not a
//   string: "field \"prompt[1].role\" ..." with file:line).
//
// Auto-detection (DATA_FORMAT_AUTO) looks at the fields of the first row:
//   info + summaries -> TL;DR;  question + answer_0 + answer_1 -> WebGPT;
//   problem_id or question + input_output -> APPS;  prompt + responses -> ranked;
//   prompt + completion + label -> unpaired;
//   prompt + chosen + rejected -> HH when there is also `response`, else pairs;
//   messages -> SFT (conversational);  chosen + rejected, no prompt -> pairs (implicit prompt);
//   prompt + response (or completion) -> SFT;  prompt alone -> prompts (but chosen without rejected, or
//   the reverse, is an error);  text (no prompt) -> SFT. Every later row must then be of the same format.
//
// Renamed columns (DatasetLoadOptions.renames, data/column_renames.h): each row's fields are
// renamed before everything above, so a file with other names reads as the format's own.
//
// Errors (a missing field, a wrong JSON type, an empty file, invalid UTF-8, a row over
// the byte limit, choice not 0 or 1, fewer than 2 responses, malformed JSON, solutions or
// input_output that do not decode) return -1 with err_set() naming the field and the
// place: "field \"summaries[1].text\" is a number, expected a string (<file>:<line>)".
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct Tokenizer Tokenizer;
typedef struct ColumnRenames ColumnRenames;

typedef enum {
    DATA_FORMAT_AUTO,
    DATA_FORMAT_TLDR,
    DATA_FORMAT_HH,
    DATA_FORMAT_WEBGPT,
    DATA_FORMAT_APPS,
    DATA_FORMAT_SFT,
    DATA_FORMAT_PAIRS,
    DATA_FORMAT_RANKED,
    DATA_FORMAT_PROMPTS,
    DATA_FORMAT_UNPAIRED,
} DataFormat;

// One example. Every string is owned by the record (xmalloc'd); NULL where the format
// has no such field (see the table above).
typedef struct {
    char *prompt;           // formatted, ready to tokenize
    char *chosen;           // pairs: preferred; SFT: the response; APPS: first solution; unpaired: a desirable completion
    char *rejected;         // pairs: the other; unpaired: an undesirable completion
    char **responses;       // ranked: best first
    int response_count;     // 0 unless ranked (then >= 2)
    long row;               // 0-based index of the row in its file
    long line;              // 1-based line where the row starts
    char *id;               // the dataset's own id (TL;DR info.id, WebGPT question.id, APPS problem_id)
    char *subreddit;        // TL;DR; NULL for a null subreddit and for ARTICLE items
    bool is_article;        // TL;DR item with an article (CNN/DM) instead of a post
    bool text_only;         // a language-modeling {"text"} row: prompt "", the text in chosen
    // APPS
    char *question;
    char *solutions;        // JSON text of a list of strings, as stored ("" when none)
    char *input_output;     // JSON text, as stored ("" when none)
    char *difficulty;
    char *url;
    char *starter_code;     // "" when none
    bool call_based;        // input_output names a function (fn_name)
    char *raw;              // the row as read, compact JSON (dataset_load_keep_raw only; else NULL)
    // Preference pairs: TRL's optional "margin" column (the reward trainer's per-pair margin)
    bool has_margin;
    double margin;
    // Conversational rows (TRL's message formats, below): the message lists as compact JSON,
    // {"prompt": [...], "chosen"?: [...], "rejected"?: [...]} (SFT's response and a desirable
    // unpaired completion under "chosen", an undesirable one under "rejected"); prompt,
    // chosen and rejected above stay NULL until dataset_render_chat() (data/chat_data.h)
    // renders them with the model's chat template. NULL for a text row.
    char *conversation;
    // A {"messages"} row rendered turn by turn (dataset_render_turns, SFT's
    // --assistant-only-loss): turns[0] the text up to the first trained assistant message's
    // content (its generation prompt included), then in turn an assistant message's text and
    // the text up to the next one; the odd-numbered turns are trained. Their concatenation
    // is the whole conversation's rendering. NULL / 0 otherwise.
    char **turns;
    int turn_count;
} DataRecord;

typedef struct {
    DataRecord *records;
    long count;
    char *path;        // the file read
    DataFormat format; // as detected or forced
    bool conversational; // the rows hold messages (every row alike; data/chat_data.h renders them)
} Dataset;

// Default limit on one row's bytes (APPS rows carry whole test suites).
#define DATA_DEFAULT_MAX_ROW_BYTES ((size_t)64 << 20)

// Reads `path` in `format` (DATA_FORMAT_AUTO: detect). max_row_bytes: 0 for the default.
// On error *dataset is left empty (nothing to free).
int dataset_load(Dataset *dataset, const char *path, DataFormat format, size_t max_row_bytes);
// The same, keeping each row's own JSON in record->raw (a reward command is given it).
int dataset_load_keep_raw(Dataset *dataset, const char *path, DataFormat format, size_t max_row_bytes);
// What dataset_load_with() reads besides the path.
typedef struct {
    DataFormat format;            // DATA_FORMAT_AUTO: detect
    size_t max_row_bytes;         // 0: the default
    bool keep_raw;                // each row's own JSON in record->raw (as in the file, before renames)
    const ColumnRenames *renames; // fields renamed in every row before it is read (data/column_renames.h); NULL: none
} DatasetLoadOptions;
int dataset_load_with(Dataset *dataset, const char *path, const DatasetLoadOptions *options);
void dataset_free(Dataset *dataset);

// The canonical name of a format ("tldr", "hh", ...; "auto").
const char *data_format_name(DataFormat format);
// A name or Hugging Face dataset id (see the table above; case-sensitive) to a format.
// An unknown name is an error naming `option` (e.g. "--data-format").
int data_format_parse(const char *name, const char *option, DataFormat *format);

// A deep copy of record indices[0..count) of `source`, in that order (an index may
// repeat). Indices outside the dataset are an internal error.
void dataset_take(const Dataset *source, const long *indices, long count, Dataset *out);
// 0, or -1 with err_set() naming `option` and the file and line of the first language-modeling
// {"text"} row: for the commands whose rows must hold a prompt to answer (PPO's and infer's
// prompts), where such a row would be an empty prompt.
int dataset_require_prompts(const Dataset *dataset, const char *option);
// Whether the data set has rows and every one is a language-modeling {"text"} row (no prompt:
// SFT and PPO's PTX train every token of such rows).
bool dataset_text_rows_only(const Dataset *dataset);
void data_record_copy(const DataRecord *source, DataRecord *out);
void data_record_free(DataRecord *record);

// PPO prompts (spec 3.3): tokenizes each prompt as DS-Chat does (tokenizer(prompt), i.e.
// with the special tokens, add_special = true) and drops, in place and keeping the order,
// every record whose prompt is longer than max_prompt_tokens tokens (dropped, not
// truncated; exactly max_prompt_tokens is kept). *dropped: how many went (may be NULL).
int dataset_filter_prompt_length(Dataset *dataset, const Tokenizer *tok, int max_prompt_tokens, long *dropped);
