// Recognising a chat template (exactly, or by its markers), naming families, reading
// template files, and the checks every rendering starts with. The renderers themselves
// are in template_families.c. The rules are described in chat_template.h.
#include "chat/chat_template.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "chat/template_families.h"
#include "core/check.h"
#include "io/fs.h"

// --- variants ----------------------------------------------------------------------------

typedef struct {
    const char *name;
    ChatFamily family;
    const char *default_system; // chatml only
    bool llama31_system_header;
    bool fold_system_into_user;
    ChatToolSyntax tool_syntax; // the published template's tool calling (CHAT_TOOLS_NONE: none)
} ChatVariant;

enum {
    VARIANT_CHATML,
    VARIANT_SMOLLM2,
    VARIANT_QWEN2,
    VARIANT_QWEN2_5,
    VARIANT_QWEN3,
    VARIANT_LLAMA2,
    VARIANT_LLAMA3,
    VARIANT_LLAMA3_1,
    VARIANT_LLAMA3_2,
    VARIANT_GEMMA,
    VARIANT_GEMMA3,
    VARIANT_ZEPHYR,
    VARIANT_HH,
    VARIANT_WEBGPT,
};

static const ChatVariant variants[] = {
    [VARIANT_CHATML] = {"chatml", CHAT_FAMILY_CHATML, NULL, false, false},
    [VARIANT_SMOLLM2] = {"smollm2", CHAT_FAMILY_CHATML,
                         "You are a helpful AI assistant named SmolLM, trained by Hugging Face", false, false},
    [VARIANT_QWEN2] = {"qwen2", CHAT_FAMILY_CHATML, "You are a helpful assistant.", false, false},
    [VARIANT_QWEN2_5] = {"qwen2.5", CHAT_FAMILY_CHATML,
                         "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", false, false,
                         CHAT_TOOLS_HERMES},
    [VARIANT_QWEN3] = {"qwen3", CHAT_FAMILY_QWEN3, NULL, false, false, CHAT_TOOLS_HERMES},
    [VARIANT_LLAMA2] = {"llama2", CHAT_FAMILY_LLAMA2, NULL, false, false},
    [VARIANT_LLAMA3] = {"llama3", CHAT_FAMILY_LLAMA3, NULL, false, false},
    [VARIANT_LLAMA3_1] = {"llama3.1", CHAT_FAMILY_LLAMA3, NULL, true, false, CHAT_TOOLS_LLAMA3_JSON},
    [VARIANT_LLAMA3_2] = {"llama3.2", CHAT_FAMILY_LLAMA3, NULL, true, false, CHAT_TOOLS_LLAMA3_JSON},
    [VARIANT_GEMMA] = {"gemma", CHAT_FAMILY_GEMMA, NULL, false, false},
    [VARIANT_GEMMA3] = {"gemma3", CHAT_FAMILY_GEMMA, NULL, false, true},
    [VARIANT_ZEPHYR] = {"zephyr", CHAT_FAMILY_ZEPHYR, NULL, false, false},
    [VARIANT_HH] = {"hh", CHAT_FAMILY_HH, NULL, false, false},
    [VARIANT_WEBGPT] = {"webgpt", CHAT_FAMILY_WEBGPT, NULL, false, false},
};
enum { VARIANT_COUNT = sizeof variants / sizeof variants[0] };
#define VARIANT_NAMES \
    "chatml, smollm2, qwen2, qwen2.5, qwen3, llama2, llama3, llama3.1, llama3.2, gemma, gemma3, zephyr, hh, webgpt"

// The published templates, by chat_template_source_hash() of their source. The sources
// themselves are in tools/make_chat_template_fixtures.py (and so in the test fixture,
// whose test checks that each one maps to the variant named here).
static const struct {
    uint64_t hash;
    int variant;
} known_templates[] = {
    {0x22d5b3fe02f79526ull, VARIANT_SMOLLM2},  // HuggingFaceTB/SmolLM2-*-Instruct
    {0xc2b73317b40dbe6full, VARIANT_QWEN2},    // Qwen/Qwen2-*-Instruct
    {0x4c6623162d6dcf8dull, VARIANT_QWEN2_5},  // Qwen/Qwen2.5-*-Instruct
    {0x94fe4bdabdbc8179ull, VARIANT_QWEN3},    // Qwen/Qwen3-* (the revised template)
    {0x2c6f3580b1bc3912ull, VARIANT_QWEN3},    // Qwen/Qwen3-* (the first release's)
    {0xab0cd8c757618b60ull, VARIANT_CHATML},   // teknium/OpenHermes-2.5-Mistral-7B
    {0xe65cbea35ee4780bull, VARIANT_LLAMA2},   // meta-llama/Llama-2-*-chat-hf
    {0xad5d213b054f43b8ull, VARIANT_LLAMA3},   // meta-llama/Meta-Llama-3-*-Instruct
    {0xa9657dcbc686f040ull, VARIANT_LLAMA3_1}, // meta-llama/Llama-3.1-*-Instruct
    {0x97bbf1436837c1daull, VARIANT_LLAMA3_2}, // meta-llama/Llama-3.2-{1B,3B}-Instruct
    {0xbf0c23c2b819e555ull, VARIANT_GEMMA},    // google/gemma-{2b,7b}-it, gemma-2-*-it
    {0xf4ce96a0f1928177ull, VARIANT_GEMMA3},   // google/gemma-3-*-it
    {0x11e5896ba204217aull, VARIANT_ZEPHYR},   // HuggingFaceH4/zephyr-7b-beta, TinyLlama-1.1B-Chat-v1.0
    {0x517a316821854413ull, VARIANT_HH},       // marlhf's HH-RLHF template (fixture script)
    {0x923aed447e7d4519ull, VARIANT_WEBGPT},   // marlhf's WebGPT template (fixture script)
};

static const ChatVariant *find_variant(const char *name) {
    for (int i = 0; i < VARIANT_COUNT; i++)
        if (strcmp(variants[i].name, name) == 0) return &variants[i];
    return NULL;
}

// The local date in `format` as the template's date_string (strftime_now's). False if it
// does not fit.
static bool set_today(ChatTemplate *t, const char *format) {
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    return strftime(t->date_string, sizeof t->date_string, format, &local) > 0;
}

static void template_init(ChatTemplate *t, const ChatVariant *variant, const char *bos, const char *eos,
                          const char *source_path) {
    memset(t, 0, sizeof *t);
    t->family = variant->family;
    t->name = variant->name;
    t->default_system = variant->default_system ? xstrdup(variant->default_system) : NULL;
    t->llama31_system_header = variant->llama31_system_header;
    t->fold_system_into_user = variant->fold_system_into_user;
    t->tool_syntax = variant->tool_syntax;
    // Qwen3's template tests `enable_thinking is defined and enable_thinking is false`:
    // left undefined, as transformers leaves it unless asked, thinking is on.
    t->enable_thinking = true;
    // Llama 3.1's and 3.2's: {%- if not tools_in_user_message is defined %} ... = true
    t->tools_in_user_message = true;
    // Llama-3.1's template: {%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}
    snprintf(t->date_string, sizeof t->date_string, "%s", "26 Jul 2024");
    // Llama 3.2's: strftime_now("%d %b %Y"), which transformers defines: today.
    if (variant == &variants[VARIANT_LLAMA3_2]) set_today(t, "%d %b %Y");
    // A token the tokenizer lacks is an undefined name to Jinja, which prints as "".
    t->bos_token = xstrdup(bos ? bos : "");
    t->eos_token = xstrdup(eos ? eos : "");
    t->source_path = source_path ? xstrdup(source_path) : NULL;
}

void chat_template_free(ChatTemplate *t) {
    free(t->default_system);
    free(t->bos_token);
    free(t->eos_token);
    free(t->source_path);
    memset(t, 0, sizeof *t);
}

const char *chat_template_name(const ChatTemplate *t) { return t->name; }

const char *chat_family_name(ChatFamily family) {
    switch (family) {
    case CHAT_FAMILY_CHATML: return "chatml";
    case CHAT_FAMILY_QWEN3: return "qwen3";
    case CHAT_FAMILY_LLAMA2: return "llama2";
    case CHAT_FAMILY_LLAMA3: return "llama3";
    case CHAT_FAMILY_GEMMA: return "gemma";
    case CHAT_FAMILY_ZEPHYR: return "zephyr";
    case CHAT_FAMILY_HH: return "hh";
    case CHAT_FAMILY_WEBGPT: return "webgpt";
    }
    return "?";
}

int chat_template_from_name(ChatTemplate *t, const char *name, const char *bos_token, const char *eos_token) {
    const ChatVariant *variant = find_variant(name);
    if (!variant) return err_set("unknown chat template '%s' (known: %s)", name, VARIANT_NAMES);
    template_init(t, variant, bos_token, eos_token, NULL);
    t->exact = true;
    return 0;
}

// --- exact recognition ----------------------------------------------------------------------

static bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// The normalised source (see normalize_source in tools/make_chat_template_fixtures.py,
// which must stay identical): inside {{ }} / {% %} / {# #}, outside string literals,
// whitespace runs become one space and none is kept next to the delimiters or their
// "-"/"+"; string literals are kept with "\n" escapes written as newlines; text outside
// tags is kept; the ends are trimmed.
static char *normalize_source(const char *source) {
    size_t n = strlen(source);
    TextBuffer out = {0};
    text_append(&out, "");
    size_t i = 0;
    while (i < n) {
        const char *closer = NULL;
        if (source[i] == '{' && i + 1 < n)
            closer = source[i + 1] == '{' ? "}}" : source[i + 1] == '%' ? "%}" : source[i + 1] == '#' ? "#}" : NULL;
        if (!closer) {
            text_append_bytes(&out, source + i, 1);
            i++;
            continue;
        }
        bool comment = closer[0] == '#';
        text_append_bytes(&out, source + i, 2);
        i += 2;
        if (i < n && (source[i] == '-' || source[i] == '+')) text_append_bytes(&out, source + i++, 1);
        bool pending_space = false, started = false;
        while (i < n) {
            char c = source[i];
            bool closes_here = strncmp(source + i, closer, 2) == 0;
            if (closes_here || ((c == '-' || c == '+') && strncmp(source + i + 1, closer, 2) == 0)) {
                size_t length = closes_here ? 2 : 3;
                text_append_bytes(&out, source + i, length);
                i += length;
                break;
            }
            if (is_ascii_space(c)) {
                pending_space = true;
                i++;
                continue;
            }
            if (pending_space && started) text_append(&out, " ");
            pending_space = false;
            started = true;
            if (!comment && (c == '\'' || c == '"')) {
                text_append_bytes(&out, source + i++, 1);
                while (i < n && source[i] != c) {
                    if (source[i] == '\\' && i + 1 < n) {
                        if (source[i + 1] == 'n') text_append(&out, "\n");
                        else text_append_bytes(&out, source + i, 2);
                        i += 2;
                    } else {
                        text_append_bytes(&out, source + i++, 1);
                    }
                }
                if (i < n) text_append_bytes(&out, source + i++, 1);
                continue;
            }
            text_append_bytes(&out, source + i++, 1);
        }
    }
    size_t start = 0, end = out.length;
    while (start < end && is_ascii_space(out.data[start])) start++;
    while (end > start && is_ascii_space(out.data[end - 1])) end--;
    memmove(out.data, out.data + start, end - start);
    out.data[end - start] = '\0';
    return out.data;
}

unsigned long long chat_template_source_hash(const char *jinja_source) {
    char *normalized = normalize_source(jinja_source);
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)normalized; *p; p++) {
        hash ^= *p;
        hash *= 0x100000001b3ull;
    }
    free(normalized);
    return hash;
}

// --- recognition by markers -------------------------------------------------------------------

static bool contains(const char *haystack, const char *needle) { return strstr(haystack, needle) != NULL; }

// The default system turn of a ChatML template: the text of the first string literal
// of the form '<|im_start|>system\n...<|im_end|>' whose middle is plain text (no quote,
// no brace: not an expression). Jinja escapes in it are decoded. NULL if none.
static char *chatml_default_system(const char *source) {
    static const char opener[] = "<|im_start|>system";
    for (const char *at = strstr(source, opener); at; at = strstr(at + 1, opener)) {
        const char *p = at + strlen(opener);
        if (strncmp(p, "\\n", 2) == 0) p += 2;
        else if (*p == '\n') p += 1;
        else continue;
        const char *end = strstr(p, "<|im_end|>");
        if (!end || end == p) continue;
        bool plain = true;
        for (const char *q = p; q < end; q++)
            if (*q == '\'' || *q == '"' || *q == '{' || *q == '}') plain = false;
        if (!plain) continue;
        TextBuffer text = {0};
        text_append(&text, "");
        for (const char *q = p; q < end; q++) {
            if (*q == '\\' && q + 1 < end) {
                q++;
                char escaped = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q;
                text_append_bytes(&text, &escaped, 1);
            } else {
                text_append_bytes(&text, q, 1);
            }
        }
        return text.data;
    }
    return NULL;
}

// Copies into `out` the string literal right after `key` in `source` (e.g. the "26 Jul
// 2024" of `set date_string = "26 Jul 2024"`), as written: dates and strftime formats
// need no escapes. False if there is none or it does not fit.
static bool literal_after(const char *source, const char *key, char *out, size_t size) {
    const char *p = strstr(source, key);
    if (!p) return false;
    p += strlen(key);
    while (*p == ' ') p++;
    if (*p != '"' && *p != '\'') return false;
    char quote = *p++;
    const char *end = strchr(p, quote);
    if (!end || (size_t)(end - p) >= size) return false;
    memcpy(out, p, end - p);
    out[end - p] = '\0';
    return true;
}

// Llama 3.1-style date: transformers gives templates strftime_now (the local date),
// which Llama 3.2/3.3 call first; otherwise the template's own default date_string.
static void llama3_date_from_source(ChatTemplate *t, const char *source) {
    char format[32];
    if (contains(source, "strftime_now")) {
        if (!literal_after(source, "strftime_now(", format, sizeof format))
            snprintf(format, sizeof format, "%%d %%b %%Y");
        if (set_today(t, format)) return;
    }
    char date[sizeof t->date_string];
    if (literal_after(source, "set date_string =", date, sizeof date))
        snprintf(t->date_string, sizeof t->date_string, "%s", date);
}

static const ChatVariant *variant_from_markers(const char *source) {
    // Qwen3's think block is written with "reasoning_content.strip('\n')" and switched off
    // by enable_thinking; reasoning templates without both render otherwise.
    if (contains(source, "<|im_start|>") && contains(source, "<|im_end|>") && contains(source, "<think>") &&
        contains(source, "enable_thinking") && contains(source, "reasoning_content.strip("))
        return &variants[VARIANT_QWEN3];
    if (contains(source, "<|im_start|>") && contains(source, "<|im_end|>") && !contains(source, "<think>"))
        return &variants[VARIANT_CHATML];
    if (contains(source, "<|start_header_id|>") && contains(source, "<|eot_id|>"))
        return &variants[!contains(source, "Cutting Knowledge Date") ? VARIANT_LLAMA3
                         : contains(source, "strftime_now")          ? VARIANT_LLAMA3_2
                                                                     : VARIANT_LLAMA3_1];
    if (contains(source, "<start_of_turn>") && contains(source, "<end_of_turn>"))
        return &variants[contains(source, "System role not supported") ? VARIANT_GEMMA : VARIANT_GEMMA3];
    if (contains(source, "[INST]") && contains(source, "<<SYS>>")) return &variants[VARIANT_LLAMA2];
    if (contains(source, "<|user|>") && contains(source, "<|assistant|>") && contains(source, "eos_token") &&
        !contains(source, "<|end|>"))
        return &variants[VARIANT_ZEPHYR];
    return NULL;
}

int chat_template_from_source(ChatTemplate *t, const char *jinja_source, const char *bos_token,
                              const char *eos_token, const char *source_path) {
    CHECK(jinja_source, "chat_template_from_source without a source");
    uint64_t hash = chat_template_source_hash(jinja_source);
    for (size_t i = 0; i < sizeof known_templates / sizeof known_templates[0]; i++) {
        if (known_templates[i].hash != hash) continue;
        template_init(t, &variants[known_templates[i].variant], bos_token, eos_token, source_path);
        t->exact = true;
        return 0;
    }
    const ChatVariant *variant = variant_from_markers(jinja_source);
    if (!variant)
        return err_set("unrecognised chat template in %s (pass --chat-template NAME or a template file)",
                       source_path ? source_path : "the given source");
    template_init(t, variant, bos_token, eos_token, source_path);
    if (variant->family == CHAT_FAMILY_CHATML) {
        // Name it after the published variant whose default system turn it has, if any.
        t->default_system = chatml_default_system(jinja_source);
        for (int i = 0; i < VARIANT_COUNT && t->default_system; i++)
            if (variants[i].default_system && strcmp(variants[i].default_system, t->default_system) == 0) {
                t->name = variants[i].name;
                t->tool_syntax = variants[i].tool_syntax; // in effect only when exact: never here
            }
    }
    if (t->llama31_system_header) llama3_date_from_source(t, jinja_source);
    return 0;
}

// --- files ------------------------------------------------------------------------------------

// A special token in tokenizer_config.json: a string, or an AddedToken object {"content": ...}.
static const char *config_token(json_t *config, const char *key) {
    json_t *value = json_object_get(config, key);
    if (json_is_object(value)) value = json_object_get(value, "content");
    return json_is_string(value) ? json_string_value(value) : NULL;
}

int chat_template_from_file(ChatTemplate *t, const char *path, const char *bos_token, const char *eos_token) {
    char *data;
    size_t size;
    if (fs_read_file(path, (size_t)64 << 20, &data, &size) != 0) return -1;
    if (strlen(data) != size) {
        free(data);
        return err_set("chat template file %s contains a NUL byte", path);
    }
    // A Jinja source never parses as a JSON object; a tokenizer_config.json does (integers
    // as reals: its "model_max_length" may be past jansson's integers, see tokenizer/load_hf.c).
    json_t *config = json_loads(data, JSON_DECODE_INT_AS_REAL, NULL);
    if (!json_is_object(config)) {
        json_decref(config);
        int rc = chat_template_from_source(t, data, bos_token, eos_token, path);
        free(data);
        return rc;
    }
    free(data);
    json_t *value = json_object_get(config, "chat_template");
    if (json_is_array(value)) {
        // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        json_t *chosen = NULL, *entry;
        size_t index;
        json_array_foreach(value, index, entry) {
            const char *name = json_string_value(json_object_get(entry, "name"));
            if (name && strcmp(name, "default") == 0) chosen = json_object_get(entry, "template");
        }
        value = chosen;
    }
    if (!json_is_string(value)) {
        json_decref(config);
        return err_set("no chat_template (a string, or a list with a \"default\" entry) in %s", path);
    }
    const char *bos = bos_token ? bos_token : config_token(config, "bos_token");
    const char *eos = eos_token ? eos_token : config_token(config, "eos_token");
    int rc = chat_template_from_source(t, json_string_value(value), bos, eos, path);
    json_decref(config);
    return rc;
}

int chat_template_from_option(ChatTemplate *t, const char *name_or_path, const char *bos_token,
                              const char *eos_token) {
    if (find_variant(name_or_path)) return chat_template_from_name(t, name_or_path, bos_token, eos_token);
    if (fs_exists(name_or_path)) return chat_template_from_file(t, name_or_path, bos_token, eos_token);
    return err_set("unknown chat template '%s': neither a name (%s) nor a file (--chat-template)", name_or_path,
                   VARIANT_NAMES);
}

int chat_template_disable_thinking(ChatTemplate *t) {
    if (t->family != CHAT_FAMILY_QWEN3)
        return err_set("chat template %s has no thinking switch (only qwen3's enable_thinking)", t->name);
    t->enable_thinking = false;
    return 0;
}

int chat_template_apply_kwargs(ChatTemplate *t, const json_t *kwargs) {
    if (!kwargs) return 0;
    if (!json_is_object(kwargs)) return err_set("chat_template_kwargs must be an object");
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)kwargs, key, value) {
        const bool thinking = !strcmp(key, "enable_thinking"), date = !strcmp(key, "date_string");
        const bool tools_placement = !strcmp(key, "tools_in_user_message");
        if (!thinking && !date && !tools_placement)
            return err_set("chat_template_kwargs.%.60s is not a variable marlhf's chat templates read "
                           "(enable_thinking, date_string, tools_in_user_message)", key);
        if ((thinking || tools_placement) && !json_is_boolean(value))
            return err_set("chat_template_kwargs.%s must be true or false", key);
        if (date && !json_is_string(value)) return err_set("chat_template_kwargs.date_string must be a string");
        if (date && json_string_length(value) >= sizeof t->date_string)
            return err_set("chat_template_kwargs.date_string is longer than %zu bytes", sizeof t->date_string - 1);
        if (!t) continue;
        if (thinking && t->family != CHAT_FAMILY_QWEN3)
            return err_set("chat_template_kwargs.enable_thinking: chat template %s has no thinking switch (only "
                           "qwen3's)", t->name);
        if ((date || tools_placement) && !t->llama31_system_header)
            return err_set("chat_template_kwargs.%s: chat template %s does not read it (only Llama 3.1's and 3.2's)",
                           key, t->name);
        if (thinking) t->enable_thinking = json_is_true(value);
        if (tools_placement) t->tools_in_user_message = json_is_true(value);
        if (date) snprintf(t->date_string, sizeof t->date_string, "%s", json_string_value(value));
    }
    return 0;
}

// --- rendering ----------------------------------------------------------------------------------

ChatToolSyntax chat_template_tool_syntax(const ChatTemplate *t) { return t->exact ? t->tool_syntax : CHAT_TOOLS_NONE; }

// Why a template takes no tools, tool calls or tool messages (`what`), as an error.
static int tools_refused(const ChatTemplate *t, const char *what) {
    if (t->tool_syntax != CHAT_TOOLS_NONE)
        return err_set("chat template %s%s%s was recognised by its markers, not as the published template: "
                       "%s need the template known exactly (pass --chat-template %s)",
                       t->name, t->source_path ? " from " : "", t->source_path ? t->source_path : "", what, t->name);
    return err_set("chat template %s does not render %s (tool calling: the qwen2.5, qwen3, llama3.1 and llama3.2 templates)",
                   t->name, what);
}

int chat_template_check_tools(const ChatTemplate *t) {
    return chat_template_tool_syntax(t) != CHAT_TOOLS_NONE ? 0 : tools_refused(t, "tools");
}

int chat_template_render_tools(const ChatTemplate *t, const ChatMessage *messages, int count, const char *tools_json,
                               bool add_generation_prompt, char **out) {
    *out = NULL;
    // transformers refuses an empty conversation before the template runs.
    if (count <= 0) return chat_template_error(t, "cannot apply a chat template to an empty conversation");
    bool tools_ok = chat_template_tool_syntax(t) != CHAT_TOOLS_NONE;
    for (int i = 0; i < count; i++) {
        const char *role = messages[i].role;
        bool tool = role && strcmp(role, "tool") == 0;
        if (!role || (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 &&
                      !tool))
            return err_set("message %d has role '%s'; chat templates take system, user and assistant "
                           "(chat template %s)", i, role ? role : "(none)", t->name);
        if (tool && !tools_ok) {
            tools_refused(t, "tool messages");
            return err_set("message %d has role 'tool': %s", i, err_msg());
        }
        if (!messages[i].content) return err_set("message %d has no content (chat template %s)", i, t->name);
        if (messages[i].num_tool_calls > 0) {
            if (strcmp(role, "assistant") != 0)
                return err_set("message %d has tool calls but role '%s' (only assistant messages make them)", i,
                               role);
            if (!tools_ok) {
                tools_refused(t, "tool calls");
                return err_set("message %d: %s", i, err_msg());
            }
            for (int j = 0; j < messages[i].num_tool_calls; j++) {
                const ChatToolCall *call = &messages[i].tool_calls[j];
                if (!call->name || !call->arguments)
                    return err_set("message %d, tool call %d: no name or arguments", i, j);
                json_t *arguments = json_loads(call->arguments, JSON_DECODE_ANY, NULL);
                if (!arguments) return err_set("message %d, tool call %d: the arguments are not JSON", i, j);
                json_decref(arguments);
            }
        }
    }
    json_t *tools = NULL;
    if (tools_json) {
        if (!tools_ok) return tools_refused(t, "tools");
        json_error_t error;
        tools = json_loads(tools_json, 0, &error);
        if (!json_is_array(tools)) {
            json_decref(tools);
            return err_set("the tools are not a JSON array (chat template %s)", t->name);
        }
    }
    TextBuffer text = {0};
    text_append(&text, "");
    int rc = 0;
    switch (t->family) {
    case CHAT_FAMILY_CHATML: rc = render_chatml(t, messages, count, tools, add_generation_prompt, &text); break;
    case CHAT_FAMILY_QWEN3: rc = render_qwen3(t, messages, count, tools, add_generation_prompt, &text); break;
    case CHAT_FAMILY_LLAMA2: rc = render_llama2(t, messages, count, add_generation_prompt, &text); break;
    case CHAT_FAMILY_LLAMA3: rc = render_llama3(t, messages, count, tools, add_generation_prompt, &text); break;
    case CHAT_FAMILY_GEMMA: rc = render_gemma(t, messages, count, add_generation_prompt, &text); break;
    case CHAT_FAMILY_ZEPHYR: rc = render_zephyr(t, messages, count, add_generation_prompt, &text); break;
    case CHAT_FAMILY_HH:
    case CHAT_FAMILY_WEBGPT: rc = render_plain_turns(t, messages, count, add_generation_prompt, &text); break;
    default: CHECK(false, "chat template with family %d", (int)t->family);
    }
    json_decref(tools);
    if (rc != 0) {
        free(text.data);
        return -1;
    }
    *out = text.data;
    return 0;
}

int chat_template_render(const ChatTemplate *t, const ChatMessage *messages, int count, bool add_generation_prompt,
                         char **out) {
    return chat_template_render_tools(t, messages, count, NULL, add_generation_prompt, out);
}
