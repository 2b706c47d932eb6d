#!/usr/bin/env python3
"""Build data/austen/: the task marlhf's SFT -> reward model -> PPO pipeline trains and is
evaluated on -- "continue a passage of Jane Austen with a positive-sentiment continuation"
-- from the real text of her six novels, with a scripted annotator (the AFINN-165
sentiment lexicon plus Bradley-Terry label noise) standing in for human labellers.

Usage (developers only; the output is committed and nothing at build or test time runs
Python):

    apt-get install r-cran-janeaustenr     # the novels (R data files; R itself is not used)
    scripts/setup-python                   # .venv-tools with transformers, rdata, afinn
    scripts/fetch-model                    # models/SmolLM2-135M-Instruct.Q4_1.gguf (token counts)
    .venv-tools/bin/python tools/build_austen_task.py
    .venv-tools/bin/python tools/build_austen_task.py --probe [embed|final [ROWS]]  # optional

Deterministic: every random choice comes from random.Random(SEED + k) streams, token
counts from SmolLM2's tokenizer, and nothing depends on the clock or the machine. Run it
twice and the files are identical (the script ends by printing their SHA-256 prefixes).

What is written (docs/austen_task.md describes each file and the statistics printed at the
end, which are also written to data/austen/stats.json):
  data/austen/lexicon.tsv             the gold scorer's word list (AFINN-165, adapted)
  data/austen/sft_train.jsonl, sft_eval.jsonl          {"prompt", "response"}
  data/austen/rm_train.jsonl, rm_eval.jsonl            {"prompt", "chosen", "rejected"}
  data/austen/rm_listwise_train.jsonl                  {"prompt", "responses": [best..worst]}
  data/austen/ppo_prompts.jsonl, eval_prompts.jsonl    {"prompt"}
  data/austen/stats.json              sizes, token lengths, gold means, flip rates
  tests/fixtures/lexicon/scores.jsonl {"text", "score", "sum", "words"}: the Python gold
                                      score (and its parts) of a few hundred texts, for
                                      tests/test_lexicon.c
  tests/fixtures/lexicon/bad_*.tsv    damaged lexicon files (the C loader must refuse them)

The gold score (gold(), and the C twin src/eval/lexicon.c) is defined in
docs/austen_task.md and src/eval/lexicon.h; keep the three in step.
"""
import gzip
import hashlib
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import warnings
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "data", "austen")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "lexicon")
JANEAUSTENR = "/usr/lib/R/site-library/janeaustenr"
GGUF = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

SEED = 1813                    # Pride and Prejudice
EVAL_CHAPTER_FRACTION = 0.12   # of each novel's chapters, held out for every *_eval / eval file
MIN_TOKENS, MAX_TOKENS = 16, 48  # prompt and response length, SmolLM2 tokens
MAX_PROMPT_SENTENCES = 3
MAX_RESPONSE_SENTENCES = 2
LENGTH_MATCH = 0.15            # alternative candidates: |len - len(real)| <= max(2, 15%)
MARGIN = 0.75                  # candidates of one prompt differ in gold score by >= this
TAU = 0.55                     # Bradley-Terry temperature of the annotator (gold units)
LISTWISE_K = 4
GOLD_CLIP = 3.0

SIZES = {  # rows per file
    "sft_train": 2500, "rm_train": 2500, "rm_listwise_train": 400, "ppo_prompts": 1000,
    "sft_eval": 300, "rm_eval": 300, "eval_prompts": 200,
}
GROUP_FILES = {  # chapter group -> its files
    "eval": ["sft_eval", "rm_eval", "eval_prompts"],
    "ppo": ["ppo_prompts"],
    "sup": ["sft_train", "rm_train", "rm_listwise_train"],
}

# Words of AFINN-165 left out of lexicon.tsv (see docs/austen_task.md): in these novels they
# are nearly always a title or a name, not the scored word. "miss" (-2, as in "I miss her")
# is the title "Miss Bennet" -- the adjustment Silge & Robinson make for Austen in "Text
# Mining with R", ch. 2; the others are surnames or first names (counts in the six novels).
DROPPED_WORDS = {
    "miss": "the title Miss (1,829 of 1,855 occurrences capitalized)",
    "grant": "Dr. and Mrs. Grant, Mansfield Park (147 of 159 occurrences capitalized)",
    "grants": "the Grants, Mansfield Park (all 12 capitalized)",
    "dick": "Dick Musgrove, Persuasion (all 9)",
    "grey": "Miss Grey, Sense and Sensibility (10 of 17)",
    "gray": "Gray's, the jeweller's shop, Sense and Sensibility (all 7)",
}

# The tokenizer of the gold score (the C twin in src/eval/lexicon.c must match it byte for
# byte): curly single quotes are apostrophes, ASCII letters are lower-cased, words are the
# maximal runs of [a-z0-9'] with their leading and trailing apostrophes removed.
WORD_RE = re.compile(rb"[a-z0-9']+")
ENTRY_WORD_RE = re.compile(r"[a-z0-9](?:[a-z0-9']*[a-z0-9])?\Z")
VALENCE_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")


def die(msg):
    print(f"build_austen_task: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------
# The gold score.

def words_of(text):
    """The word tokens of text, as bytes (the gold score's tokenizer)."""
    b = text.encode("utf-8").replace(b"\xe2\x80\x98", b"'").replace(b"\xe2\x80\x99", b"'")
    out = []
    for m in WORD_RE.finditer(b.lower()):  # bytes.lower() changes ASCII A-Z only
        w = m.group(0).strip(b"'")
        if w:
            out.append(w)
    return out


class LexiconError(ValueError):
    def __init__(self, what, path, line):
        super().__init__(f"{what} ({path}:{line})")
        self.line = line


def load_lexicon(path):
    """lexicon.tsv -> ({phrase bytes: valence}, longest phrase in words). The same rules as
    lexicon_load() in src/eval/lexicon.c (see src/eval/lexicon.h): lines end with '\n';
    empty lines and lines starting with '#' are skipped; any other line is
    PHRASE<TAB>VALENCE, PHRASE = 1..8 words joined by single spaces, each word
    [a-z0-9]([a-z0-9']*[a-z0-9])?, VALENCE = -?[0-9]+(.[0-9]+)?; no phrase twice; at least
    one phrase. Raises LexiconError naming path:line."""
    lex, longest = {}, 0
    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    for n, raw in enumerate(raw_lines, 1):
        if not raw or raw.startswith(b"#"):
            continue
        line = raw.decode("latin-1")  # non-ASCII bytes then fail the patterns below
        phrase, tab, valence = line.partition("\t")
        words = phrase.split(" ")
        if (not tab or not VALENCE_RE.match(valence) or len(words) > 8
                or not all(ENTRY_WORD_RE.match(w) for w in words)):
            raise LexiconError("bad lexicon line", path, n)
        if phrase.encode() in lex:
            raise LexiconError(f"lexicon phrase '{phrase}' given twice", path, n)
        lex[phrase.encode()] = float(valence)
        longest = max(longest, len(words))
    if not lex:
        raise LexiconError("lexicon has no entries", path, len(raw_lines))
    return lex, longest


def gold_parts(lexicon, text):
    """(sum of matched valences, number of words): phrases are matched greedily from left
    to right, the longest phrase (in words) first at each position."""
    lex, longest = lexicon
    words = words_of(text)
    total, i = 0.0, 0
    while i < len(words):
        for k in range(min(longest, len(words) - i), 0, -1):
            v = lex.get(b" ".join(words[i:i + k]))
            if v is not None:
                total += v
                i += k
                break
        else:
            i += 1
    return total, len(words)


def gold(lexicon, text):
    """clip(sum / sqrt(words), -3, 3); 0 for a text without words."""
    total, n = gold_parts(lexicon, text)
    if n == 0:
        return 0.0
    return min(GOLD_CLIP, max(-GOLD_CLIP, total / math.sqrt(n)))


def write_lexicon(path):
    """AFINN-165 (PyPI afinn) -> lexicon.tsv: hyphenated entries become phrases ("ill-fated"
    -> "ill fated"; the tokenizer splits at hyphens), entries the tokenizer cannot produce
    (non-ASCII "naïve") and DROPPED_WORDS are left out."""
    try:
        import afinn
    except ImportError:
        die("the PyPI package afinn is missing: run scripts/setup-python")
    from importlib.metadata import version
    src = os.path.join(os.path.dirname(afinn.__file__), "data", "AFINN-en-165.txt")
    with open(src, "rb") as f:
        src_sha = hashlib.sha256(f.read()).hexdigest()
    entries, skipped = {}, []
    with open(src, encoding="utf-8") as f:
        for line in f:
            word, valence = line.rstrip("\n").split("\t")
            phrase = word.replace("-", " ")
            ok = all(ENTRY_WORD_RE.match(w) for w in phrase.split(" "))
            if not ok or word in DROPPED_WORDS:
                skipped.append(word)
                continue
            if phrase in entries:
                die(f"AFINN entry '{word}' collides with another after hyphen splitting")
            entries[phrase] = int(valence)
    for word in DROPPED_WORDS:
        if word not in skipped:
            die(f"DROPPED_WORDS names '{word}', which is not in AFINN-165")
    header = [
        "# Gold sentiment lexicon of the Jane Austen task (docs/austen_task.md).",
        "# Derived from AFINN-165 (AFINN-en-165.txt) by Finn Aarup Nielsen,",
        f"# https://github.com/fnielsen/afinn, as shipped in the PyPI package afinn {version('afinn')}",
        f"# (sha256 {src_sha[:16]}...).",
        "# Licence: Open Database License (ODbL) v1.0, https://opendatacommons.org/licenses/odbl/1-0/",
        "# This derived database is also under the ODbL v1.0. Changes: hyphens replaced by",
        "# spaces (multi-word phrases); left out: "
        + ", ".join(w.encode("ascii", "backslashreplace").decode() for w in sorted(skipped)) + ".",
        "# Format: PHRASE<TAB>VALENCE; see src/eval/lexicon.h.",
    ]
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(header) + "\n")
        for phrase in sorted(entries):
            f.write(f"{phrase}\t{entries[phrase]}\n")
    return len(entries), skipped, version("afinn"), src_sha


# ---------------------------------------------------------------------------------------
# The novels.

def janeaustenr_version():
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "r-cran-janeaustenr"],
                           capture_output=True, text=True, check=False)
        deb = r.stdout.strip() if r.returncode == 0 else None
    except OSError:
        deb = None
    cran = None
    with open(os.path.join(JANEAUSTENR, "DESCRIPTION"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("Version:"):
                cran = line.split(":", 1)[1].strip()
    return cran, deb


def load_novels():
    """{name: [line, ...]} from janeaustenr's lazy-load database (data/Rdata.rdx: a gzip'd
    serialized index of offsets into Rdata.rdb, where each object is a 4-byte big-endian
    length and a zlib stream of an R serialization)."""
    data = os.path.join(JANEAUSTENR, "data")
    if not os.path.isfile(os.path.join(data, "Rdata.rdb")):
        die(f"{data}/Rdata.rdb not found: install the Debian package r-cran-janeaustenr "
            "(apt-get install r-cran-janeaustenr)")
    try:
        import rdata
        import rdata.parser
    except ImportError:
        die("the PyPI package rdata is missing: run scripts/setup-python")
    warnings.filterwarnings("ignore", message="Unknown file type")

    def parse(raw):
        return rdata.conversion.convert(rdata.parser.parse_data(raw))

    with open(os.path.join(data, "Rdata.rdx"), "rb") as f:
        index = parse(gzip.decompress(f.read()))
    with open(os.path.join(data, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    novels = {}
    for name, (offset, length) in index["variables"].items():
        blob = rdb[int(offset):int(offset) + int(length)]
        (size,) = struct.unpack(">I", blob[:4])
        raw = zlib.decompress(blob[4:])
        if len(raw) != size:
            die(f"janeaustenr object {name}: bad length")
        novels[str(name)] = [str(x) for x in parse(raw)]
    return novels


CHAPTER_RE = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
END_RE = re.compile(r"^\s*(finis|the end|a note on the text)\s*$", re.I)


def chapters_of(lines):
    """[[paragraph, ...], ...]: each chapter's prose paragraphs, lines joined by spaces.
    Skipped: everything before the first chapter and after FINIS / THE END, indented
    lines (verse, letter headings, signatures, "* * *"), paragraphs without a lower-case
    letter (headings), editorial notes in [brackets], and footnoted paragraphs ('*')."""
    chapters, para = [], []

    def flush():
        if para and chapters:
            text = re.sub(r"\s+", " ", " ".join(para)).strip().replace("_", "")
            if re.search("[a-z]", text) and "[" not in text and "*" not in text:
                chapters[-1].append(text)
        para.clear()

    for line in lines:
        if END_RE.match(line):
            break
        if CHAPTER_RE.match(line):
            flush()
            chapters.append([])
        elif not line.strip():
            flush()
        elif line.startswith("    "):
            flush()
        else:
            para.append(line)
    flush()
    return chapters


ABBREV = {"Mr", "Mrs", "Dr", "St", "Hon", "Col", "Capt", "Esq", "Edw", "Wm", "Jas", "&c"}
BOUNDARY_RE = re.compile(r"""[.!?]["')]*\s+(?=["']?[A-Z])""")


def sentences_of(paragraph):
    """Split at . ! ? (and closing quotes) followed by space and a capital (possibly after
    an opening quote), except after an abbreviation (Mr., Mrs., an initial, ...)."""
    out, start = [], 0
    for m in BOUNDARY_RE.finditer(paragraph):
        before = paragraph[start:m.start() + 1]
        last = re.search(r"(\S+)[.!?]$", before)
        if paragraph[m.start()] == "." and last:
            word = last.group(1).lstrip("\"'(")
            if word in ABBREV or re.fullmatch(r"[A-Z]", word):
                continue
        out.append(paragraph[start:m.end()].strip())
        start = m.end()
    out.append(paragraph[start:].strip())
    return [s for s in out if s]


def smollm2_tokenizer():
    if not os.path.isfile(GGUF):
        die(f"{GGUF} not found: run scripts/fetch-model")
    try:
        from tokenizers import pre_tokenizers
        from transformers import AutoTokenizer
    except ImportError:
        die("transformers is missing: run scripts/setup-python")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))
    # SmolLM2's own pre-tokenizer (transformers' GGUF loader ignores tokenizer.ggml.pre =
    # "smollm"; see tools/make_tokenizer_fixtures.py).
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


# ---------------------------------------------------------------------------------------
# Examples.

class Counter:
    def __init__(self, tok):
        self.tok, self.cache = tok, {}

    def __call__(self, text):
        n = self.cache.get(text)
        if n is None:
            n = self.cache[text] = len(self.tok(text, add_special_tokens=False)["input_ids"])
        return n

    def prime(self, texts):
        texts = [t for t in set(texts) if t not in self.cache]
        for i in range(0, len(texts), 4096):
            batch = texts[i:i + 4096]
            for t, ids in zip(batch, self.tok(batch, add_special_tokens=False)["input_ids"]):
                self.cache[t] = len(ids)


def starts_well(sentence):
    return re.match(r"""["']?[A-Z]""", sentence) is not None


def usable(sentence):
    return "&" not in sentence and "(" not in sentence and ")" not in sentence


def units_of(chapter, count, rng):
    """(prompt, response) units of one chapter: the prompt is 1-3 whole sentences of a
    paragraph, the response the next 1-2 sentences of the same paragraph (with a leading
    space), both MIN_TOKENS..MAX_TOKENS tokens long. At each sentence the prompt is the
    fewest sentences that fit, the response length is drawn among those that fit, and the
    scan resumes after the prompt (so a response may be the start of the next prompt; no
    two prompts share a sentence)."""
    units = []
    for p, paragraph in enumerate(chapter):
        sents = sentences_of(paragraph)
        i = 0
        while i < len(sents):
            options = []
            for a in range(1, MAX_PROMPT_SENTENCES + 1):
                prompt_s = sents[i:i + a]
                if len(prompt_s) < a or not starts_well(prompt_s[0]) or not all(map(usable, prompt_s)):
                    break
                prompt = " ".join(prompt_s)
                if not MIN_TOKENS <= count(prompt) <= MAX_TOKENS:
                    continue
                for b in range(1, MAX_RESPONSE_SENTENCES + 1):
                    resp_s = sents[i + a:i + a + b]
                    if len(resp_s) < b or not starts_well(resp_s[0]) or not all(map(usable, resp_s)):
                        break
                    response = " " + " ".join(resp_s)
                    if MIN_TOKENS <= count(response) <= MAX_TOKENS:
                        options.append((a, b, prompt, response))
            if not options:
                i += 1
                continue
            shortest = min(o[0] for o in options)
            a, b, prompt, response = rng.choice([o for o in options if o[0] == shortest])
            units.append({"prompt": prompt, "response": response, "paragraph": p})
            i += a
    return units


def candidates_of(chapter, count):
    """Every span of 1-2 sentences of one paragraph, MIN..MAX_TOKENS long (with a leading
    space): the pool alternative continuations are drawn from."""
    out = []
    for paragraph in chapter:
        sents = sentences_of(paragraph)
        for i in range(len(sents)):
            for b in range(1, MAX_RESPONSE_SENTENCES + 1):
                span = sents[i:i + b]
                if len(span) < b or not starts_well(span[0]) or not all(map(usable, span)):
                    break
                text = " " + " ".join(span)
                if MIN_TOKENS <= count(text) <= MAX_TOKENS:
                    out.append(text)
    return out


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class Pool:
    """Alternative continuations of one split, by token length, with their gold scores."""

    def __init__(self, items):  # items: [(text, chapter_key, tokens, gold)]
        self.by_len = {}
        for it in items:
            self.by_len.setdefault(it[2], []).append(it)

    def draw(self, rng, tokens, chapter, avoid_golds, exclude):
        d = max(2, int(LENGTH_MATCH * tokens))
        cands = [it for n in range(tokens - d, tokens + d + 1) for it in self.by_len.get(n, ())
                 if it[1] != chapter and it[0] not in exclude
                 and all(abs(it[3] - g) >= MARGIN for g in avoid_golds)]
        return rng.choice(cands) if cands else None


def main():
    cran, deb = janeaustenr_version()
    novels = load_novels()
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(FIXTURES, exist_ok=True)
    n_entries, skipped, afinn_version, afinn_sha = write_lexicon(os.path.join(OUT, "lexicon.tsv"))
    try:
        lexicon = load_lexicon(os.path.join(OUT, "lexicon.tsv"))
    except LexiconError as e:
        die(str(e))
    g = lambda text: gold(lexicon, text)  # noqa: E731

    tok = smollm2_tokenizer()
    count = Counter(tok)

    # Chapters, their units and alternative continuations.
    chapters = {}  # (novel, index) -> [paragraph]
    for name in sorted(novels):
        for c, ch in enumerate(chapters_of(novels[name])):
            chapters[(name, c)] = ch
    all_sents = [s for ch in chapters.values() for p in ch for s in sentences_of(p)]
    count.prime(all_sents + [" " + s for s in all_sents])
    unit_rng = random.Random(SEED + 1)
    chapter_units, chapter_cands = {}, {}
    for key in sorted(chapters):
        chapter_units[key] = units_of(chapters[key], count, unit_rng)
        for u in chapter_units[key]:
            u["chapter"] = key
        chapter_cands[key] = [(t, key, count(t), g(t)) for t in candidates_of(chapters[key], count)]

    # The split, by chapter, into three groups that share no text: "eval" (a fixed fraction
    # of each novel's chapters: sft_eval, rm_eval, eval_prompts), "ppo" (ppo_prompts) and
    # "sup" (the rest: sft_train, rm_train, rm_listwise_train).
    split_rng = random.Random(SEED)
    group = {}
    for name in sorted(novels):
        keys = sorted(k for k in chapters if k[0] == name)
        for k in split_rng.sample(keys, round(EVAL_CHAPTER_FRACTION * len(keys))):
            group[k] = "eval"
    rest = sorted(k for k in chapters if k not in group)
    split_rng.shuffle(rest)
    n_ppo = 0
    for k in rest:
        if n_ppo < 1.05 * SIZES["ppo_prompts"]:  # 5% spare: a few units are dropped below
            group[k] = "ppo"
            n_ppo += len(chapter_units[k])
        else:
            group[k] = "sup"
    # A few sentences recur ("I do not know."): units and alternatives with a sentence that
    # is in the chapters of two groups are left out.
    sent_groups = {}
    for k, ch in chapters.items():
        for p in ch:
            for sent in sentences_of(p):
                sent_groups.setdefault(sent, set()).add(group[k])
    own = lambda text: all(len(sent_groups.get(x, ())) == 1 for x in sentences_of(text.strip()))  # noqa: E731
    units = {gr: [u for k in sorted(chapters) if group[k] == gr for u in chapter_units[k]
                  if own(u["prompt"]) and own(u["response"])]
             for gr in GROUP_FILES}
    pools = {gr: Pool([c for k in sorted(chapters) if group[k] == gr for c in chapter_cands[k]
                       if own(c[0])])
             for gr in GROUP_FILES}
    seen = set()
    for gr in GROUP_FILES:  # drop repeated prompts (a few set phrases recur)
        kept = []
        for u in units[gr]:
            if u["prompt"] not in seen:
                seen.add(u["prompt"])
                kept.append(u)
        units[gr] = kept

    # Deal each group's units out to its files, disjointly (no prompt in two rows); the
    # files with alternatives to draw get the units left over, in case a draw fails.
    deal_rng = random.Random(SEED + 2)
    assigned = {}
    for gr, names in GROUP_FILES.items():
        us = list(units[gr])
        deal_rng.shuffle(us)
        need = sum(SIZES[n] for n in names)
        if len(us) < need:
            die(f"only {len(us)} units in the {gr} chapters for {need} rows")
        with_spare = [n for n in names if n in ("rm_train", "rm_eval", "rm_listwise_train")]
        spare = (len(us) - need) // max(1, len(with_spare))
        start = 0
        for n in names:
            take = SIZES[n] + (spare if n in with_spare else 0)
            assigned[n] = us[start:start + take]
            start += take

    rows, stats = {}, {"source": {}, "files": {}}
    label_rng = random.Random(SEED + 3)
    draw_rng = random.Random(SEED + 4)

    def sft_rows(name):
        us = assigned[name][:SIZES[name]]
        rows[name] = [{"prompt": u["prompt"], "response": u["response"]} for u in us]

    def pair_rows(name, split):
        out, flips, real_chosen = [], 0, 0
        for u in assigned[name]:
            if len(out) == SIZES[name]:
                break
            a = u["response"]
            ga = g(a)
            alt = pools[split].draw(draw_rng, count(a), u["chapter"], [ga], {a})
            if alt is None:
                continue
            b, gb = alt[0], alt[3]
            a_wins = label_rng.random() < sigmoid((ga - gb) / TAU)
            noiseless_a = ga > gb
            flips += a_wins != noiseless_a
            real_chosen += a_wins
            chosen, rejected = (a, b) if a_wins else (b, a)
            out.append({"prompt": u["prompt"], "chosen": chosen, "rejected": rejected})
        if len(out) < SIZES[name]:
            die(f"{name}: only {len(out)} pairs")
        rows[name] = out
        stats["files"].setdefault(name, {}).update({
            "label_flip_rate": flips / len(out),
            "label_agrees_with_noiseless": 1 - flips / len(out),
            "chosen_is_real_continuation": real_chosen / len(out),
        })

    def listwise_rows(name, split):
        out, disagree, pairs = [], 0, 0
        for u in assigned[name]:
            if len(out) == SIZES[name]:
                break
            a = u["response"]
            texts, golds = [a], [g(a)]
            for _ in range(LISTWISE_K - 1):
                alt = pools[split].draw(draw_rng, count(a), u["chapter"], golds, set(texts))
                if alt is None:
                    break
                texts.append(alt[0])
                golds.append(alt[3])
            if len(texts) < LISTWISE_K:
                continue
            # Plackett-Luce with weights exp(gold / TAU): sort by gold + TAU * Gumbel noise.
            # Any two of the K are then ordered as the Bradley-Terry annotator would.
            noisy = [gv - TAU * math.log(-math.log(1.0 - label_rng.random())) for gv in golds]
            order = sorted(range(LISTWISE_K), key=lambda i: -noisy[i])
            for x in range(LISTWISE_K):
                for y in range(x + 1, LISTWISE_K):
                    pairs += 1
                    disagree += golds[order[x]] < golds[order[y]]
            out.append({"prompt": u["prompt"], "responses": [texts[i] for i in order]})
        if len(out) < SIZES[name]:
            die(f"{name}: only {len(out)} lists")
        rows[name] = out
        stats["files"].setdefault(name, {})["pairwise_flip_rate"] = disagree / pairs

    sft_rows("sft_train")
    sft_rows("sft_eval")
    pair_rows("rm_train", "sup")
    pair_rows("rm_eval", "eval")
    listwise_rows("rm_listwise_train", "sup")
    for name in ("ppo_prompts", "eval_prompts"):
        us = assigned[name][:SIZES[name]]
        rows[name] = [{"prompt": u["prompt"]} for u in us]
        stats["files"].setdefault(name, {})["real_continuation_gold_mean"] = \
            sum(g(u["response"]) for u in us) / len(us)
        stats["files"][name]["real_continuation_gold_positive_fraction"] = \
            sum(g(u["response"]) > 0 for u in us) / len(us)

    check_disjoint(rows)

    # Statistics.
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    for name, rs in rows.items():
        s = stats["files"].setdefault(name, {})
        s["rows"] = len(rs)
        s["prompt_tokens_mean"] = mean([count(r["prompt"]) for r in rs])
        if "response" in rs[0]:
            s["response_tokens_mean"] = mean([count(r["response"]) for r in rs])
            s["response_gold_mean"] = mean([g(r["response"]) for r in rs])
        if "chosen" in rs[0]:
            s["response_tokens_mean"] = mean([count(r[k]) for r in rs for k in ("chosen", "rejected")])
            s["chosen_gold_mean"] = mean([g(r["chosen"]) for r in rs])
            s["rejected_gold_mean"] = mean([g(r["rejected"]) for r in rs])
            s["abs_gold_gap_mean"] = mean([abs(g(r["chosen"]) - g(r["rejected"])) for r in rs])
        if "responses" in rs[0]:
            s["response_tokens_mean"] = mean([count(t) for r in rs for t in r["responses"]])
            for k in range(LISTWISE_K):
                s[f"rank{k + 1}_gold_mean"] = mean([g(r["responses"][k]) for r in rs])
    pool_golds = {s: [it[3] for items in p.by_len.values() for it in items] for s, p in pools.items()}
    stats["source"] = {
        "package": "r-cran-janeaustenr", "debian_version": deb, "cran_version": cran,
        "novels": sorted(novels), "chapters": len(chapters),
        "chapters_per_group": {gr: sum(v == gr for v in group.values()) for gr in GROUP_FILES},
        "units": {s: len(u) for s, u in units.items()},
        "candidate_pool": {s: len(v) for s, v in pool_golds.items()},
        "candidate_pool_gold_mean": {s: mean(v) for s, v in pool_golds.items()},
        "candidate_pool_gold_zero_fraction": {s: mean([x == 0 for x in v]) for s, v in pool_golds.items()},
    }
    stats["annotator"] = {"lexicon_entries": n_entries, "lexicon_left_out": skipped,
                          "afinn_package_version": afinn_version, "afinn_165_sha256": afinn_sha,
                          "tau": TAU, "margin": MARGIN, "gold_clip": GOLD_CLIP, "seed": SEED}
    stats["bag_of_words_baseline"] = bow_baseline(rows["rm_train"], rows["rm_eval"], g)

    for name, rs in rows.items():
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8", newline="\n") as f:
            for r in rs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "stats.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
        f.write("\n")
    write_fixtures(rows, lexicon)

    print(json.dumps(stats, indent=1, sort_keys=True))
    for fn in sorted(os.listdir(OUT)):
        with open(os.path.join(OUT, fn), "rb") as f:
            data = f.read()
        print(f"{hashlib.sha256(data).hexdigest()[:16]}  {len(data):>9}  data/austen/{fn}")


def check_disjoint(rows):
    """No prompt in two rows; no sentence of one chapter group's files in another group's
    files (alternatives included): eval text is unseen in training, and PPO prompts are
    unseen by SFT and the reward model."""
    seen = {}
    for name, rs in rows.items():
        for r in rs:
            if r["prompt"] in seen:
                die(f"prompt in both {seen[r['prompt']]} and {name}")
            seen[r["prompt"]] = name
    owner = {}
    for gr, names in GROUP_FILES.items():
        for name in names:
            for r in rows[name]:
                texts = [r["prompt"]] + [r[k] for k in ("response", "chosen", "rejected") if k in r]
                for t in texts + r.get("responses", []):
                    for sent in sentences_of(t.strip()):
                        if owner.setdefault(sent, gr) != gr:
                            die(f"a sentence of {name} is also in the {owner[sent]} group: {sent[:60]}")


def bow_baseline(train, evals, g):
    """A bag-of-words logistic regression on (chosen - rejected) word counts, trained on
    the noisy train labels, scored on eval pairs against the noiseless ordering: a
    lower bound on what a reward model can learn (an LM starts with word meanings)."""
    vocab = {}

    def feats(text):
        v = {}
        for w in words_of(text):
            j = vocab.setdefault(w, len(vocab))
            v[j] = v.get(j, 0) + 1
        return v

    def diff(r, flip):
        a, b = feats(r["chosen"]), feats(r["rejected"])
        d = dict(a)
        for j, c in b.items():
            d[j] = d.get(j, 0) - c
        return ({j: -c for j, c in d.items()}, 0) if flip else (d, 1)

    rng = random.Random(SEED + 5)
    data = [diff(r, rng.random() < 0.5) for r in train]
    for r in evals:  # reserve vocabulary slots for eval-only words (they stay at zero)
        feats(r["chosen"])
        feats(r["rejected"])
    w = [0.0] * len(vocab)
    lr, l2 = 0.1, 1e-3
    for _ in range(30):
        for x, y in data:
            z = sum(w[j] * c for j, c in x.items())
            p = sigmoid(z)
            for j, c in x.items():
                w[j] -= lr * ((p - y) * c + l2 * w[j])
    right = 0
    for r in evals:
        a, b = feats(r["chosen"]), feats(r["rejected"])
        z = sum(w[j] * c for j, c in a.items()) - sum(w[j] * c for j, c in b.items())
        if g(r["chosen"]) != g(r["rejected"]):
            right += (z > 0) == (g(r["chosen"]) > g(r["rejected"]))
    return {"eval_accuracy_vs_noiseless": right / len(evals)}


def write_fixtures(rows, lexicon):
    """tests/fixtures/lexicon/: scores.jsonl (hand-written edge cases, then texts of every
    task file) and bad_*.tsv (one defect each; the C loader must name file:line)."""
    texts = [
        "", "   ", "...", "'", "''", "''''", "--", "\u2019", "good", "GOOD", "Good.", "gOoD!",
        "good good good good good good good good good", "happy happy happy happy happy",
        "bad", "not good", "not  good", "not\tgood", "Not Good", "not-good", "notgood",
        "not good at all", "it was not good", "'good'", "\"good\"", "\u2018good\u2019",
        "don't like", "dont like", "don\u2019t like", "can't stand him", "can\u2019t stand",
        "cant stand", "fed up", "fed up up", "fed fed up", "ill-fated", "ill fated",
        "ill-natured", "son-of-a-bitch", "son of a bitch", "son of a", "once-in-a-lifetime",
        "a kind of", "some kind of kindness", "kind", "kind kind", "so kind of you",
        "Miss Bennet", "I miss her", "misses", "naive", "na\u00efve", "na\u00efvet\u00e9",
        "caf\u00e9 good", "good\u00e9", "\u00e9good", "gr8", "GR8 n00b", "n00b", "1good",
        "good1", "good_", "_good_", "good's", "goods'", "'tis good", "lovers'", "o'clock",
        "abandon", "abandoned", "abandons", "superb", "outstanding", "breathtaking",
        "catastrophic", "torture", "zealous", "yeah", "yes", "no", "cool stuff",
        "cool  stuff", "best damn", "best damn damn", "green wash", "green washing",
        "does not work", "does not working", "right direction", "screwed up", "no fun",
        "kind of", "messing up", "bad luck", "cashing in", "some kind",
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that "
        "Netherfield Park is let at last?\"",
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
        "disposition, seemed to unite some of the best blessings of existence.",
        "love " * 40, "hate " * 40, "love\nhate\nlove", "good\x01bad", "good\x7fbad",
        "\xff\xfe", "\u00c0GOOD", "GOOD\u00c0", "a" * 300, "good " + "x " * 500,
        "\u201cgood\u201d", "\u2014good\u2014bad", "good\u2018s", "\u2019\u2019good",
        "it's", "it's good", "isn't good", "didn't like", "won't", "4 8 15 16 23 42",
        "excellent!!!", "EXCELLENT", "hopeless, hopeless", "Happy; happier; happiest.",
    ]
    rng = random.Random(SEED + 6)
    for name in sorted(rows):
        rs = rows[name]
        for r in rng.sample(rs, min(30, len(rs))):
            for k in ("prompt", "response", "chosen", "rejected"):
                if k in r:
                    texts.append(r[k])
            texts.extend(r.get("responses", []))
    with open(os.path.join(FIXTURES, "scores.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for t in texts:
            total, n = gold_parts(lexicon, t)
            f.write(json.dumps({"text": t, "score": gold(lexicon, t), "sum": total, "words": n},
                               ensure_ascii=False) + "\n")
    bad = {  # file: (the line at fault, content)
        "bad_no_tab.tsv": (2, "good\t3\nbad -3\n"),
        "bad_valence.tsv": (2, "good\t3\nbad\t-3x\n"),
        "bad_valence_empty.tsv": (3, "good\t3\n\nbad\t\n"),
        "bad_valence_exponent.tsv": (2, "good\t3\nbad\t-3e0\n"),
        "bad_upper.tsv": (3, "# comment\ngood\t3\nBad\t-3\n"),
        "bad_char.tsv": (2, "good\t3\nbad-ish\t-1\n"),
        "bad_apostrophe_edge.tsv": (2, "good\t3\n'bad\t-1\n"),
        "bad_double_space.tsv": (2, "good\t3\nnot  good\t-2\n"),
        "bad_empty_phrase.tsv": (2, "good\t3\n\t-2\n"),
        "bad_duplicate.tsv": (3, "good\t3\nbad\t-3\ngood\t2\n"),
        "bad_too_long.tsv": (2, "good\t3\na b c d e f g h i\t1\n"),
        "bad_two_tabs.tsv": (2, "good\t3\nbad\t-3\t1\n"),
        "bad_non_ascii.tsv": (2, "good\t3\nna\u00efve\t-2\n"),
    }
    for fn, (line, content) in bad.items():
        path = os.path.join(FIXTURES, fn)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(content)
        try:  # the Python loader refuses them too, at the same line
            load_lexicon(path)
            die(f"{fn}: the Python loader accepts it")
        except LexiconError as e:
            if e.line != line:
                die(f"{fn}: the Python loader fails at line {e.line}, not {line}")


def probe(kind="embed", limit=None, threads=2):
    """--probe: how well a reward model built on SmolLM2-135M-Instruct can separate the pairs,
    cheaply: a linear probe (logistic regression, L2) on frozen SmolLM2 features of each
    response, trained on the noisy rm_train labels (first `limit` rows) and scored on
    rm_eval against the noiseless ordering and the noisy labels. Features: "embed", the
    mean of the response tokens' input embeddings (no forward pass: seconds); "final", the
    final hidden states of prompt + response mean-pooled over the response tokens (a
    forward pass per text: about an hour on 2 idle cores). Fine-tuning the whole model, as
    the reward-model trainer does, should do at least as well as the probe. Not part of
    the build: it prints, it writes nothing."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    lexicon = load_lexicon(os.path.join(OUT, "lexicon.tsv"))
    tok = smollm2_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF),
                                                 dtype=torch.float32)
    model.eval()
    table = model.get_input_embeddings().weight.detach()

    def load(name):
        with open(os.path.join(OUT, name + ".jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        return rows[:limit] if limit and name == "rm_train" else rows

    def embed(pairs):
        if kind == "embed":
            return np.stack([table[tok(r, add_special_tokens=False)["input_ids"]].mean(0)
                             .numpy().astype(np.float64) for _, r in pairs])
        out = []
        for start in range(0, len(pairs), 32):
            batch = pairs[start:start + 32]
            ids, spans = [], []
            for prompt, response in batch:
                p = tok(prompt, add_special_tokens=False)["input_ids"]
                r = tok(response, add_special_tokens=False)["input_ids"]
                ids.append(p + r)
                spans.append((len(p), len(p) + len(r)))
            width = max(map(len, ids))
            x = torch.zeros(len(ids), width, dtype=torch.long)
            mask = torch.zeros(len(ids), width, dtype=torch.long)
            for i, row in enumerate(ids):
                x[i, :len(row)] = torch.tensor(row)
                mask[i, :len(row)] = 1
            with torch.no_grad():
                h = model(input_ids=x, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
            for i, (a, b) in enumerate(spans):
                out.append(h[i, a:b].mean(0).numpy().astype(np.float64))
            print(f"  embedded {start + len(batch)}/{len(pairs)}", file=sys.stderr, flush=True)
        return np.stack(out)

    def features(rows):
        e = embed([(r["prompt"], r[k]) for r in rows for k in ("chosen", "rejected")])
        return e[0::2] - e[1::2]

    train, evals = load("rm_train"), load("rm_eval")
    xt, xe = features(train), features(evals)
    mu, sd = xt.mean(0), xt.std(0) + 1e-6
    rng = np.random.default_rng(SEED)
    flip = rng.random(len(xt)) < 0.5  # both orders, so the probe has no bias to exploit
    xt_s = np.where(flip[:, None], -xt, xt) / sd
    yt = (~flip).astype(np.float64)
    best = None
    for l2 in (1e-3, 1e-2, 1e-1, 1.0):
        w = np.zeros(xt.shape[1])
        for _ in range(2000):  # gradient descent on the mean logistic loss + l2/2 |w|^2
            p = 1 / (1 + np.exp(-(xt_s @ w)))
            w -= 0.5 * (xt_s.T @ (p - yt) / len(yt) + l2 * w)
        z = (xe / sd) @ w
        noiseless = np.array([gold(lexicon, r["chosen"]) > gold(lexicon, r["rejected"]) for r in evals])
        acc_noisy = float(np.mean(z > 0))
        acc_clean = float(np.mean((z > 0) == noiseless))
        train_acc = float(np.mean((xt_s @ w > 0) == (yt > 0.5)))
        print(f"l2 {l2:g}: train acc (noisy) {train_acc:.3f}, eval acc vs noisy labels "
              f"{acc_noisy:.3f}, vs noiseless ordering {acc_clean:.3f}, "
              f"noisy labels agree with noiseless {float(np.mean(noiseless)):.3f}")
        best = max(best or 0, acc_clean)
    print(f"best eval accuracy vs the noiseless ordering: {best:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"] and len(sys.argv) <= 4 and sys.argv[2:3] in ([], ["embed"], ["final"]):
        probe(sys.argv[2] if len(sys.argv) > 2 else "embed", int(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif sys.argv[1:]:
        die("usage: build_austen_task.py [--probe [embed|final [TRAIN_ROWS]]]")
    else:
        main()
