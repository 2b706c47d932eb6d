#!/usr/bin/env python3
"""Write tests/fixtures/regex/cases.json: regular expressions and texts, each labelled by
Python's own `re` (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_regex_fixtures.py

For each pattern of the dialect of src/gen/regex_constraint.h, about 90 texts: random
strings over the pattern's own characters and a pool with multi-byte UTF-8 (2-, 3- and
4-byte characters, U+07FF/U+0800/U+FFFF/U+10000 boundaries, newlines), strings drawn
from the pattern's parse tree (so that many match), and one-character edits of those (so
that many nearly match). Each is labelled by
  - "fullmatch" patterns (vLLM's regex): re.fullmatch(pattern, text, re.ASCII);
  - "search" patterns (JSON Schema's pattern, ECMAScript's RegExp.test): re.search with
    the pattern's final `$` as `\\Z` (ECMAScript's `$` without the m flag is the end of
    the text; Python's also matches before a final newline).
re.ASCII gives \\d \\w \\s their ASCII meanings, as marlhf's dialect defines them.
"refused" lists patterns Python also refuses (a syntax error), which marlhf must refuse.
"""
import json
import random
import re
import os

try:
    import re._parser as sre_parse  # Python 3.11+
    import re._constants as C
except ImportError:  # pragma: no cover
    import sre_parse
    import sre_constants as C

FULLMATCH = [
    r"\d{3}-\d{4}",
    r"[A-Z][a-z]{2,8}( [A-Z][a-z]+)?",
    r"(cat|dog|bird)s?",
    r".*",
    r".{2,5}",
    r"[^aeiou\n]{1,4}x",
    r"\w+@\w+\.(com|org)",
    r"(?:ab|a)*b",
    r"a|b|",
    r"^(yes|no)$",
    r"[\s\S]{0,3}é",
    r"(?P<year>\d{4})-(0[1-9]|1[0-2])",
    r"café|naïve|中文+",
    r"[é-ü]+",
    r"[^\x00-\x7f]{2}",
    r"\u00e9\U0001F600?",
    r"x{2,}y{,2}",
    r"a{0}b",
    r"\.\*\\\(\)\[\]\{\}\|\?\+\^\$",
    r"[\d\s]+",
    r"[\D]{2}",
    r"\W\S",
    r"[]a-]+",
    r"(a*)*b",
    r"((a|b)c){1,3}",
    r"[a-c]{1,3}?d",
    r"\t\n?\r\f\v",
    r"x{",
    r"x{}",
    r"a{,}b{1,}",
    r"[😀-😂]+",
    r"[\u0800-\uffff]\w",
    r"[\x7f-\u0800]+",
    r".\n.",
    r"[^\n]*\n",
    r"[^a-z0-9]+",
    r"(\+|-)?\d+(\.\d{1,2})?",
    r"[a-zA-Z_][a-zA-Z0-9_]{0,7}",
    r"(ab){2}|(ba){3}",
    r"[\[\]\\^-]{2}",
    r"\x41\x7a\u4e2d",
    r"(a|ab)(c|bcd)(d*)",
    r"[\b]\a",
    r"[Ā-ą]+|[\u4e00-\u4e05]",
    r"[^\W\d]+",
    r"",
]

SEARCH = [
    r"abc",
    r"^ab",
    r"c$",
    r"^a|b$",
    r"\d{2}",
    r"^$",
    r"é",
    r"^[a-z]+$",
    r"x|^y",
]

REFUSED = [r"(", r"a)", r"[a", r"a**", r"*a", r"a{2}{3}", r"a{3,2}", r"\q", r"[z-a]", r"[\d-z]", r"\x4", r"\u12",
           "a\\", "(?:a"]

POOL = list("abcxyzABZ019 -_.@\n\t") + ["é", "ü", "ï", "中", "文", "😀", "😁", "😂", "\x7f", "\x80", "\u07ff", "\u0800",
                                         "\uffff", "\U00010000", "\U0010ffff", "\ud7ff", "\ue000", "\x00", "\x0b",
                                         "\u0106", "\u0100", "\u4e00", "\u4e06", "\u4e3f"]


def literal_chars(pattern):
    return [ch for ch in pattern if ch not in "\\()[]{}|*+?^$.,"]


def sample(items, rng, depth=0):
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(chr(av))
        elif op is C.NOT_LITERAL or op is C.ANY:
            out.append(rng.choice(POOL))
        elif op is C.IN:
            choices = []
            for sub_op, sub_av in av:
                if sub_op is C.LITERAL:
                    choices.append(chr(sub_av))
                elif sub_op is C.RANGE:
                    lo, hi = sub_av
                    choices += [chr(lo), chr(hi), chr(rng.randint(lo, hi))]
            choices = [c for c in choices if not 0xD800 <= ord(c) <= 0xDFFF]
            out.append(rng.choice(choices or POOL) if rng.random() < 0.8 else rng.choice(POOL))
        elif op is C.BRANCH:
            out.append(sample(rng.choice(av[1]), rng, depth + 1))
        elif op is C.SUBPATTERN:
            out.append(sample(av[-1], rng, depth + 1))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, body = av
            hi = min(hi, lo + 4)
            out += [sample(body, rng, depth + 1) for _ in range(rng.randint(lo, hi))]
        elif op is C.AT:
            pass
        else:
            raise ValueError(f"sampler: {op}")
    return "".join(out)


def texts_for(pattern, rng):
    alphabet = POOL + literal_chars(pattern)
    parsed = sre_parse.parse(pattern, re.ASCII)
    texts = set()
    for _ in range(40):
        texts.add("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))))
    drawn = [sample(list(parsed), rng) for _ in range(30)]
    texts.update(drawn)
    for t in drawn[:20]:
        k = rng.randint(0, len(t))
        edit = rng.randint(0, 2)
        if edit == 0:
            t = t[:k] + rng.choice(alphabet) + t[k:]
        elif edit == 1 and t:
            t = t[:k] + t[k + 1:]
        elif t:
            t = t[:k] + rng.choice(alphabet) + t[k + 1:]
        texts.add(t)
    return sorted(t for t in texts if not any(0xD800 <= ord(c) <= 0xDFFF for c in t))


def main():
    rng = random.Random(20261201)
    out = {"fullmatch": [], "search": [], "refused": []}
    for pattern in FULLMATCH:
        compiled = re.compile(pattern, re.ASCII)
        cases = [[t, compiled.fullmatch(t) is not None] for t in texts_for(pattern, rng)]
        out["fullmatch"].append({"pattern": pattern, "cases": cases})
    for pattern in SEARCH:
        python = pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern
        compiled = re.compile(python, re.ASCII)
        cases = [[t, compiled.search(t) is not None] for t in texts_for(pattern, rng)]
        out["search"].append({"pattern": pattern, "cases": cases})
    for pattern in REFUSED:
        try:
            re.compile(pattern)
        except re.error:
            out["refused"].append(pattern)
        else:
            raise SystemExit(f"Python accepts {pattern!r}")
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "regex", "cases.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    n = sum(len(p["cases"]) for k in ("fullmatch", "search") for p in out[k])
    m = sum(c[1] for k in ("fullmatch", "search") for p in out[k] for c in p["cases"])
    print(f"{path}: {len(FULLMATCH)} + {len(SEARCH)} patterns, {n} texts ({m} match), {len(out['refused'])} refused")


if __name__ == "__main__":
    main()
