"""A soak of mixed requests against a real `rase serve`: CLIENTS threads, each taking the next
request of a seeded plan (chat, streamed chat, a stream dropped after a few chunks, completions,
n=2, JSON mode, tokenize, embeddings, malformed bodies), checking every answer. Used at a
CI size by tests/server/test_soak.py and at full size by benchmarks/bench_soak.py."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ASKS = ["What is the capital of France?", "Write a haiku about rain.", "Count from one to ten.",
        "Explain what a compiler does.", "Name three colours.", "Tell me a joke about cats."]


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@dataclass
class SoakResult:
    requests: int = 0
    by_kind: dict = field(default_factory=dict)
    unexpected: list = field(default_factory=list)
    rss_kb: dict = field(default_factory=dict)      # requests finished -> server VmRSS (kB)
    threads_at: dict = field(default_factory=dict)  # requests finished -> server threads
    threads: tuple[int, int] = (0, 0)               # server threads before, after
    seconds: float = 0.0
    health: dict = field(default_factory=dict)


def _chat(ask: str, rng: random.Random, **kw) -> dict:
    return {"model": "smollm2", "messages": [{"role": "user", "content": ask}], "max_tokens": rng.randint(1, 24),
            "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randint(0, 1 << 30), **kw}


KINDS = ("chat", "chat", "stream", "stream", "drop", "drop", "complete", "n2", "json", "tokenize", "embed", "bad")


def _one(http: httpx.Client, base: str, rng: random.Random, kinds=KINDS) -> tuple[str, str | None]:
    """Sends one request of a random kind; (kind, what was wrong or None)."""
    ask = rng.choice(ASKS)
    kind = rng.choice(kinds)
    url = base + "/v1/chat/completions"
    if kind == "chat" or kind == "n2" or kind == "json":
        extra = {"n": 2} if kind == "n2" else {"response_format": {"type": "json_object"}} if kind == "json" else {}
        r = http.post(url, json=_chat(ask, rng, **extra))
        ok = r.status_code == 200 and len(r.json()["choices"]) == (2 if kind == "n2" else 1)
        return kind, None if ok else f"{r.status_code} {r.text[:200]}"
    if kind in ("stream", "drop"):
        keep = rng.randint(1, 3) if kind == "drop" else None
        with http.stream("POST", url, json=_chat(ask, rng, stream=True)) as r:
            if r.status_code != 200:
                return kind, f"{r.status_code}"
            n, done = 0, False
            for line in r.iter_lines():
                if line.startswith("data: "):
                    n += 1
                    done = line == "data: [DONE]"
                    if keep is not None and n >= keep:
                        break  # the client goes away mid-stream
            return kind, None if (keep is not None or done) else "stream ended without [DONE]"
    if kind == "complete":
        r = http.post(base + "/v1/completions", json={"model": "smollm2", "prompt": ask, "max_tokens": rng.randint(1, 16)})
        return kind, None if r.status_code == 200 and r.json()["choices"][0]["text"] is not None else f"{r.status_code}"
    if kind == "tokenize":
        r = http.post(base + "/tokenize", json={"content": ask, "with_pieces": True})
        return kind, None if r.status_code == 200 and r.json()["tokens"] else f"{r.status_code}"
    if kind == "embed":
        r = http.post(base + "/v1/embeddings", json={"model": "smollm2", "input": ask})
        return kind, None if r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 576 else f"{r.status_code}"
    bad = rng.choice([{"model": "smollm2", "messages": []}, {"model": "smollm2", "prompt": 3},
                      {**_chat(ask, rng), "max_tokens": -1}, {**_chat(ask, rng), "frobnicate": True}])
    r = http.post(url, json=bad)
    return kind, None if r.status_code == 400 and r.json()["error"]["message"] else f"{r.status_code} {r.text[:200]}"


def warm_up(base: str, pid: int, clients: int = 16) -> SoakResult:
    """A short soak (every kind seen), then CLIENTS concurrent embeddings of a long text: each
    holds an executor thread while it waits for the model's lock, so the event loop's executor
    (threads made on demand up to its size, never ended) is at its full size before any count."""
    res = soak(base, pid, 100, clients, seed=1)
    text = " ".join(ASKS * 8)  # about 300 tokens
    codes: list[int] = []
    with httpx.Client(timeout=120) as http:
        def embed() -> None:
            codes.append(http.post(base + "/v1/embeddings", json={"model": "smollm2", "input": text}).status_code)
        burst = [threading.Thread(target=embed) for _ in range(clients)]
        for t in burst:
            t.start()
        for t in burst:
            t.join()
    if codes != [200] * clients:
        res.unexpected.append((-1, "embed burst", str(codes)))
    return res


def soak(base: str, pid: int, n_requests: int, clients: int = 16, seed: int = 0,
         rss_at: tuple[int, ...] = (), kinds=KINDS) -> SoakResult:
    res = SoakResult(threads=(_status(pid, "Threads"), 0))
    lock = threading.Lock()
    plan = iter(range(n_requests))
    t0 = time.monotonic()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    k = next(plan, None)
                if k is None:
                    return
                rng = random.Random(seed * 1_000_003 + k)
                try:
                    kind, wrong = _one(http, base, rng, kinds)
                except Exception as exc:  # a transport failure is an unexpected error too
                    kind, wrong = "error", repr(exc)
                with lock:
                    res.requests += 1
                    res.by_kind[kind] = res.by_kind.get(kind, 0) + 1
                    if wrong is not None:
                        res.unexpected.append((k, kind, wrong))
                    if res.requests in rss_at:
                        res.rss_kb[res.requests] = _status(pid, "VmRSS")
                        res.threads_at[res.requests] = _status(pid, "Threads")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.seconds = time.monotonic() - t0
    end = time.monotonic() + 20
    while True:  # dropped streams are cancelled at the server's next step
        res.health = httpx.get(base + "/health", timeout=10).json()
        if (res.health["running"] == 0 and res.health["waiting"] == 0) or time.monotonic() > end:
            break
        time.sleep(0.1)
    res.rss_kb[res.requests] = _status(pid, "VmRSS")
    res.threads = (res.threads[0], _status(pid, "Threads"))
    res.threads_at[res.requests] = res.threads[1]
    return res
