#!/usr/bin/env python3
"""Writes a Hugging Face GPT-2 folder of one of OpenAI's sizes, with random weights: for
measuring cinder on GPT-2's shapes without downloading the weights.

    python scripts/make_gpt2_folder.py OUT [--size 124M] [--text data/tinyshakespeare.txt]

The model is `transformers`' own GPT2LMHeadModel (its initialisation, saved with
`save_pretrained`: model.safetensors in float32 unless --dtype says otherwise). The tokenizer
is a byte-level BPE trained on TEXT up to GPT-2's 50,257 tokens (a small text gives fewer; the
model keeps 50,257 rows, which cinder reads as a padded vocabulary). Needs torch and
transformers; not part of CI.
"""

import argparse
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

SIZES = {  # n_layer, n_head, n_embd: OpenAI's four GPT-2 models
    "124M": (12, 12, 768),
    "355M": (24, 16, 1024),
    "774M": (36, 20, 1280),
    "1558M": (48, 25, 1600),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", choices=SIZES, default="124M")
    p.add_argument("--text", default="data/tinyshakespeare.txt")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()
    if os.path.exists(args.out) and os.listdir(args.out):
        raise SystemExit(f"{args.out} exists and is not empty")

    torch.manual_seed(args.seed)
    n_layer, n_head, n_embd = SIZES[args.size]
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd)  # vocab 50257, 1024 positions
    model = GPT2LMHeadModel(config).to(getattr(torch, args.dtype))
    model.save_pretrained(args.out)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train([args.text], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(args.out)
    print(f"{args.out}: GPT-2 {args.size} shape ({model.num_parameters():,} parameters, "
          f"{args.dtype}), random weights; tokenizer of {bpe.get_vocab_size():,} tokens")


if __name__ == "__main__":
    main()
