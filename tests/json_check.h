// Shared by the JSON constraint tests (test_json_constraint.c, test_json_recursive.c,
// test_json_bounds.c): a schema compiled from text, every prefix of a text alive, tables of
// accepted / refused texts per schema and of refused schemas with what their error names,
// pydantic's fixtures. Include after test.h.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "core/check.h"
#include "gen/json_constraint.h"

static JsonConstraint *compile_text(const char *schema_text) {
    json_error_t error;
    json_t *schema = json_loads(schema_text, JSON_DECODE_ANY, &error);
    CHECK(schema, "test schema %s: %s", schema_text, error.text);
    JsonConstraint *c = NULL;
    int rc = json_constraint_schema(&c, schema, "schema");
    json_decref(schema);
    if (rc != 0) fprintf(stderr, "  schema %s refused: %s\n", schema_text, err_msg());
    return c;
}

// Every prefix of text (length bytes) keeps a live state (a sampler that follows the
// constraint is never stuck on it).
static bool prefixes_alive(const JsonConstraint *c, const char *text, size_t length) {
    JsonState *state = xmalloc(sizeof *state);
    json_state_init(c, state);
    bool ok = true;
    for (size_t i = 0; i < length && ok; i++) ok = json_state_feed(c, state, (uint8_t)text[i], state);
    free(state);
    return ok;
}

typedef struct {
    const char *schema;
    const char *accept[10];
    const char *reject[14];
} JsonCase;

// Each schema compiles, accepts its accepted texts (every prefix alive), refuses the others.
static void check_json_cases(const JsonCase *cases, size_t count) {
    for (size_t i = 0; i < count; i++) {
        JsonConstraint *c = compile_text(cases[i].schema);
        EXPECT(c != NULL, "schema %zu compiles", i);
        if (!c) continue;
        for (int k = 0; k < 10 && cases[i].accept[k]; k++) {
            const char *text = cases[i].accept[k];
            EXPECT(json_constraint_matches(c, text, strlen(text)), "schema %zu accepts %s", i, text);
            EXPECT(prefixes_alive(c, text, strlen(text)), "schema %zu: every prefix of %s is alive", i, text);
        }
        for (int k = 0; k < 14 && cases[i].reject[k]; k++) {
            const char *text = cases[i].reject[k];
            EXPECT(!json_constraint_matches(c, text, strlen(text)), "schema %zu refuses %s", i, text);
        }
        json_constraint_free(c);
    }
}

typedef struct {
    const char *schema, *names;
} JsonRefusal;

// Each schema is refused with a one-line error that names the schema (its `what`) and
// contains `names`.
static void check_json_refusals(const JsonRefusal *refused, size_t count) {
    for (size_t i = 0; i < count; i++) {
        json_t *schema = json_loads(refused[i].schema, JSON_DECODE_ANY, NULL);
        CHECK(schema, "refusal case %zu", i);
        JsonConstraint *c = NULL;
        err_clear();
        EXPECT(json_constraint_schema(&c, schema, "response_format.json_schema.schema") == -1, "%s is refused",
               refused[i].schema);
        EXPECT(strstr(err_msg(), refused[i].names) != NULL && strstr(err_msg(), "response_format.json_schema.schema") &&
                   !strchr(err_msg(), '\n'),
               "the error for %s names %s in one line: %s", refused[i].schema, refused[i].names, err_msg());
        json_constraint_free(c);
        json_decref(schema);
    }
}

// A fixture of pydantic's schemas with texts labelled by pydantic (tools/make_json_*_fixtures.py
// write them: `tool`): each schema compiles; every generated text, and every edited one
// marked canonical that pydantic calls valid, is accepted with every prefix alive; every
// accepted text is one pydantic calls valid.
static inline void check_pydantic_fixture(const char *path, const char *tool) {
    json_error_t error;
    json_t *fixture = json_load_file(path, 0, &error);
    EXPECT(fixture != NULL, "%s: %s (%s writes it)", path, error.text, tool);
    if (!fixture) return;
    size_t i;
    json_t *entry;
    json_array_foreach(json_object_get(fixture, "cases"), i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        JsonConstraint *c = NULL;
        if (json_constraint_schema(&c, json_object_get(entry, "schema"), name) != 0) {
            EXPECT(false, "pydantic's schema %s compiles: %s", name, err_msg());
            continue;
        }
        int generated = 0, accepted = 0, valid = 0, texts = 0, must_accept = 0, valid_refused = 0;
        size_t k;
        json_t *item;
        json_array_foreach(json_object_get(entry, "texts"), k, item) {
            const char *text = json_string_value(json_array_get(item, 0));
            const size_t length = json_string_length(json_array_get(item, 0));
            const bool is_valid = json_is_true(json_array_get(item, 1));
            const char *kind = json_string_value(json_array_get(item, 2));
            const bool is_generated = !strcmp(kind, "generated"), is_canonical = !strcmp(kind, "canonical");
            const bool accepts = json_constraint_matches(c, text, length);
            texts++, valid += is_valid, accepted += accepts, generated += is_generated;
            if (is_generated || (is_canonical && is_valid)) {
                must_accept++;
                EXPECT(accepts && prefixes_alive(c, text, length), "%s: the valid text %s is accepted, every prefix alive",
                       name, text);
            }
            EXPECT(!accepts || is_valid, "%s: %s is accepted, and pydantic says it is invalid", name, text);
            if (is_valid && !accepts && valid_refused++ < 3) // beyond the subset (docs/serving.md): the first few
                printf("  %s: valid by pydantic, refused: %s\n", name, text);
        }
        printf("%s: %d texts (%d generated), %d valid by pydantic (%d of them refused), %d accepted (%d of them "
               "required: generated, or edited and valid in json.dumps' spelling)\n", name, texts, generated, valid,
               valid_refused, accepted, must_accept);
        json_constraint_free(c);
    }
    json_decref(fixture);
}
