#include "cli/constraint_options.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/check.h"
#include "io/fs.h"

// --choice: "A,B,..." or a JSON list of strings ("[...]"): a regular expression of the alternatives.
static Constraint *choice_constraint(const char *text) {
    const char **texts = NULL;
    size_t *lengths = NULL;
    int count = 0;
    json_t *list = NULL;
    char *copy = NULL;
    if (text[0] == '[') {
        json_error_t error;
        list = json_loads(text, 0, &error);
        if (!json_is_array(list) || json_array_size(list) == 0)
            die_user("--choice: a list given as JSON must be a non-empty list of strings%s%s", list ? "" : ": ",
                     list ? "" : error.text);
        count = (int)json_array_size(list);
        texts = xmalloc((size_t)count * sizeof(char *)), lengths = xmalloc((size_t)count * sizeof(size_t));
        for (int i = 0; i < count; i++) {
            json_t *item = json_array_get(list, (size_t)i);
            if (!json_is_string(item)) die_user("--choice: item %d of the JSON list is not a string", i);
            texts[i] = json_string_value(item), lengths[i] = json_string_length(item);
        }
    } else {
        copy = xstrdup(text);
        for (char *p = copy;; p++) {
            texts = xrealloc(texts, (size_t)(count + 1) * sizeof(char *));
            lengths = xrealloc(lengths, (size_t)(count + 1) * sizeof(size_t));
            char *comma = strchr(p, ',');
            texts[count] = p, lengths[count] = comma ? (size_t)(comma - p) : strlen(p);
            count++;
            if (!comma) break;
            p = comma;
        }
    }
    RegexConstraint *regex = NULL;
    if (regex_constraint_choice(&regex, texts, lengths, count, "--choice") != 0) die_from_err();
    free(texts), free(lengths), free(copy);
    json_decref(list);
    return constraint_from_regex(regex);
}

// --grammar TEXT or --grammar-file FILE: a GBNF grammar (gen/grammar_constraint.h).
static Constraint *grammar_constraint(const char *text, const char *file) {
    char *data = NULL, what[600];
    size_t size = strlen(text ? text : "");
    if (file) {
        if (fs_read_file(file, (size_t)64 << 20, &data, &size) != 0) die_user("--grammar-file: %s", err_msg());
        text = data;
        snprintf(what, sizeof what, "--grammar-file %.500s", file);
    } else {
        snprintf(what, sizeof what, "--grammar");
    }
    GrammarConstraint *compiled = NULL;
    if (grammar_constraint_compile(&compiled, text, size, what) != 0) die_from_err();
    free(data);
    return constraint_from_grammar(compiled);
}

Constraint *cli_constraint_from_options(bool json_object, const char *json_schema, const char *regex,
                                        const char *choice, const char *grammar, const char *grammar_file) {
    if ((json_object ? 1 : 0) + (json_schema != NULL) + (regex != NULL) + (choice != NULL) + (grammar != NULL) +
            (grammar_file != NULL) > 1)
        die_user("give one of --json, --json-schema, --regex, --choice, --grammar and --grammar-file");
    Constraint *constraint = json_object ? constraint_from_json(json_constraint_object()) : NULL;
    if (regex) {
        RegexConstraint *compiled = NULL;
        if (regex_constraint_compile(&compiled, regex, strlen(regex), NULL, "--regex") != 0) die_from_err();
        constraint = constraint_from_regex(compiled);
    }
    if (choice) constraint = choice_constraint(choice);
    if (grammar || grammar_file) constraint = grammar_constraint(grammar, grammar_file);
    if (json_schema) {
        json_error_t error;
        json_t *schema = json_load_file(json_schema, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &error);
        if (!schema) die_user("--json-schema %s: not JSON: %s (line %d, column %d)", json_schema, error.text, error.line, error.column);
        char what[600];
        snprintf(what, sizeof what, "--json-schema %.500s", json_schema);
        JsonConstraint *compiled = NULL;
        if (json_constraint_schema(&compiled, schema, what) != 0) die_from_err();
        constraint = constraint_from_json(compiled);
        json_decref(schema);
    }
    return constraint;
}
