#!/usr/bin/env python3
"""Write tests/fixtures/constraints/json_recursive.json: JSON Schemas that pydantic emits for
self-referencing models, tuples and date / time / uuid fields, with texts labelled by
pydantic itself (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_json_recursive_fixtures.py

For each model: its model_json_schema() (what a pydantic user sends as response_format),
and texts, each [text, valid]:
  - random instances of the model (trees, linked lists, comment threads, arithmetic
    expressions a few levels deep; dates, times with offsets, date-times, UUIDs, tuples),
    written as json.dumps writes them (the default separators or compact), each checked
    valid by pydantic (strict mode);
  - one-byte edits and truncations of those, labelled by pydantic's strict validation
    (model_validate_json, strict=True), so that many are nearly valid; "canonical" when
    the edited text is spelled as json.dumps spells it and the edit is not inside a
    date / time / uuid string (where marlhf is documented narrower than pydantic).
tests/test_json_recursive.c checks that marlhf accepts every generated text (and every
prefix of it stays alive) and every canonical edited text pydantic calls valid (so that it
refuses no byte of those), and that every text marlhf accepts is one pydantic calls valid.
Pydantic validates the model, which the schema describes: where pydantic is more lenient
than the schema (a time without offset, 7 fraction digits) the check is one-sided only.
"""
import datetime
import json
import os
import random
import uuid
from typing import List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict


class Tree(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int
    children: List["Tree"] = []


class ListNode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    next: Optional["ListNode"] = None


class Comment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: uuid.UUID
    author: str
    posted: datetime.datetime
    replies: List["Comment"] = []


class Num(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["num"]
    value: int


class Add(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["add"]
    left: Union[Num, "Add"]
    right: Union[Num, "Add"]


class Formula(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expr: Union[Num, Add]


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    day: datetime.date
    at: datetime.time
    when: datetime.datetime
    id: uuid.UUID
    xy: Tuple[int, str]
    rest: Tuple[float, ...]
    pair: Tuple[int, Tuple[str, bool]]


rng = random.Random(20261202)
WORDS = ["a", "bo", "caf\u00e9", "x y", "q\"t", "\u20ac", "line\nbreak", ""]


def rand_date():
    while True:
        y, m, d = rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 31)
        if rng.random() < 0.2:
            m, d = 2, 29
        try:
            return datetime.date(y, m, d).isoformat()
        except ValueError:
            continue


def rand_offset():
    if rng.random() < 0.4:
        return "Z"
    return "%s%02d:%02d" % (rng.choice("+-"), rng.randint(0, 23), rng.randint(0, 59))


def rand_time():
    text = "%02d:%02d:%02d" % (rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
    if rng.random() < 0.5:
        text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6)))
    return text + rand_offset()


def rand_uuid():
    text = str(uuid.UUID(int=rng.getrandbits(128)))
    return text.upper() if rng.random() < 0.3 else text


def tree(depth):
    return {"value": rng.randint(-99, 999),
            "children": [tree(depth - 1) for _ in range(rng.randint(0, 2))] if depth > 0 else []}


def linked(length):
    node = {"label": rng.choice(WORDS), "next": None}
    if length > 1:
        node["next"] = linked(length - 1)
    return node


def comment(depth):
    return {"id": rand_uuid(), "author": rng.choice(WORDS), "posted": rand_date() + "T" + rand_time(),
            "replies": [comment(depth - 1) for _ in range(rng.randint(0, 2))] if depth > 0 else []}


def expr(depth):
    if depth == 0 or rng.random() < 0.3:
        return {"op": "num", "value": rng.randint(0, 50)}
    return {"op": "add", "left": expr(depth - 1), "right": expr(depth - 1)}


def event():
    return {"day": rand_date(), "at": rand_time(), "when": rand_date() + "T" + rand_time(), "id": rand_uuid(),
            "xy": [rng.randint(-5, 5), rng.choice(WORDS)],
            "rest": [rng.choice([1, 2.5, -0.125, 3e5]) for _ in range(rng.randint(0, 3))],
            "pair": [rng.randint(0, 9), [rng.choice(WORDS), rng.random() < 0.5]]}


OPTIONAL = ("children", "next", "replies")  # the keys with defaults: not required by the schema


def drop_optional(value):
    """Leaves out, at random, optional keys whose value is the default."""
    if isinstance(value, dict):
        return {k: drop_optional(v) for k, v in value.items()
                if not (k in OPTIONAL and v in ([], None) and rng.random() < 0.5)}
    if isinstance(value, list):
        return [drop_optional(v) for v in value]
    return value


MODELS = [
    ("tree", Tree, lambda: tree(rng.randint(0, 4))),
    ("linked_list", ListNode, lambda: linked(rng.randint(1, 8))),
    ("comments", Comment, lambda: comment(rng.randint(0, 3))),
    ("formula", Formula, lambda: {"expr": expr(rng.randint(0, 5))}),
    ("event", Event, event),
]

PIECES = ["{", "}", "[", "]", ",", ":", "\"", "0", "9", "-", ".", "T", "Z", "null", "true", " ", "a", "e", "+"]


def dumps(value, rand=rng):
    """As json.dumps writes it, with the default separators or compact (drawn from rand)."""
    if rand.random() < 0.5:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def mutants(text, rand=rng, pieces=PIECES, count=8):
    """One-byte edits and truncations of text, each with the position of the edit
    (tools/make_json_bounds_fixtures.py uses it too, with its own pieces)."""
    out = []
    for _ in range(count):
        i = rand.randrange(len(text) + 1)
        kind = rand.randrange(4)
        if kind == 0 and i < len(text):
            out.append((text[:i] + text[i + 1:], i))
        elif kind == 1:
            out.append((text[:i] + rand.choice(pieces) + text[i:], i))
        elif kind == 2 and i < len(text):
            out.append((text[:i] + rand.choice(pieces) + text[i + 1:], i))
        else:
            out.append((text[:i], i))
    return out


FORMAT_KEYS = ("day", "at", "when", "id", "posted")  # the fields whose schema has a format


def in_format_value(text, position):
    """Whether position falls inside (or at the quotes of) the string value of a format
    field in text (a valid JSON text): marlhf's formats are narrower than pydantic's
    parsers there (docs/serving.md), so an edit there may be valid for pydantic only."""
    stack, key, after_colon = [], None, False  # stack: "{" or "[" of the open containers
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            start = i
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if stack and stack[-1] == "{" and not after_colon:
                key = json.loads(text[start:i + 1])
            elif stack and stack[-1] == "{" and key in FORMAT_KEYS and start <= position <= i:
                return True
        elif ch in "{[":
            stack.append(ch)
            after_colon = False
        elif ch in "}]":
            stack.pop()
        elif ch == ":":
            after_colon = True
        elif ch == ",":
            after_colon = False
        i += 1
    return False


def canonical(text, original, position):
    """The text is spelled as json.dumps spells it (either separators), and its edit is not
    inside a format field's string: where pydantic calls such a text valid, marlhf must
    accept it."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    spelled = text in (json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return spelled and not in_format_value(original, position)


def valid(model, text):
    try:
        model.model_validate_json(text, strict=True)
        return True
    except Exception:
        return False


def main():
    cases = []
    for name, model, make in MODELS:
        texts, seen = [], set()
        for _ in range(25):
            text = dumps(drop_optional(make()))
            assert valid(model, text), (name, text)
            if text not in seen:
                seen.add(text)
                texts.append([text, True, "generated"])
        for text, _, _ in list(texts):
            for edited, position in mutants(text):
                if edited not in seen:
                    seen.add(edited)
                    texts.append([edited, valid(model, edited), "canonical" if canonical(edited, text, position) else "edited"])
        cases.append({"name": name, "schema": model.model_json_schema(), "texts": texts})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "constraints", "json_recursive.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, sum(len(c["texts"]) for c in cases), "texts")


if __name__ == "__main__":
    main()
