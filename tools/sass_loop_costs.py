#!/usr/bin/env python3
"""What a kernel's loops cost, read from its machine code (no GPU needed).

Reads the text of `cuobjdump --dump-sass` (a file, or `-` for stdin) and prints, for each
function whose name contains --kernel, every loop (a backward branch spanning at least
--min-bytes) or the address range --range FROM TO: its instruction count, the sum of the
stall cycles the compiler put in the instructions' control codes, how many instructions
wait on a scoreboard (a load, a shared-memory read, a shuffle, an MUFU result: variable
latency), and the counts of the instructions that decide an attention kernel's speed
(HMMA, MUFU, LDSM, LDS, LDG, LDGSTS, BAR, WARPSYNC).

The stall sum is the fewest cycles one warp takes to issue the range when nothing it
waits for is late: a lower bound of its time. Beside it, an HMMA.16816 holds the SM
sub-partition's tensor pipe for about 6 cycles under mma.sync (the stall ptxas puts
between two of them on sm_90), so k warps sharing a sub-partition take at least
k x 6 x HMMA cycles a step between them. bench/ops_breakdown's "attention_probe" lines
measure the same steps' cycles on a GPU (docs/cuda.md).

The control codes are the high 23 bits of each instruction's second 64-bit word, as
Volta and later lay them out: stall count in bits 41-44, yield 45, write barrier 46-48,
read barrier 49-51, wait mask 52-57, operand reuse 58-61.

usage: tools/sass_loop_costs.py SASS_FILE [--kernel NAME] [--range FROM TO] [--min-bytes N] [--list]
"""
import argparse
import collections
import re
import sys

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
CONTROL = re.compile(r"\s+/\* (0x[0-9a-f]{16}) \*/\s*$")
FUNCTION = re.compile(r"\s+Function : (\S+)")
COUNTED = ["HMMA", "MUFU", "LDSM", "LDS", "LDG", "LDGSTS", "BAR", "WARPSYNC"]


def parse(lines):
    """{function: [instruction dicts]} from cuobjdump's text."""
    functions, current = {}, None
    i = 0
    while i < len(lines):
        found = FUNCTION.match(lines[i])
        if found:
            current = found.group(1)
            functions[current] = []
            i += 1
            continue
        found = INSTRUCTION.match(lines[i])
        if found and current is not None and i + 1 < len(lines) and CONTROL.match(lines[i + 1]):
            high = int(CONTROL.match(lines[i + 1]).group(1), 16)
            text = found.group(2).strip()
            if text.startswith("@"):
                text = text.split(None, 1)[1]
            functions[current].append({
                "address": int(found.group(1), 16),
                "text": text,
                "op": text.split()[0].split(".")[0],
                "stall": (high >> 41) & 0xF,
                "waits": (high >> 52) & 0x3F,
            })
            i += 2
            continue
        i += 1
    return functions


def loops(instructions, min_bytes):
    """(first, last) addresses of each backward branch's range, outermost first."""
    ranges = []
    for instruction in instructions:
        if instruction["op"] != "BRA":
            continue
        target = re.search(r"0x([0-9a-f]+)", instruction["text"])
        if target and int(target.group(1), 16) < instruction["address"]:
            first = int(target.group(1), 16)
            if instruction["address"] - first >= min_bytes:
                ranges.append((first, instruction["address"]))
    return sorted(set(ranges), key=lambda r: (r[0], -r[1]))


def costs(instructions, first, last):
    body = [x for x in instructions if first <= x["address"] <= last]
    counts = collections.Counter(x["op"] for x in body)
    return {
        "instructions": len(body),
        "stall_cycles": sum(x["stall"] for x in body),
        "scoreboard_waits": sum(1 for x in body if x["waits"]),
        **{name: counts.get(name, 0) for name in COUNTED},
    }


def fail(message):
    """A one-line error and exit status 2, as marlhf's own bad-input errors."""
    print(f"sass_loop_costs: error: {message}", file=sys.stderr)
    sys.exit(2)


class OneLineErrors(argparse.ArgumentParser):
    """argparse with its usage errors as one line and exit 2 (fail)."""

    def error(self, message):
        fail(message)


def address(text):
    try:
        return int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a hex address") from None


def main():
    parser = OneLineErrors(description=__doc__.split("\n\n")[0])
    parser.add_argument("sass", help="cuobjdump --dump-sass output, or - for stdin")
    parser.add_argument("--kernel", default="", help="only functions whose name contains this")
    parser.add_argument("--range", nargs=2, type=address, metavar=("FROM", "TO"),
                        help="an address range (hex) instead of the loops")
    parser.add_argument("--min-bytes", type=int, default=0x400, help="the shortest loop reported (bytes of code)")
    parser.add_argument("--list", action="store_true", help="also print each instruction: address, stall, waits")
    args = parser.parse_args()
    try:
        lines = (sys.stdin if args.sass == "-" else open(args.sass)).read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        fail(f"cannot read {args.sass}: {error}")
    functions = parse(lines)
    matched = [name for name in functions if args.kernel in name]
    if not matched:
        fail(f"no function in {args.sass} matches --kernel '{args.kernel}' (is it cuobjdump --dump-sass output?)")
    for name in matched:
        instructions = functions[name]
        ranges = [tuple(args.range)] if args.range else loops(instructions, args.min_bytes)
        print(f"{name}: {len(instructions)} instructions")
        for first, last in ranges:
            c = costs(instructions, first, last)
            counted = " ".join(f"{k} {c[k]}" for k in COUNTED if c[k])
            print(f"  {first:#06x}-{last:#06x}: {c['instructions']} instructions, {c['stall_cycles']} stall cycles, "
                  f"{c['scoreboard_waits']} scoreboard waits; {counted}")
            if args.list:
                for x in instructions:
                    if first <= x["address"] <= last:
                        waits = f"W{x['waits']:02x}" if x["waits"] else "   "
                        print(f"    {x['address']:#06x} {x['stall']:2d} {waits} {x['text']}")


if __name__ == "__main__":
    main()
