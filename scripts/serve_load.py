#!/usr/bin/env python3
"""Load on `serve`: N concurrent clients, each streaming one completion of TOKENS tokens.

    python3 scripts/serve_load.py --serve target/release/serve --checkpoint RUN [--clients 1 8 32 64]
        [--tokens 200] [--repeat 5] [--generate target/release/generate] [--interleave] [--whole]
        [--threads]

For each number of clients it starts a fresh `serve --checkpoint RUN` (its own port), waits for
it, loads the model with one request, then --repeat times starts the clients at once (one
HTTP connection each, all read by one thread, the standard library only) and prints one row:
aggregate tokens/s (tokens received over the wall time from the first request to the last
[DONE]; the median of the bursts, and their range), time to first token (median and p99 over every burst's
requests), the server's peak resident memory (VmHWM), failed or truncated responses (any
response that is not 200, has no [DONE], or has fewer than TOKENS tokens of usage), and the
cores busy during the bursts: the engine (the generation thread and its sampling pools'
threads), the HTTP threads, and the clients.

The clients run on the same cores as the server: while streaming they only keep what arrives
and when, and parse it once every client of the burst is done. With --threads each client is a
thread of its own reading its connection (a plain client, as a user would write one: it takes
more of the cores than the one reading thread).

With --interleave every row runs on one server and their bursts are taken in turn (1, 8, 32,
64, 1, ...), so that on a machine whose speed drifts each burst is measured beside the others;
a column gives each burst's tokens/s over the one-client burst of its turn (median and range):
the speed-up of batching, measured side by side.

Every client sends a seed (its index) and temperature 0.8: "differ from alone" counts the
clients whose text differs from what the same request gives alone on an idle server (batch
invariance), asked afterwards one at a time.

With --generate (and without --interleave) it first measures the ceiling, `generate
--num-samples 32 --max-new-tokens TOKENS` (tokens/s of 32 samples decoded as one batch, without
HTTP), on the same checkpoint and prompt. With --interleave, each turn instead runs `generate`
with 32 samples and with one (the server idle meanwhile): the engine's own speed-up of batching,
measured beside the bursts (a line before the table gives its median and its tokens/s), and a
last column gives each burst's speed-up over the engine's 32 over one of its turn (median and
range; the reference for 32 clients, whatever the row's clients; none for one client).
"""

import argparse
import json
import os
import re
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time


# A burst still waiting for its clients' ends after this long has stalled.
STALLED_S = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port, body):
    """A connection on which the completion `body` has been asked for."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=STALLED_S)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nConnection: close\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def burst(port, bodies):
    """Starts one streamed completion per body at once, each on its own HTTP/1.1 connection, and
    reads them all from one thread (a selector): returns, per body, (start, [(time, bytes)]):
    what each `recv` brought and when. One thread that only keeps bytes takes far less from the
    server's cores than a thread per client would; parsing waits until every client is done
    ([`parse`])."""
    clock, sel, out = time.perf_counter, selectors.DefaultSelector(), []
    for i, body in enumerate(bodies):
        start = clock()
        sock = connect(port, body)
        sock.setblocking(False)
        out.append((start, []))
        sel.register(sock, selectors.EVENT_READ, (i, [b""]))
    left, until = len(bodies), time.monotonic() + STALLED_S
    while left:
        ready = sel.select(timeout=max(0.0, until - time.monotonic()))
        if not ready:
            break  # a stalled stream: what came is kept, and counts as truncated
        for key, _ in ready:
            (i, tail), sock = key.data, key.fileobj
            try:
                piece = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if piece:
                out[i][1].append((clock(), piece))
                tail[0] = (tail[0] + piece)[-64:]
            # A stream ends with [DONE]; a whole completion with the connection.
            if not piece or b"data: [DONE]" in tail[0]:
                sel.unregister(sock)
                sock.close()
                left -= 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    return out


def burst_threads(port, bodies):
    """[`burst`]'s requests and result, from a thread per client, each reading its connection
    until it closes (a plain client, as a user would write one)."""
    clock, out = time.perf_counter, [None] * len(bodies)

    def client(i, body):
        start, pieces = clock(), []
        try:
            with connect(port, body) as sock:
                while piece := sock.recv(1 << 16):
                    pieces.append((clock(), piece))
        except OSError:
            pass  # a stalled or broken stream: what came is kept, and counts as truncated
        out[i] = (start, pieces)

    threads = [threading.Thread(target=client, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def parse(streamed):
    """(status, text, usage, done, ttft_s) of a [`stream`]: TTFT is the arrival of the first
    event (every event of a character model holds text)."""
    start, pieces = streamed
    raw = b"".join(p for _, p in pieces)
    if not raw:
        return 0, "", None, False, None  # nothing came: a failure
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    ttft = next((at - start for at, p in pieces if b"data: {" in p), None)
    if status != 200:
        return status, "", None, False, ttft
    if b"chunked" in head.lower():
        parts, at = [], 0
        while at < len(rest):
            end = rest.index(b"\r\n", at)
            n = int(rest[at:end], 16)
            if n == 0:
                break
            parts.append(rest[end + 2:end + 2 + n])
            at = end + 2 + n + 2
        rest = b"".join(parts)
    if not head.lower().count(b"text/event-stream"):
        whole = json.loads(rest)  # not streamed: one completion object, its time as TTFT
        return status, whole["choices"][0]["text"], whole["usage"], True, pieces[-1][0] - start
    text, usage, done = "", None, False
    for line in rest.decode().split("\n"):
        if not line.startswith("data: "):
            continue
        data = line[6:].strip()
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            break
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            text += choice["text"]
    return status, text, usage, done, ttft


def request(port, body):
    return parse(burst(port, [body])[0])


# Every client's prompt, and the engine's with --generate.
PROMPT = "ROMEO:"


def body(model, seed, tokens, stream=True):
    return {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.8,
            "seed": seed, "stream": stream, "stream_options": {"include_usage": True}}


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid):
    """CPU seconds the server's threads have used, by kind: the engine (its generation thread,
    and the sampling pools' threads, which take its name) and the rest (the HTTP runtime's
    threads)."""
    used = {"engine": 0.0, "http": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ran = int(f.read().split()[0]) / 1e9  # nanoseconds on a CPU
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        used["engine" if name == "generation" else "http"] += ran
    return used


class Server:
    """A fresh `serve --checkpoint RUN` on a port of its own, its model loaded."""

    def __init__(self, args):
        self.port = free_port()
        self.process = subprocess.Popen(
            [args.serve, "--checkpoint", args.checkpoint, "--port", str(self.port), "--runs",
             args.empty, "--queue", "256", "--max-batch", "64"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("listening on"), line
        self.model = os.path.basename(os.path.normpath(args.checkpoint))
        request(self.port, body(self.model, 0, 2))  # loads the model

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.process.terminate()
        self.process.wait()


class Row:
    """The bursts of one number of clients."""

    def __init__(self, clients):
        self.clients, self.rates, self.ttfts, self.bad, self.first = clients, [], [], 0, None
        # Cores busy during the bursts: the server's generation thread, its HTTP threads, and
        # the clients (this process).
        self.cores = {"engine": [], "http": [], "clients": []}

    def burst(self, args, server):
        """Starts the row's clients at once and waits for them all."""
        pid = server.process.pid
        before, mine = cpu_seconds(pid), time.process_time()
        start = time.perf_counter()
        read = burst_threads if args.threads else burst
        results = read(server.port, [body(server.model, i, args.tokens, not args.whole)
                                     for i in range(self.clients)])
        wall = time.perf_counter() - start
        after = cpu_seconds(pid)
        for kind in after:
            self.cores[kind].append((after[kind] - before[kind]) / wall)
        self.cores["clients"].append((time.process_time() - mine) / wall)
        results = [parse(r) for r in results]
        self.first = self.first or results
        self.bad += sum(1 for r in results if r[0] != 200 or not r[3] or not r[2]
                        or r[2]["completion_tokens"] != args.tokens)
        self.rates.append(sum(r[2]["completion_tokens"] for r in results if r[2]) / wall)
        self.ttfts += [r[4] for r in results if r[4] is not None]

    def line(self, args, server, one=None, engine=None):
        """The table's row: with `one` (the row of one client, its bursts interleaved with
        these), the median of each burst's tokens/s over the one-client burst beside it; with
        `engine` too (`generate`'s tokens/s with 32 samples and with one, a pair per turn), that
        speed-up over the engine's of the same turn."""
        peak = peak_rss_mib(server.process.pid)
        ttfts = sorted(self.ttfts)
        p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))] if ttfts else float("nan")
        # The same requests one at a time on the idle server.
        checked = min(self.clients, args.invariance)
        differ = sum(request(server.port, body(server.model, i, args.tokens, not args.whole))[1]
                     != self.first[i][1] for i in range(checked))
        spread = f"{min(self.rates):.0f}-{max(self.rates):.0f}"
        ratio = ""
        if one is not None:
            ratios = sorted(r / o for r, o in zip(self.rates, one.rates))
            ratio = (f" {statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) |")
        if one is not None and engine is not None and self is not one:
            of = sorted(r / o / (many / single) for r, o, many, single
                        in zip(self.rates, one.rates, *engine))
            ratio += f" {statistics.median(of):.2f} ({of[0]:.2f}-{of[-1]:.2f}) |"
        elif engine is not None:
            ratio += " - |"
        return (f"| {self.clients} | {statistics.median(self.rates):.0f} ({spread}) | "
                f"{statistics.median(ttfts) * 1000:.0f} | {p99 * 1000:.0f} | {peak:.0f} | "
                f"{self.bad} | {differ} of {checked} | "
                + " / ".join(f"{statistics.median(v):.2f}" for v in self.cores.values()) + " |"
                + ratio)


def run(args, clients):
    """One row, on a server of its own."""
    with Server(args) as server:
        row = Row(clients)
        for _ in range(args.repeat):
            row.burst(args, server)
        return row.line(args, server)


def interleaved(args):
    """Every row on one server, their bursts taken in turn (1, 8, 32, 64, 1, 8, ...): on a
    machine whose speed drifts, each burst is measured beside the others, and each row also
    shows its bursts' tokens/s over the one-client burst of the same turn. With --generate,
    each turn also runs the engine alone (32 samples, then one), and each row shows its speed-up
    over the engine's of the same turn. Peak memory is then the server's over all rows."""
    counts = sorted(set(args.clients) | {1})
    engine = ([], []) if args.generate else None
    with Server(args) as server:
        rows = [Row(c) for c in counts]
        for _ in range(args.repeat):
            if engine:
                for rates, samples in zip(engine, (32, 1)):
                    rates.append(generate_rate(args, samples))
            for row in rows:
                row.burst(args, server)
        lines = [row.line(args, server, rows[0], engine) for row in rows]
    preamble = []
    if engine:
        ratios = sorted(many / one for many, one in zip(*engine))
        preamble.append(f"engine: generate --num-samples 32 over 1 sample, --max-new-tokens "
                        f"{args.tokens}, in each turn: {statistics.median(ratios):.2f}x "
                        f"({ratios[0]:.2f}-{ratios[-1]:.2f}); 32 samples "
                        f"{statistics.median(engine[0]):.0f} tokens/s, one "
                        f"{statistics.median(engine[1]):.0f}\n")
    return preamble, lines


def generate_rate(args, samples):
    """Tokens/s of `generate --num-samples SAMPLES --max-new-tokens TOKENS`: its own report of
    its speed after the first token (whose time it reports apart)."""
    out = subprocess.run(
        [args.generate, "--checkpoint", args.checkpoint, "--num-samples", str(samples),
         "--max-new-tokens", str(args.tokens), "--temperature", "0.8", "--seed", "1",
         "--prompt", PROMPT],
        capture_output=True, text=True, check=True)
    # generate reports its own sampling speed on stderr.
    speed = re.search(r"([\d.]+) (?:tokens|characters)/s", out.stderr)
    if not speed:
        sys.exit(f"generate reported no speed (--tokens must be 2 or more): {out.stderr}")
    return float(speed.group(1))


def ceiling(args):
    rates = [generate_rate(args, 32) for _ in range(args.repeat)]
    return (f"ceiling: generate --num-samples 32 --max-new-tokens {args.tokens}: "
            f"{statistics.median(rates):.0f} tokens/s (median of {args.repeat}, "
            f"{min(rates):.0f}-{max(rates):.0f})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", default="target/release/serve")
    p.add_argument("--generate")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--whole", action="store_true",
                   help="ask for whole completions, not streams: the batching without an event "
                        "per token (TTFT is then the whole response's time)")
    p.add_argument("--repeat", type=int, default=5,
                   help="bursts of clients per row (and runs of the ceiling): the median is shown, "
                        "with the range")
    p.add_argument("--interleave", action="store_true",
                   help="run every row on one server, taking their bursts in turn, and add a "
                        "column: each burst's tokens/s over the one-client burst of its turn "
                        "(with --generate, another: that over the engine's 32 over one)")
    p.add_argument("--threads", action="store_true",
                   help="a thread per client, each reading its own connection, instead of one "
                        "thread reading every connection")
    p.add_argument("--invariance", type=int, default=8,
                   help="clients whose text is compared with the same request alone")
    args = p.parse_args()
    args.empty = os.path.join("/tmp", f"serve-load-empty-{os.getpid()}")
    os.makedirs(args.empty, exist_ok=True)
    if args.generate and not args.interleave:
        print(ceiling(args), flush=True)
    head = ("| clients | tokens/s, median (range) | TTFT median (ms) | TTFT p99 (ms) | peak RSS (MiB) "
            "| failed or truncated | differ from alone | cores busy: engine / HTTP / clients |")
    columns = 8
    if args.interleave:
        head += " x one client, median (range) |"
        columns += 1
        if args.generate:
            head += " over the engine's 32 over 1, median (range) |"
            columns += 1
        preamble, lines = interleaved(args)
        print("\n".join([*preamble, head, "| --- " * columns + "|", *lines]), flush=True)
        return
    print(head)
    print("| --- " * columns + "|", flush=True)
    for clients in args.clients:
        print(run(args, clients), flush=True)


if __name__ == "__main__":
    sys.exit(main())
