#!/usr/bin/env python3
"""Writes a large synthetic UTF-8 text for memory and throughput measurements (BENCHMARKS.md).

The text is synthetic: paragraphs cut at random from the corpora at hand (Tiny Shakespeare and
this repository's Markdown files), with one paragraph in five followed by a line of random
Unicode words (Latin, Greek, Cyrillic, CJK, emoji, combining marks). The same seed and size give
the same bytes.

    python3 scripts/make_big_text.py --size-mb 1100 --seed 1 --out /tmp/big.txt
"""
import argparse
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent

RANGES = [
    (0x0041, 0x007A), (0x00C0, 0x017F), (0x0391, 0x03C9), (0x0410, 0x044F),
    (0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x1F300, 0x1F64F),
]


def corpora():
    texts = [(ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")]
    texts += [p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("*.md"))]
    return texts


def unicode_words(rng, n):
    words = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        word = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
        if rng.random() < 0.1:
            word += "\u0301"  # a combining acute accent
        words.append(word)
    return words


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, required=True, help="stop after this many MB (10^6 bytes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    texts = corpora()
    pool = unicode_words(rng, 20000)
    target = int(a.size_mb * 1e6)
    written = 0
    with open(a.out, "w", encoding="utf-8", newline="\n") as f:
        while written < target:
            chunk = []
            for _ in range(1000):
                text = rng.choice(texts)
                start = rng.randrange(0, max(1, len(text) - 2000))
                para = text[start:start + rng.randint(200, 2000)]
                chunk.append(para)
                if rng.random() < 0.2:
                    chunk.append("\n" + " ".join(rng.choice(pool) for _ in range(rng.randint(3, 30))))
                chunk.append("\n\n")
            data = "".join(chunk).encode("utf-8")
            f.write(data.decode("utf-8"))
            written += len(data)
    print(f"wrote {written / 1e6:.1f} MB to {a.out} (seed {a.seed})")


if __name__ == "__main__":
    main()
