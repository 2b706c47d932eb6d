#!/usr/bin/env python3
"""Write tests/fixtures/constraints/json_bounds.json: JSON Schemas that pydantic emits for
models with numeric bounds (Field(ge=, le=, gt=, lt=) on int and float fields, integer and
fractional bounds) and
documented enum fields (a `$ref` beside `description` / `default` / `deprecated`), with
texts labelled by pydantic itself (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_json_bounds_fixtures.py

For each model: its model_json_schema() and texts, each [text, valid, kind]:
  - "generated": random instances (values at the bounds' edges, just inside them, and
    anywhere between; floats with up to 6 decimals), written as json.dumps writes them
    (either separators), each checked valid by pydantic (strict mode);
  - one-byte edits and truncations of those, and the same instances with one bounded
    field's value replaced by a probe (the bound, one past it, the bound +-0.5, -0,
    -0.0, 0.0, exponent forms, leading zeros, 19-digit integers), labelled by pydantic's
    strict validation (model_validate_json, strict=True); "canonical" when the text is
    spelled as json.dumps spells it and its numbers are within marlhf's documented limits
    (no exponent under bounds, an integer within int64, a number's integer part at most 18
    digits: docs/serving.md), else "edited".
tests/test_json_bounds.c checks that marlhf accepts every generated text (every prefix
alive) and every canonical text pydantic calls valid, and that every text marlhf accepts is
one pydantic calls valid.
"""
import json
import os
import random
from enum import Enum
from typing import List, Optional

from pydantic import BaseModel, ConfigDict, Field

import make_json_recursive_fixtures as recursive_fixtures  # its json.dumps spellings, edits and verdicts


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Reading(BaseModel):
    model_config = ConfigDict(extra="forbid")
    age: int = Field(ge=0, le=120, description="in years")
    score: int = Field(ge=10, le=15)
    step: int = Field(gt=-5, lt=5)
    big: int = Field(ge=-2**63, le=2**63 - 1)
    above: int = Field(ge=9223372036854775000)
    p: float = Field(ge=0, le=1, description="a probability")
    rate: float = Field(gt=0)
    loss: float = Field(le=0)
    below: float = Field(lt=0)
    window: float = Field(gt=-2, lt=3)


class Documented(BaseModel):
    model_config = ConfigDict(extra="forbid")
    color: Color = Field(default=Color.red, description="the main colour")
    accent: Optional[Color] = Field(default=None, description="a second colour, if any")
    old: Color = Field(description="kept for old clients", deprecated=True)
    level: int = Field(default=1, ge=1, le=5, description="how loud")
    tags: List[Color] = Field(default=[], description="more colours")


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(ge=0.1, le=1.9)
    top_p: float = Field(gt=0.05, le=0.95)
    offset: float = Field(ge=-2.5, lt=-0.25)
    penalty: float = Field(gt=-0.001, lt=0.001)


rng = random.Random(20261203)

# Each bounded field: (low, high, low_exclusive, high_exclusive, is_float); None: no bound.
BOUNDS = {
    "age": (0, 120, False, False, False),
    "score": (10, 15, False, False, False),
    "step": (-5, 5, True, True, False),
    "big": (-2**63, 2**63 - 1, False, False, False),
    "above": (9223372036854775000, 2**63 - 1, False, False, False),
    "p": (0, 1, False, False, True),
    "rate": (0, None, True, False, True),
    "loss": (None, 0, False, False, True),
    "below": (None, 0, False, True, True),
    "window": (-2, 3, True, True, True),
    "level": (1, 5, False, False, False),
    "temperature": (0.1, 1.9, False, False, True),
    "top_p": (0.05, 0.95, True, False, True),
    "offset": (-2.5, -0.25, False, True, True),
    "penalty": (-0.001, 0.001, True, True, True),
}


def plain_float(x):
    """A float json.dumps writes without an exponent."""
    for _ in range(100):
        text = json.dumps(x)
        if "e" not in text and "E" not in text:
            return x
        x = round(rng.uniform(-1000, 1000), 3)
    raise AssertionError(x)


def draw(name):
    low, high, low_x, high_x, is_float = BOUNDS[name]
    lo = low if low is not None else (high - 10**6 if high is not None else -10**6)
    hi = high if high is not None else lo + 10**6
    if not is_float:
        lo, hi = lo + (1 if low_x else 0), hi - (1 if high_x else 0)
        return rng.choice([lo, hi, lo + 1 if lo < hi else lo, hi - 1 if lo < hi else hi, rng.randint(lo, hi)])
    edge = rng.random()
    if edge < 0.2 and not low_x and low is not None:
        return float(low) if rng.random() < 0.5 or low != int(low) else int(low)
    if edge < 0.4 and not high_x and high is not None:
        return float(high) if rng.random() < 0.5 or high != int(high) else int(high)
    while True:
        x = round(rng.uniform(lo, hi), rng.randint(1, 6))
        if (x > lo or not low_x) and (x < hi or not high_x) and (low is None or x >= low) and (high is None or x <= high):
            if (low_x and x == low) or (high_x and x == high):
                continue
            # Under a fractional bound an exponent spelling (1e-05) is drawn again: plain_float's
            # replacement (anywhere in +-1000) would leave the bounds.
            if any(b is not None and b != int(b) for b in (low, high)) and "e" in json.dumps(x):
                continue
            return plain_float(x)


def reading():
    return {name: draw(name) for name in ("age", "score", "step", "big", "above", "p", "rate", "loss", "below", "window")}


def documented():
    value = {"old": rng.choice(list(Color)).value}
    if rng.random() < 0.7:
        value["color"] = rng.choice(list(Color)).value
    if rng.random() < 0.7:
        value["accent"] = rng.choice([None] + [c.value for c in Color])
    if rng.random() < 0.7:
        value["level"] = draw("level")
    if rng.random() < 0.5:
        value["tags"] = [rng.choice(list(Color)).value for _ in range(rng.randint(0, 3))]
    return value


def sampling():
    return {name: draw(name) for name in ("temperature", "top_p", "offset", "penalty")}


MODELS = [("reading", Reading, reading), ("documented", Documented, documented), ("sampling", Sampling, sampling)]

PIECES = ["0", "1", "9", "-", ".", "e", "E", "+", ",", "\"", "5", "00"]


def probes(name):
    """Texts for a bounded field's value near and beyond its bounds, and odd spellings."""
    low, high, _, _, is_float = BOUNDS[name]
    out = ["-0", "0", "01", "-01", "1e0", "1E-3", "0.0", "-0.0", "9223372036854775807", "9223372036854775808",
           "-9223372036854775808", "-9223372036854775809", "1000000000000000000", "999999999999999999"]
    for bound in (low, high):
        if bound is None:
            continue
        if bound != int(bound):  # a fractional bound: it, its neighbours in its last digit and beyond
            text = repr(bound)
            step = 10.0 ** -len(text.split(".")[1])
            out += [text, text + "0", text + "1", text + "9", repr(round(bound - step, 12)), repr(round(bound + step, 12)),
                    text + "e0", text.rstrip("0123456789") + "0"]
            continue
        for delta in (-1, 0, 1):
            out.append(str(bound + delta))
        out += [str(bound) + ".0", str(bound) + ".5", str(bound - 1) + ".5", str(bound) + ".000001",
                str(bound - 1) + ".999999", str(bound) + "e0"]
    return out


def dumps(value):
    return recursive_fixtures.dumps(value, rng)


def mutants(text):
    return [edited for edited, _ in recursive_fixtures.mutants(text, rng, PIECES, 4)]


class Literal(str):
    """A number's text as the JSON spells it."""


def within_limits(key, literal):
    """marlhf's documented limits on a field's number (docs/serving.md): no exponent; an
    integer field's value within int64; a float field's integer part at most 18 digits."""
    if "e" in literal or "E" in literal:
        return False
    if BOUNDS.get(key, (0, 0, 0, 0, True))[4]:
        return len(literal.lstrip("-").split(".")[0]) <= 18
    return "." in literal or -2**63 <= int(literal) < 2**63


def canonical(text):
    """Spelled as json.dumps spells it (either separators), every number within marlhf's
    limits (within_limits)."""
    try:
        fields = json.loads(text, parse_float=Literal, parse_int=Literal)
    except ValueError:
        return False
    if isinstance(fields, dict) and not all(within_limits(k, v) for k, v in fields.items() if isinstance(v, Literal)):
        return False
    value = json.loads(text)
    return text in (json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def main():
    cases = []
    for name, model, make in MODELS:
        texts, seen = [], set()
        values = []
        for _ in range(20):
            value = make()
            text = dumps(value)
            assert recursive_fixtures.valid(model, text), (name, text)
            if text not in seen:
                seen.add(text)
                values.append(value)
                texts.append([text, True, "generated"])
        edited = []
        for text, _, _ in list(texts):
            edited += mutants(text)
        for value in values:
            for field in value:
                if field not in BOUNDS:
                    continue
                for probe in rng.sample(probes(field), 5):
                    changed = dict(value)
                    changed[field] = 0  # a placeholder whose text is replaced by the probe's
                    text = dumps(changed).replace('"%s": 0' % field, '"%s": %s' % (field, probe)).replace(
                        '"%s":0' % field, '"%s":%s' % (field, probe))
                    edited.append(text)
        for text in edited:
            if text not in seen:
                seen.add(text)
                texts.append([text, recursive_fixtures.valid(model, text), "canonical" if canonical(text) else "edited"])
        cases.append({"name": name, "schema": model.model_json_schema(), "texts": texts})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "constraints", "json_bounds.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, sum(len(c["texts"]) for c in cases), "texts,",
          sum(t[1] for c in cases for t in c["texts"]), "valid")


if __name__ == "__main__":
    main()
