#include "cli/options.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// "--termination_condition" and "--termination-condition" name the same option.
static bool names_match(const char *given, const char *name) {
    for (; *given && *name; given++, name++) {
        char a = *given == '_' ? '-' : *given, b = *name == '_' ? '-' : *name;
        if (a != b) return false;
    }
    return *given == '\0' && *name == '\0';
}

static Option *find_option(OptionSet *set, const char *given) {
    for (int i = 0; i < set->count; i++) {
        Option *o = &set->options[i];
        if (names_match(given, o->name)) return o;
        if (!o->aliases) continue;
        char aliases[256];
        snprintf(aliases, sizeof aliases, "%s", o->aliases);
        for (char *save = NULL, *alias = strtok_r(aliases, " ", &save); alias;
             alias = strtok_r(NULL, " ", &save))
            if (names_match(given, alias)) return o;
    }
    return NULL;
}

// Strings from --config files, kept until exit (argv strings live that long already).
static char **config_strings;
static int config_string_count;
static void free_config_strings(void) {
    for (int i = 0; i < config_string_count; i++) free(config_strings[i]);
    free(config_strings);
}
static const char *keep_config_string(const char *value) {
    if (config_string_count == 0) atexit(free_config_strings);
    config_strings = xrealloc(config_strings, (size_t)(config_string_count + 1) * sizeof(char *));
    return config_strings[config_string_count++] = xstrdup(value);
}

static void set_value(const OptionSet *set, Option *o, const char *value) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_STRING:
        *(const char **)o->target = value;
        break;
    case OPT_INT: {
        long v = strtol(value, &end, 10);
        if (!*value || *end || errno)
            die_user("option --%s expects an integer, got '%s' (marlhf %s --help)", o->name,
                     value, set->command);
        *(long *)o->target = v;
        break;
    }
    case OPT_FLOAT: {
        double v = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(v))
            die_user("option --%s expects a number, got '%s' (marlhf %s --help)", o->name, value,
                     set->command);
        *(double *)o->target = v;
        break;
    }
    case OPT_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes"))
            *(bool *)o->target = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no"))
            *(bool *)o->target = false;
        else
            die_user("option --%s expects true or false, got '%s' (marlhf %s --help)", o->name,
                     value, set->command);
        break;
    }
    o->seen = true;
}

// Applies the keys of a JSON object file; options already given on the command line win.
static void apply_config_file(OptionSet *set, const char *path, bool *given_on_command_line) {
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    if (!root)
        die_user("bad config file: %s (%s:%d:%d)", error.text, path, error.line, error.column);
    if (!json_is_object(root)) die_user("config file must hold a JSON object (%s)", path);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        Option *o = find_option(set, key);
        if (!o) die_user("unknown option '%s' in config file (%s)", key, path);
        if (given_on_command_line[o - set->options]) continue;
        char text[64];
        if (json_is_string(value)) {
            set_value(set, o, keep_config_string(json_string_value(value)));
            continue;
        }
        // A list for an option that takes a comma-separated one (TRL's configs write
        // "loss_type": ["sigmoid", "sft"], "loss_weights": [0.8, 1.0]).
        if (json_is_array(value) && o->type == OPT_STRING) {
            char *joined = xstrdup("");
            size_t i;
            json_t *item;
            json_array_foreach(value, i, item) {
                if (json_is_string(item)) snprintf(text, sizeof text, "%s", json_string_value(item));
                else if (json_is_integer(item))
                    snprintf(text, sizeof text, "%lld", (long long)json_integer_value(item));
                else if (json_is_real(item)) snprintf(text, sizeof text, "%.17g", json_real_value(item));
                else die_user("config key '%s': a list of strings or numbers expected (%s)", key, path);
                joined = xrealloc(joined, strlen(joined) + strlen(text) + 2);
                if (i > 0) strcat(joined, ",");
                strcat(joined, text);
            }
            set_value(set, o, keep_config_string(joined));
            free(joined);
            continue;
        }
        if (json_is_integer(value)) snprintf(text, sizeof text, "%lld", (long long)json_integer_value(value));
        else if (json_is_real(value)) snprintf(text, sizeof text, "%.17g", json_real_value(value));
        else if (json_is_boolean(value)) snprintf(text, sizeof text, "%s", json_is_true(value) ? "true" : "false");
        else die_user("config key '%s' must be a string, number or boolean (%s)", key, path);
        set_value(set, o, text);
    }
    json_decref(root);
}

void options_print_help(const OptionSet *set) {
    printf("%s\n\nusage: %s\n\noptions:\n", set->summary, set->usage);
    for (int i = 0; i < set->count; i++) {
        const Option *o = &set->options[i];
        char value[160] = "";
        switch (o->type) {
        case OPT_STRING:
            snprintf(value, sizeof value, "%s", *(char **)o->target ? *(char **)o->target : "");
            break;
        case OPT_INT: snprintf(value, sizeof value, "%ld", *(long *)o->target); break;
        case OPT_FLOAT: snprintf(value, sizeof value, "%g", *(double *)o->target); break;
        case OPT_BOOL: snprintf(value, sizeof value, "%s", *(bool *)o->target ? "true" : "false"); break;
        }
        printf("  --%-26s %s", o->name, o->help);
        if (o->required) printf(" (required)");
        else if (value[0]) printf(" (default: %s)", value);
        if (o->aliases) printf(" [alias: %s]", o->aliases);
        printf("\n");
    }
    printf("  --%-26s %s\n", "config FILE.json", "read options from a JSON object (same keys)");
    printf("  --%-26s %s\n", "help", "show this help");
}

void options_parse(OptionSet *set, int argc, char **argv) {
    bool given[set->count > 0 ? set->count : 1];
    memset(given, 0, sizeof given);
    const char *config_path = NULL;
    set->num_positional = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            options_print_help(set);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (set->num_positional >= set->max_positional)
                die_user("unexpected argument '%s' (marlhf %s --help)", arg, set->command);
            set->positional[set->num_positional++] = arg;
            continue;
        }
        char name[128];
        const char *eq = strchr(arg + 2, '=');
        size_t length = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (length >= sizeof name) die_user("option name too long: %.40s...", arg);
        memcpy(name, arg + 2, length);
        name[length] = '\0';
        const char *value = eq ? eq + 1 : NULL;
        if (strcmp(name, "config") == 0) {
            if (!value) {
                if (i + 1 >= argc) die_user("option --config needs a file");
                value = argv[++i];
            }
            config_path = value;
            continue;
        }
        Option *o = find_option(set, name);
        if (!o) die_user("unknown option --%s (marlhf %s --help)", name, set->command);
        if (!value) {
            if (o->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 ||
                                        (strcmp(argv[i + 1], "true") && strcmp(argv[i + 1], "false")))) {
                value = "true"; // a bare flag
            } else {
                if (i + 1 >= argc) die_user("option --%s needs a value", o->name);
                value = argv[++i];
            }
        }
        set_value(set, o, value);
        given[o - set->options] = true;
    }
    if (config_path) apply_config_file(set, config_path, given);
    for (int i = 0; i < set->count; i++)
        if (set->options[i].required && !set->options[i].seen)
            die_user("missing required option --%s (marlhf %s --help)", set->options[i].name,
                     set->command);
}

bool options_given(const OptionSet *set, const char *name) {
    for (int k = 0; k < set->count; k++)
        if (!strcmp(set->options[k].name, name)) return set->options[k].seen;
    return false;
}
