#!/usr/bin/env bash
# POST /v1/embeddings of `marlhf serve` on the tiny chat model: the response's schema, each
# form of 'input' (a string, strings, token ids, lists of token ids) giving transformers'
# vectors (tests/fixtures/embeddings/tiny_chat.json, tools/make_embedding_fixtures.py) and
# usage counts, base64 decoding to the float list, a batch equal to its texts alone,
# concurrent embedding and chat requests answered as they are alone, --pooling last and
# cls, the /metrics counters, every bad request with its error JSON, and bad --pooling at
# startup. Concurrent embedding requests sharing forwards, each answered its vectors alone.
# llama.cpp's POST /embeddings: the same vector as a list of one; with --pooling none every
# token's state (transformers' per-token hidden_states[-1], unnormalised), and /v1/embeddings
# refused. (test_pooling checks the numbers closer, test_smollm2 on SmolLM2, serve.sh
# embeddings beside a long generation on SmolLM2.) Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve_embeddings
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
fixture=tests/fixtures/embeddings/tiny_chat.json
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh

# `emb.py KIND ...`, one place for the JSON: exits non-zero with a reason.
#   vectors FILE N: checks a response of N embeddings; prints {"vectors", "prompt_tokens"}
#                   (base64 decoded to its float32 values)
#   fixture POOLING: the fixture's vectors and token count for all its texts, the same shape
#   close GOT WANT TOLERANCE: every component within TOLERANCE, the same token counts;
#                   prints the largest difference
#   body FORM: a request body of the fixture's texts as FORM (string, strings, ids, id_lists)
#   error FILE PARAM: an OpenAI error object naming PARAM ("" for none)
cat > "$tmp/emb.py" << 'PY'
import base64, json, struct, sys
FIXTURE = json.load(open("tests/fixtures/embeddings/tiny_chat.json", encoding="utf-8"))
HIDDEN = FIXTURE["hidden_size"]

def fail(why):
    print(why)
    sys.exit(1)

def vectors(path, n):
    o = json.load(open(path, encoding="utf-8"))
    if set(o) != {"object", "data", "model", "usage"} or o["object"] != "list": fail(f"keys {sorted(o)}, object {o.get('object')!r}")
    if o["model"] != "tiny_chat": fail(f"model {o['model']!r}")
    u = o["usage"]
    if set(u) != {"prompt_tokens", "total_tokens"} or u["prompt_tokens"] != u["total_tokens"] or u["prompt_tokens"] < n:
        fail(f"usage {u}")
    if len(o["data"]) != n: fail(f"{len(o['data'])} embeddings, wanted {n}")
    out = []
    for i, d in enumerate(o["data"]):
        if set(d) != {"object", "index", "embedding"} or d["object"] != "embedding" or d["index"] != i:
            fail(f"data[{i}]: {str(d)[:200]}")
        e = d["embedding"]
        if isinstance(e, str):
            raw = base64.b64decode(e, validate=True)
            if len(raw) != 4 * HIDDEN: fail(f"data[{i}]: {len(raw)} bytes of base64")
            e = list(struct.unpack(f"<{HIDDEN}f", raw))
        elif isinstance(e, list) and len(e) == HIDDEN and all(isinstance(x, float) for x in e):
            e = list(struct.unpack(f"<{HIDDEN}f", struct.pack(f"<{HIDDEN}f", *e))) # as float32: what the digits stand for
        else:
            fail(f"data[{i}]: embedding {str(e)[:200]}")
        if abs(sum(x * x for x in e) - 1) > 1e-5: fail(f"data[{i}]: length {sum(x * x for x in e) ** 0.5}, not 1")
        out.append(e)
    print(json.dumps({"vectors": out, "prompt_tokens": u["prompt_tokens"]}))

def fixture(pooling):
    print(json.dumps({"vectors": [t[pooling] for t in FIXTURE["inputs"]],
                      "prompt_tokens": sum(len(t["ids"]) for t in FIXTURE["inputs"])}))

def close(got, want, tolerance):
    got, want = json.loads(got), json.loads(want)
    if got["prompt_tokens"] != want["prompt_tokens"]: fail(f"{got['prompt_tokens']} tokens, wanted {want['prompt_tokens']}")
    if len(got["vectors"]) != len(want["vectors"]): fail("not as many vectors")
    worst = max((abs(a - b) for g, w in zip(got["vectors"], want["vectors"]) for a, b in zip(g, w)), default=0.0)
    print(f"{worst:.2g}")
    if not worst <= float(tolerance): sys.exit(1)

def body(form, extra):
    texts = [t["text"] for t in FIXTURE["inputs"]]
    ids = [t["ids"] for t in FIXTURE["inputs"]]
    inputs = {"string": texts[0], "strings": texts, "ids": ids[0], "id_lists": ids}[form]
    print(json.dumps({"input": inputs, **json.loads(extra)}))

def error(path, param):
    o = json.load(open(path, encoding="utf-8"))
    e = o.get("error")
    if not isinstance(e, dict) or set(e) != {"message", "type", "param", "code"} or not e["message"]: fail(f"not an error: {o}")
    if e["param"] != (param or None): fail(f"param {e['param']!r}, wanted {param!r}: {e['message']}")

def tokens(path, per_token):
    """llama.cpp's /embeddings answer: [{"index", "embedding": [[floats], ...]}, ...]; prints
    {"vectors": [[token vectors] per input]} (as float32), one vector per input unless per_token."""
    o = json.load(open(path, encoding="utf-8"))
    if not isinstance(o, list) or not o: fail(f"not a list: {str(o)[:200]}")
    out = []
    for i, d in enumerate(o):
        if not isinstance(d, dict) or set(d) != {"index", "embedding"} or d["index"] != i: fail(f"[{i}]: {str(d)[:200]}")
        e = d["embedding"]
        if not isinstance(e, list) or not e or (not per_token and len(e) != 1): fail(f"[{i}]: {len(e)} vectors")
        for v in e:
            if not isinstance(v, list) or len(v) != HIDDEN or not all(isinstance(x, float) for x in v): fail(f"[{i}]: {str(v)[:100]}")
        out.append([list(struct.unpack(f"<{HIDDEN}f", struct.pack(f"<{HIDDEN}f", *v))) for v in e])
    print(json.dumps({"vectors": out}))

def tokens_close(got, want, tolerance):
    """Every component within tolerance times max(1, the largest |component| of WANT) (files)."""
    got, want = json.load(open(got))["vectors"], json.load(open(want))["vectors"]
    if [len(g) for g in got] != [len(w) for w in want]: fail(f"shapes {[len(g) for g in got]} and {[len(w) for w in want]}")
    scale = max(1.0, max(abs(x) for w in want for v in w for x in v))
    worst = max(abs(a - b) for g, w in zip(got, want) for u, v in zip(g, w) for a, b in zip(u, v))
    same = sum(u == v for g, w in zip(got, want) for u, v in zip(g, w))
    print(f"{worst:.2g} ({same} of {sum(len(w) for w in want)} vectors bit for bit)")
    if not worst <= float(tolerance) * scale: sys.exit(1)

kind = sys.argv[1]
if kind == "vectors": vectors(sys.argv[2], int(sys.argv[3]))
elif kind == "fixture": fixture(sys.argv[2])
elif kind == "close": close(sys.argv[2], sys.argv[3], sys.argv[4])
elif kind == "body": body(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "{}")
elif kind == "error": error(sys.argv[2], sys.argv[3])
elif kind == "tokens": tokens(sys.argv[2], sys.argv[3] == "per_token")
elif kind == "tokens_fixture": print(json.dumps({"vectors": [t["none"] for t in FIXTURE["inputs"]]}))
elif kind == "tokens_close": tokens_close(sys.argv[2], sys.argv[3], sys.argv[4])
PY
emb() { python3 "$tmp/emb.py" "$@"; }
count=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["inputs"]))' "$fixture")

# expect_embeddings NAME BODY N WANT TOLERANCE: a 200 with N vectors within TOLERANCE of WANT
# (the output of `emb fixture` or `emb vectors`); the vectors in $tmp/got.
expect_embeddings() {
    local name=$1 body=$2 n=$3 want=$4 tolerance=$5 status got why
    status=$(request POST /v1/embeddings "$body")
    if [ "$status" != 200 ]; then
        fail "$name" "status $status: $(head -c 300 "$tmp/body")"
    elif ! got=$(emb vectors "$tmp/body" "$n"); then
        fail "$name" "$(echo "$got" | head -c 300)"
    elif why=$(emb close "$got" "$want" "$tolerance"); then
        echo "$got" > "$tmp/got"
        pass "$name (largest difference $why)"
    else
        fail "$name" "$why"
    fi
}

# expect_refused NAME STATUS PARAM BODY [TEXT]: that status and an error naming PARAM (and
# whose message holds TEXT).
expect_refused() {
    local name=$1 want=$2 param=$3 body=$4 text=${5:-} status why
    status=$(request POST /v1/embeddings "$body")
    if [ "$status" != "$want" ]; then
        fail "$name" "status $status, wanted $want: $(head -c 300 "$tmp/body")"
    elif ! why=$(emb error "$tmp/body" "$param"); then
        fail "$name" "$why"
    elif [ -n "$text" ] && ! grep -qF -- "$text" "$tmp/body"; then
        fail "$name" "no '$text' in $(head -c 300 "$tmp/body")"
    else
        pass "$name"
    fi
}

if ! start_server "$tmp/server.log" --model "$model" --threads 1 --max-concurrent 8; then
    fail server_starts "$(tail -n 5 "$tmp/server.log")"
    exit 1
fi
mean=$(emb fixture mean)
first=$(python3 -c 'import json, sys; o = json.loads(sys.argv[1]); t = json.load(open(sys.argv[2]))["inputs"][0]; print(json.dumps({"vectors": o["vectors"][:1], "prompt_tokens": len(t["ids"])}))' "$mean" "$fixture")

# Each form of 'input' gives transformers' mean-pooled vectors (float32 against a float64
# reference: 1e-5, test_pooling's tolerance) and counts the tokens transformers counts
# (texts: tokenized as transformers does, with the tokenizer's BOS).
expect_embeddings embeddings_string "$(emb body string)" 1 "$first" 1e-5
expect_embeddings embeddings_strings "$(emb body strings)" "$count" "$mean" 1e-5
# The vectors of all the texts in one request: what the checks below compare with.
request POST /v1/embeddings "$(emb body strings)" > /dev/null
emb vectors "$tmp/body" "$count" > "$tmp/batched.json" || echo '{"vectors": [], "prompt_tokens": 0}' > "$tmp/batched.json"
expect_embeddings embeddings_token_ids "$(emb body ids)" 1 "$first" 1e-5
expect_embeddings embeddings_token_id_lists "$(emb body id_lists '{"model": "tiny_chat", "encoding_format": "float", "dimensions": 64, "user": "u1"}')" \
    "$count" "$mean" 1e-5

# base64: the little-endian float32 bytes of exactly the floats of the float list.
expect_embeddings embeddings_base64_equals_floats "$(emb body strings '{"encoding_format": "base64"}')" "$count" \
    "$(cat "$tmp/batched.json")" 0

# A batch of texts of different lengths (one forward, right-padded) gives each text's
# vector alone.
python3 -c 'import json, sys; [print(json.dumps({"input": t["text"]})) for t in json.load(open(sys.argv[1]))["inputs"]]' "$fixture" > "$tmp/alone_bodies"
: > "$tmp/alone.jsonl"
while read -r body; do
    request POST /v1/embeddings "$body" > /dev/null
    emb vectors "$tmp/body" 1 > "$tmp/one.json" && cat "$tmp/one.json" >> "$tmp/alone.jsonl"
done < "$tmp/alone_bodies"
alone=$(python3 -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; print(json.dumps({"vectors": [r["vectors"][0] for r in rows], "prompt_tokens": sum(r["prompt_tokens"] for r in rows)}))' "$tmp/alone.jsonl")
why=$(emb close "$(cat "$tmp/batched.json")" "$alone" 1e-6) && pass "embeddings_batch_equals_alone (largest difference $why)" ||
    fail embeddings_batch_equals_alone "$(echo "$why" | head -c 300)"

# Embedding and chat requests at once from eight clients: every answer is the one it gets alone.
chat='{"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0, "max_tokens": 48}'
request POST /v1/chat/completions "$chat" > /dev/null
python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$tmp/body" > "$tmp/chat_alone.txt"
pids=()
for i in 0 1 2 3; do
    curl -s --max-time 60 -o "$tmp/concurrent_embeddings_$i.json" --data-binary "$(emb body strings)" \
        "http://127.0.0.1:$port/v1/embeddings" &
    pids+=($!)
    curl -s --max-time 60 -o "$tmp/concurrent_chat_$i.json" --data-binary "$chat" "http://127.0.0.1:$port/v1/chat/completions" &
    pids+=($!)
done
wait "${pids[@]}"
why=ok
for i in 0 1 2 3; do
    got=$(emb vectors "$tmp/concurrent_embeddings_$i.json" "$count") && emb close "$got" "$(cat "$tmp/batched.json")" 1e-6 > /dev/null ||
        why="embeddings $i: $(echo "$got" | head -c 200)"
    text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$tmp/concurrent_chat_$i.json" 2>&1)
    [ "$text" = "$(cat "$tmp/chat_alone.txt")" ] || why="chat $i: $text"
done
[ "$why" = ok ] && pass embeddings_concurrent_with_chat || fail embeddings_concurrent_with_chat "$why"

# Seven clients post a text each while a request of 2,048 inputs is being embedded:
# the waiting requests share forwards (fewer forwards than their requests alone would run,
# /metrics' marlhf_embedding_forwards_total), and each gets the vectors it gets alone.
forwards() { curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^marlhf_embedding_forwards_total //p'; }
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["inputs"][3]["text"]; print(json.dumps({"input": [t] * 2048}))' \
    "$fixture" > "$tmp/blocker.json"
# The forwards of each alone.
before=$(forwards)
request POST /v1/embeddings "@$tmp/blocker.json" > /dev/null
middle=$(forwards)
emb body string > "$tmp/string.json"
request POST /v1/embeddings "@$tmp/string.json" > /dev/null
emb vectors "$tmp/body" 1 > "$tmp/string_alone.json" || echo '{"vectors": [], "prompt_tokens": 0}' > "$tmp/string_alone.json"
alone_forwards=$((middle - before + 7 * ($(forwards) - middle)))
before=$(forwards)
curl -s -o "$tmp/blocker_answer.json" --data-binary "@$tmp/blocker.json" "http://127.0.0.1:$port/v1/embeddings" &
blocker=$!
until [ "$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^marlhf_requests_in_progress //p')" != 0 ] ||
    ! kill -0 "$blocker" 2> /dev/null; do sleep 0.01; done
pids=()
for i in 0 1 2 3 4 5 6; do
    curl -s -o "$tmp/shared_$i.json" --data-binary "@$tmp/string.json" "http://127.0.0.1:$port/v1/embeddings" &
    pids+=($!)
done
wait "$blocker" "${pids[@]}"
after=$(forwards)
why=ok
emb vectors "$tmp/blocker_answer.json" 2048 > /dev/null || why="the large request: $(head -c 200 "$tmp/blocker_answer.json")"
for i in 0 1 2 3 4 5 6; do
    got=$(emb vectors "$tmp/shared_$i.json" 1) && emb close "$got" "$(cat "$tmp/string_alone.json")" 1e-6 > /dev/null ||
        why="request $i: $(echo "$got" | head -c 200)"
done
[ "$why" = ok ] && [ -n "$before" ] && [ $((after - before)) -lt "$alone_forwards" ] &&
    pass "embeddings_concurrent_requests_share_forwards ($((after - before)) forwards, $alone_forwards alone)" ||
    fail embeddings_concurrent_requests_share_forwards "$why; forwards $before -> $after"

# llama.cpp's POST /embeddings: each input's vector as a list of one, the /v1/embeddings
# vector bit for bit; its 'content' key; base64 refused there.
status=$(request POST /embeddings "$(emb body strings)")
got=$(emb tokens "$tmp/body" pooled) && python3 -c 'import json, sys; a = json.loads(sys.argv[1]); b = json.load(open(sys.argv[2]))
sys.exit(0 if [v[0] for v in a["vectors"]] == b["vectors"] else 1)' "$got" "$tmp/batched.json" &&
    pass embeddings_native_route || fail embeddings_native_route "status $status: $(head -c 200 "$tmp/body")"
status=$(request POST /embedding "$(emb body strings | sed 's/"input"/"content"/')")
[ "$status" = 200 ] && [ "$(emb tokens "$tmp/body" pooled)" = "$got" ] && pass embeddings_native_content ||
    fail embeddings_native_content "status $status: $(head -c 200 "$tmp/body")"
status=$(request POST /embeddings '{"input": "a", "encoding_format": "base64"}')
[ "$status" = 400 ] && emb error "$tmp/body" encoding_format > /dev/null && pass embeddings_native_no_base64 ||
    fail embeddings_native_no_base64 "status $status: $(head -c 200 "$tmp/body")"
status=$(request POST /embeddings '{"content": []}')
[ "$status" = 400 ] && emb error "$tmp/body" input > /dev/null && pass embeddings_native_empty ||
    fail embeddings_native_empty "status $status: $(head -c 200 "$tmp/body")"

# Bad requests: an OpenAI error naming the parameter.
expect_refused embeddings_bad_json 400 "" '{"input": ["a"' "invalid_json"
expect_refused embeddings_empty_body 400 "" '' "invalid_json"
expect_refused embeddings_body_not_object 400 "" '["a"]'
expect_refused embeddings_no_input 400 input '{"model": "tiny_chat"}'
expect_refused embeddings_input_null 400 input '{"input": null}'
for bad in 5 true '{"text": "a"}' '[1.5]' '[-1]' '[["a"]]' '[[1], "a"]' '["a", [1]]' '["a", null]' '[[1, "2"]]' '[null]'; do
    expect_refused "embeddings_input_wrong_type ($bad)" 400 input "{\"input\": $bad}"
done
for bad in '""' '[]' '[""]' '[[]]' '["a", ""]' '[[1], []]'; do
    expect_refused "embeddings_input_empty ($bad)" 400 input "{\"input\": $bad}" "empty"
done
# An input of the whole context (256 tokens) is embedded, in a request with a short one
# (one forward each: rows x the longest must fit the context), each as it is alone.
full_ids=$(python3 -c 'print(list(range(1, 257)))')
request POST /v1/embeddings "{\"input\": [$full_ids, [5, 6]]}" > /dev/null
pair=$(emb vectors "$tmp/body" 2) || pair='{"vectors": [], "prompt_tokens": 0}'
request POST /v1/embeddings "{\"input\": $full_ids}" > /dev/null
emb vectors "$tmp/body" 1 > "$tmp/full.json" || echo '{"vectors": [[]], "prompt_tokens": 0}' > "$tmp/full.json"
request POST /v1/embeddings '{"input": [5, 6]}' > /dev/null
emb vectors "$tmp/body" 1 > "$tmp/short.json" || echo '{"vectors": [[]], "prompt_tokens": 0}' > "$tmp/short.json"
alone=$(python3 -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print(json.dumps({"vectors": a["vectors"] + b["vectors"], "prompt_tokens": a["prompt_tokens"] + b["prompt_tokens"]}))' "$tmp/full.json" "$tmp/short.json")
why=$(emb close "$pair" "$alone" 1e-6) && python3 -c 'import json, sys; sys.exit(0 if json.loads(sys.argv[1])["prompt_tokens"] == 258 else 1)' "$pair" &&
    pass "embeddings_full_context (largest difference $why)" || fail embeddings_full_context "$(echo "$why $pair" | head -c 300)"

long_ids=$(python3 -c 'print(list(range(1, 258)))')
expect_refused embeddings_ids_over_context 400 input "{\"input\": $long_ids}" "maximum context length is 256 tokens"
long_text=$(python3 -c 'print(" ".join(["word"] * 300))')
expect_refused embeddings_text_over_context 400 input "{\"input\": [\"short\", \"$long_text\"]}" "input[1] has"
python3 -c 'import json; print(json.dumps({"input": ["a"] * 2049}))' > "$tmp/many.json"
expect_refused embeddings_too_many_inputs 400 input "@$tmp/many.json" "at most 2048"
expect_refused embeddings_id_outside_vocabulary 400 input '{"input": [[1, 2], [3, 5000]]}' "input[1][1] = 5000"
expect_refused embeddings_encoding_format 400 encoding_format '{"input": "a", "encoding_format": "hex"}'
expect_refused embeddings_encoding_format_type 400 encoding_format '{"input": "a", "encoding_format": 1}'
expect_refused embeddings_dimensions_other 400 dimensions '{"input": "a", "dimensions": 32}' "64"
expect_refused embeddings_dimensions_type 400 dimensions '{"input": "a", "dimensions": "64"}'
expect_refused embeddings_unknown_model 404 model '{"input": "a", "model": "text-embedding-3-small"}' "model_not_found"
status=$(request GET /v1/embeddings)
[ "$status" = 405 ] && emb error "$tmp/body" "" > /dev/null && pass embeddings_get_405 || fail embeddings_get_405 "status $status"
stop_server
[ "$stop_rc" = 0 ] && pass embeddings_server_stops || fail embeddings_server_stops "exit $stop_rc"

# --pooling last and cls: transformers' last and first token's vectors; /metrics counts
# the one request.
for pooling in last cls; do
    if start_server "$tmp/server_$pooling.log" --model "$model" --threads 1 --pooling "$pooling"; then
        expect_embeddings "embeddings_pooling_$pooling" "$(emb body strings)" "$count" "$(emb fixture "$pooling")" 1e-5
        curl -s -o "$tmp/metrics.txt" "http://127.0.0.1:$port/metrics"
        tokens=$(python3 -c 'import json, sys; print(sum(len(t["ids"]) for t in json.load(open(sys.argv[1]))["inputs"]))' "$fixture")
        if [ "$pooling" = last ]; then
            grep -qx 'marlhf_embedding_requests_total 1' "$tmp/metrics.txt" &&
                grep -qx "marlhf_embedding_inputs_total $count" "$tmp/metrics.txt" &&
                grep -qx "marlhf_embedding_tokens_total $tokens" "$tmp/metrics.txt" &&
                grep -qx 'marlhf_requests_in_progress 0' "$tmp/metrics.txt" &&
                grep -q '^marlhf_embedding_seconds_total [0-9]' "$tmp/metrics.txt" && pass embeddings_metrics ||
                fail embeddings_metrics "$(grep -E '^marlhf_(embedding|requests_in)' "$tmp/metrics.txt")"
        fi
        stop_server
    else
        fail "embeddings_pooling_$pooling" "$(tail -n 3 "$tmp/server_$pooling.log")"
    fi
done

# --pooling none: POST /embeddings answers every token's final hidden state, unnormalised,
# transformers' per-token hidden_states[-1] (float32 against float64: 1e-5 times the
# largest component); two concurrent requests get what they get alone; /v1/embeddings is
# refused (llama.cpp: "Pooling type 'none' is not OAI compatible").
if start_server "$tmp/server_none.log" --model "$model" --threads 1 --pooling none; then
    status=$(request POST /embeddings "$(emb body strings)")
    emb tokens_fixture > "$tmp/tokens_fixture.json"
    if emb tokens "$tmp/body" per_token > "$tmp/tokens_alone.json" &&
        why=$(emb tokens_close "$tmp/tokens_alone.json" "$tmp/tokens_fixture.json" 1e-5); then
        pass "embeddings_pooling_none (largest difference $why)"
    else
        fail embeddings_pooling_none "status $status: $(head -c 300 "$tmp/tokens_alone.json") ${why:-}"
        echo '{"vectors": []}' > "$tmp/tokens_alone.json"
    fi
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["inputs"]; print(json.dumps({"content": [x["text"] for x in t[::-1]]}))' \
        "$fixture" > "$tmp/reversed.json"
    curl -s -o "$tmp/none_0.json" --data-binary "$(emb body id_lists)" "http://127.0.0.1:$port/embeddings" &
    a=$!
    curl -s -o "$tmp/none_1.json" --data-binary "@$tmp/reversed.json" "http://127.0.0.1:$port/embeddings" &
    b=$!
    wait "$a" "$b"
    python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["vectors"]; print(json.dumps({"vectors": v[::-1]}))' \
        "$tmp/tokens_alone.json" > "$tmp/tokens_reversed.json"
    emb tokens "$tmp/none_0.json" per_token > "$tmp/got0.json" && emb tokens "$tmp/none_1.json" per_token > "$tmp/got1.json" &&
        why=$(emb tokens_close "$tmp/got0.json" "$tmp/tokens_alone.json" 1e-6) &&
        why1=$(emb tokens_close "$tmp/got1.json" "$tmp/tokens_reversed.json" 1e-6) &&
        pass "embeddings_pooling_none_concurrent (largest difference $why; $why1)" ||
        fail embeddings_pooling_none_concurrent "$(echo "$why ${why1:-}" | head -c 300)"
    expect_refused embeddings_pooling_none_not_oai 400 "" '{"input": "a"}' "--pooling none"
    # At most one context (256 tokens) of per-token vectors per request.
    status=$(request POST /embeddings "{\"input\": [$(python3 -c 'print(list(range(1, 200)))'), $(python3 -c 'print(list(range(1, 60)))')]}")
    [ "$status" = 400 ] && emb error "$tmp/body" input > /dev/null && grep -q "at most the model's context, 256 tokens" "$tmp/body" &&
        pass embeddings_pooling_none_total_tokens || fail embeddings_pooling_none_total_tokens "status $status: $(head -c 200 "$tmp/body")"
    stop_server
else
    fail embeddings_pooling_none "$(tail -n 3 "$tmp/server_none.log")"
fi

# A pooling that does not exist, or one with a reward model: a one-line error, exit 2.
expect_error serve_bad_pooling "--pooling" "$bin" serve --model "$model" --pooling max
expect_error serve_empty_pooling "--pooling" "$bin" serve --model "$model" --pooling ""
[ "$failures" -eq 0 ]
