#!/usr/bin/env python3
"""Checks cinder's Hugging Face folders (GPT-2 and NanoChat) against `transformers` itself.

    python scripts/check_hf_export.py DIR TEXT [--bin target/release]
    python scripts/check_hf_export.py --made-by-transformers TEXT [--bin target/release]

For a folder written by cinder's `export`:
1. `AutoModelForCausalLM` and `AutoTokenizer` load it without remote code, and the tokenizer
   decodes its ids of TEXT back to TEXT exactly (that they are cinder's ids shows in 2).
2. transformers' loss equals what `evaluate --checkpoint DIR --data TEXT` prints, within 5e-4:
   on TEXT cut into the windows `evaluate` uses (consecutive windows of the context, or one
   window of the text's length if it is shorter), and on TEXT's first line (one window).
3. Greedy continuations are identical: transformers' `generate(do_sample=False)` and cinder's
   `generate --temperature 0`, while prompt and continuation fit in the context.
4. The model saved back by transformers (`save_pretrained`, in float16) loads in cinder and
   gives the same loss within 1e-2 (half precision).

With `--made-by-transformers`: a small NanoChat with random weights and a soft-cap, made and
saved by transformers with TEXT's characters as its vocabulary, must evaluate in cinder to
transformers' loss within 5e-4 and sample the same greedy text.

Needs torch and transformers 5 (`pip install torch transformers`). Exits 1 on a mismatch.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

TOLERANCE = 5e-4


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read().replace("\r\n", "\n").lstrip("\ufeff")


def hf_loss(model, ids, block):
    """Mean next-token loss over consecutive windows of `block` predictions, as `evaluate`."""
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


def context(model):
    c = model.config
    return getattr(c, "n_positions", None) or c.max_position_embeddings


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def cinder_loss(bin_dir, folder, text_path):
    out = run([os.path.join(bin_dir, "evaluate"), "--checkpoint", folder, "--data", text_path, "-q"])
    match = re.search(r"loss ([0-9.]+)", out)
    if not match:
        sys.exit(f"unexpected output from evaluate: {out}")
    return float(match.group(1))


def cinder_greedy(bin_dir, folder, prompt, tokens):
    # `generate` ends what it prints with a newline of its own.
    return run([
        os.path.join(bin_dir, "generate"), "--checkpoint", folder, "--prompt", prompt,
        "--max-new-tokens", str(tokens), "--temperature", "0", "-q",
    ])[:-1]


def hf_greedy(model, tokenizer, prompt, tokens):
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=tokens, min_new_tokens=tokens)
    return tokenizer.decode(out[0, ids.shape[1]:])


class Checks:
    def __init__(self):
        self.ok = True

    def close(self, what, theirs, ours, tolerance):
        good = abs(theirs - ours) < tolerance
        print(f"{'ok' if good else 'MISMATCH'}: {what}: transformers {theirs:.6f}, cinder {ours:.6f}")
        self.ok &= good

    def same(self, what, theirs, ours):
        good = theirs == ours
        print(f"{'ok' if good else 'MISMATCH'}: {what}: transformers {theirs!r}, cinder {ours!r}")
        self.ok &= good


def compare(folder, text_path, bin_dir, checks, saved_back=True):
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = read_text(text_path)
    ids = tokenizer(text)["input_ids"]
    print(f"{folder}: {type(model).__name__}, {model.config.num_hidden_layers} layers, "
          f"{model.num_parameters():,} parameters, {len(tokenizer)} tokens; {len(ids):,} tokens of text")
    checks.same("the tokenizer round-trips the text", tokenizer.decode(ids) == text, True)

    block = context(model)
    checks.close("loss over evaluate's windows", hf_loss(model, ids, block),
                 cinder_loss(bin_dir, folder, text_path), TOLERANCE)
    with tempfile.TemporaryDirectory() as tmp:
        line = text.split("\n")[0][: block // 2] or text[: block // 2]
        short = os.path.join(tmp, "line.txt")
        with open(short, "w", encoding="utf-8") as f:
            f.write(line)
        checks.close(f"loss of one window ({line!r})", hf_loss(model, tokenizer(line)["input_ids"], block),
                     cinder_loss(bin_dir, folder, short), TOLERANCE)

    prompt = text[:8]
    tokens = block - len(tokenizer(prompt)["input_ids"])
    checks.same(f"greedy continuation of {prompt!r} ({tokens} tokens)",
                hf_greedy(model, tokenizer, prompt, tokens), cinder_greedy(bin_dir, folder, prompt, tokens))

    if saved_back:
        with tempfile.TemporaryDirectory() as saved:
            model.to(torch.float16).save_pretrained(saved)
            tokenizer.save_pretrained(saved)
            checks.close("saved back by transformers in float16 (cinder's loss)",
                         cinder_loss(bin_dir, folder, text_path), cinder_loss(bin_dir, saved, text_path), 1e-2)


def made_by_transformers(text_path, bin_dir, checks):
    """A NanoChat of transformers' own making, with TEXT's characters as its vocabulary."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import NanoChatConfig, NanoChatForCausalLM, PreTrainedTokenizerFast

    text = read_text(text_path)
    chars = sorted(set(text))
    vocab = {c: i for i, c in enumerate(chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
    torch.manual_seed(0)
    config = NanoChatConfig(
        vocab_size=len(chars), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        final_logit_softcapping=15.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = NanoChatForCausalLM(config).eval()
    with torch.no_grad():  # transformers' initialisation is too quiet to tell layers apart
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        print(f"made by transformers: {json.load(open(os.path.join(folder, 'config.json')))}")
        compare(folder, text_path, bin_dir, checks, saved_back=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", metavar="[DIR] TEXT",
                   help="a folder written by `export` (not with --made-by-transformers), and a UTF-8 text")
    p.add_argument("--bin", default="target/release", help="the folder of cinder's binaries")
    p.add_argument("--made-by-transformers", action="store_true",
                   help="check a NanoChat that transformers makes and saves instead")
    args = p.parse_args()
    checks = Checks()
    if args.made_by_transformers and len(args.paths) == 1:
        made_by_transformers(args.paths[0], args.bin, checks)
    elif not args.made_by_transformers and len(args.paths) == 2:
        compare(*args.paths, args.bin, checks)
    else:
        p.error("give DIR and TEXT, or --made-by-transformers and TEXT")
    print("\nOK" if checks.ok else "\nMISMATCH")
    sys.exit(0 if checks.ok else 1)


if __name__ == "__main__":
    main()
