#!/usr/bin/env bash
# marlhf serve's structured outputs (docs/serving.md "Structured outputs"), through HTTP.
# Refusals on the tiny chat model: response_format of a wrong type or shape, a json_schema
# without its schema, with an unsupported keyword or format, malformed, or with a
# definition that has no finite value, beside a tool_choice that
# forces calls; vLLM's structured_outputs / guided_* malformed, combined or with a bad
# pattern; 400 naming the field. Then SmolLM2-135M-Instruct (when fetched; plain build only) with the
# Qwen2.5 template: json_object and json_schema answers (n = 2, sampled) parse and validate
# against their schema (a validator of the subset written here, stdlib only; it follows
# $ref), a recursive pydantic-style schema (a Tree of Trees, greedy), streamed
# answers are the non-streamed ones (same seed), /v1/completions too, an answer cut by
# max_tokens ends "length"; tool_choice "required" and a named function give tool calls of
# the declared tools whose arguments validate against their parameters (a bounded integer
# and a $ref beside annotations among them; a named function and parallel_tool_calls false
# exactly one), streamed as delta.tool_calls;
# structured_outputs.regex answers (n = 2) that Python's re.fullmatch accepts, streamed the
# same, and guided_choice on /v1/completions; GBNF grammars (structured_outputs.grammar,
# guided_grammar, llama.cpp's grammar): refused malformed with the line and column, and
# SmolLM2's answers under one parse; llama.cpp's grammar_lazy / grammar_triggers refused
# malformed, and SmolLM2's greedy answer under a lazy grammar is its free answer up to the
# trigger word, then the grammar's. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve_json
rm -rf "$tmp" && mkdir -p "$tmp"
tiny=tests/fixtures/models/tiny_chat
real_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh

cat > "$tmp/check.py" <<'PY'
import json, re, sys

def fail(why):
    print(why)
    sys.exit(1)

ROOT = {}  # the schema whose $defs a $ref names

def valid(v, s):
    """A JSON Schema validator of the subset the server takes (no other keys when
    additionalProperties is absent, as the server documents)."""
    if "$ref" in s:
        ref = s["$ref"]
        return valid(v, ROOT if ref == "#" else ROOT[ref.split("/")[1]][ref.split("/")[2]])
    if "anyOf" in s: return any(valid(v, a) for a in s["anyOf"])
    if "enum" in s and v not in s["enum"]: return False
    t = s.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if t == "integer" and not (isinstance(v, int) and not isinstance(v, bool)): return False
    if t == "number" and not (isinstance(v, (int, float)) and not isinstance(v, bool)): return False
    if t in kinds and not isinstance(v, kinds[t]): return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]: return False
        if "maximum" in s and v > s["maximum"]: return False
        if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]: return False
        if "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]: return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", 10**9): return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", 10**9): return False
        if "items" in s and not all(valid(x, s["items"]) for x in v): return False
    if isinstance(v, dict):
        props = s.get("properties", {})
        if any(k not in v for k in s.get("required", [])): return False
        for k, x in v.items():
            if k in props:
                if not valid(x, props[k]): return False
            elif s.get("additionalProperties") is not True:
                return False
    return True

kind = sys.argv[1]
if kind == "error":  # FILE PARAM SUBSTRING
    e = json.load(open(sys.argv[2])).get("error") or fail("not an error")
    if e.get("param") != sys.argv[3]: fail(f"param {e.get('param')!r}: {e}")
    if sys.argv[4] not in e["message"]: fail(f"message {e['message']!r} lacks {sys.argv[4]!r}")
elif kind == "answers":  # FILE SCHEMA|object [chat|completion]: each choice's text parses and validates
    o = json.load(open(sys.argv[2]))
    schema = None if sys.argv[3] == "object" else json.loads(sys.argv[3])
    ROOT = schema
    texts = []
    for c in o["choices"]:
        text = c["message"]["content"] if "message" in c else c["text"]
        if c["finish_reason"] != "stop": fail(f"finish_reason {c['finish_reason']}: {text!r}")
        try:
            v = json.loads(text)
        except ValueError as e:
            fail(f"not JSON: {text!r} ({e})")
        if schema is None and not isinstance(v, dict): fail(f"not an object: {text!r}")
        if schema is not None and not valid(v, schema): fail(f"does not validate: {text!r}")
        texts.append(text)
    print(json.dumps(texts))
elif kind == "stream":  # FILE: the choices' streamed contents, as "answers" prints them
    parts, reasons = {}, {}
    for line in open(sys.argv[2]):
        if not line.startswith("data: ") or line.strip() == "data: [DONE]": continue
        for c in json.loads(line[6:])["choices"]:
            d = c.get("delta", {})
            parts[c["index"]] = parts.get(c["index"], "") + (d.get("content") or c.get("text") or "")
            if c.get("finish_reason"): reasons[c["index"]] = c["finish_reason"]
    if any(r != "stop" for r in reasons.values()): fail(f"finish reasons {reasons}")
    print(json.dumps([parts[i] for i in sorted(parts)]))
elif kind == "regex":  # FILE PATTERN: each choice's text fullmatches (Python's re), finish_reason stop
    o = json.load(open(sys.argv[2]))
    texts = [c["message"]["content"] if "message" in c else c["text"] for c in o["choices"]]
    for c, t in zip(o["choices"], texts):
        if c["finish_reason"] != "stop": fail(f"finish_reason {c['finish_reason']}: {t!r}")
        if not re.fullmatch(sys.argv[3], t): fail(f"{t!r} does not match {sys.argv[3]!r}")
    print(json.dumps(texts))
elif kind == "choice":  # FILE CHOICES: each choice's text is one of them
    o = json.load(open(sys.argv[2]))
    texts = [c["message"]["content"] if "message" in c else c["text"] for c in o["choices"]]
    if any(t not in json.loads(sys.argv[3]) for t in texts): fail(f"{texts} not among {sys.argv[3]}")
    print(json.dumps(texts))
elif kind == "finish":  # FILE: the first choice's finish_reason
    print(json.load(open(sys.argv[2]))["choices"][0]["finish_reason"])
elif kind == "calls":  # FILE TOOLS [NAME] [ONE]: tool calls of the tools, arguments valid
    o = json.load(open(sys.argv[2]))
    tools = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in json.loads(sys.argv[3])}
    out = []
    for c in o["choices"]:
        m = c["message"]
        if c["finish_reason"] != "tool_calls": fail(f"finish_reason {c['finish_reason']}: {m}")
        calls = m.get("tool_calls") or fail(f"no calls: {m}")
        if m.get("content") is not None: fail(f"content beside forced calls: {m['content']!r}")
        for call in calls:
            f = call["function"]
            if f["name"] not in tools: fail(f"call of an undeclared tool {f['name']}")
            ROOT = tools[f["name"]]
            if len(sys.argv) > 4 and sys.argv[4] and f["name"] != sys.argv[4]: fail(f"call of {f['name']}, not {sys.argv[4]}")
            if not valid(json.loads(f["arguments"]), tools[f["name"]]): fail(f"arguments do not validate: {f}")
        if len(sys.argv) > 5 and len(calls) != 1: fail(f"{len(calls)} calls with parallel_tool_calls false")
        out.append([[x["function"]["name"], x["function"]["arguments"]] for x in calls])
    print(json.dumps(out))
elif kind == "stream_calls":  # FILE: the calls of a streamed answer
    calls, reason = [], None
    for line in open(sys.argv[2]):
        if not line.startswith("data: ") or line.strip() == "data: [DONE]": continue
        for c in json.loads(line[6:])["choices"]:
            for t in c.get("delta", {}).get("tool_calls", []):
                calls.append([t["function"]["name"], t["function"]["arguments"]])
            if c.get("delta", {}).get("content"): fail(f"content streamed: {c['delta']['content']!r}")
            reason = c.get("finish_reason") or reason
    if reason != "tool_calls": fail(f"finish_reason {reason}")
    print(json.dumps([calls]))
PY
check() { python3 "$tmp/check.py" "$@"; }

# expect_api_error NAME PARAM SUBSTRING BODY [ROUTE]: a 400 naming PARAM, its message containing SUBSTRING.
expect_api_error() {
    local name=$1 param=$2 substring=$3 body=$4 route=${5:-/v1/chat/completions}
    local status why
    status=$(request POST "$route" "$body")
    if [ "$status" = 400 ] && why=$(check error "$tmp/body" "$param" "$substring"); then
        pass "$name"
    else
        fail "$name" "status $status ${why:-}: $(head -c 300 "$tmp/body")"
    fi
}

start_server "$tmp/server_errors.log" --model "$tiny" --chat-template qwen2.5 --threads 1 ||
    fail server_starts "$(tail -n 3 "$tmp/server_errors.log")"
msg='"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
rf() { echo "{$msg, \"response_format\": $1}"; }
expect_api_error response_format_not_object response_format "'response_format' must be an object" "$(rf '"json"')"
expect_api_error response_format_type response_format "'response_format.type' must be" "$(rf '{"type": "xml"}')"
expect_api_error json_schema_missing response_format "'response_format.json_schema' must be an object" "$(rf '{"type": "json_schema"}')"
expect_api_error json_schema_no_name response_format "'response_format.json_schema.name' must be" \
    "$(rf '{"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}')"
expect_api_error json_schema_no_schema response_format "'response_format.json_schema.schema' is required" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x"}}')"
expect_api_error json_schema_strict_not_bool response_format "strict' must be a boolean" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "strict": "yes", "schema": {}}}')"
expect_api_error json_schema_unsupported_keyword response_format \
    "response_format.json_schema.schema: 'format' 'email' is not supported (only date, time, date-time and uuid) (at properties.when)" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"when": {"type": "string", "format": "email"}}}}}')"
expect_api_error json_schema_malformed response_format "'type' must be a string or a list of strings" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}')"
expect_api_error json_schema_not_a_schema response_format "a schema must be an object or a boolean" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}')"
expect_api_error json_schema_no_finite_value response_format \
    "response_format.json_schema.schema: '\$ref' '#/\$defs/n' has no finite value" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"}}}')"
expect_api_error json_schema_completions response_format "'format' 'uri' is not supported" \
    '{"prompt": "hi", "max_tokens": 1, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri"}}}}' \
    /v1/completions
expect_api_error json_schema_bad_pattern response_format "'pattern' (at properties.code): nothing to repeat (at position 0)" \
    "$(rf '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"code": {"type": "string", "pattern": "*a"}}}}}')"
# vLLM's structured_outputs and the guided_* fields of vLLM before 0.12.
so() { echo "{$msg, \"structured_outputs\": $1}"; }
expect_api_error regex_bad structured_outputs.regex "structured_outputs.regex: lookahead and lookbehind are not supported (at position 2)" \
    "$(so '{"regex": "ab(?=c)"}')"
expect_api_error regex_not_string structured_outputs.regex "must be a string" "$(so '{"regex": 5}')"
expect_api_error regex_completions structured_outputs.regex "nothing to repeat (at position 0)" \
    '{"prompt": "hi", "max_tokens": 1, "structured_outputs": {"regex": "+"}}' /v1/completions
expect_api_error choice_empty structured_outputs.choice "must be a list of 1 to 4096 strings" "$(so '{"choice": []}')"
expect_api_error choice_not_strings guided_choice "item 1 is not one" "{$msg, \"guided_choice\": [\"a\", 1]}"
expect_api_error guided_regex_bad guided_regex "guided_regex: backreferences" "{$msg, \"guided_regex\": \"(a)\\\\1\"}"
expect_api_error structured_two_kinds structured_outputs "not both 'regex' and 'choice'" "$(so '{"regex": "a", "choice": ["a"]}')"
# GBNF grammars: structured_outputs.grammar, guided_grammar and llama.cpp's grammar.
expect_api_error structured_grammar_bad structured_outputs.grammar \
    "structured_outputs.grammar: the rule 'x' is used but never defined (at line 1, column 10)" "$(so '{"grammar": "root ::= x"}')"
expect_api_error guided_grammar_left_recursive guided_grammar "guided_grammar: the rule 'a' is left-recursive (it can begin with itself)" \
    "{$msg, \"guided_grammar\": \"root ::= a\\na ::= a \\\"x\\\" | \\\"y\\\"\"}"
expect_api_error grammar_completions grammar "grammar: the group '(' is never closed (at line 2, column 7)" \
    '{"prompt": "hi", "max_tokens": 1, "grammar": "root ::= a\na ::= (\"x\""}' /v1/completions
expect_api_error grammar_not_string grammar "'grammar' must be a string (a GBNF grammar)" "{$msg, \"grammar\": 5}"
expect_api_error grammar_and_guided grammar "give one of 'structured_outputs'" \
    "{$msg, \"grammar\": \"root ::= \\\"a\\\"\", \"guided_grammar\": \"root ::= \\\"a\\\"\"}"
expect_api_error structured_grammar_and_choice structured_outputs "not both 'grammar' and 'choice'" \
    "$(so '{"grammar": "root ::= \"a\"", "choice": ["a"]}')"
expect_api_error structural_tag structural_tag "'structural_tag' is not supported" "{$msg, \"structural_tag\": {}}"
status=$(request POST /v1/chat/completions "{$msg, \"grammar\": \"\"}")
[ "$status" = 200 ] && pass grammar_empty_is_none || fail grammar_empty_is_none "status $status: $(head -c 300 "$tmp/body")"
# llama.cpp's lazy grammars: grammar_lazy with word triggers, refused malformed.
g='"grammar": "root ::= \"yes\" [0-9]"'
expect_api_error grammar_lazy_not_bool grammar_lazy "'grammar_lazy' must be a boolean" "{$msg, $g, \"grammar_lazy\": 1}"
expect_api_error grammar_lazy_without_grammar grammar_lazy "'grammar_lazy' needs a 'grammar'" \
    "{$msg, \"grammar_lazy\": true, \"grammar_triggers\": [{\"type\": 1, \"value\": \"yes\"}]}"
expect_api_error grammar_lazy_without_triggers grammar_triggers "'grammar_lazy' needs a non-empty 'grammar_triggers'" \
    "{$msg, $g, \"grammar_lazy\": true}"
expect_api_error grammar_triggers_without_lazy grammar_triggers "'grammar_triggers' needs \"grammar_lazy\": true" \
    "{$msg, $g, \"grammar_triggers\": [{\"type\": 1, \"value\": \"yes\"}]}"
expect_api_error grammar_trigger_token grammar_triggers "grammar_triggers[0].type 0 is not supported" \
    "{$msg, $g, \"grammar_lazy\": true, \"grammar_triggers\": [{\"type\": 0, \"value\": \"yes\", \"token\": 5}]}"
expect_api_error grammar_trigger_malformed grammar_triggers "grammar_triggers[1] must be {\"type\": 1" \
    "{$msg, $g, \"grammar_lazy\": true, \"grammar_triggers\": [{\"type\": 1, \"value\": \"yes\"}, \"no\"]}"
expect_api_error grammar_trigger_not_a_start grammar_triggers "grammar_triggers: the trigger 'no' does not start any text" \
    "{$msg, $g, \"grammar_lazy\": true, \"grammar_triggers\": [{\"type\": 1, \"value\": \"no\"}]}"
status=$(request POST /v1/chat/completions "{$msg, $g, \"grammar_lazy\": false, \"grammar_triggers\": []}")
[ "$status" = 200 ] && pass grammar_lazy_false_is_neutral || fail grammar_lazy_false_is_neutral "status $status: $(head -c 300 "$tmp/body")"
# The field is parsed and drives the answer (the tiny model, 6 tokens at most: a prefix).
status=$(request POST /v1/completions '{"prompt": "hi", "max_tokens": 6, "temperature": 1, "seed": 3, "grammar": "root ::= \"yes\" | \"no\""}')
got=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["choices"][0]["text"]
assert any(w.startswith(t) for w in ("yes", "no")), t; print(repr(t))' "$tmp/body" 2>&1) && [ "$status" = 200 ] &&
    pass "grammar_drives_tiny_model $got" || fail grammar_drives_tiny_model "status $status: $got"
expect_api_error structured_and_guided guided_regex "give one of 'structured_outputs'" \
    "{$msg, \"structured_outputs\": {\"regex\": \"a\"}, \"guided_regex\": \"a\"}"
expect_api_error structured_and_response_format structured_outputs "beside 'response_format'" \
    "{$msg, \"structured_outputs\": {\"regex\": \"a\"}, \"response_format\": {\"type\": \"json_object\"}}"
expect_api_error structured_json_bad structured_outputs.json "'format' 'email' is not supported" \
    "$(so '{"json": "{\"type\": \"string\", \"format\": \"email\"}"}')"
weather='{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}'
expect_api_error response_format_with_forced_calls response_format "beside a 'tool_choice' that forces calls" \
    "{$msg, \"tools\": [$weather], \"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}}"
expect_api_error guided_choice_with_forced_calls guided_choice "beside a 'tool_choice' that forces calls" \
    "{$msg, \"tools\": [$weather], \"tool_choice\": \"required\", \"guided_choice\": [\"a\"]}"
status=$(request POST /v1/chat/completions "$(rf '{"type": "text"}')")
[ "$status" = 200 ] && pass response_format_text_accepted || fail response_format_text_accepted "status $status"
stop_server

if ! real_model_runs "$real_model" "smollm2 structured outputs"; then
    [ "$failures" = 0 ]
    exit
fi
start_server "$tmp/server_smollm2.log" --model "$real_model" --chat-template qwen2.5 --threads 2 --parallel 4 ||
    fail server_starts_smollm2 "$(tail -n 3 "$tmp/server_smollm2.log")"
person='{"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}, "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 2}}, "required": ["name", "age", "hobbies"], "additionalProperties": false}'
body() { # CONTENT RESPONSE_FORMAT STREAM [N] [MAX_TOKENS]
    python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": sys.argv[1]}],
        "response_format": json.loads(sys.argv[2]), "stream": sys.argv[3] == "stream", "n": int(sys.argv[4]),
        "max_tokens": int(sys.argv[5]), "temperature": 0.8, "top_p": 0.95, "seed": 7}))' "$1" "$2" "$3" "${4:-1}" "${5:-80}"
}
# Long answers on a loaded machine: wait as long as a request may run.
status=$(request POST /v1/chat/completions "$(body "Describe a person in JSON." '{"type": "json_object"}' plain)" --max-time 600)
got=$(check answers "$tmp/body" object) && [ "$status" = 200 ] && pass "json_object_answer $got" || fail json_object_answer "status $status: $got"

format="{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"person\", \"strict\": true, \"schema\": $person}}"
status=$(request POST /v1/chat/completions "$(body "Describe a person." "$format" plain 2)" --max-time 600)
plain=$(check answers "$tmp/body" "$person") && [ "$status" = 200 ] && pass "json_schema_answers_n2 $plain" ||
    fail json_schema_answers_n2 "status $status: $plain"
request POST /v1/chat/completions "$(body "Describe a person." "$format" stream 2)" --max-time 600 > /dev/null
streamed=$(check stream "$tmp/body")
[ -n "$plain" ] && [ "$streamed" = "$plain" ] && pass json_schema_streamed_same || fail json_schema_streamed_same "$streamed vs $plain"

completion=$(python3 -c 'import json,sys; print(json.dumps({"prompt": "A person, as JSON: ", "max_tokens": 80, "seed": 3,
    "response_format": json.loads(sys.argv[1])}))' "$format")
status=$(request POST /v1/completions "$completion" --max-time 600)
got=$(check answers "$tmp/body" "$person") && [ "$status" = 200 ] && pass "completions_json_schema $got" ||
    fail completions_json_schema "status $status: $got"

# A recursive schema as pydantic writes a self-referencing model (Tree.kids: List[Tree]),
# greedy on /v1/completions after one example: the answer validates (the checker follows
# $ref) and nests a Tree inside a Tree.
tree='{"$defs": {"Tree": {"properties": {"name": {"maxLength": 12, "title": "Name", "type": "string"}, "kids": {"items": {"$ref": "#/$defs/Tree"}, "maxItems": 2, "title": "Kids", "type": "array"}}, "required": ["name", "kids"], "title": "Tree", "type": "object", "additionalProperties": false}}, "$ref": "#/$defs/Tree"}'
tree_body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": "A family tree as JSON: {\"name\": \"Ann\", \"kids\": [{\"name\": \"Bob\", \"kids\": []}]}\nAnother family tree as JSON: ",
    "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "tree", "schema": json.loads(sys.argv[1])}}}))' "$tree")
status=$(request POST /v1/completions "$tree_body" --max-time 600)
got=$(check answers "$tmp/body" "$tree") && [ "$status" = 200 ] &&
    python3 -c 'import json,sys; assert json.loads(json.loads(sys.argv[1])[0])["kids"], "no Tree inside the Tree"' "$got" &&
    pass "completions_recursive_schema_greedy $got" || fail completions_recursive_schema_greedy "status $status: $got"

request POST /v1/chat/completions "$(body "Describe a person." "$format" plain 1 4)" --max-time 600 > /dev/null
reason=$(check finish "$tmp/body")
[ "$reason" = length ] && pass max_tokens_before_the_end_is_length || fail max_tokens_before_the_end_is_length "$reason"

# structured_outputs.regex: n = 2 sampled, every answer fullmatches; streamed the same; guided_choice on /v1/completions.
# (bounded: at most 31 characters, so every answer ends within max_tokens)
regex='[A-Z][a-z]{1,12} (is|was) born in (19|20)\d{2}\.'
regex_body() { # STREAM
    python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": "When was Marie Curie born? One sentence."}],
        "structured_outputs": {"regex": sys.argv[1]}, "stream": sys.argv[2] == "stream", "n": 2, "max_tokens": 40,
        "temperature": 0.8, "seed": 11}))' "$regex" "$1"
}
status=$(request POST /v1/chat/completions "$(regex_body plain)" --max-time 600)
plain=$(check regex "$tmp/body" "$regex") && [ "$status" = 200 ] && pass "structured_outputs_regex_n2 $plain" ||
    fail structured_outputs_regex_n2 "status $status: $plain"
request POST /v1/chat/completions "$(regex_body stream)" --max-time 600 > /dev/null
streamed=$(check stream "$tmp/body")
[ -n "$plain" ] && [ "$streamed" = "$plain" ] && pass structured_outputs_regex_streamed_same || fail structured_outputs_regex_streamed_same "$streamed vs $plain"
# A GBNF grammar (structured_outputs.grammar, n = 2 sampled; llama.cpp's grammar on
# /v1/completions, greedy): every answer parses (re.fullmatch of the equivalent pattern).
list_grammar='root ::= "[" item ("," " "? item){0,3} "]"
item ::= number | "[" number ("," " "? number){0,2} "]"
number ::= "-"? [0-9]{1,3}'
list_regex='\[(-?\d{1,3}|\[-?\d{1,3}(, ?-?\d{1,3}){0,2}\])(, ?(-?\d{1,3}|\[-?\d{1,3}(, ?-?\d{1,3}){0,2}\])){0,3}\]'
status=$(request POST /v1/chat/completions "$(python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user",
    "content": "Give a list of three small numbers."}], "structured_outputs": {"grammar": sys.argv[1]}, "n": 2, "max_tokens": 40,
    "temperature": 0.8, "seed": 11}))' "$list_grammar")" --max-time 600)
got=$(check regex "$tmp/body" "$list_regex") && [ "$status" = 200 ] && pass "structured_outputs_grammar_n2 $got" ||
    fail structured_outputs_grammar_n2 "status $status: $got"
status=$(request POST /v1/completions "$(python3 -c 'import json,sys; print(json.dumps({"prompt": "Three numbers in a list:",
    "grammar": sys.argv[1], "max_tokens": 40, "temperature": 0}))' "$list_grammar")" --max-time 600)
got=$(check regex "$tmp/body" "$list_regex") && [ "$status" = 200 ] && pass "completions_grammar_greedy $got" ||
    fail completions_grammar_greedy "status $status: $got"
# A lazy grammar (llama.cpp's grammar_lazy): free until the word "France", then the
# grammar, which makes the capital Rome or Berlin. Greedy, so the text before the trigger
# is the unconstrained answer's.
capital() {
    python3 -c 'import json,sys; b = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0}
if sys.argv[1] == "lazy": b.update(grammar="root ::= \"France is \" (\"Rome\" | \"Berlin\") \".\"", grammar_lazy=True,
    grammar_triggers=[{"type": 1, "value": "France"}])
print(json.dumps(b))' "$1"
}
request POST /v1/chat/completions "$(capital free)" --max-time 600 > /dev/null
free=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$tmp/body")
status=$(request POST /v1/chat/completions "$(capital lazy)" --max-time 600)
lazy=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$tmp/body")
if [ "$status" = 200 ] && [[ "$free" == *France* ]] && [[ "$free" != *Rome* && "$free" != *Berlin* ]] &&
    { [ "$lazy" = "${free%%France*}France is Rome." ] || [ "$lazy" = "${free%%France*}France is Berlin." ]; }; then
    pass "grammar_lazy_after_trigger '$lazy' (free: '$free')"
else fail grammar_lazy_after_trigger "status $status: '$lazy' (free: '$free')"; fi
choices='["Paris", "Lyon", "Marseille, France"]'
status=$(request POST /v1/completions "{\"prompt\": \"The capital of France is the city of\", \"max_tokens\": 8, \"guided_choice\": $choices}" --max-time 600)
got=$(check choice "$tmp/body" "$choices") && [ "$status" = 200 ] && pass "completions_guided_choice $got" || fail completions_guided_choice "status $status: $got"

# get_weather's parameters as pydantic writes a bounded field and a documented enum field
# (a $ref beside description / default): the answers stay within days 2..5.
tools='[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.", "parameters": {"$defs": {"Unit": {"enum": ["celsius", "fahrenheit"], "title": "Unit", "type": "string"}}, "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"$ref": "#/$defs/Unit", "description": "the unit", "default": "celsius"}, "days": {"type": "integer", "minimum": 2, "maximum": 5, "description": "days of forecast"}}, "required": ["city", "unit", "days"]}}},
 {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone.", "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}}, "required": ["timezone"]}}}]'
calls() { # TOOL_CHOICE PARALLEL STREAM
    python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}],
        "tools": json.loads(sys.argv[1]), "tool_choice": json.loads(sys.argv[2]), "parallel_tool_calls": sys.argv[3] == "true",
        "stream": sys.argv[4] == "stream", "max_tokens": 120, "temperature": 0}))' "$tools" "$@"
}
status=$(request POST /v1/chat/completions "$(calls '"required"' true plain)" --max-time 600)
got=$(check calls "$tmp/body" "$tools") && [ "$status" = 200 ] && pass "tool_choice_required $got" || fail tool_choice_required "status $status: $got"
named='{"type": "function", "function": {"name": "get_time"}}'
status=$(request POST /v1/chat/completions "$(calls "$named" true plain)" --max-time 600)
named_plain=$(check calls "$tmp/body" "$tools" get_time one) && [ "$status" = 200 ] && pass "tool_choice_named $named_plain" ||
    fail tool_choice_named "status $status: $named_plain"
request POST /v1/chat/completions "$(calls "$named" true stream)" --max-time 600 > /dev/null
streamed=$(check stream_calls "$tmp/body")
[ -n "$named_plain" ] && [ "$streamed" = "$named_plain" ] && pass tool_choice_named_streamed ||
    fail tool_choice_named_streamed "$streamed vs $named_plain"
status=$(request POST /v1/chat/completions "$(calls '"required"' false plain)" --max-time 600)
got=$(check calls "$tmp/body" "$tools" "" one) && [ "$status" = 200 ] && pass "parallel_tool_calls_false_one_call $got" ||
    fail parallel_tool_calls_false_one_call "status $status: $got"
stop_server
[ "$failures" = 0 ]
