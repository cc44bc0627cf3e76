#!/usr/bin/env python3
"""Screens the modded-nanogpt speedrun's newer pieces on cinder's default recipe, in PyTorch.

The model and optimizer are ../shared/bench/torch_recipe.py's --modern --muon --schedule
trapezoid (cinder's configs/tiny_cpu.toml: 4 x 4 x 128, context 64, 880 steps of 24, Muon on the
blocks' matrices, AdamW on the embedding and the untied head), on characters. --pieces adds, each
in the simplest form the speedrun (KellerJordan/modded-nanogpt, train_gpt.py) or nanochat gives it:

  ve        value embeddings: on alternating layers ending at the last (nanochat's choice), a
            table [V, C] per layer added to the values, gated per head by 2 sigmoid(W x[:12]),
            W zero-initialised (the speedrun's gate); the tables normal(0, 0.01)
  unet      U-net skips: the first half's block outputs added to the second half's inputs in
            reverse order, each times a learned scalar starting at 1
  smear     the smear gate: the token embedding at t gets lambda sigmoid(W x_t[:12]) x_{t-1},
            lambda and W starting at 0
  backout   before the final norm, lambda (starting at 0.5) times the residual stream after
            2/3 of the blocks subtracted
  bigram    an embedding of (previous token, token), hashed into min(V^2, 8 V) + 1 rows,
            zero-initialised, added to the token embedding
  polar     Polar Express in place of Newton-Schulz (the speedrun's five coefficient triples,
            the matrix divided by 1.02 times its norm first)
  normuon   NorMuon: each orthogonalised update's rows (or columns, along the longer side)
            normalised by a running mean of their squares (beta2 0.9), the matrix's norm kept
  cautious  cautious weight decay: Muon's weights decay only where the update has their sign

The tables and scalars the pieces add train with AdamW at the embedding's rate. Validation loss is
the mean over --eval-iters batches drawn from the last 10% with a generator of their own (the same
batches for every variant of a text). One run prints one JSON line; --grid runs texts x variants x
seeds in --jobs processes and prints a table of medians.

  python3 scripts/speedrun_pieces.py --text data/tinyshakespeare.txt --pieces polar,cautious
  python3 scripts/speedrun_pieces.py --grid --texts a.txt,b.txt --variants base,ve,all \\
      --seeds 1337,1338,1339 --jobs 12 --out results.jsonl
"""
import argparse, json, math, os, statistics, subprocess, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

PIECES = ["ve", "unet", "smear", "backout", "bigram", "polar", "normuon", "cautious"]
POLAR = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
         (4.042929935166739, -2.808917465908714, 0.5000178451051316),
         (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
         (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
         (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def rope(x, cos, sin):  # x: (B, H, T, D)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rms(x):
    return F.rms_norm(x, (x.shape[-1],))


def has_ve(c, layer):  # nanochat: alternating layers, the last one included
    return "ve" in c.pieces and layer % 2 == (c.n_layer - 1) % 2


class Attn(nn.Module):
    def __init__(s, c, layer):
        super().__init__(); s.c = c; C = c.n_embd
        s.qkv = nn.Linear(C, 3 * C, bias=False); s.out = nn.Linear(C, C, bias=False)
        s.ve_gate = nn.Linear(12, c.n_head, bias=False) if has_ve(c, layer) else None

    def forward(s, x, cos, sin, ve):
        B, T, C = x.shape; H = s.c.n_head
        q, k, v = s.qkv(x).split(C, 2)
        if s.ve_gate is not None:
            g = 2 * torch.sigmoid(s.ve_gate(x[..., :12]))  # (B, T, H)
            v = (v.view(B, T, H, C // H) + g.unsqueeze(-1) * ve.view(B, T, H, C // H)).view(B, T, C)
        q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v))
        q, k = rope(rms(q), cos, sin), rope(rms(k), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return s.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(s, c, layer):
        super().__init__(); C = c.n_embd
        s.attn = Attn(c, layer)
        s.up = nn.Linear(C, 4 * C, bias=False); s.down = nn.Linear(4 * C, C, bias=False)

    def forward(s, x, cos, sin, ve):
        x = x + s.attn(rms(x), cos, sin, ve)
        return x + s.down(F.relu(s.up(rms(x))).square())


class Gpt(nn.Module):
    def __init__(s, c):
        super().__init__(); s.c = c; C, V, L = c.n_embd, c.vocab, c.n_layer
        s.tok = nn.Embedding(V, C)
        s.blocks = nn.ModuleList(Block(c, i) for i in range(L))
        s.head = nn.Linear(C, V, bias=False)
        for n, p in s.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        for b in s.blocks:
            nn.init.zeros_(b.attn.out.weight); nn.init.zeros_(b.down.weight)
            if b.attn.ve_gate is not None:
                nn.init.zeros_(b.attn.ve_gate.weight)
        nn.init.zeros_(s.head.weight)
        # The pieces' own weights (AdamW at the embedding's rate).
        s.ve = nn.ModuleDict({str(i): nn.Embedding(V, C) for i in range(L) if has_ve(c, i)})
        for e in s.ve.values():
            nn.init.normal_(e.weight, 0.0, 0.01)
        s.skip_w = nn.Parameter(torch.ones(L // 2)) if "unet" in c.pieces else None
        if "smear" in c.pieces:
            s.smear_gate = nn.Linear(12, 1, bias=False); nn.init.zeros_(s.smear_gate.weight)
            s.smear_lambda = nn.Parameter(torch.zeros(1))
        s.backout = nn.Parameter(torch.tensor(0.5)) if "backout" in c.pieces else None
        s.bigram_rows = min(V * V, 8 * V) + 1
        s.bigram = nn.Embedding(s.bigram_rows, C) if "bigram" in c.pieces else None
        if s.bigram is not None:
            nn.init.zeros_(s.bigram.weight)
        hd = C // c.n_head
        inv = 1.0 / (10000 ** (torch.arange(0, hd // 2).float() / (hd // 2)))
        f = torch.outer(torch.arange(c.block_size).float(), inv)
        s.register_buffer("cos", f.cos(), persistent=False); s.register_buffer("sin", f.sin(), persistent=False)

    def piece_params(s):
        ps = [e.weight for e in s.ve.values()] + [b.attn.ve_gate.weight for b in s.blocks if b.attn.ve_gate is not None]
        for name in ("skip_w", "smear_lambda", "backout"):
            if getattr(s, name, None) is not None:
                ps.append(getattr(s, name))
        if hasattr(s, "smear_gate"):
            ps.append(s.smear_gate.weight)
        if s.bigram is not None:
            ps.append(s.bigram.weight)
        return ps

    def forward(s, idx, tgt):
        B, T = idx.shape; L = s.c.n_layer
        x = s.tok(idx)
        if s.bigram is not None:
            prev = torch.cat([torch.full_like(idx[:, :1], -1), idx[:, :-1]], 1)
            h = torch.where(prev < 0, s.bigram_rows - 1, (prev * s.c.vocab + idx) % (s.bigram_rows - 1))
            x = x + s.bigram(h)
        if hasattr(s, "smear_gate"):
            g = s.smear_lambda * torch.sigmoid(s.smear_gate(x[:, 1:, :12]))
            x = torch.cat([x[:, :1], x[:, 1:] + g * x[:, :-1]], 1)
        x = rms(x)
        cos, sin = s.cos[:T], s.sin[:T]
        skips, snap = [], None
        for i, b in enumerate(s.blocks):
            if s.skip_w is not None and i >= L - L // 2:
                x = x + s.skip_w[i - (L - L // 2)] * skips.pop()
            ve = s.ve[str(i)](idx) if str(i) in s.ve else None
            x = b(x, cos, sin, ve)
            if s.skip_w is not None and i < L // 2:
                skips.append(x)
            if i == (2 * L) // 3 - 1:
                snap = x
        if s.backout is not None:
            x = x - s.backout * snap
        logits = s.head(rms(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.reshape(-1))


def orthogonalise(G, polar):
    X = G.T if G.size(0) > G.size(1) else G
    if polar:
        X = X / (X.norm() * 1.02 + 1e-6)
        steps = POLAR
    else:
        X = X / (X.norm() + 1e-7)
        steps = [(3.4445, -4.7750, 2.0315)] * 5
    for a, b, c in steps:
        A = X @ X.T; X = a * X + (b * A + c * A @ A) @ X
    return X.T if G.size(0) > G.size(1) else X


class Muon(torch.optim.Optimizer):
    def __init__(s, params, lr, wd, pieces, momentum=0.95, beta2=0.9):
        super().__init__(params, dict(lr=lr, wd=wd, momentum=momentum)); s.pieces = pieces; s.beta2 = beta2

    def normuon(s, st, key, u):
        red = -1 if u.size(0) >= u.size(1) else -2
        mean = u.square().mean(dim=red, keepdim=True)
        if key not in st: st[key] = torch.zeros_like(mean)
        st[key].lerp_(mean, 1 - s.beta2)
        v = u * st[key].clamp_min(1e-10).rsqrt()
        return v * (u.norm() / v.norm().clamp_min(1e-10))

    @torch.no_grad()
    def step(s):
        for g in s.param_groups:
            for p in g["params"]:
                st = s.state[p]
                if "buf" not in st: st["buf"] = torch.zeros_like(p.grad)
                buf = st["buf"]; buf.lerp_(p.grad, 1 - g["momentum"])
                u = p.grad.lerp(buf, g["momentum"])
                parts = u.split(u.shape[1], 0) if u.shape[0] == 3 * u.shape[1] else (u,)  # qkv as 3 matrices
                outs = []
                for j, m in enumerate(parts):
                    o = orthogonalise(m, "polar" in s.pieces)
                    if "normuon" in s.pieces:
                        o = s.normuon(st, f"v{j}", o)
                    outs.append(o * max(1, m.shape[0] / m.shape[1]) ** 0.5)
                u = torch.cat(outs)
                decay = g["lr"] * g["wd"]
                if "cautious" in s.pieces:
                    p.sub_(p * (u * p >= 0) * decay)
                else:
                    p.mul_(1 - decay)
                p.add_(u, alpha=-g["lr"])


def run(c):
    torch.manual_seed(c.seed); dev = torch.device(c.device)
    text = open(c.text, encoding="utf-8").read(); chars = sorted(set(text)); c.vocab = len(chars)
    ix = {ch: i for i, ch in enumerate(chars)}
    ids = torch.tensor([ix[ch] for ch in text], device=dev); cut = int(0.9 * len(ids))
    tr, va = ids[:cut], ids[cut:]
    offs = torch.arange(c.block_size + 1, device=dev)

    def batcher(d, seed):
        gen = torch.Generator().manual_seed(seed)
        def batch():
            s = torch.randint(len(d) - c.block_size - 1, (c.batch_size,), generator=gen).to(dev)
            w = d[s[:, None] + offs]
            return w[:, :-1], w[:, 1:]
        return batch

    m = Gpt(c).to(dev)
    hidden = [p for n, p in m.blocks.named_parameters() if p.dim() == 2 and "ve_gate" not in n]
    opts = [Muon(hidden, c.muon_lr, c.wd, c.pieces),
            torch.optim.AdamW([dict(params=[m.tok.weight] + m.piece_params(), lr=c.embed_lr),
                               dict(params=[m.head.weight], lr=c.head_lr)],
                              betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)]
    for o in opts:
        for g in o.param_groups: g["base"] = g["lr"]

    def scale(it):  # trapezoid: warm-up, constant, linear cool-down to min_lr/lr over the last part
        if it < c.warmup: return (it + 1) / (c.warmup + 1)
        cd = int(c.cooldown * c.iters)
        return 1.0 if it < c.iters - cd else max(c.min_lr / c.lr, (c.iters - it) / cd)

    train_batch = batcher(tr, c.seed)
    t0 = time.perf_counter()
    for it in range(c.iters):
        k = scale(it)
        for o in opts:
            for g in o.param_groups: g["lr"] = g["base"] * k
        loss = m(*train_batch())
        for o in opts: o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts: o.step()
    if dev.type == "cuda": torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    m.eval(); val_batch = batcher(va, 4242)
    with torch.no_grad():
        val = sum(m(*val_batch()).item() for _ in range(c.eval_iters)) / c.eval_iters
    return dict(text=os.path.basename(c.text), pieces=",".join(c.pieces) or "base", seed=c.seed,
                iters=c.iters, train_s=round(secs, 1), val=round(val, 4),
                params=sum(p.numel() for p in m.parameters()))


def grid(a):
    variants = a.variants.split(",")
    # Seed by seed, so that a grid cut short leaves whole seeds.
    jobs = [(t, v, s) for s in a.seeds.split(",") for t in a.texts.split(",") for v in variants]
    done = set()
    if os.path.exists(a.out):
        for line in open(a.out):
            r = json.loads(line); done.add((r["path"], r["variant"], str(r["seed"])))
    todo = [j for j in jobs if j not in done]
    print(f"{len(jobs)} runs, {len(todo)} to do, {a.jobs} at a time", flush=True)
    running = []
    out = open(a.out, "a")
    t0 = time.time()
    while todo or running:
        while todo and len(running) < a.jobs:
            t, v, s = todo.pop(0)
            pieces = ",".join(PIECES) if v == "all" else ("" if v == "base" else v)
            cmd = [sys.executable, __file__, "--text", t, "--pieces", pieces, "--seed", s,
                   "--device", a.device, "--iters", str(a.iters), "--threads", "1"]
            running.append(((t, v, s), subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
        time.sleep(0.5)
        for job in [r for r in running if r[1].poll() is not None]:
            running.remove(job)
            (t, v, s), p = job
            line = p.stdout.read().strip().splitlines()
            if p.returncode != 0 or not line:
                print(f"FAILED {t} {v} {s}", flush=True); continue
            r = json.loads(line[-1]); r.update(path=t, variant=v)
            out.write(json.dumps(r) + "\n"); out.flush()
            print(f"{time.time() - t0:6.0f} s  {r['text']:<22} {v:<10} {s}  val {r['val']:.4f}  ({r['train_s']} s)", flush=True)
    out.close()
    rows = [json.loads(l) for l in open(a.out)]
    print("\nmedian val over seeds (difference from base)")
    for t in a.texts.split(","):
        base = [r["val"] for r in rows if r["path"] == t and r["variant"] == "base"]
        b = statistics.median(base) if base else float("nan")
        for v in variants:
            vals = [r["val"] for r in rows if r["path"] == t and r["variant"] == v]
            if vals:
                print(f"{os.path.basename(t):<22} {v:<10} {statistics.median(vals):.4f} ({statistics.median(vals) - b:+.4f})  n={len(vals)}  {sorted(vals)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=24, iters=880, lr=1e-3,
                     min_lr=1e-4, warmup=100, muon_lr=0.02, embed_lr=0.01, head_lr=0.004, cooldown=0.5,
                     eval_iters=200, seed=1337, threads=2, wd=0.1).items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--text"); ap.add_argument("--pieces", default="")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--grid", action="store_true"); ap.add_argument("--texts"); ap.add_argument("--variants")
    ap.add_argument("--seeds", default="1337,1338,1339"); ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--out", default="speedrun_pieces.jsonl")
    a = ap.parse_args()
    if a.grid:
        return grid(a)
    a.pieces = [p for p in a.pieces.split(",") if p]
    unknown = [p for p in a.pieces if p not in PIECES]
    if unknown: ap.error(f"unknown pieces {unknown}; known: {PIECES}")
    torch.set_num_threads(a.threads)
    print(json.dumps(run(a)))


main()
