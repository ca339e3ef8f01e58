#!/usr/bin/env python3
"""Prints the code point ranges src/data/pretokenizer.cpp adds to PCRE2's \\p{L} and \\p{N}.

Debian 12's PCRE2 (10.42) classifies characters by Unicode 14.0; Hugging Face `tokenizers`
(Oniguruma, and Rust's char::is_numeric for the Digits pre-tokenizer) by Unicode 16.0. The
characters assigned in between are unassigned (Cn) to PCRE2, so its \\p{L} and \\p{N} miss
them. No character changed between L, N and the rest among those assigned in both versions
(this script checks), so adding the new letters and numbers to the classes is exact; with a
newer PCRE2 the additions are redundant and harmless.

Run with an interpreter whose unicodedata is Unicode 14.0 (Python 3.11) and the PyPI package
unicodedata2 16.x installed:

    python3.11 tools/pretokenizer_unicode_additions.py

With unicodedata2 17.x instead, the \\p{N} line less the 16.x one is the SmolLm pattern's
extra numbers (@D): Rust's char::is_numeric, which the Digits pre-tokenizer of tokenizers
0.23.3 uses, follows Unicode 17.0.
"""

from __future__ import annotations

import sys
import unicodedata

import unicodedata2

OLD = "14.0.0"


def ranges(points: list[int]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for point in points:
        if merged and merged[-1][1] == point - 1:
            merged[-1][1] = point
        else:
            merged.append([point, point])
    return [(first, last) for first, last in merged]


def main() -> int:
    if unicodedata.unidata_version != OLD:
        print(f"need unicodedata {OLD}, have "
              f"{unicodedata.unidata_version} and {unicodedata2.unidata_version}", file=sys.stderr)
        return 1
    for major in "LN":
        added, changed = [], []
        for point in range(0x110000):
            old = unicodedata.category(chr(point))
            new = unicodedata2.category(chr(point))
            if new[0] == major and old == "Cn":
                added.append(point)
            elif old != "Cn" and (old[0] == major) != (new[0] == major):
                changed.append(point)
        if changed:
            print(f"{major}: assigned characters changed class: {changed}", file=sys.stderr)
            return 1
        text = "".join(
            f"\\x{{{first:X}}}" if first == last else f"\\x{{{first:X}}}-\\x{{{last:X}}}"
            for first, last in ranges(added))
        print(f"// \\p{{{major}}}: {len(added)} characters of Unicode {OLD}.."
              f"{unicodedata2.unidata_version}")
        print(f'R"({text})"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
