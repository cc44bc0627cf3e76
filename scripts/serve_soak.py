"""Memory over a soak of `serve`: many requests of mixed kinds, resident memory (RSS) measured.

    python3 scripts/serve_soak.py --serve target/release/serve --checkpoint RUN [--requests 1000]
        [--clients 8] [--seed 0]

Starts `serve --checkpoint RUN` on a free port and sends REQUESTS completions from CLIENTS threads
at once: each of a seeded random kind (1 to 400 tokens, streamed or whole, n from 1 to 4, with or
without logprobs, echo, penalties and min_p, a stop string), plus a /tokenize every tenth, in ten
shares. After each share, with every request answered, it reads the server's VmRSS and its
threads: it prints the first RSS, the last, their ratio, the peak (VmHWM) and every share's RSS
and threads. `MIMALLOC_PURGE_DELAY=0` in its environment (the server's) makes each reading the
memory in use rather than what the allocator keeps for reuse (with the allocator's default the
readings move by about 6%, with no trend; BENCHMARKS.md section 34). It fails (exit 1) when the end's RSS is more than
5% over the first's, or when any request failed. The standard library only.
"""

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def request_body(rng, model):
    body = {
        "model": model,
        "prompt": rng.choice(["ROMEO:", "JULIET:\nO", "", "First Citizen:\nBefore we proceed"]),
        "max_tokens": rng.choice([1, 5, 20, 50, 100, 200, 400]),
        "temperature": rng.choice([0, 0.8, 1.2]),
        "seed": rng.randrange(1 << 30),
        "n": rng.choice([1, 1, 1, 2, 4]),
        "stream": rng.random() < 0.5,
    }
    if rng.random() < 0.4:
        body["logprobs"] = rng.randrange(6)
    if rng.random() < 0.2:
        body["echo"] = True
    if rng.random() < 0.3:
        body["presence_penalty"] = 0.5
        body["repetition_penalty"] = 1.2
    if rng.random() < 0.2:
        body["min_p"] = 0.05
    if rng.random() < 0.2:
        body["stop"] = ["\n\n"]
    return body


def send(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"{path} {response.status}: {data[:200]!r}")
    if body.get("stream") and b"data: [DONE]" not in data:
        raise RuntimeError("a stream ended without [DONE]")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", default="target/release/serve")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    port = free_port()
    # Freed memory goes back to the kernel at once, so that RSS is the memory in use.
    env = dict(os.environ, MIMALLOC_PURGE_DELAY=os.environ.get("MIMALLOC_PURGE_DELAY", "0"))
    server = subprocess.Popen([a.serve, "--checkpoint", a.checkpoint, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    model = a.checkpoint.rstrip("/").split("/")[-1]
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        rng = random.Random(a.seed)
        bodies = [request_body(rng, model) for _ in range(a.requests)]
        lock = threading.Lock()
        failed = []

        def run(share):
            """Sends `share` from CLIENTS threads and waits for every answer."""
            queue = list(enumerate(share))

            def client():
                while True:
                    with lock:
                        if not queue:
                            return
                        i, body = queue.pop(0)
                    try:
                        send(port, "/v1/completions", body)
                        if i % 10 == 0:
                            send(port, "/tokenize", {"model": model, "prompt": "ROMEO: good night"})
                    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                        with lock:
                            failed.append(str(e))

            threads = [threading.Thread(target=client) for _ in range(a.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        # RSS is read with the server idle (every request answered), after each tenth: under load
        # it holds the passes' buffers of the moment, which come and go. (The model's key/value
        # cache stays, made for --max-batch rows.)
        started = time.time()
        tenth = max(1, a.requests // 10)
        series, threads = [], []
        for k in range(0, a.requests, tenth):
            run(bodies[k:k + tenth])
            # The least of a few readings once settled: what the last requests left behind and
            # the allocator has not returned yet is not memory the server keeps.
            readings = []
            for _ in range(10):
                time.sleep(0.1)
                readings.append(status_kb(server.pid, "VmRSS"))
            series.append(min(readings))
            threads.append(status_kb(server.pid, "Threads"))
        seconds = time.time() - started
        peak = status_kb(server.pid, "VmHWM")
    finally:
        server.terminate()
        server.wait()
    first, rss_end = series[0], series[-1]
    ratio = rss_end / first
    print(f"{a.requests} requests from {a.clients} clients in {seconds:.1f} s; {len(failed)} failed")
    print(f"idle RSS after {tenth}: {first / 1024:.1f} MiB; at the end: {rss_end / 1024:.1f} MiB "
          f"({100 * (ratio - 1):+.1f}%); peak {peak / 1024:.1f} MiB")
    print("idle RSS after each tenth:", " ".join(f"{r / 1024:.1f}" for r in series), "MiB")
    print("the server's threads after each tenth:", " ".join(str(t) for t in threads))
    for failure in failed[:5]:
        print("failed:", failure)
    sys.exit(1 if failed or ratio > 1.05 else 0)


if __name__ == "__main__":
    main()
