// Command-line options: one table per command, parsed from `--name value`,
// `--name=value` and `--config FILE.json` (same keys; command-line values win).
//
// Names are --kebab-case; each option may list aliases (the MA-RLHF / DeepSpeed-Chat
// spellings such as --termination_condition). Every user mistake is a one-line error
// naming the option, exit status 2. `--help` prints each option with its default.
#pragma once
#include <stdbool.h>

typedef enum { OPT_STRING, OPT_INT, OPT_FLOAT, OPT_BOOL } OptionType;

typedef struct {
    const char *name;    // without the leading dashes, kebab-case
    const char *aliases; // space-separated alternative names, or NULL
    OptionType type;
    void *target;        // char **, long *, double *, bool *
    const char *help;    // one line; the default is printed from *target
    bool required;
    bool seen;           // set by the parser
} Option;

typedef struct {
    const char *command;  // e.g. "logprobs"
    const char *summary;  // one line
    const char *usage;    // e.g. "marlhf logprobs --model PATH --input FILE.jsonl"
    Option *options;
    int count;
    const char **positional; // filled with positional arguments (may be NULL)
    int max_positional;
    int num_positional;
} OptionSet;

// Parses argv (after the command name). Exits 0 after printing help for --help;
// exits 2 with a one-line error for an unknown option, a missing or malformed value,
// a bad --config file, or a missing required option.
void options_parse(OptionSet *set, int argc, char **argv);
void options_print_help(const OptionSet *set);
// Whether the command line (or --config) gave option `name` (after options_parse).
bool options_given(const OptionSet *set, const char *name);
