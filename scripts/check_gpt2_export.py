#!/usr/bin/env python3
"""Checks a folder written by cinder's `export` with Hugging Face transformers.

    python scripts/check_gpt2_export.py DIR TEXT [--evaluate target/release/evaluate]

1. `GPT2LMHeadModel.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load it.
2. transformers computes the loss on TEXT the way cinder's `evaluate` does (consecutive windows
   of the context length, or one window of the text's length if it is shorter) and it must
   equal what `evaluate --checkpoint DIR --data TEXT` prints, within 1e-3 nats.
3. The model and tokenizer saved back by transformers (`save_pretrained`, in float16) load in
   cinder again and give the same loss within 1e-2 (half precision).

Needs torch and transformers (`pip install torch transformers`); not part of CI. Exits 1 on a
mismatch.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GPT2LMHeadModel


def hf_loss(model, ids, block):
    """Mean next-token loss over consecutive windows of `block` predictions."""
    block = min(block, len(ids) - 1)
    windows = (len(ids) - 1) // block
    total = 0.0
    with torch.no_grad():
        for w in range(windows):
            x = torch.tensor([ids[w * block:(w + 1) * block]])
            y = torch.tensor([ids[w * block + 1:(w + 1) * block + 1]])
            logits = model(x).logits
            total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item()
    return total / windows


def cinder_loss(evaluate, folder, text):
    out = subprocess.run(
        [evaluate, "--checkpoint", folder, "--data", text, "-q"],
        check=True, capture_output=True, text=True,
    ).stdout
    match = re.search(r"loss ([0-9.]+)", out)
    if not match:
        sys.exit(f"unexpected output from {evaluate}: {out}")
    return float(match.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="a folder written by `export`")
    p.add_argument("text", help="a UTF-8 text to measure on")
    p.add_argument("--evaluate", default="target/release/evaluate", help="cinder's evaluate binary")
    args = p.parse_args()

    model = GPT2LMHeadModel.from_pretrained(args.dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.dir)
    with open(args.text, encoding="utf-8") as f:
        text = f.read().replace("\r\n", "\n").lstrip("\ufeff")
    ids = tokenizer(text)["input_ids"]
    print(f"{args.dir}: {model.config.n_layer} layers, {model.num_parameters():,} parameters, "
          f"{len(tokenizer)} tokens; {len(ids):,} tokens of text")
    assert tokenizer.decode(ids) == text, "the tokenizer does not round-trip the text"

    ok = True
    theirs = hf_loss(model, ids, model.config.n_positions)
    ours = cinder_loss(args.evaluate, args.dir, args.text)
    print(f"loss: transformers {theirs:.4f}, cinder {ours:.4f}")
    ok &= abs(theirs - ours) < 1e-3

    with tempfile.TemporaryDirectory() as saved:
        model.to(torch.float16).save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        back = cinder_loss(args.evaluate, saved, args.text)
        print(f"saved back by transformers in float16: cinder {back:.4f}")
        ok &= abs(back - ours) < 1e-2

    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
