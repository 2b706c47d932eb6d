#!/usr/bin/env python3
"""Writes tests/fixtures/chat_data/cases.json for tests/test_chat_data.c.

Run with the tools environment:
    .venv-tools/bin/python tools/make_chat_data_fixtures.py [models/SmolLM2-135M-Instruct.Q4_1.gguf]
The output is deterministic.

Why: marlhf reads TRL's conversational dataset formats (lists of {role, content}
messages) and renders them with the model's chat template (src/data/chat_data.c). The
reference here is transformers' apply_chat_template, applied by the rules of TRL's
trl/data_utils.py: maybe_extract_prompt (implicit-prompt preference pairs) and
maybe_apply_chat_template (prompt with add_generation_prompt=True; each response the text
apply_chat_template(prompt + response) adds after the prompt's text), with the row's
tools (TRL's "tools" column) passed to every rendering. Those two functions' rules are
written out below (extract_prompt, apply_template), following TRL's code (TRL 1.12 is now in
the tools environment: tools/make_implicit_prompt_fixtures.py calls it directly).
SFT's {"messages"} rows are split as marlhf documents it (prompt = the messages before the
last assistant message, response = that message; TRL's SFTTrainer instead trains on the
whole conversation unless assistant_only_loss).

Token ids are what TRL's DPOTrainer.tokenize_row feeds the model: the rendered prompt and
each response tokenized on their own with add_special_tokens=False (the template wrote
the BOS), then the tokenizer's EOS after the response (marlhf's tokenize_example adds it
too). Two tokenizers:
  smollm2    SmolLM2-135M-Instruct's, built from the GGUF in models/ by transformers' own
             GGUF tokenizer converter (its GGUF reader needs PyTorch, so the metadata is
             read with the gguf package); with SmolLM2's own template (read from the GGUF).
  tiny_chat  tests/fixtures/models/tiny_chat's tokenizer.json, a tokenizer that adds BOS
             (<|begin_of_text|>, id 0) with add_special_tokens=True, with Llama 3's
             template: the case where a second BOS would appear if the prompt were
             tokenized with the special tokens.
For each case the script also checks that tokenizing prompt + response as one text gives
the same ids as the two parts (so SFT's whole-text tokenization in TRL agrees).

cases.json: {"cases": [{name, template (marlhf's name), tokenizer, row (the JSON row as
a file line), expected: {prompt, chosen, rejected} (null where absent), ids: {prompt,
chosen, rejected}, and for {"messages"} rows turns: {texts, ids, trained}}]}: SFT's
--assistant-only-loss pieces (turns_of), the whole conversation's ids with EOS, and which
of them are trained, from the tokenizer's character offsets (turn_ids); and whole: {text,
ids}: SFT's --completion-only-loss false, the whole conversation (the messages after the last
assistant message too) as TRL's SFTTrainer renders it, and its ids as marlhf builds them
(the prompt's, then the rest of the text's, then EOS; with SmolLM2's tokenizer checked to be
the whole text's, which is what TRL tokenizes).
"""
import json
import sys
from pathlib import Path

import gguf
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING, _SPECIAL_TOKENS,
                                                                    convert_gguf_tokenizer)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat_data" / "cases.json"
CHAT_CASES = ROOT / "tests" / "fixtures" / "chat_templates" / "cases.json"


def gguf_field(reader, key):
    field = reader.fields.get(key)
    if field is None:
        return None
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [field.parts[i].tobytes().decode("utf-8") if field.types[-1] == gguf.GGUFValueType.STRING
                else field.parts[i].tolist()[0] for i in field.data]
    value = field.parts[field.data[0]]
    return value.tobytes().decode("utf-8") if field.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]


def smollm2_tokenizer(gguf_path):
    reader = gguf.GGUFReader(gguf_path)
    metadata = {key: gguf_field(reader, key) for key in reader.fields if key.startswith("tokenizer.") or key == "general.architecture"}
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                      if f"tokenizer.{key}" in metadata}
    backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    special = {name: tokenizer_dict["tokens"][metadata[f"tokenizer.ggml.{key}"]]
               for name, key in _SPECIAL_TOKENS.items() if metadata.get(f"tokenizer.ggml.{key}") is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    tok.chat_template = metadata["tokenizer.chat_template"]
    return tok


def tiny_chat_tokenizer(template_source):
    folder = ROOT / "tests" / "fixtures" / "models" / "tiny_chat"
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tok.chat_template = template_source
    return tok


# --- TRL's rules (trl/data_utils.py), written out -------------------------------------

def extract_prompt(example):
    """maybe_extract_prompt for an implicit-prompt pair of message lists."""
    chosen, rejected = example["chosen"], example["rejected"]
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            break
    return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}


def split_messages(messages):
    """marlhf's SFT rule for {"messages"}: the last assistant message is the response."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return {"prompt": messages[:last], "chosen": [messages[last]]}


def apply_template(example, tok):
    """maybe_apply_chat_template: a prompt that ends with a user or tool message gets the
    generation prompt; one that ends with an assistant message is continued
    (continue_final_message). The row's tools go to every rendering (TRL's trainers pass
    tools=example.get("tools"), `or None`)."""
    continued = example["prompt"][-1]["role"] == "assistant"
    assert continued or example["prompt"][-1]["role"] in ("user", "tool")
    tools = example.get("tools") or None
    kwargs = example.get("chat_template_kwargs") or {}
    prompt = tok.apply_chat_template(example["prompt"], tools=tools, tokenize=False, add_generation_prompt=not continued,
                                     continue_final_message=continued, **kwargs)
    out = {"prompt": prompt, "chosen": None, "rejected": None}
    for key in ("chosen", "rejected"):
        if key in example:
            full = tok.apply_chat_template(example["prompt"] + example[key], tools=tools, tokenize=False, **kwargs)
            assert full.startswith(prompt), (key, full, prompt)
            out[key] = full[len(prompt):]
    return out


def turns_of(messages, tok, tools=None, kwargs=None):
    """SFT --assistant-only-loss: the conversation cut before and after each assistant message
    that follows another message, up to the last one (marlhf's data/chat_data.c rule); the
    odd-numbered pieces are the trained turns."""
    pieces, rendered = [], ""
    for i, message in enumerate(messages):
        if i == 0 or message["role"] != "assistant":
            continue
        leading = tok.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True,
                                          **(kwargs or {}))
        through = tok.apply_chat_template(messages[:i + 1], tools=tools, tokenize=False, **(kwargs or {}))
        assert leading.startswith(rendered) and through.startswith(leading), (i, rendered, leading, through)
        pieces += [leading[len(rendered):], through[len(leading):]]
        rendered = through
    return pieces


def whole_conversation(row, prompt, tok, whole_text_check):
    """SFT's --completion-only-loss false on a {"messages"} row: TRL's SFTTrainer renders the
    whole conversation (apply_chat_template(messages), no generation prompt) and trains every
    token. marlhf keeps the last-turn prompt and makes the response the rest of that text."""
    text = tok.apply_chat_template(parsed_arguments(row["messages"]), tools=row_tools(row) or None, tokenize=False,
                                   **(row.get("chat_template_kwargs") or {}))
    assert text.startswith(prompt), (text, prompt)
    out = ids(tok, prompt, False) + ids(tok, text[len(prompt):], True)
    if whole_text_check:
        assert out == ids(tok, text, True), text
    return {"text": text, "ids": out}


def turn_ids(tok, pieces, whole_text_check):
    """The pieces tokenized one by one (add_special_tokens=False), then EOS, and which tokens
    are trained: those of odd-numbered pieces, and the EOS. With whole_text_check (a real
    tokenizer, whose chat markers are special tokens) the conversation tokenized as one text
    must give the same ids, and the trained tokens must be those whose characters lie in an
    odd-numbered piece by the tokenizer's offsets. The tiny test tokenizer has no special
    tokens for Llama 3's markers, so "<|eot_id|><|start_header_id|>" merges across a piece
    boundary there: it is checked piece by piece only."""
    ids, trained = [], []
    for k, piece in enumerate(pieces):
        piece_ids = tok(piece, add_special_tokens=False)["input_ids"]
        ids += piece_ids
        trained += [k % 2] * len(piece_ids)
    if whole_text_check:
        encoded = tok("".join(pieces), add_special_tokens=False, return_offsets_mapping=True)
        spans, start = [], 0
        for k, piece in enumerate(pieces):
            if k % 2 == 1:
                spans.append((start, start + len(piece)))
            start += len(piece)
        by_offsets = [int(any(a <= begin and end <= b for a, b in spans)) for begin, end in encoded["offset_mapping"]]
        assert encoded["input_ids"] == ids and by_offsets == trained, pieces
    return ids + [tok.eos_token_id], trained + [1]


def row_tools(row):
    """The row's tools as TRL's trainers take them: json.loads of a string."""
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def parsed_arguments(messages):
    """marlhf's rule for a tool call whose arguments are a string holding a JSON object: the
    template renders the object (as marlhf serve and vLLM render a request's), where TRL would
    hand it the string. The reference is rendered from the parsed object."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                                    if isinstance(c["function"]["arguments"], str) else c for c in m["tool_calls"]])
        out.append(m)
    return out


def normalise(row):
    """The row's message lists as prompt / chosen / rejected (unpaired: by label), with its tools."""
    row = {k: parsed_arguments(v) if isinstance(v, list) and k != "tools" else v for k, v in row.items()}
    example = normalise_messages(row)
    example["tools"] = row_tools(row)
    example["chat_template_kwargs"] = row.get("chat_template_kwargs")
    return example


def normalise_messages(row):
    if "messages" in row:
        return split_messages(row["messages"])
    if "prompt" not in row:
        return extract_prompt(row)
    example = {"prompt": row["prompt"]}
    if "completion" in row and "label" in row:
        example["chosen" if row["label"] else "rejected"] = row["completion"]
    elif "completion" in row:
        example["chosen"] = row["completion"]
    for key in ("chosen", "rejected"):
        if key in row:
            example[key] = row[key]
    return example


def ids(tok, text, response):
    if text is None:
        return None
    out = tok(text, add_special_tokens=False)["input_ids"]
    return out + [tok.eos_token_id] if response else out


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


ROWS = [
    ("sft_messages", {"messages": [{"role": "system", "content": "Answer briefly."}, user("What is the capital of France?"),
                                   assistant("Paris."), user("And of Italy?"), assistant("Rome.")]}),
    # An assistant message first (context: nothing before it to answer), two assistant messages
    # in a row, and a user message after the last assistant message (left out).
    ("sft_messages_edges", {"messages": [assistant("Hello! Ask me anything."), user("Count to two."), assistant("One."),
                                         assistant("Two."), user("Thanks."), assistant("You're welcome."), user("Bye.")]}),
    ("sft_prompt_completion", {"prompt": [user("Name a colour.")], "completion": [assistant("Blue, like the sky.")]}),
    ("pairs_explicit", {"prompt": [user("Is the sea salty?")], "chosen": [assistant("Yes, it holds dissolved salts.")],
                        "rejected": [assistant("No.")]}),
    ("pairs_implicit", {"chosen": [user("Hi!"), assistant("Hello, how can I help?"), user("Tell me a joke."),
                                   assistant("Why did the chicken cross the road?")],
                        "rejected": [user("Hi!"), assistant("Hello, how can I help?"), user("Tell me a joke."),
                                     assistant("No.")]}),
    ("unpaired_true", {"prompt": [user("2 + 2 = ?")], "completion": [assistant("4")], "label": True}),
    ("unpaired_false", {"prompt": [user("2 + 2 = ?")], "completion": [assistant("5")], "label": False}),
    ("prompt_only", {"prompt": [{"role": "system", "content": "You are terse."}, user("Say hi in French.")]}),
    # A prompt that ends with an assistant message: continued (continue_final_message), its
    # trailing space kept where the template keeps it; the completion follows as a new turn.
    ("prompt_continued", {"prompt": [user("What is 2 + 2?"), assistant("The answer is ")],
                          "completion": [assistant("4.")]}),
    ("pairs_continued", {"prompt": [user("Finish the line: roses are red,"), assistant("  Violets are")],
                         "chosen": [assistant("blue.")], "rejected": [assistant("green.")]}),
]


def function_tool(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


WEATHER = function_tool("get_weather", "The weather now in a city.",
                        {"city": {"type": "string", "description": "The city's name."}}, ["city"])
LIGHT = function_tool("control_light", "Turns a room's light on or off.",
                      {"room": {"type": "string"}, "state": {"type": "string", "enum": ["on", "off"]}}, ["room", "state"])


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool(text):
    return {"role": "tool", "content": text}


# Tool-calling rows (TRL's "tools" column, assistant messages with "tool_calls", "tool"
# messages), rendered with the two tool-calling template families marlhf renders tools for.
TOOL_ROWS = [
    # TRL's documented language-modeling form: the call without content, the tool's answer,
    # the final reply.
    ("tools_messages", {"messages": [user("Turn on the living room lights."),
                                     {"role": "assistant", "tool_calls": [call("control_light",
                                                                                {"room": "living room", "state": "on"})]},
                                     {"role": "tool", "name": "control_light", "content": "The lights are now on."},
                                     assistant("Done!")],
                        "tools": [LIGHT]}),
    # A prompt that ends with the tool's answer (generation prompt), the tools as a JSON
    # string (TRL decodes it), the call's arguments a string holding an object (OpenAI's
    # fine-tuning form; rendered as the object) and content null.
    ("tools_prompt_completion", {"prompt": [user("What is the weather in Paris?"),
                                            {"role": "assistant", "content": None,
                                             "tool_calls": [{"id": "call_1", "type": "function",
                                                             "function": {"name": "get_weather",
                                                                          "arguments": "{\"city\": \"Paris\"}"}}]},
                                            tool("18 degrees, sunny")],
                                 "completion": [assistant("It is 18 degrees and sunny in Paris.")],
                                 "tools": json.dumps([WEATHER])}),
    # A preference pair: calling the tool against refusing.
    ("tools_pairs", {"prompt": [user("Is it raining in Oslo?")],
                     "chosen": [{"role": "assistant", "tool_calls": [call("get_weather", {"city": "Oslo"})]}],
                     "rejected": [assistant("I cannot know that.")],
                     "tools": [WEATHER, LIGHT]}),
    # Tool messages without tools (a conversation's history), and an empty tools list (no tools).
    ("tools_history_only", {"prompt": [user("Lights?"),
                                       {"role": "assistant", "tool_calls": [call("control_light",
                                                                                 {"room": "hall", "state": "off"})]},
                                       tool("off")],
                            "completion": [assistant("The hall light is off.")], "tools": []}),
]
# Two calls in one message: Qwen's templates write both; Llama 3.1's raises.
QWEN_TOOL_ROWS = [
    ("tools_two_calls", {"prompt": [user("Weather in Rome and Oslo?")],
                         "completion": [{"role": "assistant", "content": "Checking both.",
                                         "tool_calls": [call("get_weather", {"city": "Rome"}),
                                                        call("get_weather", {"city": "Oslo"})]}],
                         "tools": [WEATHER]}),
]


# TRL's per-row chat_template_kwargs: Qwen3's enable_thinking (off: the generation prompt
# closes an empty think block) and Llama 3.1's date_string. With thinking off the prompt
# ends in "</think>\n\n", and SmolLM2's pre-tokenizer splits "\n\nHello" of the whole text
# as "\n" + "\nHello": the answers start with a space, so that the prompt's tokens are the
# start of the whole text's (the check below) as they are for Qwen3's own tokenizer.
QWEN3_KWARGS_ROWS = [
    ("thinking_off_messages", {"messages": [user("Hi!"), assistant(" Hello, how can I help?")],
                               "chat_template_kwargs": {"enable_thinking": False}}),
    # A word, not "4": "\n\n4" is "\n\n" "4" for SmolLM2's own pre-tokenizer (digits split off
    # first; marlhf and llama.cpp agree on the GGUF) but "\n" "\n" "4" for the tokenizer
    # transformers' GGUF converter builds here (src/tokenizer/load_gguf.c).
    ("thinking_on_completion", {"prompt": [user("2 + 2 = ?")], "completion": [assistant("Four.")],
                                "chat_template_kwargs": {"enable_thinking": True}}),
    ("thinking_off_pairs", {"prompt": [user("Capital of Italy?")], "chosen": [assistant(" Rome.")],
                            "rejected": [assistant(" Milan.")], "chat_template_kwargs": {"enable_thinking": False}}),
]
LLAMA31_KWARGS_ROWS = [
    ("date_string", {"prompt": [user("What day is it?")], "completion": [assistant("Thursday.")],
                     "chat_template_kwargs": {"date_string": "03 Dec 2026"}}),
    # tools_in_user_message false: the tools in the system turn, after the date and before
    # the system message; the first user message stays its own turn.
    ("tools_in_system", {"prompt": [{"role": "system", "content": "Be brief."}, user("Is it raining in Oslo?")],
                         "completion": [{"role": "assistant", "tool_calls": [call("get_weather", {"city": "Oslo"})]}],
                         "tools": [WEATHER], "chat_template_kwargs": {"tools_in_user_message": False}}),
]


def main():
    gguf_path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    templates = {t["id"]: t for t in json.loads(CHAT_CASES.read_text())["templates"]}
    smollm2_with_qwen = smollm2_tokenizer(gguf_path)
    smollm2_with_qwen.chat_template = templates["qwen2.5"]["source"]
    smollm2_with_qwen3 = smollm2_tokenizer(gguf_path)
    smollm2_with_qwen3.chat_template = templates["qwen3"]["source"]
    tokenizers = {
        ("smollm2", "smollm2"): (smollm2_tokenizer(gguf_path), ROWS),
        ("llama3", "tiny_chat"): (tiny_chat_tokenizer(templates["llama3"]["source"]), ROWS),
        # The tool rows: Qwen2.5's template on SmolLM2's tokenizer (its ChatML markers are
        # special tokens), Llama 3.1's on the tiny one.
        ("qwen2.5", "smollm2"): (smollm2_with_qwen, TOOL_ROWS + QWEN_TOOL_ROWS),
        ("llama3.1", "tiny_chat"): (tiny_chat_tokenizer(templates["llama3.1"]["source"]),
                                    TOOL_ROWS + LLAMA31_KWARGS_ROWS),
        ("qwen3", "smollm2"): (smollm2_with_qwen3, QWEN3_KWARGS_ROWS),
    }
    cases = []
    for (template, tokenizer_name), (tok, rows) in tokenizers.items():
        for name, row in rows:
            rendered = apply_template(normalise(row), tok)
            case_ids = {"prompt": ids(tok, rendered["prompt"], False)}
            for key in ("chosen", "rejected"):
                case_ids[key] = ids(tok, rendered[key], True)
                if rendered[key] is not None:
                    whole = tok(rendered["prompt"] + rendered[key], add_special_tokens=False)["input_ids"]
                    assert whole == case_ids["prompt"] + case_ids[key][:-1], (name, key)
            case = {"name": f"{template}/{name}", "template": template, "tokenizer": tokenizer_name,
                    "row": json.dumps(row, ensure_ascii=False), "expected": rendered, "ids": case_ids}
            if "messages" in row:
                pieces = turns_of(parsed_arguments(row["messages"]), tok, row_tools(row) or None,
                                  row.get("chat_template_kwargs"))
                whole, trained = turn_ids(tok, pieces, tokenizer_name == "smollm2")
                case["turns"] = {"texts": pieces, "ids": whole, "trained": trained}
                case["whole"] = whole_conversation(row, rendered["prompt"], tok, tokenizer_name == "smollm2")
            cases.append(case)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
