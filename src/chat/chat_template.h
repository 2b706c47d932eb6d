// Chat templates: a conversation (system/user/assistant messages) into the exact text
// transformers' `tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...)` gives, without a Jinja engine.
//
// A model publishes its template as Jinja source (tokenizer_config.json "chat_template",
// GGUF "tokenizer.chat_template"). marlhf does not interpret that source: it recognises
// which *family* (and variant) it is and renders with C code written for that family.
//
// Recognition rule (chat_template_from_source):
//  1. Exact: the source, after whitespace normalisation, equals one of the published
//     templates marlhf knows (kept as the 64-bit FNV-1a hash of the normalised text; the
//     sources are in tools/make_chat_template_fixtures.py). Normalising changes only
//     whitespace that cannot reach the output: inside a tag ({{ }}, {% %}, {# #}) and
//     outside string literals, a run of ASCII whitespace becomes one space and none is
//     kept next to the delimiters; string literals keep every character, a "\n" escape
//     counting as the newline it stands for; text between tags is kept; whitespace at
//     both ends of the source is dropped. So `{{'x'}}` and `{{ 'x' }}` match, and so do
//     a "\n" escape and a real newline inside a string; `'a  b'` and `'a b'` do not.
//  2. Markers (fallback), tried in this order, for templates edited or republished:
//       qwen3     "<|im_start|>", "<|im_end|>", "<think>", "enable_thinking" and
//                 "reasoning_content.strip(" (how Qwen3's writes its think block). Other
//                 reasoning templates stay unrecognised: QwQ's and Qwen3-*-Thinking-2507's
//                 (no enable_thinking; their generation prompt always opens "<think>\n")
//                 and ones that trim the reasoning ("reasoning_content|trim") instead.
//       chatml    "<|im_start|>" and "<|im_end|>", and no "<think>" (reasoning templates
//                 render differently). Default system turn: the literal text of a
//                 '<|im_start|>system\n...<|im_end|>' string in the source, if any.
//       llama3    "<|start_header_id|>" and "<|eot_id|>"; the 3.1 system header if the
//                 source has "Cutting Knowledge Date" (date: `set date_string = "..."`
//                 if present; today's date if the template calls strftime_now, as
//                 transformers provides it, and then the variant is llama3.2; otherwise
//                 "26 Jul 2024").
//       gemma     "<start_of_turn>" and "<end_of_turn>"; a system turn is refused if the
//                 source says "System role not supported", else folded into the first
//                 user turn (Gemma 3).
//       llama2    "[INST]" and "<<SYS>>" (Mistral's "[INST]" without "<<SYS>>" is not).
//       zephyr    "<|user|>", "<|assistant|>" and "eos_token", and no "<|end|>" (Phi-3).
//     A marker match renders as that family's published variant; details a modified
//     template adds beyond those switches are not seen.
//  3. Otherwise: "unrecognised chat template in <file> (pass --chat-template NAME or a
//     template file)".
//
// Families and names (chat_template_from_name):
//   chatml    ChatML, no default system turn (OpenHermes-2.5)
//   smollm2   ChatML, default system "You are a helpful AI assistant named SmolLM,
//             trained by Hugging Face" (SmolLM2-*-Instruct)
//   qwen2     ChatML, default system "You are a helpful assistant." (Qwen2-*-Instruct)
//   qwen2.5   ChatML, default system "You are Qwen, created by Alibaba Cloud. You are a
//             helpful assistant." (Qwen2.5-*-Instruct), with its tools (see below)
//   qwen3     Qwen3's hybrid-thinking ChatML (Qwen3-0.6B ... Qwen3-235B-A22B). Two published
//             sources are known exactly and render alike for text contents: the first
//             release's (April 2025; llama.cpp keeps it as models/templates/Qwen-Qwen3-0.6B.jinja)
//             and the revised one of the later tokenizer_config.json. No default system turn.
//             Assistant turns are split as the template splits them: the reasoning is the
//             text before the first "</think>" (after its last "<think>"), the answer the
//             text after the last "</think>"; newlines (no other whitespace) are taken off
//             both ends of the reasoning and the start of the answer. Before
//             the last user query (the last user turn that is not one whole
//             "<tool_response>...</tool_response>") only the answer is kept; after it a turn
//             is "<think>\n" reasoning "\n</think>\n\n" answer when its reasoning is not
//             empty or it is the last turn. enable_thinking (the Jinja variable; undefined
//             means on) off ends the generation prompt with "<think>\n\n</think>\n\n"
//             (chat_template_disable_thinking, `--no-thinking`). Tools as below; a separate
//             reasoning_content field is not supported.
//   llama2    [INST] <<SYS>> ... with bos/eos per turn (Llama-2-*-chat)
//   llama3    <|start_header_id|>role<|end_header_id|>, bos first (Meta-Llama-3-*-Instruct)
//   llama3.1  llama3 plus the system header "Cutting Knowledge Date: December 2023" /
//             "Today Date: <date_string>" (Llama-3.1-*-Instruct), with its tools (see below)
//   llama3.2  the same with today's date, strftime_now("%d %b %Y") (Llama-3.2-1B/3B-Instruct;
//             Llama 3.3's template is recognised as this one by its markers)
//   gemma     <start_of_turn>user ... model; a system message is an error (Gemma 1, 2)
//   gemma3    the same, the system message folded into the first user turn (Gemma 3)
//   zephyr    <|system|> <|user|> <|assistant|>, eos after each (zephyr-7b-beta, TinyLlama-Chat)
//   hh        the paper's HH-RLHF transcript: "\n\nHuman: " q "\n\nAssistant: " a ...,
//             generation prompt "\n\nAssistant:" (no system role; turns alternate)
//   webgpt    the paper's WebGPT prompt: " Human: " q " Assistant: " a ..., generation
//             prompt " Assistant:" (no system role; turns alternate)
//
// Tools (chat_template_render_tools): four published templates render OpenAI-style tools
// (the `tools` argument of apply_chat_template), assistant messages with tool_calls and
// messages of role "tool", and are known exactly (by their source's hash or by name; one
// recognised by its markers may have changed the tool branches, so it is refused tools):
//   qwen2.5, qwen3  Hermes style: the tools as one JSON line each (tojson) inside <tools>
//                   in the system turn, calls as <tool_call>\n{"name": ..., "arguments":
//                   ...}\n</tool_call>, tool turns as <tool_response> blocks in a user turn
//                   (CHAT_TOOLS_HERMES).
//   llama3.1, 3.2   the tools as tojson(indent=4) in the first user turn, "Environment:
//                   ipython" in the system header, a call as {"name": ..., "parameters": ...}
//                   (one per assistant turn: the template raises on more), tool turns as
//                   ipython turns whose text is tojson'd, quotes included
//                   (CHAT_TOOLS_LLAMA3_JSON).
// JSON is written as transformers' tojson writes it (python_json.h). Any other template
// given tools, a tool call or a tool message is an error saying so.
//
// Rendering follows the template's own rules, errors included: Llama-2, Gemma, hh and
// webgpt raise "Conversation roles must alternate user/assistant/user/assistant/..." and
// Gemma 1/2, hh and webgpt "System role not supported" where the template would. Roles
// other than system/user/assistant (and "tool" for the tool-calling templates), NULL content
// and an empty conversation are errors.
// Contents are bytes (UTF-8); where a template trims ("| trim", ".strip()"), the
// characters Python's str.strip() removes are removed (Unicode whitespace included).
#pragma once
#include <jansson.h>
#include <stdbool.h>

// A call an assistant message made (OpenAI's tool_calls[i].function).
typedef struct {
    const char *name;
    const char *arguments; // JSON text (the API's arguments string), rendered as the parsed
                           // value, as vLLM hands templates a dict
} ChatToolCall;

typedef struct {
    const char *role;    // "system", "user", "assistant" or (tool-calling templates) "tool"
    const char *content; // UTF-8 text
    const ChatToolCall *tool_calls; // assistant: the calls it made (num_tool_calls of them; 0: none)
    int num_tool_calls;
} ChatMessage;

// How a template's model writes tool calls, which is how the server parses them
// (serve/tool_calls.h).
typedef enum {
    CHAT_TOOLS_NONE,        // the template renders no tools
    CHAT_TOOLS_HERMES,      // <tool_call>{"name", "arguments"}</tool_call> (Qwen2.5, Qwen3)
    CHAT_TOOLS_LLAMA3_JSON, // a bare {"name", "parameters"} object (Llama 3.1)
} ChatToolSyntax;

typedef enum {
    CHAT_FAMILY_CHATML,
    CHAT_FAMILY_QWEN3,
    CHAT_FAMILY_LLAMA2,
    CHAT_FAMILY_LLAMA3,
    CHAT_FAMILY_GEMMA,
    CHAT_FAMILY_ZEPHYR,
    CHAT_FAMILY_HH,
    CHAT_FAMILY_WEBGPT,
} ChatFamily;

typedef struct {
    ChatFamily family;
    const char *name;            // variant name, as chat_template_from_name takes it (static)
    bool exact;                  // a published template, or forced by name (false: by markers)
    char *default_system;        // chatml: system turn when messages[0] is not one (NULL: none)
    bool llama31_system_header;  // llama3: the 3.1 "Cutting Knowledge Date" system header
    char date_string[32];        // llama3.1 header date; the caller may overwrite it
    bool fold_system_into_user;  // gemma: Gemma 3's behaviour (else a system turn is an error)
    bool enable_thinking;        // qwen3: the template's enable_thinking (true, its default, unless
                                 // chat_template_disable_thinking); other families ignore it
    char *bos_token;             // "" if the tokenizer has none
    char *eos_token;
    char *source_path;           // where the template came from, for messages (NULL: by name)
    ChatToolSyntax tool_syntax;  // the variant's; in effect only when `exact` (chat_template_tool_syntax)
    bool tools_in_user_message;  // llama3.1/3.2: the tools before the first user message (the
                                 // template's default, true) or, false, in the system turn
} ChatTemplate;

// Recognises `jinja_source` (see the rule above). `bos_token`/`eos_token` are the
// tokenizer's (NULL: none, rendered as "" like Jinja's undefined); `source_path` names
// the file in errors (may be NULL). Returns 0, or -1 with err_set().
int chat_template_from_source(ChatTemplate *t, const char *jinja_source, const char *bos_token,
                              const char *eos_token, const char *source_path);

// A family forced by name (list above). Unknown names are an error listing the names.
int chat_template_from_name(ChatTemplate *t, const char *name, const char *bos_token,
                            const char *eos_token);

// A template file: a tokenizer_config.json (its "chat_template", a string or the list of
// {name, template} whose "default" entry is taken; bos/eos from its "bos_token" /
// "eos_token" where the arguments are NULL) or a file holding the Jinja source itself.
int chat_template_from_file(ChatTemplate *t, const char *path, const char *bos_token,
                            const char *eos_token);

// What `--chat-template X` means: a name from the list above, else a template file.
int chat_template_from_option(ChatTemplate *t, const char *name_or_path, const char *bos_token,
                              const char *eos_token);

// Renders as transformers does with apply_chat_template(..., enable_thinking=False) (what
// `--no-thinking` asks for). Only a template that reads that variable (qwen3) has the
// switch: for any other, -1 with err_set() rather than a flag that silently does nothing.
int chat_template_disable_thinking(ChatTemplate *t);

// The conversation as text, in a new xmalloc'd string (free() it). 0, or -1 with err_set()
// when the template refuses the conversation (out is then NULL).
int chat_template_render(const ChatTemplate *t, const ChatMessage *messages, int count,
                         bool add_generation_prompt, char **out);

// The same with OpenAI-style tools: `tools_json` a JSON array of tool objects ({"type":
// "function", "function": {"name", "description", "parameters"}}), rendered as the client
// sent them, or NULL for no tools (an empty array is passed to the template as one: Llama
// 3.1's tests `tools is not none`). Tools, tool calls or tool messages on a template whose
// chat_template_tool_syntax is CHAT_TOOLS_NONE are an error.
int chat_template_render_tools(const ChatTemplate *t, const ChatMessage *messages, int count, const char *tools_json,
                               bool add_generation_prompt, char **out);

// The template variables a request or a dataset row may set (vLLM's and TRL's
// chat_template_kwargs), applied to t, a copy of the template that borrows the original's
// strings: "enable_thinking" (true or false; Qwen3's switch), "date_string" (a string under
// 32 bytes; the date of Llama 3.1's and 3.2's system header), "tools_in_user_message" (true
// or false; Llama 3.1's and 3.2's tools before the first user message or, false, in the
// system turn). No Jinja runs here, so any other key, a value of another type, or a
// variable the template does not read is -1 with err_set() naming it
// ("chat_template_kwargs.date_string: ..."). With t NULL only the keys and types are
// checked (a dataset at load, before the template is known). kwargs NULL: nothing to do.
int chat_template_apply_kwargs(ChatTemplate *t, const json_t *kwargs);

// The tool-call syntax of the template: its variant's when it is known exactly, else
// CHAT_TOOLS_NONE.
ChatToolSyntax chat_template_tool_syntax(const ChatTemplate *t);
// 0 when the template renders tools (chat_template_tool_syntax is not CHAT_TOOLS_NONE), else
// -1 with err_set() saying why (no tool calling, or recognised only by its markers).
int chat_template_check_tools(const ChatTemplate *t);

const char *chat_template_name(const ChatTemplate *t);        // "qwen2.5", "llama3.1", ...
const char *chat_family_name(ChatFamily family);               // "chatml", "llama3", ...
void chat_template_free(ChatTemplate *t);

// The recognition key of a source: FNV-1a 64 of its normalised text (exposed for tests
// and for adding a published template to the table in chat_template.c).
unsigned long long chat_template_source_hash(const char *jinja_source);
