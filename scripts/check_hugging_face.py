#!/usr/bin/env python3
"""cinder's Hugging Face folders against `transformers` and PyTorch, end to end (run by CI).

    python scripts/check_hugging_face.py [--bin target/release] [--text data/tinyshakespeare.txt]

1. Small runs of each kind `export` writes are trained, exported and checked with
   check_hf_export.py (transformers' loss within 5e-4 of `evaluate`'s, identical greedy text,
   the tokenizer's round trip, the float16 copy transformers saves read back): NanoChat for the
   default recipe with characters and with a BPE, tied and untied, with and without a soft-cap,
   with grouped key/value heads; GPT-2 for nanoGPT's recipe.
2. A NanoChat that transformers makes and saves (random weights, a soft-cap) is read by cinder.
3. The default run goes on under `torchrun` with 2 CPU processes (gloo) for a few steps, from its
   exported folder, and comes back:
   - before any step, PyTorch's validation loss over the windows `evaluate` uses equals
     cinder's `evaluate --split val` of the run within 5e-4 (the same model, the same split);
   - the first step's training loss (the mean of the two processes' batches) is within the batch
     noise of cinder's last evaluation of the training split: within 4 standard deviations of
     the run's last per-step training losses;
   - both processes end with equal weights;
   - cinder reads the result and evaluates it on the validation text to PyTorch's last
     validation loss within 5e-4.

Needs torch and transformers 5. Exits 1 on any mismatch.
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 5e-4


def sh(*cmd, **kw):
    print("$", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def loss_of(out):
    match = re.search(r"loss ([0-9.]+)", out)
    if not match:
        sys.exit(f"no loss in: {out}")
    return float(match.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="target/release", help="the folder of cinder's binaries")
    p.add_argument("--text", default="data/tinyshakespeare.txt")
    args = p.parse_args()
    b = lambda name: os.path.join(args.bin, name)
    ok = True

    with tempfile.TemporaryDirectory() as work:
        text = os.path.join(work, "text.txt")
        with open(args.text, encoding="utf-8") as f:
            original = f.read(20_000)
        # Runs of spaces and characters beyond ASCII, which the tokenizers must keep.
        extra = "\nÉté — ça va?   Naïve   café,\t你好\n" * 3
        with open(text, "w", encoding="utf-8") as f:
            f.write(original[:10_000] + extra + original[10_000:])
        small = ["--data", text, "--n-layer", "2", "--n-head", "4", "--n-embd", "64",
                 "--block-size", "48", "--batch-size", "8", "--max-iters", "60",
                 "--warmup-iters", "10", "--lr-decay-iters", "60", "--eval-interval", "60",
                 "--eval-iters", "10", "--log-interval", "1", "--sample-tokens", "0", "-q"]
        recipe = ["--config", "configs/tiny_cpu.toml"]
        bpe = ["--tokenizer", "bpe", "--vocab-size", "300"]
        runs = {
            "chars-untied": recipe,
            "chars-tied-capped": recipe + ["--tie-embeddings", "true", "--logit-softcap", "15"],
            "chars-grouped": recipe + ["--n-kv-head", "2"],
            "bpe-untied-capped": recipe + bpe + ["--logit-softcap", "30"],
            "bpe-tied": recipe + bpe + ["--tie-embeddings", "true"],
            "gpt2-nanogpt": ["--config", "configs/nanogpt_cpu.toml"],
        }
        for name, flags in runs.items():
            run = os.path.join(work, name)
            sh(b("train"), *flags, *small, "--out", run)
            sh(b("export"), "--checkpoint", run, "--out", run + "-hf")
            check = subprocess.run([sys.executable, os.path.join(HERE, "check_hf_export.py"),
                                    run + "-hf", text, "--bin", args.bin],
                                   capture_output=True, text=True)
            print("\n".join(l for l in check.stdout.splitlines() if l.startswith(("ok", "MISMATCH"))))
            if check.returncode != 0:
                print(check.stdout[-2000:], check.stderr[-2000:])
                ok = False
            print(f"{name}: {'OK' if check.returncode == 0 else 'MISMATCH'}\n", flush=True)

        made = subprocess.run([sys.executable, os.path.join(HERE, "check_hf_export.py"),
                               "--made-by-transformers", text, "--bin", args.bin],
                              capture_output=True, text=True)
        print("\n".join(l for l in made.stdout.splitlines() if l.startswith(("ok", "MISMATCH"))))
        print(f"made by transformers: {'OK' if made.returncode == 0 else 'MISMATCH'}\n", flush=True)
        ok &= made.returncode == 0

        ok &= torchrun(work, text, b)
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


def torchrun(work, text, b):
    run, folder, out = (os.path.join(work, n) for n in ("chars-untied", "chars-untied-hf", "ddp"))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    result = sh(torchrun, "--nproc_per_node", "2", os.path.join(HERE, "continue_in_pytorch.py"),
                folder, "--data", text, "--steps", "4", "--batch-size", "8", "--eval-full",
                "--log-interval", "1", "--out", out, "--cpu",
                env={**os.environ, "OMP_NUM_THREADS": "1"})
    log = result.stdout + result.stderr
    print(log[-3000:])
    ok = True

    def close(what, a, b, tol):
        nonlocal ok
        good = abs(a - b) < tol
        ok &= good
        print(f"{'ok' if good else 'MISMATCH'}: {what}: {a:.6f} against {b:.6f} (within {tol:.4g})")

    first_val = float(re.search(r"step 0 \(the folder's weights\): val loss ([0-9.]+)", log).group(1))
    close("validation loss before any step: PyTorch, cinder's evaluate --split val", first_val,
          loss_of(sh(b("evaluate"), "--checkpoint", run, "--split", "val", "-q").stdout), TOLERANCE)

    first = float(re.search(r"first step train loss [0-9.]+ \(mean over ranks ([0-9.]+)\)", log).group(1))
    with open(os.path.join(run, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    train_losses = [float(r["train_loss"]) for r in rows if r.get("train_loss")][-10:]
    noise = statistics.stdev(train_losses)
    evals = [float(r["eval_train_loss"]) for r in rows if r.get("eval_train_loss")]
    close("first step's training loss in PyTorch, cinder's last evaluation of the training split",
          first, evals[-1], 4 * noise)

    diffs = [float(d) for d in re.findall(r"max \|weight - rank 0's\| over all ranks ([0-9.e+-]+)", log)]
    equal = len(diffs) == 2 and max(diffs) == 0.0
    ok &= equal
    print(f"{'ok' if equal else 'MISMATCH'}: both processes' weights equal after the steps: {diffs}")

    last_val = float(re.findall(r"val loss ([0-9.]+)", log)[-1])
    # The validation split is the text after the first 90% of its characters (one id each).
    val_text = os.path.join(work, "val.txt")
    with open(text, encoding="utf-8") as f:
        chars = f.read()
    with open(val_text, "w", encoding="utf-8") as f:
        f.write(chars[int(len(chars) * 0.9):])
    close("PyTorch's last validation loss, cinder's evaluate of its final folder", last_val,
          loss_of(sh(b("evaluate"), "--checkpoint", os.path.join(out, "final"), "--data", val_text,
                     "-q").stdout), TOLERANCE)
    print(f"torchrun: {'OK' if ok else 'MISMATCH'}\n", flush=True)
    return ok


if __name__ == "__main__":
    main()
