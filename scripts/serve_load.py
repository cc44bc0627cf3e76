#!/usr/bin/env python3
"""Load on `serve`: N concurrent clients, each streaming one completion of TOKENS tokens.

    python3 scripts/serve_load.py --serve target/release/serve --checkpoint RUN [--clients 1 8 32 64]
        [--tokens 200] [--generate target/release/generate]

For each number of clients it starts a fresh `serve --checkpoint RUN` (its own port), waits for
it, loads the model with one request, then starts the clients at once (threads, one HTTP
connection each, the standard library only) and prints one row: aggregate tokens/s (tokens
received over the wall time from the first request to the last [DONE]), time to first token
(median and p99), the server's peak resident memory (VmHWM), and failed or truncated responses
(any response that is not 200, has no [DONE], or has fewer than TOKENS tokens of usage).

Every client sends a seed (its index) and temperature 0.8: the last column counts the clients
whose text differs from what the same request gives alone on an idle server (batch
invariance), asked afterwards one at a time.

With --generate it first measures the ceiling, `generate --num-samples 32 --max-new-tokens TOKENS`
(tokens/s of 32 samples decoded as one batch, without HTTP), on the same checkpoint.
"""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, body):
    """Streams one completion; returns (status, text, usage, done, ttft_s, total_s)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        return resp.status, "", None, False, None, time.perf_counter() - start
    text, usage, done, ttft = "", None, False, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            break
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            if choice["text"] and ttft is None:
                ttft = time.perf_counter() - start
            text += choice["text"]
    conn.close()
    return 200, text, usage, done, ttft, time.perf_counter() - start


def body(model, seed, tokens, stream=True):
    return {"model": model, "prompt": "ROMEO:", "max_tokens": tokens, "temperature": 0.8,
            "seed": seed, "stream": stream, "stream_options": {"include_usage": True}}


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(args, clients):
    port = free_port()
    serve = subprocess.Popen(
        [args.serve, "--checkpoint", args.checkpoint, "--port", str(port), "--runs", args.empty,
         "--queue", "256", "--max-batch", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = serve.stdout.readline()
        assert line.startswith("listening on"), line
        model = os.path.basename(os.path.normpath(args.checkpoint))
        request(port, body(model, 0, 2))  # loads the model
        results = [None] * clients
        barrier = threading.Barrier(clients + 1)

        def client(i):
            barrier.wait()
            results[i] = request(port, body(model, i, args.tokens))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        peak = peak_rss_mib(serve.pid)
        bad = [r for r in results
               if r[0] != 200 or not r[3] or not r[2] or r[2]["completion_tokens"] != args.tokens]
        tokens = sum(r[2]["completion_tokens"] for r in results if r[2])
        ttfts = sorted(r[4] for r in results if r[4] is not None)
        p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))] if ttfts else float("nan")
        # The same requests one at a time on the idle server.
        differ = 0
        for i in range(min(clients, args.invariance)):
            alone = request(port, body(model, i, args.tokens))
            differ += alone[1] != results[i][1]
        checked = min(clients, args.invariance)
        return (f"| {clients} | {tokens / wall:.0f} | {statistics.median(ttfts) * 1000:.0f} | "
                f"{p99 * 1000:.0f} | {peak:.0f} | {len(bad)} | {differ} of {checked} |")
    finally:
        serve.terminate()
        serve.wait()


def ceiling(args):
    start = time.perf_counter()
    out = subprocess.run(
        [args.generate, "--checkpoint", args.checkpoint, "--num-samples", "32",
         "--max-new-tokens", str(args.tokens), "--temperature", "0.8", "--seed", "1"],
        capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    # generate reports its own sampling speed on stderr; fall back to the wall time.
    m = re.search(r"([\d.]+) (?:tokens|characters)/s", out.stderr)
    rate = float(m.group(1)) if m else 32 * args.tokens / wall
    return f"ceiling: generate --num-samples 32 --max-new-tokens {args.tokens}: {rate:.0f} tokens/s" + (
        "" if m else f" (32 x {args.tokens} tokens / {wall:.1f} s wall, start-up included)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", default="target/release/serve")
    p.add_argument("--generate")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--invariance", type=int, default=8,
                   help="clients whose text is compared with the same request alone")
    args = p.parse_args()
    args.empty = os.path.join("/tmp", f"serve-load-empty-{os.getpid()}")
    os.makedirs(args.empty, exist_ok=True)
    if args.generate:
        print(ceiling(args), flush=True)
    print("| clients | tokens/s | TTFT median (ms) | TTFT p99 (ms) | peak RSS (MiB) | failed or truncated | differ from alone |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for clients in args.clients:
        print(run(args, clients), flush=True)


if __name__ == "__main__":
    sys.exit(main())
