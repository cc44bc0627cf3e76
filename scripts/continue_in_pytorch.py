#!/usr/bin/env python3
"""Continue training a cinder model in PyTorch, with DistributedDataParallel across processes
and machines.

FOLDER is a Hugging Face NanoChat folder written by cinder's `export` (config.json,
model.safetensors, tokenizer.json, ...); `transformers` loads it as NanoChatForCausalLM.
--data is the run's token files (a folder written by `prepare`, or a run folder whose `data/`
holds them), or texts, encoded here with FOLDER's tokenizer.json and cut as cinder cuts them, so
the validation split is the same text as cinder's.

One machine (several GPUs, or several CPU processes):
    torchrun --nproc_per_node N scripts/continue_in_pytorch.py FOLDER --data DATA --out DIR
Several machines (run on each, R = 0 .. M-1; HOST:PORT is node 0, reachable from all):
    torchrun --nnodes M --node_rank R --master_addr HOST --master_port PORT \\
        --nproc_per_node N scripts/continue_in_pytorch.py FOLDER --data DATA --out DIR
Without torchrun it runs as one process. NCCL when CUDA is available (one GPU per process,
LOCAL_RANK), gloo on CPU.

Writes into --out (rank 0 only): latest/ (a NanoChat folder, float32, rewritten at each
evaluation and after the last step, so that --out reads as a run folder), final/ (the same,
written after the last step and its evaluation) and metrics.csv in cinder's columns.
Both folders hold tokenizer.json, tokenizer_config.json and generation_config.json copied from
FOLDER, so `AutoModelForCausalLM.from_pretrained(DIR/final)` and cinder's commands read them.

The data (cinder: crates/data/src/prepared.rs, split.rs, source.rs, crates/cinder/src/data.rs):
- A prepared folder holds train.bin and val.bin: raw little-endian token ids, 16-bit when the
  vocabulary has at most 65,536 tokens, else 32-bit, as meta.json's `token_bytes` says (2 or 4),
  with the token count of each split in meta.json; the split is already made (train.bin the
  first `train_fraction` of the text's characters, val.bin the rest).
- Texts: each file is read as UTF-8 with a leading byte-order mark dropped and every CRLF read
  as LF; several files (or a folder's .txt files in name order) are documents joined by a
  blank line (a character vocabulary, or a BPE without <|endoftext|>) or by the <|endoftext|>
  token (a BPE that has it). A character model's ids are cut after int(n * 0.9) of the ids (one
  character is one id); a BPE's text is cut after int(chars * 0.9) characters (a break counting
  0 characters, or 2 for a blank line), each part encoded on its own, in the pieces cinder
  encodes (so even a tokenizer whose pre-tokenizer does not cut at newlines gives cinder's ids).

The optimizer follows cinder's default (configs/tiny_cpu.toml; crates/cinder/src/run/optim.rs):
Muon for the matrices inside the blocks (q, k, v, o, fc1, fc2: NanoChat stores q/k/v apart,
which is what cinder's Muon does with its fused q/k/v weight: three matrices) at --muon-lr
with momentum 0.95 and decoupled weight decay 0.1; AdamW with betas (0.8, 0.95), epsilon 1e-10
and no weight decay for the token embedding (--embedding-lr, also a tied head's), an untied head
(--head-lr) and anything else (gains or biases, none in NanoChat: --lr). The schedule is
cinder's trapezoid: linear warm-up over --warmup of the steps, the peak held, then a linear
cool-down over the last --cooldown of the steps to --min-lr-ratio of each group's peak.

torch.optim.Muon (PyTorch 2.9 and later) is used when it exists. It is cinder's Muon (Nesterov
momentum as a lerp, 5 Newton-Schulz steps of Keller Jordan's coefficients (3.4445, -4.775,
2.0315), weight decay p *= 1 - lr*wd, the update scaled by sqrt(max(1, rows/cols)) of the
[out, in] weight: adjust_lr_fn "original") except that it runs Newton-Schulz in bfloat16 (cinder:
float32) and divides by max(norm, eps) (cinder: norm + eps, eps 1e-7): updates agree to
bfloat16's precision, not bit for bit. Without it, every parameter takes cinder's `adamw`
recipe instead (betas (0.9, 0.99), epsilon 1e-8, weight decay 0.1 on matrices, all at --lr),
and a note says so. Optimizer state is not in an exported folder (cinder's optimizer.bpk stays
in its checkpoint): Muon's momentum and AdamW's moments start from zero here, which is why a
short warm-up is the default.

Evaluation: --eval-iters random batches of each split (the same batches at every evaluation,
whatever the number of processes: batch i is drawn from a generator seeded by (--seed, split,
i) and evaluated by rank i mod world size); with --eval-full, the validation loss is over the
whole val split cut into consecutive non-overlapping windows of --block-size predictions (a
split shorter than that is one window), as cinder's `evaluate` does. Training batches are
random windows drawn by each rank from a generator seeded by (--seed, rank): every rank sees
different windows. These are not cinder's ChaCha8 batches.

Needs torch and transformers 5 (and numpy, tokenizers, which they bring).
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# Data

END_OF_TEXT = "<|endoftext|>"
BOM = "\ufeff"
# Text pieces (source.rs PIECE_BYTES) and encoding parts (bpe.rs encode_into PART), in bytes.
PIECE_BYTES = 1 << 20
PART_BYTES = 16 << 10
# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace also takes U+001C-1F.
RUST_WHITESPACE = set(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
)


def fail(message):
    sys.exit(f"continue_in_pytorch: {message}")


def read_document(path):
    """A text as cinder reads it (corpus.rs): UTF-8, the byte-order mark dropped (Corpus::text
    drops one and normalized_chars another), CRLF read as LF."""
    raw = open(path, "rb").read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path} is not valid UTF-8 (byte offset {e.start}); convert it first")
    for _ in range(2):
        if text.startswith(BOM):
            text = text[1:]
    text = text.replace("\r\n", "\n")
    if not text:
        fail(f"text file {path} is empty")
    return text


def document_paths(paths):
    """Files as given; a folder is its .txt files in name order (source.rs Sources::open)."""
    docs = []
    for p in paths:
        if os.path.isdir(p):
            files = sorted(
                os.path.join(p, f) for f in os.listdir(p)
                if f.endswith(".txt") and os.path.isfile(os.path.join(p, f))
            )
            if not files:
                fail(f"folder {p} has no .txt files")
            docs.extend(files)
        else:
            docs.append(p)
    return docs


def char_boundary(b, at):
    at = min(at, len(b))
    while at < len(b) and (b[at] & 0xC0) == 0x80:
        at += 1
    return at


def next_char_is_text(b, at):
    """Whether a character starts at byte `at` and is not whitespace."""
    if at >= len(b):
        return False
    end = char_boundary(b, at + 1)
    return b[at:end].decode("utf-8") not in RUST_WHITESPACE


def pieces_of(text):
    """A document in source.rs's pieces: cut after a newline followed by a non-space character
    once a piece holds PIECE_BYTES bytes."""
    b = text.encode("utf-8")
    start = 0
    while start < len(b):
        at = start + PIECE_BYTES - 1
        cut = None
        while True:
            nl = b.find(b"\n", at)
            if nl < 0:
                break
            if next_char_is_text(b, nl + 1):
                cut = nl + 1
                break
            at = nl + 1
        end = cut if cut is not None else len(b)
        yield b[start:end].decode("utf-8")
        start = end


def parts_of(text):
    """bpe.rs encode_into's parts of `text`: cut after a newline followed by a non-space
    character, at least PART_BYTES apart."""
    b = text.encode("utf-8")
    parts, start = [], 0
    i = char_boundary(b, PART_BYTES)
    while i < len(b):
        nl = b.find(b"\n", i)
        if nl < 0:
            break
        after = nl + 1
        if next_char_is_text(b, after):
            parts.append(b[start:after].decode("utf-8"))
            start = after
            i = char_boundary(b, after + PART_BYTES)
        else:
            i = after
    parts.append(b[start:].decode("utf-8"))
    return parts


class Tokenizer:
    """FOLDER's tokenizer.json, with what cinder makes of it."""

    def __init__(self, path):
        from tokenizers import Tokenizer as HfTokenizer
        self.path = path
        self.json = json.load(open(path, encoding="utf-8"))
        self.inner = HfTokenizer.from_file(path)
        model = self.json.get("model") or {}
        vocab = model.get("vocab") or {}
        # cinder's character vocabulary as exported (bpe.rs of_chars): a BPE without merges of
        # one token per character, no normaliser or pre-tokenizer.
        self.chars = None
        if (model.get("type") == "BPE" and not model.get("merges") and vocab
                and all(len(k) == 1 for k in vocab)
                and not self.json.get("pre_tokenizer") and not self.json.get("normalizer")):
            self.chars = dict(vocab)
        self.end_of_text = self.inner.token_to_id(END_OF_TEXT)
        self.vocab_size = self.inner.get_vocab_size(with_added_tokens=True)

    def encode(self, text):
        if self.chars is not None:
            try:
                return [self.chars[c] for c in text]
            except KeyError:
                unknown = sorted({c for c in text if c not in self.chars})
                fail(f"the text has characters the model's vocabulary lacks: {unknown[:20]!r}")
        parts = parts_of(text)
        enc = getattr(self.inner, "encode_batch_fast", self.inner.encode_batch)
        ids = []
        for e in enc(parts, add_special_tokens=False):
            ids.extend(e.ids)
        return ids


def split_texts(paths, tokenizer, fraction):
    """(train ids, val ids) of texts, cut as cinder cuts them."""
    if not 0.0 < fraction < 1.0:
        fail(f"--train-fraction is {fraction}, but it must be in (0, 1)")
    docs = [read_document(p) for p in document_paths(paths)]
    if tokenizer.chars is not None:
        # data.rs TrainingData::in_memory: the documents joined by a blank line, encoded, and
        # split.rs Splits::new cuts the ids after int(len * fraction).
        ids = tokenizer.encode("\n\n".join(docs))
        n_train = int(len(ids) * fraction)
        return ids[:n_train], ids[n_train:]
    # prepared.rs prepare with source.rs Cut: the cut is made on the text, in characters.
    brk_token = tokenizer.end_of_text
    break_chars = 0 if brk_token is not None else 2
    total = sum(len(d) for d in docs) + break_chars * (len(docs) - 1)
    cut = int(total * fraction)
    seen = 0
    out = ([], [])
    for i, doc in enumerate(docs):
        if i > 0:
            side = 0 if seen < cut else 1
            seen += break_chars
            if brk_token is not None:
                out[side].append(brk_token)
            else:
                out[side].extend(tokenizer.encode("\n\n"))
        for piece in pieces_of(doc):
            start, n = seen, len(piece)
            seen += n
            if seen <= cut:
                out[0].extend(tokenizer.encode(piece))
            elif start >= cut:
                out[1].extend(tokenizer.encode(piece))
            else:
                out[0].extend(tokenizer.encode(piece[:cut - start]))
                out[1].extend(tokenizer.encode(piece[cut - start:]))
    return out


def check_prepared_tokenizer(meta, data_dir, tokenizer):
    """The prepared folder's tokenizer must be the model's (data.rs OtherTokenizer)."""
    record = meta.get("tokenizer")
    same = True
    if isinstance(record, list):  # a character vocabulary, inline
        if tokenizer.chars is None:
            same = False
        else:
            same = len(record) == len(tokenizer.chars) and all(
                tokenizer.chars.get(c) == i for i, c in enumerate(record))
    elif isinstance(record, dict) and record.get("bpe"):
        theirs = json.load(open(os.path.join(data_dir, record["bpe"]), encoding="utf-8"))
        same = (theirs.get("model") == tokenizer.json.get("model")
                and [t.get("content") for t in theirs.get("added_tokens") or []]
                == [t.get("content") for t in tokenizer.json.get("added_tokens") or []])
    if not same:
        fail(f"{data_dir} was prepared with another tokenizer than {tokenizer.path}: prepare "
             f"the text again with it (prepare --tokenizer {tokenizer.path})")


def max_id(ids):
    step = 1 << 26
    return max(int(ids[i:i + step].max()) for i in range(0, len(ids), step))


def open_prepared(data_dir, tokenizer):
    """train.bin and val.bin memory-mapped (prepared.rs Prepared::open)."""
    meta = json.load(open(os.path.join(data_dir, "meta.json"), encoding="utf-8"))
    width = meta.get("token_bytes")
    if width not in (2, 4):
        fail(f"{data_dir}/meta.json: token_bytes is {width}, but must be 2 or 4")
    dtype = np.dtype("<u2" if width == 2 else "<u4")
    check_prepared_tokenizer(meta, data_dir, tokenizer)
    splits = []
    for name, split in (("train.bin", "train"), ("val.bin", "val")):
        path = os.path.join(data_dir, name)
        tokens = int(meta[split]["tokens"])
        size = os.path.getsize(path)
        if size != tokens * width:
            fail(f"{path} has {size} bytes, but {tokens} tokens of {width} bytes are recorded")
        splits.append(np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)) if tokens else
                      np.zeros(0, dtype))
    return splits


def load_data(args, tokenizer, vocab_size):
    """(train ids, val ids, description)."""
    paths = args.data
    if len(paths) == 1 and os.path.isdir(paths[0]):
        d = paths[0]
        for candidate in (d, os.path.join(d, "data")):
            if os.path.isfile(os.path.join(candidate, "meta.json")) and os.path.isfile(
                    os.path.join(candidate, "train.bin")):
                train, val = open_prepared(candidate, tokenizer)
                what = f"token files {candidate}/train.bin, val.bin ({train.dtype})"
                break
        else:
            if os.path.isdir(os.path.join(d, "latest")) or os.path.isfile(
                    os.path.join(d, "metrics.csv")):
                fail(f"{d} is a run folder without token files (a character run keeps its ids "
                     "in memory): pass the run's text with --data TEXT")
            train = val = None
    else:
        train = val = None
    if train is None:
        t, v = split_texts(paths, tokenizer, args.train_fraction)
        dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
        train, val = np.asarray(t, dtype=dtype), np.asarray(v, dtype=dtype)
        what = (f"text {', '.join(paths)} encoded with {tokenizer.path} "
                f"({'characters' if tokenizer.chars is not None else 'BPE'}), cut at "
                f"{args.train_fraction}")
    for name, ids in (("train", train), ("val", val)):
        if len(ids) < args.block_size + 1:
            fail(f"the {name} split has {len(ids)} tokens, but one window needs block_size + 1 = "
                 f"{args.block_size + 1}: lower --block-size")
        top = max_id(ids)
        if top >= vocab_size:
            fail(f"the {name} tokens hold id {top}, but the model has {vocab_size} tokens")
    return train, val, what


def windows(ids, starts, block):
    idx = starts[:, None] + np.arange(block + 1)[None, :]
    chunk = torch.from_numpy(np.asarray(ids[idx]).astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def random_batch(ids, rng, batch, block):
    # As cinder's Batcher: starts uniform in 0..=len - (block + 1).
    starts = rng.integers(0, len(ids) - block, size=batch)
    return windows(ids, starts, block)


# ----------------------------------------------------------------------------------------------
# Schedule and optimizer


def lr_factor(it, args):
    """Learning rate of iteration `it` (from 0) over the peak (schedule.rs learning_rate, with
    max_iters = lr_decay_iters = --steps)."""
    steps, low = args.steps, args.min_lr_ratio
    warmup = int(round(args.warmup * steps))
    if it < warmup:
        return (it + 1) / (warmup + 1)
    if it >= steps:
        return low
    if args.schedule == "cosine":
        ratio = (it - warmup) / max(steps - warmup, 1)
        return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - low)
    cooldown = int(args.cooldown * steps)
    left = steps - it
    return 1.0 if left > cooldown else max(left / cooldown, low)


def make_optimizers(model, args, log):
    """A list of optimizers whose param groups carry `peak` (each group's peak rate)."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    head = out.weight if out is not None and out.weight is not emb else None
    params = [p for p in model.parameters() if p.requires_grad]
    special = {id(emb)} | ({id(head)} if head is not None else set())
    matrices = [p for p in params if p.ndim == 2 and id(p) not in special]
    others = [p for p in params if p.ndim != 2 and id(p) not in special]
    kind = args.optimizer
    if kind == "muon" and not hasattr(torch.optim, "Muon"):
        log(f"NOTE: torch {torch.__version__} has no torch.optim.Muon (PyTorch 2.9+): using "
            f"cinder's `adamw` recipe for every parameter instead (betas ({args.beta1}, "
            f"{args.beta2}), weight decay {args.weight_decay} on matrices, lr {args.lr})")
        kind = "adamw"
    optimizers = []
    if kind == "muon":
        muon = torch.optim.Muon(
            [{"params": matrices, "lr": args.muon_lr, "peak": args.muon_lr}],
            lr=args.muon_lr, weight_decay=args.weight_decay, momentum=args.muon_momentum,
            nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
            adjust_lr_fn="original")
        groups = [{"params": [emb], "peak": args.embedding_lr}]
        if head is not None:
            groups.append({"params": [head], "peak": args.head_lr})
        if others:
            groups.append({"params": others, "peak": args.lr})
        for g in groups:
            g["lr"] = g["peak"]
        adamw = torch.optim.AdamW(groups, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)
        optimizers = [muon, adamw]
        log(f"optimizer: torch.optim.Muon on {len(matrices)} matrices (lr {args.muon_lr}, "
            f"momentum {args.muon_momentum}, weight decay {args.weight_decay}; Newton-Schulz in "
            f"bfloat16, cinder's in float32), AdamW betas (0.8, 0.95) on the embedding (lr "
            f"{args.embedding_lr})" + (f", the head (lr {args.head_lr})" if head is not None
                                       else " (the head is tied to it)")
            + (f", {len(others)} other tensors (lr {args.lr})" if others else "")
            + "; optimizer state starts from zero (it is not in the folder)")
    else:
        decayed = [p for p in params if p.ndim >= 2]
        flat = [p for p in params if p.ndim < 2]
        groups = [{"params": decayed, "weight_decay": args.weight_decay, "peak": args.lr}]
        if flat:
            groups.append({"params": flat, "weight_decay": 0.0, "peak": args.lr})
        for g in groups:
            g["lr"] = g["peak"]
        optimizers = [torch.optim.AdamW(groups, betas=(args.beta1, args.beta2), eps=1e-8)]
        log(f"optimizer: AdamW betas ({args.beta1}, {args.beta2}), lr {args.lr}, weight decay "
            f"{args.weight_decay} on matrices; state starts from zero")
    return optimizers


# ----------------------------------------------------------------------------------------------
# Distributed


class Dist:
    def __init__(self, force_cpu):
        self.on = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) >= 1 and \
            "RANK" in os.environ
        cuda = torch.cuda.is_available() and not force_cpu
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.backend = "nccl" if cuda else "gloo"
        if self.on:
            if cuda:
                dist.init_process_group(backend="nccl", device_id=self.device)
            else:
                dist.init_process_group(backend="gloo")
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world = 0, 1

    def sum(self, values):
        """Element-wise sum over ranks of a list of floats (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.on:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def barrier(self):
        if self.on:
            dist.barrier()

    def close(self):
        if self.on:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Evaluation, checkpoints, metrics


def batch_loss(model, x, y, dev, amp):
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=x.to(dev, non_blocking=True), use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                           y.to(dev, non_blocking=True).reshape(-1))


@torch.no_grad()
def random_eval(model, ids, split_no, args, d):
    """Mean loss over --eval-iters fixed random batches, shared out among the ranks."""
    total = 0.0
    for i in range(d.rank, args.eval_iters, d.world):
        rng = np.random.default_rng([args.seed, 1, split_no, i])
        x, y = random_batch(ids, rng, args.batch_size, args.block_size)
        total += batch_loss(model, x, y, d.device, args.bf16).item()
    (total,) = d.sum([total])
    return total / max(args.eval_iters, 1)


@torch.no_grad()
def full_eval(model, ids, args, d):
    """Mean loss over consecutive windows of block_size predictions (eval.rs text_loss; the
    tokens after the last whole window are left out)."""
    block = min(args.block_size, len(ids) - 1)
    n = (len(ids) - 1) // block
    mine = np.arange(d.rank, n, d.world)
    total = 0.0
    for first in range(0, len(mine), args.eval_batch_size):
        starts = mine[first:first + args.eval_batch_size] * block
        x, y = windows(ids, starts, block)
        total += batch_loss(model, x, y, d.device, args.bf16).item() * len(starts)
    (total,) = d.sum([total])
    return total / max(n, 1)


def evaluate(model, train, val, args, d):
    """(val loss, train loss measured like it, or None)."""
    model.eval()
    if args.eval_full:
        val_loss = full_eval(model, val, args, d)
    else:
        val_loss = random_eval(model, val, 1, args, d) if args.eval_iters else None
    train_loss = random_eval(model, train, 0, args, d) if args.eval_iters else None
    model.train()
    return val_loss, train_loss


def save_folder(model, source, out, name):
    """OUT/name as a NanoChat folder (float32), written aside then renamed into place."""
    final = os.path.join(out, name)
    tmp = os.path.join(out, f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.isfile(os.path.join(source, f)):
            shutil.copyfile(os.path.join(source, f), os.path.join(tmp, f))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


# metrics.csv in cinder's columns (crates/cinder/src/run/metrics.rs HEADER and Row::to_csv).
# A row each --log-interval steps and at each evaluation: iter (steps done here, from 1),
# train_loss (the step's loss, mean over ranks), val_loss and eval_train_loss (at evaluations
# only, else empty, as in cinder), lr (the base rate, --lr times the schedule: each group's rate
# is its peak times the same factor), tokens_per_s (tokens of the step over all ranks, over the
# step's seconds), elapsed_s (seconds since this script started training). Every column is
# filled where cinder fills it; eval_train_loss is empty with --eval-iters 0.
METRICS_HEADER = "iter,train_loss,val_loss,eval_train_loss,lr,tokens_per_s,elapsed_s"


def rust_f32(x):
    """Rust's `{}` of an f32: the shortest digits, never an exponent."""
    return np.format_float_positional(np.float32(x), unique=True, trim="-")


def rust_e4(x):
    """Rust's `{:.4e}`: 1.0000e-3 (no padding of the exponent, no plus sign)."""
    mantissa, exponent = f"{x:.4e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def metrics_row(it, train_loss, val, eval_train, lr, tps, elapsed):
    opt = lambda v: "" if v is None else rust_f32(v)  # noqa: E731
    return (f"{it},{rust_f32(train_loss)},{opt(val)},{opt(eval_train)},{rust_e4(lr)},"
            f"{tps:.1f},{elapsed:.3f}\n")


# ----------------------------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("Writes into")[0],
        epilog="Writes into" + __doc__.split("Writes into")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="a NanoChat folder written by cinder's `export`")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="a prepared folder (train.bin, val.bin, meta.json), a run folder whose "
                        "data/ holds them, or UTF-8 texts / folders of .txt files")
    p.add_argument("--tokenizer", help="tokenizer.json for texts [default: FOLDER's]")
    p.add_argument("--train-fraction", type=float, default=0.9,
                   help="texts only: leading fraction that trains, as cinder's train_fraction")
    p.add_argument("--out", required=True, help="folder for latest/, final/ and metrics.csv")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=24, help="windows per micro-batch per rank")
    p.add_argument("--block-size", type=int,
                   help="tokens per window [default: config.json's max_position_embeddings]")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches averaged into one step (per rank)")
    p.add_argument("--optimizer", choices=["muon", "adamw"], default="muon",
                   help="cinder's two recipes (muon falls back to adamw without torch.optim.Muon)")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="base peak rate: gains/biases with muon, everything with adamw")
    p.add_argument("--muon-lr", type=float, default=0.02)
    p.add_argument("--muon-momentum", type=float, default=0.95)
    p.add_argument("--embedding-lr", type=float, default=0.01,
                   help="the token embedding's (and a tied head's) peak rate, with muon")
    p.add_argument("--head-lr", type=float, default=0.004, help="an untied head's, with muon")
    p.add_argument("--weight-decay", type=float, default=0.1,
                   help="on Muon's matrices (muon), on all matrices (adamw)")
    p.add_argument("--beta1", type=float, default=0.9, help="adamw recipe only")
    p.add_argument("--beta2", type=float, default=0.99, help="adamw recipe only")
    p.add_argument("--grad-clip", type=float, default=0.0, help="global norm; 0: off (cinder's)")
    p.add_argument("--schedule", choices=["trapezoid", "cosine"], default="trapezoid")
    p.add_argument("--warmup", type=float, default=0.1,
                   help="fraction of --steps warming up linearly (tiny_cpu: 100 of 880)")
    p.add_argument("--cooldown", type=float, default=0.5,
                   help="trapezoid: last fraction of --steps cooling down linearly")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="each group ends at this fraction of its peak (cinder's min_lr/lr)")
    p.add_argument("--eval-interval", type=int, default=0,
                   help="evaluate and write latest/ every this many steps (and at the end); "
                        "0: at the end only")
    p.add_argument("--eval-iters", type=int, default=20,
                   help="random batches per split per evaluation (all ranks together)")
    p.add_argument("--eval-full", action="store_true",
                   help="val loss over the whole val split in consecutive windows (cinder's "
                        "`evaluate`)")
    p.add_argument("--eval-batch-size", type=int, help="windows per batch with --eval-full")
    p.add_argument("--no-eval-first", action="store_true",
                   help="skip the evaluation before the first step (printed, not logged)")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast for forward and backward (weights stay float32)")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU (gloo) even with CUDA")
    args = p.parse_args()
    if args.steps < 1 or args.batch_size < 1 or args.grad_accum < 1:
        p.error("--steps, --batch-size and --grad-accum must be at least 1")
    if not (0 <= args.warmup <= 1 and 0 <= args.cooldown <= 1):
        p.error("--warmup and --cooldown are fractions of --steps, in [0, 1]")
    args.eval_batch_size = args.eval_batch_size or args.batch_size
    return args


def main():
    args = parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    d = Dist(args.cpu)
    log = (lambda *a: print(*a, flush=True)) if d.rank == 0 else (lambda *a: None)

    config = AutoConfig.from_pretrained(args.folder)
    if config.model_type != "nanochat":
        fail(f"{args.folder} is model_type {config.model_type!r}: this script continues "
             "NanoChat folders (cinder's default recipe; `export` writes one), whose optimizer "
             "groups it knows")
    args.block_size = args.block_size or config.max_position_embeddings
    tokenizer = Tokenizer(args.tokenizer or os.path.join(args.folder, "tokenizer.json"))
    train, val, what = load_data(args, tokenizer, config.vocab_size)

    if d.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        taken = [n for n in ("latest", "final", "metrics.csv")
                 if os.path.exists(os.path.join(args.out, n))]
        if taken and not args.overwrite:
            fail(f"{args.out} already holds {', '.join(taken)}: choose another --out, or pass "
                 "--overwrite")
    d.barrier()

    torch.manual_seed(args.seed + d.rank)
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
    model.to(d.device).train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{args.folder}: {type(model).__name__}, {n_params:,} parameters, "
        f"{config.num_hidden_layers} layers, context {config.max_position_embeddings}")
    log(f"data: {what}; train {len(train):,} tokens, val {len(val):,} tokens")
    log(f"{d.world} process(es), backend {d.backend if d.on else 'none'}, device "
        f"{d.device.type}; batch {args.batch_size} x {args.block_size} x accum {args.grad_accum} "
        f"per rank = {args.batch_size * args.block_size * args.grad_accum * d.world:,} tokens "
        f"per step")

    optimizers = make_optimizers(model, args, log)
    if d.on:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    else:
        ddp = model

    if not args.no_eval_first:
        v, t = evaluate(model, train, val, args, d)
        log(f"step 0 (the folder's weights): val loss {v if v is None else f'{v:.4f}'}, "
            f"train loss {t if t is None else f'{t:.4f}'}")

    metrics = open(os.path.join(args.out, "metrics.csv"), "w") if d.rank == 0 else None
    if metrics:
        metrics.write(METRICS_HEADER + "\n")
        metrics.flush()
    rng = np.random.default_rng([args.seed, 0, d.rank])
    tokens_per_step = args.batch_size * args.block_size * args.grad_accum * d.world
    started = time.time()
    for it in range(args.steps):
        t0 = time.time()
        factor = lr_factor(it, args)
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["peak"] * factor
        loss_sum = 0.0
        for micro in range(args.grad_accum):
            x, y = random_batch(train, rng, args.batch_size, args.block_size)
            last = micro == args.grad_accum - 1
            sync = ddp.no_sync() if (d.on and not last) else contextlib.nullcontext()
            with sync:
                loss = batch_loss(ddp, x, y, d.device, args.bf16) / args.grad_accum
                loss.backward()
            loss_sum += loss.item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        done = it + 1
        seconds = time.time() - t0
        is_last = done == args.steps
        is_eval = is_last or (args.eval_interval > 0 and done % args.eval_interval == 0)
        is_log = is_eval or done % args.log_interval == 0 or it == 0
        if not math.isfinite(loss_sum):
            fail(f"rank {d.rank}: the loss is {loss_sum} at step {done}")
        if is_log:
            (mean_loss,) = d.sum([loss_sum])
            mean_loss /= d.world
            if it == 0:
                print(f"rank {d.rank}: first step train loss {loss_sum:.6f} (mean over ranks "
                      f"{mean_loss:.6f})", flush=True)
        val_loss = eval_train = None
        if is_eval:
            val_loss, eval_train = evaluate(model, train, val, args, d)
        lr = args.lr * factor
        if is_log:
            if d.rank == 0 and (done % args.log_interval == 0 or is_eval):
                metrics.write(metrics_row(done, mean_loss, val_loss, eval_train, lr,
                                          tokens_per_step / max(seconds, 1e-9),
                                          time.time() - started))
                metrics.flush()
            msg = f"step {done}/{args.steps}: train loss {mean_loss:.4f}, lr factor {factor:.4f}"
            if is_eval:
                msg += (f", val loss {val_loss:.4f}" if val_loss is not None else "") + (
                    f", eval train loss {eval_train:.4f}" if eval_train is not None else "")
            log(msg + f", {tokens_per_step / max(seconds, 1e-9):,.0f} tokens/s")
        if is_eval and d.rank == 0:
            # latest/ always, so that --out reads as a run folder (cinder's commands take
            # best/, else latest/); final/ too after the last step.
            for name in ["latest", "final"] if is_last else ["latest"]:
                log(f"wrote {save_folder(model, args.folder, args.out, name)}")
    if metrics:
        metrics.close()

    # Every rank's weights must be equal: a checksum each, and the largest difference from rank
    # 0's over all ranks.
    with torch.no_grad():
        flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
        checksum = flat.sum().item()
        ref = flat.clone()
        if d.on:
            dist.broadcast(ref, src=0)
        diff = (flat - ref).abs().max()
        if d.on:
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    print(f"rank {d.rank}: weight checksum {checksum:.12e}; max |weight - rank 0's| over all "
          f"ranks {diff.item():.3e}", flush=True)
    d.barrier()
    d.close()


if __name__ == "__main__":
    main()
