#!/usr/bin/env bash
# marlhf serve with OpenAI tool calling. On the tiny chat model (its context widened to
# 2,048 positions for the tools' system prompt; RoPE, so no weight depends on it) given the
# published Qwen2.5, Qwen3 and Llama 3.1 templates (recognised exactly): requests with
# tools, assistant tool calls (arguments sent as compact JSON strings, content null) and
# tool turns are rendered as transformers renders the fixture's tool conversations
# (tests/fixtures/chat_templates/cases.json): the prompt's token count is that of the
# fixture's text tokenized by `marlhf tokenize`, and the first answer token's top-5
# log-probs are those /v1/completions gives for those very token ids; tool_choice "none"
# renders the same prompt. Refusals: tools on a template without tool calling (the model's
# own ChatML) or recognised only by its markers, tool turns there, and every malformed
# tools / tool_choice / tool_calls field (400 naming it). Then SmolLM2 (when fetched; plain build only), asked
# to repeat a <tool_call> block: the call comes back as message.tool_calls (content null,
# finish_reason "tool_calls"), the same as the raw text (tool_choice "none") parsed here
# independently; streamed, as one delta.tool_calls chunk; under "auto" (the lazy tool-call
# constraint) a block it is asked to repeat with broken JSON or arguments off the schema
# comes back as a call that matches the schema (the unconstrained text has the fault), and
# an answer without a call stays plain text; a schema the constraint cannot honour does not
# refuse an "auto" request (its arguments go unchecked, the log says so). Prints PASS/FAIL
# per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve_tools
rm -rf "$tmp" && mkdir -p "$tmp"
tiny=tests/fixtures/models/tiny_chat
real_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh

# The model, the template files, and per (template, tool conversation) the request body and
# the fixture's expected prompt text (as `marlhf tokenize` input).
python3 - "$tiny" "$tmp" <<'PY'
import json, os, shutil, sys
tiny, tmp = sys.argv[1], sys.argv[2]
model = os.path.join(tmp, "model")
os.makedirs(model)
for name in os.listdir(tiny):
    shutil.copy(os.path.join(tiny, name), model)
config = json.load(open(os.path.join(tiny, "config.json")))
config["max_position_embeddings"] = 2048
json.dump(config, open(os.path.join(model, "config.json"), "w"), indent=2)
fixture = json.load(open("tests/fixtures/chat_templates/cases.json", encoding="utf-8"))
sources = {t["id"]: t["source"] for t in fixture["templates"]}
cases = []
for template in ("qwen2.5", "qwen3", "llama3.1"):
    open(os.path.join(tmp, template + ".jinja"), "w", encoding="utf-8").write(sources[template])
    for case in fixture["cases"]:
        if case["template"] != template or "tool_conversation" not in case or not case["add_generation_prompt"] \
                or "expected" not in case:
            continue
        k = case["tool_conversation"]
        conversation = fixture["tool_conversations"][k]
        messages = []
        for m in conversation["messages"]:
            m = dict(m)
            if "tool_calls" in m:
                # As a client sends them: arguments a JSON string (compact here; the template
                # gets the parsed value), content null when empty.
                m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(
                    c["function"]["arguments"], separators=(",", ":"), ensure_ascii=False)))
                    for c in m["tool_calls"]]
                if m["content"] == "":
                    m["content"] = None
            messages.append(m)
        body = {"messages": messages, "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 5}
        if conversation["tools"] is not None:
            body["tools"] = conversation["tools"]
        name = f"{template}_{k}"
        json.dump(body, open(os.path.join(tmp, name + ".json"), "w", encoding="utf-8"), ensure_ascii=False)
        with open(os.path.join(tmp, name + ".text.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": case["expected"]}, ensure_ascii=False) + "\n")
        cases.append(name)
open(os.path.join(tmp, "cases.txt"), "w").write("\n".join(cases) + "\n")
PY
model="$tmp/model"

# The JSON checks: `check.py KIND ...` prints a result or exits non-zero with a reason.
cat > "$tmp/check.py" <<'PY'
import json, re, sys

def fail(why):
    print(why)
    sys.exit(1)

kind = sys.argv[1]
if kind == "chat":  # FILE: prints prompt_tokens and the first token's top log-probs
    o = json.load(open(sys.argv[2], encoding="utf-8"))
    c = o["choices"][0]
    top = c["logprobs"]["content"][0]["top_logprobs"]
    print(json.dumps([o["usage"]["prompt_tokens"], [[t["token"], t["logprob"]] for t in top]]))
elif kind == "ids":  # tokenize output -> a /v1/completions body on those ids
    ids = json.loads(open(sys.argv[2]).readline())["ids"]
    print(json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 5}))
elif kind == "same":  # CHAT_RESULT FILE (a completion on the ids): same count, same top-5
    count, top = json.loads(sys.argv[2])
    o = json.load(open(sys.argv[3], encoding="utf-8"))
    if o["usage"]["prompt_tokens"] != count: fail(f"completion prompt_tokens {o['usage']['prompt_tokens']} vs {count}")
    alternatives = o["choices"][0]["logprobs"]["top_logprobs"][0]
    # The legacy object keys tokens by text: of tokens with equal texts, the likelier one.
    first = {}
    for t, lp in top:
        first.setdefault(t, lp)
    if len(top) != 5 or set(first) != set(alternatives) or any(abs(alternatives[t] - lp) > 1e-5 for t, lp in first.items()):
        fail(f"top log-probs differ: chat {top} vs completion {alternatives}")
elif kind == "error":  # FILE PARAM SUBSTRING: an OpenAI error naming PARAM whose message has SUBSTRING
    o = json.load(open(sys.argv[2], encoding="utf-8"))
    e = o.get("error") or fail(f"not an error: {o}")
    if e.get("param") != (sys.argv[3] or None): fail(f"param {e.get('param')!r}, wanted {sys.argv[3]!r}: {e}")
    if sys.argv[4] not in e["message"]: fail(f"message {e['message']!r} lacks {sys.argv[4]!r}")
    if "\n" in e["message"]: fail("a multi-line message")
elif kind == "calls":  # FILE: prints [content, [[name, arguments]...], finish_reason, ids ok]
    o = json.load(open(sys.argv[2], encoding="utf-8"))
    c = o["choices"][0]
    m = c["message"]
    calls = m.get("tool_calls", [])
    for call in calls:
        if not (call["type"] == "function" and re.fullmatch(r"call_[0-9a-f]+", call["id"])
                and isinstance(call["function"]["arguments"], str)):
            fail(f"call shape {call}")
    print(json.dumps([m["content"], [[x["function"]["name"], x["function"]["arguments"]] for x in calls],
                      c["finish_reason"]]))
elif kind == "parse":  # FILE (tool_choice none): the raw text parsed here as vLLM's hermes parser does
    text = json.load(open(sys.argv[2], encoding="utf-8"))["choices"][0]["message"]["content"]
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)
    calls = []
    for b in blocks:
        v = json.loads(b.strip())
        calls.append([v["name"], json.dumps(v["arguments"], ensure_ascii=False)])
    rest = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.S).rstrip()
    print(json.dumps([rest or None, calls, "tool_calls" if calls else "stop"]))
elif kind == "stream":  # FILE: the SSE stream as [content, calls, finish_reason]
    raw = open(sys.argv[2], encoding="utf-8").read()
    events = [e[len("data: "):] for e in raw.strip().split("\n\n")]
    if events[-1] != "[DONE]": fail("no [DONE]")
    content, calls, finish = "", [], None
    for e in events[:-1]:
        c = json.loads(e)["choices"][0]
        d = c["delta"]
        content += d.get("content") or ""
        for t in d.get("tool_calls", []):
            if t["index"] != len(calls) or not re.fullmatch(r"call_[0-9a-f]+", t["id"]) or t["type"] != "function":
                fail(f"tool call delta {t}")
            calls.append([t["function"]["name"], t["function"]["arguments"]])
        finish = c["finish_reason"] or finish
    print(json.dumps([content or None, calls, finish]))
PY
check() { python3 "$tmp/check.py" "$@"; }

# expect_api_error NAME PARAM SUBSTRING BODY [PATH]: a 400 naming PARAM, its message containing SUBSTRING.
expect_api_error() {
    local name=$1 param=$2 substring=$3 body=$4 path=${5:-/v1/chat/completions} status why
    status=$(request POST "$path" "$body")
    if [ "$status" = 400 ] && why=$(check error "$tmp/body" "$param" "$substring"); then
        pass "$name"
    else
        fail "$name" "status $status ${why:-}: $(head -c 300 "$tmp/body")"
    fi
}

# Rendering: each published template, each of the fixture's tool conversations.
for template in qwen2.5 qwen3 llama3.1; do
    if ! start_server "$tmp/server_$template.log" --model "$model" --chat-template "$tmp/$template.jinja" --threads 1; then
        fail "server_starts_$template" "$(tail -n 3 "$tmp/server_$template.log")"
        continue
    fi
    checked=0 bad=0 first_bad=
    for name in $(grep "^${template}_" "$tmp/cases.txt"); do
        status=$(request POST /v1/chat/completions "@$tmp/$name.json")
        result=$(check chat "$tmp/body") || { bad=$((bad + 1)); first_bad=${first_bad:-"$name: status $status $(head -c 200 "$tmp/body")"}; continue; }
        "$bin" tokenize --model "$model" --input "$tmp/$name.text.jsonl" --output "$tmp/$name.ids.jsonl" 2> /dev/null
        want=$(python3 -c 'import json,sys; print(len(json.loads(open(sys.argv[1]).readline())["ids"]))' "$tmp/$name.ids.jsonl")
        got=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$result")
        request POST /v1/completions "$(check ids "$tmp/$name.ids.jsonl")" > /dev/null
        if [ "$status" != 200 ] || [ "$got" != "$want" ] || ! why=$(check same "$result" "$tmp/body"); then
            bad=$((bad + 1))
            first_bad=${first_bad:-"$name: status $status, prompt_tokens $got, fixture $want ${why:-}"}
        fi
        checked=$((checked + 1))
    done
    if [ "$bad" = 0 ] && [ "$checked" -ge 7 ]; then pass "tools_rendered_as_transformers_$template ($checked conversations)"
    else fail "tools_rendered_as_transformers_$template" "$bad of $checked differ; first: $first_bad"; fi
    # tool_choice "none": the tools are still in the prompt (vLLM's default), the count unchanged.
    python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); b["tool_choice"]="none"; print(json.dumps(b))' \
        "$tmp/${template}_0.json" > "$tmp/none.json"
    request POST /v1/chat/completions "@$tmp/${template}_0.json" > /dev/null
    auto=$(check chat "$tmp/body")
    request POST /v1/chat/completions "@$tmp/none.json" > /dev/null
    none=$(check chat "$tmp/body")
    [ -n "$auto" ] && [ "$auto" = "$none" ] && pass "tool_choice_none_renders_the_tools_$template" ||
        fail "tool_choice_none_renders_the_tools_$template" "$auto vs $none"
    stop_server
done

# Malformed requests: 400 naming the field (on a tool-calling template).
start_server "$tmp/server_errors.log" --model "$model" --chat-template qwen2.5 --threads 1 || fail server_starts "$(tail -n 3 "$tmp/server_errors.log")"
msg='"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
weather='{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}'
expect_api_error tools_not_list tools "'tools' must be a list" "{$msg, \"tools\": {\"type\": \"function\"}}"
expect_api_error tool_not_object tools "tools[0] must be an object" "{$msg, \"tools\": [\"get_weather\"]}"
expect_api_error tool_type tools 'tools[1].type must be "function"' "{$msg, \"tools\": [$weather, {\"type\": \"retrieval\", \"function\": {\"name\": \"x\"}}]}"
expect_api_error tool_function_missing tools "tools[0].function must be an object" "{$msg, \"tools\": [{\"type\": \"function\"}]}"
expect_api_error tool_name_missing tools "tools[0].function.name must be a non-empty string" "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"parameters\": {}}}]}"
expect_api_error tool_name_empty tools "tools[0].function.name must be a non-empty string" "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"\"}}]}"
expect_api_error tool_parameters_not_object tools "tools[0].function.parameters must be an object" "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": \"{}\"}}]}"
expect_api_error tool_description_not_string tools "tools[0].function.description must be a string" "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": 5}}]}"
expect_api_error tool_choice_required_without_tools tool_choice '"required" needs a non-empty' "{$msg, \"tools\": [], \"tool_choice\": \"required\"}"
expect_api_error tool_choice_named_not_in_tools tool_choice "names the function 'get_time', which is not in 'tools'" "{$msg, \"tools\": [$weather], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}}"
expect_api_error tool_choice_named_malformed tool_choice "a named 'tool_choice' must be" "{$msg, \"tools\": [$weather], \"tool_choice\": {\"type\": \"function\", \"function\": {}}}"
expect_api_error tool_choice_unsupported_parameters tools "tools[0].function.parameters: 'format' 'email' is not supported (only date, time, date-time and uuid) (at properties.city)" "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"format\": \"email\"}}}}}], \"tool_choice\": \"required\"}"
# ... but "auto" still answers it (that tool's arguments unchecked, said in the log).
status=$(request POST /v1/chat/completions "{$msg, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"format\": \"email\"}}}}}]}")
if [ "$status" = 200 ] && grep -q "tool_choice auto: tools\[0\].function.parameters: 'format' 'email' is not supported" "$tmp/server_errors.log"
then pass tool_choice_auto_unsupported_parameters; else fail tool_choice_auto_unsupported_parameters "status $status"; fi
expect_api_error tool_choice_unknown tool_choice "'tool_choice' must be" "{$msg, \"tools\": [$weather], \"tool_choice\": \"sometimes\"}"
expect_api_error parallel_tool_calls_not_bool parallel_tool_calls "'parallel_tool_calls' must be a boolean" "{$msg, \"tools\": [$weather], \"parallel_tool_calls\": \"yes\"}"
expect_api_error functions_legacy functions "use 'tools'" "{$msg, \"functions\": [{\"name\": \"f\"}]}"
expect_api_error completions_tools tools "'tools' is a chat parameter" "{\"prompt\": \"hi\", \"tools\": [$weather]}" /v1/completions
call='{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}'
expect_api_error call_arguments_not_json messages "messages[1].tool_calls[0].function.arguments must be a string holding JSON" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [${call/ARGS/\"\{city: Paris\"}]}]}"
expect_api_error call_name_missing messages "messages[1].tool_calls[0].function.name must be a non-empty string" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"arguments\": \"{}\"}}]}]}"
expect_api_error call_on_user messages "messages[0] has tool_calls but role 'user'" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"tool_calls\": [${call/ARGS/\"\{\}\"}]}]}"
expect_api_error tool_call_id_not_string messages "messages[1].tool_call_id must be a string" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"tool_call_id\": 5, \"content\": \"22\"}]}"
expect_api_error tool_content_missing messages "messages[1].content is required" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"tool_call_id\": \"c1\"}]}"
stop_server

# chat_template_kwargs (vLLM's): Qwen3's enable_thinking false renders what a server started
# with --no-thinking renders (the same prompt tokens and first-token log-probs), a longer
# prompt than with thinking on; on the --no-thinking server, true turns it back on for the
# request. Then the refusals: a variable no template of marlhf's reads, a wrong type, one this
# template does not read, and the parameter on /v1/completions.
ask='"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 1, "temperature": 0, "logprobs": true, "top_logprobs": 5'
kwargs_result() { request POST /v1/chat/completions "{$ask${1:+, \"chat_template_kwargs\": $1}}" > /dev/null; check chat "$tmp/body"; }
if start_server "$tmp/server_qwen3_kwargs.log" --model "$model" --chat-template qwen3 --threads 1; then
    thinking=$(kwargs_result) off=$(kwargs_result '{"enable_thinking": false}')
    expect_api_error template_kwargs_unknown chat_template_kwargs "chat_template_kwargs.add_vision_id is not a variable" \
        "{$ask, \"chat_template_kwargs\": {\"add_vision_id\": true}}"
    expect_api_error template_kwargs_type chat_template_kwargs "enable_thinking must be true or false" \
        "{$ask, \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}"
    expect_api_error template_kwargs_not_read chat_template_kwargs "chat template qwen3 does not read it" \
        "{$ask, \"chat_template_kwargs\": {\"date_string\": \"03 Dec 2026\"}}"
    expect_api_error template_kwargs_completions chat_template_kwargs "is a chat parameter" \
        '{"prompt": "hi", "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": false}}' /v1/completions
    stop_server
else
    fail server_starts_qwen3_kwargs "$(tail -n 3 "$tmp/server_qwen3_kwargs.log")"
fi
if start_server "$tmp/server_qwen3_off.log" --model "$model" --chat-template qwen3 --no-thinking --threads 1; then
    server_off=$(kwargs_result) back_on=$(kwargs_result '{"enable_thinking": true}')
    stop_server
else
    fail server_starts_qwen3_off "$(tail -n 3 "$tmp/server_qwen3_off.log")"
fi
python3 - "$thinking" "$off" "${server_off:-}" "${back_on:-}" <<'PY' && pass "template_kwargs_enable_thinking ($thinking / $off)" ||
import json, sys
thinking, off, server_off, back_on = (json.loads(x) if x else None for x in sys.argv[1:5])
assert off == server_off and back_on == thinking and off[0] > thinking[0], sys.argv[1:5]
PY
    fail template_kwargs_enable_thinking "on $thinking, off $off, --no-thinking $server_off, back on $back_on"


# Llama 3.1's own refusal (one call per assistant turn) and a tools prompt over the context.
start_server "$tmp/server_llama.log" --model "$model" --chat-template llama3.1 --threads 1 || fail server_starts "$(tail -n 3 "$tmp/server_llama.log")"
expect_api_error llama31_one_call_per_turn messages "This model only supports single tool-calls at once!" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [${call/ARGS/\"\{\}\"}, ${call/ARGS/\"\{\}\"}]}]}"
stop_server

# Templates without tool calling: the tiny model's own ChatML, and Qwen2.5's edited
# (recognised by its markers only).
start_server "$tmp/server_chatml.log" --model "$model" --threads 1 || fail server_starts "$(tail -n 3 "$tmp/server_chatml.log")"
expect_api_error chatml_refuses_tools tools "does not render tools" "{$msg, \"tools\": [$weather]}"
expect_api_error chatml_refuses_tool_turns messages "message 1 has role 'tool'" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"22\"}]}"
expect_api_error chatml_refuses_tool_calls messages "does not render tool calls" \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [${call/ARGS/\"\{\}\"}]}]}"
status=$(request POST /v1/chat/completions "{$msg, \"tools\": [], \"tool_choice\": \"none\"}")
[ "$status" = 200 ] && pass chatml_empty_tools_accepted || fail chatml_empty_tools_accepted "status $status $(head -c 200 "$tmp/body")"
stop_server
{ cat "$tmp/qwen2.5.jinja"; printf '{#- edited -#}'; } > "$tmp/edited.jinja"
start_server "$tmp/server_edited.log" --model "$model" --chat-template "$tmp/edited.jinja" --threads 1 || fail server_starts "$(tail -n 3 "$tmp/server_edited.log")"
expect_api_error markers_only_refuse_tools tools "was recognised by its markers, not as the published template" "{$msg, \"tools\": [$weather]}"
stop_server

# SmolLM2 (when fetched; plain build only) asked to repeat a tool call: the call is parsed out of its answer.
if ! real_model_runs "$real_model" "smollm2 tool calls"; then
    :
else
    start_server "$tmp/server_smollm2.log" --model "$real_model" --chat-template qwen2.5 --threads 2 ||
        fail server_starts_smollm2 "$(tail -n 3 "$tmp/server_smollm2.log")"
    repeat() {
        python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": "Repeat exactly this text and nothing else:\n" + sys.argv[1]}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a given city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "max_tokens": 48, "temperature": 0, "tool_choice": sys.argv[2], "stream": sys.argv[3] == "stream"}))' "$@"
    }
    # SmolLM2's prompts are ~350 tokens: on a loaded machine an answer may take longer than
    # request's default wait, so these wait as long as a request may run.
    good=$'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    request POST /v1/chat/completions "$(repeat "$good" none plain)" --max-time 600 > /dev/null
    cp "$tmp/body" "$tmp/raw.json"
    parsed=$(check parse "$tmp/raw.json")
    status=$(request POST /v1/chat/completions "$(repeat "$good" auto plain)" --max-time 600)
    got=$(check calls "$tmp/body")
    want='[null, [["get_weather", "{\"city\": \"Paris\"}"]], "tool_calls"]'
    if [ "$status" = 200 ] && [ "$got" = "$want" ] && [ "$parsed" = "$want" ]; then pass smollm2_tool_call_parsed
    else fail smollm2_tool_call_parsed "status $status: $got; raw text parsed here: $parsed"; fi
    request POST /v1/chat/completions "$(repeat "$good" auto stream)" --max-time 600 > /dev/null
    streamed=$(check stream "$tmp/body")
    [ "$streamed" = "$want" ] && pass smollm2_tool_call_streamed || fail smollm2_tool_call_streamed "$streamed"
    # Under "auto" a call is decoded under the lazy constraint (free text until
    # "<tool_call>", then the call syntax and the tool's schema): asked to repeat a block
    # whose JSON is broken (an unquoted string) or whose arguments miss the schema (a key
    # it does not have), the unconstrained answer (tool_choice "none") has it as the model
    # wrote it, while "auto" returns a get_weather call whose arguments match the schema.
    bad=$'<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    request POST /v1/chat/completions "$(repeat "$bad" none plain)" --max-time 600 > /dev/null
    raw=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]))' "$tmp/body")
    request POST /v1/chat/completions "$(repeat "$bad" auto plain)" --max-time 600 > /dev/null
    got=$(check calls "$tmp/body")
    if [ "$got" = "$want" ] && grep -q '"city\\": Paris' <<< "$raw"; then pass smollm2_broken_call_constrained
    else fail smollm2_broken_call_constrained "$got; unconstrained $raw"; fi
    request POST /v1/chat/completions "$(repeat "$bad" auto stream)" --max-time 600 > /dev/null
    streamed=$(check stream "$tmp/body")
    [ "$streamed" = "$want" ] && pass smollm2_broken_call_constrained_streamed ||
        fail smollm2_broken_call_constrained_streamed "$streamed"
    off_schema=$'<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'
    request POST /v1/chat/completions "$(repeat "$off_schema" none plain)" --max-time 600 > /dev/null
    parsed=$(check parse "$tmp/body")
    request POST /v1/chat/completions "$(repeat "$off_schema" auto plain)" --max-time 600 > /dev/null
    got=$(check calls "$tmp/body")
    if [ "$got" = "$want" ] && [ "$parsed" = '[null, [["get_weather", "{\"town\": \"Paris\"}"]], "tool_calls"]' ]; then
        pass smollm2_off_schema_call_constrained
    else fail smollm2_off_schema_call_constrained "$got; unconstrained, parsed here: $parsed"; fi
    # Before a trigger the text is free: an answer without a call is plain content.
    request POST /v1/chat/completions "$(repeat "Hello there." auto plain)" --max-time 600 > /dev/null
    got=$(check calls "$tmp/body")
    [ "$got" = '["Hello there.", [], "stop"]' ] && pass smollm2_auto_free_text || fail smollm2_auto_free_text "$got"
    stop_server
fi

echo "serve_tools: $failures failed"
[ "$failures" -eq 0 ]
