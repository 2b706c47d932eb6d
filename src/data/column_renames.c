#include "data/column_renames.h"

#include <string.h>

#include "core/check.h"

static int find(char *const *names, int count, const char *name) {
    for (int k = 0; k < count; k++)
        if (!strcmp(names[k], name)) return k;
    return -1;
}

int column_renames_parse(const char *text, const char *option, ColumnRenames *out) {
    memset(out, 0, sizeof *out);
    if (!text || !*text) return 0;
    char *copy = xstrdup(text);
    int capacity = 1;
    for (const char *c = text; *c; c++) capacity += *c == ',';
    out->from = xcalloc((size_t)capacity, sizeof(char *));
    out->to = xcalloc((size_t)capacity, sizeof(char *));
    int rc = 0;
    for (char *pair = copy, *next; rc == 0 && pair; pair = next) {
        next = strchr(pair, ',');
        if (next) *next++ = '\0';
        char *equals = strchr(pair, '=');
        if (!equals || equals == pair || !equals[1] || strchr(equals + 1, '=')) {
            rc = err_set("option %s must be old=new pairs separated by commas, got '%s'", option, text);
            break;
        }
        *equals = '\0';
        const char *from = pair, *to = equals + 1;
        if (find(out->from, out->count, from) >= 0 || find(out->to, out->count, to) >= 0) {
            rc = err_set("option %s renames '%s' or names '%s' twice, got '%s'", option, from, to, text);
            break;
        }
        out->from[out->count] = xstrdup(from);
        out->to[out->count] = xstrdup(to);
        out->count++;
    }
    free(copy);
    if (rc != 0) column_renames_free(out);
    return rc;
}

void column_renames_free(ColumnRenames *renames) {
    for (int k = 0; k < renames->count; k++) free(renames->from[k]), free(renames->to[k]);
    free(renames->from), free(renames->to);
    memset(renames, 0, sizeof *renames);
}

int column_renames_apply(const ColumnRenames *renames, json_t *row, const char *path, long line) {
    if (renames->count == 0) return 0;
    // Every check first, so a row is renamed whole or not at all.
    for (int k = 0; k < renames->count; k++) {
        if (!json_object_get(row, renames->from[k]))
            return err_set("the row has no field \"%s\" to rename to \"%s\" (--rename-columns; %s:%ld)", renames->from[k],
                           renames->to[k], path, line);
        if (json_object_get(row, renames->to[k]) && find(renames->from, renames->count, renames->to[k]) < 0)
            return err_set("the row has a field \"%s\" already: \"%s\" cannot be renamed to it (--rename-columns; %s:%ld)",
                           renames->to[k], renames->from[k], path, line);
    }
    json_t **values = xmalloc((size_t)renames->count * sizeof(json_t *));
    for (int k = 0; k < renames->count; k++) {
        values[k] = json_incref(json_object_get(row, renames->from[k]));
        json_object_del(row, renames->from[k]);
    }
    for (int k = 0; k < renames->count; k++) json_object_set_new(row, renames->to[k], values[k]);
    free(values);
    return 0;
}
