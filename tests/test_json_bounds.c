// Tests of gen/json_constraint.c's numeric bounds, allOf and `$ref` beside annotations:
//  - texts accepted and refused under integer and number bounds (one-sided, both, exclusive,
//    draft 4's boolean form, int64's limits, real bounds on integers, fractional bounds on
//    numbers, bounds inside objects and type lists), `$ref` with description / default /
//    deprecated / readOnly / writeOnly, allOf of one schema and of several object schemas;
//    every prefix of an accepted text alive, and chosen prefixes dead ("2" under 10..15);
//  - the one-line errors (empty ranges, a number's bound with more digits than fit, draft 4's
//    exclusiveMinimum alone, allOf members that do not merge, $ref beside a bound);
//  - integers exhaustively against a plain comparison in 128-bit arithmetic: under 140
//    bound pairs (near 0, ±1, powers of ten, ±(2^63 - 1), INT64_MIN, random; 40 of them
//    with a multipleOf, 2 to 2^62), every signed
//    text of up to 4 digits (leading zeros included) is accepted exactly when it is an
//    integer in range (and a multiple), and each of its prefixes is alive exactly when some
//    such integer begins with it; random walks of up to 20 bytes check the same past 4 digits; a schema
//    compiles exactly when its range holds an integer; states with equal keys (the integer
//    part reduced to how it compares with the bounds' leading digits) behave alike;
//  - numbers under integer and fractional bounds (0.5, -1.25, 9.9, ...), some with a
//    multipleOf of 1, 0.1 or 0.01: every text of up to 5 bytes over "-0159." accepted exactly
//    when strtod's value is in range (JSON's syntax, no exponent; no nonzero digit past the
//    step's places), and from every live state a depth-first completion (the constraint's own
//    bytes) reaches a text the plain comparison accepts (a started text can always be
//    completed); states with equal keys behave alike;
//  - tests/fixtures/constraints/json_bounds.json (tools/make_json_bounds_fixtures.py):
//    pydantic's schemas of models with Field(ge=, le=, gt=, lt=) (integer and fractional
//    bounds) and documented enum fields, with texts labelled by pydantic: every generated
//    text, and every edited one pydantic calls valid that is spelled as json.dumps spells it
//    with no exponent, is accepted with every prefix alive; every accepted text is one
//    pydantic calls valid;
//  - the token mask over SmolLM2's vocabulary equals the brute force through bounded numbers.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "gen/json_constraint.h"
#include "test.h"

#include "constraint_check.h"
#include "json_check.h"

#define COLOR_DEFS "\"$defs\": {\"Color\": {\"enum\": [\"red\", \"green\"], \"title\": \"Color\", \"type\": \"string\"}}"
#define BASE_DEFS                                                                                                      \
    "\"$defs\": {\"Base\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\", \"minimum\": 1}}, "   \
    "\"required\": [\"id\"]}, \"Named\": {\"$ref\": \"#/$defs/Base2\"}, \"Base2\": {\"properties\": {\"name\": "          \
    "{\"type\": \"string\"}}, \"required\": [\"name\"], \"additionalProperties\": true}}"

static const JsonCase cases[] = {
    // Integers.
    {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 15}", {"10", "12", "15"},
     {"9", "16", "1", "2", "010", "-10", "10.0", "1e1", "-0", "150", "1 "}},
    {"{\"type\": \"integer\", \"exclusiveMinimum\": 0}", {"1", "999", "9223372036854775807"},
     {"0", "-0", "-1", "9223372036854775808", "01"}},
    {"{\"type\": \"integer\", \"minimum\": 0, \"exclusiveMinimum\": true}", {"1", "42"}, {"0", "-0", "-1"}},
    {"{\"type\": \"integer\", \"maximum\": 0, \"exclusiveMaximum\": false}", {"0", "-0", "-7"}, {"1"}},
    {"{\"type\": \"integer\", \"maximum\": -1}", {"-1", "-100", "-9223372036854775808"},
     {"0", "-0", "1", "-9223372036854775809"}},
    {"{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 5}", {"-0", "0", "-5", "5", "3"}, {"-6", "6", "-00", "05", "-"}},
    {"{\"type\": \"integer\", \"exclusiveMinimum\": -5, \"exclusiveMaximum\": 5}", {"-4", "4", "0"}, {"-5", "5"}},
    // Both forms on a side: the stricter.
    {"{\"type\": \"integer\", \"minimum\": 3, \"exclusiveMinimum\": 3, \"maximum\": 9, \"exclusiveMaximum\": 20}",
     {"4", "9"}, {"3", "10"}},
    {"{\"type\": \"integer\", \"minimum\": 9223372036854775800}", {"9223372036854775800", "9223372036854775807"},
     {"9223372036854775799", "9223372036854775808", "922337203685477580", "-1"}},
    {"{\"type\": \"integer\", \"minimum\": -9223372036854775808, \"maximum\": 9223372036854775807}",
     {"-9223372036854775808", "9223372036854775807", "0"}, {"-9223372036854775809", "9223372036854775808"}},
    // No bounds: 18 digits, as before.
    {"{\"type\": \"integer\"}", {"999999999999999999", "-999999999999999999", "-0"}, {"1000000000000000000", "1.5"}},
    // Real bounds on an integer: rounded inward; 2.0 exclusive is 2 exclusive.
    {"{\"type\": \"integer\", \"minimum\": 0.5, \"exclusiveMaximum\": 3.0}", {"1", "2"}, {"0", "3"}},
    {"{\"type\": \"integer\", \"maximum\": 1e300, \"minimum\": -1e300}", {"9223372036854775807", "-9223372036854775808"},
     {"9223372036854775808"}},
    // Numbers under integer bounds (a probability, signs, a window).
    {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}",
     {"0", "1", "0.5", "1.0", "1.000", "0.001", "-0", "-0.0", "0.999999"},
     {"1.5", "1.01", "-0.1", "2", "1e-3", "10", "-1", "1.", ".5", "00.5", "0.5e0", "1E0"}},
    {"{\"type\": \"number\", \"exclusiveMinimum\": 0}", {"0.001", "5", "1.0", "0.00000000000000000001"},
     {"0", "0.0", "-0", "-1", "0.000", "-0.5"}},
    {"{\"type\": \"number\", \"maximum\": 0}", {"0", "-3.5", "-0.0", "-100000"}, {"0.1", "1", "0.0001"}},
    {"{\"type\": \"number\", \"exclusiveMaximum\": 0}", {"-0.5", "-3", "-0.0001"}, {"0", "-0", "-0.0", "0.5"}},
    {"{\"type\": \"number\", \"exclusiveMinimum\": -2, \"exclusiveMaximum\": 3}", {"-1.999", "2.999", "0", "-0.5"},
     {"-2", "3", "3.0", "-2.0", "-2.5", "3.000001"}},
    {"{\"type\": \"number\", \"minimum\": 2.0, \"maximum\": 1e300}", {"2", "2.5", "999999999999999999.5"}, {"1.9", "-2"}},
    // multipleOf on integers, with and without bounds.
    {"{\"type\": \"integer\", \"multipleOf\": 5, \"minimum\": 0, \"maximum\": 100}", {"0", "5", "95", "100", "-0"},
     {"3", "101", "105", "-5", "50.0", "1"}},
    {"{\"type\": \"integer\", \"multipleOf\": 3}", {"0", "-3", "12", "999999999999999999", "-999999999999999999"},
     {"1", "-1", "10", "999999999999999998"}},
    {"{\"type\": \"integer\", \"multipleOf\": 7.0, \"exclusiveMinimum\": 7, \"maximum\": 30}", {"14", "21", "28"},
     {"7", "0", "35", "20"}},
    {"{\"type\": [\"integer\", \"null\"], \"multipleOf\": 1000}", {"null", "1000", "-2000", "0"}, {"100", "1001"}},
    // multipleOf 10^-p on numbers: no nonzero digit past p places; the bounds onto that grid.
    {"{\"type\": \"number\", \"multipleOf\": 0.01, \"exclusiveMinimum\": 0, \"maximum\": 9.995}",
     {"0.01", "9.99", "5", "5.5", "5.50", "5.500", "0.10"}, {"0", "0.001", "0.005", "10", "9.995", "5.555", "-1"}},
    {"{\"type\": \"number\", \"multipleOf\": 0.1}", {"0", "-3.5", "12.3", "12.30", "-0.0"}, {"0.25", "1.01", "1e1"}},
    {"{\"type\": \"number\", \"multipleOf\": 1, \"minimum\": -2.5, \"exclusiveMaximum\": 2}",
     {"-2", "1", "1.0", "-0", "0.000"}, {"-3", "2", "1.5", "-2.5"}},
    {"{\"type\": \"number\", \"multipleOf\": 1e-2, \"maximum\": 1}", {"1", "1.00", "0.99", "-7.25"}, {"1.01", "0.999"}},
    {"{\"type\": \"number\", \"multipleOf\": 0.001, \"minimum\": -0.0015, \"exclusiveMaximum\": 0}",
     {"-0.001", "-0.0010"}, {"0", "-0", "-0.002", "-0.0015", "-0.0005"}},
    // Numbers under fractional bounds: exact decimals against the bound's shortest decimal.
    {"{\"type\": \"number\", \"minimum\": 0.5}", {"0.5", "0.50", "0.5000001", "0.6", "1", "12.25"},
     {"0.4", "0.4999999", "0", "-0.5", "0.49"}},
    {"{\"type\": \"number\", \"exclusiveMinimum\": 0.5, \"maximum\": 2.75}", {"0.5001", "0.51", "2.75", "2.7500", "1", "2"},
     {"0.5", "0.500", "2.751", "2.76", "3", "0.4"}},
    {"{\"type\": \"number\", \"minimum\": 0.1, \"exclusiveMaximum\": 0.3}", {"0.1", "0.2", "0.29999", "0.10"},
     {"0.09999", "0.3", "0.30", "0.31", "0"}},
    {"{\"type\": \"number\", \"minimum\": -1.5, \"maximum\": -0.25}", {"-1.5", "-1", "-0.25", "-0.3", "-1.49"},
     {"-1.51", "-0.24", "0", "-0", "-2", "1"}},
    {"{\"type\": \"number\", \"exclusiveMinimum\": -0.5, \"exclusiveMaximum\": 0.5}", {"0", "-0", "-0.49", "0.499", "-0.0"},
     {"-0.5", "0.5", "-1", "1"}},
    {"{\"type\": \"number\", \"minimum\": 0.25, \"maximum\": 0.25}", {"0.25", "0.250"}, {"0.2", "0.3", "0.251", "0.24"}},
    {"{\"type\": \"number\", \"minimum\": 0.001, \"maximum\": 99.99}", {"0.001", "0.0011", "99.99", "50"},
     {"0.0009", "0.000", "99.991", "100"}},
    {"{\"type\": \"integer\", \"minimum\": 0.5, \"maximum\": 2.5}", {"1", "2"}, {"0", "3", "1.5"}},
    // Type lists, no type, bounds inside an object.
    {"{\"type\": [\"number\", \"null\"], \"minimum\": 0}", {"null", "3", "0.25"}, {"-1", "-0.5"}},
    {"{\"type\": [\"integer\", \"string\"], \"minimum\": 1, \"maxLength\": 2}", {"1", "\"ab\""}, {"0", "\"abc\""}},
    {"{\"minimum\": 1}", {"1", "1.5"}, {"0", "\"a\""}},
    {"{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 120}, \"p\": "
     "{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}}, \"required\": [\"age\"]}",
     {"{\"age\": 0}", "{\"age\": 120, \"p\": 0.5}", "{\"p\":1,\"age\":7}"},
     {"{\"age\": 121}", "{\"age\": -1}", "{\"age\": 1, \"p\": 1.5}", "{\"age\": 12.5}"}},
    // $ref beside annotations (pydantic >= 2's documented fields).
    {"{" COLOR_DEFS ", \"type\": \"object\", \"properties\": {\"c\": {\"$ref\": \"#/$defs/Color\", \"description\": "
     "\"the colour\", \"default\": \"red\", \"deprecated\": true, \"readOnly\": true, \"writeOnly\": false, \"title\": "
     "\"C\", \"examples\": [\"red\"], \"$comment\": \"x\"}}, \"required\": [\"c\"]}",
     {"{\"c\": \"red\"}", "{\"c\": \"green\"}"}, {"{\"c\": \"blue\"}", "{}"}},
    // allOf: one schema (older pydantic), several object schemas merged.
    {"{" COLOR_DEFS ", \"type\": \"object\", \"properties\": {\"c\": {\"allOf\": [{\"$ref\": \"#/$defs/Color\"}], "
     "\"description\": \"d\", \"default\": \"red\"}}}",
     {"{\"c\": \"red\"}", "{}"}, {"{\"c\": \"blue\"}"}},
    {"{" BASE_DEFS ", \"allOf\": [{\"$ref\": \"#/$defs/Base\"}, {\"$ref\": \"#/$defs/Named\", \"description\": \"n\"}, "
     "{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\", \"minimum\": 1}, \"tag\": {\"type\": "
     "\"string\"}}}, true, {\"title\": \"only annotations\"}]}",
     {"{\"id\": 1, \"name\": \"a\"}", "{\"name\": \"a\", \"id\": 7, \"tag\": \"t\"}"},
     {"{\"id\": 1}", "{\"name\": \"a\"}", "{\"id\": 0, \"name\": \"a\"}", "{\"id\": 1, \"name\": \"a\", \"other\": 1}"}},
    // additionalProperties: true beside a schema is the schema; a schema beside false is false.
    {"{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": true}, {\"properties\": "
     "{\"b\": {\"type\": \"integer\"}}, \"additionalProperties\": {\"type\": \"integer\", \"maximum\": 3}}]}",
     {"{\"a\": 1, \"b\": 2, \"z\": 3}", "{}"}, {"{\"z\": 4}", "{\"z\": \"s\"}"}},
    {"{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": {\"type\": "
     "\"integer\"}}, {\"properties\": {\"b\": {\"type\": \"integer\"}}, \"additionalProperties\": false}]}",
     {"{\"a\": 1, \"b\": 2}"}, {"{\"z\": 3}"}},
    // A recursive definition through allOf.
    {"{\"$defs\": {\"N\": {\"allOf\": [{\"properties\": {\"v\": {\"type\": \"integer\", \"minimum\": 0}}, \"required\": "
     "[\"v\"]}, {\"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/N\"}, {\"type\": \"null\"}]}}}]}}, "
     "\"$ref\": \"#/$defs/N\"}",
     {"{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", "{\"v\": 0}"}, {"{\"v\": 1, \"next\": {\"v\": -2}}"}},
};

static void test_accept_and_reject(void) { check_json_cases(cases, sizeof cases / sizeof cases[0]); }

// Prefixes that must die at once (no completion within the bounds), and the byte budget's edge.
static void test_dead_prefixes(void) {
    static const struct {
        const char *schema, *alive, *dead;
    } checks[] = {
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 15}", "1", "2"},
        {"{\"type\": \"integer\", \"minimum\": 0, \"maximum\": 100, \"multipleOf\": 25}", "7", "3"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0.5, \"maximum\": 2.75}", "0.50", "0.4"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0.5, \"maximum\": 2.75}", "2.7", "2.8"},
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 15}", "1", "-"},
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 15}", "1", "0"},
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 15}", "1", "16"},
        {"{\"type\": \"integer\", \"minimum\": -15, \"maximum\": -10}", "-1", "-2"},
        {"{\"type\": \"integer\", \"minimum\": -15, \"maximum\": -10}", "-1", "-0"},
        {"{\"type\": \"integer\", \"minimum\": 1}", "9", "0"},
        {"{\"type\": \"integer\", \"maximum\": -1}", "-", "0"},
        {"{\"type\": \"integer\", \"maximum\": 9223372036854775807}", "922337203685477580", "9223372036854775808"},
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", "1.", "1.1"},
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", "0.9", "2"},
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", "1.0", "1e"},
        {"{\"type\": \"number\", \"exclusiveMaximum\": 1}", "0.9", "1."},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0}", "0.0", "-"},
        // 23 bytes of "0.000...": one more byte, a nonzero digit, still fits; 24 zeros do not.
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0}", "0.000000000000000000000", "0.0000000000000000000000"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        JsonConstraint *c = compile_text(checks[i].schema);
        EXPECT(c != NULL, "%s compiles", checks[i].schema);
        if (!c) continue;
        EXPECT(prefixes_alive(c, checks[i].alive, strlen(checks[i].alive)), "%s: %s is alive", checks[i].schema,
               checks[i].alive);
        EXPECT(!prefixes_alive(c, checks[i].dead, strlen(checks[i].dead)), "%s: %s is dead", checks[i].schema,
               checks[i].dead);
        json_constraint_free(c);
    }
}

static void test_refusals(void) {
    static const JsonRefusal refused[] = {
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 5}", "the bounds ('minimum': 10, 'maximum': 5) leave no integer"},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": 4, \"exclusiveMaximum\": 5}", "leave no integer"},
        {"{\"type\": \"integer\", \"minimum\": 0.2, \"maximum\": 0.8}", "leave no integer"},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": 9223372036854775807}", "leave no integer"},
        {"{\"type\": \"integer\", \"minimum\": 1e19}", "leave no integer"},
        {"{\"type\": \"integer\", \"exclusiveMaximum\": -9223372036854775808}", "leave no integer"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 1, \"exclusiveMaximum\": 1}", "leave no number"},
        {"{\"type\": \"number\", \"minimum\": 1000000000000000000}", "leave no number of at most 18 integer digits"},
        {"{\"type\": \"number\", \"maximum\": 1e-30}", "'maximum' 1.0000000000000001e-30 has more digits"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 1.5e-20}", "'exclusiveMinimum' 1.5000000000000001e-20 has more digits"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0.5, \"maximum\": 0.5}", "('exclusiveMinimum': 0.5, 'maximum': 0.5) leave no number"},
        {"{\"type\": \"number\", \"minimum\": 0.25, \"maximum\": -0.25}", "leave no number"},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": true}", "'exclusiveMinimum' true needs the bound beside it"},
        {"{\"type\": \"integer\", \"minimum\": \"1\"}", "'minimum' must be a number"},
        {"{\"type\": \"integer\", \"exclusiveMaximum\": null}", "'exclusiveMaximum' must be a number"},
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 3, \"maximum\": 2}}}",
         "(at properties.n)"},
        {"{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 4, \"multipleOf\": 5}",
         "the bounds ('minimum': 1, 'maximum': 4, 'multipleOf': 5) leave no integer"},
        {"{\"type\": \"integer\", \"multipleOf\": 0}", "'multipleOf' on an integer must be a positive integer"},
        {"{\"type\": \"integer\", \"multipleOf\": -3}", "'multipleOf' on an integer must be a positive integer"},
        {"{\"type\": \"integer\", \"multipleOf\": 0.5}", "'multipleOf' on an integer must be a positive integer"},
        {"{\"type\": \"integer\", \"multipleOf\": \"2\"}", "'multipleOf' on an integer must be a positive integer"},
        {"{\"multipleOf\": 2}", "'multipleOf' on a number must be 1, 0.1, 0.01, 0.001 or 0.0001"},
        {"{\"type\": \"number\", \"minimum\": 0, \"multipleOf\": 0.05}", "'multipleOf' on a number must be"},
        {"{\"type\": \"number\", \"multipleOf\": 0.00001}", "'multipleOf' on a number must be"},
        {"{\"type\": \"number\", \"multipleOf\": 10}", "'multipleOf' on a number must be"},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0.001, \"maximum\": 0.009, \"multipleOf\": 0.01}",
         "leave no number"},
        {"{\"enum\": [1, 2], \"minimum\": 2}", "'minimum' beside 'enum'"},
        {"{\"$defs\": {\"A\": {\"type\": \"integer\"}}, \"$ref\": \"#/$defs/A\", \"minimum\": 2}",
         "'$ref', 'anyOf' and 'oneOf' beside other keywords"},
        {"{\"allOf\": []}", "'allOf' must be a non-empty list"},
        {"{\"allOf\": {}}", "'allOf' must be a non-empty list"},
        {"{\"type\": \"object\", \"allOf\": [{}]}", "'allOf' beside other keywords"},
        {"{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}}, {\"properties\": {\"a\": {\"type\": "
         "\"string\"}}}]}",
         "'allOf' gives the property 'a' two different schemas (not supported) (at allOf[1])"},
        {"{\"allOf\": [{\"additionalProperties\": {\"type\": \"integer\"}}, {\"additionalProperties\": {\"type\": "
         "\"string\"}}]}",
         "two different 'additionalProperties' schemas"},
        {"{\"allOf\": [{\"type\": \"object\"}, {\"type\": \"integer\", \"minimum\": 1}]}", "'type' in an 'allOf' of several"},
        {"{\"allOf\": [{\"type\": \"object\"}, {\"anyOf\": [{}]}]}", "'anyOf' in an 'allOf' of several"},
        {"{\"allOf\": [{\"type\": \"object\"}, 3]}", "an 'allOf' member must be an object schema (at allOf[1])"},
        {"{\"allOf\": [{\"type\": \"object\"}, {\"$ref\": \"#/$defs/X\"}]}", "names no definition"},
        {"{\"$defs\": {\"X\": {\"$ref\": \"#/$defs/Y\"}, \"Y\": {\"$ref\": \"#/$defs/X\"}}, \"allOf\": [{\"type\": "
         "\"object\"}, {\"$ref\": \"#/$defs/X\"}]}",
         "refers to itself through references only"},
        {"{\"$defs\": {\"X\": {\"type\": \"object\"}}, \"allOf\": [{\"type\": \"object\"}, {\"$ref\": \"#/$defs/X\", "
         "\"required\": []}]}",
         "'required' beside '$ref'"},
        {"{\"allOf\": [{\"type\": \"object\"}, {\"properties\": {}, \"required\": [\"x\"]}]}", "'required' names 'x'"},
    };
    check_json_refusals(refused, sizeof refused / sizeof refused[0]);
}

// --- integers against a plain comparison ------------------------------------------------------

typedef __int128 wide;

// An integer schema's bounds as given: kind 0 none, 1 minimum/maximum, 2 exclusive (draft 6),
// 3 draft 4's boolean form.
typedef struct {
    int low_kind, high_kind;
    int64_t low, high;
    int64_t multiple; // multipleOf; 0: none
} IntBounds;

static void bounds_schema(const IntBounds *b, char *text, size_t size) {
    static const char *const low_forms[] = {"", "\"minimum\": %lld, ", "\"exclusiveMinimum\": %lld, ",
                                            "\"minimum\": %lld, \"exclusiveMinimum\": true, "};
    static const char *const high_forms[] = {"", "\"maximum\": %lld, ", "\"exclusiveMaximum\": %lld, ",
                                             "\"maximum\": %lld, \"exclusiveMaximum\": true, "};
    char low[96], high[96], multiple[48] = "";
    snprintf(low, sizeof low, low_forms[b->low_kind], (long long)b->low);
    snprintf(high, sizeof high, high_forms[b->high_kind], (long long)b->high);
    if (b->multiple) snprintf(multiple, sizeof multiple, "\"multipleOf\": %lld, ", (long long)b->multiple);
    snprintf(text, size, "{%s%s%s\"type\": \"integer\"}", low, high, multiple);
}

// The integers allowed, as docs/serving.md says: the bounds (exclusive ones one step in);
// with no bounds ±(10^18 - 1); a side with no bound, int64's limit.
static void bounds_range(const IntBounds *b, wide *low, wide *high) {
    const wide limit = (wide)999999999999999999LL;
    const bool none = b->low_kind == 0 && b->high_kind == 0;
    *low = b->low_kind == 0 ? (none ? -limit : (wide)INT64_MIN) : (wide)b->low + (b->low_kind >= 2 ? 1 : 0);
    *high = b->high_kind == 0 ? (none ? limit : (wide)INT64_MAX) : (wide)b->high - (b->high_kind >= 2 ? 1 : 0);
}

// Some multiple of `multiple` (1: any integer) in [low, high]: the smallest one from low.
static bool has_multiple(wide low, wide high, wide multiple) {
    if (low > high) return false;
    wide remainder = low % multiple;
    if (remainder < 0) remainder += multiple;
    const wide first = remainder ? low + (multiple - remainder) : low;
    return first <= high;
}

// Some integer in [low, high], a multiple of `multiple` (1: any), is written with `text` as
// its beginning (JSON's syntax; -0 is 0).
static bool reference_alive(const char *text, size_t length, wide low, wide high, wide multiple) {
    if (!has_multiple(low, high, multiple)) return false;
    const bool negative = length > 0 && text[0] == '-';
    const char *digits = text + negative;
    const size_t count = length - negative;
    if (count == 0) return !negative || has_multiple(low, high < 0 ? high : 0, multiple);
    wide value = 0;
    for (size_t i = 0; i < count; i++) {
        if (digits[i] < '0' || digits[i] > '9') return false;
        value = value * 10 + (digits[i] - '0');
    }
    if (digits[0] == '0') return count == 1 && low <= 0 && 0 <= high;
    wide scale = 1;
    for (size_t total = count; total <= 20; total++, scale *= 10) {
        wide first = value * scale, last = first + scale - 1;
        if (negative) {
            const wide t = -last;
            last = -first, first = t;
        }
        if (has_multiple(first > low ? first : low, last < high ? last : high, multiple)) return true;
    }
    return false;
}

static bool reference_accepts(const char *text, size_t length, wide low, wide high, wide multiple) {
    const bool negative = length > 0 && text[0] == '-';
    const char *digits = text + negative;
    const size_t count = length - negative;
    if (count == 0 || count > 20 || (digits[0] == '0' && count > 1)) return false;
    wide value = 0;
    for (size_t i = 0; i < count; i++) {
        if (digits[i] < '0' || digits[i] > '9') return false;
        value = value * 10 + (digits[i] - '0');
    }
    if (negative) value = -value;
    return low <= value && value <= high && value % multiple == 0;
}

// States by key (json_state_key), each with what it does next: the next byte's liveness
// for each of "-0123456789" and whether it is complete. Equal keys must mean equal
// behaviour (the key stands for the state in the mask cache and in completion searches).
#define KEY_TABLE 65536
typedef struct {
    uint8_t *keys[KEY_TABLE];
    size_t lengths[KEY_TABLE];
    uint32_t behaviour[KEY_TABLE];
    int count;
} KeyTable;

static uint32_t state_behaviour(const JsonConstraint *c, const JsonState *state) {
    JsonState *next = xmalloc(sizeof *next);
    uint32_t bits = json_state_accepts(c, state);
    for (int k = 0; k < 12; k++)
        if (json_state_feed(c, state, (uint8_t)"-0123456789."[k], next)) bits |= 2u << k;
    free(next);
    return bits;
}

// Records the state's key and behaviour; false when the key was met with another behaviour.
static bool key_table_check(KeyTable *table, const JsonConstraint *c, const JsonState *state) {
    uint8_t *key = xmalloc(sizeof(JsonState));
    const size_t length = json_state_key(c, state, key);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < length; i++) h = (h ^ key[i]) * 1099511628211ull;
    const uint32_t behaviour = state_behaviour(c, state);
    size_t at = h % KEY_TABLE;
    for (; table->keys[at]; at = (at + 1) % KEY_TABLE)
        if (table->lengths[at] == length && !memcmp(table->keys[at], key, length)) {
            free(key);
            return table->behaviour[at] == behaviour;
        }
    CHECK(table->count < KEY_TABLE / 2, "key table full");
    table->keys[at] = key, table->lengths[at] = length, table->behaviour[at] = behaviour;
    table->count++;
    return true;
}

static void key_table_clear(KeyTable *table) {
    for (size_t i = 0; i < KEY_TABLE; i++) free(table->keys[i]), table->keys[i] = NULL;
    table->count = 0;
}

typedef struct {
    const JsonConstraint *c;
    wide low, high, multiple;
    char text[32];
    int checked, wrong_alive, wrong_accepts, wrong_keys;
    KeyTable *keys; // NULL: keys not checked
} IntWalk;

// Every text of up to 4 digits after the text so far (and a sign first): its liveness and
// acceptance against the reference. state: the constraint's state after walk->text (alive).
static void enumerate_integers(IntWalk *walk, const JsonState *state, size_t length) {
    JsonState *next = xmalloc(sizeof *next);
    for (const char *b = "-0123456789.e"; *b; b++) {
        if (*b == '-' && length > 0) continue;
        walk->text[length] = *b;
        const bool alive = json_state_feed(walk->c, state, (uint8_t)*b, next);
        const bool expected = reference_alive(walk->text, length + 1, walk->low, walk->high, walk->multiple);
        walk->checked++;
        if (alive != expected) {
            if (walk->wrong_alive++ < 5)
                fprintf(stderr, "  %.*s: alive %d, expected %d\n", (int)length + 1, walk->text, alive, expected);
            continue;
        }
        if (!alive) continue;
        if (walk->keys && !key_table_check(walk->keys, walk->c, next) && walk->wrong_keys++ < 5)
            fprintf(stderr, "  %.*s: its key is another state's, which behaves otherwise\n", (int)length + 1, walk->text);
        if (json_state_accepts(walk->c, next) !=
                reference_accepts(walk->text, length + 1, walk->low, walk->high, walk->multiple) &&
            walk->wrong_accepts++ < 5)
            fprintf(stderr, "  %.*s: accepted %d\n", (int)length + 1, walk->text, json_state_accepts(walk->c, next));
        const size_t digits = length + 1 - (walk->text[0] == '-');
        if (digits < 4 || (digits == 4 && *b == '-')) enumerate_integers(walk, next, length + 1);
    }
    free(next);
}

// Random walks of up to 20 bytes, each byte drawn among those the constraint takes: at every
// step all 11 bytes' liveness against the reference; where no byte is taken, the text is
// complete.
static void walk_integers(IntWalk *walk, uint64_t *rng, int walks) {
    JsonState *state = xmalloc(sizeof *state), *next = xmalloc(sizeof *next);
    for (int w = 0; w < walks; w++) {
        json_state_init(walk->c, state);
        size_t length = 0;
        for (;;) {
            char allowed[11];
            int count = 0;
            for (const char *b = "-0123456789"; *b; b++) {
                walk->text[length] = *b;
                const bool alive = json_state_feed(walk->c, state, (uint8_t)*b, next);
                if (alive != reference_alive(walk->text, length + 1, walk->low, walk->high, walk->multiple) &&
                    walk->wrong_alive++ < 5)
                    fprintf(stderr, "  walk %.*s: alive %d\n", (int)length + 1, walk->text, alive);
                if (alive) allowed[count++] = *b;
                walk->checked++;
            }
            const bool accepts = json_state_accepts(walk->c, state);
            if (length > 0 && accepts != reference_accepts(walk->text, length, walk->low, walk->high, walk->multiple) &&
                walk->wrong_accepts++ < 5)
                fprintf(stderr, "  walk %.*s: accepted %d\n", (int)length, walk->text, accepts);
            if (count == 0) {
                if (!accepts && walk->wrong_alive++ < 5) fprintf(stderr, "  walk %.*s: stuck\n", (int)length, walk->text);
                break;
            }
            if (length >= 20 || (accepts && random_next(rng) % 8 == 0)) break;
            walk->text[length] = allowed[random_next(rng) % (uint64_t)count];
            json_state_feed(walk->c, state, (uint8_t)walk->text[length], state);
            length++;
        }
    }
    free(state), free(next);
}

static void test_integers_exhaustive(void) {
    static const int64_t interesting[] = {0, 1, -1, 2, -2, 9, -9, 10, -10, 11, -11, 99, -99, 100, -100, 101, 999, -999,
                                          1000, -1000, 1001, 9999, -9999, 10000, -10000, 12345, -12345,
                                          999999999999999999LL, -999999999999999999LL, 1000000000000000000LL,
                                          INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 9223372036854775000LL};
    const int num_interesting = (int)(sizeof interesting / sizeof interesting[0]);
    uint64_t rng = 2026;
    JsonState *state = xmalloc(sizeof *state);
    KeyTable *keys = xcalloc(1, sizeof *keys);
    int schemas = 0, empty = 0, checked = 0, wrong_alive = 0, wrong_accepts = 0, wrong_compile = 0, wrong_keys = 0;
    int key_states = 0;
    // From schema 100 on, with a multipleOf too (small steps, a power of ten, a large one).
    static const int64_t multiples[] = {2, 3, 7, 10, 25, 1000, 4611686018427387904LL};
    for (int s = 0; s < 140; s++) {
        IntBounds b = {(int)(random_next(&rng) % 4), (int)(random_next(&rng) % 4), 0, 0, 0};
        if (s >= 100) b.multiple = multiples[(random_next(&rng) >> 8) % 7];
        if (s == 0) b.low_kind = b.high_kind = 0; // no bounds at all
        for (int side = 0; side < 2; side++) {
            const uint64_t r = random_next(&rng) >> 8;
            int64_t v = r % 3 == 0   ? (int64_t)(random_next(&rng) % 40001) - 20000
                        : r % 3 == 1 ? interesting[(random_next(&rng) >> 8) % (uint64_t)num_interesting]
                                     : (int64_t)random_next(&rng);
            if (side == 0) b.low = v;
            else b.high = v;
        }
        // Keep most ranges non-empty: the lower of the two values low.
        if (random_next(&rng) % 4 != 0 && b.low > b.high) {
            const int64_t t = b.low;
            b.low = b.high, b.high = t;
        }
        char schema_text[256];
        bounds_schema(&b, schema_text, sizeof schema_text);
        IntWalk walk = {.multiple = b.multiple ? b.multiple : 1};
        bounds_range(&b, &walk.low, &walk.high);
        json_t *schema = json_loads(schema_text, 0, NULL);
        CHECK(schema, "%s", schema_text);
        JsonConstraint *c = NULL;
        const bool compiles = json_constraint_schema(&c, schema, "schema") == 0;
        json_decref(schema);
        if (compiles != has_multiple(walk.low, walk.high, walk.multiple)) {
            wrong_compile++;
            fprintf(stderr, "  %s: compiles %d\n", schema_text, compiles);
        }
        if (!c) {
            empty++;
            continue;
        }
        schemas++;
        walk.c = c;
        walk.keys = s % 8 == 0 ? keys : NULL; // every 8th schema: the keys too
        json_state_init(c, state);
        enumerate_integers(&walk, state, 0);
        if (walk.keys) key_states += keys->count, key_table_clear(keys);
        walk_integers(&walk, &rng, 40);
        if (walk.wrong_alive || walk.wrong_accepts) fprintf(stderr, "  under %s\n", schema_text);
        checked += walk.checked, wrong_alive += walk.wrong_alive, wrong_accepts += walk.wrong_accepts;
        wrong_keys += walk.wrong_keys;
        json_constraint_free(c);
    }
    printf("integers: %d schemas (%d more refused as empty), %d texts checked; %d distinct keys checked\n", schemas,
           empty, checked, key_states);
    EXPECT(wrong_keys == 0, "%d states share a key with a state that behaves otherwise", wrong_keys);
    EXPECT(wrong_compile == 0, "%d schemas compiled where the range is empty or were refused where it is not", wrong_compile);
    EXPECT(wrong_alive == 0, "%d prefixes alive where no integer in range begins with them, or the reverse", wrong_alive);
    EXPECT(wrong_accepts == 0, "%d texts accepted differently from the plain comparison", wrong_accepts);
    EXPECT(schemas > 90 && empty > 3, "both kinds of ranges were drawn (%d, %d)", schemas, empty);
    free(state), free(keys);
}

// --- numbers ------------------------------------------------------------------------------------

typedef struct {
    bool has_low, has_high, low_exclusive, high_exclusive;
    double low, high;
    int places; // multipleOf 10^-places; 0 (with `step`): 1; no step: none
    bool step;
} NumBounds;

// JSON's number syntax without an exponent (at most 18 integer digits), and strtod's value
// within the bounds (exact here: at most 5 bytes).
static bool number_reference(const char *text, const NumBounds *b) {
    const char *p = text + (text[0] == '-');
    if (!(*p >= '0' && *p <= '9')) return false;
    if (*p == '0' && p[1] >= '0' && p[1] <= '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return false;
        for (int place = 0; *p >= '0' && *p <= '9'; p++, place++)
            if (b->step && place >= b->places && *p != '0') return false; // not a multiple of the step
    }
    if (*p) return false;
    const double x = strtod(text, NULL);
    if (b->has_low && (x < b->low || (b->low_exclusive && x == b->low))) return false;
    if (b->has_high && (x > b->high || (b->high_exclusive && x == b->high))) return false;
    return true;
}

// Completes the state depth-first, the first byte that keeps it alive first (a nonzero digit
// before 0), within 24 bytes;
// false when no completion is found within `*budget` states.
static bool complete_number(const JsonConstraint *c, const JsonState *state, char *text, size_t length, int *budget) {
    if (json_state_accepts(c, state)) {
        text[length] = '\0';
        return true;
    }
    if (length >= JSON_MAX_NUMBER_BYTES || --*budget < 0) return false;
    JsonState *next = xmalloc(sizeof *next);
    bool found = false;
    for (const char *b = "1234567890.-"; *b && !found; b++) { // short completions: strtod is exact on them
        if (!json_state_feed(c, state, (uint8_t)*b, next)) continue;
        text[length] = *b;
        found = complete_number(c, next, text, length + 1, budget);
    }
    free(next);
    return found;
}

typedef struct {
    const JsonConstraint *c;
    NumBounds bounds;
    char text[40];
    int checked, wrong, stuck, wrong_keys;
    KeyTable *keys;
} NumWalk;

// Every text of up to 5 bytes over "-0159." (the whole tree: past a dead prefix the
// reference must refuse too); from every live state a completion.
static void enumerate_numbers(NumWalk *walk, const JsonState *state, size_t length) {
    JsonState *next = xmalloc(sizeof *next);
    for (const char *b = "-0159."; *b; b++) {
        walk->text[length] = *b;
        walk->text[length + 1] = '\0';
        const bool alive = state && json_state_feed(walk->c, state, (uint8_t)*b, next);
        const bool accepts = alive && json_state_accepts(walk->c, next);
        walk->checked++;
        if (accepts != number_reference(walk->text, &walk->bounds) && walk->wrong++ < 5)
            fprintf(stderr, "  %s: accepted %d\n", walk->text, accepts);
        if (alive && !key_table_check(walk->keys, walk->c, next) && walk->wrong_keys++ < 5)
            fprintf(stderr, "  %s: its key is another state's, which behaves otherwise\n", walk->text);
        if (alive) {
            char completed[40];
            memcpy(completed, walk->text, length + 1);
            int budget = 2000;
            if (!complete_number(walk->c, next, completed, length + 1, &budget) ||
                !number_reference(completed, &walk->bounds)) {
                if (walk->stuck++ < 5) fprintf(stderr, "  %s: no completion (%s)\n", walk->text, completed);
            }
        }
        if (length + 1 < 5) enumerate_numbers(walk, alive ? next : NULL, length + 1);
    }
    free(next);
}

static void test_numbers_exhaustive(void) {
    // Integer bounds, then fractional ones: some the texts over "0159." can equal (0.5,
    // 1.95, -0.05), some only straddle (0.25, -1.25); the texts are short decimals, so
    // strtod's order is the decimals' (exact).
    static const double integers[] = {-10, -2, -1, 0, 1, 2, 3, 10};
    static const double fractions[] = {-1.5, -1.25, -0.5, -0.05, 0.1, 0.25, 0.5, 0.95, 1.5, 1.95, 5.1, 9.9};
    uint64_t rng = 7;
    JsonState *state = xmalloc(sizeof *state);
    KeyTable *keys = xcalloc(1, sizeof *keys);
    int schemas = 0, checked = 0, wrong = 0, stuck = 0, wrong_keys = 0;
    for (int s = 0; s < 110; s++) {
        NumBounds b = {0};
        // From schema 70 on, a multipleOf of 1, 0.1 or 0.01 too.
        if (s >= 70) b.step = true, b.places = (int)(random_next(&rng) % 3);
        if (s < 4) { // the common cases: [0, 1], > 0, <= 0, < 0
            const NumBounds common[] = {{true, true, false, false, 0, 1, 0, false}, {true, false, true, false, 0, 0, 0, false},
                                        {false, true, false, false, 0, 0, 0, false}, {false, true, false, true, 0, 0, 0, false}};
            b = common[s];
        } else {
            b.has_low = random_next(&rng) % 4 != 0, b.has_high = random_next(&rng) % 4 != 0;
            b.low_exclusive = random_next(&rng) % 2, b.high_exclusive = random_next(&rng) % 2;
            // From schema 30 on, each bound fractional or not by a coin.
            const bool low_fraction = s >= 30 && random_next(&rng) % 3 != 0, high_fraction = s >= 30 && random_next(&rng) % 3 != 0;
            b.low = low_fraction ? fractions[(random_next(&rng) >> 8) % 12] : integers[(random_next(&rng) >> 8) % 8];
            b.high = high_fraction ? fractions[(random_next(&rng) >> 8) % 12] : integers[(random_next(&rng) >> 8) % 8];
            if (b.has_low && b.has_high && b.low > b.high) {
                const double t = b.low;
                b.low = b.high, b.high = t;
            }
            if (b.has_low && b.has_high && b.low == b.high) b.low_exclusive = b.high_exclusive = false;
        }
        char schema_text[200];
        snprintf(schema_text, sizeof schema_text, "{\"type\": \"number\"");
        if (b.has_low)
            snprintf(schema_text + strlen(schema_text), sizeof schema_text - strlen(schema_text), ", \"%s\": %g",
                     b.low_exclusive ? "exclusiveMinimum" : "minimum", b.low);
        if (b.has_high)
            snprintf(schema_text + strlen(schema_text), sizeof schema_text - strlen(schema_text), ", \"%s\": %g",
                     b.high_exclusive ? "exclusiveMaximum" : "maximum", b.high);
        if (b.step)
            snprintf(schema_text + strlen(schema_text), sizeof schema_text - strlen(schema_text), ", \"multipleOf\": %s",
                     b.places == 0 ? "1" : b.places == 1 ? "0.1" : "0.01");
        strcat(schema_text, "}");
        JsonConstraint *c = compile_text(schema_text);
        EXPECT(c != NULL, "%s compiles", schema_text);
        if (!c) continue;
        NumWalk walk = {.c = c, .bounds = b, .keys = keys};
        json_state_init(c, state);
        enumerate_numbers(&walk, state, 0);
        key_table_clear(keys);
        if (walk.wrong || walk.stuck || walk.wrong_keys) fprintf(stderr, "  under %s\n", schema_text);
        schemas++, checked += walk.checked, wrong += walk.wrong, stuck += walk.stuck, wrong_keys += walk.wrong_keys;
        json_constraint_free(c);
    }
    printf("numbers: %d schemas, %d texts checked\n", schemas, checked);
    EXPECT(wrong == 0, "%d texts accepted differently from strtod's comparison", wrong);
    EXPECT(stuck == 0, "%d live states with no completion the comparison accepts", stuck);
    EXPECT(wrong_keys == 0, "%d states share a key with a state that behaves otherwise", wrong_keys);
    free(state), free(keys);
}

// --- pydantic's schemas and verdicts --------------------------------------------------------

static void test_pydantic_fixture(void) {
    check_pydantic_fixture("tests/fixtures/constraints/json_bounds.json", "tools/make_json_bounds_fixtures.py");
}

// --- the vocabulary ------------------------------------------------------------------------------

// The trie's mask equals the brute force at every state of a text through bounded integers
// and numbers, integer and fractional bounds (constraint_check.h: also the cache — integer parts that compare alike with
// the bounds share a key — and the one-token check).
static void test_mask_equals_brute_force(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    Constraint *c = constraint_from_json(compile_text(
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"integer\", "
        "\"minimum\": 0, \"maximum\": 120}}, \"p\": {\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}, "
        "\"r\": {\"type\": \"number\", \"minimum\": -2.5, \"exclusiveMaximum\": 99.75}}, \"required\": [\"a\", \"p\", \"r\"]}"));
    double ms = 0;
    int steps = 0;
    if (c) check_mask(trie, tok, c, "{\"a\": [120, 11, 0], \"p\": 0.05, \"r\": -2.25}", "bounded numbers", &ms, &steps);
    constraint_free(c);
    token_trie_free(trie);
    tokenizer_free(tok);
}

int main(void) {
    RUN(test_accept_and_reject);
    RUN(test_dead_prefixes);
    RUN(test_refusals);
    RUN(test_integers_exhaustive);
    RUN(test_numbers_exhaustive);
    RUN(test_pydantic_fixture);
    RUN(test_mask_equals_brute_force);
    TEST_EXIT();
}
