#!/usr/bin/env bash
# marlhf serve on the tiny chat model: the OpenAI API's shapes and usage numbers, the same
# text as `marlhf generate` (greedy and seeded sampling), streaming that adds up to the
# non-streamed text, n choices (generate's --num-return-sequences samples), stop strings,
# every error status with its error JSON, a burst of concurrent good and bad requests
# against --max-concurrent, a clean exit on SIGTERM; then
# SmolLM2 (when fetched; in the plain build only: tests/cli_helpers.sh real_model_runs): a real
# answer, a deterministic 429, a stream cancelled by its client, /metrics, the prompt cache (a
# chat's second turn), requests joining a running batch (continuous batching, --parallel rows) and
# answering as they do alone, a short request answered while a long one still streams (and
# an embedding request), a request's choices (n) taking one batch row each, a long prompt
# prefilled in chunks (--prefill-chunk) answering as prefilled whole, and stopped mid-prefill
# by its timeout. Every wait is bounded. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
real_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh

# wait_in_progress N TRIES: polls /health every 0.05 s, at most TRIES times, until N requests
# are in progress; returns 0 when they are.
wait_in_progress() {
    for _ in $(seq "$2"); do
        request GET /health > /dev/null
        grep -q "\"requests_in_progress\":$1" "$tmp/body" && return 0
        sleep 0.05
    done
    return 1
}

# The JSON checks, one place: `check.py KIND FILE ...` exits non-zero with a reason.
cat > "$tmp/check.py" <<'PY'
import json, os, sys

def fail(why):
    print(why)
    sys.exit(1)

def head(o, object_name):
    if o.get("object") != object_name: fail(f"object {o.get('object')!r}, wanted {object_name!r}")
    if o.get("model") != os.environ.get("SERVED_MODEL", "tiny_chat"): fail(f"model {o.get('model')!r}")
    if not isinstance(o.get("created"), int): fail("no created")
    prefix = "chatcmpl-" if object_name.startswith("chat") else "cmpl-"
    if not str(o.get("id", "")).startswith(prefix): fail(f"id {o.get('id')!r}")

def completion(path, kind, max_tokens):
    # prints [text, finish_reason, prompt_tokens, completion_tokens]
    o = json.load(open(path, encoding="utf-8"))
    head(o, "chat.completion" if kind == "chat" else "text_completion")
    if len(o.get("choices", [])) != 1: fail("not one choice")
    c = o["choices"][0]
    if kind == "chat":
        if c["message"]["role"] != "assistant": fail("role")
        text = c["message"]["content"]
    else:
        text = c["text"]
    if not isinstance(text, str): fail("text is not a string")
    if c["finish_reason"] not in ("stop", "length"): fail(f"finish_reason {c['finish_reason']!r}")
    u = o["usage"]
    if not (u["prompt_tokens"] > 0 and 1 <= u["completion_tokens"] <= int(max_tokens)
            and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]):
        fail(f"usage {u}")
    print(json.dumps([text, c["finish_reason"], u["prompt_tokens"], u["completion_tokens"]]))

def sse_chunks(path):
    # the JSON chunks of a Server-Sent Events stream, which must end with data: [DONE]
    raw = open(path, encoding="utf-8").read()
    if not raw.endswith("\n\n"): fail("stream does not end with a blank line")
    events = raw[:-2].split("\n\n")
    if any(not e.startswith("data: ") for e in events): fail("an event is not a data line")
    payloads = [e[len("data: "):] for e in events]
    if payloads[-1] != "[DONE]": fail("no [DONE] at the end")
    return [json.loads(p) for p in payloads[:-1]]

def stream(path, kind):
    # prints [text, finish_reason] from the Server-Sent Events
    chunks = sse_chunks(path)
    if not chunks: fail("no chunks")
    text, finishes = "", []
    for i, ch in enumerate(chunks):
        head(ch, "chat.completion.chunk" if kind == "chat" else "text_completion")
        if len(ch["choices"]) != 1: fail("not one choice in a chunk")
        c = ch["choices"][0]
        piece = c["delta"].get("content", "") if kind == "chat" else c["text"]
        text += piece or ""
        if c["finish_reason"] is not None: finishes.append(i)
    if finishes != [len(chunks) - 1]: fail("finish_reason is not on the last chunk alone")
    if kind == "chat" and chunks[0]["choices"][0]["delta"].get("role") != "assistant": fail("first delta has no role")
    print(json.dumps([text, chunks[-1]["choices"][0]["finish_reason"]]))

def choices(path, kind, n, max_tokens):
    # a response with n choices: prints [[text, finish_reason] per choice, usage]
    o = json.load(open(path, encoding="utf-8"))
    head(o, "chat.completion" if kind == "chat" else "text_completion")
    cs = o.get("choices", [])
    if [c.get("index") for c in cs] != list(range(int(n))): fail(f"indexes {[c.get('index') for c in cs]}, wanted 0..{int(n) - 1}")
    answers = []
    for c in cs:
        if kind == "chat" and c["message"]["role"] != "assistant": fail("role")
        text = c["message"]["content"] if kind == "chat" else c["text"]
        if not isinstance(text, str): fail("text is not a string")
        if c["finish_reason"] not in ("stop", "length"): fail(f"finish_reason {c['finish_reason']!r}")
        answers.append([text, c["finish_reason"]])
    u = o["usage"]
    if not (u["prompt_tokens"] > 0 and int(n) <= u["completion_tokens"] <= int(n) * int(max_tokens)
            and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]):
        fail(f"usage {u}")
    print(json.dumps([answers, u]))

def stream_choices(path, kind, n):
    # a stream of n choices: prints [[text, finish_reason] per choice, usage or None]. Each
    # choice's chunks carry its index; each ends with one finish chunk after all its text;
    # then the usage chunk (when asked), then [DONE].
    chunks = sse_chunks(path)
    usage = None
    if chunks and chunks[-1]["choices"] == []:
        usage = chunks.pop()["usage"]
    texts, finishes, seen = [""] * int(n), [None] * int(n), [0] * int(n)
    for ch in chunks:
        head(ch, "chat.completion.chunk" if kind == "chat" else "text_completion")
        if len(ch["choices"]) != 1: fail("not one choice in a chunk")
        c = ch["choices"][0]
        i = c.get("index")
        if not isinstance(i, int) or not 0 <= i < int(n): fail(f"index {i!r}")
        if finishes[i] is not None: fail(f"choice {i} has a chunk after its finish chunk")
        if kind == "chat" and (seen[i] == 0) != (c["delta"].get("role") == "assistant"):
            fail(f"choice {i}: the role is not on its first chunk alone")
        seen[i] += 1
        piece = c["delta"].get("content", "") if kind == "chat" else c["text"]
        texts[i] += piece or ""
        finishes[i] = c["finish_reason"]
    if any(f not in ("stop", "length") for f in finishes): fail(f"finish_reasons {finishes}")
    print(json.dumps([[list(a) for a in zip(texts, finishes)], usage]))

def error(path, code, param=None):
    o = json.load(open(path, encoding="utf-8"))
    e = o.get("error")
    if not isinstance(e, dict) or set(e) != {"message", "type", "param", "code"}: fail(f"not an error object: {o}")
    if not (isinstance(e["message"], str) and e["message"] and isinstance(e["type"], str)): fail(f"bad error fields: {e}")
    if code and e["code"] != code: fail(f"code {e['code']!r}, wanted {code!r}")
    if param and (e["param"] != param or e["type"] != "invalid_request_error"): fail(f"param {e['param']!r}, type {e['type']!r}")

def generated(path):
    # `marlhf generate` output (one row): [response, prompt_tokens, response_tokens]
    row = json.loads(open(path, encoding="utf-8").readline())
    print(json.dumps([row["response"], row["prompt_tokens"], row["response_tokens"]]))

def token_object(t, where):
    # chat's {"token", "logprob", "bytes"}: a log-prob, and the bytes of the token's text
    if not isinstance(t.get("token"), str): fail(f"{where}: token {t.get('token')!r}")
    if not isinstance(t.get("logprob"), (int, float)) or not -9999 <= t["logprob"] <= 0: fail(f"{where}: logprob {t.get('logprob')!r}")
    if t.get("bytes") != list(t["token"].encode("utf-8")): fail(f"{where}: bytes {t.get('bytes')!r} of {t['token']!r}")

def logprob_entries(kind, lp, k, where):
    # A choice's (or a chunk's) log-probs checked, in one shape for both APIs:
    # ([[token, logprob, [[token, logprob] per alternative, most likely first]] per token], text_offset or None)
    if not isinstance(lp, dict): fail(f"{where}: logprobs {lp!r}")
    entries = []
    if kind == "chat":
        if set(lp) != {"content"} or not isinstance(lp["content"], list): fail(f"{where}: keys {sorted(lp)}")
        for i, e in enumerate(lp["content"]):
            token_object(e, f"{where} token {i}")
            top = e.get("top_logprobs")
            if not isinstance(top, list) or len(top) != k: fail(f"{where} token {i}: {k} alternatives wanted, got {top!r}")
            for t in top: token_object(t, f"{where} token {i} alternative")
            values = [t["logprob"] for t in top]
            if values != sorted(values, reverse=True): fail(f"{where} token {i}: alternatives not most likely first: {values}")
            entries.append([e["token"], e["logprob"], [[t["token"], t["logprob"]] for t in top]])
        return entries, None
    if set(lp) != {"tokens", "token_logprobs", "top_logprobs", "text_offset"}: fail(f"{where}: keys {sorted(lp)}")
    n = len(lp["tokens"])
    if any(len(lp[key]) != n for key in lp): fail(f"{where}: lists of lengths {[len(v) for v in lp.values()]}")
    for i, (token, value, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
        if not isinstance(token, str) or not isinstance(value, (int, float)) or not -9999 <= value <= 0:
            fail(f"{where} token {i}: {token!r} {value!r}")
        if k == 0:
            if top is not None: fail(f"{where} token {i}: alternatives {top!r} with logprobs 0")
            entries.append([token, value, []])
            continue
        # the k most likely, plus the chosen token when it is not among them
        if not isinstance(top, dict) or not 1 <= len(top) <= k + 1 or top.get(token) != value:
            fail(f"{where} token {i}: alternatives {top!r} for {token!r} {value!r}")
        if any(not -9999 <= v <= 0 for v in top.values()): fail(f"{where} token {i}: alternatives {top!r}")
        entries.append([token, value, sorted([list(kv) for kv in top.items()], key=lambda kv: -kv[1])])
    return entries, lp["text_offset"]

def text_offsets(tokens, offsets, where):
    # 0, then each token starts where the one before ends (characters)
    want = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    if offsets != want: fail(f"{where}: text_offset {offsets}, wanted {want} from the tokens' lengths")

def logprobs(path, kind, n, k):
    # a response asked for log-probs: prints [[text, entries] per choice]
    o = json.load(open(path, encoding="utf-8"))
    if len(o.get("choices", [])) != int(n): fail(f"{len(o.get('choices', []))} choices, wanted {n}")
    out = []
    for c in o["choices"]:
        entries, offsets = logprob_entries(kind, c.get("logprobs"), int(k), f"choice {c['index']}")
        if offsets is not None: text_offsets([e[0] for e in entries], offsets, f"choice {c['index']}")
        out.append([c["message"]["content"] if kind == "chat" else c["text"], entries])
    print(json.dumps(out))

def stream_logprobs(path, kind, n, k):
    # a stream asked for log-probs: prints what logprobs() prints for the answer, from the
    # chunks: every chunk with text has log-probs (their entries follow each other, text
    # offsets included), the role and finish chunks have none
    events = open(path, encoding="utf-8").read().split("\n\n")
    if events[-2:] != ["data: [DONE]", ""]: fail("no [DONE] at the end")
    texts, entries, offsets = [""] * int(n), [[] for _ in range(int(n))], [[] for _ in range(int(n))]
    for e in events[:-2]:
        c = json.loads(e[len("data: "):])["choices"][0]
        i = c["index"]
        piece = c["delta"].get("content") if kind == "chat" else c["text"]
        role_or_finish = c["finish_reason"] is not None or (kind == "chat" and "role" in c["delta"])
        if role_or_finish:
            if c["logprobs"] is not None: fail(f"choice {i}: logprobs on a role or finish chunk: {c}")
            continue
        got, got_offsets = logprob_entries(kind, c["logprobs"], int(k), f"choice {i} chunk")
        texts[i] += piece
        entries[i] += got
        offsets[i] += got_offsets or []
    for i in range(int(n)):
        if kind != "chat": text_offsets([e[0] for e in entries[i]], offsets[i], f"streamed choice {i}")
    print(json.dumps([list(a) for a in zip(texts, entries)]))

def chunks_carry_their_tokens(path, kind):
    # plain text streamed without stop strings: each chunk's tokens are the chunk's text
    for e in open(path, encoding="utf-8").read().split("\n\n")[:-2]:
        c = json.loads(e[len("data: "):])["choices"][0]
        if c["logprobs"] is None: continue
        piece = c["delta"].get("content") if kind == "chat" else c["text"]
        tokens = [t["token"] for t in c["logprobs"]["content"]] if kind == "chat" else c["logprobs"]["tokens"]
        if "".join(tokens) != piece: fail(f"a chunk's text {piece!r} with the tokens {tokens}")

kind = sys.argv[1]
if kind == "logprobs": logprobs(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
elif kind == "stream_logprobs": stream_logprobs(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
elif kind == "chunks_carry_their_tokens": chunks_carry_their_tokens(sys.argv[2], sys.argv[3])
elif kind == "completion": completion(sys.argv[2], sys.argv[3], sys.argv[4])
elif kind == "stream": stream(sys.argv[2], sys.argv[3])
elif kind == "choices": choices(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
elif kind == "stream_choices": stream_choices(sys.argv[2], sys.argv[3], sys.argv[4])
elif kind == "error": error(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "", sys.argv[4] if len(sys.argv) > 4 else None)
elif kind == "generated": generated(sys.argv[2])
elif kind == "generated_samples":
    # `marlhf generate --num-return-sequences` output: [[response, response_tokens] per sample], in sample order
    rows = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
    if [r.get("sample") for r in rows] != list(range(len(rows))): fail("samples out of order")
    print(json.dumps([[r["response"], r["response_tokens"]] for r in rows]))
elif kind == "models":
    o = json.load(open(sys.argv[2]))
    if not (o["object"] == "list" and len(o["data"]) == 1 and o["data"][0]["id"] == "tiny_chat"
            and o["data"][0]["object"] == "model"): fail(f"{o}")
elif kind == "text":  # the text of a completion or stream result line
    print(json.dumps(json.loads(sys.argv[2])[0]))
PY
check() { python3 "$tmp/check.py" "$@"; }

# expect_api_error NAME STATUS CODE METHOD PATH [BODY [CURL ARGS]]: that status and an
# OpenAI error object (with that code, unless CODE is "").
expect_api_error() {
    local name=$1 want=$2 code=$3
    shift 3
    local got why
    got=$(request "$@")
    if [ "$got" != "$want" ]; then
        fail "$name" "status $got, wanted $want: $(head -c 300 "$tmp/body")"
    elif why=$(check error "$tmp/body" "$code"); then
        pass "$name"
    else
        fail "$name" "$why"
    fi
}

if ! start_server "$tmp/server.log" --model "$model" --threads 1 --max-concurrent 4 --max-body-bytes 65536 --max-tokens-limit 512; then
    fail server_starts "$(tail -n 5 "$tmp/server.log")"
    exit 1
fi
pass server_starts

status=$(request GET /v1/models)
why=$(check models "$tmp/body") && [ "$status" = 200 ] && pass models_list || fail models_list "$status $why"
status=$(request GET /health)
[ "$status" = 200 ] && grep -q '"status":"ok"' "$tmp/body" && pass health || fail health "$status"

# Chat, greedy: the same text twice, and the text, prompt and token counts of `marlhf generate`.
question="What is the capital of France?"
greedy_chat='{"model": "tiny_chat", "messages": [{"role": "user", "content": "'"$question"'"}], "temperature": 0, "seed": 11, "max_tokens": 24}'
status=$(request POST /v1/chat/completions "$greedy_chat")
if chat1=$(check completion "$tmp/body" chat 24) && [ "$status" = 200 ]; then pass chat_completion_shape; else fail chat_completion_shape "$status $chat1"; fi
request POST /v1/chat/completions "$greedy_chat" > /dev/null
chat2=$(check completion "$tmp/body" chat 24)
[ -n "$chat1" ] && [ "$chat1" = "$chat2" ] && pass chat_greedy_reproducible || fail chat_greedy_reproducible "$chat1 vs $chat2"
"$bin" generate --model "$model" --chat --greedy --max-new-tokens 24 --threads 1 "$question" > "$tmp/generate.jsonl" 2> /dev/null
want=$(check generated "$tmp/generate.jsonl")
got=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps([r[0], r[2], r[3]]))' "$chat1")
[ -n "$want" ] && [ "$got" = "$want" ] && pass chat_equals_generate_greedy || fail chat_equals_generate_greedy "$got vs $want"

# Seeded sampling: the same text for the same seed, the same as `marlhf generate`, and
# another text for another seed.
sampled() { echo '{"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": '"$1"', "max_tokens": 32}'; }
request POST /v1/chat/completions "$(sampled 7)" > /dev/null
s1=$(check completion "$tmp/body" chat 32)
request POST /v1/chat/completions "$(sampled 7)" > /dev/null
s2=$(check completion "$tmp/body" chat 32)
request POST /v1/chat/completions "$(sampled 8)" > /dev/null
s3=$(check completion "$tmp/body" chat 32)
"$bin" generate --model "$model" --chat --temperature 0.9 --top-p 0.95 --top-k 40 --seed 7 --max-new-tokens 32 --threads 1 \
    "Tell me a story." > "$tmp/generate_sampled.jsonl" 2> /dev/null
want=$(check generated "$tmp/generate_sampled.jsonl")
got=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps([r[0], r[2], r[3]]))' "$s1")
[ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$s1" != "$s3" ] && pass chat_seed_reproducible || fail chat_seed_reproducible "$s1 / $s2 / $s3"
[ -n "$want" ] && [ "$got" = "$want" ] && pass chat_sampling_equals_generate || fail chat_sampling_equals_generate "$got vs $want"
# The penalties (OpenAI's presence_penalty and frequency_penalty, vLLM's repetition_penalty and
# min_p): the same text and log-probs as `marlhf generate` with the same options.
penalties='"presence_penalty": 0.4, "frequency_penalty": 0.6, "repetition_penalty": 1.3, "min_p": 0.05'
request POST /v1/chat/completions "$(sampled 7 | sed "s/}\$/, $penalties}/")" > /dev/null
p1=$(check completion "$tmp/body" chat 32)
"$bin" generate --model "$model" --chat --temperature 0.9 --top-p 0.95 --top-k 40 --seed 7 --max-new-tokens 32 --threads 1 \
    --presence-penalty 0.4 --frequency-penalty 0.6 --repetition-penalty 1.3 --min-p 0.05 "Tell me a story." \
    > "$tmp/generate_penalties.jsonl" 2> /dev/null
want=$(check generated "$tmp/generate_penalties.jsonl")
got=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps([r[0], r[2], r[3]]))' "$p1")
[ -n "$p1" ] && [ "$p1" != "$s1" ] && [ "$got" = "$want" ] && pass chat_penalties_equal_generate ||
    fail chat_penalties_equal_generate "$got vs $want"

# Streaming: chunks ending with [DONE] whose deltas add up to the non-streamed text.
stream_body() { python3 -c 'import json,sys; o=json.loads(sys.argv[1]); o.update(json.loads(sys.argv[2])); print(json.dumps(o))' "$1" "$2"; }
status=$(request POST /v1/chat/completions "$(stream_body "$(sampled 7)" '{"stream": true}')" -N)
if streamed=$(check stream "$tmp/body" chat) && [ "$status" = 200 ]; then
    want=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps(r[:2]))' "$s1")
    [ "$streamed" = "$want" ] && pass chat_stream_equals_text || fail chat_stream_equals_text "$streamed vs $want"
else
    fail chat_stream_equals_text "$status $streamed"
fi
status=$(request POST /v1/chat/completions "$(stream_body "$(sampled 7)" '{"stream": true, "stream_options": {"include_usage": true}}')" -N)
python3 - "$tmp/body" <<'PY' && pass chat_stream_usage || fail chat_stream_usage "$(tail -c 300 "$tmp/body")"
import json, sys
events = open(sys.argv[1]).read().split("\n\n")
last = json.loads(events[-3][len("data: "):])
sys.exit(0 if last["choices"] == [] and last["usage"]["completion_tokens"] >= 1 and events[-2] == "data: [DONE]" else 1)
PY

# Stop strings: the text is cut before the first one, streamed or not.
stop=$(python3 -c 'import json,sys; t=json.loads(sys.argv[1])[0]; print(json.dumps(t[len(t)//2:len(t)//2+2]))' "$s1")
want=$(python3 -c 'import json,sys; t=json.loads(sys.argv[1])[0]; s=json.loads(sys.argv[2]); print(json.dumps([t[:t.find(s)], "stop"]))' "$s1" "$stop")
request POST /v1/chat/completions "$(stream_body "$(sampled 7)" '{"stop": ["@@@", '"$stop"']}')" > /dev/null
got=$(check completion "$tmp/body" chat 32 | python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())[:2]))')
[ "$got" = "$want" ] && pass stop_string || fail stop_string "$got vs $want (stop $stop)"
request POST /v1/chat/completions "$(stream_body "$(sampled 7)" '{"stop": '"$stop"', "stream": true}')" -N > /dev/null
got=$(check stream "$tmp/body" chat)
[ "$got" = "$want" ] && pass stop_string_stream || fail stop_string_stream "$got vs $want"

# Text completions: the text of `marlhf generate` without --chat; streamed the same.
status=$(request POST /v1/completions '{"prompt": "Once upon a time", "temperature": 0.7, "seed": 3, "max_tokens": 16}')
if text1=$(check completion "$tmp/body" text 16) && [ "$status" = 200 ]; then pass completions_shape; else fail completions_shape "$status $text1"; fi
"$bin" generate --model "$model" --temperature 0.7 --top-k 0 --seed 3 --max-new-tokens 16 --threads 1 "Once upon a time" \
    > "$tmp/generate_text.jsonl" 2> /dev/null
want=$(check generated "$tmp/generate_text.jsonl")
got=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps([r[0], r[2], r[3]]))' "$text1")
[ -n "$want" ] && [ "$got" = "$want" ] && pass completions_equal_generate || fail completions_equal_generate "$got vs $want"
request POST /v1/completions '{"prompt": "Once upon a time", "temperature": 0.7, "seed": 3, "max_tokens": 16, "stream": true}' -N > /dev/null
got=$(check stream "$tmp/body" text)
want=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])[:2]))' "$text1")
[ "$got" = "$want" ] && pass completions_stream || fail completions_stream "$got vs $want"
status=$(request POST /v1/completions '{"prompt": [5, 6, 7], "max_tokens": 4}')
check completion "$tmp/body" text 4 > /dev/null && [ "$status" = 200 ] && pass completions_token_ids || fail completions_token_ids "$status"

# n: several answers per request. Choice i samples from the random stream `marlhf generate
# --num-return-sequences` gives sample i, so choice 0 is the request's answer without n, the
# choices are generate's samples (texts and token counts: usage sums them), and sampled
# choices differ.
n_story() { echo '{"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 1, "seed": 7, "max_tokens": 12'"$1"'}'; }
request POST /v1/chat/completions "$(n_story '')" > /dev/null
n1=$(check completion "$tmp/body" chat 12)
"$bin" generate --model "$model" --chat --temperature 1 --top-k 0 --top-p 1 --seed 7 --max-new-tokens 12 \
    --num-return-sequences 3 --threads 1 "Tell me a story." > "$tmp/generate_n3.jsonl" 2> /dev/null
samples=$(check generated_samples "$tmp/generate_n3.jsonl")
status=$(request POST /v1/chat/completions "$(n_story ', "n": 3')")
if ! n3=$(check choices "$tmp/body" chat 3 12) || [ "$status" != 200 ]; then
    fail chat_n_3 "$status $n3"
    n3=
elif [ -z "$n1" ] || [ -z "$samples" ]; then
    fail chat_n_3 "no answer without n ($n1) or no samples from generate ($samples)"
else
    why=$(python3 - "$n3" "$n1" "$samples" <<'PY'
import json, sys
(answers, usage), alone, samples = (json.loads(a) for a in sys.argv[1:4])
texts = [a[0] for a in answers]
if texts[0] != alone[0]: print(f"choice 0 {texts[0]!r} is not the answer without n {alone[0]!r}")
elif len(set(texts)) < 2: print(f"every choice is the same: {texts!r}")
elif texts != [s[0] for s in samples]: print(f"{texts!r} vs generate's samples {[s[0] for s in samples]!r}")
elif usage["completion_tokens"] != sum(s[1] for s in samples): print(f"usage {usage} vs generate's {[s[1] for s in samples]}")
elif usage["prompt_tokens"] != alone[2]: print(f"prompt_tokens {usage['prompt_tokens']} vs {alone[2]} without n")
else: print("ok")
PY
)
    [ "$why" = ok ] && pass chat_n_3 || fail chat_n_3 "$why"
fi
# Streamed, the choices' pieces (each index its own, with its own role and finish chunk)
# add up to the non-streamed choices, and the usage chunk sums them too.
status=$(request POST /v1/chat/completions "$(n_story ', "n": 3, "stream": true, "stream_options": {"include_usage": true}')" -N)
got=$(check stream_choices "$tmp/body" chat 3)
[ "$status" = 200 ] && [ -n "$got" ] && [ "$got" = "$n3" ] && pass chat_n_3_stream || fail chat_n_3_stream "$status $got vs $n3"
n_text='{"prompt": "Once upon a time", "temperature": 0.7, "seed": 3, "max_tokens": 16, "n": 2'
status=$(request POST /v1/completions "$n_text}")
n2=$(check choices "$tmp/body" text 2 16)
request POST /v1/completions "$n_text"', "stream": true, "stream_options": {"include_usage": true}}' -N > /dev/null
got=$(check stream_choices "$tmp/body" text 2)
[ "$status" = 200 ] && [ -n "$n2" ] && [ "$got" = "$n2" ] && pass completions_n_2_stream || fail completions_n_2_stream "$status $got vs $n2"
# Greedy: every choice is the greedy answer.
status=$(request POST /v1/chat/completions "$(stream_body "$greedy_chat" '{"n": 2}')")
got=$(check choices "$tmp/body" chat 2 24 | python3 -c 'import json,sys; a=json.loads(sys.stdin.read())[0]; print(json.dumps(a) if a[0] == a[1] else "")')
want=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps([r[:2], r[:2]]))' "$chat1")
[ "$status" = 200 ] && [ -n "$got" ] && [ "$got" = "$want" ] && pass chat_n_2_greedy_identical || fail chat_n_2_greedy_identical "$status $got vs $want"
# More choices than --parallel (4) rows: the request is generated alone, all 16 rows.
status=$(request POST /v1/completions '{"prompt": "Once upon a time", "seed": 5, "max_tokens": 4, "n": 16}')
check choices "$tmp/body" text 16 4 > /dev/null && [ "$status" = 200 ] && pass completions_n_16_over_parallel ||
    fail completions_n_16_over_parallel "$status $(head -c 300 "$tmp/body")"
for bad in 0 17 '"2"' 1.5 -1; do
    status=$(request POST /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": $bad}")
    if why=$(check error "$tmp/body" "" n) && [ "$status" = 400 ]; then pass "n_refused ($bad)"; else fail "n_refused ($bad)" "$status $why"; fi
done

# Errors: status and error object.
head -c 200000 /dev/zero | tr '\0' 'a' > "$tmp/big.json"
expect_api_error body_too_large 413 request_too_large POST /v1/chat/completions "@$tmp/big.json"
expect_api_error body_too_large_chunked 413 request_too_large POST /v1/chat/completions "@$tmp/big.json" -H 'Transfer-Encoding: chunked'
expect_api_error bad_json 400 invalid_json POST /v1/chat/completions '{"messages": ['
expect_api_error empty_body 400 invalid_json POST /v1/completions ''
expect_api_error body_not_object 400 "" POST /v1/completions '[1, 2]'
expect_api_error reward_route_on_generator 400 not_a_reward_model POST /get_reward '{"query": ["hi"]}'
expect_api_error unknown_model 404 model_not_found POST /v1/chat/completions '{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}'
expect_api_error unknown_model_get 404 model_not_found GET /v1/models/gpt-4
msg='"messages": [{"role": "user", "content": "hi"}]'
expect_api_error max_tokens_negative 400 "" POST /v1/chat/completions "{$msg, \"max_tokens\": -1}"
expect_api_error max_tokens_zero 400 "" POST /v1/chat/completions "{$msg, \"max_tokens\": 0}"
expect_api_error max_tokens_huge 400 "" POST /v1/chat/completions "{$msg, \"max_tokens\": 100000}"
expect_api_error max_tokens_over_limit 400 "" POST /v1/completions '{"prompt": "hi", "max_tokens": 513}'
expect_api_error max_tokens_string 400 "" POST /v1/chat/completions "{$msg, \"max_tokens\": \"10\"}"
expect_api_error temperature_5 400 "" POST /v1/chat/completions "{$msg, \"temperature\": 5}"
expect_api_error temperature_negative 400 "" POST /v1/chat/completions "{$msg, \"temperature\": -0.5}"
expect_api_error top_p_zero 400 "" POST /v1/chat/completions "{$msg, \"top_p\": 0}"
expect_api_error stop_five 400 "" POST /v1/chat/completions "{$msg, \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}"
expect_api_error stop_number 400 "" POST /v1/chat/completions "{$msg, \"stop\": 5}"
expect_api_error stream_not_bool 400 "" POST /v1/chat/completions "{$msg, \"stream\": \"yes\"}"
expect_api_error messages_empty 400 "" POST /v1/chat/completions '{"messages": []}'
expect_api_error messages_missing 400 "" POST /v1/chat/completions '{"prompt": "hi"}'
expect_api_error messages_not_list 400 "" POST /v1/chat/completions '{"messages": "hi"}'
expect_api_error role_unknown 400 "" POST /v1/chat/completions '{"messages": [{"role": "wizard", "content": "hi"}]}'
expect_api_error content_number 400 "" POST /v1/chat/completions '{"messages": [{"role": "user", "content": 5}]}'
expect_api_error message_not_object 400 "" POST /v1/chat/completions '{"messages": ["hi"]}'
expect_api_error prompt_missing 400 "" POST /v1/completions '{"max_tokens": 3}'
expect_api_error prompt_bad_token_id 400 "" POST /v1/completions '{"prompt": [5, 99999999]}'
python3 -c 'import json; print(json.dumps({"messages": [{"role": "user", "content": "hello " * 400}]}))' > "$tmp/long.json"
expect_api_error prompt_too_long 400 context_length_exceeded POST /v1/chat/completions "@$tmp/long.json"
# OpenAI's logit_bias: +100 on one token makes every greedy token that one (the text of its id
# four times, as `marlhf tokenize --decode` spells it); -100 on the greedy answer's first token
# turns it away from it; a token id outside the vocabulary, a key that is no id or a bias out of
# [-100, 100] is a 400 naming logit_bias.
forced=$(echo '{"ids": [83, 83, 83, 83]}' | "$bin" tokenize --model "$model" --decode --input - 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])')
status=$(request POST /v1/completions '{"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logit_bias": {"83": 100}}')
got=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$tmp/body" 2>/dev/null)
first_id=$("$bin" generate --model "$model" --greedy --max-new-tokens 4 --threads 1 Hello 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["ids"][0])')
status2=$(request POST /v1/completions "{\"prompt\": \"Hello\", \"max_tokens\": 1, \"temperature\": 0, \"logprobs\": 1, \"logit_bias\": {\"$first_id\": -100}}")
banned=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$tmp/body" 2>/dev/null)
plain=$(echo "{\"ids\": [$first_id]}" | "$bin" tokenize --model "$model" --decode --input - 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])')
[ "$status" = 200 ] && [ -n "$forced" ] && [ "$got" = "$forced" ] && [ "$status2" = 200 ] && [ -n "$first_id" ] &&
    [ "$banned" != "$plain" ] && pass logit_bias || fail logit_bias "status $status/$status2 forced '$got' vs '$forced', banned '$banned' vs '$plain'"
expect_api_error logit_bias_token_range 400 "" POST /v1/chat/completions "{$msg, \"logit_bias\": {\"99999999\": 5}}"
expect_api_error logit_bias_key 400 "" POST /v1/chat/completions "{$msg, \"logit_bias\": {\"abc\": 5}}"
expect_api_error logit_bias_value 400 "" POST /v1/chat/completions "{$msg, \"logit_bias\": {\"5\": 101}}"
expect_api_error frequency_penalty_range 400 "" POST /v1/chat/completions "{$msg, \"frequency_penalty\": 2.5}"
expect_api_error presence_penalty_string 400 "" POST /v1/chat/completions "{$msg, \"presence_penalty\": \"1\"}"
expect_api_error repetition_penalty_zero 400 "" POST /v1/chat/completions "{$msg, \"repetition_penalty\": 0}"
expect_api_error min_p_range 400 "" POST /v1/chat/completions "{$msg, \"min_p\": 1.5}"
# Log-probs: chat's top_logprobs is 0..20 and needs logprobs true, chat's logprobs is a
# boolean, completions' logprobs 0..5 (and top_logprobs is chat's): 400 naming the parameter.
bad_logprobs=("chat top_logprobs {$msg, \"logprobs\": true, \"top_logprobs\": 21}"
              "chat top_logprobs {$msg, \"top_logprobs\": 2}"
              "chat top_logprobs {$msg, \"logprobs\": false, \"top_logprobs\": 1}"
              "chat top_logprobs {$msg, \"logprobs\": true, \"top_logprobs\": -1}"
              "chat logprobs {$msg, \"logprobs\": \"yes\"}"
              "chat logprobs {$msg, \"logprobs\": 1}"
              "completions logprobs {\"prompt\": \"hi\", \"logprobs\": 6}"
              "completions logprobs {\"prompt\": \"hi\", \"logprobs\": true}"
              "completions top_logprobs {\"prompt\": \"hi\", \"logprobs\": 2, \"top_logprobs\": 2}")
for case in "${bad_logprobs[@]}"; do
    read -r route param body <<< "$case"
    path=/v1/completions
    [ "$route" = chat ] && path=/v1/chat/completions
    status=$(request POST "$path" "$body")
    if why=$(check error "$tmp/body" invalid_value "$param") && [ "$status" = 400 ]; then
        pass "logprobs_refused ($body)"
    else
        fail "logprobs_refused ($body)" "$status $why"
    fi
done
# Their neutral values change nothing: "logprobs": null on every choice.
status=$(request POST /v1/chat/completions "$(stream_body "$greedy_chat" '{"logprobs": false, "top_logprobs": 0}')")
got=$(check completion "$tmp/body" chat 24)
[ "$status" = 200 ] && [ "$got" = "$chat1" ] && python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["choices"][0]["logprobs"] is not None)' "$tmp/body" &&
    pass logprobs_off_is_null || fail logprobs_off_is_null "$status $got vs $chat1"
# Completions' logprobs 0: each token's log-prob without alternatives (null in top_logprobs),
# the same answer as without log-probs, and one entry per generated token (no stop token
# here: the text model has none in plain completions unless it draws its EOS).
status=$(request POST /v1/completions '{"prompt": "Once upon a time", "temperature": 0.7, "seed": 3, "max_tokens": 16, "logprobs": 0}')
got=$(check logprobs "$tmp/body" text 1 0)
python3 - "$got" "$text1" <<'PY' && [ "$status" = 200 ] && pass completions_logprobs_0 || fail completions_logprobs_0 "$status $got vs $text1"
import json, sys
(text, entries), = json.loads(sys.argv[1])
plain = json.loads(sys.argv[2])
sys.exit(0 if text == plain[0] and 1 <= len(entries) <= plain[3] and all(e[2] == [] for e in entries) else 1)
PY
expect_api_error unknown_route 404 unknown_url GET /v1/nothing
expect_api_error unknown_route_post 404 unknown_url POST /completions '{}'
expect_api_error get_on_post_route 405 method_not_allowed GET /v1/chat/completions
expect_api_error get_on_completions 405 method_not_allowed GET /v1/completions
expect_api_error post_on_models 405 method_not_allowed POST /v1/models '{}'

# A burst of 20 concurrent requests, good and bad, against --max-concurrent 4: each answer
# is a completion (good requests only), an error JSON with a 4xx status (bad ones: 400/404),
# or 429; then the server still answers correctly.
bad_bodies=('{"messages": [' '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}'
            '{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}' '{"messages": []}'
            '{"messages": [{"role": "user", "content": "hi"}], "temperature": 5}')
pids=()
for i in $(seq 0 19); do
    if [ $((i % 2)) -eq 0 ]; then
        body='{"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 1, "seed": '$i', "max_tokens": 200}'
        path=/v1/chat/completions
        [ $((i % 4)) -eq 0 ] && body=$(stream_body "$body" '{"stream": true}')
        echo good > "$tmp/burst_$i.kind"
    else
        body=${bad_bodies[$(((i / 2) % 5))]}
        path=/v1/chat/completions
        echo bad > "$tmp/burst_$i.kind"
    fi
    curl -s -N --max-time 60 -o "$tmp/burst_$i.body" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$body" "http://127.0.0.1:$port$path" > "$tmp/burst_$i.status" &
    pids+=($!)
done
wait "${pids[@]}"
python3 - "$tmp" <<'PY' > "$tmp/burst.result"
import json, sys
tmp = sys.argv[1]
counts, problems = {}, []
for i in range(20):
    kind = open(f"{tmp}/burst_{i}.kind").read().strip()
    status = open(f"{tmp}/burst_{i}.status").read().strip()
    body = open(f"{tmp}/burst_{i}.body", encoding="utf-8").read()
    counts[status] = counts.get(status, 0) + 1
    try:
        if status == "200":
            if kind != "good": problems.append(f"{i}: bad request answered 200")
            elif body.startswith("data: "):
                if not body.endswith("data: [DONE]\n\n"): problems.append(f"{i}: stream without [DONE]")
            else:
                o = json.loads(body)
                if o["object"] != "chat.completion" or not isinstance(o["choices"][0]["message"]["content"], str):
                    problems.append(f"{i}: not a completion")
        elif status in ("400", "404", "429"):
            e = json.loads(body)["error"]
            if not e["message"] or set(e) != {"message", "type", "param", "code"}: problems.append(f"{i}: bad error")
            if kind == "good" and status != "429": problems.append(f"{i}: good request got {status}")
            if status == "429" and e["code"] != "rate_limit_exceeded": problems.append(f"{i}: 429 code {e['code']}")
        else:
            problems.append(f"{i}: status {status}")
    except Exception as x:
        problems.append(f"{i}: {status} {x!r}: {body[:100]!r}")
print(" ".join(f"{k}x{v}" for k, v in sorted(counts.items())))
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
burst_rc=$?
[ $burst_rc -eq 0 ] && pass "burst_answers ($(head -n 1 "$tmp/burst.result"))" || fail burst_answers "$(cat "$tmp/burst.result")"
request POST /v1/chat/completions "$greedy_chat" > /dev/null
after=$(check completion "$tmp/body" chat 24)
[ -n "$after" ] && [ "$after" = "$chat1" ] && pass after_burst_still_correct || fail after_burst_still_correct "$after"
request GET /health > /dev/null
grep -q '"requests_in_progress":0' "$tmp/body" && pass after_burst_nothing_in_progress || fail after_burst_nothing_in_progress "$(cat "$tmp/body")"

# Command-line mistakes: one line, exit 2.
expect_error serve_port_in_use "cannot listen" "$bin" serve --model "$model" --port "$port"
expect_error serve_bad_port "--port" "$bin" serve --model "$model" --port 70000
expect_error serve_bad_max_concurrent "--max-concurrent" "$bin" serve --model "$model" --max-concurrent 0
expect_error serve_bad_template "chat template" "$bin" serve --model "$model" --chat-template nonsense
expect_error serve_no_thinking_unsupported "--no-thinking: chat template" "$bin" serve --model "$model" --no-thinking
expect_error serve_reward_model_no_thinking "option --no-thinking does not apply to --reward-model" \
    "$bin" serve --reward-model "$model" --no-thinking

stop_server
[ "$stop_rc" = 0 ] && grep -q '^serve: stopped$' "$tmp/server.log" && pass sigterm_exits_0 || fail sigterm_exits_0 "exit $stop_rc: $(tail -n 2 "$tmp/server.log")"

# GET /metrics on a fresh server: Prometheus text whose counters add up to the answers'
# usage (two requests answered, one with n = 2; a rejected one is not a generation).
if start_server "$tmp/metrics.log" --model "$model" --threads 1; then
    request POST /v1/completions '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}' > /dev/null
    cp "$tmp/body" "$tmp/metrics_a.json"
    request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2, "seed": 3}' > /dev/null
    cp "$tmp/body" "$tmp/metrics_b.json"
    request POST /v1/completions '{"prompt": "x", "max_tokens": -1}' > /dev/null
    status=$(curl -s -D "$tmp/metrics.headers" -o "$tmp/metrics.txt" -w '%{http_code}' "http://127.0.0.1:$port/metrics")
    why=$(python3 - "$tmp" <<'PY'
import json, re, sys
tmp = sys.argv[1]
usage = [json.load(open(f"{tmp}/metrics_{k}.json"))["usage"] for k in "ab"]
lines = open(f"{tmp}/metrics.txt").read().splitlines()
samples = {}
for line in lines:
    if line.startswith("#"):
        if not re.match(r"# (HELP marlhf_\w+ .+|TYPE marlhf_\w+ (gauge|counter))$", line): print(f"bad comment {line!r}"); sys.exit()
        continue
    m = re.match(r"(marlhf_\w+) (\S+)$", line)
    if not m: print(f"bad sample {line!r}"); sys.exit()
    samples[m[1]] = float(m[2])
want = {"marlhf_requests_answered_total": 2, "marlhf_requests_failed_total": 0, "marlhf_requests_in_progress": 0,
        "marlhf_requests_queued": 0, "marlhf_rows_generating": 0,
        "marlhf_prompt_tokens_total": sum(u["prompt_tokens"] for u in usage),
        "marlhf_completion_tokens_total": sum(u["completion_tokens"] for u in usage)}
wrong = {k: (samples.get(k), v) for k, v in want.items() if samples.get(k) != v}
if wrong: print(f"got (metric, want): {wrong}")
elif samples["marlhf_generated_tokens_total"] < want["marlhf_completion_tokens_total"] or samples["marlhf_decode_steps_total"] < 1 \
        or samples["marlhf_prefills_total"] != 2 or samples["marlhf_kv_cache_slots"] < 1:
    print(f"batch counters {samples}")
else: print("ok")
PY
)
    [ "$status" = 200 ] && grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/metrics.headers" && [ "$why" = ok ] &&
        pass metrics_add_up || fail metrics_add_up "status $status: $why"
    status=$(request POST /metrics '{}')
    [ "$status" = 405 ] && pass metrics_post_405 || fail metrics_post_405 "status $status"
    stop_server
else
    fail metrics_server "$(tail -n 3 "$tmp/metrics.log")"
fi

# --prompt-cache: a chat's second turn (the first turn, its answer, a new message) takes
# the first turn's tokens from the cache: usage.prompt_tokens_details.cached_tokens counts
# at least the first turn's prompt but its last token and at most that prompt and the
# answer's tokens but the last (the tiny model answers in newlines, which the chat
# template trims, so the answer's own tokens do not come back), and /metrics counts the
# same; the answers are a server's without the cache. The first turn reports none.
turn1='{"messages": [{"role": "user", "content": "Tell me a story about a cat."}], "max_tokens": 12, "temperature": 0}'
turn2() { python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]; print(json.dumps({"messages": [{"role": "user", "content": "Tell me a story about a cat."}, {"role": "assistant", "content": a}, {"role": "user", "content": "And then?"}], "max_tokens": 12, "temperature": 0}))' "$1"; }
for cache in 4 0; do
    if start_server "$tmp/prompt_cache_$cache.log" --model "$model" --threads 1 --prompt-cache "$cache"; then
        request POST /v1/chat/completions "$turn1" > /dev/null
        cp "$tmp/body" "$tmp/turn1_$cache.json"
        request POST /v1/chat/completions "$(turn2 "$tmp/turn1_$cache.json")" > /dev/null
        cp "$tmp/body" "$tmp/turn2_$cache.json"
        curl -s -o "$tmp/prompt_cache_metrics_$cache.txt" "http://127.0.0.1:$port/metrics"
        stop_server
    fi
done
why=$(python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
t1, t2, t1_off, t2_off = (json.load(open(f"{tmp}/{name}.json")) for name in ("turn1_4", "turn2_4", "turn1_0", "turn2_0"))
metrics = dict(l.split() for l in open(f"{tmp}/prompt_cache_metrics_4.txt") if not l.startswith("#"))
cached1 = t1["usage"]["prompt_tokens_details"]["cached_tokens"]
cached2 = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
low, high = t1["usage"]["prompt_tokens"] - 1, t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"] - 1
text = lambda r: r["choices"][0]["message"]["content"]
if cached1 != 0 or not low <= cached2 <= high: print(f"cached tokens {cached1}, {cached2} (want 0, {low} to {high})")
elif t2_off["usage"]["prompt_tokens_details"]["cached_tokens"] != 0: print("cached tokens without the cache")
elif text(t1) != text(t1_off) or text(t2) != text(t2_off): print(f"answers {text(t2)!r} vs {text(t2_off)!r} without the cache")
elif float(metrics["marlhf_prompt_cache_hits_total"]) != 1 or float(metrics["marlhf_prompt_tokens_cached_total"]) != cached2: print(f"metrics {metrics}")
else: print("ok")
PY
)
[ "$why" = ok ] && pass prompt_cache_second_turn || fail prompt_cache_second_turn "$why"
expect_error serve_bad_prompt_cache "--prompt-cache" "$bin" serve --model "$model" --prompt-cache -1

# SmolLM2 (fetched by scripts/fetch-model): a real answer, equal to `marlhf generate`.
if real_model_runs "$real_model" "serve on SmolLM2"; then
    if start_server "$tmp/real.log" --model "$real_model" --max-concurrent 1 --threads 2; then
        status=$(request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "'"$question"'"}], "temperature": 0, "max_tokens": 8}')
        real=$(SERVED_MODEL=SmolLM2-135M-Instruct.Q4_1.gguf check completion "$tmp/body" chat 8)
        "$bin" generate --model "$real_model" --chat --greedy --max-new-tokens 8 "$question" > "$tmp/real_generate.jsonl" 2> /dev/null
        want=$(check generated "$tmp/real_generate.jsonl" | python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())[0]))')
        got=$(check text "$real")
        [ "$status" = 200 ] && [ -n "$got" ] && [ "$got" != '""' ] && [ "$got" = "$want" ] &&
            pass real_model_answer || fail real_model_answer "$status $got vs $want"

        # Log-probs, greedy: each token is its own most likely alternative with the same
        # log-prob, three alternatives most likely first, the tokens make up the answer, and
        # the log-probs are generate's for the same tokens (its ids end with the stop token,
        # which has no entry).
        export SERVED_MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
        status=$(request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "'"$question"'"}], "temperature": 0, "max_tokens": 8, "logprobs": true, "top_logprobs": 3}')
        got=$(check logprobs "$tmp/body" chat 1 3)
        why=$(python3 - "$got" "$tmp/real_generate.jsonl" <<'PY'
import json, sys
(text, entries), = json.loads(sys.argv[1])
row = json.loads(open(sys.argv[2]).readline())
want = row["logprobs"][:len(row["ids"]) - (row["stop_reason"] == "stop_token")]
if not entries: print("no entries")
elif any(e[0] != e[2][0][0] or e[1] != e[2][0][1] for e in entries): print(f"a greedy token is not its first alternative: {entries}")
elif "".join(e[0] for e in entries) != text or text != row["response"]: print(f"tokens {[e[0] for e in entries]} vs {text!r} vs {row['response']!r}")
elif len(entries) != len(want) or any(abs(e[1] - w) > 1e-5 for e, w in zip(entries, want)):
    print(f"log-probs {[e[1] for e in entries]} vs generate's {want}")
else: print("ok")
PY
)
        [ "$status" = 200 ] && [ "$why" = ok ] && pass real_model_logprobs_greedy || fail real_model_logprobs_greedy "$status $why $got"

        # Completions, logprobs 2: lists of one length, offsets from the tokens' lengths, the
        # tokens make up the text.
        lp_text='{"prompt": "The best thing about rainy days is", "temperature": 0.8, "seed": 5, "max_tokens": 12, "logprobs": 2}'
        status=$(request POST /v1/completions "$lp_text")
        got=$(check logprobs "$tmp/body" text 1 2)
        python3 -c 'import json,sys; (t, e), = json.loads(sys.argv[1]); sys.exit(0 if e and "".join(x[0] for x in e) == t else 1)' "$got" &&
            [ "$status" = 200 ] && pass real_model_completions_logprobs || fail real_model_completions_logprobs "$status $got"
        # Streamed, the chunks' entries add up to the same (text offsets continuing).
        request POST /v1/completions "$(stream_body "$lp_text" '{"stream": true}')" -N > /dev/null
        streamed=$(check stream_logprobs "$tmp/body" text 1 2)
        why=$(check chunks_carry_their_tokens "$tmp/body" text)
        [ -n "$got" ] && [ "$streamed" = "$got" ] && [ -z "$why" ] && pass real_model_completions_logprobs_stream ||
            fail real_model_completions_logprobs_stream "$why $streamed vs $got"

        # Chat, sampled, streamed: each chunk carries its own tokens, and the entries of all
        # the chunks are the non-streamed ones; with a stop string too, where the entries
        # stop at the token the cut splits.
        lp_chat='{"messages": [{"role": "user", "content": "Tell me about cats."}], "temperature": 0.8, "seed": 9, "max_tokens": 16, "logprobs": true, "top_logprobs": 2}'
        request POST /v1/chat/completions "$lp_chat" > /dev/null
        plain=$(check logprobs "$tmp/body" chat 1 2)
        request POST /v1/chat/completions "$(stream_body "$lp_chat" '{"stream": true}')" -N > /dev/null
        streamed=$(check stream_logprobs "$tmp/body" chat 1 2)
        why=$(check chunks_carry_their_tokens "$tmp/body" chat)
        python3 -c 'import json,sys; (t, e), = json.loads(sys.argv[1]); sys.exit(0 if len(e) >= 8 and "".join(x[0] for x in e) == t else 1)' "$plain" &&
            [ "$streamed" = "$plain" ] && [ -z "$why" ] && pass real_model_chat_logprobs_stream ||
            fail real_model_chat_logprobs_stream "$why $streamed vs $plain"
        # The stop string: two characters from the middle of the answer, inside a token.
        stop=$(python3 -c 'import json,sys; (t, e), = json.loads(sys.argv[1]); n = len(t) // 2; print(json.dumps(t[n:n + 2]))' "$plain")
        request POST /v1/chat/completions "$(stream_body "$lp_chat" '{"stop": '"$stop"'}')" > /dev/null
        cut=$(check logprobs "$tmp/body" chat 1 2)
        request POST /v1/chat/completions "$(stream_body "$lp_chat" '{"stop": '"$stop"', "stream": true}')" -N > /dev/null
        streamed=$(check stream_logprobs "$tmp/body" chat 1 2)
        why=$(python3 - "$cut" "$plain" "$stop" <<'PY'
import json, sys
(text, entries), = json.loads(sys.argv[1])
(whole, all_entries), = json.loads(sys.argv[2])
stop = json.loads(sys.argv[3])
tokens = [e[0] for e in entries]
if text != whole[:whole.find(stop)]: print(f"text {text!r}, wanted the answer {whole!r} cut at {stop!r}")
elif entries != all_entries[:len(entries)]: print("the entries are not the answer's first ones")
# the last entry is the token whose text the cut splits (or ends at the cut)
elif not ("".join(tokens).startswith(text) and len("".join(tokens[:-1])) < len(text) <= len("".join(tokens))):
    print(f"tokens {tokens} for {text!r}")
else: print("ok")
PY
)
        [ "$why" = ok ] && [ "$streamed" = "$cut" ] && pass real_model_logprobs_stop_string ||
            fail real_model_logprobs_stop_string "$why; streamed $streamed vs $cut"

        # n = 2: each choice its own list, consistent with its own text; choice 0's tokens are
        # the answer of n = 1 (log-probs within float rounding: 2 rows instead of 1).
        request POST /v1/chat/completions "$(stream_body "$lp_chat" '{"n": 2}')" > /dev/null
        two=$(check logprobs "$tmp/body" chat 2 2)
        why=$(python3 - "$two" "$plain" <<'PY'
import json, sys
choices = json.loads(sys.argv[1])
(alone_text, alone), = json.loads(sys.argv[2])
if any("".join(e[0] for e in entries) != text or not entries for text, entries in choices): print("tokens vs text")
elif choices[0][0] == choices[1][0]: print("both choices are the same")
elif [e[0] for e in choices[0][1]] != [e[0] for e in alone] or any(abs(a[1] - b[1]) > 1e-4 for a, b in zip(choices[0][1], alone)):
    print("choice 0 is not the answer of n = 1")
else: print("ok")
PY
)
        [ "$why" = ok ] && pass real_model_logprobs_n_2 || fail real_model_logprobs_n_2 "$why: $two"
        unset SERVED_MODEL

        # While one request generates, a second is over --max-concurrent 1: 429. The first
        # streams up to 400 tokens (greedy, this prompt runs past 120), so it is still
        # generating whatever the machine's speed; its client hangs up after the check.
        long='{"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "temperature": 0, "max_tokens": 32}'
        curl -s -N --max-time 120 -o "$tmp/cancel.sse" --data-binary "$(stream_body "$long" '{"stream": true, "max_tokens": 400}')" \
            "http://127.0.0.1:$port/v1/chat/completions" &
        cancel_pid=$!
        busy=
        wait_in_progress 1 100 && busy=1
        status=$(request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}')
        [ -n "$busy" ] && [ "$status" = 429 ] && check error "$tmp/body" rate_limit_exceeded > /dev/null &&
            pass real_model_429 || fail real_model_429 "busy=$busy status $status"

        # A client that leaves a stream stops its generation: once it has read a few pieces
        # and hangs up, the slot frees long before 400 tokens could be generated.
        for _ in $(seq 600); do
            [ "$(cat "$tmp/cancel.sse" 2> /dev/null | grep -c '^data: ')" -ge 3 ] && break
            sleep 0.1
        done
        kill "$cancel_pid" 2> /dev/null
        wait "$cancel_pid" 2> /dev/null
        freed=
        wait_in_progress 0 40 && freed=1
        [ -n "$freed" ] && ! grep -q '^data: \[DONE\]' "$tmp/cancel.sse" && pass real_model_stream_cancel ||
            fail real_model_stream_cancel "$(cat "$tmp/body")"

        # SIGTERM while a request generates: it is answered 503, and the server exits 0.
        curl -s --max-time 120 -o "$tmp/long.body" -w '%{http_code}' --data-binary "$(stream_body "$long" '{"max_tokens": 400}')" \
            "http://127.0.0.1:$port/v1/chat/completions" > "$tmp/long.status" &
        long_pid=$!
        busy=
        wait_in_progress 1 100 && busy=1
        stop_server
        wait "$long_pid"
        [ -n "$busy" ] && [ "$stop_rc" = 0 ] && [ "$(cat "$tmp/long.status")" = 503 ] &&
            check error "$tmp/long.body" server_shutting_down > /dev/null && pass real_model_sigterm_while_busy ||
            fail real_model_sigterm_while_busy "busy=$busy exit $stop_rc, client $(cat "$tmp/long.status")"
    else
        fail real_model_server "$(tail -n 3 "$tmp/real.log")"
    fi

    # The worker's "join" lines: every batch fits --parallel 4 rows, and some request joined
    # rows that were generating (continuous batching). Prints ok or the lines.
    cat > "$tmp/joins.py" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1]) if " join" in l]
parsed = [re.match(r"serve: (\d+) requests? \((\d+) rows?\) joins? (\d+) generating rows?$", l) for l in lines]
ok = (lines and all(parsed) and all(int(m[2]) + int(m[3]) <= 4 for m in parsed)
      and any(int(m[3]) > 0 and int(m[2]) >= int(sys.argv[2]) for m in parsed))
print("ok" if ok else "".join(lines).replace("\n", "; "))
PY
    # --parallel 4 (the default): the four requests sent while a long one generates join
    # its batch as rows are free (three at once, the fourth when a row frees), each with its
    # own temperature, top-p, seed and max_tokens, and each answer is the one the request
    # gets alone.
    if start_server "$tmp/parallel.log" --model "$real_model" --max-concurrent 8 --threads 2; then
        batch_body() { echo '{"messages": [{"role": "user", "content": "Tell me about '"$1"'."}], "temperature": '"$2"', "top_p": '"$3"', "seed": '"$4"', "max_tokens": '"$5"'}'; }
        batch_bodies=("$(batch_body cats 1 1 11 12)" "$(batch_body rain 0.7 0.9 12 8)" "$(batch_body ships 1.3 1 13 16)"
                      "$(batch_body cats 0 1 14 10)")
        blocker_body='{"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "temperature": 0, "max_tokens": 128}'
        curl -s --max-time 120 -o /dev/null --data-binary "$blocker_body" \
            "http://127.0.0.1:$port/v1/chat/completions" &
        blocker=$!
        wait_in_progress 1 100
        pids=()
        for i in 0 1 2 3; do
            curl -s --max-time 120 -o "$tmp/together_$i.json" --data-binary "${batch_bodies[$i]}" \
                "http://127.0.0.1:$port/v1/chat/completions" &
            pids+=($!)
        done
        wait "${pids[@]}" "$blocker"
        joins=$(python3 "$tmp/joins.py" "$tmp/parallel.log" 1)
        for i in 0 1 2 3; do
            curl -s --max-time 120 -o "$tmp/alone_$i.json" --data-binary "${batch_bodies[$i]}" \
                "http://127.0.0.1:$port/v1/chat/completions"
        done
        python3 - "$tmp" <<'PY' && [ "$joins" = ok ] &&
import json, sys
texts = [[json.load(open(f"{sys.argv[1]}/{kind}_{i}.json"))["choices"][0]["message"]["content"] for i in range(4)]
         for kind in ("together", "alone")]
sys.exit(0 if texts[0] == texts[1] and len(set(texts[0])) == 4 else 1)
PY
            pass parallel_batch_equals_alone || fail parallel_batch_equals_alone "$joins"

        # Continuous batching: a short request sent while a long one streams is answered
        # while the long one is still generating (a static batch would hold it back until
        # the long one ended), and the long one's text is what it is alone.
        curl -s -N --max-time 120 -o "$tmp/long_stream.sse" \
            --data-binary "$(stream_body "$blocker_body" '{"stream": true, "max_tokens": 120}')" \
            "http://127.0.0.1:$port/v1/chat/completions" &
        long_pid=$!
        busy=
        wait_in_progress 1 100 && busy=1
        short_status=$(request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}')
        short_body=$(cat "$tmp/body")
        still=
        request GET /health > /dev/null
        grep -q '"requests_in_progress":1' "$tmp/body" && ! grep -q '^data: \[DONE\]' "$tmp/long_stream.sse" && still=1
        wait "$long_pid"
        curl -s --max-time 120 -o "$tmp/long_alone.json" \
            --data-binary "$(stream_body "$blocker_body" '{"max_tokens": 120}')" "http://127.0.0.1:$port/v1/chat/completions"
        python3 - "$tmp" <<'PY' && [ -n "$busy" ] && [ -n "$still" ] && [ "$short_status" = 200 ] &&
import json, sys
events = [e[len("data: "):] for e in open(f"{sys.argv[1]}/long_stream.sse").read().split("\n\n") if e.startswith("data: ")]
streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1] if json.loads(e)["choices"])
alone = json.load(open(f"{sys.argv[1]}/long_alone.json"))["choices"][0]["message"]["content"]
sys.exit(0 if events[-1] == "[DONE]" and streamed == alone and len(alone) > 200 else 1)
PY
            pass parallel_short_request_overtakes_long || fail parallel_short_request_overtakes_long \
                "busy=$busy still_generating=$still short=$short_status $short_body"

        # Embeddings beside generation: while the long answer streams again, a request of 8
        # texts is answered before the stream ends (its forwards run between decode steps),
        # with the vectors it gets from an idle server, and the stream's text is the answer
        # alone (the two share the model's activations, one after the other).
        python3 -c 'import json; print(json.dumps({"input": [f"Text number {i}: " + "the cat sat on the mat. " * (1 + i % 3) for i in range(8)]}))' \
            > "$tmp/embed_body.json"
        idle_start=$(date +%s.%N)
        request POST /v1/embeddings "@$tmp/embed_body.json" > /dev/null
        idle_seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$idle_start" "$(date +%s.%N)")
        cp "$tmp/body" "$tmp/embed_idle.json"
        curl -s -N --max-time 120 -o "$tmp/long_stream_embed.sse" \
            --data-binary "$(stream_body "$blocker_body" '{"stream": true, "max_tokens": 120}')" \
            "http://127.0.0.1:$port/v1/chat/completions" &
        long_pid=$!
        busy=
        wait_in_progress 1 100 && busy=1
        busy_start=$(date +%s.%N)
        embed_status=$(request POST /v1/embeddings "@$tmp/embed_body.json")
        cp "$tmp/body" "$tmp/embed_busy.json"
        busy_seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$busy_start" "$(date +%s.%N)")
        still=
        grep -q '^data: \[DONE\]' "$tmp/long_stream_embed.sse" || still=1
        wait "$long_pid"
        why=$(python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
events = [e[len("data: "):] for e in open(f"{tmp}/long_stream_embed.sse").read().split("\n\n") if e.startswith("data: ")]
streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1] if json.loads(e)["choices"])
alone = json.load(open(f"{tmp}/long_alone.json"))["choices"][0]["message"]["content"]
idle, busy = (json.load(open(f"{tmp}/embed_{kind}.json")) for kind in ("idle", "busy"))
worst = max(abs(a - b) for x, y in zip(idle["data"], busy["data"]) for a, b in zip(x["embedding"], y["embedding"]))
if events[-1] != "[DONE]" or streamed != alone: print(f"streamed {streamed[:80]!r} vs alone {alone[:80]!r}")
elif len(busy["data"]) != 8 or busy["usage"] != idle["usage"] or worst > 1e-6: print(f"vectors {worst:.3g} from the idle ones")
else: print("ok")
PY
)
        [ -n "$busy" ] && [ -n "$still" ] && [ "$embed_status" = 200 ] && [ "$why" = ok ] &&
            pass "parallel_embeddings_beside_generation (8 texts: ${busy_seconds} s while generating, ${idle_seconds} s idle)" ||
            fail parallel_embeddings_beside_generation "busy=$busy still_generating=$still status $embed_status: $why"

        # A request takes one row per choice: sent while a long one generates, a request
        # with n = 2 joins it (3 rows), the next (n = 2) waits until 2 rows are free, the
        # third (n = 1) waits behind it; each answers as it does alone.
        n_bodies=("$(batch_body owls 1 1 21 10 | sed 's/}$/, "n": 2}/')" "$(batch_body tea 0.8 0.9 22 8 | sed 's/}$/, "n": 2}/')"
                  "$(batch_body rain 1 1 23 6)")
        log_lines=$(wc -l < "$tmp/parallel.log")
        curl -s --max-time 120 -o /dev/null --data-binary "$blocker_body" "http://127.0.0.1:$port/v1/chat/completions" &
        blocker=$!
        queued=
        wait_in_progress 1 100 && queued=1
        pids=()
        for i in 0 1 2; do
            curl -s --max-time 120 -o "$tmp/n_together_$i.json" --data-binary "${n_bodies[$i]}" \
                "http://127.0.0.1:$port/v1/chat/completions" &
            pids+=($!)
            sleep 0.05 # in this order
        done
        wait "${pids[@]}" "$blocker"
        tail -n +"$((log_lines + 1))" "$tmp/parallel.log" > "$tmp/parallel_n.log"
        joins=$(python3 "$tmp/joins.py" "$tmp/parallel_n.log" 2)
        for i in 0 1 2; do
            curl -s --max-time 120 -o "$tmp/n_alone_$i.json" --data-binary "${n_bodies[$i]}" \
                "http://127.0.0.1:$port/v1/chat/completions"
        done
        python3 - "$tmp" <<'PY' && [ -n "$queued" ] && [ "$joins" = ok ] &&
import json, sys
texts = [[[c["message"]["content"] for c in json.load(open(f"{sys.argv[1]}/{kind}_{i}.json"))["choices"]] for i in range(3)]
         for kind in ("n_together", "n_alone")]
sys.exit(0 if texts[0] == texts[1] and [len(t) for t in texts[0]] == [2, 2, 1] and len(set(texts[0][0])) == 2 else 1)
PY
            pass parallel_batch_rows_are_choices || fail parallel_batch_rows_are_choices "queued=$queued $joins"
        stop_server
    else
        fail parallel_server "$(tail -n 3 "$tmp/parallel.log")"
    fi
fi
expect_error serve_bad_parallel "--parallel" "$bin" serve --model "$model" --parallel 0
expect_error serve_bad_prefill_chunk "--prefill-chunk must be in [0, 1048576]" "$bin" serve --model "$model" --prefill-chunk -1
expect_error serve_bad_prefill_chunk_value "--prefill-chunk" "$bin" serve --model "$model" --prefill-chunk 7x
expect_error serve_reward_model_prefill_chunk "option --prefill-chunk does not apply to --reward-model" \
    "$bin" serve --reward-model "$model" --prefill-chunk 16

# --prefill-chunk on SmolLM2: a ~390-token prompt prefilled in chunks of 7 tokens while
# another answer streams gives the greedy answer of the prompt prefilled whole
# (--prefill-chunk 0), its log-probs and top-5 alternatives within 1e-4 (6.7e-6 seen: the
# chunks attend to each other through the cache); /metrics counts the chunk forwards of
# both prompts. Then, at one token per step past --request-timeout-s 1, a prompt stops in
# the middle of its prefill: 503, fewer chunks run than it has tokens, no row left held,
# and the next request is answered.
if real_model_runs "$real_model" "serve --prefill-chunk on SmolLM2"; then
    python3 -c '
import json
s = "The keeper of the lighthouse climbed the narrow stairs each evening, trimmed the wick, wound the clockwork and watched the ships pass the reef in the failing light. "
print(json.dumps({"prompt": s * 12 + "Tell the story of the keeper:", "max_tokens": 12, "temperature": 0, "logprobs": 5}))' \
        > "$tmp/chunk_body.json"
    chunk_stream='{"prompt": "Once upon a time, in a town by the sea,", "max_tokens": 120, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}'
    whole_status= chunked_status= still=
    if start_server "$tmp/chunk_whole.log" --model "$real_model" --threads 1 --prefill-chunk 0; then
        whole_status=$(request POST /v1/completions "@$tmp/chunk_body.json")
        cp "$tmp/body" "$tmp/chunk_whole.json"
        stop_server
    fi
    if start_server "$tmp/chunk_7.log" --model "$real_model" --threads 1 --prefill-chunk 7; then
        curl -s -N --max-time 300 -o "$tmp/chunk_stream.sse" --data-binary "$chunk_stream" \
            "http://127.0.0.1:$port/v1/completions" &
        stream_pid=$!
        # Its prompt prefilled (its first token out), so that the chunks of the next are whole.
        for _ in $(seq 600); do
            grep -q '"text"' "$tmp/chunk_stream.sse" 2> /dev/null && break
            sleep 0.1
        done
        chunked_status=$(request POST /v1/completions "@$tmp/chunk_body.json")
        cp "$tmp/body" "$tmp/chunk_7.json"
        grep -q '^data: \[DONE\]' "$tmp/chunk_stream.sse" || still=1
        wait "$stream_pid"
        request GET /metrics > /dev/null
        cp "$tmp/body" "$tmp/chunk_metrics.txt"
        stop_server
    fi
    why=$(python3 - "$tmp" <<'PY'
import json, math, sys
tmp = sys.argv[1]
whole, chunked = (json.load(open(f"{tmp}/chunk_{k}.json")) for k in ("whole", "7"))
lw, lc = whole["choices"][0]["logprobs"], chunked["choices"][0]["logprobs"]
events = [e[6:] for e in open(f"{tmp}/chunk_stream.sse").read().split("\n\n") if e.startswith("data: ")]
stream_usage = [json.loads(e)["usage"] for e in events if e != "[DONE]" and json.loads(e).get("usage")]
metrics = dict(l.split() for l in open(f"{tmp}/chunk_metrics.txt").read().splitlines() if not l.startswith("#"))
prompts = [whole["usage"]["prompt_tokens"], stream_usage[0]["prompt_tokens"] if stream_usage else 0]
want_chunks = sum(math.ceil(p / 7) for p in prompts if p > 7)
worst = max([abs(a - b) for a, b in zip(lw["token_logprobs"], lc["token_logprobs"])] +
            [abs(x[k] - y[k]) for x, y in zip(lw["top_logprobs"], lc["top_logprobs"]) for k in x if k in y])
if prompts[0] < 300 or chunked["usage"] != whole["usage"]: print(f"usage {chunked['usage']} vs {whole['usage']}")
elif chunked["choices"][0]["text"] != whole["choices"][0]["text"] or lc["tokens"] != lw["tokens"]:
    print(f"text {chunked['choices'][0]['text']!r} vs {whole['choices'][0]['text']!r}")
elif any(set(x) != set(y) for x, y in zip(lw["top_logprobs"], lc["top_logprobs"])) or worst > 1e-4:
    print(f"log-probs differ by {worst:.3g}")
elif float(metrics["marlhf_prefill_chunks_total"]) != want_chunks or float(metrics["marlhf_rows_prefilling"]) != 0:
    print(f"{metrics['marlhf_prefill_chunks_total']} chunks, want {want_chunks} (prompts {prompts})")
else: print("ok")
PY
)
    [ "$whole_status" = 200 ] && [ "$chunked_status" = 200 ] && [ -n "$still" ] && [ "$why" = ok ] &&
        pass serve_prefill_chunk_equals_whole ||
        fail serve_prefill_chunk_equals_whole "status $whole_status/$chunked_status, streaming=$still: $why"

    if start_server "$tmp/chunk_1.log" --model "$real_model" --threads 1 --prefill-chunk 1 --request-timeout-s 1; then
        timeout_status=$(request POST /v1/completions "@$tmp/chunk_body.json")
        cp "$tmp/body" "$tmp/chunk_timeout.json"
        wait_in_progress 0 40
        request GET /metrics > /dev/null
        cp "$tmp/body" "$tmp/chunk_timeout_metrics.txt"
        after_status=$(request POST /v1/completions '{"prompt": "Hello", "max_tokens": 2}')
        why=$(python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
error = json.load(open(f"{tmp}/chunk_timeout.json"))["error"]
metrics = dict(l.split() for l in open(f"{tmp}/chunk_timeout_metrics.txt").read().splitlines() if not l.startswith("#"))
chunks = float(metrics["marlhf_prefill_chunks_total"])
if error["code"] != "timeout": print(f"error {error}")
elif not 1 <= chunks < 300: print(f"{chunks} chunks ran")
elif any(float(metrics[k]) != 0 for k in ("marlhf_rows_prefilling", "marlhf_rows_generating", "marlhf_requests_in_progress")):
    print(f"metrics {metrics}")
else: print("ok")
PY
)
        stop_server
        [ "$timeout_status" = 503 ] && [ "$after_status" = 200 ] && [ "$why" = ok ] &&
            pass serve_prefill_chunk_timeout_mid_prefill ||
            fail serve_prefill_chunk_timeout_mid_prefill "status $timeout_status, then $after_status: $why"
    else
        fail serve_prefill_chunk_timeout_mid_prefill "$(tail -n 3 "$tmp/chunk_1.log")"
    fi
fi
[ "$failures" -eq 0 ]
