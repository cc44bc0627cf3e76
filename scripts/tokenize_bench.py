#!/usr/bin/env python3
"""Throughput of Hugging Face's Python `tokenizers` on a text, to compare with `prepare`'s MB/s
(BENCHMARKS.md). Reads the text in blocks of about 8 MB cut at line ends, encodes each block's
lines with encode_batch (parallel, as the library does by default), and counts ids.

    pip install tokenizers
    python3 scripts/tokenize_bench.py --tokenizer run/data/tokenizer.json --text big.txt
"""
import argparse
import json
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    t0 = time.perf_counter()
    n_bytes = n_ids = 0
    with open(a.text, encoding="utf-8", newline="") as f:
        while True:
            lines = f.readlines(8 << 20)
            if not lines:
                break
            for enc in tok.encode_batch_fast(lines, add_special_tokens=False):
                n_ids += len(enc.ids)
            n_bytes += sum(len(line.encode("utf-8")) for line in lines)
    secs = time.perf_counter() - t0
    print(json.dumps({"impl": "python-tokenizers", "MB": round(n_bytes / 1e6, 1), "ids": n_ids,
                      "seconds": round(secs, 1), "MB_per_s": round(n_bytes / 1e6 / secs, 2)}))


if __name__ == "__main__":
    main()
