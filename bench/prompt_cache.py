"""Load for bench/run_prompt_cache.sh: one chat of TURNS turns, each a user message after
the conversation so far (a system prompt of about 280 tokens, then every earlier message
and answer), greedy, MAX_TOKENS new tokens per answer.

  prompt_cache.py client URL ...    against marlhf serve (with or without --prompt-cache)
  prompt_cache.py llamacpp GGUF ... the same chat through llama-cpp-python in this process
                                    (it keeps the previous call's tokens and computes only
                                    what follows their common prefix)

Prints one JSON line: the seconds of each turn, their total, the prompt tokens of the last
turn and (marlhf) the tokens each turn took from the cache."""
import argparse
import json
import time
import urllib.request

SYSTEM = ("You are a patient assistant for a small public library. " * 3 + "You answer questions about opening "
          "hours, borrowing rules, the reading room, events for children, the local history collection, "
          "interlibrary loans, printing and scanning, study rooms, accessibility, lost cards and late fees. " * 5)
QUESTIONS = ["When is the library open on Saturdays?", "Can I borrow ten books at once?",
             "How do I book a study room?", "What happens if I return a book late?",
             "Is there a story hour for children?", "Can I print in colour?"]


def chat_client(url, messages, max_tokens):
    data = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    usage = answer["usage"]
    return (answer["choices"][0]["message"]["content"], usage["prompt_tokens"],
            usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["client", "llamacpp"])
ap.add_argument("target")
ap.add_argument("--impl", required=True)
ap.add_argument("--turns", type=int, default=6)
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
if args.mode == "llamacpp":
    import llama_cpp
    llm = llama_cpp.Llama(model_path=args.target, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                          verbose=False)

    def chat(messages):
        answer = llm.create_chat_completion(messages=messages, max_tokens=args.max_tokens, temperature=0)
        return answer["choices"][0]["message"]["content"], answer["usage"]["prompt_tokens"], None
else:
    def chat(messages):
        return chat_client(args.target, messages, args.max_tokens)

messages = [{"role": "system", "content": SYSTEM}]
seconds, cached, prompt_tokens = [], [], 0
for turn in range(args.turns):
    messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
    start = time.perf_counter()
    text, prompt_tokens, cached_tokens = chat(messages)
    seconds.append(round(time.perf_counter() - start, 3))
    cached.append(cached_tokens)
    messages.append({"role": "assistant", "content": text})
print(json.dumps({"impl": args.impl, "turns": args.turns, "max_tokens": args.max_tokens, "turn_seconds": seconds,
                  "total_s": round(sum(seconds), 2), "last_prompt_tokens": prompt_tokens,
                  "cached_tokens": cached if args.mode == "client" else None, "threads": args.threads}))
