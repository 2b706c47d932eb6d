// A JSON constraint for structured outputs: a byte-level pushdown recogniser of the JSON
// texts that are (a) any JSON object (OpenAI's response_format json_object), (b) a value
// that matches a JSON Schema (a subset, below), or (c) tool calls in a chat template's
// syntax whose arguments match the tools' `parameters` schemas. The sampler
// (gen/token_mask.h) asks it, before each token, which tokens' bytes keep the text a prefix
// of an accepted one, and whether the text so far is complete (the end-of-text token is
// allowed only then).
//
// The schema subset. Honoured: `type` (object, array, string, number, integer, boolean,
// null, or a list of them), `properties`, `required`, `additionalProperties` (false or
// absent: no other keys, as llama.cpp's json_schema and OpenAI's strict mode; true: other
// keys with any JSON value; a schema: other keys with values matching it), `items`,
// `prefixItems` (a tuple's first items; the rest match `items`: a schema, any value when
// absent, none when false), `minItems` / `maxItems`, `enum`, `const`, `anyOf` / `oneOf` (as
// alternatives: oneOf's "exactly one" is not checked), `$ref` to `#` (the root),
// `#/$defs/NAME` or `#/definitions/NAME` of the root schema, recursive ones included (each
// definition is compiled once, to one node of a graph; a definition with no finite value,
// or one that is its own alternative with no object or array between, is refused naming
// it), `minLength` / `maxLength` of
// strings (in code points), `pattern` of strings (gen/regex_constraint.h's dialect, with
// JSON Schema's meaning: the decoded content contains a match, unless the pattern is
// anchored by ^ / $; the length bounds are folded into its automaton; inside such a string
// the short escapes \" \\ \/ \b \f \n \r \t decode into the match but \uXXXX is refused:
// write the character itself), `format` of strings: date, time, date-time, uuid (anchored
// patterns written from RFC 3339 / RFC 4122, json_constraint.c's FORMAT_* say exactly which
// texts; not beside `pattern`), `minimum` / `maximum` / `exclusiveMinimum` /
// `exclusiveMaximum` (draft 6's numbers, or draft 4's boolean exclusiveMinimum /
// exclusiveMaximum beside minimum / maximum; both forms on a side: the stricter) on
// integers — any bounds, rounded inward when not integers; a side with no bound is int64's
// limit (an integer with no bound at all keeps the 18 digits below) — and on numbers,
// integer or fractional bounds (a fraction as its shortest decimal, compared with the text
// as an exact decimal; one with more digits than a number here holds is refused; a number
// under bounds is written without an exponent); `multipleOf` on integers (a positive
// integer) and on numbers (1, 0.1, 0.01, 0.001 or 0.0001: no nonzero digit past that many
// places, the bounds moved onto that grid; other steps refused);
// a schema with only these keywords is a number; `allOf` (one schema: that schema; several:
// object schemas — `$ref`s to them followed — merged: the properties' union, a property in
// two with the same schema only, the required keys' union, the stricter
// additionalProperties: false or absent, then a schema, then true), and the annotations
// `title`, `description`, `$schema`, `$id`, `$comment`, `default`, `examples`, `strict`,
// `deprecated`, `readOnly`, `writeOnly` (anywhere, `$ref` included: pydantic's documented
// fields). Any other keyword (`not`, `if`, `uniqueItems`, ...) or format
// (`email`, ...) is refused with an error naming it and where it is. So are schemas that
// no value satisfies as far as the recogniser can tell (an empty `type` list, minItems >
// maxItems, an enum none of whose values match the node's other keywords, a required key
// that is not a property when no other keys are allowed, bounds that leave no value), so
// that a text that starts to match can always be completed. An empty schema ({} or true)
// is any JSON value.
//
// Integers, and numbers under bounds, are read digit by digit against the bounds (no table
// of numbers): a digit is taken only where some value within them begins with the text so
// far, so under minimum 10, maximum 15 a first "1" is taken (10-15 complete it) and "2" is
// not.
//
// The texts: compact JSON with one optional space after each ':' and ',' (json.dumps'
// default separators; no other whitespace, none before or after the value), so a model
// cannot spend its tokens on spaces. Object keys in any order, each at most once, matched
// as json.dumps(key, ensure_ascii=False) spells them (no escapes the key does not need);
// strings: any UTF-8 (well-formed, checked byte by byte) but '"', '\\' and control bytes,
// which are written as escapes (\" \\ \/ \b \f \n \r \t \uXXXX; \u0000 and the surrogates
// \uD800-\uDFFF are refused: write the character itself); numbers as JSON spells them,
// at most 24 bytes, an integer part of at most 18 digits (19 for an integer under bounds,
// which keep it within int64) and an exponent of at most 2 (so that every number fits an
// int64 or a finite double); enum / const values exactly as jansson writes them compact (the
// object keys in the schema's order, no spaces). Nesting: at most JSON_MAX_DEPTH open
// values, an object's key counting as its value (deeper `{`/`[` is refused where the schema
// leaves it free). Each node knows the least nesting its values need, and a value, an
// anyOf branch, an optional key, another key under an additionalProperties schema or an
// array's next item is taken only where that still fits in what is left of JSON_MAX_DEPTH
// (a schema all of whose values nest deeper is refused): at the limit a recursive list's
// `next` can only be null. Alternatives run side by side (anyOf whose branches begin alike): at
// most JSON_MAX_PATHS of them alive at once; beyond that the later ones are dropped, which
// can forbid a text the schema allows but never allows one it forbids.
//
// The state (JsonState) is a small fixed-size value: copy it with json_state_copy (only
// its used part is copied); one per generated sequence.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define JSON_MAX_DEPTH 32
#define JSON_MAX_PATHS 16
#define JSON_MAX_NUMBER_BYTES 24
#define JSON_MAX_INTEGER_DIGITS 18
#define JSON_MAX_PROPERTIES 64 // per object schema
#define JSON_MAX_ENUM 64       // values of one enum

typedef struct JsonConstraint JsonConstraint;

typedef struct {
    int32_t node;
    int16_t phase;
    int16_t aux;
    int32_t count;
    int32_t str; // a string's escape / UTF-8 state
    uint64_t a, b;
} JsonFrame;

typedef struct {
    int depth;
    JsonFrame frames[JSON_MAX_DEPTH + 2];
} JsonPath;

typedef struct {
    int num_paths; // 0: dead (no text with this prefix is accepted)
    JsonPath paths[JSON_MAX_PATHS];
} JsonState;

// Any JSON object (response_format {"type": "json_object"}).
JsonConstraint *json_constraint_object(void);
// A value matching `schema` (an object, or true). Returns 0, or -1 with err_set(): the
// message names the keyword and where it is ("'format' is not supported (at
// properties.name)"), prefixed with `what` (e.g. "response_format.json_schema.schema").
int json_constraint_schema(JsonConstraint **out, const json_t *schema, const char *what);
// Tool calls: one or more (at most max_calls; 0: no limit) of `open` OBJECT `close`,
// separated by `separator`, where OBJECT is {"name": NAME, ARGUMENTS_KEY: ARGUMENTS} (either
// order) for one of the tools (a JSON array of OpenAI tools) whose name is `only` (NULL:
// any of them), ARGUMENTS matching its function.parameters (absent: any object). Errors as
// json_constraint_schema's, naming tools[i].function.parameters.
int json_constraint_tool_calls(JsonConstraint **out, const json_t *tools, const char *only, const char *open,
                               const char *close, const char *separator, const char *arguments_key, int max_calls);
void json_constraint_free(JsonConstraint *constraint);

// The state before any byte.
void json_state_init(const JsonConstraint *constraint, JsonState *state);
void json_state_copy(JsonState *dst, const JsonState *src);
// The state's used part as bytes into `key` (room for sizeof(JsonState)); returns the
// length (gen/constraint.h constraint_state_key). Equal keys: the same state. A string's
// character count is written as its minLength once it has passed it where no maxLength
// bounds it (it decides nothing more), so the states inside a long string share a key; a
// bounded number's integer part as how it compares with the bounds' leading digits (its
// digit count and, per bound, below / equal / above; its fraction's comparison with the
// bounds' fractions is in the frame already), which is all its future depends on (an integer
// under multipleOf: the integer part itself).
size_t json_state_key(const JsonConstraint *constraint, const JsonState *state, uint8_t *key);
// Feeds one byte: *out (may be *state) becomes the state after it; false when the byte
// takes every path to a dead end (then out->num_paths is 0).
bool json_state_feed(const JsonConstraint *constraint, const JsonState *state, uint8_t byte, JsonState *out);
// Feeds `length` bytes in place; false as soon as the text cannot be accepted.
bool json_state_feed_bytes(const JsonConstraint *constraint, JsonState *state, const char *bytes, size_t length);
// The text fed so far is a complete accepted text (the end of text may come now).
bool json_state_accepts(const JsonConstraint *constraint, const JsonState *state);

// The whole text: accepted or not (for tests and checks).
bool json_constraint_matches(const JsonConstraint *constraint, const char *text, size_t length);
