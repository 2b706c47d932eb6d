// Tests of gen/json_constraint.c's recursive schemas, tuples and string formats:
//  - texts accepted and refused for recursive `$ref` (#/$defs, #/definitions, # itself;
//    mutual recursion), `prefixItems` with `items` false / a schema / absent, and the
//    formats date, time, date-time, uuid; every prefix of an accepted text alive;
//  - the one-line errors for schemas with no finite value, left recursion, too deep, and
//    the unsupported forms (naming the definition / keyword);
//  - the depth bound at its exact edge: a value (or an alternative of it) is opened only
//    where it can still be completed within JSON_MAX_DEPTH;
//  - random walks (bytes drawn among those the constraint allows, opening bytes favoured, so
//    that the walks press against JSON_MAX_DEPTH) on recursive schemas: no walk reaches a
//    state with no allowed byte that is not complete, and a search from the walk's end
//    always finds a completion (the invariant "a text that starts to match can always be
//    completed"), which jansson parses;
//  - tests/fixtures/constraints/json_recursive.json (tools/make_json_recursive_fixtures.py):
//    pydantic's schemas of self-referencing models, tuples and date / uuid fields with texts
//    labelled by pydantic: every generated (valid) text, and every edited one pydantic calls
//    valid that is spelled as json.dumps spells it (the edit outside a format's string), is
//    accepted with every prefix alive (no byte of it refused), and every text accepted is
//    one pydantic calls valid;
//  - tool calls whose tools each have their own $defs of the same name;
//  - the token mask over SmolLM2's vocabulary equals the brute force at the depth limit.
#include <jansson.h>
#include <string.h>

#include "core/check.h"
#include "gen/json_constraint.h"
#include "test.h"

#include "constraint_check.h"
#include "json_check.h"

#define LINKED_LIST                                                                                                     \
    "{\"$defs\": {\"N\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, \"next\": {\"anyOf\": " \
    "[{\"$ref\": \"#/$defs/N\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\"], \"additionalProperties\": false}}, "   \
    "\"$ref\": \"#/$defs/N\"}"
// A value needs 3 levels when it takes the object branch: {"w": {"v": 1}}.
#define DEEP_BRANCH                                                                                                     \
    "{\"$defs\": {\"Node\": {\"type\": \"object\", \"properties\": {\"v\": {\"anyOf\": [{\"type\": \"integer\"}, "     \
    "{\"$ref\": \"#/$defs/W\"}]}}, \"required\": [\"v\"]}, \"W\": {\"type\": \"object\", \"properties\": {\"w\": "      \
    "{\"$ref\": \"#/$defs/Node\"}}, \"required\": [\"w\"]}}, \"$ref\": \"#/$defs/Node\"}"
// [[[1, {"x": 2}], {"x": 1}]]: a tuple whose first item nests, whose second needs 2 levels.
#define TUPLE_NEST                                                                                                      \
    "{\"$defs\": {\"A\": {\"type\": \"array\", \"prefixItems\": [{\"anyOf\": [{\"type\": \"integer\"}, {\"$ref\": "      \
    "\"#/$defs/A\"}]}, {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}], "   \
    "\"minItems\": 1, \"items\": false}}, \"$ref\": \"#/$defs/A\"}"
#define NESTED_ARRAYS "{\"$defs\": {\"A\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/A\"}}}, \"$ref\": \"#/$defs/A\"}"

static const JsonCase cases[] = {
    {LINKED_LIST,
     {"{\"v\": 1}", "{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3}}}",
      "{\"next\":{\"v\":2},\"v\":1}"},
     {"{\"v\": 1, \"next\": {}}", "{\"v\": 1, \"next\": {\"v\": \"x\"}}", "{\"next\": null}",
      "{\"v\": 1, \"next\": {\"v\": 2, \"w\": 1}}", "{\"v\": 1, \"next\": [{\"v\": 2}]}"}},
    // `#`: the root itself.
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"kids\": {\"type\": \"array\", \"items\": "
     "{\"$ref\": \"#\"}}}, \"required\": [\"name\"]}",
     {"{\"name\": \"a\", \"kids\": [{\"name\": \"b\"}, {\"name\": \"c\", \"kids\": []}]}", "{\"name\": \"a\"}"},
     {"{\"name\": \"a\", \"kids\": [{}]}", "{\"name\": \"a\", \"kids\": [{\"name\": \"b\", \"kids\": [1]}]}"}},
    // Mutual recursion through #/definitions, with an alternative that is no object.
    {"{\"definitions\": {\"A\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/definitions/B\"}}, \"B\": {\"anyOf\": "
     "[{\"type\": \"integer\"}, {\"$ref\": \"#/definitions/A\"}]}}, \"$ref\": \"#/definitions/B\"}",
     {"1", "[]", "[1, [2, [3]], []]", "[[[[[[]]]]]]"},
     {"[1, \"a\"]", "[[[true]]]", "{}", "[1,[2]"}},
    // Required recursion, ended by the alternative.
    {DEEP_BRANCH, {"{\"v\": 1}", "{\"v\": {\"w\": {\"v\": {\"w\": {\"v\": -3}}}}}"},
     {"{\"v\": {\"w\": {}}}", "{\"v\": {}}", "{\"v\": {\"w\": {\"v\": {\"w\": 1}}}}"}},
    // Tuples.
    {"{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"type\": \"string\"}], \"minItems\": 2, "
     "\"maxItems\": 2}",
     {"[1, \"a\"]", "[1,\"a\"]"}, {"[1]", "[1, \"a\", 2]", "[\"a\", 1]", "[]", "[1, 2]"}},
    {"{\"prefixItems\": [{\"type\": \"boolean\"}], \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}",
     {"[true]", "[false, 1, 2]"}, {"[]", "[1]", "[true, \"a\"]", "[true, 1, 2, 3]"}},
    {"{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"type\": \"null\"}], \"items\": false}",
     {"[]", "[1]", "[1, null]"}, {"[1, null, 2]", "[null]"}},
    {"{\"prefixItems\": [{\"type\": \"integer\"}]}", {"[]", "[1, \"x\", {\"a\": []}]"}, {"[\"x\"]", "{}"}},
    // A recursive tuple: a cons list [1, [2, null]].
    {"{\"$defs\": {\"T\": {\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"anyOf\": [{\"$ref\": "
     "\"#/$defs/T\"}, {\"type\": \"null\"}]}], \"minItems\": 2, \"items\": false}}, \"$ref\": \"#/$defs/T\"}",
     {"[1, null]", "[1, [2, [3, null]]]"}, {"[1]", "[1, [2]]", "[1, null, 3]", "[null, 1]"}},
    // Formats.
    {"{\"type\": \"string\", \"format\": \"date\"}",
     {"\"2024-02-29\"", "\"2000-02-29\"", "\"0001-01-01\"", "\"1999-12-31\"", "\"2023-04-30\"", "\"0400-02-29\""},
     {"\"1900-02-29\"", "\"2023-02-29\"", "\"2023-04-31\"", "\"0000-01-01\"", "\"2023-1-01\"", "\"2023-13-01\"",
      "\"20230101\"", "\"2023-01-01T00:00:00Z\"", "\"2023-01-00\"", "\"2023-01-32\"", "2023"}},
    {"{\"type\": \"string\", \"format\": \"time\"}",
     {"\"23:59:59Z\"", "\"00:00:00.123456+05:30\"", "\"12:00:00-23:59\""},
     {"\"24:00:00Z\"", "\"12:00:00\"", "\"12:60:00Z\"", "\"12:00:60Z\"", "\"12:00:00z\"", "\"12:00:00.1234567Z\"",
      "\"12:00:00+24:00\"", "\"12:00Z\"", "\"12:00:00.Z\""}},
    {"{\"type\": \"string\", \"format\": \"date-time\"}", {"\"2024-02-29T23:59:59.5Z\"", "\"0999-01-01T00:00:00+01:00\""},
     {"\"2024-02-29t23:59:59Z\"", "\"2024-02-29 23:59:59Z\"", "\"2023-02-29T00:00:00Z\"", "\"2024-02-29T23:59:59\""}},
    {"{\"type\": \"string\", \"format\": \"uuid\"}",
     {"\"123e4567-e89b-12d3-a456-426614174000\"", "\"00000000-0000-0000-0000-000000000000\"",
      "\"ABCDEF01-2345-6789-abcd-ef0123456789\""},
     {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\"",
      "\"g23e4567-e89b-12d3-a456-426614174000\"", "\"{123e4567-e89b-12d3-a456-426614174000}\"",
      "\"123e4567-e89b-12d3-a456-4266141740000\""}},
    {"{\"type\": [\"string\", \"null\"], \"format\": \"date\"}", {"null", "\"2024-01-01\""}, {"\"x\"", "1"}},
    {"{\"format\": \"uuid\", \"maxLength\": 36}", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"\""}},
};

static void test_accept_and_reject(void) { check_json_cases(cases, sizeof cases / sizeof cases[0]); }

// A schema whose values all nest `levels` objects deep, each object's one required key
// "k"; the chain ends with a reference (compiled first, shallow, through "a") to a chain
// of 20 more: the nesting adds up beyond the single schema's.
static char *deep_schema(int levels) {
    size_t size = 4096 + (size_t)levels * 96;
    char *text = xmalloc(size);
    size_t n = 0;
    n += (size_t)snprintf(text + n, size - n, "{\"$defs\": {\"D\": ");
    for (int i = 0; i < 20; i++) n += (size_t)snprintf(text + n, size - n, "{\"type\": \"object\", \"required\": [\"k\"], \"properties\": {\"k\": ");
    n += (size_t)snprintf(text + n, size - n, "{\"type\": \"integer\"}");
    for (int i = 0; i < 20; i++) n += (size_t)snprintf(text + n, size - n, "}}");
    n += (size_t)snprintf(text + n, size - n, "}, \"type\": \"object\", \"required\": [\"k\"], \"properties\": {\"a\": {\"$ref\": \"#/$defs/D\"}, \"k\": ");
    for (int i = 0; i < levels; i++) n += (size_t)snprintf(text + n, size - n, "{\"type\": \"object\", \"required\": [\"k\"], \"properties\": {\"k\": ");
    n += (size_t)snprintf(text + n, size - n, "{\"$ref\": \"#/$defs/D\"}");
    for (int i = 0; i < levels; i++) n += (size_t)snprintf(text + n, size - n, "}}");
    n += (size_t)snprintf(text + n, size - n, "}}");
    CHECK(n < size, "deep schema text");
    return text;
}

static void test_refusals(void) {
    static const JsonRefusal refused[] = {
        {"{\"$defs\": {\"L\": {\"type\": \"object\", \"properties\": {\"next\": {\"$ref\": \"#/$defs/L\"}}, \"required\": "
         "[\"next\"]}}, \"$ref\": \"#/$defs/L\"}",
         "'$ref' '#/$defs/L' has no finite value"},
        {"{\"type\": \"object\", \"properties\": {\"x\": {\"$ref\": \"#\"}}, \"required\": [\"x\"]}", "'$ref' '#' has no finite value"},
        // Mutual: A requires a B, B is a non-empty array of A.
        {"{\"$defs\": {\"A\": {\"type\": \"object\", \"properties\": {\"b\": {\"$ref\": \"#/$defs/B\"}}, \"required\": "
         "[\"b\"]}, \"B\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/A\"}, \"minItems\": 1}}, \"type\": "
         "\"object\", \"properties\": {\"a\": {\"$ref\": \"#/$defs/A\"}}}",
         "'$ref' '#/$defs/A' has no finite value"},
        {"{\"$defs\": {\"T\": {\"prefixItems\": [{\"$ref\": \"#/$defs/T\"}], \"minItems\": 1}}, \"$ref\": \"#/$defs/T\"}",
         "'$ref' '#/$defs/T' has no finite value"},
        {"{\"$defs\": {\"X\": {\"anyOf\": [{\"type\": \"string\"}, {\"$ref\": \"#/$defs/X\"}]}}, \"$ref\": \"#/$defs/X\"}",
         "'$ref' '#/$defs/X' is one of its own alternatives (left recursion"},
        {"{\"$defs\": {\"X\": {\"$ref\": \"#/$defs/Y\"}, \"Y\": {\"oneOf\": [{\"$ref\": \"#/$defs/X\"}, {\"type\": \"null\"}]}}, "
         "\"$ref\": \"#/$defs/X\"}",
         "left recursion"},
        {"{\"$ref\": \"#/properties/a\"}", "'$ref' '#/properties/a' is not supported"},
        {"{\"type\": \"string\", \"format\": \"email\"}", "'format' 'email' is not supported (only date, time, date-time and uuid)"},
        {"{\"type\": \"integer\", \"format\": \"int64\"}", "'format' 'int64' is not supported"},
        {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": \"date\", \"pattern\": \"^2\"}}}",
         "'format' beside 'pattern' is not supported (at properties.d)"},
        {"{\"type\": \"string\", \"format\": 3}", "'format' must be a string"},
        {"{\"type\": \"array\", \"prefixItems\": {}}", "'prefixItems' must be a list of schemas"},
        {"{\"type\": \"array\", \"prefixItems\": [{}, {}], \"items\": false, \"minItems\": 3}",
         "'items': false with 'minItems' above the number of 'prefixItems' matches nothing"},
        {"{\"type\": \"array\", \"prefixItems\": [{\"type\": \"strin\"}]}", "(at prefixItems[0])"},
        {"{\"type\": \"array\", \"items\": [{}]}", "write 'prefixItems'"},
    };
    check_json_refusals(refused, sizeof refused / sizeof refused[0]);
    // Nesting that adds up through a reference compiled once: 20 levels of D below 11 of
    // the root's chain and the root fit in JSON_MAX_DEPTH (32), 12 do not.
    char *fits = deep_schema(10), *too_deep = deep_schema(11);
    JsonConstraint *c = compile_text(fits);
    EXPECT(c != NULL, "a schema whose values nest 32 levels compiles");
    json_constraint_free(c);
    json_t *schema = json_loads(too_deep, 0, NULL);
    c = NULL;
    EXPECT(json_constraint_schema(&c, schema, "schema") == -1 && strstr(err_msg(), "nests more than 32 levels"),
           "a schema whose values all nest 33 levels is refused: %s", err_msg());
    json_decref(schema);
    free(fits), free(too_deep);
}

// Feeds text; true when every byte was taken.
static bool feed_text(const JsonConstraint *c, JsonState *state, const char *text) {
    return json_state_feed_bytes(c, state, text, strlen(text));
}

static void test_depth_edge(void) {
    // The linked list: a key and its value take a level as an object does, so 31 nested
    // objects fit (the root frame, 31 objects, the last one's key or value: JSON_MAX_DEPTH
    // open values); the 32nd '{' is refused, where `null` still ends the list.
    JsonConstraint *list = compile_text(LINKED_LIST);
    JsonState *state = xmalloc(sizeof *state), *copy = xmalloc(sizeof *copy);
    if (list) {
        json_state_init(list, state);
        bool ok = true;
        for (int level = 1; level < JSON_MAX_DEPTH - 1 && ok; level++) ok = feed_text(list, state, "{\"v\": 0, \"next\": ");
        EXPECT(ok, "30 nested objects are taken");
        json_state_copy(copy, state);
        EXPECT(feed_text(list, copy, "{\"v\": 1}"), "the 31st object is taken");
        json_state_copy(copy, state);
        EXPECT(feed_text(list, copy, "{\"v\": 1, \"next\": "), "the 31st object's next key is taken");
        JsonState *deeper = xmalloc(sizeof *deeper);
        json_state_copy(deeper, copy);
        EXPECT(!json_state_feed(list, deeper, '{', deeper), "the 32nd object is refused");
        EXPECT(feed_text(list, copy, "null"), "null ends the list at the limit");
        for (int level = 0; level < JSON_MAX_DEPTH - 1; level++) feed_text(list, copy, "}");
        EXPECT(json_state_accepts(list, copy), "the 31-deep list is complete");
        free(deeper);
        json_constraint_free(list);
    }
    // DEEP_BRANCH: the object branch of v needs 3 levels ({"w": {"v": 1}}: the object, its
    // key, the inner object's key): after k pairs {"v": {"w": and {"v": the frames are the
    // root's and 2k + 1 objects', so '{' is allowed while 1 + 2k + 1 + 3 <= 33, i.e. k <= 14;
    // beyond that only an integer is.
    JsonConstraint *branch = compile_text(DEEP_BRANCH);
    if (branch) {
        for (int k = 13; k <= 15; k++) {
            json_state_init(branch, state);
            bool ok = true;
            for (int i = 0; i < k && ok; i++) ok = feed_text(branch, state, "{\"v\": {\"w\": ");
            ok = ok && feed_text(branch, state, "{\"v\": ");
            EXPECT(ok, "%d pairs are taken", k);
            json_state_copy(copy, state);
            const bool open = json_state_feed(branch, copy, '{', copy);
            EXPECT(open == (k <= 14), "after %d pairs '{' is %s", k, k <= 14 ? "allowed" : "refused");
            json_state_copy(copy, state);
            EXPECT(json_state_feed(branch, copy, '7', copy), "after %d pairs an integer is allowed", k);
        }
        json_constraint_free(branch);
    }
    // An optional property whose value needs more room than is left is not offered (its
    // key is refused), and an object schema for other keys likewise: inside the 31st object,
    // "w" (its value {"x": 1} needs 2 levels) is not, "o" (its value {} needs 1) is.
    JsonConstraint *optional = compile_text(
        "{\"$defs\": {\"O\": {\"type\": \"object\", \"properties\": {\"o\": {\"$ref\": \"#/$defs/O\"}, \"w\": {\"type\": "
        "\"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}}, \"additionalProperties\": "
        "{\"type\": \"object\", \"properties\": {\"y\": {\"type\": \"integer\"}}, \"required\": [\"y\"]}}}, \"$ref\": "
        "\"#/$defs/O\"}");
    if (optional) {
        json_state_init(optional, state);
        bool ok = true;
        for (int level = 1; level < JSON_MAX_DEPTH - 1 && ok; level++) ok = feed_text(optional, state, "{\"o\": ");
        ok = ok && feed_text(optional, state, "{"); // the 31st object: room for one more level only
        EXPECT(ok, "31 nested objects are taken");
        json_state_copy(copy, state);
        EXPECT(feed_text(optional, copy, "\"o\": {}}"), "o (an empty object needs one level) is offered");
        json_state_copy(copy, state);
        EXPECT(!feed_text(optional, copy, "\"w\""), "w (needs two levels) is refused: %d", copy->num_paths);
        json_state_copy(copy, state);
        EXPECT(!feed_text(optional, copy, "\"z\""), "another key (its schema needs two levels) is refused");
        json_state_copy(copy, state);
        EXPECT(!feed_text(optional, copy, "\"o\": {\"o\""), "inside the 32nd object no key is offered");
        json_constraint_free(optional);
    }
    // A property's name stays that property's where other keys may come: "w" (too deep
    // there) is not taken as another key, whose schema (an integer) would fit.
    JsonConstraint *named = compile_text(
        "{\"$defs\": {\"O\": {\"type\": \"object\", \"properties\": {\"o\": {\"$ref\": \"#/$defs/O\"}, \"w\": {\"type\": "
        "\"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}}, \"additionalProperties\": "
        "{\"type\": \"integer\"}}}, \"$ref\": \"#/$defs/O\"}");
    if (named) {
        json_state_init(named, state);
        bool ok = true;
        for (int level = 1; level < JSON_MAX_DEPTH - 1 && ok; level++) ok = feed_text(named, state, "{\"o\": ");
        ok = ok && feed_text(named, state, "{");
        EXPECT(ok, "31 nested objects are taken");
        json_state_copy(copy, state);
        EXPECT(feed_text(named, copy, "\"z\": 1"), "another key with an integer is taken");
        json_state_copy(copy, state);
        EXPECT(!feed_text(named, copy, "\"w\":"), "\"w\" is refused, not taken as another key");
        json_state_copy(copy, state);
        EXPECT(feed_text(named, copy, "\"wz\": 2}"), "a longer key beginning with w is another key");
        json_constraint_free(named);
    }
    // A tuple's later item that needs more room than is left: ',' is refused before it
    // (its first item fits, minItems is 1, so ']' ends it). The tuple nests through its
    // first item; the second is an object with a required key (2 levels).
    JsonConstraint *tuple = compile_text(TUPLE_NEST);
    if (tuple) {
        for (int arrays = 30; arrays <= 31; arrays++) {
            json_state_init(tuple, state);
            bool ok = true;
            for (int i = 0; i < arrays && ok; i++) ok = feed_text(tuple, state, "[");
            ok = ok && feed_text(tuple, state, "1");
            EXPECT(ok, "%d nested arrays and an integer are taken", arrays);
            json_state_copy(copy, state);
            EXPECT(feed_text(tuple, copy, ", {\"x\": 1}") == (arrays == 30), "inside %d arrays the object item is %s", arrays,
                   arrays == 30 ? "taken" : "refused");
            json_state_copy(copy, state);
            EXPECT(!json_state_feed(tuple, copy, ',', copy) == (arrays == 31), "inside %d arrays ',' is %s", arrays,
                   arrays == 31 ? "refused" : "taken");
            json_state_copy(copy, state);
            EXPECT(feed_text(tuple, copy, "]"), "inside %d arrays ']' ends the tuple", arrays);
        }
        json_constraint_free(tuple);
    }
    free(state), free(copy);
}

// --- random walks -------------------------------------------------------------------------

static uint64_t walk_rng;

// A set of state keys (open addressing).
typedef struct {
    uint8_t **keys;
    size_t *lengths;
    size_t capacity, count;
} KeySet;

static uint64_t key_hash(const uint8_t *key, size_t length) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < length; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

// Adds the key; false when it was there.
static bool keyset_add(KeySet *set, const uint8_t *key, size_t length) {
    if (2 * (set->count + 1) > set->capacity) {
        KeySet bigger = {xcalloc(set->capacity ? 2 * set->capacity : 1024, sizeof(uint8_t *)),
                         xcalloc(set->capacity ? 2 * set->capacity : 1024, sizeof(size_t)),
                         set->capacity ? 2 * set->capacity : 1024, 0};
        for (size_t i = 0; i < set->capacity; i++)
            if (set->keys[i]) {
                size_t at = key_hash(set->keys[i], set->lengths[i]) & (bigger.capacity - 1);
                while (bigger.keys[at]) at = (at + 1) & (bigger.capacity - 1);
                bigger.keys[at] = set->keys[i], bigger.lengths[at] = set->lengths[i], bigger.count++;
            }
        free(set->keys), free(set->lengths);
        *set = bigger;
    }
    size_t at = key_hash(key, length) & (set->capacity - 1);
    for (; set->keys[at]; at = (at + 1) & (set->capacity - 1))
        if (set->lengths[at] == length && !memcmp(set->keys[at], key, length)) return false;
    set->keys[at] = xmalloc(length);
    memcpy(set->keys[at], key, length);
    set->lengths[at] = length;
    set->count++;
    return true;
}

static void keyset_free(KeySet *set) {
    for (size_t i = 0; i < set->capacity; i++) free(set->keys[i]);
    free(set->keys), free(set->lengths);
}

// A completion search: best first, by the text's length plus 40 bytes per open value (so
// that a value is closed before another is opened: a depth-first search would build the
// larger of the alternatives, e.g. a whole tree of Add nodes, before the smaller; and a
// string, whose states differ by their length, does not hold the search at one depth). No
// state is visited twice. States are kept packed (their used part).
typedef struct {
    long priority;
    uint8_t *packed; // the state's used part
    int parent;      // the search node before this byte (-1: the start)
    char byte;
} SearchNode;

static uint8_t *pack_state(const JsonState *s) {
    size_t size = sizeof(int);
    for (int i = 0; i < s->num_paths; i++) size += sizeof(int) + (size_t)s->paths[i].depth * sizeof(JsonFrame);
    uint8_t *packed = xmalloc(size), *at = packed;
    memcpy(at, &s->num_paths, sizeof(int)), at += sizeof(int);
    for (int i = 0; i < s->num_paths; i++) {
        memcpy(at, &s->paths[i].depth, sizeof(int)), at += sizeof(int);
        memcpy(at, s->paths[i].frames, (size_t)s->paths[i].depth * sizeof(JsonFrame)), at += (size_t)s->paths[i].depth * sizeof(JsonFrame);
    }
    return packed;
}

static void unpack_state(const uint8_t *at, JsonState *s) {
    memcpy(&s->num_paths, at, sizeof(int)), at += sizeof(int);
    for (int i = 0; i < s->num_paths; i++) {
        memcpy(&s->paths[i].depth, at, sizeof(int)), at += sizeof(int);
        memcpy(s->paths[i].frames, at, (size_t)s->paths[i].depth * sizeof(JsonFrame)), at += (size_t)s->paths[i].depth * sizeof(JsonFrame);
    }
}

static long search_priority(const JsonState *s, size_t length) {
    int depth = JSON_MAX_DEPTH + 2;
    for (int i = 0; i < s->num_paths; i++)
        if (s->paths[i].depth < depth) depth = s->paths[i].depth;
    return (long)depth * 40 + (long)length;
}

// A binary heap of search node indices by priority.
static void heap_push(int *heap, int *count, const SearchNode *nodes, int node) {
    int at = (*count)++;
    heap[at] = node;
    while (at > 0 && nodes[heap[(at - 1) / 2]].priority > nodes[heap[at]].priority) {
        const int parent = (at - 1) / 2, t = heap[parent];
        heap[parent] = heap[at], heap[at] = t, at = parent;
    }
}

static int heap_pop(int *heap, int *count, const SearchNode *nodes) {
    const int top_node = heap[0];
    heap[0] = heap[--*count];
    for (int at = 0;;) {
        int smallest = at;
        const int l = 2 * at + 1, r = 2 * at + 2;
        if (l < *count && nodes[heap[l]].priority < nodes[heap[smallest]].priority) smallest = l;
        if (r < *count && nodes[heap[r]].priority < nodes[heap[smallest]].priority) smallest = r;
        if (smallest == at) break;
        const int t = heap[smallest];
        heap[smallest] = heap[at], heap[at] = t, at = smallest;
    }
    return top_node;
}

// Appends to text (length bytes so far) bytes that complete it; false when none is found
// within max_nodes search states.
static bool complete(const JsonConstraint *c, const JsonState *start, char *text, size_t length, size_t max_text,
                     int max_nodes) {
    SearchNode *nodes = xmalloc((size_t)max_nodes * sizeof *nodes);
    int *heap = xmalloc((size_t)max_nodes * sizeof(int)), *lengths = xmalloc((size_t)max_nodes * sizeof(int));
    int num_nodes = 0, heap_count = 0, found = -1;
    KeySet seen = {0};
    JsonState *state = xmalloc(sizeof *state), *next = xmalloc(sizeof *next);
    uint8_t *key = xmalloc(sizeof(JsonState));
    keyset_add(&seen, key, json_state_key(c, start, key));
    nodes[0] = (SearchNode){search_priority(start, 0), pack_state(start), -1, 0};
    lengths[0] = 0;
    heap_push(heap, &heap_count, nodes, num_nodes++);
    while (heap_count > 0 && found < 0) {
        const int node = heap_pop(heap, &heap_count, nodes);
        unpack_state(nodes[node].packed, state);
        if (json_state_accepts(c, state)) {
            found = node;
            break;
        }
        if (length + (size_t)lengths[node] >= max_text) continue;
        for (int b = 0x20; b < 0x7f && num_nodes < max_nodes; b++) {
            if (!json_state_feed(c, state, (uint8_t)b, next)) continue;
            if (!keyset_add(&seen, key, json_state_key(c, next, key))) continue;
            lengths[num_nodes] = lengths[node] + 1;
            nodes[num_nodes] = (SearchNode){search_priority(next, (size_t)lengths[num_nodes]), pack_state(next), node, (char)b};
            heap_push(heap, &heap_count, nodes, num_nodes++);
        }
    }
    if (found >= 0) {
        const int added = lengths[found];
        for (int node = found, at = added - 1; node > 0; node = nodes[node].parent, at--) text[length + (size_t)at] = nodes[node].byte;
        text[length + (size_t)added] = '\0';
    }
    for (int i = 0; i < num_nodes; i++) free(nodes[i].packed);
    free(nodes), free(heap), free(lengths), free(state), free(next), free(key);
    keyset_free(&seen);
    return found >= 0;
}

static int nesting_of(const char *text) {
    int depth = 0, deepest = 0;
    bool in_string = false;
    for (const char *p = text; *p; p++) {
        if (in_string) {
            if (*p == '\\') p++;
            else if (*p == '"') in_string = false;
        } else if (*p == '"') {
            in_string = true;
        } else if (*p == '{' || *p == '[') {
            if (++depth > deepest) deepest = depth;
        } else if (*p == '}' || *p == ']') {
            depth--;
        }
    }
    return deepest;
}

static const char *const walk_schemas[] = {
    LINKED_LIST,
    TUPLE_NEST,
    DEEP_BRANCH,
    NESTED_ARRAYS,
    // pydantic's Formula = Num | Add(left: Formula, right: Formula): both branches objects.
    "{\"$defs\": {\"Add\": {\"properties\": {\"op\": {\"const\": \"add\", \"type\": \"string\"}, \"left\": {\"anyOf\": "
    "[{\"$ref\": \"#/$defs/Num\"}, {\"$ref\": \"#/$defs/Add\"}]}, \"right\": {\"anyOf\": [{\"$ref\": \"#/$defs/Num\"}, "
    "{\"$ref\": \"#/$defs/Add\"}]}}, \"required\": [\"op\", \"left\", \"right\"], \"type\": \"object\", "
    "\"additionalProperties\": false}, \"Num\": {\"properties\": {\"op\": {\"const\": \"num\", \"type\": \"string\"}, "
    "\"value\": {\"type\": \"integer\"}}, \"required\": [\"op\", \"value\"], \"type\": \"object\", "
    "\"additionalProperties\": false}}, \"anyOf\": [{\"$ref\": \"#/$defs/Num\"}, {\"$ref\": \"#/$defs/Add\"}]}",
    // Other keys' schema recursive, needing two levels ({"m": {}}).
    "{\"$defs\": {\"M\": {\"type\": \"object\", \"additionalProperties\": {\"$ref\": \"#/$defs/P\"}}, \"P\": {\"type\": "
    "\"object\", \"properties\": {\"m\": {\"$ref\": \"#/$defs/M\"}}, \"required\": [\"m\"], \"additionalProperties\": "
    "false}}, \"$ref\": \"#/$defs/M\"}",
    // A tuple cons list and minItems over a recursive item.
    "{\"$defs\": {\"T\": {\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"anyOf\": [{\"$ref\": "
    "\"#/$defs/T\"}, {\"type\": \"null\"}]}], \"minItems\": 2, \"items\": false}}, \"$ref\": \"#/$defs/T\"}",
    "{\"$defs\": {\"R\": {\"type\": \"array\", \"minItems\": 2, \"items\": {\"anyOf\": [{\"$ref\": \"#/$defs/R\"}, "
    "{\"type\": \"string\", \"format\": \"date\"}]}}}, \"$ref\": \"#/$defs/R\"}",
    // A linked list merged by allOf, with bounded integers and numbers.
    "{\"$defs\": {\"N\": {\"allOf\": [{\"properties\": {\"v\": {\"type\": \"integer\", \"minimum\": -5, \"maximum\": "
    "1000}, \"w\": {\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}}, \"required\": [\"v\"]}, "
    "{\"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/N\"}, {\"type\": \"null\"}]}}}]}}, \"$ref\": "
    "\"#/$defs/N\"}",
    // The root, with tuples and a uuid.
    "{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"string\", \"format\": \"uuid\"}, \"kids\": {\"type\": "
    "\"array\", \"prefixItems\": [{\"$ref\": \"#\"}], \"items\": {\"$ref\": \"#\"}, \"minItems\": 1}}, \"required\": "
    "[\"id\"], \"additionalProperties\": false}",
};

static int deepest_path(const JsonState *s) {
    int depth = 0;
    for (int i = 0; i < s->num_paths; i++)
        if (s->paths[i].depth > depth) depth = s->paths[i].depth;
    return depth;
}

// Walks draw each byte among the printable ones the state takes, a { or [ that opens a value
// weighted 40:1 (depth pressure), then a completion is searched for.
static void test_random_walks_complete(void) {
    walk_rng = 12345;
    JsonState *state = xmalloc(sizeof *state), *next = xmalloc(sizeof *next);
    const size_t max_text = 6000;
    char *text = xmalloc(max_text + 1);
    int deepest_overall = 0, walks = 0, incomplete = 0, stuck = 0;
    for (size_t s = 0; s < sizeof walk_schemas / sizeof walk_schemas[0]; s++) {
        JsonConstraint *c = compile_text(walk_schemas[s]);
        EXPECT(c != NULL, "walk schema %zu compiles", s);
        if (!c) continue;
        int deepest = 0;
        // A third of the walks in the sanitizer build (there for memory errors, not numbers).
        for (int walk = 0; walk < (TEST_SANITIZED ? 8 : 24); walk++, walks++) {
            json_state_init(c, state);
            size_t length = 0;
            const int steps = 50 + (int)(random_next(&walk_rng) % 400);
            for (int step = 0; step < steps; step++) {
                uint8_t allowed[96];
                int weights[96], total = 0, count = 0;
                for (int b = 0x20; b < 0x7f; b++)
                    if (json_state_feed(c, state, (uint8_t)b, next)) {
                        allowed[count] = (uint8_t)b;
                        weights[count] = (b == '{' || b == '[') && deepest_path(next) > deepest_path(state) ? 40 : 1;
                        total += weights[count++];
                    }
                if (count == 0) {
                    if (!json_state_accepts(c, state)) stuck++;
                    break;
                }
                int pick = (int)(random_next(&walk_rng) % (uint64_t)total), k = 0;
                while (pick >= weights[k]) pick -= weights[k++];
                json_state_feed(c, state, allowed[k], state);
                text[length++] = (char)allowed[k];
            }
            const bool done = complete(c, state, text, length, max_text, 200000);
            if (!done) {
                incomplete++;
                text[length] = '\0';
                fprintf(stderr, "  schema %zu: no completion of %.300s\n", s, text);
                continue;
            }
            const size_t full = strlen(text);
            EXPECT(json_constraint_matches(c, text, full), "schema %zu accepts its completed walk %.200s", s, text);
            json_error_t error;
            json_t *parsed = json_loadb(text, full, JSON_DECODE_ANY, &error);
            EXPECT(parsed != NULL, "jansson parses %.200s: %s", text, error.text);
            json_decref(parsed);
            if (nesting_of(text) > deepest) deepest = nesting_of(text);
        }
        printf("walk schema %zu: deepest completed text %d levels\n", s, deepest);
        if (deepest > deepest_overall) deepest_overall = deepest;
        json_constraint_free(c);
    }
    EXPECT(stuck == 0, "%d walks reached a state with no byte to take that is not complete", stuck);
    EXPECT(incomplete == 0, "%d of %d walks found no completion", incomplete, walks);
    EXPECT(deepest_overall == JSON_MAX_DEPTH, "the walks reached the depth limit (%d)", deepest_overall);
    free(state), free(next), free(text);
}

// --- pydantic's schemas and verdicts --------------------------------------------------------

static void test_pydantic_fixture(void) {
    check_pydantic_fixture("tests/fixtures/constraints/json_recursive.json", "tools/make_json_recursive_fixtures.py");
}

// --- tool calls -------------------------------------------------------------------------------

// Each tool's references are to its own definitions, even under the same name; a refusal
// names the tool.
static void test_tool_calls_own_definitions(void) {
    json_t *tools = json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"$defs\": {\"N\": {\"type\": "
        "\"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"up\": {\"$ref\": \"#/$defs/N\"}}, \"required\": "
        "[\"x\"]}}, \"type\": \"object\", \"properties\": {\"n\": {\"$ref\": \"#/$defs/N\"}}, \"required\": [\"n\"]}}}, "
        "{\"type\": \"function\", \"function\": {\"name\": \"b\", \"parameters\": {\"$defs\": {\"N\": {\"type\": "
        "\"string\"}}, \"type\": \"object\", \"properties\": {\"n\": {\"$ref\": \"#/$defs/N\"}}, \"required\": [\"n\"]}}}]",
        0, NULL);
    CHECK(tools, "tools");
    JsonConstraint *c = NULL;
    json_t *unsatisfiable = json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", \"function\": {\"name\": "
        "\"b\", \"parameters\": {\"$defs\": {\"L\": {\"type\": \"object\", \"properties\": {\"n\": {\"$ref\": "
        "\"#/$defs/L\"}}, \"required\": [\"n\"]}}, \"type\": \"object\", \"properties\": {\"l\": {\"$ref\": \"#/$defs/L\"}}}}}]",
        0, NULL);
    CHECK(unsatisfiable, "tools");
    EXPECT(json_constraint_tool_calls(&c, unsatisfiable, NULL, "", "", "; ", "arguments", 0) == -1 &&
               strstr(err_msg(), "tools[1].function.parameters: '$ref' '#/$defs/L' has no finite value"),
           "a tool's definition with no finite value is refused naming the tool: %s", err_msg());
    json_decref(unsatisfiable);
    EXPECT(json_constraint_tool_calls(&c, tools, NULL, "", "", "; ", "arguments", 0) == 0, "the tools compile: %s", err_msg());
    if (c) {
        const char *good[] = {"{\"name\": \"a\", \"arguments\": {\"n\": {\"x\": 1, \"up\": {\"x\": 2}}}}",
                              "{\"name\": \"b\", \"arguments\": {\"n\": \"s\"}}"};
        const char *bad[] = {"{\"name\": \"a\", \"arguments\": {\"n\": \"s\"}}",
                             "{\"name\": \"b\", \"arguments\": {\"n\": {\"x\": 1}}}"};
        for (int k = 0; k < 2; k++) {
            EXPECT(json_constraint_matches(c, good[k], strlen(good[k])), "accepts %s", good[k]);
            EXPECT(!json_constraint_matches(c, bad[k], strlen(bad[k])), "refuses %s", bad[k]);
        }
        json_constraint_free(c);
    }
    json_decref(tools);
}

// --- the vocabulary -------------------------------------------------------------------------

// At the depth limit the trie's mask equals the brute force: tokens such as "[[" or "[]"
// that would open one level too many are refused.
static void test_mask_at_depth_limit(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    Constraint *c = constraint_from_json(compile_text(NESTED_ARRAYS));
    char text[2 * JSON_MAX_DEPTH + 1];
    for (int i = 0; i < JSON_MAX_DEPTH; i++) text[i] = '[', text[JSON_MAX_DEPTH + i] = ']';
    text[2 * JSON_MAX_DEPTH] = '\0';
    double ms = 0;
    int steps = 0;
    if (c) check_mask(trie, tok, c, text, "nested arrays", &ms, &steps);
    constraint_free(c);
    token_trie_free(trie);
    tokenizer_free(tok);
}

int main(void) {
    RUN(test_accept_and_reject);
    RUN(test_refusals);
    RUN(test_depth_edge);
    RUN(test_random_walks_complete);
    RUN(test_pydantic_fixture);
    RUN(test_tool_calls_own_definitions);
    RUN(test_mask_at_depth_limit);
    TEST_EXIT();
}
