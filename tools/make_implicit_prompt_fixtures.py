#!/usr/bin/env python3
"""Writes tests/fixtures/data/implicit_pairs.jsonl and implicit_pairs_expected.json for
tests/test_data.c.

Run with the tools environment:  .venv-tools/bin/python tools/make_implicit_prompt_fixtures.py
The output is deterministic.

Why: a preference row without its prompt (TRL's "implicit prompt" form, and the raw
Anthropic/hh-rlhf files: {"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...", "rejected": ...})
is split by TRL's maybe_extract_prompt (trl/data_utils.py): the prompt is the longest
common prefix of chosen and rejected, in characters; a space just before the first
difference goes to the responses; when one string is a prefix of the other, the last shared
character goes to the responses. A "prompt" field of the other kind than the responses
(a string beside message lists, or a list beside strings) is not used. marlhf's
src/data/adapters.c does the same in C, on UTF-8 bytes, so the cases include characters that
share their leading bytes. The reference is TRL itself, imported here.

implicit_pairs.jsonl: the rows (a data file marlhf loads).
implicit_pairs_expected.json: {"rows": [{prompt, chosen, rejected}]}, one per row, each a
string or a list of messages, as maybe_extract_prompt returns them.
"""
import json
from pathlib import Path

from trl.data_utils import maybe_extract_prompt

FOLDER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "data"

HUMAN, ASSISTANT = "\n\nHuman: ", "\n\nAssistant: "


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


ROWS = [
    # Anthropic/hh-rlhf's raw form: the responses differ right after "Assistant: ", whose
    # space goes to them.
    {"chosen": HUMAN + "What tea helps me sleep?" + ASSISTANT + "Chamomile is a common choice.",
     "rejected": HUMAN + "What tea helps me sleep?" + ASSISTANT + "I don't know."},
    # Two turns, the responses sharing their first words: the prompt runs into them.
    {"chosen": HUMAN + "Hi" + ASSISTANT + "Hello!" + HUMAN + "What colour is the sky?" + ASSISTANT + "It is blue.",
     "rejected": HUMAN + "Hi" + ASSISTANT + "Hello!" + HUMAN + "What colour is the sky?" + ASSISTANT + "It is green."},
    # A difference inside a word.
    {"chosen": "Q: a pet?\nA: cat", "rejected": "Q: a pet?\nA: car"},
    # Characters that share their leading bytes: U+00E9 and U+00E8 (C3 A9, C3 A8), and two
    # four-byte emoji (F0 9F 8D B5, F0 9F 8D B6) after a space.
    {"chosen": "Le caf\u00e9", "rejected": "Le caf\u00e8"},
    {"chosen": "Tea: \U0001F375 yes", "rejected": "Tea: \U0001F376 no"},
    {"chosen": "\u65e5\u672c\u8a9e\u3067\u3059", "rejected": "\u65e5\u672c\u8aac\u3067\u3059"},  # E8 AA 9E, E8 AA AC
    # One string a prefix of the other, and two equal strings: Python's loop ends on its
    # last index, so the last shared character goes to the responses.
    {"chosen": "Say hi", "rejected": "Say hi there"},
    {"chosen": "Same answer", "rejected": "Same answer"},
    {"chosen": "Tea \U0001F375", "rejected": "Tea \U0001F375 is hot"},
    # An explicit text prompt is kept as it is.
    {"prompt": "Q: 2 + 2?\nA:", "chosen": " 4", "rejected": " 5"},
    # A prompt of the other kind is not this pair's prompt: it is extracted.
    {"prompt": [user("Ignored?")], "chosen": "Q: sum?\nA: 4", "rejected": "Q: sum?\nA: 5"},
]

CONVERSATIONAL_ROWS = [
    {"prompt": "What colour is the sky?",
     "chosen": [user("What colour is the sky?"), assistant("It is blue.")],
     "rejected": [user("What colour is the sky?"), assistant("It is green.")]},
]


def write(rows, stem):
    expected = []
    for row in rows:
        split = maybe_extract_prompt(dict(row))
        expected.append({key: split[key] for key in ("prompt", "chosen", "rejected")})
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (FOLDER / f"{stem}.jsonl").write_text(lines, encoding="utf-8")
    (FOLDER / f"{stem}_expected.json").write_text(json.dumps({"rows": expected}, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")


def main():
    # A file's rows are all text or all messages, so the two kinds are two files.
    write(ROWS, "implicit_pairs")
    write(CONVERSATIONAL_ROWS, "implicit_pairs_messages")


if __name__ == "__main__":
    main()
