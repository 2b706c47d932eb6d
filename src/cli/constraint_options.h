// The structured-output options of `generate` and `chat` (--json, --json-schema, --regex,
// --choice, --grammar, --grammar-file): their help texts and the constraint they make (docs/serving.md).
#pragma once
#include <stdbool.h>

#include "gen/constraint.h"

#define CONSTRAINT_HELP_JSON "constrain every answer to a JSON object (structured outputs: docs/serving.md)"
#define CONSTRAINT_HELP_JSON_SCHEMA \
    "a JSON Schema file: constrain every answer to a value matching it (the subset of docs/serving.md)"
#define CONSTRAINT_HELP_REGEX \
    "a regular expression: constrain every whole answer to match it (the dialect of docs/serving.md)"
#define CONSTRAINT_HELP_GRAMMAR \
    "a GBNF grammar (llama.cpp's notation; `root` is the start): constrain every whole answer to it (docs/serving.md)"
#define CONSTRAINT_HELP_GRAMMAR_FILE "a file holding a GBNF grammar (as --grammar)"
#define CONSTRAINT_HELP_CHOICE                                                                                   \
    "A,B,...: every answer is exactly one of these strings (commas separate them; give a JSON list of strings, " \
    "'[\"a, b\", \"c\"]', for choices with commas)"

// The constraint the options ask for, or NULL when none is given; a bad value (two of them,
// a malformed schema file, a pattern outside the dialect, a malformed grammar) exits with
// status 2 naming the option (and the file, and the line and column in it). Compiled before
// the model loads, so a bad pattern costs no load.
Constraint *cli_constraint_from_options(bool json_object, const char *json_schema, const char *regex,
                                        const char *choice, const char *grammar, const char *grammar_file);
